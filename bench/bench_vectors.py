"""Vector search latency of qmd: `qmd vsearch` warm, and the KNN at 10k, 100k and 300k vectors.

    .venv/bin/python bench/bench_vectors.py [--files 200] [--seed 1] [--max-chars 2500]
                                            [--rounds 5] [--cli-rounds 1]
                                            [--sizes 10000,100000,300000] [--queries 50]
                                            [--model GGUF] [--no-daemon] [--keep]

(a) round trip. Generates a small corpus (bench/corpus.py, files capped at a section
    boundary), starts a fresh isolated `qmdd` with `QMD_EMBED_MODEL=GGUF`, indexes and
    embeds it, then runs bench_search.py's 20 queries:
      HTTP  `POST /v1/vector` from a warm httpx client (the CLI's body: limit 5, min
            score 0.3), interleaved with `POST /v1/keyword` (keyword), the same-run
            baseline; 20 queries x --rounds after a warm-up pass
      CLI   a fresh `python -m qmd.client.cli vsearch "q"` process per query against the
            warm daemon, interleaved with `... search "q"` and `python -c pass`
    After the daemon stops, the same vector searches run in-process through the
    `Engine`, split into its steps: `vector_state` (pending count), the query
    embedding (inference worker round trip), the KNN + document lookups + snippets.

(b) scale. For each size N (default 10k, 100k, 300k), a temporary
    `qmd.server.store.sqlite.Store` gets N synthetic 384-dim unit vectors (Gaussian, no
    clusters: the hard case for the index's quantized first pass; 8 chunks per document)
    in collection `big`, plus 1,000 in a collection `small` beside it, written with
    `qmd.server.store.vectors` itself (`ensure_space`, `write_document`,
    `sync_partitions`) over matching `content`/`documents` rows. The in-memory index
    (`qmd.server.store.vector_index`) is built in the foreground and timed (cold build,
    memory, bytes a vector). Then over --queries random unit queries, each back to back:
    `vectors.search(conn, space, q, "big", limit=10)` without the index (the exact scan
    of the partition in SQLite: the baseline) and with it; recall@10 of the second
    against the first, and whether every document both found has the same distance; the
    index's search in `small`; the bare exact scan statement (k=30). Then the
    first search after an embed batch (100 documents, 800 vectors, `add_partitions`) and
    after a write to the other collection (a signature read), 5 each; and what a `vsearch`
    and an `embed` also pay at that size: the reads `Engine.vector_state` makes (pending
    count, vector counts; the engine caches them until the next write, so the first
    vsearch or status after a write pays them) and a `sync_partitions` with nothing to do
    (the end of every embed job). At the smallest size, a pure-Python brute-force dot
    product over the same vectors (stdlib only, same k) checks that the scan is exact.

Figures only, never assertions.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import math
import operator
import os
import shutil
import statistics
import sys
import tempfile
import time
from array import array
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import corpus as corpus_mod  # noqa: E402
from _common import (  # noqa: E402
    PYTHON,
    CpuWindow,
    Daemon,
    Isolated,
    children_cpu_s,
    code_line,
    embed_model_path,
    machine,
    mb,
    proc_cpu_s,
    proc_status_kb,
    summary_ms,
    table,
    write_json,
)
from bench_search import QUERIES, search_body, time_process  # noqa: E402

DIMS = 384
CHUNKS_PER_DOC = 8
SMALL = 1000
LIMIT = 10


def vsearch_body(query: str) -> dict:
    """What `qmd vsearch QUERY` sends (client/cli.py), default format, limit and min score."""
    return {"query": query, "collections": None, "limit": 5, "min_score": 0.3, "all": False, "full": False}


# -- (a) round trip ------------------------------------------------------------------


def round_trip(args: argparse.Namespace, model: str) -> dict:
    env = Isolated(keep=args.keep)
    env.vars["QMD_EMBED_MODEL"] = model
    daemon: Daemon | None = None
    try:
        root = env.base / "corpus"
        stats = corpus_mod.generate(root, args.files, args.seed, args.max_chars)
        print(
            f"(a) corpus: {stats.files} files, {stats.bytes / 1e6:.2f} MB (generated, seed {args.seed}, "
            f"capped at {args.max_chars} chars)",
            flush=True,
        )
        daemon = Daemon(env)
        index_s, _ = env.cli("collection", "add", str(root), "--name", "bench")
        embed_s, r = env.cli("embed")
        print(f"indexed in {index_s:.1f}s, embedded in {embed_s:.1f}s: {r.stdout.strip()}", flush=True)
        http = daemon.http
        worker_pid = int(http.get("/v1/status").raise_for_status().json()["inference"]["pid"] or 0)

        def ours() -> float:
            """CPU of everything under test: daemon, its worker, this process, the CLIs run so far."""
            return (
                sum(proc_cpu_s(pid) or 0.0 for pid in (daemon.pid, worker_pid)) + time.process_time() + children_cpu_s()
            )

        hits_v: dict[str, int] = {}
        hits_k: dict[str, int] = {}
        for _, q in QUERIES:  # warm-up: connection, page cache, the query embedder's context
            rv = http.post("/v1/vector", json=vsearch_body(q)).raise_for_status().json()
            if rv.get("degraded"):
                raise RuntimeError(f"vsearch fell back to keyword search: {rv.get('warnings')}")
            hits_v[q] = len(rv["results"])
            hits_k[q] = len(http.post("/v1/keyword", json=search_body(q)).raise_for_status().json()["results"])
        http_v, http_k = [], []
        win, ours0 = CpuWindow(), ours()
        for _ in range(args.rounds):
            for _, q in QUERIES:
                t0 = time.perf_counter()
                http.post("/v1/vector", json=vsearch_body(q)).raise_for_status()
                t1 = time.perf_counter()
                http.post("/v1/keyword", json=search_body(q)).raise_for_status()
                http_k.append(time.perf_counter() - t1)
                http_v.append(t1 - t0)
        http_others = win.stop().others(ours() - ours0)
        print("HTTP measured", flush=True)

        cli_v, cli_k, py_pass = [], [], []
        win, ours0 = CpuWindow(), ours()
        for _ in range(args.cli_rounds):
            for _, q in QUERIES:
                py_pass.append(time_process([PYTHON, "-c", "pass"], env.vars, env.home))
                cli_v.append(time_process([PYTHON, "-m", "qmd.client.cli", "vsearch", q], env.vars, env.home))
                cli_k.append(time_process([PYTHON, "-m", "qmd.client.cli", "search", q], env.vars, env.home))
        cli_others = win.stop().others(ours() - ours0)
        print("CLI measured", flush=True)
        status = http.get("/v1/status").raise_for_status().json()
        rss = proc_status_kb(daemon.pid, "VmRSS")
        rss_worker = proc_status_kb(status["inference"]["pid"], "VmRSS") if status["inference"].get("pid") else None
        daemon.stop()
        daemon = None

        steps = in_process(env, model, args.rounds)
        S = {
            name: summary_ms(v)
            for name, v in {
                "http_vsearch": http_v,
                "http_search": http_k,
                "cli_vsearch": cli_v,
                "cli_search": cli_k,
                "python_pass": py_pass,
                **steps,
            }.items()
        }
        p = {k: v["p50_ms"] for k, v in S.items()}
        rows = [
            ["POST /v1/vector, warm httpx", "http_vsearch", f"{p['http_vsearch'] / p['http_search']:.1f}x search"],
            ["POST /v1/keyword (keyword), warm httpx", "http_search", ""],
            ["python -m qmd.client.cli vsearch", "cli_vsearch", f"{p['cli_vsearch'] / p['cli_search']:.2f}x search"],
            [
                "python -m qmd.client.cli search (keyword)",
                "cli_search",
                f"{p['cli_search'] / p['python_pass']:.1f}x pass",
            ],
            ["python -c pass", "python_pass", ""],
            ["in-process Engine.vsearch", "engine_vsearch", f"{p['engine_vsearch'] / p['http_vsearch']:.2f}x HTTP"],
            [
                "  vector_state (pending count, cached)",
                "vector_state",
                f"{p['vector_state'] / p['engine_vsearch']:.0%}",
            ],
            ["  embed the query (worker round trip)", "embed_query", f"{p['embed_query'] / p['engine_vsearch']:.0%}"],
            [
                "  vector_search (KNN, lookups, snippets)",
                "vector_search",
                f"{p['vector_search'] / p['engine_vsearch']:.0%}",
            ],
            ["in-process Engine.search (keyword)", "engine_search", ""],
        ]
        print()
        print(
            table(
                ["measure", "n", "p50 ms", "p95 ms", "ratio (p50)"],
                [[name, S[key]["n"], S[key]["p50_ms"], S[key]["p95_ms"], ratio] for name, key, ratio in rows],
                title=(
                    f"(a) vsearch round trip: {stats.files} files, {status['vector']['embedded_chunks']} chunks "
                    f"embedded, {len(QUERIES)} queries"
                ),
                formats=[None, "d", ".1f", ".1f", None],
            )
        )
        mean_v = sum(hits_v.values()) / len(hits_v)
        mean_k = sum(hits_k.values()) / len(hits_k)
        print(
            f"mean hits: vsearch {mean_v:.1f} (min score 0.3), search {mean_k:.1f}; daemon RSS {mb(rss)} MB, "
            f"inference worker {mb(rss_worker)} MB"
        )
        print(
            f"other processes used {http_others['others_share'] or 0:.0%} of the machine during the HTTP rows, "
            f"{cli_others['others_share'] or 0:.0%} during the CLI rows"
        )
        return {
            "corpus": {"files": stats.files, "mb": round(stats.bytes / 1e6, 3), "max_chars": args.max_chars},
            "embedded_chunks": status["vector"]["embedded_chunks"],
            "index_s": round(index_s, 2),
            "embed_s": round(embed_s, 2),
            "summary": S,
            "ratios_p50": {
                "http_vsearch / http_search": round(p["http_vsearch"] / p["http_search"], 2),
                "cli_vsearch / cli_search": round(p["cli_vsearch"] / p["cli_search"], 2),
                "engine_vsearch / http_vsearch": round(p["engine_vsearch"] / p["http_vsearch"], 2),
            },
            "mean_hits": {"vsearch": mean_v, "search": mean_k},
            "others": {"http": http_others, "cli": cli_others},
            "rss_mb": {"daemon": mb(rss), "worker": mb(rss_worker)},
        }
    finally:
        if daemon is not None:
            daemon.stop()
        env.cleanup()


def in_process(env: Isolated, model: str, rounds: int) -> dict[str, list[float]]:
    """The daemon's vsearch steps, timed in this process on the same index."""
    os.environ.update({k: env.vars[k] for k in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")})
    os.environ["QMD_EMBED_MODEL"] = model
    from qmd.paths import IndexPaths
    from qmd.server.engine import Engine
    from qmd.server.models.embedders import embed_query
    from qmd.server.search.pointers import SearchOptions
    from qmd.server.search.vector import vector_search
    from qmd.server.store.vectors import find_space

    VSEARCH = SearchOptions(limit=5, min_score=0.3)

    engine = Engine(IndexPaths.resolve(None))
    out: dict[str, list[float]] = {
        k: [] for k in ("engine_vsearch", "vector_state", "embed_query", "vector_search", "engine_search")
    }
    try:
        emb = engine.embedder()
        with engine.store.read() as conn:
            space = find_space(conn, emb.fingerprint)
        assert space is not None
        for _, q in QUERIES:  # warm-up (starts the worker, loads the model)
            engine.vsearch(q, VSEARCH)
        for _ in range(rounds):
            for _, q in QUERIES:
                t0 = time.perf_counter()
                engine.vsearch(q, VSEARCH)
                t1 = time.perf_counter()
                engine.vector_state(None)
                t2 = time.perf_counter()
                qvec = embed_query(emb, q)
                t3 = time.perf_counter()
                vector_search(engine.store, engine.config, space, qvec, q, VSEARCH, engine.index_label)
                t4 = time.perf_counter()
                engine.search(q, SearchOptions(limit=5))
                t5 = time.perf_counter()
                for key, secs in zip(out, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                    out[key].append(secs)
    finally:
        engine.close()
    return out


# -- (b) scale ---------------------------------------------------------------------------


def unit_vector(rng: np.random.Generator) -> array:
    """A random unit vector, Gaussian: no clusters, the hard case for the index's quantized
    first pass (a flat scan's cost does not depend on it)."""
    x = rng.standard_normal(DIMS)
    out = array("f")
    out.frombytes((x / np.linalg.norm(x)).astype(np.float32).tobytes())
    return out


def build(path: Path, n_big: int, seed: int) -> dict:
    """An index with `n_big` vectors in `big` and SMALL in `small`, through qmd.server.store.vectors."""
    from qmd.server.store import vectors
    from qmd.server.store.sqlite import Store, utcnow

    rng = np.random.default_rng([seed, 1])
    store = Store(path)
    space = store.write(lambda c: vectors.ensure_space(c, "bench-synthetic", "synthetic", DIMS))
    now = utcnow()
    t_write = 0.0
    doc = 0
    for coll, n in (("big", n_big), ("small", SMALL)):
        left = n
        while left:
            batch = []
            for _ in range(min(500, math.ceil(left / CHUNKS_PER_DOC))):
                k = min(CHUNKS_PER_DOC, left)
                left -= k
                h = hashlib.sha256(f"{seed}-{doc}".encode()).hexdigest()
                chunks = [
                    vectors.ChunkVector(s, s * 100, s * 100 + 100, s * 3 + 1, s * 3 + 3, 60, False, unit_vector(rng))
                    for s in range(k)
                ]
                batch.append((coll, f"docs/d{doc}.md", h, chunks))
                doc += 1

            def write(conn, batch=batch) -> None:  # noqa: ANN001
                for coll_, p, h, chunks in batch:
                    conn.execute("INSERT INTO content(hash, doc, created_at) VALUES (?, ?, ?)", (h, p, now))
                    conn.execute(
                        "INSERT INTO documents(collection, path, title, hash, created_at, modified_at, active)"
                        " VALUES (?, ?, ?, ?, ?, ?, 1)",
                        (coll_, p, p, h, now, now),
                    )
                    vectors.write_document(conn, space, h, chunks, len(chunks))

            t0 = time.perf_counter()
            store.write(write)
            t_write += time.perf_counter() - t0
    t0 = time.perf_counter()
    added, _ = store.write(lambda c: vectors.sync_partitions(c, space))
    t_sync = time.perf_counter() - t0
    store.close()
    return {"documents": doc, "vectors": added, "write_s": t_write, "sync_s": t_sync}


def more_vectors(store, space, n_docs: int, seed: int, coll: str = "big") -> None:  # noqa: ANN001
    """One embed-job batch: `n_docs` new documents' vectors committed with `add_partitions`."""
    from qmd.server.store import vectors
    from qmd.server.store.sqlite import utcnow

    rng = np.random.default_rng([seed, 2])
    now = utcnow()

    def write(conn) -> None:  # noqa: ANN001
        hashes = []
        for i in range(n_docs):
            h = hashlib.sha256(f"more-{seed}-{i}".encode()).hexdigest()
            p = f"more/{seed}-{i}.md"
            conn.execute("INSERT INTO content(hash, doc, created_at) VALUES (?, ?, ?)", (h, p, now))
            conn.execute(
                "INSERT INTO documents(collection, path, title, hash, created_at, modified_at, active)"
                " VALUES (?, ?, ?, ?, ?, ?, 1)",
                (coll, p, p, h, now, now),
            )
            chunks = [
                vectors.ChunkVector(s, s * 100, s * 100 + 100, s * 3 + 1, s * 3 + 3, 60, False, unit_vector(rng))
                for s in range(CHUNKS_PER_DOC)
            ]
            vectors.write_document(conn, space, h, chunks, CHUNKS_PER_DOC)
            hashes.append(h)
        vectors.add_partitions(conn, space, hashes)

    store.write(write)


def scale(args: argparse.Namespace) -> tuple[list[dict], dict]:
    from qmd.server.store import vector_codec, vector_index, vectors
    from qmd.server.store.sqlite import Store

    base = Path(tempfile.mkdtemp(prefix="qmd-bench-vectors-"))
    qrng = np.random.default_rng([args.seed, 3])
    queries = [unit_vector(qrng) for _ in range(args.queries)]
    results: list[dict] = []
    baseline: dict = {}
    try:
        for n in args.sizes:
            path = base / f"index-{n}.sqlite"
            t0 = time.perf_counter()
            built = build(path, n, args.seed)
            build_s = time.perf_counter() - t0
            store = Store(path)
            try:
                space = store.write(lambda c: vectors.find_space(c, "bench-synthetic"))
                assert space is not None
                index = vector_index.index_of(store)
                t: dict[str, list[float]] = {
                    k: []
                    for k in (
                        "exact_big",
                        "index_big",
                        "index_small",
                        "knn_big",
                        "complete",
                        "pending",
                        "sync_noop",
                        "after_batch",
                        "after_other_write",
                    )
                }
                with store.read() as conn:
                    cid = vectors.collection_id(conn, "big", create=False)
                    small = vectors.collection_id(conn, "small", create=False)
                    assert cid is not None and small is not None
                    t0 = time.perf_counter()
                    snap = index.warm(space, cid)
                    cold_s = time.perf_counter() - t0
                    index.warm(space, small)
                    for q in queries[:5]:  # warm-up: page cache, statement cache
                        vectors.search(conn, space, q, "big", LIMIT)
                        vectors.search(conn, space, q, "big", LIMIT, None, index)
                    recall: list[float] = []
                    same_distance = compared = 0
                    for q in queries:
                        unit = vector_codec.unit(q)
                        t0 = time.perf_counter()
                        exact = vectors.search(conn, space, q, "big", LIMIT)
                        t1 = time.perf_counter()
                        fast = vectors.search(conn, space, q, "big", LIMIT, None, index)
                        t2 = time.perf_counter()
                        vectors.search(conn, space, q, "small", LIMIT, None, index)
                        t3 = time.perf_counter()
                        vectors._knn(conn, space, unit, LIMIT * 3, cid)  # noqa: SLF001 - the bare exact scan
                        t4 = time.perf_counter()
                        for key, secs in zip(
                            ("exact_big", "index_big", "index_small", "knn_big"), (t1 - t0, t2 - t1, t3 - t2, t4 - t3)
                        ):
                            t[key].append(secs)
                        want = {h.doc_id: h.distance for h in exact}
                        recall.append(len(want.keys() & {h.doc_id for h in fast}) / len(want))
                        for h in fast:
                            if h.doc_id in want:
                                compared += 1
                                same_distance += h.distance == want[h.doc_id]
                    for _ in range(3):
                        t0 = time.perf_counter()
                        vectors.complete_hashes(conn, space)
                        t1 = time.perf_counter()
                        vector_state_queries(conn, space)
                        t["complete"].append(t1 - t0)
                        t["pending"].append(time.perf_counter() - t1)
                for _ in range(3):
                    t0 = time.perf_counter()
                    store.write(lambda c, space=space: vectors.sync_partitions(c, space))
                    t["sync_noop"].append(time.perf_counter() - t0)
                for i, q in enumerate(queries[:5]):
                    # the next search after an embed batch (100 documents, 800 vectors) reads
                    # only the rows it lacks; after a write to another collection, a signature
                    more_vectors(store, space, 100, 1000 * n + i)
                    with store.read() as conn:
                        t0 = time.perf_counter()
                        vectors.search(conn, space, q, "big", LIMIT, None, index)
                        t["after_batch"].append(time.perf_counter() - t0)
                    more_vectors(store, space, 1, 2000 * n + i, coll="small")
                    with store.read() as conn:
                        t0 = time.perf_counter()
                        vectors.search(conn, space, q, "big", LIMIT, None, index)
                        t["after_other_write"].append(time.perf_counter() - t0)
                if not baseline:
                    baseline = brute_force(store, space, cid, queries[: args.brute_queries])
            finally:
                store.close()
            db_mb = sum(p.stat().st_size for p in base.glob(f"index-{n}.sqlite*")) / 1e6
            results.append(
                {
                    "n_big": n,
                    "n_small": SMALL,
                    **built,
                    "build_s": build_s,
                    "db_mb": db_mb,
                    "times": t,
                    "index_cold_s": cold_s,
                    "index_mb": snap.nbytes / 1e6,
                    "index_bytes_per_vector": snap.nbytes / max(snap.size, 1),
                    "recall_at_10": statistics.fmean(recall),
                    "recall_min": min(recall),
                    "same_distance": same_distance,
                    "compared": compared,
                }
            )
            print(
                f"(b) {n:,} vectors: built in {build_s:.1f}s (write {built['write_s']:.1f}s, "
                f"sync_partitions {built['sync_s']:.1f}s), {db_mb:.0f} MB; in-memory index {cold_s:.2f}s, "
                f"{snap.nbytes / 1e6:.1f} MB ({snap.nbytes / max(snap.size, 1):.0f} B a vector with room to append)",
                flush=True,
            )
            path.unlink()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return results, baseline


def vector_state_queries(conn, space) -> None:  # noqa: ANN001
    """The index reads `Engine.vector_state` makes before every vector search (and for
    status): the pending count and two counts of content_vectors."""
    from qmd.server.store import vectors

    vectors.pending_hashes(conn, space, None)
    conn.execute("SELECT COUNT(*) FROM content_vectors WHERE space_id = ?", (space.id,)).fetchone()
    conn.execute("SELECT COUNT(DISTINCT hash) FROM content_vectors WHERE space_id != ?", (space.id,)).fetchone()


def brute_force(store, space, cid: int, queries: list[array]) -> dict:  # noqa: ANN001
    """Top-k by a pure-Python dot product over the `big` partition's vectors, and
    whether the store's exact scan finds the same rows (it should)."""
    from qmd.server.store import vector_codec, vectors

    with store.read() as conn:
        rows = conn.execute(
            "SELECT vr.id, cv.embedding FROM vector_rows vr JOIN content_vectors cv ON cv.id = vr.chunk_id"
            " WHERE vr.space_id = ? AND vr.collection_id = ?",
            (space.id, cid),
        ).fetchall()
        ids = [r[0] for r in rows]
        vecs = vector_codec.decode([r[1] for r in rows], space.dims).tolist()
        times, same = [], 0
        k = LIMIT * 3
        for q in queries:
            ql = q.tolist()
            t0 = time.perf_counter()
            dots = [sum(map(operator.mul, ql, v)) for v in vecs]
            top = heapq.nlargest(k, range(len(dots)), key=dots.__getitem__)
            times.append(time.perf_counter() - t0)
            knn = [r[0] for r in vectors._knn(conn, space, vector_codec.unit(q), k, cid)]  # noqa: SLF001
            same += {ids[i] for i in top} == set(knn)
    return {"vectors": len(vecs), "times": times, "same_neighbours": same, "queries": len(queries)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-chars", type=int, default=2500, help="cap each file at a section boundary")
    ap.add_argument("--rounds", type=int, default=5, help="HTTP rounds over the 20 queries")
    ap.add_argument("--cli-rounds", type=int, default=1, help="CLI process rounds over the 20 queries")
    ap.add_argument("--sizes", default="10000,100000,300000", help="comma-separated vector counts for (b)")
    ap.add_argument("--queries", type=int, default=50, help="query vectors per size in (b)")
    ap.add_argument("--brute-queries", type=int, default=5, help="queries for the pure-Python baseline")
    ap.add_argument("--model", default=None, help="embed GGUF [$QMD_BENCH_EMBED_MODEL or the shared MiniLM Q8_0]")
    ap.add_argument("--no-daemon", action="store_true", help="only (b)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder of (a)")
    args = ap.parse_args(argv)
    args.sizes = sorted(int(x) for x in args.sizes.split(","))
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(code_line(), flush=True)

    result: dict = {"machine": machine()}
    if not args.no_daemon:
        result["round_trip"] = round_trip(args, embed_model_path(args.model))
        print()

    sizes, base = scale(args)
    rows = []
    for s in sizes:
        t = s["times"]
        eb, ib, ism, kb = (summary_ms(t[k]) for k in ("exact_big", "index_big", "index_small", "knn_big"))
        ab, ao = summary_ms(t["after_batch"]), summary_ms(t["after_other_write"])
        rows += [
            [f"{s['n_big']:,}", "exact: scan + lookups (no index, baseline)", eb["p50_ms"], eb["p95_ms"], ""],
            [
                "",
                "in-memory index: sign bits, int8, exact distances in SQLite",
                ib["p50_ms"],
                ib["p95_ms"],
                f"{eb['p50_ms'] / ib['p50_ms']:.1f}x faster",
            ],
            [
                "",
                f"  recall@10 vs exact: mean {s['recall_at_10']:.4f}, worst query {s['recall_min']:.1f};"
                f" same distance {s['same_distance']}/{s['compared']}",
                None,
                None,
                "",
            ],
            ["", "  first search after an 800-vector embed batch", ab["p50_ms"], ab["p95_ms"], ""],
            ["", "  first search after a write to another collection", ao["p50_ms"], ao["p95_ms"], ""],
            [
                "",
                f"  cold build {s['index_cold_s']:.2f} s, {s['index_mb']:.1f} MB in memory",
                None,
                None,
                "",
            ],
            ["", f"index search 'small' ({SMALL:,}) beside it", ism["p50_ms"], ism["p95_ms"], ""],
            [
                "",
                f"exact scan statement only, 'big', k={LIMIT * 3}",
                kb["p50_ms"],
                kb["p95_ms"],
                f"{kb['p50_ms'] / eb['p50_ms']:.0%} of exact search",
            ],
        ]
        pend, comp, noop = summary_ms(t["pending"]), summary_ms(t["complete"]), summary_ms(t["sync_noop"])
        rows.append(["", "vector_state's reads, uncached", pend["p50_ms"], pend["p95_ms"], ""])
        rows.append(
            ["", "  of which complete_hashes", comp["p50_ms"], comp["p95_ms"], f"{comp['p50_ms'] / pend['p50_ms']:.0%}"]
        )
        rows.append(["", "sync_partitions, nothing to do (every embed)", noop["p50_ms"], noop["p95_ms"], ""])
        s["summary"] = {
            "exact_big": eb,
            "index_big": ib,
            "index_small": ism,
            "knn_big": kb,
            "after_batch": ab,
            "after_other_write": ao,
            "vector_state": pend,
            "complete_hashes": comp,
            "sync_noop": noop,
        }
        del s["times"]
    bsum = summary_ms(base["times"])
    small_knn = sizes[0]["summary"]["knn_big"]["p50_ms"]
    rows.append(
        [
            f"{sizes[0]['n_big']:,}",
            f"pure-Python dot product + top {LIMIT * 3} (baseline)",
            bsum["p50_ms"],
            bsum["p95_ms"],
            f"{bsum['p50_ms'] / small_knn:.0f}x the exact scan",
        ]
    )
    print(
        table(
            ["vectors", "measure", "p50 ms", "p95 ms", "ratio (p50)"],
            rows,
            title=f"(b) vectors.search, limit {LIMIT}, {args.queries} random queries, {DIMS} dims",
            formats=[None, None, ".2f", ".2f", None],
        )
    )
    print(
        f"baseline found the same {LIMIT * 3} neighbours as the exact scan for "
        f"{base['same_neighbours']}/{base['queries']} queries"
    )
    for s in sizes:
        sm = s["summary"]
        index_ms = sm["vector_state"]["p50_ms"] + sm["after_batch"]["p50_ms"]
        print(
            f"the first vsearch over 'big' after an embed batch at {s['n_big']:,} vectors spends ~{index_ms:.0f} ms in"
            f" the index (vector_state's reads {sm['vector_state']['p50_ms']:.0f} + search "
            f"{sm['after_batch']['p50_ms']:.0f}), later ones ~{sm['index_big']['p50_ms']:.0f} ms while the engine "
            "caches the pending count; plus the query embedding and HTTP"
        )
    print()
    print(
        table(
            ["vectors", "documents", "build s", "write_document s", "sync_partitions s", "index MB"],
            [
                [f"{s['n_big'] + SMALL:,}", s["documents"], s["build_s"], s["write_s"], s["sync_s"], s["db_mb"]]
                for s in sizes
            ],
            title="(b) building the synthetic indexes (through qmd.server.store.vectors)",
            formats=[None, "d", ".1f", ".1f", ".1f", ".0f"],
        )
    )
    result["scale"] = {
        "limit": LIMIT,
        "dims": DIMS,
        "queries": args.queries,
        "sizes": sizes,
        "brute_force": {**base, "summary": bsum, "times": None},
    }
    path = write_json("vectors", result)
    print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
