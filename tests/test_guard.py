"""Origin / Host guard (spec §21.3): the predicates, the settings, and the middleware.

The predicates are pure, so each rule is pinned by a table of header values. The
middleware is then exercised through a real FastAPI app with a mounted streaming
sub-app (the shape of the daemon's `/mcp`) to prove that rejection happens before
routing on every path and that allowed traffic -- streaming included -- is untouched.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient, WebSocketDenialResponse
from starlette.types import Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from qmd.server.http.guard import (
    GuardSettings,
    OriginHostGuard,
    check_host,
    check_origin,
    is_loopback_hostname,
)

DISABLED_WARNING = (
    "Warning: QMD_ALLOWED_ORIGINS=* — DNS-rebinding protection is off. "
    "Only do this behind your own authenticating proxy."
)


def host_warning(host: str) -> str:
    return (
        f"Warning: bound to {host} with no QMD_ALLOWED_HOSTS — Host validation is off "
        "and the index is readable by anyone who can reach this port."
    )


def settings(bind: str = "localhost", origins: str | None = None, hosts: str | None = None) -> GuardSettings:
    return GuardSettings.build(bind, origins, hosts)[0]


LOCAL = settings()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- loopback hostnames -------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LOCALHOST",
        " localhost ",
        "app.localhost",
        "a.b.LocalHost",
        "::1",
        "[::1]",
        "0:0:0:0:0:0:0:1",
        "[0:0:0:0:0:0:0:1]",
        "127.0.0.1",
        "127.1.2.3",
        "127.255.255.255",
        "127.000.000.001",
        "::ffff:127.0.0.1",
        "[::ffff:127.0.0.1]",
        "::FFFF:127.9.9.9",
        "::ffff:7f00:1",
    ],
)
def test_loopback_hostnames(host: str) -> None:
    assert is_loopback_hostname(host)


@pytest.mark.parametrize(
    "host",
    [
        "0.0.0.0",
        "[0.0.0.0]",
        "::",
        "[::]",
        "",
        "128.0.0.1",
        "10.0.0.1",
        "192.168.1.1",
        "127.0.0",
        "127.0.0.1.evil.com",
        "127.0.0.1234",
        "localhost.evil.com",
        "notlocalhost",
        "evil.com",
        "::2",
        "fe80::1",
        "::ffff:10.0.0.1",
        "::ffff:0.0.0.0",
    ],
)
def test_not_loopback_hostnames(host: str) -> None:
    assert not is_loopback_hostname(host)


# --- settings -------------------------------------------------------------------------


@pytest.mark.parametrize("bind", ["localhost", "127.0.0.1", "::1", "[::1]", "LocalHost"])
def test_loopback_bind_enforces_host_without_extra_hosts(bind: str) -> None:
    s, warnings = GuardSettings.build(bind, None, None)
    assert s == GuardSettings(frozenset(), frozenset(), disabled=False, enforce_host=True)
    assert warnings == []


def test_concrete_bind_trusts_itself() -> None:
    s, warnings = GuardSettings.build(" MyBox.LAN ", None, "Other.Example")
    assert s.allowed_hosts == {"mybox.lan", "other.example"}
    assert s.enforce_host and warnings == []
    assert check_host("mybox.lan:8181", s)
    assert check_host("MYBOX.lan", s)
    assert check_host("other.example:1", s)
    assert not check_host("evil.example:8181", s)


def test_concrete_ipv6_bind_matches_its_bracketed_host() -> None:
    s = settings("fe80::1")
    assert check_host("[fe80::1]:8181", s)
    assert check_host("[FE80::1]", s)
    assert not check_host("[fe80::2]:8181", s)


@pytest.mark.parametrize("bind", ["", "0.0.0.0", "::", "[::]", "*", " 0.0.0.0 "])
def test_wildcard_bind_skips_host_check_and_warns(bind: str) -> None:
    s, warnings = GuardSettings.build(bind, None, None)
    assert not s.enforce_host and not s.disabled
    assert s.allowed_hosts == frozenset()
    assert warnings == [host_warning(bind)]
    assert check_host("anything.example:8181", s)
    assert check_host("not a host", s)
    # Origin is still enforced: browsers are the threat and always send it.
    assert not check_origin("https://evil.example", s)


def test_wildcard_bind_with_allowlist_enforces_host() -> None:
    s, warnings = GuardSettings.build("0.0.0.0", None, "box.example")
    assert s.enforce_host and warnings == []
    assert check_host("box.example:8181", s)
    assert check_host("localhost:8181", s)
    assert not check_host("evil.example:8181", s)


@pytest.mark.parametrize("origins", ["*", " * ", "https://a.example,*", ",*,"])
def test_star_disables_everything(origins: str) -> None:
    s, warnings = GuardSettings.build("0.0.0.0", origins, "box.example")
    assert s == GuardSettings(frozenset(), frozenset(), disabled=True, enforce_host=False)
    assert warnings == [DISABLED_WARNING]
    assert check_origin("null", s)
    assert check_origin("https://evil.example", s)
    assert check_host("evil.example", s)
    assert check_host("bad host@", s)


def test_star_on_concrete_bind_warns_only_about_disabling() -> None:
    assert GuardSettings.build("localhost", "*", None)[1] == [DISABLED_WARNING]


def test_allowed_origins_are_normalised_and_invalid_ones_dropped() -> None:
    s = settings(
        origins="HTTPS://Notes.Internal, http://a.example:80, https://b.example:443/x?y,"
        "http://c.example:8080, null, file:///tmp, not-a-url, http://bad host, http://d:99999"
    )
    assert s.allowed_origins == {
        "https://notes.internal",
        "http://a.example",
        "https://b.example",
        "http://c.example:8080",
    }


def test_from_env_trims_and_drops_empty_items() -> None:
    env = {
        "QMD_ALLOWED_ORIGINS": " https://a.example ,, ,https://b.example:8443, ",
        "QMD_ALLOWED_HOSTS": " Box.Example , ,box.example:9000,",
    }
    s, warnings = GuardSettings.from_env("0.0.0.0", env)
    assert s.allowed_origins == {"https://a.example", "https://b.example:8443"}
    assert s.allowed_hosts == {"box.example", "box.example:9000"}
    assert s.enforce_host and warnings == []


@pytest.mark.parametrize("value", [None, "", " , ,"])
def test_from_env_empty_lists(value: str | None) -> None:
    env = {} if value is None else {"QMD_ALLOWED_ORIGINS": value, "QMD_ALLOWED_HOSTS": value}
    s, warnings = GuardSettings.from_env("0.0.0.0", env)
    assert s == GuardSettings(frozenset(), frozenset(), disabled=False, enforce_host=False)
    assert warnings == [host_warning("0.0.0.0")]


def test_from_env_reads_star() -> None:
    s, warnings = GuardSettings.from_env("localhost", {"QMD_ALLOWED_ORIGINS": "*"})
    assert s.disabled and warnings == [DISABLED_WARNING]


# --- Origin ---------------------------------------------------------------------------


@pytest.mark.parametrize("origin", [None, "", "   "])
def test_missing_origin_is_fine(origin: str | None) -> None:
    assert check_origin(origin, LOCAL)


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost",
        "http://localhost:8181",
        "https://localhost:8181",
        "HTTP://LOCALHOST:8181",
        "http://app.localhost:3000",
        "http://127.0.0.1:8181",
        "http://127.8.9.10",
        "http://[::1]:8181",
        "http://[0:0:0:0:0:0:0:1]",
        "http://[::ffff:127.0.0.1]:8181",
        "http://localhost:8181/",
        " http://localhost:8181 ",
        "http://127.1",
    ],
)
def test_loopback_origins_allowed(origin: str) -> None:
    assert check_origin(origin, LOCAL)


@pytest.mark.parametrize(
    "origin",
    [
        "null",
        "NULL",
        "file://",
        "file:///etc/passwd",
        "chrome-extension://abcdef",
        "ws://localhost:8181",
        "ftp://127.0.0.1",
        "http://127.0.0.1.evil.com",
        "http://127.0.0.1.evil.com:8181",
        "http://localhost.evil.com",
        "http://0.0.0.0:8181",
        "http://[::]:8181",
        "https://evil.example",
        "http://evil.127",
        "localhost",
        "localhost:8181",
        "http://",
        "http:localhost",
        "http:\\\\localhost",
        "http://local host",
        "http://localhost:99999",
        "http://localhost:80x",
        "http://evil.example@127.0.0.1",
        "http://127.0.0.1@evil.example",
        "http://[::1",
        "http://%6cocalhost",
        "http://localhöst",
        "http://localhost http://evil.example",
    ],
)
def test_foreign_or_unparsable_origins_rejected(origin: str) -> None:
    assert not check_origin(origin, LOCAL)


def test_allowlisted_origin() -> None:
    s = settings(origins="https://notes.internal,http://c.example:8080")
    assert check_origin("https://notes.internal", s)
    assert check_origin("HTTPS://NOTES.INTERNAL:443", s)
    assert check_origin("http://c.example:8080", s)
    assert not check_origin("http://notes.internal", s)  # scheme is part of an origin
    assert not check_origin("https://notes.internal:8443", s)
    assert not check_origin("http://c.example", s)
    assert not check_origin("https://evil.notes.internal", s)


def test_allowlisted_origin_with_other_scheme() -> None:
    """An operator who lists an extension origin gets exactly that origin, nothing else."""
    s = settings(origins="chrome-extension://abcdef")
    assert check_origin("chrome-extension://abcdef", s)
    assert not check_origin("chrome-extension://other", s)
    assert not check_origin("null", s)


# --- Host -----------------------------------------------------------------------------


@pytest.mark.parametrize("host", [None, "", "  "])
def test_missing_host_is_fine(host: str | None) -> None:
    assert check_host(host, LOCAL)


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:8181",
        "LocalHost:8181",
        "app.localhost:8181",
        "127.0.0.1:8181",
        "127.0.0.2",
        "[::1]:8181",
        "[::1]",
        "[0:0:0:0:0:0:0:1]:8181",
        "[::ffff:127.0.0.1]:8181",
        "localhost:",
        "[::1]:",
        "127.1:8181",
        "2130706433:8181",
        "0x7f.0.0.1",
        "127.0.0.1.",
    ],
)
def test_loopback_hosts_allowed(host: str) -> None:
    assert check_host(host, LOCAL)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8181",
        "0.0.0.0:8181",
        "0:8181",
        "[::]:8181",
        "127.0.0.1.evil.com:8181",
        "localhost.evil.com",
        "10.0.0.1:8181",
        "evil.127",
        "127.0.0.256",
        # malformed: must be refused, never raise
        "local host",
        "localhost :8181",
        "evil.example@localhost",
        "localhost:8181@evil.example",
        "localhost:99999",
        "localhost:-1",
        "localhost:80:80",
        "localhost:8o",
        "localhost:+80",
        ":8181",
        "[::1",
        "[::1]x",
        "[zz::1]",
        "[fe80::1%25eth0]:8181",
        "%6cocalhost",
        "localhöst",
        "evil\\localhost",
        "http://localhost",
        "localhost/path",
    ],
)
def test_foreign_or_malformed_hosts_rejected(host: str) -> None:
    assert not check_host(host, LOCAL)


def test_allowlisted_host_forms() -> None:
    s = settings(hosts="Box.Example,pinned.example:8181,[fe80::9]")
    assert check_host("box.example", s)
    assert check_host("BOX.EXAMPLE:1234", s)
    assert check_host("pinned.example:8181", s)
    assert not check_host("pinned.example:9999", s)
    assert not check_host("pinned.example", s)
    assert check_host("[fe80::9]:8181", s)
    assert not check_host("sub.box.example", s)


def test_allowlist_cannot_admit_a_malformed_host() -> None:
    s = settings(hosts="bad host,a@b")
    assert not check_host("bad host", s)
    assert not check_host("a@b", s)


# --- middleware, end to end -----------------------------------------------------------

CHUNKS = [b"event: one\n\n", b"event: two\n\n", b"event: three\n\n"]


async def _stream(request: Request) -> StreamingResponse:
    async def chunks() -> AsyncIterator[bytes]:
        for chunk in CHUNKS:
            yield chunk

    return StreamingResponse(chunks(), media_type="text/event-stream", headers={"x-sub": request.method})


async def _echo(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text(await websocket.receive_text())
    await websocket.close()


def make_app(guard: GuardSettings) -> tuple[OriginHostGuard, list[str]]:
    """The daemon's shape: FastAPI routes plus a mounted streaming sub-app at /mcp."""
    events: list[str] = []

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        events.append("startup")
        yield
        events.append("shutdown")

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "uptime": 0}

    app.add_api_websocket_route("/ws", _echo)
    app.mount("/mcp", Starlette(routes=[Route("/", _stream, methods=["GET", "POST"])]))
    return OriginHostGuard(app, guard), events


