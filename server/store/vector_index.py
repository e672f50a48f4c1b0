"""The daemon's in-memory first pass over each vector partition, so a KNN reads no floats.

An exact KNN reads every float of the partition (sqlite-vec's vec0, before schema 9: 65-82
ms at 100k vectors of 384 dims on 2 cores; its bit and int8 quantized tables were measured
at only 2x and 0.6x of that here; the scan of `content_vectors` that replaced it, 1.6-2x).
So each searched (space, collection) partition gets, in memory:

1. a sign-bit code per vector (unit vector minus the partition's mean; RaBitQ's estimator
   without its rotation), scored against the query quantized to sign and 3 bits of
   magnitude: XOR, AND and popcount over 64-bit words, a block of rows at a time so they
   stay in cache, for a shortlist of ~1/16 of the rows (its threshold read off a sample of
   the estimates, not a partition of all of them);
2. an int8 copy of each unit vector (per-vector scale), ranking that shortlist: int8 · an
   integer copy of the query summed in int32, exact, a block at a time (no float copy of a
   row: the float pass this replaced made 96 MB of floats a search at 1M);
3. then `rescore`: the stored vectors of the best 2k read from SQLite and measured by
   `vector_codec.distances`, the function the exact scan computes, so the distances are the
   very ones an exact KNN returns, and a row deleted since the snapshot is simply not found:
   no hit can be stale.
Measured on Gaussian unit vectors (no clusters: the hard case), the passes this replaced
and these interleaved in one process on 2 cores, `nearest` with SQLite's rescoring on a
real Store (bench/bench_vectors.py's `build`), recall@10 against the exact scan: at 1M
vectors 38.8 ms p50 against 76.0 at load 0.2-2 (30 queries), 77-81 against 344-470 at
load 4-10 (40-100 queries; the float pass's 120 MB a search suffers most), recall 1.0 for
both; at 300k 25.1 against 44.4 at load 9 (0.998 both). Both passes are cut across the
cores (`cores.THREADS`): at 1M on 2 cores at load < 1, the first passes take 29.8 ms p50
against 40.6 in one thread (40 queries interleaved), the bit pass 18 against 26 and the
int8 ranking 7.6 against 14.7 (its rows are gathered from all over the copy, which two
threads overlap), on the pool's free workers, and not in a hybrid query, whose legs already
run side by side (store/cores.py). What is left is the bit pass's 18 ANDs and popcounts a
row, which numpy cannot fuse; on loaded cores (load 4-10) an earlier split of the bit pass
gained nothing.

Where the answer must be exact (a metadata filter's widened KNN, a partition of at most
`MIN_SHORTLIST` rows), the int8 copy is a bound instead: each row's residual e (|u −
s·int8|) and the query's own f cap how far the estimate can be off (`_bounded`), so every
row whose estimate plus that reaches the k-th best estimate minus it is measured
(`rescore`), and the rows are the exact scan's own.

What it costs: 460 bytes a vector of 384 dims (48 of sign bits, 384 of int8, 16 of ids,
12 of factors), 46 MB per 100k vectors (52 MB allocated, room for appends), against 154 MB
for a float32 copy; nothing for a partition never searched, and it goes with the Store. A
build writes each coded batch into the snapshot's columns, so at its peak it holds the
index and one batch, and a search allocates ~6 MB (the float pass made 120): in a process
that opens a store of 1M vectors, builds the index and searches, RSS 530 MiB after the
build against 876 before (peak 596 against 1,323; the index itself 494 MiB allocated).

Freshness: a snapshot is tagged with `Store.generation`, bumped after every committed
write. A search that finds the generation moved reads `vector_rows`' marks (the epoch, which
every deletion of vector rows changes, and the largest row id: `vector_tables.Marks`) in one
read transaction with what follows. The same epoch: the rows past the snapshot's top (the
embed job's batches) are read and written past its end in place, so the first search after
a batch reads that batch, at any size. A new epoch: the partition's signature (row count,
sums of row and chunk ids); unchanged, the snapshot is retagged; rows appended past its
last are appended; anything else (removals, a reused row id) is found by diffing the (row,
chunk) pairs. All under the partition's lock; a published snapshot never changes, so
concurrent readers need no lock.

Cold start: a partition's first search starts a background build (its own connection) and
is answered by the exact scan in SQLite (`vectors._knn`), as is every search until the
build is in, and while a change of more than `INLINE` rows is rebuilt; `VectorIndex.warm`
builds in the caller's thread (tests, benchmarks).

Postgres: the same index serves a collection pgvector would walk with HNSW (one larger than
its exact-scan rules, `pg_vectors.knn`), built from the same `vector_rows` and
`content_vectors` (the SQL both backends speak, a page of row ids at a time), and its best
rows are measured again by pgvector (`rescore`), so the distances are those of its HNSW walk
and exact scan. HNSW answers while a partition loads. The generation is a row every
daemon's writes move, and the writers of the vector tables take turns
(`vectors._vector_write`), so "the rows past the snapshot's top" holds across daemons too.
Measured with bench/bench_scale.py --backend postgres on its uniform random vectors (the
hard case for both): at 100k, 7.5 ms p50 at recall@10 0.995, where the HNSW walk took 11.8
ms at 0.15; at 1M 37 ms at 1.0, where it took 42 ms at 0.015.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import wait
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from qmd.server.store import cores, vector_codec
from qmd.server.store.db import Connection, IndexStore, sqlite3
from qmd.server.store.vector_tables import Marks, marks

log = logging.getLogger("qmd.vector_index")


class Space(Protocol):
    """What this index needs of a vector space (`vectors.Space` is one)."""

    @property
    def id(self) -> int: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def dims(self) -> int: ...


MAGNITUDE_BITS = 3
"""The query's |components| for the sign-bit pass, beside their signs: levels -7..7 ranked
the rows as well as the float query itself (Gaussian vectors, 200k, 100 queries)."""
SHORTLIST_SHARE = 16
"""The sign-bit pass keeps 1/16 of a partition (at least `MIN_SHORTLIST`). On Gaussian vectors
(200k, 100 queries) a true top-10 row fell outside the best 1/32 by the sign-bit estimate
0.019 of the time, outside 1/16 0.004, outside 1/8 never: 1/32 gave recall@10 0.979 at
100k (bench/bench_scale.py's vectors), 1/16 0.997-1.0 at 100k-1M."""
MIN_SHORTLIST = 2048
"""Also the largest partition searched by the exact pass alone (under 1 ms at this size)."""
MIN_RESCORED = 64
"""Rows the int8 pass hands to the exact measure (`rescore`) beyond a KNN's k (at least 2k)."""
INLINE = 50_000
"""A refresh reading more new rows than this goes to the background (the exact scan answers
meanwhile)."""
BUILD_INLINE = 10_000
"""A partition of at most this many rows is built by the search that first needs it (tens of
milliseconds), not in the background: a note folder just embedded is searched from its index
at once, without a "still loading" note."""
BATCH = 8192
"""Rows read and coded at a time while building: no float copy of a partition is ever held."""
BLOCK = 4096
"""Rows of the int8 copy read at a time by the int8 pass (1.5 MB at 384 dims: in cache; 2048
and 8192 measured 5-40% slower at 1M)."""
BITS_BLOCK = 8192
"""Rows at a time of the sign-bit pass: its planes × words temporaries (1.2 MB at 384 dims)
stay in the 2 MB L2; 4096 and 16384 measured 5-20% slower at 1M."""
SIGN_PART = 65_536
"""The fewest rows the sign-bit pass hands to another thread (3 MB of bits): a smaller part
costs about what the handoff does."""
INT8_PART = 8_192
"""The same for the int8 pass (3 MB of codes)."""
SAMPLE = 16384
"""Estimates sampled for the shortlist's threshold: at a 1/16 share, within ~3% of its size
(1.3 ms at 1M, where `np.argpartition` of all the estimates took 10)."""
ROUNDING = 1e-4
"""Margin of the int8 bound for rounding: the exact measure's float32 sums of 384 products
(`vector_codec.distances`, ~2e-5 at worst) and the estimate's scaling (~1e-7)."""

U64 = npt.NDArray[np.uint64]
F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]


