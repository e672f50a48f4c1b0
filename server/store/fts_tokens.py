"""FTS5's own tokenizer, run outside the SQLite index: the terms and positions of
documents and query phrases exactly as ``documents_fts`` holds them.

A backend that keeps its own postings (Postgres, server/store/pg_lexical.py) must cut
text into the very tokens the SQLite index does, or the two rank differently: a
re-implementation of unicode61 + porter would have to copy SQLite's Unicode tables
(older than Python's: see ``_SQLITE_SEPARATOR_LETTERS`` in search/lexical.py), its
diacritic folding and its porter quirks, and would drift with every SQLite release.
So the tokenizer is SQLite's: an in-memory copy of the index's FTS table (the same
``FTS_TABLE`` statement, so the same tokenizer and options) takes the rows, and an
``fts5vocab`` table in ``instance`` mode reads back every (term, column, offset) it
indexed, grouped per posting inside SQLite, which also writes each posting as the line
Postgres' COPY takes: no Python object per posting (a 2,000-file batch has a million).

Title and body pass through ``norm_cjk`` first, as ``store.fts_put`` does; the file
path does not.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

from qmd.server.store.db import sqlite3
from qmd.server.store.schema import FTS_TABLE, fts_table
from qmd.server.text.cjk import norm_cjk

COLUMNS = ("filepath", "title", "body")
"""The indexed columns, in FTS5's column order (a posting's column number)."""


@dataclass(frozen=True)
class TokenBatch:
    """Documents as FTS5 tokenizes them, in the form Postgres stores them."""

    lengths: dict[int, tuple[int, int, int]]
    """Document id → tokens per column: what FTS5's ``_docsize`` records (bm25's document
    length is their sum)."""
    postings: str
    """``COPY lex_postings (term, doc_id, col, tf, positions)`` text: a line per (term,
    document, column), its offsets ascending."""


DocumentTokenizer = Callable[[Sequence[tuple[int, str, str, str]]], TokenBatch]
"""(document id, filepath, title, body) of each document → its tokens: `tokenize_documents`,
or another tokenizer whose agreement with FTS5 is being measured (bench/bench_postgres_lexical.py)."""

_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_line(term: str, doc_id: int, col: int, offsets: Sequence[int]) -> str:
    """One posting as a COPY text line (for a tokenizer that has it as Python objects)."""
    positions = ",".join(map(str, offsets))
    return f"{term.translate(_COPY_ESCAPES)}\t{doc_id}\t{col}\t{len(offsets)}\t{{{positions}}}\n"


PhraseTokenizer = Callable[[Sequence[str]], list[tuple[str, ...]]]
"""Query phrases → their tokens: `tokenize_phrases`, or the same other tokenizer's."""


class _Tokenizer:
    """One in-memory FTS5 table per thread (a sqlite3 connection is not shared)."""

    def __init__(self, statement: str = FTS_TABLE) -> None:
        self.conn = sqlite3.connect(":memory:", isolation_level=None)
        self.conn.execute(statement)
        self.conn.execute("CREATE VIRTUAL TABLE documents_vocab USING fts5vocab(documents_fts, 'instance')")
        self.conn.execute("CREATE VIRTUAL TABLE documents_terms USING fts5vocab(documents_fts, 'row')")
        # 'delete-all' empties a contentless table at once; SQLite before 3.43 makes a table
        # with content (schema.py), which only DELETE empties.
        contentless = "content=''" in statement
        self.clear = "INSERT INTO documents_fts(documents_fts) VALUES ('delete-all')" if contentless else None

    def batch(self, rows: Sequence[tuple[int, str, str, str]]) -> TokenBatch:
        """The rows (id, filepath, title, body) indexed under their own ids, read back as
        lengths and COPY lines; the table is emptied after. The vocabulary is in (term, row,
        column, offset) order, which GROUP BY keeps, so each offset list comes ascending."""
        with self._indexed(rows):
            # the column lengths as FTS5 records them: a few varints a row, not a scan of every token
            lengths = {
                doc: fts5_varints(size) for doc, size in self.conn.execute("SELECT id, sz FROM documents_fts_docsize")
            }
            (postings,) = self.conn.execute(
                "SELECT coalesce(group_concat(line, ''), '') FROM (SELECT"
                " replace(replace(replace(replace(term, '\\', '\\\\'), char(9), '\\t'), char(10), '\\n'),"
                " char(13), '\\r') || char(9) || doc || char(9) || (CASE col WHEN 'filepath' THEN 0"
                " WHEN 'title' THEN 1 ELSE 2 END) || char(9) || count(*) || char(9) || '{' || group_concat(offset)"
                " || '}' || char(10) AS line FROM documents_vocab GROUP BY term, doc, col)"
            ).fetchone()
        return TokenBatch({d: (n[0], n[1], n[2]) for d, n in lengths.items()}, postings)

    def run(self, rows: Sequence[tuple[str, str, str]]) -> list[dict[tuple[str, int], list[int]]]:
        """Each row's (term, column) → offsets, for query phrases; the table is emptied after."""
        out: list[dict[tuple[str, int], list[int]]] = [{} for _ in rows]
        with self._indexed([(i + 1, *row) for i, row in enumerate(rows)]):
            for doc, term, col, offsets in self.conn.execute(
                "SELECT doc, term, col, group_concat(offset) FROM documents_vocab GROUP BY term, doc, col"
            ):
                out[doc - 1][(term, _COLUMN[col])] = sorted(map(int, offsets.split(",")))
        return out

    def terms(self, rows: Sequence[tuple[int, str, str, str]]) -> list[tuple[str, int]]:
        """Each term of the rows (id, filepath, title, body), with how many of them hold it."""
        with self._indexed(rows):
            return [(term, int(docs)) for term, docs in self.conn.execute("SELECT term, doc FROM documents_terms")]

    @contextmanager
    def _indexed(self, rows: Sequence[tuple[int, str, str, str]]) -> Iterator[None]:
        """The rows (rowid, filepath, title, body) in the table for the block, emptied after."""
        self.conn.executemany("INSERT INTO documents_fts(rowid, filepath, title, body) VALUES (?, ?, ?, ?)", rows)
        try:
            yield
        finally:
            self.conn.execute(self.clear or "DELETE FROM documents_fts")


