"""Vectors stored once (issue 34): a SQLite index keeps each chunk vector in `content_vectors`
only. An index made by schema 7, with a sqlite-vec vec0 table per space holding a second copy,
is upgraded by migration 9, which drops it (with or without sqlite-vec loaded), answers the
same nearest neighbours after, and says how to give the freed pages back to the disk. Without
the in-memory index a search measures every vector of the partition (the exact scan), which
a search says while that index loads; a copy makes no second copy either. Real SQLite and
sqlite-vec, random vectors written through the embed job's own functions."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import cast

import numpy as np
import pytest
import sqlite_vec
from test_vectors import DIMS, Corpus

from qmd.server.config import Collection, Config
from qmd.server.errors import InvalidInput
from qmd.server.models.embedders import EmbedBackend, Embedder
from qmd.server.search import legs
from qmd.server.search.pointers import SearchOptions
from qmd.server.search.relevance import Scales
from qmd.server.search.vector import index_loading, vector_search
from qmd.server.store import copy as index_copy
from qmd.server.store import schema, sqlite, vector_codec, vector_index, vectors
from qmd.server.store.db import sqlite3
from qmd.server.store.sqlite import Store
from qmd.server.store.vector_tables import VecHit, widened

pytestmark = pytest.mark.sqlite_only("the vec0 tables and their migration are SQLite's")

QUERIES = 12


def connect(db: Path, *, vec: bool = True) -> closing[sqlite3.Connection]:
    conn = sqlite3.connect(str(db), isolation_level=None)
    if vec:
        conn.enable_load_extension(True)
        sqlite_vec.load(conn)
    return closing(conn)


def vec0_search(conn: sqlite3.Connection, space: vectors.Space, cid: int, q: list[float]) -> list[VecHit]:
    """What schema 7's qmd answered without its in-memory index: vec0's KNN, widened."""
    return (
        widened(
            conn,
            "big",
            10,
            lambda k: conn.execute(
                f"SELECT rowid, distance FROM vectors_s{space.id}"
                " WHERE embedding MATCH ? AND k = ? AND collection_id = ?",
                (np.asarray(q, np.float32).tobytes(), k, cid),  # vec0 took float32
            ).fetchall(),
        )
        or []
    )


def rewind_to_7(tmp_path: Path, db: Path, space: vectors.Space, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the index what schema 7's qmd left: the space's vec0 table (its DDL and rows as
    that qmd's `Vec0Tables` wrote them: one per `vector_rows` row) and no later migration's objects."""
    v7 = tmp_path / "v7.sqlite"
    with monkeypatch.context() as m:
        m.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:7])
        Store(v7).close()
    with connect(v7) as conn:
        known = {tuple(r) for r in conn.execute("SELECT type, name FROM sqlite_master")}
    with connect(db) as conn:
        for kind, name in conn.execute("SELECT type, name FROM sqlite_master").fetchall():
            if (kind, name) not in known and kind in ("table", "trigger", "view"):
                conn.execute(f'DROP {kind.upper()} IF EXISTS "{name}"')
        # schema 7's rows: float32 blobs (schema 10 stores half floats), the fingerprint repeated
        conn.create_function("f32", 1, lambda blob: vector_codec.decode([blob], space.dims)[0].tobytes())
        conn.execute("ALTER TABLE content_vectors ADD COLUMN embed_fingerprint TEXT NOT NULL DEFAULT ''")
        conn.execute(
            "UPDATE content_vectors SET embedding = f32(embedding), embed_fingerprint = ?", (space.fingerprint,)
        )
        conn.execute(
            f"CREATE VIRTUAL TABLE vectors_s{space.id} USING vec0("
            f"collection_id INTEGER PARTITION KEY, embedding float[{space.dims}] distance_metric=cosine)"
        )
        conn.execute(
            f"INSERT INTO vectors_s{space.id}(rowid, collection_id, embedding) SELECT vr.id, vr.collection_id,"
            " cv.embedding FROM vector_rows vr JOIN content_vectors cv ON cv.id = vr.chunk_id ORDER BY vr.id"
        )
        conn.execute("PRAGMA user_version = 7")


