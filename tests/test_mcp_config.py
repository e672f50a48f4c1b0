"""`qmd mcp --print-config CLIENT`: what it prints is read back the way each client's documented
format has it, and the MCP SDK's client, given exactly those settings, reaches the daemon."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from conftest import NOTES, Daemon, Env, write
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from qmd.client.mcp_config import CLIENTS, Remote, Server, Stdio, stdio_server

TOKEN = "s3cret-t0ken"
HTTP_CLIENTS = [name for name, spec in CLIENTS.items() if spec.http]


def launch_of(client: str, text: str) -> Server:
    """What CLIENT makes of the printed config, read as its documentation spells a server:
    `mcpServers` (Claude Desktop, Claude Code, Cursor) or `servers` (VS Code) in JSON, a
    `type` where the client wants one, and Codex's `[mcp_servers.NAME]` TOML table."""
    if client == "codex":
        entry = tomllib.loads(text)["mcp_servers"]["qmd"]
        assert set(entry) <= {"command", "args", "env", "url", "http_headers"}, entry
        if "url" in entry:
            return Remote(entry["url"], entry.get("http_headers", {}))
        return Stdio(entry["command"], tuple(entry["args"]), entry.get("env", {}))
    document = json.loads(text)
    ((name, entry),) = document["servers" if client == "vscode" else "mcpServers"].items()
    assert name == "qmd" and len(document) == 1
    kind = entry.pop("type") if client in ("claude-code", "vscode") else ("http" if "url" in entry else "stdio")
    if kind == "http":
        assert set(entry) <= {"url", "headers"}, entry
        return Remote(entry["url"], entry.get("headers", {}))
    assert kind == "stdio" and set(entry) <= {"command", "args", "env"}, entry
    return Stdio(entry["command"], tuple(entry["args"]), entry.get("env", {}))


async def reach(server: Server) -> tuple[list[str], str]:
    """The tools the MCP SDK client finds with these settings, and the top hit's file for 'sourdough'."""
    async with httpx2.AsyncClient(headers=server.headers if isinstance(server, Remote) else None) as http:
        target: StdioServerParameters | object = (
            StdioServerParameters(command=server.command, args=list(server.args), env=server.env)
            if isinstance(server, Stdio)
            else streamable_http_client(server.url, http_client=http)
        )
        async with Client(target, read_timeout_seconds=60) as client:  # type: ignore[arg-type]
            tools = [t.name for t in (await client.list_tools()).tools]
            found = await client.call_tool("query", {"searches": [{"type": "lex", "query": "sourdough"}]})
            assert found.structured_content is not None, found
            return tools, found.structured_content["results"][0]["file"]


def printed(env: Env, *args: str, extra: dict[str, str] | None = None) -> tuple[str, str]:
    r = env.qmd(*args, env=extra)
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


@pytest.fixture(scope="module")
def tokened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """A daemon that demands a bearer token (QMD_TOKEN), with the notes indexed."""
    base = tmp_path_factory.mktemp("mcp-config")
    env = Env(base)
    env.vars["QMD_TOKEN"] = TOKEN
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    env.ok("collection", "add", str(write(base / "notes", NOTES)), "--name", "notes")
    yield env
    d.stop()


@pytest.fixture
def desktop(tokened: Env, monkeypatch: pytest.MonkeyPatch) -> Env:
    """The test process as a desktop client is: its own HOME and working directory, and none
    of the installation's variables, which must come from the printed config."""
    monkeypatch.setenv("HOME", str(tokened.home))
    monkeypatch.chdir(tokened.home)
    for name in [k for k in os.environ if k.startswith(("QMD_", "XDG_"))]:
        monkeypatch.delenv(name)
    return tokened


# -- connecting with what is printed ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_the_printed_stdio_config_connects(desktop: Env, client: str) -> None:
    out, note = printed(desktop, "mcp", "--print-config", client)
    server = launch_of(client, out)
    assert isinstance(server, Stdio)
    assert Path(server.command).is_absolute() and server.args[-1] == "mcp"
    # Where the index, config and daemon are, and the token, all travel with the entry.
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "QMD_PORT", "QMD_TOKEN", "QMD_WATCH"):
        assert server.env[name] == desktop.vars[name]
    assert "HOME" not in server.env and "PATH" not in server.env
    assert CLIENTS[client].title in note and "QMD_TOKEN" in note and "private" in note
    tools, top = anyio.run(reach, server)
    assert tools == ["query", "get", "multi_get", "metadata", "status"]
    assert top == "qmd://notes/cooking/bread.md"


