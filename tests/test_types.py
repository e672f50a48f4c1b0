"""The package type-checks (mypy, configured in pyproject.toml) under its import name.

mypy cannot follow setuptools' editable-install finder, and the folders are not laid
out as the package (`server/` is `qmd.server`), so the check runs over a tree of
symlinks shaped like the installed package. Paths in its report are then
`qmd/server/...` for `server/...`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# mypy over the package takes seconds even with its cache: outside the fast run (-m "not slow").
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {"server": "server", "client": "client", "mcp_bridge": "mcp_bridge"}


def package_tree() -> Path:
    """`.typecheck/qmd`: the package as pip installs it, made of links to the sources."""
    tree = ROOT / ".typecheck" / "qmd"
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    for src in (ROOT / "qmd").glob("*.py"):
        (tree / src.name).symlink_to(src)
    for name, folder in PACKAGE_DIRS.items():
        (tree / name).symlink_to(ROOT / folder, target_is_directory=True)
    return tree.parent


def test_mypy_clean() -> None:
    where = package_tree()
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "-p", "qmd", "--config-file", str(ROOT / "pyproject.toml")],
        cwd=where,
        capture_output=True,
        text=True,
        env={"MYPY_CACHE_DIR": str(ROOT / ".mypy_cache"), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
