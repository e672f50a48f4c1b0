"""Code files chunked at their syntax: functions, classes and imports (`--chunk-strategy auto`).

A passage cut mid-function embeds half an idea, and its pointer names lines that do not
read on their own. So a code file is parsed with tree-sitter (the `tree-sitter` package
and one grammar package per language) and cut only where a top-level statement starts:
an import, a function, a class, a type. Small neighbours share a chunk up to the token
budget (one short helper per vector would swamp the index); a definition over the
budget is split at its own inner statements (a class at its methods, a function at its
statements), as deep as it takes, and what has no structure left to split is handed to
the smart chunker (`chunking`), the "regex" strategy. Comments and attributes directly
above a definition stay with it, so a doc comment is embedded with what it documents.

Every cut is at the start of a line, so a chunk's line range is whole lines, and chunks
tile the file without overlap except inside a piece the smart chunker split. Token
counts come from the caller's tokenizer (the embedder's own, in the worker), measured
once per piece and once per chunk. A file whose grammar is missing or fails to load is
`GrammarUnavailable`, and the caller chunks it as prose; a file with syntax errors still
parses (tree-sitter recovers), so it is still cut at whatever structure it has.
"""

from __future__ import annotations

import bisect
import functools
import importlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from qmd.server.text.chunking import (
    Chunk,
    LineCounter,
    Tokenizer,
    iter_chunks,
    make_chunk,
)

if TYPE_CHECKING:
    from tree_sitter import Language, Node, Parser

CODE_CHUNKER_VERSION = "qmd-py-code-1"
"""Part of the `auto` strategy's vector-space fingerprint: change it whenever the cuts made
for the same file and budget could change."""

MAX_DEPTH = 12
"""Nesting levels split by syntax before the smart chunker takes over (deeper is data, not code)."""


@dataclass(frozen=True)
class Grammar:
    """One tree-sitter grammar: the package that ships it and the function that returns it."""

    language: str
    package: str
    module: str
    function: str


GRAMMARS: dict[str, Grammar] = {
    g.language: g
    for g in (
        Grammar("python", "tree-sitter-python", "tree_sitter_python", "language"),
        Grammar("typescript", "tree-sitter-typescript", "tree_sitter_typescript", "language_typescript"),
        Grammar("tsx", "tree-sitter-typescript", "tree_sitter_typescript", "language_tsx"),
        Grammar("javascript", "tree-sitter-javascript", "tree_sitter_javascript", "language"),
        Grammar("go", "tree-sitter-go", "tree_sitter_go", "language"),
        Grammar("rust", "tree-sitter-rust", "tree_sitter_rust", "language"),
    )
}

LANGUAGES: dict[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".jsx": "tsx",  # JSX parses with the TSX grammar (spec §7.2), a superset for it
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".go": "go",
    ".rs": "rust",
}
"""File extension (lowercased) → grammar. Everything else, markdown included, is prose."""

GLUE = frozenset({"comment", "line_comment", "block_comment", "attribute_item", "decorator"})
"""Nodes that belong to the definition right below them (doc comments, `#[derive]`, `@decorator`)."""


class GrammarUnavailable(RuntimeError):
    """The file's grammar cannot be used here; the caller chunks the file as prose."""


def language_for(path: str) -> str | None:
    """The grammar for a file name, by extension (case-insensitive); None for prose."""
    return LANGUAGES.get(PurePosixPath(path).suffix.lower())


@dataclass(frozen=True)
class GrammarStatus:
    """Whether one language can be chunked by syntax here, for `qmd status`."""

    language: str
    package: str
    version: str | None
    available: bool
    error: str | None


@functools.cache
def _load(language: str) -> Language | str:
    """A language's grammar, or why it cannot be used: loaded once per process, as a
    failed import is not worth retrying per document (install a grammar, then restart)."""
    grammar = GRAMMARS[language]
    try:
        from tree_sitter import Language

        return Language(getattr(importlib.import_module(grammar.module), grammar.function)())
    except Exception as e:  # an absent package, an ABI the bindings do not read, a broken wheel
        return f"{grammar.package}: {type(e).__name__}: {e}"


