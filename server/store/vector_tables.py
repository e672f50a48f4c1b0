"""A vector space's rows as one backend keeps them: the `VectorTables` protocol both
backends' searches meet, on the model of httpx's `BaseTransport`, the `SpaceTable` only
Postgres keeps, and what their searches share.

Every chunk vector is stored once, in `content_vectors`; `vector_rows` puts each in the
partitions (collections) that hold its content. SQLite searches those two tables
(`vectors.SqliteTables`, with the daemon's in-memory index as the first pass); Postgres
keeps a pgvector table of the rows besides, for its HNSW index (`pg_vectors.PgvectorTables`).
Which one a connection has is decided by `vectors.tables_of` and `vectors.space_table`.
Everything that is not the backend's own (the space's bookkeeping, rows → documents,
widening a KNN until enough documents turn up) is written once, here or in
server/store/vectors.py, so the two searches rank by the same rules. This module sits below
both implementations so that neither imports the other's backend: vectors.py reaches
pg_vectors.py (and psycopg) only when a Postgres connection asks.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from qmd.server.store.db import Connection
from qmd.server.store.metadata import DocFilter

MAX_K = 4096
EPOCH_KEY = "vector_epoch"
"""The `store_config` row that changes whenever rows of `content_vectors` or `vector_rows`
are deleted (`new_epoch`)."""


@dataclass(frozen=True)
class Space:
    id: int
    fingerprint: str
    model: str
    dims: int


@dataclass(frozen=True)
class VecHit:
    doc_id: int
    distance: float
    pos: int
    end_pos: int
    start_line: int
    end_line: int


@dataclass(frozen=True)
class Marks:
    """Where a table of rows that are only ever appended or deleted stood, read in O(log n):
    while `epoch` is the same no row was deleted, so ids only grew (a new row gets the largest
    id plus one) and the rows past `top` are all that is new. What lets a cache of the table
    read only what changed (`vectors.complete_hashes`, the in-memory index's refresh)."""

    epoch: str | None
    top: int


def marks(conn: Connection, table: str) -> Marks:
    """`table`'s marks now (`content_vectors` or `vector_rows`)."""
    row = conn.execute("SELECT value FROM store_config WHERE key = ?", (EPOCH_KEY,)).fetchone()
    (top,) = conn.execute(f"SELECT max(id) FROM {table}").fetchone()
    return Marks(row[0] if row else None, int(top or 0))


def new_epoch(conn: Connection) -> None:
    """Say that vector rows were deleted (writer only): caches keyed by `Marks` start over.
    Random, not counted, so an index copied or emptied never repeats a value."""
    conn.execute(
        "INSERT INTO store_config(key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (EPOCH_KEY, uuid.uuid4().hex),
    )


class FirstPass(Protocol):
    """What a search needs of the daemon's in-memory index (`vector_index.VectorIndex` is
    one), said here rather than imported: vector_index.py reaches pg_store.py (through
    sqlite.py and fts.py), which imports pg_vectors.py, which imports this module."""

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
        """The `k` nearest rows of the partition, or None while the index is being built."""

    def rows(self, space: Space, cid: int) -> int | None:
        """The partition's size as its snapshot last held it, or None before its first build."""

    def fresh(self, conn: Connection, space: Space, cid: int) -> object | None:
        """The partition's snapshot as of now, or None while it is being built (asking starts
        the build a search would start)."""


class SpaceTable(Protocol):
    """A backend's own table of a space's rows, written with `vector_rows`: pgvector's, for
    its HNSW index. SQLite keeps none (its searches read `vector_rows` and `content_vectors`,
    where each vector already is), so it is never asked to write a copy."""

    def create(self, space: Space, *, bulk: bool) -> None:
        """The space's empty table. `bulk`: rows come all at once next (a copy), and
        `build_index` follows them (Postgres builds HNSW far faster over rows in place)."""

    def build_index(self, space: Space) -> None:
        """Index a table made with `bulk`."""

    def drop(self, space: Space) -> None:
        """Drop the table, if it is there."""

    def insert(self, space: Space, rows: Sequence[tuple[int, int, bytes]]) -> None:
        """(vector_rows id, collection id, packed embedding) rows, at least one."""

    def delete(self, space: Space, row_ids: Sequence[int]) -> None:
        """Remove these rows, at least one."""


class VectorTables(Protocol):
    """The searches of one connection's backend. Rows are keyed by `vector_rows.id` and
    partitioned by collection id, so the shared SQL around them (`vector_rows`,
    `content_vectors`, `documents`) is the same on both backends."""

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
        """`vectors.search` in the collection's partition `cid`: under `doc_filter`, exactly
        the eligible documents' top `limit`; `index` is the daemon's in-memory first pass,
        for a backend that has one."""

    def nearest_of(
        self, space: Space, query: Sequence[float], cid: int, collection: str, doc_ids: Sequence[int]
    ) -> list[VecHit]:
        """`vectors.nearest_of` in the partition `cid`: exact distances, the ones `search` ranks by."""


def ranked(best: dict[int, VecHit]) -> list[VecHit]:
    """Nearest first, ties by document id, so both backends order equal distances alike."""
    return sorted(best.values(), key=lambda h: (h.distance, h.doc_id))


def widened(
    conn: Connection,
    collection: str,
    limit: int,
    nearest: Callable[[int], list[tuple[int, float]] | None],
    eligible: set[int] | None = None,
    share: float = 1.0,
) -> list[VecHit] | None:
    """The top `limit` documents of `nearest(k)`'s rows, `k` grown fourfold up to `MAX_K`
    until they turn up: a document has many chunks, and `eligible` skips some of them. A
    filter admitting `share` of the collection starts that much wider. None when `nearest`
    cannot answer, or when `MAX_K` rows held too few eligible documents: the caller then
    measures every eligible chunk, so a filtered answer is never short."""
    k = min(MAX_K, math.ceil(max(limit * 3, 10) / share))
    while True:
        knn = nearest(k)
        if knn is None:
            return None
        best = documents_for(conn, knn, collection, eligible)
        if len(best) >= limit or len(knn) < k:
            break
        if k >= MAX_K:
            if eligible is not None:
                return None
            break
        k = min(MAX_K, k * 4)
    return ranked(best)[:limit]


def documents_for(
    conn: Connection, knn: list[tuple[int, float]], collection: str, eligible: set[int] | None = None
) -> dict[int, VecHit]:
    """The active documents of `collection` these (row id, distance) rows are chunks of, each
    with its nearest chunk: plain lookups by the KNN's row ids, whichever backend found them."""
    best: dict[int, VecHit] = {}
    for i in range(0, len(knn), 500):
        part = knn[i : i + 500]
        dist = {rid: d for rid, d in part}
        rows = conn.execute(
            "SELECT vr.id, cv.hash, cv.pos, cv.end_pos, cv.start_line, cv.end_line FROM vector_rows vr"
            f" JOIN content_vectors cv ON cv.id = vr.chunk_id WHERE vr.id IN ({','.join('?' * len(part))})",
            [rid for rid, _ in part],
        ).fetchall()
        by_hash: dict[str, list[tuple]] = {}
        for rid, h, pos, end, sl, el in rows:
            by_hash.setdefault(h, []).append((dist[rid], pos, end, sl, el))
        if not by_hash:
            continue
        docs = conn.execute(
            f"SELECT id, hash FROM documents WHERE active = 1 AND collection = ? AND hash IN"
            f" ({','.join('?' * len(by_hash))})",
            [collection, *by_hash],
        ).fetchall()
        for doc_id, h in docs:
            if eligible is not None and doc_id not in eligible:
                continue
            d, pos, end, sl, el = min(by_hash[h])
            if doc_id not in best or d < best[doc_id].distance:
                best[doc_id] = VecHit(doc_id, d, pos, end, sl, el)
    return best
