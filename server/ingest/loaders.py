"""Loaders by extension (seeds/001): what a file's bytes become in the index.

One small interface, consulted by the file's extension: a `Loader` turns bytes into the
text that is indexed, chunked, embedded and read back by `get`, plus a title, or raises
`LoadError` with the real reason the file cannot be searched, which the indexer reports
as a skip (`qmd update`, `qmd status`). The content hash stays the hash of the file's
bytes, so change detection does not depend on what a loader makes of them.

- **markdown** and **text** (every extension without a loader of its own): the bytes as
  UTF-8, unchanged, so line numbers are the file's. Markdown keeps its markup: headings
  are the chunker's best splitting signal and rewriting text would move every pointer.
- **html**: the page's main content as text, read by libxml2 through lxml's streaming
  parser (BSD, maintained with libxml2). Measured on a generated 50 MB page (2 cores):
  lxml's parser with a target 0.4 s and 174 MB peak RSS, selectolax (Lexbor, MIT) 0.2 s
  and 249 MB but its `text()` breaks every inline element onto a line of its own,
  readability-lxml (Apache) 17 s and 959 MB, trafilatura (Apache; the best boilerplate
  heuristics, and 30 dependencies) 41 s and 630 MB; jusText (BSD) kept nothing of a
  page whose words are not in its stop list. A streaming parser never holds a tree, so
  memory is the text kept, the same order as a markdown file of that size. The rules are
  structural and predictable: `<main>` (or `role=main`) when the page has one, never
  script, style, nav, aside, forms or a page-level header/footer, and blocks become lines.
- **pdf**: text per page through pypdf (BSD, pure Python). On a generated 400-page PDF,
  pypdfium2 (Apache/BSD) took 0.57 s, pypdf 1.8 s, pdfminer.six (MIT) 14.9 s; pypdf is
  chosen over PDFium because a hostile PDF can then only raise, never crash the daemon
  (PDFium is native code in qmdd's process; llama.cpp is kept in a worker for that reason).
  Pages are joined by a line holding a single form feed, so the body alone says where
  each page starts (`Pages`), and a pointer names the page and its lines within it.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import re
from collections.abc import Callable
from dataclasses import dataclass

from qmd.server.text import frontmatter
from qmd.server.text.pages import PAGE_BREAK, PAGED_EXTENSIONS


class LoadError(Exception):
    """A file its loader cannot make searchable text of; `reason` is what the user is told."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Extracted:
    """What a loader makes of a file: the text to index and its title."""

    text: str
    title: str


@dataclass(frozen=True)
class Loader:
    """How files of some extensions become text. `paged` loaders join pages with
    `PAGE_BREAK` lines, which `Pages` reads back for pointers and `get`."""

    name: str
    extensions: frozenset[str]
    read: Callable[[str, bytes], Extracted]
    paged: bool = False
    version: str = ""
    """Salts the content key (`content_key`): a loader's text, and the vectors made from
    it, are never taken for another loader's (or an older version's) of the same bytes.
    Empty for the loaders whose text is the file itself."""
    isolated: bool = False
    """Parsed in a child process with a time and memory budget (`sandbox`): a pure-Python
    parser of a hostile file cannot be interrupted in the daemon's own threads."""

    def content_key(self, data: bytes) -> str:
        """The hash a document's text and vectors are stored under."""
        salt = f"{self.version}\0".encode() if self.version else b""
        return hashlib.sha256(salt + data).hexdigest()


