"""The code stays linted and formatted (ruff, configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ["qmd", "server", "client", "mcp_bridge", "tests", "bench", "docs"]


def test_ruff_check() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", *TREES], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", *TREES], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
