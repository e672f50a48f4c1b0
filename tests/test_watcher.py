"""The watcher (server/ingest/watcher.py): real watchfiles on real temp folders, through the
real daemon. A saved note must become searchable with no command; what the indexer would
not take stays out; a vanished folder never prunes; bursts are coalesced; hooks never run.

The harness turns watching off for every other test (their `qmd update` reports count what
they changed); these turn it on, with short quiet periods so a change lands in well under
a second. The fast run keeps the core (saves, renames, deletions, a vanished folder, nested
collections, symlinks, adding and removing); each test that waits out a sweep, a restart or
a setting is slow."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import MODELS_DIR, require, unavailable, write
from harness import Daemon, Env

from qmd.server.config import Collection
from qmd.server.ingest.indexer import Scope, index_collection
from qmd.server.store.sqlite import Store

FAST = {"QMD_WATCH": "1", "QMD_WATCH_QUIET_MS": "200", "QMD_WATCH_MAX_WAIT_MS": "1000"}


def eventually(check: Callable[[], Any], timeout: float = 15, what: str = "") -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or check}")
        time.sleep(0.05)


def watched(env: Env, extra: dict[str, str] | None = None) -> Daemon:
    env.vars.update(FAST)
    env.vars.update(extra or {})
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    return d


@pytest.fixture
def live(env: Env) -> Iterator[Daemon]:
    d = watched(env)
    yield d
    d.stop()


def paths_for(d: Daemon, word: str, collection: str | None = None) -> list[str]:
    body: dict[str, Any] = {"query": word, "limit": 50}
    if collection:
        body["collections"] = [collection]
    r = d.http.post("/v1/keyword", json=body)
    assert r.status_code == 200, r.text
    return sorted(h["path"] for h in r.json()["results"])


def coll_status(d: Daemon, name: str) -> dict[str, Any]:
    st = d.http.get("/v1/status").json()
    return next(c for c in st["collections"] if c["name"] == name)


def watch_of(d: Daemon, name: str) -> dict[str, Any]:
    w: dict[str, Any] = coll_status(d, name)["watch"]
    return w


def settled(d: Daemon, name: str) -> dict[str, Any] | None:
    """The collection's watch state once its folder is watched and nothing waits in its queue."""
    w = watch_of(d, name)
    return w if w["mode"] in ("watching", "polling") and w["queue"] == 0 else None


def add(env: Env, folder: Path, name: str, d: Daemon | None = None) -> None:
    """`qmd collection add`, then (given the daemon) wait until its watch is in place, so
    what the test writes next is heard rather than found by the later sweep."""
    env.ok("collection", "add", str(folder), "--name", name)
    if d is not None:
        eventually(lambda: settled(d, name), what=f"the watch of {name}")


def config_file(env: Env) -> Path:
    return env.config / "qmd" / "index.yml"


def test_create_edit_rename_atomic_save_delete(env: Env, live: Daemon, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {"seed.md": "# Seed\n\nfirst note\n"})
    add(env, notes, "notes", live)
    (notes / "fresh.md").write_text("# Fresh\n\nquokka habitat survey\n")
    eventually(lambda: paths_for(live, "quokka") == ["fresh.md"], what="a created file")

    (notes / "fresh.md").write_text("# Fresh\n\nwombat burrow survey\n")
    eventually(lambda: paths_for(live, "wombat") == ["fresh.md"] and not paths_for(live, "quokka"), what="an edit")

    os.rename(notes / "fresh.md", notes / "moved.md")
    eventually(lambda: paths_for(live, "wombat") == ["moved.md"], what="a rename")

    # An editor's atomic save: a temp file (a dot-name, never indexed) renamed over the note.
    tmp = notes / ".moved.md.swp"
    tmp.write_text("# Fresh\n\nplatypus survey\n")
    os.replace(tmp, notes / "moved.md")
    eventually(lambda: paths_for(live, "platypus") == ["moved.md"] and not paths_for(live, "wombat"), what="a save")

    (notes / "moved.md").unlink()
    eventually(lambda: not paths_for(live, "platypus"), what="a deletion")
    assert paths_for(live, "first") == ["seed.md"]

    # A folder moved in at once (one event for the folder, none for its files) is walked.
    staged = write(tmp_path / "staging", {"deep/er.md": "# Deeper\n\naardvark\n"})
    os.rename(staged, notes / "sub")
    eventually(lambda: paths_for(live, "aardvark") == ["sub/deep/er.md"], what="a folder moved in")
    os.rename(notes / "sub", tmp_path / "away")
    eventually(lambda: not paths_for(live, "aardvark"), what="a folder moved out")

    w = eventually(lambda: settled(live, "notes"), what="an empty queue")
    assert w["mode"] == "watching" and w["reason"] == "" and w["last_change"]
    text = env.ok("status")
    assert "Watch:    watching; last change" in text and "0 queued" in text


