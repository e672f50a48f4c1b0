"""What the engine reports about itself: the index, its collections, its vectors, and
`qmd doctor`'s everything-at-once.

Typed, so `qmd status`, the MCP `status` tool, `doctor`, the library and the vector
leg of a query read the same fields; `http.wire` turns them into JSON.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata as packages
from typing import Any

from qmd.paths import IndexPaths
from qmd.server.config import Collection, Config
from qmd.server.ingest.embed_job import EmbedProgress, strategy_groups
from qmd.server.ingest.upkeep import Orphans
from qmd.server.ingest.watcher import Watcher, WatchInfo, off
from qmd.server.models.embedders import Embedder
from qmd.server.models.registry import ModelCheck
from qmd.server.store import catalog, metadata, vectors
from qmd.server.store.catalog import LastRun, SkippedFile
from qmd.server.store.db import IndexCheck, IndexStore
from qmd.server.store.metadata import ExtractionCounts
from qmd.server.text.chunking import ChunkStrategy
from qmd.server.text.code_chunks import GrammarStatus, grammar_status
from qmd.version import __version__

PACKAGES = (
    "qmd",
    "fastapi",
    "uvicorn",
    "pydantic",
    "mcp",
    "sqlite-vec",
    "pysqlite3-binary",
    "llama_cpp_python",
    "wcmatch",
    "PyYAML",
)
"""The distributions whose versions `qmd doctor` shows: what a bug report needs first."""


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
    collections: Sequence[CollectionInfo]
    global_context: str | None
    grammars: list[GrammarStatus] = field(default_factory=list)
    """The code grammars of `--chunk-strategy auto`: which load here, and why others do not."""
    warnings: list[str] = field(default_factory=list)
    """What of a project-local config is not used now, and why (`index.trust`)."""
    embedding: EmbedProgress | None = None
    """The embed running now (`qmd embed`'s or the watcher's), with its rate and ETA."""


def collection_infos(store: IndexStore, cfg: Config) -> list[CollectionInfo]:
    """Each configured collection as configured and as indexed (one that never was has
    the index's defaults), from one snapshot of the index."""
    with store.read() as conn:
        states = catalog.collection_states(conn)
        extraction = {name: metadata.extraction_counts(conn, [name]) for name in cfg.collections}
    unindexed = catalog.CollectionState()
    return [
        CollectionInfo(
            name=c.name,
            uri=f"qmd://{c.name}/",
            path=str(c.root),
            pattern=c.pattern,
            ignore=list(c.ignore),
            update_command=c.update,
            include_by_default=c.include_by_default,
            contexts=dict(c.context),
            files=st.files,
            updated_at=st.updated_at,
            last_run=st.last_run,
            skipped=list(st.skipped),
            metadata=extraction[c.name],
            chunk_strategy=c.chunk_strategy,
        )
        for c, st in ((c, states.get(c.name, unindexed)) for c in cfg.collections.values())
    ]


def watch_of(coll: Collection, pending: int, embedding: str, *, untrusted: bool, watcher: Watcher | None) -> WatchInfo:
    """A collection's watch as status shows it: why it is off, or the watcher's account."""
    if untrusted:
        return off("outside the project: untrusted project config (run 'qmd trust')", pending, embedding)
    if watcher is None:
        return off("only the daemon (qmdd) watches folders", pending, embedding)
    return watcher.info(coll, pending, embedding)


class VectorStates:
    """Can vector search run, and over how much of the corpus? Each answer is kept until
    the next write (the store's generation is part of its key) or a collection's chunk
    strategy changes, as status asks per collection. After a write the counts are asked
    again of `vectors`, which reads what changed: a few marks when the documents did not
    (an embed batch writes vectors only), the batch's rows (`vectors.pending_hashes`,
    `count_spaces`); the active documents again only when the documents mark moved."""

    def __init__(self, store: IndexStore) -> None:
        self.store = store
        self._counted: dict[tuple[object, ...], VectorState] = {}

    def get(
        self, emb: Embedder | None, reason: str, collections: list[str] | None, strategies: dict[str, ChunkStrategy]
    ) -> VectorState:
        """Each collection's documents against the space of the strategy it is cut by
        (`reason` says why there is no embedder when `emb` is None)."""
        key = (
            tuple(collections) if collections else None,
            emb.fingerprint if emb else reason,
            self.store.generation,
            tuple(sorted(strategies.items())),
        )
        cached = self._counted.get(key)
        if cached is not None:
            return cached
        groups = strategy_groups(collections, strategies)
        fingerprints: dict[str, str] = {s: emb.fingerprint_for(s) for s in groups} if emb else {}
        pending: set[str] = set()
        used: list[vectors.Space] = []
        with self.store.read() as conn:
            for strategy, names in groups.items():
                space = vectors.find_space(conn, fingerprints[strategy]) if emb else None
                pending |= vectors.pending_hashes(conn, space, names)
                used += [space] if space else []
            counts = vectors.count_spaces(conn, used)
        embedded = counts.embedded_chunks
        available = bool(emb) and embedded > 0
        if not emb:
            message = f"vector search unavailable — {len(pending)} documents pending ({reason})"
        elif not available:
            message = f"vector search unavailable — {len(pending)} documents pending (run 'qmd embed')"
        elif pending:
            message = f"vector search partial — {len(pending)} documents pending (run 'qmd embed')"
        else:
            message = f"{embedded} chunks embedded; nothing pending"
        state = VectorState(
            available=available,
            pending=len(pending),
            embedded_chunks=embedded,
            stale_contents=counts.stale_contents,
            orphan_chunks=counts.orphan_chunks,
            model=emb.uri if emb else None,
            fingerprint=emb.fingerprint if emb else None,
            message=message,
            spaces=fingerprints,
        )
        if len(self._counted) > 64:
            self._counted.clear()
        self._counted[key] = state
        return state


def index_status(
    store: IndexStore,
    paths: IndexPaths,
    cfg: Config,
    *,
    vector: VectorState,
    inference: dict[str, Any],
    collections: list[CollectionInfo],
    warnings: list[str],
    embedding: EmbedProgress | None,
) -> IndexStatus:
    """`qmd status`: the index's counts and versions with what the engine found."""
    with store.read() as conn:
        counts = catalog.document_counts(conn)
    return IndexStatus(
        version=__version__,
        index=paths.name,
        index_path=store.location,
        config_path=str(paths.config),
        size_bytes=store.size_bytes(),
        documents=counts.documents,
        unique_contents=counts.unique_contents,
        sqlite_version=store.sqlite_version,
        sqlite_vec=store.vec_version,
        vector=vector,
        inference=inference,
        collections=collections,
        global_context=cfg.global_context,
        grammars=grammar_status(),
        warnings=warnings,
        embedding=embedding,
    )


@dataclass(frozen=True)
class Doctor:
    """`qmd doctor`: everything worth knowing when something is off, in one answer."""

    python: str
    packages: dict[str, str | None]
    """Each package's installed version; None when it is not installed."""
    sqlite: str
    sqlite_vec: str | None
    backend: str
    index: list[IndexCheck]
    inference: dict[str, Any]
    models: list[ModelCheck]
    vector: VectorState
    orphans: Orphans
    config_path: str
    index_path: str


def doctor(
    store: IndexStore,
    paths: IndexPaths,
    *,
    inference: dict[str, Any],
    models: list[ModelCheck],
    vector: VectorState,
    orphans: Orphans,
) -> Doctor:
    def version(pkg: str) -> str | None:
        try:
            return packages.version(pkg)
        except packages.PackageNotFoundError:
            return None

    return Doctor(
        python=sys.version.split()[0],
        packages={p: version(p) for p in PACKAGES},
        sqlite=store.sqlite_version,
        sqlite_vec=store.vec_version,
        backend=store.dialect.name,
        index=store.checks(),
        inference=inference,
        models=models,
        vector=vector,
        orphans=orphans,
        config_path=str(paths.config),
        index_path=str(paths.db),
    )
