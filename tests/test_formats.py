"""Tests for client/formats.py: every output format of search, multi-get and get."""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from qmd.client.formats import (
    DEFAULT_EDITOR_URI,
    FORMATS,
    Style,
    add_line_numbers,
    editor_link,
    full_path_warning,
    osc8,
    render_document,
    render_multi_get,
    render_search,
    resolve_full_path,
)
from qmd.defaults import snippet_header

PLAIN = Style(color=False, links=False)
COLOR = Style(color=True, links=False)
TTY = Style(color=True, links=True)

WARN_ONE = (
    "warning: --full-path could not resolve the file on disk (moved or deleted since "
    "indexing); showing qmd:// + docid instead. Run 'qmd update' to refresh the index."
)


def make_hits(tmp_path: Path) -> list[dict[str, Any]]:
    """Three hits: a strong match with context, a mid one without, a weak one with explain."""
    notes = tmp_path / "notes"
    (notes / "dir").mkdir(parents=True)
    a = notes / "dir" / "a.md"
    b = notes / "b.md"
    a.write_text("x\n")
    b.write_text("x\n")
    return [
        {
            "docid": "a1b2c3",
            "score": 0.8312,
            "file": "qmd://notes/dir/a.md",
            "collection": "notes",
            "path": "dir/a.md",
            "abs_path": str(a),
            "title": "Raising money",
            "context": "Fundraising notes",
            "line": 42,
            "start_line": 41,
            "end_line": 44,
            "total_lines": 120,
            "snippet": "intro\nHow to Raise money fast\nmore\nend",
            "body": None,
            "terms": ["raise", "money"],
            "explain": None,
        },
        {
            "docid": "d4e5f6",
            "score": 0.45,
            "file": "qmd://notes/b.md",
            "collection": "notes",
            "path": "b.md",
            "abs_path": str(b),
            "title": "B",
            "context": None,
            "line": 2,
            "start_line": 1,
            "end_line": 3,
            "total_lines": 3,
            "snippet": "# B\nnothing here\nbye",
            "body": None,
            "terms": ["zebra"],
            "explain": None,
        },
        {
            "docid": "0a0b0c",
            "score": 0.2,
            "file": "qmd://notes/gone.md?index=work",
            "collection": "notes",
            "path": "gone.md",
            "abs_path": str(notes / "gone.md"),
            "title": "Gone",
            "context": None,
            "line": 7,
            "start_line": 6,
            "end_line": 7,
            "total_lines": 9,
            "snippet": "six\nseven",
            "body": None,
            "terms": ["seven"],
            "explain": {
                "ftsScores": [0.892, 0.907],
                "vectorScores": [],
                "rrf": {
                    "rank": 1,
                    "positionScore": 1.0,
                    "weight": 0.75,
                    "baseScore": 0.123,
                    "topRankBonus": 0.05,
                    "totalScore": 0.173,
                    "contributions": [
                        {"source": "fts", "queryType": "lex", "rank": 1, "rrfContribution": 0.0164},
                        {"source": "fts", "queryType": "original", "rank": 1, "rrfContribution": 0.0328},
                        {"source": "vec", "queryType": "original", "rank": 2, "rrfContribution": 0.0323},
                        {"source": "vec", "queryType": "vec", "rank": 9, "rrfContribution": 0.001},
                    ],
                },
                "rerankScore": 0.81,
                "blendedScore": 0.9525,
            },
        },
    ]


@pytest.fixture
def hits(tmp_path: Path) -> list[dict[str, Any]]:
    return make_hits(tmp_path)


