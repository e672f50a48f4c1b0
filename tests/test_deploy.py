"""The login units start the same command the tests run, and are valid files."""

from __future__ import annotations

import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def _exec_args(unit: str) -> list[str]:
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    return line.split("=", 1)[1].split()


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    unit = (DEPLOY / "qmdd.service").read_text()
    qmdd = Path(sys.executable).with_name("qmdd")
    local = tmp_path / "qmdd.service"
    local.write_text(unit.replace("%h/.local/bin/qmdd", str(qmdd)))
    r = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_units_run_valid_qmdd_arguments() -> None:
    unit_args = _exec_args((DEPLOY / "qmdd.service").read_text())
    plist_args = plistlib.loads((DEPLOY / "com.qmd.qmdd.plist").read_bytes())["ProgramArguments"]
    for args in (unit_args, plist_args):
        assert args[0].endswith("/qmdd")
        # --help after the real arguments: click parses them all and fails on any bad one.
        r = subprocess.run(
            [sys.executable, "-m", "qmd.server.daemon", *args[1:], "--help"], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
