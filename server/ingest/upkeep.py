"""Upkeep: what the index holds that nothing needs any more (`qmd cleanup`, `qmd doctor`),
what it holds of each collection's folder (`qmd status --files`), and the index moved
whole to another place (`qmd index copy`).

An index never lies about its corpus (seeds/001), and that includes its counts: an
edited document's old text and vectors, a deleted file's soft-deleted row, the vector
space of a model no longer configured, a collection removed from index.yml by hand, all
stay in the file (so a restored file or a model switched back costs nothing) until
`qmd cleanup` drops them. `survey` counts them without changing anything, so doctor can
show them and a test can check that cleanup leaves none.

Cleanup is one transaction for what it deletes (the index is never half-cleaned), then
the store gives the space back as its backend does (`IndexStore.compact`: on SQLite FTS5's
`optimize`, VACUUM when worth it and a truncating WAL checkpoint, so the bytes reported are
the bytes on disk; on Postgres VACUUM when asked, autovacuum otherwise).

Model-cache entries go when their model is no longer configured, or when they are older
than `CACHE_MAX_AGE_DAYS`: their keys are content hashes, so they are never wrong, but
one-off queries add entries nobody asks for again, and a hit does not refresh an entry
(a read would become a write), so an entry in daily use is recomputed once a month, the
cost of one expansion or one rerank batch.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from qmd.paths import IndexPaths
from qmd.server.config import (
    Collection,
    Config,
    ConfigFile,
    check_index_url,
    describe_url,
    is_index_url,
    server_of,
)
from qmd.server.errors import Conflict, InvalidInput, NotFound, QmdError
from qmd.server.ingest.indexer import discover
from qmd.server.models.embedders import EmbedderUnavailable
from qmd.server.models.registry import Models
from qmd.server.store import catalog, llm_cache, vectors
from qmd.server.store import copy as index_copy
from qmd.server.store.catalog import delete_orphan_content
from qmd.server.store.db import Connection, IndexStore, Vacuum, not_an_index
from qmd.server.store.sqlite import open_store
from qmd.server.text.chunking import CHUNK_STRATEGIES

CACHE_MAX_AGE_DAYS = 30

Step = Callable[[str], None]
"""Told each step as it starts (`qmd cleanup` shows them)."""


@dataclass(frozen=True)
class Configured:
    """What the configuration still uses; whatever else the index holds is an orphan."""

    collections: frozenset[str]
    fingerprints: frozenset[str] | None
    """The spaces of the configured embedder, one per chunk strategy; None when it cannot be
    resolved now (not downloaded, endpoint down): every space is kept then."""
    unresolved: str
    """Why `fingerprints` is None ("" otherwise)."""
    cache_models: tuple[str, ...] | None
    """The URIs of the models whose outputs are cached; None when the models block does not
    resolve: entries are then judged by age alone."""
    cache_days: int = CACHE_MAX_AGE_DAYS

    def cache_cutoff(self) -> str:
        return (datetime.now(UTC) - timedelta(days=self.cache_days)).isoformat()


def configured(cfg: Config, models: Models, *, embed_trusted: bool, cache_days: int = CACHE_MAX_AGE_DAYS) -> Configured:
    """What `cfg` (its usable models) uses now. The embedder is resolved without loading or
    downloading anything, as status does; when it cannot be, or a project's own embed model
    is not trusted now, its spaces are all kept (a model not downloaded yet, or an approval
    lapsed, must not cost its vectors)."""
    try:
        if not embed_trusted:
            raise EmbedderUnavailable("the project's embed model is not trusted now (run 'qmd trust')")
        emb = models.embedder(cfg)
        fingerprints: frozenset[str] | None = frozenset(emb.fingerprint_for(s) for s in CHUNK_STRATEGIES)
        unresolved = ""
    except EmbedderUnavailable as e:
        fingerprints, unresolved = None, f"vector spaces kept: {e.message}"
    try:
        resolved = models.resolved(cfg)
        cache_models: tuple[str, ...] | None = (resolved["generate"].ref.uri, resolved["rerank"].ref.uri)
    except QmdError:
        cache_models = None
    return Configured(frozenset(cfg.collections), fingerprints, unresolved, cache_models, cache_days)


@dataclass(frozen=True)
class StaleSpace:
    """A vector space of an embedder (or chunking) no longer configured."""

    fingerprint: str
    model: str
    chunks: int


@dataclass(frozen=True)
class Orphans:
    """What the index holds that nothing needs: all zero after `qmd cleanup`."""

    unconfigured_documents: int
    """Documents of collections no longer in index.yml."""
    inactive_documents: int
    """Rows of files that left the index (soft-deleted, so a restored file reuses its text)."""
    orphan_contents: int
    """Bodies no active document holds (an edited document's old version, a deleted file's)."""
    orphan_chunks: int
    """Vector chunks, in the configured embedder's spaces, of contents no active document holds."""
    stale_spaces: list[StaleSpace]
    stale_cache_entries: int
    unresolved: str = ""
    """Why spaces could not be judged (the embedder is unavailable), "" when they were."""


