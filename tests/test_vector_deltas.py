"""Vector bookkeeping proportional to the change (issue 34): an embed with nothing to do skips
the partition sync, and the first vector search after an embed batch reads that batch, not
the index (the per-content chunk tally, the in-memory index's refresh). Real SQLite and
sqlite-vec, random vectors written as the embed job writes them; every cached answer is
checked against the same question asked of the tables from scratch."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_vectors import CHUNKS, DIMS, Corpus

from qmd.server.store import vector_codec, vectors
from qmd.server.store.db import Connection, sqlite3
from qmd.server.store.sqlite import Store, utcnow

pytestmark = pytest.mark.sqlite_only("these trace SQLite's statements; test_pg_scale.py has Postgres' own")


@pytest.fixture
def corpus(tmp_path: Path) -> Iterator[Corpus]:
    c = Corpus(tmp_path / "index.sqlite", seed=11)
    c.add(300)
    yield c
    c.store.close()


@contextmanager
def traced(conn: sqlite3.Connection) -> Iterator[list[str]]:
    """The statements `conn` runs meanwhile."""
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        conn.set_trace_callback(None)


def complete_in(conn: Connection, space: vectors.Space) -> set[str]:
    """Contents complete in the space, from the tables: every chunk written, or cut into none."""
    return {
        r[0]
        for r in conn.execute(
            "SELECT hash FROM content_vectors WHERE space_id = ? GROUP BY hash HAVING COUNT(*) = MAX(total_chunks)"
            " UNION SELECT hash FROM chunkless_contents WHERE space_id = ?",
            (space.id, space.id),
        )
    }


def truth(conn: sqlite3.Connection, space: vectors.Space) -> tuple[set[str], set[str], tuple[int, int]]:
    """(complete, pending, (embedded chunks, orphan chunks)) from the tables, as the store
    counted them before it kept a tally."""
    complete = complete_in(conn, space)
    active = {r[0] for r in conn.execute("SELECT DISTINCT hash FROM documents WHERE active = 1")}
    held = "EXISTS (SELECT 1 FROM documents d WHERE d.hash = cv.hash AND d.active = 1)"
    embedded, orphans = conn.execute(
        "SELECT COALESCE(SUM(n) FILTER (WHERE held AND n = total), 0), COALESCE(SUM(n) FILTER (WHERE NOT held), 0)"
        f" FROM (SELECT COUNT(*) AS n, MAX(total_chunks) AS total, {held} AS held"
        " FROM content_vectors cv WHERE space_id = ? GROUP BY hash)",
        (space.id,),
    ).fetchone()
    return complete, active - complete, (embedded, orphans)


def counted(conn: sqlite3.Connection, space: vectors.Space) -> tuple[set[str], set[str], tuple[int, int]]:
    """The same through the store's functions."""
    counts = vectors.count_vectors(conn, space)
    return (
        vectors.complete_hashes(conn, space),
        vectors.pending_hashes(conn, space),
        (counts.embedded_chunks, counts.orphan_chunks),
    )


def agrees(c: Corpus) -> None:
    with c.store.read() as conn:
        assert counted(conn, c.space) == truth(conn, c.space)


def rows(c: Corpus) -> set[tuple[int, int]]:
    """The search rows: (chunk, collection id) of `vector_rows`."""
    with c.store.read() as conn:
        return {(r[0], r[1]) for r in conn.execute("SELECT chunk_id, collection_id FROM vector_rows")}


def wanted(c: Corpus) -> set[tuple[int, int]]:
    """The search rows the active documents call for: every chunk of a complete content, once
    per collection an active document holding it is in."""
    with c.store.read() as conn:
        complete = truth(conn, c.space)[0]
        out = set()
        for coll, h in conn.execute("SELECT DISTINCT collection, hash FROM documents WHERE active = 1").fetchall():
            cid = vectors.collection_id(conn, coll, create=False)
            if h in complete and cid is not None:
                out |= {(r[0], cid) for r in conn.execute("SELECT id FROM content_vectors WHERE hash = ?", (h,))}
    return out


def sync(c: Corpus) -> tuple[tuple[int, int], list[str]]:
    """`sync_partitions` on the writer: what it did, and the statements it ran."""

    def run(conn: sqlite3.Connection) -> tuple[tuple[int, int], list[str]]:
        with traced(conn) as seen:
            return vectors.sync_partitions(conn, c.space), seen

    return c.store.write(run)


def reads_tables(statements: list[str]) -> list[str]:
    tables = ("FROM documents", "FROM content_vectors", "FROM vector_rows")
    return [s for s in statements if any(t in s for t in tables)]


# -- the partition sync ----------------------------------------------------------------------


def test_a_sync_with_nothing_changed_reads_nothing(corpus: Corpus) -> None:
    assert sync(corpus)[0] == (0, 0)
    done, statements = sync(corpus)
    assert done == (0, 0) and reads_tables(statements) == []
    assert rows(corpus) == wanted(corpus)


