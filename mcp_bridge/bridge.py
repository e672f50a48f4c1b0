"""Forward newline-delimited JSON-RPC between stdin/stdout and the daemon's `/mcp`.

The daemon serves MCP as Streamable HTTP, stateless, with JSON responses, so the
bridge is a pure relay: each message read from stdin is POSTed on its own, and
the response body (one JSON-RPC message, or a batch) is written back as one line.
A notification is answered 202 with no body, and nothing is written for it.

What the bridge guarantees, because an MCP client cannot recover from less:

- **stdout carries JSON-RPC and nothing else.** File descriptor 1 is moved aside
  at start and replaced by stderr, so a stray print, a warning or a library log
  lands on stderr whatever writes it; only `Output` holds the real stdout.
- **every request gets exactly one answer.** A daemon that cannot be reached or
  started, an HTTP error, a body that is not JSON-RPC: each becomes a JSON-RPC
  error for that request's id, never a crash or silence.
- **it outlives the daemon.** Each exchange reconnects when the kept-alive
  connection was closed, and starts the daemon again (under the same lock as
  the CLI's autostart) when nothing listens.
- **it exits 0 when stdin closes**, after waiting up to 5 s for requests still
  in flight, as the original's stdio server does.

Requests run concurrently (one thread each), so a slow `query` does not hold up
a `get` sent after it; responses carry their ids, so order does not matter.

Streamable HTTP routes by headers as well as by body. A 2026-era request carries
its protocol version in `params._meta`, and the server checks that the
`MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers repeat it; a
handshake-era session sends the version its `initialize` settled on. The bridge
derives these headers from each message, as the SDK's HTTP client does. (The
SDK's `Mcp-Param-*` headers exist only for tools whose schema declares
`x-mcp-header`; qmd's tools declare none, which the tests check.)

Stdlib only, plus the CLI's daemon connection: importing the `mcp` SDK would
cost more start-up time than the whole forwarding job.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

from qmd.connection import ClientError, Daemon, Http

MCP_PATH = "/mcp"
DRAIN_TIMEOUT_S = 5.0
"""How long requests still in flight may finish after stdin closes."""

# The wire names below are the MCP SDK's (mcp.shared.inbound, mcp_types); the
# tests check they still agree with the installed SDK.
PROTOCOL_VERSION_HEADER = "MCP-Protocol-Version"
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
NAME_PARAMS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
"""Methods whose named parameter the `Mcp-Name` header repeats."""

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
DAEMON_ERROR = -32000
"""Implementation-defined server error: the daemon could not answer this request."""

_HEADER_SAFE = re.compile(r"[\x20-\x7e]*")
_B64_SENTINEL = re.compile(r"=\?base64\?.*\?=")


def encode_header_value(value: str) -> str:
    """An HTTP-safe spelling of `value`: verbatim when it survives a header, else the
    SDK's `=?base64?…?=` sentinel (non-ASCII names, edge whitespace)."""
    if _HEADER_SAFE.fullmatch(value) and value == value.strip() and not _B64_SENTINEL.fullmatch(value):
        return value
    return f"=?base64?{base64.b64encode(value.encode('utf-8')).decode('ascii')}?="


def log(message: str) -> None:
    """One line on stderr: the only place a human-readable word may go."""
    sys.stderr.write(f"qmd mcp: {message}\n")
    sys.stderr.flush()


def error_response(request_id: Any, code: int, message: str, data: dict | None = None) -> dict:
    error: dict[str, Any] = {"code": code, "message": message}
    if data:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def request_ids(message: Any) -> list[Any]:
    """Ids of the requests in a message or batch: the ones owed an answer."""
    items = message if isinstance(message, list) else [message]
    return [m["id"] for m in items if isinstance(m, dict) and "method" in m and m.get("id") is not None]


def _sse_messages(response: http.client.HTTPResponse) -> Iterator[Any]:
    """The JSON payloads of a `text/event-stream` body, as each event completes."""
    data: list[str] = []
    while raw := response.readline():
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            yield json.loads("\n".join(data))
            data = []
    if data:
        yield json.loads("\n".join(data))


