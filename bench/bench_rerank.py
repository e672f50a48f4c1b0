"""What each stage of the full query buys, and what it costs: nDCG@10 and latency per configuration.

    .venv/bin/python bench/bench_rerank.py [--corpus man|pydoc] [--docs 1500] [--max-chars 3000]
                                           [--queries 40] [--seed 7] [--during 16] [--embed-model GGUF]
                                           [--generate-model GGUF] [--rerank-model GGUF|cosine]
                                           [--only NAME ...] [--keep]

The corpus is a BEIR-format known-item set built from this machine's man pages
(bench/manpages_beir.py: a page's one-line description is the query, the page its one
relevant document), each page cut to --max-chars so that embedding fits the run; or, with
`--corpus pydoc` (and `--during 0`), from the standard library's docstrings
(bench/pydoc_beir.py: a summary line is the query, the rest of its entry the document). One
isolated `qmdd` (temporary HOME/XDG, free port) with MiniLM embedding and Gemma 3 270M
expanding and reranking by query likelihood (bench_query.py's setup) serves everything:

1. **Scheduling**: once the corpus is embedded, a second collection of --extra other pages
   is added and `qmd embed` runs in the background; meanwhile --during queries go to
   `POST /v1/query` in three modes (`SCHEDULED`: a plain query, whose embedding is its one
   worker call; expansion and vectors, no rerank: expansion is one more; the same with 5
   candidates reranked: rerank batches too);
   after the embed and `qmd cleanup --cache-days 0`, the same queries run the same way
   idle. Each query is a cache miss both times, and the same text both times: how long an
   expansion takes depends on what it generates (0.3-1.1 s for Gemma), so other queries idle
   would measure the queries, not the embed. The ratio during/idle is the figure (issue 15:
   ≤ 1.5×).
2. **Configurations**: `qmd bench --beir` through the CLI, once per configuration, each
   after `qmd cleanup --cache-days 0`, so no expansion or rerank score comes from an
   earlier run: every latency is a cold, honest one with warm models. Baselines from the
   same run: bm25 and vector alone.

Prints one table (configuration, nDCG@10, MRR@10, R@100, p50/p95 latency, ratio of p50 to
the no-rerank pipeline's) and writes bench/out/bench_rerank.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import manpages_beir  # noqa: E402
import pydoc_beir  # noqa: E402
from _common import (  # noqa: E402
    Daemon,
    Isolated,
    code_line,
    embed_model_path,
    machine,
    percentile,
    proc_cpu_s,
    system_cpu_s,
    table,
    write_json,
)
from bench_query import model_paths  # noqa: E402

CONFIGS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("fusion, no expansion", ("-b", "hybrid", "--no-expand"), True),
    ("fusion + expansion", ("-b", "hybrid", "--expand"), True),
    ("rerank top 10, no expansion", ("-b", "full", "-C", "10", "--no-expand"), True),
    ("rerank top 40, no expansion", ("-b", "full", "--no-expand"), False),
    ("rerank top 40 + expansion (the former default)", ("-b", "full", "--expand"), True),
    ("rerank top 20 + expansion", ("-b", "full", "-C", "20", "--expand"), False),
    ("rerank top 10 + expansion", ("-b", "full", "-C", "10", "--expand"), False),
)
"""(name, `qmd bench` flags, cold). A cold configuration runs after the caches are emptied, so
its latency is measured; a warm one reuses the scores of the cold runs before it (a top-20 run
scores the same passages as the top-40 one), so its nDCG is exact and its latency is
estimated from the cold runs' per-candidate cost."""
BASELINE = "fusion, no expansion"


def bench_json(env: Isolated, beir: Path, *args: str) -> dict[str, Any]:
    _, r = env.cli("bench", "--beir", str(beir), "--keep", "--json", *args)
    return json.loads(r.stdout)


def figures(report: dict[str, Any], backend: str) -> dict[str, Any]:
    """A backend's means, and latency percentiles from its per-query times."""
    means = report["summary"][backend]["means"]
    times = [r["backends"][backend]["latency_ms"] for r in report["results"] if backend in r["backends"]]
    notes = next((b["notes"] for b in report["backends"] if b["name"] == backend), [])
    return {
        "ndcg_at_10": round(means["ndcg_at_10"], 4),
        "mrr_at_10": round(means["mrr_at_10"], 4),
        "recall_at_100": round(means["recall_at_100"], 4),
        "p50_ms": round(percentile(times, 50), 1),
        "p95_ms": round(percentile(times, 95), 1),
        "queries": len(times),
        "notes": notes,
    }


