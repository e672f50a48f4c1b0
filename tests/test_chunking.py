"""The chunker (server/text/chunking.py): spec §7 break points, fences and cut-offs, the
token ceiling (estimate and the real MiniLM tokenizer), the minChars floor
(seeds/001), the located-text invariant, and hostile input."""

from __future__ import annotations

import bisect
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MODELS_DIR, SHARED, require

from qmd.server.text.chunking import (
    CHUNKER_VERSION,
    SCORES,
    BreakPoint,
    CharEstimateTokenizer,
    Chunk,
    ChunkingError,
    CodeFences,
    LlamaTokenizer,
    Tokenizer,
    chunk_document,
    find_best_cutoff,
    is_fragment,
    iter_chunks,
    scan_break_points,
    verify_chunks,
)
from qmd.server.text.split import split

EXACT = CharEstimateTokenizer(chars_per_token=1)  # tokens == characters: budgets read as char counts
MINILM_CEILING = 256  # all-MiniLM-L6-v2's trained length, [CLS] and [SEP] included


@pytest.fixture(scope="module")
def minilm() -> LlamaTokenizer:
    path = require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM embedder GGUF (../shared/models)")
    return LlamaTokenizer.from_model_path(path)


def paragraph(rng: random.Random, words: int) -> str:
    vocab = "alpha beta gamma delta vector index chunk search model token fence heading body".split()
    return " ".join(rng.choice(vocab) for _ in range(words)) + "."


def assert_valid(text: str, chunks: list[Chunk], tokenizer: Tokenizer, max_tokens: int) -> None:
    """Everything a chunk sequence must satisfy, recomputed independently (line numbers
    by bisecting the newline offsets, so a 10 MB check stays linear)."""
    newlines = [m.start() for m in re.finditer("\n", text)]
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    for i, c in enumerate(chunks):
        assert text[c.start : c.end] == c.text
        assert c.tokens == tokenizer.count(c.text)
        assert c.clipped == (c.tokens > max_tokens)
        assert not c.clipped, f"chunk {i} over the ceiling: {c.tokens} > {max_tokens}"
        if i:
            prev = chunks[i - 1]
            assert prev.start < c.start <= prev.end < c.end
        for edge in (c.start, c.end):
            if 0 < edge < len(text):
                assert not (text[edge - 1] == "\r" and text[edge] == "\n"), "CRLF split"
                assert not ("\ud800" <= text[edge - 1] <= "\udbff" and "\udc00" <= text[edge] <= "\udfff")
        lead = len(c.text) - len(c.text.lstrip("\r\n"))
        trail = len(c.text) - len(c.text.rstrip("\r\n"))
        first, last = (c.start + lead, c.end - trail - 1) if lead < len(c.text) else (c.start, c.start)
        assert c.start_line == bisect.bisect_left(newlines, first) + 1
        assert c.end_line == bisect.bisect_left(newlines, last) + 1


# --- break points (§7.2) ------------------------------------------------------------


def test_each_heading_level_has_its_score() -> None:
    text = "intro\n# a\n## b\n### c\n#### d\n##### e\n###### f\n####### g\n#tag"
    kinds = [(p.kind, p.score) for p in scan_break_points(text)]
    assert kinds == [
        ("h1", 100),
        ("h2", 90),
        ("h3", 80),
        ("h4", 70),
        ("h5", 60),
        ("h6", 50),
        ("newline", 1),  # seven hashes are not a heading
        ("h1", 100),  # the original's pattern needs no space after '#'
    ]


def test_other_kinds_and_scores() -> None:
    text = "a\n```py\nx\n```\n---\n***  \n___\nb\n\n\nc\n- item\n* item\n12. item\nplain"
    got = {(p.kind, p.score) for p in scan_break_points(text)}
    assert got == {
        ("codeblock", 80),
        ("newline", 1),
        ("hr", 60),
        ("blank", 20),
        ("list", 5),
        ("numlist", 5),
    }
    # a blank run scores once, at its first newline, as `\n\n+` does
    run = [p for p in scan_break_points("b\n\n\nc") if p.kind != "newline"]
    assert [(p.pos, p.kind) for p in run] == [(1, "blank")]


