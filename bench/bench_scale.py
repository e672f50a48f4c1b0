"""qmd at scale: every cost a user pays at 10k, 100k and 1M chunks, beside the same run's floors.

    .venv/bin/python bench/bench_scale.py [--sizes 10000,100000] [--json FILE] [--queries 50]
                                          [--exact-queries 20] [--seed 1] [--model GGUF] [--keep]
                                          [--backend sqlite|postgres] [--url postgresql://...]

Per size N (chunks), one isolated installation (bench/_common.py's `Isolated`):

1. A corpus of N/8 markdown notes of real text: paragraphs of the Python standard library's
   docstrings (read with `ast`, no import), shuffled into notes of 8 `##` sections under a
   `#` title; the docstrings' summary lines are the keyword queries. Seeded: the same size
   and seed give the same files.
2. A daemon (`qmdd`, with the shared MiniLM GGUF as its embed model) indexes it with the CLI
   (`qmd collection add`), then stops.
3. In process (the `Engine` on the same index, no daemon): 8 synthetic unit vectors of 384
   dims per note, written through the store's own code (`vectors.ensure_space` in the space
   the daemon's embedder would write, `write_document` + `add_partitions` per batch, as the
   embed job does), so no model runs. 500 notes (a tenth of the smallest corpora) are held
   back for the embed batches below. Then, over random unit queries:
     vector leg     `vectors.search(..., index)`: the daemon's in-memory index, p50/p95
     exact          the same call without the index (the exact scan of every vector): the baseline, and
                    the reference of recall@10
     numpy floor    `M @ q` + top 30 over the partition's float32 matrix: the memory-bandwidth
                    floor of any float scan
     warm search    `Engine.vector_state` (cached) + the indexed search, nothing changed
     first search after an embed batch
                    the same right after a batch of held-back notes was written (the engine's
                    cached state and the index's snapshot both stale)
4. A daemon again, on the same index, from a fresh process: cold start to its first keyword
   answer and to its in-memory vector index loaded (vector searches stop saying it is
   loading), then over HTTP from a warm client: keyword (`POST /v1/keyword`, the CLI's body),
   the full `query` without model stages but the query's embedding (`POST /v1/query`, expand
   and rerank off), each round and each of the two on summary lines of its own (the daemon
   keeps each word's document count until the index changes: a repeated query would time
   what it remembers), `update` with nothing changed, an embed call with nothing to do
   (`POST /v1/embed`), daemon RSS with the index loaded, the index size on disk, the first
   embed call of a daemon started again on the unchanged index, and last `update` after 1% of
   the notes were edited.

`--backend postgres` measures the same on a Postgres index (`QMD_INDEX_URL`): a fresh database
per size on the server at `--url`, else on an embedded one (tests/pg_server.py). What differs:
the vectors go into the space's pgvector table without its HNSW index, which is built after
them (`hnsw_build_s`), as `qmd index copy` does (inserted into the index one by one a
million rows would take ~25 minutes); the vector leg is the same in-memory index, its rows
measured again by pgvector; the exact scan and the reference of recall@10 is pgvector's
`knn_exact`; the search without the in-memory index (what answers while it loads) is
pgvector's HNSW walk, timed with its recall@10 (`hnsw_p50_ms`, `hnsw_recall_at_10`); the embed
batches are inserted into the HNSW index as the embed job inserts them; the size on disk is
the database's. `--no-hnsw` skips the HNSW build (565 s at 1M) and its walk: the daemon's
leg is then read from tables Postgres has no statistics of yet, as right after a bulk load.

Prints a table per size and writes the figures (`--json FILE`, else bench/out/scale.json):
a list with one object per size. Figures only, never assertions; on a shared machine read
them beside their floors.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import sys
import sysconfig
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    Daemon,
    Isolated,
    code_line,
    embed_model_path,
    machine,
    mb,
    percentile,
    pg_database,
    pg_database_bytes,
    proc_status_kb,
    table,
    write_json,
)

if TYPE_CHECKING:
    from qmd.server.engine import Engine
    from qmd.server.store.vectors import Space

DIMS = 384
CHUNKS_PER_NOTE = 8
LIMIT = 10
BATCHES = 5
"""Embed batches timed (each followed by its first search)."""
BATCH_NOTES = 100
"""Notes per embed batch (800 vectors), at most a tenth of the corpus over all batches."""
COLLECTION = "notes"
ENGINE_VARS = ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "QMD_EMBED_MODEL", "QMD_INDEX_URL")
"""The isolated installation's variables the in-process `Engine` reads."""
EMBED_NOOPS = 5
"""Embed calls with nothing to do timed after the daemon's first (which reads the partitions'
state once, and is reported apart)."""


