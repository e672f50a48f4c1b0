"""The keyword index's rows: a document's title and body in, a document out, FTS5's
totals kept honest, and each term's document count kept beside them. (On Postgres the same
rows are postings: server/store/pg_lexical.py.)

FTS5 keeps no count of the documents holding a term: a search had to count each query
word's documents itself (``count(*) … MATCH``, 42 ns a document: 5 ms for a word most of a
million chunks' notes hold, a third of a keyword search there). So every write of the
keyword index also writes what it changed in ``fts_terms`` (term → documents holding it, in
any column, exactly what ``fts5vocab``'s 'row' table counts), from the written rows and the
rows they replace, cut into terms by FTS5's own tokenizer (store/fts_tokens.py).
``fts_rows`` names each indexed row's text (its file path, title and body hash), so a row
that is replaced or removed can be cut into terms again. Where that text cannot be had (a
body gone, a row the table does not name) or the SQLite library changed (its tokenizer may
cut some text otherwise), the counts are made again from FTS5's own vocabulary."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from qmd.server.store.db import Connection, IndexStore, is_postgres, sqlite3
from qmd.server.store.fts_tokens import fts5_varints, term_documents, varint_bytes
from qmd.server.text.cjk import norm_cjk

log = logging.getLogger("qmd.store")
V = TypeVar("V")


@dataclass(frozen=True)
class FtsDoc:
    """One active document as the keyword index takes it; its row is ``documents.id``."""

    doc_id: int
    collection: str
    path: str
    title: str
    body: str
    hash: str
    """The body's ``content`` hash: how `fts_rows` finds the body again."""

    @property
    def filepath(self) -> str:
        return f"{self.collection}/{self.path}"


def fts_put(conn: Connection, docs: Sequence[FtsDoc]) -> None:
    """(Re)write these documents' keyword-index rows (the ``filepath`` column is
    ``collection/path``): FTS5's rows and their terms' counts, or on Postgres the postings,
    all in one go."""
    if is_postgres(conn):
        from qmd.server.store import pg_lexical, pg_store

        lex = [pg_lexical.LexDoc(d.doc_id, d.collection, d.filepath, d.title, d.body) for d in docs]
        pg_lexical.put_documents(pg_store.raw(conn), lex)
        return
    latest = list({d.doc_id: d for d in docs}.values())
    change = _Change.leaving(conn, [d.doc_id for d in latest]) if counts_kept(conn) else None
    for d in latest:
        conn.execute("DELETE FROM documents_fts WHERE rowid = ?", (d.doc_id,))
        conn.execute(
            "INSERT INTO documents_fts(rowid, filepath, title, body) VALUES (?, ?, ?, ?)",
            (d.doc_id, d.filepath, norm_cjk(d.title), norm_cjk(d.body)),
        )
    conn.executemany(
        "INSERT OR REPLACE INTO fts_rows(doc_id, filepath, title, hash) VALUES (?, ?, ?, ?)",
        [(d.doc_id, d.filepath, d.title, d.hash) for d in latest],
    )
    if change is None:
        return
    if not change.recount:
        change.add(term_documents([(d.doc_id, d.filepath, d.title, d.body) for d in latest]))
    change.write(conn)


def fts_delete(conn: Connection, doc_ids: list[int]) -> None:
    if is_postgres(conn):
        from qmd.server.store import pg_lexical, pg_store

        pg_lexical.delete_documents(pg_store.raw(conn), doc_ids)
        return
    change = _Change.leaving(conn, doc_ids) if counts_kept(conn) else None
    for chunk in _chunks(doc_ids):
        marks = ",".join("?" * len(chunk))
        conn.execute(f"DELETE FROM documents_fts WHERE rowid IN ({marks})", chunk)
        conn.execute(f"DELETE FROM fts_rows WHERE doc_id IN ({marks})", chunk)
    if change is not None:
        change.write(conn)


def _chunks(values: Sequence[V], size: int = 500) -> Iterator[Sequence[V]]:
    for i in range(0, len(values), size):
        yield values[i : i + size]


RECOUNT_SHARE = 0.25
"""A write of at least this share of the index's rows (written or removed) makes the
counts again from FTS5's vocabulary instead of cutting its rows into terms a second time: the
vocabulary reads 11 µs a document, the tokenizer 50 (a first index, removing a large
collection)."""


