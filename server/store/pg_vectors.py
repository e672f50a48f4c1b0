"""Vectors on Postgres (pgvector): one table per vector space (issue 14), and
`PgvectorTables`, the `VectorTables` (server/store/vector_tables.py) a Postgres index's
searches go through, as a SQLite one's go through `SqliteTables` (server/store/vectors.py).

SQLite reads each vector where it is stored (`content_vectors`); here each space has a
table ``vectors_s<space>`` of its rows keyed by ``vector_rows.id``: the row id as primary
key, the collection id with a btree on it, and the embedding as a
``halfvec`` with an HNSW index over cosine distance. Half floats take 199 MB for 100k
384-dim vectors with their indexes where float32 ``vector`` takes 354, build faster, and found
the same top 10 sets by exact search (bench/bench_postgres_vectors.py; figures in the README).
A distance is ``embedding <=> query`` over the stored half floats on every path (HNSW, exact
scan, eligible rows), so the paths agree to the last bit; against the float32 distance
SQLite computed before its schema 10 (which stores half floats too: `vector_codec`), the
rounding moved one by at most 5e-5 (measured up to 200k vectors), which can swap two hits
that close and nothing else (exact top 10s held float32's rows in 300 of 300 searches of a
large collection; 4 of 300 of a small one differed in order or in a tenth row).

A search in a collection is exact while the collection is small (``EXACT_UP_TO`` rows: a
scan of its rows by the btree beats a filtered HNSW walk there) or a small share of its
space (``EXACT_SHARE``: there a filtered walk loses its way). Otherwise the daemon's
in-memory first pass answers (server/store/vector_index.py, the one SQLite's searches use:
recall@10 ≥ 0.99 where HNSW found 0.72 of the top 10 at a million rows of a clustered mixture,
0.015 at a million uniform ones), its rows measured again here (`distances`); and until it is in, or
in a process without it, an HNSW walk with pgvector 0.8's iterative scan, which keeps walking
until the filter has let `k` rows through; should it give up (``hnsw.max_scan_tuples``)
before that, the exact scan answers, so a collection with `k` rows always returns `k`. The HNSW settings are
``SET LOCAL`` in a savepoint (or transaction) that is rolled back after the read, so they
never outlive the statement, whoever owns the surrounding transaction.

Functions take an autocommit ``psycopg.Connection``; writes run in ``conn.transaction()``,
which is the caller's transaction's savepoint when there is one, so a failed batch leaves
nothing behind. Bad input (a vector of the wrong size, a NaN) is `InvalidInput`; a space
without a table is `NotFound`; a database without pgvector is `Unavailable`.
"""

from __future__ import annotations

import array
import json
import struct
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from qmd.server.errors import Conflict, InvalidInput, NotFound, Unavailable
from qmd.server.store.db import Connection
from qmd.server.store.metadata import DocFilter, ids_sql
from qmd.server.store.vector_tables import FirstPass, Space, VecHit, documents_for, ranked, widened

HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64
"""pgvector's defaults: with `EF_SEARCH` they reach recall@10 0.994 at 200k (the issue asks
0.95), in an 83 s build on 2 cores. At a million rows of the bench's hard mixture they level
off near 0.90 (`ROWS_PER_EF`), but m 32 with ef_construction 128 had not built in 33 minutes
where these take 8 (bench/bench_postgres_vectors.py)."""
EF_SEARCH = 100
"""The HNSW candidate list for a small `k` in a space of up to `ROWS_PER_EF` × 100 rows (a
larger `k` gets `k`, up to pgvector's 1,000, past which the iterative scan supplies the
rest). Measured at 200k: 40 (pgvector's default) gives recall@10 0.864, 64 0.944, 100 0.994
at p50 5.6 ms."""
ROWS_PER_EF = 5_000
"""A larger space gets a candidate list of one per this many rows: at a million rows (the
bench's hard mixture) 100 found 0.72 of the top 10 in 12.7 ms, 200 0.83 in 21 ms, 400 0.89
in 39 ms; past that the graph itself is the limit (800: 0.90 in 70 ms)."""
EXACT_UP_TO = 5_000
"""A collection of at most this many rows is searched exactly: a scan costs ~1.3 ms and
0.75 ms per 1,000 rows at 384 dims (measured), so at most about what an HNSW walk does, and
the answer is exact. (Left alone, the planner often makes the same choice from its estimates;
this makes it a rule.)"""
EXACT_SHARE = 0.05
"""A collection of at most this share of its space's rows (the table's row estimate) is
searched exactly too, however many rows that is: a walk filtered to a share s passes about
1/s rows for each it keeps and loses its way, so at a million rows a 1% collection's walk
found a quarter of the true top 10 (bench/bench_postgres_vectors.py), where the exact scan
of its 10,000 rows takes ~9 ms."""
MAX_HNSW_DIMS = 4_000
"""pgvector indexes a halfvec of at most 4,000 dimensions with HNSW."""
HALF_MAX = 65_504.0
"""The largest half float: a stored value must not exceed it (unit vectors never come near)."""
MAX_BUILD_MB = 2_048
"""The most memory `build_index` asks for (``maintenance_work_mem``)."""
GRAPH_BYTES_PER_LINK = 64
"""A row's neighbour lists and bookkeeping in pgvector's in-memory graph, per unit of `HNSW_M`,
with room to spare."""
_MAX_EF_SEARCH = 1_000


def table_name(space_id: int) -> str:
    return f"vectors_s{int(space_id)}"


def _said(e: psycopg.Error) -> str:
    """The server's message and its detail (which key), without the statement excerpt
    psycopg adds below them."""
    said = e.diag.message_primary or str(e).strip()
    return f"{said} ({e.diag.message_detail})" if e.diag.message_detail else said


@contextmanager
def _errors(space_id: int) -> Iterator[None]:
    """Postgres' refusals as the engine's errors, naming the space: a vector of the wrong
    size or with a NaN, a table that is not there (dropped by another daemon) or already is,
    a database without the `vector` extension."""
    try:
        yield
    except psycopg.errors.UndefinedTable:
        raise NotFound(f"vector space {space_id} has no table {table_name(space_id)}") from None
    except psycopg.errors.DuplicateTable:
        raise Conflict(f"vector space {space_id} already has a table {table_name(space_id)}") from None
    except psycopg.errors.DataException as e:
        raise InvalidInput(f"vector space {space_id}: {_said(e)}") from None
    except psycopg.errors.UndefinedObject as e:  # `type "halfvec" does not exist`
        raise Unavailable(
            f"vector space {space_id}: the database has no pgvector ({_said(e)});"
            " a superuser can add it with CREATE EXTENSION vector"
        ) from None


def create_space_table(conn: psycopg.Connection, space_id: int, dims: int, *, indexed: bool = True) -> None:
    """The space's table with a btree on the collection and, unless `indexed` is False, its
    HNSW index: what the Postgres `vectors.ensure_space` makes on first use of a fingerprint.
    A bulk load (a copy of a whole index) creates it without, inserts, then `build_index`:
    rows inserted into the index cost 1.4 ms each (20k, measured), a build 0.25 ms (10k)."""
    if not 1 <= dims <= MAX_HNSW_DIMS:
        raise InvalidInput(f"vector space {space_id}: {dims} dimensions; Postgres indexes 1 to {MAX_HNSW_DIMS}")
    t = table_name(space_id)
    with _errors(space_id), conn.transaction():
        conn.execute(
            f"CREATE TABLE {t} (id bigint PRIMARY KEY, collection_id integer NOT NULL,"
            f" embedding halfvec({int(dims)}) NOT NULL)"
        )
        conn.execute(f"CREATE INDEX {t}_collection ON {t} (collection_id)")
        if indexed:
            _create_hnsw(conn, t)


def _create_hnsw(conn: psycopg.Connection, t: str) -> None:
    conn.execute(
        f"CREATE INDEX IF NOT EXISTS {t}_hnsw ON {t} USING hnsw (embedding halfvec_cosine_ops)"
        f" WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION})"
    )


