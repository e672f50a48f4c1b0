"""Vectors in the index: one space per embedder fingerprint, partitioned by collection.

Vectors from two embedders never share a space: each fingerprint (model identity + prompt
format + chunker version + chunk strategy) gets its own `vector_spaces` row, so a changed
embedder can only make documents *pending*, never mix spaces. Each chunk's vector is stored
once, in `content_vectors` (a chunk shared by two collections is embedded and kept once);
`vector_rows` partitions a space by collection (spec §4.3), one row per (chunk, collection
holding its content), so a search scoped to a small collection reads only that collection
and is never starved by a big one.

On SQLite that is all there is (issue 34: the sqlite-vec vec0 table that kept a second copy
of every vector, 2.1x the original's bytes, was dropped by schema migration 9). A search's
first pass is the daemon's in-memory index (server/store/vector_index.py); without it
(a library, or while the index is being built) `vector_codec.distances` measures every row of
the partition (`_knn`), and under a selective metadata filter every chunk of the eligible
documents. Postgres keeps a pgvector table of each space's rows besides (`SpaceTable`), for
its HNSW index.

The searches are the one thing the backends do differently, so they sit behind one protocol
(`vector_tables.VectorTables`, as httpx's transports sit behind `BaseTransport`):
`SqliteTables` here, pgvector's `PgvectorTables` on a Postgres index (server/store/pg_vectors.py:
an HNSW index, the same cosine distance). `tables_of` and `space_table` are the only places
that ask which backend a connection is, and import pg_vectors only then, so a SQLite-only
daemon never loads psycopg. Everything else here is the same SQL on both.

Bookkeeping costs what changed, not the index (issue 34): an embed with nothing to do skips
the partition sync (`_changes`: triggers count the changes to the tables it reads), and
which contents are complete is a per-content tally that reads only the rows past the
largest id it has seen (`_tallied`), valid while no vector row is deleted
(every deletion sets a new epoch: `vector_tables.Marks`). What the active documents hold is
read again only when the documents mark moved (`_active`: a random value triggers on
`documents` set, schema migration 8), and the pending contents and the held chunk counts
derived from a tally are kept on it and moved with each row it counts in (`_Tally.pending`,
`.splits`): an embed with nothing to do, or the first search after an embed batch, reads a
few marks and the batch. Postgres, which other daemons may write, does the same with marks
every daemon's writes move (`_changes`, `_index_key`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from qmd.server.store import vector_codec
from qmd.server.store.db import Connection, snapshot, sqlite3
from qmd.server.store.metadata import DocFilter, ids_sql
from qmd.server.store.sqlite import utcnow
from qmd.server.store.vector_tables import MAX_K as MAX_K  # the most rows a search reads, for its callers
from qmd.server.store.vector_tables import (
    FirstPass,
    Marks,
    Space,
    SpaceTable,
    VecHit,
    VectorTables,
    marks,
    new_epoch,
    widened,
)

if TYPE_CHECKING:
    from qmd.server.store.pg_vectors import PgvectorTables
    from qmd.server.store.vector_index import VectorIndex

F32 = vector_codec.F32

SCAN_BATCH = 8192
"""Rows the exact scan (`_knn`) decodes and measures at a time."""

DENSE = 0.1
"""A filter admitting at least this share of a collection is searched by widening an
unfiltered KNN; a sparser one by measuring the distance to each eligible chunk."""


def pack(vector: Sequence[float]) -> bytes:
    """A vector as `content_vectors` stores it (`vector_codec`: its unit vector in half floats)."""
    return vector_codec.encode(vector)


def tables_of(conn: Connection) -> VectorTables:
    """The searches of `conn`'s backend: SQLite's own, else pgvector's."""
    return SqliteTables(conn) if isinstance(conn, sqlite3.Connection) else _pgvector(conn)


def space_table(conn: Connection) -> SpaceTable | None:
    """The table `conn`'s backend keeps of each space's rows besides `vector_rows`, written with
    them: pgvector's; None on SQLite, whose searches read the vectors where they are stored."""
    return None if isinstance(conn, sqlite3.Connection) else _pgvector(conn)


def _pgvector(conn: Connection) -> PgvectorTables:
    """pg_vectors imported now, not with this module, so SQLite never loads psycopg."""
    from qmd.server.store.pg_store import raw
    from qmd.server.store.pg_vectors import PgvectorTables

    return PgvectorTables(conn, raw(conn))


def insert_space_rows(conn: Connection, space: Space, rows: Sequence[tuple[int, int, int]]) -> None:
    """(vector_rows id, collection id, chunk id) rows just added to `vector_rows`, into the
    backend's own table if it keeps one (their vectors are read from `content_vectors` only then)."""
    table = space_table(conn)
    if table is None or not rows:
        return
    embedding: dict[int, bytes] = {}
    for i in range(0, len(rows), 500):
        part = [chunk for _, _, chunk in rows[i : i + 500]]
        embedding.update(
            (int(chunk), bytes(blob))
            for chunk, blob in conn.execute(
                f"SELECT id, embedding FROM content_vectors WHERE id IN ({','.join('?' * len(part))})", part
            )
        )
    table.insert(space, [(rid, cid, embedding[chunk]) for rid, cid, chunk in rows])  # one write: all or nothing