def forbidden(reason: str) -> bytes:
    return b'{"jsonrpc":"2.0","error":{"code":-32003,"message":"Forbidden: ' + reason.encode() + b'"},"id":null}'


def client(app: OriginHostGuard, base_url: str = "http://localhost:8181") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url)


@pytest.mark.anyio
async def test_local_clients_pass_untouched() -> None:
    app, _ = make_app(LOCAL)
    async with client(app) as c:
        health = await c.get("/health")
        assert health.status_code == 200
        assert health.json() == {"status": "ok", "uptime": 0}

        async with c.stream("POST", "/mcp/", content=b"{}") as mcp:
            assert mcp.status_code == 200
            assert mcp.headers["content-type"].startswith("text/event-stream")
            assert mcp.headers["x-sub"] == "POST"
            assert b"".join([chunk async for chunk in mcp.aiter_bytes()]) == b"".join(CHUNKS)

        browser = await c.get("/health", headers={"Origin": "http://localhost:8181"})
        assert browser.status_code == 200

        missing = await c.get("/nowhere")
        assert missing.status_code == 404


@pytest.mark.anyio
@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/health"),
        ("POST", "/mcp/"),
        ("GET", "/mcp"),
        ("POST", "/query"),
        ("POST", "/search"),
        ("POST", "/metadata"),
        ("GET", "/nowhere"),
    ],
)
async def test_foreign_origin_gets_403_on_every_path(method: str, path: str) -> None:
    app, _ = make_app(LOCAL)
    async with client(app) as c:
        response = await c.request(method, path, headers={"Origin": "https://evil.example"})
    assert response.status_code == 403
    assert response.headers["content-type"] == "application/json"
    assert response.content == forbidden("Origin not allowed: https://evil.example")
    assert response.headers["content-length"] == str(len(response.content))


