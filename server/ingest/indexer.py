"""Files → index: discovery, incremental re-indexing, update hooks.

An index must never lie about its corpus (seeds/001): a deleted file leaves the
index, an emptied or now-binary file stops matching, and an empty walk (a typo'd
path, an unmounted disk, a mask that matches nothing) never prunes. Work is
incremental: a file whose size and mtime are unchanged is not even read.

Reading and hashing run on the calling thread while the previous batch is being
written by the store's writer thread, so disk I/O and FTS indexing overlap.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Set
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Literal, TypeAlias

from wcmatch import glob as wglob

from qmd.paths import file_kind
from qmd.server.config import Collection
from qmd.server.errors import HookFailed
from qmd.server.ingest import loaders, sandbox
from qmd.server.store import metadata, vectors
from qmd.server.store.catalog import delete_orphan_content
from qmd.server.store.db import Connection, IndexStore
from qmd.server.store.fts import FtsDoc, counted_after, fts_delete, fts_put
from qmd.server.store.sqlite import utcnow
from qmd.server.text import frontmatter

BUILTIN_EXCLUDED_DIRS = frozenset({"node_modules", ".git", ".cache", "vendor", "dist", "build"})
GLOB_FLAGS = wglob.GLOBSTAR | wglob.BRACE | wglob.EXTGLOB
DEFAULT_MAX_FILE_BYTES = 128 * 1024 * 1024
BATCH_FILES = 400
BATCH_BYTES = 16 * 1024 * 1024
HOOK_TIMEOUT_S = 600

Progress = Callable[[dict], None]


def max_file_bytes() -> int:
    raw = os.environ.get("QMD_MAX_FILE_BYTES", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_MAX_FILE_BYTES


def split_mask(mask: str) -> list[str]:
    """Split on commas outside `{...}` and `[...]` (spec §6.1): `a.md,*.txt` is two globs."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in mask:
        if ch in "{[":
            depth += 1
        elif ch in "}]" and depth:
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


# -- pacing ---------------------------------------------------------------------


class Cancelled(Exception):
    """A paced walk or pass stopped by its `cancel` event (the daemon shutting down)."""


class Pace:
    """Background work (the watcher's polls and sweeps) in short slices, each followed by a
    rest, so that a tree of millions of files takes at most `share` of a core and the GIL,
    and `/health`, searches and status answer between slices; `cancel` stops it at the next
    step, not at the end of the walk."""

    def __init__(self, cancel: threading.Event, slice_s: float = 0.02, share: float = 0.25) -> None:
        self.cancel = cancel
        self.slice_s = slice_s
        self.rest_factor = 1 / share - 1
        self.started = time.monotonic()

    def step(self) -> None:
        """One unit of work is done: rest if the slice is used up; raise Cancelled once asked to stop."""
        if self.cancel.is_set():
            raise Cancelled
        worked = time.monotonic() - self.started
        if worked < self.slice_s:
            return
        if self.cancel.wait(worked * self.rest_factor):
            raise Cancelled
        self.started = time.monotonic()


# -- discovery ----------------------------------------------------------------


@dataclass(frozen=True)
class Found:
    rel: str
    """The path in the index: as on disk, or `display_rel`'s form of a name that is not UTF-8."""
    abs: str
    """The path on disk (a name that is not UTF-8 in `os.fsdecode`'s surrogate escapes)."""
    size: int
    mtime_ns: int
    link: bool = False
    """Listed as a symlink (resolving inside the root): the only kind of file opened through a link."""


_ESCAPED = re.compile("[\udc80-\udcff]")


def display_rel(rel: str) -> str:
    """`rel` as the index keeps it. A name that is not UTF-8 (a Latin-1 `caf\xe9.md` from an
    old archive) reaches Python with each bad byte as a lone surrogate, which SQLite, JSON
    and a terminal all refuse; each such byte becomes `%XX` (`caf%E9.md`), so the name is
    displayable, `qmd get` finds it by what it shows, and the walk can tell two apart
    (`discover` skips a name whose form is another file's). A UTF-8 name is unchanged."""
    return _ESCAPED.sub(lambda m: f"%{ord(m.group()) - 0xDC00:02X}", rel)