def test_higher_score_wins_at_one_position_and_breaks_are_sorted() -> None:
    text = "x\n## heading\ntext\n\n- a\n1. b\n"
    points = scan_break_points(text)
    positions = [p.pos for p in points]
    assert positions == sorted(set(positions)) == [i for i, ch in enumerate(text) if ch == "\n"]
    assert points[0] == BreakPoint(1, 90, "h2")  # not the plain newline (1) at the same place


def test_crlf_blank_lines_are_paragraph_breaks() -> None:
    points = scan_break_points("a\r\n\r\nb\r\n## c\r\n")
    assert [(p.pos, p.kind) for p in points] == [(2, "blank"), (4, "newline"), (7, "h2"), (13, "newline")]


def test_scan_range_and_lookahead_past_it() -> None:
    text = "aaa\n## b\nccc\n---\nddd"
    assert [p.pos for p in scan_break_points(text, 4, 13)] == [8, 12]
    assert scan_break_points(text, 12, 13)[0].kind == "hr"  # the pattern reads past the range's end
    assert scan_break_points("no newline at all") == []


def test_scan_matches_the_spec_regexes_on_random_documents() -> None:
    """The combined classifier equals §7.2's table applied pattern by pattern (max
    score per position), on LF text where the two definitions coincide."""
    table = [(rf"\n{'#' * k}(?!#)", 110 - 10 * k) for k in range(1, 7)] + [
        (r"\n```", 80),
        (r"(?=\n(?:---|\*\*\*|___)\s*\n)", 60),  # lookahead: every line, not non-overlapping
        (r"\n\n+", 20),
        (r"\n[-*]\s", 5),
        (r"\n[0-9]+\.\s", 5),
        (r"\n", 1),
    ]
    pieces = ["#", "##", "####### x", "```", "---", "*** ", "___", "", "", "- a", "* b", "3. c", "text", "#x", "  "]
    rng = random.Random(7)
    for _ in range(300):
        text = "\n".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        expected: dict[int, int] = {}
        for pattern, score in table:
            for m in re.finditer(pattern, text):
                expected[m.start()] = max(expected.get(m.start(), 0), score)
        assert {p.pos: p.score for p in scan_break_points(text)} == expected, repr(text)


# --- code fences (§7.3) ---------------------------------------------------------------


def test_fences_pair_up_and_an_unclosed_one_extends_to_the_end() -> None:
    text = "a\n```\ncode\n```\nb\n```\nopen"
    fences = CodeFences(text)
    assert fences.regions() == [(1, 14), (16, len(text))]
    assert fences.inside(6) and fences.inside(10) and fences.inside(len(text) - 1)
    assert not fences.inside(0) and not fences.inside(15)


def test_fence_boundaries_are_not_inside() -> None:
    text = "p\n```\nx\n```\nq"
    (start, end), *_ = CodeFences(text).regions()
    fences = CodeFences(text)
    assert not fences.inside(start) and not fences.inside(end)
    assert fences.inside(start + 1) and fences.inside(end - 1)


# --- best cutoff (§7.4) ---------------------------------------------------------------


def test_h2_at_window_edge_beats_blank_at_target() -> None:
    points = [BreakPoint(200, 90, "h2"), BreakPoint(1000, 20, "blank")]
    assert find_best_cutoff(points, 1000, 800) == 200  # 90 * (1 - 0.7) = 27 > 20


def test_no_break_points_means_the_target() -> None:
    assert find_best_cutoff([], 500, 100) == 500
    assert find_best_cutoff([BreakPoint(100, 100, "h1")], 500, 100) == 500  # outside the window
    assert find_best_cutoff([BreakPoint(450, 100, "h1")], 500, 0) == 500


def test_cutoff_skips_break_points_inside_fences() -> None:
    fences = CodeFences("x" * 60 + "\n```" + "y" * 40)
    points = [BreakPoint(20, 1, "newline"), BreakPoint(85, 20, "blank")]
    assert fences.inside(85)
    assert find_best_cutoff(points, 90, 80, fences) == 20
    assert find_best_cutoff(points, 90, 80) == 85  # without fence protection


