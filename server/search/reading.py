"""Reading documents back by name: `get` (a document, a line range or a page of it),
`multi-get` (by glob, names or docids), `ls` (a collection's files).

A pointer is only useful if following it reads exactly the lines it named, so these
answers are shaped here, beside the pointers, from the same document references a search
returns; what they read comes from the index, never from a path on disk
(`store.documents` refuses names outside every collection).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from qmd.paths import DEFAULT_INDEX
from qmd.server.config import Config
from qmd.server.errors import InvalidInput, NotFound, QmdError
from qmd.server.search.pointers import (
    DocumentRef,
    DocumentText,
    Retrieved,
    answer_bytes,
    cap_text,
    document_ref,
    too_large_note,
)
from qmd.server.store import catalog
from qmd.server.store.db import Connection, IndexStore
from qmd.server.store.documents import (
    DocRow,
    find_document,
    glob_documents,
    is_comma_list,
    link_index,
    parse_virtual,
    safe_relpath,
    split_range,
)
from qmd.server.text.frontmatter import MARKDOWN_EXTENSIONS
from qmd.server.text.lines import file_lines, sections
from qmd.server.text.pages import Pages, split_page
from qmd.uri import file_uri, section_in_query, split_section


def get(
    store: IndexStore,
    cfg: Config,
    name: str,
    index: str,
    label: str | None,
    from_line: int | None = None,
    max_lines: int | None = None,
    cwd: str | None = None,
    *,
    full: bool = False,
) -> DocumentText:
    """A document or a line range of it. `name` may end in `:from[:count]`;
    explicit `from_line` / `max_lines` win over that suffix. A paged document (PDF)
    may be addressed by page, `report.pdf#page=3:10:5`: lines counted within that
    page, read from the same body, so both spellings of a pointer read the same text.
    `notes/a.md#getting-started` (a heading's GitHub anchor, or its text) reads that
    section whole, so an agent can widen a pointer to the section it sits in.
    `full` widens a pointer to its whole document (the seed's `get FILE --full`), so an
    agent can pass a result's `file:line` as it is.
    `index` is the name of the index read, `label` the one its links carry."""
    _same_index(name, index)
    name, suffix_from, suffix_count = split_range(name)
    name, page = split_page(name)
    if full:
        if from_line is not None or max_lines is not None:
            raise InvalidInput("--full shows the whole document: drop --from and -l/--lines")
        suffix_from = suffix_count = page = None
    from_line = from_line if from_line is not None else suffix_from
    max_lines = max_lines if max_lines is not None else suffix_count
    if max_lines is not None and max_lines < 1:
        raise InvalidInput("-l/--lines must be at least 1")
    with store.read() as conn:
        doc, anchor, ranged = _find_section(conn, cfg, name, cwd)
    ref = document_ref(doc, cfg, label)
    lines = file_lines(doc.body)
    if anchor is not None:
        if ranged or from_line is not None or max_lines is not None or full:
            raise InvalidInput(
                f"#{anchor} reads a whole section, and a line range (:LINE, --from, -l) or --full reads lines: pick one"
            )
        first, last = _section(doc, ref, anchor)
        return DocumentText(ref, first, last, len(lines), "\n".join(lines[first - 1 : last]))
    pages = Pages.of(doc.path, doc.body)
    first, last, where = 1, len(lines), f"{ref.display_path} has {len(lines)} lines"
    if page is not None:
        if pages is None:
            raise InvalidInput(f"{ref.display_path} has no pages: #page= addresses the pages of a PDF")
        if not 1 <= page <= pages.count:
            raise InvalidInput(f"{ref.display_path} has {pages.count} pages; page {page} does not exist")
        first, last = pages.bounds(page)
        where = f"page {page} of {ref.display_path} has {last - first + 1} lines"
    start = first - 1 + max(1, from_line or 1)
    if start > last:
        # An empty slice numbered from a line that does not exist would read as a real, blank line.
        raise InvalidInput(f"{where}; line {start - first + 1} is past the end")
    end = last if max_lines is None else min(last, start - 1 + max_lines)
    spans = pages.spans(start, end) if pages is not None else ()
    return DocumentText(ref, start, end, len(lines), "\n".join(lines[start - 1 : end]), spans)


SHOWN_ANCHORS = 20
"""The anchors an unknown one's error lists: enough to pick from, not a table of contents."""


def _find_section(conn: Connection, cfg: Config, name: str, cwd: str | None) -> tuple[DocRow, str | None, bool]:
    """The document `name` names, the section anchor it carries (None: the whole name is
    the document's, as in `notes/C#.md`), and whether a line range came with the anchor."""
    base, anchor = split_section(name)
    if not section_in_query(name):
        try:
            return find_document(conn, cfg, name, cwd), None, False
        except NotFound:
            if anchor is None:
                raise
    base, first, _ = split_range(base)  # `a.md:40#intro`; `a.md#intro:40` lost its range before
    return find_document(conn, cfg, base, cwd), anchor, first is not None


def _section(doc: DocRow, ref: DocumentRef, anchor: str) -> tuple[int, int]:
    """The lines (first, last) of the section `anchor` names: its GitHub anchor, or its
    heading's text in any case. Only markdown has headings: a `#` line of code is a comment."""
    if not anchor.strip():
        raise InvalidInput("an empty #anchor names no section: give a heading's anchor, e.g. #getting-started")
    if PurePosixPath(doc.path).suffix.lower().lstrip(".") not in MARKDOWN_EXTENSIONS:
        raise InvalidInput(f"{ref.display_path} is not markdown: #anchor reads a section under a markdown heading")
    found = sections(doc.body)
    wanted = anchor.strip().casefold()
    for s in found:
        if s.anchor == anchor or s.title.casefold() == wanted:
            return s.first, s.last
    if not found:
        raise NotFound(f"{ref.display_path} has no headings, so no section #{anchor}")
    listed = ", ".join(f"#{s.anchor}" for s in found[:SHOWN_ANCHORS])
    more = f" (and {len(found) - SHOWN_ANCHORS} more)" if len(found) > SHOWN_ANCHORS else ""
    raise NotFound(f"{ref.display_path} has no section #{anchor}; its sections: {listed}{more}")


def _same_index(name: str, index: str | None) -> None:
    """Refuse a link into another index: the same path there is another document."""
    linked = link_index(name)
    if linked is not None and linked != index:
        raise InvalidInput(
            f"{name} is a link into index '{linked}', and this request is served by '{index or DEFAULT_INDEX}': "
            "ask that index for it (qmd get follows such links itself)"
        )


def multi_get(
    store: IndexStore,
    cfg: Config,
    pattern: str,
    label: str | None,
    max_bytes: int = 65536,
    max_lines: int | None = None,
    cwd: str | None = None,
) -> list[Retrieved]:
    """Documents by glob, comma-separated names or docids. A listed name that matches
    nothing is an entry with `error`; a document over `max_bytes` is `skipped`."""
    if max_bytes < 1:
        raise InvalidInput("--max-bytes must be at least 1")
    items: list[Retrieved] = []
    with store.read() as conn:
        if is_comma_list(pattern) or (pattern.strip().startswith("#") and "," not in pattern):
            names = [n for n in (p.strip() for p in pattern.split(",")) if n]
            if not names:
                raise InvalidInput(f"no file names in {pattern!r}: give a glob, names joined by commas, or docids")
            docs = []
            for name in names:
                try:
                    _same_index(name, label)
                    docs.append(find_document(conn, cfg, name, cwd))
                except QmdError as e:
                    items.append(Retrieved(name, None, skipped=True, reason=e.message))
        else:
            docs = glob_documents(conn, cfg, pattern)
            if not docs:
                raise NotFound(f"No files matched pattern: {pattern}")
    cap, sent = answer_bytes(), 0
    for doc in docs:
        ref = document_ref(doc, cfg, label)
        size = len(doc.body.encode("utf-8"))
        lines = file_lines(doc.body)
        total = len(lines)
        if size > max_bytes:
            items.append(
                Retrieved(ref.file, ref, size, skipped=True, reason=too_large_note(size, max_bytes), total_lines=total)
            )
            continue
        sent += size
        if sent > cap:
            reason = (
                f"answer size cap reached ({cap_text(cap)}, QMD_MAX_ANSWER_BYTES): "
                "narrow the pattern, or read this one with get"
            )
            items.append(Retrieved(ref.file, ref, size, skipped=True, reason=reason, total_lines=total))
            continue
        # The body is exactly the file's first lines: what was cut is a count beside it,
        # never a note inside it that numbering would take for a line of the file.
        cut = 0 if max_lines is None else max(0, total - max_lines)
        body = "\n".join(lines[: total - cut])
        items.append(Retrieved(ref.file, ref, size, body, total_lines=total, truncated_lines=cut))
    return items


@dataclass(frozen=True)
class ListedFile:
    file: str
    """Its `qmd://` URI, as `get` takes it."""
    path: str
    bytes: int
    modified_at: str
    docid: str


@dataclass(frozen=True)
class Listing:
    """`qmd ls coll/sub`: the files under a folder of a collection (`prefix`, "" for all)."""

    collection: str
    prefix: str
    files: list[ListedFile]


def ls(store: IndexStore, cfg: Config, target: str, label: str | None) -> Listing:
    """The files of a collection, or of a folder in it (`coll/sub`, `qmd://coll/sub`)."""
    virtual = parse_virtual(target)
    if virtual:
        coll_name, prefix = virtual
    else:
        coll_name, _, prefix = target.strip().strip("/").partition("/")
    cfg.get(coll_name)
    prefix = safe_relpath(prefix) if prefix else ""
    with store.read() as conn:
        entries = catalog.list_files(conn, coll_name, prefix)
    files = [
        ListedFile(file_uri(coll_name, e.path, label), e.path, e.bytes, e.modified_at, e.hash[:6]) for e in entries
    ]
    return Listing(coll_name, prefix, files)
