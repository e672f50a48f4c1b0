"""Lexical search: the lex query language and disjunctive BM25 ranking.

This is qmd's keyword engine (spec §10.1/§10.2) with these deliberate changes.

Every query item becomes exactly one double-quoted FTS5 string.
    A plain word is ``"word"*`` (prefix match), a quoted phrase ``"w1 w2"``. A
    token with punctuation between its words (``multi-agent``, ``2026.4.10``,
    ``node.js``, ``src/app.py``, ``hello!world``) is ONE phrase of those words:
    unicode61 indexed them as adjacent tokens, so the phrase matches exactly the
    text the user typed (the spec ANDs dotted parts and glues ``hello!world``
    into ``helloworld``, a token the index never holds). CJK text is a phrase of
    single characters, mirroring ``norm_cjk`` (server/text/cjk.py) on the index side. String
    content is sanitised to letters, marks, numbers, ``'`` and ``_`` (so it
    never holds a ``"``) and lowercased, and the operators are written by this
    module alone, so no user input can produce an FTS5 syntax error.

Natural-language questions still find something.
    The original ANDs every item, so ``how do I raise money for a startup``
    returns nothing unless one document has all seven words. Here English stop
    words are dropped while a content word remains, and the search is
    disjunctive BM25: every document holding any item is a candidate, ranked by
    FTS5's ``bm25`` over the OR of the items. Rare items weigh more than common
    ones, so a document with the two words that matter outranks one with three
    common words; a document with every item still wins when the items matter.
    (An earlier rule ranked "more items matched" first and BM25 within, which
    lost 0.06-0.08 nDCG@10 on natural-language queries: see the README.)

Prefixes where they help.
    A plain word is a prefix (``"word"*``) in a query of one or two items, where a
    user types partial words. In a longer query a word is exact (its porter stem),
    unless no document holds it exactly: then it stays a prefix (a partial word),
    if it has `MIN_PREFIX_CHARS`: the "d" of "vitamin d" as ``"d"*`` matched every note
    holding a word in d, at 96% of the query's attainable BM25 where no note held the rest.
    On long queries prefixes expand common stems into dozens of unrelated terms
    (``cell*`` is also ``cellar``, ``cellular``) and cost 0.01 nDCG@10.

Score (what ``LexHit.score`` holds)::

    idf(p)  = ln((N - n_p + 0.5) / (n_p + 0.5)), 1e-6 where that is not positive
    score   = |bm25| / ((k1 + 1) * sum over positive items p of idf(p))

with ``N`` the documents in the index, ``n_p`` those holding item ``p`` and k1 = 1.2 (FTS5's
frame, whatever `Bm25` ranks by), exactly the terms FTS5's bm25 sums. Each item adds
``idf(p)`` times a saturation in ``[0, k1 + 1)``, so the score is the fraction of the
query's attainable BM25 a document reaches: in [0, 1), monotone in BM25 within a query,
and independent of corpus size (a one-word query on three documents, where every idf is
clamped, still scores its hits by how often and where they hold the word). A document holding every item once in
its body, at average length, scores about 0.45; in its title as well, about 0.8.

Ranking is exact: the returned hits are the top ``limit`` of all matching
documents under BM25, computed inside SQLite (see :func:`search_fts`), with one
rule: an item more than half the documents hold (idf clamped) does not rank beside
the others, and the documents holding only such items follow (:func:`ranking_items`).
"""

from __future__ import annotations

import heapq
import json
import math
import re
import sqlite3
import unicodedata
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from itertools import groupby

from qmd.server.store import cores
from qmd.server.store.fts import counts_kept, indexed_rows, term_counts, vocabulary_tables
from qmd.server.store.fts_tokens import tokenize_phrases
from qmd.server.store.metadata import DocFilter, hit_check_sql, ids_sql
from qmd.server.store.sqlite import remembered
from qmd.server.text.cjk import CJK_RUN, norm_cjk

__all__ = [
    "BM25",
    "FTS5_B",
    "FTS5_K1",
    "Bm25",
    "LexHit",
    "LexQuery",
    "STOP_WORDS",
    "FtsVocabulary",
    "Held",
    "common_tail",
    "held_questions",
    "hit_score",
    "identifier_tokens",
    "item_idfs",
    "item_text",
    "intent_terms",
    "indexed_rows",
    "parse_lex",
    "resolve_prefixes",
    "ranking_items",
    "resolve_prefixes_by",
    "search_fts",
    "successor",
    "words",
]

# The intent stop list of spec §15.1 plus the one-letter words it filters by length, less the
# content words a notes search needs ("notes", "search", "find", "show", "need", "want", "tell", "looking").
# Only applied to unquoted, non-negated single words, and only while a content word remains.
STOP_WORDS: frozenset[str] = frozenset(
    """
    a i
    am an as at be by do he if in is it me my no of on or so to up us we all and any are but can
    did for get has her him his how its let may not our out the too was who why you also does
    from have into more some that them this what when will with your about where which
    """.split()
)