@pytest.mark.slow
def test_mask_ignores_and_builtin_folders_are_not_watched(env: Env, live: Daemon, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {"a.md": "# A\n\nalpha\n"})
    for folder in ("drafts", "node_modules/pkg", ".hidden"):
        (notes / folder).mkdir(parents=True)  # a new folder is walked: count file events only
    add(env, notes, "notes")
    cfg = yaml.safe_load(config_file(env).read_text())
    cfg["collections"]["notes"]["ignore"] = ["drafts/**"]
    config_file(env).write_text(yaml.safe_dump(cfg))
    # The new ignore list is a new watch, which sweeps first: wait for that, then count.
    eventually(lambda: (w := settled(live, "notes")) and w["passes"], what="the re-watch's sweep")
    before = watch_of(live, "notes")["passes"]
    write(
        notes,
        {
            "drafts/d.md": "# D\n\nmarmot\n",
            "node_modules/pkg/n.md": "# N\n\nmarmot\n",
            ".hidden/h.md": "# H\n\nmarmot\n",
            "notes.txt": "marmot\n",
            ".x.md": "marmot\n",
        },
    )
    time.sleep(1.5)
    w = watch_of(live, "notes")
    assert (w["passes"], w["queue"]) == (before, 0), "ignored paths reached the indexer"
    assert paths_for(live, "marmot") == []
    (notes / "b.md").write_text("# B\n\nmarmot\n")
    eventually(lambda: paths_for(live, "marmot") == ["b.md"], what="a file the mask takes")


def test_folder_removed_and_restored_never_prunes(env: Env, live: Daemon, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {"a.md": "# A\n\nkestrel\n", "b/c.md": "# C\n\nkestrel\n"})
    add(env, notes, "notes", live)
    aside = tmp_path / "unmounted"
    os.rename(notes, aside)  # what an unmount looks like: the whole folder gone at once
    eventually(lambda: "missing" in watch_of(live, "notes")["reason"], what="the folder reported missing")
    time.sleep(1.0)
    assert paths_for(live, "kestrel") == ["a.md", "b/c.md"]
    assert "missing" in env.ok("status")

    (aside / "b" / "c.md").unlink()  # changed while away: found when it is back
    (aside / "new.md").write_text("# New\n\nkestrel\n")
    os.rename(aside, notes)
    eventually(lambda: paths_for(live, "kestrel") == ["a.md", "new.md"], what="the sweep after the folder is back")
    assert watch_of(live, "notes")["reason"] == ""

    # Deleted outright, file by file, then the folder: still nothing pruned.
    shutil.rmtree(notes)
    eventually(lambda: "missing" in watch_of(live, "notes")["reason"], what="the folder reported missing")
    time.sleep(1.0)
    assert paths_for(live, "kestrel") == ["a.md", "new.md"]


def test_symlink_loop_and_symlinked_folder(env: Env, live: Daemon, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {"sub/a.md": "# A\n\nheron\n"})
    outside = write(tmp_path / "outside", {"o.md": "# O\n\nheron\n"})
    os.symlink("..", notes / "sub" / "loop")
    os.symlink(".", notes / "self")
    os.symlink(outside, notes / "out")
    add(env, notes, "notes", live)
    (notes / "sub" / "b.md").write_text("# B\n\nheron\n")
    (outside / "p.md").write_text("# P\n\nheron\n")  # heard through the symlink, never indexed
    eventually(lambda: paths_for(live, "heron") == ["sub/a.md", "sub/b.md"], what="a file beside a loop")
    time.sleep(1.0)
    assert paths_for(live, "heron") == ["sub/a.md", "sub/b.md"]
    assert watch_of(live, "notes")["mode"] == "watching"


