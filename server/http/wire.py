"""The wire contract: every body the daemon reads or writes, and the one mapping from
the engine's typed results to JSON.

Requests: one model per operation, whatever the surface (`POST /query`, the CLI's
`/v1/*`, MCP tools). Names are camelCase on the wire, as in the original; snake_case
spellings are accepted too. Unknown fields are refused by name: the original silently
ignored a misspelled `collection`, and users got answers from the wrong collections.
The MCP tools' input schemas are generated from these models.

Responses: a pointer (`search.pointers.Pointer`) becomes JSON here and nowhere else,
rounded, named and numbered one way: `ResultOut` for the public surfaces (`/query`,
MCP), `HitOut` with the passage's raw text and line numbers for the CLI, which draws
its own formats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from qmd.defaults import CANDIDATE_LIMIT, CLI_RESULTS, MAX_QUERY_CHARS, MCP_BUDGET_MS, MCP_RESULTS, RESULTS
from qmd.server.config import Context, unstorable
from qmd.server.errors import Conflict, Forbidden, HookFailed, InvalidInput, NotFound, QmdError, Unavailable
from qmd.server.ingest.embed_job import EmbedProgress, EmbedSource
from qmd.server.ingest.upkeep import CACHE_MAX_AGE_DAYS, Coverage
from qmd.server.quality import BACKENDS, BenchSpec
from qmd.server.search import discovery
from qmd.server.search.discovery import MetadataOptions, MetadataReport
from qmd.server.search.filters import Filter, parse_filter, parse_match
from qmd.server.search.hybrid import HybridOutcome, QueryOptions, Stage
from qmd.server.search.pointers import DocumentRef, DocumentText, Pointer, Retrieved, SearchOptions, SearchOutcome
from qmd.server.search.querydoc import MAX_SEARCHES, QueryDoc, SubQueryType, parse_query, typed_query
from qmd.server.search.reading import ListedFile, Listing
from qmd.server.search.relevance import AGENT_FLOOR
from qmd.server.search.scope import FilterReport
from qmd.server.status import CollectionInfo, IndexStatus
from qmd.server.text.chunking import ChunkStrategy
from qmd.server.text.pages import PageSpan
from qmd.server.trust import Approval, ApprovalState, FileState, Gate, IndexFile, Kind, Reviewed

SCORE_DECIMALS = 2
"""Public scores are rounded to 2 decimals (spec §20.3, §21.1): enough to threshold on."""

STATUS: dict[type[QmdError], int] = {
    InvalidInput: 400,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    HookFailed: 422,
    Unavailable: 503,
}


def http_status(err: QmdError) -> int:
    """The HTTP status of an engine error: its nearest class in `STATUS` (400 by default)."""
    return next((STATUS[k] for k in type(err).__mro__ if k in STATUS), 400)


# -- requests ------------------------------------------------------------------------


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, validate_by_name=True, validate_by_alias=True)

    @field_validator("*", mode="before")
    @classmethod
    def _text_is_storable(cls, value: Any) -> Any:
        """No NUL or lone surrogate in any string of any body (JSON can spell them as
        escapes): refused here, before anything could store one."""
        if (problem := unstorable(value)) is not None:
            raise ValueError(problem)
        return value


FILTER_DESCRIPTION = (
    "Only documents whose metadata (frontmatter `qmd: metadata:`) satisfies this filter: a JSON tree of"
    ' conditions {"field": KEY, "operator": OP, "value": V} with OP one of eq ne gt gte lt lte (a string,'
    " number or boolean), in nin all (an array), contains prefix suffix (a string), type"
    ' ("string"|"number"|"boolean"), exists (true|false); optional "caseInsensitive": true on string values;'
    ' combined with {"operator": "and"|"or", "operands": [...]} and {"operator": "not", "operand": {...}}.'
    ' Matching is typed and exact (3 never equals "3"); arrays match when any element does. Use the'
    " `metadata` tool (or POST /metadata) to see which keys and values exist."
)


FUZZY_DESCRIPTION = (
    "Typo tolerance: a keyword of 4 or more letters that no document holds is searched as its nearest"
    " indexed word (1 edit for a stem under 6 letters, 2 from 6; same first letter; never a quoted phrase,"
    " a negation or a word with a digit), and `warnings` says so: \"searched 'kubernetes' for 'kuberentes'\"."
)


def filter_of(raw: dict[str, Any] | None) -> Filter | None:
    """The request's filter, parsed; a bad one raises `InvalidInput` naming the node."""
    return None if raw is None else parse_filter(raw)