@dataclass
class Walk:
    files: list[Found] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    root_missing: bool = False
    # Folders (relative) that exist but could not be listed: their indexed documents
    # are kept, as an unreadable file's are, not pruned as deleted. ("" is the root,
    # whose failure leaves the walk empty, which never prunes anyway.)
    unlisted: list[str] = field(default_factory=list)


def _no_step() -> None:
    """An unpaced walk's step: nothing to wait for."""


def _inside(real: str, real_root: str) -> bool:
    """True if the resolved `real` is the root or below it (also for a root of `/`)."""
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


class Rules:
    """Which paths of a collection are its files: its mask and ignore globs, dot-names
    and the built-in folders never entered. Discovery and the watcher (`watcher`) ask
    the same object, so a path the watcher reacts to is one `qmd update` would index."""

    def __init__(self, coll: Collection) -> None:
        self.include = wglob.compile(split_mask(coll.pattern) or ["**/*.md"], flags=GLOB_FLAGS)
        self.ignore = wglob.compile(list(coll.ignore), flags=GLOB_FLAGS) if coll.ignore else None

    @staticmethod
    def enters(dirname: str) -> bool:
        """A folder discovery walks into (dot-folders and `BUILTIN_EXCLUDED_DIRS` are pruned)."""
        return not dirname.startswith(".") and dirname not in BUILTIN_EXCLUDED_DIRS

    def wants(self, rel: str) -> bool:
        """A file (collection-relative, `/`-separated) the mask takes and no ignore glob drops."""
        if rel.rsplit("/", 1)[-1].startswith("."):
            return False
        return bool(self.include.match(rel)) and not (self.ignore is not None and self.ignore.match(rel))

    def reachable(self, rel: str) -> bool:
        """Whether the walk can get to `rel` at all: no dot-name anywhere on it and no
        pruned folder above it."""
        parts = rel.split("/")
        return all(self.enters(p) for p in parts[:-1]) and not parts[-1].startswith(".")


@dataclass(frozen=True)
class Scope:
    """The paths one pass covers (the watcher's changed files and folders): a path is
    covered when it is one of them or lies below one."""

    paths: frozenset[str]
    """As the index names them (`display_rel`)."""
    disk: Mapping[str, str] = field(default_factory=dict)
    """Each of `paths` as on disk, where that differs."""

    @classmethod
    def of(cls, rels: Iterable[str]) -> Scope:
        """`rels` (as on disk) without those below another (a folder's walk finds them)."""
        kept: dict[str, str] = {}
        for rel in sorted(set(rels), key=lambda r: r.count("/")):
            shown = display_rel(rel)
            if not _within(shown, kept.keys()):
                kept[shown] = rel
        return cls(frozenset(kept), {shown: rel for shown, rel in kept.items() if shown != rel})

    def covers(self, rel: str) -> bool:
        return _within(rel, self.paths)


def _within(rel: str, paths: Set[str]) -> bool:
    """`rel` is one of `paths` or lies below one."""
    parts = rel.split("/")
    return any("/".join(parts[:n]) in paths for n in range(1, len(parts) + 1))


