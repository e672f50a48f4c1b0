"""The SQLite index: one writer thread, concurrent readers; the schema is migrated on open.

Following datasette: every write is a function handed to a single writer thread
through a queue and run inside one `BEGIN IMMEDIATE` transaction, so writes never
contend and a failed write rolls back whole. Reads use per-thread connections in WAL
mode and never block on the writer, so no request ever sees "database is locked".
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from qmd.paths import private_file
from qmd.server.index.db import sqlite3
from qmd.server.index.schema import migrate
from qmd.server.search.lexical import norm_cjk

log = logging.getLogger("qmd.store")
T = TypeVar("T")


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def fts_put(conn: sqlite3.Connection, doc_id: int, filepath: str, title: str, body: str) -> None:
    """(Re)write one active document's FTS row; rowid = documents.id."""
    conn.execute("DELETE FROM documents_fts WHERE rowid = ?", (doc_id,))
    conn.execute(
        "INSERT INTO documents_fts(rowid, filepath, title, body) VALUES (?, ?, ?, ?)",
        (doc_id, filepath, norm_cjk(title), norm_cjk(body)),
    )


def fts_delete(conn: sqlite3.Connection, doc_ids: list[int]) -> None:
    for i in range(0, len(doc_ids), 500):
        chunk = doc_ids[i : i + 500]
        conn.execute(f"DELETE FROM documents_fts WHERE rowid IN ({','.join('?' * len(chunk))})", chunk)


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA synchronous = NORMAL")
    if readonly:
        conn.execute("PRAGMA query_only = 1")
    return conn


def _load_vec(conn: sqlite3.Connection) -> str | None:
    """sqlite-vec is optional for keyword search; return its version or None."""
    try:
        import sqlite_vec

        conn.enable_load_extension(True)
        sqlite_vec.load(conn)
        conn.enable_load_extension(False)
        return str(conn.execute("SELECT vec_version()").fetchone()[0])
    except Exception as e:  # noqa: BLE001 - any failure means "no vectors", announced by status
        log.warning("sqlite-vec could not be loaded: %s", e)
        return None


class Store:
    """Owns the index file. Use `read()` for queries and `write(fn)` for changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        private_file(path)  # SQLite gives the -wal and -shm files the database's own mode
        for side in (Path(f"{path}-wal"), Path(f"{path}-shm")):
            if side.exists():
                private_file(side)
        self._queue: queue.Queue[tuple[Callable[[sqlite3.Connection], object], Future, bool] | None] = queue.Queue()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self.generation = 0
        """Bumped after every committed write: lets callers cache what they derive from the index."""
        wconn = _connect(path, readonly=False)
        try:
            self.vec_version = _load_vec(wconn)
            # before the switch to WAL, so an index refused as too new is not touched at all
            migrate(wconn, path)
            mode = wconn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise RuntimeError(f"could not switch {path} to WAL mode (got {mode})")
        except BaseException:
            wconn.close()
            raise
        self.sqlite_version: str = sqlite3.sqlite_version
        """The SQLite library the index runs on (pysqlite3's bundled one, or the system's)."""
        self._writer = threading.Thread(target=self._write_loop, args=(wconn,), name="qmd-writer", daemon=True)
        self._writer.start()

    # -- writes -------------------------------------------------------------

    def _write_loop(self, conn: sqlite3.Connection) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            fn, fut, bump = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                conn.execute("BEGIN IMMEDIATE")
                result = fn(conn)
                conn.execute("COMMIT")
                if bump:
                    self.generation += 1
            except BaseException as e:  # noqa: BLE001 - the caller gets the exception
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                fut.set_exception(e)
            else:
                fut.set_result(result)
        try:
            conn.execute("PRAGMA optimize")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()

    def submit(self, fn: Callable[[sqlite3.Connection], T], *, bump: bool = True) -> Future[T]:
        """Queue `fn(conn)` to run in one transaction on the writer thread. `bump=False`
        for writes that change nothing derived from documents (the model cache), so
        `generation`-keyed caches survive them."""
        if self._closed:
            raise RuntimeError("the index is closed")
        fut: Future[T] = Future()
        self._queue.put((fn, fut, bump))
        return fut

    def write(self, fn: Callable[[sqlite3.Connection], T], *, bump: bool = True) -> T:
        """Like `submit`, and wait for the result (re-raising the writer's exception)."""
        return self.submit(fn, bump=bump).result()

    # -- reads --------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path, readonly=True)
            if self.vec_version:
                _load_vec(conn)
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        yield conn

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._writer.join(timeout=30)
        with self._readers_lock:
            for conn in self._readers:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._readers.clear()
