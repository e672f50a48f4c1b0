"""The embed job: the index's documents, chunked, become vectors in the embedder's space.

Which embedder, and where it runs, is `models.embedders`. The job is incremental and
resumable: only content without a complete set of vectors in the current space is
embedded, every batch is committed as it completes (a killed daemon resumes where it
stopped) together with the search-table rows of the documents it completes (what status
counts as embedded is what vector search reaches, also after a kill), and the report
counts rows written, not rows planned. Chunks longer than the embedder reads are
embedded clipped and reported once per run, by count and names (seeds/001).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar

from qmd.server.ingest.loaders import file_stem
from qmd.server.models.embedders import Embedder
from qmd.server.models.worker import WorkerLost
from qmd.server.store import vectors
from qmd.server.store.db import Connection, IndexStore
from qmd.server.store.sqlite import utcnow
from qmd.server.text.chunking import DEFAULT_CHUNK_STRATEGY, Chunk, ChunkStrategy
from qmd.server.text.code_chunks import language_for
from qmd.server.text.headings import HeadingPaths, chunk_context

Progress = Callable[[dict], None]
log = logging.getLogger("qmd.embed")
T = TypeVar("T")


class Cancel(Protocol):
    """What stops a job at its next batch boundary: a `threading.Event`, or the engine's
    `either` of one and a scheduler's request that background work yield."""

    def is_set(self) -> bool: ...


class either:  # noqa: N801 - reads as the function it stands for
    """A `Cancel` set when any of `flags` is."""

    def __init__(self, *flags: Cancel) -> None:
        self.flags = flags

    def is_set(self) -> bool:
        return any(f.is_set() for f in self.flags)


LOST_RETRIES = 2
"""Times a batch is sent again after the inference worker crashed or was killed as hung under it:
the worker restarts with the next call, and a model that crashed it twice is reloaded with safe
settings (`WorkerClient._recover`), so the third try runs where the first two crashed."""
EMBED_SUB_BATCH = 32
"""Texts per embed request to the backend: chunks of as many documents as fill it, so an embedder
with parallel contexts (QMD_EMBED_PARALLELISM) embeds several small documents at once."""


@dataclass
class EmbedReport:
    """What one run did, in seed 001's names where it names them (`chunks`, `embedded`,
    `skipped`, `truncated`, `truncated_count`)."""

    documents: int = 0
    chunks: int = 0
    """Chunks of the documents this run took up: `embedded` + `skipped` + `reused`."""
    embedded: int = 0
    """Chunks whose vectors this run wrote, counted from the batches committed, not from the plan."""
    skipped: int = 0
    """Chunks that had their vector already (a run resumed after a kill or Ctrl-C): not embedded again."""
    reused: int = 0
    """Chunks of changed documents whose title and text an earlier version (or a copy) had
    embedded: their vectors were copied, not computed (counted in `chunks`, not `embedded`)."""
    pending_before: int = 0
    pending_after: int = 0
    truncated: list[dict] = field(default_factory=list)
    """Chunks longer than the embedder reads, embedded clipped: `{file, chunk, tokens, limit}` each."""
    seconds: float = 0.0
    cancelled: bool = False
    model: str = ""
    fingerprint: str = ""
    partitions_added: int = 0
    partitions_removed: int = 0
    strategies: dict[str, str] = field(default_factory=dict)
    """Chunk strategy → the fingerprint of the space its collections were embedded into."""
    switched: list[str] = field(default_factory=list)
    """Collections this run moved to another chunk strategy (`--chunk-strategy`)."""

    @property
    def truncated_count(self) -> int:
        """The number to assert on (seed 001)."""
        return len(self.truncated)

    def line(self) -> str:
        """Seed 001's counters, then the run's speed and what is left."""
        rate = self.embedded / self.seconds if self.seconds else 0.0
        return (
            f"Embedded: documents {self.documents} · chunks {self.chunks} · embedded {self.embedded} · "
            f"skipped {self.skipped} · reused {self.reused} · clipped {self.truncated_count} "
            f"({self.seconds:.1f}s, {rate:.1f} chunks/s); {self.pending_after} pending"
        )

    def as_json(self) -> dict[str, Any]:
        """The report on the wire (`done`, `--json`, the last run in `/v1/embed/progress`)."""
        return {**asdict(self), "truncated_count": self.truncated_count, "line": self.line()}


EmbedSource = Literal["embed", "background"]
"""Who started an embed: `qmd embed` (or the library), or the daemon in the background (for
what the watcher indexed, or a collection just added)."""