def _kept(conn: Connection, keep: Configured) -> tuple[list[vectors.Space], list[vectors.Space]]:
    """The index's vector spaces: (kept, stale)."""
    every = vectors.spaces(conn)
    if keep.fingerprints is None:
        return every, []
    return [s for s in every if s.fingerprint in keep.fingerprints], [
        s for s in every if s.fingerprint not in keep.fingerprints
    ]


def _chunks(conn: Connection, space: vectors.Space) -> int:
    return int(conn.execute("SELECT count(*) FROM content_vectors WHERE space_id = ?", (space.id,)).fetchone()[0])


def _unconfigured(conn: Connection, keep: Configured) -> list[str]:
    return [
        name
        for (name,) in conn.execute("SELECT DISTINCT collection FROM documents ORDER BY collection")
        if name not in keep.collections
    ]


def survey(conn: Connection, keep: Configured) -> Orphans:
    """Count what `cleanup` would drop, changing nothing. The bodies and vectors of a
    collection no longer configured count as held until its documents go (they go with them)."""
    kept, stale = _kept(conn, keep)
    names = _unconfigured(conn, keep)
    return Orphans(
        unconfigured_documents=conn.execute(
            f"SELECT count(*) FROM documents WHERE active = 1 AND collection IN ({','.join('?' * len(names))})", names
        ).fetchone()[0],
        inactive_documents=conn.execute("SELECT count(*) FROM documents WHERE active = 0").fetchone()[0],
        orphan_contents=conn.execute(
            "SELECT count(*) FROM content c WHERE NOT EXISTS"
            " (SELECT 1 FROM documents d WHERE d.hash = c.hash AND d.active = 1)"
        ).fetchone()[0],
        orphan_chunks=vectors.count_spaces(conn, kept).orphan_chunks,
        stale_spaces=[StaleSpace(s.fingerprint, s.model, _chunks(conn, s)) for s in stale],
        stale_cache_entries=llm_cache.count_stale(conn, keep.cache_models, keep.cache_cutoff()),
        unresolved=keep.unresolved,
    )


@dataclass
class CleanupReport:
    """What `qmd cleanup` found and dropped (or, with `--dry-run`, would drop)."""

    dry_run: bool
    found: Orphans
    """The orphans before: what was dropped, unless this is a dry run."""
    left: Orphans | None = None
    """The orphans after (none, unless something wrote in between); None on a dry run."""
    collections_removed: list[str] = field(default_factory=list)
    search_rows_removed: int = 0
    """Rows of the vector search tables for a collection that no longer holds their content."""
    cache_entries_removed: int = 0
    fts_optimized: bool = False
    vacuum: Vacuum | None = None
    bytes_before: int = 0
    bytes_after: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class _Dropped:
    collections: list[str]
    search_rows: int
    cache_entries: int


def _drop(conn: Connection, keep: Configured) -> _Dropped:
    """Everything `survey` counts, in one transaction (writer only)."""
    gone = _unconfigured(conn, keep)
    for name in gone:
        catalog.delete_collection(conn, name)
    conn.execute("DELETE FROM documents WHERE active = 0")
    delete_orphan_content(conn)
    kept, stale = _kept(conn, keep)
    for space in stale:
        vectors.drop_space(conn, space)
    rows = 0
    for space in kept:
        vectors.forget_hashes(conn, space, vectors.orphan_hashes(conn, space))
        rows += vectors.sync_partitions(conn, space)[1]
    cache = llm_cache.prune(conn, keep.cache_models, keep.cache_cutoff())
    return _Dropped(gone, rows, cache)


