"""`qmd update`: each collection's update command, then its re-index, told as events,
and the report of what changed since the collection was last reported.

The caller holds the update lock and decides what a project's trust gate keeps out
(`held`): this floor runs what it is given and says so, so `qmd update` shows a hook
that did not run, or a folder that was not read, instead of leaving it out in silence.

The watcher indexes a saved file before any `qmd update` runs, so a report of only the
update's own pass would say `0 updated` right after a user's edit. Every pass (the
watcher's and the update's) is counted in a `ChangeLog`, and an update reports, per
collection, what all of them changed since that collection's last report (or since the
daemon started): the daemon keeps one count per collection, so two clients updating the
same collection share it, and the report says from when it counts (`since`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from qmd.server.config import Collection
from qmd.server.ingest.indexer import Progress, Summary, index_collection, run_hook
from qmd.server.store.catalog import SkippedFile
from qmd.server.store.db import IndexStore
from qmd.server.store.sqlite import utcnow

Held = Callable[[Literal["path", "update"], str], str | None]
"""(what, collection) → why the gate keeps it out (its folder, its update command), or None."""


@dataclass(frozen=True)
class Changes:
    """What passes over a collection changed, summed: documents new, updated and removed,
    and files read."""

    passes: int = 0
    new: int = 0
    updated: int = 0
    removed: int = 0
    loaded: int = 0

    def plus(self, s: Summary) -> Changes:
        return Changes(
            self.passes + 1,
            self.new + s.indexed,
            self.updated + s.updated,
            self.removed + s.removed,
            self.loaded + sum(s.loaded.values()),
        )


class ChangeLog:
    """Each collection's changes since its last report, split by who made them. A change
    counts once per pass: a file the watcher indexed on two saves counts twice as updated."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = utcnow()
        self._all: dict[str, Changes] = {}
        self._watcher: dict[str, Changes] = {}
        self._since: dict[str, str] = {}

    def record(self, collection: str, summary: Summary, *, watcher: bool) -> None:
        with self._lock:
            self._all[collection] = self._all.get(collection, Changes()).plus(summary)
            if watcher:
                self._watcher[collection] = self._watcher.get(collection, Changes()).plus(summary)

    def take(self, collection: str) -> tuple[Changes, Changes, str]:
        """(all changes, the watcher's share, since when) of the collection; its count restarts."""
        with self._lock:
            got = (
                self._all.pop(collection, Changes()),
                self._watcher.pop(collection, Changes()),
                self._since.get(collection, self.started),
            )
            self._since[collection] = utcnow()
            return got

    def forget(self, collection: str) -> None:
        """A collection removed or renamed away: a new one of that name starts from nothing."""
        with self._lock:
            for counts in (self._all, self._watcher, self._since):
                counts.pop(collection, None)


@dataclass(frozen=True)
class CollectionReport:
    """One collection's update in seed 001's words: `discovered` (files the walk found),
    `loaded` (files read), `skipped` (files not indexed, and why) and `removed`, with `new`,
    `updated` and `unchanged` documents. `unchanged`, `discovered` and `skipped` describe
    the collection now; the others count every pass since `since` (`watcher`: the
    watcher's share of them)."""

    collection: str
    since: str
    """When the counts start: the collection's last report, or the daemon's start (ISO, UTC)."""
    discovered: int
    loaded: int
    new: int
    updated: int
    unchanged: int
    removed: int
    skipped: list[SkippedFile]
    remembered: int
    """Of `skipped`, the files not read again: unchanged since they were skipped."""
    watcher: Changes
    loaders: dict[str, int]
    """Files this update read, per loader."""
    warnings: list[str]
    orphans_cleaned: int
    metadata_extracted: int
    seconds: float

    @classmethod
    def of(cls, s: Summary, log: ChangeLog) -> CollectionReport:
        everything, watcher, since = log.take(s.collection)
        return cls(
            collection=s.collection,
            since=since,
            discovered=s.files,
            loaded=everything.loaded,
            new=everything.new,
            updated=everything.updated,
            unchanged=s.unchanged,
            removed=everything.removed,
            skipped=[SkippedFile(p, r) for p, r in s.skipped],
            remembered=s.remembered,
            watcher=watcher,
            loaders=dict(s.loaded),
            warnings=list(s.warnings),
            orphans_cleaned=s.orphans_cleaned,
            metadata_extracted=s.metadata_extracted,
            seconds=s.seconds,
        )

    def line(self) -> str:
        return (
            f"Indexed: {self.new} new, {self.updated} updated, {self.unchanged} unchanged, {self.removed} removed"
            f" · discovered {self.discovered} · loaded {self.loaded} · skipped {len(self.skipped)}"
        )

    def watcher_line(self) -> str | None:
        """What of the counts the watcher had indexed already, if anything."""
        w = self.watcher
        if not (w.new or w.updated or w.removed):
            return None
        return (
            f"of which the watcher indexed {w.new} new, {w.updated} updated, {w.removed} removed "
            f"since {self.since.replace('T', ' ').removesuffix('+00:00')} UTC"
        )

    def as_json(self) -> dict[str, Any]:
        """The report on the wire (the `summary` event, `--json`): its fields and `line`."""
        return {**asdict(self), "line": self.line(), "watcher_line": self.watcher_line()}


@dataclass(frozen=True)
class UpdateReport:
    """`qmd update`: a report per collection updated, and why any other was not (a gated one:
    untrusted project config), so "all updated" is never said over one left out."""

    collections: list[CollectionReport] = field(default_factory=list)
    seconds: float = 0.0
    not_updated: dict[str, str] = field(default_factory=dict)
    """Collection → why it was not updated."""

    def as_json(self) -> dict[str, Any]:
        return {
            "collections": [c.as_json() for c in self.collections],
            "not_updated": self.not_updated,
            "seconds": self.seconds,
        }


def run_update(
    store: IndexStore, colls: list[Collection], held: Held, log: ChangeLog, progress: Progress | None = None
) -> UpdateReport:
    """Run each collection's hook, then re-index it. A failing hook aborts the run."""
    t0 = time.monotonic()
    say = progress or (lambda _: None)
    out = UpdateReport()
    for i, coll in enumerate(colls, 1):
        if (note := held("path", coll.name)) is not None:
            say({"event": "gated", "collection": coll.name, "note": note})
            out.not_updated[coll.name] = note
            continue
        say(
            {
                "event": "collection",
                "index": i,
                "count": len(colls),
                "name": coll.name,
                "pattern": coll.pattern,
                "path": str(coll.root),
            }
        )
        gated = held("update", coll.name) if coll.update is not None else None
        if coll.update and gated is None:
            say({"event": "hook", "collection": coll.name, "command": coll.update})
            output = run_hook(coll)
            say({"event": "hook_done", "collection": coll.name, "output": output})
        with store.exclusive(f"update:{coll.name}"):
            summary = index_collection(store, coll, progress)
        if gated is not None:
            summary.warnings.insert(0, gated)
        log.record(coll.name, summary, watcher=False)
        report = CollectionReport.of(summary, log)
        out.collections.append(report)
        say({"event": "summary", **report.as_json()})
    return replace(out, seconds=time.monotonic() - t0)