def test_cutoff_decay_trades_score_against_distance() -> None:
    near = BreakPoint(95, 20, "blank")
    assert find_best_cutoff([BreakPoint(60, 100, "h1"), near], 100, 100) == 60  # 100 * (1 - .16 * .7) > 19.97
    assert find_best_cutoff([BreakPoint(5, 50, "h6"), near], 100, 100) == 95  # 50 * (1 - .9025 * .7) < 19.97


# --- chunking ------------------------------------------------------------------------


def test_small_document_is_one_chunk() -> None:
    text = "# Title\n\nA short note.\n"
    (chunk,) = chunk_document(text, max_tokens=100, tokenizer=EXACT)
    assert chunk == Chunk(text, 0, len(text), 1, 3, len(text), False)


def test_blank_document_has_no_chunks() -> None:
    for text in ("", "   ", "\n\n\r\n\t \n"):
        assert chunk_document(text, max_tokens=50, tokenizer=EXACT) == []


def test_a_document_of_nothing_but_headings_has_no_chunks() -> None:
    """seeds/001: a heading is a coordinate, not a passage, so a note that is only headings
    gives the embedder nothing (keyword search still finds it: tests/test_contextual_chunks.py).
    The rule is the document's (`split`); `iter_chunks` itself, which also cuts code units
    of only `#` comments, chunks any text that is not blank."""
    headings_only = ("# Buy milk\n", "# A\n\n## B\n   \n### C", "".join(f"## heading {i}\n" for i in range(300)))
    for text in headings_only:
        assert list(split(text, max_tokens=50, tokenizer=EXACT)) == []
        assert is_fragment(text) and chunk_document(text, max_tokens=50, tokenizer=EXACT) != []
    (chunk,) = split("# Buy milk\ntoday\n", max_tokens=50, tokenizer=EXACT)
    assert chunk.text == "# Buy milk\ntoday\n"
    assert list(split("    # indented code, not a heading\n", max_tokens=50, tokenizer=EXACT)) != []
    assert list(split("# just a comment\n", max_tokens=50, tokenizer=EXACT, language="python")) != []


def test_large_document_splits_with_overlap() -> None:
    rng = random.Random(1)
    text = "\n\n".join(paragraph(rng, rng.randint(5, 40)) for _ in range(200))
    chunks = chunk_document(text, max_tokens=400, tokenizer=EXACT)
    assert len(chunks) > 10
    assert_valid(text, chunks, EXACT, 400)
    overlaps = [prev.end - c.start for prev, c in zip(chunks, chunks[1:])]
    assert all(o > 0 for o in overlaps)
    assert sum(overlaps) / len(overlaps) > 0.05 * 400
    no_overlap = chunk_document(text, max_tokens=400, tokenizer=EXACT, overlap_ratio=0)
    assert all(prev.end == c.start for prev, c in zip(no_overlap, no_overlap[1:]))


def test_prefers_headings_and_paragraph_breaks() -> None:
    rng = random.Random(2)
    # paragraphs (about 70 characters) are shorter than the search window (120), so a
    # paragraph break is always in reach; each paragraph also has a plain line break
    sections = [
        f"## Section {i}\n\n"
        + "\n\n".join(paragraph(rng, 6) + "\n" + paragraph(rng, 5) for _ in range(rng.randint(1, 5)))
        for i in range(80)
    ]
    text = "# Doc\n\n" + "\n\n".join(sections)
    chunks = chunk_document(text, max_tokens=600, tokenizer=EXACT)
    assert_valid(text, chunks, EXACT, 600)
    kinds = {p.pos: p.kind for p in scan_break_points(text)}
    cut_kinds = [kinds.get(c.end) for c in chunks[:-1]]
    assert all(k in ("h2", "blank") for k in cut_kinds), cut_kinds
    assert cut_kinds.count("h2") > len(cut_kinds) / 3  # a heading wins from farther back


