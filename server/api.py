"""Request and response bodies on the wire.

Every request model forbids unknown fields: the original silently ignored a
misspelled `collection`, and users got answers from the wrong collections.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
    """Body of `POST /query` and `/search` (spec §21.1)."""

    searches: list[SubSearch] = Field(min_length=1, max_length=10)
    collections: list[str] | None = None
    limit: int = Field(10, ge=1, le=1000)
    minScore: float = Field(0.0, ge=0.0, le=1.0)
    candidateLimit: int | None = Field(None, ge=1, le=1000)
    intent: str | None = Field(None, max_length=2000)
    rerank: bool = True


class SkippedStage(BaseModel):
    stage: str
    reason: str


class QueryResult(BaseModel):
    docid: str
    file: str
    title: str
    score: float
    context: str | None
    line: int
    lines: str
    snippet: str


class QueryResponse(BaseModel):
    results: list[QueryResult]
    skipped: list[SkippedStage]
    warnings: list[str]


class SearchRequest(Strict):
    """The CLI's `qmd search`."""

    query: str = Field(max_length=20_000)
    collections: list[str] | None = None
    limit: int = Field(5, ge=1, le=100_000)
    min_score: float = Field(0.0, ge=0.0, le=1.0)
    all: bool = False
    full: bool = False
    explain: bool = False


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
