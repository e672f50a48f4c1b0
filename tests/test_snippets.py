"""The passage a pointer names (search/snippets.py): its best line is the first line holding
the most query terms (intent terms count 0.3), however the lines are scored. A property test
against the rule written line by line, on text with case that changes length when lowered
(İ), a final sigma, repeated terms and terms that cross a line break."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from qmd.server.search.snippets import INTENT_WEIGHT, best_passage
from qmd.server.text.lines import file_lines

WORDS = ["alpha", "Beta", "ALPHA beta", "İstanbul", "ΟΔΟΣ", "straße", "x", "", " "]
LINE = st.lists(st.sampled_from(WORDS) | st.text(max_size=6), max_size=6).map(" ".join)
BODY = st.lists(LINE, min_size=1, max_size=25).map("\n".join)
TERMS = st.lists(st.sampled_from([*WORDS, "alpha\nbeta", "i̇stanbul", "οδος", "a", "ss"]), max_size=4)


def first_best(body: str, terms: list[str], intent: list[str], lo: int, hi: int) -> tuple[int, float]:
    """The rule as written before: each line of lo..hi lowered and scored on its own."""
    lines = file_lines(body)
    needles = [t.lower() for t in terms if t]
    extra = [t.lower() for t in intent if t and t.lower() not in needles]
    best, best_score = lo, 0.0
    for i in range(lo, hi):
        low = lines[i].lower()
        score = sum(1 for t in needles if t in low) + INTENT_WEIGHT * sum(1 for t in extra if t in low)
        if score > best_score:
            best, best_score = i, score
    return best, best_score


@settings(max_examples=400, deadline=None)
@given(BODY, TERMS, TERMS, st.integers(1, 30), st.integers(0, 30))
def test_the_best_line_is_the_first_holding_the_most_terms(
    body: str, terms: list[str], intent: list[str], first: int, span: int
) -> None:
    lines = file_lines(body)
    within = (first, first + span)
    lo, hi = max(0, first - 1), min(len(lines), first + span)
    best, score = first_best(body, terms, intent, lo, hi)
    passage = best_passage(body, terms, lines_within=within, intent_terms=intent)
    assert (passage.line, passage.matched) == (best + 1, score > 0)
    whole = best_passage(body, terms, intent_terms=intent)
    best, score = first_best(body, terms, intent, 0, len(lines))
    assert (whole.line, whole.matched) == (best + 1, score > 0)


def test_a_term_is_found_on_its_own_line_only() -> None:
    body = "intro\nthe alpha\nbeta here\nalpha and beta together"
    assert best_passage(body, ["alpha", "beta"]).line == 4
    assert best_passage(body, ["alpha\nbeta"]).matched is False  # no line holds a line break
    assert best_passage(body, ["beta"], lines_within=(1, 2)).line == 1  # not in the region: it opens