@contextmanager
def quiet(update: threading.Lock, embed: threading.Lock, wait_s: float) -> Iterator[None]:
    """Updates and embeds kept out while cleanup runs: it waits up to `wait_s` for one
    running now to finish, then refuses, saying which (a watcher's short pass is waited
    for; a long embed is not silently raced)."""
    if wait_s < 0:
        raise InvalidInput(f"--wait must be 0 or more seconds (got {wait_s:g})")
    deadline = time.monotonic() + wait_s
    for lock, job in ((update, "an update"), (embed, "an embed")):
        if not lock.acquire(timeout=max(deadline - time.monotonic(), 0)):
            if job == "an embed":
                update.release()
            raise Conflict(
                f"{job} is running, so cleanup did not start (waited {wait_s:g}s). Run 'qmd cleanup' again"
                " when it has finished, or give it longer with --wait SECONDS."
            )
    try:
        yield
    finally:
        embed.release()
        update.release()


def cleanup(
    store: IndexStore, keep: Configured, *, dry_run: bool = False, vacuum: bool | None = None, step: Step | None = None
) -> CleanupReport:
    """Drop what `survey` counts, optimize FTS, VACUUM when worth it. The caller keeps
    updates and embeds out meanwhile (`quiet`)."""
    t0 = time.monotonic()
    say = step or (lambda _: None)
    with store.read() as conn:
        found = survey(conn, keep)
    report = CleanupReport(dry_run=dry_run, found=found, bytes_before=store.size_bytes())
    if dry_run:
        report.bytes_after = report.bytes_before
        report.seconds = time.monotonic() - t0
        return report
    say("dropping orphans")
    dropped = store.write(functools.partial(_drop, keep=keep))
    report.collections_removed = dropped.collections
    report.search_rows_removed = dropped.search_rows
    report.cache_entries_removed = dropped.cache_entries
    report.vacuum, report.fts_optimized = store.compact(vacuum, say)
    with store.read() as conn:
        report.left = survey(conn, keep)
    report.bytes_after = store.size_bytes()
    report.seconds = time.monotonic() - t0
    return report


# -- coverage -----------------------------------------------------------------

FileStateName = Literal["indexed", "changed", "new", "missing", "skipped", "failed"]

FAILURES = (
    "unreadable",
    "vanished",
    "folder could not be listed",
    "dangling symlink",
    "PDF could not be read",
    "HTML could not be read",
    "encrypted PDF",
)
"""Skip reasons that mean the file could not be read, as opposed to one a rule leaves out
(too large, binary, empty, outside the collection): `failed` in the coverage report."""


@dataclass(frozen=True)
class FileState:
    path: str
    state: FileStateName
    """indexed (as on disk); changed (on disk since the last update), new (not indexed yet),
    missing (indexed, gone from disk): the next update fixes these; skipped, failed (why in `reason`)."""
    reason: str = ""
    pending_vectors: bool = False
    clipped_chunks: int = 0
    """Chunks longer than the embedder reads: their vectors see only the opening."""
    metadata_error: str = ""


@dataclass(frozen=True)
class Coverage:
    """One collection: what its folder holds against what the index holds (seed 001's names)."""

    collection: str
    path: str
    discovered: int
    """Files the folder holds that the mask takes (a walk now)."""
    indexed: int
    """Active documents."""
    skipped: int
    failed: int
    pending_update: int
    """Changed, new and missing files: what the next `qmd update` changes."""
    pending_vectors: int
    clipped: int
    """Files with a chunk embedded clipped."""
    metadata_errors: int
    root_missing: bool
    files: list[FileState]
    vectors_note: str = ""
    """Why every file counts as pending vectors (no embedder), "" otherwise."""


@dataclass(frozen=True)
class _Doc:
    path: str
    hash: str
    size: int
    mtime_ns: int
    meta_error: str


