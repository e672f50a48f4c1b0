"""MCP over Streamable HTTP at `/mcp` (spec §20), served by the daemon itself.

Every MCP client -- an editor speaking HTTP, or `qmd mcp` bridging stdio -- shares
this one process, its index and its warm models, instead of each agent loading its
own copy. The official SDK's low-level `Server` is used rather than `MCPServer`
because the tool contract is ours to state exactly: the wire's request models (their
schemas generated, with the descriptions agents read), unknown parameters refused by
name (the original drops them silently), and results shaped as pointers (seeds/002).

The transport is stateless with JSON responses: each POST is one self-contained
exchange, so nothing outlives a request. That is also why a session manager is
created and run per request (`McpEndpoint`): the SDK needs a running task group
to serve a request, and a per-request one works however the app is hosted
(`qmdd` runs uvicorn with `lifespan="off"`), with no state to leak between
requests and nothing to shut down.

SDK surface relied on (mcp 2.3.0): `mcp.server.lowlevel.Server` (`on_*` handlers,
`get_tool_input_schema`, the `middleware` list), `StreamableHTTPSessionManager`
(`stateless=True`, `json_response=True`, `run()`, `handle_request()`),
`TransportSecuritySettings`, `MCPError` and the `mcp.types` models.
"""

from __future__ import annotations

import difflib
import json
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import anyio.to_thread
from mcp import types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ValidationError
from starlette.types import Receive, Scope, Send

from qmd.defaults import AGENT_RELEVANCE_FLOOR, MCP_BUDGET_MS, MCP_RESULTS
from qmd.server.engine import Engine
from qmd.server.errors import InvalidInput, NotFound, QmdError
from qmd.server.http.routes import on_model_thread
from qmd.server.http.wire import (
    GetRequest,
    McpCollection,
    McpKey,
    McpQueryArgs,
    McpStatus,
    MetadataRequest,
    MetadataResponse,
    MultiGetRequest,
    QueryResponse,
    ResultOut,
    StatusRequest,
    SubSearch,
    form_error,
    metadata_response,
    metadata_text,
    public_result,
    query_plan,
    query_response,
)
from qmd.server.search.discovery import OptionNames, TypeReport
from qmd.server.search.hybrid import primary_text
from qmd.server.store.documents import split_range
from qmd.server.store.sqlite import utcnow
from qmd.server.text.pages import describe_pages
from qmd.uri import with_range
from qmd.version import __version__

log = logging.getLogger("qmd.mcp")

URI_SCHEME = "qmd://"


# -- tool arguments ------------------------------------------------------------------
#
# The argument models are the wire's (`http.wire`), validated by their camelCase names
# only (§20.3): a snake_case or misspelled parameter is an error that names the one
# meant, never silently ignored. The listed input schemas are generated from them.

_NESTED_ARGS: dict[str, type[BaseModel]] = {"searches": SubSearch}
"""Models of list-valued parameters, for naming the fields an unknown nested key may have meant."""


