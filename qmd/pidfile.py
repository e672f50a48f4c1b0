"""The daemon's pidfile: which process serves an index, and stopping exactly that one.

The pidfile records pid *and* process start time, so a recycled pid is never mistaken
for a live daemon, never reported as running and never signalled. Stdlib only: the
daemon writes it, `qmd daemon stop` reads it without importing the server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from qmd.paths import IndexPaths, private_dir

STOP_TIMEOUT_S = 20.0
"""SIGTERM lets in-flight requests finish (uvicorn's graceful shutdown is 10 s)."""


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def process_start_time(pid: int) -> str | None:
    """When `pid` started (kernel clock ticks since boot): with the pid, a unique identity.

    Without /proc (macOS, where the launchd agent runs qmdd) `ps` reports the start
    time instead; either way it is only ever compared with a value read the same way.
    """
    fields = _proc_stat(pid)
    if fields is not None:
        return fields[19]
    if Path("/proc/self/stat").exists():
        return None  # /proc works here, so the process is gone
    try:
        out = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def is_running(pid: object, start_time: object) -> bool:
    """Whether the process the pidfile names is still that process, and not a zombie.

    A pid alone is not enough: after the daemon dies the kernel may hand its pid
    to any other program, which must never be reported as qmd or sent SIGTERM.
    """
    if not isinstance(pid, int) or pid <= 0 or not isinstance(start_time, str):
        return False
    if process_start_time(pid) != start_time:
        return False
    fields = _proc_stat(pid)
    return fields is None or fields[0] not in ("Z", "X")


def read_pidfile(paths: IndexPaths) -> dict | None:
    """The pidfile's record, or None when there is none (or it is unreadable)."""
    try:
        data = json.loads(paths.pidfile.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def running_daemon(paths: IndexPaths) -> dict | None:
    """The pidfile's record if it names a live daemon; a stale pidfile is removed."""
    info = read_pidfile(paths)
    if info is not None and is_running(info.get("pid"), info.get("start_time")):
        return info
    if paths.pidfile.exists():
        paths.pidfile.unlink(missing_ok=True)
    return None


def stop_daemon(paths: IndexPaths, timeout: float = STOP_TIMEOUT_S) -> tuple[int, str]:
    """SIGTERM the pidfile's daemon and wait for it to exit: (exit code, message).

    Messages are the original's (spec §22). Unlike the original this waits, so a
    `qmd daemon stop && qmdd --daemon` never finds the old daemon on the port.
    """
    info = read_pidfile(paths)
    if info is None:
        if paths.pidfile.exists():
            paths.pidfile.unlink(missing_ok=True)
            return 0, "Cleaned up stale PID file (server was not running)."
        return 0, "Not running (no PID file)."
    pid, start_time = info.get("pid"), info.get("start_time")
    if not is_running(pid, start_time):
        paths.pidfile.unlink(missing_ok=True)
        return 0, "Cleaned up stale PID file (server was not running)."
    assert isinstance(pid, int)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    except PermissionError:
        return 1, f"Cannot stop qmdd (PID {pid}): it belongs to another user."
    deadline = time.monotonic() + timeout
    while is_running(pid, start_time):
        if time.monotonic() > deadline:
            return 1, f"qmdd (PID {pid}) did not exit within {timeout:.0f}s of SIGTERM; see {paths.logfile}"
        time.sleep(0.05)
    if (read_pidfile(paths) or {}).get("pid") == pid:
        paths.pidfile.unlink(missing_ok=True)
    return 0, f"Stopped qmdd (PID {pid})."


def locate_daemon(paths: IndexPaths, health: dict | None) -> tuple[IndexPaths, dict | None, str | None]:
    """Which daemon `qmd daemon stop|status|restart` means: (the paths of the index whose
    pidfile names it, that live record or None, why it cannot be handled or None).

    The index's own pidfile first (`qmd --index work daemon stop` stops work's daemon,
    whatever port it is on); else the daemon answering on the port (`health`, its
    unauthenticated /health), which one daemon serving every index may have started for
    another index: its pidfile is that index's, the first `/health` names, and counts
    only if it names the same pid. A daemon no pidfile of this user names is never signalled.
    """
    info = read_pidfile(paths)
    if info is not None and is_running(info.get("pid"), info.get("start_time")):
        return paths, info, None
    pid = (health or {}).get("pid")
    if not isinstance(pid, int):
        return paths, None, None
    indexes = (health or {}).get("indexes") or []
    if indexes and isinstance(indexes[0], str):
        try:
            started = IndexPaths.resolve(indexes[0])
        except ValueError:
            started = None
        record = read_pidfile(started) if started is not None else None
        if (
            started is not None
            and record is not None
            and record.get("pid") == pid
            and is_running(pid, record.get("start_time"))
        ):
            return started, record, None
    return (
        paths,
        None,
        f"the qmd daemon on the port (PID {pid}) is named by none of your pidfiles in {paths.cache_dir} "
        "(another user's, or started with other XDG dirs): not signalling it.",
    )


def write_pidfile(paths: IndexPaths, host: str, port: int, version: str) -> None:
    private_dir(paths.cache_dir)
    tmp = paths.pidfile.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "start_time": process_start_time(os.getpid()),
                "host": host,
                "port": port,
                "index": paths.name,
                "started_at": time.time(),
                "version": version,
            }
        )
    )
    os.replace(tmp, paths.pidfile)


def remove_pidfile(paths: IndexPaths) -> None:
    try:
        data = json.loads(paths.pidfile.read_text())
    except (OSError, ValueError):
        return
    if data.get("pid") == os.getpid():
        paths.pidfile.unlink(missing_ok=True)