def _extension(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def file_stem(path: str) -> str:
    """The file name without its extension: the title of a document that states none."""
    name = path.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[0] if "." in name else name


# -- markdown and text ------------------------------------------------------------

_FM_TITLE_RE = re.compile(r"^title:[ \t]*(.+?)[ \t]*$", re.M)
_HEADING_RE = re.compile(r"^##?[ \t]+(.*\S)", re.M)
_H2_RE = re.compile(r"^##[ \t]+(.*\S)", re.M)
_ORG_TITLE_RE = re.compile(r"^#\+TITLE:[ \t]*(.*\S)", re.M | re.I)
_ORG_HEADING_RE = re.compile(r"^\*+[ \t]+(.*\S)", re.M)


def extract_title(path: str, text: str) -> str:
    """Frontmatter `title:`, else the original's rule (first H1/H2, skipping "Notes"),
    else the file name without extension.

    Headings are looked for after the frontmatter, where a YAML comment (`# draft`)
    would otherwise become the title; blank headings (`#` alone) are not titles.
    """
    ext = _extension(path)
    head = text[:65536].removeprefix("\ufeff")
    if ext in frontmatter.MARKDOWN_EXTENSIONS:
        fm = frontmatter.FRONTMATTER_RE.match(head)
        if fm:
            t = _FM_TITLE_RE.search(fm.group(1))
            if t and t.group(1).strip("'\" "):
                return t.group(1).strip().strip("'\"").strip()
            head = head[fm.end() :]
        m = _HEADING_RE.search(head)
        if m:
            title = m.group(1).strip()
            if title in ("Notes", "📝 Notes"):
                h2 = _H2_RE.search(head)
                if h2:
                    return h2.group(1).strip()
            return title
    elif ext == "org":
        m = _ORG_TITLE_RE.search(head) or _ORG_HEADING_RE.search(head)
        if m:
            return m.group(1).strip()
    return file_stem(path)


def _read_text(path: str, data: bytes) -> Extracted:
    """The file as it is: UTF-8, no NUL bytes, not blank."""
    if b"\x00" in data[:8192]:
        raise LoadError("binary (NUL bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LoadError(f"not UTF-8 (invalid byte at offset {e.start})") from e
    if not text.strip():
        raise LoadError("empty")
    return Extracted(text, extract_title(path, text))


MARKDOWN = Loader("markdown", frontmatter.MARKDOWN_EXTENSIONS, _read_text)
TEXT = Loader("text", frozenset(), _read_text)


# -- HTML -------------------------------------------------------------------------

# Never content: code, styling, and the furniture around a page's text.
_DROPPED = frozenset(
    {"head", "script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "embed", "nav", "aside"}
    | {"form", "button", "select", "textarea", "dialog", "menu"}
)
# The page's banner and footer, unless they belong to the main content (an article's header holds its title).
_FURNITURE = frozenset({"header", "footer"})
_DROPPED_ROLES = frozenset({"navigation", "banner", "contentinfo", "complementary", "search", "menu", "menubar"})
_CONTENT = frozenset({"main", "article"})
# Blocks that end a paragraph (a blank line after) and blocks that only end a line.
_PARAGRAPHS = frozenset(
    {"p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "table", "ul", "ol", "dl", "figure"}
    | {"section", "article", "main", "hr", "address", "details", "fieldset"}
)
_LINES = frozenset({"div", "br", "li", "tr", "dt", "dd", "figcaption", "summary", "caption", "body", "td", "th"})
_SPACE = re.compile(r"\s+")
_META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)
_FEED_CHARS = 1 << 20


_WEB_ENCODINGS = frozenset(
    codecs.lookup(name).name
    for name in (
        "utf-8 utf-16-le utf-16-be ibm866 koi8-r koi8-u mac-roman mac-cyrillic cp874 cp1250 cp1251 cp1252 cp1253"
        " cp1254 cp1255 cp1256 cp1257 cp1258 iso8859-1 iso8859-2 iso8859-3 iso8859-4 iso8859-5 iso8859-6 iso8859-7"
        " iso8859-8 iso8859-10 iso8859-13 iso8859-14 iso8859-15 iso8859-16 ascii gbk gb18030 big5 euc-jp iso2022-jp"
        " shift_jis euc-kr"
    ).split()
)
"""The WHATWG Encoding Standard's encodings that Python has (and ASCII and Latin-1, which
it reads as windows-1252). A `<meta charset>` naming anything else is ignored, as a
browser ignores it: Python's codec registry also holds `base64`, `zlib`, `rot13`, `idna`
and `undefined`, which are not text encodings, and a page must not pick its decoder."""


def _html_encoding(data: bytes) -> str:
    """The encoding a browser would use: a BOM, else a `<meta charset>` near the top
    naming a web encoding (HTML's prescan; a meta claiming UTF-16 means UTF-8), else
    UTF-8 when the bytes are, else windows-1252, the web's legacy default."""
    for bom, name in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            return name
    m = _META_CHARSET.search(data[:4096])
    if m:
        try:
            name = codecs.lookup(m.group(1).decode("ascii")).name
        except LookupError:
            name = ""
        if name in _WEB_ENCODINGS:
            return "utf-8" if name.startswith("utf-16") else name
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "cp1252"
    return "utf-8"


class _PageText:
    """An lxml parser target: text events become lines, as they stream in. No tree is
    built, so a huge page costs the text it keeps, and nesting depth costs nothing."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._line: list[str] = []
        self._line_has_text = False
        self._depth = 0
        self._dropped_at = 0
        """The depth of the element being dropped (0: none)."""
        self._pre = 0
        self._content = 0
        """How many `main`/`article` elements are open: their header and footer are content."""
        self._main_at = 0
        self.main: tuple[int, int] | None = None
        """The first `<main>`'s lines: [start, end) in `lines`."""
        self._title: list[str] | None = None
        self.title = ""
        self._h1: list[str] | None = None
        self.h1 = ""

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        self._depth += 1
        if tag == "title" and not self.title:
            self._title = []
        if self._dropped_at:
            return
        role = (attrib.get("role") or "").lower()
        if (
            tag in _DROPPED
            or (tag in _FURNITURE and not self._content)
            or role in _DROPPED_ROLES
            or "hidden" in attrib
            or (attrib.get("aria-hidden") or "").lower() == "true"
        ):
            self._dropped_at = self._depth
            return
        if tag in _CONTENT:
            self._content += 1
        if tag == "pre":
            self._pre += 1
        if tag == "h1" and not self.h1:
            self._h1 = []
        self._break(tag)
        if (tag == "main" or role == "main") and self.main is None and not self._main_at:
            self._main_at = self._depth
            self.main = (len(self.lines), len(self.lines))

    def end(self, tag: str) -> None:
        if tag == "title" and self._title is not None:
            self.title = _SPACE.sub(" ", "".join(self._title)).strip()
            self._title = None
        if self._dropped_at:
            if self._dropped_at == self._depth:
                self._dropped_at = 0
            self._depth -= 1
            return
        if tag == "h1" and self._h1 is not None:
            self.h1 = _SPACE.sub(" ", "".join(self._h1)).strip()
            self._h1 = None
        self._break(tag)
        if tag in _CONTENT:
            self._content -= 1
        if tag == "pre":
            self._pre -= 1
        if self._main_at == self._depth:
            self._main_at = 0
            assert self.main is not None
            self.main = (self.main[0], len(self.lines))
        self._depth -= 1

    def data(self, text: str) -> None:
        if self._title is not None:
            self._title.append(text)
        if self._dropped_at:
            return
        if self._h1 is not None:
            self._h1.append(text)
        if self._pre:
            first, *rest = text.split("\n")
            self._line.append(first)
            for part in rest:
                self._end_line()
                self._line.append(part)
            self._line_has_text = bool(self._line[-1])
            return
        text = _SPACE.sub(" ", text)
        if not self._line_has_text:
            text = text.lstrip()
        if text:
            self._line.append(text)
            self._line_has_text = True

    def comment(self, text: str) -> None:
        """Comments are not content."""

    def close(self) -> None:
        self._end_line()

    def _end_line(self) -> None:
        line = "".join(self._line).rstrip()
        self._line = []
        self._line_has_text = False
        if line.strip() or self._pre:
            self.lines.append(line)

    def _break(self, tag: str) -> None:
        if tag in _PARAGRAPHS:
            self._end_line()
            if self.lines and self.lines[-1]:
                self.lines.append("")
        elif tag in _LINES:
            self._end_line()


def _page_lines(lines: list[str]) -> str:
    """Lines without leading or trailing blank ones."""
    lo, hi = 0, len(lines)
    while lo < hi and not lines[lo].strip():
        lo += 1
    while hi > lo and not lines[hi - 1].strip():
        hi -= 1
    return "\n".join(lines[lo:hi])


def _read_html(path: str, data: bytes) -> Extracted:
    """The page's main content as lines of text; title from `<title>`, else the first `<h1>`."""
    from lxml import etree

    encoding = _html_encoding(data)
    if encoding == "utf-8" and b"\x00" in data[:8192]:
        raise LoadError("binary (NUL bytes)")
    try:
        text = data.decode(encoding, errors="replace")
    except (UnicodeError, LookupError) as e:  # a codec's own failure, whatever `replace` promises
        raise LoadError(f"HTML could not be read as {encoding} ({e})") from e
    target = _PageText()
    # recover: browsers render broken markup, so must we; huge_tree: libxml2 would
    # otherwise refuse a text node over 10 MB. Text is fed, already decoded, in slices.
    parser = etree.HTMLParser(target=target, recover=True, huge_tree=True, no_network=True)
    try:
        for i in range(0, len(text), _FEED_CHARS):
            parser.feed(text[i : i + _FEED_CHARS])
        parser.close()
    except etree.LxmlError:
        # libxml2 raises only when it found no element at all: there is no text either.
        target.close()
    del text
    lines = target.lines
    body = ""
    if target.main is not None:
        body = _page_lines(lines[target.main[0] : target.main[1]])
    if not body.strip():
        body = _page_lines(lines)
    if not body.strip():
        raise LoadError("HTML has no text")
    return Extracted(body, target.title or target.h1 or file_stem(path))


HTML = Loader("html", frozenset({"html", "htm", "xhtml"}), _read_html, version="html-1", isolated=True)


# -- PDF --------------------------------------------------------------------------

"""A paged body's pages are joined by a line holding only this (a form feed, as pdftotext
ends its pages), so the page map is read from the body itself: nothing else to store."""
_SURROGATE = re.compile("[\ud800-\udfff]")
_TITLE_CHARS = 200
_PLACEHOLDER_TITLES = frozenset({"untitled", "untitled document", "title"})
"""What PDF writers put in the title field when nobody gave one (reportlab: "untitled")."""


def _clean_page(text: str) -> str:
    """A page's text as lines: no form feed (it marks pages), no NUL, no lone surrogate
    (SQLite cannot store one), no trailing spaces."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace(PAGE_BREAK, "\n").replace("\x00", "")
    text = _SURROGATE.sub("\ufffd", text)
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")


def _read_pdf(path: str, data: bytes) -> Extracted:
    """Each page's text layer, in order; title from the PDF's metadata, else its first
    line of text (a PDF without any is skipped, so it has one)."""
    from pypdf import PasswordType, PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:
            raise LoadError("encrypted PDF (it needs a password to open)")
        pages = [_clean_page(page.extract_text() or "") for page in reader.pages]
        meta_title = (reader.metadata.title if reader.metadata else None) or ""
    except LoadError:
        raise
    except (FileNotDecryptedError, DependencyError) as e:
        raise LoadError(f"encrypted PDF ({e})") from e
    except Exception as e:  # noqa: BLE001 - a parser of untrusted files: whatever it raises is this file's skip
        raise LoadError(f"PDF could not be read ({type(e).__name__}: {e})") from e
    if not pages:
        raise LoadError("PDF has no pages")
    if not any(p.strip() for p in pages):
        raise LoadError("PDF has no text layer (scanned?)")
    body = f"\n{PAGE_BREAK}\n".join(pages)
    title = _SPACE.sub(" ", _SURROGATE.sub("\ufffd", str(meta_title))).strip()
    if not title or title.lower() in _PLACEHOLDER_TITLES:
        # Some page has text (else the file was skipped), so there is a first line.
        title = next(line.strip()[:_TITLE_CHARS] for line in body.split("\n") if line.strip())
    return Extracted(body, title)


PDF = Loader("pdf", PAGED_EXTENSIONS, _read_pdf, paged=True, version="pdf-1", isolated=True)


# -- the registry -----------------------------------------------------------------

LOADERS = (MARKDOWN, HTML, PDF)
_BY_EXTENSION = {ext: loader for loader in LOADERS for ext in loader.extensions}


def loader_for(path: str) -> Loader:
    """The loader of `path`'s extension; plain text for every other one."""
    return _BY_EXTENSION.get(_extension(path), TEXT)


def load(path: str, data: bytes) -> Extracted:
    """`data` (the file at collection-relative `path`) as indexed text, or `LoadError`."""
    return loader_for(path).read(path, data)