def _wire_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def tool_schema(model: type[BaseModel], *, output: bool = False) -> dict[str, Any]:
    """The JSON schema agents read, from the model that validates (or, for `output`,
    serializes): references inlined, no generated titles, and in inputs `X or null`
    shown as `X` (null means "left out", which is what an agent should do)."""
    raw = model.model_json_schema(by_alias=True, mode="serialization" if output else "validation")
    defs = raw.pop("$defs", {})

    def clean(node: Any) -> Any:
        if isinstance(node, list):
            return [clean(n) for n in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return clean({**defs[node["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}})
        options = node.get("anyOf")
        if not output and options and len(options) == 2 and {"type": "null"} in options:
            kept = next(o for o in options if o != {"type": "null"})
            node = {**{k: v for k, v in node.items() if k != "anyOf"}, **kept}
            if node.get("default", 0) is None:
                del node["default"]
        return {k: clean(v) for k, v in node.items() if k != "title"}

    schema = clean(raw)
    schema.setdefault("properties", {})
    return schema


def _unknown_parameter(where: str, name: str, known: list[str]) -> str:
    """`unknown parameter 'where'`, with the real parameter `name` most likely meant."""
    folded = {k.lower().replace("_", ""): k for k in known}
    guess = folded.get(name.lower().replace("_", "").replace("-", ""))
    if guess is None:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        guess = close[0] if close else None
    if guess:
        hint = f" (did you mean '{guess}'?)"
    elif known:
        hint = f" (expected one of: {', '.join(known)})"
    else:
        hint = " (this tool takes no parameters)"
    return f"unknown parameter '{where}'{hint}"


def _describe(err: ValidationError, model: type[BaseModel]) -> str:
    """Turn pydantic errors into one line that names each bad parameter and what to fix."""
    parts: list[str] = []
    for e in err.errors():
        loc = [str(x) for x in e["loc"]]
        where = loc[0] + "".join(f"[{x}]" if x.isdigit() else f".{x}" for x in loc[1:]) if loc else "arguments"
        if e["type"] == "extra_forbidden":
            owner = _NESTED_ARGS.get(loc[0], model) if len(loc) > 1 else model
            parts.append(_unknown_parameter(where, loc[-1], _wire_names(owner)))
        elif e["type"] == "missing":
            parts.append(f"missing required parameter '{where}'")
        else:
            parts.append(f"invalid value for '{where}': {e['msg']}")
    return "; ".join(dict.fromkeys(parts))


# -- tool definitions ----------------------------------------------------------------

_READ_ONLY = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)

_QUERY_DESCRIPTION = """\
Search the indexed markdown notes. Give typed sub-queries in `searches`, or one plain \
`query` string (not both). Results are pointers -- file, line range, docid and a short \
numbered snippet -- not sources: read the range with `get`, passing the result's `file` URI with \
its range (e.g. `get file="qmd://notes/a.md:41:4"`), before citing it, and widen it if the passage \
looks cut off.

Sub-query types:
- lex: BM25 keyword search. Words match as prefixes; "quoted phrase" for exact phrases; \
-word excludes. Documents matching every term rank first.
- vec: semantic vector search (meaning-based).
- hyde: a hypothetical document: write what the answer looks like.

Strategy:
| you have | use |
|---|---|
| exact names, ids, dates, error strings | lex |
| a paraphrased question | vec, plus lex for its key terms |
| an idea of what the answer says | hyde |

Examples:
  {"searches": [{"type": "lex", "query": "error handling"}]}
  {"searches": [{"type": "lex", "query": "\\"connection pool\\" -deprecated"}, \
{"type": "vec", "query": "how do we size the database pool"}], "intent": "tuning the API server"}
  {"query": "seed round investors", "collections": ["notes"], "limit": 5}

A plain `query` runs on keyword and vector search; `expand: true` also has the generate model \
write lex/vec/hyde lines (by default only a model trained for it does: a general small \
model's measured no gain). The lists are fused and the best passages reranked \
(by default by a model trained to rank only; `rerank: true` also with a general model). \
`relevance` (0-1) is the probability that a result is relevant, the same meaning for every \
query: results below `minRelevance` (default AGENT_RELEVANCE_FLOOR) are dropped, and when none is left the \
answer says so and names the closest one. Treat that as "nothing here on this". A plain \
query without a rerank is ranked by relevance, and `score` is it; otherwise `score` = fusion \
blended with rerank, 0-1: `fusion` is how strongly the searches agree (1 = first everywhere, \
relative to this query's lists), `rerank` the reranker's relevance (null if not scored).

At most MCP_RESULTS results unless `limit` says otherwise. The answer comes within `budgetMs` \
(default MCP_BUDGET_MS): expansion, then reranking, then vectors are dropped to meet it. Stages that \
could not run are reported under `skipped` with the reason, never dropped silently."""


def _with_defaults(text: str) -> str:
    """`text` with the defaults it names by their constants' names put in: an f-string would
    need every brace of the JSON examples doubled."""
    for name, value in (
        ("AGENT_RELEVANCE_FLOOR", f"{AGENT_RELEVANCE_FLOOR:g}"),
        ("MCP_RESULTS", str(MCP_RESULTS)),
        ("MCP_BUDGET_MS", str(MCP_BUDGET_MS)),
    ):
        text = text.replace(name, value)
    return text


_METADATA_DESCRIPTION = """\
Discover the metadata (frontmatter `qmd: metadata:`) the documents hold, to write a \
`filter` for `query` from what is indexed instead of guessing. One block per key in \
coverage order, split by type, with document counts and the top values (numbers: min, \
median, max). `match` narrows which entries are reported (`field` is "key" or "value"): \
{"field":"key","operator":"eq","value":"topics"} for one key, \
{"field":"value","operator":"eq","value":"docs-team"} for which keys hold a value. `filter` \
narrows which documents are counted, to see what a filtered query would see. Every value \
reported is one an `eq` filter matches exactly."""

# -- shaping -------------------------------------------------------------------------


def document_uri(display: str) -> str:
    """`qmd://` URI of a document, percent-encoded per segment so it round-trips."""
    return URI_SCHEME + quote(display, safe="/")


def _document_text(body: str, first_line: int, context: str | None, line_numbers: bool, note: str = "") -> str:
    """Body (numbered from its real first line) under the `<!-- Context -->` comment of §20.3."""
    if line_numbers:
        body = "\n".join(f"{first_line + i}: {line}" for i, line in enumerate(body.split("\n")))
    text = body + note
    return f"<!-- Context: {context} -->\n\n{text}" if context else text


def _resource(display: str, text: str) -> types.EmbeddedResource:
    return types.EmbeddedResource(
        resource=types.TextResourceContents(uri=document_uri(display), mime_type="text/markdown", text=text)
    )


def _text(text: str) -> types.TextContent:
    return types.TextContent(text=text)


def _tool_error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[_text(message)], is_error=True)


def _not_found_message(name: str, err: NotFound) -> str:
    """§20.3's "Did you mean" list, naming each candidate as results do and `get` accepts it."""
    similar = err.detail.get("similar") or []
    if not similar:
        return err.message
    lines = "\n".join(f"  - {s}" for s in similar)
    return f"Document not found: {name}\n\nDid you mean one of these?\n{lines}"


# -- tools ---------------------------------------------------------------------------


def run_query(engine: Engine, args: McpQueryArgs) -> types.CallToolResult:
    """Typed or plain search; every result is a pointer to a line range, not an answer."""
    if (error := form_error(args)) is not None:
        raise InvalidInput(f"Error: {error}")  # §20.3 words these two as "Error: …"; grammar errors as they are
    doc, opts = query_plan(args)
    out = engine.query(doc, opts)
    answer = query_response(out, public_result)
    primary = primary_text(doc)
    results = answer.results
    head = f'Found {len(results)} result(s) for "{primary}":' if results else f'No results found for "{primary}"'
    if answer.closest is not None:
        head = (
            f'No result for "{primary}" is above the relevance floor ({args.min_relevance:g}): probably nothing '
            "here answers it. The closest, in case the notes word it differently (minRelevance: 0 shows all):"
        )
    blocks = [head]
    if answer.skipped:
        blocks.append("Not run:\n" + "\n".join(f"  - {s.stage}: {s.reason}" for s in answer.skipped))
    if out.warnings:
        blocks.append("Warnings:\n" + "\n".join(f"  - {w}" for w in out.warnings))
    blocks.extend(_result_text(r) for r in (results or ([answer.closest] if answer.closest else [])))
    if results:
        first = out.hits[0]
        example = with_range(results[0].file, first.start_line, first.end_line - first.start_line + 1)
        blocks.append(
            "These are pointers, not sources. Before citing one, read its range with `get` "
            f'(e.g. get file="{example}"), widen it if the passage is cut off, and cite file:lines. '
            "Snippets are for choosing what to read, not for quoting."
        )
    return types.CallToolResult(
        content=[_text("\n\n".join(blocks))],
        structured_content=answer.model_dump(mode="json", by_alias=True),
    )


def _result_text(r: ResultOut) -> str:
    """One result as one block: where it is, its context (`Context: …`, as the CLI shows
    it), its metadata, then the numbered passage. A context of several lines (a folder's
    under the global one) goes on indented lines without the blank ones, so no blank
    line splits the block."""
    page = "" if r.page is None else f" (page {r.page}, lines {r.page_lines})"
    chance = "" if r.relevance is None else f" (relevance {r.relevance:.2f})"
    lines = [f"{r.docid} {round(r.score * 100)}% {with_range(r.file, r.lines)}{page} - {r.title}{chance}"]
    if r.context and (parts := [line.strip() for line in r.context.splitlines() if line.strip()]):
        lines.append("Context: " + "\n  ".join(parts))
    if r.metadata:
        lines.append(f"metadata: {json.dumps(r.metadata, ensure_ascii=False)}")
    lines.append(r.snippet)
    return "\n".join(lines)


def run_get(engine: Engine, args: GetRequest) -> types.CallToolResult:
    """One document, or the exact range a pointer named: by a result's `file`, a path,
    a docid, or the percent-encoded `qmd://` URI of a document this server returned."""
    try:
        doc = engine.get(args.file, from_line=args.from_line, max_lines=args.max_lines, full=args.full)
    except NotFound as e:
        decoded = unquote(args.file) if args.file.startswith(URI_SCHEME) else args.file
        if decoded == args.file:
            return _tool_error(_not_found_message(split_range(args.file)[0], e))
        try:  # an embedded resource's URI (`qmd://notes/a%20b.md`), as `resources/read` takes it
            doc = engine.get(decoded, from_line=args.from_line, max_lines=args.max_lines, full=args.full)
        except NotFound:
            return _tool_error(_not_found_message(split_range(args.file)[0], e))
    display = doc.doc.display_path
    text = _document_text(doc.body, doc.from_line, doc.doc.context, args.line_numbers)
    if doc.pages:
        text = f"<!-- {describe_pages(doc.pages)} -->\n\n{text}"
    return types.CallToolResult(content=[_resource(display, text)])


def run_multi_get(engine: Engine, args: MultiGetRequest) -> types.CallToolResult:
    """Several documents at once; oversized ones are named with the `get` call that reads them."""
    items = engine.multi_get(args.pattern, max_bytes=args.max_bytes, max_lines=args.max_lines)
    errors = [item.reason or "" for item in items if item.doc is None]
    content: list[types.ContentBlock] = []
    if errors:
        content.append(_text("Errors:\n" + "\n".join(errors)))
    for item in items:
        if item.doc is None:
            continue
        display = item.doc.display_path
        if item.skipped or item.body is None:
            content.append(
                _text(f"[SKIPPED: {display} - {item.reason}. Use 'get' with file=\"{item.doc.file}\" to retrieve.]")
            )
            continue
        note = f"\n\n[... truncated {item.truncated_lines} more lines]" if item.truncated_lines else ""
        content.append(_resource(display, _document_text(item.body, 1, item.doc.context, args.line_numbers, note)))
    if not content:
        return _tool_error(f"No files matched pattern: {args.pattern}")
    return types.CallToolResult(content=content)


def _parameter(name: str) -> str:
    """The `metadata` tool's name for an option: its wire alias, as the input schema lists it."""
    return MetadataRequest.model_fields[name].alias or name


MCP_OPTIONS = OptionNames(
    key_limit=f"{_parameter('key_limit')}: <n>",
    key_offset=f"{_parameter('key_offset')}: <n>",
    all_keys=f"{_parameter('key_limit')}: null",
    value_limit=f"{_parameter('value_limit')}: <n>",
    value_offset=f"{_parameter('value_offset')}: <n>",
    all_values=f"{_parameter('value_limit')}: null",
    match=f"`{_parameter('match')}`",
    filter=f"`{_parameter('filter')}`",
    rerun="Call `metadata`",
)
"""The `metadata` tool's parameters, named in its text where the CLI names its flags."""


def run_metadata(engine: Engine, args: MetadataRequest) -> types.CallToolResult:
    """Discovery: the text the CLI prints, and the report as structured content."""
    report = engine.metadata(args.options(engine.scope(args.collections)))
    answer = metadata_response(report)
    text = metadata_text(report, args, MCP_OPTIONS)
    if answer.warnings:
        text += "\n\n" + "\n".join(answer.warnings)
    return types.CallToolResult(content=[_text(text)], structured_content=answer.model_dump(mode="json", by_alias=True))


def _type_names(t: TypeReport) -> str:
    return t.type + ("[]" if t.multi_valued else "")


def run_status(engine: Engine, _args: StatusRequest) -> types.CallToolResult:
    """Index size, embedding backlog and collections (with their most covered metadata
    keys, so a first call reveals what `filter` can use), most recently updated first."""
    st = engine.status()
    now = utcnow()
    indexed = [c for c in st.collections if c.files > 0]
    keys = engine.collection_keys([c.name for c in indexed])
    collections = sorted(
        (
            McpCollection(
                name=c.name,
                path=c.path,
                pattern=c.pattern,
                documents=c.files,
                last_updated=c.updated_at or now,
                metadata_keys=[
                    McpKey(key=k.key, documents=k.documents, types=[_type_names(t) for t in k.types])
                    for k in keys[c.name].keys
                ],
            )
            for c in indexed
        ),
        key=lambda c: c.last_updated,
        reverse=True,
    )
    vector = st.vector
    lines = [
        "QMD Index Status:",
        f"  Total documents: {st.documents}",
        f"  Needs embedding: {vector.pending}",
        f"  Vector index: {'yes' if vector.available else 'no'}",
        *([] if vector.available else [f"    {vector.message}"]),
        f"  Collections: {len(collections)}",
        *(f"    - {c.name}: {c.path} ({c.documents} docs){_key_summary(c)}" for c in collections),
        *(f"  Not used: {w}" for w in st.warnings),  # what of a project's own config is untrusted
    ]
    answer = McpStatus(
        total_documents=st.documents,
        needs_embedding=vector.pending,
        has_vector_index=vector.available,
        collections=collections,
    )
    return types.CallToolResult(
        content=[_text("\n".join(lines))], structured_content=answer.model_dump(mode="json", by_alias=True)
    )


def _key_summary(c: McpCollection) -> str:
    if not c.metadata_keys:
        return ""
    keys = ", ".join(f"{k.key} ({'|'.join(k.types)}, {k.documents} docs)" for k in c.metadata_keys)
    return f"; metadata keys to filter on: {keys}"


@dataclass(frozen=True)
class ToolSpec:
    """A tool as listed, how its arguments are checked, and what runs it (in a worker thread)."""

    definition: types.Tool
    args: type[BaseModel]
    run: Callable[[Engine, Any], types.CallToolResult]
    model_bound: bool = False
    """It may wait on the inference worker: run on a model thread, never the shared pool."""


TOOLS: dict[str, ToolSpec] = {
    spec.definition.name: spec
    for spec in (
        ToolSpec(
            types.Tool(
                name="query",
                title="Query",
                description=_with_defaults(_QUERY_DESCRIPTION),
                input_schema=tool_schema(McpQueryArgs),
                output_schema=tool_schema(QueryResponse[ResultOut], output=True),
                annotations=_READ_ONLY,
            ),
            McpQueryArgs,
            run_query,
            model_bound=True,
        ),
        ToolSpec(
            types.Tool(
                name="get",
                title="Get Document",
                description="Read a document, or the line range a search result points at: its `file` "
                '(a `qmd://` URI) with the range, `file="qmd://notes/a.md:41:4"` reads 4 lines from line 41 '
                "(`notes/a.md:41:4` and a docid `#abc123` work too); a PDF's page and its lines: "
                '`file="qmd://docs/r.pdf#page=3:10:5"`; a markdown section whole, to widen a pointer to the '
                'section it sits in: `file="qmd://notes/a.md#getting-started"` (the heading\'s GitHub anchor '
                "or its text). Lines are numbered so they can be cited.",
                input_schema=tool_schema(GetRequest),
                annotations=_READ_ONLY,
            ),
            GetRequest,
            run_get,
        ),
        ToolSpec(
            types.Tool(
                name="multi_get",
                title="Multi-Get Documents",
                description="Read several documents by glob, comma-separated list (paths or results' `qmd://` "
                "URIs) or docids. Documents over "
                "`maxBytes` are skipped with a note naming the `get` call that reads them.",
                input_schema=tool_schema(MultiGetRequest),
                annotations=_READ_ONLY,
            ),
            MultiGetRequest,
            run_multi_get,
        ),
        ToolSpec(
            types.Tool(
                name="metadata",
                title="Metadata Discovery",
                description=_METADATA_DESCRIPTION,
                input_schema=tool_schema(MetadataRequest),
                output_schema=tool_schema(MetadataResponse, output=True),
                annotations=_READ_ONLY,
            ),
            MetadataRequest,
            run_metadata,
        ),
        ToolSpec(
            types.Tool(
                name="status",
                title="Index Status",
                description="Index health: document count, embedding backlog, and each collection's path, "
                "pattern and document count.",
                input_schema=tool_schema(StatusRequest),
                output_schema=tool_schema(McpStatus, output=True),
                annotations=_READ_ONLY,
            ),
            StatusRequest,
            run_status,
        ),
    )
}


# -- instructions and resources --------------------------------------------------------

_INSTRUCTIONS_TAIL = """\
Search: Use `query` with sub-queries (lex/vec/hyde), or a plain `query` string:
  - type:'lex' — BM25 keyword search (exact terms, fast)
  - type:'vec' — semantic vector search (meaning-based)
  - type:'hyde' — hypothetical document (write what the answer looks like)

  Always provide `intent` on every search call to disambiguate and improve snippets.

Examples:
  Quick keyword lookup: [{type:'lex', query:'error handling'}]
  Semantic search: [{type:'vec', query:'how to handle errors gracefully'}]
  Best results: [{type:'lex', query:'error'}, {type:'vec', query:'error handling best practices'}]
  With intent: searches=[{type:'lex', query:'performance'}], intent='web page load times'

Retrieval:
  - `get` — single document by a result's `file` (`qmd://collection/path`), a path or docid (#abc123). \
Supports a line-range suffix: `qmd://notes/file.md:100` (from line 100) or `qmd://notes/file.md:100:40` \
(40 lines from line 100). A PDF's results name a page too: \
`file.pdf#page=3:10:5` reads 5 lines from line 10 of page 3, the same text as the result's own range. \
A markdown section whole: `qmd://notes/file.md#getting-started` (a heading's GitHub anchor, or its text).
  - `multi_get` — batch retrieve by glob (`journals/2025-05*.md`), comma-separated list, or docids (#abc123).

Citing:
  - Search results are pointers (file, line range, docid), not sources. Read the range with `get` \
before stating a fact from it, widen it if the passage is cut off, and cite file:lines.
  - If the pointed ranges do not contain the answer, say so.

Tips:
  - Results name files as `qmd://collection/path` URIs; pass one back to `get` as it is.
  - A score ranks results within one answer; without a reranker it is not a confidence: \
read the top results rather than dropping them by score.
  - Results include a `context` field describing the content type."""


def build_instructions(engine: Engine) -> str:
    """The §20.2 system-prompt text, from the index as it is now (not as it was at start-up)."""
    st = engine.status()
    lines = [f"QMD is your local search engine over {st.documents} markdown documents."]
    if st.global_context:
        lines.append(f"Context: {st.global_context}")
    lines.append("")
    names = [c.name for c in st.collections if c.files > 0]
    if names:
        lines.append(f"Collections (scope with `collections` parameter): {', '.join(names)}")
    lines.append("Call the `status` tool for collection descriptions, paths, and per-collection doc counts.")
    if not st.vector.available:
        lines += ["", "Note: No vector embeddings yet. Run `qmd embed` to enable semantic search (vec/hyde)."]
    elif st.vector.pending:
        lines += ["", f"Note: {st.vector.pending} documents need embedding. Run `qmd embed` to update."]
    lines += ["", _INSTRUCTIONS_TAIL]
    return "\n".join(lines)


_TEMPLATE = types.ResourceTemplate(
    name="document",
    title="QMD Document",
    uri_template=URI_SCHEME + "{+path}",
    description="A markdown document in the index, by collection/path, with line numbers.",
    mime_type="text/markdown",
)


def read_document(engine: Engine, uri: str) -> types.ReadResourceResult:
    """§20.4: a numbered document by `qmd://` URI; a miss is a text answer, not an error."""
    path = unquote(uri.removeprefix(URI_SCHEME).split("?", 1)[0])
    try:
        doc = engine.get(path)
    except NotFound as e:
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="text/plain", text=_not_found_message(path, e))]
        )
    display = doc.doc.display_path
    text = _document_text(doc.body, 1, doc.doc.context, line_numbers=True)
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=document_uri(display), mime_type="text/markdown", text=text)]
    )


