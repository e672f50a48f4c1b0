"""Keyword search on the Postgres index: FTS5's bm25, computed in SQL from the postings of
server/store/pg_lexical.py, for the same `LexQuery` and into the same `LexHit`.

The query language is search/lexical.py's, parsed once by `parse_lex`: each item is one
FTS5 string, ``"w1 w2"`` (a phrase: the tokens at consecutive offsets of one column) or
``"word"*`` (its last token a prefix: any term that starts with it, one index range on
the ``C``-collated term). Their text is cut by FTS5's tokenizer (server/store/fts_tokens.py),
so a prefix is stemmed as FTS5 stems it (``running*`` is ``run*``).

The ranking is FTS5's bm25 to the letter (``fts5Bm25Function`` in SQLite's fts5_aux.c),
which is not quite textbook BM25F: per item, the frequency is the sum over its instances
of their column's weight (`Bm25.fts5_weights`: path 1.5, title 4.0, body 1.0 as shipped);
the document length ``D`` and the average length are over all columns together,
unweighted; the idf is FTS5's, over ``N`` = all indexed documents and the documents
holding the item anywhere in the index, whatever the search is restricted to, clamped to
1e-6 where it is not positive::

    bm25 = -Σ_items idf · (f · (k1 + 1)) / (f + k1 · (1 - b + b · D / avgdl))

Documents holding any positive item and no negative one are ranked; ties go to the
lower id, as ``ORDER BY s, rowid`` does on SQLite. The score is `hit_score`, and the
prefix rule is `resolve_prefixes_by`, both from search/lexical.py. A search reads one
snapshot (a repeatable-read transaction), so its counts, its totals and its postings
always agree, however many writers there are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import psycopg

from qmd.server.search.lexical import (
    BM25,
    FTS5_K1,
    Bm25,
    Held,
    LexHit,
    LexQuery,
    common_tail,
    held_questions,
    hit_score,
    item_idfs,
    item_text,
    ranking_items,
    resolve_prefixes_by,
    successor,
)
from qmd.server.store.fts_tokens import PhraseTokenizer, tokenize_phrases
from qmd.server.store.pg_lexical import Totals

__all__ = ["PgVocabulary", "search_pg"]


@dataclass(frozen=True)
class _Phrase:
    """One query item as the postings see it."""

    tokens: tuple[str, ...]
    prefix: bool
    """The last token matches any term it begins."""


def _term_test(alias: str, term: str, prefix: bool) -> tuple[str, list[object]]:
    if not prefix:
        return f"{alias}.term = %s", [term]
    upper = successor(term)
    if upper is None:
        return f"starts_with({alias}.term, %s)", [term]
    return f"{alias}.term >= %s AND {alias}.term < %s", [term, upper]


def _hits(phrase: _Phrase) -> tuple[str, list[object]]:
    """SELECT (doc_id, col, tf) of every column holding `phrase`, tf its instances there."""
    if not phrase.tokens:  # FTS5 matches nothing with a phrase of no tokens
        return "SELECT NULL::bigint AS doc_id, NULL::smallint AS col, 0 AS tf WHERE false", []
    last = len(phrase.tokens) - 1
    first, params = _term_test("p0", phrase.tokens[0], phrase.prefix and last == 0)
    if last == 0:
        if not phrase.prefix:
            return f"SELECT p0.doc_id, p0.col, p0.tf FROM lex_postings p0 WHERE {first}", params
        return (
            f"SELECT p0.doc_id, p0.col, sum(p0.tf)::int AS tf FROM lex_postings p0 WHERE {first} GROUP BY 1, 2",
            params,
        )
    follow = []
    for i, token in enumerate(phrase.tokens[1:], 1):
        test, more = _term_test(f"p{i}", token, phrase.prefix and i == last)
        follow.append(
            f" AND EXISTS (SELECT 1 FROM lex_postings p{i} WHERE p{i}.doc_id = p0.doc_id AND p{i}.col = p0.col"
            f" AND {test} AND s.pos + {i} = ANY(p{i}.positions))"
        )
        params += more
    return (
        "SELECT p0.doc_id, p0.col, count(*)::int AS tf FROM lex_postings p0"
        f" CROSS JOIN LATERAL unnest(p0.positions) AS s(pos) WHERE {first}{''.join(follow)} GROUP BY 1, 2",
        params,
    )


def _documents(phrase: _Phrase, hits: tuple[str, list[object]]) -> tuple[str, list[object]]:
    """How many documents hold `phrase` (its `hits`), as an expression: a word's count is
    kept (``lex_terms``); a phrase's or a prefix's is counted from its hits."""
    if len(phrase.tokens) == 1 and not phrase.prefix:
        return "coalesce((SELECT docs FROM lex_terms WHERE term = %s), 0)", [phrase.tokens[0]]
    sql, params = hits
    return f"(SELECT count(DISTINCT doc_id) FROM ({sql}) h)", params


class _Phrases:
    """Every item's tokens, cut in one call to the tokenizer."""

    def __init__(self, query: LexQuery, tokenize: PhraseTokenizer) -> None:
        # a prefix's exact form has the same text
        texts = {item_text(expr) for expr in (*query.positives, *query.negatives)}
        order = sorted(texts)
        self.tokens = dict(zip(order, tokenize(order)))

    def __call__(self, expr: str) -> _Phrase:
        return _Phrase(self.tokens[item_text(expr)], expr.endswith("*"))


