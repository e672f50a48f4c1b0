"""`qmdd`: run the daemon in the foreground, or detached with `--daemon`.

The socket is bound before uvicorn starts so a busy port is one clear line and
exit 1, not a traceback. The pidfile records pid and process start time so a
recycled pid is never mistaken for a live daemon, never reported as running and
never signalled.

`--daemon` starts the same command as a detached child (its own session, output
to the log) and reports success only once that child answers `/health`: the
original wrote its pidfile and said "Started" even when the child then failed to
bind. The pidfile helpers here are stdlib only, so `qmd daemon stop` can use
them without importing the server.
"""

from __future__ import annotations

import errno
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click

from . import __version__
from .auth import TokenError, load_token
from .paths import DEFAULT_HOST, DEFAULT_PORT, IndexPaths

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
"""SIGTERM lets in-flight requests finish (uvicorn's graceful shutdown is 10 s)."""
_WILDCARDS = {"", "0.0.0.0", "::", "[::]", "*"}


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


def _health(host: str, port: int) -> dict | None:
    """`/health` of whatever listens on host:port, or None if nothing answers it."""
    connect = "127.0.0.1" if host in _WILDCARDS or host == "localhost" else host.strip("[]")
    conn = http.client.HTTPConnection(connect, port, timeout=2)
    try:
        conn.request("GET", "/health")
        r = conn.getresponse()
        return json.loads(r.read()) if r.status == 200 else None
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def start_detached(paths: IndexPaths, host: str, port: int, log_level: str) -> int:
    """`qmdd --daemon`: start this command detached; report once `/health` answers.

    Runs under the same lock as the CLI's autostart, so a CLI starting a daemon at
    the same moment waits and then finds this one.
    """
    import fcntl

    paths.cache_dir.mkdir(parents=True, exist_ok=True)
    with open(paths.lockfile, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        info = running_daemon(paths)
        if info is not None:
            click.echo(f"Already running (PID {info['pid']}). Run 'qmd daemon stop' first.", err=True)
            return 1
        cmd = [sys.executable, "-m", "server.main", "--host", host, "--port", str(port)]
        cmd += ["--index", paths.name, "--log-level", log_level]
        with open(paths.logfile, "wb") as log:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True, cwd="/"
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                click.echo(f"qmdd failed to start (exit {proc.returncode}); see {paths.logfile}:", err=True)
                click.echo(_tail(paths.logfile), err=True)
                return 1
            health = _health(host, port)
            if health is not None and health.get("pid") == proc.pid:
                click.echo(f"Started on http://{host or DEFAULT_HOST}:{port} (PID {proc.pid})")
                click.echo(f"Logs: {paths.logfile}")
                return 0
            time.sleep(0.05)
        proc.terminate()
        click.echo(
            f"qmdd did not answer /health within {START_TIMEOUT_S:.0f}s; stopped it. See {paths.logfile}", err=True
        )
        return 1


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def bind_socket(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = sorted(infos, key=lambda i: i[0] != socket.AF_INET)[0]
    # proto must be IPPROTO_TCP: asyncio only sets TCP_NODELAY on accepted sockets whose
    # proto says TCP, and without it every kept-alive response waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6 and host in ("::", "[::]"):
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(addr)
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def write_pidfile(paths: IndexPaths, host: str, port: int) -> None:
    paths.cache_dir.mkdir(parents=True, exist_ok=True)
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
                "version": __version__,
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


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--host",
    envvar="QMD_HOST",
    default=DEFAULT_HOST,
    show_default=True,
    help="Interface to bind (env QMD_HOST). Non-loopback binds need QMD_ALLOWED_HOSTS.",
)
@click.option(
    "--port",
    envvar="QMD_PORT",
    default=DEFAULT_PORT,
    type=click.IntRange(1, 65535),
    show_default=True,
    help="TCP port (env QMD_PORT).",
)
@click.option("--index", "index_name", default=None, help="Named index (its own config and database).")
@click.option(
    "--log-level", default="warning", type=click.Choice(["debug", "info", "warning", "error"]), show_default=True
)
@click.option(
    "--daemon",
    "detach",
    is_flag=True,
    help="Start in the background (log in the cache dir); return once it answers /health.",
)
@click.version_option(__version__, prog_name="qmdd")
def main(host: str, port: int, index_name: str | None, log_level: str, detach: bool) -> None:
    """The qmd daemon: owns the index, serves the CLI, HTTP and MCP clients."""
    try:
        paths = IndexPaths.resolve(index_name)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    try:
        token = load_token()
    except TokenError as e:
        click.echo(f"qmdd: {e}", err=True)
        sys.exit(1)
    if detach:
        sys.exit(start_detached(paths, host, port, log_level))
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        sock = bind_socket(host, port)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            click.echo(
                f"qmdd: port {port} on {host} is already in use (another qmdd?). Try a different port with --port.",
                err=True,
            )
        else:
            click.echo(f"qmdd: cannot listen on {host}:{port}: {e.strerror or e}", err=True)
        sys.exit(1)

    import uvicorn

    from .app import create_app
    from .engine import Engine
    from .errors import QmdError
    from .guard import GuardSettings

    guard, warnings = GuardSettings.from_env(host)
    for w in warnings:
        click.echo(w, err=True)
    try:
        engine = Engine(paths)
    except QmdError as e:
        click.echo(f"qmdd: {e.message}", err=True)
        sys.exit(1)
    write_pidfile(paths, host, port)
    click.echo(f"qmdd {__version__} listening on http://{host}:{port} (index {paths.db}, pid {os.getpid()})", err=True)
    if token is not None:
        click.echo("qmdd: a bearer token is required on every route but /health", err=True)
    # uvicorn re-raises the signal it shut down on; with these handlers in place that
    # re-raise lands here instead of killing the process before the cleanup below.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: click.echo(f"qmdd: shutting down ({signal.Signals(s).name})", err=True))
    try:
        config = uvicorn.Config(
            create_app(engine, guard, token),
            log_level=log_level,
            access_log=log_level == "debug",
            timeout_graceful_shutdown=10,
            lifespan="off",
        )
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        engine.close()
        remove_pidfile(paths)
        click.echo("qmdd: stopped", err=True)


if __name__ == "__main__":
    main()
