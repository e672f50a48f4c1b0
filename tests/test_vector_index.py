"""The in-memory vector index's passes on their own (issue 34): the sign-bit estimate against
its float formula, the shortlist's threshold, recall@10 on Gaussian vectors (the hard case)
against an exact float ranking, the int8 bound that makes the exact paths exact, and a build
that holds a partition once. Pure numpy on seeded random vectors, and for the build the real
Store, written as the embed job writes it (test_vectors.Corpus)."""

from __future__ import annotations

import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from test_vectors import Corpus

from qmd.server.store import cores, vector_index
from qmd.server.store.vector_tables import Marks

DIMS = 384


def unit(rng: np.random.Generator, n: int, dims: int = DIMS) -> np.ndarray:
    x = rng.standard_normal((n, dims)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def snapshot_of(x: np.ndarray) -> vector_index.Snapshot:
    """The index's snapshot of these unit vectors (row i has id i), coded as a build codes them."""
    n = len(x)
    mean = x[: vector_index.BATCH].mean(axis=0).astype(np.float32)
    ids = np.arange(n, dtype=np.int64)
    parts = (
        vector_index._code(ids[lo : lo + 4096], ids[lo : lo + 4096], x[lo : lo + 4096], mean)  # noqa: SLF001
        for lo in range(0, n, 4096)
    )
    return vector_index._snapshot(0, Marks(0, 0), mean, parts, n)  # noqa: SLF001 - the index's own constructor


def top(x: np.ndarray, q: np.ndarray, k: int, rows: np.ndarray | None = None) -> set[int]:
    """The exact top `k` (of `rows`, or of all) by a float64 cosine."""
    rows = np.arange(len(x)) if rows is None else rows
    sims = x[rows].astype(np.float64) @ (q.astype(np.float64) / np.linalg.norm(q))
    return set(rows[np.argsort(-sims, kind="stable")[:k]].tolist())


@pytest.fixture(scope="module")
def gaussian() -> tuple[np.ndarray, vector_index.Snapshot]:
    x = unit(np.random.default_rng(34), 30_000)
    return x, snapshot_of(x)


def test_sign_estimates_are_the_quantized_dot_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """The XOR / AND / popcount pass computes factor·(q̂ · sign(x')) exactly, q̂ the query's
    sign·level, across block edges (a block smaller than the rows, a last one partly full)."""
    monkeypatch.setattr(vector_index, "BITS_BLOCK", 100)
    rng = np.random.default_rng(1)
    for dims in (48, 384):
        x = unit(rng, 1_050, dims)
        snap = snapshot_of(x)
        c = snap.columns
        q = unit(rng, 1, dims)[0]
        query = vector_index._SignQuery.of(q, c.bits.shape[0])  # noqa: SLF001
        got = vector_index._sign_estimates(c.bits[:, : snap.size], c.factor[: snap.size], query)  # noqa: SLF001
        signs = np.unpackbits(c.bits[:, : snap.size].T.copy().view(np.uint8), axis=1)[:, :dims] * 2.0 - 1
        levels = np.unpackbits(query.planes.view(np.uint8), axis=1)[:, :dims]
        weights = (levels * (1 << np.arange(len(levels)))[:, None]).sum(axis=0)
        q_hat = np.where(np.unpackbits(query.signs.view(np.uint8))[:dims] == 1, weights, -weights)
        assert float(weights.sum()) == query.total
        np.testing.assert_allclose(got, (signs @ q_hat) * c.factor[: snap.size], rtol=1e-6)


def test_passes_cut_across_threads_give_the_same_numbers(
    gaussian: tuple[np.ndarray, vector_index.Snapshot], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sign-bit and int8 passes, their rows cut into parts (uneven, one per free worker and
    one in the caller), give the very estimates they give in one part, and so the same
    candidates, however many of the pool's workers other searches hold."""
    x, snap = gaussian
    c, n = snap.columns, snap.size
    rng = np.random.default_rng(5)
    queries = unit(rng, 3)
    rows = np.sort(rng.choice(n, 7_001, replace=False)).astype(np.int64)

    def passes() -> list[np.ndarray]:
        out = []
        for q in queries:
            sign = vector_index._SignQuery.of(q, c.bits.shape[0])  # noqa: SLF001
            exact = vector_index._Query.of(q.tolist())  # noqa: SLF001
            out.append(vector_index._sign_estimates(c.bits[:, :n], c.factor[:n], sign))  # noqa: SLF001
            out.append(vector_index._int8_sims(snap, exact, rows))  # noqa: SLF001
            out.append(vector_index._int8_sims(snap, exact))  # noqa: SLF001
            out.append(vector_index.candidates(snap, q.tolist(), 10, exact=False, within=None))
        return out

    monkeypatch.setattr(cores, "THREADS", 1)
    alone = passes()
    monkeypatch.setattr(cores, "THREADS", 3)
    monkeypatch.setattr(vector_index, "SIGN_PART", 7_000)
    monkeypatch.setattr(vector_index, "INT8_PART", 1_000)
    monkeypatch.setattr(cores, "_FREE", threading.Semaphore(2))
    with ThreadPoolExecutor(2) as pool:
        monkeypatch.setattr(cores, "_POOL", pool)
        for one, cut in zip(alone, passes(), strict=True):
            np.testing.assert_array_equal(one, cut)
        submitted = pool.submit
        monkeypatch.setattr(pool, "submit", lambda *a: pytest.fail("a part submitted while sharing"))
        with cores.sharing():  # a hybrid query's legs: no parts
            for one, cut in zip(alone, passes(), strict=True):
                np.testing.assert_array_equal(one, cut)
        monkeypatch.setattr(pool, "submit", submitted)
        assert cores._FREE.acquire(blocking=False)  # noqa: SLF001 - another search holds a worker
        for one, cut in zip(alone, passes(), strict=True):
            np.testing.assert_array_equal(one, cut)
        assert cores._FREE.acquire(blocking=False)  # noqa: SLF001 - and the other: one part
        for one, cut in zip(alone, passes(), strict=True):
            np.testing.assert_array_equal(one, cut)


def test_about_best_keeps_about_m_and_never_a_worse_row() -> None:
    """Every row kept is at least as good as every row left; about `m` are kept for the
    shares the shortlist asks (1/16 of the rows and more), all of them up to `SAMPLE` rows."""
    rng = np.random.default_rng(2)
    for n in (10, 5_000, 300_000):
        values = rng.standard_normal(n).astype(np.float32)
        for m in (1, n // 16 or 1, n // 3 or 1):
            kept = vector_index._about_best(values, m)  # noqa: SLF001
            left = np.setdiff1d(np.arange(n), kept)
            assert np.all(np.diff(kept) > 0)
            assert len(left) == 0 or values[kept].min() >= values[left].max()
            if n <= vector_index.SAMPLE:
                assert len(kept) == m
            elif m >= n // 16:
                assert 0.9 * m <= len(kept) <= 1.1 * m
    assert len(vector_index._about_best(np.zeros(5, np.float32), 9)) == 5  # noqa: SLF001


def test_recall_on_gaussian_vectors(gaussian: tuple[np.ndarray, vector_index.Snapshot]) -> None:
    """The approximate path's candidates, measured exactly, hold the true top 10: recall@10 ≥
    0.99 over 100 queries, on random Gaussian vectors (no clusters: the hard case)."""
    x, snap = gaussian
    rng = np.random.default_rng(3)
    found = 0
    for q in unit(rng, 100):
        rows = vector_index.candidates(snap, q.tolist(), 10, exact=False, within=None)
        assert len(rows) == 10 + vector_index.MIN_RESCORED
        found += len(top(x, q, 10) & top(x, q, 10, rows))
    assert found / 1000 >= 0.99


def test_the_bound_holds_every_true_neighbour(gaussian: tuple[np.ndarray, vector_index.Snapshot]) -> None:
    """The exact paths (all rows, or a subset) hand SQLite a superset of the true top k, also
    for a query whose integer copy is coarse (one large component), and they stay small."""
    x, snap = gaussian
    rng = np.random.default_rng(4)
    spiky = unit(rng, 4)
    spiky[:, 0] = 40.0
    subset = np.sort(rng.choice(len(x), 500, replace=False)).astype(np.int64)
    for q in [*unit(rng, 6), *spiky]:
        for k in (1, 10, 100):
            rows = vector_index.candidates(snap, q.tolist(), k, exact=True, within=None)
            assert top(x, q, k) <= set(rows.tolist())
            assert len(rows) < 20 * k + 200
            among = vector_index.candidates(snap, q.tolist(), k, exact=False, within=subset)
            assert top(x, q, k, subset) <= set(among.tolist()) <= set(subset.tolist())


def test_a_build_holds_the_partition_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The build writes each coded batch into the snapshot's columns: at its peak it holds
    the columns and one batch, not the partition coded twice (concatenated, then copied)."""
    monkeypatch.setattr(vector_index, "BATCH", 64)
    c = Corpus(tmp_path / "index.sqlite", seed=6)
    try:
        for _ in range(4):
            c.add(500)
        tracemalloc.start()
        try:
            c.warm()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        snap = vector_index.index_of(c.store)._parts  # noqa: SLF001
        (part,) = snap.values()
        assert part.snapshot is not None and part.snapshot.size == 8_000
        assert peak < 1.5 * part.snapshot.nbytes  # the code this replaced: 2.0
    finally:
        c.store.close()