def fill_space_table(conn: Connection, space: Space) -> int:
    """The backend's own table of the space made from `vector_rows` as they stand (a copy's
    destination, which received them as rows): all at once, then indexed. Returns the space's
    search rows."""
    table = space_table(conn)
    if table is None:
        return int(conn.execute("SELECT count(*) FROM vector_rows WHERE space_id = ?", (space.id,)).fetchone()[0])
    rows = [
        (int(rid), int(cid), int(chunk))
        for rid, cid, chunk in conn.execute(
            "SELECT id, collection_id, chunk_id FROM vector_rows WHERE space_id = ? ORDER BY id", (space.id,)
        )
    ]
    table.create(space, bulk=True)
    insert_space_rows(conn, space, rows)
    table.build_index(space)
    return len(rows)


def _delete_rows(conn: Connection, space: Space, row_ids: Sequence[int]) -> None:
    """These `vector_rows` ids, about to be deleted, out of the backend's own table if it keeps one."""
    table = space_table(conn)
    if table is not None and row_ids:
        table.delete(space, row_ids)


def find_space(conn: Connection, fingerprint: str) -> Space | None:
    r = conn.execute(
        "SELECT id, fingerprint, model, dims FROM vector_spaces WHERE fingerprint = ?", (fingerprint,)
    ).fetchone()
    return Space(*r) if r else None


def spaces(conn: Connection) -> list[Space]:
    return [Space(*r) for r in conn.execute("SELECT id, fingerprint, model, dims FROM vector_spaces ORDER BY id")]


def ensure_space(conn: Connection, fingerprint: str, model: str, dims: int) -> Space:
    """The space for this fingerprint, created with its search table on first use (writer only)."""
    space = find_space(conn, fingerprint)
    if space:
        if space.dims != dims:
            raise RuntimeError(f"vector space {fingerprint[:12]} has {space.dims} dims, the embedder gave {dims}")
        return space
    row = conn.execute(
        "INSERT INTO vector_spaces(fingerprint, model, dims, created_at) VALUES (?, ?, ?, ?) RETURNING id",
        (fingerprint, model, dims, utcnow()),
    ).fetchone()
    space = Space(int(row[0]), fingerprint, model, dims)
    if (table := space_table(conn)) is not None:
        table.create(space, bulk=False)
    new_epoch(conn)  # every index with vectors has its own epoch, so no two indexes share one
    return space


def _vector_write(conn: Connection) -> None:
    """Take this writer's turn at the vector tables, before its first change of them in the
    transaction (on Postgres; SQLite has one writer). Postgres hands out an id at the insert,
    not at the commit: two daemons writing at once could commit a lower id after a higher one,
    and a cache that reads "the rows past its top" (`vector_tables.Marks`: the tallies here,
    the in-memory index) would never see it. So a writer holds the row every change of these
    tables moves (`vector_changes`, Postgres migration 8), then locks the two id-ordered
    tables against other writers (not readers) until it commits: ids commit in order, and
    `sync_partitions` reads nothing another daemon changes meanwhile. The row first, always,
    so no two writers can each hold what the other waits for (a trigger takes the row after
    its statement's own table lock: every writer of these tables comes through here). Postgres
    migration 8's `qmd_vector_write()` does it, once a transaction."""
    if not isinstance(conn, sqlite3.Connection):
        conn.execute("SELECT qmd_vector_write()")


def drop_space(conn: Connection, space: Space) -> None:
    _vector_write(conn)
    if (table := space_table(conn)) is not None:
        table.drop(space)
    conn.execute("DELETE FROM vector_rows WHERE space_id = ?", (space.id,))
    conn.execute("DELETE FROM content_vectors WHERE space_id = ?", (space.id,))
    conn.execute("DELETE FROM chunkless_contents WHERE space_id = ?", (space.id,))
    conn.execute("DELETE FROM vector_spaces WHERE id = ?", (space.id,))
    new_epoch(conn)


def forget_hashes(conn: Connection, space: Space, hashes: Iterable[str]) -> int:
    """Drop these contents' vectors from the space (`qmd embed -f -c NAME`, orphans in
    `qmd cleanup`), leaving the other collections' vectors alone; returns the chunks dropped."""
    _vector_write(conn)
    dropped = unmarked = 0
    for h in hashes:
        rows = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM vector_rows WHERE chunk_id IN"
                " (SELECT id FROM content_vectors WHERE space_id = ? AND hash = ?)",
                (space.id, h),
            )
        ]
        _delete_rows(conn, space, rows)
        conn.executemany("DELETE FROM vector_rows WHERE id = ?", [(rid,) for rid in rows])
        dropped += conn.execute("DELETE FROM content_vectors WHERE space_id = ? AND hash = ?", (space.id, h)).rowcount
        unmarked += conn.execute(
            "DELETE FROM chunkless_contents WHERE space_id = ? AND hash = ?", (space.id, h)
        ).rowcount
    if dropped or unmarked:
        new_epoch(conn)
    return dropped