def test_never_splits_inside_code_fences() -> None:
    rng = random.Random(3)
    parts = []
    for i in range(80):
        parts.append(paragraph(rng, rng.randint(10, 30)))
        if i % 3 == 0:
            code = "\n".join(f"    line_{j} = {j}  # comment" for j in range(rng.randint(3, 10)))
            parts.append(f"```python\n{code}\n```")
    text = "\n\n".join(parts)
    fences = CodeFences(text)
    assert max(end - start for start, end in fences.regions()) < 500
    chunks = chunk_document(text, max_tokens=700, tokenizer=EXACT)
    assert_valid(text, chunks, EXACT, 700)
    assert not any(fences.inside(c.end) for c in chunks[:-1])


def test_fence_larger_than_a_chunk_is_cut_and_an_unclosed_fence_runs_to_the_end() -> None:
    code = "\n".join(f"x = {i}" for i in range(400))
    intro = "An introduction long enough to stand as a chunk of its own. " * 2
    for text in (f"{intro}\n```\n{code}\n```\noutro", f"{intro}\n```\n{code}\n"):
        chunks = chunk_document(text, max_tokens=300, tokenizer=EXACT)
        assert_valid(text, chunks, EXACT, 300)
        assert chunks[0].end == text.index("\n```")  # the fence starts a chunk rather than being split early
    assert CodeFences(text).regions() == [(text.index("\n```"), len(text))]


def test_surrogate_pairs_are_never_split() -> None:
    """A str can hold UTF-16 surrogate pairs (e.g. text decoded with surrogatepass):
    no boundary - cut, hard cut or overlap start - falls between the two halves."""
    pair = "\ud83d\ude42"
    for body in (pair * 5000, ("ab" + pair) * 3000, (pair + " ") * 3000):
        for max_tokens in (7, 50, 333):
            chunks = chunk_document(body, max_tokens=max_tokens, tokenizer=EXACT)
            assert_valid(body, chunks, EXACT, max_tokens)


@pytest.mark.slow
def test_real_emoji_and_cjk_stay_whole(minilm: LlamaTokenizer) -> None:
    text = ("混合テキスト🙂 emoji 👩‍💻 and 中文字符 " * 2000).strip()
    chunks = chunk_document(text, max_tokens=MINILM_CEILING, tokenizer=minilm)
    assert_valid(text, chunks, minilm, MINILM_CEILING)


def test_crlf_documents() -> None:
    rng = random.Random(4)
    text = "\r\n\r\n".join(f"## H{i}\r\n" + paragraph(rng, 30) for i in range(100))
    chunks = chunk_document(text, max_tokens=300, tokenizer=EXACT)
    assert_valid(text, chunks, EXACT, 300)
    assert all(not c.text.startswith("\n") for c in chunks)


def test_invariant_on_random_documents() -> None:
    """Property loop: random markdown-ish documents with every hostile ingredient,
    random budgets and tokenizer shapes; every output is valid, and the floor holds:
    a chunk other than the last brings at least `min_chars` of new text, and a short
    or heading-only tail merges backward whenever the merge fits."""
    rng = random.Random(1234)
    pieces = [
        lambda: "# " + paragraph(rng, 3),
        lambda: "### " + paragraph(rng, 2),
        lambda: paragraph(rng, rng.randint(1, 60)),
        lambda: "- " + paragraph(rng, 5),
        lambda: "```\n" + "code();\n" * rng.randint(0, 30) + ("```" if rng.random() < 0.8 else ""),
        lambda: "---",
        lambda: "",
        lambda: "\r\n".join(paragraph(rng, 8) for _ in range(3)),
        lambda: "x" * rng.randint(50, 3000),
        lambda: "nul\x00byte\x00",
        lambda: "🙂" * rng.randint(1, 50) + "\ud83d\ude42" * rng.randint(0, 5),
        lambda: "\n" * rng.randint(2, 20),
        lambda: "1. " + paragraph(rng, 4),
    ]
    for _ in range(400):
        text = "\n".join(rng.choice(pieces)() for _ in range(rng.randint(1, 60)))
        if not text.strip():
            continue
        tok = CharEstimateTokenizer(rng.choice([1, 2.5, 4]), rng.choice([0, 2]))
        max_tokens = rng.randint(10, 400)
        floor = rng.randint(0, int((max_tokens - tok.special_tokens) * tok.chars_per_token * 0.2))
        chunks = chunk_document(text, max_tokens=max_tokens, tokenizer=tok, min_chars=floor)
        assert_valid(text, chunks, tok, max_tokens)
        for prev, c in zip(chunks, chunks[1:-1]):
            assert c.end - prev.end >= floor
        if len(chunks) > 1:
            before = chunks[-2]
            own = text[before.end :]
            if len(own.strip()) < floor or is_fragment(own):
                assert tok.count(text[before.start :]) > max_tokens, "a mergeable tail was left alone"


