"""Flags and pointers mean the same on every command and index (issue 31): a search that
cannot run exits 1, a negation read as an option gets its hint, `get --full` widens a
pointer, a pointer into a named or project index is short and resolves as printed, and a
file an ignore rule keeps out says so however it is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import NOTES, Daemon, Env, write

from qmd.uri import file_uri, index_label, index_name, with_range


def test_pointer_spelling(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    name = f"project:{tmp_path}/src/site"
    assert index_label(name) == "project:~/src/site" and index_name("project:~/src/site") == name
    assert index_label("project:/srv/site") == "project:/srv/site" and index_label("work") == "work"
    assert file_uri("docs", "a b.md", name) == "qmd://docs/a b.md?index=project:~/src/site"
    assert with_range("qmd://w/a.md?index=work", 3, 2) == "qmd://w/a.md:3:2?index=work"
    assert with_range("/notes/what?.md", 3) == "/notes/what?.md:3"  # a path's own `?`


def test_a_search_over_no_collections_fails(env: Env, daemon: Daemon) -> None:
    for command in ("search", "vsearch", "query"):
        r = env.qmd(command, "anything")
        assert r.returncode == 1, r
        assert r.stderr.strip() == "Error: no collections to search: add one with 'qmd collection add <folder>'"
    r = daemon.http.post("/query", json={"searches": [{"type": "lex", "query": "x"}]})
    assert r.status_code == 404 and "qmd collection add" in r.json()["error"]


def test_a_negation_read_as_an_option_gets_the_hint(env: Env) -> None:
    r = env.qmd("vsearch", "-cats")  # `-c ats`, leaving no query
    assert r.returncode == 2 and "Missing argument 'QUERY...'" in r.stderr
    assert "qmd vsearch -- -cats" in r.stderr
    r = env.qmd("search", "-api")
    assert r.returncode == 2 and "qmd search -- -api" in r.stderr
    r = env.qmd("search", "--fromat", "json", "x")  # a mistyped option is not a negation
    assert r.returncode == 2 and "negation" not in r.stderr


@pytest.mark.slow
def test_get_full_and_ignored_files(env: Env, daemon: Daemon, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {**NOTES, "Archive/old.md": "# Old\n\nstale\n"})
    env.ok("collection", "add", str(notes), "--name", "notes")
    lines = (notes / "fundraising.md").read_text().splitlines()
    whole = env.ok("get", "notes/fundraising.md:7:1", "--full")
    assert whole.rstrip("\n").endswith(f"{len(lines)}: {lines[-1]}")  # no line past the last
    assert f"{len(lines) + 1}:" not in whole
    r = env.qmd("get", "notes/fundraising.md", "--full", "-l", "2")
    assert r.returncode == 1 and "--full shows the whole document" in r.stderr
    config = env.config / "qmd" / "index.yml"
    cfg = yaml.safe_load(config.read_text())
    cfg["collections"]["notes"]["ignore"] = ["Archive/**"]
    config.write_text(yaml.safe_dump(cfg))
    env.ok("update")
    for name in ("notes/Archive/old.md", "qmd://notes/Archive/old.md"):
        r = env.qmd("get", name)
        assert r.returncode == 1 and "excluded by ignore rule" in r.stderr, (name, r.stderr)


@pytest.mark.slow
def test_pointers_into_other_indexes_are_short_and_resolve(env: Env, daemon: Daemon, tmp_path: Path) -> None:
    work = write(tmp_path / "work", {"plan.md": "# Plan\n\nThe zanzibar launch plan.\n", "b.md": "# B\n\nzanzibar b\n"})
    env.ok("--index", "work", "collection", "add", str(work), "--name", "plans")
    text = env.ok("--index", "work", "search", "launch plan")
    assert "qmd://plans/plan.md:3?index=work" in text.splitlines()[0]
    got = env.ok("get", "qmd://plans/plan.md:3:1?index=work")  # as printed, from the default index
    assert got.rstrip("\n").endswith("3: The zanzibar launch plan.")
    listed = "qmd://plans/plan.md?index=work,qmd://plans/b.md?index=work"
    files = env.ok("--index", "work", "multi-get", listed, "--files").splitlines()
    assert len(files) == 2 and "No files matched" not in "".join(files)

    repo = write(env.home / "repo", {"README.md": "# Widget\n\nThe zanzibar widget.\n"})
    env.ok("init", cwd=repo)
    env.ok("update", cwd=repo)
    (hit,) = env.json("search", "widget", "--json", cwd=repo)
    assert hit["file"] == "qmd://repo/README.md?index=project:~/repo"
    assert "The zanzibar widget." in env.ok("get", with_range(hit["file"], 3, 1), cwd=tmp_path)
