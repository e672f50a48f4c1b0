"""Project-local indexes: finding the project a command runs in (`qmd.paths`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import Daemon, Env, write

from qmd.paths import IndexPaths, find_project, is_project_root
from qmd.server.models.refs import DEFAULT_MODELS, parse_model_ref


def project(root: Path, name: str = "index.yml") -> Path:
    (root / ".qmd").mkdir(parents=True, exist_ok=True)
    (root / ".qmd" / name).write_text("collections: {}\n", encoding="utf-8")
    return root


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home" / "me"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("QMD_CONFIG_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    return home


def test_a_subfolder_finds_the_nearest_project(home: Path) -> None:
    outer = project(home / "work")
    inner = project(home / "work" / "docs", "index.yaml")
    (inner / "deep" / "er").mkdir(parents=True)
    assert find_project(inner / "deep" / "er") == inner
    (outer / "src").mkdir()
    assert find_project(outer / "src") == outer
    assert find_project(home) is None


def test_the_walk_stops_below_the_home_folders_parent(home: Path) -> None:
    project(home.parent)  # /home/.qmd: someone else's, or planted
    (home / "notes").mkdir()
    assert find_project(home / "notes") is None
    project(home)
    assert find_project(home / "notes") == home


def test_a_folder_outside_home_walks_to_the_root(home: Path, tmp_path: Path) -> None:
    root = project(tmp_path / "srv" / "repo")
    (root / "a").mkdir()
    assert find_project(root / "a") == root


def test_the_users_own_config_folder_is_never_a_project(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project(home / "dots")
    monkeypatch.setenv("QMD_CONFIG_DIR", str(home / "dots" / ".qmd"))
    assert not is_project_root(home / "dots")
    assert find_project(home / "dots") is None


def test_only_absolute_folders_with_a_config_are_projects(home: Path) -> None:
    assert not is_project_root(Path("relative"))
    (home / "empty" / ".qmd").mkdir(parents=True)
    assert not is_project_root(home / "empty")
    (home / "empty" / ".qmd" / "index.yml").mkdir()  # a folder, not a file
    assert not is_project_root(home / "empty")


def test_a_config_link_to_nothing_is_an_error_not_the_default_index(home: Path) -> None:
    """A project whose `.qmd/index.yml` (or `.qmd`) is a link to nothing means to be a
    project: read as none, every command would use the default index instead."""
    repo = home / "repo"
    (repo / ".qmd").mkdir(parents=True)
    (repo / "sub").mkdir()
    (repo / ".qmd" / "index.yml").symlink_to(home / "moved.yml")
    with pytest.raises(ValueError, match=r"index\.yml is a link to .*moved\.yml, which qmd cannot read as a config"):
        find_project(repo / "sub")
    assert not is_project_root(repo)
    (home / "moved.yml").write_text("collections: {}\n")  # the link mended: a project
    assert find_project(repo / "sub") == repo
    (home / "moved.yml").unlink()
    (home / "moved.yml").mkdir()  # a link to a folder is no config either
    with pytest.raises(ValueError, match="cannot read as a config file"):
        find_project(repo)

    other = home / "other"
    other.mkdir()
    (other / ".qmd").symlink_to(home / "gone")
    with pytest.raises(ValueError, match=r"\.qmd is a link to .*gone, which qmd cannot read as a folder"):
        find_project(other)


def test_a_broken_link_where_the_walk_does_not_look_is_ignored(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (home.parent / ".qmd").symlink_to(home / "nowhere")  # above the walk's stop
    assert find_project(home) is None
    dots = home / "dots"
    (dots / ".qmd").mkdir(parents=True)
    (dots / ".qmd" / "index.yml").symlink_to(home / "nowhere.yml")
    monkeypatch.setenv("QMD_CONFIG_DIR", str(dots / ".qmd"))  # the user's own configs
    assert find_project(dots) is None


def test_a_projects_files_live_in_its_dot_qmd(home: Path) -> None:
    root = project(home / "p", "index.yaml")
    paths = IndexPaths.for_project(root)
    assert paths.name == f"project:{root}"
    assert paths.db == root / ".qmd" / "index.sqlite"
    assert paths.config == root / ".qmd" / "index.yaml"
    assert paths.cache_dir == root / ".qmd"
    assert paths.project_root == root
    assert IndexPaths.resolve("work").project_root is None
    project(root)  # both: index.yml wins
    assert IndexPaths.for_project(root).config == root / ".qmd" / "index.yml"


# -- through the real CLI and daemon ---------------------------------------------------


def test_init_makes_a_project_that_every_command_inside_it_adopts(env: Env, daemon: Daemon) -> None:
    repo = write(env.home / "repo", {"README.md": "# Widget\n\nThe zanzibar widget.\n", "docs/use.md": "# Use\n"})
    out = env.ok("init", cwd=repo)
    assert f"Initialized a qmd project in {repo}" in out
    config = repo / ".qmd" / "index.yml"
    cfg = yaml.safe_load(config.read_text())
    assert cfg["models"] == {role: parse_model_ref(uri).uri for role, uri in DEFAULT_MODELS.items()}
    assert cfg["collections"] == {"repo": {"path": ".", "pattern": "**/*.md"}}
    assert "index.sqlite*" in (repo / ".qmd" / ".gitignore").read_text().splitlines()

    sub = repo / "docs"
    assert "Indexed: 2 new" in env.ok("update", cwd=sub)
    assert "repo/README.md" in env.ok("search", "zanzibar", "--files", cwd=sub)
    status = env.json("status", "--json", cwd=sub)
    assert status["index"] == f"project:{repo}"
    assert status["index_path"] == str(repo / ".qmd" / "index.sqlite") and status["warnings"] == []
    # the user's own index is another one, and --index wins inside the tree
    assert env.json("status", "--json")["collections"] == []
    assert env.json("--index", "index", "status", "--json", cwd=sub)["collections"] == []
    outside = env.qmd("search", "zanzibar", "--files", cwd=env.home)
    assert outside.returncode == 1 and "no collections to search" in outside.stderr


def test_a_command_in_a_project_with_a_broken_config_link_says_what_to_mend(env: Env, daemon: Daemon) -> None:
    repo = write(env.home / "repo", {"notes/a.md": "# A\n\nzanzibar\n"})
    (repo / ".qmd").mkdir()
    (repo / ".qmd" / "index.yml").symlink_to(env.home / "elsewhere" / "index.yml")
    for args in (("search", "zanzibar"), ("collection", "add", "notes"), ("status",)):
        r = env.qmd(*args, cwd=repo / "notes")
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert f"{repo / '.qmd' / 'index.yml'} is a link to {env.home / 'elsewhere' / 'index.yml'}" in r.stderr
        assert "fix the link, or remove it" in r.stderr
    assert env.json("status", "--json")["collections"] == []  # nothing went to the default index
    r = env.qmd("trust", "revoke", str(repo / "notes"))  # named from outside the project
    assert r.returncode == 1 and "is a link to" in r.stderr and "Traceback" not in r.stderr
    (repo / ".qmd" / "index.yml").unlink()
    assert env.json("status", "--json", cwd=repo)["index"] == "index"  # removed: no project


def test_init_refuses_a_folder_that_is_a_project_or_not_a_folder(env: Env, daemon: Daemon) -> None:
    repo = write(env.home / "repo", {"a.md": "# A\n"})
    env.ok("init", str(repo))
    before = (repo / ".qmd" / "index.yml").read_text()
    r = env.qmd("init", str(repo))
    assert r.returncode == 1 and "already a qmd project" in r.stderr and "Traceback" not in r.stderr
    assert (repo / ".qmd" / "index.yml").read_text() == before
    (env.home / "plain").mkdir()
    (env.home / "plain" / ".qmd").mkdir()
    (env.home / "plain" / ".qmd" / "index.yaml").write_text("collections: {}\n")
    r = env.qmd("init", str(env.home / "plain"))
    assert r.returncode == 1 and "index.yaml exists" in r.stderr
    r = env.qmd("init", str(env.home / "missing"))
    assert r.returncode == 1 and "Folder not found" in r.stderr


def test_a_collection_added_inside_a_project_is_stored_relative(env: Env, daemon: Daemon) -> None:
    repo = write(env.home / "repo", {"a.md": "# A\n", "notes/n.md": "# N\n"})
    env.ok("init", cwd=repo)
    env.ok("collection", "add", "notes", "--name", "notes", cwd=repo)
    cfg = yaml.safe_load((repo / ".qmd" / "index.yml").read_text())
    assert cfg["collections"]["notes"]["path"] == "notes"
    moved = env.home / "moved"
    repo.rename(moved)  # a clone elsewhere: the checked-in config still finds its folders
    env.ok("update", cwd=moved)
    files = env.ok("search", "N", "--files", "-c", "notes", cwd=moved)
    assert "notes/n.md" in files


@pytest.mark.parametrize("name", ["café-notes", "笔记"])
def test_a_project_folder_named_in_any_script(env: Env, daemon: Daemon, name: str) -> None:
    repo = write(env.home / name, {"a.md": "# A\n\nzanzibar\n"})
    env.ok("init", cwd=repo)
    r = env.qmd("update", cwd=repo)
    assert r.returncode == 0, r.stderr
    assert "Indexed: 1 new" in r.stdout