@pytest.mark.anyio
@pytest.mark.parametrize("origin", ["null", "file://", "http://127.0.0.1.evil.com"])
async def test_browser_only_origins_get_403(origin: str) -> None:
    app, _ = make_app(LOCAL)
    async with client(app) as c:
        response = await c.get("/health", headers={"Origin": origin})
    assert response.status_code == 403
    assert response.content == forbidden(f"Origin not allowed: {origin}")


@pytest.mark.anyio
async def test_rebound_host_without_origin_gets_403() -> None:
    app, _ = make_app(LOCAL)
    async with client(app, "http://attacker.example:8181") as c:
        response = await c.post("/mcp/", content=b"{}")
    assert response.status_code == 403
    assert response.content == forbidden("Host not allowed: attacker.example:8181")


@pytest.mark.anyio
async def test_origin_is_reported_before_host() -> None:
    app, _ = make_app(LOCAL)
    async with client(app, "http://attacker.example:8181") as c:
        response = await c.get("/health", headers={"Origin": "http://attacker.example:8181"})
    assert response.content == forbidden("Origin not allowed: http://attacker.example:8181")


@pytest.mark.anyio
async def test_wildcard_bind_admits_any_host_but_not_foreign_origins() -> None:
    app, _ = make_app(settings("0.0.0.0"))
    async with client(app, "http://box.example:8181") as c:
        assert (await c.get("/health")).status_code == 200
        rejected = await c.get("/health", headers={"Origin": "http://box.example:8181"})
        assert rejected.status_code == 403


