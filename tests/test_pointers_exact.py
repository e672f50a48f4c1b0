"""Pointers an agent can cite are exact (issue 31): a numbered line is a line of the file,
with its real number, in every format that numbers lines; notes (a cut, a skip) live
beside the body, never in it; a size note's comparison is true as printed; a context is
one line in the line formats."""

from __future__ import annotations

import csv
import io
import json
import random
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, Env, write
from hypothesis import given, settings
from hypothesis import strategies as st

from qmd.client.formats import Style, context_line, render_document, render_multi_get, render_search
from qmd.server.search.pointers import size_comparison, too_large_note
from qmd.server.text.lines import file_lines

PLAIN = Style(color=False, links=False)

# Line text: anything but a line break (and what XML 1.0 cannot carry, which XML output
# replaces by U+FFFD on purpose; that is not a numbering question).
LINE = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Cn", "Zl", "Zp")), max_size=12)
FILE = st.lists(LINE, min_size=1, max_size=30)  # [""] is an empty file: one empty line
NUMBERED = re.compile(r"(\d+): (.*)", re.S)


def numbered(text: str) -> list[tuple[int, str]]:
    """`n: line` lines back into (n, line), failing on any line that is not numbered."""
    out = []
    for line in text.split("\n"):
        m = NUMBERED.fullmatch(line)
        assert m, f"not a numbered line: {line!r}"
        out.append((int(m[1]), m[2]))
    return out


def window(lines: list[str], first: int, count: int | None) -> list[tuple[int, str]]:
    """The file's lines `first`.. (1-based), `count` of them, with their real numbers."""
    end = len(lines) if count is None else min(len(lines), first - 1 + count)
    return [(n, lines[n - 1]) for n in range(first, end + 1)]


def multi_item(lines: list[str], count: int | None, context: str | None = None) -> dict[str, Any]:
    """A multi-get entry as the daemon sends it: the body is exactly the first lines."""
    kept = lines if count is None else lines[:count]
    return {
        "file": "qmd://notes/a.md",
        "docid": "a1b2c3",
        "collection": "notes",
        "path": "a.md",
        "abs_path": None,
        "title": "A",
        "context": context,
        "modified_at": "",
        "bytes": 1,
        "skipped": False,
        "reason": None,
        "body": "\n".join(kept),
        "total_lines": len(lines),
        "truncated_lines": len(lines) - len(kept),
    }


def fenced(md: str) -> str:
    """The body inside the first Markdown fence of a multi-get section."""
    rows = md.split("\n")
    start = next(i for i, r in enumerate(rows) if re.fullmatch(r"`{3,}", r))
    end = rows.index(rows[start], start + 1)
    return "\n".join(rows[start + 1 : end])


def cli_body(text: str) -> str:
    """The body of a one-document text multi-get: after the header block, before any
    unnumbered note."""
    body = text.split("=" * 60 + "\n\n", 1)[1].rstrip("\n")
    if body.startswith("Folder Context: "):
        context, body = body.split("\n---\n\n", 1)
        assert "\n" not in context
    return body.split("\n\n[... truncated ")[0]


# -- the property, through client/formats.py ---------------------------------------------


@settings(max_examples=200, deadline=None)
@given(lines=FILE, data=st.data())
def test_numbered_multi_get_bodies_are_the_files_lines(lines: list[str], data: st.DataObject) -> None:
    count = data.draw(st.none() | st.integers(1, len(lines) + 3))
    item = multi_item(lines, count)
    expected = window(lines, 1, count)
    cut = len(lines) - len(expected)
    bodies = {}
    cli = render_multi_get([item], "cli", PLAIN, line_numbers=True)[0]
    bodies["cli"] = cli_body(cli)
    assert ("[... truncated" in cli.split("=" * 60)[-1]) == (cut > 0)
    (entry,) = json.loads(render_multi_get([item], "json", PLAIN, line_numbers=True)[0])
    bodies["json"] = entry["body"]
    assert entry.get("truncated_lines", 0) == cut
    rows = list(csv.reader(io.StringIO(render_multi_get([item], "csv", PLAIN, line_numbers=True)[0], newline="")))
    assert rows[0][-1] == "truncated_lines" and rows[1][-1] == str(cut)
    bodies["csv"] = rows[1][5]
    bodies["md"] = fenced(render_multi_get([item], "md", PLAIN, line_numbers=True)[0])
    xml = ET.fromstring(render_multi_get([item], "xml", PLAIN, line_numbers=True)[0].encode())
    bodies["xml"] = xml.findtext("document/body") or ""
    assert int(xml.findtext("document/truncated_lines") or 0) == cut
    for fmt, body in bodies.items():
        assert numbered(body) == expected, fmt


