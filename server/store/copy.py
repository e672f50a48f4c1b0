"""`qmd index copy SRC DST`: an index moved between backends (SQLite ⇄ Postgres), vectors
included, ids kept, so every pointer and docid means what it meant.

What is copied is what the index records: contents, documents and their metadata, the
collections' record, runs and skips, the model cache, vector spaces and chunk vectors. What
is derived from those (the keyword index; on Postgres, each space's pgvector table) is rebuilt
on the destination by the same functions an update and an embed use, so a copy is searchable
the way a fresh index is.

All or nothing. The source is read in one snapshot. A Postgres destination is written in
one transaction, checked, and only then committed; a SQLite one is built in a file beside it
that replaces it only once checked. Interrupted (Ctrl-C, a crash, the server gone), the
destination is as it was; run the copy again.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qmd.server.config import is_index_url
from qmd.server.errors import Conflict, QmdError
from qmd.server.store import metadata, vectors
from qmd.server.store.db import Connection, IndexStore, is_postgres, snapshot
from qmd.server.store.fts import FtsDoc, fts_put, pause_term_counts, recount_terms
from qmd.server.store.sqlite import Store

Progress = Callable[[dict[str, Any]], None]

TABLES: tuple[tuple[str, str, str], ...] = (
    ("content", "hash, doc, created_at", "hash"),
    (
        "documents",
        "id, collection, path, title, hash, created_at, modified_at, active, size, mtime_ns, meta_state, meta_error",
        "id",
    ),
    ("document_metadata", "doc_id, key, type, value, folded, multi", "doc_id, key, type, value"),
    (
        "store_collections",
        "name, path, pattern, ignore_patterns, include_by_default, update_command, context",
        "rowid",
    ),
    ("store_config", "key, value", "key"),
    ("skipped_files", "collection, path, reason, seen_at, size, mtime_ns", "collection, path"),
    ("collection_runs", "collection, updated_at, summary", "collection"),
    ("llm_cache", "hash, result, created_at, model", "hash"),
    ("vector_spaces", "id, fingerprint, model, dims, created_at", "id"),
    (
        "content_vectors",
        "id, space_id, hash, seq, pos, end_pos, start_line, end_line, tokens, clipped, total_chunks,"
        " embedded_at, embedding, chunk_key",
        "id",
    ),
    ("chunkless_contents", "space_id, hash", "space_id, hash"),
    ("vector_collection_ids", "id, name", "id"),
    ("vector_rows", "id, space_id, chunk_id, collection_id", "id"),
)
"""Each recorded table, its columns and its order, parents before children."""

IDENTITY = ("documents", "vector_spaces", "content_vectors", "vector_collection_ids", "vector_rows")
"""Tables whose ids Postgres hands out: its sequences move past the copied ids."""

BATCH = 1000


@dataclass
class CopyReport:
    """What `qmd index copy` moved, and the check that the destination holds it all."""

    source: str
    destination: str
    rows: dict[str, int] = field(default_factory=dict)
    """Rows copied per table (equal on both sides: checked before the copy is kept)."""
    keyword_documents: int = 0
    """Documents indexed for keyword search on the destination."""
    vector_rows: int = 0
    """Search rows (`vector_rows`) of the destination's vector spaces."""
    seconds: float = 0.0


def _counts(conn: Connection) -> dict[str, int]:
    return {t: int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t, _, _ in TABLES}


def _empty(conn: Connection) -> bool:
    return all(n == 0 for n in _counts(conn).values())


def _clear(conn: Connection) -> None:
    """Empty a Postgres index in the copy's transaction (`--replace`)."""
    for space in vectors.spaces(conn):
        vectors.drop_space(conn, space)
    for table, _, _ in reversed(TABLES):
        conn.execute(f"DELETE FROM {table}")
    conn.execute("DELETE FROM lex_postings")
    conn.execute("DELETE FROM lex_terms")
    conn.execute("DELETE FROM lex_docs")
    conn.execute("UPDATE lex_totals SET docs = 0, tokens = 0")