_COLUMN = {name: i for i, name in enumerate(COLUMNS)}


_local = threading.local()


def _tokenizer() -> _Tokenizer:
    tok = getattr(_local, "tokenizer", None)
    if tok is None:
        tok = _local.tokenizer = _Tokenizer()
    return tok


def tokenize_documents(docs: Sequence[tuple[int, str, str, str]]) -> TokenBatch:
    """Each (id, filepath, title, body) as ``documents_fts`` would index it; ids distinct."""
    return _documents(_tokenizer(), docs)


def term_documents(docs: Sequence[tuple[int, str, str, str]]) -> list[tuple[str, int]]:
    """Each term of these (id, filepath, title, body), as ``documents_fts`` would index them,
    with how many of the documents hold it (in any column); ids distinct."""
    rows = [(doc_id, filepath, norm_cjk(title), norm_cjk(body)) for doc_id, filepath, title, body in docs]
    return _tokenizer().terms(rows) if rows else []


def tokenize_phrases(phrases: Sequence[str]) -> list[tuple[str, ...]]:
    """The tokens of each query phrase, in order, as FTS5 cuts the text of a quoted string
    (the query side of porter unicode61 is the document side: a prefix is stemmed too)."""
    return _phrases(_tokenizer(), phrases)


def other_tokenizer(tokenize: str) -> tuple[DocumentTokenizer, PhraseTokenizer]:
    """Documents and phrases cut by FTS5 with another ``tokenize`` option (``unicode61``: no
    stemmer), for a Postgres index fed to measure it (bench/bench_bm25.py); this thread's only."""
    tok = _Tokenizer(fts_table(tokenize))
    return partial(_documents, tok), partial(_phrases, tok)


def _documents(tok: _Tokenizer, docs: Sequence[tuple[int, str, str, str]]) -> TokenBatch:
    rows = [(doc_id, filepath, norm_cjk(title), norm_cjk(body)) for doc_id, filepath, title, body in docs]
    return tok.batch(rows) if rows else TokenBatch({}, "")


def _phrases(tok: _Tokenizer, phrases: Sequence[str]) -> list[tuple[str, ...]]:
    out = []
    for postings in tok.run([("", "", text) for text in phrases]) if phrases else []:
        at = {offset: term for (term, _), offsets in postings.items() for offset in offsets}
        out.append(tuple(at[offset] for offset in sorted(at)))
    return out


def fts5_varints(blob: bytes) -> list[int]:
    """The varints of an FTS5 record (SQLite's big-endian, 7 bits a byte; FTS5's counts
    stay far below the 9-byte form)."""
    values, value = [], 0
    for byte in blob:
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            values.append(value)
            value = 0
    return values


def varint_bytes(value: int) -> bytes:
    groups = [value & 0x7F]
    while value := value >> 7:
        groups.append(0x80 | (value & 0x7F))
    return bytes(reversed(groups))
