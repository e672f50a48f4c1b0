"""A markdown document's ATX headings, outside fenced code, and the path of headings a
position sits under: what a chunk is about when its own text does not say (contextual
chunks, issue 33)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from qmd.server.text.chunking import CodeFences
from qmd.server.text.frontmatter import FRONTMATTER_RE

_HEADING = re.compile(r"^[ \t]{0,3}(#{1,6})(?:[ \t]+(.*?))??(?:[ \t]+#+)?[ \t]*\r?$", re.MULTILINE)
"""An ATX heading: a closing run of `#` counts only after a space (`## C#` is "C#")."""
CONTEXT_VERSION = "qmd-ctx-1"
"""Names how chunk contexts are made (`chunk_context`), in every space's fingerprint: a
change re-embeds, it never mixes vectors made with different contexts."""
CONTEXT_CHARS = 160
"""The most of a heading path a chunk's context carries: a title and two or three levels.
A path is a hint of where a passage sits, not a second passage (past ~40 tokens it would
take the chunk's own share of a 256-token model)."""


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    start: int
    """Offset of the heading line's first character."""


def headings(text: str) -> list[Heading]:
    """The ATX headings of `text` in order; a `#` line inside a code fence is code, and
    one in the frontmatter a YAML comment."""
    fences = CodeFences("\n" + text)  # a fence opening the text is a fence too
    front = FRONTMATTER_RE.match(text)
    found = []
    for m in _HEADING.finditer(text, front.end() if front else 0):
        if fences.inside(m.start()):
            continue
        title = (m.group(2) or "").strip()
        if title:
            found.append(Heading(len(m.group(1)), title, m.start()))
    return found


class HeadingPaths:
    """The headings positions of one document sit under, asked in order (a document's
    chunks): one parse, and the path carried forward, so a document of many headings and
    many chunks costs one pass, not one per chunk."""

    def __init__(self, text: str) -> None:
        self._headings = headings(text)
        self._next = 0
        self._path: list[Heading] = []

    def at(self, pos: int) -> list[str]:
        """Titles of the headings enclosing `pos`, outermost first: the last heading before
        it at each level, less the deeper ones a shallower heading closed."""
        if self._path and pos <= self._path[-1].start:
            self._next, self._path = 0, []  # asked out of order: start over
        while self._next < len(self._headings) and self._headings[self._next].start < pos:
            h = self._headings[self._next]
            while self._path and self._path[-1].level >= h.level:
                self._path.pop()
            self._path.append(h)
            self._next += 1
        return [h.text for h in self._path]


def chunk_context(title: str, path: list[str], text: str) -> str:
    """The context chunk `text` is embedded with: its document's title, then the headings
    it sits under, less what its own opening already says (a first chunk holds the title's
    heading; a first heading repeating the title is said once), cut to `CONTEXT_CHARS`.
    A one-chunk note whose title is its heading is therefore embedded as it always was."""
    opening = text[: CONTEXT_CHARS * 2].casefold()
    parts: list[str] = []
    for p in [title, *path] if title else path:
        if p.casefold() not in opening and (not parts or p.casefold() != parts[-1].casefold()):
            parts.append(p)
    context = " › ".join(parts)
    return context if len(context) <= CONTEXT_CHARS else context[: CONTEXT_CHARS - 1].rstrip() + "…"
