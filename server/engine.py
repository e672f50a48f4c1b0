"""The engine: the composition root of one index.

It wires the store, the config (and the trust gate over a project's), the models and
the jobs' locks together, and each operation is a short delegation to the room that
does the work: `ingest` (indexing, embedding, upkeep), `search` (queries, reading back),
`models.registry` (a role's ready model), `status` and `quality`. It knows nothing of
HTTP and holds no SQL: routes, the MCP tools and the library call these methods; they
return plain data and raise `errors.QmdError` subclasses for anything the caller should fix.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from qmd.paths import DEFAULT_INDEX, IndexPaths
from qmd.server import quality, status, trust
from qmd.server.config import (
    DEFAULT_PATTERN,
    Collection,
    Config,
    ConfigFile,
    ConfigSource,
    Context,
    check_chunk_strategy,
    collection_folder,
    expand_path,
    index_server,
    normalize_context_key,
    stored_path,
    validate_collection_name,
)
from qmd.server.errors import Conflict, InvalidInput, NotFound, QmdError, Unavailable
from qmd.server.ingest import upkeep
from qmd.server.ingest.embed_job import BackgroundStart, EmbedReport, EmbedTracker, either, embed_pending
from qmd.server.ingest.indexer import Pace, Progress, Scope, Summary, index_collection, split_mask
from qmd.server.ingest.indexer import discover as walk_collection
from qmd.server.ingest.update import ChangeLog, UpdateReport, run_update
from qmd.server.ingest.watcher import Watcher
from qmd.server.models.embedders import Embedder, EmbedderUnavailable
from qmd.server.models.refs import RemoteRef
from qmd.server.models.registry import LocalModel, Models, Pulled, Ready
from qmd.server.models.worker import WorkerClient, background_lane, env_number
from qmd.server.search import legs, reading
from qmd.server.search.discovery import CollectionKeys, MetadataOptions, MetadataReport, discover, top_keys
from qmd.server.search.expansion import Expander
from qmd.server.search.hybrid import (
    RERANK_PASSAGE_CHARS,
    CostModel,
    HybridOutcome,
    HybridQuery,
    Legs,
    QueryOptions,
    VectorLeg,
)
from qmd.server.search.keyword import search
from qmd.server.search.pointers import DocumentText, Retrieved, SearchOptions, SearchOutcome
from qmd.server.search.querydoc import QueryDoc
from qmd.server.search.relevance import Scales
from qmd.server.search.rerank import CosineScorer, Reranker
from qmd.server.search.scope import resolve_scope, searchable
from qmd.server.search.vector import VectorUnavailable
from qmd.server.status import CollectionInfo, IndexStatus, VectorState
from qmd.server.store import catalog
from qmd.server.store import copy as index_copy
from qmd.server.store.db import IndexStore
from qmd.server.store.documents import parse_virtual, safe_relpath
from qmd.server.store.sqlite import open_store
from qmd.server.text.chunking import ChunkStrategy

log = logging.getLogger("qmd.engine")
BACKGROUND_SLICE_DOCS = 16
"""Documents per batch of a background embed: a user's `qmd embed` waits for at most one
sub-batch of their chunks (`embed_job.EMBED_SUB_BATCH`) before it runs."""


class Engine:
    """One index, its config and every operation on them (the daemon holds one; the
    library opens its own). `config` is where the collections live: the YAML file at
    `paths.config` unless the caller holds them itself (`MemoryConfig`)."""

    def __init__(
        self,
        paths: IndexPaths,
        config: ConfigSource | None = None,
        *,
        worker: WorkerClient | None = None,
        store: IndexStore | None = None,
    ) -> None:
        self.paths = paths
        self.config_file: ConfigSource = config or ConfigFile(paths.config, base=paths.project_root)
        self.store = store or open_store(paths.db, index_server(paths, self.config_file.load()))
        """The index (the caller's, or the one `QMD_INDEX_URL` / `index_url` / the file names)."""
        self.worker = worker or WorkerClient()
        self._owns_worker = worker is None
        """A daemon's other indexes share its default index's worker; the owner closes it."""
        self.models = Models(self.worker, paths.config.parent)
        """Role → ready model (embed, generate, rerank), for this index's config folder."""
        self.started = time.time()
        self._mutate = threading.RLock()
        self._update = threading.Lock()
        self._embed = threading.Lock()
        self._embed_turns = threading.Condition()
        """Guards `_users_embedding` and `_embed_holder`; background embeds wait on it for their turn."""
        self._users_embedding = 0
        """Users' embeds running or waiting for the embed lock: background embeds yield to them (`_user_turn`)."""
        self._yield_background = threading.Event()
        """Set while `_users_embedding`: a background embed stops at its next slice boundary."""
        self._embed_holder = ""
        """Who holds the embed lock, in words, for a user's embed that must wait."""
        self._vector_states = status.VectorStates(self.store)
        self.changes = ChangeLog()
        """What every pass changed since each collection's last update report (`ingest.update`)."""
        self.embeds = EmbedTracker()
        """The running embed, whoever started it, and the last one's report."""
        self._closing = threading.Event()
        self._background: list[threading.Thread] = []
        """Embeds `embed_in_background` started (they wait their turn on the embed lock)."""
        self.costs = CostModel()
        self.scales = Scales()
        """Each embedder's cosine scale, what a hit's relevance reads its cosine on."""
        self.rerank_passage_chars = int(env_number("QMD_RERANK_PASSAGE_CHARS", RERANK_PASSAGE_CHARS, int))
        """Characters of each candidate's passage a reranker scores; its cost is about linear in them."""
        self._expanders: dict[LocalModel | RemoteRef, Expander] = {}
        self._rerankers: dict[Ready, Reranker | CosineScorer] = {}
        self._synced: Config | None = None
        self.watcher: Watcher | None = None
        """The daemon's (`qmdd` sets it); a library engine watches nothing."""
        self.trust = trust.TrustFile()
        """The user's approvals of project configs (`index.trust`), read on each use."""
        self._mirror(self.config)  # validates the YAML and records it in the index at start

    # -- config -------------------------------------------------------------

    @property
    def config(self) -> Config:
        """The config as it is now (re-read when the YAML changed on disk). Reading it
        writes nothing: the index's record of it follows the writes (`_save`, `update`)."""
        return self.config_file.load()

    def _mirror(self, cfg: Config) -> None:
        """Record the collections in the index (`store_collections`, spec §2.2), so the
        index file describes itself without the YAML (the library's index-only mode)."""
        if cfg is not self._synced:
            self.store.write(lambda conn: catalog.sync_collections(conn, cfg))
            self._synced = cfg

    def _save(self, cfg: Config) -> None:
        self.config_file.save(cfg)
        self._mirror(cfg)

    def gate(self, cfg: Config | None = None) -> trust.Gate:
        """What of a project-local config may be used now (`index.trust`): computed from the
        config and the user's approvals on every use, so an edit is gated at once. The
        user's own config (any index that is not a project's) is never gated."""
        root = self.paths.project_root
        if root is None:
            return trust.OPEN
        return trust.gate(cfg or self.config, root, self.paths.config.parent, self.trust)

    def usable_config(self, cfg: Config | None = None) -> Config:
        """The config with the `models:` that may be used; an untrusted project's own choice
        falls back to the default, which is all that is ever loaded or downloaded for it."""
        cfg = cfg or self.config
        return replace(cfg, models=self.gate(cfg).models(cfg.models))

    @property
    def index_label(self) -> str | None:
        """The index name shown in `qmd://…?index=NAME` links (None for the default)."""
        return None if self.paths.name == DEFAULT_INDEX else self.paths.name

    def close(self) -> None:
        self._closing.set()
        for t in self._background:
            t.join(timeout=60)
        if self.watcher is not None:
            self.watcher.stop()
        if self._owns_worker:
            self.worker.close()
        self.store.close()

    # -- collections --------------------------------------------------------

    def create_collection(
        self, path: str, name: str | None = None, pattern: str | None = None, ignore: tuple[str, ...] = ()
    ) -> Collection:
        """Validate and record a new collection (`ignore`: globs of files left out of it);
        indexing it is a separate `update`."""
        root = collection_folder(path)
        name = validate_collection_name(name or root.name or "root")
        pattern = (pattern or DEFAULT_PATTERN).strip()
        if not split_mask(pattern):
            raise InvalidInput(f"empty mask {pattern!r}: give a glob such as '**/*.md'")
        with self._mutate:
            cfg = self.config
            cfg.check_new(name, root, pattern)
            project = self.paths.project_root
            coll = Collection(name=name, path=stored_path(root, project), pattern=pattern, base=project, ignore=ignore)
            self._save(cfg.with_collection(coll))
        self._watch_changed()
        return coll

    def remove_collection(self, name: str) -> int:
        with self._mutate, self._update:
            self.config.get(name)
            deleted = self.store.write(lambda conn: catalog.delete_collection(conn, name))
            self._save(self.config.without_collection(name))
            self.changes.forget(name)
        self._watch_changed()
        return deleted

    def rename_collection(self, old: str, new: str) -> None:
        validate_collection_name(new)
        with self._mutate, self._update:
            cfg = self.config
            coll = cfg.get(old)
            if new in cfg.collections:
                raise Conflict(f"Collection '{new}' already exists.")
            self.store.write(lambda conn: catalog.rename_collection(conn, old, new))
            self._save(cfg.without_collection(old).with_collection(replace(coll, name=new)))
            self.changes.forget(old)
        self._watch_changed()

    def set_collection(
        self, name: str, *, include: bool | None = None, update_cmd: str | None = None, clear_update: bool = False
    ) -> Collection:
        with self._mutate:
            cfg = self.config
            coll = cfg.get(name)
            if include is not None:
                coll = replace(coll, include_by_default=include)
            if update_cmd is not None or clear_update:
                coll = replace(coll, update=(update_cmd or "").strip() or None)
            self._save(cfg.with_collection(coll))
        return coll

    def describe_collections(self) -> list[CollectionInfo]:
        return status.collection_infos(self.store, self.config)

    # -- contexts -----------------------------------------------------------

    def _context_target(self, target: str, cwd: str | None) -> tuple[str | None, str]:
        """(collection or None for global, key) of `/`, a `qmd://` path or a folder on disk."""
        t = target.strip()
        if t == "/":
            return None, ""
        virtual = parse_virtual(t)
        if virtual:
            self.config.get(virtual[0])
            return virtual[0], normalize_context_key(safe_relpath(virtual[1]))
        p = expand_path(t, Path(cwd) if cwd else None)
        found = self.config.collection_at(p)
        if found is None:
            raise NotFound(f"Path is not in any indexed collection: {p}")
        return found

    def add_context(self, target: str, text: str, cwd: str | None) -> Context:
        text = text.strip()
        if not text:
            raise InvalidInput("context text is empty")
        with self._mutate:
            coll_name, key = self._context_target(target, cwd)
            self._save(self.config.with_context(coll_name, key, text))
        return Context(coll_name, key, text)

    def remove_context(self, target: str, cwd: str | None) -> Context:
        with self._mutate:
            coll_name, key = self._context_target(target, cwd)
            cfg, removed = self.config.without_context(coll_name, key, target)
            self._save(cfg)
        return removed

    def list_contexts(self) -> list[Context]:
        return self.config.contexts()

    # -- indexing -----------------------------------------------------------

    def update(self, collections: list[str] | None = None, progress: Progress | None = None) -> UpdateReport:
        """Run each collection's hook, then re-index it, and report what changed since each
        was last reported, the watcher's passes included (`ingest.update`).

        The config is read under the update lock, which removing or renaming a
        collection also takes: an update queued behind one sees the collection gone,
        instead of re-indexing it from the config it read while waiting."""
        with self._update:
            cfg = self.config
            self._mirror(cfg)
            gate = self.gate(cfg)
            colls = [cfg.get(n) for n in collections or list(cfg.collections)]
            return run_update(self.store, colls, lambda kind, name: _held(gate, kind, name), self.changes, progress)

    # -- watching -------------------------------------------------------------

    def _watch_changed(self) -> None:
        """A collection came, went or was renamed: its watch starts or stops now."""
        if self.watcher is not None:
            self.watcher.poke()

    def watched_collections(self) -> list[Collection]:
        """What the watcher listens to: watched collections, less an untrusted project's
        outside folders (they are not even listened to)."""
        cfg = self.config
        gate = self.gate(cfg)
        return [c for c in cfg.collections.values() if c.watch and not gate.blocks("path", c.name)]

    def index_watched(self, name: str, scope: Scope | None, pace: Pace) -> Summary | None:
        """The watcher's pass over one collection (the paths in `scope`, or all of it), at
        `pace`: walked first, then indexed under the update lock, so it never races `qmd
        update` or the collection's removal, yet a slow walk of a large tree does not hold
        them up; with the config as it is then (None when the collection is gone or no
        longer watched, or moved while walked). Never runs the collection's update command:
        a saved file must not run a shell command."""
        walked = self._watched(name)
        if walked is None:
            return None
        walk = walk_collection(walked, scope, pace)
        with self._update:
            cfg = self.config
            coll = self._watched(name, cfg)
            if coll is None or coll != walked:
                return None
            self._mirror(cfg)
            with self.store.exclusive(f"update:{name}"):
                summary = index_collection(self.store, coll, scope=scope, pace=pace, walk=walk)
            self.changes.record(name, summary, watcher=True)
            return summary

    def _watched(self, name: str, cfg: Config | None = None) -> Collection | None:
        """The collection the watcher may index now, or None (gone, unwatched, gated)."""
        cfg = cfg or self.config
        coll = cfg.collections.get(name)
        if coll is None or not coll.watch or self.gate(cfg).blocks("path", name):
            return None
        return coll

    def background_embedder(self) -> tuple[Embedder | None, str]:
        return self.models.background_embedder(self.usable_config())

    def embed_watched(self, collections: list[str], cancel: threading.Event) -> EmbedReport | None:
        """Embed what the watcher changed, in the worker's background lane (a query's calls go
        first), in slices that stop at a batch boundary when a user's `qmd embed` wants the embed
        lock and go on after it (`_user_turn`); the last slice's report, or None when no local
        embed model is ready or `cancel` stopped it between slices."""
        emb, _ = self.background_embedder()
        if emb is None:
            return None
        names = [n for n in collections if n in self.config.collections]
        if not names:
            return None
        while True:
            with self._embed_turns:
                while self._users_embedding and not cancel.is_set():
                    self._embed_turns.wait(0.5)  # `cancel` (the daemon stopping) is not notified here
            if cancel.is_set():
                return None
            holder = f"the background embed of {', '.join(repr(n) for n in names)}"
            with (
                self._holding(holder, blocking=True),
                background_lane(),
                self.embeds.run("background", emb.uri, names, None) as seen,
            ):
                report = embed_pending(
                    self.store,
                    emb,
                    collections=names,
                    strategies=self.chunk_strategies(names),
                    max_docs_per_batch=BACKGROUND_SLICE_DOCS,
                    progress=seen,
                    cancel=either(cancel, self._yield_background),
                )
            if not report.cancelled or cancel.is_set():
                break
        if report.pending_before:  # a sweep that found nothing to embed leaves the last report be
            self.embeds.finished("background", report)
        return report

    @contextlib.contextmanager
    def _holding(self, what: str, *, blocking: bool) -> Iterator[bool]:
        """The embed lock, held as `what` (said to a user's embed that waits for it); False
        without it when not `blocking` and it is taken."""
        if not self._embed.acquire(blocking=blocking):
            yield False
            return
        self._embed_holder = what
        try:
            yield True
        finally:
            self._embed_holder = ""
            self._embed.release()

    @contextlib.contextmanager
    def _user_turn(self, progress: Progress | None, what: str) -> Iterator[None]:
        """Hold the embed lock for a user's embed, ahead of background ones: the one running stops
        at its next slice boundary and the others wait until this is done; a wait is announced."""
        with self._embed_turns:
            self._users_embedding += 1
            self._yield_background.set()
        try:
            with contextlib.ExitStack() as stack:
                if not stack.enter_context(self._holding(what, blocking=False)):
                    holder = self._embed_holder or "a cleanup or copy of the index"
                    until = "to reach a slice boundary" if holder.startswith("the background") else "to finish"
                    if progress is not None:
                        progress({"event": "notice", "message": f"waiting for {holder} {until}"})
                    stack.enter_context(self._holding(what, blocking=True))
                yield
        finally:
            with self._embed_turns:
                self._users_embedding -= 1
                if not self._users_embedding:
                    self._yield_background.clear()
                    self._embed_turns.notify_all()

    def embed_in_background(self, name: str) -> BackgroundStart:
        """Start embedding a collection just added, as the watcher would at its first sweep a
        few seconds later, so `qmd collection add` can say what it started, and `qmd embed
        --follow` right after it has something to follow. Only where the watcher embeds by
        itself: a daemon's, watching this collection, with a local model ready."""
        coll = self.config.get(name)
        emb, why = self.background_embedder()
        settings = self.watcher.settings if self.watcher is not None else None
        if settings is None or not settings.enabled or not settings.embed or not coll.watch:
            return BackgroundStart(False, 0, None, "the daemon does not embed this collection by itself")
        if emb is None or self.gate().blocks("path", name):
            return BackgroundStart(False, 0, None, why or "untrusted project config")
        pending = self.vector_state([name]).pending
        if not pending:
            return BackgroundStart(False, 0, emb.uri, "nothing to embed")
        thread = threading.Thread(target=self._embed_added, args=(name,), name=f"qmd-embed-{name}", daemon=True)
        self._background = [t for t in self._background if t.is_alive()] + [thread]
        thread.start()
        return BackgroundStart(True, pending, emb.uri, "")

    def _embed_added(self, name: str) -> None:
        try:
            self.embed_watched([name], self._closing)
        except Exception:  # vectors stay pending; `qmd embed` or the watcher's next pass retries
            log.exception("embedding %s in the background failed", name)

    def _with_watch(self, info: CollectionInfo, embedding: str) -> CollectionInfo:
        coll = self.config.collections.get(info.name)
        if coll is None:  # removed since it was described
            return info
        pending = self.vector_state([coll.name]).pending
        untrusted = self.gate().blocks("path", coll.name)
        return replace(info, watch=status.watch_of(coll, pending, embedding, untrusted=untrusted, watcher=self.watcher))

    # -- search and retrieval -----------------------------------------------

    def search(self, query: str, opts: SearchOptions = SearchOptions()) -> SearchOutcome:
        """Keyword (BM25) search: pointers, best first."""
        with self.worker.searching():
            return search(self.store, self.config, query, opts, self.index_label)

    def query(self, doc: QueryDoc, opts: QueryOptions) -> HybridOutcome:
        """The hybrid query: typed routing, expansion, RRF, rerank, within `opts.budget_ms`."""
        with self.worker.searching():  # from the first step: sizing the legs reads the index too
            return self._query(doc, opts)

    def _query(self, doc: QueryDoc, opts: QueryOptions) -> HybridOutcome:
        cfg = self.config
        searchable(cfg, opts.collections)  # no or an unknown collection is the caller's error, before any model loads
        check_chunk_strategy(opts.chunk_strategy)
        if opts.budget_ms is None and cfg.query_budget_ms is not None:  # index.yml's default; a request's own wins
            opts = replace(opts, budget_ms=cfg.query_budget_ms)
        # Only the models this query can use are resolved (a local model's file is checked on each resolve).
        unused: tuple[None, str] = (None, "")
        stages = Legs(
            *self._vector_leg(opts.collections),
            *(self.expander(cfg) if doc.mode == "expand" else unused),
            *(self.reranker(cfg) if opts.rerank is not False else unused),
            backlog=self.worker.backlog,
        )
        out = HybridQuery(
            self.store, cfg, stages, self.costs, index_name=self.index_label, passage_chars=self.rerank_passage_chars
        ).run(doc, opts)
        out.warnings += self._model_notes(cfg)
        return out

    def _model_notes(self, cfg: Config) -> list[str]:
        """Which of a project's own models a search did not use (the defaults answered)."""
        return [i.skipped() for i in self.gate(cfg).skipped if i.kind == "model"]

    def _vector_leg(self, collections: list[str] | None) -> tuple[VectorLeg | None, str]:
        state = self.vector_state(collections)
        if not state.available:
            return None, state.message
        emb, why = self._embedder_or_why()
        if emb is None:
            return None, f"vector search unavailable — {why}"
        spaces = legs.spaces(self.store, emb, self.chunk_strategies(collections))
        if not spaces:
            return None, state.message
        return legs.vector_leg(self.store, emb, spaces, self.scales, state.message if state.pending else None), ""

    def load_vector_index(self) -> None:
        """Start building the in-memory vector index of the partitions searches read, in the
        background, at the daemon's start rather than on its first vector search: at 1M
        chunks a build takes ~10 s, during which vector searches take the exact scan and say
        so. Keyword search does not wait for it; no model is loaded."""

        def run() -> None:
            try:
                self._vector_leg(None)  # sizing the leg starts the builds (`vectors.loading`)
            except Exception:  # noqa: BLE001 - the first search builds it instead; logged
                log.exception("could not start loading the vector index")

        threading.Thread(target=run, name="qmd-vector-index-load", daemon=True).start()

    def expander(self, cfg: Config) -> tuple[Expander | None, str]:
        """The query expander, or why there is none (announced as a skipped stage)."""
        try:
            model = self.models.generator(self.usable_config(cfg))
            if model not in self._expanders:
                self._expanders[model] = legs.expander(model, self.worker, self.store)
            return self._expanders[model], ""
        except QmdError as e:
            return None, f"query expansion unavailable — {e.message}"

    def reranker(self, cfg: Config) -> tuple[Reranker | CosineScorer | None, str]:
        """The reranker, or why there is none (a skipped stage; bench's `full` backend)."""
        try:
            model = self.models.reranker(self.usable_config(cfg))
            if model not in self._rerankers:
                self._rerankers[model] = legs.reranker(model, self.worker)
            return self._rerankers[model], ""
        except QmdError as e:
            return None, f"reranking unavailable — {e.message}"

    # -- metadata -----------------------------------------------------------

    def scope(self, collections: list[str] | None) -> list[str]:
        """The collections a request covers: those named (each must exist), else the default ones."""
        return resolve_scope(self.config, collections)

    def metadata(self, opts: MetadataOptions) -> MetadataReport:
        """Discovery: the keys, types and values filters can be written from, in one snapshot."""
        with self.store.read() as conn:
            return discover(conn, opts)

    def collection_keys(self, names: list[str], n: int = 5, *, values: int = 0) -> dict[str, CollectionKeys]:
        """Each collection's most covered keys, for status and listings (a discovery each)."""
        with self.store.read() as conn:
            return {ck.collection: ck for ck in top_keys(conn, names, n, values=values)}

    # -- vectors ------------------------------------------------------------

    def embedder(self, *, download: bool = False, progress: Progress | None = None) -> Embedder:
        return self.models.embedder(self.usable_config(), download=download, progress=progress)

    def chunk_strategies(self, collections: list[str] | None = None) -> dict[str, ChunkStrategy]:
        return self.config.chunk_strategies(collections)

    def _embedder_or_why(self) -> tuple[Embedder | None, str]:
        """The embedder, or None and why not: what status, coverage and a query report
        instead of failing (keyword search still answers)."""
        if self.store.vector_missing is not None:  # no model can help (Postgres without pgvector)
            return None, self.store.vector_missing
        try:
            return self.embedder(), ""
        except EmbedderUnavailable as e:
            return None, e.message

    def vector_state(self, collections: list[str] | None = None) -> VectorState:
        """Can vector search run, and over how much of the corpus? Never loads a model."""
        emb, reason = self._embedder_or_why()
        return self._vector_states.get(emb, reason, collections, self.chunk_strategies(collections))

    def _vector_or_raise(self, query: str, opts: SearchOptions) -> SearchOutcome:
        state = self.vector_state(opts.collections)
        if not state.available:
            raise VectorUnavailable(state.message)
        strategies = self.chunk_strategies()
        out = legs.vector_answer(self.store, self.config, self.embedder(), strategies, query, opts, self.index_label)
        if state.pending:
            out.warnings.append(state.message)
        return out

    def vsearch(self, query: str, opts: SearchOptions = SearchOptions()) -> SearchOutcome:
        """Vector search; when it cannot run, keyword results with the reason (never silence)."""
        searchable(self.config, opts.collections)  # before "vector search unavailable" for an empty index
        with self.worker.searching():
            try:
                out = self._vector_or_raise(query, opts)
            except VectorUnavailable as e:
                out = self.search(query, replace(opts, min_score=0.0))
                out.warnings.insert(0, f"{e.message}; showing keyword results instead")
                out.degraded = True
        out.warnings += self._model_notes(self.config)
        return out

    def embed(
        self,
        *,
        collections: list[str] | None = None,
        force: bool = False,
        max_docs_per_batch: int = 64,
        max_batch_bytes: int = 4 * 1024 * 1024,
        chunk_strategy: ChunkStrategy | None = None,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> EmbedReport:
        """Embed what is pending. `chunk_strategy` first makes it the strategy of the
        collections embedded (all when none are named), saved in index.yml like any
        collection setting: their vectors then live in that strategy's space, which later
        embeds and searches keep using (a one-off would be undone by the next plain embed)."""
        for name in collections or []:
            self.config.get(name)
        if max_docs_per_batch < 1 or max_batch_bytes < 1:
            raise InvalidInput("--max-docs-per-batch and --max-batch-mb must be positive")
        check_chunk_strategy(chunk_strategy)
        if self.store.vector_missing is not None:
            raise Unavailable(f"cannot embed: {self.store.vector_missing}")
        scope = ", ".join(repr(n) for n in collections) if collections else "every collection"
        with self._user_turn(progress, f"another 'qmd embed' (of {scope})"):
            emb = self.embedder(download=True, progress=progress)
            switched: list[str] = []
            if chunk_strategy:  # saved like any collection setting, before the vectors it places
                with self._mutate:
                    cfg, switched = self.config.with_chunk_strategy(collections, chunk_strategy)
                    if switched:
                        self._save(cfg)
            with (
                self.store.exclusive("embed"),
                background_lane(),  # a query's calls go before the next batch
                self.embeds.run("embed", emb.uri, collections, progress) as seen,
            ):
                report = embed_pending(
                    self.store,
                    emb,
                    collections=collections,
                    strategies=self.chunk_strategies(collections),
                    force=force,
                    max_docs_per_batch=max_docs_per_batch,
                    max_batch_bytes=max_batch_bytes,
                    progress=seen,
                    cancel=cancel,
                )
            report.switched = switched
            self.embeds.finished("embed", report)
            return report

    # -- reading back -------------------------------------------------------

    def get(
        self,
        name: str,
        *,
        from_line: int | None = None,
        max_lines: int | None = None,
        cwd: str | None = None,
        full: bool = False,
    ) -> DocumentText:
        return reading.get(
            self.store, self.config, name, self.paths.name, self.index_label, from_line, max_lines, cwd, full=full
        )

    def multi_get(
        self, pattern: str, *, max_bytes: int = 65536, max_lines: int | None = None, cwd: str | None = None
    ) -> list[Retrieved]:
        return reading.multi_get(self.store, self.config, pattern, self.index_label, max_bytes, max_lines, cwd)

    def ls(self, target: str) -> reading.Listing:
        return reading.ls(self.store, self.config, target, self.index_label)

    # -- upkeep -------------------------------------------------------------

    def _configured(self, cache_days: int = upkeep.CACHE_MAX_AGE_DAYS) -> upkeep.Configured:
        """What the config uses now: the yardstick of orphans."""
        cfg = self.config
        trusted = not self.gate(cfg).blocks("model", "embed")
        return upkeep.configured(self.usable_config(cfg), self.models, embed_trusted=trusted, cache_days=cache_days)

    def orphans(self) -> upkeep.Orphans:
        """What the index holds that nothing needs (doctor shows it; `cleanup` drops it)."""
        with self.store.read() as conn:
            return upkeep.survey(conn, self._configured())

    def copy_index(
        self,
        source: str,
        destination: str,
        *,
        replace: bool = False,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> index_copy.CopyReport:
        """`qmd index copy`: the index at `source` into `destination`. Updates and embeds of
        this index wait meanwhile, so a copy of it is of one moment."""
        src, dst = upkeep.copy_ends(self.store.location, source, destination)
        with self._update, self._embed:
            return upkeep.copy(self.store, src, dst, replace=replace, progress=progress, cancel=cancel)

    def cleanup(
        self,
        *,
        dry_run: bool = False,
        vacuum: bool | None = None,
        cache_days: int = upkeep.CACHE_MAX_AGE_DAYS,
        wait_s: float = 30.0,
        progress: Progress | None = None,
    ) -> upkeep.CleanupReport:
        """`qmd cleanup`, with updates and embeds kept out while it runs (`upkeep.quiet`)."""
        if cache_days < 0:
            raise InvalidInput(f"--cache-days must be 0 or more (got {cache_days})")
        with upkeep.quiet(self._update, self._embed, wait_s):
            step = (lambda name: progress({"event": "step", "step": name})) if progress else None
            return upkeep.cleanup(self.store, self._configured(cache_days), dry_run=dry_run, vacuum=vacuum, step=step)

    def coverage(self, name: str | None = None) -> list[upkeep.Coverage]:
        """Each collection (or the one named): its folder walked now against the index."""
        cfg = self.config
        colls = [cfg.get(name)] if name is not None else list(cfg.collections.values())
        emb, note = self._embedder_or_why()
        spaces = legs.spaces(self.store, emb, self.chunk_strategies([c.name for c in colls])) if emb else {}
        return [upkeep.coverage(self.store, c, spaces.get(c.name), note) for c in colls]

    # -- models -------------------------------------------------------------

    def pull(self, *, refresh: bool = False, progress: Progress | None = None) -> list[Pulled]:
        return self.models.pull(self.usable_config(), refresh=refresh, progress=progress)

    def doctor(self) -> status.Doctor:
        """Everything worth knowing when something is off; loads no model."""
        models = self.models.check(self.usable_config(), lambda m: legs.reranker(m, self.worker).method)
        return status.doctor(
            self.store,
            self.paths,
            inference=self.worker.status(),
            models=models,
            vector=self.vector_state(),
            orphans=self.orphans(),
        )

    # -- bench ----------------------------------------------------------------

    def bench(
        self, spec: quality.BenchSpec, progress: Progress | None = None, cancel: threading.Event | None = None
    ) -> quality.BenchReport:
        return quality.bench(self, spec, progress, cancel)

    # -- status -------------------------------------------------------------

    def status(self) -> IndexStatus:
        embedding = self.background_embedder()[1]
        collections = [self._with_watch(c, embedding) for c in self.describe_collections()]
        return status.index_status(
            self.store,
            self.paths,
            self.config,
            collections=collections,
            vector=self.vector_state(),
            inference=self.worker.status(),
            warnings=self.gate().notes(),
            embedding=self.embeds.running(),
        )


def _held(gate: trust.Gate, kind: trust.Kind, name: str) -> str | None:
    """Why the gate keeps a collection's `kind` item out, as the answer says it; None when it does not."""
    if not gate.blocks(kind, name):
        return None
    return next(i.skipped() for i in gate.items if i.kind == kind and i.name == name)