def build_index(conn: psycopg.Connection, space_id: int) -> None:
    """Build the HNSW index of a table made without one (nothing to do if it has it), with
    ``maintenance_work_mem`` sized for the whole graph (up to `MAX_BUILD_MB`): past it
    pgvector goes on building on disk, many times slower."""
    t = table_name(space_id)
    with _errors(space_id), conn.transaction():
        row = conn.execute(f"SELECT count(*), coalesce(max(vector_dims(embedding)), 0) FROM {t}").fetchone()
        assert row is not None  # an aggregate always returns its row
        need = row[0] * (2 * row[1] + GRAPH_BYTES_PER_LINK * HNSW_M) // 2**20
        conn.execute("SELECT set_config('maintenance_work_mem', %s, true)", (f"{min(MAX_BUILD_MB, max(64, need))}MB",))
        _create_hnsw(conn, t)


def drop_space_table(conn: psycopg.Connection, space_id: int) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {table_name(space_id)}")


_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)


def _copy_rows(space_id: int, rows: Sequence[tuple[int, int, bytes]]) -> bytes:
    """The rows as one binary COPY stream: three fields a row, the embedding in halfvec's
    wire form (dims and a zero as int16, then the half floats, all big-endian). numpy is
    imported here, by the embed job's write, and not with the daemon (see vectors.py)."""
    import numpy as np

    dims = len(rows[0][2]) // 4
    for _rid, _cid, blob in rows:
        if len(blob) != 4 * dims or not dims:
            raise InvalidInput(
                f"vector space {space_id}: a batch holds vectors of {len(blob)} and {4 * dims} bytes;"
                " every embedding must be float32 and of the space's size"
            )
    record = np.dtype(
        [
            ("fields", ">i2"),
            ("id_len", ">i4"),
            ("id", ">i8"),
            ("cid_len", ">i4"),
            ("cid", ">i4"),
            ("vec_len", ">i4"),
            ("dims", ">i2"),
            ("unused", ">i2"),
            ("embedding", ">f2", (dims,)),
        ]
    )
    out = np.zeros(len(rows), dtype=record)
    out["fields"] = 3
    out["id_len"] = 8
    out["cid_len"] = 4
    out["vec_len"] = 4 + 2 * dims
    out["dims"] = dims
    out["id"] = [r[0] for r in rows]
    out["cid"] = [r[1] for r in rows]
    values = np.frombuffer(b"".join(r[2] for r in rows), dtype="<f4").reshape(len(rows), dims)
    if np.any(np.abs(values) > HALF_MAX):  # NaN compares False: the server refuses it by name
        raise InvalidInput(
            f"vector space {space_id}: an embedding holds a value beyond ±{HALF_MAX:g}, the largest half float"
        )
    out["embedding"] = values
    return _COPY_HEADER + out.tobytes() + _COPY_TRAILER


def insert_rows(conn: psycopg.Connection, space_id: int, rows: Sequence[tuple[int, int, bytes]]) -> None:
    """Add (row id, collection id, embedding) rows, the embedding as float32 bytes
    (little-endian; `PgvectorTables.insert` decodes `content_vectors`' stored form to it):
    one binary COPY, all or nothing. A row id already present is a `Conflict`, as a primary
    key is."""
    if not rows:
        return
    data = _copy_rows(space_id, rows)
    with _errors(space_id), conn.transaction(), conn.cursor() as cur:
        try:
            with cur.copy(
                f"COPY {table_name(space_id)} (id, collection_id, embedding) FROM STDIN (FORMAT BINARY)"
            ) as cp:
                cp.write(data)
        except psycopg.errors.UniqueViolation as e:
            raise Conflict(f"vector space {space_id}: {_said(e)}") from None


def delete_rows(conn: psycopg.Connection, space_id: int, row_ids: Sequence[int]) -> int:
    """Remove these rows (ids not present are ignored); returns how many went."""
    if not row_ids:
        return 0
    with _errors(space_id):
        return conn.execute(f"DELETE FROM {table_name(space_id)} WHERE id = ANY(%s)", (list(row_ids),)).rowcount


