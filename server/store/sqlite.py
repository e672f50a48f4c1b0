"""The SQLite index: one writer thread, concurrent readers; the schema is migrated on open.
(Its Postgres twin is server/store/pg_store.py; `open_store` picks one.)

Following datasette: every write is a function handed to a single writer thread
through a queue and run inside one `BEGIN IMMEDIATE` transaction, so writes never
contend and a failed write rolls back whole. Reads use per-thread connections in WAL
mode and never block on the writer, so no request ever sees "database is locked".
"""

from __future__ import annotations

import functools
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from qmd.paths import ForeignFile, private_file
from qmd.server.config import describe_url
from qmd.server.errors import Forbidden, Unavailable
from qmd.server.store.db import IndexCheck, IndexStore, Vacuum, Writer, sqlite3
from qmd.server.store.dialect import SQLITE
from qmd.server.store.fts import check_term_counts, indexed_rows, recount_terms, repair_fts_totals, term_count_check
from qmd.server.store.schema import migrate

log = logging.getLogger("qmd.store")
T = TypeVar("T")


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class ReadConnection(sqlite3.Connection):
    """A reading connection (``query_only``) that keeps what searches derive from the index
    between statements, such as each query word's document count: a full pass over its
    documents, the same for every query until the index changes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._seen = -1
        self._memo: dict[str, int] = {}

    def memo(self) -> dict[str, int] | None:
        """A dict that holds until another connection commits (``PRAGMA data_version``
        moves; this one never writes); None inside a transaction, whose snapshot may be
        older than the data version it would be kept under."""
        if self.in_transaction:
            return None
        (version,) = self.execute("PRAGMA data_version").fetchone()
        if version != self._seen or len(self._memo) > MEMO_ENTRIES:
            self._memo, self._seen = {}, version
        return self._memo


def remembered(conn: object, key: str, compute: Callable[[], int]) -> int:
    """`compute()`, kept under `key` while the index does not change when `conn` is a
    `ReadConnection` (any other connection computes it every time)."""
    memo = conn.memo() if isinstance(conn, ReadConnection) else None
    if memo is None:
        return compute()
    if (value := memo.get(key)) is None:
        value = memo[key] = compute()
    return value


MERGE_SHARE = 0.1
"""`Store.merge_keyword_segments` merges after a pass that changed at least this share of the
indexed documents: the merge costs about the whole keyword index, at most ten times the pass's
own writes."""
MEMO_ENTRIES = 10_000
"""At most this many derived values a connection keeps between writes (then it starts again)."""


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    factory = ReadConnection if readonly else sqlite3.Connection
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30, factory=factory)
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


def index_bytes(db: Path) -> int:
    """The index on disk: the database file and its write-ahead log."""
    total = 0
    for path in (db, Path(f"{db}-wal")):
        try:
            total += path.stat().st_size
        except OSError:
            pass
    return total


SIDE_FILES = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside an index (WAL mode's two, and the rollback journal it
uses until the switch to WAL)."""


def own_files(db: Path, *, create: bool = True) -> None:
    """Check the index and its side files are plain files of this user's, never links,
    before SQLite (which follows links) opens them, and make them private (SQLite gives
    the side files the database's own mode). A checked-in project can plant any of them,
    so each is refused (`Forbidden`, naming the path and the fix), never written through.
    `create`: make the database file when it is missing."""
    try:
        private_file(db, create=create)
        for suffix in SIDE_FILES:
            private_file(Path(f"{db}{suffix}"), create=False)
    except ForeignFile as e:
        raise Forbidden(str(e)) from None


def open_store(db: Path, url: str | None) -> IndexStore:
    """The index at `url` (a Postgres server) when one is given, else the SQLite file `db`."""
    if url is None:
        return Store(db)
    try:
        from qmd.server.store.pg_store import PgStore
    except ImportError as e:
        raise Unavailable(
            f"the index is on a Postgres server ({describe_url(url)}), and this qmd cannot reach one: {e}."
            " Install the postgres extra: pip install 'qmd[postgres]'"
        ) from None
    return PgStore(url)


VACUUM_FREE_SHARE = 0.10
"""VACUUM rewrites the whole file: worth it from this share of free pages on (below, SQLite
reuses them for the next writes anyway)."""


