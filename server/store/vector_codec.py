"""How a chunk vector is kept in `content_vectors`, and the one distance SQLite searches measure.

A vector is stored as its unit vector in IEEE half floats, 2 bytes a dimension (schema 10;
float32 before, 4 bytes). Issue 34's goal was the original's size for the same vectors:
float32 rows of ~1.75 KB fit two to a 4 KiB page (2,053 bytes a 1,536-byte vector, above the
original's ~1.9 KB with its metadata); half-float rows fit four. Cosine ranks by direction,
so keeping the unit vector loses only rounding: each component of a unit vector is within
2^-11 of itself relative (4.9e-4), which moves a cosine of 384 dimensions by ~1e-5, two
orders below the gaps the relevance model reads. Postgres has kept its vectors as pgvector's
`halfvec` from the start (server/store/pg_vectors.py), so both backends now rank the same
rounded vectors.

Rows written before schema 10 hold float32 (a Postgres index keeps them: its disk was never
the goal); `decode` reads either by length, so nothing depends on a conversion having run.

Every distance on SQLite is `distances` (the exact scan, the in-memory index's rescoring,
a filter's measured chunks): the cosine distance of the decoded rows, summed in float32 as
`vec_distance_cosine` summed it before (~1e-6 off the exact value), each row on its own, so
the paths agree to the last bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from qmd.server.errors import InvalidInput

STORED = np.dtype("<f2")
LEGACY = np.dtype("<f4")
"""What rows written before schema 10 hold (and what the embedder sends)."""

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


def encode(vector: Sequence[float] | npt.NDArray[np.floating]) -> bytes:
    """The stored form of a vector: its unit vector in half floats. A zero vector is stored as
    zeros (it is at distance 1 from everything); NaN or infinity is refused, by name."""
    x = np.asarray(vector, dtype=np.float64)
    if x.ndim != 1 or not x.size:
        raise InvalidInput(f"an embedding must be a non-empty list of numbers, not an array of shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise InvalidInput("an embedding holds NaN or infinity; the embedder's output is unusable")
    norm = float(np.linalg.norm(x))
    return (x / norm if norm > 0 else x).astype(STORED).tobytes()


def stored(blob: bytes, dims: int) -> bytes:
    """A blob in the stored form: a float32 one (from a row written before schema 10) converted."""
    return blob if len(blob) == STORED.itemsize * dims else encode(decode([blob], dims)[0])


def decode(blobs: Sequence[bytes], dims: int) -> F32:
    """Stored vectors as a (rows, dims) float32 array, each read by its length: half floats,
    or float32 from before schema 10. Any other length is a row of another space's size."""
    if not blobs:
        return np.zeros((0, dims), np.float32)
    lengths = set(map(len, blobs))
    for dtype in (STORED, LEGACY):
        if lengths == {dtype.itemsize * dims}:
            return np.frombuffer(b"".join(blobs), dtype=dtype).reshape(len(blobs), dims).astype(np.float32)
    out = np.empty((len(blobs), dims), np.float32)
    for i, blob in enumerate(blobs):
        for dtype in (STORED, LEGACY):
            if len(blob) == dtype.itemsize * dims:
                out[i] = np.frombuffer(blob, dtype=dtype)
                break
        else:
            raise InvalidInput(
                f"a stored vector of {len(blob)} bytes is not of its space's {dims} dimensions;"
                " `qmd doctor` checks the index"
            )
    return out


def unit(query: Sequence[float] | npt.NDArray[np.floating]) -> F32:
    """A query as `distances` reads it: its unit vector in float32 (never rounded to half)."""
    q = np.asarray(query, dtype=np.float64)
    norm = float(np.linalg.norm(q))
    return (q / norm if norm > 0 else q).astype(np.float32)


def distances(rows: F32, query: F32) -> F64:
    """Cosine distance of each row to the unit `query`: 1 − cos (a zero row: 1). Each row is
    summed on its own by `einsum`'s loop (1 ms for 8k rows of 384), never by a matrix product,
    whose rounding depends on how many rows it is given: a row's distance is the same bits
    whichever path, batch or shortlist measures it (a test checks batches and alignments)."""
    dots = np.einsum("ij,j->i", rows, query)
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    cos = np.divide(dots, norms, out=np.zeros(len(rows), np.float32), where=norms > 0)
    return 1.0 - cos.astype(np.float64)


def nearest(ids: npt.NDArray[np.int64], dist: F64, k: int) -> list[tuple[int, float]]:
    """The `k` smallest distances with their ids, nearest first, ties by id (what every exact
    path returns, so their answers merge)."""
    if len(dist) > k:
        cut = np.partition(dist, k - 1)[k - 1] if k > 0 else -np.inf
        keep = np.flatnonzero(dist <= cut)
        ids, dist = ids[keep], dist[keep]
    order = np.lexsort((ids, dist))[:k]
    return [(int(ids[i]), float(dist[i])) for i in order]