def collection_id(conn: Connection, name: str, *, create: bool) -> int | None:
    r = conn.execute("SELECT id FROM vector_collection_ids WHERE name = ?", (name,)).fetchone()
    if r or not create:
        return r[0] if r else None
    _vector_write(conn)
    return int(conn.execute("INSERT INTO vector_collection_ids(name) VALUES (?) RETURNING id", (name,)).fetchone()[0])


def rename_collection(conn: Connection, old: str, new: str) -> None:
    """A rename is one row: partitions are keyed by the id, not the name."""
    _vector_write(conn)
    conn.execute("UPDATE vector_collection_ids SET name = ? WHERE name = ?", (new, old))


@dataclass(frozen=True)
class ChunkVector:
    seq: int
    pos: int
    end_pos: int
    start_line: int
    end_line: int
    tokens: int
    clipped: bool
    embedding: Sequence[float] | bytes
    """The vector, or its packed bytes when it is reused from another row (`reusable`)."""
    key: str | None = None
    """`chunk_key` of what was embedded; None writes a row that is never reused."""


def chunk_key(title: str | None, text: str) -> str:
    """What a chunk's vector depends on within one space: the title and text the embedder
    read (the space's fingerprint covers the model and its prompt format)."""
    return hashlib.sha256(f"{title or ''}\0{text}".encode()).hexdigest()


def reusable(conn: Connection, space: Space, keys: Sequence[str]) -> dict[str, tuple[int, bool, bytes]]:
    """Of these chunk keys, those the space already holds a vector for: key → (tokens,
    clipped, packed embedding), from any content (an earlier version of the document, a
    copy elsewhere)."""
    found: dict[str, tuple[int, bool, bytes]] = {}
    for i in range(0, len(keys), 500):
        part = list(keys[i : i + 500])
        for key, tokens, clipped, blob in conn.execute(
            "SELECT chunk_key, tokens, clipped, embedding FROM content_vectors"
            f" WHERE space_id = ? AND chunk_key IN ({','.join('?' * len(part))})",
            (space.id, *part),
        ):
            found.setdefault(key, (tokens, bool(clipped), blob))
    return found


def write_document(
    conn: Connection, space: Space, content_hash: str, chunks: Sequence[ChunkVector], total: int
) -> None:
    """Store one content hash's chunk vectors (all of them, or the next batch of them)."""
    _vector_write(conn)
    now = utcnow()
    replaced = 0
    for c in chunks:
        # a replaced row gets a new id, as SQLite's INSERT OR REPLACE gave it: the search rows
        # of the old one are dropped by the next reconciliation (`sync_partitions`)
        replaced += conn.execute(
            "DELETE FROM content_vectors WHERE space_id = ? AND hash = ? AND seq = ?", (space.id, content_hash, c.seq)
        ).rowcount
        conn.execute(
            "INSERT INTO content_vectors(space_id, hash, seq, pos, end_pos, start_line, end_line, tokens,"
            " clipped, total_chunks, embedded_at, embedding, chunk_key)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                space.id,
                content_hash,
                c.seq,
                c.pos,
                c.end_pos,
                c.start_line,
                c.end_line,
                c.tokens,
                int(c.clipped),
                total,
                now,
                vector_codec.stored(c.embedding, space.dims) if isinstance(c.embedding, bytes) else pack(c.embedding),
                c.key,
            ),
        )
    if replaced:
        new_epoch(conn)


@dataclass
class _Pending:
    """The contents of `active` pending in a space: neither complete in the tally it is kept on
    nor cut into no chunk (`chunkless`). Moved with each row the tally counts in, so the first
    search after an embed batch reads the batch, not the active documents."""

    active: frozenset[str]
    chunkless: frozenset[str]
    hashes: set[str]

    def count(self, h: str, complete: bool) -> None:
        if complete or h not in self.active or h in self.chunkless:
            self.hashes.discard(h)
        else:
            self.hashes.add(h)


@dataclass
class _Split:
    """A tally's chunks split by `held` (the contents the active documents hold): those of
    complete contents held, and those of contents none holds. Moved with each row counted in."""

    held: frozenset[str]
    embedded: int = 0
    orphans: int = 0

    def count(self, h: str, before: tuple[int, int], now: tuple[int, int]) -> None:
        """Content `h` went from `before` to `now` (chunks written, chunks it has)."""
        if h not in self.held:
            self.orphans += now[0] - before[0]
        else:
            self.embedded += (now[0] if now[0] == now[1] else 0) - (before[0] if before[0] == before[1] else 0)


