"""Loaders by extension (seeds/001): real PDFs (reportlab, pypdf to encrypt) and HTML pages
made here, through the loaders, the indexer, the engine, and the real CLI and daemon."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write
from harness import Daemon, Env
from pypdf import PdfReader, PdfWriter
from reportlab.lib.pagesizes import A4
from reportlab.pdfgen import canvas
from test_indexing import run, skipped_in_status
from test_mcp import resources_of, text_of, tool

import qmd
from qmd.server.errors import InvalidInput
from qmd.server.ingest import loaders
from qmd.server.ingest.indexer import Found, Skip, load_file
from qmd.server.ingest.loaders import LoadError, load
from qmd.server.text.chunking import CharEstimateTokenizer, chunk_document
from qmd.server.text.pages import PAGE_BREAK, Pages, PageSpan, describe_pages, split_page

# -- making files ------------------------------------------------------------------


def make_pdf(pages: list[list[str]], title: str | None = None) -> bytes:
    """A real PDF with a text layer: one list of lines per page."""
    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=A4)
    if title is not None:
        c.setTitle(title)
    for lines in pages:
        y = 800
        for line in lines:
            c.drawString(50, y, line)
            y -= 16
        c.showPage()
    c.save()
    return buf.getvalue()


def scanned_pdf() -> bytes:
    """A page that is only an image, as a scanner makes: no text layer at all."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (400, 200), "white")
    ImageDraw.Draw(img).rectangle((20, 20, 380, 60), fill="black")
    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=A4)
    from reportlab.lib.utils import ImageReader

    c.drawImage(ImageReader(img), 50, 500, width=400, height=200)
    c.showPage()
    c.save()
    return buf.getvalue()


def encrypted(pdf: bytes, user: str, owner: str = "owner-secret") -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf)))
    writer.encrypt(user_password=user, owner_password=owner, algorithm="AES-256")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def lines_of(page: int, n: int = 10, marks: dict[tuple[int, int], str] | None = None) -> list[str]:
    marks = marks or {}
    return [f"page {page} line {i} text {marks.get((page, i), '')}".rstrip() for i in range(1, n + 1)]


PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title> Guide to
 Rivers </title><style>.x { font-family: stylewordzz }</style>
<script>var scriptwordzz = 1;</script></head>
<body><header><nav><a href="/">navwordzz home</a></nav></header>
<aside>asidewordzz related</aside>
<main><article><header><h1>Rivers and mountains</h1><p>by the author</p></header>
<p>The <b>Danube</b> flows
   east through <a href="#">ten countries</a>.</p>
<pre>def flow():
    return "east"</pre>