def test_collection_inside_another(env: Env, live: Daemon, tmp_path: Path) -> None:
    outer = write(tmp_path / "outer", {"top.md": "# Top\n\nosprey\n", "inner/in.md": "# In\n\nosprey\n"})
    add(env, outer, "outer", live)
    add(env, outer / "inner", "inner", live)
    (outer / "inner" / "new.md").write_text("# New\n\ngannet\n")
    eventually(lambda: paths_for(live, "gannet", "outer") == ["inner/new.md"], what="the outer collection")
    eventually(lambda: paths_for(live, "gannet", "inner") == ["new.md"], what="the inner collection")
    (outer / "inner" / "new.md").unlink()
    eventually(lambda: not paths_for(live, "gannet"), what="a deletion seen by both")


@pytest.mark.slow
def test_hook_never_runs(env: Env, live: Daemon, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {"a.md": "# A\n\nplover\n"})
    marker = tmp_path / "hook-ran"
    add(env, notes, "notes", live)
    env.ok("collection", "update-cmd", "notes", f"touch {marker}")
    (notes / "b.md").write_text("# B\n\nplover\n")
    eventually(lambda: paths_for(live, "plover") == ["a.md", "b.md"], what="the watcher's pass")
    eventually(lambda: watch_of(live, "notes")["passes"] >= 2, what="the delayed sweep")
    assert not marker.exists(), "the watcher ran the collection's update command"
    env.ok("update")  # the user's update does run it
    assert marker.exists()


@pytest.mark.slow
def test_daemon_killed_and_restarted_sweeps_what_changed(env: Env, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {"a.md": "# A\n\ncurlew\n", "b.md": "# B\n\ncurlew\n"})
    d = watched(env)
    try:
        add(env, notes, "notes")
        eventually(lambda: paths_for(d, "curlew") == ["a.md", "b.md"], what="the first index")
    finally:
        d.stop(signal.SIGKILL)
    (notes / "a.md").unlink()
    (notes / "b.md").write_text("# B\n\nsandpiper\n")
    (notes / "c.md").write_text("# C\n\ncurlew\n")
    d = watched(env)
    try:
        eventually(lambda: paths_for(d, "curlew") == ["c.md"], what="the start sweep")
        assert paths_for(d, "sandpiper") == ["b.md"]
        assert watch_of(d, "notes")["passes"] >= 1
    finally:
        assert d.stop() == 0  # the watcher stops with the daemon


@pytest.mark.slow
def test_polling_fallback_is_reported(env: Env, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {"a.md": "# A\n\nlapwing\n"})
    d = watched(env, {"QMD_WATCH_POLL": "1", "QMD_WATCH_POLL_MS": "100"})
    try:
        add(env, notes, "notes", d)
        w = watch_of(d, "notes")
        assert (w["mode"], w["reason"]) == ("polling", "QMD_WATCH_POLL=1")
        (notes / "b.md").write_text("# B\n\nlapwing\n")
        eventually(lambda: paths_for(d, "lapwing") == ["a.md", "b.md"], what="a change found by polling")
        assert "Watch:    polling (QMD_WATCH_POLL=1)" in env.ok("status")
    finally:
        d.stop()