def test_short_tail_merges_backward() -> None:
    body = "\n\n".join(f"Paragraph {i} " + "word " * 30 for i in range(12))
    text = body + "\n\n## Last\n\nShort end."
    chunks = chunk_document(text, max_tokens=400, tokenizer=EXACT)
    assert_valid(text, chunks, EXACT, 400)
    assert "## Last\n\nShort end." in chunks[-1].text
    assert len(chunks[-1].text) > 100  # the heading and its sentence lead nothing on their own
    assert not any(c.text.strip() in ("## Last", "## Last\n\nShort end.") for c in chunks)


def test_heading_without_body_is_never_alone_even_at_min_chars_zero() -> None:
    body = "\n\n".join(f"Paragraph {i} " + "word " * 30 for i in range(12))
    for tail in ("\n\n## Trailing heading", "\n\n## A\n### B\n"):
        text = body + tail
        chunks = chunk_document(text, max_tokens=400, tokenizer=EXACT, min_chars=0)
        assert_valid(text, chunks, EXACT, 400)
        assert not any(is_fragment(c.text) for c in chunks)
        assert len(chunks[-1].text.strip()) > len(tail.strip())


def test_headings_lead_their_body_within_a_document() -> None:
    """No overlap and no floor, so nothing hides a heading-only chunk: a cut that would
    leave only headings as a chunk's text moves past the first line of body."""
    body = "word " * 20
    for text in (
        f"# Title\n## Intro\n{body}\n{body}",
        f"{body}\n## A\n## B\n{body}\n{body}",
        f"{body}\n" + "".join(f"### H{i}\n" for i in range(8)) + f"{body}\n{body}",
    ):
        for max_tokens in (60, 90, 120, 150):
            chunks = chunk_document(text, max_tokens=max_tokens, tokenizer=EXACT, overlap_ratio=0, min_chars=0)
            assert_valid(text, chunks, EXACT, max_tokens)
            assert not any(is_fragment(c.text) for c in chunks), [c.text for c in chunks]


def test_tail_that_cannot_merge_is_rebalanced() -> None:
    """When the previous chunk is full, merging would break the ceiling (which wins);
    the last chunk then starts a full budget back so the fragment is not alone."""
    # budget 180 chars, no overlap: cuts at 180, 360, then at the heading (531), which
    # leaves the heading alone; the chunk before it plus the heading is over 200
    text = "w" * 530 + "\n\n## " + "End " * 8 + "\n"
    heading = text.index("\n## ")
    chunks = chunk_document(text, max_tokens=200, tokenizer=EXACT, overlap_ratio=0)
    assert_valid(text, chunks, EXACT, 200)
    assert chunks[-2].end == heading and EXACT.count(text[chunks[-2].start :]) > 200
    last = chunks[-1]
    assert last.start < heading and last.end == len(text) and last.tokens <= 200
    assert not is_fragment(last.text)


def test_line_ranges_point_at_the_text() -> None:
    rng = random.Random(5)
    text = "\n".join(paragraph(rng, rng.randint(1, 15)) if rng.random() < 0.8 else "" for _ in range(2000))
    lines = text.split("\n")
    chunks = chunk_document(text, max_tokens=500, tokenizer=EXACT)
    assert_valid(text, chunks, EXACT, 500)
    for c in chunks:
        window = "\n".join(lines[c.start_line - 1 : c.end_line])
        assert c.text.strip("\n") in window


