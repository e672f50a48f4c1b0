"""Pointers: what every search result and `get` hands back (seeds/002).

A result is not an answer but a pointer to one: a document (its `qmd://` URI, docid,
collection, path and context) and the line range of its best passage, with the
passage's exact text. Keyword, vector and hybrid search all build their results here,
once, as typed objects; `http.wire` is the one place they become JSON.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from qmd.defaults import CLI_RESULTS, snippet_header
from qmd.server.config import Config
from qmd.server.search.filters import Filter
from qmd.server.search.scope import FilterReport
from qmd.server.search.snippets import best_passage
from qmd.server.store.documents import DocRow
from qmd.server.text.frontmatter import Metadata
from qmd.server.text.pages import Pages, PageSpan
from qmd.uri import file_uri


@dataclass(frozen=True)
class DocumentRef:
    """What names a document, everywhere it is shown."""

    file: str
    """`qmd://collection/path` (plus `?index=NAME` outside the default index)."""
    docid: str
    """The first 6 hex digits of the content hash, without `#`."""
    collection: str
    path: str
    abs_path: str | None
    title: str
    context: str | None
    modified_at: str

    @property
    def display_path(self) -> str:
        """`collection/path`: what MCP results show and what `get` accepts back."""
        return f"{self.collection}/{self.path}"


@dataclass
class Pointer:
    """One result: a document and the line range (1-based, inclusive) worth reading."""

    doc: DocumentRef
    score: float
    line: int
    """The best-matching line."""
    start_line: int
    end_line: int
    total_lines: int
    snippet: str
    """The passage: exactly lines `start_line`..`end_line` of the document."""
    body: str | None = None
    """The whole document, when the caller asked for it (`--full`)."""
    terms: tuple[str, ...] = ()
    """The query terms, for highlighting."""
    fusion: float | None = None
    """Hybrid query: the fused rank score (1.0 = first in every list)."""
    rerank: float | None = None
    """Hybrid query: the reranker's relevance, None when it did not score this one."""
    relevance: float | None = None
    """Hybrid query: the probability that this result is relevant (search/relevance.py)."""
    explain: dict[str, Any] | None = None
    """Why it ranked where it did (`--explain`): a trace, shaped by the stage that made it."""
    metadata: Metadata = field(default_factory=dict)
    """The document's indexed metadata (`qmd: metadata:`), empty when it has none."""
    page: PageSpan | None = None
    """A paged document (PDF): the page the passage is on and its lines within that page."""

    @property
    def lines(self) -> str:
        return f"{self.start_line}-{self.end_line}"

    def numbered_snippet(self) -> str:
        """The passage under its `@@` header, each line numbered with its real line number."""
        lines = self.snippet.split("\n")
        body = "\n".join(f"{self.start_line + i}: {line}" for i, line in enumerate(lines))
        return snippet_header(self.start_line, len(lines), self.total_lines) + "\n" + body


@dataclass(frozen=True)
class SearchOptions:
    """How a keyword or vector search is scoped and cut, whoever asks for it."""

    collections: list[str] | None = None
    """None: every collection included by default."""
    limit: int = CLI_RESULTS
    min_score: float = 0.0
    all_results: bool = False
    """Every result above `min_score`, whatever `limit` says."""
    full: bool = False
    """Whole documents in `Pointer.body`."""
    explain: bool = False
    max_len: int = 500
    """Longest passage, in characters."""
    filter: Filter | None = None
    """Only documents whose metadata satisfies it."""
    fuzzy: bool = False
    """Search a word no document holds as its nearest indexed word, saying so (search/typos.py)."""


@dataclass
class SearchOutcome:
    """Keyword or vector search: the pointers, and everything the caller must be told."""

    hits: list[Pointer]
    below_min_score: bool = False
    """There were results, but none reached `min_score`."""
    warnings: list[str] = field(default_factory=list)
    terms: tuple[str, ...] = ()
    degraded: bool = False
    """A vector search that could not run answered with keyword results."""
    filter: FilterReport | None = None
    """Under a filter: how much of the scope it could see and admitted."""


DEFAULT_ANSWER_BYTES = 16 * 1024 * 1024