@settings(max_examples=200, deadline=None)
@given(lines=FILE, data=st.data())
def test_numbered_get_is_the_files_window(lines: list[str], data: st.DataObject) -> None:
    first = data.draw(st.integers(1, len(lines)))
    count = data.draw(st.none() | st.integers(1, len(lines) + 3))
    expected = window(lines, first, count)
    doc = multi_item(lines, None, context="Global KB\n\nEval docs")
    doc.update(body="\n".join(line for _, line in expected), from_line=first, to_line=expected[-1][0])
    text = render_document(doc, from_line=first, line_numbers=True, full_path=False, cwd=None)
    head, body = text.split("\n---\n\n", 1)
    assert head == "qmd://notes/a.md  #a1b2c3\nFolder Context: Global KB | Eval docs"
    assert numbered(body.removesuffix("\n")) == expected


# -- notes beside the body, contexts on one line, sizes that compare ----------------------


def test_truncation_is_not_a_numbered_line() -> None:
    item = multi_item([f"line {n}" for n in range(1, 8)], 3)
    text = render_multi_get([item], "cli", PLAIN, line_numbers=True)[0]
    assert text.endswith("1: line 1\n2: line 2\n3: line 3\n\n[... truncated 4 more lines]\n")
    md = render_multi_get([item], "md", PLAIN, line_numbers=True)[0]
    assert "```\n1: line 1\n2: line 2\n3: line 3\n```\n\n_[... truncated 4 more lines]_\n" in md


@pytest.mark.parametrize(
    ("context", "line"),
    [
        ("Global KB\n\nEval docs", "Global KB | Eval docs"),
        ("Global KB\n\nEval docs\n\nAPI notes", "Global KB | Eval docs | API notes"),
        ("one level\nwrapped\r\nover lines", "one level wrapped over lines"),
        ("  padded \n\n\n\n  next  ", "padded | next"),
        ("", ""),
        (None, ""),
    ],
)
def test_context_line(context: str | None, line: str) -> None:
    assert context_line(context) == line


def test_line_formats_keep_one_record_per_line() -> None:
    hit = {
        "file": "qmd://eval/x.md",
        "docid": "762e73",
        "collection": "eval",
        "path": "x.md",
        "abs_path": None,
        "title": "X",
        "context": "Global KB\n\nEval docs",
        "score": 0.93,
        "line": 1,
        "start_line": 1,
        "end_line": 1,
        "total_lines": 1,
        "snippet": "x",
    }
    assert render_search([hit], "files", PLAIN)[0] == '#762e73,0.93,qmd://eval/x.md,"Global KB | Eval docs"\n'
    cli = render_search([hit], "cli", PLAIN)[0]
    assert "Context: Global KB | Eval docs\nScore:" in cli
    # JSON keeps the text, every level and the blank line between them.
    assert json.loads(render_search([hit], "json", PLAIN)[0])[0]["context"] == "Global KB\n\nEval docs"
    item = multi_item(["a"], None, context="Global KB\n\nEval docs")
    assert render_multi_get([item], "files", PLAIN)[0] == '#a1b2c3,qmd://notes/a.md,"Global KB | Eval docs"\n'


@pytest.mark.parametrize(
    ("size", "limit", "text"),
    [
        (3172, 3072, "3.1KB > 3.0KB"),
        (3100, 3072, "3100 bytes > 3072 bytes"),
        (250, 60, "250 bytes > 60 bytes"),
        (73728, 65536, "72KB > 64KB"),
    ],
)
def test_size_comparison(size: int, limit: int, text: str) -> None:
    assert size_comparison(size, limit) == text
    assert too_large_note(size, limit) == f"File too large ({text})"


@given(limit=st.integers(1, 10**9), over=st.integers(1, 10**6))
def test_size_comparison_is_true_as_printed(limit: int, over: int) -> None:
    m = re.fullmatch(r"([\d.]+)(KB| bytes) > ([\d.]+)(KB| bytes)", size_comparison(limit + over, limit))
    assert m and m[2] == m[4]
    assert float(m[1]) > float(m[3]) > 0