@dataclass
class _Tally:
    """One space's `content_vectors` counted per content as of some snapshot: (chunks written,
    chunks it has) by hash, and the complete ones. What `complete_hashes` and `count_spaces`
    derive from; brought up to date by reading the rows past `marks.top` only, so the first
    vector search after an embed batch reads that batch, not the index (1M chunks take ~1 s
    to group)."""

    marks: Marks
    chunks: dict[str, tuple[int, int]] = field(default_factory=dict)
    complete: set[str] = field(default_factory=set)
    pending: dict[tuple[tuple[str, int | None], tuple[str, ...] | None], _Pending] = field(default_factory=dict)
    """What `pending_hashes` derived from these counts, by what else it read (`_pending_key`)."""
    splits: dict[tuple[str, None], _Split] = field(default_factory=dict)
    """What `count_spaces` derived from these counts, by the documents mark it read."""

    def add(self, rows: Iterable[tuple[str, int, int]]) -> None:
        """Count (hash, chunks, total) rows in, and into what was derived."""
        for h, n, total in rows:
            before = self.chunks.get(h, (0, 0))
            now = (before[0] + n, max(before[1], total))
            self.chunks[h] = now
            complete = now[0] == now[1]
            if complete:
                self.complete.add(h)
            else:
                self.complete.discard(h)
            for pending in self.pending.values():
                pending.count(h, complete)
            for split in self.splits.values():
                split.count(h, before, now)

    def copy(self) -> _Tally:
        """The counts to count on apart (the writer's), with nothing derived."""
        return _Tally(self.marks, dict(self.chunks), set(self.complete))

    def bare(self) -> _Tally:
        """The same counts, unshared derivations: for the writer, whose would be of rows it may
        roll back (it derives from, never changes, the counts)."""
        return _Tally(self.marks, self.chunks, self.complete)


M = TypeVar("M")
S = TypeVar("S")
V = TypeVar("V")


def _derived(views: dict[tuple[M, S], V], key: tuple[M, S] | None, make: Callable[[], V]) -> V:
    """The view kept under `key` (the marks it was made at, its scope), made on first use; never
    kept under no key (no mark to key it by). Making one drops those of other marks: gone by,
    and each may hold a set of every active content."""
    if key is None:
        return make()
    view = views.get(key)
    if view is None:
        for gone in [k for k in views if k[0] != key[0]]:
            del views[gone]
        view = views[key] = make()
    return view


_TALLIES: dict[tuple[str, int, str], _Tally] = {}
"""By index file, space id and fingerprint: shared by the daemon's reader threads."""
_TALLIES_LOCK = threading.Lock()
T = TypeVar("T")


def _tallied(conn: Connection, space: Space, use: Callable[[_Tally], T]) -> T:
    """`use` of the space's tally as `conn` sees it (call inside one snapshot with what else
    the caller reads). A cached tally is used where its marks say it holds the rows of `conn`'s
    snapshot or fewer (the same epoch, so nothing was deleted since, and a top no higher): the
    rows past its top are read and counted in (and into what was derived from the tally:
    `_Tally.pending`, `.splits`). Only the daemon's readers (`_reader`: they see committed
    rows) write the cache; the writer, which may see its own uncommitted rows, counts on a copy
    and derives on a bare tally. On Postgres too: its writers take turns (`_vector_write`), so
    the rows past a top are all that any daemon added since."""
    key = _tally_key(conn, space)
    now = marks(conn, "content_vectors")
    if key is None:
        return use(_count(conn, space, now))
    cacheable = _reader(conn)
    with _TALLIES_LOCK:
        cached = _TALLIES.get(key)
        if cached is not None and cached.marks == now:
            return use(cached if cacheable else cached.bare())
        if cached is None or cached.marks.epoch != now.epoch or cached.marks.top > now.top:
            tally = _count(conn, space, now)
        else:
            tally = cached if cacheable else cached.copy()
            try:
                tally.add(
                    conn.execute(
                        # `+space_id`: the rows past the top by rowid, not the space's whole hash index
                        "SELECT hash, 1, total_chunks FROM content_vectors WHERE id > ? AND +space_id = ?",
                        (cached.marks.top, space.id),
                    )
                )
            except BaseException:
                _TALLIES.pop(key, None)  # half counted
                raise
            tally.marks = now
        if cacheable:
            _TALLIES[key] = tally
        return use(tally)


def _tally_key(conn: Connection, space: Space) -> tuple[str, int, str] | None:
    """The cache key of an index's space; None for one that keeps no cache."""
    index = _index_key(conn)
    return (index, space.id, space.fingerprint) if index else None


def _index_key(conn: Connection) -> str | None:
    """What the caches here are kept by: the SQLite index file `conn` reads, or a Postgres
    index's server and schema (`PgConnection.index`); None for an in-memory index or a
    connection that keeps nothing."""
    if not isinstance(conn, sqlite3.Connection):
        index: str | None = getattr(conn, "index", None)
        return index
    return next((r[2] for r in conn.execute("PRAGMA database_list") if r[1] == "main"), "") or None


def _reader(conn: Connection) -> bool:
    """Whether `conn` sees only committed rows: a SQLite reader (``query_only``) or a pooled
    Postgres one (`PgConnection.reader`); not the writer, which also sees its own."""
    if not isinstance(conn, sqlite3.Connection):
        return bool(getattr(conn, "reader", False))
    return bool(conn.execute("PRAGMA query_only").fetchone()[0])


def _count(conn: Connection, space: Space, now: Marks) -> _Tally:
    """The tally from scratch: one walk of the space's hash index."""
    tally = _Tally(now)
    tally.add(
        conn.execute(
            "SELECT hash, COUNT(*), MAX(total_chunks) FROM content_vectors WHERE space_id = ? GROUP BY hash",
            (space.id,),
        )
    )
    return tally


def _chunkless(conn: Connection, space: Space) -> set[str]:
    return {r[0] for r in conn.execute("SELECT hash FROM chunkless_contents WHERE space_id = ?", (space.id,))}


