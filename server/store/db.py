"""What the index layer's SQL runs on: the sqlite3 module, and the two protocols both
backends meet (SQLite's own connection, and server/store/pg_store.py's adapter over a
Postgres one), so everything above the stores is written once.

Python builds often ship an SQLite without extension loading (so no sqlite-vec) and
an old FTS5. `pysqlite3-binary` bundles a current SQLite with both; the stdlib
module is the fallback, and the store announces when vectors are unavailable.

The SQL the modules write is the dialect both speak: `?` placeholders, ``ON CONFLICT``
upserts, ``RETURNING`` for new ids. What only one backend has (FTS5, sqlite-vec, pragmas,
VACUUM) is behind `is_postgres`, in the module of the store that owns it; the floors above
the store get a `Dialect` instead (server/store/dialect.py), which says how, not which.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from qmd.server.store.dialect import POSTGRES, SQLITE, Dialect

if TYPE_CHECKING:
    # pysqlite3 ships no type information; its dbapi2 mirrors the stdlib module, so
    # the checker reads the stdlib stubs whichever one is loaded at run time.
    import sqlite3
else:
    try:
        import pysqlite3.dbapi2 as sqlite3
    except ImportError:  # pragma: no cover - platforms without the wheel
        import sqlite3

__all__ = [
    "Connection",
    "Cursor",
    "IndexCheck",
    "IndexStore",
    "Writer",
    "dialect_of",
    "is_postgres",
    "not_an_index",
    "snapshot",
    "sqlite3",
]

T = TypeVar("T")
C = TypeVar("C")


@dataclass(frozen=True)
class Vacuum:
    """What `qmd cleanup` did to give the space of dropped rows back, or why it did not."""

    ran: bool
    reason: str
    """Why it ran, or why not."""
    free_pages: int
    pages: int
    seconds: float = 0.0


@dataclass(frozen=True)
class IndexCheck:
    """One line of `qmd doctor` about the index's backend."""

    ok: bool
    what: str


class Cursor(Protocol):
    """What a statement's result offers: rows by position or by column name."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def fetchmany(self, size: int = ..., /) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """A connection to either backend, as the index modules use it."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Cursor: ...

    @property
    def in_transaction(self) -> bool: ...


class IndexStore(Protocol):
    """One index, on SQLite (server/store/sqlite.py) or Postgres (server/store/pg_store.py):
    reads on per-thread connections, every write one transaction on one writer thread."""

    postgres: bool
    dialect: Dialect
    """The SQL its connections speak where the backends differ, for the floors above."""

    @property
    def generation(self) -> int:
        """Bumped after every committed write (on Postgres, by any daemon): lets callers
        cache what they derive from the index."""
        ...

    @property
    def vec_version(self) -> str | None:
        """The vector extension's version; None when vectors are unavailable."""
        ...

    @property
    def vector_missing(self) -> str | None:
        """Why this index cannot hold vectors, with what fixes it; None when it can."""
        ...

    @property
    def sqlite_version(self) -> str: ...

    @property
    def location(self) -> str:
        """Where the index lives, for messages: a file path or a URL without its password."""
        ...

    def read(self) -> AbstractContextManager[Connection]: ...

    def submit(self, fn: Callable[[Connection], T], *, bump: bool = True) -> Future[T]: ...

    def write(self, fn: Callable[[Connection], T], *, bump: bool = True) -> T: ...

    def maintain(self, fn: Callable[[Connection], T]) -> T: ...

    def compact(self, vacuum: bool | None, step: Callable[[str], None]) -> tuple[Vacuum, bool]:
        """After cleanup dropped rows: what this backend does to give their space back (VACUUM
        when `vacuum`, or when worth it for None), saying each `step` as it starts; the VACUUM's
        outcome, and whether the keyword index was merged."""
        ...

    def merge_keyword_segments(self, changed: int) -> bool:
        """After an indexing pass that changed `changed` documents: merge the keyword index
        into one b-tree when the pass was large enough to be worth it (a search reads every
        segment); True when it did. Nothing to do where the backend keeps no segments
        (Postgres' postings)."""
        ...

    def size_bytes(self) -> int:
        """What the index takes on disk (files, or the server's relations)."""
        ...

    def checks(self) -> list[IndexCheck]:
        """What `qmd doctor` says about the backend: versions, extensions, indexes."""
        ...

    def exclusive(self, what: str) -> AbstractContextManager[None]:
        """Hold `what` (``update:<collection>``, ``embed``) against every other process
        serving this index, waiting a while for a holder to finish: on Postgres an advisory
        lock, which the server releases if the holder dies; on SQLite nothing (one daemon
        owns the file, and its own locks order its work)."""
        ...

    def close(self) -> None: ...