def with_bodies(hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same hits as the daemon returns them for --full."""
    out = copy.deepcopy(hits)
    for h in out:
        h["body"] = "first\nsecond\nthird"
    return out


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def test_add_line_numbers() -> None:
    assert add_line_numbers("a\nb") == "1: a\n2: b"
    assert add_line_numbers("a\nb", 41) == "41: a\n42: b"
    assert add_line_numbers("") == ""


def test_snippet_header_arithmetic() -> None:
    assert snippet_header(41, 4, 120) == "@@ -41,4 @@ (40 before, 76 after)"
    assert snippet_header(1, 1, 1) == "@@ -1,1 @@ (0 before, 0 after)"
    assert snippet_header(2, 4, 77) == "@@ -2,4 @@ (1 before, 72 after)"


def test_osc8_exact_bytes() -> None:
    assert osc8("vscode://file/a:1:1", "a.md") == "\x1b]8;;vscode://file/a:1:1\x07a.md\x1b]8;;\x07"


def test_editor_link_placeholders() -> None:
    link = editor_link("/home/u/a b/c.md", 42, DEFAULT_EDITOR_URI)
    assert link == "vscode://file//home/u/a%20b/c.md:42:1"
    assert editor_link("/x/what?#1.md", 3, "ed://{path}?l={line}&c={column}&k={col}") == (
        "ed:///x/what%3F%231.md?l=3&c=1&k=1"
    )
    assert editor_link("/x/ü%{line}.md", 0, "{path}:{line}") == "/x/%C3%BC%25%7Bline%7D.md:1"
    assert editor_link("/x/a.md", -5, "{path}:{line}") == "/x/a.md:1"
    # encodeURI keeps its reserved set.
    kept = "/a;b,c:d@e&f=g+h$i!j*k'l(m)~_.-"
    assert editor_link(kept, 1, "{path}") == kept


class FakeStream:
    def __init__(self, tty: bool) -> None:
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_style_detect_tty_and_no_color() -> None:
    assert Style.detect(FakeStream(True), {}) == Style(True, True, DEFAULT_EDITOR_URI)
    assert Style.detect(FakeStream(False), {}) == Style(False, False, DEFAULT_EDITOR_URI)
    no_color = Style.detect(FakeStream(True), {"NO_COLOR": "1"})
    assert (no_color.color, no_color.links) == (False, True)
    # An empty NO_COLOR does not disable colour (no-color.org).
    assert Style.detect(FakeStream(True), {"NO_COLOR": ""}).color is True


def test_style_detect_editor_uri_precedence() -> None:
    stream = FakeStream(True)
    assert Style.detect(stream, {}, editor_uri="cfg://{path}").editor_uri == "cfg://{path}"
    env = {"QMD_EDITOR_URI": " env://{path} "}
    assert Style.detect(stream, env, editor_uri="cfg://{path}").editor_uri == "env://{path}"
    blank = Style.detect(stream, {"QMD_EDITOR_URI": "  "}, editor_uri="  ")
    assert blank.editor_uri == DEFAULT_EDITOR_URI


def test_unknown_format_rejected(hits: list[dict[str, Any]]) -> None:
    assert FORMATS == ("cli", "json", "csv", "md", "xml", "files")
    with pytest.raises(ValueError):
        render_search(hits, "yaml", PLAIN)
    with pytest.raises(ValueError):
        render_multi_get([], "yaml", PLAIN)


# ---------------------------------------------------------------------------
# Search: empty results
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("json", "[]\n"),
        ("csv", "docid,score,file,title,context,line,snippet\n"),
        ("xml", "<results></results>\n"),
        ("md", ""),
        ("files", ""),
        ("cli", "No results found.\n"),
    ],
)
def test_search_empty(fmt: str, expected: str) -> None:
    assert render_search([], fmt, PLAIN) == (expected, [])


def test_search_empty_below_min_score() -> None:
    assert render_search([], "cli", PLAIN, below_min_score=True) == (
        "No results found above minimum score threshold.\n",
        [],
    )
    assert render_search([], "json", PLAIN, below_min_score=True) == ("[]\n", [])
    assert render_search([], "files", PLAIN, below_min_score=True) == ("", [])


# ---------------------------------------------------------------------------
# Search: json
# ---------------------------------------------------------------------------


def test_search_json(hits: list[dict[str, Any]]) -> None:
    text, warnings = render_search(hits, "json", PLAIN)
    assert warnings == []
    assert text.startswith('[\n  {\n    "docid"')  # pretty, 2-space indent
    data = json.loads(text)
    assert data[0] == {
        "docid": "#a1b2c3",
        "score": 0.83,
        "file": "qmd://notes/dir/a.md",
        "line": 42,
        "lines": "41-44",
        "title": "Raising money",
        "context": "Fundraising notes",
        "snippet": "@@ -41,4 @@ (40 before, 76 after)\nintro\nHow to Raise money fast\nmore\nend",
    }
    assert list(data[0]) == ["docid", "score", "file", "line", "lines", "title", "context", "snippet"]
    assert "context" not in data[1]
    assert "explain" not in data[1]
    assert data[2]["file"] == "qmd://notes/gone.md?index=work"
    assert data[2]["explain"]["rrf"]["rank"] == 1
    assert data[1]["score"] == 0.45


def test_search_json_score_rounds_half_up(hits: list[dict[str, Any]]) -> None:
    hits[0]["score"] = 0.125
    assert json.loads(render_search(hits[:1], "json", PLAIN)[0])[0]["score"] == 0.13


def test_search_json_line_numbers_are_real(hits: list[dict[str, Any]]) -> None:
    data = json.loads(render_search(hits, "json", PLAIN, line_numbers=True)[0])
    assert data[0]["snippet"].split("\n") == [
        "@@ -41,4 @@ (40 before, 76 after)",
        "41: intro",
        "42: How to Raise money fast",
        "43: more",
        "44: end",
    ]
    assert data[0]["line"] == 42


def test_search_json_full(hits: list[dict[str, Any]]) -> None:
    data = json.loads(render_search(with_bodies(hits), "json", PLAIN, full=True)[0])
    assert data[0]["body"] == "first\nsecond\nthird"
    assert "snippet" not in data[0]
    assert data[0]["line"] == 42 and data[0]["lines"] == "41-44"
    numbered_text, _ = render_search(with_bodies(hits), "json", PLAIN, full=True, line_numbers=True)
    numbered = json.loads(numbered_text)
    assert numbered[0]["body"] == "1: first\n2: second\n3: third"


# ---------------------------------------------------------------------------
# Search: csv
# ---------------------------------------------------------------------------


def parse_csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def test_search_csv(hits: list[dict[str, Any]]) -> None:
    rows = parse_csv(render_search(hits, "csv", PLAIN)[0])
    assert rows[0] == ["docid", "score", "file", "title", "context", "line", "snippet"]
    assert rows[1] == [
        "#a1b2c3",
        "0.8312",
        "qmd://notes/dir/a.md",
        "Raising money",
        "Fundraising notes",
        "42",
        "@@ -41,4 @@ (40 before, 76 after)\nintro\nHow to Raise money fast\nmore\nend",
    ]
    assert rows[2][4] == ""
    assert rows[3][1] == "0.2000"
    assert len(rows) == 4


def test_search_csv_round_trips_awkward_text(hits: list[dict[str, Any]]) -> None:
    hit = hits[0]
    hit["title"] = 'Commas, "quotes"'
    hit["context"] = "line one\nline two\r\nthree\rfour"
    hit["snippet"] = 'a,b\n"c"\nd'
    hit["file"] = "qmd://notes/we,ird.md"
    hits[1]["title"] = "trailing space "
    rows = parse_csv(render_search([hit, hits[1]], "csv", PLAIN)[0])
    assert len(rows) == 3
    assert rows[2][3] == "trailing space "
    assert rows[1][2] == "qmd://notes/we,ird.md"
    assert rows[1][3] == 'Commas, "quotes"'
    # A context is one line in CSV (a record per line): line breaks inside a level are spaces.
    assert rows[1][4] == "line one line two three four"
    assert rows[1][6].endswith('a,b\n"c"\nd')


def test_search_csv_line_numbers_and_full(hits: list[dict[str, Any]]) -> None:
    rows = parse_csv(render_search(hits, "csv", PLAIN, line_numbers=True)[0])
    assert rows[1][6].split("\n")[1:] == ["41: intro", "42: How to Raise money fast", "43: more", "44: end"]
    assert rows[1][6].split("\n")[0].startswith("@@ -41,4 @@")
    full_text, _ = render_search(with_bodies(hits), "csv", PLAIN, full=True, line_numbers=True)
    full = parse_csv(full_text)
    assert full[1][6] == "1: first\n2: second\n3: third"
    assert full[1][5] == "42"


# ---------------------------------------------------------------------------
# Search: files / md / xml
# ---------------------------------------------------------------------------


def test_search_files(hits: list[dict[str, Any]]) -> None:
    hits[0]["context"] = 'say "hi"'
    text, _ = render_search(hits, "files", PLAIN)
    assert text == (
        '#a1b2c3,0.83,qmd://notes/dir/a.md,"say ""hi"""\n'
        "#d4e5f6,0.45,qmd://notes/b.md\n"
        "#0a0b0c,0.20,qmd://notes/gone.md?index=work\n"
    )
    # Content options do not change the files listing.
    assert render_search(hits, "files", PLAIN, line_numbers=True, full=True)[0] == text