# -- end to end: the real CLI and daemon --------------------------------------------------


@pytest.fixture
def random_files(env: Env, daemon: Daemon, tmp_path: Path) -> dict[str, list[str]]:
    rng = random.Random(31)
    words = [
        "alpha",
        "beta",
        "",
        "  indented",
        "# heading",
        "- item",
        "1: looks numbered",
        "[... truncated 9 more lines]",
    ]
    files = {
        f"f{i}.md": [" ".join(rng.choices(words, k=rng.randint(0, 3))) for _ in range(rng.randint(1, 25))]
        for i in range(5)
    }
    for i, lines in enumerate(files.values()):
        lines[0] = f"# first {i}"  # every file has text, and a search for "first" finds them all
        lines[-1] = lines[-1] or "last"  # an empty last line would be only a final line break
    # f0 ends with a line break, which ends its last line and opens none (`wc -l`'s count)
    write(tmp_path / "rand", {name: "\n".join(lines) + "\n" * (name == "f0.md") for name, lines in files.items()})
    env.ok("collection", "add", str(tmp_path / "rand"), "--name", "rand")
    env.ok("context", "add", "/", "Global KB")
    env.ok("context", "add", "qmd://rand", "Eval docs")
    return files


@pytest.mark.slow
def test_cli_numbers_exactly_the_window(env: Env, random_files: dict[str, list[str]]) -> None:
    rng = random.Random(7)
    for name, lines in random_files.items():
        uri = f"qmd://rand/{name}"
        first = rng.randint(1, len(lines))
        count = rng.randint(1, len(lines) + 2)
        out = env.ok("get", uri, "--from", str(first), "-l", str(count))
        head, body = out.split("\n---\n\n", 1)
        assert numbered(body.removesuffix("\n")) == window(lines, first, count), (name, first, count)
        assert head.endswith("\nFolder Context: Global KB | Eval docs")
        count = rng.randint(1, len(lines) + 2)
        expected = window(lines, 1, count)
        cut = len(lines) - len(expected)
        (entry,) = env.json("multi-get", uri, "-l", str(count), "--json")
        assert numbered(entry["body"]) == expected and entry.get("truncated_lines", 0) == cut
        rows = list(csv.reader(io.StringIO(env.ok("multi-get", uri, "-l", str(count), "--csv"), newline="")))
        assert numbered(rows[1][5]) == expected and rows[1][6] == str(cut)
        assert rows[1][3] == "Global KB | Eval docs"
        text = env.ok("multi-get", uri, "-l", str(count))
        assert numbered(cli_body(text)) == expected
        assert text.endswith(f"\n\n[... truncated {cut} more lines]\n" if cut else "\n")


@pytest.mark.slow
def test_cli_notes_and_contexts(env: Env, random_files: dict[str, list[str]]) -> None:
    lines = random_files["f0.md"]
    size = len(("\n".join(lines) + "\n").encode())  # f0 ends with a line break
    (entry,) = env.json("multi-get", "qmd://rand/f0.md", "--max-bytes", str(size - 1), "--json")
    assert entry["skipped"] and entry["reason"].startswith(f"File too large ({size} bytes > {size - 1} bytes)")
    files = env.ok("multi-get", "qmd://rand/*.md", "--files").splitlines()
    assert len(files) == len(random_files)
    assert all(line.endswith(',"Global KB | Eval docs"') for line in files)
    assert env.json("multi-get", "qmd://rand/f0.md", "--json")[0]["context"] == "Global KB\n\nEval docs"
    hits = env.ok("search", "first", "--files").splitlines()
    assert hits and all(line.endswith(',"Global KB | Eval docs"') for line in hits)
    assert "Context: Global KB | Eval docs\nScore:" in env.ok("search", "first")


@pytest.mark.parametrize(
    ("body", "lines"),
    [("a\nb\n", ["a", "b"]), ("a\nb", ["a", "b"]), ("a\n\n", ["a", ""]), ("", [""]), ("\n", [""])],
)
def test_a_final_line_break_opens_no_line(body: str, lines: list[str]) -> None:
    assert file_lines(body) == lines
