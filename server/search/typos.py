"""Typo tolerance (`--fuzzy`, opt-in): a query word that no indexed term matches is
searched as its nearest indexed word, and the answer says so
(`searched 'kubernetes' for 'kuberentes'`), so nobody takes a corrected search for the
one they typed.

What is corrected: a plain word (not a quoted phrase, not a negation, not a word with a
digit: those are identifiers, exact by intent) of at least `MIN_LETTERS` letters that
no document holds, even as a prefix. A word that matches anything is never touched.

Nearest: the index holds porter stems (FTS5's `porter unicode61`; the Postgres
postings are cut by the same tokenizer), so the typed word's stem is compared with the
indexed stems by optimal string alignment distance (an insertion, deletion,
substitution or swap of neighbours is one edit): at most one edit for a stem under
`TWO_EDITS_FROM` letters, two from there on. Only stems with the same first letter and
a length within reach are compared (a typo in the first letter is not corrected: that
prefilter is what keeps a 100k-term vocabulary to milliseconds), all of them at once
in numpy. Of the nearest, the one most documents hold wins (then the first in order).
The word searched is one the documents hold for that stem (`kubernetes`, not the stem
`kubernet`), so the note names a word, and searching it finds exactly that stem.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from qmd.server.search.lexical import LexQuery
from qmd.server.store.db import Connection, sqlite3
from qmd.server.store.documents import fetch_ids
from qmd.server.store.fts_tokens import tokenize_phrases

MIN_LETTERS = 4
"""Shorter words are left alone: one edit from a three-letter word reaches dozens of words."""
TWO_EDITS_FROM = 6
"""A stem this long or longer may be two edits from the word meant; a shorter one one edit."""
SURFACE_CANDIDATES = 64
"""Words of a holding document tried as the stem's surface form, most frequent first."""


class Vocabulary(Protocol):
    """The indexed terms (stems) of one backend, as the correction reads them."""

    def has_prefix(self, prefix: str) -> bool:
        """Whether some indexed term starts with `prefix` (a plain query word is a prefix)."""
        ...

    def with_initial(self, initial: str) -> list[str]:
        """Every indexed term starting with the character `initial`."""
        ...

    def frequency(self, term: str) -> int:
        """How many documents hold `term`."""
        ...

    def holder(self, term: str) -> int | None:
        """A document holding `term`, to read the word it was cut from."""
        ...


@dataclass(frozen=True)
class Correction:
    typed: str
    """The word as the query had it (lowercased, as searched)."""
    searched: str | None
    """The indexed word searched instead; None when no indexed word was near enough."""

    @property
    def note(self) -> str:
        """What the answer says, in its notes (CLI stderr, JSON and MCP `warnings`)."""
        if self.searched is None:
            return f"no indexed word is near '{self.typed}'; searched it as typed"
        return f"searched '{self.searched}' for '{self.typed}'"


def vocabulary(conn: Connection) -> Vocabulary:
    """The vocabulary of whichever backend holds the index."""
    if isinstance(conn, sqlite3.Connection):
        from qmd.server.search.lexical import FtsVocabulary

        return FtsVocabulary(conn)
    from qmd.server.search.lexical_pg import PgVocabulary
    from qmd.server.store.pg_store import raw

    return PgVocabulary(raw(conn))


def correct(conn: Connection, query: LexQuery) -> tuple[LexQuery, list[Correction]]:
    """`query` with each plain word no document holds replaced by its nearest indexed word,
    and what was done for each such word."""
    typed = [expr[1:-2] for expr in query.positives if _fuzzable(expr)]
    if not typed:
        return query, []
    vocab = vocabulary(conn)
    stems = dict(zip(typed, (t[0] if len(t) == 1 else "" for t in tokenize_phrases(typed))))
    found: dict[str, Correction] = {}
    for word, stem in stems.items():
        if stem and not vocab.has_prefix(stem):
            found[word] = Correction(word, _nearest_word(conn, vocab, stem))
    if not found:
        return query, []
    searched = {w: c.searched for w, c in found.items() if c.searched is not None}
    positives = [f'"{searched[e[1:-2]]}"' if _fuzzable(e) and e[1:-2] in searched else e for e in query.positives]
    terms = [searched.get(t, t) for t in query.terms]
    fixed = replace(query, positives=tuple(dict.fromkeys(positives)), terms=tuple(dict.fromkeys(terms)))
    return fixed, list(found.values())


def _fuzzable(expr: str) -> bool:
    """A plain word's item (`"word"*`), long enough and without a digit."""
    word = expr[1:-2]
    return expr.endswith('"*') and len(word) >= MIN_LETTERS and not any(ch.isdigit() for ch in word)


def _nearest_word(conn: Connection, vocab: Vocabulary, stem: str) -> str | None:
    """The word searched for `stem`'s nearest indexed stem, or None when none is in reach."""
    tied = nearest(stem, vocab.with_initial(stem[0]), 2 if len(stem) >= TWO_EDITS_FROM else 1)
    if not tied:
        return None
    best = max(tied, key=lambda t: (vocab.frequency(t), [-ord(ch) for ch in t]))
    doc_id = vocab.holder(best)
    doc = fetch_ids(conn, [doc_id]).get(doc_id) if doc_id is not None else None
    return _surface(best, f"{doc.path}\n{doc.title}\n{doc.body}") if doc is not None else best


def nearest(stem: str, terms: Sequence[str], reach: int) -> list[str]:
    """The terms fewest edits from `stem`, within `reach` edits (none: nothing in reach).
    Optimal string alignment, computed for every candidate at once: a row of the edit
    matrix per letter of `stem`, each cell one numpy operation over all candidates, and
    only the cells within `reach` of the diagonal (any other is past reach, held at
    `reach + 1`)."""
    near = [t for t in terms if abs(len(t) - len(stem)) <= reach and t != stem]
    if not near:
        return []
    lengths = np.fromiter(map(len, near), dtype=np.int64, count=len(near))
    width, far = int(lengths.max()), reach + 1
    cand = np.full((len(near), width), -1, dtype=np.int64)  # -1: past a term's end, equal to no letter
    cand[np.arange(width) < lengths[:, None]] = np.frombuffer("".join(near).encode("utf-32-le"), dtype=np.uint32)
    target = [ord(ch) for ch in stem]
    before = np.tile(np.minimum(np.arange(width + 1, dtype=np.int64), far), (len(near), 1))
    earlier = before
    for i, ch in enumerate(target, 1):
        row = np.full_like(before, far)
        row[:, 0] = min(i, far)
        for j in range(max(1, i - reach), min(width, i + reach) + 1):
            cell = np.minimum(before[:, j] + 1, row[:, j - 1] + 1)
            cell = np.minimum(cell, before[:, j - 1] + (cand[:, j - 1] != ch))
            if i > 1 and j > 1:
                swapped = (cand[:, j - 1] == target[i - 2]) & (cand[:, j - 2] == ch)
                cell = np.where(swapped, np.minimum(cell, earlier[:, j - 2] + 1), cell)
            row[:, j] = np.minimum(cell, far)
        earlier, before = before, row
    distance = before[np.arange(len(near)), lengths]
    least = int(distance.min())
    return [near[i] for i in np.flatnonzero(distance == least)] if least <= reach else []


def _surface(stem: str, text: str) -> str:
    """The word of `text` that the tokenizer cuts to `stem`, the most frequent if several
    (`Kubernetes` and `kubernetes` are one word); the stem itself if none is found (a
    word whose first letters folding changed, `café`)."""
    start = re.compile(r"(?<![\w'])" + re.escape(stem[: max(1, len(stem) - 1)]) + r"[\w']*", re.IGNORECASE)
    counts = Counter(m.group().rstrip("'").lower() for m in start.finditer(text))
    tried = [w for w, _ in counts.most_common(SURFACE_CANDIDATES)]
    for word, tokens in zip(tried, tokenize_phrases(tried) if tried else []):
        if tokens == (stem,):
            return word
    return stem
