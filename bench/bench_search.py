"""Search latency of qmd, and how much of it is Python's own start-up.

    .venv/bin/python bench/bench_search.py [--files 2000] [--seed 1] [--corpus DIR]
                                           [--rounds 5] [--cli-rounds 1]

Indexes a generated corpus (bench/corpus.py; or an existing folder with --corpus, which
is only read) in a fresh isolated `qmdd` (temporary HOME/XDG dirs, free port), then
runs 20 fixed queries (1 word, 2-3 words, questions, phrases, negations):

  (a) HTTP      `POST /v1/keyword` from a warm httpx client, the CLI's own request body;
                p50/p95 over 20 queries x --rounds (after one warm-up pass)
  (b) CLI       a fresh `python -m qmd.client.cli search "q"` process per query, and the
                same through the `.venv/bin/qmd` entry-point script, against the warm
                daemon; p50/p95 over 20 queries x --cli-rounds
  (c) baseline  `python -c pass` (interpreter start), `python -c "import qmd.client.cli"`
                (start + the CLI's imports), `python -m qmd.client.cli --help`, and
                `GET /health` over the warm client (the HTTP floor); after the daemon
                stops, the same searches in-process through `Engine.search` (no HTTP)

Ratios compare each figure with its baseline from the same run, because these
machines are noisy. Figures only, never assertions.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import corpus as corpus_mod  # noqa: E402
from _common import (  # noqa: E402
    PYTHON,
    Daemon,
    Isolated,
    code_line,
    machine,
    mb,
    percentile,
    proc_status_kb,
    summary_ms,
    table,
    write_json,
)

# (category, query). Words come from bench/corpus.py's vocabulary, so every query can match.
QUERIES: list[tuple[str, str]] = [
    ("1 word", "kubernetes"),
    ("1 word", "authentication"),
    ("1 word", "cache"),
    ("1 word", "deploy"),
    ("1 word", "timeout"),
    ("2-3 words", "connection pool"),
    ("2-3 words", "rate limit retry"),
    ("2-3 words", "docker volume mount"),
    ("2-3 words", "schema migration rollback"),
    ("2-3 words", "webhook signature"),
    ("question", "how do I configure the access token for the api"),
    ("question", "what is the best way to handle a memory leak"),
    ("question", "why does the health check fail after deploy"),
    ("question", "where are the release notes for the breaking change"),
    ("phrase", '"circuit breaker"'),
    ("phrase", '"load balancer" health'),
    ("phrase", '"environment variable" config file'),
    ("negation", "cache -redis"),
    ("negation", "deploy -kubernetes -docker"),
    ("negation", '"thread pool" -async'),
]


def search_body(query: str) -> dict:
    """What `qmd search QUERY` sends (client/cli.py), default format and limit."""
    return {
        "query": query,
        "collections": None,
        "limit": 5,
        "min_score": 0.0,
        "all": False,
        "full": False,
        "explain": False,
    }


def time_process(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.decode(errors='replace')}")
    return wall


def import_profile(env: dict[str, str], cwd: Path, top: int = 10) -> list[tuple[str, float]]:
    """The heaviest imports under `import qmd.client.cli` (python -X importtime), by cumulative
    time: its direct imports, and theirs, named `parent > child`. Interpreter start-up
    imports (site, encodings) are left out: `python -c pass` already counts them."""
    r = subprocess.run(
        [PYTHON, "-X", "importtime", "-c", "import qmd.client.cli"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = []
    for line in r.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append(((len(m.group(3)) - 1) // 2, m.group(4), int(m.group(2)) / 1e6))
    end = next((i for i, (d, name, _) in enumerate(rows) if d == 0 and name == "qmd.client.cli"), None)
    if end is None:
        return []
    start = end
    while start > 0 and rows[start - 1][0] > 0:
        start -= 1
    # Children are printed before their parent: walk backwards to name each child's parent.
    out = [("qmd.client.cli (total)", rows[end][2])]
    parents: dict[int, str] = {0: "qmd.client.cli"}
    for depth, name, secs in reversed(rows[start:end]):
        parents[depth] = name
        if depth == 1:
            out.append((name, secs))
        elif depth == 2:
            out.append((f"{parents[1]} > {name}", secs))
    return sorted(out, key=lambda kv: -kv[1])[:top]


def new_connection_health(port: int) -> float:
    """GET /health on a fresh TCP connection (stdlib http.client: no client set-up cost)."""
    import http.client

    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/health")
    conn.getresponse().read()
    conn.close()
    return time.perf_counter() - t0


def httpx_client_setup() -> float:
    """What `qmd.connection.Daemon` pays to build its httpx.Client (default verify=True)."""
    import httpx

    t0 = time.perf_counter()
    c = httpx.Client(base_url="http://127.0.0.1:1", timeout=httpx.Timeout(600.0, connect=2.0))
    secs = time.perf_counter() - t0
    c.close()
    return secs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus", type=Path, default=None, help="index this folder instead of a generated corpus")
    ap.add_argument("--rounds", type=int, default=5, help="HTTP rounds over the 20 queries")
    ap.add_argument("--cli-rounds", type=int, default=1, help="CLI process rounds over the 20 queries")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args(argv)

    env = Isolated(keep=args.keep)
    daemon: Daemon | None = None
    try:
        if args.corpus:
            root = args.corpus.resolve()
            if not root.is_dir():
                ap.error(f"--corpus {root} is not a folder")
            files = [p for p in root.rglob("*.md") if p.is_file()]
            n_files, corpus_bytes = len(files), sum(p.stat().st_size for p in files)
            origin = str(root)
        else:
            root = env.base / "corpus"
            stats = corpus_mod.generate(root, args.files, args.seed)
            n_files, corpus_bytes, origin = stats.files, stats.bytes, f"generated, seed {args.seed}"
        print(f"corpus: {n_files} files, {corpus_bytes / 1e6:.1f} MB ({origin})")
        print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        print(code_line(), flush=True)

        daemon = Daemon(env)
        index_s, _ = env.cli("collection", "add", str(root), "--name", "bench")
        print(f"indexed in {index_s:.1f}s (qmd collection add)", flush=True)
        http = daemon.http

        # (a) HTTP, warm client ------------------------------------------------------------
        hits: dict[str, int] = {}
        for _, q in QUERIES:  # warm-up: connection, SQLite page cache, per-thread readers
            r = http.post("/v1/keyword", json=search_body(q))
            r.raise_for_status()
            hits[q] = len(r.json()["results"])
        health = []
        for _ in range(len(QUERIES) * args.rounds):
            t0 = time.perf_counter()
            http.get("/health").raise_for_status()
            health.append(time.perf_counter() - t0)
        health_new = [new_connection_health(env.port) for _ in range(len(QUERIES) * args.rounds)]
        client_setup = [httpx_client_setup() for _ in range(20)]
        per_query: dict[str, list[float]] = {q: [] for _, q in QUERIES}
        for _ in range(args.rounds):
            for _, q in QUERIES:
                t0 = time.perf_counter()
                r = http.post("/v1/keyword", json=search_body(q))
                per_query[q].append(time.perf_counter() - t0)
                r.raise_for_status()
        http_all = [x for xs in per_query.values() for x in xs]
        print("HTTP measured", flush=True)

        # (b) CLI processes against the warm daemon, interleaved with (c) the process
        # baselines so that both see the same machine load -------------------------------
        script = str(Path(PYTHON).parent / "qmd")
        cli_module, cli_script, py_pass, py_import, py_help = [], [], [], [], []
        for _ in range(args.cli_rounds):
            for _, q in QUERIES:
                py_pass.append(time_process([PYTHON, "-c", "pass"], env.vars, env.home))
                cli_module.append(time_process([PYTHON, "-m", "qmd.client.cli", "search", q], env.vars, env.home))
                py_import.append(time_process([PYTHON, "-c", "import qmd.client.cli"], env.vars, env.home))
                cli_script.append(time_process([script, "search", q], env.vars, env.home))
                py_help.append(time_process([PYTHON, "-m", "qmd.client.cli", "--help"], env.vars, env.home))
        print("CLI measured", flush=True)
        imports = import_profile(env.vars, env.home)
        probe = subprocess.run(
            [PYTHON, "-c", "import sys, qmd.client.cli; print('httpx' in sys.modules)"],
            env=env.vars,
            cwd=env.home,
            capture_output=True,
            text=True,
            timeout=60,
        )
        cli_uses_httpx = probe.stdout.strip() == "True"
        rss = proc_status_kb(daemon.pid, "VmRSS")
        daemon.stop()
        daemon = None

        # In-process engine (no HTTP), on the same index, once the daemon has let go of it.
        os.environ.update({k: env.vars[k] for k in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")})
        from qmd.paths import IndexPaths
        from qmd.server.engine import Engine
        from qmd.server.search.pointers import SearchOptions

        engine = Engine(IndexPaths.resolve(None))
        try:
            for _, q in QUERIES:
                engine.search(q, SearchOptions(limit=5))
            inproc_q: dict[str, list[float]] = {q: [] for _, q in QUERIES}
            for _ in range(args.rounds):
                for _, q in QUERIES:
                    t0 = time.perf_counter()
                    engine.search(q, SearchOptions(limit=5))
                    inproc_q[q].append(time.perf_counter() - t0)
            inproc = [x for xs in inproc_q.values() for x in xs]
        finally:
            engine.close()

        # -- report ---------------------------------------------------------------------
        S = {
            name: summary_ms(v)
            for name, v in {
                "http_health": health,
                "http_health_new_conn": health_new,
                "httpx_client_setup": client_setup,
                "http_search": http_all,
                "engine_search": inproc,
                "cli_module": cli_module,
                "cli_script": cli_script,
                "python_pass": py_pass,
                "python_import_cli": py_import,
                "cli_help": py_help,
            }.items()
        }
        p = {k: v["p50_ms"] for k, v in S.items()}
        rows = [
            [
                "(a) POST /v1/keyword, warm httpx",
                S["http_search"],
                f"{p['http_search'] / p['http_health']:.1f}x GET /health",
            ],
            [
                "(b) python -m qmd.client.cli search",
                S["cli_module"],
                f"{p['cli_module'] / p['python_pass']:.1f}x python -c pass",
            ],
            ["(b) .venv/bin/qmd search", S["cli_script"], f"{p['cli_script'] / p['python_pass']:.1f}x python -c pass"],
            [
                "(c) GET /health, warm httpx (keep-alive)",
                S["http_health"],
                f"{p['http_health'] / p['http_health_new_conn']:.1f}x new connection",
            ],
            ["(c) GET /health, new connection each", S["http_health_new_conn"], ""],
            [
                "(c) httpx.Client() set-up, in-process",
                S["httpx_client_setup"],
                "the CLI builds one" if cli_uses_httpx else "the CLI does not use httpx",
            ],
            [
                "(c) Engine.search in-process",
                S["engine_search"],
                f"{p['engine_search'] / p['http_search']:.2f}x HTTP search",
            ],
            ["(c) python -c pass", S["python_pass"], ""],
            [
                '(c) python -c "import qmd.client.cli"',
                S["python_import_cli"],
                f"{p['python_import_cli'] / p['python_pass']:.1f}x python -c pass",
            ],
            [
                "(c) python -m qmd.client.cli --help",
                S["cli_help"],
                f"{p['cli_help'] / p['python_pass']:.1f}x python -c pass",
            ],
        ]
        print()
        print(
            table(
                ["measure", "n", "p50 ms", "p95 ms", "ratio (p50)"],
                [[name, s["n"], s["p50_ms"], s["p95_ms"], ratio] for name, s, ratio in rows],
                title=f"Search over {n_files} files / {corpus_bytes / 1e6:.1f} MB, {len(QUERIES)} queries",
                formats=[None, "d", ".1f", ".1f", None],
            )
        )

        start = p["python_pass"]
        imp = p["python_import_cli"] - start
        rest = p["cli_module"] - p["python_import_cli"]
        print()
        print(
            table(
                ["where a CLI search's p50 goes", "ms", "share"],
                [
                    ["Python start-up (python -c pass)", start, start / p["cli_module"]],
                    ["importing qmd.client.cli and what it imports", imp, imp / p["cli_module"]],
                    ["the rest: connect, /health, search, render", rest, rest / p["cli_module"]],
                    *(
                        [
                            [
                                "  of which httpx.Client() set-up",
                                p["httpx_client_setup"],
                                p["httpx_client_setup"] / p["cli_module"],
                            ]
                        ]
                        if cli_uses_httpx
                        else []
                    ),
                    ["  of which the search over HTTP (a, p50)", p["http_search"], p["http_search"] / p["cli_module"]],
                    ["    of which the engine's own work", p["engine_search"], p["engine_search"] / p["cli_module"]],
                ],
                formats=[None, ".1f", ".0%"],
            )
        )

        cats: dict[str, list[float]] = {}
        for cat, q in QUERIES:
            cats.setdefault(cat, []).extend(per_query[q])
        print()
        print(
            table(
                ["HTTP search by query kind", "queries", "p50 ms", "p95 ms", "mean hits"],
                [
                    [
                        cat,
                        sum(1 for c, _ in QUERIES if c == cat),
                        percentile(v, 50) * 1000,
                        percentile(v, 95) * 1000,
                        sum(hits[q] for c, q in QUERIES if c == cat) / sum(1 for c, _ in QUERIES if c == cat),
                    ]
                    for cat, v in cats.items()
                ],
                formats=[None, "d", ".1f", ".1f", ".1f"],
            )
        )

        slowest = sorted(QUERIES, key=lambda cq: -percentile(inproc_q[cq[1]], 50))[:5]
        print()
        print(
            table(
                ["slowest queries", "kind", "engine p50 ms", "HTTP p50 ms"],
                [
                    [q, cat, percentile(inproc_q[q], 50) * 1000, percentile(per_query[q], 50) * 1000]
                    for cat, q in slowest
                ],
                formats=[None, None, ".1f", ".1f"],
            )
        )

        print()
        print(
            table(
                ["heaviest imports under qmd.client.cli", "ms (cumulative)"],
                [[name, secs * 1000] for name, secs in imports],
                formats=[None, ".1f"],
            )
        )
        print(f"\ndaemon RSS with the index warm: {mb(rss)} MB")
        if p["http_health"] > 5 * p["http_health_new_conn"] and p["http_health"] - p["http_health_new_conn"] > 20:
            print(
                f"note: a request on a kept-alive connection takes {p['http_health']:.0f} ms, a fresh connection "
                f"{p['http_health_new_conn']:.1f} ms. ~40 ms is the signature of Nagle's algorithm meeting delayed "
                "ACKs: the daemon's accepted sockets lack TCP_NODELAY."
            )

        result = {
            "machine": machine(),
            "corpus": {"files": n_files, "mb": round(corpus_bytes / 1e6, 2), "origin": origin},
            "index_s": round(index_s, 2),
            "rounds": args.rounds,
            "cli_rounds": args.cli_rounds,
            "summary": S,
            "ratios_p50": {
                "http_search / http_health": round(p["http_search"] / p["http_health"], 2),
                "http_health keep-alive / new connection": round(p["http_health"] / p["http_health_new_conn"], 2),
                "engine_search / http_search": round(p["engine_search"] / p["http_search"], 2),
                "cli_module / python_pass": round(p["cli_module"] / p["python_pass"], 2),
                "cli_script / python_pass": round(p["cli_script"] / p["python_pass"], 2),
                "python_import_cli / python_pass": round(p["python_import_cli"] / p["python_pass"], 2),
            },
            "queries": [
                {
                    "kind": cat,
                    "query": q,
                    "hits": hits[q],
                    **summary_ms(per_query[q]),
                    "engine": summary_ms(inproc_q[q]),
                }
                for cat, q in QUERIES
            ],
            "import_profile_ms": {name: round(secs * 1000, 1) for name, secs in imports},
            "cli_imports_httpx": cli_uses_httpx,
            "daemon_rss_mb": mb(rss),
        }
        path = write_json("search", result)
        print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
        if args.keep:
            print(f"kept {env.base}")
    finally:
        if daemon is not None:
            daemon.stop()
        env.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
