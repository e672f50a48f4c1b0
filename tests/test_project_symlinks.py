"""A cloned project's index files are its own (issue 35): a `.qmd/index.sqlite`, `-wal`,
`-shm` or `-journal` that is a symbolic link, a FIFO or a folder, or a `.qmd` folder that
links elsewhere, is refused with an error that names the path and the fix; the file it
names is never written, never chmod'ed, and nothing hangs."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest
from conftest import Daemon, Env, write

from qmd.paths import ForeignFile, private_file

CONFIG = "collections:\n  repo:\n    path: .\n    pattern: '**/*.md'\n"


def project(env: Env) -> Path:
    repo = write(env.home / "repo", {"README.md": "# Widget\n\nThe zanzibar widget.\n", ".qmd/index.yml": CONFIG})
    return repo


def other_database(path: Path) -> bytes:
    """Another program's SQLite file, world-readable as such files often are."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE appdata(x)")
    conn.execute("INSERT INTO appdata VALUES ('precious')")
    conn.commit()
    conn.close()
    path.chmod(0o644)
    return path.read_bytes()


def refused(env: Env, repo: Path, named: Path, *args: str) -> str:
    r = env.qmd(*(args or ("update",)), cwd=repo, timeout=60)
    assert r.returncode != 0, r.stdout
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert str(named) in r.stderr, r.stderr
    return r.stderr


def test_an_index_linked_to_another_database_is_never_written(env: Env, daemon: Daemon) -> None:
    repo = project(env)
    victim = env.base / "app.sqlite"
    before = other_database(victim)
    (repo / ".qmd" / "index.sqlite").symlink_to(victim)
    for args in (("update",), ("status",), ("search", "zanzibar")):
        message = refused(env, repo, repo / ".qmd" / "index.sqlite", *args)
        assert "symbolic link" in message and str(victim) in message and "rm " in message
    assert victim.read_bytes() == before
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert not Path(f"{victim}-wal").exists()
    # without the link, qmd makes its own index and the project works
    (repo / ".qmd" / "index.sqlite").unlink()
    assert "Indexed: 1 new" in env.ok("update", cwd=repo)
    assert not (repo / ".qmd" / "index.sqlite").is_symlink()


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_a_linked_side_file_is_never_written_or_chmoded(env: Env, daemon: Daemon, suffix: str) -> None:
    repo = project(env)
    victim = env.base / "victim.txt"
    victim.write_text("someone else's\n")
    victim.chmod(0o644)
    link = repo / ".qmd" / f"index.sqlite{suffix}"
    link.symlink_to(victim)
    assert "symbolic link" in refused(env, repo, link)
    assert victim.read_text() == "someone else's\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644


def test_a_dangling_link_is_refused_and_not_created(env: Env, daemon: Daemon) -> None:
    repo = project(env)
    target = env.base / "elsewhere" / "made.sqlite"
    target.parent.mkdir()
    (repo / ".qmd" / "index.sqlite").symlink_to(target)
    assert "symbolic link" in refused(env, repo, repo / ".qmd" / "index.sqlite")
    assert not target.exists()


def test_a_fifo_index_is_refused_without_hanging(env: Env, daemon: Daemon) -> None:
    repo = project(env)
    os.mkfifo(repo / ".qmd" / "index.sqlite")
    os.mkfifo(repo / ".qmd" / "index.sqlite-wal")
    assert "FIFO" in refused(env, repo, repo / ".qmd" / "index.sqlite")
    (repo / ".qmd" / "index.sqlite").unlink()
    assert "FIFO" in refused(env, repo, repo / ".qmd" / "index.sqlite-wal")


def test_a_linked_dot_qmd_folder_is_refused(env: Env, daemon: Daemon) -> None:
    repo = write(env.home / "repo", {"README.md": "# Widget\n"})
    elsewhere = write(env.base / "app-data", {"index.yml": CONFIG})
    before = other_database(elsewhere / "index.sqlite")
    (repo / ".qmd").symlink_to(elsewhere)
    message = refused(env, repo, repo / ".qmd", "update")
    assert "symbolic link" in message
    assert (elsewhere / "index.sqlite").read_bytes() == before


def test_the_http_answer_is_a_403_naming_the_files(env: Env, daemon: Daemon) -> None:
    repo = project(env)
    (repo / ".qmd" / "index.sqlite-shm").symlink_to(env.base / "nowhere")
    r = daemon.http.get("/v1/status", headers={"x-qmd-project": str(repo)})
    assert r.status_code == 403, r.text
    assert "index.sqlite-shm" in r.json()["error"]
    files = {f["path"]: f for f in r.json()["files"]}
    assert files[str(repo / ".qmd" / "index.sqlite-shm")]["state"] == "refused"
    assert files[str(repo / ".qmd" / "index.sqlite")]["state"] == "missing"
    assert daemon.http.get("/v1/status").status_code == 200


def test_private_file_never_follows_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("x")
    victim.chmod(0o644)
    (tmp_path / "link").symlink_to(victim)
    for create in (True, False):
        with pytest.raises(ForeignFile, match="symbolic link"):
            private_file(tmp_path / "link", create=create)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    (tmp_path / "dir").mkdir()
    with pytest.raises(ForeignFile, match="folder"):
        private_file(tmp_path / "dir")
    assert private_file(tmp_path / "absent", create=False) == tmp_path / "absent"
    assert not (tmp_path / "absent").exists()
    mine = private_file(tmp_path / "made")
    assert stat.S_IMODE(mine.stat().st_mode) == 0o600
