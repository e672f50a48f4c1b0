"""RRF, the blend and identifier detection: pure functions, checked against the formulas of spec §14."""

from __future__ import annotations

import pytest

from qmd.server.search.fusion import RankedList, blend, fuse, max_fused, position_weight
from qmd.server.search.lexical import identifier_tokens, intent_terms


def lst(weight: float, *ids: int, source: str = "fts", kind: str = "original") -> RankedList:
    return RankedList(source, kind, "q", weight, [(d, 1.0 - i / 10) for i, d in enumerate(ids)])  # type: ignore[arg-type]


def test_rrf_contributions_and_bonus_follow_the_spec() -> None:
    fused = fuse([lst(2.0, 1, 2, 3), lst(1.0, 2, 3, source="vec", kind="vec")])
    by = {c.doc_id: c for c in fused}
    assert by[1].base == pytest.approx(2 / 61)
    assert by[1].bonus == 0.05
    assert by[2].base == pytest.approx(2 / 62 + 1 / 61)
    assert by[2].bonus == 0.05  # rank 1 in the second list
    assert by[3].base == pytest.approx(2 / 63 + 1 / 62)
    assert by[3].bonus == 0.02
    assert [c.doc_id for c in fused] == [2, 1, 3]
    assert [c.rrf_rank for c in fused] == [1, 2, 3]
    assert [(k.source, k.query_type, k.rank) for k in by[2].contributions] == [
        ("fts", "original", 2),
        ("vec", "vec", 1),
    ]


def test_fusion_is_a_fraction_of_the_best_possible_score() -> None:
    lists = [lst(2.0, 1, 2), lst(2.0, 1, 3, source="vec")]
    fused = fuse(lists)
    assert fused[0].doc_id == 1 and fused[0].fusion == pytest.approx(1.0)
    assert max_fused(lists) == pytest.approx(4 / 61 + 0.05)
    # a document only one list found is far below 1 even at a good rank
    assert all(c.fusion < 0.6 for c in fused[1:])


def test_empty_lists_do_not_count_toward_the_maximum() -> None:
    lists = [lst(2.0, 7), lst(1.0)]
    assert fuse(lists)[0].fusion == pytest.approx(1.0)
    assert fuse([]) == []


def test_ties_keep_first_seen_order() -> None:
    fused = fuse([lst(1.0, 5), lst(1.0, 9)])
    assert [c.doc_id for c in fused] == [5, 9]


def test_blend_weights_by_position_and_counts_an_unscored_rerank_as_zero() -> None:
    assert [position_weight(r) for r in (1, 3, 4, 10, 11)] == [0.75, 0.75, 0.60, 0.60, 0.40]
    c = fuse([lst(2.0, 1)])[0]
    assert blend(c, 0.8) == (pytest.approx(0.75 * 1.0 + 0.25 * 0.8), 0.75)
    assert blend(c, None)[0] == pytest.approx(0.75)
    # rank 1 with a weak fusion and an irrelevant rerank scores low: thresholdable
    weak = fuse([lst(2.0, 1, 2), lst(2.0, 3, 1), lst(1.0, 3), lst(1.0, 3)])
    low = next(x for x in weak if x.doc_id == 2)
    assert blend(low, 0.0)[0] < 0.3


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("how do I raise money for a startup", ()),
        ("meeting 2026-04-10 notes", ("2026-04-10",)),
        ("release v1.2.3 changes", ("v1.2.3",)),
        ("ABC-123 crash", ("ABC-123",)),
        ("getUserById returns null", ("getUserById",)),
        ("error in src/app.py", ("src/app.py",)),
        ("user_id column", ("user_id",)),
        ("issue #1234", ("#1234",)),
        ("README.md install", ("README.md",)),
        ("real-time sync e-mail", ()),
        ("2 startups", ()),
    ],
)
def test_identifier_tokens(query: str, expected: tuple[str, ...]) -> None:
    assert identifier_tokens(query) == expected


def test_intent_terms_drop_stop_words_and_edge_punctuation() -> None:
    assert intent_terms("Looking for the fundraising notes, (Series-A)!") == ("fundraising", "series-a")
    assert intent_terms(None) == ()
