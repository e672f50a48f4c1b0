"""An index on a Postgres server, behind the same store contract as SQLite's
(server/store/sqlite.py): per-thread read connections, every write one transaction on one
writer thread fed by a queue, `generation` bumped by each committed write.

The index modules write their SQL once, in the dialect both backends speak (see
server/store/db.py); `PgConnection` is the thin adapter that lets psycopg run it: ``?``
placeholders become ``%s``, the few spellings only SQLite has are rewritten by one table
(`_REWRITES`), rows answer by position and by column name as ``sqlite3.Row`` does, and
numeric aggregates come back as int or float, never Decimal. What has no common spelling
(FTS5 and its Postgres postings, sqlite-vec and pgvector, pragmas and VACUUM) is chosen by
`is_postgres` in the module that owns it; what differs in the search floor's SQL, by the
`POSTGRES` dialect each connection carries (server/store/dialect.py).

Many daemons may serve one server: the generation is a row every write moves, so a
daemon sees another's writes in its caches; coordination of who indexes what is an
advisory lock per collection (`collection_lock`), which Postgres releases when the
holder's session ends, a crashed daemon's included.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.adapt import Loader
from psycopg_pool import ConnectionPool, PoolTimeout

from qmd.server.config import describe_url
from qmd.server.errors import Conflict, InvalidInput, Unavailable
from qmd.server.store import pg
from qmd.server.store.db import Connection, Cursor, IndexCheck, Vacuum, Writer, sqlite3
from qmd.server.store.dialect import POSTGRES

log = logging.getLogger("qmd.pg")
T = TypeVar("T")

STATEMENT_TIMEOUT_MS = 30_000
"""A read statement's limit (`QMD_PG_STATEMENT_TIMEOUT_MS`): a stuck query gives a clear
error instead of holding a request forever. Writes have none (a large update may take long)."""

_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = (
    # a JSON array parameter as a set of values (collection names, model names; ids through a CAST)
    (re.compile(r"FROM json_each\(\?\)"), "FROM json_array_elements_text(?::json) AS value"),
    # a column's values as a JSON array, in the rows' order ('[]' for none, as SQLite gives)
    (re.compile(r"\bjson_group_array\(([\w.]+)\)"), r"coalesce(json_agg(\1)::text, '[]')"),
    # SQLite's CROSS JOIN fixes the join order; Postgres plans it itself, and has no CROSS JOIN … ON
    (re.compile(r"\bCROSS JOIN (\w+ \w+) ON\b"), r"JOIN \1 ON"),
    # SQLite's unary plus (`+d.collection IN …`) keeps its planner off an index; Postgres has no + for text
    (re.compile(r"(?<![\w)\]])\+(?=[a-z_]+\.[a-z_]+ IN\b)"), ""),
    (re.compile(r"\binstr\("), "strpos("),
    # text as its UTF-8 bytes (a byte length)
    (re.compile(r"CAST\(([\w.]+) AS BLOB\)"), r"convert_to(\1, 'UTF8')"),
    # a reader's BEGIN is a snapshot on SQLite: repeatable read is Postgres' one
    (re.compile(r"^BEGIN$"), "BEGIN ISOLATION LEVEL REPEATABLE READ"),
    # an empty list: SQLite allows `x IN ()`, Postgres wants an (empty) subquery of x's type
    (re.compile(r"([\w.]+) (NOT )?IN \(\)"), r"\1 \2IN (SELECT \1 WHERE false)"),
    # SQLite's LIKE ignores ASCII case; with the C collation ILIKE folds ASCII only, too
    (re.compile(r"\bLIKE\b"), "ILIKE"),
)


@functools.lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """`sql` as psycopg takes it (always given a parameter tuple, maybe empty): the rewrites,
    ``?`` → ``%s`` outside string literals and quoted names, and every ``%`` doubled."""
    for pattern, repl in _REWRITES:
        sql = pattern.sub(repl, sql)
    out: list[str] = []
    quote = ""
    for ch in sql:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "?":
            out.append("%s")
            continue
        out.append("%%" if ch == "%" else ch)
    return "".join(out)


class Row(tuple[Any, ...]):
    """A result row by position or by column name, as ``sqlite3.Row``."""

    _names: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def _rows(cursor: psycopg.Cursor[Any]) -> Callable[[Sequence[Any]], Row]:
    names = {c.name: i for i, c in enumerate(cursor.description or ())}

    def make(values: Sequence[Any]) -> Row:
        row = Row(values)
        row._names = names
        return row

    return make


class _NumericLoader(Loader):
    """numeric (what sum() and avg() of integers give) as int when whole, else float."""

    def load(self, data: Any) -> int | float:
        text = bytes(data).decode()
        return int(text) if "." not in text and "e" not in text.lower() else float(text)


class PgConnection:
    """A psycopg connection speaking the index modules' SQL (see the module docstring)."""

    dialect = POSTGRES

    def __init__(self, raw: psycopg.Connection[Any], *, index: str | None = None, reader: bool = False) -> None:
        self.raw = raw
        """The psycopg connection itself, for the Postgres-only modules (postings, pgvector)."""
        self.index = index
        """The index it reads (its server and schema), by which what is derived from it may
        be kept in memory; None: keep nothing."""
        self.reader = reader
        """A pooled reader: it sees only committed rows (the writer also sees its own)."""

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor:
        cur = self.raw.cursor(row_factory=_rows)
        cur.execute(translate(sql), tuple(parameters))
        return cur

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Cursor:
        cur = self.raw.cursor(row_factory=_rows)
        cur.executemany(translate(sql), [tuple(p) for p in parameters])
        return cur

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