@dataclass(frozen=True)
class Coded:
    """Rows coded for the index, one entry per row (bits as rows × 64-bit words)."""

    row_ids: I64
    chunk_ids: I64
    bits: U64
    factor: F32
    """|x'|² / |x'|₁ of each centred unit vector x': the estimator's scale."""
    int8: I8
    scale: F32
    residual: F32
    """|u − scale·int8| of each unit vector u: by Cauchy-Schwarz, the most the int8 estimate of
    a cosine can be off by, which makes the int8 pass a bound and not only a guess."""

    @staticmethod
    def empty(dims: int) -> Coded:
        f = np.zeros(0, np.float32)
        i = np.zeros(0, np.int64)
        return Coded(i, i, np.zeros((0, -(-dims // 64)), np.uint64), f, np.zeros((0, dims), np.int8), f, f)

    def signature(self) -> tuple[int, float, float]:
        """What `_SIGNATURE_SQL` gives for exactly these rows: a moved count or sum means a change."""
        return len(self.row_ids), float(self.row_ids.sum()), float(self.chunk_ids.sum())


_PER_ROW = tuple(f.name for f in fields(Coded) if f.name != "bits")
"""The columns stored as they are coded; the bits are stored transposed."""


class _Columns:
    """Growable columns of one partition's coded rows, of which a `Snapshot` sees a prefix.
    Rows are only ever written past `used`, which no published snapshot reaches, so a
    snapshot never changes under its readers (appends are writes under the partition's lock)."""

    def __init__(self, dims: int, capacity: int) -> None:
        self.used = 0
        self.row_ids = np.empty(capacity, np.int64)
        self.chunk_ids = np.empty(capacity, np.int64)
        self.bits = np.empty((-(-dims // 64), capacity), np.uint64)
        """Transposed, (words, rows): one contiguous array per 64-bit word for the scan."""
        self.factor = np.empty(capacity, np.float32)
        self.int8 = np.empty((capacity, dims), np.int8)
        self.scale = np.empty(capacity, np.float32)
        self.residual = np.empty(capacity, np.float32)

    @property
    def capacity(self) -> int:
        return len(self.row_ids)

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes + sum(getattr(self, name).nbytes for name in _PER_ROW)

    def append(self, rows: Coded) -> None:
        lo, hi = self.used, self.used + len(rows.row_ids)
        self.bits[:, lo:hi] = rows.bits.T
        for name in _PER_ROW:
            getattr(self, name)[lo:hi] = getattr(rows, name)
        self.used = hi


def _room(rows: int) -> int:
    """Capacity for `rows`: an eighth more, so the embed job's batches append in place."""
    return rows + max(rows // 8, 1024)


@dataclass(frozen=True)
class Snapshot:
    """One partition's coded rows as of `generation` (the first `size` of `columns`), read
    when `vector_rows` stood at `marks`."""

    generation: int
    signature: tuple[int, float, float]
    marks: Marks
    mean: F32
    columns: _Columns
    size: int

    def rows(self, keep: npt.NDArray[np.bool_] | None = None) -> Coded:
        """Its rows (or the kept ones) as a copy, to write into new columns."""
        c, n = self.columns, self.size
        sel = slice(0, n) if keep is None else np.flatnonzero(keep)
        return Coded(bits=c.bits[:, :n].T[sel], **{name: getattr(c, name)[:n][sel] for name in _PER_ROW})

    @property
    def row_ids(self) -> I64:
        return self.columns.row_ids[: self.size]

    @property
    def chunk_ids(self) -> I64:
        return self.columns.chunk_ids[: self.size]

    @property
    def nbytes(self) -> int:
        return self.columns.nbytes + self.mean.nbytes

    def plus(self, added: Coded, generation: int, now: Marks) -> Snapshot:
        """This snapshot and `added` rows: in place when nothing was appended past it and
        there is room, else in new columns."""
        n = self.size + len(added.row_ids)
        signature = _sum(self.signature, added.signature())
        if self.columns.used == self.size and self.columns.capacity >= n:
            self.columns.append(added)
            return Snapshot(generation, signature, now, self.mean, self.columns, n)
        return _snapshot(generation, now, self.mean, [self.rows(), added], n)

    def minus(self, keep: npt.NDArray[np.bool_], added: Coded, generation: int, now: Marks) -> Snapshot:
        """The kept rows and `added`, in new columns."""
        kept = self.rows(keep)
        return _snapshot(generation, now, self.mean, [kept, added], len(kept.row_ids) + len(added.row_ids))


def _sum(a: tuple[int, float, float], b: tuple[int, float, float]) -> tuple[int, float, float]:
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


def _snapshot(generation: int, now: Marks, mean: F32, parts: Iterable[Coded], rows: int) -> Snapshot:
    """`rows` rows from `parts`, written into columns with room to append: a part at a time,
    so a partition read batch by batch is never held twice."""
    columns = _Columns(len(mean), _room(rows))
    signature = (0, 0.0, 0.0)
    for p in parts:
        columns.append(p)
        signature = _sum(signature, p.signature())
    return Snapshot(generation, signature, now, mean, columns, columns.used)


_SIGNATURE_SQL = (
    "SELECT count(*), coalesce(sum(id), 0), coalesce(sum(chunk_id), 0) FROM vector_rows"
    " WHERE space_id = ? AND collection_id = ?"
)


def _signature(conn: Connection, space_id: int, cid: int) -> tuple[int, float, float]:
    """Row count and id sums of the partition (one read of `vector_rows`)."""
    count, ids, chunks = conn.execute(_SIGNATURE_SQL, (space_id, cid)).fetchone()
    return int(count), float(ids), float(chunks)


def _at_most(conn: Connection, space: Space, cid: int, rows: int) -> bool:
    """Whether the partition holds at most `rows` rows, reading no more than one past them."""
    (n,) = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM vector_rows WHERE space_id = ? AND collection_id = ? LIMIT ?)",
        (space.id, cid, rows + 1),
    ).fetchone()
    return int(n) <= rows


def _pairs(conn: Connection, space: Space, cid: int) -> tuple[I64, I64]:
    """The partition's (row, chunk) ids, as one aggregate row (100k ids in ~20 ms); both
    arrays in the same row order."""
    rows, chunks = conn.execute(
        "SELECT json_group_array(id), json_group_array(chunk_id) FROM vector_rows"
        " WHERE space_id = ? AND collection_id = ?",
        (space.id, cid),
    ).fetchone()
    return np.array(json.loads(rows), dtype=np.int64), np.array(json.loads(chunks), dtype=np.int64)


def _pair_keys(row_ids: I64, chunk_ids: I64) -> I64:
    """One comparable value per (row, chunk): a row id reused for another chunk is a new row."""
    return (row_ids << 32) | chunk_ids


PAGE_SQL = (
    "SELECT vr.id, vr.chunk_id, cv.embedding FROM vector_rows vr CROSS JOIN content_vectors cv"
    " ON cv.id = vr.chunk_id WHERE vr.space_id = ? AND vr.collection_id = ? AND vr.id > ? {where}"
    " ORDER BY vr.id LIMIT {batch}"
)
"""A page of a partition's rows past a row id (`_batches`): an index range on both backends
(SQLite's rowid, Postgres' `idx_vector_rows_partition`, migration 9)."""


def _batches(
    conn: Connection, space: Space, cid: int, mean: F32, *, after: int = 0, where: str = "", arg: object = None
) -> Iterator[Coded]:
    """The partition's rows past row id `after` (those matching `where` on `vr`) coded batch
    by batch, a page of row ids at a time: no float copy of the partition is ever held, here
    or in a driver that fetches a whole result at once (psycopg's cursors do)."""
    while True:
        args: tuple[object, ...] = (space.id, cid, after) if arg is None else (space.id, cid, after, arg)
        rows = conn.execute(PAGE_SQL.format(where=where, batch=BATCH), args).fetchall()
        if not rows:
            return
        x = vector_codec.decode([r[2] for r in rows], space.dims)
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        chunks = np.array([r[1] for r in rows], dtype=np.int64)
        yield _code(ids, chunks, _unit(x), mean)
        if len(rows) < BATCH:
            return
        after = int(ids[-1])


def _read(
    conn: Connection, space: Space, cid: int, mean: F32, *, after: int = 0, where: str = "", arg: object = None
) -> Coded:
    """The rows matching `where`, coded, in one `Coded` (for a change: a whole partition is
    written batch by batch into its columns instead, see `VectorIndex._build`)."""
    parts = [Coded.empty(space.dims), *_batches(conn, space, cid, mean, after=after, where=where, arg=arg)]
    return Coded(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Coded)))


def _unit(x: F32) -> F32:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def _mean(conn: Connection, space: Space, cid: int) -> F32:
    """The centre of the codes: the mean unit vector of a sample (an estimator needs no more)."""
    rows = conn.execute(
        "SELECT cv.embedding FROM vector_rows vr CROSS JOIN content_vectors cv ON cv.id = vr.chunk_id"
        " WHERE vr.space_id = ? AND vr.collection_id = ? LIMIT ?",
        (space.id, cid, BATCH),
    ).fetchall()
    if not rows:
        return np.zeros(space.dims, np.float32)
    x = vector_codec.decode([r[0] for r in rows], space.dims)
    return _unit(x).mean(axis=0).astype(np.float32)


def _code(row_ids: I64, chunk_ids: I64, unit: F32, mean: F32) -> Coded:
    centred = unit - mean
    rows, dims = unit.shape
    signs = np.zeros((rows, -(-dims // 64) * 64), dtype=bool)
    signs[:, :dims] = centred > 0
    bits = np.packbits(signs, axis=1).view(np.uint64)
    l1 = np.abs(centred).sum(axis=1)
    factor = np.divide(np.einsum("ij,ij->i", centred, centred), l1, out=np.zeros_like(l1), where=l1 > 0)
    scale = (np.abs(unit).max(axis=1) / 127.0).astype(np.float32)
    int8 = np.round(np.divide(unit, scale[:, None], out=np.zeros_like(unit), where=scale[:, None] > 0))
    residual = np.linalg.norm(unit - int8 * scale[:, None], axis=1).astype(np.float32)
    return Coded(row_ids, chunk_ids, bits, factor.astype(np.float32), int8.astype(np.int8), scale, residual)


def rescore(
    conn: Connection, space: Space, cid: int, query: Sequence[float], row_ids: Sequence[int]
) -> list[tuple[int, float]]:
    """Exact cosine distances of these rows to `query`, nearest first, as the backend's exact
    search measures them: on SQLite by `vector_codec.distances` of its unit vector (what the
    exact scan, `vectors._knn`, computes), on Postgres by pgvector (`pg_vectors.distances`: the
    query as given, rounded to half floats as its HNSW walk and exact scan round it, so the
    distances are theirs to the bit). Rows no longer in the partition are not found."""
    if not isinstance(conn, sqlite3.Connection):
        from qmd.server.store import pg_vectors
        from qmd.server.store.pg_store import raw

        return pg_vectors.distances(raw(conn), space.id, query, row_ids)
    rows = conn.execute(
        "SELECT vr.id, cv.embedding FROM vector_rows vr CROSS JOIN content_vectors cv"
        " ON cv.id = vr.chunk_id WHERE vr.id IN (SELECT value FROM json_each(?))"
        " AND vr.space_id = ? AND vr.collection_id = ?",
        (json.dumps(list(row_ids)), space.id, cid),
    ).fetchall()
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    dist = vector_codec.distances(vector_codec.decode([r[1] for r in rows], space.dims), vector_codec.unit(query))
    return vector_codec.nearest(ids, dist, len(rows))


@dataclass(frozen=True)
class _Query:
    """A query as the passes read it: its unit vector and an integer copy of it, as fine as
    its products with int8 rows allow summed in int32 without overflow (the int8 pass is
    then an exact integer dot product, with no float copy of any row)."""

    unit: F32
    code: npt.NDArray[np.int16]
    scale: float
    residual: float
    """|unit − scale·code|: what the integer copy adds to the bound (see `_bounded`)."""

    @staticmethod
    def of(query: Sequence[float]) -> _Query:
        q = np.asarray(query, dtype=np.float32)
        unit = q / (float(np.linalg.norm(q)) or 1.0)
        top = min(np.iinfo(np.int16).max, np.iinfo(np.int32).max // (127 * max(len(unit), 1)))
        scale = float(np.abs(unit).max()) / top
        code = np.round(unit / (scale or 1.0)).astype(np.int16)
        residual = float(np.linalg.norm(unit.astype(np.float64) - scale * code))
        return _Query(unit, code, scale, residual)


@dataclass(frozen=True)
class _SignQuery:
    """A query quantized to sign·level for the sign-bit pass: its sign bits, and its levels
    as bit planes (planes × 64-bit words), whose sum `total` completes the estimate."""

    signs: U64
    planes: U64
    total: float

    @staticmethod
    def of(unit: F32, words: int) -> _SignQuery:
        step = float(np.abs(unit).max()) / ((1 << MAGNITUDE_BITS) - 1) or 1.0
        levels = np.zeros(words * 64, dtype=np.uint8)
        levels[: len(unit)] = np.round(np.abs(unit) / step).astype(np.uint8)
        signs = np.zeros(words * 64, dtype=bool)
        signs[: len(unit)] = unit > 0
        planes = (levels[None, :] >> np.arange(MAGNITUDE_BITS, dtype=np.uint8)[:, None]) & 1
        return _SignQuery(
            np.packbits(signs).view(np.uint64), np.packbits(planes, axis=1).view(np.uint64), float(levels.sum())
        )


def _sign_estimates(bits: U64, factor: F32, query: _SignQuery) -> F32:
    """Similarity estimates of the rows of `bits` (words × rows), up to a positive constant.
    With the query quantized to sign·step·level, q·sign(x') = step·(Σ level − 2·Σ level where
    the signs differ), and that last sum is Σ 2^p·popcount((signs ^ bits) & plane_p): XOR,
    AND and popcount over 64-bit words, a block of rows at a time so they stay in cache, the
    rows cut across the cores (`_in_parts`); each part's integer sums are made floats once, at its end."""
    estimate = np.empty(bits.shape[1], np.float32)

    def part(lo: int, hi: int) -> None:
        out = estimate[lo:hi]
        out[:] = _differ_levels(bits[:, lo:hi], query)
        out *= -2.0
        out += query.total
        out *= factor[lo:hi]

    _in_parts(bits.shape[1], SIGN_PART, part)
    return estimate


def _differ_levels(bits: U64, query: _SignQuery) -> npt.NDArray[np.uint16]:
    """Per row of `bits`: Σ level over the dimensions whose signs differ from the query's (at
    most 384·(2^MAGNITUDE_BITS − 1), so a uint16)."""
    words, n = bits.shape
    planes = len(query.planes)
    levels = np.empty(n, np.uint16)
    differ = np.empty((words, BITS_BLOCK), np.uint64)
    both = np.empty((planes, words, BITS_BLOCK), np.uint64)
    counts = np.empty(both.shape, np.uint8)
    sums = np.empty((planes, BITS_BLOCK), np.uint16)
    for lo in range(0, n, BITS_BLOCK):
        hi = min(n, lo + BITS_BLOCK)
        b = hi - lo
        np.bitwise_xor(bits[:, lo:hi], query.signs[:, None], out=differ[:, :b])
        np.bitwise_and(differ[None, :, :b], query.planes[:, :, None], out=both[:, :, :b])
        np.bitwise_count(both[:, :, :b], out=counts[:, :, :b])
        np.add.reduce(counts[:, :, :b], axis=1, dtype=np.uint16, out=sums[:, :b])
        total = levels[lo:hi]
        total[:] = sums[planes - 1, :b]
        for p in range(planes - 2, -1, -1):  # Horner: Σ 2^p·sums[p]
            total <<= 1
            total += sums[p, :b]
    return levels


def _in_parts(n: int, least: int, work: Callable[[int, int], None]) -> None:
    """`work(lo, hi)` over rows 0..n cut into up to `cores.THREADS` parts of at least `least`
    rows: the first in this thread, the others on the free helpers `cores.helpers` gives (none
    when the search shares the cores)."""
    with cores.helpers(min(cores.THREADS, n // least) - 1) as helpers:
        if helpers == 0:
            work(0, n)
            return
        step = -(-n // (helpers + 1))
        others = [cores.submit(work, lo, min(n, lo + step)) for lo in range(step, n, step)]
        try:
            work(0, step)
        finally:
            wait(others)
        for f in others:
            f.result()


def _shortlist(snap: Snapshot, unit: F32, m: int) -> I64:
    """About `m` rows of best estimated similarity by the sign-bit pass (in row order)."""
    c, n = snap.columns, snap.size
    query = _SignQuery.of(unit, c.bits.shape[0])
    return _about_best(_sign_estimates(c.bits[:, :n], c.factor[:n], query), m)


def _about_best(values: F32, m: int) -> I64:
    """The rows whose value reaches the `m`-th best of a strided sample's: about `m` of them,
    in row order, without partitioning all the values (`np.argpartition`: 10 ms at 1M)."""
    n = len(values)
    if m >= n:
        return np.arange(n, dtype=np.int64)
    sample = values[:: max(1, n // SAMPLE)]
    keep = min(len(sample), -(-m * len(sample) // n))
    floor = np.partition(sample, len(sample) - keep)[len(sample) - keep]
    return np.flatnonzero(values >= floor).astype(np.int64)


def _int8_sims(snap: Snapshot, query: _Query, rows: I64 | None = None) -> F32:
    """Cosine estimates from the int8 copy, of these rows or of all: int8 · the query's integer
    copy summed in int32 (exact), a block of rows at a time, so no float copy of a row is made,
    the rows cut across the cores (`_in_parts`) (reading the rows is most of it: a shortlist's are
    gathered from all over the copy)."""
    c = snap.columns
    n = snap.size if rows is None else len(rows)
    out = np.empty(n, np.float32)

    def part(first: int, last: int) -> None:
        for lo in range(first, last, BLOCK):
            hi = min(last, lo + BLOCK)
            codes = c.int8[lo:hi] if rows is None else c.int8[rows[lo:hi]]
            out[lo:hi] = np.einsum("ij,j->i", codes, query.code, dtype=np.int32, casting="unsafe")

    _in_parts(n, INT8_PART, part)
    return out * (c.scale[:n] if rows is None else c.scale[rows]) * np.float32(query.scale)


def _bounded(snap: Snapshot, query: _Query, k: int, rows: I64 | None) -> I64:
    """Every row (of all, or of `rows`) that can be among the `k` nearest: the int8 estimate
    of each, give or take how far it can be off, against the k-th best lower bound (plus a
    margin for float32 rounding). With u = ũ + e (|e| the row's residual) and the unit query
    q = q̃ + f: u·q − ũ·q̃ = e·q + ũ·f, at most |e| + (1 + |e|)·|f| by Cauchy-Schwarz."""
    sims = _int8_sims(snap, query, rows)
    residual = snap.columns.residual[: snap.size] if rows is None else snap.columns.residual[rows]
    error = residual + (1.0 + residual) * np.float32(query.residual)
    n = len(sims)
    floor = np.partition(sims - error, n - k)[n - k]
    found = np.flatnonzero(sims + error >= floor - ROUNDING).astype(np.int64)
    return found if rows is None else rows[found]


def candidates(snap: Snapshot, query: Sequence[float], k: int, *, exact: bool, within: I64 | None) -> I64:
    """The rows `nearest` measures exactly for a KNN of `k` (see there)."""
    q = _Query.of(query)
    n = snap.size if within is None else len(within)
    if exact or within is not None or n <= MIN_SHORTLIST:
        return _bounded(snap, q, k, within)
    measured = min(n, max(2 * k, k + MIN_RESCORED))
    rows = _shortlist(snap, q.unit, min(n, max(4 * measured, n // SHORTLIST_SHARE, MIN_SHORTLIST)))
    if measured < len(rows):
        rows = rows[np.argpartition(-_int8_sims(snap, q, rows), measured - 1)[:measured]]
    return rows


def nearest(
    conn: Connection,
    space: Space,
    cid: int,
    snap: Snapshot,
    query: Sequence[float],
    k: int,
    *,
    exact: bool = False,
    among: Sequence[int] | None = None,
) -> list[tuple[int, float]]:
    """The partition's `k` nearest rows (of those whose chunk is `among`, if given) with their
    exact distances (`rescore`). `exact`, `among`, or a partition of at most `MIN_SHORTLIST`
    rows: every row the int8 bound cannot rule out is measured, so these are the very rows
    an exact KNN returns. Otherwise a sign-bit shortlist, ranked by int8, the best measured:
    recall@10 ≥ 0.99 measured."""
    within = None if among is None else np.flatnonzero(np.isin(snap.chunk_ids, np.asarray(among, np.int64)))
    k = min(k, snap.size if within is None else len(within))
    if k <= 0:
        return []
    rows = candidates(snap, query, k, exact=exact, within=within)
    return rescore(conn, space, cid, query, snap.row_ids[rows].tolist())[:k]


def _refreshed(conn: Connection, space: Space, cid: int, snap: Snapshot, generation: int) -> Snapshot | None:
    """`snap` brought up to the partition as `conn` sees it now, in one read transaction. No
    row deleted since (the same epoch: `vector_tables.Marks`): nothing past its top is a
    retag, else the partition's rows past it (the embed job's batches) are appended, read from
    the row id index whatever the partition's size. After a deletion, a signature read: the
    same rows cost no more; rows appended past its last are appended; anything else
    (removals, a reused row id) is found by diffing the (row, chunk) pairs. None: more than
    `INLINE` rows to read."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        now = marks(conn, "vector_rows")
        if now.epoch == snap.marks.epoch:
            if now.top <= snap.marks.top:
                return replace(snap, generation=generation)
            added = _past(conn, space, cid, snap, snap.marks.top)
            return None if added is None else snap.plus(added, generation, now)
        signature = _signature(conn, space.id, cid)
        if signature == snap.signature:
            return replace(snap, generation=generation, marks=now)
        if signature[0] == 0:  # emptied (its space dropped, its collection removed): free the memory
            return _snapshot(generation, now, snap.mean, [], 0)
        added = _past(conn, space, cid, snap, int(snap.row_ids.max()) if snap.size else 0)
        if added is None:
            return None
        if _sum(snap.signature, added.signature()) == signature:
            return snap.plus(added, generation, now)
        row_ids, chunk_ids = _pairs(conn, space, cid)
        current = _pair_keys(row_ids, chunk_ids)
        held = _pair_keys(snap.row_ids, snap.chunk_ids)
        missing = row_ids[~np.isin(current, held)]
        if len(missing) > INLINE:
            return None
        added = _read(
            conn,
            space,
            cid,
            snap.mean,
            where="AND vr.id IN (SELECT CAST(value AS BIGINT) FROM json_each(?))",
            arg=json.dumps(missing.tolist()),
        )
        return snap.minus(np.isin(held, current), added, generation, now)
    finally:
        if own:
            conn.execute("COMMIT")


def _past(conn: Connection, space: Space, cid: int, snap: Snapshot, top: int) -> Coded | None:
    """The partition's rows past row id `top`, coded; None when more than `INLINE`."""
    (above,) = conn.execute(
        "SELECT count(*) FROM vector_rows WHERE space_id = ? AND collection_id = ? AND id > ?",
        (space.id, cid, top),
    ).fetchone()
    return None if above > INLINE else _read(conn, space, cid, snap.mean, after=top)


class _Partition:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.snapshot: Snapshot | None = None
        self.building = False


class VectorIndex:
    """The in-memory first passes of one Store's partitions (see the module's docstring)."""

    def __init__(self, store: IndexStore) -> None:
        self._store = weakref.ref(store)
        self._lock = threading.Lock()
        self._parts: dict[tuple[int, str, int], _Partition] = {}
        """By space id, fingerprint and collection id: a space dropped and another made gets
        the same id (SQLite reuses the highest), not the same partition."""

    def _live(self) -> IndexStore:
        store = self._store()
        if store is None:
            raise RuntimeError("the index is closed")
        return store

    def _generation(self) -> int:
        """The Store's: on Postgres a row every daemon's writes move, so a snapshot sees theirs too."""
        return self._live().generation

    def _part(self, space: Space, cid: int) -> _Partition:
        with self._lock:
            return self._parts.setdefault((space.id, space.fingerprint, cid), _Partition())

    def knn(
        self,
        conn: Connection,
        space: Space,
        cid: int,
        query: Sequence[float],
        k: int,
        *,
        exact: bool,
        among: Sequence[int] | None = None,
    ) -> list[tuple[int, float]] | None:
        """The `k` nearest rows of the partition as of this search (`nearest`), or None while
        its snapshot is being built (the caller asks SQLite)."""
        snap = self.fresh(conn, space, cid)
        return None if snap is None else nearest(conn, space, cid, snap, query, k, exact=exact, among=among)

    def rows(self, space: Space, cid: int) -> int | None:
        """How many rows the partition's snapshot holds, as last brought up to date (None
        before its first build): a size to decide by, read without touching the index."""
        snap = self._part(space, cid).snapshot
        return None if snap is None else snap.size

    def fresh(self, conn: Connection, space: Space, cid: int) -> Snapshot | None:
        """The partition's snapshot, brought up to the Store's generation first (inline for
        the embed job's batches; a change of more than `INLINE` rows goes to the background
        like the first build, and None means: not ready)."""
        part = self._part(space, cid)
        generation = self._generation()
        snap = part.snapshot
        if snap is not None and snap.generation == generation:
            return snap
        if part.building:
            return None
        with part.lock:
            snap = part.snapshot
            if snap is None and not part.building and _at_most(conn, space, cid, BUILD_INLINE):
                try:
                    part.snapshot = self._build(space, cid)
                except Exception:  # noqa: BLE001 - this search takes the exact scan; logged, retried by the next
                    log.exception("could not build the vector index of space %d, collection %d", space.id, cid)
                return part.snapshot
            if snap is None or part.building:
                self._start(space, cid, part)
                return None
            if snap.generation == generation:
                return snap
            snap = _refreshed(conn, space, cid, snap, generation)
            if snap is None:
                self._start(space, cid, part)
                return None
            part.snapshot = snap
            return snap

    def warm(self, space: Space, cid: int) -> Snapshot:
        """Build the partition's snapshot in this thread, now (tests and benchmarks time it)."""
        part = self._part(space, cid)
        with part.lock:
            part.snapshot = self._build(space, cid)
            return part.snapshot

    def _start(self, space: Space, cid: int, part: _Partition) -> None:
        """Build in the background (called under `part.lock`): one build per partition at a time."""
        if part.building:
            return
        part.building = True

        def run() -> None:
            try:
                snap = self._build(space, cid)
                with part.lock:
                    if part.snapshot is None or part.snapshot.generation <= snap.generation:
                        part.snapshot = snap
            except Exception:  # noqa: BLE001 - searches keep using the exact scan; logged, retried by the next one
                log.exception("could not build the vector index of space %d, collection %d", space.id, cid)
            finally:
                part.building = False

        threading.Thread(target=run, name=f"qmd-vector-index-{space.id}-{cid}", daemon=True).start()

    def _build(self, space: Space, cid: int) -> Snapshot:
        """A whole snapshot in one read transaction (a snapshot of the partition for the read
        and its signature), tagged with the generation read first, so a write committed
        meanwhile is caught by the next search's check. SQLite's on a connection of its own
        (this may be a background thread); Postgres' on one of the pool's."""
        generation = self._generation()
        with self._reading() as conn:
            conn.execute("BEGIN")  # repeatable read on Postgres
            try:
                now = marks(conn, "vector_rows")
                mean = _mean(conn, space, cid)
                rows = _signature(conn, space.id, cid)[0]
                return _snapshot(generation, now, mean, _batches(conn, space, cid, mean), rows)
            finally:
                conn.execute("COMMIT")

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        from qmd.server.store.sqlite import Store

        store = self._live()
        if not isinstance(store, Store):
            with store.read() as conn:
                yield conn
            return
        conn = sqlite3.connect(str(store.path), isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA query_only = 1")
            yield conn
        finally:
            conn.close()


_INDEXES: weakref.WeakKeyDictionary[IndexStore, VectorIndex] = weakref.WeakKeyDictionary()
_INDEXES_LOCK = threading.Lock()


def index_of(store: IndexStore) -> VectorIndex:
    """The Store's in-memory index, made on first use and gone with the Store."""
    with _INDEXES_LOCK:
        index = _INDEXES.get(store)
        if index is None:
            index = _INDEXES[store] = VectorIndex(store)
        return index