def _union(queries: Sequence[tuple[str, list[object]]], among: str = "") -> tuple[str, list[object]]:
    """The hits of several items as one relation of (item, doc_id, col, tf), item numbering
    them in order; `among` a condition on ``h.doc_id`` that every row meets."""
    parts, params = [], []
    for i, (sql, more) in enumerate(queries):
        parts.append(f"SELECT {i} AS item, h.* FROM ({sql}) h{among}")
        params += more
    return " UNION ALL ".join(parts), params


@dataclass(frozen=True)
class _Ranking:
    """One search's ranking statement, with what it needs from the statistics."""

    positives: list[tuple[str, list[object]]]
    idfs: list[float]
    """Each item's weight in the score: its idf, or 0 for an item that does not rank here."""
    avgdl: float
    where: str
    """The scope, as conditions on ``d`` (lex_docs)."""
    where_params: list[object]
    excluding: list[tuple[str, list[object]]]
    """The hits of the items whose documents are left out (the negations), collected once and
    anti-joined (a correlated NOT EXISTS over their union planned as a loop: 3.7 s for one query)."""
    limit: int
    bm25: Bm25

    def rows(self, conn: psycopg.Connection, among: Sequence[int] | None = None) -> list[tuple[int, float, int]]:
        """(doc_id, bm25, matched) of the best documents, or of the best that hold one of the
        items numbered `among`: every item still scored in full for those."""
        head, params, within = "", list[object](), ""
        if among is not None:
            head, params = _union([self.positives[i] for i in among])
            # each item's hits semi-join one distinct set (a plain CTE was made distinct again
            # for each item: at 125k notes 15% of the ranking's time)
            head = f"cand AS MATERIALIZED (SELECT DISTINCT doc_id FROM ({head}) c), "
            within = " WHERE h.doc_id IN (SELECT doc_id FROM cand)"
        hits, more = _union(self.positives, within)
        if self.excluding:
            sql, left_out = _union(self.excluding)
            head += f"excluded AS MATERIALIZED (SELECT DISTINCT doc_id FROM ({sql}) x), "
            params += left_out
        anti = " AND NOT EXISTS (SELECT 1 FROM excluded x WHERE x.doc_id = f.doc_id)" if self.excluding else ""
        return conn.execute(
            f"WITH {head}hits AS ({hits}),"
            " freq AS (SELECT doc_id, item, sum(tf * (%s::float8[])[col + 1]) AS f FROM hits GROUP BY doc_id, item)"
            # summed in item order, as FTS5's loop sums: the same bits, so ties stay ties (lower id first)
            " SELECT f.doc_id, -sum((%s::float8[])[f.item + 1] * ((f.f * (%s + 1.0))"
            " / (f.f + %s * (1 - %s + %s * (d.len_filepath + d.len_title + d.len_body) / %s)))"
            " ORDER BY f.item) AS bm25,"
            " count(*) AS matched"
            f" FROM freq f JOIN lex_docs d ON d.doc_id = f.doc_id WHERE {self.where}{anti}"
            " GROUP BY f.doc_id ORDER BY bm25, f.doc_id LIMIT %s",
            [
                *params,
                *more,
                list(self.bm25.fts5_weights()),
                self.idfs,
                FTS5_K1,
                FTS5_K1,
                self.bm25.b,
                self.bm25.b,
                self.avgdl,
                *self.where_params,
                self.limit,
            ],
        ).fetchall()

    def best(self, conn: psycopg.Connection) -> list[tuple[int, float, int]]:
        """The exact top `limit` as on SQLite (`search_fts` in search/lexical.py): the items
        most documents hold follow the others (`ranking_items`), and each part is ranked
        MaxScore first."""
        ranked, common = ranking_items(self.idfs)
        if not common:
            return self._top(conn, None)
        first = replace(self, idfs=_weighing(self.idfs, ranked))._top(conn, ranked)
        if len(first) >= self.limit:
            return first
        rest = replace(
            self,
            idfs=_weighing(self.idfs, common),
            excluding=[*(self.positives[i] for i in ranked), *self.excluding],
            limit=self.limit - len(first),
        )
        return first + rest._top(conn, common)

    def _top(self, conn: psycopg.Connection, items: Sequence[int] | None) -> list[tuple[int, float, int]]:
        """The best of the documents holding one of `items` (None: any), as `_ranked` finds
        them on SQLite: a first pass over those holding a rarer item is the answer when its
        last score reaches the bound of the common items it left out."""
        tail = common_tail(self.idfs)
        if tail:
            rarer = [i for i, idf in enumerate(self.idfs) if i not in tail and idf > 0]
            # Postgres cannot estimate the candidates (a CTE) nor a prefix's range, and
            # planned their semi-join as a loop over every pair (400 ms for a two-word
            # query at 20k files, 10 ms hashed): this pass joins by hashing.
            conn.execute("SET LOCAL enable_nestloop = off")
            rows = self.rows(conn, rarer)
            conn.execute("SET LOCAL enable_nestloop TO DEFAULT")
            if len(rows) == self.limit and abs(rows[-1][1]) >= (FTS5_K1 + 1) * sum(self.idfs[i] for i in tail):
                return rows
        return self.rows(conn, items)


