"""A document's lines as the pointers number them.

A line break ends a line; it does not open one. `notes/a.md` holding `a\\nb\\n` has two
lines, as `wc -l`, an editor and `sed -n 2p` count them, so no surface may show (or let an
agent cite) a third, empty line that `str.split` would invent after the last break.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from qmd.server.text.headings import headings


def file_lines(body: str) -> list[str]:
    """The lines of `body`; an empty body is one empty line (a window of it still reads)."""
    lines = body.split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines


@dataclass(frozen=True)
class Section:
    """A heading and the lines under it, to the next heading of its level or a higher one."""

    anchor: str
    """GitHub's anchor for the heading (`#getting-started`, `-1` on a repeat), without `#`."""
    title: str
    first: int
    """The heading's own line (1-based)."""
    last: int


_DROPPED = re.compile(r"[^\w\- \u0300-\u036f]")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def slug(title: str) -> str:
    """GitHub's anchor of a heading (github-slugger): the rendered text lowercased, every
    character but letters, digits, marks, `-` and `_` dropped, each space a `-`. A link
    renders as its text, so `[b](u)` anchors as `b`."""
    return _DROPPED.sub("", _LINK.sub(r"\1", title).lower()).replace(" ", "-")


def sections(body: str) -> list[Section]:
    """The sections of a markdown body, in order: its ATX headings (`headings.headings`),
    anchored as GitHub anchors them. One pass: a heading closes the open sections of its
    level and deeper."""
    seen: dict[str, int] = {}
    out: list[Section] = []
    open_: list[tuple[int, int]] = []  # (level, index in out) of the sections not yet closed
    line, counted = 1, 0
    for h in headings(body):
        line, counted = line + body.count("\n", counted, h.start), h.start
        while open_ and open_[-1][0] >= h.level:
            i = open_.pop()[1]
            out[i] = replace(out[i], last=line - 1)
        anchor = base = slug(h.text)
        while anchor in seen:  # GitHub's repeats: `a`, `a-1`, `a-2`, never clashing with a real `a-1`
            seen[base] += 1
            anchor = f"{base}-{seen[base]}"
        seen[anchor] = 0
        open_.append((h.level, len(out)))
        out.append(Section(anchor, h.text, line, 0))
    total = len(file_lines(body))
    for _, i in open_:
        out[i] = replace(out[i], last=total)
    return out