class Output:
    """The real stdout, one whole JSON-RPC message per line, one writer at a time."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def write(self, message: Any) -> None:
        # ASCII escapes: a lone surrogate the daemon escaped stays valid JSON instead of failing to encode.
        line = json.dumps(message, separators=(",", ":")).encode("ascii") + b"\n"
        with self.lock:
            try:
                self.stream.write(line)
                self.stream.flush()
            except (BrokenPipeError, ValueError):
                log("stdout is closed; dropping a response")


class Bridge:
    """Relays messages from an input stream to `/mcp` and answers on an `Output`."""

    def __init__(self, daemon: Daemon, out: Output) -> None:
        self.daemon = daemon
        self.out = out
        self.idle: list[Http] = []
        self.pool_lock = threading.Lock()
        self.negotiated: str | None = None
        """Protocol version a handshake-era `initialize` settled on, sent on later messages."""

    # -- the loop -----------------------------------------------------------------

    def run(self, stdin: BinaryIO) -> int:
        """Forward every line of `stdin`; at its end, let requests in flight finish."""
        workers: list[threading.Thread] = []
        for raw in stdin:
            line = raw.strip()
            if not line:
                continue
            try:
                message = json.loads(line)
            except ValueError as e:
                self.out.write(error_response(None, PARSE_ERROR, f"Parse error: {e}"))
                continue
            worker = threading.Thread(target=self.forward, args=(message,), name="qmd-mcp-request", daemon=True)
            worker.start()
            workers = [w for w in workers if w.is_alive()] + [worker]
        log("Shutting down (stdin closed)...")
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        if any(w.is_alive() for w in workers):
            log(f"requests still unanswered after {DRAIN_TIMEOUT_S:.0f}s; exiting anyway")
        with self.pool_lock:
            for conn in self.idle:
                conn.close()
        return 0

    # -- one message ----------------------------------------------------------------

    def forward(self, message: Any) -> None:
        """POST one message (or batch) and write what the daemon answers.

        Nothing raised here may escape: a thread that dies silently would leave
        its request unanswered, which an MCP client waits on forever."""
        ids = request_ids(message)
        try:
            self._exchange(message, ids)
        except ClientError as e:
            self._fail(ids, e.message)
        except (OSError, http.client.HTTPException) as e:
            self._fail(ids, f"lost the connection to the qmd daemon at {self.daemon.url}: {e or type(e).__name__}")
        except Exception as e:  # noqa: BLE001 - a bug still owes the client an answer
            log(f"internal error: {type(e).__name__}: {e}")
            self._fail(ids, f"qmd mcp bridge internal error: {type(e).__name__}: {e}", INTERNAL_ERROR)

    def _exchange(self, message: Any, ids: list[Any]) -> None:
        conn = self._checkout()
        try:
            try:
                r = conn.open("POST", MCP_PATH, message, self.headers_for(message))
            except ConnectionRefusedError:
                conn.close()
                self.daemon.autostart()
                r = conn.open("POST", MCP_PATH, message, self.headers_for(message))
            index = r.getheader("x-qmd-index")
            if index is not None and not self.daemon.serves(index):
                r.read()
                self._fail(ids, self.daemon.wrong_index(index))
            elif r.status == 200 and (r.getheader("content-type") or "").startswith("text/event-stream"):
                for event in _sse_messages(r):
                    self._answer(event, ids)
                conn.close()  # a stream's end is the server's to decide; do not reuse it
            else:
                self._relay(r.status, r.read(), ids)
        except BaseException:
            conn.close()
            raise
        self._checkin(conn)

    def _relay(self, status: int, body: bytes, ids: list[Any]) -> None:
        if status == 202 and not body.strip():
            if ids:
                self._fail(ids, "the qmd daemon accepted a request without answering it (HTTP 202)", INVALID_REQUEST)
            return
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        if _is_jsonrpc(document):
            self._answer(document, ids)
            return
        text = document.get("error") if isinstance(document, dict) else None
        detail = text if isinstance(text, str) else body[:300].decode("utf-8", "replace").strip()
        message = f"the qmd daemon answered HTTP {status}: {detail}"
        if ids:
            self._fail(ids, message, data={"status": status})
        else:
            log(message)

    def _answer(self, document: Any, ids: list[Any]) -> None:
        """Write a JSON-RPC document, giving an `id: null` error the request's own id.

        Errors raised before the server parsed the id (the Origin guard, a bad
        header) come back with `id: null`; relayed as they are, they would answer
        nothing and leave the client waiting."""
        if isinstance(document, dict):
            if "error" in document and document.get("id") is None and len(ids) == 1:
                document = {**document, "id": ids[0]}
            result = document.get("result")
            if isinstance(result, dict) and isinstance(result.get("protocolVersion"), str):
                self.negotiated = result["protocolVersion"]
        self.out.write(document)

    def _fail(self, ids: list[Any], message: str, code: int = DAEMON_ERROR, data: dict | None = None) -> None:
        if not ids:
            log(message)
        for request_id in ids:
            self.out.write(error_response(request_id, code, message, data))

    # -- headers and connections ----------------------------------------------------

    def headers_for(self, message: Any) -> dict[str, str]:
        """The Streamable HTTP headers the server checks against this message."""
        headers = {"Accept": "application/json, text/event-stream"}
        if not isinstance(message, dict):
            if self.negotiated:
                headers[PROTOCOL_VERSION_HEADER] = self.negotiated
            return headers
        method = message.get("method")
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        version = meta.get(PROTOCOL_VERSION_META) if isinstance(meta, dict) else None
        if isinstance(version, str) and isinstance(method, str) and isinstance(params, dict):
            headers[PROTOCOL_VERSION_HEADER] = version
            headers[METHOD_HEADER] = method
            name = params.get(NAME_PARAMS.get(method, ""))
            if isinstance(name, str):
                headers[NAME_HEADER] = encode_header_value(name)
        elif method != "initialize" and self.negotiated:
            headers[PROTOCOL_VERSION_HEADER] = self.negotiated
        return headers

    def _checkout(self) -> Http:
        with self.pool_lock:
            if self.idle:
                return self.idle.pop()
        return self.daemon.connect()

    def _checkin(self, conn: Http) -> None:
        with self.pool_lock:
            self.idle.append(conn)


def _is_jsonrpc(document: Any) -> bool:
    if isinstance(document, list):
        return bool(document) and all(_is_jsonrpc(d) for d in document)
    return isinstance(document, dict) and document.get("jsonrpc") == "2.0"


def claim_stdout() -> Output:
    """Take file descriptor 1 for JSON-RPC and point everything else at stderr.

    After this, `print`, `sys.stdout` and any native write to fd 1 go to stderr;
    only the returned `Output` reaches the client."""
    sys.stdout.flush()
    real = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return Output(real)


def main(index: str | None = None) -> int:
    """Run the bridge on this process's stdin/stdout; the exit code to use."""
    out = claim_stdout()
    try:
        daemon = Daemon(index)
    except ClientError as e:
        log(f"Error: {e.message}")
        return 1
    try:
        return Bridge(daemon, out).run(sys.stdin.buffer)
    except KeyboardInterrupt:
        return 130