@pytest.mark.slow
@pytest.mark.parametrize("client", HTTP_CLIENTS)
def test_the_printed_http_config_connects_with_the_token(desktop: Env, client: str) -> None:
    out, note = printed(desktop, "mcp", "--http", "--print-config", client)
    server = launch_of(client, out)
    assert isinstance(server, Remote)
    assert server.url == f"http://127.0.0.1:{desktop.port}/mcp"
    assert server.headers["Authorization"] == f"Bearer {TOKEN}"
    assert "bearer token" in note and "must be running" in note
    tools, top = anyio.run(reach, server)
    assert "query" in tools and top == "qmd://notes/cooking/bread.md"


@pytest.mark.slow
def test_without_the_printed_token_the_daemon_refuses(desktop: Env) -> None:
    """The Authorization header is what lets the HTTP entry in."""
    out, _ = printed(desktop, "mcp", "--http", "--print-config", "cursor")
    server = launch_of("cursor", out)
    assert isinstance(server, Remote)
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    accept = {"Accept": "application/json, text/event-stream"}
    bare = {k: v for k, v in server.headers.items() if k != "Authorization"}
    assert httpx.post(server.url, json=initialize, headers={**bare, **accept}).status_code == 401
    assert httpx.post(server.url, json=initialize, headers={**server.headers, **accept}).status_code == 200


# -- what is printed, without a daemon -----------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_each_format_reads_back_what_was_meant(env: Env, client: str) -> None:
    """Names that need escaping survive each format, TOML included (quotes, backslashes, DEL,
    newlines, non-ASCII)."""
    odd = 'C:\\notes "q"\x7f\nnaïve 🍞'
    out, _ = printed(env, "--index", "work", "mcp", "--print-config", client, extra={"QMD_EMBED_MODEL": odd})
    server = launch_of(client, out)
    assert isinstance(server, Stdio)
    assert server.args[-3:] == ("--index", "work", "mcp") and server.env["QMD_EMBED_MODEL"] == odd
    assert server.env["XDG_CONFIG_HOME"] == env.vars["XDG_CONFIG_HOME"] and "NO_COLOR" not in server.env


@pytest.mark.parametrize("client", HTTP_CLIENTS)
def test_the_http_entry_names_the_index_and_no_token_when_none_is_set(env: Env, client: str) -> None:
    out, note = printed(env, "--index", "work", "mcp", "--http", "--print-config", client)
    server = launch_of(client, out)
    assert server == Remote(f"http://127.0.0.1:{env.port}/mcp", {"x-qmd-index": "work"})
    assert "private" not in note


def test_the_command_is_the_qmd_beside_the_interpreter(tmp_path: Path) -> None:
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    python = bindir / "python"
    assert stdio_server(None, {}, str(python)) == Stdio(str(python), ("-m", "qmd.client.cli", "mcp"), {})
    script = bindir / "qmd"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    env = {"QMD_PORT": "9", "HOME": "/h", "PATH": "/bin", "QMD_INDEX_URL": "", "QMD_RERANK_API_KEY": "k"}
    assert stdio_server("x", env, str(python)) == Stdio(
        str(script), ("--index", "x", "mcp"), {"QMD_PORT": "9", "QMD_RERANK_API_KEY": "k"}
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["mcp", "--http", "--print-config", "claude-desktop"], "starts stdio servers only: drop --http"),
        (["mcp", "--print-config", "cursor", "--port", "9000"], "do not go with --print-config"),
        (["mcp", "--http", "--daemon", "--print-config", "cursor"], "do not go with --print-config"),
        (["mcp", "--print-config", "emacs"], "'emacs' is not one of 'claude-desktop'"),
        (["--index", "a b", "mcp", "--http", "--print-config", "cursor"], "invalid index name"),
        (["--index", "a b", "mcp", "--print-config", "codex"], "invalid index name"),
    ],
)
def test_what_cannot_be_printed_is_refused_cleanly(env: Env, args: list[str], message: str) -> None:
    r = env.qmd(*args)
    assert r.returncode in (1, 2) and message in r.stderr and r.stdout == ""
    assert "Traceback" not in r.stderr


def test_an_unusable_token_file_is_said_not_printed(env: Env) -> None:
    token = env.config / "qmd" / "token"
    token.parent.mkdir(parents=True)
    token.write_text("t")
    token.chmod(0o644)
    for over_http in (["--http"], []):
        r = env.qmd("mcp", *over_http, "--print-config", "vscode")
        assert r.returncode == 1 and "chmod 600" in r.stderr and r.stdout == ""
