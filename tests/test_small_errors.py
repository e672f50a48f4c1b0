"""The smaller wrong answers of issue 35, each a clear error that changes nothing: a dangling
link in a project's `.qmd/`, `qmd index copy` from a file that is no index, a Postgres
server that cannot be reached (told at once, not after 30 s as a "busy" pool), and a
watcher that died (said, with why, not shown as still starting)."""

from __future__ import annotations

import glob
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from urllib.parse import parse_qs, urlsplit

import pytest
from conftest import NOTES, Daemon, Env, new_database, write
from harness import free_port
from test_project_symlinks import CONFIG
from test_watcher import eventually

from qmd.server.config import Collection
from qmd.server.ingest.indexer import Pace, Scope, Summary
from qmd.server.ingest.watcher import Watcher, WatchSettings

# -- a dangling link under .qmd ----------------------------------------------------------


@pytest.mark.parametrize("name", ["index.sqlite", "index.sqlite-wal", "index.sqlite-shm", "index.sqlite-journal"])
def test_a_dangling_link_in_dot_qmd_is_a_clear_error_on_every_command(env: Env, daemon: Daemon, name: str) -> None:
    repo = write(env.home / "repo", {"README.md": "# Widget\n\nzanzibar\n", ".qmd/index.yml": CONFIG})
    link = repo / ".qmd" / name
    link.symlink_to(env.base / "gone" / name)
    for args in (("status",), ("search", "zanzibar"), ("update",), ("get", "README.md"), ("ls",)):
        r = env.qmd(*args, cwd=repo)
        assert r.returncode == 1, (args, r.stdout)
        assert "internal error" not in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert f"{link} is a symbolic link" in r.stderr and f"rm '{link}'" in r.stderr, (args, r.stderr)
    assert not (env.base / "gone").exists()
    link.unlink()
    assert "1 new" in env.ok("update", cwd=repo)


def test_init_over_a_dangling_dot_qmd_link_says_what_to_remove(env: Env, daemon: Daemon) -> None:
    repo = write(env.home / "repo", {"README.md": "# Widget\n"})
    (repo / ".qmd").symlink_to(env.base / "gone")
    r = env.qmd("init", cwd=repo)
    assert r.returncode == 1 and "internal error" not in r.stderr, r.stderr
    # said by the walk every command takes to its project, before init's own check
    assert f"{repo / '.qmd'} is a link to {env.base / 'gone'}, which qmd cannot read as a folder" in r.stderr
    assert not (env.base / "gone").exists()
    (repo / ".qmd").unlink()
    (repo / ".qmd").write_text("a file where the folder goes\n")
    r = env.qmd("init", cwd=repo)
    assert r.returncode == 1 and f"{repo / '.qmd'} is not a folder" in r.stderr, r.stderr


# -- qmd index copy from what is no index ---------------------------------------------------


def test_copying_from_a_file_that_is_no_index_is_a_400_that_changes_nothing(env: Env, daemon: Daemon) -> None:
    text = env.base / "notes.txt"
    text.write_text("not an index\n")
    empty = env.base / "empty.sqlite"
    empty.write_bytes(b"")
    app = env.base / "app.sqlite"
    conn = sqlite3.connect(app)
    conn.execute("CREATE TABLE appdata(x)")
    conn.commit()
    conn.close()
    sources = {text: "not an SQLite database", empty: "an empty file", app: "an SQLite database without qmd's tables"}
    for source, why in sources.items():
        before = source.read_bytes()
        body = {"source": str(source), "destination": str(env.base / "out.sqlite")}
        r = daemon.http.post("/v1/index/copy", json=body)
        [event] = [line for line in r.text.splitlines() if '"error"' in line]
        assert '"status": 400' in event and why in event, event
        cli = env.qmd("index", "copy", str(source), str(env.base / "out.sqlite"))
        assert cli.returncode == 1 and "internal error" not in cli.stderr, cli.stderr
        assert f"{source} is not a qmd index ({why}" in cli.stderr, cli.stderr
        assert source.read_bytes() == before and not (env.base / "out.sqlite").exists()


