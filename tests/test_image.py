"""The container image, built and run with podman (deploy/check-image.sh): only when asked
(`QMD_TEST_IMAGE=1`, which .ci/run sets), since a first build compiles llama.cpp into it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent.parent / "deploy" / "check-image.sh"


@pytest.mark.skipif(os.environ.get("QMD_TEST_IMAGE") != "1", reason="set QMD_TEST_IMAGE=1 to build and run the image")
@pytest.mark.timeout(3600)
def test_the_image_builds_runs_indexes_searches_and_is_healthy() -> None:
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "OK: image built, ran, indexed, searched, healthy, non-root, stopped, kept its index" in r.stdout
