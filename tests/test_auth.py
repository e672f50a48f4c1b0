"""Optional bearer token: every route but /health needs it once configured, and the
CLI and the bridge send it (from QMD_TOKEN or a private token file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Daemon, Env

from qmd.token import TokenError, load_token, token_path

TOKEN = "s3cret-token-for-tests"
MCP_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}


def write_token(env: Env, mode: int, text: str = TOKEN) -> Path:
    path = token_path({"XDG_CONFIG_HOME": str(env.config)})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


# -- where the token comes from -----------------------------------------------------------


def test_load_token_sources(env: Env) -> None:
    environ = {"XDG_CONFIG_HOME": str(env.config)}
    assert load_token(environ) is None
    write_token(env, 0o600)
    assert load_token(environ) == TOKEN
    assert load_token({**environ, "QMD_TOKEN": "from-env"}) == "from-env"  # the variable wins


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_token_file_readable_by_others_is_refused(env: Env, mode: int) -> None:
    path = write_token(env, mode)
    with pytest.raises(TokenError, match=f"chmod 600 {path}"):
        load_token({"XDG_CONFIG_HOME": str(env.config)})


def test_empty_token_file_is_refused(env: Env) -> None:
    write_token(env, 0o600, "  ")
    with pytest.raises(TokenError, match="is empty"):
        load_token({"XDG_CONFIG_HOME": str(env.config)})


# -- the daemon ---------------------------------------------------------------------------------


@pytest.fixture
def locked(env: Env) -> Iterator[Daemon]:
    d = Daemon(env, extra_env={"QMD_TOKEN": TOKEN})
    env.vars["QMD_NO_AUTOSTART"] = "1"
    yield d
    d.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "method,path,body",
    [
        ("GET", "/v1/status", None),
        ("POST", "/query", {"searches": []}),
        ("POST", "/mcp", MCP_LIST),
        ("GET", "/docs", None),
    ],
)
def test_routes_need_the_token(locked: Daemon, method: str, path: str, body: dict | None) -> None:
    h = locked.http
    for headers in ({}, bearer("wrong"), {"Authorization": TOKEN}, bearer(TOKEN + "x")):
        r = h.request(method, path, json=body, headers={**MCP_HEADERS, **headers})
        assert r.status_code == 401, (headers, r.text)
        assert "unauthorized" in r.json()["error"] and r.headers["www-authenticate"].startswith("Bearer")
        assert r.headers["x-qmd-index"] == "index"
    r = h.request(method, path, json=body, headers={**MCP_HEADERS, **bearer(TOKEN)})
    assert r.status_code != 401


@pytest.mark.slow
def test_health_needs_no_token(locked: Daemon) -> None:
    assert locked.http.get("/health").json()["status"] == "ok"


@pytest.mark.slow
def test_two_authorization_headers_are_refused(locked: Daemon) -> None:
    r = locked.http.get("/v1/status", headers=[("Authorization", f"Bearer {TOKEN}"), ("Authorization", "Bearer x")])
    assert r.status_code == 401


@pytest.mark.slow
def test_guard_still_answers_first(locked: Daemon) -> None:
    r = locked.http.get("/v1/status", headers={"Origin": "http://evil.example", **bearer(TOKEN)})
    assert r.status_code == 403 and r.json()["error"]["code"] == -32003


@pytest.mark.slow
def test_cli_sends_the_token(env: Env, locked: Daemon) -> None:
    r = env.qmd("status")
    assert r.returncode == 1 and "unauthorized: missing bearer token" in r.stderr
    assert "Traceback" not in r.stderr
    assert "QMD Status" in env.ok("status", env={"QMD_TOKEN": TOKEN})
    write_token(env, 0o600)
    assert "QMD Status" in env.ok("status")  # from the token file


@pytest.mark.slow
def test_bridge_sends_the_token(env: Env, locked: Daemon) -> None:
    lines = (json.dumps(MCP_LIST) + "\n").encode()
    bridge = [sys.executable, "-m", "qmd.client.cli", "mcp"]
    denied = subprocess.run(bridge, input=lines, env=env.vars, capture_output=True, timeout=60)
    (answer,) = [json.loads(x) for x in denied.stdout.splitlines()]
    assert denied.returncode == 0 and "HTTP 401" in answer["error"]["message"]
    allowed = subprocess.run(bridge, input=lines, env={**env.vars, "QMD_TOKEN": TOKEN}, capture_output=True, timeout=60)
    (answer,) = [json.loads(x) for x in allowed.stdout.splitlines()]
    assert [t["name"] for t in answer["result"]["tools"]] == ["query", "get", "multi_get", "metadata", "status"]


@pytest.mark.slow
def test_token_file_starts_a_locked_daemon(env: Env) -> None:
    write_token(env, 0o600)
    d = Daemon(env)
    try:
        assert d.http.get("/v1/status").status_code == 401
        assert d.http.get("/v1/status", headers=bearer(TOKEN)).status_code == 200
        assert "a bearer token is required" in d.output.read_text()
    finally:
        d.stop()


@pytest.mark.slow
def test_bad_permissions_refused_by_daemon_and_cli(env: Env) -> None:
    path = write_token(env, 0o644)
    r = env.qmdd()
    assert r.returncode == 1
    assert f"accessible by group or others (mode -rw-r--r--); make it private with: chmod 600 {path}" in r.stderr
    cli = env.qmd("status")
    assert cli.returncode == 1 and f"chmod 600 {path}" in cli.stderr and "Traceback" not in cli.stderr
    assert not (env.cache / "qmd" / "qmdd.pid").exists()  # nothing was started
    assert env.ok("daemon", "stop").strip() == "Not running (no PID file)."  # stopping needs no token
    assert os.stat(path).st_mode & 0o777 == 0o644  # and the file was left as it was