@pytest.mark.slow
def test_watch_limit_falls_back_to_polling(env: Env, tmp_path: Path) -> None:
    """inotify's watch limit, for real: the daemon runs in a user namespace of its own whose
    limit (`/proc/sys/user/max_inotify_watches`) is 4, so 8 folders cannot all be watched."""
    limited = ["unshare", "--user", "--map-root-user", "sh", "-c"]
    if subprocess.run([*limited, "true"], capture_output=True).returncode != 0:
        unavailable("user namespaces (unshare --user) are needed to lower the inotify watch limit")
    notes = write(tmp_path / "notes", {f"d{i}/n.md": f"# N{i}\n\ntern\n" for i in range(8)})
    env.vars.update({**FAST, "QMD_WATCH_POLL_MS": "100"})
    d = Daemon(env, wrapper=[*limited, 'echo 4 > /proc/sys/user/max_inotify_watches && exec "$@"', "sh"])
    env.vars["QMD_NO_AUTOSTART"] = "1"
    try:
        add(env, notes, "notes")
        w = eventually(lambda: (w := watch_of(d, "notes"))["mode"] == "polling" and w, what="the fallback")
        assert "inotify watches could not be added (OS file watch limit reached" in w["reason"]
        assert "polling every 100 ms" in w["reason"]
        (notes / "d7" / "new.md").write_text("# New\n\nskua\n")
        eventually(lambda: paths_for(d, "skua") == ["d7/new.md"], what="a change found by polling")
        assert "Watch:    polling (inotify watches could not be added" in env.ok("status")
    finally:
        d.stop()


@pytest.mark.slow
def test_watch_false_in_index_yml(env: Env, live: Daemon, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {"a.md": "# A\n\ndunlin\n"})
    add(env, notes, "notes")
    cfg = yaml.safe_load(config_file(env).read_text())
    cfg["collections"]["notes"]["watch"] = False
    config_file(env).write_text(yaml.safe_dump(cfg))
    eventually(lambda: watch_of(live, "notes")["mode"] == "off", what="the watch stopped")
    assert watch_of(live, "notes")["reason"] == "watch: false in index.yml"
    (notes / "b.md").write_text("# B\n\ndunlin\n")
    time.sleep(1.5)
    assert paths_for(live, "dunlin") == ["a.md"]
    assert "Watch:    off (watch: false in index.yml)" in env.ok("status")
    env.ok("update")
    assert paths_for(live, "dunlin") == ["a.md", "b.md"]


@pytest.mark.slow
def test_qmd_watch_0_turns_it_off(env: Env, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {"a.md": "# A\n\nruff\n"})
    d = watched(env, {"QMD_WATCH": "0"})
    try:
        add(env, notes, "notes")
        (notes / "b.md").write_text("# B\n\nruff\n")
        time.sleep(1.5)
        assert paths_for(d, "ruff") == ["a.md"]
        st = env.json("status", "--json")
        w = next(c for c in st["collections"] if c["name"] == "notes")["watch"]
        assert (w["mode"], w["reason"], w["passes"]) == ("off", "QMD_WATCH=0", 0)
    finally:
        d.stop()


def test_add_and_remove_while_running(env: Env, live: Daemon, tmp_path: Path) -> None:
    first = write(tmp_path / "first", {"a.md": "# A\n\ngodwit\n"})
    add(env, first, "first", live)
    assert watch_of(live, "first")["mode"] == "watching"
    env.ok("collection", "remove", "first")
    assert all(c["name"] != "first" for c in live.http.get("/v1/status").json()["collections"])
    (first / "b.md").write_text("# B\n\ngodwit\n")
    second = write(tmp_path / "second", {"s.md": "# S\n\nwhimbrel\n"})
    add(env, second, "second", live)
    (second / "t.md").write_text("# T\n\nwhimbrel\n")
    eventually(lambda: paths_for(live, "whimbrel") == ["s.md", "t.md"], what="the new collection's watch")
    assert paths_for(live, "godwit") == []
    assert "Traceback" not in live.output.read_text()


def test_a_scoped_pass_touches_only_its_paths(tmp_path: Path) -> None:
    """The watcher's pass (`index_collection` with a `Scope`): a folder gone takes its files
    with it and no neighbour whose name merely starts the same (`a-b` beside `a`); the
    last document of a collection is kept (the empty-walk rule, via a whole walk)."""
    root = write(tmp_path / "c", {"a/x.md": "# X\n", "a-b/y.md": "# Y\n", "ab.md": "# AB\n"})
    coll = Collection("c", str(root))
    store = Store(tmp_path / "index.sqlite")
    try:
        assert index_collection(store, coll).indexed == 3
        shutil.rmtree(root / "a")
        (root / "ab.md").write_text("# AB, edited\n")
        s = index_collection(store, coll, scope=Scope.of(["a", "a/x.md"]))
        assert (s.removed, s.updated, s.unchanged) == (1, 0, 0)  # ab.md is outside the scope
        assert index_collection(store, coll, scope=Scope.of(["ab.md"])).updated == 1
        (root / "a-b" / "y.md").unlink()
        (root / "ab.md").unlink()
        s = index_collection(store, coll, scope=Scope.of(["a-b/y.md", "ab.md"]))
        assert s.removed == 0 and "an empty walk never prunes" in s.warnings[0]
    finally:
        store.close()