# -- the corpus --------------------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    """Real text to build notes from: docstring paragraphs, and summary lines as queries."""

    paragraphs: list[str]
    summaries: list[str]


def text_pool(min_paragraphs: int = 20_000) -> Pool:
    """Docstrings of the standard library's modules, classes and functions, read with `ast`
    (nothing imported), file by file in sorted order until `min_paragraphs` are found."""
    paragraphs: list[str] = []
    summaries: list[str] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            parts = [" ".join(p.split()) for p in doc.split("\n\n")]
            if 3 <= len(parts[0].split()) <= 16:
                summaries.append(parts[0].rstrip("."))
            paragraphs += [p for p in parts if len(p) >= 80]
        if len(paragraphs) >= min_paragraphs:
            break
    return Pool(paragraphs, sorted(set(summaries)))


def note(pool: Pool, rng: random.Random, number: int) -> str:
    """One note: a title, then `CHUNKS_PER_NOTE` sections of one to three paragraphs."""
    title = rng.choice(pool.summaries)
    lines = [f"# {title} ({number})", ""]
    for _ in range(CHUNKS_PER_NOTE):
        heading = " ".join(rng.choice(pool.summaries).split()[:5])
        lines += [f"## {heading}", ""]
        for _ in range(rng.randint(1, 3)):
            lines += [rng.choice(pool.paragraphs), ""]
    return "\n".join(lines)


def write_corpus(root: Path, notes: int, pool: Pool, seed: int) -> int:
    """`notes` notes in folders of 500; returns the bytes written."""
    rng = random.Random(f"qmd-bench-scale-{seed}")
    total = 0
    for i in range(notes):
        path = root / f"part{i // 500:04d}" / f"note{i:07d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        total += path.write_text(note(pool, rng, i), encoding="utf-8")
    return total