def deactivate(c: Corpus) -> None:
    c.store.write(lambda conn: conn.execute("UPDATE documents SET active = 0 WHERE path = 'd0.md'"))


def copy_elsewhere(c: Corpus) -> None:
    c.store.write(
        lambda conn: conn.execute(
            "INSERT INTO documents(collection, path, title, hash, created_at, modified_at, active)"
            " SELECT 'other', path, title, hash, created_at, modified_at, 1 FROM documents WHERE path = 'd1.md'"
        )
    )


def replace_a_chunk(c: Corpus) -> None:
    def write(conn: sqlite3.Connection) -> None:
        h = conn.execute("SELECT hash FROM documents WHERE path = 'd2.md'").fetchone()[0]
        chunk = vectors.ChunkVector(0, 0, 1, 1, 1, 4, False, [1.0] * DIMS)
        vectors.write_document(conn, c.space, h, [chunk], CHUNKS)

    c.store.write(write)


def write_elsewhere(c: Corpus) -> None:
    """A commit from another connection (another process): the writer's triggers never see it."""
    other = sqlite3.connect(str(c.store.path), isolation_level=None)
    try:
        other.execute("UPDATE documents SET active = 0 WHERE path = 'd3.md'")
    finally:
        other.close()


def leave_collection_runs(c: Corpus) -> None:
    """What `qmd update` with nothing changed writes: nothing the sync reads."""
    c.store.write(
        lambda conn: conn.execute(
            "INSERT OR REPLACE INTO collection_runs(collection, updated_at, summary) VALUES ('big', ?, '{}')",
            (utcnow(),),
        )
    )


@pytest.mark.parametrize(
    ("change", "done"),
    [
        (deactivate, (0, CHUNKS)),
        (copy_elsewhere, (CHUNKS, 0)),
        (replace_a_chunk, (1, 1)),
        (write_elsewhere, (0, CHUNKS)),
        (leave_collection_runs, (0, 0)),
    ],
)
def test_a_sync_after_a_change_reconciles_it(
    corpus: Corpus, change: Callable[[Corpus], None], done: tuple[int, int]
) -> None:
    sync(corpus)
    change(corpus)
    assert sync(corpus)[0] == done
    assert rows(corpus) == wanted(corpus)
    assert sync(corpus)[0] == (0, 0)


def test_a_sync_serves_every_connection_and_every_start(corpus: Corpus) -> None:
    """What a sync saw is the index's (migration 12), not its connection's: the store opened
    again, as a daemon started again opens it, has nothing to reconcile on an index nothing
    changed (3.4 s at a million chunks when it was kept per connection), and a later change by
    any connection is reconciled."""
    sync(corpus)
    corpus.store.close()
    corpus.store = Store(corpus.store.path)
    done, statements = sync(corpus)
    assert done == (0, 0) and reads_tables(statements) == []
    write_elsewhere(corpus)
    assert sync(corpus)[0] == (0, CHUNKS)
    assert rows(corpus) == wanted(corpus)


def test_a_sync_rolled_back_is_run_again(corpus: Corpus) -> None:
    """The mark of a sync whose transaction failed goes with it."""
    sync(corpus)
    deactivate(corpus)

    def fail(conn: sqlite3.Connection) -> None:
        vectors.sync_partitions(conn, corpus.space)
        raise RuntimeError("after the sync")

    with pytest.raises(RuntimeError):
        corpus.store.write(fail)
    assert sync(corpus)[0] == (0, CHUNKS)


# -- the chunk tally -------------------------------------------------------------------------


def test_the_first_count_after_a_batch_reads_only_the_batch(corpus: Corpus) -> None:
    agrees(corpus)
    corpus.add(5)
    with corpus.store.read() as conn, traced(conn) as seen:
        answer = counted(conn, corpus.space)
    assert [s for s in seen if "GROUP BY" in s and "content_vectors" in s] == []
    assert [s for s in seen if "FROM content_vectors WHERE id >" in s]
    with corpus.store.read() as conn:
        assert answer == truth(conn, corpus.space)