def test_bad_settings_are_clear_errors(env: Env, tmp_path: Path) -> None:
    r = env.qmdd(env={"QMD_WATCH_QUIET_MS": "soon"})
    assert r.returncode == 1
    assert "QMD_WATCH_QUIET_MS must be a number of at least 150 (got 'soon')" in r.stderr
    assert "Traceback" not in r.stderr
    notes = write(tmp_path / "notes", {"a.md": "# A\n"})
    config_file(env).parent.mkdir(parents=True, exist_ok=True)
    config_file(env).write_text(yaml.safe_dump({"collections": {"n": {"path": str(notes), "watch": "maybe"}}}))
    r = env.qmdd()
    assert r.returncode == 1
    assert "collection 'n': watch must be true or false (got 'maybe')" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_burst_of_10000_files_is_coalesced(env: Env, live: Daemon, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {"a.md": "# A\n\nstart\n"})
    add(env, notes, "notes", live)
    before = watch_of(live, "notes")["passes"]
    # What a `git checkout` does: thousands of files written as fast as the disk takes them.
    for i in range(10_000):
        p = notes / f"d{i % 50:02d}" / f"n{i:05d}.md"
        p.parent.mkdir(exist_ok=True)
        p.write_text(f"# Note {i}\n\nbulk{i} burst\n")
    eventually(lambda: coll_status(live, "notes")["files"] == 10_001, timeout=120, what="all 10,000 indexed")
    w = eventually(lambda: settled(live, "notes"), what="an empty queue")
    # One pass for the burst; one more if the collection's first sweep falls inside it.
    assert w["passes"] - before <= 2, f"{w['passes'] - before} passes for one burst"
    assert paths_for(live, "bulk9999") == ["d49/n09999.md"]


@pytest.mark.slow
def test_changed_documents_are_embedded_in_the_background(env: Env, tmp_path: Path) -> None:
    model = require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM embed model")
    notes = write(tmp_path / "notes", {"a.md": "# A\n\nsourdough starter feeding schedule\n"})
    config_file(env).parent.mkdir(parents=True, exist_ok=True)
    config_file(env).write_text(yaml.safe_dump({"models": {"embed": str(model)}, "collections": {}}))
    d = watched(env)
    try:
        add(env, notes, "notes")
        eventually(lambda: watch_of(d, "notes")["pending_vectors"] == 0, timeout=120, what="the first embedding")
        assert watch_of(d, "notes")["embedding"] == "automatic"
        (notes / "b.md").write_text("# B\n\nthe tide tables for the harbour\n")
        eventually(lambda: paths_for(d, "harbour") == ["b.md"], what="keyword freshness")
        eventually(lambda: watch_of(d, "notes")["pending_vectors"] == 0, timeout=60, what="the new note embedded")
        r = d.http.post("/v1/vector", json={"query": "when is high water at the port", "limit": 1})
        assert r.status_code == 200, r.text
        assert [h["path"] for h in r.json()["results"]] == ["b.md"]
    finally:
        d.stop()
    # QMD_WATCH_EMBED=0: indexed at once, embedding left to `qmd embed`.
    d = watched(env, {"QMD_WATCH_EMBED": "0"})
    try:
        (notes / "c.md").write_text("# C\n\nmigrating geese over the estuary\n")
        eventually(lambda: paths_for(d, "estuary") == ["c.md"], what="the start sweep")
        time.sleep(1.0)
        w = watch_of(d, "notes")
        assert (w["pending_vectors"], w["embedding"]) == (1, "off: QMD_WATCH_EMBED=0 (run 'qmd embed')")
    finally:
        d.stop()