def test_search_md(hits: list[dict[str, Any]]) -> None:
    hits[1]["title"] = ""
    text, _ = render_search(hits[:2], "md", PLAIN)
    assert text == (
        "---\n"
        "# Raising money\n"
        "**file:** `qmd://notes/dir/a.md`\n"
        "**docid:** `#a1b2c3`\n"
        "**context:** Fundraising notes\n"
        "\n"
        "@@ -41,4 @@ (40 before, 76 after)\nintro\nHow to Raise money fast\nmore\nend\n"
        "\n"
        "---\n"
        "# qmd://notes/b.md\n"
        "**file:** `qmd://notes/b.md`\n"
        "**docid:** `#d4e5f6`\n"
        "\n"
        "@@ -1,3 @@ (0 before, 0 after)\n# B\nnothing here\nbye\n"
        "\n"
    )


def test_search_md_line_numbers_and_full(hits: list[dict[str, Any]]) -> None:
    text, _ = render_search(hits[:1], "md", PLAIN, line_numbers=True)
    assert "@@ -41,4 @@ (40 before, 76 after)\n41: intro\n42: How to Raise money fast\n43: more\n44: end\n" in text
    full, _ = render_search(with_bodies(hits)[:1], "md", PLAIN, full=True, line_numbers=True)
    assert "\n1: first\n2: second\n3: third\n" in full
    assert "@@" not in full


