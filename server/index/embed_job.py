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

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from qmd.server.index import vectors
from qmd.server.index.chunking import Chunk
from qmd.server.index.db import sqlite3
from qmd.server.index.store import Store
from qmd.server.models.embedders import Embedder

Progress = Callable[[dict], None]
EMBED_SUB_BATCH = 32
"""Texts per embed request to the backend: chunks of as many documents as fill it, so an embedder
with parallel contexts (QMD_EMBED_PARALLELISM) embeds several small documents at once."""


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
    embedder: Embedder,
    *,
    collections: list[str] | None,
    force: bool = False,
    max_docs_per_batch: int = 64,
    max_batch_bytes: int = 4 * 1024 * 1024,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> EmbedReport:
    """Embed what the embedder's space lacks."""
    t0 = time.monotonic()
    report = EmbedReport(model=embedder.model_name, fingerprint=embedder.fingerprint)

    def prepare(conn: sqlite3.Connection) -> vectors.Space:
        old = vectors.find_space(conn, embedder.fingerprint)
        if force and old and collections:  # only the named collections' contents start over
            vectors.forget_hashes(conn, old, vectors.pending_hashes(conn, None, collections))
        elif force and old:
            vectors.drop_space(conn, old)
        return vectors.ensure_space(conn, embedder.fingerprint, embedder.model_name, embedder.dims)

    space = store.write(prepare)
    with store.read() as conn:
        pending = sorted(vectors.pending_hashes(conn, space, collections))
    report.pending_before = len(pending)
    done_docs = 0

    def document_done() -> None:
        nonlocal done_docs
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

    i = 0
    while i < len(pending):
        if cancel is not None and cancel.is_set():
            report.cancelled = True
            break
        batch: list[tuple[str, str, str, str]] = []  # (content hash, body, title, collection/path)
        size = 0
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

        if not _embed_documents(store, embedder, space, batch, report, cancel, document_done):
            report.cancelled = True
            break
    # what moved since its batch was written: documents removed, renamed across collections or copied
    added, removed = store.write(lambda conn: vectors.sync_partitions(conn, space))
    report.partitions_added += added
    report.partitions_removed = removed
    with store.read() as conn:
        report.pending_after = len(vectors.pending_hashes(conn, space, collections))
    report.seconds = time.monotonic() - t0
    return report


def _embed_documents(
    store: Store,
    embedder: Embedder,
    space: vectors.Space,
    docs: list[tuple[str, str, str, str]],
    report: EmbedReport,
    cancel: threading.Event | None,
    document_done: Callable[[], None],
) -> bool:
    """Chunk each (content hash, body, title, name), then embed the chunks without a vector
    `EMBED_SUB_BATCH` at a time across documents; each request's rows are committed together.
    `document_done` is called as each document's last chunk is written. False if cancelled."""
    queue: list[tuple[int, int, Chunk]] = []  # (document, seq, chunk)
    totals: list[int] = []
    left: list[int] = []
    for d, (content_hash, body, _title, _name) in enumerate(docs):
        chunks = embedder.backend.chunk(body, embedder.chunk_tokens)
        with store.read() as conn:
            have = {
                r[0]
                for r in conn.execute(
                    "SELECT seq FROM content_vectors WHERE space_id = ? AND hash = ?", (space.id, content_hash)
                )
            }
        todo = [(d, seq, c) for seq, c in enumerate(chunks) if seq not in have]
        queue += todo
        totals.append(len(chunks))
        left.append(len(todo))
        if not todo:
            document_done()
    for j in range(0, len(queue), EMBED_SUB_BATCH):
        if cancel is not None and cancel.is_set():
            return False
        part = queue[j : j + EMBED_SUB_BATCH]
        texts = [docs[d][1][c.start : c.end] for d, _, c in part]
        embs = embedder.backend.embed(texts, "document", [docs[d][2] for d, _, _ in part])
        rows: dict[int, list[vectors.ChunkVector]] = {}
        for k, (d, seq, c) in enumerate(part):
            row = vectors.ChunkVector(
                seq, c.start, c.end, c.start_line, c.end_line, embs.n_tokens[k], c.clipped or k in embs.clipped, embs[k]
            )
            if row.clipped:
                report.clipped.append({"file": docs[d][3], "chunk": seq, "tokens": row.tokens, "limit": embs.limit})
            rows.setdefault(d, []).append(row)

        def write(conn: sqlite3.Connection, rows: dict[int, list[vectors.ChunkVector]] = rows) -> int:
            for d, chunk_rows in rows.items():
                vectors.write_document(conn, space=space, content_hash=docs[d][0], chunks=chunk_rows, total=totals[d])
            # the same commit makes the documents this batch completes searchable
            done = [docs[d][0] for d, chunk_rows in rows.items() if left[d] == len(chunk_rows)]
            return vectors.add_partitions(conn, space, done)

        report.partitions_added += store.write(write)
        report.chunks += len(part)
        for d, chunk_rows in rows.items():
            left[d] -= len(chunk_rows)
            if left[d] == 0:
                document_done()
    return True