def test_clipped_when_one_character_exceeds_the_ceiling() -> None:
    dense = CharEstimateTokenizer(chars_per_token=0.25)  # every character is 4 tokens
    chunks = chunk_document("abcdef", max_tokens=3, tokenizer=dense)
    assert [c.text for c in chunks] == list("abcdef")
    assert all(c.clipped and c.tokens == 4 for c in chunks)


def test_argument_validation_and_version() -> None:
    assert isinstance(CHUNKER_VERSION, str) and CHUNKER_VERSION
    assert SCORES["h1"] == 100 and SCORES["newline"] == 1
    with pytest.raises(ValueError):
        chunk_document("text", max_tokens=2, tokenizer=CharEstimateTokenizer(4, special_tokens=2))
    with pytest.raises(ValueError):
        chunk_document("text", max_tokens=10, tokenizer=EXACT, overlap_ratio=0.6)
    with pytest.raises(ValueError):
        chunk_document("text", max_tokens=10, tokenizer=EXACT, min_chars=-1)


def test_deterministic() -> None:
    rng = random.Random(6)
    text = "\n\n".join(paragraph(rng, 40) for _ in range(100))
    assert chunk_document(text, max_tokens=300, tokenizer=EXACT) == chunk_document(
        text, max_tokens=300, tokenizer=EXACT
    )


def test_verify_refuses_chunks_that_cannot_be_located() -> None:
    text = "hello world, a small body"
    good = Chunk("hello", 0, 5, 1, 1, 5, False)
    bad_text = Chunk("hellO", 0, 5, 1, 1, 5, False)
    gap = Chunk("small body", 15, len(text), 1, 1, 10, False)
    with pytest.raises(ChunkingError, match=r"text\[start:end\]"):
        list(verify_chunks(text, [bad_text]))
    with pytest.raises(ChunkingError, match="gap"):
        list(verify_chunks(text, [good, gap]))
    with pytest.raises(ChunkingError, match="end at 5"):
        list(verify_chunks(text, [good]))
    with pytest.raises(ChunkingError, match="out of range"):
        list(verify_chunks(text, [Chunk("", 0, 0, 1, 1, 0, False)]))


# --- hostile input --------------------------------------------------------------------


def timed(label: str, chunks: Iterator[Chunk], size: int) -> list[Chunk]:
    started = time.perf_counter()
    out = list(chunks)
    elapsed = time.perf_counter() - started
    print(f"\n{label}: {size / 1e6:.1f} M chars -> {len(out)} chunks in {elapsed:.2f} s")
    return out


def test_one_ten_megabyte_line() -> None:
    text = "".join(random.Random(8).choices("abcdefghijklmnopqrstuvwxyz0123456789+/=", k=10_000_000))
    tok = CharEstimateTokenizer(3, 2)
    chunks = timed("10 MB single line (estimate)", iter_chunks(text, max_tokens=256, tokenizer=tok), len(text))
    assert_valid(text, chunks, tok, 256)


def test_fifty_thousand_headings_unclosed_fences_crlf_and_nul() -> None:
    tok = CharEstimateTokenizer(3, 2)
    docs = {
        "50k headings": "".join(f"{'#' * (i % 6 + 1)} heading {i}\n" for i in range(50_000)),
        "fence markers": "\n```" * 250_000,
        "unclosed fences": "".join(f"text {i}\n```lang\ncode {i}\n" for i in range(20_000)),
        "CRLF": "line of text\r\n\r\n" * 60_000,
        "NUL": ("a\x00b\x00\n" * 1000 + "\x00" * 5000) * 50,
        "blank runs": ("\n" * 5000 + "x") * 200,
    }
    for name, text in docs.items():
        chunks = timed(name, iter_chunks(text, max_tokens=256, tokenizer=tok), len(text))
        assert_valid(text, chunks, tok, 256)