# -- server --------------------------------------------------------------------------


class QmdMcp:
    """The MCP handlers over one engine. Engine calls are blocking SQLite work, so each
    runs in a worker thread and the event loop keeps serving other clients."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.server: Server[Any] = Server(
            "qmd",
            version=__version__,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_list_resources=self.list_resources,
            on_list_resource_templates=self.list_resource_templates,
            on_read_resource=self.read_resource,
            get_tool_input_schema=lambda name: TOOLS[name].definition.input_schema if name in TOOLS else None,
        )
        # Instructions describe the live index (§20.2), so they are filled in per
        # handshake (`initialize`, or `server/discover` for 2026-07-28 clients).
        self.server.middleware.append(self.live_instructions)

    async def live_instructions(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        result = await call_next(ctx)
        if ctx.method in ("initialize", "server/discover") and isinstance(result, dict):
            result["instructions"] = await anyio.to_thread.run_sync(build_instructions, self.engine)
        return result

    async def list_tools(
        self, _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[spec.definition for spec in TOOLS.values()])

    async def call_tool(
        self, _ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        """Validate, run, and turn every expected failure into a tool error the agent can read."""
        spec = TOOLS.get(params.name)
        if spec is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name} (tools: {', '.join(TOOLS)})")
        try:
            args = spec.args.model_validate(params.arguments or {}, by_alias=True, by_name=False)
        except ValidationError as e:
            return _tool_error(_describe(e, spec.args))
        try:
            if spec.model_bound:
                return await self.on_model_thread(spec, args)
            return await anyio.to_thread.run_sync(spec.run, self.engine, args)
        except QmdError as e:
            return _tool_error(e.message)
        except Exception as e:  # noqa: BLE001 - a bug must still reach the agent as a readable error
            log.exception("MCP tool %s failed", params.name)
            return _tool_error(f"internal error: {type(e).__name__}: {e}")

    async def on_model_thread(self, spec: ToolSpec, args: BaseModel) -> types.CallToolResult:
        """A model-bound tool on the routes' model threads; the wait for a turn is part of its budget."""
        asked = time.monotonic()
        budget = getattr(args, "budget_ms", None)

        def run() -> types.CallToolResult:
            if budget is None:
                return spec.run(self.engine, args)
            left = max(budget - (time.monotonic() - asked) * 1000, 0)
            return spec.run(self.engine, args.model_copy(update={"budget_ms": left}))

        return await on_model_thread(run, None if budget is None else budget / 1000)

    async def list_resources(
        self, _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        """No listing (§20.4): documents are reached through the template."""
        return types.ListResourcesResult(resources=[])

    async def list_resource_templates(
        self, _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[_TEMPLATE])

    async def read_resource(
        self, _ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        if not params.uri.startswith(URI_SCHEME):
            raise MCPError(types.INVALID_PARAMS, f"not a qmd:// URI: {params.uri}")
        try:
            return await anyio.to_thread.run_sync(read_document, self.engine, params.uri)
        except QmdError as e:
            raise MCPError(types.INVALID_PARAMS, e.message) from e


class McpEndpoint:
    """ASGI endpoint for `POST /mcp`: one stateless, JSON-response exchange per request.

    The app's Origin/Host guard screens the request before it gets here, so the SDK's
    own DNS-rebinding check is off: one guard, one set of rules (and of allowlists).
    """

    def __init__(self) -> None:
        self.servers: weakref.WeakKeyDictionary[Engine, QmdMcp] = weakref.WeakKeyDictionary()
        """One MCP server per engine, made on its first exchange; an index closed when idle
        takes its server with it."""
        self.security = TransportSecuritySettings(enable_dns_rebinding_protection=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        engine: Engine = scope["state"]["engine"]  # the index the request names (`IndexRouter`)
        mcp = self.servers.get(engine)
        if mcp is None:
            mcp = self.servers[engine] = QmdMcp(engine)
        manager = StreamableHTTPSessionManager(
            mcp.server, json_response=True, stateless=True, security_settings=self.security
        )
        async with manager.run():
            await manager.handle_request(scope, receive, send)
