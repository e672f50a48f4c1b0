"""Embedders: which embed model, where it runs, and the vector space it writes.

The embedder is resolved from `index.yml` > env > default (never written back). It runs
on one of two backends behind the same small interface (`EmbedBackend`: chunk a body,
embed texts): a GGUF file (an `hf:` download when needed) in the supervised inference
worker, or an OpenAI-compatible endpoint (`models.remote`). Its vector space is named by
a fingerprint = model identity (the file's hash and prompt format, or the endpoint and
model name) + chunker version + chunk size (+ the code chunker and its grammars for the
`auto` chunk strategy), stored with every vector: a changed fingerprint makes documents
pending, it never mixes spaces.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from qmd.server.config import Config
from qmd.server.errors import QmdError, Unavailable
from qmd.server.models.refs import HfRef, RemoteRef, cache_path, ensure_local, resolve_model
from qmd.server.models.remote import CHUNK_TOKENS as REMOTE_CHUNK_TOKENS
from qmd.server.models.remote import Kind, RemoteBackend, RemoteEmbedError
from qmd.server.models.worker import (
    Embeddings,
    InferenceError,
    ModelsNotInstalled,
    ModelSpec,
    WorkerClient,
    fingerprint,
)
from qmd.server.text.chunking import CHUNKER_VERSION, Chunk, ChunkStrategy
from qmd.server.text.code_chunks import strategy_identity
from qmd.server.text.headings import CONTEXT_VERSION

Progress = Callable[[dict], None]
BERT_CHUNK_TOKENS = 256
"""Sentence-transformers BERT models (MiniLM) are trained at 256 tokens though their GGUF
says 512: past 256 the tail barely moves the vector (seeds/001)."""
DEFAULT_CHUNK_TOKENS = 900
REMOTE_RETRY_S = 30.0
"""How long a failed probe of a remote embedder is believed before status/search retry it."""


class EmbedderUnavailable(Unavailable):
    """No embedder could be loaded; keyword search still answers."""


class EmbedBackend(Protocol):
    """Where an embed model runs. The job and query embedding see only this, so a local
    GGUF and a remote endpoint chunk, embed and report clipping the same way."""

    def chunk(self, text: str, max_tokens: int, language: str | None = None) -> list[Chunk]:
        """Chunks of `text`, each within `max_tokens` as this backend counts them; a code
        file's at its syntax when `language` names its grammar (`index.code_chunks`)."""
        ...

    def embed(self, texts: list[str], kind: Kind, titles: list[str | None] | None = None) -> Embeddings:
        """Unit vectors for `texts` in input order, with what was clipped and token counts."""
        ...


@dataclass(frozen=True)
class LocalBackend:
    """A GGUF file run by the supervised inference worker (its own tokenizer, prompt format)."""

    worker: WorkerClient
    spec: ModelSpec

    def chunk(self, text: str, max_tokens: int, language: str | None = None) -> list[Chunk]:
        return self.worker.chunk(self.spec, text, max_tokens=max_tokens, language=language)

    def embed(self, texts: list[str], kind: Kind, titles: list[str | None] | None = None) -> Embeddings:
        return self.worker.embed(self.spec, texts, kind=kind, titles=titles)


@dataclass(frozen=True)
class Embedder:
    """The resolved embed model: the backend that runs it and the vector space it writes."""

    uri: str
    backend: EmbedBackend = field(compare=False)
    chunk_tokens: int
    fingerprint: str
    """The space of documents cut by the smart chunker (`regex`): the name spaces had before
    strategies existed, so nothing re-embeds on an upgrade."""
    dims: int
    model_name: str

    def fingerprint_for(self, strategy: ChunkStrategy) -> str:
        """The space this embedder writes for documents cut by `strategy`. `auto` adds the
        code chunker and the grammars it can load: vectors of the two strategies never share
        a space, and switching a collection makes its documents pending in the other."""
        if strategy == "regex":
            return self.fingerprint
        return hashlib.sha256(f"{self.fingerprint}|{strategy}|{strategy_identity()}".encode()).hexdigest()


def _chunk_tokens(info: dict) -> int:
    n_ctx = int(info.get("n_ctx_train") or info.get("n_ctx") or 512)
    if info.get("arch") in ("bert", "nomic-bert", "jina-bert-v2"):
        return min(BERT_CHUNK_TOKENS, n_ctx)
    return min(DEFAULT_CHUNK_TOKENS, n_ctx)