class _Change:
    """What a write does to `fts_terms`: each term's change in documents, or, where the rows
    it replaces cannot be cut into terms again, that the counts must be made again."""

    def __init__(self) -> None:
        self.delta: Counter[str] = Counter()
        self.recount = False

    @staticmethod
    def leaving(conn: Connection, doc_ids: Sequence[int]) -> _Change:
        """The change of removing these documents' current rows (those the index holds)
        before they are written again or removed: a recount where that is many beside the
        index (`RECOUNT_SHARE`)."""
        change = _Change()
        if len(doc_ids) >= RECOUNT_SHARE * indexed_rows(conn):
            change.recount = True
            return change
        for chunk in _chunks(doc_ids):
            marks = ",".join("?" * len(chunk))
            sql = f"SELECT id FROM documents_fts_docsize WHERE id IN ({marks})"
            indexed = {int(r[0]) for r in conn.execute(sql, chunk)}
            rows = conn.execute(
                "SELECT r.doc_id, r.filepath, r.title, c.doc FROM fts_rows r LEFT JOIN content c ON c.hash = r.hash"
                f" WHERE r.doc_id IN ({marks})",
                chunk,
            ).fetchall()
            known = [(int(i), path, title, body) for i, path, title, body in rows if int(i) in indexed]
            if len(known) < len(indexed) or any(body is None for *_, body in known):
                change.recount = True
                return change
            change.delta.subtract(dict(term_documents(known)))
        return change

    def add(self, terms: Iterable[tuple[str, int]]) -> None:
        self.delta.update(dict(terms))

    def write(self, conn: Connection) -> None:
        if self.recount:
            recount_terms(conn)
            return
        changed = [(term, n) for term, n in self.delta.items() if n]
        gone = [term for term, n in changed if n < 0]
        conn.executemany(
            "INSERT INTO fts_terms(term, docs) VALUES (?, ?)"
            " ON CONFLICT(term) DO UPDATE SET docs = docs + excluded.docs",
            changed,
        )
        for chunk in _chunks(gone):
            marks = ",".join("?" * len(chunk))
            if conn.execute(f"SELECT 1 FROM fts_terms WHERE docs < 0 AND term IN ({marks}) LIMIT 1", chunk).fetchone():
                log.warning("keyword term counts had drifted from the index: made again")
                recount_terms(conn)
                return
            conn.execute(f"DELETE FROM fts_terms WHERE docs = 0 AND term IN ({marks})", chunk)


def recount_terms(conn: Connection) -> None:
    """`fts_terms` made again from FTS5's vocabulary (1.4 s at a million chunks), and the
    SQLite library that counted it recorded."""
    conn.execute("DELETE FROM fts_terms")
    conn.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.qmd_recount USING fts5vocab(main, documents_fts, 'row')")
    try:
        conn.execute("INSERT INTO fts_terms(term, docs) SELECT term, doc FROM temp.qmd_recount")
    finally:
        conn.execute("DROP TABLE temp.qmd_recount")
    conn.execute("DELETE FROM fts_counted")  # the SQLite version whose tokenizer cut the terms
    conn.execute("INSERT INTO fts_counted(sqlite) VALUES (?)", (sqlite3.sqlite_version,))


def pause_term_counts(conn: Connection) -> bool:
    """Stop keeping the counts (searches count their words' documents meanwhile) until
    `recount_terms`; returns whether they were kept (never on Postgres)."""
    if is_postgres(conn) or not counts_kept(conn):
        return False
    conn.execute("DELETE FROM fts_counted")
    return True


@contextmanager
def counted_after(store: IndexStore, writes: int) -> Iterator[None]:
    """A pass that writes or removes up to `writes` documents, in batches: when that is
    `RECOUNT_SHARE` of the index or more (a first index, a large folder added), its batches
    leave the counts alone and they are made once after it, from FTS5's vocabulary (at a
    million chunks, keeping them batch by batch made the first index 1.7× as long). A pass
    cut short still recounts; a crash leaves them to the next start (`check_term_counts`)."""
    with store.read() as conn:
        large = writes > 0 and _large(conn, writes)
    paused = large and store.write(pause_term_counts, bump=False)
    try:
        yield
    finally:
        if paused:
            store.write(recount_terms, bump=False)


def _large(conn: Connection, writes: int) -> bool:
    return not is_postgres(conn) and counts_kept(conn) and writes >= RECOUNT_SHARE * indexed_rows(conn)


def check_term_counts(conn: sqlite3.Connection) -> bool:
    """At start, on the writer: make the counts if they are not kept (a new schema, a pass
    cut short by a crash) or another SQLite library counted them (their old rows would be
    cut into terms by this one's tokenizer when they are replaced). Returns whether it did
    (not where the schema keeps no counts)."""
    if not has_term_counts(conn):
        return False
    row = conn.execute("SELECT sqlite FROM fts_counted").fetchone()
    if row is not None and row[0] == sqlite3.sqlite_version:
        return False
    conn.execute("BEGIN IMMEDIATE")
    try:
        recount_terms(conn)
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    log.info("keyword term counts made for SQLite %s", sqlite3.sqlite_version)
    return True


def has_term_counts(conn: Connection) -> bool:
    """Whether the index's schema keeps its terms' counts (qmd's since version 11 does; a
    bare FTS5 table does not)."""
    return conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'fts_terms'").fetchone() is not None