def complete_hashes(conn: Connection, space: Space) -> set[str]:
    """Contents embedded in full in this space: every chunk has its vector, or the chunker
    cut the content into none (`mark_chunkless`)."""
    with snapshot(conn):
        chunkless = _chunkless(conn, space)
        return _tallied(conn, space, lambda t: t.complete | chunkless)


def mark_chunkless(conn: Connection, space: Space, hashes: Iterable[str]) -> None:
    """Record contents the chunker cut into no chunk (a note of nothing but headings:
    seeds/001) as embedded in this space, so they are not pending for ever; keyword
    search still finds them."""
    _vector_write(conn)
    conn.executemany(
        "INSERT INTO chunkless_contents(space_id, hash) VALUES (?, ?) ON CONFLICT DO NOTHING",
        [(space.id, h) for h in dict.fromkeys(hashes)],
    )


def add_partitions(conn: Connection, space: Space, hashes: Iterable[str]) -> int:
    """Give each of these contents whose chunks are all written a search row per chunk in every
    collection an active document holding it is in (those it lacks): the embed job calls this
    in the transaction that writes a batch, so a content counted as embedded is searchable from
    that commit on, a killed daemon included. Removals are `sync_partitions`' job. Returns the
    rows added."""
    _vector_write(conn)
    added: list[tuple[int, int, int]] = []
    for h in dict.fromkeys(hashes):
        chunks = conn.execute(
            "SELECT id, total_chunks FROM content_vectors WHERE space_id = ? AND hash = ?", (space.id, h)
        ).fetchall()
        if not chunks or len(chunks) != max(c[1] for c in chunks):
            continue  # not complete yet: its last chunks come in a later batch
        for (coll,) in conn.execute(
            "SELECT DISTINCT collection FROM documents WHERE hash = ? AND active = 1", (h,)
        ).fetchall():
            cid = collection_id(conn, coll, create=True)
            assert cid is not None
            for chunk, _total in chunks:
                row = conn.execute(
                    "INSERT INTO vector_rows(space_id, chunk_id, collection_id) VALUES (?, ?, ?)"
                    " ON CONFLICT DO NOTHING RETURNING id",
                    (space.id, chunk, cid),
                ).fetchone()
                if row is not None:
                    added.append((int(row[0]), cid, chunk))
    insert_space_rows(conn, space, added)
    return len(added)


def sync_partitions(conn: Connection, space: Space) -> tuple[int, int]:
    """Make the partitions (`vector_rows`) match the active documents: add a row for every
    (embedded chunk, collection holding that content), drop rows whose collection no
    longer holds it. The reconciliation at the end of an embed run (documents removed,
    moved or copied since their batch was written); rows for new vectors are added as
    each batch commits (`add_partitions`). Skipped when none of the tables it reads changed
    since it last ran (`partitions_synced`): what an embed with nothing to do pays. Returns
    (added, removed)."""
    if partitions_synced(conn, space):
        return 0, 0
    _vector_write(conn)
    complete = complete_hashes(conn, space)
    wanted: set[tuple[int, int]] = set()
    pairs = conn.execute("SELECT DISTINCT collection, hash FROM documents WHERE active = 1").fetchall()
    chunk_ids: dict[str, list[int]] = {}
    for r in conn.execute("SELECT id, hash FROM content_vectors WHERE space_id = ?", (space.id,)):
        if r[1] in complete:
            chunk_ids.setdefault(r[1], []).append(r[0])
    for coll, h in pairs:
        if h in chunk_ids:
            cid = collection_id(conn, coll, create=True)
            assert cid is not None
            wanted.update((chunk, cid) for chunk in chunk_ids[h])
    have = {
        (r[1], r[2]): r[0]
        for r in conn.execute("SELECT id, chunk_id, collection_id FROM vector_rows WHERE space_id = ?", (space.id,))
    }
    removed = [rid for key, rid in have.items() if key not in wanted]
    _delete_rows(conn, space, removed)
    conn.executemany("DELETE FROM vector_rows WHERE id = ?", [(rid,) for rid in removed])
    if removed:
        new_epoch(conn)
    added: list[tuple[int, int, int]] = []
    for chunk, cid in wanted - have.keys():
        rid = conn.execute(
            "INSERT INTO vector_rows(space_id, chunk_id, collection_id) VALUES (?, ?, ?) RETURNING id",
            (space.id, chunk, cid),
        ).fetchone()[0]
        added.append((int(rid), cid, chunk))
    insert_space_rows(conn, space, added)
    conn.execute(
        "INSERT INTO qmd_vector_synced VALUES (?, ?, ?) ON CONFLICT (space_id, fingerprint)"
        " DO UPDATE SET changes = excluded.changes",
        (space.id, space.fingerprint, _changes(conn)),  # its own rows included
    )
    if not isinstance(conn, sqlite3.Connection):  # a change after this in the transaction drops it
        conn.execute("SELECT set_config('qmd.vectors_synced', 'yes', true)")
    return len(added), len(removed)