# The only letters (to Python's Unicode 14 database) that SQLite's older unicode61 tables still
# class as spacing marks, i.e. separators; found by indexing every letter and number code point
# (same set on 3.40.1 and 3.51.1). A word made only of these would tokenize to nothing, and an
# empty phrase silently empties any AND it takes part in.
_SQLITE_SEPARATOR_LETTERS = frozenset(chr(cp) for cp in (*range(0x19B0, 0x19C1), 0x19C8, 0x19C9, 0x1CF2, 0x1CF3))


def _is_word_char(ch: str) -> bool:
    """Whether ``ch`` survives sanitising: letters, marks, numbers, ``'`` and ``_``.

    Marks are kept (the spec drops them) because unicode61 splits words at many of them, e.g.
    Devanagari vowel signs: dropping them would glue the pieces into a word that is not in the
    index, while keeping them lets the tokenizer split the query exactly as it split the text.
    """
    return ch in "'_" or unicodedata.category(ch)[0] in "LMN"


def _has_token(word: str) -> bool:
    """Whether unicode61 will produce a token from ``word``: it needs a letter or a number."""
    return any(unicodedata.category(ch)[0] in "LN" and ch not in _SQLITE_SEPARATOR_LETTERS for ch in word)


def words(text: str) -> list[str]:
    """Split ``text`` into sanitised lowercase words, the way the index tokenized the same text.

    Any character that is not a word character separates words, so ``node.js``,
    ``multi-agent`` and ``hello!world`` give two words each, like their indexed tokens.
    Apostrophes at the edges of a word are quotation, not part of it.
    """
    words = []
    for is_word, run in groupby(norm_cjk(text), key=_is_word_char):
        if is_word:
            word = "".join(run).strip("'").lower()
            if _has_token(word):
                words.append(word)
    return words


@dataclass(frozen=True)
class _Item:
    """One parsed query item before stop-word and limit handling."""

    expr: str
    words: tuple[str, ...]
    negated: bool
    stop_word: bool


# One query item: an optional negating "-" glued to a quoted phrase (closing quote optional)
# or to a bare term that runs to the next whitespace or quote. A "-" followed by whitespace
# or by nothing is not a negation; it falls through to the term branch and sanitises away.
_ITEM = re.compile(r'(-(?=\S))?(?:"([^"]*)(?:"|\Z)|([^\s"]+))')


def _parse_items(query: str) -> list[_Item]:
    """Scan ``query`` left to right into items, dropping those that sanitise to nothing."""
    items = []
    for m in _ITEM.finditer(query):
        negated = m.group(1) is not None
        phrase, term = m.group(2), m.group(3)
        text = phrase if phrase is not None else term
        found = words(text)
        if not found:
            continue
        plain = term is not None and len(found) == 1 and not CJK_RUN.search(term)
        expr = f'"{found[0]}"*' if plain else '"' + " ".join(found) + '"'
        stop_word = plain and not negated and found[0] in STOP_WORDS
        items.append(_Item(expr, tuple(found), negated, stop_word))
    return items


@dataclass(frozen=True)
class LexQuery:
    """A parsed lex query: one FTS5 expression per item, ready to combine with AND / OR / NOT."""

    positives: tuple[str, ...]
    """FTS5 expressions of the items to find, one per item."""
    negatives: tuple[str, ...]
    """FTS5 expressions of the items to exclude."""
    terms: tuple[str, ...]
    """Lowercased words of the positive items (phrases split), for snippets and highlighting."""
    dropped_stopwords: tuple[str, ...]
    """Stop words left out of the search because content words remained."""
    truncated: bool
    """More than ``max_terms`` distinct positive (or negative) items were given; the first won."""

    def _exclusion(self) -> str:
        """The ``NOT …`` suffix, one group however many negatives, so the depth stays constant."""
        if not self.negatives:
            return ""
        if len(self.negatives) == 1:
            return f" NOT {self.negatives[0]}"
        return " NOT (" + " OR ".join(self.negatives) + ")"

    def match_any(self) -> str | None:
        """Documents with at least one positive item and no negative one; None if unsearchable.

        The positives are parenthesised because FTS5 binds NOT tighter than OR:
        ``a OR b NOT c`` means ``a OR (b NOT c)``.
        """
        if not self.positives:
            return None
        if len(self.positives) == 1:
            return self.positives[0] + self._exclusion()
        return "(" + " OR ".join(self.positives) + ")" + self._exclusion()

    def match_all(self) -> str | None:
        """Documents with every positive item and no negative one; None if unsearchable.

        No parentheses needed: NOT binds tighter than AND, and ``a AND (b NOT c)`` selects the
        same documents as ``(a AND b) NOT c``.
        """
        if not self.positives:
            return None
        return " AND ".join(self.positives) + self._exclusion()

    def match_item(self, i: int) -> str:
        """The FTS5 expression of positive item ``i`` alone, to test which items a document has."""
        return self.positives[i]

    def of_items(self, items: Sequence[int], excluding: Sequence[int] = ()) -> LexQuery:
        """The query of positive items `items` alone, their documents also without any of
        the items `excluding` (see `ranking_items`)."""
        return replace(
            self,
            positives=tuple(self.positives[i] for i in items),
            negatives=(*(self.positives[i] for i in excluding), *self.negatives),
        )


