"""Many indexes, one daemon (server/indexes.py): a request names its index by header and
the daemon opens it on demand, sharing its one model worker; idle ones close; links with
`?index=` reach theirs. Through the real CLI, HTTP, MCP and the stdio bridge."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import MODELS_DIR, NOTES, require, write
from harness import Daemon, Env, daemons_on

import qmd
from qmd.paths import IndexPaths
from qmd.server.engine import Engine
from qmd.server.errors import InvalidInput
from qmd.server.indexes import Indexes, linked_index, requested
from qmd.uri import with_range

# -- the registry, in process -----------------------------------------------------------------


def test_requested_reads_the_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert requested(None, None) is None
    assert requested("work", None) == IndexPaths.resolve("work")
    with pytest.raises(InvalidInput, match="x-qmd-index: invalid index name"):
        requested("bad name!", None)
    with pytest.raises(InvalidInput, match="not a project"):
        requested(None, str(tmp_path))
    with pytest.raises(InvalidInput, match="not a project"):
        requested(None, "relative/path")
    with pytest.raises(InvalidInput, match="not both"):
        requested("work", str(tmp_path))


def test_links_name_their_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert linked_index("qmd://notes/a.md?index=work") == IndexPaths.resolve("work")
    assert linked_index("qmd://notes/a.md?index=work:10:5") == IndexPaths.resolve("work")
    assert linked_index("qmd://notes/a.md") is None and linked_index("notes/a.md?index=work") is None
    project = tmp_path / "proj"
    (project / ".qmd").mkdir(parents=True)
    (project / ".qmd" / "index.yml").write_text("collections: {}\n")
    link = f"qmd://notes/a.md?index={quote(f'project:{project}')}:3:1"
    assert linked_index(link) == IndexPaths.for_project(project)
    with pytest.raises(InvalidInput):
        linked_index("qmd://notes/a.md?index=no%20spaces")


def test_indexes_open_once_share_the_worker_and_close_when_idle(tmp_path: Path) -> None:
    def paths(name: str) -> IndexPaths:
        return IndexPaths(name, tmp_path / f"{name}.sqlite", tmp_path / f"{name}.yml", tmp_path)

    opened: list[str] = []

    def opener(p: IndexPaths, worker: object) -> Engine:
        opened.append(p.name)
        return Engine(p, worker=default.worker)

    default = Engine(paths("index"))
    indexes = Indexes(default, opener, idle_s=3600)
    try:
        assert indexes.acquire(None) is default and indexes.acquire(paths("index")) is default
        with indexes.use(paths("work")) as work, indexes.use(paths("work")) as again:
            assert work is again and work.worker is default.worker
            assert indexes.close_idle(now=time.monotonic() + 7200) == []  # in use: never closed
        assert opened == ["work"] and indexes.served() == ["index", "work"]
        assert indexes.close_idle() == []  # used just now
        assert indexes.close_idle(now=time.monotonic() + 7200) == ["work"]
        assert indexes.served() == ["index"]
        assert not default.worker._closed  # the shared worker outlives the index that borrowed it
        with indexes.use(paths("work")):
            pass
        assert opened == ["work", "work"]  # opened again on the next request
    finally:
        indexes.close()


# -- one daemon, through every surface --------------------------------------------------------


@pytest.mark.slow
def test_two_indexes_one_daemon(env: Env, daemon: Daemon, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", NOTES)
    work = write(tmp_path / "work", {"plan.md": "# Plan\n\nThe zanzibar launch plan.\n"})
    env.ok("collection", "add", str(notes), "--name", "notes")
    env.ok("--index", "work", "collection", "add", str(work), "--name", "plans")
    assert (env.cache / "qmd" / "work.sqlite").exists() and (env.config / "qmd" / "work.yml").exists()
    assert [h["file"] for h in env.json("--index", "work", "search", "zanzibar", "--json")] == [
        "qmd://plans/plan.md?index=work"
    ]
    assert env.json("search", "zanzibar", "--json") == []  # the default index has no such note
    assert "fundraising.md" in env.ok("search", "angel")
    health = daemon.http.get("/health").json()
    assert health["index"] == "index" and health["indexes"] == ["index", "work"]
    assert daemon.http.get("/health", headers={"x-qmd-index": "work"}).json()["index"] == "work"
    assert daemons_on(env.port) == [daemon.pid]  # one daemon for both

    # a link from the other index reaches it, from a client of the default one
    got = env.ok("get", "qmd://plans/plan.md?index=work:3:1")
    assert "The zanzibar launch plan." in got
    # a bad index name is a clear 400, before anything opens
    r = daemon.http.get("/health", headers={"x-qmd-index": "bad name!"})
    assert r.status_code == 400 and "invalid index name" in r.json()["error"]
    # stopping 'work' stops the daemon serving it, though it started for the default index
    assert "Stopped qmdd" in env.ok("--index", "work", "daemon", "stop")
    assert daemons_on(env.port) == []


@pytest.mark.slow
def test_mcp_and_the_bridge_reach_the_named_index(env: Env, daemon: Daemon, tmp_path: Path) -> None:
    work = write(tmp_path / "work", {"plan.md": "# Plan\n\nThe zanzibar launch plan.\n"})
    env.ok("--index", "work", "collection", "add", str(work), "--name", "plans")
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "query", "arguments": {"searches": [{"type": "lex", "query": "zanzibar"}]}},
        },
    ]
    stdin = "".join(json.dumps(m) + "\n" for m in messages)
    out = subprocess.run(
        [sys.executable, "-m", "qmd.client.cli", "--index", "work", "mcp"],
        input=stdin,
        capture_output=True,
        text=True,
        env=env.vars,
        timeout=60,
    )
    answers = {m["id"]: m for m in map(json.loads, out.stdout.splitlines()) if "id" in m}
    text = answers[2]["result"]["content"][0]["text"]
    assert "plans/plan.md" in text, out


@pytest.mark.slow
def test_indexes_share_one_model_worker(env: Env, tmp_path: Path) -> None:
    """Vector search in two indexes: one inference worker process serves both."""
    env.vars["QMD_EMBED_MODEL"] = str(require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM embedder"))
    daemon = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    env.ok("collection", "add", str(write(tmp_path / "notes", NOTES)), "--name", "notes")
    env.ok(
        "--index", "work", "collection", "add", str(write(tmp_path / "work", {"a.md": "# A\n\nbread\n"})), "--name", "w"
    )
    env.ok("embed")
    env.ok("--index", "work", "embed")
    assert env.json("vsearch", "sourdough bread", "--json", "--min-score", "0")
    assert env.json("--index", "work", "vsearch", "bread", "--json", "--min-score", "0")
    try:
        pids = {env.json(*args, "status", "--json")["inference"]["pid"] for args in ([], ["--index", "work"])}
        assert len(pids) == 1 and None not in pids
    finally:
        daemon.stop()


@pytest.mark.slow
def test_a_project_link_reads_from_anywhere(env: Env, daemon: Daemon) -> None:
    """A result from a project's index links to it; `get` on the link works outside the project."""
    repo = write(env.home / "proj", {"a.md": "# A\n\nzanzibar harbour\n"})
    env.ok("init", cwd=repo)
    env.ok("update", cwd=repo)
    [hit] = env.json("search", "zanzibar", "--json", cwd=repo)
    assert hit["file"] == "qmd://proj/a.md?index=project:~/proj"  # the folder, under HOME as ~
    got = env.ok("get", with_range(hit["file"], 3, 1))  # from HOME, outside the project
    assert "zanzibar harbour" in got
    assert env.qmd("search", "zanzibar", "--json").returncode == 1  # the default index is another one (empty)


def test_a_link_into_another_index_is_never_read_from_this_one(tmp_path: Path) -> None:
    """Where nothing routes the link (MCP's get, the library), the engine refuses it
    rather than read the same path from the wrong index."""
    notes = write(tmp_path / "notes", {"a.md": "# A\n\nhere\n"})
    with qmd.open(tmp_path / "i.sqlite", collections={"notes": {"path": str(notes)}}) as index:
        index.update()
        assert "here" in index.get("qmd://notes/a.md").body
        with pytest.raises(qmd.InvalidInput, match="a link into index 'work'"):
            index.get("qmd://notes/a.md?index=work:3:1")
