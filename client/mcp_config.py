"""`qmd mcp --print-config CLIENT`: the entry an MCP client's config file needs to reach this
qmd, so that nobody works out the JSON (or Codex's TOML) by hand.

Over stdio the entry starts this installation's own `qmd` by its full path, since a client
started from a desktop has a PATH of its own, without the venv's `bin`, and it carries the
variables that decide which daemon, config and index are reached, which such a client's
environment lacks too. Over HTTP it names `/mcp` on the daemon this environment reaches, with
the headers the CLI itself sends (the index, and the token when one is set).

Stdlib, click and qmd's stdlib modules only: the CLI imports this at start, for the client names.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import click

from qmd.connection import Daemon

SERVER_NAME = "qmd"
"""The key the entry is filed under in every client's config."""

CLIENT_SETTINGS = (
    "QMD_HOST",
    "QMD_PORT",
    "QMD_CONFIG_DIR",
    "QMD_TOKEN",
    "QMD_NO_AUTOSTART",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "INDEX_PATH",
)
"""What `qmd mcp` reads to find the daemon, the config, the token and the index."""


@dataclass(frozen=True)
class Stdio:
    """Start `command` with `args` and speak MCP over its stdin and stdout; `env` is added to
    the environment the client gives it."""

    command: str
    args: tuple[str, ...]
    env: dict[str, str]


@dataclass(frozen=True)
class Remote:
    """MCP Streamable HTTP at `url`, each request carrying `headers`."""

    url: str
    headers: dict[str, str]


Server = Stdio | Remote


def stdio_server(index: str | None, environ: Mapping[str, str] = os.environ, python: str = sys.executable) -> Stdio:
    """`qmd [--index NAME] mcp` as the interpreter running now has it installed: the `qmd`
    script beside it, else `python -m qmd.client.cli` (an install without scripts).

    The environment passed on is every qmd setting set here, the daemon's included: the
    bridge starts the daemon when none runs, and that daemon must be the one the CLI would
    start."""
    from qmd.settings import DAEMON_SETTINGS  # here: hashlib is not worth every CLI start

    here = os.path.abspath(python)  # not resolved: a venv's python links out of the venv
    script = shutil.which("qmd", path=str(Path(here).parent))
    launcher = [script] if script else [here, "-m", "qmd.client.cli"]
    args = (*launcher[1:], *(["--index", index] if index else []), "mcp")
    env = {name: environ[name] for name in (*CLIENT_SETTINGS, *DAEMON_SETTINGS) if environ.get(name)}
    return Stdio(launcher[0], args, env)


def http_server(daemon: Daemon) -> Remote:
    """`/mcp` on the daemon this environment reaches, with the headers the CLI sends there
    (which index, the bearer token) but none of its content negotiation."""
    return Remote(f"{daemon.url}/mcp", {k: v for k, v in daemon.headers.items() if k != "Accept"})


def secrets(server: Server) -> list[str]:
    """What in the entry must stay private: the token, an index URL or an endpoint's key."""
    from qmd.settings import SECRET_SETTINGS

    if isinstance(server, Remote):
        return ["the bearer token"] if "Authorization" in server.headers else []
    return [name for name in server.env if name == "QMD_TOKEN" or name in SECRET_SETTINGS]


# -- one spelling per client -------------------------------------------------------------------


def _entry(server: Server, *, typed: bool) -> dict[str, object]:
    """The server's object as the JSON configs spell it; a `typed` client wants the transport
    named ("stdio" or "http"), the others tell them apart by `command` or `url`."""
    fields: dict[str, object]
    if isinstance(server, Stdio):
        kind, fields = "stdio", {"command": server.command, "args": list(server.args), "env": server.env}
    else:
        kind, fields = "http", {"url": server.url, "headers": server.headers}
    head: dict[str, object] = {"type": kind} if typed else {}
    return head | {k: v for k, v in fields.items() if v != {}}


def _json(top: str, *, typed: bool) -> Callable[[Server], str]:
    def render(server: Server) -> str:
        return json.dumps({top: {SERVER_NAME: _entry(server, typed=typed)}}, indent=2, ensure_ascii=False)

    return render


def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, except that TOML also escapes DEL."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_table(values: Mapping[str, str]) -> str:
    return "{ " + ", ".join(f"{_toml_string(k)} = {_toml_string(v)}" for k, v in values.items()) + " }"


def _codex(server: Server) -> str:
    """Codex's `[mcp_servers.NAME]` table: `http_headers` over HTTP, since Codex refuses an
    inline `bearer_token`."""
    lines = [f"[mcp_servers.{SERVER_NAME}]"]
    if isinstance(server, Stdio):
        lines += [f"command = {_toml_string(server.command)}"]
        lines += [f"args = [{', '.join(_toml_string(a) for a in server.args)}]"]
        if server.env:
            lines.append(f"env = {_toml_table(server.env)}")
    else:
        lines.append(f"url = {_toml_string(server.url)}")
        if server.headers:
            lines.append(f"http_headers = {_toml_table(server.headers)}")
    return "\n".join(lines)


@dataclass(frozen=True)
class McpClient:
    """An MCP client: its name, where its config lives, how it spells a server, and whether
    that file can name an HTTP server at all."""

    title: str
    where: str
    render: Callable[[Server], str]
    http: bool = True


CLIENTS: dict[str, McpClient] = {
    "claude-desktop": McpClient(
        "Claude Desktop",
        "claude_desktop_config.json (Settings > Developer > Edit Config), merged into its mcpServers",
        _json("mcpServers", typed=False),
        http=False,
    ),
    "claude-code": McpClient(
        "Claude Code",
        ".mcp.json at the project's root, merged into its mcpServers",
        _json("mcpServers", typed=True),
    ),
    "cursor": McpClient(
        "Cursor", "~/.cursor/mcp.json, or .cursor/mcp.json in a project", _json("mcpServers", typed=False)
    ),
    "vscode": McpClient(
        "VS Code",
        ".vscode/mcp.json in the workspace, or the file 'MCP: Open User Configuration' opens",
        _json("servers", typed=True),
    ),
    "codex": McpClient("Codex", "~/.codex/config.toml", _codex),
}


def client_config(client: str, index: str | None, *, over_http: bool) -> tuple[str, str]:
    """(the configuration, for stdout; where it goes and what to keep private, for stderr)."""
    spec = CLIENTS[client]
    if over_http and not spec.http:
        raise click.UsageError(
            f"{spec.title}'s config file starts stdio servers only: drop --http "
            f"(qmd mcp --print-config {client} gives the stdio entry)"
        )
    daemon = Daemon(index)  # refuses a bad index name or token file as the bridge would, before printing
    server = http_server(daemon) if over_http else stdio_server(index)
    note = f"{spec.title}: put this in {spec.where}."
    if kept := secrets(server):
        note += f" It holds {', '.join(kept)}: keep that file private (chmod 600)."
    if over_http:
        note += " The daemon must be running: any qmd command starts it, or start qmdd at login."
    return spec.render(server), note