<ul><li>first item</li><li>second item</li></ul>
<div hidden>hiddenwordzz</div><span aria-hidden="true">ariawordzz</span>
<form><button>formwordzz</button></form>
<footer>article footer kept</footer></article></main>
<footer>footerwordzz copyright</footer><script>anotherscriptzz()</script></body></html>
"""


# -- the registry and markdown -------------------------------------------------------


def test_loaders_by_extension() -> None:
    assert loaders.loader_for("a/b.md").name == "markdown"
    assert loaders.loader_for("x.MDX").name == "markdown"
    assert loaders.loader_for("p.html").name == loaders.loader_for("p.HTM").name == "html"
    assert loaders.loader_for("r.pdf").name == "pdf" and loaders.loader_for("r.pdf").paged
    assert loaders.loader_for("notes.txt").name == loaders.loader_for("x.org").name == "text"
    assert loaders.loader_for("Makefile").name == "text"


@pytest.mark.parametrize(
    "path, data",
    [
        ("a.md", b"---\ntitle: T\n---\n# H\r\nbody\twith tabs\n\n\n"),
        ("a.md", "\ufeff# Café\n".encode()),
        ("n.txt", b"  plain text\n\x0cafter a form feed\n"),
        ("x.org", b"#+TITLE: Org\n* h\n"),
    ],
)
def test_markdown_and_text_are_the_bytes_unchanged(path: str, data: bytes) -> None:
    out = load(path, data)
    assert out.text == data.decode("utf-8")
    assert out.title == loaders.extract_title(path, out.text)


@pytest.mark.parametrize(
    "path, data, reason",
    [
        ("a.md", b"# x\x00y", "binary (NUL bytes)"),
        ("a.md", "é".encode("latin-1"), "not UTF-8 (invalid byte at offset 0)"),
        ("a.txt", b" \n\t\n", "empty"),
    ],
)
def test_text_skips_keep_their_reasons(path: str, data: bytes, reason: str) -> None:
    with pytest.raises(LoadError) as e:
        load(path, data)
    assert e.value.reason == reason


# -- HTML -------------------------------------------------------------------------


def test_html_is_the_main_content_without_furniture() -> None:
    out = load("guide.html", PAGE.encode())
    assert out.title == "Guide to Rivers"
    text = out.text
    for word in (
        "stylewordzz",
        "scriptwordzz",
        "anotherscriptzz",
        "navwordzz",
        "asidewordzz",
        "footerwordzz",
        "hiddenwordzz",
        "ariawordzz",
        "formwordzz",
    ):
        assert word not in text
    lines = text.split("\n")
    assert lines[0] == "Rivers and mountains"  # the article's own header is content
    assert "The Danube flows east through ten countries." in lines  # inline markup joins its line
    assert 'def flow():\n    return "east"' in text  # <pre> keeps its lines and indentation
    assert "first item" in lines and "second item" in lines
    assert "article footer kept" in lines


def test_html_title_falls_back_to_h1_then_the_file_name() -> None:
    assert load("a.html", b"<body><p>x</p><h1> First  <i>heading</i></h1><h1>Second</h1></body>").title == (
        "First heading"
    )
    assert load("dir/some-page.htm", b"<p>only text</p>").title == "some-page"


def test_html_without_main_keeps_the_body_minus_furniture() -> None:
    out = load("a.html", b"<html><body><nav>menu</nav><div>one</div><div>two</div><footer>f</footer></body></html>")
    assert out.text == "one\ntwo"


@pytest.mark.parametrize(
    "markup",
    [
        b"<p>unclosed <b>bold <i>italic</p></div></span><table><tr><td>a<td>b</table>&bogus; &amp; <![CDATA[x]]>",
        b"<div>" * 100_000 + b"deep text" + b"</div>" * 3,
        b"<html><body><p>text</p><!-- an unclosed comment",
        b"</p></p></html><p>after the end",
        b"<<<>>> <p =x>text\xff\xfe bytes</p>",
        b"<svg><p>in svg</p></svg><math><mi>x</mi></math><p>text",
    ],
)
def test_malformed_markup_never_crashes(markup: bytes) -> None:
    try:
        out = load("bad.html", markup)
    except LoadError as e:
        assert e.reason == "HTML has no text"
    else:
        assert out.text.strip()
        assert "<" not in out.text.replace("<<<>>>", "")


@pytest.mark.parametrize(
    "markup",
    [b"", b"   ", b"<html><head><script>x()</script><style>p{}</style></head><body><nav>n</nav></body></html>"],
)
def test_html_without_text_is_a_reported_skip(markup: bytes) -> None:
    with pytest.raises(LoadError) as e:
        load("empty.html", markup)
    assert e.value.reason == "HTML has no text"


@pytest.mark.parametrize(
    "head, codec",
    [
        ('<meta charset="windows-1252">', "cp1252"),
        ("<meta http-equiv='Content-Type' content='text/html; charset=ISO-8859-15'>", "iso8859-15"),
        ('<meta charset="shift_jis">', "shift_jis"),
        ("", "utf-8"),  # no meta: UTF-8 when the bytes are
        ("", "cp1252"),  # no meta and not UTF-8: the web's legacy default
        ('<meta charset="utf-16">', "utf-8"),  # a meta can only mean an ASCII-compatible encoding
    ],
)
def test_html_encodings(head: str, codec: str) -> None:
    words = {"shift_jis": "日本語の文書", "iso8859-15": "Café naïve Grüße €"}.get(codec, "Café naïve – “quoted” Grüße")
    data = f"<html><head>{head}<title>T</title></head><body><p>{words}</p></body></html>".encode(codec)
    assert load("enc.html", data).text == words


def test_html_with_a_bom() -> None:
    page = "<title>T</title><p>Grüße</p>"
    assert load("a.html", page.encode("utf-16")).text == "Grüße"
    assert load("a.html", b"\xef\xbb\xbf" + page.encode()).text == "Grüße"


# -- PDF --------------------------------------------------------------------------


def test_pdf_text_per_page_in_order() -> None:
    pdf = make_pdf([lines_of(1, 3), lines_of(2, 2), lines_of(3, 4)], title="Quarterly Report")
    out = load("r.pdf", pdf)
    assert out.title == "Quarterly Report"
    pages = out.text.split(f"\n{PAGE_BREAK}\n")
    assert pages == ["\n".join(lines_of(1, 3)), "\n".join(lines_of(2, 2)), "\n".join(lines_of(3, 4))]


def test_pdf_title_falls_back_to_its_first_line() -> None:
    # reportlab writes "untitled" unless told otherwise: a placeholder, as an empty title, is no title
    assert load("r.pdf", make_pdf([["", "   ", "First real line"], ["x"]])).title == "First real line"
    assert load("r.pdf", make_pdf([["Opening words"]], title="")).title == "Opening words"


def test_pdf_without_a_text_layer() -> None:
    with pytest.raises(LoadError) as e:
        load("scan.pdf", scanned_pdf())
    assert e.value.reason == "PDF has no text layer (scanned?)"


def test_encrypted_pdf() -> None:
    pdf = make_pdf([["secret words"]])
    with pytest.raises(LoadError) as e:
        load("locked.pdf", encrypted(pdf, user="hunter2"))
    assert e.value.reason == "encrypted PDF (it needs a password to open)"
    # Only an owner password (permissions): anyone may open it, and so may we.
    assert load("open.pdf", encrypted(pdf, user="")).text == "secret words"


@pytest.mark.parametrize(
    "data",
    [b"not a pdf at all", b"%PDF-1.7\n" + b"\x00garbage" * 100, make_pdf([["cut short"]])[:400]],
)
def test_broken_pdf_is_a_reported_skip(data: bytes) -> None:
    with pytest.raises(LoadError) as e:
        load("broken.pdf", data)
    assert e.value.reason.startswith(("PDF could not be read (", "PDF has no")), e.value.reason


def test_page_text_is_cleaned() -> None:
    assert loaders._clean_page("a  \r\nb\fc\x00d\ud800\n\n") == "a\nb\ncd\ufffd"


def test_pages_map_body_lines_to_pages() -> None:
    body = "\n\f\n".join(["a\nb\nc", "", "d\ne"])
    pages = Pages.of("r.pdf", body)
    assert pages is not None and pages.count == 3
    assert [pages.bounds(p) for p in (1, 2, 3)] == [(1, 3), (5, 5), (7, 8)]
    assert [pages.page_of(line) for line in range(1, 9)] == [1, 1, 1, 2, 2, 3, 3, 3]
    assert pages.spans(2, 8) == (PageSpan(1, 2, 3), PageSpan(2, 1, 1), PageSpan(3, 1, 2))
    assert pages.spans(4, 4) == ()  # a page break line is on no page
    assert Pages.of("r.md", body) is None  # only a paged loader's bodies have pages
    assert describe_pages((PageSpan(3, 10, 14),)) == "page 3, lines 10-14"
    assert describe_pages(pages.spans(1, 8)) == "pages 1-3 (page 1 from line 1, page 3 to line 2)"


def test_split_page() -> None:
    assert split_page("c/r.pdf#page=3") == ("c/r.pdf", 3)
    assert split_page("qmd://c/r.pdf#page=12") == ("qmd://c/r.pdf", 12)
    assert split_page("c/r.pdf") == ("c/r.pdf", None)
    assert split_page("#page=3") == ("#page=3", None)


def test_chunks_of_a_pdf_body_keep_the_invariant() -> None:
    body = load("r.pdf", make_pdf([lines_of(p, 40) for p in range(1, 6)])).text
    chunks = chunk_document(body, max_tokens=64, tokenizer=CharEstimateTokenizer())
    assert len(chunks) > 5
    for c in chunks:
        assert body[c.start : c.end] == c.text


# -- through the indexer and the engine ---------------------------------------------


def test_load_file_hashes_the_bytes_and_reports_the_loader(tmp_path: Path) -> None:
    pdf = make_pdf([["hash me"]])
    (tmp_path / "r.pdf").write_bytes(pdf)
    (tmp_path / "s.pdf").write_bytes(scanned_pdf())
    st = (tmp_path / "r.pdf").stat()
    loaded = load_file(Found("r.pdf", str(tmp_path / "r.pdf"), st.st_size, st.st_mtime_ns), 1 << 30)
    # the bytes' hash salted with the loader's version: text and vectors are the PDF loader's own
    salted = hashlib.sha256(b"pdf-1\0" + pdf).hexdigest()
    assert loaded.hash == salted == loaders.PDF.content_key(pdf) and loaded.text == "hash me"
    st = (tmp_path / "s.pdf").stat()
    with pytest.raises(Skip) as e:
        load_file(Found("s.pdf", str(tmp_path / "s.pdf"), st.st_size, st.st_mtime_ns), 1 << 30)
    assert e.value.reason == "PDF has no text layer (scanned?)" and not e.value.keep


@pytest.fixture
def library(tmp_path: Path) -> qmd.Index:
    root = write(
        tmp_path / "docs",
        {
            "report.pdf": make_pdf(
                [lines_of(1), lines_of(2, marks={(2, 10): "zanzibar harbour"}), lines_of(3, marks={(3, 1): "quokka"})]
            ),
            "guide.html": PAGE,
            "note.md": "# Note\n\nDanube in markdown\n",
        },
    )
    index = qmd.open(
        str(tmp_path / "i.sqlite"), collections={"d": {"path": str(root), "pattern": "**/*.{md,pdf,html}"}}
    )
    index.update()
    return index


def test_search_pointers_name_the_page_and_stay_on_it(library: qmd.Index) -> None:
    with library:
        (hit,) = library.search("zanzibar").hits
        # Page 2's last line: the passage must not run on into page 3 (or its page break).
        assert hit.page == PageSpan(2, 9, 10)
        assert (hit.start_line, hit.end_line) == (20, 21)
        assert hit.snippet == "page 2 line 9 text\npage 2 line 10 text zanzibar harbour"
        (hit,) = library.search("quokka").hits
        assert hit.page == PageSpan(3, 1, 3) and hit.start_line == 23
        (md,) = [h for h in library.search("Danube").hits if h.doc.path == "note.md"]
        assert md.page is None


def test_get_reads_a_page_range_and_the_same_body_range(library: qmd.Index) -> None:
    with library:
        by_page = library.get("d/report.pdf#page=2:9:2")
        by_line = library.get("d/report.pdf:20:2")
        assert by_page == by_line
        assert by_page.body == "page 2 line 9 text\npage 2 line 10 text zanzibar harbour"
        assert by_page.pages == (PageSpan(2, 9, 10),)
        whole = library.get("d/report.pdf#page=3")
        assert whole.body.split("\n")[0] == "page 3 line 1 text quokka" and whole.pages == (PageSpan(3, 1, 10),)
        # A count past the page's end stops at it: a page address reads that page only.
        assert library.get("d/report.pdf#page=1:9:50").body == "page 1 line 9 text\npage 1 line 10 text"
        assert library.get("d/note.md:3:1").pages == ()


@pytest.mark.parametrize(
    "name, message",
    [
        ("d/report.pdf#page=4", "d/report.pdf has 3 pages; page 4 does not exist"),
        ("d/report.pdf#page=0", "d/report.pdf has 3 pages; page 0 does not exist"),
        ("d/report.pdf#page=2:11", "page 2 of d/report.pdf has 10 lines; line 11 is past the end"),
        ("d/note.md#page=1", "d/note.md has no pages: #page= addresses the pages of a PDF"),
    ],
)
def test_get_page_errors(library: qmd.Index, name: str, message: str) -> None:
    with library, pytest.raises(InvalidInput) as e:
        library.get(name)
    assert e.value.message == message


# -- memory ---------------------------------------------------------------------------

# VmHWM, the process's own peak: getrusage's ru_maxrss survives exec, so a child forked
# from a pytest that grew to 700 MB over the whole suite would report that instead.
_PEAK = """
import re, sys
from qmd.server.ingest import loaders
path = sys.argv[1]
data = open(path, "rb").read()
text = loaders.load(path, data).text
status = open("/proc/self/status").read()
print(len(text), re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1))
"""


def peak_rss_kb(path: Path) -> tuple[int, int]:
    """Characters indexed and the peak RSS (KiB) of loading `path` in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", _PEAK, str(path)], capture_output=True, text=True, check=True)
    chars, peak = out.stdout.split()
    return int(chars), int(peak)