def half_written(c: Corpus) -> None:
    """Two of a content's four chunks, as a job killed between its batches leaves it."""
    h = hashlib.sha256(b"half").hexdigest()
    chunks = [vectors.ChunkVector(s, s, s + 1, 1, 1, 4, False, [0.5] * DIMS) for s in range(2)]

    def write(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO content(hash, doc, created_at) VALUES (?, 'half', ?)", (h, utcnow()))
        conn.execute(
            "INSERT INTO documents(collection, path, title, hash, created_at, modified_at, active)"
            " VALUES ('big', 'half.md', 'half', ?, ?, ?, 1)",
            (h, utcnow(), utcnow()),
        )
        vectors.write_document(conn, c.space, h, chunks, CHUNKS)

    c.store.write(write)


def forget_one(c: Corpus) -> None:
    def write(conn: sqlite3.Connection) -> None:
        h = conn.execute("SELECT hash FROM documents WHERE path = 'd4.md'").fetchone()[0]
        vectors.forget_hashes(conn, c.space, [h])

    c.store.write(write)


def chunkless(c: Corpus) -> None:
    def write(conn: sqlite3.Connection) -> None:
        h = conn.execute("SELECT hash FROM documents WHERE path = 'd5.md'").fetchone()[0]
        vectors.forget_hashes(conn, c.space, [h])
        vectors.mark_chunkless(conn, c.space, [h])

    c.store.write(write)


@pytest.mark.parametrize(
    "change",
    [lambda c: c.add(3), half_written, replace_a_chunk, forget_one, chunkless, deactivate, copy_elsewhere],
)
def test_counts_stay_exact_through_every_kind_of_change(corpus: Corpus, change: Callable[[Corpus], None]) -> None:
    agrees(corpus)
    change(corpus)
    agrees(corpus)
    corpus.add(2)
    agrees(corpus)


def test_a_space_dropped_and_made_again_is_counted_anew(corpus: Corpus) -> None:
    agrees(corpus)
    corpus.store.write(lambda conn: vectors.drop_space(conn, corpus.space))
    corpus.space = corpus.store.write(lambda conn: vectors.ensure_space(conn, "fp-index", "test", DIMS))
    agrees(corpus)
    corpus.add(2)
    agrees(corpus)


def test_an_older_snapshot_neither_sees_nor_spoils_newer_counts(corpus: Corpus) -> None:
    old = sqlite3.connect(str(corpus.store.path), isolation_level=None, check_same_thread=False)
    try:
        old.execute("PRAGMA query_only = 1")  # a reader, as the daemon's are
        old.execute("BEGIN")
        before = truth(old, corpus.space)
        corpus.add(4)
        agrees(corpus)  # the cache moves on to the new rows
        assert counted(old, corpus.space) == before  # the old snapshot counts what it sees
        old.execute("COMMIT")
        assert counted(old, corpus.space) == truth(old, corpus.space) != before
        agrees(corpus)
    finally:
        old.close()


def test_a_writer_rolled_back_leaves_no_count_behind(corpus: Corpus) -> None:
    agrees(corpus)
    h = hashlib.sha256(b"never").hexdigest()

    def fail(conn: sqlite3.Connection) -> None:
        chunks = [vectors.ChunkVector(s, s, s + 1, 1, 1, 4, False, [0.25] * DIMS) for s in range(CHUNKS)]
        vectors.write_document(conn, corpus.space, h, chunks, CHUNKS)
        assert h in vectors.complete_hashes(conn, corpus.space)  # the writer sees its own rows
        raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        corpus.store.write(fail)
    with corpus.store.read() as conn:
        assert h not in vectors.complete_hashes(conn, corpus.space)
    agrees(corpus)
    corpus.add(1)  # takes the rolled-back rows' ids
    agrees(corpus)


# -- the in-memory index ---------------------------------------------------------------------


def test_the_index_after_a_batch_reads_the_batch_not_the_partition(corpus: Corpus) -> None:
    idx = corpus.warm()
    corpus.add(5)
    with corpus.store.read() as conn:
        cid = vectors.collection_id(conn, "big", create=False)
        assert cid is not None
        with traced(conn) as seen:
            snap = idx.fresh(conn, corpus.space, cid)
        assert snap is not None and snap.size == 305 * CHUNKS
        assert [s for s in seen if "total(id)" in s or "json_group_array" in s] == []
        new = {r[0] for r in conn.execute("SELECT id FROM documents WHERE path IN ('d300.md', 'd304.md')")}
    for doc in new:  # a new document's own chunk is its nearest
        with corpus.store.read() as conn:
            (blob,) = conn.execute(
                "SELECT cv.embedding FROM documents d JOIN content_vectors cv ON cv.hash = d.hash"
                " WHERE d.id = ? AND cv.seq = 0",
                (doc,),
            ).fetchone()
        assert corpus.search(vector_codec.decode([blob], DIMS)[0].tolist(), 1)[0].doc_id == doc


def test_the_index_after_a_removal_drops_the_rows(corpus: Corpus) -> None:
    idx = corpus.warm()
    corpus.remove(["d7.md", "d8.md"])
    with corpus.store.read() as conn:
        cid = vectors.collection_id(conn, "big", create=False)
        assert cid is not None
        snap = idx.fresh(conn, corpus.space, cid)
        assert snap is not None and snap.size == 298 * CHUNKS
        live = {r[0] for r in conn.execute("SELECT id FROM vector_rows")}
        assert set(snap.row_ids.tolist()) == live
        gone = {r[0] for r in conn.execute("SELECT id FROM documents WHERE active = 0")}
    assert len(gone) == 2 and gone.isdisjoint(h.doc_id for h in corpus.search(corpus.query(), 300))
