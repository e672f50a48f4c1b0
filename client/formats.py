"""Rendering of daemon answers for the `qmd` CLI (spec §15.3–15.4, §16.2–16.3, §18).

The CLI imports this module on every call, so it uses the standard library only:
a heavy import here would slow down `qmd --help` as much as one in the CLI itself.

Every renderer returns the complete stdout text, ending with a newline unless it is
empty, so the caller writes it verbatim. Search and multi-get renderers also return
stderr warnings (one line each, no newline) so stdout stays machine-clean.

Deliberate departures from the original qmd (§26):
- snippet line numbers are the real file line numbers (passage numbered from
  `start_line`, the `@@` header unnumbered), the same in every format;
- XML is escaped in content and attributes, and characters XML 1.0 cannot carry
  at all are replaced by U+FFFD, so the output always parses;
- multi-get `file` is always the `qmd://` URI.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol
from urllib.parse import quote

from qmd.client import api
from qmd.defaults import snippet_header
from qmd.uri import with_range

FORMATS = ("cli", "json", "csv", "md", "xml", "files")

DEFAULT_EDITOR_URI = "vscode://file/{path}:{line}:{col}"

SEARCH_CSV_HEADER = ("docid", "score", "file", "title", "context", "line", "snippet")
MULTI_GET_CSV_HEADER = ("docid", "file", "title", "context", "skipped", "body", "truncated_lines")

_RESET = "\x1b[0m"
_BOLD = "\x1b[1m"
_DIM = "\x1b[2m"
_GREEN = "\x1b[32m"
_YELLOW = "\x1b[33m"
_CYAN = "\x1b[36m"

# Terms shorter than this light up half of every line ("a", "of"), so the
# original only highlights longer ones (§15.4).
_MIN_HIGHLIGHT_LEN = 3

# Code points XML 1.0 forbids even as character references: leaving one in makes
# the whole document unparseable, so they are replaced rather than escaped.
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")

# Escaping is a translate table rather than xml.sax.saxutils, whose import pulls in
# urllib.request and http.client (~30 ms on every CLI call). `>` is escaped too, so
# a literal `]]>` can never appear.
_XML_TEXT_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
# Attribute values are normalised by XML parsers (newline/tab become spaces);
# encoding them as references keeps titles and contexts byte-exact.
_XML_ATTR_ESCAPES = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"} | {"\n": "&#10;", "\r": "&#13;", "\t": "&#9;"}
)

# What JavaScript's encodeURI leaves alone, minus `?` and `#`: editors would read
# those as a query or fragment of the file URI and open the wrong path (§18.2).
_URI_PATH_SAFE = ";,/:@&=+$!*'()"

_SEPARATOR = "=" * 60


class _TTYProbe(Protocol):
    """The only thing `Style.detect` needs from a stream."""

    def isatty(self) -> bool: ...


class Style(NamedTuple):
    """Terminal capabilities, decided once per process so every renderer agrees.

    A NamedTuple, not a dataclass: `dataclasses` pulls in `inspect`, ~6 ms on every
    CLI start."""

    color: bool
    links: bool
    editor_uri: str = DEFAULT_EDITOR_URI

    @classmethod
    def detect(
        cls,
        stream: _TTYProbe,
        environ: Mapping[str, str] = os.environ,
        editor_uri: str | None = None,
    ) -> Style:
        """Derive the style from stdout and the environment.

        Colour and hyperlinks are for people: a pipe or file gets plain text.
        `NO_COLOR` (any non-empty value, per no-color.org) turns colour off but not
        hyperlinks, which are invisible markup rather than colour. The editor template
        precedence is `QMD_EDITOR_URI` > `editor_uri` (the caller's config value) >
        the VS Code default (§18.2).
        """
        tty = stream.isatty()
        template = (environ.get("QMD_EDITOR_URI") or "").strip() or (editor_uri or "").strip()
        return cls(
            color=tty and not environ.get("NO_COLOR"),
            links=tty,
            editor_uri=template or DEFAULT_EDITOR_URI,
        )


# ---------------------------------------------------------------------------
# Small public helpers
# ---------------------------------------------------------------------------


def add_line_numbers(text: str, start: int = 1) -> str:
    """Prefix every line with `"{n}: "` so a reader can cite and re-fetch exact lines.

    Empty text stays empty: numbering it would invent a line that is not there
    (e.g. `get file:500` past the end of the file).
    """
    if not text:
        return ""
    return "\n".join(f"{start + i}: {line}" for i, line in enumerate(text.split("\n")))


# Between the levels of a context (global, collection, folder) in one-line formats.
CONTEXT_SEPARATOR = " | "
_CONTEXT_LEVEL_BREAK = re.compile(r"[ \t]*(?:\r?\n[ \t]*){2,}")
_CONTEXT_LINE_BREAK = re.compile(r"[ \t]*\r?\n[ \t]*|\r")


def context_line(context: str | None) -> str:
    """A context on one line, for the formats that hold a record per line (text, CSV,
    `--files`, Markdown's labels). The daemon joins a document's context levels (global,
    collection, then each folder, outermost first) with a blank line; here the levels are
    joined by `CONTEXT_SEPARATOR` and a line break inside one level becomes a space, so
    every level is kept and no record ever spills onto a second line. JSON and XML keep
    the text as it is."""
    if not context:
        return ""
    levels = (_CONTEXT_LINE_BREAK.sub(" ", level).strip() for level in _CONTEXT_LEVEL_BREAK.split(context.strip()))
    return CONTEXT_SEPARATOR.join(level for level in levels if level)


def number_window(body: str, start: int, lines: int) -> str:
    """`body`, the `lines` lines of a file from line `start`, each numbered with its real
    number: one empty line (a file's last, after its final newline) is `N: `, not
    nothing, so the numbers always match the window the daemon read."""
    return f"{start}: " if not body and lines > 0 else add_line_numbers(body, start)


def truncation_note(lines: int) -> str:
    """The unnumbered line after a body cut by `-l`: never a line of the file."""
    return f"[... truncated {lines} more lines]"


def editor_link(abs_path: str, line: int, template: str) -> str:
    """Fill an editor URI template (§18.2).

    `{path}` is percent-encoded like JavaScript's `encodeURI`, plus `?` and `#`;
    `{line}` is the match line and `{col}`/`{column}` are 1. Non-positive numbers
    become 1 because editors reject line 0. The path is substituted first and is
    fully encoded, so braces inside it can never be mistaken for placeholders.
    """
    safe_line = line if line > 0 else 1
    encoded = quote(abs_path, safe=_URI_PATH_SAFE, errors="surrogateescape")
    return (
        template.replace("{path}", encoded)
        .replace("{line}", str(safe_line))
        .replace("{col}", "1")
        .replace("{column}", "1")
    )


def osc8(url: str, text: str) -> str:
    """Wrap text in an OSC 8 terminal hyperlink (ESC ] 8 ; ; url BEL text ESC ] 8 ; ; BEL)."""
    return f"\x1b]8;;{url}\x07{text}\x1b]8;;\x07"


def resolve_full_path(abs_path: str | None, cwd: str | None = None) -> str | None:
    """The `--full-path` identifier for a file, or None when it is not on disk (§18.3).

    Files under the working directory are shown as `./rel` so they are unmistakably
    filesystem paths; anything else as its absolute realpath, so symlinks display
    consistently. None means the index is stale (file moved or deleted) and the
    caller must keep the `qmd://` URI and docid, which still address the row.
    """
    if not abs_path or not os.path.exists(abs_path):
        return None
    real = os.path.realpath(abs_path)
    base = os.path.realpath(cwd if cwd is not None else os.getcwd())
    if real == base:
        return "./"
    if real.startswith(base.rstrip(os.sep) + os.sep):
        return "./" + os.path.relpath(real, base)
    return real


def full_path_warning(unresolved: int, total: int) -> str | None:
    """The stderr notice for rows `--full-path` could not resolve, or None if all resolved.

    Falling back to `qmd://` silently would hide a stale index; saying it on stderr
    keeps stdout parseable. Public so `qmd get` (whose renderer returns only stdout)
    can emit the same text.
    """
    if unresolved <= 0:
        return None
    subject = "the file" if total == 1 else f"{unresolved} of {total} results"
    return (
        f"warning: --full-path could not resolve {subject} on disk "
        "(moved or deleted since indexing); showing qmd:// + docid instead. "
        "Run 'qmd update' to refresh the index."
    )


# ---------------------------------------------------------------------------
# Internal helpers
# ---------------------------------------------------------------------------


class _Ident(NamedTuple):
    """How one row names its document: the visible identifier and its docid, if shown."""

    name: str
    docid: str | None  # with '#', or None when --full-path replaced it by a path
    resolved: bool


def _identify(row: Mapping[str, Any], full_path: bool, cwd: str | None) -> _Ident:
    """Pick the row identifier: `qmd://` URI + docid, or the on-disk path under --full-path."""
    docid = f"#{row['docid']}" if row.get("docid") else None
    if full_path:
        disk = resolve_full_path(row.get("abs_path"), cwd)
        if disk is not None:
            return _Ident(disk, None, True)
    return _Ident(row["file"], docid, False)


def _identify_all(
    rows: Sequence[Mapping[str, Any]], full_path: bool, cwd: str | None
) -> tuple[list[_Ident], list[str]]:
    """Identify every row up front so the warning can count the unresolved ones."""
    idents = [_identify(row, full_path, cwd) for row in rows]
    warnings: list[str] = []
    if full_path:
        notice = full_path_warning(sum(not i.resolved for i in idents), len(idents))
        if notice is not None:
            warnings.append(notice)
    return idents, warnings


def _paint(text: str, code: str, style: Style) -> str:
    """Apply an ANSI code only when colour is on, so plain output never holds ESC."""
    return f"{code}{text}{_RESET}" if style.color else text


def _rounded(score: float | None) -> float | None:
    return None if score is None else _round_half_up(score, 2)


def _round_half_up(value: float, digits: int) -> float:
    """Round like JavaScript's `Math.round(x * 10**d) / 10**d`, which the original used.

    Python's `round` rounds halves to even (0.125 → 0.12), which would make scores
    differ from qmd's for no reason.
    """
    factor = 10**digits
    return math.floor(value * factor + 0.5) / factor


def _hunk_header(hit: api.HitOut) -> str:
    """The `@@` header of a hit's passage, built from its real line range."""
    start, end = hit["start_line"], hit["end_line"]
    return snippet_header(start, end - start + 1, hit["total_lines"])


def _on_pages(spans: Sequence[api.PageSpan]) -> str:
    """A PDF's lines as a reader with the file open finds them: the page, and the lines
    within it (`qmd get FILE#page=N:FROM:COUNT` reads them)."""
    first, last = spans[0], spans[-1]
    if len(spans) == 1:
        return f"page {first['page']}, lines {first['start_line']}-{first['end_line']}"
    return f"pages {first['page']}-{last['page']}"


def _content(hit: api.HitOut, full: bool, line_numbers: bool) -> str:
    """The text a non-CLI format shows for a hit: whole body (--full) or header + passage.

    Passage lines are numbered from `start_line` (their real numbers) and the header
    is left unnumbered, unlike the original, whose numbers were off by one or two (§26).
    """
    if full:
        body = hit.get("body") or ""
        return add_line_numbers(body) if line_numbers else body
    passage = hit.get("snippet") or ""
    if line_numbers:
        passage = add_line_numbers(passage, hit["start_line"])
    return f"{_hunk_header(hit)}\n{passage}"


def _csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """RFC 4180 CSV with `\\n` between records.

    Each record is written with a CRLF terminator and the terminator is then cut:
    the csv module only quotes characters it finds in the terminator, and a CR
    inside a field must be quoted too, which a plain `\\n` terminator would miss.
    """
    out = []
    for record in (header, *rows):
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\r\n").writerow(record)
        out.append(buffer.getvalue()[:-2])
    return "\n".join(out) + "\n"


def _files_context(context: str | None) -> str:
    """The optional trailing `,"context"` field of the `files` format (quotes doubled)."""
    if not context:
        return ""
    escaped = context_line(context).replace('"', '""')
    return f',"{escaped}"'


def _xml_text(value: str) -> str:
    """Escape element content."""
    return _XML_ILLEGAL.sub("\ufffd", value).translate(_XML_TEXT_ESCAPES)


def _xml_attr(value: str) -> str:
    """Escape an attribute value for use inside double quotes."""
    return _XML_ILLEGAL.sub("\ufffd", value).translate(_XML_ATTR_ESCAPES)


def _fence(body: str) -> str:
    """Wrap a document in a Markdown code fence longer than any backtick run inside it.

    Markdown documents contain ``` fences of their own; a fixed ``` fence would be
    closed by the first one and the rest of the document would render as Markdown.
    """
    longest = max((len(run) for run in re.findall("`+", body)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}\n{body}\n{ticks}"


def _highlight(text: str, terms: Sequence[str], style: Style) -> str:
    """Wrap query terms (≥3 chars, case-insensitive, literal) in yellow+bold (§15.4).

    One alternation, longest term first, so a term inside another term's match or
    inside an inserted escape code is never re-highlighted.
    """
    if not style.color:
        return text
    words = sorted({t for t in terms if len(t) >= _MIN_HIGHLIGHT_LEN}, key=len, reverse=True)
    if not words:
        return text
    pattern = re.compile("|".join(re.escape(w) for w in words), re.IGNORECASE)
    return pattern.sub(lambda m: f"{_YELLOW}{_BOLD}{m.group(0)}{_RESET}", text)


def _has_match(hit: api.HitOut) -> bool:
    """Whether any query term occurs in the passage, i.e. whether `:line` means anything."""
    passage = (hit.get("snippet") or "").lower()
    return any(t and t.lower() in passage for t in hit.get("terms") or ())


def _score_text(score: float, style: Style) -> str:
    """Score as a 3-wide percentage, coloured by band when colour is on (§18.1)."""
    pct = f"{math.floor(score * 100 + 0.5):>3}%"
    if score >= 0.7:
        return _paint(pct, _GREEN, style)
    if score >= 0.4:
        return _paint(pct, _YELLOW, style)
    return _paint(pct, _DIM, style)


def closest_line(hit: api.HitOut, floor: float) -> str:
    """What a query whose every result fell below `--min-relevance` says instead (stderr)."""
    chance = hit.get("relevance") or 0.0
    return (
        f"no result above the relevance floor ({floor:g}); the closest: {hit['file']}:{hit['start_line']}"
        f" - {hit['title']} (relevance {chance:.3f}), probably not relevant"
    )


def stage_lines(answer: api.CliQueryResponse, *, verbose: bool) -> list[str]:
    """What each stage of a hybrid query did (stderr): skipped and partial stages always,
    every stage with its time when `verbose`."""
    lines = []
    for st in answer.get("stages") or []:
        if verbose or st["status"] in ("skipped", "partial"):
            timing = f" ({st['ms']:.0f} ms)" if st["status"] not in ("skipped", "off") or st["ms"] else ""
            lines.append(f"{st['stage']}: {st['status']}{timing}" + (f" - {st['detail']}" if st["detail"] else ""))
    if verbose and (expansion := answer.get("expansion")):
        lines += [f"  ├─ {e['type']}: {e['query'][:72]}" for e in expansion]
    if verbose:
        budget = answer.get("budget_ms")
        lines.append(f"total: {answer.get('elapsed_ms', 0):.0f} ms" + (f" (budget {budget} ms)" if budget else ""))
    return lines


def _explain_lines(explain: Mapping[str, Any]) -> list[str]:
    """The `--explain` summary printed under the score line (§14.4)."""

    def num(value: float) -> str:
        return f"{value:.4f}"

    def listing(values: Sequence[float]) -> str:
        return ", ".join(num(v) for v in values) if values else "none"

    if "cosine_distance" in explain:  # vector search: the nearest chunk's distance, and the score it makes
        d, (first, last), score = explain["cosine_distance"], explain["chunk_lines"], explain["score"]
        return [f"Explain: cosine distance {d:.4f} to the chunk at lines {first}-{last}; score 1/(1+d) = {score:.4f}"]
    if "rrf" not in explain:  # keyword search: no fusion, no rerank, only which terms matched
        return [f"Explain: BM25 matched {explain.get('bm25_terms_matched', 0)} of {explain.get('terms', 0)} terms"]
    rrf = explain["rrf"]
    weight = rrf.get("weight", 1.0)
    lines = [
        f"Explain: fts=[{listing(explain.get('ftsScores') or [])}] vec=[{listing(explain.get('vectorScores') or [])}]",
        f"  RRF: total={num(rrf.get('totalScore', 0.0))} base={num(rrf.get('baseScore', 0.0))} "
        f"bonus={num(rrf.get('topRankBonus', 0.0))} rank={rrf.get('rank', 0)}",
    ]
    if explain.get("scoredBy") == "relevance":  # a plain query without a rerank: ranked by its relevance
        fusion = num(rrf.get("positionScore", 0.0))
        lines.append(f"  Score: relevance = {num(explain.get('blendedScore', 0.0))} (fusion {fusion})")
    else:
        lines.append(
            f"  Blend: {round(weight * 100)}%*{num(rrf.get('positionScore', 0.0))} + "
            f"{round((1 - weight) * 100)}%*{num(explain.get('rerankScore', 0.0))} = "
            f"{num(explain.get('blendedScore', 0.0))}"
        )
    if chance := explain.get("relevance"):  # the logistic's terms, which the server weighs
        summed = " + ".join(f"{t['weight']:g}*{t['value']:.4f} {t['name']}" for t in chance["terms"])
        bias = chance["bias"]
        sign = "-" if bias < 0 else "+"
        lines.append(f"  Relevance: logistic({summed} {sign} {abs(bias):g}) = {num(chance['probability'])}")
    contributions = sorted(rrf.get("contributions") or [], key=lambda c: c.get("rrfContribution", 0.0), reverse=True)[
        :3
    ]
    if contributions:
        summary = " | ".join(
            f"{c.get('source')}/{c.get('queryType')}#{c.get('rank')}:{num(c.get('rrfContribution', 0.0))}"
            for c in contributions
        )
        lines.append(f"  Top RRF contributions: {summary}")
    if explain.get("rerankRaw") is not None:
        cached = " (cached)" if explain.get("rerankCached") else ""
        lines.append(f"  Rerank: raw={explain['rerankRaw']:.4f} -> {num(explain.get('rerankScore', 0.0))}{cached}")
    return lines


# ---------------------------------------------------------------------------
# Search results (§18.1)
# ---------------------------------------------------------------------------


def _empty_search(fmt: str, below_min_score: bool) -> str:
    """Format-safe empty output: parsers get a valid empty document, people a sentence."""
    if fmt == "json":
        return "[]\n"
    if fmt == "csv":
        return _csv_text(SEARCH_CSV_HEADER, [])
    if fmt == "xml":
        return "<results></results>\n"
    if fmt == "cli":
        if below_min_score:
            return "No results found above minimum score threshold.\n"
        return "No results found.\n"
    return ""


def _search_json(hits: Sequence[api.HitOut], idents: Sequence[_Ident], full: bool, line_numbers: bool) -> str:
    """Pretty JSON array; `lines` gives agents the passage range to `get` directly."""
    out = []
    for hit, ident in zip(hits, idents):
        item: dict[str, Any] = {}
        if ident.docid:
            item["docid"] = ident.docid
        item["score"] = _round_half_up(hit["score"], 2)
        if "fusion" in hit:  # the hybrid query's score components
            item["fusion"] = _rounded(hit.get("fusion"))
        if "rerank" in hit:
            item["rerank"] = _rounded(hit.get("rerank"))
        if "relevance" in hit:
            item["relevance"] = _rounded(hit.get("relevance"))
        item["file"] = ident.name
        item["line"] = hit["line"]
        item["lines"] = f"{hit['start_line']}-{hit['end_line']}"
        if page := hit.get("page"):
            item["page"] = page["page"]
            item["pageLines"] = f"{page['start_line']}-{page['end_line']}"
        item["title"] = hit.get("title")
        if hit.get("context"):
            item["context"] = hit["context"]
        if hit.get("metadata"):
            item["metadata"] = hit["metadata"]
        item["body" if full else "snippet"] = _content(hit, full, line_numbers)
        if hit.get("explain") is not None:
            item["explain"] = hit["explain"]
        out.append(item)
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"


def _search_csv(hits: Sequence[api.HitOut], idents: Sequence[_Ident], full: bool, line_numbers: bool) -> str:
    """CSV with a constant column set; a --full-path row leaves its docid cell empty."""
    rows = [
        (
            ident.docid or "",
            f"{hit['score']:.4f}",
            ident.name,
            hit.get("title") or "",
            context_line(hit.get("context")),
            hit["line"],
            _content(hit, full, line_numbers),
        )
        for hit, ident in zip(hits, idents)
    ]
    return _csv_text(SEARCH_CSV_HEADER, rows)


def _search_files(hits: Sequence[api.HitOut], idents: Sequence[_Ident]) -> str:
    """Headerless `#docid,score,file[,"context"]`; the docid field is dropped under --full-path."""
    lines = []
    for hit, ident in zip(hits, idents):
        prefix = f"{ident.docid}," if ident.docid else ""
        lines.append(f"{prefix}{hit['score']:.2f},{ident.name}{_files_context(hit.get('context'))}")
    return "".join(f"{line}\n" for line in lines)


def _search_md(hits: Sequence[api.HitOut], idents: Sequence[_Ident], full: bool, line_numbers: bool) -> str:
    """One `---`-separated section per hit, headed by the title (or the file)."""
    blocks = []
    for hit, ident in zip(hits, idents):
        lines = ["---", f"# {hit.get('title') or ident.name}", f"**file:** `{ident.name}`"]
        if ident.docid:
            lines.append(f"**docid:** `{ident.docid}`")
        if hit.get("context"):
            lines.append(f"**context:** {context_line(hit['context'])}")
        lines += ["", _content(hit, full, line_numbers), ""]
        blocks.append("\n".join(lines) + "\n")
    return "".join(blocks)


def _search_xml(hits: Sequence[api.HitOut], idents: Sequence[_Ident], full: bool, line_numbers: bool) -> str:
    """Sibling `<file>` elements separated by blank lines, as the original prints them."""
    blocks = []
    for hit, ident in zip(hits, idents):
        attrs = ""
        if ident.docid:
            attrs += f' docid="{_xml_attr(ident.docid)}"'
        attrs += f' name="{_xml_attr(ident.name)}"'
        if hit.get("title"):
            attrs += f' title="{_xml_attr(hit["title"])}"'
        if context := hit.get("context"):
            attrs += f' context="{_xml_attr(context)}"'
        content = _xml_text(_content(hit, full, line_numbers))
        blocks.append(f"<file{attrs}>\n{content}\n</file>\n")
    return "\n".join(blocks)


def _search_cli(
    hits: Sequence[api.HitOut],
    idents: Sequence[_Ident],
    style: Style,
    full: bool,
    line_numbers: bool,
) -> str:
    """Human output: location line, title, context, score, then the passage (§18.1)."""
    blocks = []
    for hit, ident in zip(hits, idents):
        matched = _has_match(hit)
        location = with_range(ident.name, hit["line"]) if matched else ident.name
        abs_path = hit.get("abs_path")
        if style.links and abs_path:
            url = editor_link(abs_path, hit["line"] if matched else 1, style.editor_uri)
            location = osc8(url, location)
        first = _paint(location, _CYAN, style)
        if ident.docid:
            first += " " + _paint(ident.docid, _DIM, style)
        if page := hit.get("page"):
            first += f" ({_on_pages([page])})"

        lines = [first]
        if hit.get("title"):
            lines.append(_paint(f"Title: {hit['title']}", _BOLD, style))
        if hit.get("context"):
            lines.append(_paint(f"Context: {context_line(hit['context'])}", _DIM, style))
        lines.append(f"Score: {_paint(_score_text(hit['score'], style), _BOLD, style)}")
        if (explain := hit.get("explain")) is not None:
            lines += [_paint(line, _DIM, style) for line in _explain_lines(explain)]
        lines.append("")

        terms = hit.get("terms") or []
        if full:
            # Highlight before numbering so a term made of digits never lights up a line number.
            body = _highlight(hit.get("body") or "", terms, style)
            lines.append(add_line_numbers(body) if line_numbers else body)
        else:
            passage = _highlight(hit.get("snippet") or "", terms, style)
            if line_numbers:
                passage = add_line_numbers(passage, hit["start_line"])
            lines += [_hunk_header(hit), passage]
        blocks.append("\n".join(lines))
    return "\n\n\n".join(blocks) + "\n"


def render_search(
    hits: Sequence[api.HitOut],
    fmt: str,
    style: Style,
    *,
    full: bool = False,
    line_numbers: bool = False,
    full_path: bool = False,
    cwd: str | None = None,
    below_min_score: bool = False,
) -> tuple[str, list[str]]:
    """Render `search`/`vsearch`/`query` hits. Returns (stdout text, stderr warnings).

    `below_min_score=True` means results existed but all were under `--min-score`,
    which only changes the CLI's empty message. `cwd` (default: the process cwd)
    anchors `./rel` paths under `--full-path`.
    """
    if fmt not in FORMATS:
        raise ValueError(f"Unknown format: {fmt}")
    if not hits:
        return _empty_search(fmt, below_min_score), []
    idents, warnings = _identify_all(hits, full_path, cwd)
    if fmt == "json":
        text = _search_json(hits, idents, full, line_numbers)
    elif fmt == "csv":
        text = _search_csv(hits, idents, full, line_numbers)
    elif fmt == "files":
        text = _search_files(hits, idents)
    elif fmt == "md":
        text = _search_md(hits, idents, full, line_numbers)
    elif fmt == "xml":
        text = _search_xml(hits, idents, full, line_numbers)
    else:
        text = _search_cli(hits, idents, style, full, line_numbers)
    return text, warnings


# ---------------------------------------------------------------------------
# Multi-get (§18.4)
# ---------------------------------------------------------------------------


def _skip_reason(item: Mapping[str, Any]) -> str:
    """The skip reason plus the CLI's hint on how to fetch the document anyway (§16.3).

    The hint names the `qmd://` URI because that always resolves with `qmd get`,
    whatever selection or `--full-path` produced the row.
    """
    reason = item.get("reason") or "skipped"
    return f"{reason}. Use 'qmd get {item['file']}' to retrieve."


def _body(item: Mapping[str, Any], line_numbers: bool) -> str:
    """A multi-get body: exactly the file's first lines, numbered from 1 if asked."""
    body = item.get("body") or ""
    if not line_numbers:
        return body
    return number_window(body, 1, 0 if item.get("total_lines") is None else 1)


def _truncated(item: Mapping[str, Any]) -> int:
    return int(item.get("truncated_lines") or 0)


def _multi_json(items: Sequence[api.RetrievedOut], idents: Sequence[_Ident], line_numbers: bool) -> str:
    """JSON array; skipped items carry `skipped: true` and `reason` instead of `body`;
    a body cut by `-l` is followed by `truncated_lines`, the count left out."""
    out = []
    for item, ident in zip(items, idents):
        entry: dict[str, Any] = {"file": ident.name}
        if ident.docid:
            entry["docid"] = ident.docid
        entry["title"] = item.get("title")
        if item.get("context"):
            entry["context"] = item["context"]
        if item.get("skipped"):
            entry["skipped"] = True
            entry["reason"] = _skip_reason(item)
        else:
            entry["body"] = _body(item, line_numbers)
            if _truncated(item):
                entry["truncated_lines"] = _truncated(item)
        out.append(entry)
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"


def _multi_csv(items: Sequence[api.RetrievedOut], idents: Sequence[_Ident], line_numbers: bool) -> str:
    """CSV with the skip reason in the `body` column of skipped rows; `truncated_lines`
    counts the lines a `-l` cut left out after the body."""
    rows = [
        (
            ident.docid or "",
            ident.name,
            item.get("title") or "",
            context_line(item.get("context")),
            "true" if item.get("skipped") else "false",
            _skip_reason(item) if item.get("skipped") else _body(item, line_numbers),
            "" if item.get("skipped") else _truncated(item),
        )
        for item, ident in zip(items, idents)
    ]
    return _csv_text(MULTI_GET_CSV_HEADER, rows)


def _multi_files(items: Sequence[api.RetrievedOut], idents: Sequence[_Ident]) -> str:
    """Headerless `#docid,file[,"context"][,[SKIPPED]]`."""
    lines = []
    for item, ident in zip(items, idents):
        prefix = f"{ident.docid}," if ident.docid else ""
        status = ",[SKIPPED]" if item.get("skipped") else ""
        lines.append(f"{prefix}{ident.name}{_files_context(item.get('context'))}{status}")
    return "".join(f"{line}\n" for line in lines)


def _multi_md(items: Sequence[api.RetrievedOut], idents: Sequence[_Ident], line_numbers: bool) -> str:
    """A `##` section per document; the body fenced, a skip as a blockquote."""
    blocks = []
    for item, ident in zip(items, idents):
        parts = [f"## {ident.name}"]
        if ident.docid:
            parts.append(f"**docid:** `{ident.docid}`")
        title = item.get("title")
        if title and title not in (item["file"], item.get("path")):
            parts.append(f"**Title:** {title}")
        if item.get("context"):
            parts.append(f"**Context:** {context_line(item['context'])}")
        if item.get("skipped"):
            parts.append(f"> {_skip_reason(item)}")
        else:
            parts.append(_fence(_body(item, line_numbers)))
            if _truncated(item):
                parts.append(f"_{truncation_note(_truncated(item))}_")
        blocks.append("\n\n".join(parts) + "\n\n")
    return "".join(blocks)


def _multi_xml(items: Sequence[api.RetrievedOut], idents: Sequence[_Ident], line_numbers: bool) -> str:
    """A `<documents>` XML document with one escaped `<document>` per item."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<documents>"]
    for item, ident in zip(items, idents):
        docid = f' docid="{_xml_attr(ident.docid)}"' if ident.docid else ""
        lines.append(f"  <document{docid}>")
        lines.append(f"    <file>{_xml_text(ident.name)}</file>")
        lines.append(f"    <title>{_xml_text(item.get('title') or '')}</title>")
        if context := item.get("context"):
            lines.append(f"    <context>{_xml_text(context)}</context>")
        if item.get("skipped"):
            lines.append("    <skipped>true</skipped>")
            lines.append(f"    <reason>{_xml_text(_skip_reason(item))}</reason>")
        else:
            lines.append(f"    <body>{_xml_text(_body(item, line_numbers))}</body>")
            if _truncated(item):
                lines.append(f"    <truncated_lines>{_truncated(item)}</truncated_lines>")
        lines.append("  </document>")
    lines.append("</documents>")
    return "\n".join(lines) + "\n"


def _multi_cli(items: Sequence[api.RetrievedOut], idents: Sequence[_Ident], style: Style, line_numbers: bool) -> str:
    """`=`-ruled blocks per document, the file line styled like search results."""
    out = []
    for item, ident in zip(items, idents):
        name = ident.name
        if style.links and (abs_path := item.get("abs_path")):
            name = osc8(editor_link(abs_path, 1, style.editor_uri), name)
        label = _paint(name, _CYAN, style)
        if ident.docid:
            label += "  " + _paint(ident.docid, _DIM, style)
        out.append(f"\n{_SEPARATOR}\nFile: {label}\n{_SEPARATOR}\n\n")
        if item.get("skipped"):
            out.append(f"[SKIPPED: {_skip_reason(item)}]\n")
            continue
        if item.get("context"):
            out.append(f"Folder Context: {context_line(item['context'])}\n---\n\n")
        out.append(f"{_body(item, line_numbers)}\n")
        if _truncated(item):
            out.append(f"\n{truncation_note(_truncated(item))}\n")
    return "".join(out)


def render_multi_get(
    items: Sequence[api.RetrievedOut],
    fmt: str,
    style: Style,
    *,
    full_path: bool = False,
    cwd: str | None = None,
    line_numbers: bool = False,
) -> tuple[str, list[str]]:
    """Render `multi-get` items. Returns (stdout text, stderr warnings).

    A body is exactly the file's first lines (the daemon applied `-l`), numbered here
    from 1 under `line_numbers`; a cut is reported beside the body (`truncated_lines`,
    or an unnumbered note after it), never as a line in it (§16.3). `file` is always
    the `qmd://` URI unless `--full-path` found the file on disk.
    """
    if fmt not in FORMATS:
        raise ValueError(f"Unknown format: {fmt}")
    idents, warnings = _identify_all(items, full_path, cwd)
    if fmt == "json":
        text = _multi_json(items, idents, line_numbers)
    elif fmt == "csv":
        text = _multi_csv(items, idents, line_numbers)
    elif fmt == "files":
        text = _multi_files(items, idents)
    elif fmt == "md":
        text = _multi_md(items, idents, line_numbers)
    elif fmt == "xml":
        text = _multi_xml(items, idents, line_numbers)
    else:
        text = _multi_cli(items, idents, style, line_numbers)
    return text, warnings


# ---------------------------------------------------------------------------
# Single document (§16.2)
# ---------------------------------------------------------------------------


def render_document(
    doc: api.DocumentOut,
    *,
    from_line: int,
    line_numbers: bool,
    full_path: bool,
    cwd: str | None,
) -> str:
    """Render `qmd get`: header, optional folder context, `---`, blank line, the lines.

    `doc["body"]` is already sliced to the requested range; `from_line` is the real
    number of its first line, so numbering matches the file. Under `--full-path` a
    file missing from disk keeps the `qmd://` header and docid; the caller reports
    that with `full_path_warning(1, 1)` when `resolve_full_path` returns None.
    """
    ident = _identify(doc, full_path, cwd)
    header = f"{ident.name}  {ident.docid}" if ident.docid else ident.name
    if doc.get("pages"):
        header += f"  ({_on_pages(doc['pages'])})"
    lines = [header]
    if doc.get("context"):
        lines.append(f"Folder Context: {context_line(doc['context'])}")
    body = doc.get("body") or ""
    first = max(1, from_line)
    count = int(doc.get("to_line") or 0) - first + 1
    lines += ["---", "", number_window(body, first, count) if line_numbers else body]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Upkeep: orphans (doctor), cleanup, coverage (status --files)
# ---------------------------------------------------------------------------


def fmt_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def orphan_items(orphans: api.Orphans) -> list[str]:
    """What the index holds that nothing needs, one phrase per kind present (none: empty)."""
    spaces = orphans["stale_spaces"]
    models = ", ".join(f"{s['model']}: {s['chunks']} chunks" for s in spaces)
    kinds = [
        (orphans["unconfigured_documents"], "document", "documents", " of collections no longer in index.yml"),
        (orphans["inactive_documents"], "inactive document record", None, " (files that left the index)"),
        (orphans["orphan_contents"], "orphaned content body", "orphaned content bodies", ""),
        (orphans["orphan_chunks"], "orphaned embedding chunk", None, ""),
        (len(spaces), "vector space", None, f" of models no longer configured ({models})"),
        (orphans["stale_cache_entries"], "stale cached model output", None, ""),
    ]
    return [_plural(n, one, many) + tail for n, one, many, tail in kinds if n]


def orphan_lines(orphans: api.Orphans) -> list[str]:
    """`qmd doctor`: the orphans, or that there are none."""
    items = orphan_items(orphans)
    lines = [f"⚠ orphans: {item} (run 'qmd cleanup')" for item in items] or ["✓ orphans: none"]
    if orphans["unresolved"]:
        lines.append(f"⚠ {orphans['unresolved']}")
    return lines


def render_copy(report: Mapping[str, Any]) -> str:
    rows = report["rows"]
    return (
        f"Copied {report['source']} → {report['destination']} in {report['seconds']:.1f}s:"
        f" {rows.get('documents', 0)} documents, {rows.get('content_vectors', 0)} chunk vectors"
        f" in {rows.get('vector_spaces', 0)} vector spaces, {rows.get('llm_cache', 0)} cached model answers.\n"
        f"Checked: every table holds as many rows as the source's; {report['keyword_documents']} documents"
        f" searchable by keyword, {report['vector_rows']} vector search rows."
    )


def render_cleanup(report: Mapping[str, Any]) -> str:
    """`qmd cleanup`: what it dropped (or would), the vacuum, the bytes before and after."""
    dry = report["dry_run"]
    found = report["found"]
    items = orphan_items(found)
    lines = ["Dry run — no changes made."] if dry else []
    verb = "Would remove" if dry else "✓ Removed"
    lines += [f"{verb} {item}" for item in items] or ["No orphans found."]
    if report["search_rows_removed"]:
        lines.append(f"✓ Removed {_plural(report['search_rows_removed'], 'vector search row')} of moved documents")
    if found["unresolved"]:
        lines.append(f"⚠ {found['unresolved']}")
    if not dry:
        lines.append("✓ Keyword index optimized (FTS5 segments merged)")
        vacuum = report["vacuum"]
        if vacuum["ran"]:
            lines.append(f"✓ Database vacuumed ({vacuum['reason']}) in {vacuum['seconds']:.1f}s")
        else:
            lines.append(f"  Not vacuumed: {vacuum['reason']}")
        left = orphan_items(report["left"])
        lines += [f"⚠ Still there (written meanwhile?): {item}" for item in left]
        before, after = report["bytes_before"], report["bytes_after"]
        lines.append(
            f"Size: {fmt_bytes(before)} → {fmt_bytes(after)} (freed {fmt_bytes(max(before - after, 0))})"
            f" in {report['seconds']:.1f}s"
        )
    return "\n".join(lines) + "\n"


_UPDATE_TAGS = {"changed": "changed since the last update", "new": "not indexed yet", "missing": "gone from disk"}


def render_coverage(collections: Sequence[api.Coverage]) -> str:
    """`qmd status --files`: per collection, the counts in seed 001's words, then the files by state."""
    lines: list[str] = []
    for c in collections:
        files = c["files"]
        lines += [
            f"{c['collection']} (qmd://{c['collection']}/)",
            f"  Folder: {c['path']}" + ("  ⚠ missing or not a directory" if c["root_missing"] else ""),
            "  "
            + " · ".join(
                f"{label} {count}"
                for label, count in (
                    ("discovered", c["discovered"]),
                    ("indexed", c["indexed"]),
                    ("skipped", c["skipped"]),
                    ("failed", c["failed"]),
                    ("pending update", c["pending_update"]),
                    ("pending vectors", c["pending_vectors"]),
                    ("clipped", c["clipped"]),
                    ("metadata errors", c["metadata_errors"]),
                )
            ),
        ]
        sections = [
            ("Indexed", [f["path"] for f in files if f["state"] == "indexed"]),
            (
                "Pending update",
                [f"{f['path']} ({_UPDATE_TAGS[f['state']]})" for f in files if f["state"] in _UPDATE_TAGS],
            ),
            ("Skipped", [f"{f['path']}: {f['reason']}" for f in files if f["state"] == "skipped"]),
            ("Failed", [f"{f['path']}: {f['reason']}" for f in files if f["state"] == "failed"]),
            ("Pending vectors", [f["path"] for f in files if f["pending_vectors"]]),
            (
                "Clipped",
                [
                    f"{f['path']}: {_plural(f['clipped_chunks'], 'chunk')} longer than the embedder reads"
                    for f in files
                    if f["clipped_chunks"]
                ],
            ),
            ("Metadata errors", [f"{f['path']}: {f['metadata_error']}" for f in files if f["metadata_error"]]),
        ]
        for title, rows in sections:
            if rows:
                lines.append(f"  {title} ({len(rows)})")
                lines += [f"    {row}" for row in rows]
        if c["vectors_note"]:
            lines.append(f"  ⚠ every file counts as pending vectors: {c['vectors_note']}")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n" if lines else "No collections yet.\n"


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def embed_progress_line(run: api.EmbedProgress) -> str:
    """A running embed in one line (`qmd status`, `qmd embed --follow`): how far, how fast,
    how long still, and whose it is."""
    who = "qmd embed" if run["source"] == "embed" else "in the background"
    if not run["documents_total"]:
        return f"starting ({who}; {run['model']})"
    eta = f" · ETA {_duration(run['eta_s'])}" if run["eta_s"] is not None and run["documents_done"] else ""
    return (
        f"{run['documents_done']}/{run['documents_total']} documents · {run['chunks_embedded']} chunks embedded · "
        f"{run['chunks_per_s']:.1f} chunks/s{eta} ({who}; {run['model']})"
    )
