"""Bytes on disk a chunk vector: qmd's layout against the original qmd's, for the same vectors.

    .venv/bin/python bench/bench_vector_disk.py [--vectors 100000] [--dims 384] [--json FILE]

Each layout is made in a fresh SQLite file by its own schema, filled with the same unit
vectors under the same keys (64-hex content hashes, 8 chunks a content, a chunk key each),
and VACUUMed; a vector's bytes are the file's growth over the same file with the tables
empty, divided by the vectors. Layouts:

- **qmd now** (schema 10): the Store's own tables (`content_vectors` and its indexes,
  `vector_rows`, one row a chunk: one collection), written by `vectors.write_document`:
  the unit vector in half floats.
- **qmd at schema 9**: the same rows with float32 vectors and the space's fingerprint in
  each row, as migration 10 finds them.
- **the original qmd 2.x** (docs/design/original.md, "Tables"): `content_vectors(hash, seq,
  pos, model, embed_fingerprint, total_chunks, embedded_at, PK(hash, seq))` with its
  (model, fingerprint, hash, total_chunks) index, and the sqlite-vec table `vectors_vec`
  (vec0, `hash_seq TEXT PRIMARY KEY`, `embedding float[D]`, cosine). The model column holds
  a local GGUF path (45 characters; an `hf:` URI is longer) and the fingerprint 16 hex
  characters: each is repeated in every row, so longer ones make the original larger.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import code_line, table, write_json  # noqa: E402

CHUNKS = 8
MODEL = "/home/user/models/all-MiniLM-L6-v2-Q8_0.gguf"
FINGERPRINT = "3f9a2c7e5b1d4086"
EMBEDDED_AT = "2026-12-06T01:30:00.000Z"


def unit_vectors(n: int, dims: int, seed: int = 1) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dims), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def hashes(n: int) -> list[str]:
    return [hashlib.sha256(f"content-{i}".encode()).hexdigest() for i in range(-(-n // CHUNKS))]


def vacuumed_size(conn: Any, path: Path) -> int:
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size


def qmd_layouts(folder: Path, x: np.ndarray) -> tuple[float, float]:
    """Bytes a vector in qmd's schema 10 and, converted in place, its schema 9."""
    from qmd.server.store import vector_codec, vectors
    from qmd.server.store.sqlite import Store

    path = folder / "qmd.sqlite"
    store = Store(path)
    n, dims = x.shape
    try:
        space = store.write(lambda c: vectors.ensure_space(c, "f" * 64, "all-MiniLM-L6-v2", dims))
    finally:
        store.close()
    conn = _raw(path)
    base = vacuumed_size(conn, path)
    conn.close()
    store = Store(path)
    try:
        halves = x.astype(vector_codec.STORED)

        def write(conn: Any) -> None:
            for d, h in enumerate(hashes(n)):
                rows = range(d * CHUNKS, min(n, (d + 1) * CHUNKS))
                chunks = [
                    vectors.ChunkVector(
                        i - d * CHUNKS,
                        i * 900,
                        i * 900 + 900,
                        i * 20 + 1,
                        i * 20 + 20,
                        200,
                        False,
                        halves[i].tobytes(),
                        hashlib.sha256(f"chunk-{i}".encode()).hexdigest(),
                    )
                    for i in rows
                ]
                vectors.write_document(conn, space, h, chunks, CHUNKS)
            cid = vectors.collection_id(conn, "notes", create=True)
            conn.execute(
                "INSERT INTO vector_rows(space_id, chunk_id, collection_id)"
                " SELECT space_id, id, ? FROM content_vectors",
                (cid,),
            )

        store.write(write)
    finally:
        store.close()
    conn = _raw(path)
    now = (vacuumed_size(conn, path) - base) / n
    conn.create_function("f32", 1, lambda blob: vector_codec.decode([blob], dims)[0].tobytes())
    conn.execute("ALTER TABLE content_vectors ADD COLUMN embed_fingerprint TEXT NOT NULL DEFAULT ''")
    conn.execute("UPDATE content_vectors SET embedding = f32(embedding), embed_fingerprint = ?", ("f" * 64,))
    before = (vacuumed_size(conn, path) - base) / n
    conn.close()
    return now, before


def original_layout(folder: Path, x: np.ndarray) -> float:
    """Bytes a vector in the original's tables, made by its DDL and filled as its embed writes."""
    import sqlite_vec

    path = folder / "original.sqlite"
    conn = _raw(path)
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)
    n, dims = x.shape
    conn.execute(
        "CREATE TABLE content_vectors (hash TEXT NOT NULL, seq INTEGER NOT NULL DEFAULT 0, pos INTEGER NOT NULL"
        " DEFAULT 0, model TEXT NOT NULL, embed_fingerprint TEXT NOT NULL DEFAULT '', total_chunks INTEGER NOT NULL"
        " DEFAULT 1, embedded_at TEXT NOT NULL, PRIMARY KEY (hash, seq))"
    )
    conn.execute(
        "CREATE INDEX idx_content_vectors_model_fingerprint ON content_vectors(model, embed_fingerprint, hash,"
        " total_chunks)"
    )
    conn.execute(
        f"CREATE VIRTUAL TABLE vectors_vec USING vec0(hash_seq TEXT PRIMARY KEY, embedding float[{dims}]"
        " distance_metric=cosine)"
    )
    base = vacuumed_size(conn, path)
    conn.execute("BEGIN")
    for d, h in enumerate(hashes(n)):
        for i in range(d * CHUNKS, min(n, (d + 1) * CHUNKS)):
            seq = i - d * CHUNKS
            conn.execute(
                "INSERT INTO content_vectors VALUES (?, ?, ?, ?, ?, ?, ?)",
                (h, seq, i * 900, MODEL, FINGERPRINT, CHUNKS, EMBEDDED_AT),
            )
            conn.execute("INSERT INTO vectors_vec(hash_seq, embedding) VALUES (?, ?)", (f"{h}_{seq}", x[i].tobytes()))
    conn.execute("COMMIT")
    size = (vacuumed_size(conn, path) - base) / n
    conn.close()
    return size


def _raw(path: Path) -> Any:
    from qmd.server.store.db import sqlite3

    return sqlite3.connect(str(path), isolation_level=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vectors", type=int, default=100_000)
    ap.add_argument("--dims", type=int, default=384)
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(code_line())
    x = unit_vectors(a.vectors, a.dims)
    with tempfile.TemporaryDirectory(prefix="qmd-bench-disk-") as tmp:
        folder = Path(tmp)
        now, before = qmd_layouts(folder, x)
        original = original_layout(folder, x)
    raw = 4 * a.dims
    rows = [
        ("qmd now (schema 10: half floats)", now),
        ("qmd at schema 9 (float32, fingerprint per row)", before),
        ("the original qmd 2.x (vec0 + content_vectors)", original),
    ]
    print(f"\n{a.vectors:,} vectors of {a.dims} dimensions (float32: {raw:,} bytes)")
    print(
        table(
            ["layout", "bytes a vector", "× the original", "MB a million"],
            [[name, f"{b:,.0f}", f"{b / original:.2f}", f"{b:,.0f}"] for name, b in rows],
        )
    )
    figures = {
        "vectors": a.vectors,
        "dims": a.dims,
        "bytes_per_vector": {"qmd": now, "qmd_schema_9": before, "original": original},
        "ratio_to_original": now / original,
    }
    if a.json:
        a.json.write_text(json.dumps(figures, indent=2) + "\n")
    else:
        write_json("vector_disk", figures)


if __name__ == "__main__":
    main()