def discover(coll: Collection, scope: Scope | None = None, pace: Pace | None = None) -> Walk:
    """List the collection's files (those in `scope` only, when given): masks and ignores
    applied, dot- and built-in folders pruned, symlinked folders not followed, file
    symlinks kept only when they resolve inside the root. With `pace`, a step per entry."""
    step = pace.step if pace is not None else _no_step
    walk = Walk()
    root = coll.root
    if not root.is_dir():
        walk.root_missing = True
        return walk
    real_root = os.path.realpath(root)
    rules = Rules(coll)

    shown: set[str] = set()

    def unlistable(err: OSError) -> None:
        rel = display_rel(os.path.relpath(err.filename or root, root).replace(os.sep, "/"))
        rel = "" if rel == "." else rel
        walk.unlisted.append(rel)
        walk.skipped.append(
            (rel or ".", f"folder could not be listed ({err.strerror or err}); its indexed files are kept")
        )

    def consider(on_disk: str, abs_path: str) -> None:
        step()
        if not rules.wants(on_disk):
            return
        rel = display_rel(on_disk)
        if rel in shown:
            walk.skipped.append((rel, f"its name is not UTF-8 and shows as {rel}, another file's name: rename one"))
            return
        shown.add(rel)
        try:
            st = os.lstat(abs_path)
        except OSError as e:
            walk.skipped.append((rel, f"unreadable ({e.strerror or e})"))
            return
        # Folders are never followed, so only a file symlink can lead outside the root.
        link = stat.S_ISLNK(st.st_mode)
        if link:
            if not _inside(os.path.realpath(abs_path), real_root):
                walk.skipped.append((rel, "outside the collection (symlink)"))
                return
            try:
                st = os.stat(abs_path)
            except OSError as e:
                walk.skipped.append((rel, f"dangling symlink ({e.strerror or e})"))
                return
        if stat.S_ISREG(st.st_mode):
            walk.files.append(Found(rel, abs_path, st.st_size, st.st_mtime_ns, link))
        elif not stat.S_ISDIR(st.st_mode):
            walk.skipped.append((rel, f"{file_kind(st.st_mode)}, not a regular file: never read"))

    def tree(top: str) -> None:
        for dirpath, dirnames, filenames in os.walk(top, onerror=unlistable, followlinks=False):
            step()
            dirnames[:] = sorted(d for d in dirnames if rules.enters(d))
            reldir = os.path.relpath(dirpath, root)
            reldir = "" if reldir == "." else reldir.replace(os.sep, "/") + "/"
            for fname in sorted(filenames):
                consider(reldir + fname, os.path.join(dirpath, fname))

    if scope is None:
        tree(str(root))
        return walk
    for rel in sorted(scope.disk.get(p, p) for p in scope.paths):
        if not rules.reachable(rel):
            continue
        abs_path = os.path.join(root, *rel.split("/"))
        parent = os.path.dirname(abs_path)
        # Below a symlinked folder (which the walk never follows) the parent resolves elsewhere.
        if os.path.realpath(parent) != os.path.join(real_root, *rel.split("/")[:-1]):
            continue
        try:
            is_dir = stat.S_ISDIR(os.lstat(abs_path).st_mode)
        except FileNotFoundError:
            continue  # gone: its documents leave the index
        except OSError as e:
            walk.unlisted.append(display_rel(rel))
            walk.skipped.append((display_rel(rel), f"unreadable ({e.strerror or e}); its indexed files are kept"))
            continue
        if is_dir:
            if rules.enters(rel.rsplit("/", 1)[-1]):
                tree(abs_path)
        else:
            consider(rel, abs_path)
    return walk


# -- reading --------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    found: Found
    text: str
    hash: str
    title: str
    nbytes: int
    meta: frontmatter.Extracted
    loader: str
    """The loader that read it (`loaders.Loader.name`), for the run's report."""


# One write `_apply` makes: deactivate a document id; record a new size and mtime for a
# document whose content is unchanged; add a new file; rewrite a known document.
_Op: TypeAlias = (
    tuple[Literal["deactivate"], int]
    | tuple[Literal["stat"], tuple[int, Found]]
    | tuple[Literal["insert"], Loaded]
    | tuple[Literal["update"], tuple[int, Loaded]]
)