def counts_kept(conn: Connection) -> bool:
    """Whether `fts_terms` holds the index's counts now (not paused by `pause_term_counts`,
    nor waiting for `check_term_counts`)."""
    return has_term_counts(conn) and conn.execute("SELECT 1 FROM fts_counted").fetchone() is not None


def vocabulary_tables(conn: sqlite3.Connection) -> None:
    """``temp.qmd_vocab`` (``fts5vocab`` 'row': each term, its documents) and
    ``temp.qmd_places`` ('instance': where each term is) over ``documents_fts``, made once
    in the connection's ``temp`` schema: nothing is written to the index, so a reader may
    (its ``query_only`` guard is lifted for them)."""
    if conn.execute("SELECT 1 FROM temp.sqlite_master WHERE name = 'qmd_vocab'").fetchone():
        return
    (query_only,) = conn.execute("PRAGMA query_only").fetchone()
    conn.execute("PRAGMA query_only = 0")
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.qmd_vocab USING fts5vocab(main, documents_fts, 'row')")
        conn.execute("CREATE VIRTUAL TABLE temp.qmd_places USING fts5vocab(main, documents_fts, 'instance')")
    finally:
        conn.execute(f"PRAGMA query_only = {int(query_only)}")


def term_count_check(conn: sqlite3.Connection) -> tuple[bool, str]:
    """`qmd doctor`'s word on the counts: whether `fts_terms` holds exactly what FTS5's
    vocabulary counts (a pass over it: 1.4 s at a million chunks)."""
    if not has_term_counts(conn):
        return False, "the keyword index keeps no term counts (schema older than 11)"
    if not counts_kept(conn):
        return True, "keyword term counts: being made again (searches count their words meanwhile)"
    vocabulary_tables(conn)
    terms, agreeing, present = conn.execute(
        "SELECT count(*), coalesce(sum(t.docs IS v.doc), 0), coalesce(sum(t.docs IS NOT NULL), 0)"
        " FROM temp.qmd_vocab v LEFT JOIN fts_terms t ON t.term = v.term"
    ).fetchone()
    (kept,) = conn.execute("SELECT count(*) FROM fts_terms").fetchone()
    if terms == agreeing == kept:
        return True, f"keyword term counts: {terms:,} terms, as FTS5 counts them"
    differ = terms - agreeing + kept - present  # wrong or missing, and kept for no term of the index
    return False, f"{differ:,} keyword term counts differ from FTS5's: `qmd cleanup` makes them again"


def term_counts(conn: sqlite3.Connection, terms: Sequence[str]) -> list[int]:
    """How many documents hold each of these terms (FTS5 tokens), from `fts_terms`."""
    found: dict[str, int] = {}
    for chunk in _chunks(terms):
        sql = f"SELECT term, docs FROM fts_terms WHERE term IN ({','.join('?' * len(chunk))})"
        found.update((term, int(n)) for term, n in conn.execute(sql, list(chunk)))
    return [found.get(term, 0) for term in terms]


def indexed_rows(conn: Connection) -> int:
    """The row count FTS5's bm25 uses as N. FTS5 keeps one ``_docsize`` row per indexed
    row, written as the row is (its totals record waits for the commit), and an ordinary
    table counts in microseconds where ``count(*)`` on the FTS table scans it (8 ms at 100k)."""
    return int(conn.execute("SELECT count(*) FROM documents_fts_docsize").fetchone()[0])


def repair_fts_totals(conn: sqlite3.Connection) -> bool:
    """Make FTS5's totals record (row count and tokens per column: bm25's N and average
    lengths) agree with the rows it holds. In a contentless-delete table (SQLite 3.51)
    a DELETE leaves the totals as they were, so every edit or removal inflates N, which
    skews every idf and the score normaliser that counts the real rows. Checked after
    each write (two lookups); recomputed from ``_docsize`` when it drifted, in its own
    transaction, since FTS5 rewrites the totals it cached when a transaction commits.
    Returns whether it repaired anything."""
    row = conn.execute("SELECT block FROM documents_fts_data WHERE id = 1").fetchone()
    recorded = fts5_varints(row[0]) if row and row[0] else []
    rows = indexed_rows(conn)
    if not recorded or recorded[0] == rows:
        return False
    totals = [0] * (len(recorded) - 1)
    for (size,) in conn.execute("SELECT sz FROM documents_fts_docsize"):
        for column, tokens in enumerate(fts5_varints(size)[: len(totals)]):
            totals[column] += tokens
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "UPDATE documents_fts_data SET block = ? WHERE id = 1", (b"".join(map(varint_bytes, [rows, *totals])),)
    )
    conn.execute("COMMIT")
    log.info("FTS totals repaired: %d rows recorded, %d present", recorded[0], rows)
    return True
