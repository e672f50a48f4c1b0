"""The watcher: the daemon keeps every watched collection's index fresh as its files change.

Each watched collection has a listener thread running watchfiles' Rust backend (inotify)
over its folder, or, when watches cannot be added or `QMD_WATCH_POLL=1`, a poller of its
own that scans the folder in paced slices (`Pace`): a polled tree as large as `/` costs a
bounded share of a core and never keeps `/health`, searches or status from answering.
What it hears is filtered by the indexer's own `Rules` (mask, ignore globs, dot-names,
built-in folders) and queued as changed paths. One pass thread waits for a collection's queue to go quiet
(`QMD_WATCH_QUIET_MS`, or `QMD_WATCH_MAX_WAIT_MS` during a long burst), then runs the
indexer over just those paths through the engine's update lock, so a `git checkout` of
10,000 files is a pass or two, never 10,000, and never races `qmd update`. Renames and
atomic saves need nothing special: a pass looks at each queued path as it is on disk now.

A folder that vanishes (unmounted, moved away) is never pruned: the scoped pass keeps the
empty-walk rule, and the listener waits for the folder to come back, then sweeps it. A
sweep (a whole-collection incremental pass) also runs at start, catching what changed
while the daemon was down, and every `QMD_WATCH_SWEEP_S`, for what the OS dropped. Sweeps
and passes are paced too, walk before taking the update lock, and stop at their next step
when the daemon does (SIGTERM never waits for a walk of a large tree).

The watcher never runs a collection's `update` command: a saved file must not run a shell
command. Documents it changed (and, after a sweep, any still pending) are embedded on a
thread of their own, in the worker's background lane, when a local embed model is ready
(never a download, never a remote endpoint).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from qmd.server.config import Collection
from qmd.server.errors import InvalidInput
from qmd.server.ingest.indexer import Cancelled, Pace, Rules, Scope, Summary
from qmd.server.store.sqlite import utcnow

log = logging.getLogger("qmd.watcher")


class Watched(Protocol):
    """What the watcher needs of the index it keeps fresh (the engine, in the daemon)."""

    def watched_collections(self) -> list[Collection]:
        """The collections to listen to now, as the config says (InvalidInput if it cannot be read)."""
        ...

    def index_watched(self, name: str, scope: Scope | None, pace: Pace) -> Summary | None:
        """One pass over a collection's `scope` (None: all of it), at `pace`; None when it is gone."""
        ...

    def embed_watched(self, collections: list[str], cancel: threading.Event) -> object:
        """Embed what the passes changed, in the background."""
        ...


WatchMode = Literal["watching", "polling", "off"]


@dataclass(frozen=True)
class WatchInfo:
    """The watcher's side of a collection (`index.watcher`): is the daemon keeping it fresh,
    how, and how far behind it is."""

    mode: WatchMode
    reason: str
    """Why it is off or polling, or what is wrong with its folder ('' when all is well)."""
    last_change: str | None
    """When the watcher last saw one of its files change (ISO, UTC)."""
    queue: int
    """Changed paths waiting for the next pass."""
    passes: int
    """Index passes the watcher has run over it since the daemon started (sweeps included)."""
    last_pass: str | None
    """The last pass's one-line report (`Summary.line`)."""
    pending_vectors: int
    """Its documents without a complete set of vectors from the current embedder."""
    embedding: str
    """'automatic' when changed documents are embedded in the background, else why not."""


FULL_PASS_AT = 1000
"""A burst of more changed paths than this is one walk of the whole collection: cheaper than
looking at each, and it catches what the burst touched that the OS did not report."""
BURST_WAIT_FACTOR = 5
"""How many times `max_wait` such a burst may wait for its end."""
ADDED_SWEEP_DELAY_S = 5.0
"""A collection added while the daemon runs is swept after this, so the `qmd update` that
`qmd collection add` runs first reports what it indexed."""
RECONCILE_S = 2.0
"""How often the config is compared with the watches (a hand edit of index.yml)."""
ROOT_CHECK_MS = 1000
"""How often a listener checks that its folder is still the one it watches."""
POLL_SHARE = 0.25
"""The share of a core (and of the GIL) a poller's scan may take: it runs forever."""
PASS_SHARE = 0.5
"""The share a pass over a polled collection may take: its sweeps can cover a tree as large
as `/`. A pass over a watched one runs flat out (a save is searchable sooner, a checkout
indexed at full speed; searches already answer between its writes), only cancellable."""
STEP_MS = 50
"""watchfiles' step, and the longest it groups changes: a steady stream (a checkout) reaches
the queue every ~2 steps, so a quiet period of 3 steps or more is never found between two of
its batches (`QMD_WATCH_QUIET_MS` may not be shorter)."""


