"""`import qmd`: an index opened in this process, without the daemon or HTTP.

The seed's SDK (`createStore`, `search`, `get`, …) for Python programs. An `Index` is
an engine of its own: the same indexer, searches, pointers and errors as the daemon's
(`qmd.server.errors`), and its own inference worker when a model is used. Two
processes may read one index file; write to it from one (a daemon serving the same
file is a writer too).

Three ways to open one, as the seed's `createStore`:

    qmd.open("notes.sqlite", collections={"notes": {"path": "~/notes"}})  # inline
    qmd.open("notes.sqlite", config="qmd.yml")                           # a YAML file
    qmd.open("notes.sqlite")                  # the collections the index last recorded

The index path is always explicit: nothing is read from or written to the user's qmd
config or cache, so embedding qmd in an application has no side effects on it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NamedTuple

from qmd.defaults import VSEARCH_MIN_SCORE
from qmd.paths import DEFAULT_INDEX, IndexPaths, cache_root
from qmd.server.config import Config, ConfigFile, ConfigSource, Context, MemoryConfig, is_index_url
from qmd.server.engine import Engine
from qmd.server.errors import InvalidInput, Unavailable
from qmd.server.ingest.embed_job import EmbedReport
from qmd.server.ingest.update import UpdateReport
from qmd.server.models.worker import WorkerClient
from qmd.server.quality import BACKENDS, BenchReport, BenchSpec
from qmd.server.search.discovery import MetadataOptions, MetadataReport
from qmd.server.search.filters import Filter, parse_filter, parse_match
from qmd.server.search.hybrid import HybridOutcome, QueryOptions
from qmd.server.search.pointers import DocumentText, Retrieved, SearchOptions, SearchOutcome
from qmd.server.search.querydoc import SubQueryType, parse_query, typed_query
from qmd.server.status import CollectionInfo, IndexStatus
from qmd.server.store import catalog
from qmd.server.store.db import IndexStore
from qmd.server.store.sqlite import open_store
from qmd.server.text.chunking import ChunkStrategy

Progress = Callable[[dict[str, Any]], None]


class ExpandedQuery(NamedTuple):
    """One typed sub-query an expansion wrote (the seed's `ExpandedQuery`): a pair, so a
    list of them is what `Index.query(searches=…)` takes."""

    type: SubQueryType
    """`lex` (keywords for BM25), `vec` (a question to embed) or `hyde` (a passage a relevant document would hold)."""
    query: str


def open(  # noqa: A001 - `qmd.open` reads as what it does, like `sqlite3.connect`
    index: str | os.PathLike[str],
    *,
    collections: Mapping[str, Mapping[str, Any]] | None = None,
    config: str | os.PathLike[str] | None = None,
    models: Mapping[str, str] | None = None,
    verbose: bool = False,
) -> Index:
    """Open (or create) the index at `index`: a SQLite file, or a Postgres server's
    ``postgresql://…`` URL (the `postgres` extra).

    `collections` gives them inline (`{name: {"path": …, "pattern": …, "ignore": […],
    "context": {…}}}`, as in `index.yml`); `config` names a YAML file that holds them
    (changes are saved there); with neither, the collections are those the index file
    recorded when it was last written. `models` (`{"embed": uri, "generate": uri,
    "rerank": uri}`) goes with inline collections; a YAML file has its own `models:`.
    `verbose=True` lets llama.cpp's own log (warnings about a model file, such as
    `special_eos_id is not in special_eog_ids`) through as warnings of the `qmd.inference`
    logger, which reach stderr unless logging is configured; by default they are logged at
    DEBUG only.
    """
    url = str(index) if is_index_url(str(index)) else None
    db = cache_root() / "index.sqlite" if url else Path(index).expanduser()
    if collections is not None and config is not None:
        raise InvalidInput("give either 'collections' (inline) or 'config' (a YAML file), not both")
    if models is not None and config is not None:
        raise InvalidInput("'models' goes with inline collections; put them under 'models:' in the YAML file")
    yml = Path(config).expanduser() if config is not None else db.with_suffix(".yml")
    paths = IndexPaths(name=DEFAULT_INDEX, db=db, config=yml, cache_dir=cache_root())
    source: ConfigSource
    store = open_store(db, url)
    try:
        if config is not None:
            source = ConfigFile(yml)
        elif collections is not None:
            raw = {"collections": dict(collections), "models": dict(models or {})}
            source = MemoryConfig(Config.from_yaml(raw, Path("collections")))
        else:
            source = MemoryConfig(_recorded_config(store, models))
        worker = WorkerClient(native_log_level=logging.WARNING if verbose else logging.DEBUG)
        return Index(Engine(paths, source, store=store, worker=worker), worker)
    except BaseException:
        store.close()
        raise


def _recorded_config(store: IndexStore, models: Mapping[str, str] | None) -> Config:
    """What the index says about its collections (none for a new one)."""
    with store.read() as conn:
        recorded = catalog.mirrored_config(conn)
    return Config(collections=recorded.collections, global_context=recorded.global_context, models=dict(models or {}))


class Index:
    """An open index. Use it as a context manager, or call `close()`: it stops the
    writer thread and, if a model was used, the inference worker."""

    def __init__(self, engine: Engine, worker: WorkerClient | None = None) -> None:
        self.engine = engine
        self._worker = worker
        """The inference worker `open` made for this index (the engine does not own one it was given)."""

    def __enter__(self) -> Index:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.engine.close()
        finally:
            if self._worker is not None:
                self._worker.close()

    # -- collections and contexts ---------------------------------------------------

    def add_collection(
        self,
        name: str,
        path: str | os.PathLike[str],
        *,
        pattern: str | None = None,
        ignore: Sequence[str] | None = None,
    ) -> CollectionInfo:
        """Record a folder as a collection; `update()` indexes it. `ignore` holds globs
        (relative to the folder, as `index.yml`'s `ignore:`) of files left out of it."""
        coll = self.engine.create_collection(os.fspath(path), name, pattern, _ignore_globs(ignore))
        return self.collection(coll.name)

    def remove_collection(self, name: str) -> int:
        """Forget a collection and its documents; returns how many documents left the index."""
        return self.engine.remove_collection(name)

    def rename_collection(self, old: str, new: str) -> None:
        self.engine.rename_collection(old, new)

    def collections(self) -> list[CollectionInfo]:
        return self.engine.describe_collections()

    def collection(self, name: str) -> CollectionInfo:
        self.engine.config.get(name)
        return next(c for c in self.engine.describe_collections() if c.name == name)

    def add_context(self, target: str, text: str) -> None:
        """Describe a folder (`qmd://notes/meetings`, a path, or `/` for every collection):
        results under it carry the text."""
        self.engine.add_context(target, text, None)

    def remove_context(self, target: str) -> None:
        self.engine.remove_context(target, None)

    def list_contexts(self) -> list[Context]:
        """Every context: the global one first (`collection` None, `path` ""), then each
        collection's, by path within it (`""` for the whole collection)."""
        return self.engine.list_contexts()

    # -- indexing -------------------------------------------------------------------

    def update(self, collections: Sequence[str] | None = None, *, progress: Progress | None = None) -> UpdateReport:
        """Re-index (running each collection's update command first); incremental. The report
        counts, per collection, what changed since its last report (seed 001's words)."""
        return self.engine.update(list(collections) if collections else None, progress=progress)

    def embed(
        self,
        collections: Sequence[str] | None = None,
        *,
        force: bool = False,
        chunk_strategy: ChunkStrategy | None = None,
        progress: Progress | None = None,
    ) -> EmbedReport:
        """Embed what changed since the last run, for vector search (downloads an `hf:` model if needed).
        `chunk_strategy` ("auto": code files at their syntax; "regex") first becomes these
        collections' strategy, as `qmd embed --chunk-strategy` does."""
        return self.engine.embed(
            collections=list(collections) if collections else None,
            force=force,
            chunk_strategy=chunk_strategy,
            progress=progress,
        )

    # -- search -----------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        collections: Sequence[str] | None = None,
        limit: int = 5,
        min_score: float = 0.0,
        all: bool = False,  # noqa: A002 - the CLI's --all
        full: bool = False,
        filter: Mapping[str, Any] | None = None,  # noqa: A002 - the surfaces' `filter`
        fuzzy: bool = False,
    ) -> SearchOutcome:
        """Keyword (BM25) search: `.hits` are pointers, best first. `filter` is the
        metadata filter of every surface (a JSON-shaped dict); each hit's `.metadata`
        holds its document's. `fuzzy`: a word no document holds is searched as its nearest
        indexed word, and `.warnings` says so (`searched 'kubernetes' for 'kubernets'`)."""
        scope = list(collections) if collections else None
        opts = SearchOptions(scope, limit, min_score, all, full, filter=_filter(filter), fuzzy=fuzzy)
        return self.engine.search(query, opts)

    def vsearch(
        self,
        query: str,
        *,
        collections: Sequence[str] | None = None,
        limit: int = 5,
        min_score: float = VSEARCH_MIN_SCORE,
        all: bool = False,  # noqa: A002 - the CLI's --all
        full: bool = False,
        filter: Mapping[str, Any] | None = None,  # noqa: A002 - the surfaces' `filter`
    ) -> SearchOutcome:
        """Vector search; when it cannot run (no model, no vectors yet) keyword results,
        with `degraded` set and the reason in `warnings`."""
        scope = list(collections) if collections else None
        return self.engine.vsearch(query, SearchOptions(scope, limit, min_score, all, full, filter=_filter(filter)))

    def query(
        self,
        query: str | None = None,
        *,
        searches: Sequence[tuple[SubQueryType, str]] | None = None,
        intent: str | None = None,
        collections: Sequence[str] | None = None,
        limit: int = 10,
        min_score: float = 0.0,
        min_relevance: float = 0.0,
        candidate_limit: int = 40,
        rerank: bool | None = None,
        expand: bool | None = None,
        budget_ms: float | None = None,
        explain: bool = False,
        filter: Mapping[str, Any] | None = None,  # noqa: A002 - the surfaces' `filter`
        chunk_strategy: ChunkStrategy | None = None,
        fuzzy: bool = False,
    ) -> HybridOutcome:
        """The hybrid query: a plain `query` (expanded by the generate model) or a query
        document, or typed `searches` (`[("lex", "…"), ("vec", "…")]`). `.stages` says
        what ran, what was skipped and why; `fuzzy` corrects keyword typos as `search` does. Each
        hit's `relevance` is the probability it is relevant; `min_relevance` drops those below it
        (`.closest` then names the most relevant one dropped)."""
        if (query is None) == (searches is None):
            raise InvalidInput("give either 'query' (text or a query document) or 'searches' (typed sub-queries)")
        doc = parse_query(query, intent) if query is not None else typed_query(list(searches or ()), intent)
        opts = QueryOptions(
            collections=list(collections) if collections else None,
            limit=limit,
            min_score=min_score,
            min_relevance=min_relevance,
            candidate_limit=candidate_limit,
            rerank=rerank,
            expand=expand,
            budget_ms=budget_ms,
            explain=explain,
            filter=_filter(filter),
            chunk_strategy=chunk_strategy,
            fuzzy=fuzzy,
        )
        return self.engine.query(doc, opts)

    def expand_query(self, query: str) -> list[ExpandedQuery]:
        """The typed sub-queries the generate model writes for `query`: the expansion the
        hybrid query runs (same prompt, parser and cache), to look at or edit before
        `query(searches=…)`. When the model wrote nothing usable, the query itself as
        `lex` and `vec` (as the hybrid query searches then). Raises `Unavailable` when
        there is no generate model to run."""
        doc = parse_query(query)
        if doc.mode != "expand":
            raise InvalidInput("expand_query takes a plain query, not a query document: its lines are typed already")
        expander, why = self.engine.expander(self.engine.config)  # the hybrid query's own, cached per model
        if expander is None:
            raise Unavailable(why)
        with self.engine.worker.searching():
            expansion = expander.expand(doc.query)
        return [ExpandedQuery(kind, text) for kind, text in expansion.lines]

    def metadata(
        self,
        *,
        collections: Sequence[str] | None = None,
        match: Mapping[str, Any] | None = None,
        filter: Mapping[str, Any] | None = None,  # noqa: A002 - the surfaces' `filter`
        key_limit: int | None = 50,
        key_offset: int = 0,
        value_limit: int | None = 10,
        value_offset: int = 0,
        sort: Literal["count", "value"] = "count",
        min_count: int = 1,
    ) -> MetadataReport:
        """Discovery: which keys, types and values the documents in scope hold, so a
        filter can be written from what is indexed. `match` narrows the entries reported,
        `filter` the documents counted; `None` limits mean every key / value."""
        opts = MetadataOptions(
            self.engine.scope(list(collections) if collections else None),
            match=None if match is None else parse_match(dict(match)),
            filter=_filter(filter),
            key_limit=key_limit,
            key_offset=key_offset,
            value_limit=value_limit,
            value_offset=value_offset,
            sort=sort,
            min_count=min_count,
        )
        return self.engine.metadata(opts)

    def bench(
        self,
        fixture: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        *,
        beir: str | os.PathLike[str] | None = None,
        collection: str | None = None,
        backends: Sequence[str] = BACKENDS,
        split: str = "test",
        max_queries: int | None = None,
        embed: bool = False,
        keep: bool = False,
        candidate_limit: int = 40,
        expand: bool | None = None,
    ) -> BenchReport:
        """`qmd bench`: search quality per backend (bm25, vector, hybrid, full) on a fixture
        (its parsed JSON, or its file) against an indexed collection, or on a BEIR-format
        folder indexed into a collection of its own. `.summary[backend].means` holds the
        averages (`ndcg_at_10`, `mrr`, ...); `.backends` says what was skipped and why."""
        if (fixture is None) == (beir is None):
            raise InvalidInput("give a fixture or a BEIR folder (beir=), not both and not neither")
        unknown = sorted(set(backends) - set(BACKENDS))
        if unknown:
            raise InvalidInput(f"unknown backend(s) {', '.join(unknown)}: choose from {', '.join(BACKENDS)}")
        source, raw = "fixture", fixture
        if isinstance(fixture, str | os.PathLike):
            path = Path(fixture)
            try:
                raw, source = json.loads(path.read_text(encoding="utf-8")), path.name
            except (OSError, ValueError) as e:
                raise InvalidInput(f"cannot read the fixture {path}: {e}") from e
        spec = BenchSpec(
            fixture=raw,
            source=source,
            beir=str(Path(beir).resolve()) if beir is not None else None,
            collection=collection,
            backends=tuple(backends),
            split=split,
            max_queries=max_queries,
            embed=embed,
            keep=keep,
            candidate_limit=candidate_limit,
            expand=expand,
        )
        return self.engine.bench(spec)

    # -- retrieval ----------------------------------------------------------------------

    def get(
        self, name: str, *, from_line: int | None = None, max_lines: int | None = None, full: bool = False
    ) -> DocumentText:
        """A document by path (`notes/a.md`, `qmd://notes/a.md`) or docid (`#abc123`), or the
        range a pointer names (`notes/a.md:41:4`: 4 lines from line 41); `full=True`: the
        whole document whatever range the name carries; `notes/a.md#getting-started` (a
        heading's GitHub anchor, or its text): that section whole."""
        return self.engine.get(name, from_line=from_line, max_lines=max_lines, full=full)

    def multi_get(self, pattern: str, *, max_bytes: int = 65536, max_lines: int | None = None) -> list[Retrieved]:
        """Documents by glob (`notes/2026-*.md`), comma-separated names or docids."""
        return self.engine.multi_get(pattern, max_bytes=max_bytes, max_lines=max_lines)

    def status(self) -> IndexStatus:
        return self.engine.status()


def _ignore_globs(ignore: Sequence[str] | None) -> tuple[str, ...]:
    """`ignore=` as the collection keeps it; one glob may come as a string, as in YAML."""
    if ignore is None:
        return ()
    globs = [ignore] if isinstance(ignore, str) else list(ignore)
    if not all(isinstance(g, str) and g.strip() for g in globs):
        raise InvalidInput("'ignore' takes globs such as 'drafts/**' (non-empty strings)")
    return tuple(g.strip() for g in globs)


def _filter(raw: Mapping[str, Any] | None) -> Filter | None:
    """A filter as every surface takes it; a bad one raises `InvalidInput` naming the node."""
    return None if raw is None else parse_filter(dict(raw))