class SubSearch(Request):
    type: SubQueryType = Field(
        description="lex = keywords (BM25), vec = meaning, hyde = hypothetical answer text.",
    )
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)


class QueryFields(Request):
    """The hybrid query as every surface states it: typed `searches`, or a `query`
    (plain text to expand, or a query document of `lex:`/`vec:`/`hyde:` lines)."""

    searches: list[SubSearch] | None = Field(
        None,
        min_length=1,
        max_length=MAX_SEARCHES,
        description="Typed sub-queries; results of all of them are merged. Mutually exclusive with `query`.",
    )
    query: str | None = Field(
        None,
        max_length=MAX_QUERY_CHARS,
        description="Plain-text query, expanded by the local model (or a query document of "
        "lex:/vec:/hyde: lines). Mutually exclusive with `searches`.",
    )
    limit: int = Field(RESULTS, ge=1, le=100_000, description="Maximum number of results.")
    min_score: float = Field(0.0, ge=0.0, le=1.0, description="Drop results scoring below this (0-1).")
    min_relevance: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Drop results less likely than this to be relevant (`relevance`, 0-1); when none is left, "
        "the answer names the closest one.",
    )
    candidate_limit: int = Field(
        CANDIDATE_LIMIT, ge=1, le=1000, description="Candidates kept after fusion and handed to the reranker."
    )
    collections: list[str] | None = Field(
        None, description="Only search these collections (default: every collection included by default)."
    )
    intent: str | None = Field(
        None, max_length=2000, description="What the search is for; disambiguates the query and focuses snippets."
    )
    rerank: bool | None = Field(
        None,
        description="Rerank the merged candidates (default: with a model trained to rank only; a general "
        "small model's query likelihood costs seconds per query on a CPU).",
    )
    expand: bool | None = Field(
        None,
        description="Expand a plain-text query with the generate model (default: with a model trained "
        "for it only; a general small model's expansions measured no gain).",
    )
    budget_ms: int | None = Field(
        None,
        ge=1,
        le=600_000,
        description="Answer within this many milliseconds; stages that do not fit are skipped and reported.",
    )
    filter: dict[str, Any] | None = Field(None, description=FILTER_DESCRIPTION)
    chunk_strategy: ChunkStrategy | None = Field(
        None,
        description="How candidates are cut to pick each one's reranked passage: `auto` keeps a code file's "
        "passage inside its function or class; default: each collection's own (index.yml `chunk_strategy`).",
    )
    fuzzy: bool = Field(False, description=FUZZY_DESCRIPTION)


class QueryRequest(QueryFields):
    """`POST /query` and `/search` (spec §21.1)."""

    explain: bool = Field(False, description="Add each result's ranking trace and every stage's detail.")


class CliQueryRequest(QueryRequest):
    """`POST /v1/query`: `qmd query`, which can also ask for every result or whole documents."""

    all: bool = Field(False, description="Every result above minScore, whatever the limit.")
    full: bool = Field(False, description="Whole documents instead of snippets.")


class McpQueryArgs(QueryFields):
    """The MCP `query` tool. Agents call it in loops, so by default it answers within ~4 s
    (dropping expansion, then reranking, then vectors as needed, each drop reported)
    with at most ~8 pointers (seeds/002: a budget that keeps ranking honest)."""

    limit: int = Field(MCP_RESULTS, ge=1, le=1000, description="Maximum number of results.")
    min_relevance: float = Field(
        AGENT_FLOOR,
        ge=0.0,
        le=1.0,
        description="Drop results less likely than this to be relevant (`relevance`, 0-1; 0 keeps all); "
        "when none is left, the answer says so and names the closest one.",
    )
    budget_ms: int | None = Field(
        MCP_BUDGET_MS,
        ge=1,
        le=600_000,
        description="Answer within this many milliseconds; stages that do not fit are skipped and reported.",
    )


CLI_SNIPPET_CHARS = 500
"""The CLI shows longer passages than the 300 characters an agent gets (spec §15.2)."""


def form_error(req: QueryFields) -> str | None:
    """Why a request names no query or two (spec §20.3's wording), or None when it names one."""
    if req.query is not None and req.searches is not None:
        return "'query' and 'searches' are mutually exclusive; provide only one"
    if req.query is None and req.searches is None:
        return "provide either 'query' (plain text) or 'searches' (typed sub-queries)"
    return None