def _unique(values: list[str]) -> list[str]:
    """Drop repeats, keeping first occurrences in order."""
    return list(dict.fromkeys(values))


def parse_lex(query: str, max_terms: int = 32) -> LexQuery:
    """Parse lex syntax (spec §10.1, with the changes in the module docstring) into a LexQuery.

    Never raises for any string: every item is a quoted FTS5 string with no ``"`` inside, and
    items that sanitise to nothing are dropped. Positive and negative items are each capped at
    ``max_terms`` (first ones win) because every item costs an index scan; the negatives are
    also capped so a pasted wall of ``-x`` cannot build a huge query.
    """
    if max_terms < 1:
        raise ValueError(f"max_terms must be at least 1, got {max_terms}")
    items = _parse_items(query)
    positive_items = [item for item in items if not item.negated]
    dropped: list[str] = []
    if any(not item.stop_word for item in positive_items):
        dropped = _unique([item.words[0] for item in positive_items if item.stop_word])
        positive_items = [item for item in positive_items if not item.stop_word]
    positives = _unique([item.expr for item in positive_items])
    negatives = _unique([item.expr for item in items if item.negated])
    truncated = len(positives) > max_terms or len(negatives) > max_terms
    positives, negatives = positives[:max_terms], negatives[:max_terms]
    kept = set(positives)
    terms = _unique([w for item in positive_items if item.expr in kept for w in item.words])
    return LexQuery(
        positives=tuple(positives),
        negatives=tuple(negatives),
        terms=tuple(terms),
        dropped_stopwords=tuple(dropped),
        truncated=truncated,
    )


@dataclass(frozen=True)
class Held:
    """How much of a query the documents searched hold at all (`share`): the idf of the items
    some document in scope holds over that of every item, one that no document of the index
    holds counted at bm25's idf for that, ln((N + 0.5) / 0.5).

    `hit_score` leaves such items out, so that a misspelt word lowers no score; a query's
    relevance (`relevance.Evidence.held`) reads what it left out: in 150 Node sections "what
    are the rules of chess castling" reaches 0.91 of its attainable score from "rules" alone,
    and holds 0.2 of its idf. It is read over the scope, not the index: in one index with
    pydoc and man pages beside them, the other manuals' questions asked of Node's docs held
    0.95 of their idf in the index and 0.67 in Node's docs, Node's own 0.98 and 0.97
    (docs/benchmarks.md#relevance). A search of several collections searches each on its own;
    their `Held`s join with `|`."""

    items: tuple[str, ...]
    """The query's positive items as they were searched (`resolve_prefixes_by`: a prefix made
    exact may join an item already there, so there may be fewer than the query was given)."""
    negated: bool
    """The query has a negation, which leaves out documents that hold its items."""
    idfs: tuple[float, ...]
    """Each item's idf in the whole index (the scores' statistics)."""
    present: tuple[bool, ...]
    """Whether some document in scope holds each item."""
    indexed: tuple[bool, ...]
    """Whether some document of the whole index holds each item."""

    @classmethod
    def of(cls, query: LexQuery, counts: Sequence[int], rows: int, present: Sequence[bool] | None = None) -> Held:
        """For `query` as searched, from how many of the index's `rows` documents hold each
        item, and whether one in scope does (None: the scope is the index)."""
        rows = max(rows, *counts, 1)
        absent = math.log((rows + 0.5) / 0.5)
        scoped = [True] * len(counts) if present is None else present
        held = tuple(n > 0 and p for n, p in zip(counts, scoped, strict=True))
        idfs = tuple(_idf(n, rows) if n else absent for n in counts)
        return cls(query.positives, bool(query.negatives), idfs, held, tuple(n > 0 for n in counts))

    @property
    def share(self) -> float:
        total = sum(self.idfs)
        return sum(v for v, p in zip(self.idfs, self.present, strict=True) if p) / total if total > 0 else 1.0

    def __or__(self, other: Held) -> Held:
        """Held by the documents of either search (of the same query and index)."""
        return replace(self, present=tuple(a or b for a, b in zip(self.present, other.present, strict=True)))

    def elsewhere(self) -> tuple[str, ...]:
        """The words that only documents outside the scope hold: what a search of the other
        collections might answer. None for a query with a negation: a collection whose every
        match it left out found nothing, yet holds them."""
        if self.negated:
            return ()
        held = zip(self.items, self.present, self.indexed, strict=True)
        return tuple(item_text(expr) for expr, present, indexed in held if indexed and not present)

    def nowhere_in_scope(self) -> Held:
        """The same, for a search of a scope that found no document at all."""
        return replace(self, present=tuple(False for _ in self.present))


