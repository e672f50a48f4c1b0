"""What the engine reports about itself: the index, its collections, its vectors.

Typed, so `qmd status`, the MCP `status` tool, `doctor`, the library and the vector
leg of a query read the same fields; `http.wire` turns them into JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qmd.server.ingest.watcher import WatchInfo
from qmd.server.store.catalog import LastRun, SkippedFile
from qmd.server.store.metadata import ExtractionCounts
from qmd.server.text.code_chunks import GrammarStatus


@dataclass(frozen=True)
class VectorState:
    """Can vector search run, and over how much of the corpus?"""

    available: bool
    pending: int
    """Documents without a complete set of vectors from the current embedder."""
    embedded_chunks: int
    stale_contents: int
    """Contents with vectors from another embedder only (left by a model change)."""
    orphan_chunks: int
    """Vector chunks of contents no active document holds, until `qmd cleanup` drops them."""
    model: str | None
    fingerprint: str | None
    message: str
    """One line for the user: `vector search unavailable — 3 documents pending (run 'qmd embed')`."""
    spaces: dict[str, str] = field(default_factory=dict)
    """Chunk strategy → the fingerprint of its space, for the strategies the collections use."""


@dataclass(frozen=True)
class CollectionInfo:
    """A collection as configured (`index.yml`) and as indexed."""

    name: str
    uri: str
    path: str
    pattern: str
    ignore: list[str]
    update_command: str | None
    include_by_default: bool
    contexts: dict[str, str]
    files: int
    updated_at: str | None
    last_run: LastRun | None
    skipped: list[SkippedFile] = field(default_factory=list)
    metadata: ExtractionCounts | None = None
    """What a filter can see here: documents with metadata, pending, rejected (and why)."""
    chunk_strategy: str = "regex"
    """How its documents are cut for vectors (`index.chunking.ChunkStrategy`)."""
    watch: WatchInfo | None = None
    """Filled in by `status` only (it counts pending vectors per collection)."""


@dataclass(frozen=True)
class IndexStatus:
    version: str
    index: str
    index_path: str
    config_path: str
    size_bytes: int
    documents: int
    unique_contents: int
    sqlite_version: str
    sqlite_vec: str | None
    vector: VectorState
    inference: dict[str, Any]
    """The inference worker's own snapshot (`models.worker.WorkerClient.status`)."""
    collections: list[CollectionInfo]
    global_context: str | None
    grammars: list[GrammarStatus] = field(default_factory=list)
    """The code grammars of `--chunk-strategy auto`: which load here, and why others do not."""
    warnings: list[str] = field(default_factory=list)
    """What of a project-local config is not used now, and why (`index.trust`)."""
