"""Every chunk strategy behind one call: the smart chunker for prose (`chunking`), and for
a code file under `--chunk-strategy auto` its syntax (`code_chunks`), falling back to
prose when the grammar cannot be used here. The worker and a remote embedder both chunk
through `split`, so a document is cut the same way wherever it is embedded."""

from __future__ import annotations

import functools
from collections.abc import Iterator

from qmd.server.text.chunking import (
    OVERLAP_RATIO,
    CharEstimateTokenizer,
    Chunk,
    Tokenizer,
    check_options,
    is_fragment,
    iter_chunks,
    needs_cutting,
    verify_chunks,
)
from qmd.server.text.code_chunks import GrammarUnavailable, chunk_code, language_for


def split(
    text: str,
    *,
    max_tokens: int,
    tokenizer: Tokenizer,
    overlap_ratio: float = OVERLAP_RATIO,
    min_chars: int | None = None,
    language: str | None = None,
) -> Iterator[Chunk]:
    """Chunks of `text` in order (see `chunking.iter_chunks`). `language` (a
    `code_chunks.GRAMMARS` key, the `auto` strategy's choice for a code file) cuts a text
    longer than one chunk at its syntax instead.

    A document of nothing but headings has no chunks (seeds/001: a heading is a
    coordinate, not a passage; keyword search still finds the note by its words).
    """
    check_options(overlap_ratio, min_chars)
    if language is None and is_fragment(text):
        return
    if language is not None and needs_cutting(text, max_tokens, tokenizer):
        try:
            code = chunk_code(text, language, max_tokens=max_tokens, tokenizer=tokenizer)
        except GrammarUnavailable:
            pass
        else:
            yield from verify_chunks(text, code)
            return
    yield from iter_chunks(
        text, max_tokens=max_tokens, tokenizer=tokenizer, overlap_ratio=overlap_ratio, min_chars=min_chars
    )


QUERY_CHARS_PER_TOKEN = 4.0
"""Spec §7.1's character approximation: a query chunks its candidates without the embedder's
tokenizer (§7.7), which lives in the worker and would cost a round trip per candidate."""


def code_unit(text: str, path: str, line: int, max_chars: int) -> tuple[int, int] | None:
    """The lines (1-based, inclusive) of the `auto` chunk of about `max_chars` holding
    `line`: the function, class or import block a query's passage should stay inside.
    None for prose (the smart chunker's cuts are no better than the window's own)."""
    language = language_for(path)
    if language is None:
        return None
    return next((span for span in _unit_lines(text, language, max_chars) if span[0] <= line <= span[1]), None)


@functools.lru_cache(maxsize=64)
def _unit_lines(text: str, language: str, max_chars: int) -> tuple[tuple[int, int], ...]:
    """Every chunk's lines, kept for the candidates of the last queries: a 40 kB file takes
    7 ms to parse and cut, and a query's 40 candidates come back in the next ones."""
    tokenizer = CharEstimateTokenizer(QUERY_CHARS_PER_TOKEN)
    max_tokens = max(1, int(max_chars / QUERY_CHARS_PER_TOKEN))
    chunks = split(text, max_tokens=max_tokens, tokenizer=tokenizer, language=language)
    return tuple((c.start_line, c.end_line) for c in chunks)
