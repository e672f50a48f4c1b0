"""Reciprocal Rank Fusion and the rerank blend (spec §14), with scores an agent can threshold.

The original scored the final list by position (`1/rank` blended with the reranker), so
rank 1 always scored at least 0.75 whatever its relevance. Here the position term is the
fused RRF score as a fraction of the best score this set of lists allows (1.0 = first in
every list, with the top-rank bonus), so a document that only one weak list found scores
low even at rank 1. The blend weights stay the original's (§14.3): a small reranker moves
a result within its neighbourhood but cannot pull one from rank 30 to the top.

    fusion  = Σ_lists w / (60 + rank) + bonus, divided by its maximum Σ w / 61 + 0.05
    score   = fusion                                  (no rerank)
    score   = w_pos × fusion + (1 − w_pos) × rerank   (w_pos = 0.75 for RRF ranks 1–3,
                                                       0.60 for 4–10, 0.40 beyond)

`rerank` is in [0, 1]; a candidate the budget left unscored counts 0 there, and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

RRF_K = 60
TOP_BONUS = 0.05
NEAR_TOP_BONUS = 0.02

Source = Literal["fts", "vec"]
QueryType = Literal["original", "lex", "vec", "hyde"]


@dataclass(frozen=True)
class RankedList:
    """One backend's answer to one sub-query, best first (document ids and backend scores)."""

    source: Source
    query_type: QueryType
    query: str
    weight: float
    items: Sequence[tuple[int, float]]


@dataclass(frozen=True)
class Contribution:
    list_index: int
    source: Source
    query_type: QueryType
    query: str
    rank: int  # 1-based
    weight: float
    backend_score: float
    rrf: float


@dataclass
class Candidate:
    doc_id: int
    base: float = 0.0
    bonus: float = 0.0
    top_rank: int = 10**9  # best 1-based rank over the lists
    contributions: list[Contribution] = field(default_factory=list)
    rrf_rank: int = 0  # 1-based position after fusion
    fusion: float = 0.0  # (base + bonus) / best possible, in [0, 1]

    @property
    def total(self) -> float:
        return self.base + self.bonus


def fuse(lists: Sequence[RankedList]) -> list[Candidate]:
    """Weighted RRF over document ids (§14.1), best first; ties keep first-seen order."""
    by_doc: dict[int, Candidate] = {}
    for i, ranked in enumerate(lists):
        for r, (doc_id, backend_score) in enumerate(ranked.items, 1):
            c = by_doc.setdefault(doc_id, Candidate(doc_id))
            rrf = ranked.weight / (RRF_K + r)
            c.base += rrf
            c.top_rank = min(c.top_rank, r)
            c.contributions.append(
                Contribution(i, ranked.source, ranked.query_type, ranked.query, r, ranked.weight, backend_score, rrf)
            )
    best = max_fused(lists)
    out = sorted(by_doc.values(), key=lambda c: -(c.base + _bonus(c.top_rank)))
    for pos, c in enumerate(out, 1):
        c.bonus = _bonus(c.top_rank)
        c.rrf_rank = pos
        c.fusion = min(1.0, c.total / best) if best > 0 else 0.0
    return out


def max_fused(lists: Sequence[RankedList]) -> float:
    """The fused score of a document ranked first in every non-empty list."""
    weights = [ranked.weight for ranked in lists if ranked.items]
    return sum(w / (RRF_K + 1) for w in weights) + TOP_BONUS if weights else 0.0


def _bonus(top_rank: int) -> float:
    if top_rank == 1:
        return TOP_BONUS
    return NEAR_TOP_BONUS if top_rank <= 3 else 0.0


def position_weight(rrf_rank: int) -> float:
    """How much the fused rank counts against the reranker (§14.3)."""
    if rrf_rank <= 3:
        return 0.75
    return 0.60 if rrf_rank <= 10 else 0.40


def blend(candidate: Candidate, rerank: float | None) -> tuple[float, float]:
    """(score, position weight). `rerank` None: the candidate was not scored, so the
    rerank term is 0 (never an invented middle value)."""
    w = position_weight(candidate.rrf_rank)
    return w * candidate.fusion + (1 - w) * (rerank or 0.0), w
