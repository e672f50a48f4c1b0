"""Split a document into the passages the embedder reads (spec §7, seeds/001).

A chunk is a pointer as much as a passage: it names `text[start:end]` of the body
and the lines it spans, so a vector hit can be read back at its source. Three rules
shape it, in this order of precedence:

1. **The ceiling.** A chunk never holds more tokens than the embedder reads, counted
   with the model's own tokenizer (`Tokenizer`). An embedder silently drops what lies
   past its trained length, so an over-long chunk is indexed by its opening while its
   full text is served as the passage. What cannot be made to fit (only possible when
   one character is worth more tokens than the budget) is flagged `clipped`.
2. **Smart breaks** (§7.2-7.5). Cuts land on the best markdown boundary near the
   size target (headings over fences over rules over blank lines over list items
   over line ends), never inside a code fence when a boundary outside one exists,
   with 15 % overlap between neighbours.
3. **The floor** (seeds/001 minChars). A short fragment - a trailing heading, a
   preamble sentence - retrieves too well for what it contains, so it is never
   emitted on its own: cuts leave at least `min_chars` of new text, and a short
   tail merges into the chunk before it.

Every chunk is checked before it leaves (`text[start:end] == chunk.text`, full
coverage, ordering): a chunk that cannot be located would produce a citation that
points at the wrong words, so a violation raises `ChunkingError` instead.

Work is linear in the document: break points are scanned only inside each cut's
search window, code fences are kept as one integer per marker, line numbers are
counted incrementally, and `iter_chunks` yields as it goes, so a 100 MB document
never needs its chunks all in memory.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from llama_cpp import Llama

# Part of every vector's fingerprint: change it whenever the chunks produced for the
# same text, budget and tokenizer could change, so stale vectors count as pending.
CHUNKER_VERSION = "qmd-py-chunk-2"

ChunkStrategy = Literal["regex", "auto"]
"""How documents are cut (`--chunk-strategy`, `chunk_strategy` in index.yml): `regex`, the
smart chunker for every file; `auto`, code files at their syntax (`code_chunks`)."""
CHUNK_STRATEGIES: tuple[ChunkStrategy, ...] = ("regex", "auto")
DEFAULT_CHUNK_STRATEGY: ChunkStrategy = "regex"
"""The seed's default: the smart chunker's vectors, and the fingerprint they were made under,
stay as they are; code chunking is opted into per collection or per run."""

# Break-point scores (spec §7.2). Patterns are mutually exclusive at one position,
# except for the plain line end, which every other kind outranks.
SCORES: dict[str, int] = {
    "h1": 100,
    "h2": 90,
    "h3": 80,
    "h4": 70,
    "h5": 60,
    "h6": 50,
    "codeblock": 80,
    "hr": 60,
    "blank": 20,
    "list": 5,
    "numlist": 5,
    "newline": 1,
}
DECAY = 0.7  # §7.4: a break at the window's far edge keeps 30 % of its score
OVERLAP_RATIO = 0.15  # §7.1: 135 of 900 tokens
WINDOW_RATIO = 200 / 900  # §7.1: search window relative to the chunk size

# The first character budget is the measured chars/token of the document times the
# token budget, less this margin, so most chunks fit on the first measurement.
BUDGET_MARGIN = 0.9
SHRINK_MARGIN = 0.95  # §7.6 safeMax: aim a little under the ceiling when shrinking
MAX_SHRINKS = 4  # ratio-guided shrinks before the token-accurate hard cut
SAMPLE_CHARS = 16_384  # prefix measured to estimate chars/token
# A document this many characters per token of budget or shorter is tokenized whole
# for the fast path; longer ones cannot fit (whitespace-only text aside) and skip it.
FAST_PATH_CHARS_PER_TOKEN = 16
MIN_RATIO, MAX_RATIO = 0.25, 8.0  # bounds for chars/token (byte-fallback BPE .. sparse text)
FENCE_MARKER = "\n```"

# One match per "\n": the lookahead classifies it and always succeeds (its last
# alternative is empty), and only the "\n" itself is consumed, so every line end is
# visited once. `blank` fires on the first "\n" of a run only (as `\n\n+` with
# finditer does), and also for CRLF blank lines.
_BREAK = re.compile(
    r"\n(?="
    r"(?P<h>#{1,6})(?!#)"
    r"|(?P<codeblock>```)"
    r"|(?P<hr>(?:---|\*\*\*|___)\s*\n)"
    r"|(?P<blank>(?<!\n\n)(?<!\n\r\n)\r?\n)"
    r"|(?P<list>[-*]\s)"
    r"|(?P<numlist>[0-9]+\.\s)"
    r"|)"
)
_NONBLANK = re.compile(r"\S")
# a line with text that is not an ATX heading: what makes a chunk more than a coordinate
_BODY_LINE = re.compile(r"^(?![ \t]{0,3}#{1,6}(?:[ \t]|\r?$))[^\n]*?\S", re.MULTILINE)
_SPACE = re.compile(r"[^\S\r\n]")  # a word break within a line
_NEWLINES = re.compile(r"[\r\n]*")


class ChunkingError(RuntimeError):
    """The chunker broke its own invariant: a bug, never a property of the input."""


class Tokenizer(Protocol):
    """What the chunker needs from a model: how many tokens it would read for `text`,
    counting the special tokens it adds (e.g. [CLS] and [SEP]), exactly as it will
    be fed at embedding time."""

    def count(self, text: str) -> int: ...


class CharEstimateTokenizer:
    """A character-based estimate, for tests and for embedders whose tokenizer is out
    of reach (a remote endpoint): choose `chars_per_token` conservatively (3 for
    mixed prose and code)."""

    def __init__(self, chars_per_token: float = 4.0, special_tokens: int = 0) -> None:
        if chars_per_token <= 0 or special_tokens < 0:
            raise ValueError("chars_per_token must be > 0 and special_tokens >= 0")
        self.chars_per_token = chars_per_token
        self.special_tokens = special_tokens

    def count(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token) + self.special_tokens


class LlamaTokenizer:
    """Counts tokens with a GGUF model's own vocabulary through llama.cpp.

    `from_model_path` loads the vocabulary only (`vocab_only=True`: no weights, ~35 ms
    and ~7 MB), so the indexer can chunk without loading the embedder itself. Counts
    match `Llama.embed()`, which tokenizes with `add_bos=True, special=False` (for BERT
    that adds [CLS] and [SEP]). Calls are serialised: one llama.cpp object is never
    used by two threads at once (models/README.md).
    """

    def __init__(self, llama: Llama) -> None:
        self._llama = llama
        self._lock = threading.Lock()

    @classmethod
    def from_model_path(cls, path: str | Path) -> LlamaTokenizer:
        from llama_cpp import Llama  # heavy import, needed only when a model is used

        return cls(Llama(model_path=str(path), vocab_only=True, verbose=False))

    def count(self, text: str) -> int:
        # "replace": a lone surrogate cannot be encoded; it would count as one "?"
        data = text.encode("utf-8", "replace")
        with self._lock:
            return len(self._llama.tokenize(data, add_bos=True, special=False))


@dataclass(frozen=True, slots=True)
class BreakPoint:
    pos: int  # index of the "\n" the break sits on; a cut there starts the next chunk with it
    score: int
    kind: str


@dataclass(frozen=True, slots=True)
class Chunk:
    text: str  # == body[start:end], checked
    start: int  # character offsets into the body (code points)
    end: int
    start_line: int  # 1-based, inclusive: the lines holding the chunk's first and last
    end_line: int  # characters other than line breaks
    tokens: int  # as counted by the tokenizer, special tokens included
    clipped: bool  # over the ceiling even after every cut: the embedder reads a prefix


def make_chunk(
    text: str, start: int, end: int, tokens: int, clipped: bool, starts: LineCounter, ends: LineCounter
) -> Chunk:
    """The chunk `text[start:end]`, its lines those of its first and last characters other
    than line breaks (counted by `starts` and `ends`, one counter per edge so each moves
    mostly forward)."""
    piece = text[start:end]
    body = piece.rstrip("\r\n")
    lead = len(body) - len(body.lstrip("\r\n"))
    first = start + lead if body else start
    last = start + len(body) - 1 if body else start
    return Chunk(
        text=piece,
        start=start,
        end=end,
        start_line=starts.at(first),
        end_line=ends.at(last),
        tokens=tokens,
        clipped=clipped,
    )


def scan_break_points(text: str, start: int = 0, end: int | None = None) -> list[BreakPoint]:
    """Break points at the "\\n" positions in `[start, end)`, sorted, one per position
    with the highest score that applies there (§7.2). Patterns may look past `end`."""
    end = len(text) if end is None else end
    first = text.find("\n", start, end)
    if first < 0:
        return []
    last = text.rfind("\n", start, end)
    points: list[BreakPoint] = []
    for m in _BREAK.finditer(text, first):
        kind = m.lastgroup or "newline"
        if kind == "h":
            kind = f"h{len(m.group('h'))}"
        points.append(BreakPoint(m.start(), SCORES[kind], kind))
        if m.start() >= last:  # stop before the engine searches past the range
            break
    return points


class CodeFences:
    """Fenced code regions (§7.3): "\\n```" markers pair up in order; a region runs from
    its opening marker to its closing marker + 4, and an unclosed one to the end of
    the text. Stored as one integer per marker so a hostile document stays small."""

    def __init__(self, text: str) -> None:
        self.length = len(text)
        self.markers = array("q")
        pos = text.find(FENCE_MARKER)
        while pos >= 0:
            self.markers.append(pos)
            pos = text.find(FENCE_MARKER, pos + len(FENCE_MARKER))

    def regions(self) -> list[tuple[int, int]]:
        """`(start, end)` of every region, for inspection."""
        m = self.markers
        return [(m[i], m[i + 1] + len(FENCE_MARKER) if i + 1 < len(m) else self.length) for i in range(0, len(m), 2)]

    def opening(self, pos: int) -> int:
        """Start of the region strictly containing `pos` (`start < pos < end`), or -1."""
        j = bisect.bisect_left(self.markers, pos) - 1
        if j < 0:
            return -1
        if j % 2 == 0:  # after an opening marker whose closing one is at/after pos, or absent
            return self.markers[j]
        return self.markers[j - 1] if pos < self.markers[j] + len(FENCE_MARKER) else -1

    def inside(self, pos: int) -> bool:
        return self.opening(pos) >= 0


def find_best_cutoff(
    points: list[BreakPoint], target: int, window: int, fences: CodeFences | None = None, decay: float = DECAY
) -> int:
    """The break point in `[target - window, target]` outside any fence with the best
    score after squared-distance decay; ties keep the earlier one; none → `target` (§7.4)."""
    best, best_score = target, -1.0
    if window <= 0:
        return target
    for p in points:
        if p.pos < target - window or p.pos > target or (fences is not None and fences.inside(p.pos)):
            continue
        d = (target - p.pos) / window
        score = p.score * (1 - d * d * decay)
        if score > best_score:
            best, best_score = p.pos, score
    return best


def is_fragment(text: str) -> bool:
    """True for text that must not be a chunk's only new content: nothing but
    headings (a coordinate, not a passage) or blank lines."""
    return _BODY_LINE.search(text) is None


class LineCounter:
    """Line numbers by incremental counting: callers move mostly forward, so the total
    work stays linear where `text.count("\\n", 0, pos)` per chunk would be quadratic."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1

    def at(self, pos: int) -> int:
        if pos >= self.pos:
            self.line += self.text.count("\n", self.pos, pos)
        else:
            self.line -= self.text.count("\n", pos, self.pos)
        self.pos = pos
        return self.line