def estimate(configs: dict[str, dict[str, Any]]) -> None:
    """A warm configuration's p50: its pipeline's cold p50 without rerank plus its candidates at
    the cold top-40 run's cost per candidate (a rerank's time is about linear in candidates)."""
    top40, fused = configs.get("rerank top 40 + expansion (the former default)"), configs.get("fusion + expansion")
    if not top40 or not fused:
        return
    per = (top40["p50_ms"] - fused["p50_ms"]) / 40
    for name, f in configs.items():
        if not f.get("cold", True):
            base = configs.get("fusion, no expansion" if "no expansion" in name else "fusion + expansion", fused)
            candidates = int(re.search(r"top (\d+)", name).group(1))  # type: ignore[union-attr]
            f["estimated_p50_ms"] = round(base["p50_ms"] + candidates * per, 1)


class Timed:
    """Wall-clock seconds per query, what the daemon said each stage took (ms), and the CPU
    seconds the daemon process, its model worker and the whole machine used meanwhile: what
    tells a query waiting for the worker from one sharing the cores with other work."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.stages: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def stage_p50(self) -> dict[str, float]:
        return {name: round(percentile(ms, 50), 1) for name, ms in self.stages.items()}

    def cpu_p50_ms(self) -> dict[str, float]:
        return {name: round(percentile(s, 50) * 1000, 1) for name, s in self.cpu.items()}


def _cpu(daemon_pid: int, worker_pid: int | None) -> dict[str, float]:
    return {
        "daemon": proc_cpu_s(daemon_pid) or 0.0,
        "worker": (proc_cpu_s(worker_pid) or 0.0) if worker_pid else 0.0,
        "machine": (system_cpu_s() or (0.0, 0.0))[0],
    }


def _inference(http: httpx.Client) -> dict[str, Any]:
    """The worker's own snapshot (`WorkerClient.status`): its pid and its recent calls."""
    answer: dict[str, Any] = http.get("/v1/status").raise_for_status().json()["inference"]
    return answer


def _lane_seconds(recent: list[dict[str, Any]], start: float, end: float) -> dict[str, float]:
    """Seconds of [start, end] the worker spent on calls of each lane."""
    busy = {"interactive": 0.0, "background": 0.0}
    for call in recent:
        if call["started_at"] is not None:
            overlap = min(call["ended_at"] or end, end) - max(call["started_at"], start)
            busy[call["lane"]] += max(overlap, 0.0)
    return busy


def timed_queries(http: httpx.Client, daemon_pid: int, texts: list[str], body: dict[str, Any]) -> Timed:
    out = Timed()
    worker = _inference(http)
    for text in texts:
        before = _cpu(daemon_pid, worker["pid"])
        w0, t0 = time.time(), time.perf_counter()
        answer = http.post("/v1/query", json={"query": text, **body}).raise_for_status().json()
        out.seconds.append(time.perf_counter() - t0)
        after, w1 = _cpu(daemon_pid, worker["pid"]), time.time()
        for name in before:
            out.cpu.setdefault(name, []).append(after[name] - before[name])
        worker = _inference(http)
        for lane, busy in _lane_seconds(worker["recent"], w0, w1).items():
            out.cpu.setdefault(f"worker {lane} calls (wall)", []).append(busy)
        for stage in [*answer["stages"], {"stage": "daemon total", "ms": answer["elapsed_ms"]}]:
            out.stages.setdefault(stage["stage"], []).append(stage["ms"])
    return out


SCHEDULED: dict[str, dict[str, Any]] = {
    "default": {"limit": 10},
    "no rerank": {"rerank": False, "expand": True, "limit": 10},
    "full -C 5": {"rerank": True, "expand": True, "candidateLimit": 5, "limit": 10},
}
"""The scheduling phase's modes: what `qmd query TEXT` sends (keyword and vectors, fused: the
query's embedding is its one worker call), then expansion, then rerank batches too."""


