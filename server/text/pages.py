"""Pages of a paged document (a PDF's text): the loader joins pages with `PAGE_BREAK`
lines, and pointers, `get` and the MCP tools read the page map back from the body, so a
result can say "page 3, lines 10-14" as a reader with the PDF open finds it."""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

from qmd.server.text.lines import file_lines

PAGE_BREAK = "\f"
"""The line between two pages of a paged body (a form feed: no page's text holds one)."""
PAGED_EXTENSIONS = frozenset({"pdf"})
"""The extensions whose loader writes pages (server/ingest/loaders.py's PDF loader)."""


@dataclass(frozen=True)
class PageSpan:
    """Lines of one page: the page number and the range within that page's text
    (1-based, inclusive), as a reader with the PDF open finds them."""

    page: int
    start_line: int
    end_line: int

    @property
    def lines(self) -> str:
        return f"{self.start_line}-{self.end_line}"


@dataclass(frozen=True)
class Pages:
    """Where each page of a paged body starts, in the body's own line numbers (1-based)."""

    starts: tuple[int, ...]
    total_lines: int

    @classmethod
    def of(cls, path: str, body: str) -> Pages | None:
        """The page map of a paged document's body; None for a document without pages."""
        name = path.rsplit("/", 1)[-1]
        if "." not in name or name.rsplit(".", 1)[-1].lower() not in PAGED_EXTENSIONS:
            return None
        lines = file_lines(body)
        starts = [1] + [i + 2 for i, line in enumerate(lines) if line == PAGE_BREAK]
        return cls(tuple(starts), len(lines))

    @property
    def count(self) -> int:
        return len(self.starts)

    def page_of(self, line: int) -> int:
        """The page a body line is on; a page break line counts as the page it opens."""
        return max(1, min(self.count, bisect_right(self.starts, line + 1)))

    def bounds(self, page: int) -> tuple[int, int]:
        """The body lines (first, last) of `page`, without the break lines around it."""
        first = self.starts[page - 1]
        last = self.starts[page] - 2 if page < self.count else self.total_lines
        return first, last

    def spans(self, start: int, end: int) -> tuple[PageSpan, ...]:
        """Body lines `start`..`end` as page-relative ranges, one per page they touch."""
        out = []
        for page in range(self.page_of(start), self.page_of(end) + 1):
            first, last = self.bounds(page)
            lo, hi = max(start, first), min(end, last)
            if lo <= hi:
                out.append(PageSpan(page, lo - first + 1, hi - first + 1))
        return tuple(out)


_PAGE_SUFFIX = re.compile(r"#page=(\d+)$")


def split_page(name: str) -> tuple[str, int | None]:
    """`report.pdf#page=3` → ("report.pdf", 3): the page an address names, if it names one."""
    m = _PAGE_SUFFIX.search(name)
    if not m or m.start() == 0:
        return name, None
    return name[: m.start()], int(m.group(1))


def describe_pages(spans: tuple[PageSpan, ...]) -> str:
    """Where lines of a paged document are, as a reader turning pages would look:
    `page 3, lines 10-14`, or for a range over many pages its first and last."""
    if len(spans) <= 2:
        return "; ".join(f"page {s.page}, lines {s.lines}" for s in spans)
    first, last = spans[0], spans[-1]
    ends = f"page {first.page} from line {first.start_line}, page {last.page} to line {last.end_line}"
    return f"pages {first.page}-{last.page} ({ends})"