def parse_xml_fragment(text: str) -> ET.Element:
    """Search XML is a sequence of sibling <file> elements; wrap it to parse."""
    return ET.fromstring(f"<root>{text}</root>")


def test_search_xml(hits: list[dict[str, Any]]) -> None:
    text, _ = render_search(hits, "xml", PLAIN)
    assert text.startswith(
        '<file docid="#a1b2c3" name="qmd://notes/dir/a.md" title="Raising money" context="Fundraising notes">\n'
        "@@ -41,4 @@ (40 before, 76 after)\nintro\n"
    )
    files = parse_xml_fragment(text).findall("file")
    assert len(files) == 3
    assert files[1].get("context") is None
    assert files[2].get("name") == "qmd://notes/gone.md?index=work"
    assert files[1].text == "\n@@ -1,3 @@ (0 before, 0 after)\n# B\nnothing here\nbye\n"


def test_search_xml_escapes_everything(hits: list[dict[str, Any]]) -> None:
    hit = hits[0]
    nasty = "a < b & \"c\" ]]> d 'e'"
    hit["title"] = nasty
    hit["context"] = nasty + "\nsecond line\ttab"
    hit["snippet"] = nasty + "\n<tag>&amp;</tag>\x0c\x1b[0m"
    hit["file"] = 'qmd://notes/<&">.md'
    text, _ = render_search([hit], "xml", PLAIN, line_numbers=True)
    assert "]]>" not in text
    node = parse_xml_fragment(text).find("file")
    assert node is not None
    assert node.get("title") == nasty
    assert node.get("context") == nasty + "\nsecond line\ttab"
    assert node.get("name") == 'qmd://notes/<&">.md'
    assert node.get("docid") == "#a1b2c3"
    assert node.text is not None
    assert f"41: {nasty}\n42: <tag>&amp;</tag>\ufffd\ufffd[0m" in node.text


def test_search_xml_full(hits: list[dict[str, Any]]) -> None:
    text, _ = render_search(with_bodies(hits), "xml", PLAIN, full=True, line_numbers=True)
    node = parse_xml_fragment(text).find("file")
    assert node is not None and node.text == "\n1: first\n2: second\n3: third\n"


# ---------------------------------------------------------------------------
# Search: cli
# ---------------------------------------------------------------------------


def test_search_cli_plain(hits: list[dict[str, Any]]) -> None:
    text, warnings = render_search(hits, "cli", PLAIN)
    assert warnings == []
    assert "\x1b" not in text
    assert text == (
        "qmd://notes/dir/a.md:42 #a1b2c3\n"
        "Title: Raising money\n"
        "Context: Fundraising notes\n"
        "Score:  83%\n"
        "\n"
        "@@ -41,4 @@ (40 before, 76 after)\n"
        "intro\nHow to Raise money fast\nmore\nend\n"
        "\n\n"
        # No query term in the passage: no ":line".
        "qmd://notes/b.md #d4e5f6\n"
        "Title: B\n"
        "Score:  45%\n"
        "\n"
        "@@ -1,3 @@ (0 before, 0 after)\n"
        "# B\nnothing here\nbye\n"
        "\n\n"
        "qmd://notes/gone.md:7?index=work #0a0b0c\n"
        "Title: Gone\n"
        "Score:  20%\n"
        "Explain: fts=[0.8920, 0.9070] vec=[none]\n"
        "  RRF: total=0.1730 base=0.1230 bonus=0.0500 rank=1\n"
        "  Blend: 75%*1.0000 + 25%*0.8100 = 0.9525\n"
        "  Top RRF contributions: fts/original#1:0.0328 | vec/original#2:0.0323 | fts/lex#1:0.0164\n"
        "\n"
        "@@ -6,2 @@ (5 before, 2 after)\n"
        "six\nseven\n"
    )


def test_search_cli_score_100_and_no_title(hits: list[dict[str, Any]]) -> None:
    hit = hits[1]
    hit["score"] = 1.0
    hit["title"] = ""
    text, _ = render_search([hit], "cli", PLAIN)
    assert "Score: 100%\n" in text
    assert "Title:" not in text


def test_search_cli_line_numbers_are_real(hits: list[dict[str, Any]]) -> None:
    text, _ = render_search(hits[:1], "cli", PLAIN, line_numbers=True)
    assert text.endswith(
        "\n@@ -41,4 @@ (40 before, 76 after)\n41: intro\n42: How to Raise money fast\n43: more\n44: end\n"
    )


def test_search_cli_full(hits: list[dict[str, Any]]) -> None:
    text, _ = render_search(with_bodies(hits)[:1], "cli", PLAIN, full=True, line_numbers=True)
    assert text.endswith("Score:  83%\n\n1: first\n2: second\n3: third\n")
    assert "@@" not in text
    # The location still points at the best line.
    assert text.startswith("qmd://notes/dir/a.md:42 #a1b2c3\n")


