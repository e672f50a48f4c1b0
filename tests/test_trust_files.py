"""`GET /v1/trust` and `qmd trust` list a project's index files with their state (issue 35):
qmd's own, missing, or refused (a link, another kind of file, another user's), so what a
clone planted in `.qmd/` is seen before anything is written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, Env, write
from test_project_symlinks import CONFIG

from qmd.paths import IndexPaths
from qmd.server.trust import index_file_states


def project(env: Env) -> Path:
    return write(env.home / "repo", {"README.md": "# Widget\n\nzanzibar\n", ".qmd/index.yml": CONFIG})


def states(daemon: Daemon, repo: Path) -> dict[str, dict[str, Any]]:
    r = daemon.http.get("/v1/trust", headers={"x-qmd-project": str(repo)})
    assert r.status_code == 200, r.text
    return {Path(f["path"]).name: f for f in r.json()["files"]}


def test_the_trust_answer_lists_the_index_files_and_their_states(env: Env, daemon: Daemon) -> None:
    repo = project(env)
    env.ok("update", cwd=repo)
    files = states(daemon, repo)
    assert [(f["role"], f["state"]) for f in files.values()] == [
        ("folder", "ok"),
        ("index", "ok"),
        ("index wal", "ok"),
        ("index shm", "ok"),
        ("index journal", "missing"),
        ("bench cache", "missing"),
    ]
    out = env.ok("trust", cwd=repo)
    assert "Index files:" in out and f"ok       {repo / '.qmd' / 'index.sqlite'} (index)" in out, out
    assert f"missing  {repo / '.qmd' / 'index.sqlite-journal'} (index journal)" in out, out
    # outside a project: the user's own index, nothing listed
    assert daemon.http.get("/v1/trust").json()["files"] == []


def test_a_refused_file_is_listed_with_why_by_the_cli(env: Env, daemon: Daemon) -> None:
    repo = project(env)
    victim = env.base / "victim.sqlite"
    victim.write_bytes(b"someone else's")
    (repo / ".qmd" / "index.sqlite-wal").symlink_to(victim)
    r = env.qmd("trust", cwd=repo)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    wal = repo / ".qmd" / "index.sqlite-wal"
    assert f"refused  {wal} (index wal: a symbolic link (to {victim}))" in r.stderr, r.stderr
    assert f"missing  {repo / '.qmd' / 'index.sqlite'} (index)" in r.stderr, r.stderr
    assert f"Error: {wal} is a symbolic link" in r.stderr, r.stderr
    assert victim.read_bytes() == b"someone else's"
    # the HTTP refusal carries the same list
    answer = daemon.http.get("/v1/trust", headers={"x-qmd-project": str(repo)})
    assert answer.status_code == 403
    refused = {f["path"]: f["why"] for f in answer.json()["files"] if f["state"] == "refused"}
    assert refused == {str(wal): f"a symbolic link (to {victim})"}


@pytest.mark.parametrize(
    ("plant", "why"),
    [
        (lambda p: os.mkfifo(p), "a FIFO, not a regular file"),
        (lambda p: p.mkdir(), "a folder, not a regular file"),
        (lambda p: p.symlink_to(p.parent / "nowhere"), "a symbolic link (to "),
    ],
)
def test_each_kind_of_planted_file_is_refused_by_state(tmp_path: Path, plant: Any, why: str) -> None:
    repo = write(tmp_path / "repo", {".qmd/index.yml": CONFIG})
    paths = IndexPaths.for_project(repo)
    plant(paths.db)
    got = {f.role: f for f in index_file_states(paths)}
    assert got["index"].state == "refused" and got["index"].why.startswith(why), got["index"]
    assert got["folder"].state == "ok" and got["index wal"].state == "missing"


def test_a_linked_dot_qmd_folder_is_listed_as_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    elsewhere = write(tmp_path / "elsewhere", {"index.yml": CONFIG})
    (repo / ".qmd").symlink_to(elsewhere)
    folder = index_file_states(IndexPaths.for_project(repo))[0]
    assert (folder.role, folder.state, folder.why) == ("folder", "refused", f"a symbolic link (to {elsewhere})")
