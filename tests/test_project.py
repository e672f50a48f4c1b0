"""Project-local indexes: finding the project a command runs in (`qmd.paths`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmd.paths import IndexPaths, find_project, is_project_root


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
