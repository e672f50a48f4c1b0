"""Other local users: with no token (the default), a loopback request from another uid
is refused on every route but /health, whatever it asks (issue 13, item 6: uid 65534
with plain curl added /etc as a collection and read /etc/shadow); the daemon's own user
is served with no setup; a token shares the daemon on purpose. The other user is real:
`setpriv` runs the client as uid 65534 (the tests run as root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import NoReturn

import pytest
from conftest import Daemon, Env, unavailable

from qmd.server.http.peer import _diag_uid, _hex, _table_uid, peer_uid

pytestmark = pytest.mark.slow

NOBODY = 65534
CLIENT = """
import json, sys, urllib.request, urllib.error
method, url, body, token = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
headers = {"content-type": "application/json"}
if token:
    headers["authorization"] = "bearer " + token
req = urllib.request.Request(url, method=method, data=body.encode() or None, headers=headers)
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
"""


def as_user(uid: int | None, method: str, url: str, body: dict | None = None, token: str = "") -> tuple[int, dict]:
    argv = [sys.executable, "-I", "-c", CLIENT, method, url, json.dumps(body) if body else "", token]
    if uid is not None:
        if os.getuid() != 0 or not shutil.which("setpriv"):
            unavailable("another uid needs root and setpriv")
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    status, _, text = out.stdout.partition(" ")
    assert status.isdigit(), out.stderr
    return int(status), json.loads(text)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("peer")
    os.chmod(base, 0o755)  # so uid 65534 can run Python from here; the daemon's files stay private
    env = Env(base)
    d = Daemon(env)
    yield d
    d.stop()


ATTACKS = [
    ("POST", "/v1/collections", {"path": "/etc", "name": "etc", "pattern": "shadow"}),
    ("POST", "/v1/get", {"file": "/etc/shadow"}),
    ("GET", "/v1/status", None),
    ("POST", "/v1/keyword", {"query": "root"}),
    ("POST", "/query", {"query": "root"}),
    ("POST", "/metadata", {}),
]


@pytest.mark.parametrize(("method", "path", "body"), ATTACKS)
def test_another_local_user_is_refused_and_changes_nothing(
    daemon: Daemon, method: str, path: str, body: dict | None
) -> None:
    status, answer = as_user(NOBODY, method, daemon.env.url + path, body)
    assert status == 403, answer
    assert f"another local user (uid {NOBODY})" in answer["error"]
    assert daemon.http.get("/v1/collections").json()["collections"] == []


def test_mcp_over_http_from_another_user_is_refused(daemon: Daemon) -> None:
    status, answer = as_user(
        NOBODY, "POST", daemon.env.url + "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    )
    assert status == 403 and "another local user" in answer["error"]


def test_health_answers_anyone_and_the_own_user_needs_no_setup(daemon: Daemon) -> None:
    assert as_user(NOBODY, "GET", daemon.env.url + "/health")[0] == 200
    status, answer = as_user(None, "GET", daemon.env.url + "/v1/collections")
    assert status == 200 and answer == {"collections": []}


def test_a_token_shares_the_daemon_on_purpose(tmp_path_factory: pytest.TempPathFactory) -> None:
    base = tmp_path_factory.mktemp("peer-token")
    os.chmod(base, 0o755)
    env = Env(base)
    d = Daemon(env, extra_env={"QMD_TOKEN": "shared-secret"})
    try:
        url = env.url + "/v1/collections"
        assert as_user(NOBODY, "GET", url)[0] == 401
        status, answer = as_user(NOBODY, "GET", url, token="shared-secret")  # lowercase "bearer" is accepted
        assert status == 200 and answer == {"collections": []}
    finally:
        d.stop()


def test_the_kernel_names_this_connection_both_ways(daemon: Daemon) -> None:
    """The lookup itself, on connections of ours: uid 0 here (tests run as root), from
    sock_diag and from the tables alike; a connection nobody has is in neither."""
    import socket

    host, port = "127.0.0.1", daemon.env.port
    with socket.create_connection((host, port)) as s:
        client = s.getsockname()
        assert peer_uid(client, (host, port)) == _diag_uid(client, (host, port)) == os.getuid()
        assert _table_uid(client, (host, port)) == os.getuid()
        assert _diag_uid((host, 1), (host, port)) is None and _table_uid((host, 1), (host, port)) is None
    with socket.socket(socket.AF_INET6) as listener:
        listener.bind(("::1", 0))
        listener.listen()
        server = listener.getsockname()[:2]
        with socket.create_connection(server) as s6:
            assert _diag_uid(s6.getsockname()[:2], server) == _table_uid(s6.getsockname()[:2], server) == os.getuid()
    assert _hex("127.0.0.1", 8181) == ("0100007F:1FF5", "0000000000000000FFFF00000100007F:1FF5")
    assert _hex("::1", 1)[1] == "00000000000000000000000001000000:0001"


def test_without_netlink_the_tables_answer(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel (or sandbox) that refuses sock_diag: the lookup reads /proc's tables instead."""
    import socket

    import qmd.server.http.peer as peer

    def refused(*_: object) -> NoReturn:
        raise PermissionError(1, "netlink refused")

    monkeypatch.setattr(peer, "_diag_uid", refused)
    host, port = "127.0.0.1", daemon.env.port
    with socket.create_connection((host, port)) as s:
        assert peer_uid(s.getsockname(), (host, port)) == os.getuid()
