"""`qmdd`: run the daemon in the foreground, or detached with `--daemon`.

The socket is bound before uvicorn starts so a busy port is one clear line and
exit 1, not a traceback. `--daemon` starts the same command as a detached child
(`qmd.spawn`, shared with the CLI's autostart) and reports success only once that
child answers `/health`. The pidfile (`qmd.pidfile`) records pid and start time.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys

import click

from qmd.paths import DEFAULT_HOST, DEFAULT_PORT, IndexPaths, private_dir
from qmd.pidfile import remove_pidfile, running_daemon, write_pidfile
from qmd.token import TokenError, load_token
from qmd.version import __version__


def start_detached(paths: IndexPaths, host: str, port: int, log_level: str) -> int:
    """`qmdd --daemon`: start this command detached; report once `/health` answers.

    Runs under the same lock as the CLI's autostart, so a CLI starting a daemon at
    the same moment waits and then finds this one.
    """
    from qmd.spawn import SpawnError, daemon_lock, spawn_daemon

    with daemon_lock(paths):
        info = running_daemon(paths)
        if info is not None:
            click.echo(f"Already running (PID {info['pid']}). Run 'qmd daemon stop' first.", err=True)
            return 1
        try:
            health = spawn_daemon(paths, host, port, ["--index", paths.name, "--log-level", log_level])
        except SpawnError as e:
            click.echo(e.message, err=True)
            return 1
    click.echo(f"Started on http://{host or DEFAULT_HOST}:{port} (PID {health['pid']})")
    click.echo(f"Logs: {paths.logfile}")
    return 0


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

    from qmd.server.engine import Engine
    from qmd.server.errors import QmdError
    from qmd.server.http.app import create_app
    from qmd.server.http.guard import GuardSettings
    from qmd.server.indexes import Indexes
    from qmd.server.ingest.watcher import Watcher, WatchSettings
    from qmd.server.models.worker import WorkerClient

    guard, warnings = GuardSettings.from_env(host)
    for w in warnings:
        click.echo(w, err=True)
    private_dir(paths.cache_dir)  # the index, its log and pidfile
    private_dir(paths.config.parent)  # index.yml: collections and their commands

    def open_index(index: IndexPaths, worker: WorkerClient | None = None) -> Engine:
        """An index as the daemon serves it: its engine, watching its collections."""
        engine = Engine(index, worker=worker)
        engine.watcher = Watcher(engine, watch)
        if worker is not None:  # the default one starts watching once the pidfile is written
            engine.watcher.start()
        engine.load_vector_index()
        return engine

    try:
        watch = WatchSettings.from_env()
        engine = open_index(paths)
        indexes = Indexes(engine, open_index)
    except QmdError as e:
        click.echo(f"qmdd: {e.message}", err=True)
        sys.exit(1)
    write_pidfile(paths, host, port, __version__)
    click.echo(f"qmdd {__version__} listening on http://{host}:{port} (index {paths.db}, pid {os.getpid()})", err=True)
    if token is not None:
        click.echo("qmdd: a bearer token is required on every route but /health", err=True)
    # uvicorn re-raises the signal it shut down on; with these handlers in place that
    # re-raise lands here instead of killing the process before the cleanup below.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: click.echo(f"qmdd: shutting down ({signal.Signals(s).name})", err=True))
    try:
        assert engine.watcher is not None
        engine.watcher.start()  # after the pidfile: a client that finds this daemon finds it watching
        config = uvicorn.Config(
            create_app(engine, guard, token, indexes),
            log_level=log_level,
            access_log=log_level == "debug",
            timeout_graceful_shutdown=10,
            lifespan="off",
        )
        server = uvicorn.Server(config)
        graceful = server.handle_exit

        def handle_exit(sig: int, frame: object) -> None:
            indexes.stopping()  # a pass reading a file ends now, not after the graceful wait
            graceful(sig, frame)  # type: ignore[arg-type]

        server.handle_exit = handle_exit  # type: ignore[method-assign]
        server.run(sockets=[sock])
    finally:
        indexes.close()
        remove_pidfile(paths)
        click.echo("qmdd: stopped", err=True)


if __name__ == "__main__":
    main()
