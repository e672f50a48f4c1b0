"""The keyword index's rows: a document's title and body in, a document out, and FTS5's
totals kept honest. (On Postgres the same rows are postings: server/store/pg_lexical.py.)"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from qmd.server.store.db import Connection, is_postgres, sqlite3
from qmd.server.store.fts_tokens import fts5_varints, varint_bytes
from qmd.server.text.cjk import norm_cjk

log = logging.getLogger("qmd.store")


@dataclass(frozen=True)
class FtsDoc:
    """One active document as the keyword index takes it; its row is ``documents.id``."""

    doc_id: int
    collection: str
    path: str
    title: str
    body: str


def fts_put(conn: Connection, docs: Sequence[FtsDoc]) -> None:
    """(Re)write these documents' keyword-index rows (the ``filepath`` column is
    ``collection/path``): FTS5's rows, or on Postgres the postings, all in one go."""
    if is_postgres(conn):
        from qmd.server.store import pg_lexical, pg_store

        lex = [pg_lexical.LexDoc(d.doc_id, d.collection, f"{d.collection}/{d.path}", d.title, d.body) for d in docs]
        pg_lexical.put_documents(pg_store.raw(conn), lex)
        return
    for d in docs:
        conn.execute("DELETE FROM documents_fts WHERE rowid = ?", (d.doc_id,))
        conn.execute(
            "INSERT INTO documents_fts(rowid, filepath, title, body) VALUES (?, ?, ?, ?)",
            (d.doc_id, f"{d.collection}/{d.path}", norm_cjk(d.title), norm_cjk(d.body)),
        )


def fts_delete(conn: Connection, doc_ids: list[int]) -> None:
    if is_postgres(conn):
        from qmd.server.store import pg_lexical, pg_store

        pg_lexical.delete_documents(pg_store.raw(conn), doc_ids)
        return
    for i in range(0, len(doc_ids), 500):
        chunk = doc_ids[i : i + 500]
        conn.execute(f"DELETE FROM documents_fts WHERE rowid IN ({','.join('?' * len(chunk))})", chunk)


def indexed_rows(conn: sqlite3.Connection) -> int:
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