@pytest.mark.slow
def test_a_50_mb_html_page_loads_in_bounded_memory(tmp_path: Path) -> None:
    """Peak memory grows with the text kept, as for a markdown file of the same size: the
    streaming parser never holds a tree (measured: 50 MB page, 225 MB peak; the same
    bytes as markdown, 114 MB)."""
    para = "<p>" + "river mountain <b>forest</b> cloud " * 12 + "</p>\n"
    body = PAGE.replace("</article>", para * (50_000_000 // len(para)) + "</article>")
    html = tmp_path / "big.html"
    html.write_text(body, encoding="utf-8")
    md = tmp_path / "big.md"
    md.write_text(body, encoding="utf-8")
    size_mb = html.stat().st_size / 1e6
    assert size_mb > 50
    chars, html_kb = peak_rss_kb(html)
    _, md_kb = peak_rss_kb(md)
    assert chars > 30_000_000
    assert html_kb < 2.5 * md_kb, (html_kb, md_kb)
    assert html_kb / 1024 < 5 * size_mb, html_kb


# -- the real CLI and daemon ----------------------------------------------------------


@pytest.mark.slow
def test_cli_indexes_pdf_and_html_by_mask(env: Env, daemon: Daemon, tmp_path: Path) -> None:
    root = write(
        tmp_path / "docs",
        {
            "report.pdf": make_pdf(
                [lines_of(1), lines_of(2, marks={(2, 6): "zanzibar harbour"}), lines_of(3)], title="Quarterly"
            ),
            "scan.pdf": scanned_pdf(),
            "locked.pdf": encrypted(make_pdf([["locked words"]]), user="pw"),
            "guide.html": PAGE,
            "empty.html": "<html><head><script>scriptonlyzz()</script></head><body></body></html>",
            "note.md": "# Note\n\nzanzibar in markdown\n",
            "skipped.txt": "zanzibar outside the mask\n",
        },
    )
    out = run(env, "collection", "add", str(root), "--name", "docs", "--mask", "**/*.{md,pdf,html}")
    assert out.counts == [(3, 0, 0, 0)], out.output
    assert "Read: 1 html, 1 markdown, 1 pdf" in out.output  # what each loader read
    for path, reason in {
        "scan.pdf": "PDF has no text layer (scanned?)",
        "locked.pdf": "encrypted PDF (it needs a password to open)",
        "empty.html": "HTML has no text",
    }.items():
        assert f"⚠ Skipped {path}: {reason}" in out.stderr
    assert skipped_in_status(env) == {
        "scan.pdf": "PDF has no text layer (scanned?)",
        "locked.pdf": "encrypted PDF (it needs a password to open)",
        "empty.html": "HTML has no text",
    }

    hits = {h["file"]: h for h in env.json("search", "zanzibar", "--json")}
    assert set(hits) == {"qmd://docs/report.pdf", "qmd://docs/note.md"}
    pdf = hits["qmd://docs/report.pdf"]
    assert (pdf["page"], pdf["pageLines"], pdf["lines"], pdf["title"]) == (2, "5-8", "16-19", "Quarterly")
    assert "page" not in hits["qmd://docs/note.md"]
    text = env.ok("search", "zanzibar", "-c", "docs")
    assert "qmd://docs/report.pdf:17 " in text and "(page 2, lines 5-8)" in text

    start, end = (int(n) for n in pdf["lines"].split("-"))
    got = env.ok("get", f"docs/report.pdf:{start}:{end - start + 1}")
    assert "(page 2, lines 5-8)" in got.split("\n")[0]
    assert got.split("---\n\n", 1)[1] == (
        "16: page 2 line 5 text\n17: page 2 line 6 text zanzibar harbour\n18: page 2 line 7 text\n"
        "19: page 2 line 8 text\n"
    )
    assert env.ok("get", "docs/report.pdf#page=2:6:1", "--no-line-numbers").endswith(
        "\npage 2 line 6 text zanzibar harbour\n"
    )
    bad = env.qmd("get", "docs/report.pdf#page=9")
    assert bad.returncode != 0 and "has 3 pages; page 9 does not exist" in bad.stderr
    assert "Traceback" not in bad.stderr

    assert env.json("search", "scriptwordzz", "--json") == []
    assert env.json("search", "navwordzz", "--json") == []
    (guide,) = env.json("search", "Danube", "--json")
    assert guide["title"] == "Guide to Rivers"
    assert env.json("search", "outside", "--json") == []  # the mask decided: no .txt

    answer = tool(daemon, "query", {"searches": [{"type": "lex", "query": "zanzibar harbour"}]})
    assert "docs/report.pdf:16-19 (page 2, lines 5-8)" in text_of(answer)
    result = json.dumps(answer.structured_content)
    assert '"page": 2' in result and '"pageLines": "5-8"' in result
    (res,) = resources_of(tool(daemon, "get", {"file": "docs/report.pdf#page=2:6:1"}))
    assert res.text.startswith("<!-- page 2, lines 6-6 -->") and "17: page 2 line 6 text zanzibar harbour" in res.text