def _number(environ: Mapping[str, str], name: str, default: float, low: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= low:
        raise InvalidInput(f"{name} must be a number of at least {low:g} (got {raw!r})")
    return value


@dataclass(frozen=True)
class WatchSettings:
    enabled: bool = True
    quiet_s: float = 0.3
    max_wait_s: float = 2.0
    sweep_s: float = 600.0
    force_polling: bool = False
    embed: bool = True
    """Embed what the watcher indexed, and a sweep's backlog (`QMD_WATCH_EMBED=0`: leave it to `qmd embed`)."""
    poll_ms: int = 1000

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> WatchSettings:
        """The settings from `QMD_WATCH*`; a bad value is a clear error at start."""
        return cls(
            enabled=environ.get("QMD_WATCH", "1").strip() not in ("0", "false", "no", "off"),
            quiet_s=_number(environ, "QMD_WATCH_QUIET_MS", 300, 3 * STEP_MS) / 1000,
            max_wait_s=_number(environ, "QMD_WATCH_MAX_WAIT_MS", 2000, 10) / 1000,
            sweep_s=_number(environ, "QMD_WATCH_SWEEP_S", 600, 1),
            force_polling=environ.get("QMD_WATCH_POLL", "").strip() in ("1", "true", "yes", "on"),
            embed=environ.get("QMD_WATCH_EMBED", "1").strip() not in ("0", "false", "no", "off"),
            poll_ms=int(_number(environ, "QMD_WATCH_POLL_MS", 1000, 50)),
        )


def _key(coll: Collection) -> tuple[str, str, tuple[str, ...]]:
    """What a listener depends on: another folder, mask or ignore list is a new watch."""
    return (str(coll.root), coll.pattern, coll.ignore)


def _identity(path: str) -> tuple[int, int] | None:
    """The folder's (device, inode), or None when it is not a folder now: a watch follows
    the inode, so a folder moved away and another put in its place must be watched anew."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


class _Watch:
    """One collection's listener and what it has heard but not yet indexed."""

    def __init__(self, coll: Collection, settings: WatchSettings, wake: Callable[[], None], sweep_at: float) -> None:
        self.coll = coll
        self.root = str(coll.root)
        self.rules = Rules(coll)
        self.settings = settings
        self.wake = wake
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.mode: WatchMode = "polling" if settings.force_polling else "watching"
        self.reason = "QMD_WATCH_POLL=1" if settings.force_polling else ""
        self.trouble = ""
        """Why nothing watches the folder now (it is missing, say), while that lasts."""
        self.live = False
        """The OS watches (or the poller) are in place."""
        self.pending: set[str] = set()
        self.first_at = 0.0
        self.last_at = 0.0
        self.sweep_at = sweep_at
        self.last_change: str | None = None
        self.passes = 0
        self.last_pass: str | None = None
        self.pass_end = 0.0
        self.thread = threading.Thread(target=self._listen, name=f"qmd-watch-{coll.name}", daemon=True)

    def key(self) -> tuple[str, str, tuple[str, ...]]:
        return _key(self.coll)

    # -- the listener thread ----------------------------------------------------

    def relevant(self, path: str) -> bool:
        """A changed path worth a pass: a file the indexer would take, or a folder that may
        hold some (one that exists now, or a path gone already, which may have been one)."""
        if not path.startswith(self.root + os.sep):
            return False
        rel = path[len(self.root) + 1 :].replace(os.sep, "/")
        if not self.rules.reachable(rel):
            return False
        if self.rules.wants(rel):
            return True
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and Rules.enters(rel.rsplit("/", 1)[-1])

    def _heard(self, rels: list[str]) -> None:
        if not rels:
            return
        now = time.monotonic()
        with self.lock:
            if not self.pending:
                self.first_at = now
            self.pending.update(rels)
            self.last_at = now
            self.last_change = utcnow()
        self.wake()

    def _listen(self) -> None:
        """The listener thread: one that dies says so in status (`off (stopped: …)`),
        instead of looking as if it were still starting."""
        try:
            self._listen_until_stopped()
        except Exception as e:
            log.exception("watcher: the listener of %s stopped", self.root)
            self._trouble(f"stopped: {type(e).__name__}: {e}; restart the daemon to watch it again")

    def _listen_until_stopped(self) -> None:
        # watchfiles' own backend rather than `watchfiles.watch`, whose generator adds the
        # watches only when first resumed: status must not say "watching" before they are.
        from watchfiles._rust_notify import RustNotify, WatchfilesRustInternalError

        polling = self.settings.force_polling
        restarted = False
        while not self.stop.is_set():
            ident = _identity(self.root)
            if ident is None:
                self._trouble(f"folder {self.root} is missing; its documents are kept until it is back")
                self.stop.wait(ROOT_CHECK_MS / 1000)
                continue
            if restarted:  # what changed while nothing listened is found by walking
                self.request_sweep()
            restarted = True
            if polling:
                self._poll(ident)
                continue
            try:
                # Permission errors are not ignored: watchfiles then also swallows the watch
                # limit, leaving folders silently unwatched where polling would see them.
                with RustNotify([self.root], False, False, self.settings.poll_ms, True, False) as notify:
                    self._trouble("", live=True)
                    while not self.stop.is_set():
                        try:
                            raw = notify.watch(STEP_MS, STEP_MS, ROOT_CHECK_MS, self.stop)
                        except WatchfilesRustInternalError as e:  # a changed name that is not UTF-8
                            log.info("watching %s again, and sweeping it: %s", self.root, e)
                            break  # watchfiles raises on that batch forever; the sweep walks any name
                        if isinstance(raw, set):
                            self._heard(
                                [
                                    path[len(self.root) + 1 :].replace(os.sep, "/")
                                    for _, path in raw
                                    if self.relevant(path)
                                ]
                            )
                        elif raw != "timeout":
                            break
                        if _identity(self.root) != ident:
                            break  # moved, replaced or gone: watch the folder that is there now
            except FileNotFoundError:  # gone between the check and the watch
                self.stop.wait(ROOT_CHECK_MS / 1000)
            except OSError as e:
                # inotify's watch limit (fs.inotify.max_user_watches, ENOSPC), its instance
                # limit, or a folder inotify may not watch: polling needs none of them.
                polling = True
                self._set(
                    "polling",
                    f"inotify watches could not be added ({e}); polling every {self.settings.poll_ms} ms",
                )
                log.warning("watching %s by polling: %s", self.root, e)
            finally:
                with self.lock:
                    self.live = False

    def _poll(self, ident: tuple[int, int]) -> None:
        """Poll the folder until it is replaced or the watch stops: each scan lists it anew
        (size and mtime of each file the rules take) and queues what differs from the last.
        Not watchfiles' poller, which scans the whole tree at start holding the GIL (minutes
        for a folder such as `/`, with nothing else answering) and then rescans it
        flat out; here a scan is `Pace`d, and the next starts `poll_ms` after it ends."""
        known: dict[str, tuple[int, int]] | None = None
        self._trouble("", live=True)
        try:
            while not self.stop.is_set():
                seen = self._scan(Pace(self.stop, share=POLL_SHARE))
                if known is not None:
                    self._heard([rel for rel in seen.keys() | known.keys() if seen.get(rel) != known.get(rel)])
                known = seen
                if _identity(self.root) != ident or self.stop.wait(self.settings.poll_ms / 1000):
                    return
        except Cancelled:
            return
        finally:
            with self.lock:
                self.live = False

    def _scan(self, pace: Pace) -> dict[str, tuple[int, int]]:
        """(size, mtime) of every file under the root the rules take, by relative path (as
        on disk); folders that cannot be listed are passed over (the sweep reports them)."""
        seen: dict[str, tuple[int, int]] = {}
        folders = [""]
        while folders:
            reldir = folders.pop()
            try:
                with os.scandir(os.path.join(self.root, reldir) if reldir else self.root) as it:
                    entries = list(it)
            except OSError:
                continue
            for entry in entries:
                pace.step()
                rel = reldir + entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if Rules.enters(entry.name):
                            folders.append(rel + "/")
                    elif self.rules.wants(rel):
                        st = entry.stat(follow_symlinks=False)
                        seen[rel] = (st.st_size, st.st_mtime_ns)
                except OSError:
                    continue
        return seen

    def _set(self, mode: WatchMode, reason: str) -> None:
        with self.lock:
            self.mode, self.reason = mode, reason

    def _trouble(self, trouble: str, *, live: bool = False) -> None:
        with self.lock:
            self.trouble, self.live = trouble, live

    # -- the pass thread --------------------------------------------------------

    def request_sweep(self) -> None:
        with self.lock:
            self.sweep_at = 0.0
        self.wake()

    def _due(self) -> float:
        """When the queued paths are due (the lock held): once quiet, or after the longest
        wait. A burst big enough to be a whole walk waits longer for its end (a checkout
        in progress), since walking again every `max_wait` would only redo the work."""
        if not self.pending:
            return self.sweep_at
        max_wait = self.settings.max_wait_s * (BURST_WAIT_FACTOR if len(self.pending) > FULL_PASS_AT else 1)
        # Quiet counts from the end of the last pass too: a pass holds the GIL, so what the
        # listener heard meanwhile may not have been queued yet.
        quiet_from = max(self.last_at, self.pass_end)
        return min(self.sweep_at, quiet_from + self.settings.quiet_s, self.first_at + max_wait)

    def take(self, now: float, sweep_s: float) -> tuple[Scope | None, int] | None:
        """The pass due now, if one is: (a scope, or None for a sweep; paths it covers)."""
        with self.lock:
            if now < self._due():
                return None
            rels, self.pending = self.pending, set()
            if now >= self.sweep_at:
                self.sweep_at = now + sweep_s
                return None, len(rels)
        return (Scope.of(rels) if len(rels) <= FULL_PASS_AT else None), len(rels)

    def next_due(self, now: float) -> float:
        """Seconds until `take` may have a pass."""
        with self.lock:
            return max(0.0, self._due() - now)

    def passed(self, summary: Summary | None) -> None:
        with self.lock:
            self.pass_end = time.monotonic()
            if summary is None:
                return
            self.passes += 1
            self.last_pass = summary.line()

    def info(self, pending_vectors: int, embedding: str) -> WatchInfo:
        with self.lock:
            mode, reason = (self.mode, self.reason) if self.live else ("off", self.trouble or "starting")
            return WatchInfo(
                mode=mode,
                reason=reason,
                last_change=self.last_change,
                queue=len(self.pending),
                passes=self.passes,
                last_pass=self.last_pass,
                pending_vectors=pending_vectors,
                embedding=embedding,
            )


class Watcher:
    """Watches the collections of one engine's config; `start` with the daemon, `stop`
    before the index closes (`Engine.close` does)."""

    def __init__(self, engine: Watched, settings: WatchSettings) -> None:
        self.engine = engine
        self.settings = settings
        self._watches: dict[str, _Watch] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._embed_wake = threading.Event()
        self._to_embed: set[str] = set()
        self._started = False
        self._threads = [
            threading.Thread(target=self._passes, name="qmd-watch-passes", daemon=True),
            threading.Thread(target=self._embedding, name="qmd-watch-embed", daemon=True),
        ]

    def start(self) -> None:
        if not self.settings.enabled or self._started:
            return
        self._started = True
        self._reconcile(first=True)
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop listening, cancel a pass in flight (at its next step) and background embedding."""
        self._stop.set()
        self._wake.set()
        self._embed_wake.set()
        with self._lock:
            watches = list(self._watches.values())
            self._watches.clear()
        for w in watches:
            w.stop.set()
        if self._started:
            for t in [*self._threads, *(w.thread for w in watches)]:
                t.join(timeout=60)

    def poke(self) -> None:
        """The collections changed (added, removed, renamed): look at the config now."""
        self._wake.set()

    def info(self, coll: Collection, pending_vectors: int, embedding: str) -> WatchInfo:
        if not self.settings.embed:
            embedding = "off: QMD_WATCH_EMBED=0 (run 'qmd embed')"
        with self._lock:
            w = self._watches.get(coll.name)
        if w is not None and w.key() == _key(coll):
            return w.info(pending_vectors, embedding)
        if not self.settings.enabled:
            reason = "QMD_WATCH=0"
        elif not coll.watch:
            reason = "watch: false in index.yml"
        else:
            reason = "starting"
        return off(reason, pending_vectors, embedding)

    # -- threads ------------------------------------------------------------------

    def _reconcile(self, first: bool = False) -> None:
        """Start a watch for each watched collection without one, stop those of collections
        gone, unwatched or moved to another folder."""
        try:
            wanted = {c.name: c for c in self.engine.watched_collections()}
        except InvalidInput as e:
            log.warning("watcher: the config cannot be read, watches unchanged: %s", e.message)
            return
        now = time.monotonic()
        started: list[_Watch] = []
        with self._lock:
            if self._stop.is_set():  # stopping: no watch may start after `stop` took the list
                return
            rewatch: set[str] = set()
            for name, w in list(self._watches.items()):
                c = wanted.get(name)
                if c is None or w.key() != _key(c):
                    w.stop.set()
                    del self._watches[name]
                    rewatch.add(name)
            for name, c in wanted.items():
                if name not in self._watches:
                    # Another folder, mask or ignore list is swept at once; a new collection
                    # after the `qmd update` that adding it runs.
                    delay = 0.0 if first or name in rewatch else ADDED_SWEEP_DELAY_S
                    w = _Watch(c, self.settings, self._wake.set, now + delay)
                    self._watches[name] = w
                    started.append(w)
        for w in started:
            w.thread.start()

    def _passes(self) -> None:
        last_reconcile = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if self._wake.is_set() or now - last_reconcile >= RECONCILE_S:
                self._wake.clear()
                self._reconcile()
                last_reconcile = now
            with self._lock:
                watches = list(self._watches.items())
            for name, w in watches:
                due = w.take(time.monotonic(), self.settings.sweep_s)
                if due is not None and not self._stop.is_set():
                    self._pass(name, w, *due)
            now = time.monotonic()
            waits = [w.next_due(now) for _, w in watches] + [RECONCILE_S]
            self._wake.wait(min(waits))

    def _pass(self, name: str, w: _Watch, scope: Scope | None, paths: int) -> None:
        t0 = time.monotonic()
        try:
            share = PASS_SHARE if w.mode == "polling" else 1.0
            summary = self.engine.index_watched(name, scope, Pace(self._stop, share=share))
        except Cancelled:  # stopping: what the pass wrote stays, and the next start sweeps
            summary = None
        except Exception:  # the daemon keeps serving; the next change or sweep tries again
            log.exception("watcher: indexing %s failed", name)
            summary = None
        w.passed(summary)
        if summary is None:
            return
        log.info(
            "watcher: %s %s (%d paths, %.0f ms): %s",
            name,
            "sweep" if scope is None else "pass",
            paths,
            (time.monotonic() - t0) * 1000,
            summary.line(),
        )
        # A sweep also embeds the backlog (what `qmd update` indexed, what a stopped daemon left).
        if self.settings.embed and (summary.indexed or summary.updated or scope is None):
            with self._lock:
                self._to_embed.add(name)
            self._embed_wake.set()

    def _embedding(self) -> None:
        while not self._stop.is_set():
            self._embed_wake.wait()
            self._embed_wake.clear()
            with self._lock:
                names, self._to_embed = sorted(self._to_embed), set()
            if names and not self._stop.is_set():
                try:
                    self.engine.embed_watched(names, cancel=self._stop)
                except Exception:  # vectors stay pending; `qmd embed` or the next change retries
                    log.exception("watcher: embedding %s failed", ", ".join(names))


def off(reason: str, pending_vectors: int, embedding: str) -> WatchInfo:
    """A collection nobody watches, and why."""
    return WatchInfo("off", reason, None, 0, 0, None, pending_vectors, embedding)
