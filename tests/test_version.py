"""One version, readable everywhere: `qmd --version`, `qmdd --version`, /health and
`qmd daemon status` say qmd/version.py's, and CHANGELOG.md's newest entry is that version.
(tests/test_wheel.py checks the built wheel's metadata and the installed commands say it too.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT, Daemon, Env

from qmd.version import __version__


@pytest.mark.parametrize(("module", "name"), [("qmd.client.cli", "qmd"), ("qmd.server.daemon", "qmdd")])
def test_the_commands_say_the_packages_version(module: str, name: str) -> None:
    r = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True)
    assert (r.returncode, r.stdout) == (0, f"{name}, version {__version__}\n")


@pytest.mark.slow
def test_health_and_daemon_status_say_it_too(env: Env, daemon: Daemon) -> None:
    assert daemon.http.get("/health").json()["version"] == __version__
    assert json.loads(env.ok("daemon", "status", "--json"))["version"] == __version__


def test_the_changelog_leads_with_this_version() -> None:
    headings = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings[0] == __version__ and len(headings) == len(set(headings))
