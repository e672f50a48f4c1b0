"""Vectors on a Postgres index at scale (issue 34), with a real Postgres (conftest's embedded
server), written as the embed job writes it (test_vectors.Corpus).

The daemon's in-memory first pass: a collection too large for pgvector's exact scan is
searched by the index SQLite's searches use (server/store/vector_index.py), its rows
measured again by pgvector, so recall@10 is the sign-bit pass's (≥ 0.99) and not HNSW's
(0.72 at a million rows), with pgvector's own distances; another daemon's writes are in the
next search; while it loads, HNSW answers and the answer says so. What an embed with
nothing to do and the first search after a batch read: a count of changes and the rows
past a top, as on SQLite, another daemon's included."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from test_vectors import CHUNKS, Corpus, found_first

from qmd.server.store import pg, pg_vectors, vector_index, vector_tables, vectors
from qmd.server.store.db import Connection
from qmd.server.store.pg_store import PgStore, raw, translate
from qmd.server.store.vector_tables import VecHit, widened


@pytest.fixture
def corpus(pg_index: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Corpus]:
    """3,000 vectors (past the shortlist's floor, so the first pass is approximate) in a
    collection pgvector would walk with HNSW: its exact-scan rules turned off."""
    monkeypatch.setattr(pg_vectors, "EXACT_UP_TO", 0)
    monkeypatch.setattr(pg_vectors, "EXACT_SHARE", 0.0)
    c = Corpus(PgStore(pg_index), seed=21)
    c.add(750)
    yield c
    c.store.close()


def exact(c: Corpus, q: list[float], limit: int = 10) -> dict[int, VecHit]:
    """The collection's exact top `limit` by pgvector's scan of every row (`knn_exact`)."""
    with c.store.read() as conn:
        cid = vectors.collection_id(conn, "big", create=False)
        assert cid is not None
        hits = widened(conn, "big", limit, lambda k: pg_vectors.knn_exact(raw(conn), c.space.id, q, k, cid))
    return {h.doc_id: h for h in hits or []}


def test_a_large_collection_is_searched_by_the_first_pass(corpus: Corpus, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every search goes through the in-memory pass; recall@10 against the exact ranking is
    ≥ 0.99, and each hit's distance is the one pgvector's exact scan gives, bit for bit."""
    corpus.warm()
    passes: list[int] = []
    measure = vector_index.nearest
    monkeypatch.setattr(vector_index, "nearest", lambda *a, **kw: passes.append(1) or measure(*a, **kw))
    queries = [corpus.query() for _ in range(30)]
    found = 0
    for q in queries:
        hits = corpus.search(q, 10)
        assert len(hits) == 10
        want = exact(corpus, q)
        found += len({h.doc_id for h in hits} & set(want))
        for h in hits:
            if h.doc_id in want:
                assert h == want[h.doc_id]
    assert len(passes) == len(queries)
    assert found / (10 * len(queries)) >= 0.99


def test_another_daemons_writes_are_in_the_next_search(corpus: Corpus, pg_index: str) -> None:
    """A second store on the same database (another daemon) adds a document and then removes
    it: this one's next search finds it first, by the rows appended to its snapshot, and
    after the removal never returns it."""
    corpus.warm()
    before = corpus.snapshot()
    assert before is not None and before.size == 750 * CHUNKS
    q = corpus.query()
    other = Corpus(PgStore(pg_index), seed=22)
    try:
        other.docs = corpus.docs  # new paths and contents
        new, new_id, _ = found_first(corpus, other, q, 1e-3)
        other.remove([new])
        assert new_id not in {h.doc_id for h in corpus.search(q)}
        gone = corpus.snapshot()
        assert gone is not None and gone.size == before.size
    finally:
        other.store.close()


def test_while_it_loads_hnsw_answers_and_says_so(corpus: Corpus, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition's first search starts the build in the background; until it is in, HNSW
    answers and `loading` names it (approximate), and afterwards says nothing."""
    monkeypatch.setattr(vector_index, "BUILD_INLINE", 0)
    release = threading.Event()
    build = vector_index.VectorIndex._build  # noqa: SLF001

    def held(self: vector_index.VectorIndex, space: vectors.Space, cid: int) -> vector_index.Snapshot:
        release.wait(30)
        return build(self, space, cid)

    monkeypatch.setattr(vector_index.VectorIndex, "_build", held)
    q = corpus.query()
    index = vector_index.index_of(corpus.store)
    with corpus.store.read() as conn:
        assert vectors.loading(conn, {"big": corpus.space}, index) == vectors.LOADING_HNSW
    assert len(corpus.search(q)) == 10  # HNSW's answer meanwhile
    release.set()
    for _ in range(300):
        if corpus.snapshot() is not None:
            break
        threading.Event().wait(0.05)
    loaded = corpus.snapshot()
    assert loaded is not None and loaded.size == 750 * CHUNKS
    with corpus.store.read() as conn:
        assert vectors.loading(conn, {"big": corpus.space}, index) is None


def test_writers_of_search_rows_take_turns(corpus: Corpus, pg_index: str) -> None:
    """A write of search rows waits for another session's that has begun, so their ids commit
    in order and no row lands below a snapshot's top after it was read."""
    import psycopg

    from qmd.server.store.pg_store import PgConnection

    other = Corpus(PgStore(pg_index), seed=23)
    other.docs = corpus.docs
    try:
        with psycopg.connect(pg_index, autocommit=True) as first, first.transaction():
            vectors.add_partitions(PgConnection(first), corpus.space, [])  # holds the turn
            writer = threading.Thread(target=other.add, args=(1,))
            writer.start()
            writer.join(1.0)
            assert writer.is_alive()  # waiting for the first session's commit
        writer.join(30)
        assert not writer.is_alive()
    finally:
        other.store.close()


def test_an_embed_with_nothing_to_do_reads_one_number(corpus: Corpus, pg_index: str) -> None:
    """Once the partitions are reconciled, the check before the next reconciliation reads the
    count of changes (`vector_changes`) and nothing else; another daemon's change of a
    document moves it, and the reconciliation after it settles again."""
    synced = functools.partial(vectors.partitions_synced, space=corpus.space)
    corpus.store.write(functools.partial(vectors.sync_partitions, space=corpus.space))
    assert corpus.store.write(synced, bump=False)
    other = Corpus(PgStore(pg_index), seed=24)
    try:
        other.store.write(lambda c: c.execute("UPDATE documents SET active = 0 WHERE path = 'd0.md'"))
        assert not corpus.store.write(synced, bump=False)
        added, removed = corpus.store.write(functools.partial(vectors.sync_partitions, space=corpus.space))
        assert (added, removed) == (0, CHUNKS)  # d0's rows, found by this daemon
        assert corpus.store.write(synced, bump=False)
    finally:
        other.store.close()


def test_a_reconciliation_serves_every_daemon_and_every_start(corpus: Corpus, pg_index: str) -> None:
    """What a reconciliation recorded is the index's, not its session's: a daemon started
    after it (a new store, new sessions) finds nothing to do without reconciling every search
    row again (18 s at a million), until a change moves the count."""
    corpus.store.write(functools.partial(vectors.sync_partitions, space=corpus.space))
    later = PgStore(pg_index)
    try:
        synced = functools.partial(vectors.partitions_synced, space=corpus.space)
        assert later.write(synced, bump=False)
        corpus.store.write(lambda c: c.execute("UPDATE documents SET active = 0 WHERE path = 'd0.md'"))
        assert not later.write(synced, bump=False)
        assert later.write(functools.partial(vectors.sync_partitions, space=corpus.space)) == (0, CHUNKS)
        assert corpus.store.write(synced, bump=False)
    finally:
        later.close()


def test_a_page_of_the_partition_is_an_index_range_without_statistics(pg_index: str) -> None:
    """The first pass reads a partition a page of row ids at a time (`vector_index._batches`).
    Right after a bulk load Postgres has no statistics on the tables; on an index of (space,
    collection) alone it then planned each page as a scan and a sort of every row past it
    (152 s to read a million rows, against 15 once analysed). The partition's index holds the
    row id too, so a page is an index range whatever the statistics."""
    import psycopg

    with psycopg.connect(pg_index, autocommit=True) as conn:
        pg.migrate(conn, "test")
        conn.execute("ALTER TABLE vector_rows SET (autovacuum_enabled = false)")
        conn.execute(
            "INSERT INTO vector_rows (space_id, chunk_id, collection_id)"
            " SELECT 1, g, 1 FROM generate_series(1, 50000) g"
        )
        query = translate(vector_index.PAGE_SQL.format(where="", batch=vector_index.BATCH))
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {query}", (1, 1, 25_000)))
    assert "Index Scan using idx_vector_rows_partition on vector_rows" in plan, plan
    assert "Sort" not in plan, plan


def test_the_count_moves_once_a_transaction_and_a_later_change_is_not_synced(corpus: Corpus) -> None:
    """A transaction of many statements moves the count once (a row updated once a statement
    made an embed batch's writes quadratic); a change after the writer's own reconciliation,
    in the same transaction, drops what the reconciliation recorded."""

    def count() -> int:
        with corpus.store.read() as conn:
            return int(conn.execute("SELECT n FROM vector_changes").fetchone()[0])

    before = count()
    corpus.add(3)  # documents, contents and vectors: dozens of statements, one transaction
    assert count() == before + 1

    def sync_then_change(conn: Connection) -> None:
        conn.execute("UPDATE documents SET active = 0 WHERE path = 'd2.md'")  # the count moves here
        assert vectors.sync_partitions(conn, corpus.space) == (0, CHUNKS)
        conn.execute("UPDATE documents SET active = 0 WHERE path = 'd1.md'")  # and not again

    corpus.store.write(sync_then_change)
    assert not corpus.store.write(functools.partial(vectors.partitions_synced, space=corpus.space), bump=False)
    assert corpus.store.write(functools.partial(vectors.sync_partitions, space=corpus.space)) == (0, CHUNKS)


def test_the_tally_follows_another_daemons_batches(
    corpus: Corpus, pg_index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's count of the embedded contents is kept and brought up to date by the rows
    another daemon adds past it: counted from scratch once, and the same as a fresh count."""
    counted: list[int] = []
    count = vectors._count  # noqa: SLF001 - the from-scratch count, spied on
    monkeypatch.setattr(vectors, "_count", lambda *a: counted.append(1) or count(*a))

    def complete() -> set[str]:
        with corpus.store.read() as conn:
            return vectors.complete_hashes(conn, corpus.space)

    before = complete()
    assert len(before) == 750 and complete() == before
    other = Corpus(PgStore(pg_index), seed=25)
    try:
        other.docs = corpus.docs
        other.add(3)
        after = complete()
        assert len(after) == 753 and before < after
        assert counted == [1]
        with corpus.store.read() as conn:
            fresh = vectors._count(conn, corpus.space, vector_tables.marks(conn, "content_vectors"))  # noqa: SLF001
        assert fresh.complete == after
    finally:
        other.store.close()


def test_a_collection_the_index_holds_is_not_counted_again(corpus: Corpus, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the first pass holds a collection larger than the exact scan's share, a search no
    longer counts the collection's rows to decide (a million rows: 50,001 index entries a
    search); before its first build it does."""
    import psycopg

    said: list[str] = []
    execute = psycopg.Connection.execute

    def spied(self: psycopg.Connection, query: Any, *args: Any, **kwargs: Any) -> Any:
        said.append(str(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", spied)
    monkeypatch.setattr(vector_index, "BUILD_INLINE", 0)  # the first search starts a build, HNSW answers
    q = corpus.query()
    corpus.search(q)
    assert any("count(*) <=" in s for s in said)
    corpus.warm()
    said.clear()
    assert len(corpus.search(q)) == 10
    assert not any("count(*) <=" in s for s in said)
