"""Optional bearer token: when one is configured, every route but `/health` needs it.

The Origin/Host guard keeps browsers out, but not another local user or, in a
container, anything that can reach the published port. A token closes that gap.
It comes from `QMD_TOKEN`, or from a token file only its owner can read (the
daemon, the CLI and the bridge all read the same file, so setting one up is
`umask 077; openssl rand -hex 32 > ~/.config/qmd/token`).

Stdlib only at import: the thin CLI and the stdio bridge import `load_token` to
send the token, and must stay fast to start.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from .paths import config_root

TOKEN_ENV = "QMD_TOKEN"
TOKEN_FILE = "token"
OPEN_PATHS = frozenset({"/health"})
"""Routes that answer without the token: container and login-manager probes have none."""

# ASGI's types, spelled out so importing this module does not import starlette.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class TokenError(Exception):
    """The configured token cannot be used; the message says what to fix."""


def token_path(environ: dict[str, str] | os._Environ = os.environ) -> Path:
    """Where the token file lives: beside the index config (`$XDG_CONFIG_HOME/qmd/token`)."""
    return config_root(environ) / TOKEN_FILE


def load_token(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """The bearer token in force, or None when none is configured.

    `QMD_TOKEN` wins over the file. A token file that group or others can read is
    refused rather than used: a secret anyone on the machine can read protects
    nothing, and silently ignoring it would leave the daemon open while the user
    believes it is closed.
    """
    value = (environ.get(TOKEN_ENV) or "").strip()
    if value:
        return value
    path = token_path(environ)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TokenError(f"cannot read the token file {path}: {e.strerror or e}") from e
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TokenError(
                f"the token file {path} is accessible by group or others (mode {stat.filemode(mode)}); "
                f"make it private with: chmod 600 {path}"
            )
        token = fh.read().decode("utf-8", "replace").strip()
    if not token:
        raise TokenError(f"the token file {path} is empty; put a token in it or remove it")
    return token


class BearerAuth:
    """ASGI middleware: `Authorization: Bearer <token>` on every route but `/health`.

    Pure ASGI like the guard, so the mounted MCP endpoint and streaming responses
    are covered and a rejected request's body is never read. Comparison is
    constant-time (`hmac.compare_digest`) so response timing does not leak how
    much of a guess was right. A request with several Authorization headers is
    refused: two readers could disagree on which one counts.
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        import hmac  # here, not at the top: the CLI imports this module and hmac costs it 1.5 ms

        given = [v for k, v in scope.get("headers", ()) if k.lower() == b"authorization"]
        if len(given) == 1 and hmac.compare_digest(given[0].strip(), self.expected):
            await self.app(scope, receive, send)
            return
        reason = "missing bearer token" if not given else "wrong bearer token"
        body = json.dumps(
            {"error": f"unauthorized: {reason}. Send 'Authorization: Bearer <token>' (QMD_TOKEN or {TOKEN_FILE} file)"}
        ).encode()
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="qmd"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})


def require_token(app: ASGIApp, token: str | None) -> ASGIApp:
    """`app` behind `BearerAuth` when a token is configured, else `app` itself."""
    return app if token is None else BearerAuth(app, token)
