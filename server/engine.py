"""The engine: one index, its config and every operation on them.

Knows nothing of HTTP. Routes (and tests, and a future library API) call these
methods; they return plain data and raise `errors.QmdError` subclasses for anything
the caller should fix.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Literal

from qmd.paths import DEFAULT_INDEX, IndexPaths
from qmd.server import quality, trust
from qmd.server.config import (
    DEFAULT_PATTERN,
    Collection,
    Config,
    ConfigFile,
    ConfigSource,
    check_index_url,
    describe_url,
    expand_path,
    is_index_url,
    normalize_context_key,
    schema_url,
    validate_collection_name,
)
from qmd.server.errors import Conflict, Forbidden, InvalidInput, NotFound, QmdError
from qmd.server.ingest import upkeep
from qmd.server.ingest.embed_job import EmbedReport, embed_pending, strategy_groups
from qmd.server.ingest.indexer import Progress, Scope, Summary, index_collection, run_hook, split_mask
from qmd.server.ingest.watcher import Watcher, off
from qmd.server.models.embedders import Embedder, Embedders, EmbedderUnavailable, LocalBackend, embed_query
from qmd.server.models.refs import (
    COSINE,
    CosineRef,
    FileRef,
    HfRef,
    RemoteRef,
    cache_path,
    ensure_local,
    fetch,
    local_model,
    resolve_model,
    resolve_models,
)
from qmd.server.models.worker import ModelSpec, WorkerClient, background_lane, env_number
from qmd.server.quality import BenchSpec
from qmd.server.search.discovery import CollectionKeys, MetadataOptions, MetadataReport, discover, top_keys
from qmd.server.search.expansion import Expander, remote_expander, worker_generate
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
from qmd.server.search.pointers import (
    DocumentText,
    Pointer,
    Retrieved,
    SearchOptions,
    SearchOutcome,
    answer_bytes,
    document_ref,
    file_uri,
)
from qmd.server.search.querydoc import QueryDoc, parse_query
from qmd.server.search.rerank import CosineScorer, Reranker, make_reranker, remote_reranker
from qmd.server.search.scope import resolve_scope
from qmd.server.search.vector import VectorUnavailable, nearest_chunks, vector_hits, vector_search
from qmd.server.status import CollectionInfo, IndexStatus, VectorState
from qmd.server.store import catalog, metadata, vectors
from qmd.server.store import copy as index_copy
from qmd.server.store.db import IndexStore
from qmd.server.store.documents import (
    find_document,
    glob_documents,
    is_comma_list,
    link_index,
    parse_virtual,
    safe_relpath,
    split_range,
)
from qmd.server.store.sqlite import open_store
from qmd.server.text.chunking import CHUNK_STRATEGIES, ChunkStrategy
from qmd.server.text.code_chunks import grammar_status
from qmd.server.text.pages import Pages, split_page
from qmd.version import __version__


def _server_of(index: str, configured: str | None) -> str | None:
    """The Postgres URL of the named index (not a project's): `QMD_INDEX_URL`, else its
    config's `index_url`, in the index's own schema of that database (`schema_url`)."""
    url = os.environ.get("QMD_INDEX_URL")
    url = check_index_url(url, "QMD_INDEX_URL") if url else configured
    return schema_url(url, index) if url else None


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
        self.store = store or open_store(paths.db, self._index_url())
        """The index (the caller's, or the one `QMD_INDEX_URL` / `index_url` / the file names)."""
        self.worker = worker or WorkerClient()
        self._owns_worker = worker is None
        """A daemon's other indexes share its default index's worker; the owner closes it."""
        self.embedders = Embedders(self.worker)
        self.started = time.time()
        self._mutate = threading.RLock()
        self._update = threading.Lock()
        self._embed = threading.Lock()
        self._vector_states: dict[tuple[object, ...], VectorState] = {}
        self.costs = CostModel()
        self.rerank_passage_chars = int(env_number("QMD_RERANK_PASSAGE_CHARS", RERANK_PASSAGE_CHARS, int))
        """Characters of each candidate's passage a reranker scores; its cost is about linear in them."""
        self._expanders: dict[str, Expander] = {}
        self._rerankers: dict[str, Reranker] = {}
        self._synced: Config | None = None
        self.watcher: Watcher | None = None
        """The daemon's (`qmdd` sets it); a library engine watches nothing."""
        self.trust = trust.TrustFile()
        """The user's approvals of project configs (`index.trust`), read on each use."""
        self._mirror(self.config)  # validates the YAML and records it in the index at start

    def _index_url(self) -> str | None:
        """The Postgres server of this index, if it has one: `QMD_INDEX_URL`, else the
        config's `index_url`. A project's index (`qmd init`) stays in its `.qmd/` folder:
        QMD_INDEX_URL is not for it, and its own config may not name a server, so a cloned
        repository never makes the daemon connect to a server its user did not choose."""
        project = self.paths.project_root is not None
        url = self.config_file.load().index_url
        if url is not None and project:
            raise Forbidden(
                f"{self.paths.config} names a Postgres server (index_url), and a project's config may not:"
                " set index_url in your own config (~/.config/qmd/<index>.yml) or QMD_INDEX_URL"
            )
        return None if project else _server_of(self.paths.name, url)

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

    def _usable_models(self, cfg: Config) -> dict[str, str]:
        """The config's `models:` that may be used; an untrusted project's own choice falls
        back to the default, which is all that is ever loaded or downloaded for it."""
        return self.gate(cfg).models(cfg.models)

    @property
    def index_label(self) -> str | None:
        """The index name shown in `qmd://…?index=NAME` links (None for the default)."""
        return None if self.paths.name == DEFAULT_INDEX else self.paths.name

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self._owns_worker:
            self.worker.close()
        self.store.close()

    # -- collections --------------------------------------------------------

    def create_collection(self, path: str, name: str | None = None, pattern: str | None = None) -> Collection:
        """Validate and record a new collection; indexing it is a separate `update`."""
        root = expand_path(path)
        if not root.exists():
            raise InvalidInput(f"Folder not found: {root}")
        if not root.is_dir():
            raise InvalidInput(f"Not a folder: {root}")
        root = Path(os.path.realpath(root))
        name = validate_collection_name(name or root.name or "root")
        pattern = (pattern or DEFAULT_PATTERN).strip()
        if not split_mask(pattern):
            raise InvalidInput(f"empty mask {pattern!r}: give a glob such as '**/*.md'")
        with self._mutate:
            cfg = self.config
            if name in cfg.collections:
                raise Conflict(f"Collection '{name}' already exists. Pick another --name, or remove it first.")
            for other in cfg.collections.values():
                if os.path.realpath(other.root) == str(root) and other.pattern == pattern:
                    raise Conflict(f"Folder {root} is already collection '{other.name}' with mask '{pattern}'.")
            coll = Collection(name=name, path=self._stored_path(root), pattern=pattern, base=self.paths.project_root)
            self._save(cfg.with_collection(coll))
        self._watch_changed()
        return coll

    def _stored_path(self, root: Path) -> str:
        """A folder as index.yml records it: relative to a project's folder when inside it
        (the checked-in config then works wherever the project is cloned), else absolute."""
        project = self.paths.project_root
        if project is not None and (root == project or project in root.parents):
            return root.relative_to(project).as_posix() or "."
        return str(root)

    def remove_collection(self, name: str) -> int:
        with self._mutate, self._update:
            self.config.get(name)
            deleted = self.store.write(lambda conn: catalog.delete_collection(conn, name))
            self._save(self.config.without_collection(name))
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
        cfg = self.config
        with self.store.read() as conn:
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

    # -- contexts -----------------------------------------------------------

    def _context_target(self, target: str, cwd: str | None) -> tuple[str | None, str]:
        """(collection or None for global, key)."""
        t = target.strip()
        if t == "/":
            return None, ""
        cfg = self.config
        virtual = parse_virtual(t)
        if virtual:
            cfg.get(virtual[0])
            return virtual[0], normalize_context_key(safe_relpath(virtual[1]))
        p = expand_path(t, Path(cwd) if cwd else None)
        real = os.path.realpath(p)
        best: tuple[int, str, str] | None = None
        for c in cfg.collections.values():
            root = os.path.realpath(c.root)
            if real == root or real.startswith(root + os.sep):
                rel = os.path.relpath(real, root).replace(os.sep, "/")
                cand = (len(root), c.name, "" if rel == "." else rel)
                best = max(best, cand) if best else cand
        if not best:
            raise NotFound(f"Path is not in any indexed collection: {p}")
        return best[1], best[2]

    def add_context(self, target: str, text: str, cwd: str | None) -> dict:
        text = text.strip()
        if not text:
            raise InvalidInput("context text is empty")
        with self._mutate:
            coll_name, key = self._context_target(target, cwd)
            cfg = self.config
            if coll_name is None:
                cfg = replace(cfg, global_context=text)
            else:
                coll = cfg.get(coll_name)
                cfg = cfg.with_collection(replace(coll, context={**coll.context, key: text}))
            self._save(cfg)
        return {"collection": coll_name, "path": key, "text": text}

    def remove_context(self, target: str, cwd: str | None) -> dict:
        with self._mutate:
            coll_name, key = self._context_target(target, cwd)
            cfg = self.config
            if coll_name is None:
                if not cfg.global_context:
                    raise NotFound(f"No context found for: {target}")
                cfg = replace(cfg, global_context=None)
            else:
                coll = cfg.get(coll_name)
                if key not in coll.context:
                    raise NotFound(f"No context found for: {target}")
                cfg = cfg.with_collection(replace(coll, context={k: v for k, v in coll.context.items() if k != key}))
            self._save(cfg)
        return {"collection": coll_name, "path": key}

    def list_contexts(self) -> list[dict]:
        cfg = self.config
        out = [{"collection": None, "path": "", "text": cfg.global_context}] if cfg.global_context else []
        for c in cfg.collections.values():
            out.extend({"collection": c.name, "path": k, "text": v} for k, v in sorted(c.context.items()))
        return out

    # -- indexing -----------------------------------------------------------

    def update(self, collections: list[str] | None = None, progress: Progress | None = None) -> list[Summary]:
        """Run each collection's hook, then re-index it. A failing hook aborts the run.

        The config is read under the update lock, which removing or renaming a
        collection also takes: an update queued behind one sees the collection gone,
        instead of re-indexing it from the config it read while waiting."""
        out: list[Summary] = []
        with self._update:
            cfg = self.config
            self._mirror(cfg)
            gate = self.gate(cfg)
            names = collections or list(cfg.collections)
            colls = [cfg.get(n) for n in names]
            for i, coll in enumerate(colls, 1):
                if gate.blocks("path", coll.name):
                    if progress:
                        progress({"event": "gated", "collection": coll.name, "note": _note(gate, "path", coll)})
                    continue
                if progress:
                    progress(
                        {
                            "event": "collection",
                            "index": i,
                            "count": len(colls),
                            "name": coll.name,
                            "pattern": coll.pattern,
                            "path": str(coll.root),
                        }
                    )
                gated = coll.update is not None and gate.blocks("update", coll.name)
                if coll.update and not gated:
                    if progress:
                        progress({"event": "hook", "collection": coll.name, "command": coll.update})
                    output = run_hook(coll)
                    if progress:
                        progress({"event": "hook_done", "collection": coll.name, "output": output})
                with self.store.exclusive(f"update:{coll.name}"):
                    summary = index_collection(self.store, coll, progress)
                if gated:
                    summary.warnings.insert(0, _note(gate, "update", coll))
                out.append(summary)
                if progress:
                    progress({"event": "summary", **summary_dict(summary)})
        return out

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

    def index_watched(self, name: str, scope: Scope | None) -> Summary | None:
        """The watcher's pass over one collection (the paths in `scope`, or all of it): under
        the update lock, so it never races `qmd update` or the collection's removal, with the
        config as it is then (None when the collection is gone or no longer watched). Never
        runs the collection's update command: a saved file must not run a shell command."""
        with self._update:
            cfg = self.config
            coll = cfg.collections.get(name)
            if coll is None or not coll.watch or self.gate(cfg).blocks("path", name):
                return None
            self._mirror(cfg)
            with self.store.exclusive(f"update:{name}"):
                return index_collection(self.store, coll, scope=scope)

    def background_embedder(self) -> tuple[Embedder | None, str]:
        """The embedder the watcher may use for what it indexed, or why there is none: only a
        model already on this machine (never a download, never a remote endpoint's bill)."""
        try:
            emb = self.embedder()
        except EmbedderUnavailable as e:
            return None, f"off: {e.message}"
        if not isinstance(emb.backend, LocalBackend):
            return None, f"off: {emb.uri} is a remote endpoint (run 'qmd embed')"
        return emb, "automatic"

    def embed_watched(self, collections: list[str], cancel: threading.Event) -> EmbedReport | None:
        """Embed what the watcher changed, in the worker's background lane (a query's calls go
        first); None when no local embed model is ready."""
        emb, _ = self.background_embedder()
        if emb is None:
            return None
        names = [n for n in collections if n in self.config.collections]
        if not names:
            return None
        with self._embed, background_lane():
            return embed_pending(
                self.store, emb, collections=names, strategies=self.chunk_strategies(names), cancel=cancel
            )

    def _with_watch(self, info: CollectionInfo, embedding: str) -> CollectionInfo:
        coll = self.config.collections.get(info.name)
        if coll is None:  # removed since it was described
            return info
        pending = self.vector_state([coll.name]).pending
        if self.gate().blocks("path", coll.name):
            watch = off("outside the project: untrusted project config (run 'qmd trust')", pending, embedding)
        elif self.watcher is None:
            watch = off("only the daemon (qmdd) watches folders", pending, embedding)
        else:
            watch = self.watcher.info(coll, pending, embedding)
        return replace(info, watch=watch)

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
        resolve_scope(cfg, opts.collections)  # an unknown collection is the caller's error, before any model loads
        check_strategy(opts.chunk_strategy)
        if opts.budget_ms is None and cfg.query_budget_ms is not None:  # index.yml's default; a request's own wins
            opts = replace(opts, budget_ms=cfg.query_budget_ms)
        # Only the models this query can use are resolved (a local model's file is checked on each resolve).
        unused: tuple[None, str] = (None, "")
        legs = Legs(
            *self._vector_leg(opts.collections),
            *(self._expander(cfg) if doc.mode == "expand" else unused),
            *(self._reranker(cfg) if opts.rerank is not False else unused),
            backlog=self.worker.backlog,
        )
        out = HybridQuery(
            self.store, cfg, legs, self.costs, index_name=self.index_label, passage_chars=self.rerank_passage_chars
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
        try:
            emb = self.embedder()
        except EmbedderUnavailable as e:
            return None, f"vector search unavailable — {e.message}"
        spaces = self._spaces(emb, collections)
        if not spaces:
            return None, state.message

        def embed(texts: list[str]) -> list[list[float]]:
            try:
                return [list(v) for v in emb.backend.embed(texts, "query")]
            except QmdError as e:
                raise VectorUnavailable(
                    f"vector search unavailable — the query could not be embedded: {e.message}"
                ) from e

        return (
            VectorLeg(
                embed=embed,
                search=lambda qvec, k, scope: vector_hits(self.store, spaces, qvec, scope, k),
                nearest=lambda qvec, docs: nearest_chunks(self.store, spaces, qvec, docs),
                model=emb.uri,
                warning=state.message if state.pending else None,
            ),
            "",
        )

    def _expander(self, cfg: Config) -> tuple[Expander | None, str]:
        """The query expander, or why there is none (announced as a skipped stage). An endpoint's
        needs no local worker: llama.cpp need not even be installed."""
        try:
            models = self._usable_models(cfg)
            ref = resolve_model("generate", models, config_dir=self.paths.config.parent).ref
            if isinstance(ref, RemoteRef):
                if ref.uri not in self._expanders:
                    self._expanders[ref.uri] = remote_expander(ref, self.store)
                return self._expanders[ref.uri], ""
            self.worker.require_models()
            uri, path = local_model("generate", models, self.paths.config.parent)
            key = f"{uri}|{path}"
            if key not in self._expanders:
                spec = ModelSpec(role="generate", path=str(path))
                info = self.worker.model_info(spec)
                self._expanders[key] = Expander(
                    worker_generate(self.worker, spec), uri, info["name"], info["chat_template"], self.store
                )
            return self._expanders[key], ""
        except QmdError as e:
            return None, f"query expansion unavailable — {e.message}"

    def _reranker(self, cfg: Config) -> tuple[Reranker | CosineScorer | None, str]:
        """The reranker, or why there is none; an endpoint's needs no local worker (remote rerank)."""
        try:
            models = self._usable_models(cfg)
            ref = resolve_model("rerank", models, config_dir=self.paths.config.parent).ref
            if isinstance(ref, CosineRef):
                return CosineScorer(), ""
            if isinstance(ref, RemoteRef):
                if ref.uri not in self._rerankers:
                    self._rerankers[ref.uri] = remote_reranker(ref)
                return self._rerankers[ref.uri], ""
            self.worker.require_models()
            uri, path = local_model("rerank", models, self.paths.config.parent)
            key = f"{uri}|{path}"
            if key not in self._rerankers:
                self._rerankers[key] = make_reranker(self.worker, str(path), uri)
            return self._rerankers[key], ""
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
        cfg = self.config
        usable = replace(cfg, models=self._usable_models(cfg))
        return self.embedders.get(usable, self.paths.config.parent, download=download, progress=progress)

    def chunk_strategies(self, collections: list[str] | None = None) -> dict[str, ChunkStrategy]:
        """Each collection named (all when None) → how its documents are cut for vectors."""
        cfg = self.config
        names = collections if collections is not None else list(cfg.collections)
        return {n: cfg.collections[n].chunk_strategy for n in names if n in cfg.collections}

    def _spaces(self, emb: Embedder, collections: list[str] | None) -> dict[str, vectors.Space]:
        """Each collection (all when None) whose strategy's space exists → that space: a
        collection is searched only in the space of the strategy it is cut by now."""
        strategies = self.chunk_strategies(collections)
        with self.store.read() as conn:
            found = {s: vectors.find_space(conn, emb.fingerprint_for(s)) for s in set(strategies.values())}
        return {n: space for n, s in strategies.items() if (space := found[s]) is not None}

    def vector_state(self, collections: list[str] | None = None) -> VectorState:
        """Can vector search run, and over how much of the corpus? Never loads a model.

        Counting pending documents scans the index (110 ms at 100k documents), so the
        answer is cached until the next write (or a collection's chunk strategy changes)."""
        try:
            emb = self.embedder()
        except EmbedderUnavailable as e:
            emb, reason = None, e.message
        strategies = self.chunk_strategies(collections)
        key = (
            tuple(collections) if collections else None,
            emb.fingerprint if emb else reason,
            self.store.generation,
            tuple(sorted(strategies.items())),
        )
        cached = self._vector_states.get(key)
        if cached is not None:
            return cached
        state = self._count_vectors(emb, reason if not emb else "", collections, strategies)
        if len(self._vector_states) > 64:
            self._vector_states.clear()
        self._vector_states[key] = state
        return state

    def _count_vectors(
        self,
        emb: Embedder | None,
        reason: str,
        collections: list[str] | None,
        strategies: dict[str, ChunkStrategy],
    ) -> VectorState:
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
        return VectorState(
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

    def _vector_or_raise(self, query: str, opts: SearchOptions) -> SearchOutcome:
        state = self.vector_state(opts.collections)
        if not state.available:
            raise VectorUnavailable(state.message)
        emb = self.embedder()
        try:
            qvec = embed_query(emb, query)
        except EmbedderUnavailable as e:
            raise VectorUnavailable(f"vector search unavailable — {e.message}") from e
        out = vector_search(self.store, self.config, self._spaces(emb, None), qvec, query, opts, self.index_label)
        if state.pending:
            out.warnings.append(state.message)
        return out

    def vsearch(self, query: str, opts: SearchOptions = SearchOptions()) -> SearchOutcome:
        """Vector search; when it cannot run, keyword results with the reason (never silence)."""
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
        check_strategy(chunk_strategy)
        with self._embed:
            emb = self.embedder(download=True, progress=progress)
            switched = self._set_chunk_strategy(collections, chunk_strategy) if chunk_strategy else []
            with self.store.exclusive("embed"), background_lane():  # a query's calls go before the next batch
                report = embed_pending(
                    self.store,
                    emb,
                    collections=collections,
                    strategies=self.chunk_strategies(collections),
                    force=force,
                    max_docs_per_batch=max_docs_per_batch,
                    max_batch_bytes=max_batch_bytes,
                    progress=progress,
                    cancel=cancel,
                )
            report.switched = switched
            return report

    def _set_chunk_strategy(self, collections: list[str] | None, strategy: ChunkStrategy) -> list[str]:
        """Make `strategy` the chunk strategy of these collections (all when None); returns
        those it changed."""
        with self._mutate:
            cfg = self.config
            changed = [
                c.name
                for c in cfg.collections.values()
                if (collections is None or c.name in collections) and c.chunk_strategy != strategy
            ]
            for name in changed:
                cfg = cfg.with_collection(replace(cfg.collections[name], chunk_strategy=strategy))
            if changed:
                self._save(cfg)
            return changed

    def get(
        self, name: str, *, from_line: int | None = None, max_lines: int | None = None, cwd: str | None = None
    ) -> DocumentText:
        """A document or a line range of it. `name` may end in `:from[:count]`;
        explicit `from_line` / `max_lines` win over that suffix. A paged document (PDF)
        may be addressed by page, `report.pdf#page=3:10:5`: lines counted within that
        page, read from the same body, so both spellings of a pointer read the same text."""
        linked = link_index(name)
        if linked is not None and linked != self.paths.name:  # never the same path in the wrong index
            raise InvalidInput(
                f"{name} is a link into index '{linked}', and this request is served by '{self.paths.name}': "
                "ask that index for it (qmd get follows such links itself)"
            )
        name, suffix_from, suffix_count = split_range(name)
        name, page = split_page(name)
        from_line = from_line if from_line is not None else suffix_from
        max_lines = max_lines if max_lines is not None else suffix_count
        if max_lines is not None and max_lines < 1:
            raise InvalidInput("-l/--lines must be at least 1")
        cfg = self.config
        with self.store.read() as conn:
            doc = find_document(conn, cfg, name, cwd)
        ref = document_ref(doc, cfg, self.index_label)
        lines = doc.body.split("\n")
        pages = Pages.of(doc.path, doc.body)
        first, last, where = 1, len(lines), f"{ref.display_path} has {len(lines)} lines"
        if page is not None:
            if pages is None:
                raise InvalidInput(f"{ref.display_path} has no pages: #page= addresses the pages of a PDF")
            if not 1 <= page <= pages.count:
                raise InvalidInput(f"{ref.display_path} has {pages.count} pages; page {page} does not exist")
            first, last = pages.bounds(page)
            where = f"page {page} of {ref.display_path} has {last - first + 1} lines"
        start = first - 1 + max(1, from_line or 1)
        if start > last:
            # An empty slice numbered from a line that does not exist would read as a real, blank line.
            raise InvalidInput(f"{where}; line {start - first + 1} is past the end")
        end = last if max_lines is None else min(last, start - 1 + max_lines)
        spans = pages.spans(start, end) if pages is not None else ()
        return DocumentText(ref, start, end, len(lines), "\n".join(lines[start - 1 : end]), spans)

    def multi_get(
        self, pattern: str, *, max_bytes: int = 65536, max_lines: int | None = None, cwd: str | None = None
    ) -> list[Retrieved]:
        """Documents by glob, comma-separated names or docids. A listed name that matches
        nothing is an entry with `error`; a document over `max_bytes` is `skipped`."""
        if max_bytes < 1:
            raise InvalidInput("--max-bytes must be at least 1")
        cfg = self.config
        items: list[Retrieved] = []
        with self.store.read() as conn:
            if is_comma_list(pattern) or (pattern.strip().startswith("#") and "," not in pattern):
                names = [n for n in (p.strip() for p in pattern.split(",")) if n]
                if not names:
                    raise InvalidInput(f"no file names in {pattern!r}: give a glob, names joined by commas, or docids")
                docs = []
                for name in names:
                    try:
                        docs.append(find_document(conn, cfg, name, cwd))
                    except QmdError as e:
                        items.append(Retrieved(name, None, skipped=True, reason=e.message))
            else:
                docs = glob_documents(conn, cfg, pattern)
                if not docs:
                    raise NotFound(f"No files matched pattern: {pattern}")
        cap, sent = answer_bytes(), 0
        for doc in docs:
            ref = document_ref(doc, cfg, self.index_label)
            size = len(doc.body.encode("utf-8"))
            if size > max_bytes:
                reason = f"File too large ({round(size / 1024)}KB > {round(max_bytes / 1024)}KB)"
                items.append(Retrieved(ref.file, ref, size, skipped=True, reason=reason))
                continue
            sent += size
            if sent > cap:
                reason = (
                    f"answer size cap reached ({cap // (1024 * 1024)} MiB, QMD_MAX_ANSWER_BYTES): "
                    "narrow the pattern, or read this one with get"
                )
                items.append(Retrieved(ref.file, ref, size, skipped=True, reason=reason))
                continue
            body = doc.body
            if max_lines is not None:
                lines = body.split("\n")
                if len(lines) > max_lines:
                    body = "\n".join(lines[:max_lines]) + f"\n\n[... truncated {len(lines) - max_lines} more lines]"
            items.append(Retrieved(ref.file, ref, size, body))
        return items

    def ls(self, target: str | None = None) -> dict:
        cfg = self.config
        if not target:
            return {"collections": [{"name": c.name, "files": c.files} for c in self.describe_collections()]}
        virtual = parse_virtual(target)
        if virtual:
            coll_name, prefix = virtual
        else:
            coll_name, _, prefix = target.strip().strip("/").partition("/")
        cfg.get(coll_name)
        prefix = safe_relpath(prefix) if prefix else ""
        with self.store.read() as conn:
            entries = catalog.list_files(conn, coll_name, prefix)
        return {
            "collection": coll_name,
            "prefix": prefix,
            "files": [
                {
                    "file": file_uri(coll_name, e.path, self.index_label),
                    "path": e.path,
                    "bytes": e.bytes,
                    "modified_at": e.modified_at,
                    "docid": e.hash[:6],
                }
                for e in entries
            ],
        }

    # -- upkeep -------------------------------------------------------------

    def _configured(self, cache_days: int = upkeep.CACHE_MAX_AGE_DAYS) -> upkeep.Configured:
        """What the config uses now: the yardstick of orphans. The embedder is resolved
        without loading or downloading anything, as status does; when it cannot be, its
        spaces are all kept (a model not downloaded yet must not cost its vectors)."""
        cfg = self.config
        try:
            if self.gate(cfg).blocks("model", "embed"):
                # Its vectors are kept for when it is approved again, not dropped for a lapse.
                raise EmbedderUnavailable("the project's embed model is not trusted now (run 'qmd trust')")
            emb = self.embedder()
            fingerprints: frozenset[str] | None = frozenset(emb.fingerprint_for(s) for s in CHUNK_STRATEGIES)
            unresolved = ""
        except EmbedderUnavailable as e:
            fingerprints, unresolved = None, f"vector spaces kept: {e.message}"
        try:
            models = self._models()
            cache_models: tuple[str, ...] | None = (models["generate"].ref.uri, models["rerank"].ref.uri)
        except QmdError:
            cache_models = None
        return upkeep.Configured(frozenset(cfg.collections), fingerprints, unresolved, cache_models, cache_days)

    def orphans(self) -> upkeep.Orphans:
        """What the index holds that nothing needs (doctor shows it; `cleanup` drops it)."""
        with self.store.read() as conn:
            return upkeep.survey(conn, self._configured())

    def _index_at(self, spec: str) -> str:
        """Where `spec` (an index name, a SQLite file, a ``postgresql://`` URL) keeps its index:
        the URL, or the file's absolute path. A name's config may give its server."""
        if "://" in spec:  # a Postgres URL, or a clear error (never a file named "mysql:")
            return check_index_url(spec, f"{spec!r}: an index given by URL")
        if "/" in spec or spec.endswith((".sqlite", ".db")):
            return str(Path(spec).expanduser().resolve())
        paths = IndexPaths.resolve(spec)
        url = _server_of(paths.name, ConfigFile(paths.config).load().index_url if paths.config.exists() else None)
        return url or str(paths.db)

    def copy_index(
        self,
        source: str,
        destination: str,
        *,
        replace: bool = False,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> index_copy.CopyReport:
        """`qmd index copy`: the index at `source` into `destination` (index_copy). Updates
        and embeds of this index wait meanwhile, so a copy of it is of one moment; the index
        this daemon serves is never a destination."""
        src, dst = self._index_at(source), self._index_at(destination)
        # compared as described (no password), so one server named with and without it is one index
        here = describe_url(self.store.location)
        if describe_url(src) == describe_url(dst):
            raise InvalidInput(f"the source and the destination are the same index ({describe_url(src)})")
        if describe_url(dst) == here:
            raise Conflict(
                f"{describe_url(dst)} is the index this daemon serves, so it cannot be copied into:"
                " copy into another, then point the config at it (index_url) and restart the daemon"
            )
        if not is_index_url(src) and not Path(src).exists():
            raise NotFound(f"there is no index at {src}")
        with self._update, self._embed:
            if describe_url(src) == here:
                return index_copy.copy_index(self.store, dst, replace=replace, progress=progress, cancel=cancel)
            store = open_store(Path(src), src if is_index_url(src) else None)
            try:
                return index_copy.copy_index(store, dst, replace=replace, progress=progress, cancel=cancel)
            finally:
                store.close()

    def cleanup(
        self,
        *,
        dry_run: bool = False,
        vacuum: bool | None = None,
        cache_days: int = upkeep.CACHE_MAX_AGE_DAYS,
        wait_s: float = 30.0,
        progress: Progress | None = None,
    ) -> upkeep.CleanupReport:
        """`qmd cleanup`. Updates and embeds are kept out while it runs: it waits up to
        `wait_s` for one running now to finish, then refuses, saying which (a watcher's
        short pass is waited for; a long embed is not silently raced)."""
        if cache_days < 0:
            raise InvalidInput(f"--cache-days must be 0 or more (got {cache_days})")
        if wait_s < 0:
            raise InvalidInput(f"--wait must be 0 or more seconds (got {wait_s:g})")
        deadline = time.monotonic() + wait_s
        for lock, job in ((self._update, "an update"), (self._embed, "an embed")):
            if not lock.acquire(timeout=max(deadline - time.monotonic(), 0)):
                if job == "an embed":
                    self._update.release()
                raise Conflict(
                    f"{job} is running, so cleanup did not start (waited {wait_s:g}s). Run 'qmd cleanup' again"
                    " when it has finished, or give it longer with --wait SECONDS."
                )
        try:
            keep = self._configured(cache_days)
            return upkeep.cleanup(
                self.store,
                keep,
                dry_run=dry_run,
                vacuum=vacuum,
                step=(lambda name: progress({"event": "step", "step": name})) if progress else None,
            )
        finally:
            self._embed.release()
            self._update.release()

    def coverage(self, name: str | None = None) -> list[upkeep.Coverage]:
        """Each collection (or the one named): its folder walked now against the index."""
        cfg = self.config
        colls = [cfg.get(name)] if name is not None else list(cfg.collections.values())
        try:
            emb: Embedder | None = self.embedder()
            note = ""
        except EmbedderUnavailable as e:
            emb, note = None, e.message
        spaces = self._spaces(emb, [c.name for c in colls]) if emb else {}
        return [upkeep.coverage(self.store, c, spaces.get(c.name), note) for c in colls]

    # -- models -------------------------------------------------------------

    def _models(self) -> dict:
        return resolve_models(self._usable_models(self.config), config_dir=self.paths.config.parent)

    def pull(self, *, refresh: bool = False, progress: Progress | None = None) -> list[dict]:
        """Download every configured `hf:` model (resumable); check local files. Each role
        is reported on its own: one failure does not stop the others."""
        out: list[dict] = []
        for role, resolved in self._models().items():
            ref = resolved.ref
            row = {"role": role, "uri": ref.uri, "source": resolved.source}
            if progress:
                progress({"event": "model", **row})
            try:
                if isinstance(ref, HfRef):
                    got = fetch(
                        ref,
                        (lambda done, total: progress({"event": "download", "done": done, "total": total}))
                        if progress
                        else None,
                        refresh=refresh,
                    )
                    row.update(path=str(got.path), size=got.size, downloaded=got.downloaded)
                elif isinstance(ref, FileRef):
                    path = ensure_local(ref)
                    row.update(path=str(path), size=path.stat().st_size, downloaded=False)
                elif isinstance(ref, CosineRef):
                    row.update(
                        path=None, size=None, downloaded=False, note="the embedder's vectors: nothing to download"
                    )
                else:
                    row.update(path=None, size=None, downloaded=False, note="remote endpoint: nothing to download")
            except QmdError as e:
                row.update(error=e.message)
            out.append(row)
            if progress:
                progress({"event": "pulled", **row})
        return out

    def doctor(self) -> dict:
        """Everything worth knowing when something is off; loads no model."""
        from importlib import metadata as packages

        def version(pkg: str) -> str | None:
            try:
                return packages.version(pkg)
            except packages.PackageNotFoundError:
                return None

        models = []
        try:
            resolved = self._models()
        except QmdError as e:
            resolved, models = {}, [{"role": "*", "error": e.message}]
        for role, r in resolved.items():
            row: dict = {"role": role, "uri": r.ref.uri, "source": r.source}
            local = None
            if isinstance(r.ref, FileRef):
                local = r.ref.path
            elif isinstance(r.ref, HfRef) and cache_path(r.ref).exists():
                local = cache_path(r.ref)
            if isinstance(r.ref, CosineRef):
                row.update(file=None, method=COSINE)
            elif local is None:
                row["file"] = None
                row["problem"] = (
                    "remote endpoint" if isinstance(r.ref, RemoteRef) else "not downloaded (run 'qmd pull')"
                )
            else:
                try:
                    info = self.worker.model_info(ModelSpec(role=role, path=str(local)))
                    row.update(
                        file=str(local),
                        size=info["file_size"],
                        arch=info["arch"],
                        loaded=info["loaded"],
                        context_live=info["context_live"],
                        fingerprint=info.get("fingerprint"),
                    )
                    if role == "rerank":
                        row["method"] = make_reranker(self.worker, str(local), r.ref.uri).method
                except (QmdError, OSError) as e:
                    row.update(file=str(local), problem=str(getattr(e, "message", e)))
            models.append(row)
        return {
            "python": sys.version.split()[0],
            "packages": {
                p: version(p)
                for p in (
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
            },
            "sqlite": self.store.sqlite_version,
            "sqlite_vec": self.store.vec_version,
            "backend": "postgres" if self.store.postgres else "sqlite",
            "index": [asdict(c) for c in self.store.checks()],
            "inference": self.worker.status(),
            "models": models,
            "vector": asdict(self.vector_state()),
            "orphans": asdict(self.orphans()),
            "config_path": str(self.paths.config),
            "index_path": str(self.paths.db),
        }

    # -- bench ----------------------------------------------------------------

    def bench(
        self, spec: BenchSpec, progress: Progress | None = None, cancel: threading.Event | None = None
    ) -> quality.BenchReport:
        """`qmd bench`: a fixture against an indexed collection, or a BEIR folder indexed into
        a collection of its own (`bench-<folder>`, removed afterwards unless `keep`)."""
        cancelled = cancel.is_set if cancel else (lambda: False)
        if spec.beir is None:
            fixture = quality.parse_fixture(spec.fixture, spec.source)
            name = spec.collection or fixture.collection
            return self._bench(fixture, name, "fixture", [], spec, progress, cancelled)
        folder = Path(spec.beir)
        docs, fixture, warnings = quality.load_beir(folder, spec.split, spec.max_queries)
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", folder.resolve().name).strip("-") or "beir"
        name = spec.collection or validate_collection_name(f"bench-{slug}")
        root = self.paths.cache_dir / "bench" / name
        existing = self.config.collections.get(name)
        if existing is not None and Path(existing.root) != root:
            raise Conflict(f"Collection '{name}' exists and is not a bench collection: pass -c with another name")
        quality.materialize(docs, root)
        if existing is None:
            self.create_collection(str(root), name, "**/*.md")
        try:
            self.update([name], progress=progress)
            if spec.embed:
                self.embed(collections=[name], progress=progress, cancel=cancel)
            return self._bench(fixture, name, "beir", warnings, spec, progress, cancelled)
        finally:
            if not spec.keep:
                self.remove_collection(name)
                shutil.rmtree(root, ignore_errors=True)

    def _bench(
        self,
        fixture: quality.Fixture,
        name: str | None,
        kind: Literal["fixture", "beir"],
        warnings: list[str],
        spec: BenchSpec,
        progress: Progress | None,
        cancelled: Callable[[], bool],
    ) -> quality.BenchReport:
        cfg = self.config
        if name is not None and name not in cfg.collections:
            available = ", ".join(sorted(cfg.collections)) or "none"
            raise NotFound(f"Collection not found: {name}\nAvailable: {available}. Run 'qmd ls' to inspect.")
        names = [name] if name else self.scope(None)
        with self.store.read() as conn:
            paths = [f"{n}/{f.path}" for n in names for f in catalog.list_files(conn, n, "")]
        if not paths:
            raise InvalidInput(
                f"Collection '{name}' has no indexed documents.\nRun 'qmd update', then 'qmd ls {name}'."
                if name
                else "No indexed documents found.\nAdd one with 'qmd collection add <folder>', then 'qmd update'."
            )
        if missing := quality.missing_expected(fixture, paths):
            shown = "; ".join(missing[:10]) + (f"; and {len(missing) - 10} more" if len(missing) > 10 else "")
            raise InvalidInput(
                f"{len(missing)} expected file(s) are not in {'collection ' + repr(name) if name else 'the index'}: "
                f"{shown}. Fix the fixture's expected_files (collection-relative paths, as 'qmd ls' shows them), "
                "or run 'qmd update'."
            )
        colls = [name] if name else None

        def files(hits: list[Pointer]) -> list[str]:
            return [h.doc.display_path for h in hits]

        def keyword(q: str, depth: int) -> quality.Answer:
            return quality.Answer(files(self.search(q, SearchOptions(collections=colls, limit=depth)).hits))

        def vector(q: str, depth: int) -> quality.Answer:
            return quality.Answer(files(self.vsearch(q, SearchOptions(collections=colls, limit=depth)).hits))

        def pipeline(rerank: bool) -> quality.Runner:
            def run(q: str, depth: int) -> quality.Answer:
                opts = QueryOptions(
                    collections=colls,
                    limit=depth,
                    rerank=rerank,
                    expand=spec.expand,
                    candidate_limit=spec.candidate_limit,
                )
                out = self.query(parse_query(q), opts)
                return quality.Answer(files(out.hits), [quality.stage_note(s.stage, s.reason) for s in out.skipped])

            return run

        state = self.vector_state(colls)
        no_vectors = "" if state.available else state.message
        reranker, no_reranker = self._reranker(cfg)
        plans = [
            quality.BackendPlan("bm25", keyword),
            quality.BackendPlan("vector", None if no_vectors else vector, no_vectors),
            quality.BackendPlan("hybrid", None if no_vectors else pipeline(False), no_vectors),
            quality.BackendPlan(
                "full", pipeline(True) if reranker and not no_vectors else None, no_vectors or no_reranker
            ),
        ]
        return quality.run(
            fixture,
            [p for p in plans if p.name in spec.backends],
            collection=name or "all",
            documents=len(paths),
            kind=kind,
            warnings=warnings,
            candidate_limit=spec.candidate_limit,
            expand=spec.expand,
            progress=progress,
            cancelled=cancelled,
        )

    # -- status -------------------------------------------------------------

    def status(self) -> IndexStatus:
        embedding = self.background_embedder()[1]
        collections = [self._with_watch(c, embedding) for c in self.describe_collections()]
        with self.store.read() as conn:
            counts = catalog.document_counts(conn)
        return IndexStatus(
            version=__version__,
            index=self.paths.name,
            index_path=self.store.location,
            config_path=str(self.paths.config),
            size_bytes=self.store.size_bytes(),
            documents=counts.documents,
            unique_contents=counts.unique_contents,
            sqlite_version=self.store.sqlite_version,
            sqlite_vec=self.store.vec_version,
            vector=self.vector_state(),
            inference=self.worker.status(),
            collections=collections,
            global_context=self.config.global_context,
            grammars=grammar_status(),
            warnings=self.gate().notes(),
        )


def check_strategy(strategy: str | None) -> None:
    """A chunk strategy from a caller that pydantic did not check (the library)."""
    if strategy is not None and strategy not in CHUNK_STRATEGIES:
        raise InvalidInput(f'--chunk-strategy must be "auto" or "regex" (got "{strategy}")')


def _note(gate: trust.Gate, kind: trust.Kind, coll: Collection) -> str:
    """Why a gated item of `coll` was not used, as the answer says it."""
    return next(i.skipped() for i in gate.items if i.kind == kind and i.name == coll.name)


def summary_dict(s: Summary) -> dict:
    """An update's report on the wire, its walk's count named `discovered` as in seed 001."""
    d = asdict(s)
    d["discovered"] = d.pop("files")
    d["skipped"] = [{"path": p, "reason": r} for p, r in s.skipped]
    d["line"] = s.line()
    return d