def test_hundred_megabyte_document_streams() -> None:
    unit = "## Section\n\nSome prose for the chunker to cut, with words and lines.\n- item\n\n"
    text = unit * (100_000_000 // len(unit))
    tok = CharEstimateTokenizer(4, 2)
    started = time.perf_counter()
    first = next(iter_chunks(text, max_tokens=256, tokenizer=tok))
    print(f"\n100 MB: first chunk after {time.perf_counter() - started:.3f} s")
    assert first.start == 0
    count, end = 0, 0
    started = time.perf_counter()
    for c in iter_chunks(text, max_tokens=256, tokenizer=tok):
        assert c.start <= end and not c.clipped
        count, end = count + 1, c.end
    print(f"100 MB ({len(text) / 1e6:.0f} M chars): {count} chunks in {time.perf_counter() - started:.2f} s")
    assert end == len(text)


# --- the real tokenizer ---------------------------------------------------------------


@pytest.mark.slow
def test_llama_tokenizer_counts_special_tokens(minilm: LlamaTokenizer) -> None:
    assert minilm.count("") == 2  # [CLS] [SEP]
    assert minilm.count("hello world") == 4
    assert minilm.count("lone \ud800 surrogate") > 2  # counted, not a UnicodeEncodeError
    text = open(require(MODELS_DIR / "README.md", "the models README"), encoding="utf-8").read()
    started = time.perf_counter()
    rounds = 20
    for _ in range(rounds):
        minilm.count(text)
    elapsed = time.perf_counter() - started
    ratio = len(text) / minilm.count(text)
    print(f"\nMiniLM tokenizer: {rounds * len(text) / elapsed / 1e6:.1f} M chars/s, {ratio:.2f} chars/token")


@pytest.mark.slow
def test_real_documents_stay_under_the_minilm_ceiling(minilm: LlamaTokenizer, eval_docs: Path) -> None:
    for path in sorted(eval_docs.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        chunks = chunk_document(text, max_tokens=MINILM_CEILING, tokenizer=minilm)
        assert_valid(text, chunks, minilm, MINILM_CEILING)
        assert max(c.tokens for c in chunks) > 0.6 * MINILM_CEILING or len(chunks) == 1  # chunks fill the budget


@pytest.mark.slow
def test_pathological_blobs_stay_under_the_minilm_ceiling(minilm: LlamaTokenizer) -> None:
    rng = random.Random(9)
    docs = {
        "base64 line": "".join(
            rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", k=300_000)
        ),
        "digits": "".join(rng.choices("0123456789", k=200_000)),
        "punctuation": "".join(rng.choices("!@#$%^&*()[]{};:,.<>/?|", k=100_000)),
        "CJK": "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(50_000)),
        "minified": ",".join(f'{{"k{i}":[{i},{i * 2},"v{i}"]}}' for i in range(20_000)),
        "CRLF and NUL": ("word\x00 " * 50 + "\r\n") * 2000,
        "dense then prose": "".join(rng.choices("xyz0123456789", k=50_000)) + "\n\n" + "plain words here. " * 5000,
    }
    for name, text in docs.items():
        chunks = timed(f"MiniLM {name}", iter_chunks(text, max_tokens=MINILM_CEILING, tokenizer=minilm), len(text))
        assert_valid(text, chunks, minilm, MINILM_CEILING)


@pytest.mark.slow
def test_ten_megabytes_of_markdown_with_the_real_tokenizer(minilm: LlamaTokenizer) -> None:
    spec = open(require(SHARED / "reference" / "qmd-spec.md", "the reference spec"), encoding="utf-8").read()
    text = (spec * (10_000_000 // len(spec) + 1))[:10_000_000]
    count, biggest = 0, 0
    started = time.perf_counter()
    for c in iter_chunks(text, max_tokens=MINILM_CEILING, tokenizer=minilm):
        assert not c.clipped
        count, biggest = count + 1, max(biggest, c.tokens)
    print(f"\n10 MB markdown, MiniLM tokenizer: {count} chunks in {time.perf_counter() - started:.2f} s, max {biggest}")
    assert biggest <= MINILM_CEILING