def _literal(query: bytes | Sequence[float]) -> str:
    """The query as halfvec's text form; bytes are float32 (little-endian). The server rounds
    it to half floats exactly as the stored rows were rounded. Each value is made a Python
    float first: numpy 2 writes its own scalars as `np.float32(…)`, which the server refuses."""
    values = array.array("f", query).tolist() if isinstance(query, bytes) else [float(v) for v in query]
    return str(values)


def _exact(
    conn: psycopg.Connection, space_id: int, q: str, where: str, params: Sequence[object], k: int | None
) -> list[tuple[int, float]]:
    """Distances to the rows `where` selects, nearest first (ties by id), measured on each:
    the materialized CTE keeps the planner from answering through the HNSW index."""
    limit = "" if k is None else f" LIMIT {int(k)}"
    return conn.execute(
        f"WITH c AS MATERIALIZED (SELECT id, embedding <=> %s::halfvec AS d FROM {table_name(space_id)} WHERE {where})"
        f" SELECT id, d FROM c ORDER BY d, id{limit}",
        (q, *params),
    ).fetchall()


def ef_search(k: int, rows: float) -> int:
    """The HNSW candidate list for `k` nearest of a space of about `rows` rows."""
    return min(_MAX_EF_SEARCH, max(EF_SEARCH, k, int(rows / ROWS_PER_EF)))


def knn_exact(
    conn: psycopg.Connection, space_id: int, query: bytes | Sequence[float], k: int, collection_id: int
) -> list[tuple[int, float]]:
    """The collection's `k` nearest rows by a scan of all of its rows: (row id, cosine distance)."""
    with _errors(space_id):
        return _exact(conn, space_id, _literal(query), "collection_id = %s", (collection_id,), k)


def knn(
    conn: psycopg.Connection,
    space_id: int,
    query: bytes | Sequence[float],
    k: int,
    collection_id: int,
    first: Callable[[int], list[tuple[int, float]] | None] | None = None,
    held: int | None = None,
) -> list[tuple[int, float]]:
    """The collection's `k` nearest rows, (row id, cosine distance) nearest first: exact for a
    collection of at most `EXACT_UP_TO` rows or `EXACT_SHARE` of the space's; else `first(k)`,
    the daemon's in-memory first pass (recall@10 ≥ 0.99, with these distances), when it
    answers; else HNSW (approximate) with an iterative scan. Fewer than `k` only when the
    collection holds fewer. `held`: the rows the first pass last held of the collection; more
    than the exact scan's share spares counting them (at a million rows, 50,001 index entries
    a search)."""
    if k < 1:
        return []
    q = _literal(query)
    t = table_name(space_id)
    with _errors(space_id):
        estimate = conn.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", (t,)).fetchone()
        rows = max(0.0, estimate[0]) if estimate else 0.0  # -1 before the table's first ANALYZE
        exact_up_to = max(EXACT_UP_TO, int(rows * EXACT_SHARE))
        if held is None or held <= exact_up_to:
            small = conn.execute(
                f"SELECT count(*) <= %s FROM (SELECT 1 FROM {t} WHERE collection_id = %s LIMIT %s) s",
                (exact_up_to, collection_id, exact_up_to + 1),
            ).fetchone()
            if small and small[0]:
                return _exact(conn, space_id, q, "collection_id = %s", (collection_id,), k)
    if first is not None and (found := first(k)) is not None:
        return found
    with _errors(space_id), conn.transaction(force_rollback=True):
        conn.execute(
            "SELECT set_config('hnsw.ef_search', %s, true), set_config('hnsw.iterative_scan', 'relaxed_order', true)",
            (str(ef_search(k, rows)),),
        )
        # relaxed_order may hand rows back slightly out of order: the outer ORDER BY sorts them
        found = conn.execute(
            f"WITH nn AS MATERIALIZED (SELECT id, embedding <=> %s::halfvec AS d FROM {t}"
            " WHERE collection_id = %s ORDER BY d LIMIT %s) SELECT id, d FROM nn ORDER BY d, id",
            (q, collection_id, k),
        ).fetchall()
        if len(found) < k:  # the walk gave up before the filter let k rows through
            return _exact(conn, space_id, q, "collection_id = %s", (collection_id,), k)
        return found