@dataclass(frozen=True)
class EmbedProgress:
    """A running embed as `qmd status` and `qmd embed --follow` show it."""

    source: EmbedSource
    model: str
    collections: list[str] | None
    """The collections it embeds (None: all)."""
    started_at: str
    documents_done: int
    documents_total: int
    """Documents it found pending when it started (0 until it has counted them)."""
    chunks_embedded: int
    chunks_per_s: float
    eta_s: float | None
    """Seconds left at the rate so far (None before the first document is done)."""
    notices: tuple[str, ...] = ()
    """What it said on the way (a batch sent again to a new worker), the last `NOTICES_KEPT`:
    `qmd embed --follow` shows them as the embed's own stream does."""
    notices_total: int = 0
    """How many it said in all, so a follower knows which of `notices` it has not shown."""


NOTICES_KEPT = 20


@dataclass(frozen=True)
class BackgroundStart:
    """What `collection add` started: the documents the daemon embeds in the background and
    with which model, or why it embeds nothing (`reason`)."""

    started: bool
    documents: int
    model: str | None
    reason: str


class EmbedTracker:
    """The engine's running embed (the embed lock keeps it to one at a time) and the report
    of the last one that finished, for status and `--follow`, whoever started them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: EmbedProgress | None = None
        self._last: tuple[EmbedSource, EmbedReport] | None = None

    def running(self) -> EmbedProgress | None:
        with self._lock:
            return self._running

    def last(self) -> tuple[EmbedSource, EmbedReport] | None:
        with self._lock:
            return self._last

    @contextmanager
    def run(
        self, source: EmbedSource, model: str, collections: list[str] | None, progress: Progress | None
    ) -> Iterator[Callable[[dict], None]]:
        """Track one embed: yields the progress callback to give `embed_pending` (which also
        passes each event on to `progress`); `finished` records its report."""
        with self._lock:
            self._running = EmbedProgress(source, model, collections, utcnow(), 0, 0, 0, 0.0, None)

        def seen(ev: dict) -> None:
            if ev.get("event") == "notice":
                with self._lock:
                    if self._running is not None:
                        notices = (*self._running.notices, ev["message"])[-NOTICES_KEPT:]
                        total = self._running.notices_total + 1
                        self._running = replace(self._running, notices=notices, notices_total=total)
            if ev.get("event") == "progress":
                with self._lock:
                    if self._running is not None:
                        self._running = replace(
                            self._running,
                            documents_done=ev["done"],
                            documents_total=ev["total"],
                            chunks_embedded=ev["chunks"],
                            chunks_per_s=ev["chunks_per_s"],
                            eta_s=ev["eta_s"],
                        )
            if progress is not None:
                progress(ev)

        try:
            yield seen
        finally:
            with self._lock:
                self._running = None

    def finished(self, source: EmbedSource, report: EmbedReport) -> None:
        with self._lock:
            self._last = (source, report)


@dataclass(frozen=True)
class _Group:
    """The collections of one chunk strategy: one vector space, its pending contents."""

    strategy: ChunkStrategy
    collections: list[str] | None
    space: vectors.Space
    pending: list[str]


def strategy_groups(
    collections: list[str] | None, strategies: Mapping[str, ChunkStrategy] | None
) -> dict[ChunkStrategy, list[str] | None]:
    """The collections in scope by chunk strategy. Without `strategies` everything is cut by
    the default one; with them, they name the universe when `collections` is None."""
    if not strategies:
        return {DEFAULT_CHUNK_STRATEGY: collections}
    grouped: dict[ChunkStrategy, list[str]] = {}
    for name in collections if collections is not None else list(strategies):
        grouped.setdefault(strategies.get(name, DEFAULT_CHUNK_STRATEGY), []).append(name)
    return {strategy: names for strategy, names in grouped.items()}


def embed_pending(
    store: IndexStore,
    embedder: Embedder,
    *,
    collections: list[str] | None,
    strategies: Mapping[str, ChunkStrategy] | None = None,
    force: bool = False,
    max_docs_per_batch: int = 64,
    max_batch_bytes: int = 4 * 1024 * 1024,
    progress: Progress | None = None,
    cancel: Cancel | None = None,
) -> EmbedReport:
    """Embed what the embedder's spaces lack: each collection's documents cut by its chunk
    strategy (`strategies`, collection → strategy; the default for those not named) into
    that strategy's space."""
    t0 = time.monotonic()
    report = EmbedReport(model=embedder.model_name, fingerprint=embedder.fingerprint)

    def prepare(conn: Connection, strategy: ChunkStrategy, names: list[str] | None) -> vectors.Space:
        fingerprint = embedder.fingerprint_for(strategy)
        old = vectors.find_space(conn, fingerprint)
        if force and old and collections:  # only the named collections' contents start over
            vectors.forget_hashes(conn, old, vectors.pending_hashes(conn, None, names))
        elif force and old:
            vectors.drop_space(conn, old)
        return vectors.ensure_space(conn, fingerprint, embedder.model_name, embedder.dims)

    groups: list[_Group] = []
    for strategy, names in strategy_groups(collections, strategies).items():
        with store.read() as conn:
            space = vectors.find_space(conn, embedder.fingerprint_for(strategy))
        if force or space is None or space.dims != embedder.dims:  # `ensure_space` says what is wrong with dims
            # only then a write: one that changed nothing would still move every generation-keyed cache
            space = store.write(functools.partial(prepare, strategy=strategy, names=names))
        with store.read() as conn:
            groups.append(_Group(strategy, names, space, sorted(vectors.pending_hashes(conn, space, names))))
    report.strategies = {g.strategy: g.space.fingerprint for g in groups}
    total = sum(len(g.pending) for g in groups)
    report.pending_before = total
    done_docs = 0
    if progress:  # the total before the first document is done: a long first batch shows it
        progress({"event": "progress", "done": 0, "total": total, "chunks": 0, "chunks_per_s": 0.0, "eta_s": None})

    def document_done() -> None:
        nonlocal done_docs
        done_docs += 1
        report.documents += 1
        if progress:
            elapsed = max(time.monotonic() - t0, 1e-6)
            rate = report.embedded / elapsed
            left = total - done_docs
            eta = left * (elapsed / done_docs)
            progress(
                {
                    "event": "progress",
                    "done": done_docs,
                    "total": total,
                    "chunks": report.embedded,
                    "chunks_per_s": round(rate, 1),
                    "eta_s": round(eta, 1),
                }
            )

    for group in groups:
        if report.cancelled or not _embed_group(
            store, embedder, group, max_docs_per_batch, max_batch_bytes, report, cancel, document_done, progress
        ):
            report.cancelled = True
            break
    # what moved since its batch was written: documents removed, renamed across collections or copied
    pending_after: set[str] = set()
    for group in groups:
        if not store.write(functools.partial(vectors.partitions_synced, space=group.space), bump=False):
            added, removed = store.write(functools.partial(vectors.sync_partitions, space=group.space))
            report.partitions_added += added
            report.partitions_removed += removed
        with store.read() as conn:
            pending_after |= vectors.pending_hashes(conn, group.space, group.collections)
    report.pending_after = len(pending_after)
    report.seconds = time.monotonic() - t0
    return report