def same_hits(got: list[VecHit], want: list[VecHit]) -> bool:
    """The same documents and chunks in the same order, each distance within the rounding of
    its vector to half floats (schema 10) of vec0's float32 one."""
    return [replace(h, distance=0.0) for h in got] == [replace(h, distance=0.0) for h in want] and all(
        abs(a.distance - b.distance) < 1e-3 for a, b in zip(got, want, strict=True)
    )


def second_copies(db: Path) -> list[str]:
    """Tables holding a second copy of the vectors: vec0's and its shadow tables."""
    with connect(db, vec=False) as conn:
        return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name GLOB 'vectors_s[0-9]*'")]


@pytest.fixture
def old_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, vectors.Space, list]]:
    """A schema 7 index with a vec0 table, its queries and what it answered to each."""
    db = tmp_path / "index.sqlite"
    c = Corpus(db, seed=11)
    c.add(300)  # 1,200 vectors: one partition the in-memory index ranks exactly
    queries = [c.query() for _ in range(QUERIES)]
    space = c.space
    c.store.close()
    rewind_to_7(tmp_path, db, space, monkeypatch)
    with connect(db) as conn:
        (cid,) = conn.execute("SELECT id FROM vector_collection_ids WHERE name = 'big'").fetchone()
        answers = [(q, vec0_search(conn, space, cid, q)) for q in queries]
    assert all(len(a) == 10 for _, a in answers)
    assert second_copies(db)
    yield db, space, answers


def searches(store: Store, space: vectors.Space, q: list[float]) -> tuple[list[VecHit], list[VecHit]]:
    """The search without the in-memory index (the exact scan) and with it, warmed."""
    idx = vector_index.index_of(store)
    with store.read() as conn:
        cid = vectors.collection_id(conn, "big", create=False)
        assert cid is not None
        idx.warm(space, cid)
        return (
            vectors.search(conn, space, q, "big", 10),
            vectors.search(conn, space, q, "big", 10, None, idx),
        )