def distances(
    conn: psycopg.Connection, space_id: int, query: bytes | Sequence[float], row_ids: Sequence[int]
) -> list[tuple[int, float]]:
    """Exact distances to these rows, nearest first (ids not present are left out): the
    eligible-set path of a filter (`PgvectorTables.search`)."""
    if not row_ids:
        return []
    with _errors(space_id):
        return _exact(conn, space_id, _literal(query), "id = ANY(%s)", (list(row_ids),), None)


class PgvectorTables:
    """`VectorTables` on Postgres: `conn` for the SQL both backends share, `raw` (the psycopg
    connection under it) for the space's table. The daemon's in-memory first pass, when
    given, answers an unfiltered search of a large collection (`knn`); HNSW answers while it
    loads, and in a process without one."""

    def __init__(self, conn: Connection, raw: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._raw = raw

    def create(self, space: Space, *, bulk: bool) -> None:
        create_space_table(self._raw, space.id, space.dims, indexed=not bulk)

    def build_index(self, space: Space) -> None:
        build_index(self._raw, space.id)

    def drop(self, space: Space) -> None:
        drop_space_table(self._raw, space.id)

    def insert(self, space: Space, rows: Sequence[tuple[int, int, bytes]]) -> None:
        """Rows whose embeddings are as `content_vectors` stores them (`vector_codec`)."""
        from qmd.server.store import vector_codec

        x = vector_codec.decode([blob for _, _, blob in rows], space.dims)
        insert_rows(self._raw, space.id, [(rid, cid, v.tobytes()) for (rid, cid, _), v in zip(rows, x, strict=True)])

    def delete(self, space: Space, row_ids: Sequence[int]) -> None:
        delete_rows(self._raw, space.id, row_ids)

    def search(
        self,
        space: Space,
        query: Sequence[float],
        cid: int,
        collection: str,
        limit: int,
        doc_filter: DocFilter | None,
        index: FirstPass | None,
    ) -> list[VecHit]:
        """The partition's nearest rows (`knn`: exact for a small one, else the in-memory
        `index` once it is in, else HNSW), widened until `limit` documents are found; under a
        filter, exact over the eligible documents' chunks (`distances`), however few they are."""
        if doc_filter is not None:
            sql, params = ids_sql(collection, doc_filter)
            eligible = {int(r[0]) for r in self._conn.execute(sql, params)}
            return self._eligible(space, query, cid, collection, (sql, params), eligible)[:limit]

        def first(k: int) -> list[tuple[int, float]] | None:
            return None if index is None else index.knn(self._conn, space, cid, query, k, exact=False)

        held = None if index is None else index.rows(space, cid)
        # unfiltered, and `knn` always answers: `widened` has no reason to give up
        return (
            widened(self._conn, collection, limit, lambda k: knn(self._raw, space.id, query, k, cid, first, held)) or []
        )

    def nearest_of(
        self, space: Space, query: Sequence[float], cid: int, collection: str, doc_ids: Sequence[int]
    ) -> list[VecHit]:
        ids = json.dumps(sorted(set(doc_ids)))
        select = ("SELECT value::bigint FROM json_array_elements_text(?::json)", (ids,))
        return self._eligible(space, query, cid, collection, select, set(doc_ids))

    def _eligible(
        self,
        space: Space,
        query: Sequence[float],
        cid: int,
        collection: str,
        ids: tuple[str, Sequence[Any]],
        eligible: set[int],
    ) -> list[VecHit]:
        """The documents `ids` selects (SQL and parameters), each with its nearest chunk, nearest
        first: the distance to every one of their chunks in the partition (`distances`)."""
        sql, params = ids
        rows = [
            int(r[0])
            for r in self._conn.execute(
                "SELECT vr.id FROM documents d JOIN content_vectors cv ON cv.space_id = ? AND cv.hash = d.hash"
                f" JOIN vector_rows vr ON vr.chunk_id = cv.id AND vr.collection_id = ? WHERE d.id IN ({sql})",
                (space.id, cid, *params),
            )
        ]
        return ranked(documents_for(self._conn, distances(self._raw, space.id, query, rows), collection, eligible))