def test_search_cli_colour(hits: list[dict[str, Any]]) -> None:
    hits[0]["terms"] = ["raise", "money", "to", "(x"]
    text, _ = render_search(hits, "cli", COLOR)
    assert "\x1b]8;;" not in text  # links are off
    assert text.startswith("\x1b[36mqmd://notes/dir/a.md:42\x1b[0m \x1b[2m#a1b2c3\x1b[0m\n")
    assert "\x1b[1mTitle: Raising money\x1b[0m\n" in text
    assert "\x1b[2mContext: Fundraising notes\x1b[0m\n" in text
    assert "Score: \x1b[1m\x1b[32m 83%\x1b[0m\x1b[0m\n" in text
    assert "Score: \x1b[1m\x1b[33m 45%\x1b[0m\x1b[0m\n" in text
    assert "Score: \x1b[1m\x1b[2m 20%\x1b[0m\x1b[0m\n" in text
    # Case-insensitive highlight that keeps the original case; short terms untouched.
    assert "How to \x1b[33m\x1b[1mRaise\x1b[0m \x1b[33m\x1b[1mmoney\x1b[0m fast" in text
    assert "\x1b[33m\x1b[1mto\x1b[0m" not in text
    # The @@ header is never highlighted.
    assert "@@ -41,4 @@ (40 before, 76 after)\n" in text


def test_search_cli_highlight_is_literal(hits: list[dict[str, Any]]) -> None:
    hit = hits[1]
    hit["snippet"] = "use c++ or c..+ here"
    hit["terms"] = ["c++"]
    text, _ = render_search([hit], "cli", COLOR)
    assert "use \x1b[33m\x1b[1mc++\x1b[0m or c..+ here" in text


def test_search_cli_highlight_before_numbering(hits: list[dict[str, Any]]) -> None:
    hit = hits[0]
    hit["terms"] = ["424"]
    hit["snippet"] = "a\nb 424\nc\nd"
    text, _ = render_search([hit], "cli", COLOR, line_numbers=True)
    assert "\n42: b \x1b[33m\x1b[1m424\x1b[0m\n" in text


def test_search_cli_links(hits: list[dict[str, Any]]) -> None:
    style = Style(color=False, links=True, editor_uri="ed://{path}:{line}")
    text, _ = render_search(hits[:2], "cli", style)
    a_path = hits[0]["abs_path"]
    b_path = hits[1]["abs_path"]
    assert text.startswith(osc8(f"ed://{a_path}:42", "qmd://notes/dir/a.md:42") + " #a1b2c3\n")
    # Without a term match the link opens line 1.
    assert osc8(f"ed://{b_path}:1", "qmd://notes/b.md") + " #d4e5f6\n" in text
    coloured, _ = render_search(hits[:1], "cli", Style(True, True, "ed://{path}:{line}"))
    assert coloured.startswith("\x1b[36m\x1b]8;;ed://")


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_escape_bytes_without_colour_or_links(hits: list[dict[str, Any]], fmt: str) -> None:
    for full in (False, True):
        rows = with_bodies(hits) if full else hits
        text, _ = render_search(rows, fmt, PLAIN, full=full, line_numbers=True)
        assert "\x1b" not in text
    assert "\x1b" not in render_multi_get(make_items(hits), fmt, PLAIN)[0]


# ---------------------------------------------------------------------------
# --full-path
# ---------------------------------------------------------------------------


def test_resolve_full_path(tmp_path: Path) -> None:
    target = tmp_path / "notes" / "a.md"
    target.parent.mkdir()
    target.write_text("x")
    assert resolve_full_path(str(target), str(tmp_path)) == "./notes/a.md"
    assert resolve_full_path(str(tmp_path / "notes"), str(tmp_path / "notes")) == "./"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert resolve_full_path(str(target), str(elsewhere)) == os.path.realpath(target)
    # A sibling whose name merely starts with the cwd's name is not "under" it.
    sibling = tmp_path / "notes2.md"
    sibling.write_text("x")
    assert resolve_full_path(str(sibling), str(tmp_path / "notes")) == os.path.realpath(sibling)
    assert resolve_full_path(str(tmp_path / "missing.md"), str(tmp_path)) is None
    assert resolve_full_path(None, str(tmp_path)) is None


def test_resolve_full_path_defaults_to_process_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "a.md"
    target.write_text("x")
    monkeypatch.chdir(tmp_path)
    assert resolve_full_path(str(target)) == "./a.md"


def test_full_path_warning_texts() -> None:
    assert full_path_warning(0, 3) is None
    assert full_path_warning(1, 1) == WARN_ONE
    assert full_path_warning(1, 3) == (
        "warning: --full-path could not resolve 1 of 3 results on disk (moved or deleted since "
        "indexing); showing qmd:// + docid instead. Run 'qmd update' to refresh the index."
    )