def test_migration_9_drops_the_second_copy_and_answers_the_same(
    old_index: tuple[Path, vectors.Space, list], caplog: pytest.LogCaptureFixture
) -> None:
    db, space, answers = old_index
    with caplog.at_level(logging.WARNING, logger="qmd.store"):
        store = Store(db)
    try:
        assert second_copies(db) == []
        assert f"dropped the second copy of the vectors (vectors_s{space.id})" in caplog.text
        assert "`qmd cleanup` gives them back" in caplog.text
        for q, before in answers:
            exact, indexed = searches(store, space, q)
            assert same_hits(exact, before)
            assert indexed == exact  # the index's distances are the exact scan's, bit for bit
        free = [c.what for c in store.checks() if not c.ok]
        assert len(free) == 1 and "are free pages: `qmd cleanup` gives them back to the disk" in free[0]
        size = store.size_bytes()
        vacuum, _ = store.compact(None, lambda _: None)  # what `qmd cleanup` runs
        assert vacuum.ran and store.size_bytes() < size
        assert all(c.ok for c in store.checks())
    finally:
        store.close()
    with connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(schema.MIGRATIONS)
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_migration_9_without_sqlite_vec_forgets_the_table(
    old_index: tuple[Path, vectors.Space, list], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keyword search opens an index without sqlite-vec, where SQLite cannot drop a vec0 table:
    the upgrade still succeeds, leaving neither the table nor its shadow tables."""
    db, space, answers = old_index
    with monkeypatch.context() as m:
        m.setattr(sqlite, "_load_vec", lambda conn: None)
        store = Store(db)
        try:
            assert store.vec_version is None
            with store.read() as conn:
                assert conn.execute("SELECT count(*) FROM documents WHERE active = 1").fetchone()[0] == 300
        finally:
            store.close()
    assert second_copies(db) == []
    with connect(db, vec=False) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        conn.execute(f"CREATE TABLE vectors_s{space.id}(x)")  # the name is free in the schema SQLite reads
        conn.execute(f"DROP TABLE vectors_s{space.id}")
    store = Store(db)
    try:
        for q, before in answers:
            exact, indexed = searches(store, space, q)
            assert same_hits(exact, before) and indexed == exact
    finally:
        store.close()


def test_a_new_space_keeps_its_vectors_once(tmp_path: Path) -> None:
    c = Corpus(tmp_path / "index.sqlite", seed=2)
    try:
        c.add(50)
        assert second_copies(c.store.path) == []
        with c.store.read() as conn:
            (rows,) = conn.execute("SELECT count(*) FROM vector_rows").fetchone()
            (stored,) = conn.execute("SELECT count(*) FROM content_vectors").fetchone()
        assert rows == stored == 200
    finally:
        c.store.close()


def test_the_exact_scan_is_the_index_s_exact_pass_and_brute_force(tmp_path: Path) -> None:
    """Without the in-memory index, `_knn` measures every row of the partition: the very rows
    and distances of the index's exact pass, ranked as a float64 cosine ranks them."""
    c = Corpus(tmp_path / "index.sqlite", seed=5)
    try:
        c.add(800)  # 3,200 rows: past the size the index measures whole
        idx = c.warm()
        with c.store.read() as conn:
            cid = vectors.collection_id(conn, "big", create=False)
            assert cid is not None
            snap = idx.fresh(conn, c.space, cid)
            assert snap is not None
            x = vector_codec.decode(
                [
                    r[0]
                    for r in conn.execute(
                        "SELECT cv.embedding FROM vector_rows vr JOIN content_vectors cv ON cv.id = vr.chunk_id"
                        " ORDER BY vr.id"
                    )
                ],
                DIMS,
            )
            row = {r[0]: i for i, r in enumerate(conn.execute("SELECT id FROM vector_rows ORDER BY id"))}
            for k in (1, 10, 300):
                for _ in range(5):
                    q = c.query()
                    got = vectors._knn(conn, c.space, vector_codec.unit(q), k, cid)  # noqa: SLF001 - the scan itself
                    assert got == vector_index.nearest(conn, c.space, cid, snap, q, k, exact=True)
                    qv = np.asarray(q, dtype=np.float64)
                    cos = 1 - (x @ qv) / (np.linalg.norm(x, axis=1) * np.linalg.norm(qv))
                    found = cos[[row[rid] for rid, _ in got]]
                    assert len(got) == k and np.allclose(found, [d for _, d in got], atol=1e-5)
                    assert found.max() <= np.sort(cos)[k - 1] + 1e-6  # the k nearest, float32 rounding aside
    finally:
        c.store.close()


def test_a_search_while_the_index_loads_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Until a partition's in-memory index is in, its searches are answered by the exact scan
    (about twice vec0's cost) and say so, `vsearch` and the hybrid query's vector leg alike;
    once it is in, they answer the same and say nothing."""
    monkeypatch.setattr(vector_index, "BUILD_INLINE", 10)  # this partition is built in the background
    c = Corpus(tmp_path / "index.sqlite", seed=6)
    try:
        c.add(100)
        config = Config(collections={"big": Collection(name="big", path=str(tmp_path))})
        spaces = {"big": c.space}
        embedder = Embedder("fake", cast(EmbedBackend, None), 64, "f" * 64, DIMS, "fake")
        q = c.query()
        cold = vector_search(c.store, config, spaces, q, "q", SearchOptions(), None)
        assert cold.hits and vectors.LOADING in cold.warnings  # and the build started
        deadline = time.monotonic() + 30
        while (leg := legs.vector_leg(c.store, embedder, spaces, Scales())).warning is not None:
            assert leg.warning == vectors.LOADING and time.monotonic() < deadline
            time.sleep(0.01)
        warm = vector_search(c.store, config, spaces, q, "q", SearchOptions(), None)
        assert warm.hits == cold.hits and vectors.LOADING not in warm.warnings
        pending = legs.vector_leg(c.store, embedder, spaces, Scales(), "2 documents pending")
        assert pending.warning == "2 documents pending"
        assert index_loading(c.store, {}) is None
    finally:
        c.store.close()


def test_a_copy_keeps_the_vectors_once_and_answers_the_same(tmp_path: Path) -> None:
    """`qmd index copy` to a SQLite file: the vectors arrive in `content_vectors` and the rows
    in `vector_rows`, nothing is made besides, and the copy answers as the source did."""
    c = Corpus(tmp_path / "src.sqlite", seed=8)
    try:
        c.add(200)
        queries = [c.query() for _ in range(5)]
        before = [c.search(q, index=False) for q in queries]
        report = index_copy.copy_index(c.store, tmp_path / "dst.sqlite")
    finally:
        c.store.close()
    assert report.vector_rows == 800 == report.rows["vector_rows"]
    assert second_copies(tmp_path / "dst.sqlite") == []
    store = Store(tmp_path / "dst.sqlite")
    try:
        for q, want in zip(queries, before, strict=True):
            assert searches(store, c.space, q) == (want, want)
    finally:
        store.close()


def test_a_small_partition_is_built_by_its_first_search(tmp_path: Path) -> None:
    """A note folder just embedded is searched from its in-memory index at once, without a
    "still loading" note: a partition of at most `BUILD_INLINE` rows is built inline."""
    c = Corpus(tmp_path / "index.sqlite", seed=7)
    try:
        c.add(100)
        config = Config(collections={"big": Collection(name="big", path=str(tmp_path))})
        spaces = {"big": c.space}
        first = vector_search(c.store, config, spaces, c.query(), "q", SearchOptions(), None)
        assert first.hits and vectors.LOADING not in first.warnings
        assert index_loading(c.store, spaces) is None
    finally:
        c.store.close()


def test_migration_10_stores_half_floats_and_answers_the_same(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An index of schema 9 (float32 rows, each repeating its space's fingerprint) is made again
    with half floats: the same rows found, the distances within rounding, the old pages free
    until `qmd cleanup`, which then gives the file a smaller size."""
    db = tmp_path / "index.sqlite"
    c = Corpus(db, seed=13)
    c.add(400)
    queries = [vector_codec.unit(c.query()) for _ in range(QUERIES)]
    space = c.space
    c.store.close()
    with connect(db) as conn:
        conn.create_function("f32", 1, lambda blob: vector_codec.decode([blob], space.dims)[0].tobytes())
        conn.execute("ALTER TABLE content_vectors ADD COLUMN embed_fingerprint TEXT NOT NULL DEFAULT ''")
        conn.execute(
            "UPDATE content_vectors SET embedding = f32(embedding), embed_fingerprint = ?", (space.fingerprint,)
        )
        conn.execute("VACUUM")
        conn.execute("PRAGMA user_version = 9")
        (cid,) = conn.execute("SELECT id FROM vector_collection_ids WHERE name = 'big'").fetchone()
        want = [vectors._knn(conn, space, q, 10, cid) for q in queries]  # noqa: SLF001 - float32 rows, exact
    before_bytes = db.stat().st_size
    with caplog.at_level(logging.WARNING, logger="qmd.store"):
        store = Store(db)
    try:
        assert "stored 1600 chunk vectors as half floats" in caplog.text
        with store.read() as conn:
            assert "embed_fingerprint" not in {r[1] for r in conn.execute("PRAGMA table_info(content_vectors)")}
            assert {len(r[0]) for r in conn.execute("SELECT embedding FROM content_vectors")} == {2 * DIMS}
            for q, w in zip(queries, want, strict=True):
                got = vectors._knn(conn, space, q, 10, cid)  # noqa: SLF001
                assert [r for r, _ in got] == [r for r, _ in w]
                assert all(abs(a - b) < 1e-3 for (_, a), (_, b) in zip(got, w, strict=True))
        free = [ch.what for ch in store.checks() if not ch.ok]
        assert len(free) == 1 and "are free pages" in free[0]
        vacuum, _ = store.compact(None, lambda _: None)  # what `qmd cleanup` runs
        assert vacuum.ran and store.size_bytes() < 0.9 * before_bytes  # 48 dims: ~100 bytes a row saved
    finally:
        store.close()


def test_an_embedding_with_nan_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    c = Corpus(tmp_path / "index.sqlite", seed=17)
    try:
        c.add(3)
        with c.store.read() as conn:
            before = conn.execute("SELECT count(*) FROM content_vectors").fetchone()[0]
        with pytest.raises(InvalidInput, match="NaN or infinity"):
            c.add(1, vector=[float("nan")] * DIMS)
        with c.store.read() as conn:
            assert conn.execute("SELECT count(*) FROM content_vectors").fetchone()[0] == before
            assert conn.execute("SELECT count(*) FROM documents").fetchone()[0] == 3
    finally:
        c.store.close()
