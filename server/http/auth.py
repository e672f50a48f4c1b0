"""Bearer-token middleware: when a token is configured, every route but `/health` needs it.

The Origin/Host guard keeps browsers out, but not another local user or, in a
container, anything that can reach the published port. A token closes that gap;
where it comes from is `qmd.token`.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

OPEN_PATHS = frozenset({"/health", "/ui/login"})
"""Routes that answer without the token: container and login-manager probes have none, and
the search page's login takes a one-time ticket instead (`server/http/ui.py`)."""
COOKIE = "qmd_token"
"""The search page's HttpOnly, SameSite=Strict cookie: the token, for a browser that cannot send a header."""

# ASGI's types, spelled out so importing this module does not import starlette.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


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
        self.expected = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = [v for k, v in scope.get("headers", ()) if k.lower() == b"authorization"]
        scheme, _, credentials = given[0].strip().partition(b" ") if len(given) == 1 else (b"", b"", b"")
        if not given:
            cookies = [c.strip() for k, v in scope.get("headers", ()) if k.lower() == b"cookie" for c in v.split(b";")]
            named = f"{COOKIE}=".encode()
            scheme, credentials = b"bearer", next((c[len(named) :] for c in cookies if c.startswith(named)), b"")
        # The scheme is case-insensitive (RFC 9110 §11.1): `bearer` is `Bearer`.
        if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self.expected):
            await self.app(scope, receive, send)
            return
        reason = "missing bearer token" if not given else "wrong bearer token"
        body = json.dumps(
            {"error": f"unauthorized: {reason}. Send 'Authorization: Bearer <token>' (QMD_TOKEN or the token file)"}
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
