"""The package type-checks (mypy, configured in pyproject.toml) under its import name.

mypy reads the tree as it is: `qmd/server`, `qmd/client` and `qmd/mcp_bridge` are links to
the top-level folders, so `-p qmd` from the checkout is the package pip installs. Paths in
its report are then `qmd/server/...` for `server/...`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# mypy over the package takes seconds even with its cache: outside the fast run (-m "not slow").
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_clean() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "-p", "qmd", "--config-file", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"MYPY_CACHE_DIR": str(ROOT / ".mypy_cache"), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