# -- Postgres out of reach ----------------------------------------------------------------


class Cuttable:
    """A loopback TCP port forwarding to the test Postgres' unix socket, which a test cuts
    (the server unreachable: stopped, or the network lost) and restores."""

    def __init__(self, unix_socket: str) -> None:
        self.target = unix_socket
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Cuttable:
        self.up()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.down()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            socks, self._open = self._open, []
            if self._listener is not None:
                socks.append(self._listener)
                self._listener = None
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX)
            server.connect(self.target)
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass


@pytest.fixture
def cuttable_index(postgres_url: str) -> Iterator[tuple[str, Cuttable]]:
    """A database of its own on the test server, and its URL through a `Cuttable` port."""
    host = parse_qs(urlsplit(postgres_url).query)["host"][0]
    [unix_socket] = [p for p in glob.glob(os.path.join(host, ".s.PGSQL.*")) if not p.endswith(".lock")]
    with new_database(postgres_url) as url, Cuttable(unix_socket) as link:
        yield f"postgresql://postgres@127.0.0.1:{link.port}{urlsplit(url).path}", link


def test_a_postgres_server_out_of_reach_is_said_at_once(env: Env, tmp_path: Path, cuttable_index: tuple) -> None:
    url, link = cuttable_index
    d = Daemon(env, extra_env={"QMD_INDEX_URL": url})
    env.vars["QMD_NO_AUTOSTART"] = "1"
    try:
        env.ok("collection", "add", str(write(tmp_path / "notes", NOTES)), "--name", "notes")
        assert d.http.post("/v1/keyword", json={"query": "bread"}).status_code == 200
        link.down()
        t0 = time.monotonic()
        r = d.http.post("/v1/keyword", json={"query": "bread"})
        waited = time.monotonic() - t0
        print(f"a read with the Postgres server out of reach: {r.status_code} after {waited:.2f} s")
        assert r.status_code == 503, r.text
        assert "is not reachable" in r.json()["error"] and "busy" not in r.json()["error"], r.text
        assert waited < 8, waited
        cli = env.qmd("search", "bread")
        assert cli.returncode != 0 and "is not reachable" in cli.stderr and "Traceback" not in cli.stderr, cli.stderr
        link.up()
        eventually(lambda: d.http.post("/v1/keyword", json={"query": "bread"}).status_code == 200, timeout=60)
    finally:
        d.stop()


# -- a watcher that died ------------------------------------------------------------------


class _Folders:
    """The `Watched` side of a watcher over fixed collections, indexing nothing."""

    def __init__(self, colls: list[Collection]) -> None:
        self.colls = colls

    def watched_collections(self) -> list[Collection]:
        return self.colls

    def index_watched(self, name: str, scope: Scope | None, pace: Pace) -> Summary | None:
        return None

    def embed_watched(self, collections: list[str], cancel: threading.Event) -> object:
        return None


def test_a_watcher_that_died_says_it_stopped_and_why(tmp_path: Path) -> None:
    """A real cause: inotify's backend takes only UTF-8 folder names, and a Latin-1 one
    (an old archive's) made the listener raise and end, shown as 'off (starting)' forever."""
    raw = os.fsencode(tmp_path) + b"/caf\xe9"
    os.mkdir(raw)
    coll = Collection("cafe", os.fsdecode(raw))
    watcher = Watcher(_Folders([coll]), WatchSettings(embed=False))
    watcher.start()
    try:
        info = eventually(lambda: (i := watcher.info(coll, 0, "")).reason != "starting" and i, what="the death")
    finally:
        watcher.stop()
    assert info.mode == "off" and info.reason.startswith("stopped: UnicodeEncodeError: "), info
    assert info.reason.endswith("restart the daemon to watch it again"), info