@pytest.mark.anyio
async def test_allowlisted_origin_and_host_pass() -> None:
    app, _ = make_app(settings("0.0.0.0", "https://notes.internal", "notes.internal"))
    async with client(app, "http://notes.internal") as c:
        response = await c.get("/health", headers={"Origin": "https://notes.internal"})
    assert response.status_code == 200


@pytest.mark.anyio
async def test_disabled_guard_lets_everything_through() -> None:
    app, _ = make_app(settings("localhost", "*"))
    async with client(app, "http://attacker.example") as c:
        response = await c.get("/health", headers={"Origin": "null"})
    assert response.status_code == 200


# --- middleware, at the ASGI level ----------------------------------------------------


class Recorder:
    """An inner ASGI app that records how it was called."""

    def __init__(self, messages: list[Message] | None = None) -> None:
        self.messages = messages or []
        self.calls: list[tuple[Scope, Receive, Send]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls.append((scope, receive, send))
        for message in self.messages:
            await send(message)


async def _never_receive() -> Message:
    raise AssertionError("the guard must not read the request body")


def http_scope(*headers: tuple[bytes, bytes]) -> Scope:
    return {"type": "http", "method": "POST", "path": "/mcp", "headers": list(headers)}


@pytest.mark.anyio
async def test_streaming_messages_pass_one_by_one() -> None:
    """Each body chunk reaches the server as it is sent: nothing is buffered."""
    stream: list[Message] = [
        {"type": "http.response.start", "status": 200, "headers": []},
        *({"type": "http.response.body", "body": c, "more_body": True} for c in CHUNKS),
        {"type": "http.response.body", "body": b"", "more_body": False},
    ]
    inner = Recorder(stream)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope = http_scope((b"host", b"localhost:8181"), (b"origin", b"http://localhost:8181"))
    await OriginHostGuard(inner, LOCAL)(scope, _never_receive, send)
    assert sent == stream
    assert inner.calls == [(scope, _never_receive, send)]


@pytest.mark.anyio
async def test_lifespan_passes_through() -> None:
    inner = Recorder()

    async def send(message: Message) -> None:
        raise AssertionError("nothing to send")

    scope: Scope = {"type": "lifespan", "asgi": {"version": "3.0"}}
    await OriginHostGuard(inner, LOCAL)(scope, _never_receive, send)
    assert inner.calls == [(scope, _never_receive, send)]


def test_lifespan_runs_through_the_guard() -> None:
    app, events = make_app(LOCAL)
    with TestClient(app, base_url="http://localhost:8181") as c:
        assert events == ["startup"]
        assert c.get("/health").status_code == 200
    assert events == ["startup", "shutdown"]


@pytest.mark.anyio
async def test_rejection_never_calls_the_app_nor_reads_the_body() -> None:
    inner = Recorder()
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await OriginHostGuard(inner, LOCAL)(http_scope((b"origin", b"https://evil.example")), _never_receive, send)
    assert inner.calls == []
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 403


@pytest.mark.anyio
@pytest.mark.parametrize(
    "headers, reason",
    [
        (
            [(b"origin", b"http://localhost"), (b"origin", b"https://evil.example")],
            "Origin not allowed: https://evil.example",
        ),
        (
            [(b"host", b"localhost:8181"), (b"host", b"evil.example")],
            "Host not allowed: evil.example",
        ),
    ],
)
async def test_duplicated_headers_are_all_checked(headers: list[tuple[bytes, bytes]], reason: str) -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await OriginHostGuard(Recorder(), LOCAL)(http_scope(*headers), _never_receive, send)
    assert sent[1]["body"] == forbidden(reason)


@pytest.mark.anyio
async def test_non_ascii_header_yields_valid_json() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    origin = "http://évil.example".encode()
    await OriginHostGuard(Recorder(), LOCAL)(http_scope((b"origin", origin)), _never_receive, send)
    document = json.loads(sent[1]["body"])
    assert document["error"]["code"] == -32003
    expected = "Forbidden: Origin not allowed: " + origin.decode("latin-1")
    assert document["error"]["message"] == expected


def test_websocket_is_screened() -> None:
    app, _ = make_app(LOCAL)
    url = "ws://localhost:8181/ws"
    with TestClient(app, base_url="http://localhost:8181") as c:
        with c.websocket_connect(url, headers={"origin": "http://localhost:8181"}) as ws:
            ws.send_text("hi")
            assert ws.receive_text() == "hi"
        with pytest.raises(WebSocketDenialResponse) as denied:
            with c.websocket_connect(url, headers={"origin": "https://evil.example"}):
                pass
    assert denied.value.status_code == 403
    assert denied.value.headers["content-type"] == "application/json"
    assert denied.value.content == forbidden("Origin not allowed: https://evil.example")


@pytest.mark.anyio
async def test_websocket_without_denial_extension_is_closed() -> None:
    """Servers lacking the denial-response extension turn a pre-accept close into 403."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "websocket", "path": "/ws", "headers": [(b"host", b"evil.example")]}
    inner = Recorder()
    await OriginHostGuard(inner, LOCAL)(scope, _never_receive, send)
    assert inner.calls == []
    assert sent == [{"type": "websocket.close", "code": 1008}]