def _parser(language: str) -> Parser:
    """A new parser per file: a `Language` is shared, a `Parser` is not (queries chunk on
    several threads), and one costs microseconds."""
    from tree_sitter import Parser

    loaded = _load(language)
    if isinstance(loaded, str):
        raise GrammarUnavailable(loaded)
    return Parser(loaded)


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def grammar_status() -> list[GrammarStatus]:
    """Every supported language: its package, version and whether its grammar loads."""
    out = []
    for g in GRAMMARS.values():
        loaded = _load(g.language)
        error = loaded if isinstance(loaded, str) else None
        out.append(GrammarStatus(g.language, g.package, _version(g.package), error is None, error))
    return out


@functools.cache
def strategy_identity() -> str:
    """What the `auto` strategy's chunks depend on besides the text: this module and the
    grammars that load (a grammar installed or upgraded later cuts differently)."""
    grammars = ",".join(f"{s.language}={s.version}" for s in grammar_status() if s.available)
    return f"{CODE_CHUNKER_VERSION}[{grammars}]"


class _Source:
    """The text with line starts in characters and in UTF-8 bytes: tree-sitter speaks
    bytes and rows, chunks speak characters, and every cut is at a line start, so the
    row is all that needs translating."""

    def __init__(self, text: str) -> None:
        self.text = text
        # surrogatepass: a lone surrogate is 3 bytes without a newline, so rows still agree
        self.data = text.encode("utf-8", "surrogatepass")
        self.chars = _line_starts(text, "\n")
        self.bytes = _line_starts(self.data, b"\n")

    def line_start(self, node: Node) -> int | None:
        """Character offset of the line `node` starts, if only indentation precedes it there."""
        row = node.start_point.row
        if row >= len(self.bytes) or self.data[self.bytes[row] : node.start_byte].strip():
            return None
        return self.chars[row]


def _line_starts(text: str | bytes, newline: str | bytes) -> list[int]:
    starts = [0]
    find = text.find
    pos = find(newline)  # type: ignore[arg-type]  # str with str, bytes with bytes
    while pos >= 0:
        starts.append(pos + 1)
        pos = find(newline, pos + 1)  # type: ignore[arg-type]
    return starts


@dataclass(frozen=True)
class _Piece:
    """A span to embed whole, or (`smart`) a chunk the smart chunker made, kept as it is."""

    start: int
    end: int
    tokens: int
    smart: Chunk | None = None
    unit: int = 0
    """Which cut span the piece is a direct part of (0: the file): pieces pack only with
    their unit's, so a definition cut in pieces opens a chunk with its header and its
    tail never leads into the next definition."""


