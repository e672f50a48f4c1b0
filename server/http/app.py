"""The FastAPI application: routes behind the guard, errors as clear 4xx answers."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qmd.paths import IndexPaths
from qmd.server.engine import Engine
from qmd.server.errors import QmdError
from qmd.server.http import openapi
from qmd.server.http.auth import BearerAuth
from qmd.server.http.guard import GuardSettings, OriginHostGuard
from qmd.server.http.mcp import McpEndpoint
from qmd.server.http.peer import SameUser
from qmd.server.http.routes import model_threads, router
from qmd.server.http.ui import router as ui_router
from qmd.server.http.wire import http_status
from qmd.server.indexes import INDEX_HEADER, PROJECT_HEADER, Indexes, requested
from qmd.version import __version__

MAX_BODY_BYTES = 1024 * 1024
log = logging.getLogger("qmd.server")


class BodyLimit:
    """Answer 413 for request bodies over `limit` bytes.

    A declared Content-Length is checked up front; a chunked body is read (at most
    `limit` bytes) before the app sees it, then replayed, so an oversized upload is
    a 413 whatever the route does with its body.
    """

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > self.limit:
                await self._reject(send)
                return
            await self.app(scope, receive, send)
            return
        if b"chunked" not in headers.get(b"transfer-encoding", b""):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                break
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self._reject(send)
                return
            if not msg.get("more_body"):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay_receive() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replay_receive, send)

    async def _reject(self, send: Send) -> None:
        response = JSONResponse({"error": f"request body too large: the limit is {self.limit} bytes"}, status_code=413)
        await response({"type": "http"}, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("utf-8", "surrogateescape")  # a folder's name as the client's filesystem has it
    return None


def _requested(scope: Scope) -> IndexPaths | None:
    return requested(_header(scope, INDEX_HEADER.encode()), _header(scope, PROJECT_HEADER.encode()))


class IndexHeader:
    """Name the served index on every response (`x-qmd-index`), so a client that meant
    another index notices without a separate /health round trip. It sits outside the
    token check (a 401 names the index too) and so never opens one: it only reads the
    request's headers (a malformed one names the default; `IndexRouter` refuses it)."""

    def __init__(self, app: ASGIApp, default: str) -> None:
        self.app = app
        self.default = default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            paths = _requested(scope)
        except QmdError:
            paths = None
        header = (b"x-qmd-index", (paths.name if paths else self.default).encode())

        async def send_with_header(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                msg = {**msg, "headers": [*msg.get("headers", []), header]}
            await send(msg)

        await self.app(scope, receive, send_with_header)


SEARCHES = frozenset({"/query", "/search", "/v1/query", "/v1/keyword", "/v1/vector", "/mcp"})
"""The routes whose requests are searches (an MCP request is an agent's, waiting on its answer):
the worker hears of each from its arrival to its last byte (`WorkerClient.searching`), so that
background embedding makes way for its parsing and shaping as well as for its stages."""


class IndexRouter:
    """Serve each request from the index its headers name (`server/indexes.py`): the
    engine is opened if need be (off the event loop: opening migrates and reads the
    config), held for the whole request, streamed answers included, and handed to the
    routes as `request.state.engine`."""

    def __init__(self, app: ASGIApp, indexes: Indexes) -> None:
        self.app = app
        self.indexes = indexes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            paths = _requested(scope)
            engine = await anyio.to_thread.run_sync(self.indexes.acquire, paths)
        except QmdError as exc:
            response = JSONResponse({"error": exc.message, **exc.detail}, status_code=http_status(exc))
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["engine"] = engine
        try:
            with engine.worker.searching() if scope["path"] in SEARCHES else contextlib.nullcontext():
                await self.app(scope, receive, send)
        finally:
            self.indexes.release(paths)


def _describe(errors: list[dict[str, Any]]) -> str:
    """Turn pydantic errors into one sentence that says what to fix."""
    parts: list[str] = []
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        where = ".".join(loc) or "body"
        kind = err.get("type", "")
        if kind == "extra_forbidden":
            parts.append(f"unknown field '{where}'")
        elif kind == "missing":
            parts.append(f"missing required field '{where}'")
        elif kind == "json_invalid":
            parts.append(f"malformed JSON: {err.get('ctx', {}).get('error', err.get('msg'))}")
        else:
            parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(dict.fromkeys(parts))


def create_app(
    engine: Engine, guard: GuardSettings, token: str | None = None, indexes: Indexes | None = None
) -> ASGIApp:
    """The daemon's app over `engine`, its default index, and whatever other indexes
    requests name (`indexes`; by default opened plainly, without watchers)."""
    indexes = indexes or Indexes(engine, lambda paths, worker: Engine(paths, worker=worker))
    app = FastAPI(
        title="qmd",
        version=__version__,
        description="On-device search for markdown: keyword search now, vectors and reranking next.",
    )
    app.state.indexes = indexes
    app.state.log = log
    model_threads()  # a bad QMD_MODEL_THREADS is an error at start-up, not at the first vector search
    app.include_router(router)
    app.include_router(ui_router)  # the search page: outside the schema, a client like the CLI
    app.state.token, app.state.ui_tickets = token, {}
    openapi.install(app, router)
    # MCP (spec §20) is a route of this app, so every middleware and the guard screen it too.
    # An ASGI app is a valid endpoint (Starlette's Route serves any non-function callable
    # as ASGI), but add_route's annotation only names request handlers.
    app.add_route("/mcp", McpEndpoint(), methods=["POST"], include_in_schema=False)  # type: ignore[arg-type]

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        message = _describe(errors)
        extra = [
            ".".join(str(x) for x in e["loc"] if x != "body") for e in errors if e.get("type") == "extra_forbidden"
        ]
        return JSONResponse(
            {"error": message, "unknown_fields": extra} if extra else {"error": message}, status_code=400
        )

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        """Errors FastAPI raises itself (no such route, a body it cannot parse) in the same
        `{"error": …}` shape as every other answer."""
        message = str(exc.detail)
        if message == "There was an error parsing the body":
            message = "the request body could not be parsed as JSON (malformed, or nested too deeply)"
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(QmdError)
    async def _qmd(_: Request, exc: QmdError) -> JSONResponse:
        return JSONResponse({"error": exc.message, **exc.detail}, status_code=http_status(exc))

    @app.exception_handler(Exception)
    async def _fault(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)

    # The token and peer checks sit inside the guard (a foreign page is refused before it
    # can probe for a token) and inside IndexHeader (a 401 still names the index, as the
    # CLI expects).
    # Without a token, only the daemon's own user may use it (peer uid of loopback
    # connections); a token is how it is shared on purpose, and replaces that check.
    routed = BodyLimit(IndexRouter(app, indexes))
    inner = BearerAuth(routed, token) if token is not None else SameUser(routed)
    return OriginHostGuard(IndexHeader(inner, engine.paths.name), guard)