# -- vectors through the store's code ------------------------------------------------------


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random unit vectors: no clusters, the hard case for a quantized first pass."""
    x = rng.standard_normal((n, DIMS), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def bench_space(engine: Engine) -> Space:
    """The space the daemon's embedder writes for the collection (its fingerprint for the
    collection's chunk strategy), made through the store's code."""
    from qmd.server.store import vectors

    emb = engine.embedder()
    fingerprint = emb.fingerprint_for(engine.chunk_strategies([COLLECTION])[COLLECTION])
    return engine.store.write(lambda c: vectors.ensure_space(c, fingerprint, emb.model_name, emb.dims))


def embed_batch(engine: Engine, space: Space, hashes: list[str], rng: np.random.Generator) -> None:
    """What one embed job batch writes: each content's chunk vectors and its search rows, in
    one transaction. Chunks are the note's text cut in `CHUNKS_PER_NOTE` equal spans."""
    from qmd.server.store import vector_codec, vectors

    with engine.store.read() as conn:
        bodies = dict(
            conn.execute(
                f"SELECT hash, doc FROM content WHERE hash IN ({','.join('?' * len(hashes))})", hashes
            ).fetchall()
        )
    embeddings = unit_vectors(rng, len(hashes) * CHUNKS_PER_NOTE).astype(vector_codec.STORED)  # as stored

    def write(conn: Any) -> None:
        for i, h in enumerate(hashes):
            body = bodies[h]
            cuts = [len(body) * s // CHUNKS_PER_NOTE for s in range(CHUNKS_PER_NOTE + 1)]
            chunks = [
                vectors.ChunkVector(
                    s,
                    cuts[s],
                    cuts[s + 1],
                    body.count("\n", 0, cuts[s]) + 1,
                    body.count("\n", 0, cuts[s + 1]) + 1,
                    (cuts[s + 1] - cuts[s]) // 4,
                    False,
                    embeddings[i * CHUNKS_PER_NOTE + s].tobytes(),
                )
                for s in range(CHUNKS_PER_NOTE)
            ]
            vectors.write_document(conn, space, h, chunks, CHUNKS_PER_NOTE)
        vectors.add_partitions(conn, space, hashes)

    engine.store.write(write)


def unindexed(conn: Any, space: Space) -> None:
    """Postgres: the space's table made again without its HNSW index, for the rows to come."""
    from qmd.server.store import vectors

    if (table := vectors.space_table(conn)) is not None:
        table.drop(space)
        table.create(space, bulk=True)


def indexed(conn: Any, space: Space, hnsw: bool = True) -> None:
    """Postgres: the HNSW index built over the rows (unless not wanted), and the table analyzed
    (the row estimate `knn` reads, which autovacuum would give later)."""
    from qmd.server.store import pg_vectors, vectors
    from qmd.server.store.pg_store import raw

    if (table := vectors.space_table(conn)) is not None:
        if hnsw:
            table.build_index(space)
        raw(conn).execute(f"ANALYZE {pg_vectors.table_name(space.id)}")


def exact_search(conn: Any, space: Space, q: np.ndarray, cid: int) -> list[Any]:
    """The collection's exact top `LIMIT` documents: SQLite's search without the in-memory
    index (its scan of every vector), Postgres' `knn_exact` widened as its search widens `knn`."""
    from qmd.server.store import vectors

    if vectors.space_table(conn) is None:
        return vectors.search(conn, space, q, COLLECTION, LIMIT)
    from qmd.server.store import pg_vectors
    from qmd.server.store.pg_store import raw
    from qmd.server.store.vector_tables import widened

    hits = widened(conn, COLLECTION, LIMIT, lambda k: pg_vectors.knn_exact(raw(conn), space.id, q, k, cid))
    return hits or []


def in_process(env: Isolated, args: argparse.Namespace) -> dict[str, Any]:
    """Step 3 of the module's docstring: the vectors written, then the vector leg's figures."""
    os.environ.update({k: v for k, v in env.vars.items() if k in ENGINE_VARS})
    from qmd.paths import IndexPaths
    from qmd.server.engine import Engine
    from qmd.server.store import vector_codec, vector_index, vectors
    from qmd.server.store.sqlite import Store

    rng = np.random.default_rng(args.seed)
    engine = Engine(IndexPaths.resolve(None))
    try:
        space = bench_space(engine)
        engine.store.write(lambda c: unindexed(c, space))
        with engine.store.read() as conn:
            hashes = [r[0] for r in conn.execute("SELECT DISTINCT hash FROM documents WHERE active = 1 ORDER BY hash")]
        held = max(BATCHES, min(BATCHES * BATCH_NOTES, len(hashes) // 10))
        held_back, now = hashes[:held], hashes[held:]
        t0 = time.perf_counter()
        for i in range(0, len(now), 500):
            embed_batch(engine, space, now[i : i + 500], rng)
        write_s = time.perf_counter() - t0
        print(f"  vectors: {len(now) * CHUNKS_PER_NOTE:,} written in {write_s:.1f}s", flush=True)

        postgres = not isinstance(engine.store, Store)
        walk = postgres and not args.no_hnsw
        hnsw_s = timed(lambda: engine.store.write(lambda c: indexed(c, space, walk))) if postgres else None
        index = vector_index.index_of(engine.store)
        with engine.store.read() as conn:
            cid = vectors.collection_id(conn, COLLECTION, create=False)
            assert cid is not None
            build_s = timed(lambda: index.warm(space, cid))
            print(f"  in-memory index built in {build_s:.1f}s", flush=True)
            matrix = vector_codec.decode(
                [
                    bytes(r[0])
                    for r in conn.execute(
                        "SELECT cv.embedding FROM vector_rows vr JOIN content_vectors cv ON cv.id = vr.chunk_id"
                        " WHERE vr.space_id = ? AND vr.collection_id = ?",
                        (space.id, cid),
                    )
                ],
                DIMS,
            )
            queries = unit_vectors(rng, args.queries)
            for q in queries[:3]:  # warm-up: page cache, statements
                vectors.search(conn, space, q, COLLECTION, LIMIT, None, index)
                exact_search(conn, space, q, cid)
            fast, exact, floor, recall, hnsw, hnsw_recall = [], [], [], [], [], []
            for i, q in enumerate(queries):
                fast.append(timed(lambda q=q: vectors.search(conn, space, q, COLLECTION, LIMIT, None, index)))
                floor.append(timed(lambda q=q: top_rows(matrix, q)))
                if walk:  # without the in-memory index: pgvector's HNSW walk
                    hnsw.append(timed(lambda q=q: vectors.search(conn, space, q, COLLECTION, LIMIT)))
                if i < args.exact_queries:
                    t0 = time.perf_counter()
                    want = {h.doc_id for h in exact_search(conn, space, q, cid)}
                    exact.append(time.perf_counter() - t0)
                    recall.append(found(want, vectors.search(conn, space, q, COLLECTION, LIMIT, None, index)))
                    if walk:
                        hnsw_recall.append(found(want, vectors.search(conn, space, q, COLLECTION, LIMIT)))

        def search(q: np.ndarray) -> None:
            """What a vsearch does around the query's embedding: the engine's vector state, then
            the indexed search."""
            engine.vector_state(None)
            with engine.store.read() as conn:
                vectors.search(conn, space, q, COLLECTION, LIMIT, None, index)

        for q in queries[:3]:  # the engine's state counted, the snapshot tagged
            search(q)
        warm = [timed(lambda q=q: search(q)) for q in queries]
        after = []
        per_batch = max(1, len(held_back) // BATCHES)
        for b in range(BATCHES):
            embed_batch(engine, space, held_back[b * per_batch : (b + 1) * per_batch], rng)
            after.append(timed(lambda b=b: search(queries[b])))
        if BATCHES * per_batch < len(held_back):  # the rest, so an embed has nothing to do
            embed_batch(engine, space, held_back[BATCHES * per_batch :], rng)
        return {
            "vectors": len(hashes) * CHUNKS_PER_NOTE,
            "vectors_write_s": round(write_s, 2),
            "index_build_s": round(build_s, 2),
            "hnsw_build_s": round(hnsw_s, 2) if walk and hnsw_s is not None else None,
            "hnsw": hnsw,
            "hnsw_recall": hnsw_recall,
            "vector": fast,
            "exact": exact,
            "numpy_floor": floor,
            "recall_at_10": float(np.mean(recall)),
            "recall_min": float(np.min(recall)),
            "warm_search": warm,
            "after_embed": after,
            "embed_batch_vectors": per_batch * CHUNKS_PER_NOTE,
        }
    finally:
        engine.close()


def found(want: set[int], hits: list[Any]) -> float:
    """The share of the exact top documents `want` that `hits` found: recall@10."""
    return len(want & {h.doc_id for h in hits}) / max(len(want), 1)


def top_rows(matrix: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The bare float scan: every vector read once, the 30 best kept (einsum, one thread, as
    the index's own passes: OpenBLAS's threads are slower on 2 busy cores)."""
    return np.argpartition(-np.einsum("ij,j->i", matrix, q), LIMIT * 3)[: LIMIT * 3]


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# -- the daemon ---------------------------------------------------------------------------


def job(http: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A streamed job (`/v1/update`, `/v1/embed`) to its end; its `done` event."""
    with http.stream("POST", path, json=body, timeout=3600) as r:
        r.raise_for_status()
        last: dict[str, Any] = {}
        for line in r.iter_lines():
            if line.strip():
                last = json.loads(line)
    if last.get("event") != "done":
        raise RuntimeError(f"{path} ended with {last}")
    return last


def first_answer(env: Isolated, query: str) -> tuple[Daemon, float]:
    """A daemon started on the index, and the seconds from its start to its first keyword answer."""
    t0 = time.perf_counter()
    daemon = Daemon(env)
    while True:
        try:
            if daemon.http.post("/v1/keyword", json=keyword_body(query)).status_code == 200:
                return daemon, time.perf_counter() - t0
        except httpx.TransportError:  # seen once right after /health: a kept-alive connection reset
            if daemon.proc.poll() is not None:
                raise
        time.sleep(0.01)


def vectors_loaded(http: httpx.Client, query: str, started: float) -> float:
    """Seconds from the daemon's start until its vector searches stop saying the in-memory
    index is loading (the daemon starts building it at once; until then they measure every
    vector, exact but slower): the timed rows below measure the index, not that scan."""
    while True:
        r = http.post("/v1/vector", json=keyword_body(query))
        r.raise_for_status()
        if not any("still loading" in w for w in r.json().get("warnings", [])):
            return time.perf_counter() - started
        time.sleep(0.2)


def keyword_body(query: str) -> dict[str, Any]:
    """What `qmd search QUERY` sends."""
    return {"query": query, "collections": None, "limit": 5, "min_score": 0.0, "all": False, "full": False}


def query_body(query: str) -> dict[str, Any]:
    """What `qmd query QUERY` sends, expansion and reranking off: keyword and vector legs, fused."""
    return {"query": query, "limit": 5, "expand": False, "rerank": False, "full": False, "all": False}


def over_http(env: Isolated, root: Path, batches: list[list[str]]) -> dict[str, Any]:
    """Step 4 of the module's docstring: `batches` are the warm-up's queries, then a keyword
    and a query batch per round."""
    started = time.perf_counter()
    warm, rounds = batches[0], batches[1:]
    daemon, cold = first_answer(env, warm[0])
    try:
        http = daemon.http
        rss_cold = proc_status_kb(daemon.pid, "VmRSS")
        loaded = vectors_loaded(http, warm[0], started)
        for q in warm:  # warm-up: connection, page cache, the query embedder
            http.post("/v1/query", json=query_body(q)).raise_for_status()
        keyword, query = [], []
        for words, questions in zip(rounds[::2], rounds[1::2], strict=True):
            for w, q in zip(words, questions, strict=True):
                keyword.append(timed(lambda w=w: http.post("/v1/keyword", json=keyword_body(w)).raise_for_status()))
                query.append(timed(lambda q=q: http.post("/v1/query", json=query_body(q)).raise_for_status()))
        update_noop = [timed(lambda: job(http, "/v1/update", {})) for _ in range(3)]
        embed_noop = [timed(lambda: job(http, "/v1/embed", {})) for _ in range(1 + EMBED_NOOPS)]
        rss = proc_status_kb(daemon.pid, "VmRSS")
        url = env.vars.get("QMD_INDEX_URL")
        disk = pg_database_bytes(url) if url else sum(env.db_bytes().values())
        daemon.stop()  # the same index, nothing changed: what the first embed after a restart reads
        daemon, _ = first_answer(env, warm[0])
        http = daemon.http
        embed_restart = timed(lambda: job(http, "/v1/embed", {}))
        edited = sorted(root.rglob("*.md"))[::100]
        for path in edited:
            with path.open("a", encoding="utf-8") as f:
                f.write("\n## Edited\n\nA paragraph appended by the scale bench.\n")
        update_edit = timed(lambda: job(http, "/v1/update", {}))
        return {
            "cold_start": cold,
            "vectors_loaded": loaded,
            "keyword": keyword,
            "query": query,
            "update_noop": update_noop,
            "embed_noop": embed_noop,
            "embed_restart": embed_restart,
            "update_edit": update_edit,
            "edited": len(edited),
            "rss_cold_mb": mb(rss_cold),
            "rss_mb": mb(rss),
            "disk_mb": round(disk / 1e6, 1),
        }
    finally:
        daemon.stop()


# -- one size -------------------------------------------------------------------------------


def ms(values: list[float], p: float = 50) -> float:
    return round(percentile(values, p) * 1000, 2)


def one_size(size: int, pool: Pool, model: str, args: argparse.Namespace, server: str | None) -> dict[str, Any]:
    """One size's figures; on the Postgres server at `server` (a database of its own), if given."""
    env = Isolated(keep=args.keep)
    env.vars["QMD_EMBED_MODEL"] = model
    if server is not None:
        env.vars["QMD_INDEX_URL"] = pg_database(server, f"qmd_bench_scale_{size}")
    try:
        root = env.base / "corpus"
        notes = max(size // CHUNKS_PER_NOTE, BATCHES * 2)
        t0 = time.perf_counter()
        nbytes = write_corpus(root, notes, pool, args.seed)
        print(f"{size:,} chunks: {notes:,} notes, {nbytes / 1e6:.1f} MB in {time.perf_counter() - t0:.1f}s", flush=True)
        daemon = Daemon(env)
        try:
            rss_idle = proc_status_kb(daemon.pid, "VmRSS")
            index_s, _ = env.cli("collection", "add", str(root), "--name", COLLECTION)
            rss_indexed = proc_status_kb(daemon.pid, "VmRSS")
        finally:
            daemon.stop()
        print(f"  indexed in {index_s:.1f}s", flush=True)
        vec = in_process(env, args)
        print("  vector leg measured in process", flush=True)
        rng = random.Random(f"qmd-bench-scale-queries-{args.seed}")
        n = args.keyword_queries
        lines = rng.sample(pool.summaries, n * (1 + 2 * args.rounds))
        web = over_http(env, root, [lines[i : i + n] for i in range(0, len(lines), n)])
        print("  daemon measured", flush=True)
        return {
            "size": vec["vectors"],
            "backend": "postgres" if server else "sqlite",
            "notes": notes,
            "corpus_mb": round(nbytes / 1e6, 1),
            "index_s": round(index_s, 2),
            "vectors_write_s": vec["vectors_write_s"],
            "index_build_s": vec["index_build_s"],
            "hnsw_build_s": vec["hnsw_build_s"],
            "hnsw_p50_ms": ms(vec["hnsw"]) if vec["hnsw"] else None,
            "hnsw_recall_at_10": round(float(np.mean(vec["hnsw_recall"])), 4) if vec["hnsw_recall"] else None,
            "vector_p50_ms": ms(vec["vector"]),
            "vector_p95_ms": ms(vec["vector"], 95),
            "exact_p50_ms": ms(vec["exact"]),
            "exact_p95_ms": ms(vec["exact"], 95),
            "numpy_floor_p50_ms": ms(vec["numpy_floor"]),
            "recall_at_10": round(vec["recall_at_10"], 4),
            "recall_at_10_min": round(vec["recall_min"], 2),
            "keyword_p50_ms": ms(web["keyword"]),
            "keyword_p95_ms": ms(web["keyword"], 95),
            "query_p50_ms": ms(web["query"]),
            "query_p95_ms": ms(web["query"], 95),
            "update_noop_ms": ms(web["update_noop"]),
            "update_1pct_ms": round(web["update_edit"] * 1000, 1),
            "update_1pct_files": web["edited"],
            "embed_noop_ms": ms(web["embed_noop"][1:]),
            "embed_noop_first_ms": round(web["embed_noop"][0] * 1000, 1),
            "embed_noop_restart_ms": round(web["embed_restart"] * 1000, 1),
            "embed_batch_vectors": vec["embed_batch_vectors"],
            "first_search_after_embed_ms": ms(vec["after_embed"]),
            "warm_search_ms": ms(vec["warm_search"]),
            "rss_idle_mb": mb(rss_idle),
            "rss_after_index_mb": mb(rss_indexed),
            "rss_cold_start_mb": web["rss_cold_mb"],
            "rss_mb": web["rss_mb"],
            "cold_start_ms": round(web["cold_start"] * 1000, 1),
            "vectors_loaded_ms": round(web["vectors_loaded"] * 1000, 1),
            "disk_mb": web["disk_mb"],
            "loadavg": round(os.getloadavg()[0], 2),
        }
    finally:
        env.cleanup()


ROWS: list[tuple[str, str, str | None]] = [
    ("vector leg p50 / p95 (in process, in-memory index)", "vector_p50_ms", "vector_p95_ms"),
    ("  exact scan p50 / p95 (every vector of the collection; baseline)", "exact_p50_ms", "exact_p95_ms"),
    ("  numpy float scan p50 (memory-bandwidth floor)", "numpy_floor_p50_ms", None),
    ("  recall@10 vs exact (mean / worst query)", "recall_at_10", "recall_at_10_min"),
    ("  Postgres' HNSW walk p50, recall@10 (while the index loads)", "hnsw_p50_ms", "hnsw_recall_at_10"),
    ("warm search: vector_state + search (in process)", "warm_search_ms", None),
    ("first search after an embed batch (in process)", "first_search_after_embed_ms", None),
    ("keyword p50 / p95 (POST /v1/keyword)", "keyword_p50_ms", "keyword_p95_ms"),
    ("query p50 / p95, no expansion or rerank (POST /v1/query)", "query_p50_ms", "query_p95_ms"),
    ("update, nothing changed, ms", "update_noop_ms", None),
    ("update, 1% of notes edited, ms", "update_1pct_ms", None),
    ("embed, nothing to do, ms (POST /v1/embed): p50 / the daemon's first", "embed_noop_ms", "embed_noop_first_ms"),
    ("  … the first after a restart of the daemon, ms", "embed_noop_restart_ms", None),
    ("cold start to first keyword answer, ms", "cold_start_ms", None),
    ("cold start to the vector index loaded, ms", "vectors_loaded_ms", None),
    ("daemon RSS, index loaded, MB", "rss_mb", None),
    ("  RSS idle (empty index) / after indexing, MB", "rss_idle_mb", "rss_after_index_mb"),
    ("index on disk, MB", "disk_mb", None),
    ("cold index (collection add), s", "index_s", None),
    ("in-memory vector index build, s / Postgres' HNSW build, s", "index_build_s", "hnsw_build_s"),
]


def report(results: list[dict[str, Any]]) -> str:
    def value(v: Any) -> str:
        return "—" if v is None else f"{v:,}"

    def cell(r: dict[str, Any], a: str, b: str | None) -> str:
        return value(r.get(a)) if b is None else f"{value(r.get(a))} / {value(r.get(b))}"

    rows = [[name, *(cell(r, a, b) for r in results)] for name, a, b in ROWS]
    return table(["measure", *(f"{r['size']:,} chunks, {r['backend']}" for r in results)], rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000", help="comma-separated chunk counts")
    ap.add_argument("--json", type=Path, default=None, help="write the list of per-size figures here")
    ap.add_argument("--queries", type=int, default=50, help="random query vectors per size")
    ap.add_argument("--exact-queries", type=int, default=20, help="of those, how many also run the exact scan")
    ap.add_argument("--keyword-queries", type=int, default=20, help="summary lines used as keyword queries")
    ap.add_argument("--rounds", type=int, default=3, help="HTTP rounds, each on new summary lines")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model", default=None, help="embed GGUF [$QMD_BENCH_EMBED_MODEL or the shared MiniLM Q8_0]")
    ap.add_argument("--keep", action="store_true", help="keep each size's temporary folder")
    ap.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite", help="the index's database")
    ap.add_argument(
        "--no-hnsw",
        action="store_true",
        help="with --backend postgres: skip pgvector's HNSW build (565 s at 1M) and its walk",
    )
    ap.add_argument("--url", help="with --backend postgres: a server to use (its databases qmd_bench_scale_*)")
    args = ap.parse_args(argv)
    try:
        sizes = sorted(int(x) for x in args.sizes.split(","))
    except ValueError:
        ap.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not sizes or min(sizes) < 100 or args.queries < 1 or not 1 <= args.exact_queries <= args.queries:
        ap.error("sizes must be at least 100 chunks, and 1 <= --exact-queries <= --queries")
    if args.no_hnsw and args.backend != "postgres":
        ap.error("--no-hnsw is for --backend postgres (SQLite has no HNSW index)")
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(code_line(), flush=True)
    model = embed_model_path(args.model)
    pool = text_pool()
    print(f"text: {len(pool.paragraphs):,} docstring paragraphs, {len(pool.summaries):,} summary lines", flush=True)
    with ExitStack() as stack:
        server = None
        if args.backend == "postgres":
            from pg_server import embedded_postgres  # tests/ is on the path through _common

            server = args.url or stack.enter_context(embedded_postgres())
        results = [one_size(n, pool, model, args, server) for n in sizes]
    print()
    print(report(results))
    path = args.json
    if path is None:
        path = write_json("scale", {"machine": machine(), "sizes": results})
    else:
        path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