def _weighing(idfs: Sequence[float], items: Sequence[int]) -> list[float]:
    """`idfs` with every item not in `items` weighing 0 (adding 0.0 keeps FTS5's bits)."""
    keep = set(items)
    return [v if i in keep else 0.0 for i, v in enumerate(idfs)]


def _held(conn: psycopg.Connection, query: LexQuery, phrases: _Phrases) -> Callable[[str], bool]:
    """Whether some document holds each prefix item's word exactly, asked in one statement
    for `resolve_prefixes_by` (a pasted paragraph has dozens of prefix items)."""
    exact = held_questions(query)
    if not exact:
        return lambda _: False
    tests = [_hits(phrases(expr)) for expr in exact]
    row = conn.execute(
        "SELECT " + ", ".join(f"EXISTS ({sql})" for sql, _ in tests), [p for _, params in tests for p in params]
    ).fetchone()
    assert row is not None
    return dict(zip(exact, row)).__getitem__


def _present(
    conn: psycopg.Connection,
    positives: Sequence[tuple[str, list[object]]],
    counts: Sequence[int],
    where: str,
    params: Sequence[object],
) -> tuple[bool, ...]:
    """`Held.present` in a scope (`where`, conditions on ``d``, lex_docs): whether one of its
    documents holds each item of `positives` (their hits), asked in one statement."""
    tests, args = [], list[object]()
    for (sql, more), n in zip(positives, counts, strict=True):
        if n > 0:
            tests.append(f"EXISTS (SELECT 1 FROM ({sql}) h JOIN lex_docs d ON d.doc_id = h.doc_id WHERE {where})")
            args += [*more, *params]
        else:
            tests.append("false")
    row = conn.execute("SELECT " + ", ".join(tests), args).fetchone()
    assert row is not None
    return tuple(bool(v) for v in row)


