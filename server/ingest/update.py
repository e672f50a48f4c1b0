"""`qmd update`: each collection's update command, then its re-index, told as events.

The caller holds the update lock and decides what a project's trust gate keeps out
(`held`): this floor runs what it is given and says so, so `qmd update` shows a hook
that did not run, or a folder that was not read, instead of leaving it out in silence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Literal

from qmd.server.config import Collection
from qmd.server.ingest.indexer import Progress, Summary, index_collection, run_hook
from qmd.server.store.db import IndexStore

Held = Callable[[Literal["path", "update"], str], str | None]
"""(what, collection) → why the gate keeps it out (its folder, its update command), or None."""


def run_update(
    store: IndexStore, colls: list[Collection], held: Held, progress: Progress | None = None
) -> list[Summary]:
    """Run each collection's hook, then re-index it. A failing hook aborts the run."""
    say = progress or (lambda _: None)
    out: list[Summary] = []
    for i, coll in enumerate(colls, 1):
        if (note := held("path", coll.name)) is not None:
            say({"event": "gated", "collection": coll.name, "note": note})
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
        out.append(summary)
        say({"event": "summary", **summary_dict(summary)})
    return out


def summary_dict(s: Summary) -> dict:
    """An update's report on the wire, its walk's count named `discovered` as in seed 001."""
    d = asdict(s)
    d["discovered"] = d.pop("files")
    d["skipped"] = [{"path": p, "reason": r} for p, r in s.skipped]
    d["line"] = s.line()
    return d
