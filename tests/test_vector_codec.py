"""How a chunk vector is stored (half floats of its unit vector) and measured (`vector_codec`)."""

from __future__ import annotations

import numpy as np
import pytest

from qmd.server.errors import InvalidInput
from qmd.server.store import vector_codec


def test_a_vector_is_stored_as_its_unit_vector_in_half_floats() -> None:
    rng = np.random.default_rng(1)
    v = rng.standard_normal(384) * 7.0
    blob = vector_codec.encode(v.tolist())
    assert len(blob) == 2 * 384
    back = vector_codec.decode([blob], 384)[0]
    assert back.dtype == np.float32
    assert np.allclose(back, v / np.linalg.norm(v), atol=2.0**-11)
    assert vector_codec.encode([0.0, 0.0]) == bytes(4)  # a zero vector stays zeros


def test_float32_rows_from_before_schema_10_are_read_by_their_length() -> None:
    """A Postgres index keeps its older rows as float32: both forms decode, even in one batch."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    old, new = x[0].tobytes(), vector_codec.encode(x[1])
    got = vector_codec.decode([old, new, x[2].tobytes()], 8)
    assert np.array_equal(got[0], x[0]) and np.array_equal(got[2], x[2])
    assert np.allclose(got[1], x[1] / np.linalg.norm(x[1]), atol=1e-3)
    assert vector_codec.stored(new, 8) == new
    assert vector_codec.stored(old, 8) == vector_codec.encode(x[0])


@pytest.mark.parametrize("bad", [[1.0, float("nan")], [float("inf"), 1.0], [], [[1.0], [2.0]]])
def test_an_unusable_embedding_is_refused_by_name(bad: list) -> None:
    with pytest.raises(InvalidInput, match="embedding"):
        vector_codec.encode(bad)


def test_a_row_of_another_size_is_refused() -> None:
    with pytest.raises(InvalidInput, match="not of its space's 8 dimensions"):
        vector_codec.decode([bytes(16), bytes(10)], 8)


def test_distances_are_the_same_bits_in_any_batch() -> None:
    """Every exact path measures with `distances`, on batches of any size: a row's distance
    must not depend on its neighbours (a matrix product's rounding does)."""
    rng = np.random.default_rng(3)
    rows = vector_codec.decode([vector_codec.encode(v) for v in rng.standard_normal((1000, 384))], 384)
    q = vector_codec.unit(rng.standard_normal(384))
    whole = vector_codec.distances(rows, q)
    assert all(
        vector_codec.distances(rows[i : i + 7], q).tolist() == whole[i : i + 7].tolist() for i in range(0, 1000, 7)
    )
    want = 1 - (rows.astype(np.float64) @ q) / np.linalg.norm(rows.astype(np.float64), axis=1)
    assert np.allclose(whole, want, atol=1e-6)
    for offset in range(4, 64, 4):  # a row's bits do not depend on where its batch sits in memory
        buf = np.frombuffer(bytearray(offset + rows[:9].nbytes), np.float32, 9 * 384, offset).reshape(9, 384)
        buf[:] = rows[:9]
        assert vector_codec.distances(buf, q).tolist() == whole[:9].tolist()
    assert vector_codec.distances(np.zeros((1, 384), np.float32), q).tolist() == [1.0]


def test_nearest_orders_by_distance_then_id() -> None:
    ids = np.array([9, 3, 5, 1, 7], np.int64)
    dist = np.array([0.5, 0.2, 0.2, 0.9, 0.1])
    assert vector_codec.nearest(ids, dist, 3) == [(7, 0.1), (3, 0.2), (5, 0.2)]
    assert vector_codec.nearest(ids, dist, 10) == [(7, 0.1), (3, 0.2), (5, 0.2), (9, 0.5), (1, 0.9)]
    assert vector_codec.nearest(ids, dist, 0) == []
