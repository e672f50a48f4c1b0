"""`qmd pull` and `qmd doctor` as a user runs them, with hf: models served by a
loopback stand-in for the hub (HF_ENDPOINT)."""

from __future__ import annotations

import functools
import http.server
import json
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
        assert "documents 4 ·" in env.ok("embed")
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


def test_without_the_models_extra(env: Env, tmp_path: Path) -> None:
    """qmd installed without `[models]`: keyword search, get, status and MCP answer; every model
    stage says what to install. The daemon runs where `import llama_cpp` fails (a package
    on PYTHONPATH that raises ImportError, the way a missing or broken install does)."""
    model = str(require(MODELS_DIR / MODEL, "the MiniLM test embedder"))
    shim = write(
        tmp_path / "no-llama", {"llama_cpp/__init__.py": "raise ImportError(\"No module named 'llama_cpp'\")\n"}
    )
    env.vars.update(PYTHONPATH=str(shim), QMD_EMBED_MODEL=model, QMD_GENERATE_MODEL=model, QMD_RERANK_MODEL=model)
    install = "Keyword search works without it; install it with: "
    d = Daemon(env)
    try:
        env.ok("collection", "add", str(write(tmp_path / "notes", NOTES)), "--name", "notes")
        assert env.json("search", "sourdough", "--json")[0]["file"] == "qmd://notes/cooking/bread.md"
        assert "Raising a seed round" in env.ok("get", "notes/fundraising.md")
        r = env.qmd("embed")
        assert r.returncode == 1 and "Traceback" not in r.stderr
        assert "model support is not installed: No module named 'llama_cpp'" in r.stderr
        assert install in r.stderr and "[models]" in r.stderr
        r = env.qmd("vsearch", "sourdough", "--json")
        assert r.returncode == 0 and "model support is not installed" in r.stderr
        assert "showing keyword results instead" in r.stderr
        assert json.loads(r.stdout)[0]["file"] == "qmd://notes/cooking/bread.md"
        r = env.qmd("query", "bread", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)[0]["file"] == "qmd://notes/cooking/bread.md"
        assert "reranking unavailable — model support is not installed" in r.stderr
        assert "model support is not installed" in env.ok("status")
        assert "⚠ model support is not installed" in env.ok("doctor")
        call = {"name": "query", "arguments": {"searches": [{"type": "lex", "query": "sourdough"}]}}
        answer = d.http.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call},
            headers={"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"},
        )
        assert answer.status_code == 200 and "bread.md" in answer.text, answer.text
        inference = d.http.get("/v1/status").json()["inference"]
        assert inference["restarts"] == 0 and inference["last_crash"] is None, "a missing extra is not a crash"
    finally:
        d.stop()


def test_no_gpu_and_verbose(env: Env, tmp_path: Path) -> None:
    """`--no-gpu` reaches the daemon a command starts (QMD_FORCE_CPU=1); a daemon already running
    keeps its own setting and the CLI says so. `-v` says the daemon's start, round trips, every
    stage of a query and which models loaded, and how long that took."""
    env.vars.update(
        QMD_EMBED_MODEL=str(require(MODELS_DIR / MODEL, "the MiniLM test embedder")), QMD_EMBED_PARALLELISM="2"
    )
    notes = write(tmp_path / "notes", NOTES)
    try:
        r = env.qmd("--no-gpu", "-v", "collection", "add", str(notes), "--name", "notes")
        assert r.returncode == 0, r.stderr
        assert "started qmdd (PID" in r.stderr and "POST /v1/collections:" in r.stderr
        assert "--no-gpu:" not in r.stderr, "the daemon it started has the setting"
        doctor = env.ok("doctor")
        assert "GPU refused (QMD_FORCE_CPU / --no-gpu)" in doctor and "embed parallelism 2" in doctor
        r = env.qmd("-v", "embed")
        assert r.returncode == 0, r.stderr
        assert f"model {MODEL} (embed): loaded in " in r.stderr and "2 contexts embedding in parallel" in r.stderr
        assert "inference worker PID" in r.stderr and ": CPU, 2 threads" in r.stderr
        r = env.qmd("-v", "vsearch", "sourdough")
        assert r.returncode == 0 and "POST /v1/vector:" in r.stderr and "(embed): already loaded" in r.stderr
        assert "started qmdd" not in r.stderr
        r = env.qmd("-v", "query", "sourdough bread", "--no-rerank")
        assert r.returncode == 0 and "vector: ran (" in r.stderr and "total: " in r.stderr, r.stderr
        assert env.qmd("search", "bread").stderr == "", "without -v, nothing extra"
    finally:
        env.qmd("daemon", "stop")
    d = Daemon(env)  # started without --no-gpu (no QMD_FORCE_CPU)
    try:
        r = env.qmd("--no-gpu", "search", "sourdough")
        assert r.returncode == 0 and "qmd://notes/cooking/bread.md" in r.stdout
        assert f"--no-gpu: the running daemon (PID {d.pid}) was started without it and keeps its setting" in r.stderr
        assert "qmd daemon stop" in r.stderr
    finally:
        d.stop()