@contextmanager
def snapshot(conn: Connection) -> Iterator[Connection]:
    """One read transaction, so every statement inside sees the same index; inside a
    caller's transaction, that one. Ended at once, as an open reader keeps the WAL
    from being checkpointed."""
    if conn.in_transaction:
        yield conn
        return
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        conn.execute("COMMIT")


def dialect_of(conn: Connection) -> Dialect:
    """The dialect `conn` speaks: the Postgres adapter carries its own (`PgConnection.dialect`);
    sqlite3's connection, which cannot, is SQLite's."""
    dialect: Dialect = getattr(conn, "dialect", SQLITE)
    return dialect


def is_postgres(conn: Connection) -> bool:
    """Whether `conn` is a Postgres index's, for the store's own backend-only modules."""
    return dialect_of(conn) is POSTGRES


class Writer(Generic[C]):
    """Both stores' write side, after datasette: every write is a function handed to one
    writer thread through a queue and run there, so writes never contend and each runs
    whole or not at all. A store says how one runs (`_run`) and how the thread ends (`_end`)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[[C], Any], Future[Any], bool, bool] | None] = queue.Queue()
        self._closed = False
        self._writer: threading.Thread | None = None

    def _start(self, conn: C, name: str) -> None:
        self._writer = threading.Thread(target=self._write_loop, args=(conn,), name=name, daemon=True)
        self._writer.start()

    def _run(self, conn: C, fn: Callable[[C], T], bump: bool, transaction: bool) -> tuple[C, T]:
        """Run `fn` (in one transaction unless not `transaction`); the connection to use from
        now on (a store may have replaced a lost one) and the result."""
        raise NotImplementedError

    def _end(self, conn: C) -> None:
        raise NotImplementedError

    def _write_loop(self, conn: C) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            fn, fut, bump, transaction = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                conn, result = self._run(conn, fn, bump, transaction)
            except BaseException as e:  # noqa: BLE001 - the caller gets the exception
                fut.set_exception(e)
            else:
                fut.set_result(result)
        self._end(conn)

    def submit(self, fn: Callable[[C], T], *, bump: bool = True) -> Future[T]:
        """Queue `fn(conn)` to run in one transaction on the writer thread. `bump=False`
        for writes that change nothing derived from documents (the model cache), so
        `generation`-keyed caches survive them."""
        return self._enqueue(fn, bump, transaction=True)

    def _enqueue(self, fn: Callable[[C], T], bump: bool, *, transaction: bool) -> Future[T]:
        if self._closed:
            raise RuntimeError("the index is closed")
        fut: Future[T] = Future()
        self._queue.put((fn, fut, bump, transaction))
        return fut

    def write(self, fn: Callable[[C], T], *, bump: bool = True) -> T:
        """Like `submit`, and wait for the result (re-raising the writer's exception)."""
        return self.submit(fn, bump=bump).result()

    def maintain(self, fn: Callable[[C], T]) -> T:
        """Run `fn(conn)` on the writer thread *outside* any transaction, and wait: for what a
        backend refuses inside one (VACUUM, a truncating WAL checkpoint). Nothing else writes
        meanwhile, since every write waits its turn on this thread; `fn` must leave no
        transaction open."""
        return self._enqueue(fn, False, transaction=False).result()

    def _stop_writer(self) -> bool:
        """End the writer thread after what is queued; False if it was stopped already."""
        if self._closed:
            return False
        self._closed = True
        self._queue.put(None)
        if self._writer is not None:
            self._writer.join(timeout=30)
        return True


def not_an_index(path: Path) -> str | None:
    """Why the SQLite file at `path` is no qmd index (None when it is one), found read-only:
    opening it as an index migrates it, so another program's database, or any file SQLite
    accepts (an empty one), would have qmd's tables written into it."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as e:
        return f"it cannot be opened: {e}"
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as e:
        return f"not an SQLite database: {e}"
    finally:
        conn.close()
    if not version or "documents" not in tables or "store_collections" not in tables:
        return "an SQLite database without qmd's tables" if tables else "an empty file or database"
    return None