def scheduling(env: Isolated, daemon: Daemon, texts: list[str], extra: Path, say: Any) -> dict[str, Any]:
    """Query latency while `qmd embed` embeds another collection (`extra`), against the same
    queries idle afterwards, with the caches emptied between."""
    modes = SCHEDULED
    n = len(texts) // len(modes)
    groups = [texts[i * n : (i + 1) * n] for i in range(len(modes))]
    env.cli("collection", "add", str(extra), "--name", "extra")
    log = env.base / "embed.log"
    started = time.perf_counter()
    with open(log, "wb") as out:  # a file, not a pipe: the progress bar must never block the job
        embed = subprocess.Popen(
            [sys.executable, "-m", "qmd.client.cli", "embed"], env=env.vars, cwd=env.home, stdout=out, stderr=out
        )
    during: dict[str, Timed] = {}
    try:
        time.sleep(3.0)  # the job is under way: models loaded, batches flowing
        for (mode, body), group in zip(modes.items(), groups, strict=True):
            during[mode] = timed_queries(daemon.http, daemon.pid, group, body)
        still = embed.poll() is None
    finally:
        embed.wait(timeout=3600)
    embed_seconds = time.perf_counter() - started
    if embed.returncode != 0:
        raise RuntimeError(f"qmd embed failed: {log.read_text(errors='replace')[-2000:]}")
    env.cli("cleanup", "--cache-days", "0", "--no-vacuum")  # the same queries again, each a cache miss again
    idle = {mode: timed_queries(daemon.http, daemon.pid, g, body) for (mode, body), g in zip(modes.items(), groups)}
    result: dict[str, Any] = {"embed_outlasted_the_queries": still, "embed_seconds": round(embed_seconds, 1)}
    say(f"[scheduling] qmd embed of {extra.name}: {embed_seconds:.1f} s, queries meanwhile")
    for mode in modes:
        d, i = percentile(during[mode].seconds, 50), percentile(idle[mode].seconds, 50)
        result[mode] = {
            "during_p50_ms": round(d * 1000, 1),
            "during_p95_ms": round(percentile(during[mode].seconds, 95) * 1000, 1),
            "idle_p50_ms": round(i * 1000, 1),
            "idle_p95_ms": round(percentile(idle[mode].seconds, 95) * 1000, 1),
            "ratio_p50": round(d / i, 2),
            "stages_during_p50_ms": during[mode].stage_p50(),
            "stages_idle_p50_ms": idle[mode].stage_p50(),
            "cpu_during_p50_ms": during[mode].cpu_p50_ms(),
            "cpu_idle_p50_ms": idle[mode].cpu_p50_ms(),
        }
        say(f"[scheduling] {mode}: during embed {d * 1000:.0f} ms p50, idle {i * 1000:.0f} ms ({d / i:.2f}×)")
        busy, calm = during[mode].stage_p50(), idle[mode].stage_p50()
        say("  stages p50, during / idle ms: " + ", ".join(f"{k} {v:g}/{calm.get(k, 0):g}" for k, v in busy.items()))
        busy, calm = during[mode].cpu_p50_ms(), idle[mode].cpu_p50_ms()
        say("  CPU p50 per query, during / idle ms: " + ", ".join(f"{k} {v:g}/{calm[k]:g}" for k, v in busy.items()))
    if not still:
        say("[scheduling] WARNING: the embed ended before the queries did: use more --docs")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=("man", "pydoc"), default="man", help="man pages, or stdlib docstrings")
    ap.add_argument("--docs", type=int, default=1500)
    ap.add_argument("--max-chars", type=int, default=3000)
    ap.add_argument("--queries", type=int, default=40, help="judged queries per configuration")
    ap.add_argument("--rerank-queries", type=int, help="only the first N of them for the rerank configurations")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--during", type=int, default=8, help="queries per mode during the embed (and as many idle)")
    ap.add_argument("--extra", type=int, default=800, help="pages of the collection embedded meanwhile")
    ap.add_argument("--embed-model")
    ap.add_argument("--generate-model")
    ap.add_argument("--rerank-model")
    ap.add_argument("--only", action="append", help="only the configurations whose name contains this")
    ap.add_argument("--keep", action="store_true", help="keep the temporary installation")
    args = ap.parse_args(argv)

    def say(text: str) -> None:
        print(text, flush=True)

    if args.corpus == "pydoc" and args.during:
        ap.error("--corpus pydoc has no pages to embed meanwhile: give --during 0")
    scratch = Path(tempfile.mkdtemp(prefix="qmd-bench-rerank-"))
    beir = scratch / args.corpus
    extra = scratch / "extra"
    extra.mkdir()
    if args.corpus == "pydoc":
        docs, _ = pydoc_beir.build(beir, args.docs, args.queries + 1, args.seed)
    else:
        scheduled = len(SCHEDULED) * args.during
        docs, _ = manpages_beir.build(beir, args.docs, args.queries + scheduled + 1, args.seed, args.max_chars)
        # Other pages of the same shuffled list: a collection whose embedding competes with queries.
        manpages_beir.build(scratch / "more", args.docs + args.extra, 1, args.seed, args.max_chars)
        for line in (scratch / "more" / "corpus.jsonl").read_text().splitlines()[args.docs :]:
            page = json.loads(line)
            (extra / f"{page['_id']}.md").write_text(page["text"])
    asked = [json.loads(line) for line in (beir / "queries.jsonl").read_text().splitlines()]
    spare = [q["text"] for q in asked[args.queries :]]
    # The judged queries are the first --queries; the rest drive the scheduling phase only.
    qrels = (beir / "qrels" / "test.tsv").read_text().splitlines()
    keep = {q["_id"] for q in asked[: args.queries]}
    (beir / "qrels" / "test.tsv").write_text(
        "\n".join([qrels[0], *(line for line in qrels[1:] if line.split("\t")[0] in keep)]) + "\n"
    )
    models = model_paths(args, scratch)
    models["embed"] = embed_model_path(args.embed_model)
    env = Isolated(keep=args.keep)
    env.vars.update(
        {
            "QMD_EMBED_MODEL": models["embed"],
            "QMD_GENERATE_MODEL": models["generate"],
            "QMD_RERANK_MODEL": models["rerank"],
        }
    )
    say(code_line())
    kind = f"man pages (≤ {args.max_chars} characters)" if args.corpus == "man" else "standard-library docstrings"
    say(f"corpus: {docs} {kind}, {args.queries} judged queries")
    results: dict[str, Any] = {"machine": machine(), "args": vars(args), "models": models, "configs": {}}
    daemon = Daemon(env)
    try:
        daemon.http.timeout = httpx.Timeout(3600.0)
        first = bench_json(env, beir, "-b", "bm25")  # indexes the collection (no vectors yet)
        results["configs"]["bm25"] = figures(first, "bm25")
        embed_s, _ = env.cli("embed")
        chunks = daemon.http.get("/v1/status").raise_for_status().json()["vector"].get("embedded_chunks")
        say(f"embedded: {chunks} chunks in {embed_s:.0f} s")
        warm = daemon.http.post("/v1/query", json={"query": spare[0], "limit": 5, "candidateLimit": 4})
        warm.raise_for_status()  # loads the generate/rerank model before anything is timed
        if args.during:
            results["scheduling"] = scheduling(env, daemon, spare[1 : 1 + len(SCHEDULED) * args.during], extra, say)
            env.cli("collection", "remove", "extra")
        results["configs"]["vector"] = figures(bench_json(env, beir, "-b", "vector"), "vector")
        for name, flags, cold in CONFIGS:
            if args.only and not any(o in name for o in args.only):
                continue
            if cold:
                env.cli("cleanup", "--cache-days", "0", "--no-vacuum")
            subset = ("--max-queries", str(args.rerank_queries)) if args.rerank_queries and "full" in flags else ()
            report = bench_json(env, beir, *flags, *subset)
            f = results["configs"][name] = figures(report, flags[1]) | {"cold": cold}
            say(f"{name}: nDCG@10 {f['ndcg_at_10']:.3f}, p50 {f['p50_ms']:.0f} ms, p95 {f['p95_ms']:.0f} ms")
    finally:
        daemon.stop()
        env.cleanup()
    estimate(results["configs"])
    base = results["configs"].get(BASELINE, {}).get("p50_ms")
    rows = [
        [
            name,
            f["ndcg_at_10"],
            f["mrr_at_10"],
            f["recall_at_100"],
            f["p50_ms"] / 1000 if "estimated_p50_ms" not in f else f"~{f['estimated_p50_ms'] / 1000:.2f} (est.)",
            f["p95_ms"] / 1000 if "estimated_p50_ms" not in f else None,
            f"{f.get('estimated_p50_ms', f['p50_ms']) / base:.1f}×" if base else None,
        ]
        for name, f in results["configs"].items()
    ]
    say("")
    say(
        table(
            ["configuration", "nDCG@10", "MRR@10", "R@100", "p50 s", "p95 s", f"p50 vs {BASELINE}"],
            rows,
            formats=[None, ".3f", ".3f", ".3f", ".2f", ".2f", None],
        )
    )
    say(f"\nwritten: {write_json('bench_rerank', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