def partitions_synced(conn: Connection, space: Space) -> bool:
    """Whether `sync_partitions` on `conn` (the writer) would find nothing to do: none of the
    tables it reads changed since it last ran, on any connection (`_changes`). Asked in a write
    that does not move the store's generation, so an embed with nothing to do leaves every
    cache keyed by it alone. False where that is not known (never synced)."""
    return _synced(conn, space) == _changes(conn)


def _changes(conn: Connection) -> int:
    """How many times the tables `sync_partitions` reads have changed, as `conn` sees them, its
    own changes included: a count every writer's triggers move (SQLite migration 12: once a
    row; Postgres migration 8: once a transaction, where a change after the sync in its own
    transaction drops what the sync recorded instead). What each space's last sync saw of it
    is the index's `qmd_vector_synced`, so one sync serves every daemon and every start."""
    (n,) = conn.execute("SELECT n FROM vector_changes").fetchone()
    return int(n)


def _synced(conn: Connection, space: Space) -> int | None:
    """`_changes` as the last `sync_partitions` of the space left it."""
    row = conn.execute(
        "SELECT changes FROM qmd_vector_synced WHERE space_id = ? AND fingerprint = ?",
        (space.id, space.fingerprint),
    ).fetchone()
    return int(row[0]) if row else None


def pending_hashes(conn: Connection, space: Space | None, collections: Iterable[str] | None = None) -> set[str]:
    """Active content in scope without a complete set of vectors in this space. Kept on the
    space's tally (`_Tally.pending`) while the documents and the chunkless contents do not
    change: an embed with nothing to do reads a few marks."""
    names = tuple(sorted(set(collections))) if collections is not None else None
    with snapshot(conn):
        active = _active(conn, names)
        if space is None:
            return set(active)
        key = _pending_key(conn, names)

        def pending(tally: _Tally) -> set[str]:
            def make() -> _Pending:
                chunkless = frozenset(_chunkless(conn, space))
                return _Pending(active, chunkless, set(active - tally.complete - chunkless))

            return set(_derived(tally.pending, key, make).hashes)

        return _tallied(conn, space, pending)


def _pending_key(
    conn: Connection, names: tuple[str, ...] | None
) -> tuple[tuple[str, int | None], tuple[str, ...] | None] | None:
    """What a pending set depends on besides the tally (the scope, the documents mark, how many
    chunkless contents there are: deleting one sets a new epoch, which drops the tally), in an
    index that keeps caches; None elsewhere."""
    mark = _documents_mark(conn) if _index_key(conn) else None
    if mark is None:
        return None
    (count,) = conn.execute("SELECT count(*) FROM chunkless_contents").fetchone()
    return (mark, int(count)), names


def _documents_mark(conn: Connection) -> str | None:
    """The documents mark (schema migration 8): moves whenever what the active documents hold may have."""
    row = conn.execute("SELECT value FROM documents_mark").fetchone()
    return str(row[0]) if row else None


_ACTIVE: dict[tuple[str, tuple[str, ...] | None], tuple[str, frozenset[str]]] = {}
"""`_active` by index file and collections: (the documents mark it was read at, the contents)."""


def _active(conn: Connection, collections: tuple[str, ...] | None) -> frozenset[str]:
    """Contents the active documents (of these collections) hold, read again only when the
    documents mark moved. Any connection may keep what it read, the writer too: the mark is
    random, so one of a transaction rolled back never comes back. Deduplicated here: SQLite's
    DISTINCT walks the hash index and looks each row up, 2-3x the table scan (125k documents)."""
    path = _index_key(conn)
    mark = _documents_mark(conn) if path else None
    key = (path, collections) if path and mark else None
    if key is not None:
        with _TALLIES_LOCK:
            kept = _ACTIVE.get(key)
        if kept is not None and kept[0] == mark:
            return kept[1]
    q = "SELECT hash FROM documents WHERE active = 1"
    if collections is not None:
        q += f" AND collection IN ({','.join('?' * len(collections))})"
    active = frozenset(r[0] for r in conn.execute(q, collections or []))
    if key is not None and mark is not None:
        with _TALLIES_LOCK:
            if len(_ACTIVE) >= 64:
                _ACTIVE.clear()
            _ACTIVE[key] = (mark, active)
    return active


_HELD = "EXISTS (SELECT 1 FROM documents d WHERE d.hash = cv.hash AND d.active = 1)"
"""Whether an active document holds the content of the vector row `cv`."""


@dataclass(frozen=True)
class VectorCounts:
    embedded_chunks: int
    """Chunks with a vector in the spaces in use, of contents an active document holds
    and whose chunks are all written: those vector search can reach (a content
    half-embedded when the daemon was killed is not counted; it is pending)."""
    stale_contents: int
    """Contents with vectors in other spaces: left by an embedder no longer configured."""
    orphan_chunks: int
    """Chunks, in the spaces in use, of contents no active document holds (an edited document's
    old version, a deleted file): kept until `qmd cleanup` (`index.upkeep`)."""


def count_vectors(conn: Connection, space: Space | None) -> VectorCounts:
    return count_spaces(conn, [space] if space else [])