def test_search_full_path_all_formats(hits: list[dict[str, Any]], tmp_path: Path) -> None:
    cwd = str(tmp_path)
    multi_warning = full_path_warning(1, 3)

    data = json.loads(render_search(hits, "json", PLAIN, full_path=True, cwd=cwd)[0])
    assert data[0]["file"] == "./notes/dir/a.md" and "docid" not in data[0]
    assert data[2]["file"] == "qmd://notes/gone.md?index=work" and data[2]["docid"] == "#0a0b0c"

    text, warnings = render_search(hits, "csv", PLAIN, full_path=True, cwd=cwd)
    assert warnings == [multi_warning]
    rows = parse_csv(text)
    assert rows[1][:3] == ["", "0.8312", "./notes/dir/a.md"]
    assert rows[3][:3] == ["#0a0b0c", "0.2000", "qmd://notes/gone.md?index=work"]
    assert all(len(r) == 7 for r in rows)

    text, warnings = render_search(hits, "files", PLAIN, full_path=True, cwd=cwd)
    assert warnings == [multi_warning]
    assert text.splitlines() == [
        '0.83,./notes/dir/a.md,"Fundraising notes"',
        "0.45,./notes/b.md",
        "#0a0b0c,0.20,qmd://notes/gone.md?index=work",
    ]

    text, _ = render_search(hits, "md", PLAIN, full_path=True, cwd=cwd)
    assert "**file:** `./notes/dir/a.md`\n**context:**" in text
    assert text.count("**docid:**") == 1 and "**docid:** `#0a0b0c`" in text

    text, _ = render_search(hits, "xml", PLAIN, full_path=True, cwd=cwd)
    files = parse_xml_fragment(text).findall("file")
    assert files[0].get("docid") is None and files[0].get("name") == "./notes/dir/a.md"
    assert files[2].get("docid") == "#0a0b0c"

    text, warnings = render_search(hits, "cli", PLAIN, full_path=True, cwd=cwd)
    assert warnings == [multi_warning]
    assert text.startswith("./notes/dir/a.md:42\n")
    assert "\n./notes/b.md\n" in text
    assert "\nqmd://notes/gone.md:7?index=work #0a0b0c\n" in text