def query_plan(req: QueryFields, snippet_chars: int = 300) -> tuple[QueryDoc, QueryOptions]:
    """What to search and how, from any surface's request; form and grammar errors raise `InvalidInput`."""
    if (error := form_error(req)) is not None:
        raise InvalidInput(error)
    if req.searches is not None:
        doc = typed_query([(s.type, s.query) for s in req.searches], req.intent)
    else:
        doc = parse_query(req.query or "", req.intent)
    return doc, QueryOptions(
        collections=req.collections,
        limit=req.limit,
        min_score=req.min_score,
        min_relevance=req.min_relevance,
        candidate_limit=req.candidate_limit,
        rerank=req.rerank,
        expand=req.expand,
        budget_ms=req.budget_ms,
        explain=isinstance(req, QueryRequest) and req.explain,
        all_results=isinstance(req, CliQueryRequest) and req.all,
        full=isinstance(req, CliQueryRequest) and req.full,
        max_len=snippet_chars,
        filter=filter_of(req.filter),
        chunk_strategy=req.chunk_strategy,
        fuzzy=req.fuzzy,
    )


class SearchRequest(Request):
    """`qmd search` and `qmd vsearch` (`/v1/keyword`, `/v1/vector`)."""

    query: str = Field(max_length=MAX_QUERY_CHARS)
    collections: list[str] | None = None
    limit: int = Field(CLI_RESULTS, ge=1, le=100_000)
    min_score: float = Field(0.0, ge=0.0, le=1.0)
    all: bool = False
    full: bool = False
    explain: bool = False
    filter: dict[str, Any] | None = None
    fuzzy: bool = Field(False, description=FUZZY_DESCRIPTION)

    def options(self) -> SearchOptions:
        return SearchOptions(
            self.collections,
            self.limit,
            self.min_score,
            self.all,
            self.full,
            self.explain,
            filter=filter_of(self.filter),
            fuzzy=self.fuzzy,
        )


class MetadataRequest(Request):
    """`POST /metadata`, the MCP `metadata` tool, `qmd collection metadata`: show the
    metadata matching `match`, for the documents passing `filter`."""

    collections: list[str] | None = Field(
        None, description="Restrict discovery to these collections (default: the collections `query` searches)."
    )
    match: dict[str, Any] | None = Field(
        None,
        description="Report only metadata entries matching this condition: the filter grammar with `field` "
        '"key" (the entry\'s key name) or "value" (its value), e.g. {"field":"key","operator":"eq","value":"topics"} '
        'or {"field":"value","operator":"prefix","value":"2025-"}. `exists` and `all` are refused.',
    )
    filter: dict[str, Any] | None = Field(
        None, description="Count only documents matching this filter (the same filter as `query` takes)."
    )
    key_limit: int | None = Field(
        discovery.DEFAULT_KEY_LIMIT,
        ge=1,
        le=100_000,
        description="Keys reported, in coverage order (null: every key). `totalKeys` and `remainingKeys` "
        "describe the rest.",
    )
    key_offset: int = Field(0, ge=0, description="Keys skipped before the window, in report order.")
    value_limit: int | None = Field(
        discovery.DEFAULT_VALUE_LIMIT,
        ge=1,
        le=100_000,
        description="Values reported per key and type (null: every value). `remainingValues` reports the rest.",
    )
    value_offset: int = Field(0, ge=0, description="Values skipped per key and type, in `sort` order.")
    sort: Literal["count", "value"] = Field("count", description="Order values by document count or by value.")
    min_count: int = Field(1, ge=1, description="Hide values held by fewer documents.")

    def options(self, scope: list[str]) -> MetadataOptions:
        return MetadataOptions(
            scope,
            match=None if self.match is None else parse_match(self.match),
            filter=filter_of(self.filter),
            key_limit=self.key_limit,
            key_offset=self.key_offset,
            value_limit=self.value_limit,
            value_offset=self.value_offset,
            sort=self.sort,
            min_count=self.min_count,
        )


class GetRequest(Request):
    """`qmd get`, MCP `get`: one document, or the exact range a pointer named."""

    file: str = Field(
        min_length=1,
        max_length=4096,
        description="A path (`notes/a.md`, `qmd://notes/a.md`) or docid (`#abc123`), optionally with "
        "a line range suffix: `notes/a.md:100` (from line 100) or `notes/a.md:100:40` (40 lines from 100), "
        "or a markdown section: `notes/a.md#getting-started` (a heading's GitHub anchor, or its text) reads "
        "that section whole, from its heading to the next heading of the same or a higher level.",
    )
    from_line: int | None = Field(None, ge=1, description="First line to return (wins over the suffix).")
    max_lines: int | None = Field(None, ge=1, description="Number of lines (wins over the suffix).")
    full: bool = Field(
        False,
        description="The whole document, whatever line range `file` names (not with a first line or a line count).",
    )
    line_numbers: bool = Field(True, description="Prefix each line with its number.")