def answer_bytes() -> int:
    """The most text one answer carries (`QMD_MAX_ANSWER_BYTES`, default 16 MiB): `--all
    --full` over a big collection would otherwise build hundreds of megabytes in the
    daemon, hold them, and send them."""
    raw = os.environ.get("QMD_MAX_ANSWER_BYTES", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_ANSWER_BYTES


def cap_text(cap: int) -> str:
    """The answer cap as a note says it: whole MiB when exact, else exact bytes."""
    mib = 1024 * 1024
    return f"{cap // mib} MiB" if cap % mib == 0 else f"{cap} bytes"


def within_answer(pointers: Iterable[Pointer], total: int) -> tuple[list[Pointer], str | None]:
    """The pointers (built lazily, best first) that fit the answer's byte cap, and the
    warning that says where it was cut, if it was; `total` is how many there are."""
    cap, used = answer_bytes(), 0
    kept: list[Pointer] = []
    for p in pointers:
        used += len(p.snippet.encode()) + (len(p.body.encode()) if p.body is not None else 0)
        if used > cap and kept:
            return kept, (
                f"answer cut at {len(kept)} of {total} results: it would exceed {cap_text(cap)}"
                " (QMD_MAX_ANSWER_BYTES); lower the limit, drop --full, or narrow the query"
            )
        kept.append(p)
    return kept, None


def size_comparison(size: int, limit: int) -> str:
    """`size > limit` in units that keep the comparison true when printed: KB rounded to
    0, then 1 decimal, and exact bytes when even that reads as equal (or the limit is
    under a KB), so a note never says `3KB > 3KB` or `0KB > 0KB`. The one helper every
    size note (CLI, HTTP and MCP alike) is made with."""
    for digits in (0, 1) if limit >= 1024 else ():  # under a KB, bytes say it plainly
        a, b = f"{size / 1024:.{digits}f}", f"{limit / 1024:.{digits}f}"
        if float(a) > float(b):
            return f"{a}KB > {b}KB"
    return f"{size} bytes > {limit} bytes"


def too_large_note(size: int, limit: int) -> str:
    """Why a document over a byte limit was left out: `File too large (… > …)`."""
    return f"File too large ({size_comparison(size, limit)})"


def document_ref(doc: DocRow, config: Config, index_name: str | None) -> DocumentRef:
    coll = config.collections.get(doc.collection)
    return DocumentRef(
        file=file_uri(doc.collection, doc.path, index_name),
        docid=doc.hash[:6],
        collection=doc.collection,
        path=doc.path,
        abs_path=str(coll.root / doc.path) if coll else None,
        title=doc.title,
        context=config.context_for(doc.collection, doc.path),
        modified_at=doc.modified_at,
    )


def point_at(
    doc: DocRow,
    score: float,
    config: Config,
    terms: tuple[str, ...],
    *,
    full: bool,
    index_name: str | None,
    max_len: int = 500,
    explain: dict[str, Any] | None = None,
    lines_within: tuple[int, int] | None = None,
    intent_terms: tuple[str, ...] = (),
) -> Pointer:
    """A pointer at `doc`'s best passage for `terms` (inside `lines_within`, when a
    vector hit names the chunk that matched). In a paged document the passage stays on
    the page of its best line, so the pointer can name one page and lines on it."""
    passage = best_passage(doc.body, terms, max_len=max_len, lines_within=lines_within, intent_terms=intent_terms)
    page = None
    pages = Pages.of(doc.path, doc.body)
    if pages is not None:
        bounds = pages.bounds(pages.page_of(passage.line))
        passage = best_passage(
            doc.body, terms, max_len=max_len, lines_within=lines_within, intent_terms=intent_terms, bounds=bounds
        )
        page = pages.spans(passage.start_line, passage.end_line)[0]
    return Pointer(
        doc=document_ref(doc, config, index_name),
        score=score,
        line=passage.line,
        start_line=passage.start_line,
        end_line=passage.end_line,
        total_lines=passage.total_lines,
        snippet=passage.text,
        body=doc.body if full else None,
        terms=terms,
        explain=explain,
        metadata=doc.metadata,
        page=page,
    )


@dataclass(frozen=True)
class DocumentText:
    """`get`: a document, or the line range of it that was asked for (1-based, inclusive)."""

    doc: DocumentRef
    from_line: int
    to_line: int
    total_lines: int
    body: str
    pages: tuple[PageSpan, ...] = ()
    """A paged document (PDF): the pages these lines are on, with their lines within each."""


@dataclass(frozen=True)
class Retrieved:
    """One entry of `multi_get`: a document's text, or why it was left out."""

    name: str
    """The document's `qmd://` URI, or the name as asked when it matched nothing."""
    doc: DocumentRef | None
    """None when `name` matched no document."""
    bytes: int = 0
    body: str | None = None
    skipped: bool = False
    reason: str | None = None
    """Why it was skipped (or matched nothing): never part of `body`."""
    total_lines: int | None = None
    """The document's line count; None when it matched nothing."""
    truncated_lines: int = 0
    """Lines after `body` left out by `max_lines`: `body` is exactly the first lines."""

    @property
    def error(self) -> bool:
        """`name` matched no document; `reason` says why."""
        return self.doc is None
