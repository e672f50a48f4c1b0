"""`qmdd`: run the daemon in the foreground.

The socket is bound before uvicorn starts so a busy port is one clear line and
exit 1, not a traceback. The pidfile records pid and process start time so a
recycled pid is never mistaken for a live daemon.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import click

from . import __version__
from .paths import DEFAULT_HOST, DEFAULT_PORT, IndexPaths


def process_start_time(pid: int) -> str | None:
    """Kernel start time of `pid` (clock ticks since boot): with the pid, a unique identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


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
@click.version_option(__version__, prog_name="qmdd")
def main(host: str, port: int, index_name: str | None, log_level: str) -> None:
    """The qmd daemon: owns the index, serves the CLI, HTTP and MCP clients."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        paths = IndexPaths.resolve(index_name)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
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
    # uvicorn re-raises the signal it shut down on; with these handlers in place that
    # re-raise lands here instead of killing the process before the cleanup below.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: click.echo(f"qmdd: shutting down ({signal.Signals(s).name})", err=True))
    try:
        config = uvicorn.Config(
            create_app(engine, guard),
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