def coverage(store: IndexStore, coll: Collection, space: vectors.Space | None, vectors_note: str = "") -> Coverage:
    """The collection's folder walked now, against its documents, its recorded skips and
    its vectors in `space` (the configured embedder's space for its chunk strategy; None
    when there is none yet: everything is pending vectors)."""
    walk = discover(coll)
    with store.read() as conn:
        docs = {
            r[0]: _Doc(r[0], r[1], r[2], r[3], r[4] or "")
            for r in conn.execute(
                "SELECT path, hash, size, mtime_ns, CASE WHEN meta_state = 2 THEN meta_error END FROM documents"
                " WHERE collection = ? AND active = 1",
                (coll.name,),
            )
        }
        recorded = dict(
            conn.execute("SELECT path, reason FROM skipped_files WHERE collection = ?", (coll.name,)).fetchall()
        )
        pending = vectors.pending_hashes(conn, space, [coll.name])
        clipped: dict[str, int] = (
            dict(
                conn.execute(
                    "SELECT hash, count(*) FROM content_vectors WHERE space_id = ? AND clipped = 1 GROUP BY hash",
                    (space.id,),
                ).fetchall()
            )
            if space
            else {}
        )
    reasons = {**recorded, **dict(walk.skipped)}
    on_disk = {f.rel: f for f in walk.files}
    states: list[FileState] = []
    for path in sorted(on_disk.keys() | docs.keys() | reasons.keys()):
        doc, found = docs.get(path), on_disk.get(path)
        if path in reasons:
            kind: FileStateName = "failed" if reasons[path].startswith(FAILURES) else "skipped"
            states.append(FileState(path, kind, reasons[path]))
            continue
        assert doc is not None or found is not None
        if doc is None:
            states.append(FileState(path, "new"))
            continue
        if found is None:
            state: FileStateName = "indexed" if walk.root_missing or not walk.files else "missing"
        else:
            state = "indexed" if (found.size, found.mtime_ns) == (doc.size, doc.mtime_ns) else "changed"
        states.append(
            FileState(
                path,
                state,
                pending_vectors=doc.hash in pending,
                clipped_chunks=clipped.get(doc.hash, 0),
                metadata_error=doc.meta_error,
            )
        )
    return Coverage(
        collection=coll.name,
        path=str(coll.root),
        discovered=len(walk.files),
        indexed=len(docs),
        skipped=sum(s.state == "skipped" for s in states),
        failed=sum(s.state == "failed" for s in states),
        pending_update=sum(s.state in ("changed", "new", "missing") for s in states),
        pending_vectors=sum(s.pending_vectors for s in states),
        clipped=sum(s.clipped_chunks > 0 for s in states),
        metadata_errors=sum(bool(s.metadata_error) for s in states),
        root_missing=walk.root_missing,
        files=states,
        vectors_note=vectors_note,
    )


# -- copy ---------------------------------------------------------------------


def index_at(spec: str) -> str:
    """Where `spec` (an index name, a SQLite file, a ``postgresql://`` URL) keeps its index:
    the URL, or the file's absolute path. A name's config may give its server."""
    if "://" in spec:  # a Postgres URL, or a clear error (never a file named "mysql:")
        return check_index_url(spec, f"{spec!r}: an index given by URL")
    if "/" in spec or spec.endswith((".sqlite", ".db")):
        return str(Path(spec).expanduser().resolve())
    paths = IndexPaths.resolve(spec)
    url = server_of(paths.name, ConfigFile(paths.config).load().index_url if paths.config.exists() else None)
    return url or str(paths.db)


def copy_ends(here: str, source: str, destination: str) -> tuple[str, str]:
    """`qmd index copy`'s source and destination as `index_at` finds them, checked before
    anything waits: two different indexes, the source there, and never `here` (the index
    this daemon serves) as the destination."""
    src, dst = index_at(source), index_at(destination)
    # compared as described (no password), so one server named with and without it is one index
    if describe_url(src) == describe_url(dst):
        raise InvalidInput(f"the source and the destination are the same index ({describe_url(src)})")
    if describe_url(dst) == describe_url(here):
        raise Conflict(
            f"{describe_url(dst)} is the index this daemon serves, so it cannot be copied into:"
            " copy into another, then point the config at it (index_url) and restart the daemon"
        )
    if not is_index_url(src) and not Path(src).exists():
        raise NotFound(f"there is no index at {src}")
    if not is_index_url(src) and (why := not_an_index(Path(src))) is not None:
        raise InvalidInput(f"{src} is not a qmd index ({why}): nothing was copied, and it was not changed")
    return src, dst


def copy(
    store: IndexStore,
    src: str,
    dst: str,
    *,
    replace: bool = False,
    progress: index_copy.Progress | None = None,
    cancel: threading.Event | None = None,
) -> index_copy.CopyReport:
    """The index at `src` into `dst` (`copy_ends`' answers): `store` itself when it is the
    source, else that index opened for the copy only."""
    if describe_url(src) == describe_url(store.location):
        return index_copy.copy_index(store, dst, replace=replace, progress=progress, cancel=cancel)
    source = open_store(Path(src), src if is_index_url(src) else None)
    try:
        return index_copy.copy_index(source, dst, replace=replace, progress=progress, cancel=cancel)
    finally:
        source.close()