def search_pg(
    conn: psycopg.Connection,
    query: LexQuery,
    limit: int,
    collection: str | None = None,
    doc_ids: Sequence[int] | None = None,
    tokenize: PhraseTokenizer = tokenize_phrases,
    bm25: Bm25 = BM25,
) -> list[LexHit]:
    """The best `limit` documents for `query` by FTS5's bm25, as `search_fts` returns them
    from SQLite: restricted to `collection` and to `doc_ids` when given (None: no
    restriction), ranked with the whole index's statistics either way. `tokenize` cuts the
    query's phrases: the tokenizer the index was written with. `bm25` may move b too, which
    FTS5 cannot."""
    if limit <= 0 or not query.positives:
        return []
    phrases = _Phrases(query, tokenize)
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

        query = resolve_prefixes_by(query, _held(conn, query, phrases))
        items = [phrases(expr) for expr in query.positives]
        positives = [_hits(item) for item in items]
        counts = [_documents(item, hits) for item, hits in zip(items, positives, strict=True)]
        row = conn.execute(
            f"SELECT docs, tokens, {', '.join(sql for sql, _ in counts)} FROM lex_totals",
            [p for _, params in counts for p in params],
        ).fetchone()
        assert row is not None  # lex_totals has its one row from the migration on
        stats = Totals(row[0], row[1])
        idfs = item_idfs(row[2:], stats.docs)
        where, params = ["TRUE"], list[object]()
        if collection is not None:
            where.append("d.collection = %s")
            params.append(collection)
        if doc_ids is not None:
            where.append("d.doc_id = ANY(%s::bigint[])")
            params.append(list(doc_ids))
        excluding = [_hits(phrases(expr)) for expr in query.negatives]
        scope = " AND ".join(where)
        rows = _Ranking(positives, idfs, stats.avgdl, scope, params, excluding, limit, bm25).best(conn)
        holding = tuple(int(n) for n in row[2:])
        present = None if len(where) == 1 else _present(conn, positives, holding, scope, params)
    total, held = len(query.positives), Held.of(query, holding, stats.docs, present)
    return [LexHit(doc_id, bm25, matched, total, hit_score(bm25, idfs), held) for doc_id, bm25, matched in rows]


_INITIALS: dict[tuple[str, str, str], tuple[str, dict[str, list[str]]]] = {}
"""Per database (host, port, name): the `lex_totals` row version the terms were read at, and
the terms read by first letter. Every write moves the totals, so a new row version is the
sign that the vocabulary may have changed."""


class PgVocabulary:
    """The terms of the postings: their primary key (term, doc_id, col) is the vocabulary,
    read by skipping from one distinct term to the next (a probe per term, not a scan of
    every posting of the letter: 20-30 ms for the 3,800 terms of one letter of 100k), and
    kept until the next write (bench/bench_fuzzy.py)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        info = conn.info
        self.database = (info.host, str(info.port), info.dbname)
        row = conn.execute("SELECT xmin::text FROM lex_totals").fetchone()
        self.version = row[0] if row else ""

    def has_prefix(self, prefix: str) -> bool:
        test, params = _term_test("p", prefix, prefix=True)
        row = self.conn.execute(f"SELECT EXISTS (SELECT 1 FROM lex_postings p WHERE {test})", params).fetchone()
        return bool(row and row[0])

    def with_initial(self, initial: str) -> list[str]:
        version, initials = _INITIALS.get(self.database, ("", {}))
        if version != self.version:
            initials = {}
            _INITIALS[self.database] = (self.version, initials)
        if initial not in initials:
            initials[initial] = self._read(initial)
        return initials[initial]

    def _read(self, initial: str) -> list[str]:
        test, params = _term_test("p", initial, prefix=True)
        terms = self.conn.execute(
            "WITH RECURSIVE t(term) AS ("
            f" (SELECT p.term FROM lex_postings p WHERE {test} ORDER BY p.term LIMIT 1)"
            " UNION ALL SELECT (SELECT p.term FROM lex_postings p"
            f" WHERE p.term > t.term AND {test} ORDER BY p.term LIMIT 1) FROM t WHERE t.term IS NOT NULL)"
            " SELECT term FROM t WHERE term IS NOT NULL",
            params + params,
        ).fetchall()
        return [t for (t,) in terms]

    def frequency(self, term: str) -> int:
        row = self.conn.execute("SELECT docs FROM lex_terms WHERE term = %s", (term,)).fetchone()
        return int(row[0]) if row else 0

    def holder(self, term: str) -> int | None:
        row = self.conn.execute("SELECT doc_id FROM lex_postings WHERE term = %s LIMIT 1", (term,)).fetchone()
        return None if row is None else int(row[0])