def _embed_group(
    store: IndexStore,
    embedder: Embedder,
    group: _Group,
    max_docs_per_batch: int,
    max_batch_bytes: int,
    report: EmbedReport,
    cancel: Cancel | None,
    document_done: Callable[[], None],
    progress: Progress | None,
) -> bool:
    """The group's pending contents in batches of documents; False if cancelled."""
    pending = group.pending
    scope, args = "", []
    if group.collections is not None:
        scope, args = f" AND d.collection IN ({','.join('?' * len(group.collections))})", group.collections
    i = 0
    while i < len(pending):
        if cancel is not None and cancel.is_set():
            return False
        batch: list[_Doc] = []
        size = 0
        with store.read() as conn:
            while i < len(pending) and len(batch) < max_docs_per_batch and (not batch or size < max_batch_bytes):
                row = conn.execute(
                    "SELECT c.doc, d.title, d.collection, d.path FROM content c JOIN documents d ON d.hash = c.hash"
                    f" WHERE c.hash = ? AND d.active = 1{scope} LIMIT 1",
                    (pending[i], *args),
                ).fetchone()
                if row is not None:
                    language = language_for(row[3]) if group.strategy == "auto" else None
                    batch.append(_Doc(pending[i], row[0], row[1], f"{row[2]}/{row[3]}", language))
                    size += len(row[0])
                i += 1
        if not _embed_documents(store, embedder, group.space, batch, report, cancel, document_done, progress):
            return False
    return True


def _surviving(what: str, call: Callable[[], T], progress: Progress | None) -> T:
    """`call`, made again (up to `LOST_RETRIES` times) when the inference worker is lost under it:
    the batches committed stay, and this one is not dropped with the job."""
    for attempt in range(LOST_RETRIES):
        try:
            return call()
        except WorkerLost as e:
            message = f"{e.message}; {what} again (try {attempt + 2} of {LOST_RETRIES + 1})"
            log.warning("%s", message)
            if progress is not None:
                progress({"event": "notice", "message": message})
    return call()


@dataclass(frozen=True)
class _Doc:
    content_hash: str
    body: str
    title: str
    name: str
    """collection/path, for the report"""
    language: str | None
    """The grammar its chunks are cut by (`auto` strategy, a code file), else None."""


