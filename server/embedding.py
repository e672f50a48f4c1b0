"""Embeddings: which model, the embed job, and vector search.

The embedder is resolved from `index.yml` > env > default (never written back), made
local (an `hf:` download when needed) and run in the supervised inference worker. Its
vector space is named by a fingerprint = model file hash + prompt format + chunker
version + chunk size, stored with every vector: a changed fingerprint makes documents
pending, it never mixes spaces.

The embed job is incremental and resumable: only content without a complete set of
vectors in the current space is embedded, every batch is committed as it completes (a
killed daemon resumes where it stopped), and the report counts rows written, not rows
planned. Chunks longer than the embedder reads are embedded clipped and reported once
per run, by count and names (seeds/001).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import vectors
from .chunking import CHUNKER_VERSION
from .config import Config
from .errors import QmdError
from .inference import InferenceError, ModelSpec, Worker, fingerprint
from .model_files import HfRef, RemoteRef, cache_path, ensure_local, resolve_model
from .store import Store

Progress = Callable[[dict], None]
BERT_CHUNK_TOKENS = 256
"""Sentence-transformers BERT models (MiniLM) are trained at 256 tokens though their GGUF
says 512: past 256 the tail barely moves the vector (seeds/001)."""
DEFAULT_CHUNK_TOKENS = 900
EMBED_SUB_BATCH = 32


class EmbedderUnavailable(QmdError):
    """No embedder could be loaded; keyword search still answers."""

    status = 503


@dataclass(frozen=True)
class Embedder:
    """The resolved embed model: what to load and the vector space it writes."""

    uri: str
    spec: ModelSpec
    chunk_tokens: int
    fingerprint: str
    dims: int
    model_name: str


def _chunk_tokens(info: dict) -> int:
    n_ctx = int(info.get("n_ctx_train") or info.get("n_ctx") or 512)
    if info.get("arch") in ("bert", "nomic-bert", "jina-bert-v2"):
        return min(BERT_CHUNK_TOKENS, n_ctx)
    return min(DEFAULT_CHUNK_TOKENS, n_ctx)


class Embedders:
    """Resolves the configured embed model once per config, lazily and thread-safely."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._lock = threading.Lock()
        self._cache: dict[str, Embedder] = {}

    def get(
        self, config: Config, config_dir: Path, *, download: bool = False, progress: Progress | None = None
    ) -> Embedder:
        """The configured embedder. Without `download`, an `hf:` model that is not in the
        cache yet is unavailable (status and searches never start a download)."""
        try:
            ref = resolve_model("embed", config.models, config_dir=config_dir).ref
        except QmdError as e:
            raise EmbedderUnavailable(f"the embed model setting is invalid: {e.message}") from e
        if isinstance(ref, RemoteRef):
            raise EmbedderUnavailable(f"remote embedders ({ref.uri}) are not supported by this version")
        with self._lock:
            if ref.uri in self._cache:
                return self._cache[ref.uri]
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
            fp = hashlib.sha256(f"{fingerprint(spec)}|{CHUNKER_VERSION}|{tokens}".encode()).hexdigest()
            name = ref.uri if isinstance(ref, HfRef) else Path(path).name
            emb = Embedder(ref.uri, spec, tokens, fp, int(info["n_embd"]), name)
            self._cache[ref.uri] = emb
            return emb


@dataclass
class EmbedReport:
    documents: int = 0
    chunks: int = 0
    pending_before: int = 0
    pending_after: int = 0
    clipped: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    cancelled: bool = False
    model: str = ""
    fingerprint: str = ""
    partitions_added: int = 0
    partitions_removed: int = 0

    def line(self) -> str:
        rate = self.chunks / self.seconds if self.seconds else 0.0
        return (
            f"Embedded {self.chunks} chunks from {self.documents} documents in {self.seconds:.1f}s "
            f"({rate:.1f} chunks/s); {self.pending_after} pending"
        )


