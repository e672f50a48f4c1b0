"""Starting a detached `qmdd` and waiting until it answers `/health`.

Two callers start daemons: `qmdd --daemon` and the CLI's (and bridge's) autostart.
Both hold `daemon_lock` while they check for a running daemon and start one, so ten
CLIs and a `qmdd --daemon` started at once start exactly one. Success means *this*
child answers `/health` (its pid in the answer), not merely that something listens:
the original wrote its pidfile and said "Started" even when the child then failed to
bind. Stdlib only: the thin clients import it.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from qmd.paths import IndexPaths, connect_host, private_dir, private_file

START_TIMEOUT_S = 30.0
DAEMON_MODULE = "qmd.server.daemon"
"""What `python -m` runs: the same entry point as the `qmdd` script."""


class SpawnError(Exception):
    """The daemon did not come up; the message says why and where its log is."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def probe_health(host: str, port: int, timeout: float = 2.0) -> dict | None:
    """`/health` of whatever listens on host:port, or None if nothing answers it."""
    conn = http.client.HTTPConnection(connect_host(host), port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        r = conn.getresponse()
        return json.loads(r.read()) if r.status == 200 else None
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()


@contextmanager
def daemon_lock(paths: IndexPaths) -> Iterator[None]:
    """The per-index start-up lock (an flock on the cache dir's lockfile)."""
    private_dir(paths.cache_dir)
    with open(private_file(paths.lockfile), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def spawn_daemon(
    paths: IndexPaths, host: str, port: int, args: Sequence[str] = (), *, timeout: float = START_TIMEOUT_S
) -> dict:
    """Start `qmdd` detached (own session, output appended to the index's log) and
    return its `/health` answer once it gives one. Call it holding `daemon_lock`.

    A child that exits, or does not answer within `timeout` (it is then stopped), is a
    `SpawnError` carrying the end of its log.
    """
    cmd = [sys.executable, "-m", DAEMON_MODULE, "--host", host, "--port", str(port), *args]
    with open(private_file(paths.logfile), "ab") as log:
        log.write(f"\n--- {' '.join(['qmdd', *cmd[3:]])} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True, cwd="/"
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SpawnError(
                f"qmdd failed to start (exit {proc.returncode}); see {paths.logfile}:\n{tail(paths.logfile)}"
            )
        health = probe_health(host, port)
        if health is not None and health.get("pid") == proc.pid:
            return health
        time.sleep(0.05)
    proc.terminate()
    raise SpawnError(f"qmdd did not answer /health within {timeout:.0f}s; stopped it. See {paths.logfile}")


def tail(path: os.PathLike[str] | str, lines: int = 15) -> str:
    """The last lines of a log, for an error message (8 KiB read at most)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            return "\n".join(fh.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