@dataclass(frozen=True)
class LexHit:
    """One document found by :func:`search_fts`."""

    doc_id: int
    """``documents.id`` (= ``documents_fts.rowid``)."""
    bm25: float
    """Raw FTS5 bm25 (`Bm25`, in FTS5's frame) over the items that rank the hit
    (`ranking_items`): negative, lower is better."""
    matched: int | None
    """How many positive items the document contains; None unless the search counted them
    (`count_matched`: on SQLite one more pass over each item's documents, a fifth of a
    search's time, for what only the expansion's strong-signal test and `--explain` read)."""
    total: int
    """How many positive items the query has."""
    score: float
    """``|bm25|`` as a fraction of the query's attainable BM25; see the module docstring."""
    held: Held
    """The query's, the same on every hit: which of its items the documents searched hold."""

    @property
    def coordination(self) -> float | None:
        """The original's score for this hit, ``b = |bm25| / (1 + |bm25|)`` for a document
        with every item, ``(matched - 1 + b) / total`` for fewer: what spec §13.2's
        strong-signal thresholds were set on. None where `matched` was not counted."""
        if self.matched is None:
            return None
        b = abs(self.bm25) / (1.0 + abs(self.bm25))
        return (self.matched - 1 + b) / self.total


FTS5_K1 = 1.2
"""FTS5's bm25 k1, fixed in SQLite (``fts5Bm25Function``): the frame every raw bm25 is in,
so the score's normaliser and the MaxScore bounds use it, whatever `Bm25.k1` is."""
FTS5_B = 0.75
"""FTS5's bm25 b, also fixed in SQLite."""


@dataclass(frozen=True)
class Bm25:
    """bm25's parameters: k1, b and the weights of the filepath, title and body columns (a
    hit's frequency is their weighted sum).

    SQLite's FTS5 takes only the weights; k1 is reached through them: scaling every weight
    by c makes each frequency f into c·f, and c·f / (c·f + 1.2·L) = f / (f + (1.2 / c)·L),
    bm25 at k1 = 1.2 / c up to a factor the same for every document of a query. So any k1
    ranks alike on both backends, with the raw bm25 in FTS5's frame (`FTS5_K1`); b moves
    only on Postgres, which computes the formula itself. bench/bench_bm25.py measures them
    (docs/benchmarks.md#keyword-ranking)."""

    k1: float = FTS5_K1
    b: float = FTS5_B
    weights: tuple[float, float, float] = (1.5, 4.0, 1.0)

    def fts5_weights(self) -> tuple[float, ...]:
        """The column weights FTS5 is given: `weights` scaled to reach `k1` from FTS5's own."""
        scale = self.k1 / FTS5_K1  # exactly 1.0 at FTS5's k1: the weights as given, to the bit
        return tuple(w / scale for w in self.weights)


BM25 = Bm25()
"""What the index ranks by: FTS5's k1 and b, and the original's column weights (measured
against others in docs/benchmarks.md#keyword-ranking)."""
_IDF_FLOOR = 1e-6
"""What FTS5 uses for an item in more than half the documents, whose idf would be negative."""
PREFIX_ITEMS = 2
"""Queries of at most this many items search plain words as prefixes; see the module docstring."""
MIN_PREFIX_CHARS = 2
"""In a longer query, a word no document holds stays a prefix only from this many characters."""

PER_ROW_SCOPE = 2000
"""A statement whose FTS expression matches fewer rows checks its scope row by row (a
primary-key probe each); one matching more tests rows against a list of the documents in
scope, built once. The list costs about as much as the collection is large (13 ms at
100k documents), the probes as many rows as match: a rare word in a big collection is
five times faster probed, a common word faster against the list."""


@dataclass(frozen=True)
class _Scope:
    collection: str | None
    doc_filter: DocFilter | None

    def test(self, conn: sqlite3.Connection, expression: str | None, rowid: str) -> tuple[str, list[object]]:
        """The scope as an SQL condition on `rowid`, in whichever form is cheaper for
        the rows `expression` matches (counted up to `PER_ROW_SCOPE`, a cheap rowid scan)."""
        seen = conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM documents_fts WHERE documents_fts MATCH ? LIMIT ?)",
            (expression, PER_ROW_SCOPE),
        ).fetchone()[0]
        if seen < PER_ROW_SCOPE:
            return hit_check_sql(rowid, self.collection, self.doc_filter)
        sql, params = ids_sql(self.collection, self.doc_filter)
        return f"+{rowid} IN ({sql})", params


def held_questions(query: LexQuery) -> list[str]:
    """The exact expressions `resolve_prefixes_by` asks `held` about: those of the prefix
    words of a query of more than `PREFIX_ITEMS` items, but for words shorter than
    `MIN_PREFIX_CHARS` (exact whatever the index holds)."""
    if len(query.positives) <= PREFIX_ITEMS:
        return []
    exact = (expr[:-1] for expr in query.positives if expr.endswith('"*'))  # '"word"*' -> '"word"'
    return [e for e in exact if len(e) - 2 >= MIN_PREFIX_CHARS]


def item_text(expr: str) -> str:
    """The text inside a query item's quotes (`parse_lex` never puts a quote inside)."""
    return expr.rstrip("*")[1:-1]