def count_spaces(conn: Connection, used: Sequence[Space]) -> VectorCounts:
    """`VectorCounts` over the spaces in use (one per chunk strategy the collections use):
    the others' contents are stale. Each space's tally (`_tallied`: on SQLite, the rows since
    it was last counted) against the contents active documents hold tells embedded chunks
    from orphaned ones; that split is kept on the tally until the documents mark moves."""
    with snapshot(conn):
        held = _active(conn, None) if used else frozenset()
        mark = _documents_mark(conn) if _index_key(conn) else None
        embedded = orphans = 0
        for space in used:

            def counts(tally: _Tally) -> tuple[int, int]:
                split = _derived(tally.splits, None if mark is None else (mark, None), lambda: _split(tally, held))
                return split.embedded, split.orphans

            space_embedded, space_orphans = _tallied(conn, space, counts)
            embedded += space_embedded
            orphans += space_orphans
        ids = {s.id for s in used}
        # by the other spaces' ids, not NOT IN the used ones': index ranges, not the whole index
        others = [s.id for s in spaces(conn) if s.id not in ids]
        stale = (
            conn.execute(
                f"SELECT COUNT(DISTINCT hash) FROM content_vectors WHERE space_id IN ({','.join('?' * len(others))})",
                others,
            ).fetchone()[0]
            if others
            else 0
        )
    return VectorCounts(embedded_chunks=embedded, stale_contents=stale, orphan_chunks=orphans)


def _split(tally: _Tally, held: frozenset[str]) -> _Split:
    """The split of the whole tally."""
    split = _Split(held)
    for h, counted in tally.chunks.items():
        split.count(h, (0, 0), counted)
    return split


def orphan_hashes(conn: Connection, space: Space) -> list[str]:
    """Contents with vectors in this space that no active document holds."""
    return [
        r[0]
        for r in conn.execute(
            f"SELECT hash FROM content_vectors cv WHERE space_id = ? AND NOT {_HELD} GROUP BY hash"
            f" UNION SELECT hash FROM chunkless_contents cv WHERE space_id = ? AND NOT {_HELD}",
            (space.id, space.id),
        )
    ]


LOADING = (
    "the vector index is still loading into memory: this search measured every vector"
    " (exact, but slower until it is in)"
)
LOADING_HNSW = (
    "the vector index is still loading into memory: this search walked Postgres' HNSW index"
    " (approximate: it may miss some of the nearest chunks until the index is in)"
)


def loading(conn: Connection, spaces: Mapping[str, Space], index: FirstPass) -> str | None:
    """`LOADING` (SQLite) or `LOADING_HNSW` (Postgres) when a search of these collections (name
    → space) is answered without the in-memory index for now: that of one of their
    partitions is being built (the daemon just started, or a change too big to read inline).
    SQLite's exact scan costs about twice what vec0's did (issue 34); Postgres' HNSW walk is
    fast but approximate. None when every partition is in memory. Each one is asked (none
    skipped once one is found loading), so each build a search would start is started."""
    ids = {name: collection_id(conn, name, create=False) for name in spaces}
    waiting = [name for name, cid in ids.items() if cid is not None and index.fresh(conn, spaces[name], cid) is None]
    if not waiting:
        return None
    return LOADING if isinstance(conn, sqlite3.Connection) else LOADING_HNSW


def search(
    conn: Connection,
    space: Space,
    query: Sequence[float],
    collection: str,
    limit: int,
    doc_filter: DocFilter | None = None,
    index: VectorIndex | None = None,
) -> list[VecHit]:
    """Nearest documents of one collection: KNN over its partition (widened until
    `limit` distinct documents are found), then chunk → document lookups, keeping
    each document's nearest chunk. Under a metadata filter the answer is the exact top
    `limit` of the eligible documents, however selective the filter. How each backend
    gets there: `SqliteTables.search`, `PgvectorTables.search`."""
    cid = collection_id(conn, collection, create=False)
    if cid is None:
        return []
    return tables_of(conn).search(space, query, cid, collection, limit, doc_filter, index)


def nearest_of(
    conn: Connection, space: Space, query: Sequence[float], collection: str, doc_ids: Sequence[int]
) -> list[VecHit]:
    """These documents of one collection, each with its nearest chunk to `query`, nearest
    first; exact, with the distances `search` ranks by. A document with no vectors in the
    space is absent. What the cosine rerank scores (`search.rerank.CosineScorer`)."""
    cid = collection_id(conn, collection, create=False)
    if cid is None or not doc_ids:
        return []
    return tables_of(conn).nearest_of(space, query, cid, collection, doc_ids)


