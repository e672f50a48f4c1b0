"""One isolated qmd installation and its daemon, shared by the tests and the benchmarks so
that both measure and check the same thing: a real `qmdd` in temporary HOME/XDG dirs on a
free port, and the real CLI as a fresh process.

Stdlib + httpx only, and no pytest: bench/_common.py imports it from outside pytest. It
lives with the tests, not in the `qmd` package, so installing qmd never ships it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    """A loopback port nobody listens on now, so parallel runs never meet the user's daemon or each other."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    """Ask `proc` to stop with `sig`, killing it if it has not within `timeout`: a hung
    process must not outlive the test or benchmark that started it."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
    return proc.returncode


BACKEND = os.environ.get("QMD_TEST_BACKEND", "sqlite")
"""Which backend every test's index is on: `sqlite` (the default), or `postgres`, when
the suite runs as the Postgres backend's contract (`QMD_TEST_BACKEND=postgres`)."""


class Env:
    """Temporary HOME/XDG dirs and a port: one qmd installation that no other run, and not
    the user's own index or daemon, can see."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.cache = base / "cache"
        self.config = base / "config"
        self.home = base / "home"
        for d in (self.cache, self.config, self.home):
            d.mkdir(parents=True, exist_ok=True)
        # The caller's QMD_/XDG_ settings would point at a real index. PYTHONDONTWRITEBYTECODE
        # (set in some sandboxes) would make every start compile its modules from source;
        # users have bytecode caches, so run (and measure) with them.
        self.vars = {
            **{
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("QMD_", "XDG_", "INDEX_PATH")) and k != "PYTHONDONTWRITEBYTECODE"
            },
            "HOME": str(self.home),
            "XDG_CACHE_HOME": str(self.cache),
            "XDG_CONFIG_HOME": str(self.config),
            "QMD_PORT": str(self.port),
            # A daemon that indexes what changes on its own would change what every other
            # test's `qmd update` reports; tests/test_watcher.py turns watching on.
            "QMD_WATCH": "0",
            "NO_COLOR": "1",
            "PYTHONUNBUFFERED": "1",
        }
        if url := os.environ.get("QMD_TEST_INDEX_URL"):  # the suite run on Postgres (tests/conftest.py)
            self.vars["QMD_INDEX_URL"] = url

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.cache / "qmd" / "qmdd.log"

    @property
    def db(self) -> Path:
        return self.cache / "qmd" / "index.sqlite"

    def run(
        self,
        argv: list[str],
        cwd: Path | str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`argv` to completion inside this installation (its HOME, XDG dirs and port), from its HOME."""
        return subprocess.run(
            argv,
            cwd=cwd or self.home,
            env={**self.vars, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )

    def qmd(
        self,
        *args: str,
        cwd: Path | str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """The CLI as a fresh process, the way a user runs it, so start-up and autostart are real."""
        return self.run([sys.executable, "-m", "qmd.client.cli", *args], cwd, env, timeout, input)

    def qmd_background(self, *args: str) -> subprocess.Popen[str]:
        """The CLI started and left running (a long job to interrupt or race against),
        its output piped. Its SIGINT is the default, as in a user's terminal: a suite
        started as a background job without job control would hand it an ignored one,
        and Python then never raises KeyboardInterrupt."""
        return subprocess.Popen(
            [sys.executable, "-m", "qmd.client.cli", *args],
            env=self.vars,
            cwd=self.home,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    def qmdd_command(self, *args: str) -> list[str]:
        """`qmdd` on this port as `python -m`, so it runs this interpreter's qmd (the code under test)."""
        return [sys.executable, "-m", "qmd.server.daemon", "--port", str(self.port), *args]

    def qmdd(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """`qmdd` in the foreground until it exits: for starts that must be refused, and for
        `--daemon`, which returns once the detached daemon answers."""
        return self.run(self.qmdd_command(*args), env=env, timeout=timeout)

    def ok(self, *args: str, **kw: Any) -> str:
        r = self.qmd(*args, **kw)
        assert r.returncode == 0, f"qmd {' '.join(args)} exited {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
        return r.stdout

    def json(self, *args: str, **kw: Any) -> Any:
        return json.loads(self.ok(*args, **kw))


class Daemon:
    """A `qmdd` process started the way a user would, stopped with SIGTERM; ready once
    `/health` answers, which `startup_s` times."""

    def __init__(
        self, env: Env, *args: str, extra_env: dict[str, str] | None = None, wrapper: Sequence[str] = ()
    ) -> None:
        """`wrapper` is a command that execs the rest (`unshare ...`): a daemon under limits
        of its own."""
        self.env = env
        self.output = env.base / f"qmdd-{env.port}.out"
        t0 = time.perf_counter()
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                [*wrapper, *env.qmdd_command(*args)],
                cwd=env.home,
                env={**env.vars, **(extra_env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.http = httpx.Client(base_url=env.url, timeout=120)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                self.http.close()
                raise RuntimeError(f"qmdd exited {self.proc.returncode}: {self.output.read_text()}")
            try:
                if self.http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"qmdd did not answer /health within 60s: {self.output.read_text()}")
            time.sleep(0.02)
        self.startup_s = time.perf_counter() - t0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.http.close()
        return stop_process(self.proc, sig)


def processes_of(module: str, arg: str) -> list[int]:
    """Pids of every `python -m module` process with `arg` among its arguments, which no
    Popen handle of ours may know about (autostarted daemons, a daemon's children)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if module.encode() in cmd and arg.encode() in cmd:
                pids.append(int(p.name))
    return pids


def daemons_on(port: int) -> list[int]:
    """Pids of every qmdd process started for `port`, autostarted ones included."""
    return processes_of("qmd.server.daemon", str(port))


# --- model endpoints on loopback: a scripted one for failures, llama_cpp.server for real models ---

Reply = tuple[int, dict[str, str], bytes]
"""Status, headers (a JSON Content-Type unless they say otherwise) and body of one scripted answer."""


class Scripted(ThreadingHTTPServer):
    """A loopback endpoint answering POSTs from a script of replies, then from `fallback`
    (which sees the request's JSON body), recording each request's path, body and
    Authorization header: the failures a real server will not produce on demand."""

    def __init__(self, fallback: Callable[[Any], Reply] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _ScriptedHandler)
        self.fallback = fallback
        self.replies: list[Reply] = []
        self.paths: list[str] = []
        self.bodies: list[Any] = []
        self.auth: list[str | None] = []

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def url(self) -> str:
        """The API base, as OpenAI-compatible servers have it."""
        return f"{self.root}/v1"


class _ScriptedHandler(BaseHTTPRequestHandler):
    server: Scripted

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.paths.append(self.path)
        self.server.bodies.append(body)
        self.server.auth.append(self.headers.get("Authorization"))
        if self.server.replies or self.server.fallback is None:
            status, headers, payload = self.server.replies.pop(0)
        else:
            status, headers, payload = self.server.fallback(body)
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        """Quiet: a failing test shows its own output, not access logs."""


@contextmanager
def scripted_endpoint(fallback: Callable[[Any], Reply] | None = None) -> Iterator[Scripted]:
    """A `Scripted` endpoint serving in a thread until the block ends."""
    server = Scripted(fallback)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def silent_endpoint() -> Iterator[str]:
    """An API base whose socket accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


@dataclass
class LlamaServer:
    """A running model server (`python -m llama_cpp.server` or llama.cpp's `llama-server`), its
    OpenAI API base and its log."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self) -> None:
        stop_process(self.proc, timeout=10)


def llama_cpp_server(model: Path, log: Path, *args: str, alias: str, api_key: str | None = None) -> LlamaServer:
    """`python -m llama_cpp.server` serving `model` as `alias` on a free loopback port (2 threads),
    once it answers; `args` are its own options (`--embedding true`). The caller stops it."""
    port = free_port()
    argv = ["--model", str(model), "--model_alias", alias, "--verbose", "false", *args]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--n_threads", "2", "--n_threads_batch", "2"]
    argv += ["--api_key", api_key] if api_key else []
    return _serve("llama_cpp.server", [sys.executable, "-c", _LLAMA_CPP_SERVER, *argv], port, log, api_key)


_LLAMA_CPP_SERVER = """
import runpy, sys
from qmd.server.models.worker_child import model_params
sys.argv[0] = "llama_cpp.server"
with model_params():  # loaded as the worker loads: no AMX weight repacking where it crashes
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""
"""`python -m llama_cpp.server`, its model loaded with the worker's `model_params`: the server
takes no option for llama.cpp's weight repacking, which crashes Q8_0/Q4_1 models on AMX CPUs."""


def llama_server(binary: Path, model: Path, log: Path, *args: str, alias: str) -> LlamaServer:
    """llama.cpp's own `llama-server` binary serving `model` as `alias` on a free loopback port
    (2 threads), once it answers; `args` are its options (`--reranking`). The caller stops it."""
    port = free_port()
    argv = ["-m", str(model), "--alias", alias, "--host", "127.0.0.1", "--port", str(port), "-t", "2", *args]
    return _serve("llama-server", [str(binary), *argv], port, log, None)


def _serve(name: str, cmd: list[str], port: int, log: Path, api_key: str | None) -> LlamaServer:
    """Start `cmd` and wait (60 s at most) until its `/v1/models` answers 200: llama-server
    answers 503 while it loads the model."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    served = LlamaServer(proc, f"http://127.0.0.1:{port}/v1", log)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            served.stop()
            raise RuntimeError(f"{name} did not start:\n{log.read_text()}")
        try:
            if httpx.get(f"{served.url}/models", headers=headers, timeout=1).status_code == 200:
                return served
        except httpx.TransportError:
            pass
        time.sleep(0.1)