class CliGetRequest(GetRequest):
    """`/v1/get`: relative paths resolve against the caller's working directory."""

    cwd: str | None = None


DEFAULT_MAX_BYTES = 65536


class MultiGetRequest(Request):
    """`qmd multi-get`, MCP `multi_get`: several documents by glob, list or docids."""

    pattern: str = Field(
        min_length=1,
        max_length=4096,
        description="A glob (`journals/2025-05*.md`), a comma-separated list of paths, or docids (#abc123).",
    )
    max_lines: int | None = Field(None, ge=1, description="Keep the first N lines of each document.")
    max_bytes: int = Field(
        DEFAULT_MAX_BYTES,
        ge=1,
        description="Skip documents larger than this (they can still be read with `get`).",
    )
    line_numbers: bool = Field(True, description="Prefix each line with its number.")


class CliMultiGetRequest(MultiGetRequest):
    """`/v1/multi-get`: relative paths resolve against the caller's working directory."""

    cwd: str | None = None


class StatusRequest(Request):
    """MCP `status`: no parameters."""


class EmbedRequest(Request):
    collections: list[str] | None = None
    force: bool = False
    max_docs_per_batch: int = Field(64, ge=1, le=100_000)
    max_batch_mb: float = Field(4.0, gt=0, le=1024)
    chunk_strategy: ChunkStrategy | None = Field(
        None, description="Make this the chunk strategy of the collections embedded (saved in index.yml) first."
    )