def test_search_full_path_outside_cwd_and_single_warning(hits: list[dict[str, Any]], tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    text, warnings = render_search(hits[:1], "files", PLAIN, full_path=True, cwd=str(elsewhere))
    assert text == f'0.83,{os.path.realpath(hits[0]["abs_path"])},"Fundraising notes"\n'
    assert warnings == []
    text, warnings = render_search(hits[2:], "files", PLAIN, full_path=True, cwd=str(tmp_path))
    assert text == "#0a0b0c,0.20,qmd://notes/gone.md?index=work\n"
    assert warnings == [WARN_ONE]


def test_search_without_full_path_ignores_disk(hits: list[dict[str, Any]]) -> None:
    assert render_search(hits, "files", PLAIN)[1] == []


# ---------------------------------------------------------------------------
# Multi-get
# ---------------------------------------------------------------------------


A_BODY = "1: # A\n2: ```py\n3: x\n4: ```"


def make_items(hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A readable document with context, a skipped one, and one whose file is gone."""
    base = ("file", "docid", "collection", "path", "abs_path")
    a, b, gone = ({k: h[k] for k in base} for h in hits)
    a.update(title="Raising money", context="Fundraising notes", body=A_BODY, skipped=False, reason=None)
    b.update(title="B", context=None, body=None, skipped=True, reason="File too large (70KB > 64KB)")
    gone.update(file="qmd://notes/gone.md", title="gone.md", context=None, body="1: hello", skipped=False, reason=None)
    return [a, b, gone]


SKIP_REASON = "File too large (70KB > 64KB). Use 'qmd get qmd://notes/b.md' to retrieve."


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("json", "[]\n"),
        ("csv", "docid,file,title,context,skipped,body,truncated_lines\n"),
        ("xml", '<?xml version="1.0" encoding="UTF-8"?>\n<documents>\n</documents>\n'),
        ("md", ""),
        ("files", ""),
        ("cli", ""),
    ],
)
def test_multi_get_empty(fmt: str, expected: str) -> None:
    assert render_multi_get([], fmt, PLAIN) == (expected, [])


def test_multi_get_json(hits: list[dict[str, Any]]) -> None:
    data = json.loads(render_multi_get(make_items(hits), "json", PLAIN)[0])
    assert data[0] == {
        "file": "qmd://notes/dir/a.md",
        "docid": "#a1b2c3",
        "title": "Raising money",
        "context": "Fundraising notes",
        "body": A_BODY,
    }
    assert data[1] == {
        "file": "qmd://notes/b.md",
        "docid": "#d4e5f6",
        "title": "B",
        "skipped": True,
        "reason": SKIP_REASON,
    }


def test_multi_get_csv(hits: list[dict[str, Any]]) -> None:
    items = make_items(hits)
    items[2]["body"] = "1: unquoted tail "
    rows = parse_csv(render_multi_get(items, "csv", PLAIN)[0])
    assert rows[3][5] == "1: unquoted tail "
    assert rows[0] == ["docid", "file", "title", "context", "skipped", "body", "truncated_lines"]
    assert rows[1] == ["#a1b2c3", "qmd://notes/dir/a.md", "Raising money", "Fundraising notes", "false", A_BODY, "0"]
    assert rows[2] == ["#d4e5f6", "qmd://notes/b.md", "B", "", "true", SKIP_REASON, ""]


def test_multi_get_files(hits: list[dict[str, Any]]) -> None:
    assert render_multi_get(make_items(hits), "files", PLAIN)[0] == (
        '#a1b2c3,qmd://notes/dir/a.md,"Fundraising notes"\n'
        "#d4e5f6,qmd://notes/b.md,[SKIPPED]\n"
        "#0a0b0c,qmd://notes/gone.md\n"
    )


def test_multi_get_md(hits: list[dict[str, Any]]) -> None:
    items = make_items(hits)
    items[2]["title"] = "gone.md"
    items[2]["path"] = "gone.md"
    text = render_multi_get(items, "md", PLAIN)[0]
    assert text == (
        "## qmd://notes/dir/a.md\n\n"
        "**docid:** `#a1b2c3`\n\n"
        "**Title:** Raising money\n\n"
        "**Context:** Fundraising notes\n\n"
        # The body holds a ``` fence, so the wrapping fence is longer.
        "````\n1: # A\n2: ```py\n3: x\n4: ```\n````\n\n"
        "## qmd://notes/b.md\n\n"
        "**docid:** `#d4e5f6`\n\n"
        "**Title:** B\n\n"
        f"> {SKIP_REASON}\n\n"
        "## qmd://notes/gone.md\n\n"
        "**docid:** `#0a0b0c`\n\n"
        "```\n1: hello\n```\n\n"
    )


def test_multi_get_xml(hits: list[dict[str, Any]]) -> None:
    items = make_items(hits)
    items[0]["title"] = 'x < y & "z" ]]>'
    items[0]["body"] = "<b>]]></b> &amp;"
    text = render_multi_get(items, "xml", PLAIN)[0]
    assert text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<documents>\n  <document docid="#a1b2c3">\n')
    root = ET.fromstring(text.encode())
    docs = root.findall("document")
    assert [d.get("docid") for d in docs] == ["#a1b2c3", "#d4e5f6", "#0a0b0c"]
    assert docs[0].findtext("file") == "qmd://notes/dir/a.md"
    assert docs[0].findtext("title") == 'x < y & "z" ]]>'
    assert docs[0].findtext("context") == "Fundraising notes"
    assert docs[0].findtext("body") == "<b>]]></b> &amp;"
    assert docs[1].findtext("skipped") == "true"
    assert docs[1].findtext("reason") == SKIP_REASON
    assert docs[1].find("body") is None
    assert docs[1].find("context") is None


def test_multi_get_cli(hits: list[dict[str, Any]]) -> None:
    rule = "=" * 60
    text = render_multi_get(make_items(hits), "cli", PLAIN)[0]
    assert text == (
        f"\n{rule}\nFile: qmd://notes/dir/a.md  #a1b2c3\n{rule}\n\n"
        "Folder Context: Fundraising notes\n---\n\n"
        "1: # A\n2: ```py\n3: x\n4: ```\n"
        f"\n{rule}\nFile: qmd://notes/b.md  #d4e5f6\n{rule}\n\n"
        f"[SKIPPED: {SKIP_REASON}]\n"
        f"\n{rule}\nFile: qmd://notes/gone.md  #0a0b0c\n{rule}\n\n"
        "1: hello\n"
    )


def test_multi_get_cli_styled(hits: list[dict[str, Any]]) -> None:
    style = Style(color=True, links=True, editor_uri="ed://{path}:{line}")
    text = render_multi_get(make_items(hits)[:1], "cli", style)[0]
    link = osc8(f"ed://{hits[0]['abs_path']}:1", "qmd://notes/dir/a.md")
    assert f"File: \x1b[36m{link}\x1b[0m  \x1b[2m#a1b2c3\x1b[0m\n" in text


def test_multi_get_full_path(hits: list[dict[str, Any]], tmp_path: Path) -> None:
    items = make_items(hits)
    cwd = str(tmp_path)
    warning = full_path_warning(1, 3)

    text, warnings = render_multi_get(items, "files", PLAIN, full_path=True, cwd=cwd)
    assert warnings == [warning]
    assert text == ('./notes/dir/a.md,"Fundraising notes"\n./notes/b.md,[SKIPPED]\n#0a0b0c,qmd://notes/gone.md\n')
    data = json.loads(render_multi_get(items, "json", PLAIN, full_path=True, cwd=cwd)[0])
    assert data[0]["file"] == "./notes/dir/a.md" and "docid" not in data[0]
    # The skip hint keeps the qmd:// URI, which `qmd get` always resolves.
    assert data[1]["reason"] == SKIP_REASON
    assert data[2]["docid"] == "#0a0b0c"
    rows = parse_csv(render_multi_get(items, "csv", PLAIN, full_path=True, cwd=cwd)[0])
    assert rows[1][:2] == ["", "./notes/dir/a.md"]
    assert rows[3][:2] == ["#0a0b0c", "qmd://notes/gone.md"]
    md = render_multi_get(items, "md", PLAIN, full_path=True, cwd=cwd)[0]
    assert md.startswith("## ./notes/dir/a.md\n\n**Title:**")
    root = ET.fromstring(render_multi_get(items, "xml", PLAIN, full_path=True, cwd=cwd)[0].encode())
    assert root.find("document").get("docid") is None  # type: ignore[union-attr]
    cli = render_multi_get(items, "cli", PLAIN, full_path=True, cwd=cwd)[0]
    assert "File: ./notes/dir/a.md\n" in cli and "File: qmd://notes/gone.md  #0a0b0c\n" in cli
    _, none = render_multi_get(items[:2], "cli", PLAIN, full_path=True, cwd=cwd)
    assert none == []


# ---------------------------------------------------------------------------
# get
# ---------------------------------------------------------------------------


def make_doc(hits: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    doc = {k: hits[0][k] for k in ("file", "docid", "collection", "path", "abs_path", "title")}
    doc.update(context="Fundraising notes", body="ten\neleven\ntwelve", from_line=10)
    doc.update(overrides)
    return doc


def test_render_document_header_and_numbering(hits: list[dict[str, Any]]) -> None:
    doc = make_doc(hits)
    assert render_document(doc, from_line=10, line_numbers=True, full_path=False, cwd=None) == (
        "qmd://notes/dir/a.md  #a1b2c3\nFolder Context: Fundraising notes\n---\n\n10: ten\n11: eleven\n12: twelve\n"
    )
    no_context = make_doc(hits, context=None)
    plain = render_document(no_context, from_line=1, line_numbers=False, full_path=False, cwd=None)
    assert plain == "qmd://notes/dir/a.md  #a1b2c3\n---\n\nten\neleven\ntwelve\n"
    clamped = render_document(doc, from_line=-3, line_numbers=True, full_path=False, cwd=None)
    assert clamped.endswith("\n1: ten\n2: eleven\n3: twelve\n")


def test_render_document_full_path(hits: list[dict[str, Any]], tmp_path: Path) -> None:
    doc = make_doc(hits)
    text = render_document(doc, from_line=1, line_numbers=False, full_path=True, cwd=str(tmp_path))
    assert text.startswith("./notes/dir/a.md\nFolder Context:")
    gone = make_doc(hits, abs_path=str(tmp_path / "nope.md"))
    text = render_document(gone, from_line=1, line_numbers=False, full_path=True, cwd=str(tmp_path))
    assert text.startswith("qmd://notes/dir/a.md  #a1b2c3\n")
    assert resolve_full_path(gone["abs_path"], str(tmp_path)) is None


def test_explain_of_a_result_ranked_by_relevance_says_so(tmp_path: Path) -> None:
    """A plain query's score is its relevance: no blend line whose sum is not the score."""
    hit = make_hits(tmp_path)[2]
    terms = [{"name": "keyword", "weight": 3.94, "value": 0.5}, {"name": "vector", "weight": 5.77, "value": 0.75}]
    chance = {"probability": 0.8121, "bias": -10.35, "terms": terms}
    hit["explain"] = {**hit["explain"], "scoredBy": "relevance", "blendedScore": 0.8121, "relevance": chance}
    text, _ = render_search([hit], "cli", PLAIN)
    assert "  Score: relevance = 0.8121 (fusion 1.0000)\n" in text and "Blend" not in text
    assert "  Relevance: logistic(3.94*0.5000 keyword + 5.77*0.7500 vector - 10.35) = 0.8121\n" in text


def test_keyword_explain_shows_matched_terms_not_zero_fusion_fields(tmp_path: Path) -> None:
    """`qmd search --explain` has no RRF or rerank to show; it says what BM25 matched."""
    hit = {**make_hits(tmp_path)[0], "explain": {"bm25_terms_matched": 2, "terms": 3}}
    text, _ = render_search([hit], "cli", PLAIN)
    assert "Explain: BM25 matched 2 of 3 terms" in text
    assert "RRF" not in text and "Blend" not in text
