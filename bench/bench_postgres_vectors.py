"""Vector search on pgvector (server/store/pg_vectors.py): HNSW against exact search, in one run (issue 14).

    .venv/bin/python bench/bench_postgres_vectors.py [--sizes 10000,100000,200000] [--queries 100]
                                                     [--float32-at 100000] [--url postgresql://...]

For each size N, N unit vectors of 384 dims go into one space's table through the module
(`create_space_table` without the HNSW index, `insert_rows` in batches of 5,000, then
`build_index`), 99% in a collection `big` and 1% in `small`. The vectors are a gaussian
mixture, not uniform noise: N/100 random unit centres, each vector a centre plus gaussian
noise of norm --spread (1.5), normalized (cosine ~0.3 within a cluster, ~0 across: neighbours
that stand out, as sentence embeddings' do, where uniform random vectors, the worst case for
any graph index, have none). Queries are --queries fresh draws from the same mixture.

Per size: insert and build time, table and index size, then per query back to back the
exact scan of `big` (`knn_exact`: the baseline) and `knn` (HNSW, k=10); recall@10 of the
second against the first, and against float32 brute force (numpy), which also gives the
largest difference between a halfvec distance and the float32 one sqlite-vec computes;
and `knn` in `small` (exact by `EXACT_UP_TO` or `EXACT_SHARE`) next to `knn` there with both off
(the planner's plan: the HNSW walk with the iterative scan, or the btree and a sort where its
estimate prefers them): what decides the two.
At --float32-at, the same rows also go into a `vector` (float32) twin with its own HNSW
index, for halfvec's price in recall and its saving in size. Figures only, never assertions.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
import psycopg  # noqa: E402
from _common import code_line, machine, percentile, table, write_json  # noqa: E402
from pg_server import embedded_postgres  # noqa: E402 - tests/ is on the path through _common

from qmd.server.store import pg_vectors as pv  # noqa: E402

DIMS = 384
K = 10
BIG, SMALL = 1, 2
SPREAD = 1.5
"""Noise of norm 1.5 around a unit centre: cosine ~0.3 within a cluster, against ~0 ± 0.05
across, so a query's top 10 mixes its cluster's tail with near strangers (at 1.0 the top
10 is always its own cluster's, and HNSW's recall a trivial 1.000)."""


def mixture(
    rng: np.random.Generator, n: int, centres: npt.NDArray[np.float32], spread: float
) -> npt.NDArray[np.float32]:
    """n unit vectors around random ones of `centres` (noise of norm ~`spread` before normalizing)."""
    x = centres[rng.integers(0, len(centres), n)] + spread * rng.standard_normal((n, DIMS)) / np.sqrt(DIMS)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def float32_twin(conn: psycopg.Connection, x: npt.NDArray[np.float32], cids: Sequence[int]) -> tuple[float, int]:
    """The rows in a float32 `vector` table with an HNSW index (what pg_vectors does not ship):
    (build seconds, table + index bytes)."""
    conn.execute(f"CREATE TABLE f32 (id bigint PRIMARY KEY, collection_id integer NOT NULL, embedding vector({DIMS}))")
    with conn.cursor() as cur, cur.copy("COPY f32 (id, collection_id, embedding) FROM STDIN") as cp:
        for i, (v, c) in enumerate(zip(x, cids)):
            cp.write_row((i + 1, c, str(v.tolist())))
    with conn.transaction():
        conn.execute("SET LOCAL maintenance_work_mem = '2GB'")
        build, _ = timed(
            lambda: conn.execute(
                "CREATE INDEX ON f32 USING hnsw (embedding vector_cosine_ops)"
                f" WITH (m = {pv.HNSW_M}, ef_construction = {pv.HNSW_EF_CONSTRUCTION})"
            )
        )
    conn.execute("ANALYZE f32")
    size = conn.execute("SELECT pg_total_relation_size('f32')").fetchone()
    return build, size[0] if size else 0


def f32_knn(conn: psycopg.Connection, q: npt.NDArray[np.float32]) -> list[int]:
    with conn.transaction(force_rollback=True):
        conn.execute(f"SET LOCAL hnsw.ef_search = {pv.EF_SEARCH}")
        conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        rows = conn.execute(
            "SELECT id FROM f32 WHERE collection_id = %s ORDER BY embedding <=> %s::vector LIMIT %s",
            (BIG, str(q.tolist()), K),
        ).fetchall()
    return [r[0] for r in rows]


def run_size(
    conn: psycopg.Connection,
    rng: np.random.Generator,
    n: int,
    queries: int,
    spread: float,
    f32: bool,
    sweep: Sequence[int],
) -> dict[str, Any]:
    centres = rng.standard_normal((max(10, n // 100), DIMS))
    centres = (centres / np.linalg.norm(centres, axis=1, keepdims=True)).astype(np.float32)
    x = mixture(rng, n, centres, spread)
    qs = mixture(rng, queries, centres, spread)
    cids = [SMALL if i % 100 == 0 else BIG for i in range(n)]
    space = n  # one space per size
    t = pv.table_name(space)
    pv.create_space_table(conn, space, DIMS, indexed=False)
    rows = [(i + 1, c, v.tobytes()) for i, (v, c) in enumerate(zip(x, cids))]
    insert, _ = timed(lambda: [pv.insert_rows(conn, space, rows[i : i + 5000]) for i in range(0, n, 5000)])
    build, _ = timed(lambda: pv.build_index(conn, space))
    conn.execute(f"VACUUM ANALYZE {t}")
    sizes = conn.execute(
        f"SELECT pg_table_size('{t}'), pg_relation_size('{t}_hnsw'), pg_relation_size('{t}_collection')"
    ).fetchone()
    assert sizes is not None
    twin = float32_twin(conn, x, cids) if f32 else None

    big = np.array([c == BIG for c in cids])
    big_ids, small_ids = np.flatnonzero(big) + 1, np.flatnonzero(~big) + 1
    lat: dict[str, list[float]] = {"exact": [], "hnsw": [], "small": [], "small_hnsw": [], "float32_hnsw": []}
    hits = {"hnsw_vs_exact": 0, "hnsw_vs_float32": 0, "exact_vs_float32": 0, "small_hnsw_vs_float32": 0}
    hits["float32_hnsw_vs_float32"] = 0
    small_equal = 0
    max_diff = 0.0
    exact_ids: list[set[int]] = []
    for q in qs:
        blob = q.tobytes()
        s, exact = timed(lambda b=blob: pv.knn_exact(conn, space, b, K, BIG))
        lat["exact"].append(s)
        s, approx = timed(lambda b=blob: pv.knn(conn, space, b, K, BIG))
        lat["hnsw"].append(s)
        s, small = timed(lambda b=blob: pv.knn(conn, space, b, K, SMALL))
        lat["small"].append(s)
        saved = pv.EXACT_UP_TO, pv.EXACT_SHARE
        pv.EXACT_UP_TO, pv.EXACT_SHARE = 0, 0.0  # the planner's plan for the same collection
        try:
            s, walked = timed(lambda b=blob: pv.knn(conn, space, b, K, SMALL))
        finally:
            pv.EXACT_UP_TO, pv.EXACT_SHARE = saved
        lat["small_hnsw"].append(s)
        full = 1.0 - (x @ q) / (np.linalg.norm(x, axis=1) * np.linalg.norm(q))
        truth = set(big_ids[np.argsort(full[big_ids - 1])[:K]].tolist())
        small_truth = small_ids[np.argsort(full[small_ids - 1])[:K]].tolist()
        got = {"exact": {r[0] for r in exact}, "hnsw": {r[0] for r in approx}}
        exact_ids.append(got["exact"])
        hits["hnsw_vs_exact"] += len(got["hnsw"] & got["exact"])
        hits["hnsw_vs_float32"] += len(got["hnsw"] & truth)
        hits["exact_vs_float32"] += len(got["exact"] & truth)
        hits["small_hnsw_vs_float32"] += len({r[0] for r in walked} & set(small_truth))
        small_equal += [r[0] for r in small] == small_truth
        max_diff = max(max_diff, *(abs(d - float(full[rid - 1])) for rid, d in exact + approx + small))
        if twin:
            s, ids = timed(lambda v=q: f32_knn(conn, v))
            lat["float32_hnsw"].append(s)
            hits["float32_hnsw_vs_float32"] += len(set(ids) & truth)
    by_ef: dict[int, dict[str, float]] = {}
    saved_ef = pv.EF_SEARCH
    try:
        for ef in sweep:
            pv.EF_SEARCH = ef
            times, found = [], 0
            for q, truth_ids in zip(qs, exact_ids):
                s, approx = timed(lambda b=q.tobytes(): pv.knn(conn, space, b, K, BIG))
                times.append(s)
                found += len({r[0] for r in approx} & truth_ids)
            by_ef[ef] = {
                "p50_ms": percentile(times, 50) * 1000,
                "p95_ms": percentile(times, 95) * 1000,
                "recall_at_10": found / (K * queries),
            }
    finally:
        pv.EF_SEARCH = saved_ef
    return {
        "n": n,
        "ef_search_sweep": by_ef,
        "insert_s": insert,
        "build_s": build,
        "table_bytes": sizes[0],
        "hnsw_bytes": sizes[1],
        "btree_bytes": sizes[2],
        "float32": {"build_s": twin[0], "bytes": twin[1]} if twin else None,
        "recall_at_10": {k: v / (K * queries) for k, v in hits.items()},
        "small_top10_equal_float32": small_equal,
        "max_abs_distance_diff_vs_float32": max_diff,
        "latency_ms": {k: (percentile(v, 50) * 1000, percentile(v, 95) * 1000) for k, v in lat.items() if v},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,200000")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--float32-at", type=int, default=100_000, help="the size with a float32 twin (0: none)")
    ap.add_argument("--ef-search", default="40,64,100", help="ef_search values to sweep after the main pass")
    ap.add_argument("--spread", type=float, default=SPREAD, help="the noise's norm around a centre")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--m", type=int, default=pv.HNSW_M, help="the HNSW graph's m (pg_vectors.HNSW_M)")
    ap.add_argument(
        "--ef-construction", type=int, default=pv.HNSW_EF_CONSTRUCTION, help="pg_vectors.HNSW_EF_CONSTRUCTION"
    )
    ap.add_argument("--build-mb", type=int, default=pv.MAX_BUILD_MB, help="pg_vectors.MAX_BUILD_MB")
    ap.add_argument("--url", help="a Postgres server with pgvector to use instead of an embedded one")
    args = ap.parse_args()
    pv.HNSW_M, pv.HNSW_EF_CONSTRUCTION, pv.MAX_BUILD_MB = args.m, args.ef_construction, args.build_mb
    print(code_line())
    rng = np.random.default_rng(args.seed)
    results = []
    with ExitStack() as stack:
        url = args.url or stack.enter_context(embedded_postgres())
        conn = stack.enter_context(psycopg.connect(url, autocommit=True))
        for n in (int(s) for s in args.sizes.split(",")):
            r = run_size(
                conn,
                rng,
                n,
                args.queries,
                args.spread,
                n == args.float32_at,
                [int(e) for e in args.ef_search.split(",")],
            )
            results.append(r)
            print(f"{n:,} vectors: inserted in {r['insert_s']:.1f} s, HNSW built in {r['build_s']:.1f} s", flush=True)
            pv.drop_space_table(conn, n)
            conn.execute("DROP TABLE IF EXISTS f32")

    mib = 2**20
    print(
        f"{DIMS} dims, gaussian mixture, {args.queries} queries, k={K}; m={pv.HNSW_M},"
        f" ef_construction={pv.HNSW_EF_CONSTRUCTION}, ef_search={pv.EF_SEARCH},"
        f" EXACT_UP_TO={pv.EXACT_UP_TO}, EXACT_SHARE={pv.EXACT_SHARE}"
    )
    print(
        table(
            [
                "N",
                "insert s",
                "build s",
                "table MB",
                "HNSW MB",
                "exact p50",
                "p95",
                "HNSW p50",
                "p95",
                "recall@10",
                "vs float32",
                "max |d - d32|",
            ],
            [
                [
                    r["n"],
                    r["insert_s"],
                    r["build_s"],
                    r["table_bytes"] / mib,
                    r["hnsw_bytes"] / mib,
                    *r["latency_ms"]["exact"],
                    *r["latency_ms"]["hnsw"],
                    r["recall_at_10"]["hnsw_vs_exact"],
                    r["recall_at_10"]["hnsw_vs_float32"],
                    r["max_abs_distance_diff_vs_float32"],
                ]
                for r in results
            ],
            formats=[",", ".1f", ".1f", ".0f", ".0f", ".1f", ".1f", ".2f", ".2f", ".3f", ".3f", ".1e"],
        )
    )
    print(
        table(
            ["N", "1% collection", "knn p50", "p95", "top 10 exact", "HNSW walk p50", "p95", "walk recall@10"],
            [
                [
                    r["n"],
                    r["n"] // 100,
                    *r["latency_ms"]["small"],
                    r["small_top10_equal_float32"],
                    *r["latency_ms"]["small_hnsw"],
                    r["recall_at_10"]["small_hnsw_vs_float32"],
                ]
                for r in results
            ],
            formats=[",", ",", ".2f", ".2f", None, ".2f", ".2f", ".3f"],
        )
    )
    print(
        table(
            ["N", "ef_search", "HNSW p50", "p95", "recall@10"],
            [
                [r["n"], ef, v["p50_ms"], v["p95_ms"], v["recall_at_10"]]
                for r in results
                for ef, v in r["ef_search_sweep"].items()
            ],
            formats=[",", None, ".2f", ".2f", ".3f"],
        )
    )
    for r in results:
        if r["float32"]:
            print(
                f"float32 `vector` at {r['n']:,}: table + indexes {r['float32']['bytes'] / mib:.0f} MB (halfvec"
                f" {(r['table_bytes'] + r['hnsw_bytes'] + r['btree_bytes']) / mib:.0f} MB), build"
                f" {r['float32']['build_s']:.1f} s (halfvec {r['build_s']:.1f} s), HNSW p50"
                f" {r['latency_ms']['float32_hnsw'][0]:.2f} ms, recall@10 vs float32"
                f" {r['recall_at_10']['float32_hnsw_vs_float32']:.3f}"
                f" (halfvec {r['recall_at_10']['hnsw_vs_float32']:.3f})"
            )
    out = write_json("postgres_vectors", {"machine": machine(), "queries": args.queries, "results": results})
    print(f"written: {out}")


if __name__ == "__main__":
    main()