def _optimize_fts(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO documents_fts(documents_fts) VALUES ('optimize')")


def _vacuum(conn: sqlite3.Connection, db: Path, want: bool | None) -> Vacuum:
    """VACUUM when asked, or when worth it (`want` None), and there is room on disk for the
    copy it makes; then truncate the WAL either way. Outside any transaction (writer only)."""
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    share = free / pages if pages else 0.0
    live = (pages - free) * page_size
    t0 = time.monotonic()
    if want is False:
        outcome = Vacuum(False, "not asked for (--no-vacuum)", free, pages)
    elif want is None and share < VACUUM_FREE_SHARE:
        outcome = Vacuum(
            False, f"{share:.0%} of the file is free pages; VACUUM runs from {VACUUM_FREE_SHARE:.0%}", free, pages
        )
    elif shutil.disk_usage(db.parent).free < 2 * live:
        outcome = Vacuum(False, f"not enough free disk for its copy (it needs about {2 * live} bytes)", free, pages)
    else:
        conn.execute("VACUUM")
        why = "asked for (--vacuum)" if want else f"{share:.0%} of the file was free pages"
        outcome = Vacuum(True, why, free, pages, time.monotonic() - t0)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return outcome


class Store(Writer[sqlite3.Connection]):
    """Owns the index file. Use `read()` for queries and `write(fn)` for changes."""

    postgres = False
    dialect = SQLITE

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        own_files(path)
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self.generation = 0
        """Bumped after every committed write: lets callers cache what they derive from the index."""
        wconn = _connect(path, readonly=False)
        try:
            self.vec_version = _load_vec(wconn)
            self.vector_missing = (
                None if self.vec_version else "sqlite-vec could not be loaded (the daemon log says why): reinstall qmd"
            )
            # before the switch to WAL, so an index refused as too new is not touched at all
            migrate(wconn, path)
            repair_fts_totals(wconn)
            check_term_counts(wconn)
            mode = wconn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise RuntimeError(f"could not switch {path} to WAL mode (got {mode})")
        except BaseException:
            wconn.close()
            raise
        self.sqlite_version: str = sqlite3.sqlite_version
        """The SQLite library the index runs on (pysqlite3's bundled one, or the system's)."""
        self.location = str(path)
        self._start(wconn, "qmd-writer")

    # -- writes -------------------------------------------------------------

    def _run(
        self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T], bump: bool, transaction: bool
    ) -> tuple[sqlite3.Connection, T]:
        try:
            if transaction:
                conn.execute("BEGIN IMMEDIATE")
            result = fn(conn)
            if transaction:
                conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if bump:
            self._repair(conn)
            self.generation += 1
        return conn, result

    def _end(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA optimize")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()

    @staticmethod
    def _repair(conn: sqlite3.Connection) -> None:
        """`repair_fts_totals` after a committed write: a failure is logged, never the
        write's (it is committed), and the next write tries again."""
        try:
            repair_fts_totals(conn)
        except sqlite3.Error:
            log.exception("could not repair the FTS totals")
            if conn.in_transaction:
                conn.execute("ROLLBACK")

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

    def merge_keyword_segments(self, changed: int) -> bool:
        """FTS5 keeps each commit's terms as a new segment and merges them a few at a time, so a
        bulk index leaves ten or so, and a search reads each of its terms in every one: at a
        million chunks, merged into one, keyword search took 36 ms instead of 48. The merge
        rewrites the whole keyword index (2.3 s at a million chunks), so only after a pass that
        changed `MERGE_SHARE` of the documents; small passes' segments are small to read."""
        if changed <= 0:
            return False
        with self.read() as conn:
            (segments,) = conn.execute("SELECT count(DISTINCT segid) FROM documents_fts_idx").fetchone()
            rows = indexed_rows(conn)
        if segments <= 1 or changed < MERGE_SHARE * rows:
            return False
        self.write(_optimize_fts, bump=False)
        log.info("merged the keyword index's %d segments into one after %d documents changed", segments, changed)
        return True

    def size_bytes(self) -> int:
        return index_bytes(self.path)

    def compact(self, vacuum: bool | None, step: Callable[[str], None]) -> tuple[Vacuum, bool]:
        """FTS5's segments merged into one b-tree, then VACUUM (outside any transaction, on
        the writer thread, so nothing else writes meanwhile) and a truncating WAL checkpoint,
        so the bytes reported are the bytes on disk."""
        step("optimizing the keyword index")
        self.write(_optimize_fts)
        step("counting the keyword index's terms")
        self.write(recount_terms)
        step("vacuum")
        return self.maintain(functools.partial(_vacuum, db=self.path, want=vacuum)), True

    def exclusive(self, what: str) -> AbstractContextManager[None]:
        return nullcontext()

    def checks(self) -> list[IndexCheck]:
        """The index's version, keyword index and its term counts, and its free pages once
        `qmd cleanup` would VACUUM them (what an upgrade that dropped a table, schema
        migration 9, leaves)."""
        with self.read() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            fts = conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'documents_fts'").fetchone()[0]
            page_size, pages, free = (
                conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_size", "page_count", "freelist_count")
            )
            terms = term_count_check(conn) if fts else None
        checks = [
            IndexCheck(True, f"index {self.path} (SQLite {self.sqlite_version}, schema version {version})"),
            IndexCheck(bool(fts), "keyword index (FTS5)" if fts else "the keyword index (FTS5 table) is missing"),
        ]
        if terms is not None:
            checks.append(IndexCheck(*terms))
        if pages and free / pages >= VACUUM_FREE_SHARE:
            checks.append(
                IndexCheck(
                    False,
                    f"{free * page_size / 1e6:.0f} MB of the index file ({free / pages:.0%}) are free pages:"
                    " `qmd cleanup` gives them back to the disk",
                )
            )
        return checks

    def close(self) -> None:
        if not self._stop_writer():
            return
        with self._readers_lock:
            for conn in self._readers:
                try:
                    conn.close()
                except sqlite3.Error:
                    pass
            self._readers.clear()
