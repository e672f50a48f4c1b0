"""The daemon's own search page: `GET /` and its assets, served from `static/` in the package.

The page is a thin client of the same HTTP API the CLI speaks, so this module holds no
search logic: it serves three files with headers that make note text inert (a strict
Content-Security-Policy with no inline script or style, `nosniff`, no framing), and, when
the daemon has a token, turns a one-time ticket the CLI asked for into an HttpOnly cookie,
so the token never sits in the browser's history or in a script's reach.
"""

from __future__ import annotations

import hmac
import secrets
import time
from functools import cache
from pathlib import Path
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import BaseModel

from qmd.server.errors import Conflict, NotFound
from qmd.server.http.auth import COOKIE

STATIC = Path(__file__).with_name("static")
ASSETS = {
    "ui.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
"""The page's assets by name: only these are served, so no request path reaches the disk."""

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

LOGIN_PATH = "/ui/login"
TICKET_TTL_S = 60.0
"""How long a ticket from `qmd ui` waits for its browser: long enough to start one."""

router = APIRouter(include_in_schema=False)


class Ticket(BaseModel):
    """`POST /v1/ui/ticket`: where the browser goes once to trade the ticket for the cookie."""

    path: str


@cache
def _read(name: str) -> bytes:
    return (STATIC / name).read_bytes()


def _tickets(request: Request) -> dict[str, float]:
    tickets: dict[str, float] = request.app.state.ui_tickets
    now = time.monotonic()
    for ticket in [t for t, expiry in tickets.items() if expiry < now]:
        del tickets[ticket]
    return tickets


@router.post("/v1/ui/ticket", response_model=Ticket)
def ticket(request: Request) -> Ticket:
    """Behind the token like every route: only a holder of the token gets a ticket."""
    if request.app.state.token is None:
        raise Conflict("this daemon has no token: the page at / needs no ticket")
    value = secrets.token_urlsafe(24)
    _tickets(request)[value] = time.monotonic() + TICKET_TTL_S
    return Ticket(path=f"{LOGIN_PATH}?ticket={value}")


@router.get(LOGIN_PATH)
def login(request: Request, ticket: str = "", index: str = "", project: str = "") -> Response:
    """Open without the token (`auth.OPEN_PATHS`): a ticket is good once, for a minute, so
    the URL `qmd ui` opened is worthless in the browser's history."""
    tickets = _tickets(request)
    token: str | None = request.app.state.token
    match = next((t for t in tickets if hmac.compare_digest(t.encode(), ticket.encode())), None)
    if token is None or match is None:
        return JSONResponse(
            {"error": "this page link is used up or expired: run 'qmd ui' again for a new one"},
            status_code=401,
            headers=HEADERS,
        )
    del tickets[match]
    named = {k: v for k, v in (("index", index), ("project", project)) if v}  # the index the page serves
    response = RedirectResponse(f"/?{urlencode(named)}" if named else "/", status_code=303, headers=HEADERS)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
    return response


@router.get("/")
def page() -> Response:
    return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/ui/{name}")
def asset(name: str) -> Response:
    if name not in ASSETS:
        raise NotFound(f"no page asset '{name}'")
    return Response(_read(name), media_type=ASSETS[name], headers=HEADERS)