class BenchRequest(Request):
    """`qmd bench`: a fixture's JSON, or the absolute path of a BEIR-format folder."""

    fixture: dict[str, Any] | None = Field(None, description="A fixture in the seed's format (version 1).")
    source: str = Field("fixture", max_length=4096, description="The fixture's file name, for the report.")
    beir: str | None = Field(None, max_length=4096, description="Absolute path of a BEIR folder instead.")
    collection: str | None = None
    backends: list[Literal["bm25", "vector", "hybrid", "full"]] | None = None
    split: str = Field("test", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    max_queries: int | None = Field(None, ge=1)
    embed: bool = False
    keep: bool = False
    candidate_limit: int = Field(
        CANDIDATE_LIMIT, ge=1, le=1000, description="hybrid and full: candidates kept after fusion."
    )
    expand: bool | None = Field(None, description="hybrid and full: expand each query (default: as a query does).")

    def spec(self) -> BenchSpec:
        """The engine's request; exactly one of `fixture` and `beir`, a BEIR path absolute."""
        if (self.fixture is None) == (self.beir is None):
            raise InvalidInput("give a fixture or a BEIR folder (beir), not both and not neither")
        if self.beir is not None and not self.beir.startswith("/"):
            raise InvalidInput(f"beir must be an absolute path, got {self.beir!r}")
        if self.beir is None and (self.embed or self.keep):
            raise InvalidInput("embed and keep apply to a BEIR folder only")
        return BenchSpec(
            fixture=self.fixture,
            source=self.source,
            beir=self.beir,
            collection=self.collection,
            backends=tuple(self.backends) if self.backends else BACKENDS,
            split=self.split,
            max_queries=self.max_queries,
            embed=self.embed,
            keep=self.keep,
            candidate_limit=self.candidate_limit,
            expand=self.expand,
        )


class PullRequest(Request):
    refresh: bool = False


class TrustApprove(Request):
    """`qmd trust`: approve a project's gated items, named by the fingerprint of the set
    the user was shown (an edit since then is refused, not approved blind)."""

    fingerprint: str = Field(pattern=r"^[0-9a-f]{64}$")


class TrustRevoke(Request):
    """`qmd trust revoke`: the project folder whose approval goes."""

    root: str = Field(min_length=1)


class InitRequest(Request):
    """`qmd init`: the folder that becomes a project (absolute)."""

    path: str = Field(min_length=1)


class CollectionCreate(Request):
    path: str = Field(min_length=1)
    name: str | None = None
    pattern: str | None = None


class CollectionPatch(Request):
    include_by_default: bool | None = None
    update_command: str | None = None
    clear_update_command: bool = False


class RenameRequest(Request):
    new_name: str


class UpdateRequest(Request):
    collections: list[str] | None = None


class CopyRequest(Request):
    """`qmd index copy`: one index into another, between SQLite and Postgres (`index.copy`)."""

    source: str = Field(min_length=1, description="An index name, a SQLite file or a postgresql:// URL.")
    destination: str = Field(min_length=1, description="Where the copy goes; the same forms as `source`.")
    replace: bool = Field(False, description="Empty a destination that holds an index first (else refused).")


class CleanupRequest(Request):
    """`qmd cleanup`: drop what the index holds that nothing needs (`index.upkeep`)."""

    dry_run: bool = Field(False, description="Count what would be dropped; change nothing.")
    vacuum: bool | None = Field(None, description="VACUUM: always (true), never (false), when worth it (null).")
    cache_days: int = Field(
        CACHE_MAX_AGE_DAYS, ge=0, le=36_500, description="Drop model-cache entries older than this many days."
    )
    wait_s: float = Field(30.0, ge=0, le=3600, description="Seconds to wait for a running update or embed.")


class ContextAdd(Request):
    target: str = Field(min_length=1)
    text: str
    cwd: str | None = None


class ContextRemove(Request):
    target: str = Field(min_length=1)
    cwd: str | None = None


# -- responses -----------------------------------------------------------------------


class Response(BaseModel):
    """camelCase when a public route or MCP sends it (FastAPI serializes by alias),
    snake_case for the CLI's `/v1` routes (`response_model_by_alias=False`)."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True)


R = TypeVar("R", bound=Response)
D = TypeVar("D")


class Health(Response):
    status: Literal["ok"]
    uptime: int
    pid: int
    version: str
    index: str
    """The index this request named (the daemon's default when it named none)."""
    indexes: list[str]
    """Every index open in this daemon now, its default first (the one whose pidfile it wrote)."""


class SettingsOut(Response):
    """`GET /v1/settings`: behind the token and same-user checks, unlike `/health`, since
    model paths and trust overrides are nobody else's business."""

    settings: dict[str, str]
    """The daemon-read `QMD_*` variables it started with (`qmd.settings`; secrets as a hash):
    the CLI says when its own environment has another value, which this daemon ignores."""


class StageOut(Response):
    stage: str
    status: Literal["ran", "cached", "partial", "skipped", "off"]
    ms: float
    detail: str


class SkippedOut(Response):
    stage: str
    reason: str


class ResultOut(Response):
    """A pointer as the public surfaces show it (spec §20.3, §21.1)."""

    docid: str
    """`#abc123`."""
    file: str
    """`qmd://collection/path` (over HTTP and MCP alike), as `get` takes it back."""
    title: str
    score: float
    fusion: float | None = None
    rerank: float | None = None
    relevance: float | None = None
    """How likely the result is relevant (0-1), the same meaning for every query (search/relevance.py)."""
    context: str | None
    line: int
    lines: str
    """`start-end`: the range to read before citing."""
    page: int | None = None
    """A PDF's result: the page the passage is on (null for documents without pages)."""
    page_lines: str | None = None
    """`start-end` within that page's text: `file#page=N:start:count` reads them too."""
    snippet: str
    """The passage under its `@@` header, each line numbered with its real number."""
    explain: dict[str, Any] | None = None
    metadata: dict[str, Any]
    """The document's indexed metadata; empty when it has none."""


class ExpandedOut(Response):
    type: str
    query: str


class HitOut(Response):
    """A pointer as the CLI reads it: the raw passage and its line numbers, so the CLI can
    number, highlight and link it in each of its formats."""

    file: str
    docid: str
    collection: str
    path: str
    abs_path: str | None
    title: str
    context: str | None
    score: float
    fusion: float | None = None
    rerank: float | None = None
    relevance: float | None = None
    line: int
    start_line: int
    end_line: int
    total_lines: int
    snippet: str
    body: str | None
    terms: list[str]
    explain: dict[str, Any] | None = None
    metadata: dict[str, Any]
    page: PageSpan | None = None
    """A PDF's hit: its page and the passage's lines within that page."""


class FilterOut(Response):
    """Under a filter: how much of the scope it could see and admitted."""

    documents: int
    eligible: int
    pending: int
    rejected: int


class QueryResponse(Response, Generic[R]):
    """The hybrid query's answer: the pointers and its account of itself (every stage,
    what was skipped and why). Public routes and MCP send `QueryResponse[ResultOut]` in
    camelCase; `/v1/query` sends `QueryResponse[HitOut]` in snake_case, as the CLI reads."""

    results: list[R]
    stages: list[StageOut]
    skipped: list[SkippedOut]
    warnings: list[str]
    expansion: list[ExpandedOut] | None = None
    below_min_score: bool = False
    closest: R | None = None
    """When `minRelevance` left no result: the most relevant one it dropped."""
    elapsed_ms: float
    budget_ms: float | None = None
    filter: FilterOut | None = None


class SearchResponse(Response):
    """`qmd search` / `qmd vsearch`: the pointers and what the caller must be told."""

    results: list[HitOut]
    below_min_score: bool
    warnings: list[str]
    degraded: bool
    filter: FilterOut | None = None
    editor_uri: str | None = None
    """`editor_uri` from index.yml, for the CLI's editor links (`QMD_EDITOR_URI` wins)."""


class CliQueryResponse(QueryResponse[HitOut]):
    """`qmd query`: the hybrid answer, plus what the CLI needs to draw links."""

    editor_uri: str | None = None


class ValueOut(Response):
    value: str | bool | int | float
    documents: int


class RangeOut(Response):
    min: int | float
    median: int | float
    max: int | float


class TypeOut(Response):
    type: Literal["string", "number", "boolean"]
    multi_valued: bool
    documents: int
    distinct_values: int
    values: list[ValueOut]
    remaining_values: int
    range: RangeOut | None = None
    collections: list[str]


class KeyOut(Response):
    key: str
    documents: int
    types: list[TypeOut]


class RejectionOut(Response):
    collection: str
    path: str
    reason: str


class MetadataResponse(Response):
    """Discovery's answer (seed: "Metadata Discovery"): keys in coverage order, each split
    by type. Counts are documents; with a filter, `filteredDocuments` is the denominator."""

    collections: list[str]
    documents: int
    filtered_documents: int | None
    total_keys: int
    remaining_keys: int
    keys: list[KeyOut]
    with_metadata: int
    pending: int
    rejected: int
    rejected_examples: list[RejectionOut]
    warnings: list[str]
    """What the answer cannot see: documents pending extraction, rejected metadata."""


class CliMetadataResponse(MetadataResponse):
    """`qmd collection metadata`: the answer and its text, drawn where MCP draws it."""

    text: str


class McpKey(Response):
    key: str
    documents: int
    types: list[str]
    """`string`, `string[]` (an array), `number`, `boolean`; more than one when documents disagree."""


class McpCollection(Response):
    name: str
    path: str
    pattern: str
    documents: int
    last_updated: str
    metadata_keys: list[McpKey]
    """The most covered metadata keys: what `filter` can use here (`metadata` tells more)."""


class McpStatus(Response):
    """The MCP `status` tool's structured content (spec §20.3)."""

    total_documents: int
    needs_embedding: int
    has_vector_index: bool
    collections: list[McpCollection]


# -- the mapping ---------------------------------------------------------------------


def result_out(p: Pointer, *, file: str) -> ResultOut:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, SCORE_DECIMALS)

    return ResultOut(
        page=None if p.page is None else p.page.page,
        page_lines=None if p.page is None else p.page.lines,
        docid="#" + p.doc.docid,
        file=file,
        title=p.doc.title,
        score=round(p.score, SCORE_DECIMALS),
        fusion=r(p.fusion),
        rerank=r(p.rerank),
        relevance=r(p.relevance),
        context=p.doc.context,
        line=p.line,
        lines=p.lines,
        snippet=p.numbered_snippet(),
        explain=p.explain,
        metadata=p.metadata,
    )


def hit_out(p: Pointer) -> HitOut:
    """The pointer's fields, its document's flattened in. Hybrid scores only on hybrid
    results: a route that leaves unset fields out (`exclude_unset`) sends none on a keyword hit."""
    hybrid_only = ("fusion", "rerank", "relevance")
    own = {f.name: getattr(p, f.name) for f in fields(p) if f.name != "doc" and f.name not in hybrid_only}
    hybrid = {name: getattr(p, name) for name in hybrid_only} if p.fusion is not None else {}
    return HitOut.model_validate({**asdict(p.doc), **own, **hybrid, "terms": list(p.terms)})


def filter_out(report: FilterReport | None) -> FilterOut | None:
    return None if report is None else FilterOut(**asdict(report))


def stage_out(s: Stage) -> StageOut:
    return StageOut(stage=s.stage, status=s.status, ms=round(s.ms, 1), detail=s.detail)


def query_response(
    out: HybridOutcome, result: Callable[[Pointer], R], cls: type[QueryResponse[R]] = QueryResponse, **extra: Any
) -> QueryResponse[R]:
    """The answer as `cls` (a `QueryResponse` or a subclass, whose own fields come in `extra`)."""
    return cls(
        **extra,
        results=[result(p) for p in out.hits],
        stages=[stage_out(s) for s in out.stages],
        skipped=[SkippedOut(stage=s.stage, reason=s.reason) for s in out.skipped],
        warnings=out.warnings,
        expansion=None if out.expansion is None else [ExpandedOut(type=t, query=q) for t, q in out.expansion],
        below_min_score=out.below_min_score,
        closest=None if out.closest is None else result(out.closest),
        elapsed_ms=round(out.elapsed_ms, 1),
        budget_ms=out.budget_ms,
        filter=filter_out(out.filter),
    )


def public_result(p: Pointer) -> ResultOut:
    """`/query` and the MCP `query` tool: files as `qmd://` URIs, which `get` takes back."""
    return result_out(p, file=p.doc.file)


class GatedOut(Response):
    """One gated item of a project config (`index.trust.Gated`)."""

    kind: Kind
    name: str
    value: str
    shown: str
    trusted: bool


class IndexFileOut(Response):
    """A path a project's index is kept in, and its state (`trust.IndexFile`)."""

    path: str
    role: str
    state: FileState
    why: str


class TrustOut(Response):
    """`GET /v1/trust`: the request's project, its gated items, and whether they are trusted;
    and its index files as they are (none outside a project)."""

    project: str | None
    items: list[GatedOut]
    fingerprint: str
    approved: bool
    approved_at: str | None
    override: str | None
    skipped: list[str]
    files: list[IndexFileOut]


class ApprovalOut(Response):
    root: str
    fingerprint: str
    approved_at: str
    items: list[str]
    state: ApprovalState | None = None


class InitOut(Response):
    root: str
    config: str
    collection: str
    models: dict[str, str]


def trust_out(gate: Gate, files: list[IndexFile]) -> TrustOut:
    return TrustOut(
        files=[IndexFileOut(**asdict(f)) for f in files],
        project=str(gate.root) if gate.root else None,
        items=[
            GatedOut(kind=i.kind, name=i.name, value=i.value, shown=i.shown, trusted=not gate.blocks(i.kind, i.name))
            for i in gate.items
        ],
        fingerprint=gate.fingerprint,
        approved=gate.approved,
        approved_at=gate.approved_at,
        override=gate.override,
        skipped=gate.notes(),
    )


def approval_out(a: Approval | Reviewed) -> ApprovalOut:
    approval, state = (a.approval, a.state) if isinstance(a, Reviewed) else (a, None)
    return ApprovalOut(**asdict(approval), state=state)


def metadata_response(
    report: MetadataReport, cls: type[MetadataResponse] = MetadataResponse, **extra: Any
) -> MetadataResponse:
    return cls.model_validate({**asdict(report), "warnings": discovery.warnings(report), **extra})


def metadata_text(
    report: MetadataReport, req: MetadataRequest, names: discovery.OptionNames = discovery.CLI_OPTIONS
) -> str:
    """The seed's text for a report, as the CLI prints it and MCP returns it, its hints
    naming the options as `names` spells them (the CLI's flags by default)."""
    return discovery.render(
        report,
        filtered=req.filter is not None,
        matched=req.match is not None,
        key_offset=req.key_offset,
        names=names,
    )


def search_response(out: SearchOutcome, editor_uri: str | None) -> SearchResponse:
    return SearchResponse(
        results=[hit_out(p) for p in out.hits],
        below_min_score=out.below_min_score,
        warnings=out.warnings,
        degraded=out.degraded,
        editor_uri=editor_uri,
        filter=filter_out(out.filter),
    )


# -- the CLI's other answers (/v1, snake_case) ------------------------------------------


@dataclass(frozen=True)
class CollectionOut(CollectionInfo):
    """A collection as `qmd collection list` and `qmd status` show it, with its most
    covered metadata keys as one line (`status, topics, +3 more`)."""

    metadata_keys: str = field(kw_only=True)


@dataclass(frozen=True)
class CollectionShown(CollectionOut):
    """`qmd collection show`: the same, with its metadata overview drawn."""

    metadata_overview: str = field(kw_only=True)


class DaemonOut(Response):
    pid: int
    uptime: int
    """Seconds since it started."""
    url: str


@dataclass(frozen=True)
class StatusOut(IndexStatus):
    """`GET /v1/status`: the index's status and the daemon that serves it."""

    collections: list[CollectionOut]
    daemon: DaemonOut = field(kw_only=True)


class BackgroundEmbedRequest(Request):
    """`qmd collection add`: embed the collection just added in the background, now."""

    collection: str = Field(min_length=1)


class EmbedProgressOut(Response):
    """`GET /v1/embed/progress` (`qmd embed --follow`): the embed running now, whoever started
    it, and the report of the last one that finished since the daemon started."""

    running: EmbedProgress | None
    last_source: EmbedSource | None
    last: dict[str, Any] | None
    """The last report as `qmd embed --json` prints it (`EmbedReport.as_json`)."""


class CollectionsOut(Response):
    collections: list[CollectionOut]


class CollectionCreated(Response):
    name: str
    path: str
    pattern: str


class CollectionPatched(Response):
    name: str
    include_by_default: bool
    update_command: str | None


class CollectionDeleted(Response):
    name: str
    deleted_documents: int


class CollectionRenamed(Response):
    old: str
    new: str


class CoverageOut(Response):
    collections: list[Coverage]


class ApprovalsOut(Response):
    approvals: list[ApprovalOut]


@dataclass(frozen=True)
class DocumentOut(DocumentRef):
    """`/v1/get`: the document's pointer fields, then the range and its text."""

    from_line: int = field(kw_only=True)
    to_line: int = field(kw_only=True)
    total_lines: int = field(kw_only=True)
    body: str = field(kw_only=True)
    pages: list[PageSpan] = field(kw_only=True)
    """A paged document (PDF): the pages these lines are on; empty for others."""


@dataclass(frozen=True)
class RetrievedOut(DocumentRef):
    """A `/v1/multi-get` document: its pointer fields and text, or why the text was left out."""

    bytes: int = field(kw_only=True)
    skipped: bool = field(kw_only=True)
    reason: str | None = field(kw_only=True)
    """Why the text was left out (`skipped`); never inside `body`."""
    body: str | None = field(kw_only=True)
    """Exactly the document's first lines: the whole of it, or `max_lines` of it."""
    total_lines: int = field(kw_only=True)
    """The document's line count."""
    truncated_lines: int = field(kw_only=True)
    """Lines left out after `body` by `max_lines` (0: `body` is the whole document)."""


class UnmatchedOut(Response):
    """A `/v1/multi-get` name that matched no document, and why."""

    file: str
    skipped: Literal[True]
    reason: str | None
    error: Literal[True]


class MultiGetOut(Response):
    items: list[RetrievedOut | UnmatchedOut]
    editor_uri: str | None


def extended(cls: type[D], base: Any, **more: Any) -> D:
    """`base`'s fields as an instance of `cls`, a dataclass that extends (or narrows) them with `more`."""
    return cls(**({f.name: getattr(base, f.name) for f in fields(base)} | more))


def document_answer(d: DocumentText) -> DocumentOut:
    return extended(
        DocumentOut,
        d.doc,
        from_line=d.from_line,
        to_line=d.to_line,
        total_lines=d.total_lines,
        body=d.body,
        pages=list(d.pages),
    )


def retrieved_answer(r: Retrieved) -> RetrievedOut | UnmatchedOut:
    if r.doc is None:
        return UnmatchedOut(file=r.name, skipped=True, reason=r.reason, error=True)
    return extended(
        RetrievedOut,
        r.doc,
        bytes=r.bytes,
        skipped=r.skipped,
        reason=r.reason,
        body=r.body,
        total_lines=r.total_lines or 0,
        truncated_lines=r.truncated_lines,
    )


class ContextsOut(Response):
    contexts: list[Context]


class LsCollection(Response):
    name: str
    files: int


class LsOut(Response):
    """`/v1/ls`: every collection with its file count, or (given a target) the files under it."""

    collections: list[LsCollection] | None = None
    collection: str | None = None
    prefix: str | None = None
    files: list[ListedFile] | None = None


def ls_answer(listing: Listing | list[CollectionInfo]) -> LsOut:
    if isinstance(listing, Listing):
        return LsOut(collection=listing.collection, prefix=listing.prefix, files=listing.files)
    return LsOut(collections=[LsCollection(name=c.name, files=c.files) for c in listing])
