"""`qmd mcp`, the stdio bridge: framing against a stand-in server, then the real daemon
driven by the `mcp` SDK's own stdio client (both protocol eras)."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import ROOT, Env, daemons_on
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from qmd.connection import Daemon
from qmd.mcp_bridge import bridge

BRIDGES = {
    "qmd mcp": [sys.executable, "-m", "qmd.client.cli", "mcp"],
    "python -m qmd.mcp_bridge": [sys.executable, "-m", "qmd.mcp_bridge"],
}


# -- a stand-in /mcp: what the daemon may answer, one behaviour per method ------------------


class FakeMcp(BaseHTTPRequestHandler):
    seen: list[tuple[dict[str, str], Any]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json", extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeMcp.seen.append((dict(self.headers), msg))
        if isinstance(msg, list):
            self._send(200, json.dumps([{"jsonrpc": "2.0", "id": m["id"], "result": {}} for m in msg]).encode())
            return
        method, rid = msg.get("method"), msg.get("id")
        ok = json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"echo": method}}).encode()
        if rid is None:
            self._send(202, b"")
        elif method == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "fake"}}
            self._send(200, json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode())
        elif method == "sse":
            note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
            body = f"event: message\r\ndata: {json.dumps(note)}\r\n\r\nevent: message\r\ndata: {ok.decode()}\r\n\r\n"
            self._send(200, body.encode(), "text/event-stream")
        elif method == "unauthorized":
            self._send(401, b'{"error":"unauthorized: missing bearer token"}')
        elif method == "crash":
            self._send(500, b"Internal Server Error", "text/plain")
        elif method == "forbidden":
            err = {"jsonrpc": "2.0", "error": {"code": -32003, "message": "Forbidden: Origin not allowed"}, "id": None}
            self._send(403, json.dumps(err).encode())
        elif method == "accepted":
            self._send(202, b"")
        elif method == "other_index":
            self._send(200, ok, extra={"x-qmd-index": "work"})
        elif method == "slow":
            time.sleep(1.0)
            self._send(200, ok)
        else:
            self._send(200, ok)


@pytest.fixture
def fake(env: Env, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """A stand-in /mcp on env.port, with this process's environment pointing at it."""
    server = ThreadingHTTPServer(("127.0.0.1", env.port), FakeMcp)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeMcp.seen = []
    for k, v in {**env.vars, "QMD_NO_AUTOSTART": "1"}.items():
        monkeypatch.setenv(k, v)
    for k in [k for k in os.environ if k.startswith("QMD_TOKEN")]:
        monkeypatch.delenv(k)
    yield env
    server.shutdown()
    server.server_close()


def relay(*messages: Any) -> list[Any]:
    """Run the bridge in-process over `messages` (dicts, or raw lines) and parse what it wrote."""
    lines = b"".join((m if isinstance(m, bytes) else json.dumps(m).encode()) + b"\n" for m in messages)
    out = io.BytesIO()
    assert bridge.Bridge(Daemon(), bridge.Output(out)).run(io.BytesIO(lines)) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def req(rid: int, method: str, params: dict | None = None) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": method, **({"params": params} if params else {})}


def test_request_answered_notification_silent(fake: Env) -> None:
    out = relay({"jsonrpc": "2.0", "method": "notifications/initialized"}, req(1, "ping"))
    assert out == [{"jsonrpc": "2.0", "id": 1, "result": {"echo": "ping"}}]
    assert sorted(m["method"] for _, m in FakeMcp.seen) == ["notifications/initialized", "ping"]


def test_every_failure_is_an_error_for_that_id(fake: Env) -> None:
    out = relay(req(1, "unauthorized"), req(2, "crash"), req(3, "forbidden"), req(4, "accepted"), req(5, "other_index"))
    by_id = {m["id"]: m for m in out}
    assert sorted(by_id) == [1, 2, 3, 4, 5] and all("error" in m for m in out)
    assert "HTTP 401: unauthorized: missing bearer token" in by_id[1]["error"]["message"]
    assert by_id[1]["error"]["data"] == {"status": 401}
    assert "HTTP 500: Internal Server Error" in by_id[2]["error"]["message"]
    assert by_id[3]["error"] == {"code": -32003, "message": "Forbidden: Origin not allowed"}  # id null → 3
    assert "202" in by_id[4]["error"]["message"]
    assert "serves index 'work', not 'index'" in by_id[5]["error"]["message"]


def test_garbage_line_is_a_parse_error_and_the_bridge_goes_on(fake: Env) -> None:
    out = relay(b"{not json", b"", req(7, "ping"))
    assert out[0]["id"] is None and out[0]["error"]["code"] == -32700
    assert out[1]["result"] == {"echo": "ping"}