def resolve_prefixes_by(query: LexQuery, held: Callable[[str], bool]) -> LexQuery:
    """`query` as it is searched: in a query of more than `PREFIX_ITEMS` items, each plain
    prefix word that some document holds exactly (`held` of its exact expression, asked of
    whichever backend holds the index; `held_questions`), or that is shorter than
    `MIN_PREFIX_CHARS`, becomes that exact word."""
    if len(query.positives) <= PREFIX_ITEMS:
        return query
    asked = set(held_questions(query))
    resolved = []
    for expr in query.positives:
        exact = expr[:-1]
        if expr.endswith('"*') and (exact not in asked or held(exact)):
            expr = exact
        resolved.append(expr)
    return replace(query, positives=tuple(_unique(resolved)))


def resolve_prefixes(conn: sqlite3.Connection, query: LexQuery) -> LexQuery:
    """`resolve_prefixes_by` on the SQLite index."""
    return resolve_prefixes_by(
        query,
        lambda exact: bool(
            conn.execute("SELECT 1 FROM documents_fts WHERE documents_fts MATCH ? LIMIT 1", (exact,)).fetchone()
        ),
    )


def _idf(n: int, rows: int) -> float:
    """FTS5's idf of an item `n` documents hold; 0 for one no document holds, which adds
    nothing to any score and so leaves the normaliser (a misspelt word must not lower
    every score of the query)."""
    if n == 0:
        return 0.0
    rows = max(rows, n)  # the two counts are separate reads: a write between them may add rows
    value = math.log((rows - n + 0.5) / (n + 0.5))
    return value if value > 0 else _IDF_FLOOR


def item_idfs(counts: Sequence[int], rows: int) -> list[float]:
    """The idf of each query item from how many of the index's `rows` documents hold it."""
    return [_idf(n, rows) for n in counts]


def hit_score(bm25: float, idfs: Sequence[float]) -> float:
    """`LexHit.score`: `|bm25|` as a fraction of the query's attainable BM25 (module docstring).

    Every idf can read 0 for a hit when a write lands between the item counts and the ranking
    (sixteen clients during a full index did it): the sum is floored as each idf is, never 0."""
    return min(1.0, abs(bm25) / ((FTS5_K1 + 1) * max(sum(idfs), _IDF_FLOOR)))


def successor(prefix: str) -> str | None:
    """The least string above every string that starts with `prefix` (code-point order:
    the ``C`` collation's, and FTS5's, which compares UTF-8 bytes), or None when there is none."""
    last = ord(prefix[-1])
    if last == 0x10FFFF:
        return None
    following = 0xE000 if last + 1 == 0xD800 else last + 1  # no text holds a surrogate
    return prefix[:-1] + chr(following)


def _term_range(prefix: str) -> tuple[str, list[object]]:
    """The terms that start with `prefix`, as an SQL condition on ``term``."""
    upper = successor(prefix)
    if upper is None:
        return "term >= ?", [prefix]
    return "term >= ? AND term < ?", [prefix, upper]


