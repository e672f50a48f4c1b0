"""Fit and check `relevance` (server/search/relevance.py) on bench_fusion.py's saved lists.

    .venv/bin/python bench/relevance_fit.py --lists FILE [--model GGUF]

The lists (`bench/bench_fusion.py SETS... --offtopic bench/data/offtopic_queries.txt --lists
FILE`) hold each question's keyword and vector lists on each set: its own questions (one
relevant document), the other sets' and the everyday ones (none). For each, the first result
of the rank fusion (`fusion.fuse`) and its evidence as `relevance` reads it: the keyword score, and the
cosine on the embedder's scale (`relevance.Scales`, measured here with the same model the
lists were made with). A logistic regression on all of them gives the shipped weights; held
out one set at a time, what each floor refuses of the questions with no answer there and
drops of the right first answers, and the set's nDCG@10 ranked by that held-out fit (the
default order of a plain query) next to the rank fusion's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from _common import embed_model_path
from bench_fusion import as_fused, by_relevance, ndcg10, rrf_fused, scale_of

FLOORS = (0.01, 0.02, 0.05, 0.1)


def evidence(row: dict[str, Any], related: float, unrelated: float) -> tuple[float, float] | None:
    """The rank fusion's first result's (keyword score, scaled cosine), as `hybrid._evidence`
    computes them; None when nothing was found."""
    fused = rrf_fused(as_fused(row))
    if not fused:
        return None
    top = fused[0]
    cosines = {d: 2 - 1 / s for d, s in row["vec"]}  # the lists hold 1/(1 + distance)
    cosine = cosines.get(top, min(cosines.values(), default=0.0))
    return dict(row["fts"]).get(top, 0.0), (cosine - unrelated) / (related - unrelated)


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, steps: int = 4000, rate: float = 0.5) -> np.ndarray:
    xb = np.hstack([x, np.ones((len(x), 1))])
    w = np.zeros(xb.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-xb @ w))
        w -= rate * (xb.T @ (p - y) / len(y) + l2 * np.r_[w[:-1], 0])
    return w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lists", type=Path, required=True)
    ap.add_argument("--model", help="embed GGUF the lists were made with (default: the shared MiniLM)")
    a = ap.parse_args()
    related, unrelated = scale_of(embed_model_path(a.model))
    print(f"scale: related {related:.4f}, unrelated {unrelated:.4f}")
    rows = []
    lists = json.loads(a.lists.read_text())
    for r in lists:
        if (e := evidence(r, related, unrelated)) is None:
            continue
        kind = "off" if r.get("offtopic") else ("own" if r["own"] else "other")
        right = kind == "own" and rrf_fused(as_fused(r))[0] in r["relevant"]
        rows.append((r["set"], kind, right, e))
    used = [x for x in rows if x[2] or x[1] != "own"]  # an own question answered wrong says nothing either way
    w = fit(np.array([x[3] for x in used]), np.array([1.0 if x[2] else 0.0 for x in used]))
    print(f"all sets: W_KEYWORD {w[0]:.2f}, W_VECTOR {w[1]:.2f}, BIAS {w[2]:.2f}")
    print("held out: everyday refused / other sets' refused / right dropped")
    print("set | " + " | ".join(f"floor {f}" for f in FLOORS))
    for held in dict.fromkeys(x[0] for x in rows):
        train = [x for x in used if x[0] != held]
        wh = fit(np.array([x[3] for x in train]), np.array([1.0 if x[2] else 0.0 for x in train]))
        test = [x for x in rows if x[0] == held]

        def p(e: tuple[float, float], wh: np.ndarray = wh) -> float:
            return 1 / (1 + math.exp(-(wh[0] * e[0] + wh[1] * e[1] + wh[2])))

        cells = []
        for f in FLOORS:
            share = [np.mean([p(x[3]) < f for x in test if sel(x)]) for sel in (_off, _other, _right)]
            cells.append(" / ".join(f"{v:.0%}" for v in share))
        print(f"{held} | " + " | ".join(cells))
    print("held out: nDCG@10 ranked by the fit without the set / by the rank fusion")
    for held in dict.fromkeys(x[0] for x in rows):
        train = [x for x in used if x[0] != held]
        wh = fit(np.array([x[3] for x in train]), np.array([1.0 if x[2] else 0.0 for x in train]))
        own = [r for r in lists if r["set"] == held and r["own"]]
        order = by_relevance(related, unrelated, wh[0], wh[1])
        by_fit, by_rrf = (
            sum(ndcg10(v(as_fused(r)), r["relevant"]) for r in own) / len(own) for v in (order, rrf_fused)
        )
        print(f"{held} | {by_fit:.4f} / {by_rrf:.4f}")


def _off(x: tuple[Any, ...]) -> bool:
    return bool(x[1] == "off")


def _other(x: tuple[Any, ...]) -> bool:
    return bool(x[1] == "other")


def _right(x: tuple[Any, ...]) -> bool:
    return bool(x[2])


if __name__ == "__main__":
    sys.exit(main())