def _fill(src: Connection, dst: Connection, progress: Progress, report: CopyReport, cancel: threading.Event) -> None:
    """Copy every table, rebuild what is derived, and check the counts (writer of `dst`)."""
    expected = _counts(src)
    for table, columns, order in TABLES:
        marks = ", ".join("?" * len(columns.split(",")))
        insert = f"INSERT INTO {table} ({columns}) VALUES ({marks})"
        done = 0
        cur = src.execute(f"SELECT {columns} FROM {table} ORDER BY {order}")
        while rows := cur.fetchmany(BATCH):
            if cancel.is_set():
                raise QmdError("the copy was interrupted; the destination is as it was")
            if table == "document_metadata":  # each backend's form of a value (`metadata.store_rows`)
                metadata.store_rows(dst, [(d, k, t, metadata.read_value(src, t, v), f, m) for d, k, t, v, f, m in rows])
            else:
                dst.executemany(insert, [tuple(r) for r in rows])
            done += len(rows)
            progress({"event": "progress", "table": table, "done": done, "total": expected[table]})
        report.rows[table] = done
    if is_postgres(dst):
        for table in IDENTITY:
            dst.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), coalesce(max(id), 0) + 1, false) FROM {table}"
            )
    progress({"event": "step", "step": "rebuilding the keyword index"})
    paused = pause_term_counts(dst)  # one recount after, not one update a batch
    report.keyword_documents = _keyword_index(dst)
    if paused:
        recount_terms(dst)
    if vectors.space_table(dst) is not None:  # pgvector's tables; SQLite reads content_vectors itself
        progress({"event": "step", "step": "rebuilding the vector tables"})
    for space in vectors.spaces(dst):
        report.vector_rows += vectors.fill_space_table(dst, space)
    progress({"event": "step", "step": "checking the copy"})
    found = _counts(dst)
    if found != expected or found != report.rows:
        differ = ", ".join(f"{t} {expected[t]} → {found[t]}" for t in expected if expected[t] != found[t])
        raise RuntimeError(f"the copy does not hold what the source does ({differ}); nothing was kept")
    active = int(dst.execute("SELECT count(*) FROM documents WHERE active = 1").fetchone()[0])
    if report.keyword_documents != active:
        raise RuntimeError(f"{report.keyword_documents} of {active} documents reached the keyword index")


def _keyword_index(conn: Connection) -> int:
    """Index every active document for keyword search, as an update does, a batch at a time."""
    n = 0
    cur = conn.execute(
        "SELECT d.id, d.collection, d.path, d.title, c.doc, d.hash FROM documents d JOIN content c ON c.hash = d.hash"
        " WHERE d.active = 1 ORDER BY d.id"
    )
    while rows := cur.fetchmany(BATCH):
        fts_put(conn, [FtsDoc(int(i), coll, path, title, body, h) for i, coll, path, title, body, h in rows])
        n += len(rows)
    return n


def copy_index(
    source: IndexStore,
    destination: str | Path,
    *,
    replace: bool = False,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> CopyReport:
    """Copy `source` into `destination`: a ``postgresql://`` URL or a SQLite file. A
    destination that holds anything is refused unless `replace`."""
    say = progress or (lambda _: None)
    stop = cancel or threading.Event()
    t0 = time.monotonic()
    report = CopyReport(source=source.location, destination="")
    if isinstance(destination, str) and is_index_url(destination):
        from qmd.server.store.pg_store import PgStore

        dst = PgStore(destination)
        report.destination = dst.location
        try:
            if not replace:
                _refuse_occupied(dst)
            with source.read() as src, snapshot(src):

                def fill(conn: Connection) -> None:
                    if replace:
                        _clear(conn)
                    _fill(src, conn, say, report, stop)

                dst.write(fill)
        finally:
            dst.close()
    else:
        path = Path(destination).expanduser().resolve()
        report.destination = str(path)
        if path.exists() and not replace:
            store = Store(path)
            try:
                _refuse_occupied(store)
            finally:
                store.close()
        building = path.with_name(path.name + ".copying")
        _remove(building)  # what an interrupted copy left
        try:
            store = Store(building)
            try:
                with source.read() as src, snapshot(src):
                    store.write(lambda conn: _fill(src, conn, say, report, stop))
            finally:
                store.close()
            _remove(path)
            os.replace(building, path)
        finally:
            _remove(building)
    report.seconds = time.monotonic() - t0
    return report


def _refuse_occupied(store: IndexStore) -> None:
    with store.read() as conn:
        if not _empty(conn):
            raise Conflict(
                f"{store.location} already holds an index: copy refuses to overwrite one (--replace empties it first)"
            )


def _remove(db: Path) -> None:
    for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        p.unlink(missing_ok=True)