class FtsVocabulary:
    """The terms of ``documents_fts`` and their document counts, from the index's term
    counts (`store.fts`) where they are kept, else from the ``fts5vocab`` 'row' table of
    `store.fts.vocabulary_tables`, which counts every term it lists by a pass over its
    documents (at a million chunks `with_initial` took 300-440 ms a letter from it, under 1
    from the counts, and correcting four typos 568 ms against 8); 'instance' for where a
    term is."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        vocabulary_tables(conn)
        self.terms, self.docs = ("fts_terms", "docs") if counts_kept(conn) else ("temp.qmd_vocab", "doc")

    def has_prefix(self, prefix: str) -> bool:
        where, params = _term_range(prefix)
        return self.conn.execute(f"SELECT 1 FROM {self.terms} WHERE {where} LIMIT 1", params).fetchone() is not None

    def with_initial(self, initial: str) -> list[str]:
        where, params = _term_range(initial)
        return [t for (t,) in self.conn.execute(f"SELECT term FROM {self.terms} WHERE {where}", params)]

    def frequency(self, term: str) -> int:
        row = self.conn.execute(f"SELECT {self.docs} FROM {self.terms} WHERE term = ?", (term,)).fetchone()
        return 0 if row is None else int(row[0])

    def holder(self, term: str) -> int | None:
        row = self.conn.execute("SELECT doc FROM temp.qmd_places WHERE term = ? LIMIT 1", (term,)).fetchone()
        return None if row is None else int(row[0])


def _counts(conn: sqlite3.Connection, expressions: Sequence[str], rows: int) -> list[int]:
    """The documents holding each expression, or for a common one (idf clamped) a number
    as common (of the index's `rows`), from the index's term counts (`store.fts`) where they
    tell, each word's FTS5 token found by FTS5's own tokenizer: a whole word's count; a
    prefix's where one term alone starts with it, or where one of its terms is common
    already (the short stems most documents hold, a pass over most of the index each: 5 ms
    at a million chunks). Another prefix, or a phrase, is counted by a pass (`_count`)."""
    words = {i: e[1 : e.rindex('"')] for i, e in enumerate(expressions) if " " not in e}
    held: dict[int, int | None] = {}
    if words and remembered(conn, "\x00fts-terms", lambda: int(counts_kept(conn))):
        tokens = dict(zip(words, tokenize_phrases(list(words.values())), strict=True))
        single = {i: t[0] for i, t in tokens.items() if len(t) == 1}
        whole = [i for i in single if not expressions[i].endswith("*")]
        held = dict(zip(whole, term_counts(conn, [single[i] for i in whole]), strict=True))
        held |= {i: _prefix_count(conn, t, rows) for i, t in single.items() if i not in held}
    return [n if (n := held.get(i)) is not None else _count(conn, e) for i, e in enumerate(expressions)]


def _prefix_count(conn: sqlite3.Connection, prefix: str, rows: int) -> int | None:
    """The documents holding a term that starts with `prefix`, where the counts tell: none
    or one such term, its count; a term most of the `rows` documents hold, its count (their
    union holds at least as many, so the idf is clamped either way); else None (the terms'
    documents overlap, so their counts do not add)."""
    where, params = _term_range(prefix)
    sql = f"SELECT count(*), coalesce(max(docs), 0) FROM fts_terms WHERE {where}"
    terms, most = conn.execute(sql, params).fetchone()
    if terms <= 1 or _idf(most, rows) <= _IDF_FLOOR:
        return most
    return None


def _count(conn: sqlite3.Connection, expression: str) -> int:
    """The documents holding `expression`, kept on a reading connection until the index
    changes (`ReadConnection.memo`): a prefix or a phrase costs a pass over its documents
    (42 ns each: 5 ms for a word most of a million chunks' notes hold), and recurs across
    queries."""
    sql = "SELECT count(*) FROM documents_fts WHERE documents_fts MATCH ?"
    return remembered(conn, expression, lambda: int(conn.execute(sql, (expression,)).fetchone()[0]))


def ranking_items(idfs: Sequence[float]) -> tuple[list[int], list[int]]:
    """The items that rank a query's documents, and the common ones that only follow them.

    An item more than half the documents hold has its idf clamped to 1e-6: beside any other
    item it weighs next to nothing, yet FTS5 scores it in every document that holds it, which
    is most of them (at 125k notes, 46 of 60 summary-line queries held one; ranking without
    them took 25 ms p50 instead of 44, with the same top 5 but for one exact tie). So while
    some other item is held by a document, the documents are those holding one of the other
    items, ranked by them alone; those holding only common items follow, ranked by those
    (they score about 1e-6 either way). The same documents are found. A query whose held
    items are all common ranks by them all, as before."""
    common = [i for i, v in enumerate(idfs) if 0 < v <= _IDF_FLOOR]
    if not common or all(v <= _IDF_FLOOR for v in idfs):
        return list(range(len(idfs))), []
    return [i for i in range(len(idfs)) if i not in common], common


def common_tail(idfs: list[float]) -> set[int]:
    """The items a first ranking pass may leave out: the most common ones, while their
    BM25 bound stays under half the query's (see :func:`_ranked`)."""
    order = sorted((i for i in range(len(idfs)) if idfs[i] > 0), key=lambda i: (idfs[i], i))
    tail: set[int] = set()
    budget = sum(idfs) / 2
    for i in order[:-1]:
        if idfs[i] > budget:
            break
        budget -= idfs[i]
        tail.add(i)
    return tail


HALVES_FROM = 20_000
"""A ranking statement whose items' documents number at least this many (their counts summed)
runs as two halves of the index at once, on two connections (`_Halves`): at 125k notes a
two-item statement over 55k documents took 22.6 ms instead of 38.7. Below it, the second
statement's start and its own pass over each item for the idf cost more than they save."""
_RANGE = "/*range*/"
"""Where a ranking statement takes its half's rowid range."""


@dataclass(frozen=True)
class _Halves:
    """A ranking statement cut at `split` (a rowid): the lower half on the caller's connection,
    the upper on one `beside` gives in the pool's thread, the rows merged as ``ORDER BY s,
    rowid`` orders them. Each half's bm25 reads the index's own statistics, so every score is
    the whole statement's to the bit. Like the statements of one search already, the halves
    are two reads: a write committed between their starts is seen by one of them only."""

    beside: Callable[[], AbstractContextManager[sqlite3.Connection]]
    split: int

    def rows(self, conn: sqlite3.Connection, sql: str, params: Sequence[object], limit: int) -> list[tuple[int, float]]:
        with cores.helpers(1) as helpers:
            if helpers == 0:  # another search holds the helper: no queueing behind it
                return _whole(conn, sql, params)
            upper = cores.submit(self._upper, sql, params)
            try:
                lower = conn.execute(sql.replace(_RANGE, f" AND documents_fts.rowid < {self.split}"), params).fetchall()
            finally:
                higher = upper.result()
        return heapq.nsmallest(limit, [*lower, *higher], key=lambda r: (r[1], r[0]))

    def _upper(self, sql: str, params: Sequence[object]) -> list[tuple[int, float]]:
        with self.beside() as other:
            return other.execute(sql.replace(_RANGE, f" AND documents_fts.rowid >= {self.split}"), params).fetchall()


def _whole(conn: sqlite3.Connection, sql: str, params: Sequence[object]) -> list[tuple[int, float]]:
    return conn.execute(sql.replace(_RANGE, ""), params).fetchall()


def _halves(
    conn: sqlite3.Connection,
    beside: Callable[[], AbstractContextManager[sqlite3.Connection]] | None,
    counts: Sequence[int],
) -> _Halves | None:
    """How to run this search's ranking: in halves when a second connection is at hand, the
    search has the cores to itself (`cores.shared`) and the items' documents number
    `HALVES_FROM` or more; cut at the middle active document
    (kept on a reading connection until the index changes)."""
    if beside is None or cores.shared() or sum(counts) < HALVES_FROM:
        return None
    middle = remembered(conn, "\x00keyword-halves", lambda: _middle(conn))
    return _Halves(beside, middle) if middle > 0 else None


def _middle(conn: sqlite3.Connection) -> int:
    """The id of the middle active document (0 for none)."""
    row = conn.execute(
        "SELECT id FROM documents WHERE active = 1 ORDER BY id LIMIT 1 OFFSET ?", (indexed_rows(conn) // 2,)
    ).fetchone()
    return 0 if row is None else int(row[0])


def _ranked(
    conn: sqlite3.Connection,
    query: LexQuery,
    scope: _Scope | None,
    limit: int,
    idfs: list[float],
    halves: _Halves | None = None,
    bm25: Bm25 = BM25,
) -> list[tuple[int, float]]:
    """Best ``limit`` documents holding any positive item and no negative one, by `bm25`.

    bm25 is the expensive part (about 1 µs per matching row and item), so a first pass
    scores only the documents holding one of the rarer items (MaxScore): an item adds
    less than ``(k1 + 1) * idf`` to any document, so when the ``limit``-th score of that
    pass is at least the bound of the items left out, no document holding only those can
    reach the list, and the pass is the exact answer. Otherwise every match is scored.
    Each statement runs in `halves` when given.

    The scope test is written ``+rowid`` so SQLite keeps it a filter: as a plain rowid
    constraint the planner hands it to FTS5 as one lookup per document of the collection, and
    each lookup re-reads the query's doclists (measured: 200 ms instead of 1.5 ms on 5k docs).
    A half's range is a plain rowid constraint: FTS5 starts and stops its doclists there.
    """
    expression = query.match_any()
    within, args = "", list[object]()
    if scope is not None:
        test, args = scope.test(conn, expression, "documents_fts.rowid")
        within = f" AND {test}"
    weights = ", ".join(map(repr, bm25.fts5_weights()))
    select = (
        f"SELECT rowid, bm25(documents_fts, {weights}) AS s"
        f" FROM documents_fts WHERE documents_fts MATCH ?{_RANGE}{within}"
    )

    def run(sql: str, params: Sequence[object]) -> list[tuple[int, float]]:
        return _whole(conn, sql, params) if halves is None else halves.rows(conn, sql, params, limit)

    tail = common_tail(idfs)
    if tail:
        rarer = " OR ".join(expr for i, expr in enumerate(query.positives) if i not in tail and idfs[i] > 0)
        rows = run(
            f"{select} AND +documents_fts.rowid IN"
            f" (SELECT rowid FROM documents_fts WHERE documents_fts MATCH ?{_RANGE}) ORDER BY s, rowid LIMIT ?",
            (expression, *args, rarer, limit),
        )
        bound = (FTS5_K1 + 1) * sum(idfs[i] for i in tail)
        if len(rows) == limit and abs(rows[-1][1]) >= bound:
            return rows
    return run(f"{select} ORDER BY s, rowid LIMIT ?", (expression, *args, limit))


def _matched(conn: sqlite3.Connection, query: LexQuery, found: list[int]) -> dict[int, int]:
    """Per document of `found`, how many positive items it holds: one rowid scan per item."""
    ids = json.dumps(found)
    matched = dict.fromkeys(found, 0)
    for expr in query.positives:
        for (doc_id,) in conn.execute(
            "SELECT rowid FROM documents_fts WHERE documents_fts MATCH ?"
            " AND +rowid IN (SELECT value FROM json_each(?))",
            (expr, ids),
        ):
            matched[doc_id] += 1
    return matched


def _present(
    conn: sqlite3.Connection,
    query: LexQuery,
    scope: _Scope | None,
    counts: Sequence[int],
    rows: Sequence[tuple[int, float]],
    limit: int,
) -> tuple[bool, ...]:
    """`Held.present`: whether some document in `scope` holds each positive item. Without a
    scope, whether its count is above 0. In one, an item a found document holds is held;
    where the search found every document of the scope holding an item (fewer than `limit`,
    and no negation left one out), an item none of them holds is not; any other item is
    looked for, stopping at its first document in scope."""
    if scope is None:
        return tuple(n > 0 for n in counts)
    found = [json.dumps([doc_id for doc_id, _ in rows])]
    complete = len(rows) < limit and not query.negatives
    present = []
    for expr, n in zip(query.positives, counts, strict=True):
        held = n > 0 and _holds(conn, expr, "+documents_fts.rowid IN (SELECT value FROM json_each(?))", found)
        if n > 0 and not held and not complete:
            held = _holds(conn, expr, *scope.test(conn, expr, "documents_fts.rowid"))
        present.append(held)
    return tuple(present)


def _holds(conn: sqlite3.Connection, expression: str, test: str, params: Sequence[object]) -> bool:
    """Whether a document that meets `test` holds `expression`."""
    sql = f"SELECT 1 FROM documents_fts WHERE documents_fts MATCH ? AND {test} LIMIT 1"
    return conn.execute(sql, (expression, *params)).fetchone() is not None


def search_fts(
    conn: sqlite3.Connection,
    query: LexQuery,
    collection: str | None,
    limit: int,
    doc_filter: DocFilter | None = None,
    *,
    count_matched: bool = True,
    beside: Callable[[], AbstractContextManager[sqlite3.Connection]] | None = None,
    bm25: Bm25 = BM25,
) -> list[LexHit]:
    """Return the best ``limit`` documents for ``query`` by disjunctive BM25 (`bm25`: any
    k1 and weights, FTS5's b), each with how many of its items it holds when `count_matched`.

    Expects ``documents_fts`` (rowid = ``documents.id``, active documents only) and
    ``documents``. The collection and the metadata filter sit inside the ranking statement,
    so a large collection can never fill the limit before a small one is looked at, and a
    filtered search is the top ``limit`` of the eligible documents, however few of them
    there are. Scores are comparable across collections: bm25's statistics (N, each
    item's document count) are the whole index's, in every statement. `beside` gives a
    second reading connection of the same index (`Store.read`, in another thread): a large
    ranking then runs in two halves at once (`_Halves`).
    """
    if bm25.b != FTS5_B:
        raise ValueError(f"FTS5 fixes bm25's b at {FTS5_B}; {bm25.b} can be measured on Postgres only")
    if limit <= 0 or not query.positives:
        return []
    query = resolve_prefixes(conn, query)
    rows_total = indexed_rows(conn)
    counts = _counts(conn, query.positives, rows_total)
    idfs = item_idfs(counts, rows_total)
    scope = None if collection is None and doc_filter is None else _Scope(collection, doc_filter)
    ranked, common = ranking_items(idfs)
    halves = _halves(conn, beside, [counts[i] for i in ranked])
    rows = _ranked(conn, query.of_items(ranked), scope, limit, [idfs[i] for i in ranked], halves, bm25)
    if common and len(rows) < limit:
        rest = query.of_items(common, excluding=ranked)
        rows += _ranked(conn, rest, scope, limit - len(rows), [idfs[i] for i in common], halves, bm25)
    matched = _matched(conn, query, [doc_id for doc_id, _ in rows]) if count_matched else {}
    total = len(query.positives)
    held = Held.of(query, counts, rows_total, _present(conn, query, scope, counts, rows, limit))
    return [LexHit(doc_id, bm25, matched.get(doc_id), total, hit_score(bm25, idfs), held) for doc_id, bm25 in rows]


_INTENT_STOP = STOP_WORDS | frozenset("find need show tell want looking notes search".split())
_EDGE = re.compile(r"^[^\w]+|[^\w]+$")


def intent_terms(intent: str | None) -> tuple[str, ...]:
    """Words of an intent that steer passage choice (spec §15.1): lowercased, edge
    punctuation stripped, longer than one character, not a stop word."""
    if not intent:
        return ()
    words = (_EDGE.sub("", w).replace("_", "") for w in intent.lower().split())
    return tuple(dict.fromkeys(w for w in words if len(w) > 1 and w not in _INTENT_STOP))


_IDENTIFIER = re.compile(
    r"""^(?:
        \#?\d{2,}                                  # 1234, #1234
      | v?\d+(?:[.\-_/:]\d+)+[a-z0-9.\-]*         # 2026-04-10, v1.2.3, 2026.4.10, 10:30
      | [a-z]+[-_]?\d[\w\-]*                       # abc-123, rfc7231, ticket_42, q3
      | [\w.\-]*[/\\][\w./\\\-]+                    # src/app.py, docs/
      | [\w\-]+\.(?:md|txt|py|ts|js|json|ya?ml|toml|go|rs|sh|html|css|sql|c|h|cpp|java|rb|swift|kt)
      | [a-z0-9]+(?:_[a-z0-9]+)+                   # snake_case
      | 0x[0-9a-f]+                                # hex
    )$""",
    re.VERBOSE | re.IGNORECASE,
)
_MIXED_CASE = re.compile(r"^[\w.\-]*[a-z][a-z0-9]*[A-Z][\w.\-]*$|^[A-Z]{2,}[a-z]\w*$")  # getUserById, HTTPServer


def identifier_tokens(query: str) -> tuple[str, ...]:
    """Tokens of `query` that look like identifiers: ids, dates, versions, paths,
    CamelCase, snake_case, numbers. For a lookup these should match exactly, so they
    raise the keyword leg's weight in the hybrid query (seeds/002)."""
    out = []
    for raw in query.split():
        token = raw.strip("\"'`()[]{},;!?").rstrip(".")
        if token and (_IDENTIFIER.match(token) or _MIXED_CASE.match(token)):
            out.append(token)
    return tuple(dict.fromkeys(out))