class SqliteTables:
    """`VectorTables` on SQLite: the partitions are `vector_rows`, the vectors `content_vectors`,
    and the daemon's in-memory index (server/store/vector_index.py) the first pass."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

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
        """With the daemon's in-memory `index`, the KNN is its (`vector_index.nearest`: the
        same distances; under a filter the very same rows, else recall@10 ≥ 0.998 measured);
        the exact scan of the partition (`_knn`) answers until the index is built.

        A dense filter widens the unfiltered KNN until enough eligible documents turn up (a
        few of them are skipped, nothing is approximated); a sparse one is a KNN over the
        eligible documents' chunks in the index, or without it (or for a dense one whose
        eligible documents lie beyond the largest KNN) measures the distance to every chunk
        of the eligible documents (1 ms for 150 eligible rows of 150k, measured, where a
        scan of the partition reads them all)."""
        conn = self._conn
        unit = vector_codec.unit(query)
        eligible: set[int] | None = None
        among: list[int] | None = None
        share = 1.0
        if doc_filter is not None:
            sql, params = ids_sql(collection, doc_filter)
            # one aggregate row, not one Python row per document: 50k ids in 28 ms, not 41
            ids = conn.execute(f"SELECT json_group_array(id) FROM ({sql})", params).fetchone()[0]
            eligible = set(json.loads(ids))
            if not eligible:
                return []
            total = conn.execute(
                "SELECT count(*) FROM documents WHERE collection = ? AND active = 1", (collection,)
            ).fetchone()[0]
            admitted = len(eligible) / max(total, 1)
            if admitted >= DENSE:
                share = admitted
            elif index is None:
                return _search_eligible(conn, space, unit, cid, limit, ids)
            else:
                among = _chunks_of(conn, space, ids)

        def nearest(k: int) -> list[tuple[int, float]] | None:
            """The index's rows, or while it is being built the exact scan's (none over `among`:
            the eligible chunks are measured instead)."""
            knn = (
                index.knn(conn, space, cid, query, k, exact=eligible is not None, among=among)
                if index is not None
                else None
            )
            if knn is None and among is None:
                knn = _knn(conn, space, unit, k, cid)
            return knn

        hits = widened(conn, collection, limit, nearest, eligible, share)
        return _search_eligible(conn, space, unit, cid, limit, ids) if hits is None else hits

    def nearest_of(
        self, space: Space, query: Sequence[float], cid: int, collection: str, doc_ids: Sequence[int]
    ) -> list[VecHit]:
        ids = json.dumps(sorted(set(doc_ids)))
        return _search_eligible(self._conn, space, vector_codec.unit(query), cid, len(doc_ids), ids)


def _knn(conn: Connection, space: Space, query: F32, k: int, cid: int) -> list[tuple[int, float]]:
    """The partition's `k` nearest rows to the unit `query`, exact: every row's stored vector
    measured (`vector_codec.distances`), nearest first, ties by row id (as
    `vector_index.rescore` orders them). What answers without the in-memory index, as vec0's
    KNN did (a scan too), a batch of rows at a time."""
    cur = conn.execute(
        "SELECT vr.id, cv.embedding FROM vector_rows vr CROSS JOIN content_vectors cv"
        " ON cv.id = vr.chunk_id WHERE vr.space_id = ? AND vr.collection_id = ?",
        (space.id, cid),
    )
    best: list[tuple[int, float]] = []
    while rows := cur.fetchmany(SCAN_BATCH):
        dist = vector_codec.distances(vector_codec.decode([r[1] for r in rows], space.dims), query)
        ids = np.fromiter((r[0] for r in rows), np.int64, len(rows))
        if best:
            ids = np.concatenate([np.array([i for i, _ in best], np.int64), ids])
            dist = np.concatenate([np.array([d for _, d in best]), dist])
        best = vector_codec.nearest(ids, dist, k)
    return best


def _chunks_of(conn: Connection, space: Space, eligible_json: str) -> list[int]:
    """The chunks of these documents (a JSON array of ids) in the space: the ids only, from
    the hash index (no vector is read)."""
    ids = conn.execute(
        "SELECT json_group_array(cv.id) FROM documents d CROSS JOIN content_vectors cv"
        " WHERE d.id IN (SELECT value FROM json_each(?)) AND cv.space_id = ? AND cv.hash = d.hash",
        (eligible_json, space.id),
    ).fetchone()[0]
    return list(json.loads(ids))


def _search_eligible(
    conn: Connection, space: Space, query: F32, cid: int, limit: int, eligible_json: str
) -> list[VecHit]:
    """The eligible documents (a JSON array of ids) ranked by the distance to each one's
    nearest chunk, measured on every chunk of theirs that is in the collection's
    partition: exact whatever their share, and by `vector_codec.distances` as every other
    path measures, so these distances merge with KNN ones."""
    rows = conn.execute(
        "SELECT d.id, cv.embedding, cv.pos, cv.end_pos, cv.start_line, cv.end_line"
        " FROM documents d CROSS JOIN content_vectors cv CROSS JOIN vector_rows vr"
        " WHERE d.id IN (SELECT value FROM json_each(?)) AND cv.space_id = ? AND cv.hash = d.hash"
        " AND vr.chunk_id = cv.id AND vr.collection_id = ?",
        (eligible_json, space.id, cid),
    ).fetchall()
    dist = vector_codec.distances(vector_codec.decode([r[1] for r in rows], space.dims), query).tolist()
    nearest: dict[int, tuple[float, int, int, int, int]] = {}
    for (doc_id, _, pos, end, sl, el), d in zip(rows, dist, strict=True):
        t = (d, pos, end, sl, el)
        if doc_id not in nearest or t < nearest[doc_id]:
            nearest[doc_id] = t
    ranked = sorted(nearest.items(), key=lambda kv: (kv[1][0], kv[0]))[:limit]
    return [VecHit(doc_id, *chunk) for doc_id, chunk in ranked]