class Embedders:
    """Resolves the configured embed model once per config, lazily and thread-safely."""

    def __init__(self, worker: WorkerClient) -> None:
        self.worker = worker
        self._lock = threading.Lock()
        self._cache: dict[str, Embedder] = {}
        self._failed: dict[str, tuple[float, str]] = {}

    def get(
        self, config: Config, config_dir: Path, *, download: bool = False, progress: Progress | None = None
    ) -> Embedder:
        """The configured embedder. Without `download`, an `hf:` model that is not in the
        cache yet is unavailable (status and searches never start a download)."""
        try:
            ref = resolve_model("embed", config.models, config_dir=config_dir).ref
        except QmdError as e:
            raise EmbedderUnavailable(f"the embed model setting is invalid: {e.message}") from e
        with self._lock:
            if not isinstance(ref, RemoteRef):
                # Checked before the cache (it can be found missing after a resolve) and before any
                # download: a gigabyte fetched for a model that cannot run helps nobody.
                try:
                    self.worker.require_models()
                except ModelsNotInstalled as e:
                    raise EmbedderUnavailable(e.message) from e
            if ref.uri in self._cache:
                return self._cache[ref.uri]
            if isinstance(ref, RemoteRef):
                # A failed probe is remembered briefly, so `status` and searches do not each
                # wait on an unreachable host; `embed` (download=True) always tries again.
                failed = self._failed.get(ref.uri)
                if failed and not download and time.monotonic() - failed[0] < REMOTE_RETRY_S:
                    raise EmbedderUnavailable(failed[1])
                try:
                    emb = self._remote(ref)
                except EmbedderUnavailable as e:
                    self._failed[ref.uri] = (time.monotonic(), e.message)
                    raise
                self._failed.pop(ref.uri, None)
                self._cache[ref.uri] = emb
                return emb
            if isinstance(ref, HfRef) and not download and not cache_path(ref).exists():
                raise EmbedderUnavailable(
                    f"the embed model {ref.uri} is not downloaded yet (run 'qmd pull' or 'qmd embed')"
                )
            try:
                path = ensure_local(
                    ref,
                    (lambda done, total: progress({"event": "download", "done": done, "total": total}))
                    if progress
                    else None,
                )
            except QmdError as e:
                raise EmbedderUnavailable(f"the embed model {ref.uri} could not be loaded: {e.message}") from e
            spec = ModelSpec(role="embed", path=str(path))
            try:
                info = self.worker.model_info(spec)
            except QmdError as e:
                raise EmbedderUnavailable(f"the embed model {path} is not usable: {e.message}") from e
            tokens = _chunk_tokens(info)
            name = ref.uri if isinstance(ref, HfRef) else Path(path).name
            emb = Embedder(
                ref.uri,
                LocalBackend(self.worker, spec),
                tokens,
                _space_fingerprint(fingerprint(spec), tokens),
                int(info["n_embd"]),
                name,
            )
            self._cache[ref.uri] = emb
            return emb

    @staticmethod
    def _remote(ref: RemoteRef) -> Embedder:
        """An endpoint's embedder, after one probe for its dimensions (a server started
        later is found once the failed probe's grace period is over)."""
        try:
            backend = RemoteBackend(ref.endpoint, ref.model)
        except RemoteEmbedError as e:
            raise EmbedderUnavailable(e.message) from e
        try:
            dims = backend.probe()
        except RemoteEmbedError as e:
            backend.close()
            raise EmbedderUnavailable(e.message) from e
        fp = _space_fingerprint(backend.identity, REMOTE_CHUNK_TOKENS)
        return Embedder(ref.uri, backend, REMOTE_CHUNK_TOKENS, fp, dims, ref.uri)


def _space_fingerprint(model_identity: str, chunk_tokens: int) -> str:
    """The vector space's name: the model's identity, how its documents were cut, and
    what context each chunk is embedded with."""
    return hashlib.sha256(f"{model_identity}|{CHUNKER_VERSION}|{chunk_tokens}|{CONTEXT_VERSION}".encode()).hexdigest()


def embed_query(embedder: Embedder, text: str) -> list[float]:
    """The query's vector; a backend failure makes vector search unavailable, not the request."""
    try:
        return list(embedder.backend.embed([text], "query")[0])
    except (InferenceError, RemoteEmbedError) as e:
        raise EmbedderUnavailable(f"the query could not be embedded: {e.message}") from e
