"""The passage a result points at: its best line and a short line range around it.

A result is a pointer (seeds/002): `path:start-end` must name real lines of the
file, so line numbers here are absolute and 1-based, and the snippet text is exactly
those lines.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from operator import add

from qmd.server.text.lines import file_lines

BEFORE = 1
AFTER = 3


@dataclass(frozen=True)
class Passage:
    line: int  # best matching line
    start_line: int
    end_line: int  # inclusive
    total_lines: int
    text: str
    matched: bool  # some query term occurs in the passage


INTENT_WEIGHT = 0.3
"""An intent term counts this much of a query term when picking the line (spec §15.1)."""


def best_passage(
    body: str,
    terms: tuple[str, ...] | list[str],
    max_len: int = 500,
    lines_within: tuple[int, int] | None = None,
    intent_terms: tuple[str, ...] | list[str] = (),
    bounds: tuple[int, int] | None = None,
) -> Passage:
    """Score each line by how many query terms it contains (spec §15.2; intent terms
    count 0.3) and take the first best line, one line before and two after. Long
    passages are cut at `max_len` characters with `...`. `lines_within` (1-based,
    inclusive) keeps the search inside a region, e.g. the chunk a vector search
    matched; with no term there, the passage opens the region. `bounds` is a region
    the passage itself never leaves (a PDF page, which a pointer names)."""
    lines = file_lines(body)
    needles = [t.lower() for t in terms if t]
    extra = [t.lower() for t in intent_terms if t and t.lower() not in needles]
    lo, hi = (
        (0, len(lines)) if lines_within is None else (max(0, lines_within[0] - 1), min(len(lines), lines_within[1]))
    )
    last = len(lines)
    if bounds is not None:
        lo, hi, last = max(lo, bounds[0] - 1), min(hi, bounds[1]), min(last, bounds[1])
    best, best_score = lo, 0.0
    if needles or extra:
        scores = _line_scores(body.lower(), needles, extra, lo, hi)
        if scores:
            best_score = max(scores.values())
            best = min(i for i, score in scores.items() if score == best_score)
    start = max(lo, best - BEFORE) if best_score else best
    end = min(last, best + AFTER)
    text = "\n".join(lines[start:end])
    if len(text) > max_len:
        text = text[: max_len - 3] + "..."
    return Passage(
        line=best + 1,
        start_line=start + 1,
        end_line=end,
        total_lines=len(lines),
        text=text,
        matched=best_score > 0,
    )


def _line_scores(low: str, needles: list[str], extra: list[str], lo: int, hi: int) -> dict[int, float]:
    """Per line of `low` (a lowercased body) in lo..hi holding any term, how many of
    `needles` it holds plus `INTENT_WEIGHT` for each of `extra`: each term found in the
    whole text and its hits mapped to their lines, so a line no term is in costs nothing
    (scoring every line in Python was most of a keyword search's snippets)."""
    if lo >= hi:
        return {}
    lines = low.split("\n")
    starts = list(map(add, accumulate(map(len, lines), initial=0), range(len(lines) + 1)))  # + a newline each
    counts: dict[int, list[int]] = {}
    for kind, terms in enumerate((needles, extra)):
        for term in terms:
            pos = -1 if "\n" in term else low.find(term, starts[lo])  # no line holds a newline
            while pos != -1:
                i = bisect_right(starts, pos) - 1
                if i >= hi:
                    break
                counts.setdefault(i, [0, 0])[kind] += 1
                pos = low.find(term, starts[i + 1])
    return {i: n + INTENT_WEIGHT * e for i, (n, e) in counts.items()}


def passage_window(body: str, passage: Passage, max_chars: int, within: tuple[int, int] | None = None) -> str:
    """The passage grown line by line (after it, then before) to about `max_chars`:
    the text a reranker reads for a candidate, cheap to score and about one topic.
    `within` (1-based, inclusive) keeps it inside a region holding the passage's best
    line, e.g. the function it is in, so the window never reads into the next one."""
    lines = file_lines(body)
    first, last = (0, len(lines)) if within is None else (within[0] - 1, within[1])
    lo, hi = max(first, passage.start_line - 1), min(last, passage.end_line)
    size = sum(len(line) + 1 for line in lines[lo:hi])
    while size < max_chars and (lo > first or hi < last):
        if hi < last:
            size += len(lines[hi]) + 1
            hi += 1
        if lo > first and size < max_chars:
            lo -= 1
            size += len(lines[lo]) + 1
    return "\n".join(lines[lo:hi])[:max_chars]