LOCK_WAIT_S = 60.0
"""How long an update or embed waits for another daemon's on the same collection (`QMD_PG_LOCK_WAIT_S`)."""


N = TypeVar("N", int, float)


def _setting(name: str, default: N, least: N, what: str) -> N:
    """The number in environment variable `name` (`default` when unset), at least `least`,
    or a clear error naming it; `what` says what it counts."""
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = type(default)(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be a number of {what}, got {raw!r}") from None
    if value < least:
        raise InvalidInput(f"{name} must be at least {least}, got {raw!r}")
    return value


def _lock_wait() -> float:
    return _setting("QMD_PG_LOCK_WAIT_S", LOCK_WAIT_S, 0.0, "seconds")


def _pool_size() -> int:
    return _setting("QMD_PG_POOL_SIZE", POOL_SIZE, 1, "connections")


def raw(conn: Connection) -> psycopg.Connection[Any]:
    """The psycopg connection under a Postgres index's adapter, for the Postgres-only
    modules (postings, pgvector); the caller has checked `is_postgres`."""
    assert isinstance(conn, PgConnection)
    return conn.raw


def _statement_timeout() -> int:
    """0: no limit."""
    return _setting("QMD_PG_STATEMENT_TIMEOUT_MS", STATEMENT_TIMEOUT_MS, 0, "milliseconds")


def _first(cur: psycopg.Cursor[Any]) -> Any:
    row = cur.fetchone()
    return None if row is None else row[0]


POOL_SIZE = 8
"""Read connections a daemon keeps to the server at most (`QMD_PG_POOL_SIZE`); the writer and
each running update's lock hold one more each."""

POOL_WAIT_S = 30.0
"""How long a read waits for a free connection before it is refused."""

POOL_PROBE_S = 2.0
"""How long a read waits for a connection before it asks whether the server answers at all
(`PROBE_CONNECT_S` more at most): a server that is down is told at once, as unreachable,
rather than after `POOL_WAIT_S` as a busy pool."""

PROBE_CONNECT_S = 2
"""libpq's connect_timeout for that question (whole seconds)."""


def _settings() -> dict[str, Any]:
    # the application name tells a daemon waiting for a lock who holds it (`PgStore.exclusive`)
    return {
        "autocommit": True,
        "connect_timeout": 10,
        "application_name": f"qmd pid {os.getpid()} on {socket.gethostname()}",
    }


def _configure(raw: psycopg.Connection[Any], timeout_ms: int | None) -> None:
    raw.adapters.register_loader("numeric", _NumericLoader)
    if timeout_ms is not None:
        raw.execute("SELECT set_config('statement_timeout', %s, false)", (str(timeout_ms),))


def _open(url: str, *, timeout_ms: int | None) -> psycopg.Connection[Any]:
    raw = pg.reach(url, **_settings())
    _configure(raw, timeout_ms)
    return raw


def _vacuum(conn: PgConnection, want: bool | None) -> Vacuum:
    """VACUUM (ANALYZE) only when asked: autovacuum keeps the tables otherwise."""
    if want is False:
        return Vacuum(False, "not asked for (--no-vacuum)", 0, 0)
    if want is None:
        return Vacuum(False, "Postgres' autovacuum reclaims space; --vacuum runs VACUUM (ANALYZE) now", 0, 0)
    t0 = time.monotonic()
    conn.execute("VACUUM (ANALYZE)")
    return Vacuum(True, "asked for (--vacuum)", 0, 0, time.monotonic() - t0)


class PgStore(Writer[PgConnection]):
    """The index on a Postgres server at `url`; the same contract as `Store`."""

    postgres = True
    dialect = POSTGRES

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self._timeout = _statement_timeout()
        wconn = _open(url, timeout_ms=None)
        try:
            pg.migrate(wconn, self.location)  # under its lock: a second daemon waits, then finds it done
            self.vector_missing = pg.ensure_vector(wconn)
            """Why the database has no `vector` extension (the SQL to run and who can), or None."""
            row = wconn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
            self._vec_version: str | None = None if row is None else f"pgvector {row[0]}"
            if row is None:
                log.warning(
                    "%s has no `vector` extension: vector search is unavailable — %s",
                    self.location,
                    self.vector_missing,
                )
            version = wconn.execute("SELECT current_setting('server_version'), current_schema()").fetchone()
            assert version is not None
            self.server_version = str(version[0])
            self._schema = str(version[1])
            """The index's schema: ``public``, or a named index's own (`config.schema_url`)."""
            self._key = f"{self.location}#{self._schema}"
            """What this index's derived caches are kept by (`PgConnection.index`)."""
        except BaseException:
            wconn.close()
            raise
        self._local = threading.local()
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=_pool_size(),
            kwargs=_settings(),
            configure=lambda raw: _configure(raw, self._timeout),
            check=ConnectionPool.check_connection,  # a connection the server dropped is replaced, not handed out
            name="qmd-pg-readers",
            open=True,
        )
        self._start(PgConnection(wconn, index=self._key), "qmd-pg-writer")

    @property
    def location(self) -> str:
        return describe_url(self.url)

    @property
    def vec_version(self) -> str | None:
        return self._vec_version

    @property
    def sqlite_version(self) -> str:
        """The SQLite library whose FTS5 tokenizer cuts the text (server/store/fts_tokens.py)."""
        return sqlite3.sqlite_version

    @property
    def generation(self) -> int:
        with self.read() as conn:
            return int(conn.execute("SELECT generation FROM qmd_generation").fetchone()[0])

    # -- writes -------------------------------------------------------------

    def _live(self, raw: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        """The writer's session, or a new one if the server ended it (a restart, a failover):
        one round trip before each write, so a dropped session costs no write."""
        if not (raw.closed or raw.broken):
            try:
                raw.execute("SELECT 1")
                return raw
            except psycopg.OperationalError:
                raw.close()
        log.warning("the session to %s was lost; reconnecting", self.location)
        return _open(self.url, timeout_ms=None)

    def _run(
        self, conn: PgConnection, fn: Callable[[PgConnection], T], bump: bool, transaction: bool
    ) -> tuple[PgConnection, T]:
        """`fn` runs on a session checked first (`_live`): a new one if the server ended it."""
        try:
            raw = self._live(conn.raw)
            conn = conn if raw is conn.raw else PgConnection(raw, index=conn.index)
            if not transaction:
                return conn, fn(conn)
            with raw.transaction():
                result = fn(conn)
                if bump:
                    raw.execute("UPDATE qmd_generation SET generation = generation + 1")
            return conn, result
        except psycopg.OperationalError as e:
            raise Unavailable(f"Postgres index {self.location}: {str(e).strip()}") from None

    def _end(self, conn: PgConnection) -> None:
        conn.raw.close()

    # -- reads --------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[PgConnection]:
        """A connection from the pool for the block; a read inside a read on the same thread
        (a helper called with the index open) shares the outer one, so the pool never waits
        on itself."""
        held: PgConnection | None = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
        try:
            with ExitStack() as stack:
                self._local.conn = conn = PgConnection(self._checkout(stack), index=self._key, reader=True)
                try:
                    yield conn
                finally:
                    self._local.conn = None
        except PoolTimeout:
            raise Unavailable(
                f"every connection to the Postgres index {self.location} is busy"
                f" ({self._pool.max_size}, QMD_PG_POOL_SIZE); try again"
            ) from None
        except psycopg.errors.QueryCanceled as e:
            raise Unavailable(
                f"a query on the Postgres index {self.location} ran past its statement timeout"
                f" ({self._timeout} ms, QMD_PG_STATEMENT_TIMEOUT_MS): {str(e).strip()}"
            ) from None
        except psycopg.OperationalError as e:
            raise Unavailable(f"Postgres index {self.location}: {str(e).strip()}") from None

    def _checkout(self, stack: ExitStack) -> psycopg.Connection[Any]:
        """A pooled connection, returned when `stack` closes. One not free within
        `POOL_PROBE_S` is waited for only while the server answers a connection of its own:
        when it does not, the pool is not busy but cut off (a stopped server, a lost
        network), and the read fails now, saying so."""
        try:
            return stack.enter_context(self._pool.connection(timeout=POOL_PROBE_S))
        except PoolTimeout:
            try:
                pg.reach(self.url, **{**_settings(), "connect_timeout": PROBE_CONNECT_S}).close()
            except Unavailable as e:
                raise Unavailable(f"{e.message}; every read fails until it answers again") from None
        return stack.enter_context(self._pool.connection(timeout=POOL_WAIT_S - POOL_PROBE_S))

    @contextmanager
    def exclusive(self, what: str) -> Iterator[None]:
        """An advisory lock on a session of its own, held until the block ends; another
        holder is waited for up to `LOCK_WAIT_S` (`QMD_PG_LOCK_WAIT_S`), then refused, naming it."""
        name = f"qmd:{self._schema}:{what}"  # an index per schema: its own locks
        key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)
        raw = _open(self.url, timeout_ms=None)
        try:
            wait = _lock_wait()
            deadline = time.monotonic() + wait
            while not _first(raw.execute("SELECT pg_try_advisory_lock(%s)", (key,))):
                if time.monotonic() >= deadline:
                    holder = raw.execute(
                        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                        " WHERE l.locktype = 'advisory' AND l.granted"
                        " AND (l.classid::bigint << 32 | l.objid::bigint) = %s",
                        (key,),
                    ).fetchone()
                    by = f" by {holder[0]}" if holder and holder[0] else " by another daemon"
                    raise Conflict(
                        f"{what.replace(':', ' of collection ', 1)} is running{by} on {self.location};"
                        f" waited {wait:g} s (QMD_PG_LOCK_WAIT_S). Try again when it is done."
                    )
                time.sleep(0.2)
            yield
        finally:
            raw.close()  # ends the session, and the lock with it

    def checks(self) -> list[IndexCheck]:
        """The server, its extensions, the schema and the indexes searches rely on."""
        from qmd.server.store import pg_vectors

        with self.read() as conn:
            t0 = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            rtt = (time.perf_counter() - t0) * 1000
            version = pg.schema_version(conn.raw)
            spaces = [int(r[0]) for r in conn.execute("SELECT id FROM vector_spaces ORDER BY id")]
            indexed = {
                r[0] for r in conn.execute("SELECT tablename FROM pg_indexes WHERE indexdef ILIKE '%USING hnsw%'")
            }
        out = [
            IndexCheck(
                True,
                f"index {self.location} (PostgreSQL {self.server_version}, schema version {version},"
                f" {rtt:.1f} ms a round trip; statement timeout {self._timeout} ms)",
            )
        ]
        vec = self._vec_version
        if vec is None:
            out.append(IndexCheck(False, f"no `vector` extension: no vector search — {self.vector_missing}"))
        else:
            recent = tuple(int(p) for p in vec.split()[-1].split(".")[:2]) >= (0, 8)
            out.append(IndexCheck(recent, vec if recent else f"{vec}: before 0.8 scoped searches come up short"))
        missing = [pg_vectors.table_name(s) for s in spaces if pg_vectors.table_name(s) not in indexed]
        out.append(
            IndexCheck(
                not missing,
                f"HNSW index on {len(spaces)} vector space(s)"
                if not missing
                else f"no HNSW index on {', '.join(missing)}: vector search there scans every row",
            )
        )
        return out

    def compact(self, vacuum: bool | None, step: Callable[[str], None]) -> tuple[Vacuum, bool]:
        """The postings need no merging, and autovacuum reclaims space unless a VACUUM is asked for."""
        step("vacuum")
        return self.maintain(functools.partial(_vacuum, want=vacuum)), False

    def merge_keyword_segments(self, changed: int) -> bool:
        return False

    def size_bytes(self) -> int:
        with self.read() as conn:
            return int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])

    def close(self) -> None:
        if self._stop_writer():
            self._pool.close()