def test_event_stream_and_batch_are_relayed(fake: Env) -> None:
    out = relay(req(1, "sse"))
    assert out == [
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}},
        {"jsonrpc": "2.0", "id": 1, "result": {"echo": "sse"}},
    ]
    assert relay([req(1, "a"), req(2, "b")]) == [
        [{"jsonrpc": "2.0", "id": 1, "result": {}}, {"jsonrpc": "2.0", "id": 2, "result": {}}]
    ]


def test_requests_run_concurrently(fake: Env) -> None:
    t0 = time.monotonic()
    out = relay(*(req(i, "slow") for i in range(4)))
    assert sorted(m["id"] for m in out) == [0, 1, 2, 3]
    assert time.monotonic() - t0 < 3.0  # four 1 s requests, not one after another


def test_headers_follow_the_protocol_era(fake: Env) -> None:
    b = bridge.Bridge(Daemon(), bridge.Output(io.BytesIO()))
    meta = {bridge.PROTOCOL_VERSION_META: "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    b.forward(req(1, "initialize", {"protocolVersion": "2025-06-18"}))  # one at a time, as a client does
    b.forward(req(2, "tools/list"))
    b.forward(req(3, "tools/call", {"name": "qüery", "arguments": {}, "_meta": meta}))
    headers = {m["id"]: {k.lower(): v for k, v in h.items()} for h, m in FakeMcp.seen}
    assert "mcp-protocol-version" not in headers[1]  # initialize is what negotiates it
    assert headers[2]["mcp-protocol-version"] == "2025-06-18"  # ...and later messages repeat it
    assert "mcp-method" not in headers[2]
    assert headers[3]["mcp-protocol-version"] == "2026-07-28"  # a 2026 request names its own
    assert headers[3]["mcp-method"] == "tools/call"
    assert headers[3]["mcp-name"] == bridge.encode_header_value("qüery") != "qüery"


def test_wire_names_match_the_sdk() -> None:
    import mcp_types
    from mcp.shared import inbound

    assert bridge.PROTOCOL_VERSION_META == mcp_types.PROTOCOL_VERSION_META_KEY
    assert dict(inbound.NAME_BEARING_METHODS) == bridge.NAME_PARAMS
    assert bridge.PROTOCOL_VERSION_HEADER.lower() == inbound.MCP_PROTOCOL_VERSION_HEADER
    assert bridge.METHOD_HEADER.lower() == inbound.MCP_METHOD_HEADER
    assert bridge.NAME_HEADER.lower() == inbound.MCP_NAME_HEADER
    for value in ("query", "qmd://notes/a b.md", " edge", "naïve", "=?base64?eA==?=", "tab\there"):
        assert bridge.encode_header_value(value) == inbound.encode_header_value(value)


# -- the bridge as a process ------------------------------------------------------------------


def spawn(env: Env, cmd: list[str], extra: dict | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd,
        env={**env.vars, **(extra or {})},
        cwd=env.home,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("name", BRIDGES)
def test_exits_0_quickly_when_stdin_closes(env: Env, name: str) -> None:
    proc = spawn(env, BRIDGES[name])
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert out == b"" and b"Shutting down (stdin closed)" in err
    assert time.monotonic() - t0 < 3
    assert not (env.cache / "qmd" / "qmdd.pid").exists()  # nothing to forward, no daemon started


def test_unreachable_daemon_is_an_error_answer_not_a_crash(env: Env) -> None:
    proc = spawn(env, BRIDGES["qmd mcp"], {"QMD_NO_AUTOSTART": "1"})
    out, err = proc.communicate(json.dumps(req(1, "tools/list")).encode() + b"\n", timeout=30)
    assert proc.returncode == 0, err
    (answer,) = [json.loads(line) for line in out.splitlines()]
    assert answer["id"] == 1 and "QMD_NO_AUTOSTART" in answer["error"]["message"]
    assert b"Traceback" not in err


def test_stray_writes_to_stdout_go_to_stderr() -> None:
    code = (
        "import os; from qmd.mcp_bridge.bridge import claim_stdout\n"
        "out = claim_stdout()\n"
        "print('a stray print'); os.write(1, b'a native write\\n')\n"
        "out.write({'jsonrpc': '2.0', 'id': 1, 'result': {}})\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=ROOT)
    assert r.stdout == b'{"jsonrpc":"2.0","id":1,"result":{}}\n'
    assert b"a stray print" in r.stderr and b"a native write" in r.stderr


def test_imports_no_model_or_database_code() -> None:
    heavy = ("fastapi", "uvicorn", "starlette", "pydantic", "mcp", "httpx", "llama_cpp", "sqlite3", "sqlite_vec")
    code = (
        f"import sys, qmd.mcp_bridge.bridge, qmd.mcp_bridge.__main__; print([m for m in {heavy!r} if m in sys.modules])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert r.stdout.strip() == "[]"


# -- against the real daemon --------------------------------------------------------------------


@pytest.fixture
def corpus(env: Env, notes: Path) -> Iterator[Env]:
    """Notes indexed by a daemon the CLI autostarted; every daemon on the port stopped after."""
    env.ok("collection", "add", str(notes), "--name", "notes")
    yield env
    for pid in daemons_on(env.port):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while daemons_on(env.port) and time.monotonic() < deadline:
        time.sleep(0.05)


def daemon_pid(env: Env) -> int:
    return json.loads((env.cache / "qmd" / "qmdd.pid").read_text())["pid"]


def client(env: Env, cmd: list[str], mode: str = "auto") -> Client:
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=env.vars, cwd=str(env.home))
    return Client(params, mode=mode, read_timeout_seconds=60)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("name", BRIDGES)
def test_sdk_client_over_the_bridge(corpus: Env, name: str, mode: str) -> None:
    async def go() -> None:
        async with client(corpus, BRIDGES[name], mode) as c:
            assert c.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
            tools = (await c.list_tools()).tools
            assert [t.name for t in tools] == ["query", "get", "multi_get", "metadata", "status"]
            # No tool asks for Mcp-Param-* headers, which the bridge does not derive.
            assert "x-mcp-header" not in json.dumps([t.input_schema for t in tools])
            status = await c.call_tool("status", {})
            assert not status.is_error and status.structured_content["totalDocuments"] == 4
            found = await c.call_tool("query", {"searches": [{"type": "lex", "query": "angel investors"}]})
            hit = found.structured_content["results"][0]
            assert hit["file"] == "qmd://notes/fundraising.md" and hit["line"] == 7
            doc = await c.call_tool("get", {"file": f"{hit['file']}:7:2"})
            assert (
                doc.content[0].resource.text
                == "7: Angel investors fund early startups.\n8: We raise money from angels and VCs."
            )
            bad = await c.call_tool("get", {"fil": "notes/fundraising.md"})
            assert bad.is_error and "unknown parameter 'fil'" in bad.content[0].text

    anyio.run(go)


@pytest.mark.slow
def test_stdout_is_pure_jsonrpc_while_the_daemon_autostarts(env: Env) -> None:
    assert not daemons_on(env.port)
    messages = [
        req(
            1,
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        ),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        req(2, "tools/list"),
        req(3, "tools/call", {"name": "status", "arguments": {}}),
    ]
    proc = spawn(env, BRIDGES["qmd mcp"])
    try:
        assert proc.stdin is not None and proc.stdout is not None
        answers: list[dict] = []
        for m in messages:  # one at a time, as a client does: initialize is answered first
            proc.stdin.write(json.dumps(m).encode() + b"\n")
            proc.stdin.flush()
            if "id" in m:
                ready, _, _ = select.select([proc.stdout], [], [], 60)
                assert ready, "no answer within 60 s"
                answers.append(json.loads(proc.stdout.readline()))
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=10) == 0
        assert rest == b""
        assert [a["id"] for a in answers] == [1, 2, 3] and all(a["jsonrpc"] == "2.0" for a in answers)
        assert answers[0]["result"]["serverInfo"]["name"] == "qmd"
        assert answers[2]["result"]["structuredContent"]["totalDocuments"] == 0
        assert len(daemons_on(env.port)) == 1  # autostarted, detached: it outlives the bridge
    finally:
        for pid in daemons_on(env.port):
            os.kill(pid, signal.SIGTERM)


@pytest.mark.slow
def test_survives_a_daemon_restart_between_calls(corpus: Env) -> None:
    async def go() -> None:
        async with client(corpus, BRIDGES["qmd mcp"]) as c:
            assert (await c.call_tool("status", {})).structured_content["totalDocuments"] == 4
            first = daemon_pid(corpus)
            assert "Stopped qmdd" in corpus.ok("daemon", "stop")
            # Nothing listens now: the next call starts a daemon again.
            assert (await c.call_tool("status", {})).structured_content["totalDocuments"] == 4
            second = daemon_pid(corpus)
            assert second != first
            # Restarted by someone else while the bridge holds a kept-alive connection.
            corpus.ok("daemon", "stop")
            assert "Started on" in corpus.ok("mcp", "--http", "--daemon")
            assert (await c.call_tool("status", {})).structured_content["totalDocuments"] == 4
            assert daemon_pid(corpus) not in (first, second)

    anyio.run(go)


@pytest.mark.slow
def test_two_bridges_share_one_daemon(env: Env) -> None:
    assert not daemons_on(env.port)
    seen: list[int] = []

    async def one(cmd: list[str]) -> None:
        async with client(env, cmd) as c:
            status = await c.call_tool("status", {})
            assert not status.is_error
            seen.append(daemon_pid(env))

    async def both() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, BRIDGES["qmd mcp"])
            tg.start_soon(one, BRIDGES["python -m qmd.mcp_bridge"])

    try:
        anyio.run(both)
        assert len(seen) == 2 and seen[0] == seen[1]
        assert daemons_on(env.port) == [seen[0]]
    finally:
        for pid in daemons_on(env.port):
            os.kill(pid, signal.SIGTERM)