class _CodeChunker:
    def __init__(self, text: str, max_tokens: int, tokenizer: Tokenizer) -> None:
        self.src = _Source(text)
        self.text = text
        self.max_tokens = max_tokens
        self.tokenizer = tokenizer
        self.specials = tokenizer.count("")
        if max_tokens <= self.specials:
            raise ValueError(f"max_tokens={max_tokens} leaves no room for text after {self.specials} special tokens")
        self.units = itertools.count(1)

    def count(self, start: int, end: int) -> int:
        return self.tokenizer.count(self.text[start:end])

    def segments(self, nodes: list[Node], start: int, end: int) -> list[tuple[int, list[Node]]]:
        """Where `[start, end)`, the text of `nodes`, may be cut, each cut with the nodes
        that start in its segment: at the line starts of the nodes' children (of the
        largest child's, and so on down, while none starts a later line). A child glued
        below a comment or attribute is no cut, nor is one after nothing but blank lines.
        Empty when nothing can be cut."""
        kids = [k for n in nodes for k in n.named_children]
        while kids:
            cuts = [start]
            prev: Node | None = None
            for kid in kids:
                at = self.src.line_start(kid)
                glued = prev is not None and prev.type in GLUE and prev.end_point.row + 1 >= kid.start_point.row
                if at is not None and cuts[-1] < at < end and not glued and self.text[cuts[-1] : at].strip():
                    cuts.append(at)
                prev = kid
            if len(cuts) > 1:
                members: list[list[Node]] = [[] for _ in cuts]
                for kid in kids:
                    members[bisect.bisect_right(cuts, self.src.chars[kid.start_point.row]) - 1].append(kid)
                return list(zip(cuts, members))
            kids = max(kids, key=lambda k: k.end_byte - k.start_byte).named_children
        return []

    def split(self, nodes: list[Node], start: int, end: int, depth: int) -> Iterator[_Piece]:
        """`[start, end)` (the text of `nodes`) as pieces within the budget: whole when it
        fits, else cut at its children's lines, recursively, and by the smart chunker
        where no structure is left to cut at."""
        tokens = self.count(start, end)
        if tokens <= self.max_tokens:
            yield _Piece(start, end, tokens)
            return
        segments = self.segments(nodes, start, end) if depth < MAX_DEPTH else []
        if not segments:
            for c in iter_chunks(self.text[start:end], max_tokens=self.max_tokens, tokenizer=self.tokenizer):
                yield _Piece(start + c.start, start + c.end, c.tokens, c)
            return
        unit = next(self.units) if depth else 0
        ends = [at for at, _ in segments[1:]] + [end]
        for (lo, members), hi in zip(segments, ends):
            for piece in self.split(members, lo, hi, depth + 1):
                yield piece if piece.unit or piece.smart else replace(piece, unit=unit)

    def pack(self, pieces: Iterator[_Piece]) -> Iterator[_Piece]:
        """Neighbouring whole pieces of one unit merged while they fit; a short run (a
        quarter of the budget, like the smart chunker's floor) also leads into the unit
        after it, so a lone `import os` or `class A:` is not a chunk of its own. A merge's
        count is estimated from its pieces' and then measured: one that measures over the
        ceiling (tokens can merge across a join) is cut back to its longest prefix that fits."""
        group: list[_Piece] = []
        estimate = self.specials
        entered: set[int] = set()

        def close() -> Iterator[_Piece]:
            rest = group[:]
            group.clear()
            while rest:
                n, tokens = len(rest), rest[0].tokens
                while n > 1 and (tokens := self.count(rest[0].start, rest[n - 1].end)) > self.max_tokens:
                    n -= 1
                yield _Piece(rest[0].start, rest[n - 1].end, tokens if n > 1 else rest[0].tokens)
                rest = rest[n:]

        for p in pieces:
            fits = estimate + p.tokens - self.specials <= self.max_tokens
            leads_in = p.unit not in entered and estimate - self.specials <= self.max_tokens // 4
            entered.add(p.unit)
            if p.smart is not None or (group and (not fits or (group[-1].unit != p.unit and not leads_in))):
                yield from close()
                estimate = self.specials
            if p.smart is not None:
                yield p
                continue
            group.append(p)
            estimate += p.tokens - self.specials
        yield from close()

    def chunks(self, root: Node) -> Iterator[Chunk]:
        starts, ends = LineCounter(self.text), LineCounter(self.text)
        for p in self.pack(self.split([root], 0, len(self.text), 0)):
            clipped = p.smart.clipped if p.smart is not None else p.tokens > self.max_tokens
            yield make_chunk(self.text, p.start, p.end, p.tokens, clipped, starts, ends)


def chunk_code(text: str, language: str, *, max_tokens: int, tokenizer: Tokenizer) -> Iterator[Chunk]:
    """Chunks of a code file in `language` (a key of `GRAMMARS`) longer than one chunk,
    each within `max_tokens` as `tokenizer` counts them; unchecked (`chunking.iter_chunks`
    verifies them). The file is parsed before this returns, so a grammar that cannot be
    used raises `GrammarUnavailable` here, before any chunk."""
    if language not in GRAMMARS:
        raise GrammarUnavailable(f"no grammar for {language!r}")
    chunker = _CodeChunker(text, max_tokens, tokenizer)
    parser = _parser(language)
    try:
        tree = parser.parse(chunker.src.data)
    except Exception as e:  # the grammar loaded but cannot read this file
        raise GrammarUnavailable(f"{language}: {type(e).__name__}: {e}") from e
    return chunker.chunks(tree.root_node)
