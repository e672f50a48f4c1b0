"""Role → ready model: the one place where a role's setting (`index.yml` `models:` > env >
default, `refs`) becomes a model that can run now, for embed, generate and rerank alike,
and where `qmd pull` and `qmd doctor` look at the same three.

Like `llm.get_model(name)`, which hands back a runnable model for a name, `Models` hands
back a ready model for a role: the embedder (`embedders`: its backend and vector space),
or for generate and rerank where the model runs (a GGUF on this machine in the worker, an
endpoint, the embedder's cosine), which the search floor wraps into its Expander or
Reranker: this floor knows nothing of queries. Callers pass the config whose `models:`
may be used (an untrusted project's own choices already replaced by the defaults), and
nothing is downloaded unless asked (`download`, `pull`): a query never stalls on a gigabyte.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from qmd.server.config import Config
from qmd.server.errors import QmdError
from qmd.server.models.embedders import Embedder, Embedders, EmbedderUnavailable, LocalBackend, Progress
from qmd.server.models.refs import (
    COSINE,
    CosineRef,
    FileRef,
    HfRef,
    RemoteRef,
    ResolvedModel,
    Role,
    cache_path,
    ensure_local,
    fetch,
    local_model,
    resolve_model,
    resolve_models,
)
from qmd.server.models.worker import ModelSpec, WorkerClient


@dataclass(frozen=True)
class LocalModel:
    """A GGUF file on this machine, run by the supervised worker under its role."""

    role: Role
    uri: str
    path: Path

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(role=self.role, path=str(self.path))


Ready = LocalModel | RemoteRef | CosineRef
"""Where a generate or rerank model runs; frozen, so a caller can key what it builds on it."""


@dataclass
class Pulled:
    """`qmd pull`, one role: where its model now is, or why it could not be had."""

    role: str
    uri: str
    source: str
    """Where the setting came from: `index.yml`, an environment variable, or the default."""
    path: str | None = None
    size: int | None = None
    downloaded: bool = False
    """Fetched now, rather than found in the cache."""
    note: str | None = None
    """Why there was nothing to download (an endpoint, the embedder's cosine)."""
    error: str | None = None


@dataclass
class ModelCheck:
    """`qmd doctor`, one role: where its model is and what the worker reads in its file."""

    role: str
    """`*` when the settings themselves could not be read (`error` says why)."""
    uri: str | None = None
    source: str | None = None
    file: str | None = None
    size: int | None = None
    arch: str | None = None
    loaded: bool | None = None
    context_live: bool | None = None
    fingerprint: str | None = None
    method: str | None = None
    """How a rerank model scores (cross-encoder, yes/no, query likelihood, cosine)."""
    problem: str | None = None
    error: str | None = None


class Models:
    """One index's models: shared by its queries, jobs and reports, so the embedder is
    resolved once per setting and a model's file is checked where it is about to be used."""

    def __init__(self, worker: WorkerClient, config_dir: Path) -> None:
        self.worker = worker
        self.config_dir = config_dir
        """Where a relative model path in the config is resolved from."""
        self.embedders = Embedders(worker)

    def embedder(self, cfg: Config, *, download: bool = False, progress: Progress | None = None) -> Embedder:
        """The embed model, ready (an `EmbedderUnavailable` says why not)."""
        return self.embedders.get(cfg, self.config_dir, download=download, progress=progress)

    def background_embedder(self, cfg: Config) -> tuple[Embedder | None, str]:
        """The embedder the watcher may use for what it indexed, or why there is none: only a
        model already on this machine (never a download, never a remote endpoint's bill)."""
        try:
            emb = self.embedder(cfg)
        except EmbedderUnavailable as e:
            return None, f"off: {e.message}"
        if not isinstance(emb.backend, LocalBackend):
            return None, f"off: {emb.uri} is a remote endpoint (run 'qmd embed')"
        return emb, "automatic"

    def generator(self, cfg: Config) -> LocalModel | RemoteRef:
        """The generate model (query expansion). An endpoint's needs no local worker:
        llama.cpp need not even be installed."""
        ref = resolve_model("generate", cfg.models, config_dir=self.config_dir).ref
        return ref if isinstance(ref, RemoteRef) else self._local("generate", cfg)

    def reranker(self, cfg: Config) -> Ready:
        """The rerank model, or the embedder's cosine; an endpoint's needs no local worker."""
        ref = resolve_model("rerank", cfg.models, config_dir=self.config_dir).ref
        return ref if isinstance(ref, RemoteRef | CosineRef) else self._local("rerank", cfg)

    def _local(self, role: Role, cfg: Config) -> LocalModel:
        """A role's GGUF, already on disk (never downloaded here) with the worker installed."""
        self.worker.require_models()
        uri, path = local_model(role, cfg.models, self.config_dir)
        return LocalModel(role, uri, path)

    def resolved(self, cfg: Config) -> dict[Role, ResolvedModel]:
        """Every role's setting and where it came from, without touching a file."""
        return resolve_models(cfg.models, config_dir=self.config_dir)

    def pull(self, cfg: Config, *, refresh: bool = False, progress: Progress | None = None) -> list[Pulled]:
        """Download every configured `hf:` model (resumable); check local files. Each role
        is reported on its own: one failure does not stop the others."""
        out: list[Pulled] = []
        for role, resolved in self.resolved(cfg).items():
            ref = resolved.ref
            row = Pulled(role, ref.uri, resolved.source)
            if progress:
                progress({"event": "model", **asdict(row)})
            try:
                if isinstance(ref, HfRef):
                    got = fetch(
                        ref,
                        (lambda done, total: progress({"event": "download", "done": done, "total": total}))
                        if progress
                        else None,
                        refresh=refresh,
                    )
                    row.path, row.size, row.downloaded = str(got.path), got.size, got.downloaded
                elif isinstance(ref, FileRef):
                    path = ensure_local(ref)
                    row.path, row.size = str(path), path.stat().st_size
                elif isinstance(ref, CosineRef):
                    row.note = "the embedder's vectors: nothing to download"
                else:
                    row.note = "remote endpoint: nothing to download"
            except QmdError as e:
                row.error = e.message
            out.append(row)
            if progress:
                progress({"event": "pulled", **asdict(row)})
        return out

    def check(self, cfg: Config, rerank_method: Callable[[LocalModel], str]) -> list[ModelCheck]:
        """`qmd doctor`'s rows, a role each: where its model is and what the worker reads in
        its file, without loading it. `rerank_method` names how a local rerank model would
        score (the search floor decides that from the file)."""
        try:
            resolved = self.resolved(cfg)
        except QmdError as e:
            return [ModelCheck("*", error=e.message)]
        rows = []
        for role, r in resolved.items():
            row = ModelCheck(role, r.ref.uri, r.source)
            local = None
            if isinstance(r.ref, FileRef):
                local = r.ref.path
            elif isinstance(r.ref, HfRef) and cache_path(r.ref).exists():
                local = cache_path(r.ref)
            if isinstance(r.ref, CosineRef):
                row.method = COSINE
            elif local is None:
                row.problem = "remote endpoint" if isinstance(r.ref, RemoteRef) else "not downloaded (run 'qmd pull')"
            else:
                row.file = str(local)
                try:
                    info = self.worker.model_info(ModelSpec(role=role, path=str(local)))
                    row.size, row.arch, row.fingerprint = info["file_size"], info["arch"], info.get("fingerprint")
                    row.loaded, row.context_live = info["loaded"], info["context_live"]
                    if role == "rerank":
                        row.method = rerank_method(LocalModel(role, r.ref.uri, local))
                except (QmdError, OSError) as e:
                    row.problem = str(getattr(e, "message", e))
            rows.append(row)
        return rows
