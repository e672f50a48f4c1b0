"""Fit and check `relevance` (server/search/relevance.py) on bench_fusion.py's saved lists.

    .venv/bin/python bench/relevance_fit.py --lists FILE [--check SET ...] [--check-lists FILE ...]
                                            [--small-lists FILE ...] [--model GGUF]

The lists (`bench/bench_fusion.py SETS... --offtopic bench/data/offtopic_queries.txt --lists
FILE`) hold each question's keyword and vector lists on each set: its own questions (one
relevant document), the other sets' and the everyday ones (none). For each, the first result
of a plain query's default order (`bench_fusion.by_relevance`) and its evidence as
`hybrid._relevance` reads it: the keyword score, the cosine on the embedder's scale
(`relevance.Scales`, measured here with the same model the lists were made with) and the
query's `relevance.standout`. A logistic regression on the fitted sets gives the shipped
weights, with the order's ratio W_KEYWORD / W_VECTOR held; held out one set at a time (and on
each `--check` set, and every set of each `--check-lists` file, never fitted: a set made by
`bench_fusion.py` alone, in an index of its own as a user's folder is, held out together with
the same set in the shared index; and the sets of each `--small-lists` file, small folders cut
from a set by `small_beir.py`, grouped as `SET (small)` and held out with SET), what each
floor refuses of the questions with no answer
there and drops of the right first answers, and the set's nDCG@10 in that order next to the
rank fusion's. The same for keyword evidence alone (no embedder, nothing embedded yet): the
keyword list's first result, its score, the list's standout and the held share
(`relevance.KEYWORD_ONLY_*`).
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
from bench_fusion import LIST_FETCH, as_fused, by_relevance, cosines_of, ndcg10, rrf_fused, scale_of

from qmd.server.search.relevance import W_KEYWORD, W_VECTOR, CosineScale, Evidence, standout, terms

FLOORS = (0.015, 0.02, 0.025, 0.04, 0.05, 0.1)
RATIO = W_KEYWORD / W_VECTOR
OWN_INDEX = " (own index)"
"""How the sets of `--check-lists` are named: each was indexed alone, as a user's folder is."""
SMALL = " (small)"
"""How the folders `small_beir.py` cut from a set (`<set>-<size>-<k>`) are named together."""


def evidence(row: dict[str, Any], related: float, unrelated: float) -> tuple[str, list[float]] | None:
    """The default order's first result, and what its relevance reads (`relevance.terms`, the
    one place the formula is written): the order's sum with W_VECTOR as 1, then the terms
    that are the query's (its standouts, its held share); None when nothing was found."""
    lists = as_fused(row)
    order = by_relevance(related, unrelated)(lists)
    if not order:
        return None
    top = order[0]
    keyword = dict(lists["fts"])
    scale = CosineScale(related, unrelated)
    scaled = {d: scale(c) for d, c in cosines_of(lists).items()}
    vector = scaled.get(top, min(scaled.values(), default=0.0))
    read = _values(Evidence(keyword.get(top, 0.0), vector, standout(keyword.values(), scaled.values()), row["held"]))
    return top, [RATIO * read[0] + read[1], *read[2:]]


def keyword_evidence(row: dict[str, Any], related: float, unrelated: float) -> tuple[str, list[float]] | None:
    """Without vector evidence (no embedder, nothing embedded yet) the order is the keyword
    list's: its first result and what `relevance.terms` then reads of it."""
    keyword = row["fts"][:LIST_FETCH]
    if not keyword:
        return None
    return keyword[0][0], _values(Evidence(keyword[0][1], None, standout([s for _, s in keyword], []), row["held"]))


def _values(e: Evidence) -> list[float]:
    return [t.value for t in terms(e)[0]]


def order_evidence(row: dict[str, Any], related: float, unrelated: float) -> tuple[str, list[float]] | None:
    """The rank fusion's first result and its (keyword score, scaled cosine): what the order's
    ratio W_KEYWORD / W_VECTOR was fitted on (stop 46)."""
    lists = as_fused(row)
    fused = rrf_fused(lists)
    if not fused:
        return None
    scale = CosineScale(related, unrelated)
    cosines = cosines_of(lists)
    cosine = cosines.get(fused[0], min(cosines.values(), default=0.0))
    return fused[0], [dict(lists["fts"]).get(fused[0], 0.0), scale(cosine)]


def fit(
    x: np.ndarray, y: np.ndarray, l2: float = 1e-3, steps: int = 6000, rate: float = 0.5, scaled: bool = True
) -> np.ndarray:
    """Logistic regression by gradient descent, on features scaled to a mean size of 1
    (`scaled`), or as they are (how the order was fitted)."""
    size = np.abs(x).mean(axis=0) + 1e-9 if scaled else np.ones(x.shape[1])
    xb = np.hstack([x / size, np.ones((len(x), 1))])
    w = np.zeros(xb.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-xb @ w))
        w -= rate * (xb.T @ (p - y) / len(y) + l2 * np.r_[w[:-1], 0])
    return np.r_[w[:-1] / size, w[-1]]


def fitted(rows: list[tuple[Any, ...]], **how: Any) -> np.ndarray:
    used = [x for x in rows if x[2] or x[1] != "own"]  # an own question answered wrong says nothing either way
    return fit(np.array([x[3] for x in used]), np.array([1.0 if x[2] else 0.0 for x in used]), **how)


