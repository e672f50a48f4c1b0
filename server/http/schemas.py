"""Request and response bodies on the wire.

Every request model forbids unknown fields: the original silently ignored a
misspelled `collection`, and users got answers from the wrong collections.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator
from qmd.server.search.hybrid import QueryOptions
from qmd.server.search.querydoc import QueryDoc, parse_query, typed_query


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Health(BaseModel):
    status: Literal["ok"]
    uptime: int
    pid: int
    version: str
    index: str


class SubSearch(Strict):
    type: Literal["lex", "vec", "hyde"]
    query: str = Field(min_length=1, max_length=20_000)


class QueryRequest(Strict):
    """Body of `POST /query` and `/search` (spec §21.1): typed `searches`, or a `query`
    (plain text to expand, or a query document of `lex:`/`vec:`/`hyde:` lines)."""

    query: str | None = Field(None, max_length=20_000)
    searches: list[SubSearch] | None = Field(None, min_length=1, max_length=10)
    collections: list[str] | None = None
    limit: int = Field(10, ge=1, le=1000)
    minScore: float = Field(0.0, ge=0.0, le=1.0)
    candidateLimit: int = Field(40, ge=1, le=1000)
    intent: str | None = Field(None, max_length=2000)
    rerank: bool = True
    budgetMs: int | None = Field(None, ge=1, le=600_000)
    explain: bool = False

    @model_validator(mode="after")
    def _one_form(self) -> QueryRequest:
        if (self.query is None) == (self.searches is None):
            raise ValueError("give either 'query' (text or a query document) or 'searches' (typed sub-queries)")
        return self


class CamelQuery(Protocol):
    """The query fields `POST /query` and the MCP `query` tool share (camelCase on the wire)."""

    query: str | None
    searches: list[SubSearch] | list | None
    collections: list[str] | None
    limit: int
    minScore: float
    candidateLimit: int
    intent: str | None
    rerank: bool
    budgetMs: int | None


def query_plan(req: CamelQuery, *, explain: bool = False) -> tuple[QueryDoc, QueryOptions]:
    """What to search and how, from either wire form; grammar errors raise `InvalidInput`."""
    if req.searches is not None:
        doc = typed_query([(s.type, s.query) for s in req.searches], req.intent)
    else:
        doc = parse_query(req.query or "", req.intent)
    return doc, QueryOptions(
        collections=req.collections,
        limit=req.limit,
        min_score=req.minScore,
        candidate_limit=req.candidateLimit,
        rerank=req.rerank,
        budget_ms=req.budgetMs,
        explain=explain,
    )


class StageReport(BaseModel):
    stage: str
    status: Literal["ran", "cached", "partial", "skipped", "off"]
    ms: float
    detail: str


class SkippedStage(BaseModel):
    stage: str
    reason: str


class QueryResult(BaseModel):
    docid: str
    file: str
    title: str
    score: float
    fusion: float | None = None
    rerank: float | None = None
    context: str | None
    line: int
    lines: str
    snippet: str
    explain: dict | None = None


class Expanded(BaseModel):
    type: str
    query: str


class QueryResponse(BaseModel):
    results: list[QueryResult]
    stages: list[StageReport]
    skipped: list[SkippedStage]
    warnings: list[str]
    expansion: list[Expanded] | None = None
    elapsedMs: float
    budgetMs: int | None = None


class SearchRequest(Strict):
    """The CLI's `qmd search`."""

    query: str = Field(max_length=20_000)
    collections: list[str] | None = None
    limit: int = Field(5, ge=1, le=100_000)
    min_score: float = Field(0.0, ge=0.0, le=1.0)
    all: bool = False
    full: bool = False
    explain: bool = False


class CliQueryRequest(Strict):
    """The CLI's `qmd query`: the argument as typed (spec §11 grammar)."""

    query: str = Field(max_length=20_000)
    intent: str | None = Field(None, max_length=2000)
    collections: list[str] | None = None
    limit: int = Field(10, ge=1, le=100_000)
    min_score: float = Field(0.0, ge=0.0, le=1.0)
    all: bool = False
    full: bool = False
    explain: bool = False
    candidate_limit: int = Field(40, ge=1, le=1000)
    rerank: bool = True
    budget_ms: int | None = Field(None, ge=1, le=600_000)


class EmbedRequest(Strict):
    collections: list[str] | None = None
    force: bool = False
    max_docs_per_batch: int = Field(64, ge=1, le=100_000)
    max_batch_mb: float = Field(4.0, gt=0, le=1024)


class PullRequest(Strict):
    refresh: bool = False


class CollectionCreate(Strict):
    path: str = Field(min_length=1)
    name: str | None = None
    pattern: str | None = None


class CollectionPatch(Strict):
    include_by_default: bool | None = None
    update_command: str | None = None
    clear_update_command: bool = False


class RenameRequest(Strict):
    new_name: str


class UpdateRequest(Strict):
    collections: list[str] | None = None


class ContextAdd(Strict):
    target: str = Field(min_length=1)
    text: str
    cwd: str | None = None


class ContextRemove(Strict):
    target: str = Field(min_length=1)
    cwd: str | None = None


class GetRequest(Strict):
    name: str = Field(min_length=1, max_length=4096)
    from_line: int | None = Field(None, ge=-(10**9), le=10**9)
    max_lines: int | None = Field(None, ge=1)
    cwd: str | None = None


class MultiGetRequest(Strict):
    pattern: str = Field(min_length=1, max_length=4096)
    max_bytes: int = Field(65536, ge=1)
    max_lines: int | None = Field(None, ge=1)
    cwd: str | None = None