def embed_pending(
    store: Store,
    worker: Worker,
    embedder: Embedder,
    *,
    collections: list[str] | None,
    force: bool = False,
    max_docs_per_batch: int = 64,
    max_batch_bytes: int = 4 * 1024 * 1024,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> EmbedReport:
    t0 = time.monotonic()
    report = EmbedReport(model=embedder.model_name, fingerprint=embedder.fingerprint)

    def prepare(conn: object) -> vectors.Space:
        old = vectors.find_space(conn, embedder.fingerprint)  # type: ignore[arg-type]
        if force and old:
            vectors.drop_space(conn, old)  # type: ignore[arg-type]
        return vectors.ensure_space(conn, embedder.fingerprint, embedder.model_name, embedder.dims)  # type: ignore[arg-type]

    space = store.write(prepare)
    with store.read() as conn:
        pending = sorted(vectors.pending_hashes(conn, space, collections))
    report.pending_before = len(pending)
    done_docs = 0
    i = 0
    while i < len(pending):
        if cancel is not None and cancel.is_set():
            report.cancelled = True
            break
        batch, size = [], 0
        with store.read() as conn:
            while i < len(pending) and len(batch) < max_docs_per_batch and (not batch or size < max_batch_bytes):
                row = conn.execute(
                    "SELECT c.doc, d.title, d.collection, d.path FROM content c JOIN documents d ON d.hash = c.hash"
                    " WHERE c.hash = ? AND d.active = 1 LIMIT 1",
                    (pending[i],),
                ).fetchone()
                if row is not None:
                    batch.append((pending[i], row[0], row[1], f"{row[2]}/{row[3]}"))
                    size += len(row[0])
                i += 1
        for content_hash, body, title, name in batch:
            written = _embed_document(store, worker, embedder, space, content_hash, body, title, name, report, cancel)
            if not written:
                report.cancelled = True
                break
            done_docs += 1
            report.documents += 1
            if progress:
                elapsed = max(time.monotonic() - t0, 1e-6)
                rate = report.chunks / elapsed
                left = len(pending) - done_docs
                eta = left * (elapsed / done_docs)
                progress(
                    {
                        "event": "progress",
                        "done": done_docs,
                        "total": len(pending),
                        "chunks": report.chunks,
                        "chunks_per_s": round(rate, 1),
                        "eta_s": round(eta, 1),
                    }
                )
        if report.cancelled:
            break
    added, removed = store.write(lambda conn: vectors.sync_partitions(conn, space))
    report.partitions_added, report.partitions_removed = added, removed
    with store.read() as conn:
        report.pending_after = len(vectors.pending_hashes(conn, space, collections))
    report.seconds = time.monotonic() - t0
    return report


def _embed_document(
    store: Store,
    worker: Worker,
    embedder: Embedder,
    space: vectors.Space,
    content_hash: str,
    body: str,
    title: str,
    name: str,
    report: EmbedReport,
    cancel: threading.Event | None,
) -> bool:
    """Chunk and embed one content body; commits after each sub-batch. False if cancelled."""
    chunks = worker.chunk(embedder.spec, body, max_tokens=embedder.chunk_tokens)
    with store.read() as conn:
        have = {
            r[0]
            for r in conn.execute(
                "SELECT seq FROM content_vectors WHERE space_id = ? AND hash = ?", (space.id, content_hash)
            )
        }
    todo = [(seq, c) for seq, c in enumerate(chunks) if seq not in have]
    for j in range(0, len(todo), EMBED_SUB_BATCH):
        if cancel is not None and cancel.is_set():
            return False
        part = todo[j : j + EMBED_SUB_BATCH]
        texts = [body[c.start : c.end] for _, c in part]
        embs = worker.embed(embedder.spec, texts, kind="document", titles=[title] * len(texts))
        rows = [
            vectors.ChunkVector(
                seq, c.start, c.end, c.start_line, c.end_line, embs.n_tokens[k], c.clipped or k in embs.clipped, embs[k]
            )
            for k, (seq, c) in enumerate(part)
        ]
        for row in rows:
            if row.clipped:
                report.clipped.append({"file": name, "chunk": row.seq, "tokens": row.tokens, "limit": embs.limit})
        store.write(lambda conn, rows=rows: vectors.write_document(conn, space, content_hash, rows, len(chunks)))
        report.chunks += len(rows)
    return True


def embed_query(worker: Worker, embedder: Embedder, text: str) -> list[float]:
    try:
        return list(worker.embed(embedder.spec, [text], kind="query")[0])
    except InferenceError as e:
        raise EmbedderUnavailable(f"the query could not be embedded: {e.message}") from e