def rows_of(lists: list[dict[str, Any]], of: Any, related: float, unrelated: float) -> list[tuple[Any, ...]]:
    """(set, kind, right first answer, features) of each answer with a first result."""
    rows = []
    for r in lists:
        if (e := of(r, related, unrelated)) is None:
            continue
        kind = "off" if r.get("offtopic") else ("own" if r["own"] else "other")
        rows.append((r["set"], kind, kind == "own" and e[0] in r["relevant"], e[1]))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lists", type=Path, required=True)
    ap.add_argument("--check", action="append", default=[], help="a set to check the fits on, never to fit")
    ap.add_argument(
        "--check-lists",
        type=Path,
        action="append",
        default=[],
        help="more lists whose sets are checked, never fitted (a set each in an index of its own; repeatable)",
    )
    ap.add_argument(
        "--small-lists",
        type=Path,
        action="append",
        default=[],
        help="lists of a small folder small_beir.py cut from a set, each indexed alone: checked, never fitted",
    )
    ap.add_argument("--model", help="embed GGUF the lists were made with (default: the shared MiniLM)")
    a = ap.parse_args()
    for given in (a.lists, *a.check_lists, *a.small_lists):
        if not given.is_file():
            sys.exit(f"no lists at {given}: make them with bench/bench_fusion.py ... --lists {given}")
    related, unrelated = scale_of(embed_model_path(a.model))
    print(f"scale: related {related:.4f}, unrelated {unrelated:.4f}")
    lists = json.loads(a.lists.read_text())
    checked = set(a.check)
    for path in a.check_lists:
        more = [{**r, "set": f"{r['set']}{OWN_INDEX}"} for r in json.loads(path.read_text())]
        checked |= {r["set"] for r in more}
        lists += more
    for path in a.small_lists:
        more = [{**r, "set": f"{r['set'].rsplit('-', 2)[0]}{SMALL}"} for r in json.loads(path.read_text())]
        checked |= {r["set"] for r in more}
        lists += more
    if any("held" not in r for r in lists):
        sys.exit("these lists hold no `held` share (made before stop 50): make them again with bench/bench_fusion.py")
    rows = rows_of(lists, evidence, related, unrelated)
    sets = list(dict.fromkeys(x[0] for x in rows))
    fitting = [x for x in rows if x[0] not in checked]
    w = fitted(fitting)
    print(
        f"fitted on {', '.join(s for s in sets if s not in checked)}: W_KEYWORD {w[0] * RATIO:.2f}, "
        f"W_VECTOR {w[0]:.2f}, W_HELD_STANDOUT_KEYWORD {w[1]:.2f}, W_STANDOUT_VECTOR {w[2]:.2f}, "
        f"W_HELD {w[3]:.2f}, BIAS {w[4]:.2f}"
    )
    held_out(rows, fitting, sets)
    alone = rows_of(lists, keyword_evidence, related, unrelated)
    fitting_alone = [x for x in alone if x[0] not in checked]
    wk = fitted(fitting_alone)
    print(
        f"\nkeyword evidence alone (no embedder), fitted likewise: KEYWORD_ONLY_HELD_KEYWORD {wk[0]:.2f}, "
        f"KEYWORD_ONLY_HELD_STANDOUT {wk[1]:.2f}, KEYWORD_ONLY_HELD {wk[2]:.2f}, KEYWORD_ONLY_BIAS {wk[3]:.2f}"
    )
    held_out(alone, fitting_alone, sets)
    print("nDCG@10: the order fitted without the set (its ratio) / the shipped order / rank fusion")
    ordering = [x for x in rows_of(lists, order_evidence, related, unrelated) if x[0] not in checked]
    for held in sets:
        wo = fitted([x for x in ordering if x[0] != held], steps=4000, scaled=False)
        own = [r for r in lists if r["set"] == held and r["own"]]
        ndcg = [
            sum(ndcg10(v(as_fused(r)), r["relevant"]) for r in own) / len(own)
            for v in (by_relevance(related, unrelated, wo[0], wo[1]), by_relevance(related, unrelated), rrf_fused)
        ]
        print(f"{held} | {ndcg[0]:.4f} ({wo[0] / wo[1]:.3f}) / {ndcg[1]:.4f} / {ndcg[2]:.4f}")


def held_out(rows: list[tuple[Any, ...]], fitting: list[tuple[Any, ...]], sets: list[str]) -> None:
    """What each floor refuses and drops on each set, with the weights fitted without it."""
    print("held out: everyday refused / other sets' refused / right first answers dropped (of n)")
    print("set | " + " | ".join(f"floor {f}" for f in FLOORS))
    for held in sets:
        # a set in its own index, or cut small, is held out with the same set in the shared one
        wh = fitted([x for x in fitting if x[0] not in (held, held.removesuffix(OWN_INDEX).removesuffix(SMALL))])
        test = [x for x in rows if x[0] == held]

        def p(e: list[float], wh: np.ndarray = wh) -> float:
            return 1 / (1 + math.exp(-(float(np.dot(wh[:-1], e)) + wh[-1])))

        cells = []
        for f in FLOORS:
            share = [[p(x[3]) < f for x in test if sel(x)] for sel in (_off, _other, _right)]
            cells.append(" / ".join(f"{sum(v) / len(v):.0%}" if v else "-" for v in share))
        print(f"{held} | " + " | ".join(cells) + f" (n {sum(map(_right, test))})")


def _off(x: tuple[Any, ...]) -> bool:
    return bool(x[1] == "off")


def _other(x: tuple[Any, ...]) -> bool:
    return bool(x[1] == "other")


def _right(x: tuple[Any, ...]) -> bool:
    return bool(x[2])


if __name__ == "__main__":
    sys.exit(main())
