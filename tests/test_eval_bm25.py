"""Retrieval quality gate: keyword search on qmd's own eval corpus must reach at least the
original's BM25 floors (`thresholds_in_upstream_tests.bm25`). Prints the figures."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Daemon, Env, eval_spec

# A real qmdd indexes the eval corpus: integration, outside the fast run (-m "not slow").
pytestmark = pytest.mark.slow


def hit_rates(daemon: Daemon, queries: list[dict]) -> dict[str, tuple[int, int, int]]:
    """difficulty → (hits@3, hits@5, total)."""
    out: dict[str, list[int]] = {}
    for q in queries:
        r = daemon.http.post("/v1/keyword", json={"query": q["query"], "limit": 5})
        assert r.status_code == 200, r.text
        files = [h["file"].lower() for h in r.json()["results"]]
        want = q["expected_doc_substring"]
        rank = next((i for i, f in enumerate(files) if want in f), None)
        row = out.setdefault(q["difficulty"], [0, 0, 0])
        row[0] += rank is not None and rank < 3
        row[1] += rank is not None and rank < 5
        row[2] += 1
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def test_bm25_reaches_upstream_floors(env: Env, daemon: Daemon, eval_docs: Path) -> None:
    spec = eval_spec()
    floors = spec["thresholds_in_upstream_tests"]["bm25"]
    env.ok("collection", "add", str(eval_docs), "--name", "eval")
    rates = hit_rates(daemon, spec["eval_queries"])
    total3 = sum(v[0] for v in rates.values())
    total = sum(v[2] for v in rates.values())
    figures = {
        "easy_hit@3": rates["easy"][0] / rates["easy"][2],
        "medium_hit@3": rates["medium"][0] / rates["medium"][2],
        "hard_hit@5": rates["hard"][1] / rates["hard"][2],
        "overall_hit@3": total3 / total,
    }
    print("\nBM25 on qmd-eval (ours vs upstream floor):")
    for k, v in figures.items():
        print(f"  {k:<14} {v:6.1%}   floor {floors[k]:.0%}")
    print(f"  fusion_hit@3   {rates['fusion'][0] / rates['fusion'][2]:6.1%}   (no floor for BM25)")
    for k, v in figures.items():
        assert v >= floors[k], f"{k} = {v:.1%} is below the upstream floor {floors[k]:.0%}"
