"""Finding the daemon, and starting it when nothing answers.

Autostart runs under an exclusive file lock, re-checking `/health` once the lock is
held, so ten CLIs started at once start exactly one daemon. The daemon is started
detached (own session, same environment, output to its log under the cache dir)
and the CLI carries on only once `/health` answers for the right index.

When a bearer token is configured (`QMD_TOKEN` or the token file, see `qmd.token`)
every request carries it; the stdio bridge reuses this class, token included.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from qmd.paths import DEFAULT_HOST, DEFAULT_PORT, IndexPaths, connect_host, find_project
from qmd.token import TokenError, load_token

CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 600.0


class ClientError(Exception):
    """Printed as one line on stderr; the CLI exits with `exit_code`."""

    def __init__(self, message: str, exit_code: int = 1, detail: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.detail = detail or {}


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


class Response:
    """A finished HTTP exchange: status, the served index and body bytes."""

    def __init__(self, status: int, body: bytes, index: str | None = None) -> None:
        self.status = status
        self.body = body
        self.index = index

    def json(self) -> Any:
        return json.loads(self.body)


class Http:
    """A keep-alive HTTP/1.1 connection to the daemon.

    The stdlib client, not httpx: importing httpx costs about 40 ms, half of the
    budget for a whole `qmd search` round trip (it must not be slower than the
    original's 81 ms cold start).
    """

    def __init__(self, host: str, port: int, headers: dict[str, str], read_timeout: float = READ_TIMEOUT_S) -> None:
        self.host, self.port, self.headers = host, port, headers
        self.read_timeout = read_timeout
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=CONNECT_TIMEOUT_S)
            conn.connect()
            assert conn.sock is not None
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.sock.settimeout(self.read_timeout)
            self._conn = conn
        return self._conn

    def open(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> http.client.HTTPResponse:
        """Send a request and return the response with its body unread.

        `headers` are added to the connection's own (the token) for this request only.
        A kept-alive connection the server has closed is retried once on a new one."""
        data = None if body is None else json.dumps(body).encode()
        headers = {
            **self.headers,
            **({"Content-Type": "application/json"} if data is not None else {}),
            **(headers or {}),
        }
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, body: Any = None) -> Response:
        r = self.open(method, path, body)
        return Response(r.status, r.read(), r.getheader("x-qmd-index"))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _latin1(text: str) -> str:
    """`text` as http.client sends and reads header values (latin-1): its UTF-8 bytes, so
    a project folder named in any script arrives whole."""
    return text.encode("utf-8").decode("latin-1")


def address() -> tuple[str, int]:
    """Where the daemon is reached: the host to connect to and the port (`QMD_HOST`, `QMD_PORT`)."""
    port = os.environ.get("QMD_PORT") or str(DEFAULT_PORT)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ClientError(f"QMD_PORT must be a port number, got {port!r}")
    return connect_host(os.environ.get("QMD_HOST") or DEFAULT_HOST), int(port)


def current_project() -> Path | None:
    """The project the working directory is in (`.qmd/index.yml` here or above), if any."""
    try:
        return find_project(Path.cwd())
    except OSError:  # the working directory was deleted
        return None
    except ValueError as e:  # a broken config link
        raise ClientError(str(e)) from e


class Daemon:
    """The one daemon, and which of its indexes this client means: `index` (`--index
    NAME`) when given, else the project the working directory is in (sent as
    `x-qmd-project`), else the default index. `paths` is always the daemon's own (its
    pidfile, log and start lock), whichever index is asked for."""

    def __init__(self, index: str | None = None) -> None:
        try:
            self.paths = IndexPaths.resolve(index)
        except ValueError as e:
            raise ClientError(str(e)) from e
        self.index_arg = index
        self.project = None if index else current_project()
        self.target = IndexPaths.for_project(self.project).name if self.project else self.paths.name
        """The index name the daemon must say it served (`x-qmd-index` of every answer)."""
        self.bind_host = os.environ.get("QMD_HOST") or DEFAULT_HOST
        host, self.port = address()
        self.url = f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"
        self.host = host
        # One daemon serves every index: this names the one this client means (server/indexes.py).
        self.headers = {"Accept": "application/json"}
        if self.project is not None:
            self.headers["x-qmd-project"] = _latin1(str(self.project))
        else:
            self.headers["x-qmd-index"] = self.paths.name
        try:
            token = load_token()
        except TokenError as e:
            raise ClientError(str(e)) from e
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"
        self.http = self.connect()
        self.spawned: dict | None = None
        """The `/health` of the daemon this client started (with `seconds`, how long that took), if it did."""

    def connect(self, read_timeout: float = READ_TIMEOUT_S) -> Http:
        """A new connection of its own (with the token): one per thread, since an
        `http.client` connection carries one exchange at a time."""
        return Http(self.host, self.port, self.headers, read_timeout)

    # -- liveness -------------------------------------------------------------

    def health(self) -> dict | None:
        try:
            r = self.http.request("GET", "/health")
        except OSError:
            self.http.close()
            return None
        if r.status != 200:
            raise ClientError(f"{self.url} answered /health with HTTP {r.status}: {r.body[:200]!r}")
        try:
            return r.json()
        except ValueError:
            raise ClientError(f"{self.url} is not a qmd daemon (bad /health answer)") from None

    def serves(self, index: str | None) -> bool:
        """Whether an answer's `x-qmd-index` is the index this client asked for."""
        return index == _latin1(self.target)

    def _check_index(self, index: str | None) -> None:
        if not self.serves(index):
            raise ClientError(self.wrong_index(index))

    def wrong_index(self, index: str | None) -> str:
        """Why the server that answered is not this index's daemon (`index` is None when
        it sent no `X-Qmd-Index` header: not a qmd daemon at all)."""
        if index is None:
            return (
                f"something other than a qmd daemon answers at {self.url} (no X-Qmd-Index header). "
                "Stop it, or give qmd another port with QMD_PORT."
            )
        return (
            f"the qmd daemon at {self.url} serves index '{index}', not '{self.target}': it is an older "
            "qmdd, which serves only the index it started with. Restart it ('qmd daemon stop'), or give "
            "this index its own port with QMD_PORT."
        )

    def _send(self, method: str, path: str, body: Any) -> Response:
        """One request; when nothing listens, start the daemon and try once more."""
        try:
            r = self.http.request(method, path, body)
        except ConnectionRefusedError:
            self.http.close()
            self.autostart()
            r = self.http.request(method, path, body)
        if not (r.status == 400 and r.index is not None):  # a refused index header: its error says why
            self._check_index(r.index)
        return r

    def autostart(self) -> dict:
        """Make sure a daemon answers: start one (once, under the lock) if none does."""
        if _truthy(os.environ.get("QMD_NO_AUTOSTART")):
            raise ClientError(
                f"no qmd daemon answers at {self.url}, and QMD_NO_AUTOSTART is set. Start one with 'qmdd'."
            )
        from qmd.spawn import SpawnError, daemon_lock, spawn_daemon  # only when starting: subprocess is costly

        with daemon_lock(self.paths):
            info = self.health()
            if info is not None:
                return info
            started = time.monotonic()
            try:
                health = spawn_daemon(
                    self.paths, self.bind_host, self.port, ["--index", self.paths.name] if self.index_arg else []
                )
            except SpawnError as e:
                raise ClientError(e.message) from None
            self.spawned = {**health, "seconds": time.monotonic() - started}
            return health

    # -- requests -------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, params: dict | None = None) -> Any:
        if params:
            path += "?" + urlencode(params)
        try:
            r = self._send(method, path, body)
        except OSError as e:
            raise ClientError(f"lost the connection to the qmd daemon at {self.url}: {e}") from e
        return _decode(r)

    def stream(self, path: str, body: Any) -> Iterator[dict]:
        """POST and yield NDJSON events; an `error` event becomes a ClientError, and so does
        an answer that stops before its `done` event (the daemon stopped or restarted
        mid-job): a job cut short must never read as one that finished with nothing to say."""
        self._send("GET", "/health", None)
        try:
            r = self.http.open("POST", path, body)
            if r.status >= 400:
                _decode(Response(r.status, r.read()))
            done = False
            while line := r.readline():
                if not line.strip():
                    continue
                ev = json.loads(line)
                if ev.get("event") == "error":
                    raise ClientError(ev.get("error", "update failed"), detail=ev)
                done = done or ev.get("event") == "done"
                yield ev
        except OSError as e:
            raise ClientError(f"lost the connection to the qmd daemon at {self.url}: {e}") from e
        if not done:
            raise ClientError(
                f"the qmd daemon at {self.url} ended the answer before the job finished (it stopped or"
                " restarted); what the job wrote so far is kept: run the command again to finish it"
            )


def _decode(r: Response) -> Any:
    try:
        data = r.json()
    except ValueError:
        data = None
    if r.status >= 400:
        message = data.get("error") if isinstance(data, dict) else None
        text = r.body[:300].decode("utf-8", "replace")
        raise ClientError(message or f"HTTP {r.status}: {text}", detail=data if isinstance(data, dict) else {})
    return data
