"""A document's lines as the pointers number them.

A line break ends a line; it does not open one. `notes/a.md` holding `a\\nb\\n` has two
lines, as `wc -l`, an editor and `sed -n 2p` count them, so no surface may show (or let an
agent cite) a third, empty line that `str.split` would invent after the last break.
"""

from __future__ import annotations


def file_lines(body: str) -> list[str]:
    """The lines of `body`; an empty body is one empty line (a window of it still reads)."""
    lines = body.split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines
