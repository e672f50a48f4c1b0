"""The vector leg on pgvector (server/store/pg_vectors.py) on a real Postgres (conftest's
embedded server), against numpy brute force over the same float32 vectors: the rows found,
the cosine distances (those of sqlite-vec's `vec_distance_cosine`, up to half-float rounding),
collection scoping, deletes, drops, the eligible-set path and the errors."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
import pytest

from qmd.server.errors import Conflict, InvalidInput, NotFound, Unavailable
from qmd.server.store import pg_vectors as pv

DIMS = 32
HALF_TOLERANCE = 1e-3
"""How far a distance over half floats may be from the float32 one (measured at 384 dims:
under 1e-4; a generous bound for 32)."""


@pytest.fixture
def conn(postgres_url: str) -> Iterator[psycopg.Connection]:
    """A connection whose tables land in a schema of its own (the `vector` type stays in
    public), dropped after the test: space ids never collide with another test's."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
        c.execute(f"SET search_path = {schema}, public")
        yield c
        c.execute(f"DROP SCHEMA {schema} CASCADE")


def unit(rng: np.random.Generator, n: int, dims: int = DIMS) -> npt.NDArray[np.float32]:
    x = rng.standard_normal((n, dims))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def cosine(x: npt.NDArray[np.float32], q: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    return 1.0 - (x.astype(np.float64) @ q) / (np.linalg.norm(x, axis=1) * np.linalg.norm(q))


def f32(values: Sequence[float] | npt.NDArray[np.float32]) -> bytes:
    """A vector as float32 bytes: what `insert_rows` takes, and a query's blob form."""
    return np.asarray(values, np.float32).tobytes()


def load(conn: psycopg.Connection, space: int, x: npt.NDArray[np.float32], cids: list[int], bulk: bool = False) -> None:
    """Rows 1..n into a new space: into its HNSW index as they come, or (`bulk`, a second
    instead of several for thousands of rows) with the index built after them."""
    pv.create_space_table(conn, space, x.shape[1], indexed=not bulk)
    pv.insert_rows(conn, space, [(i + 1, c, v.tobytes()) for i, (v, c) in enumerate(zip(x, cids))])
    if bulk:
        pv.build_index(conn, space)


WALK = "SELECT id FROM vectors_s1 WHERE collection_id = 2 ORDER BY embedding <=> %s::halfvec LIMIT 10"
"""An HNSW walk over collection 2 of space 1 as `knn` words it, for the tests that check the walk alone."""


def test_knn_matches_brute_force(conn: psycopg.Connection) -> None:
    rng = np.random.default_rng(1)
    x = unit(rng, 300)
    load(conn, 1, x, [7] * 300)
    for q in unit(rng, 5):
        got = pv.knn(conn, 1, f32(q), 10, 7)
        ref = cosine(x, q)
        assert [rid for rid, _ in got] == (np.argsort(ref)[:10] + 1).tolist()
        assert all(abs(d - ref[rid - 1]) < HALF_TOLERANCE for rid, d in got)
        assert [d for _, d in got] == sorted(d for _, d in got)
        assert pv.knn(conn, 1, q.tolist(), 10, 7) == got  # a float list is the same query as its blob
        assert pv.knn(conn, 1, q, 10, 7) == got  # so is a numpy array (numpy 2 spells its scalars np.float32(…))


def test_the_candidate_list_grows_with_the_space() -> None:
    """100 candidates up to half a million rows, then one per 5,000 rows (a million: 200),
    never fewer than k, never more than pgvector's 1,000."""
    assert [pv.ef_search(10, rows) for rows in (0, 200_000, 500_000, 1_000_000, 2_000_000)] == [100, 100, 100, 200, 400]
    assert pv.ef_search(10, 1_000_000) == 200 and pv.ef_search(300, 1_000_000) == 300
    assert pv.ef_search(10, 50_000_000) == 1_000 and pv.ef_search(10, -1.0) == 100  # never analyzed: -1


def test_knn_settings_do_not_leak(conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """The HNSW walk's settings are gone after it, inside a caller's transaction too."""
    load(conn, 1, unit(np.random.default_rng(2), 20), [1] * 20)
    monkeypatch.setattr(pv, "EXACT_UP_TO", 0)
    before = [conn.execute(f"SHOW {s}").fetchone() for s in ("hnsw.ef_search", "hnsw.iterative_scan")]
    with conn.transaction():
        assert len(pv.knn(conn, 1, [1.0] * DIMS, 5, 1)) == 5
        inside = [conn.execute(f"SHOW {s}").fetchone() for s in ("hnsw.ef_search", "hnsw.iterative_scan")]
    assert inside == before


@pytest.mark.slow
def test_hnsw_recall_in_a_big_collection(conn: psycopg.Connection) -> None:
    """Past `EXACT_UP_TO` the search is the HNSW walk: recall@10 against brute force, and
    every distance it gives is the exact one for its row."""
    rng = np.random.default_rng(3)
    centres = unit(rng, 60, 64)
    n = pv.EXACT_UP_TO + 1_000
    x = centres[rng.integers(0, 60, n)] + rng.standard_normal((n, 64)).astype(np.float32) / 8
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    load(conn, 1, x, [1] * n, bulk=True)
    conn.execute(f"ANALYZE {pv.table_name(1)}")
    found = 0
    for q in x[rng.integers(0, n, 20)] + 0.05:
        got = pv.knn(conn, 1, q.tolist(), 10, 1)
        assert len(got) == 10
        ref = cosine(x, q)
        found += len({rid for rid, _ in got} & set((np.argsort(ref)[:10] + 1).tolist()))
        exact = dict(pv.distances(conn, 1, q.tolist(), [rid for rid, _ in got]))
        assert all(exact[rid] == d for rid, d in got)
    assert found / 200 >= 0.95


def test_small_collection_inside_a_big_one(conn: psycopg.Connection) -> None:
    """A collection of a few rows beside thousands returns its own k rows, exactly, and
    never another collection's."""
    rng = np.random.default_rng(4)
    x = unit(rng, 3_000)
    cids = [2 if i % 100 == 0 else 1 for i in range(3_000)]
    load(conn, 1, x, cids, bulk=True)
    small = np.flatnonzero(np.array(cids) == 2)
    for q in unit(rng, 3):
        got = pv.knn(conn, 1, q.tolist(), 10, 2)
        ref = cosine(x[small], q)
        assert [rid for rid, _ in got] == (small[np.argsort(ref)[:10]] + 1).tolist()
        assert pv.knn_exact(conn, 1, q.tolist(), 10, 2) == got
    assert len(pv.knn(conn, 1, [1.0] * DIMS, 100, 2)) == 30  # k beyond the collection: all of it
    assert pv.knn(conn, 1, [1.0] * DIMS, 10, 99) == []  # a collection with no rows


def test_iterative_scan_fills_k_under_a_filter(conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """The HNSW walk itself (the exact threshold forced to 0, and sorting priced out so the
    planner cannot scan the small collection by its btree instead) still returns k rows of a
    1% collection: the iterative scan walks on until the filter has let them through."""
    rng = np.random.default_rng(5)
    x = unit(rng, 2_000)
    cids = [2 if i % 100 == 0 else 1 for i in range(2_000)]
    load(conn, 1, x, cids, bulk=True)
    monkeypatch.setattr(pv, "EXACT_UP_TO", 0)
    monkeypatch.setattr(pv, "EXACT_SHARE", 0.0)
    conn.execute("SET enable_sort = off")
    q = unit(rng, 1)[0].tolist()
    plan = conn.execute(
        "EXPLAIN " + WALK,
        (str(q),),
    ).fetchall()
    assert "_hnsw" in plan[1][0]
    got = pv.knn(conn, 1, q, 10, 2)
    assert len(got) == 10
    assert {cids[rid - 1] for rid, _ in got} == {2}


def test_a_small_share_of_a_big_space_is_searched_exactly(
    conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collection of 1% of its space's rows is scanned exactly whatever its size (a filtered
    walk loses its way there: a quarter of the top 10 at a million rows); without the share
    rule the same search is the walk."""
    rng = np.random.default_rng(11)
    x = unit(rng, 2_000)
    load(conn, 1, x, [2 if i % 100 == 0 else 1 for i in range(2_000)], bulk=True)
    conn.execute(f"ANALYZE {pv.table_name(1)}")
    monkeypatch.setattr(pv, "EXACT_UP_TO", 0)
    scans: list[str] = []
    exact = pv._exact

    def recorded(*args: Any) -> list[tuple[int, float]]:
        scans.append(args[3])
        return exact(*args)

    monkeypatch.setattr(pv, "_exact", recorded)
    q = unit(rng, 1)[0].tolist()
    assert pv.knn(conn, 1, q, 10, 2) == pv.knn_exact(conn, 1, q, 10, 2)
    assert scans == ["collection_id = %s", "collection_id = %s"]  # knn's own scan, then knn_exact's
    assert len(pv.knn(conn, 1, q, 10, 1)) == 10 and len(scans) == 2  # 99% of the rows: the walk
    monkeypatch.setattr(pv, "EXACT_SHARE", 0.0)
    assert len(pv.knn(conn, 1, q, 10, 2)) == 10 and len(scans) == 2


def test_a_walk_that_gives_up_is_answered_exactly(conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """A walk stopped after one tuple (``hnsw.max_scan_tuples``) with a candidate list of 10
    reaches a few of a 1% collection's rows, not 10: the exact scan answers instead."""
    rng = np.random.default_rng(10)
    x = unit(rng, 2_000)
    load(conn, 1, x, [2 if i % 100 == 0 else 1 for i in range(2_000)], bulk=True)
    monkeypatch.setattr(pv, "EXACT_UP_TO", 0)
    monkeypatch.setattr(pv, "EXACT_SHARE", 0.0)
    monkeypatch.setattr(pv, "EF_SEARCH", 10)
    conn.execute("SET enable_sort = off")
    conn.execute("SET hnsw.max_scan_tuples = 1")
    q = unit(rng, 1)[0].tolist()
    with conn.transaction(force_rollback=True):  # the walk alone, as knn runs it
        conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        conn.execute("SET LOCAL hnsw.ef_search = 10")
        walked = conn.execute(
            WALK,
            (str(q),),
        ).fetchall()
    assert len(walked) < 10
    assert pv.knn(conn, 1, q, 10, 2) == pv.knn_exact(conn, 1, q, 10, 2)
    assert len(pv.knn(conn, 1, q, 10, 2)) == 10


def test_distances_of_an_eligible_set(conn: psycopg.Connection) -> None:
    rng = np.random.default_rng(6)
    x = unit(rng, 200)
    load(conn, 1, x, [1] * 200)
    q = unit(rng, 1)[0]
    ids = [5, 17, 40, 199, 1_000]  # 1,000 is not a row: left out
    got = pv.distances(conn, 1, f32(q), ids)
    ref = cosine(x, q)
    assert sorted(rid for rid, _ in got) == [5, 17, 40, 199]
    assert [d for _, d in got] == sorted(d for _, d in got)
    assert all(abs(d - ref[rid - 1]) < HALF_TOLERANCE for rid, d in got)
    by_knn = dict(pv.knn(conn, 1, f32(q), 200, 1))
    assert all(by_knn[rid] == d for rid, d in got)  # the same expression on every path: equal to the bit
    assert pv.distances(conn, 1, q.tolist(), []) == []


def test_delete_and_drop(conn: psycopg.Connection) -> None:
    rng = np.random.default_rng(7)
    x = unit(rng, 50)
    load(conn, 1, x, [1] * 50)
    q = x[9].tolist()
    assert pv.knn(conn, 1, q, 1, 1)[0][0] == 10
    assert pv.delete_rows(conn, 1, [10, 11, 500]) == 2
    assert 10 not in {rid for rid, _ in pv.knn(conn, 1, q, 50, 1)}
    assert len(pv.knn(conn, 1, q, 50, 1)) == 48
    assert pv.delete_rows(conn, 1, []) == 0
    pv.drop_space_table(conn, 1)
    pv.drop_space_table(conn, 1)  # dropping what is gone is a no-op, as in vectors.drop_space
    with pytest.raises(NotFound, match="vector space 1 has no table"):
        pv.knn(conn, 1, q, 5, 1)


def test_wrong_dimensions_are_refused_whole(conn: psycopg.Connection) -> None:
    """A query or a row of the wrong size is `InvalidInput` naming the space; a batch with
    one bad row, a NaN or a row id already present writes nothing."""
    rng = np.random.default_rng(8)
    load(conn, 3, unit(rng, 10), [1] * 10)
    with pytest.raises(InvalidInput, match="vector space 3: .*dimensions"):
        pv.knn(conn, 3, [1.0] * (DIMS + 1), 5, 1)
    with pytest.raises(InvalidInput, match="vector space 3: .*dimensions"):
        pv.distances(conn, 3, [1.0] * 4, [1])
    with pytest.raises(InvalidInput, match="vector space 3: .*dimensions"):
        pv.insert_rows(conn, 3, [(100, 1, f32([1.0] * 8))])
    with pytest.raises(InvalidInput, match="vector space 3: a batch holds vectors of"):
        pv.insert_rows(conn, 3, [(100, 1, f32([1.0] * DIMS)), (101, 1, f32([1.0] * 8))])
    with pytest.raises(InvalidInput, match="vector space 3: .*NaN"):
        pv.insert_rows(conn, 3, [(100, 1, f32([1.0] * DIMS)), (101, 1, f32([float("nan")] * DIMS))])
    with pytest.raises(InvalidInput, match="vector space 3: .*beyond ±65504"):
        pv.insert_rows(conn, 3, [(100, 1, f32([1e6] * DIMS))])
    with pytest.raises(Conflict, match=r"vector space 3: .*\(id\)=\(5\) already exists"):
        pv.insert_rows(conn, 3, [(100, 1, f32([1.0] * DIMS)), (5, 1, f32([1.0] * DIMS))])
    assert conn.execute(f"SELECT count(*), max(id) FROM {pv.table_name(3)}").fetchone() == (10, 10)
    with pytest.raises(Conflict, match="already has a table"):
        pv.create_space_table(conn, 3, DIMS)
    with pytest.raises(InvalidInput, match="5000 dimensions"):
        pv.create_space_table(conn, 4, 5_000)
    assert conn.execute("SELECT to_regclass('vectors_s4')").fetchone() == (None,)


def test_bulk_load_then_build(conn: psycopg.Connection) -> None:
    """A table made without its HNSW index (a copy's bulk load) gets it from `build_index`,
    once; searches answer the same before and after."""
    rng = np.random.default_rng(9)
    x = unit(rng, 100)
    pv.create_space_table(conn, 1, DIMS, indexed=False)
    pv.insert_rows(conn, 1, [(i + 1, 1, v.tobytes()) for i, v in enumerate(x)])
    before = pv.knn(conn, 1, x[0].tolist(), 5, 1)
    pv.build_index(conn, 1)
    pv.build_index(conn, 1)
    indexes = conn.execute("SELECT count(*) FROM pg_indexes WHERE tablename = %s", (pv.table_name(1),)).fetchone()
    assert indexes == (3,)  # primary key, collection, HNSW
    assert pv.knn(conn, 1, x[0].tolist(), 5, 1) == before


def test_a_database_without_pgvector(conn: psycopg.Connection) -> None:
    """Where the `vector` type cannot be found (here: public, which holds it, off the search
    path) making a space is `Unavailable`, saying how to add the extension, and leaves nothing."""
    schema = conn.execute("SELECT current_schema()").fetchone()
    conn.execute("SET search_path = " + schema[0])
    with pytest.raises(Unavailable, match="no pgvector .*CREATE EXTENSION vector"):
        pv.create_space_table(conn, 1, DIMS)
    assert conn.execute("SELECT to_regclass('vectors_s1')").fetchone() == (None,)