def _embed_documents(
    store: IndexStore,
    embedder: Embedder,
    space: vectors.Space,
    docs: list[_Doc],
    report: EmbedReport,
    cancel: Cancel | None,
    document_done: Callable[[], None],
    progress: Progress | None = None,
) -> bool:
    """Chunk each document, then embed the chunks without a vector
    `EMBED_SUB_BATCH` at a time across documents; each request's rows are committed together.
    `document_done` is called as each document's last chunk is written. False if cancelled."""
    queue: list[tuple[int, int, Chunk]] = []  # (document, seq, chunk)
    totals: list[int] = []
    left: list[int] = []
    copied: dict[int, list[vectors.ChunkVector]] = {}  # document → rows reused from identical chunks
    contexts: dict[tuple[int, int], str] = {}  # (document, seq) → the title and headings it is embedded with
    chunkless: list[str] = []
    for d, doc in enumerate(docs):
        chunks = _surviving(
            f"chunking {doc.name}",
            functools.partial(embedder.backend.chunk, doc.body, embedder.chunk_tokens, doc.language),
            progress,
        )
        if not chunks:
            chunkless.append(doc.content_hash)
        paths = HeadingPaths(doc.body)
        # a title made up from the file name (`d123`, `2024-01-05`) is not the document's words
        title = "" if doc.title == file_stem(doc.name) else doc.title
        for seq, c in enumerate(chunks):
            contexts[d, seq] = chunk_context(title, paths.at(c.start), doc.body[c.start : c.end])
        keys = [vectors.chunk_key(contexts[d, seq], doc.body[c.start : c.end]) for seq, c in enumerate(chunks)]
        with store.read() as conn:
            have = {
                r[0]
                for r in conn.execute(
                    "SELECT seq FROM content_vectors WHERE space_id = ? AND hash = ?", (space.id, doc.content_hash)
                )
            }
            todo = [(d, seq, c) for seq, c in enumerate(chunks) if seq not in have]
            known = vectors.reusable(conn, space, [keys[seq] for _, seq, _ in todo])
        for _, seq, c in todo:
            if keys[seq] in known:
                tokens, clipped, blob = known[keys[seq]]
                row = vectors.ChunkVector(
                    seq, c.start, c.end, c.start_line, c.end_line, tokens, clipped, blob, keys[seq]
                )
                copied.setdefault(d, []).append(row)  # a clipped one was reported when it was embedded
        fresh = [(d, seq, c) for _, seq, c in todo if keys[seq] not in known]
        report.chunks += len(chunks)
        report.skipped += len(chunks) - len(todo)
        report.reused += len(todo) - len(fresh)
        queue += [(d, seq, c) for d, seq, c in fresh]
        totals.append(len(chunks))
        left.append(len(fresh))
    if chunkless:
        store.write(lambda conn: vectors.mark_chunkless(conn, space, chunkless))
    if copied:

        def write_copies(conn: Connection) -> int:
            for d, chunk_rows in copied.items():
                vectors.write_document(
                    conn, space=space, content_hash=docs[d].content_hash, chunks=chunk_rows, total=totals[d]
                )
            return vectors.add_partitions(conn, space, [docs[d].content_hash for d in copied if left[d] == 0])

        report.partitions_added += store.write(write_copies)
    for d in range(len(docs)):
        if left[d] == 0:
            document_done()
    for j in range(0, len(queue), EMBED_SUB_BATCH):
        if cancel is not None and cancel.is_set():
            return False
        part = queue[j : j + EMBED_SUB_BATCH]
        texts = [docs[d].body[c.start : c.end] for d, _, c in part]
        titles: list[str | None] = [contexts[d, seq] for d, seq, _ in part]
        send = functools.partial(embedder.backend.embed, texts, "document", titles)
        embs = _surviving(f"embedding {len(part)} chunks", send, progress)
        rows: dict[int, list[vectors.ChunkVector]] = {}
        for k, (d, seq, c) in enumerate(part):
            row = vectors.ChunkVector(
                seq,
                c.start,
                c.end,
                c.start_line,
                c.end_line,
                embs.n_tokens[k],
                c.clipped or k in embs.clipped,
                embs[k],
                vectors.chunk_key(contexts[d, seq], texts[k]),
            )
            if row.clipped:
                report.truncated.append({"file": docs[d].name, "chunk": seq, "tokens": row.tokens, "limit": embs.limit})
            rows.setdefault(d, []).append(row)

        def write(conn: Connection, rows: dict[int, list[vectors.ChunkVector]] = rows) -> int:
            for d, chunk_rows in rows.items():
                vectors.write_document(
                    conn, space=space, content_hash=docs[d].content_hash, chunks=chunk_rows, total=totals[d]
                )
            # the same commit makes the documents this batch completes searchable
            done = [docs[d].content_hash for d, chunk_rows in rows.items() if left[d] == len(chunk_rows)]
            return vectors.add_partitions(conn, space, done)

        report.partitions_added += store.write(write)
        report.embedded += len(part)
        for d, chunk_rows in rows.items():
            left[d] -= len(chunk_rows)
            if left[d] == 0:
                document_done()
    return True
