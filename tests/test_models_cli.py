"""`qmd pull` and `qmd doctor` as a user runs them, with hf: models served by a
loopback stand-in for the hub (HF_ENDPOINT)."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MODELS_DIR, NOTES, Daemon, Env, require, write

# A real qmdd pulls and loads a model: integration, outside the fast run (-m "not slow").
pytestmark = pytest.mark.slow

MODEL = "all-MiniLM-L6-v2-Q8_0.gguf"


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[str]:
    """Serves /test/minilm/resolve/main/<MODEL> (a symlink to the shared test model)."""
    model = require(MODELS_DIR / MODEL, "the MiniLM test embedder")
    root = tmp_path / "hub"
    (root / "test" / "minilm" / "resolve" / "main").mkdir(parents=True)
    (root / "test" / "minilm" / "resolve" / "main" / MODEL).symlink_to(model)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_pull_doctor_embed_with_hf_model(env: Env, hub: str, tmp_path: Path) -> None:
    local = str(MODELS_DIR / MODEL)
    env.vars.update(
        HF_ENDPOINT=hub,
        QMD_EMBED_MODEL=f"hf:test/minilm/{MODEL}",
        QMD_RERANK_MODEL=local,
        QMD_GENERATE_MODEL=local,
    )
    d = Daemon(env)
    try:
        doctor = env.ok("doctor")
        assert f"⚠ embed: hf:test/minilm/{MODEL} (env) — not downloaded (run 'qmd pull')" in doctor
        assert "✓ SQLite" in doctor and "✓ sqlite-vec v" in doctor
        env.ok("collection", "add", str(write(tmp_path / "notes", NOTES)), "--name", "notes")
        r = env.qmd("vsearch", "bread")
        assert "is not downloaded yet (run 'qmd pull' or 'qmd embed')" in r.stderr
        out = env.ok("pull")
        cached = env.cache / "qmd" / "models" / "test" / "minilm" / "main" / MODEL
        assert f"✓ downloaded: {cached}" in out
        assert cached.stat().st_size == (MODELS_DIR / MODEL).stat().st_size
        assert f"✓ present: {cached}" in env.ok("pull")
        doctor = env.ok("doctor")
        assert f"✓ embed: hf:test/minilm/{MODEL} (env)" in doctor and "bert" in doctor
        assert "from 4 documents" in env.ok("embed")
        assert env.json("vsearch", "sourdough bread", "--json")[0]["file"] == "qmd://notes/cooking/bread.md"
        assert "nothing pending" in env.ok("doctor")
    finally:
        d.stop()


def test_pull_reports_each_failure_and_exits_1(env: Env, hub: str) -> None:
    env.vars.update(HF_ENDPOINT=hub, QMD_EMBED_MODEL="hf:test/minilm/missing.gguf")
    d = Daemon(env)
    try:
        r = env.qmd("pull")
        assert r.returncode == 1
        assert "missing.gguf" in r.stderr and "Traceback" not in r.stderr
    finally:
        d.stop()
