"""The same generated corpus on both index backends, in one run (issue 14): SQLite is the
baseline, Postgres (an embedded server, tests/pg_server.py, unless --url names one) the
measured one.

    .venv/bin/python bench/bench_postgres.py [--files 100000] [--seed 1] [--rounds 5] [--url postgresql://...]
        [--no-copy]

For each backend, an isolated `qmdd` (temporary HOME/XDG dirs, free port; QMD_INDEX_URL for
Postgres) and, through the real CLI and HTTP API:

  index       `qmd collection add CORPUS`: walk, read, hash, insert, the keyword index
  no change   `qmd update` with nothing changed: walk + stat, one read of the index's rows
  keyword     `POST /v1/keyword` from a warm client, bench_search.py's 15 queries
              (one word, two or three, questions), `rounds` times each: p50 / p95
  copy        `qmd index copy` of the SQLite index into a fresh Postgres database

The vector leg at scale is bench/bench_postgres_vectors.py. Figures only, never assertions.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus as corpus_mod  # noqa: E402
from _common import Isolated, code_line, machine, percentile, pg_database, table, write_json  # noqa: E402
from bench_search import QUERIES, search_body  # noqa: E402
from harness import Daemon  # noqa: E402 - tests/ is on the path through _common
from pg_server import embedded_postgres  # noqa: E402


def measure(root: Path, url: str | None, rounds: int) -> tuple[dict[str, float], Isolated]:
    env = Isolated()
    if url:
        env.vars["QMD_INDEX_URL"] = url
    d = Daemon(env)
    try:
        index_s, _ = env.cli("collection", "add", str(root), "--name", "bench")
        same_s, _ = env.cli("update")
        for _, q in QUERIES:  # warm-up: connections, page caches
            d.http.post("/v1/keyword", json=search_body(q)).raise_for_status()
        times = []
        for _ in range(rounds):
            for _, q in QUERIES:
                t0 = time.perf_counter()
                d.http.post("/v1/keyword", json=search_body(q)).raise_for_status()
                times.append(time.perf_counter() - t0)
        return {
            "index_s": index_s,
            "no_change_s": same_s,
            "keyword_p50_ms": percentile(times, 50) * 1000,
            "keyword_p95_ms": percentile(times, 95) * 1000,
        }, env
    finally:
        d.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--url", help="a Postgres server to use (its databases qmd_bench_*), not an embedded one")
    ap.add_argument("--no-copy", action="store_true", help="leave out `qmd index copy` (minutes at 100k files)")
    args = ap.parse_args()
    with ExitStack() as stack:
        root = Path(tempfile.mkdtemp(prefix="qmd-bench-corpus-"))
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        stats = corpus_mod.generate(root, files=args.files, seed=args.seed)
        server = args.url or stack.enter_context(embedded_postgres())
        print(f"corpus: {stats.files} files, {stats.bytes / 1e6:.1f} MB (generated, seed {args.seed})")
        print(code_line(), flush=True)
        sqlite, env = measure(root, None, args.rounds)
        stack.callback(env.cleanup)
        print(f"sqlite: {sqlite}", flush=True)
        pg, pg_env = measure(root, pg_database(server, "qmd_bench_index"), args.rounds)
        pg_env.cleanup()
        print(f"postgres: {pg}", flush=True)
        copy_s = None
        if not args.no_copy:
            target = pg_database(server, "qmd_bench_copy")
            d = Daemon(env)
            try:
                copy_s, _ = env.cli("index", "copy", "index", target)
            finally:
                d.stop()
        rows = [
            [
                label,
                f"{sqlite[key]:.{digits}f}",
                f"{pg[key]:.{digits}f}",
                f"{pg[key] / sqlite[key]:.2f}×" if sqlite[key] else "",
            ]
            for label, key, digits in (
                ("index (qmd collection add), s", "index_s", 1),
                ("no change (qmd update), s", "no_change_s", 2),
                ("keyword p50, ms", "keyword_p50_ms", 1),
                ("keyword p95, ms", "keyword_p95_ms", 1),
            )
        ]
        print(table(["measure", "SQLite", "Postgres", "ratio"], rows))
        if copy_s is not None:
            print(f"qmd index copy SQLite → Postgres: {copy_s:.1f} s")
        write_json(
            "postgres",
            {
                "machine": machine(),
                "files": stats.files,
                "sqlite": sqlite,
                "postgres": pg,
                "copy_s": copy_s,
            },
        )


if __name__ == "__main__":
    main()
