"""Every index one daemon serves: the default one it started with, and any other a
request names, opened on first use and closed when idle.

A request names its index with a header: `x-qmd-index: NAME` (`qmd --index NAME`), or
`x-qmd-project: /root` for a project's own index (`.qmd/` in that folder). Each index
has its own SQLite file, writer thread, config and watcher; all share the one model
worker, so a second index costs a database, not a second copy of the models (the
original's bugs #343, #691, #772). An index no request has used for `QMD_INDEX_IDLE_S`
(600 s) and none is using now is closed; the next request opens it again, and its
watcher's start sweep catches what changed meanwhile. The default index stays open.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from qmd.paths import PROJECT_PREFIX, IndexPaths, is_project_root
from qmd.server.engine import Engine
from qmd.server.errors import InvalidInput
from qmd.server.ingest import sandbox
from qmd.server.models.worker import WorkerClient
from qmd.server.store.documents import link_index
from qmd.server.trust import own_project_index

log = logging.getLogger("qmd.indexes")

IDLE_S = 600.0
"""How long an index no request uses stays open (`QMD_INDEX_IDLE_S`)."""
INDEX_HEADER = "x-qmd-index"
PROJECT_HEADER = "x-qmd-project"


def idle_seconds() -> float:
    raw = os.environ.get("QMD_INDEX_IDLE_S", "")
    try:
        value = float(raw) if raw else IDLE_S
    except ValueError:
        raise InvalidInput(f"QMD_INDEX_IDLE_S must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise InvalidInput(f"QMD_INDEX_IDLE_S must be positive, got {raw!r}")
    return value


def requested(index: str | None, project: str | None) -> IndexPaths | None:
    """The index a request's headers name; None for the daemon's default. A malformed
    name or a project folder without `.qmd/index.yml` is `InvalidInput` (a 400)."""
    if project is not None:
        if index is not None:
            raise InvalidInput(f"give {INDEX_HEADER} or {PROJECT_HEADER}, not both")
        if not os.path.isabs(project) or not is_project_root(project):
            raise InvalidInput(f"{PROJECT_HEADER}: {project!r} is not a project (no .qmd/index.yml in it)")
        return IndexPaths.for_project(project)
    if index is None:
        return None
    try:
        return IndexPaths.resolve(index)
    except ValueError as e:
        raise InvalidInput(f"{INDEX_HEADER}: {e}") from None


def linked_index(name: str) -> IndexPaths | None:
    """The index a `qmd://collection/path?index=NAME` link names (results from an index
    other than the default carry one), or None."""
    index = link_index(name)
    if index is None:
        return None
    if index.startswith(PROJECT_PREFIX):  # a project's index is named by its folder
        return requested(None, index[len(PROJECT_PREFIX) :])
    return requested(index, None)


@dataclass
class _Open:
    engine: Engine
    users: int = 0
    last_used: float = 0.0


class Indexes:
    """The daemon's indexes, keyed by their paths. `use(paths)` is how a request holds
    one: it is never closed under a request that is using it."""

    def __init__(
        self,
        default: Engine,
        opener: Callable[[IndexPaths, WorkerClient], Engine],
        idle_s: float | None = None,
    ) -> None:
        self.default = default
        self._opener = opener
        self._idle_s = idle_s if idle_s is not None else idle_seconds()
        self._open: dict[IndexPaths, _Open] = {}
        self._lock = threading.Lock()
        self._opening: dict[IndexPaths, threading.Lock] = {}
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="qmd-indexes", daemon=True)
        self._reaper.start()

    def acquire(self, paths: IndexPaths | None) -> Engine:
        """The engine of `paths` (None, or the default's paths: the default engine),
        opened if need be and held until `release(paths)`. A project's index files are
        checked on every use, open or not: one that is not qmd's own to write (a link
        planted since) is `Forbidden`."""
        if paths is None or paths == self.default.paths:
            return self.default
        if paths.project_root is not None:
            own_project_index(paths)
        return self._acquire(paths).engine

    def release(self, paths: IndexPaths | None) -> None:
        if paths is None or paths == self.default.paths:
            return
        with self._lock:
            entry = self._open.get(paths)
            if entry is not None:
                entry.users -= 1
                entry.last_used = time.monotonic()

    @contextmanager
    def use(self, paths: IndexPaths | None) -> Iterator[Engine]:
        """`acquire` and `release` around a block."""
        engine = self.acquire(paths)
        try:
            yield engine
        finally:
            self.release(paths)

    def _acquire(self, paths: IndexPaths) -> _Open:
        with self._lock:
            entry = self._open.get(paths)
            if entry is not None:
                entry.users += 1
                return entry
            gate = self._opening.setdefault(paths, threading.Lock())
        with gate:  # one opener per index; others wait for it rather than open it twice
            with self._lock:
                entry = self._open.get(paths)
                if entry is not None:
                    entry.users += 1
                    return entry
            engine = self._opener(paths, self.default.worker)
            with self._lock:
                entry = self._open[paths] = _Open(engine, users=1, last_used=time.monotonic())
                self._opening.pop(paths, None)
            log.info("opened index %s (%s)", paths.name, paths.db)
            return entry

    def served(self) -> list[str]:
        """Names of the indexes open now, the default first."""
        with self._lock:
            return [self.default.paths.name, *sorted(p.name for p in self._open)]

    def close_idle(self, now: float | None = None) -> list[str]:
        """Close every index idle for longer than the limit; returns their names."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [p for p, e in self._open.items() if e.users == 0 and now - e.last_used > self._idle_s]
            closing = [self._open.pop(p) for p in idle]
        for paths, entry in zip(idle, closing, strict=True):
            entry.engine.close()
            log.info("closed idle index %s", paths.name)
        return [p.name for p in idle]

    def _reap_loop(self) -> None:
        while not self._stop.wait(min(60.0, self._idle_s / 4)):
            try:
                self.close_idle()
            except Exception:  # noqa: BLE001 - a failed close is logged; the daemon keeps serving
                log.exception("closing idle indexes failed")

    @staticmethod
    def stopping() -> None:
        """The daemon is shutting down (its SIGTERM or SIGINT): the loader processes are
        killed for good, so a pass that is reading a file ends at once (`sandbox.Stopped`)
        instead of holding its request, and the shutdown, until the parse is done. Called
        from the signal handler: nothing here waits."""
        sandbox.POOL.stop()

    def close(self) -> None:
        """Close every index, the default last (it owns the shared worker)."""
        self._stop.set()
        with self._lock:
            entries = list(self._open.values())
            self._open.clear()
        for entry in entries:
            entry.engine.close()
        self.default.close()