class _Chunker:
    """State of one `iter_chunks` run: the budget derived from the document and the
    tokenizer, the fence index and the line counters."""

    def __init__(
        self, text: str, max_tokens: int, tokenizer: Tokenizer, overlap_ratio: float, min_chars: int | None
    ) -> None:
        self.text = text
        self.n = len(text)
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.specials = tokenizer.count("")
        if max_tokens <= self.specials:
            raise ValueError(f"max_tokens={max_tokens} leaves no room for text after {self.specials} special tokens")
        self.body_tokens = max_tokens - self.specials
        self.fences = CodeFences(text)
        self.starts = LineCounter(text)
        self.ends = LineCounter(text)
        self.overlap_ratio = overlap_ratio
        self.min_chars = min_chars if min_chars is not None else 0
        self.min_chars_default = min_chars is None
        self.set_budget(1, 1)  # placeholder: start() measures the document before any cut

    def set_budget(self, chars: int, tokens: int) -> None:
        """Char budget (and overlap, window) for the next cut from a measured density:
        the document's opening at first, then each chunk for the next one, so a data
        blob and the prose after it are both cut near the ceiling."""
        ratio = min(MAX_RATIO, max(MIN_RATIO, chars / max(1, tokens - self.specials)))
        self.budget = max(1, int(self.body_tokens * ratio * BUDGET_MARGIN))
        self.overlap = int(self.budget * self.overlap_ratio)
        self.window = max(1, int(self.budget * WINDOW_RATIO))

    def count(self, start: int, end: int) -> int:
        return self.tokenizer.count(self.text[start:end])

    def start(self, sample_end: int, tokens: int | None = None) -> None:
        """First budget from the document's opening; the default floor, min(250,
        budget/4) (seeds/001), is fixed from it for the whole document."""
        self.set_budget(sample_end, self.count(0, sample_end) if tokens is None else tokens)
        if self.min_chars_default:
            self.min_chars = min(250, self.budget // 4)

    def clean(self, cut: int, floor: int) -> int:
        """Move a boundary off the middle of a surrogate pair or a CRLF: back by one, or
        forward by one when back would not stay above `floor`."""
        t = self.text
        if 0 < cut < self.n and (
            (t[cut] == "\n" and t[cut - 1] == "\r")
            or ("\udc00" <= t[cut] <= "\udfff" and "\ud800" <= t[cut - 1] <= "\udbff")
        ):
            return cut - 1 if cut - 1 > floor else cut + 1
        return cut

    def best_cut(self, lo: int, target: int, window: int) -> int:
        """Best cut in `[max(lo, target - window), target]`; with no usable break point,
        the start of a fence that `target` falls inside (the fence is kept whole when
        it fits), else the hard target (§7.5). Never below `lo`."""
        points = scan_break_points(self.text, max(lo, target - window), target + 1)
        cut = find_best_cutoff(points, target, window, self.fences)
        if cut == target:
            opening = self.fences.opening(target)
            if opening >= lo:
                cut = opening
        return self.clean(cut, lo - 1)

    def hard_cut(self, pos: int, end: int) -> int:
        """The longest prefix of `[pos, end)` within the ceiling, by binary search on
        the tokenizer's own count (a real offset, which detokenizing an uncased
        word-piece vocabulary could not give), moved back to a word start when one is
        near."""
        lo, hi, best = 1, end - pos - 1, 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if self.count(pos, pos + mid) <= self.max_tokens:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        cut = pos + best
        if not self.text[cut].isspace():
            for i in range(cut - 1, pos + best * 4 // 5, -1):
                if self.text[i].isspace():
                    cut = i + 1
                    break
        return self.clean(cut, pos)

    def fit(self, pos: int, end: int, lo: int) -> tuple[int, int]:
        """Shrink `[pos, end)` until the tokenizer says it fits: first at lower break
        points aimed by the measured overshoot, then token-accurately. Returns the end
        and its token count (still over the ceiling only when one character is)."""
        tokens = self.count(pos, end)
        shrinks = 0
        while tokens > self.max_tokens and end - pos > 1:
            if shrinks < MAX_SHRINKS:
                length = int((end - pos) * self.body_tokens / max(1, tokens - self.specials) * SHRINK_MARGIN)
                target = pos + max(1, min(length, end - pos - 1))
                window = max(1, self.window * (target - pos) // self.budget)
                end = self.best_cut(max(pos + 1, min(lo, target)), target, window)
                shrinks += 1
            else:
                end = self.hard_cut(pos, end)
                tokens = self.count(pos, end)
                break
            tokens = self.count(pos, end)
        return end, tokens

    def next_chunk(self, pos: int, own_start: int) -> tuple[int, int, int]:
        """Start, end and tokens of the chunk from `pos` whose new text starts at
        `own_start`: the best break near the char budget that leaves at least
        `min_chars` of new text, fitted to the token ceiling. Should the overlap leave
        no room for new text under the ceiling, the chunk starts at `own_start`."""
        while True:
            target = min(pos + self.budget, self.n)
            lo = max(pos + 1, own_start + max(1, self.min_chars), self.body_after(own_start, target))
            end = self.best_cut(lo, target, self.window) if target < self.n else self.n
            end, tokens = self.fit(pos, end, lo)
            if end > own_start or pos == own_start:
                return pos, end, tokens
            pos = own_start

    def body_after(self, own_start: int, target: int) -> int:
        """Lowest cut that gives the new text a line of body, so a heading never ends up
        alone ahead of the text it introduces (it leads that chunk instead); 0 when
        the reach holds only headings, as in a table of contents."""
        body = _BODY_LINE.search(self.text, own_start, target)
        return body.start() + 1 if body else 0

    def overlap_start(self, pos: int, end: int) -> int:
        """Start of the next chunk: `overlap` characters back from `end` (§7.5), moved
        forward by at most half the overlap to the start of a non-empty line, else of a
        word, so a chunk does not open mid-word; never at or before the previous start."""
        raw = max(0, end - self.overlap)
        start = self.snap(raw, min(end - 1, raw + self.overlap // 2), end, pos)
        return start if pos < start < end else end

    def snap(self, raw: int, limit: int, end: int, floor: int) -> int:
        """The first start of a non-empty line after a newline in `[raw, limit)`, else
        the first word start there, else `raw` (off a surrogate pair)."""
        nl = self.text.find("\n", raw, limit)
        if nl >= 0:
            newlines = _NEWLINES.match(self.text, nl, end)
            assert newlines is not None  # `[\r\n]*` matches anywhere, if only the empty string
            if (line := newlines.end()) < end:
                return line
        word = _SPACE.search(self.text, raw, limit)
        return word.end() if word else self.clean(raw, floor)

    def tail_start(self, pending: Chunk, pos: int) -> int:
        """Start for a last chunk whose new text is a fragment but cannot merge into the
        previous chunk: a full budget back from the end (a line start when near), so
        the fragment leads into its context instead of standing alone."""
        raw = max(pending.start + 1, self.n - self.budget)
        if raw >= pos:
            return pos
        return min(pos, self.snap(raw, min(pos, raw + self.overlap // 2), self.n, pending.start))

    def make(self, start: int, end: int, tokens: int) -> Chunk:
        return make_chunk(self.text, start, end, tokens, tokens > self.max_tokens, self.starts, self.ends)

    def fragment(self, start: int, end: int) -> bool:
        own = self.text[start:end]
        return len(own.strip()) < self.min_chars or is_fragment(own)

    def run(self) -> Iterator[Chunk]:
        """§7.5's loop with token fitting; one chunk is held back so a short tail can
        still merge into it."""
        pending: Chunk | None = None
        pos = own_start = 0
        while True:
            pos, end, tokens = self.next_chunk(pos, own_start)
            if end < self.n:
                if pending is not None:
                    yield pending
                pending = self.make(pos, end, tokens)
                self.set_budget(end - pos, tokens)
                pos, own_start = self.overlap_start(pos, end), end
                continue
            if pending is not None and self.fragment(own_start, end):
                merged = self.count(pending.start, end)
                if merged <= self.max_tokens:
                    yield self.make(pending.start, end, merged)
                    return
                start = self.tail_start(pending, pos)
                if start < pos and (tokens_back := self.count(start, end)) <= self.max_tokens:
                    pos, tokens = start, tokens_back
            if pending is not None:
                yield pending
            yield self.make(pos, end, tokens)
            return


def verify_chunks(text: str, chunks: Iterable[Chunk]) -> Iterator[Chunk]:
    """Pass `chunks` through, raising `ChunkingError` at the first one that cannot be
    located in `text`, or that leaves a gap, goes backwards or stops short."""
    prev: Chunk | None = None
    for c in chunks:
        problem = None
        if not (0 <= c.start < c.end <= len(text)):
            problem = "offsets out of range"
        elif text[c.start : c.end] != c.text:
            problem = "text[start:end] != chunk.text"
        elif prev is None and c.start != 0:
            problem = "first chunk does not start the document"
        elif prev is not None and not (prev.start < c.start <= prev.end < c.end):
            problem = "chunks out of order, or a gap between them"
        if problem:
            raise ChunkingError(f"chunker invariant violated: {problem} (chunk {c.start}:{c.end} of {len(text)})")
        prev = c
        yield c
    if prev is not None and prev.end != len(text):
        raise ChunkingError(f"chunker invariant violated: chunks end at {prev.end}, the text at {len(text)}")


def check_options(overlap_ratio: float, min_chars: int | None) -> None:
    if not 0 <= overlap_ratio < 0.5:
        raise ValueError("overlap_ratio must be in [0, 0.5)")
    if min_chars is not None and min_chars < 0:
        raise ValueError("min_chars must be >= 0")


def needs_cutting(text: str, max_tokens: int, tokenizer: Tokenizer) -> bool:
    """Whether `text` is more than one chunk: not blank, and over `max_tokens` (a text far
    longer than any chunk is not counted)."""
    if _NONBLANK.search(text) is None:
        return False
    return len(text) > max_tokens * FAST_PATH_CHARS_PER_TOKEN or tokenizer.count(text) > max_tokens


def iter_chunks(
    text: str,
    *,
    max_tokens: int,
    tokenizer: Tokenizer,
    overlap_ratio: float = OVERLAP_RATIO,
    min_chars: int | None = None,
) -> Iterator[Chunk]:
    """Chunks of `text` in order, each within `max_tokens` as `tokenizer` counts them,
    produced lazily so a huge document is never held as chunks all at once.

    `max_tokens` is what the embedder reads for the chunk text, special tokens included
    (256 for all-MiniLM-L6-v2's trained length); a caller that wraps chunks in a prompt
    template subtracts the template's tokens first. `min_chars` defaults to
    `min(250, budget/4)`, the budget being the document's char size of a chunk.

    A blank text has no chunks, and any other that fits is one chunk, whatever it holds
    (a code unit of only `#` comments too); in a longer one, the floor keeps a
    heading-only fragment from standing alone. A markdown *document* of nothing but
    headings has no chunks at all: `split.split`'s rule.

    This is the smart chunker alone; `split.split` also cuts code at its syntax.
    """
    check_options(overlap_ratio, min_chars)
    if _NONBLANK.search(text) is None:
        return
    chunker = _Chunker(text, max_tokens, tokenizer, overlap_ratio, min_chars)
    tokens = tokenizer.count(text) if len(text) <= max_tokens * FAST_PATH_CHARS_PER_TOKEN else None
    if tokens is not None and tokens <= max_tokens:
        yield from verify_chunks(text, [chunker.make(0, len(text), tokens)])
        return
    if tokens is not None:
        chunker.start(len(text), tokens)
    else:
        chunker.start(min(len(text), SAMPLE_CHARS))
    yield from verify_chunks(text, chunker.run())


def chunk_document(
    text: str,
    *,
    max_tokens: int,
    tokenizer: Tokenizer,
    overlap_ratio: float = OVERLAP_RATIO,
    min_chars: int | None = None,
) -> list[Chunk]:
    """All chunks of `text` (see `iter_chunks`)."""
    return list(
        iter_chunks(
            text,
            max_tokens=max_tokens,
            tokenizer=tokenizer,
            overlap_ratio=overlap_ratio,
            min_chars=min_chars,
        )
    )