class Skip(Exception):
    """A file that cannot be indexed; `keep` means its previous version stays."""

    def __init__(self, reason: str, *, keep: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.keep = keep


def load_file(found: Found, limit: int) -> Loaded:
    """Read, hash and load one file through its extension's loader. Files that cannot be
    searched as text (too large, binary, not UTF-8, blank, a PDF without text) raise
    `Skip` with the loader's reason, so they leave the index instead of matching on
    stale text; only a file that could not be read keeps its previous version. HTML and
    PDF are parsed in a child process, within a budget (`sandbox`)."""
    if found.size > limit:
        raise Skip(f"too large ({found.size} bytes > {limit}; raise QMD_MAX_FILE_BYTES)")
    found, data = _read_bytes(found, limit)
    loader = loaders.loader_for(found.rel)
    try:
        extracted = sandbox.POOL.load(loader, found.rel, data) if loader.isolated else loader.read(found.rel, data)
    except loaders.LoadError as e:
        raise Skip(e.reason) from e
    return Loaded(
        found,
        extracted.text,
        loader.content_key(data),
        extracted.title,
        len(data),
        frontmatter.extract(found.rel, extracted.text),
        loader.name,
    )


def _read_bytes(found: Found, limit: int) -> tuple[Found, bytes]:
    """The file's bytes, and its size and mtime as read. The file may have changed since
    it was listed: it is opened without blocking (a FIFO put in its place would wait for
    a writer forever) and without following a link it was not listed as, then checked as
    opened (`fstat`), so a FIFO, device or folder is a skip, not a hang."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if found.link else os.O_NOFOLLOW)
    try:
        fd = os.open(found.abs, flags)
    except FileNotFoundError as e:
        raise Skip("vanished while being indexed", keep=True) from e
    except OSError as e:
        if e.errno == errno.ELOOP and not found.link:
            raise Skip("unreadable (a symlink since it was listed: never followed)", keep=True) from e
        raise Skip(f"unreadable ({e.strerror or e})", keep=True) from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Skip(f"{file_kind(st.st_mode)} since it was listed, not a regular file: never read")
        with open(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    except OSError as e:
        raise Skip(f"unreadable ({e.strerror or e})", keep=True) from e
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Skip(f"too large (> {limit} bytes; raise QMD_MAX_FILE_BYTES)")
    return replace(found, size=st.st_size, mtime_ns=st.st_mtime_ns), data


# -- one collection -------------------------------------------------------------


@dataclass(frozen=True)
class SkipStat:
    """A file skipped for what it holds, as it was then: while its size and mtime stay these,
    it is not read again (a PDF that took its whole parse budget to be skipped would
    otherwise cost that on every `qmd update` and every watcher sweep). Kept with its row
    in `skipped_files`, so a restarted daemon remembers it too."""

    size: int
    mtime_ns: int
    remembered: bool
    """Skipped again without a read: its row keeps the time the skip was decided."""


@dataclass
class Summary:
    collection: str
    indexed: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    orphans_cleaned: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    files: int = 0
    bytes_read: int = 0
    metadata_extracted: int = 0
    """Unchanged documents whose metadata was extracted for the first time."""
    loaded: dict[str, int] = field(default_factory=dict)
    """Files read this run (new or changed), per loader (seed 001: what each loader did;
    what each could not read is in `skipped`, with its reason)."""
    skip_stats: dict[str, SkipStat] = field(default_factory=dict)
    """Of `skipped`, the files skipped for what they hold, as they were (the rest carry none)."""

    @property
    def remembered(self) -> int:
        """Skipped files not read again, unchanged since their skip."""
        return sum(s.remembered for s in self.skip_stats.values())

    def line(self) -> str:
        return (
            f"Indexed: {self.indexed} new, {self.updated} updated, {self.unchanged} unchanged, {self.removed} removed"
        )


@dataclass(frozen=True)
class _Existing:
    id: int
    hash: str
    size: int
    mtime_ns: int
    title: str
    active: bool


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat(timespec="seconds")


def _deactivate(conn: Connection, ids: list[int]) -> None:
    """A document leaves the index: its keyword rows and metadata go, and its metadata
    turns pending (NULL), so a document holds metadata rows only while active and
    extracted, and when its file comes back the update that reactivates it extracts
    them again (`metadata.store`)."""
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        marks = ",".join("?" * len(chunk))
        conn.execute(f"DELETE FROM document_metadata WHERE doc_id IN ({marks})", chunk)
        conn.execute(
            f"UPDATE documents SET active = 0, meta_state = NULL, meta_error = NULL WHERE id IN ({marks})", chunk
        )
    fts_delete(conn, ids)


def run_hook(coll: Collection) -> str:
    """Run the collection's `update` command in its folder; raise HookFailed on non-zero."""
    assert coll.update
    try:
        proc = subprocess.run(
            ["bash", "-c", coll.update],
            cwd=coll.root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=HOOK_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HookFailed(f"Update command for '{coll.name}' could not run: {e}", collection=coll.name) from e
    output = (proc.stdout or "") + (proc.stderr or "")
    if proc.returncode != 0:
        # A signal death is a negative returncode here; report it as a shell does (128+N)
        # so the CLI's own exit status stays meaningful.
        code = proc.returncode if proc.returncode > 0 else 128 - proc.returncode
        how = f"exit code {code}" if proc.returncode > 0 else f"signal {-proc.returncode} (exit code {code})"
        raise HookFailed(
            f"Update command for '{coll.name}' failed with {how}: {coll.update}",
            collection=coll.name,
            exit_code=code,
            output=output,
        )
    return output


def _existing(store: IndexStore, collection: str, scope: Scope | None) -> tuple[dict[str, _Existing], int]:
    """The collection's document rows (those `scope` covers, when given) by path, and how
    many of all its documents are active."""
    select = "SELECT id, path, hash, size, mtime_ns, title, active FROM documents WHERE collection = ?"
    with store.read() as conn:
        if scope is None:
            rows = conn.execute(select, (collection,)).fetchall()
        else:
            # Each path's range in the (collection, path) index: the path itself and all below
            # it ('/' sorts just before '0'), and a few neighbours (`a-b` for `a`) the filter drops.
            rows = [
                r
                for p in sorted(scope.paths)
                for r in conn.execute(select + " AND path >= ? AND path < ?", (collection, p, p + "0"))
                if scope.covers(r["path"])
            ]
        active = conn.execute(
            "SELECT COUNT(*) FROM documents WHERE collection = ? AND active = 1", (collection,)
        ).fetchone()[0]
    existing = {
        r["path"]: _Existing(r["id"], r["hash"], r["size"], r["mtime_ns"], r["title"], bool(r["active"])) for r in rows
    }
    return existing, active


# -- one pass: the plan ---------------------------------------------------------

# How a walked file stands against its document row: only "unchanged" (the size and mtime
# of an active row) is settled without reading the file; what a read file's content says
# decides its write (`_write_for`).
_Kind: TypeAlias = Literal["new", "returning", "changed", "unchanged"]


@dataclass(frozen=True)
class _Planned:
    """A walked file and its document row, if it has one."""

    found: Found
    old: _Existing | None

    @property
    def kind(self) -> _Kind:
        """New (no row), returning (its row had left the index), unchanged or changed on disk."""
        if self.old is None:
            return "new"
        if not self.old.active:
            return "returning"
        if self.old.size == self.found.size and self.old.mtime_ns == self.found.mtime_ns:
            return "unchanged"
        return "changed"


@dataclass(frozen=True)
class _Plan:
    """What one pass must do, decided from the walk and the index's rows before any file is
    read, so that applying it only reads, writes and counts."""

    files: list[_Planned]
    """Every walked file, in walk order: progress and batch boundaries follow it."""
    deleted: list[int]
    """Active rows whose file is gone (those below a folder that could not be listed stay)."""
    skipped: list[tuple[str, str]]
    """What the walk passed over, with why."""
    empty_walk: str | None
    """The warning to give instead of pruning, when the walk found nothing."""
    rewalk: bool
    """A scoped pass that would deactivate every active document: a full walk decides instead."""


def _plan(store: IndexStore, coll: Collection, scope: Scope | None, walk: Walk) -> _Plan:
    """Set what the walk of the collection (or the scope) found against the index's rows."""
    existing, active = _existing(store, coll.name, scope)
    seen = {f.rel for f in walk.files}
    unlisted = frozenset(walk.unlisted)
    deleted = [e.id for p, e in existing.items() if e.active and p not in seen and not _within(p, unlisted)]
    return _Plan(
        files=[_Planned(f, existing.get(f.rel)) for f in walk.files],
        deleted=deleted,
        skipped=walk.skipped,
        empty_walk=_empty_walk_warning(coll, walk, scope, active),
        rewalk=scope is not None and not walk.files and bool(deleted) and len(deleted) >= active,
    )


def _empty_walk_warning(coll: Collection, walk: Walk, scope: Scope | None, active: int) -> str | None:
    """Why a walk found nothing, when that must prune nothing: a typo'd path, an unmounted
    disk or a mask that matches nothing never empties the index. A scoped walk that finds
    nothing is a deletion, unless the root itself is gone."""
    if walk.files or (scope is not None and not walk.root_missing):
        return None
    if walk.root_missing:
        why = f"the folder {coll.root} is missing or not a directory"
    elif walk.skipped:
        why = f"nothing under {coll.root} could be indexed ({len(walk.skipped)} skipped)"
    else:
        why = f"no file matches '{coll.pattern}' under {coll.root}"
    if not active:
        return why
    return (
        f"{why}; keeping its {active} indexed document(s) — an empty walk never prunes. "
        f"If the files are really gone, run 'qmd collection remove {coll.name}'."
    )


# -- one pass: applying the plan ---------------------------------------------------


def index_collection(
    store: IndexStore,
    coll: Collection,
    progress: Progress | None = None,
    scope: Scope | None = None,
    *,
    pace: Pace | None = None,
    walk: Walk | None = None,
) -> Summary:
    """Bring the index in line with the collection's files on disk: all of them, or only
    the paths `scope` covers (the watcher's pass over what changed). A scoped pass that
    would leave the collection without a document walks all of it instead, so the
    empty-walk rule decides, as for `qmd update`. Two steps: plan from the walk (`walk`,
    when the caller walked already, outside its locks) and the rows, then apply (read,
    write, prune, record the run). A pass `pace` cancels stops between files: what it wrote
    stays, and it prunes nothing."""
    t0 = time.monotonic()
    plan = _plan(store, coll, scope, walk if walk is not None else discover(coll, scope, pace))
    summary = Summary(coll.name, skipped=list(plan.skipped), files=len(plan.files))
    if plan.empty_walk is not None:
        summary.warnings.append(plan.empty_walk)
    else:
        tick = _ticker(progress, coll.name, len(plan.files), t0)
        with counted_after(store, sum(item.kind != "unchanged" for item in plan.files)):
            _write_files(store, coll.name, plan, summary, tick, pace.step if pace is not None else _no_step)
        # Before a rewalk too, as the scoped pass always did.
        summary.metadata_extracted = _extract_pending(store, coll.name)
        if plan.rewalk:
            return index_collection(store, coll, progress, pace=pace)
        summary.removed += len(plan.deleted)
        summary.orphans_cleaned = store.write(partial(_finish, gone=plan.deleted))
    summary.seconds = time.monotonic() - t0
    _record_run(store, summary, walk_empty=plan.empty_walk is not None, scope=scope)
    store.merge_keyword_segments(summary.indexed + summary.updated + summary.removed)
    return summary


def _write_files(
    store: IndexStore,
    collection: str,
    plan: _Plan,
    summary: Summary,
    tick: Callable[[int], None],
    step: Callable[[], None],
) -> None:
    """Apply the plan to its files: unchanged ones are only counted, the others are read
    and their writes queued; returns (or is cancelled by `step`) once every write queued
    is committed."""
    batches = _Batches(store, collection)
    limit = max_file_bytes()
    skips = _recorded_skips(store, collection)
    try:
        for done, item in enumerate(plan.files, 1):
            step()
            if item.kind == "unchanged":
                summary.unchanged += 1
            else:
                _read(item, limit, batches, summary, skips)
            tick(done)
    finally:
        batches.drain()


def _recorded_skips(store: IndexStore, collection: str) -> dict[tuple[str, int, int], str]:
    """The reasons of the collection's recorded skips that carry a size and mtime, by
    (path, size, mtime)."""
    with store.read() as conn:
        rows = conn.execute(
            "SELECT path, size, mtime_ns, reason FROM skipped_files"
            " WHERE collection = ? AND size IS NOT NULL AND mtime_ns IS NOT NULL",
            (collection,),
        ).fetchall()
    return {(path, size, mtime_ns): reason for path, size, mtime_ns, reason in rows}


def _read(
    item: _Planned, limit: int, batches: _Batches, summary: Summary, skips: Mapping[tuple[str, int, int], str]
) -> None:
    """Load a file its stat could not clear and queue the write its content calls for. A
    file that cannot be indexed is a skip and leaves the index, unless it merely could not
    be read: then its previous version stays. One skipped before as it is now is not read."""
    found = item.found
    remembered = skips.get((found.rel, found.size, found.mtime_ns))
    try:
        if remembered is not None:
            raise Skip(remembered)
        loaded = load_file(found, limit)
    except Skip as s:
        summary.skipped.append((found.rel, s.reason))
        if not s.keep:
            summary.skip_stats[found.rel] = SkipStat(found.size, found.mtime_ns, remembered is not None)
            if item.old is not None and item.old.active:
                summary.removed += 1
                batches.add(("deactivate", item.old.id))
        return
    summary.loaded[loaded.loader] = summary.loaded.get(loaded.loader, 0) + 1
    summary.bytes_read += loaded.nbytes
    batches.add(_write_for(item, loaded, summary), loaded.nbytes)


def _write_for(item: _Planned, loaded: Loaded, summary: Summary) -> _Op:
    """The write a read file calls for, counted. A file whose content and title are those
    of its row records only its new size and mtime, keeping its chunks and vectors."""
    old = item.old
    if old is None:
        summary.indexed += 1
        return ("insert", loaded)
    if item.kind == "returning":
        summary.indexed += 1
    elif old.hash == loaded.hash and old.title == loaded.title:
        summary.unchanged += 1
        return ("stat", (old.id, loaded.found))
    else:
        summary.updated += 1
    return ("update", (old.id, loaded))


class _Batches:
    """A pass's writes, one transaction per `BATCH_FILES` files or `BATCH_BYTES` read. Each
    batch goes to the store's writer thread while the next is read, so disk I/O and FTS
    indexing overlap; waiting for all but the newest bounds the memory held."""

    def __init__(self, store: IndexStore, collection: str) -> None:
        self.store = store
        self.collection = collection
        self.ops: list[_Op] = []
        self.nbytes = 0
        self.pending: list[Future[None]] = []

    def add(self, op: _Op, nbytes: int = 0) -> None:
        """Queue one write (`nbytes`: what was read for it); submit the batch once full."""
        self.ops.append(op)
        self.nbytes += nbytes
        if len(self.ops) >= BATCH_FILES or self.nbytes >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Submit the batch, then wait for all but it: at most one batch is in flight."""
        if not self.ops:
            return
        ops, self.ops, self.nbytes = self.ops, [], 0
        self.pending.append(self.store.submit(partial(_apply, collection=self.collection, ops=ops)))
        while len(self.pending) > 1:
            self.pending.pop(0).result()

    def drain(self) -> None:
        """Submit what is left and wait for every batch, re-raising a failed write."""
        self.flush()
        for fut in self.pending:
            fut.result()


def _ticker(progress: Progress | None, collection: str, total: int, t0: float) -> Callable[[int], None]:
    """A `tick(done)` that reports progress at most every 0.1 s, and always the last file,
    so a large walk costs no more than ten events a second."""
    last_tick = 0.0

    def tick(done: int) -> None:
        nonlocal last_tick
        now = time.monotonic()
        if progress is None or (now - last_tick < 0.1 and done != total):
            return
        last_tick = now
        elapsed = max(now - t0, 1e-6)
        progress(
            {
                "event": "progress",
                "collection": collection,
                "done": done,
                "total": total,
                "files_per_s": round(done / elapsed, 1),
            }
        )

    return tick


def _apply(conn: Connection, collection: str, ops: list[_Op]) -> None:
    now = utcnow()
    deactivate: list[int] = []
    written: list[str] = []
    keyword: list[FtsDoc] = []
    doc_id: int | None
    for op in ops:
        if op[0] == "deactivate":
            deactivate.append(op[1])
            continue
        if op[0] == "stat":
            doc_id, found = op[1]
            conn.execute(
                "UPDATE documents SET size = ?, mtime_ns = ? WHERE id = ?",
                (found.size, found.mtime_ns, doc_id),
            )
            continue
        if op[0] == "insert":
            loaded = op[1]
            doc_id = None
        else:
            doc_id, loaded = op[1]
        f = loaded.found
        conn.execute(
            "INSERT INTO content(hash, doc, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (loaded.hash, loaded.text, now),
        )
        mtime = _iso(f.mtime_ns)
        if doc_id is None:
            cur = conn.execute(
                "INSERT INTO documents(collection, path, title, hash, created_at, modified_at, active, size, mtime_ns)"
                " VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?) RETURNING id",
                (collection, f.rel, loaded.title, loaded.hash, now, mtime, f.size, f.mtime_ns),
            )
            doc_id = int(cur.fetchone()[0])
        else:
            conn.execute(
                "UPDATE documents SET title = ?, hash = ?, modified_at = ?, active = 1, size = ?, mtime_ns = ?"
                " WHERE id = ?",
                (loaded.title, loaded.hash, mtime, f.size, f.mtime_ns, doc_id),
            )
        keyword.append(FtsDoc(doc_id, collection, f.rel, loaded.title, loaded.text, loaded.hash))
        metadata.store(conn, doc_id, loaded.meta)
        written.append(loaded.hash)
    fts_put(conn, keyword)
    # A content embedded already (a copy, a move, a file restored) is searchable by
    # vectors here at once, not after the next `qmd embed`, which would find nothing pending.
    for space in vectors.spaces(conn) if written else ():
        vectors.add_partitions(conn, space, written)
    if deactivate:
        _deactivate(conn, deactivate)


def _extract_pending(store: IndexStore, collection: str) -> int:
    """Extract the metadata of documents indexed before it existed (schema migration 3)
    or whose extraction was cut short: their files are unchanged, so the walk did not
    read them. Bodies come from the index, a batch at a time."""
    with store.read() as conn:
        ids = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM documents WHERE collection = ? AND active = 1 AND meta_state IS NULL", (collection,)
            )
        ]
    for i in range(0, len(ids), BATCH_FILES):
        part = ids[i : i + BATCH_FILES]
        with store.read() as conn:
            rows = conn.execute(
                "SELECT d.id, d.path, c.doc FROM documents d JOIN content c ON c.hash = d.hash"
                f" WHERE d.id IN ({','.join('?' * len(part))})",
                part,
            ).fetchall()
        found = [(doc_id, frontmatter.extract(path, body)) for doc_id, path, body in rows]
        store.write(partial(metadata.store_many, extracted=found))
    return len(ids)


def _finish(conn: Connection, gone: list[int]) -> int:
    _deactivate(conn, gone)
    return delete_orphan_content(conn)


def _record_run(store: IndexStore, summary: Summary, *, walk_empty: bool, scope: Scope | None = None) -> None:
    """Record the run's report; its skipped files replace those recorded for the paths it
    walked (all of them, or those in `scope`), each with the size and mtime it was skipped
    at. A skip remembered without a read keeps its `seen_at`: when the file was last read."""

    def fn(conn: Connection) -> None:
        now = utcnow()
        if not walk_empty:
            kept = {p for p, _ in summary.skipped}
            recorded = conn.execute("SELECT path FROM skipped_files WHERE collection = ?", (summary.collection,))
            conn.executemany(
                "DELETE FROM skipped_files WHERE collection = ? AND path = ?",
                [
                    (summary.collection, p)
                    for (p,) in recorded.fetchall()
                    if p not in kept and (scope is None or scope.covers(p))
                ],
            )
        rows = []
        for p, r in summary.skipped:
            skip = summary.skip_stats.get(p)
            size, mtime_ns = (skip.size, skip.mtime_ns) if skip is not None else (None, None)
            rows.append((summary.collection, p, r, now, size, mtime_ns, int(skip is not None and skip.remembered)))
        conn.executemany(
            "INSERT INTO skipped_files(collection, path, reason, seen_at, size, mtime_ns) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (collection, path) DO UPDATE SET reason = excluded.reason, size = excluded.size,"
            " mtime_ns = excluded.mtime_ns,"
            " seen_at = CASE WHEN ? = 1 THEN skipped_files.seen_at ELSE excluded.seen_at END",
            rows,
        )
        conn.execute(
            "INSERT INTO collection_runs(collection, updated_at, summary) VALUES (?, ?, ?)"
            " ON CONFLICT (collection) DO UPDATE SET updated_at = excluded.updated_at, summary = excluded.summary",
            (summary.collection, now, json.dumps({"line": summary.line(), "warnings": summary.warnings})),
        )

    store.write(fn)
