"""Loaders that cannot hang the daemon (issue 35): HTML and PDF are parsed in child
processes with a time and a memory budget.

pypdf and lxml's target parser run Python code for every operator and every text event,
and nothing interrupts a thread that is inside them: a 58 KB PDF whose one page holds
20 MB of text operators kept `qmd update` busy for 75 s, and a daemon whose indexing
thread was in such a parse did not stop on SIGTERM. In a child, the budget is a kill:
past `QMD_LOADER_TIMEOUT_S` the child is killed and the file is skipped with that
reason, and its address space is capped (`QMD_LOADER_MEMORY_MB` above what it needs to
start), so a parse that would take all memory fails there, not in qmdd. A native crash
in a parser is a skip too. Files above `QMD_MAX_PARSED_BYTES` are not parsed at all.

Children are reused (starting one and importing the parsers costs about 0.3 s), at most
`PROCS` at a time; one idle for `IDLE_S` exits. `stop()` (the daemon is
shutting down) kills them all at once, and every load after it, or waiting on a killed
child, raises `Stopped`, so an indexing pass ends within moments whatever it was reading.

The protocol is a length-prefixed JSON header, then the file's bytes, one way, and a
length-prefixed JSON answer the other way: no pickle, so a child subverted by a hostile
file can send the daemon text, never code.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO

from qmd.server.children import exit_with_parent
from qmd.server.errors import Unavailable
from qmd.server.ingest import loaders
from qmd.server.models.worker import env_number

TIMEOUT_S = 30
MEMORY_MB = 1024
MAX_PARSED_BYTES = 67_108_864
PROCS = 2
IDLE_S = 60.0
_LEN = struct.Struct(">Q")


class Stopped(Unavailable):
    """The daemon is stopping: no file is parsed any more."""


@dataclass(frozen=True)
class Budget:
    """What one parse may take, from the environment (read for each file, as
    `QMD_MAX_FILE_BYTES` is)."""

    timeout_s: float
    memory_mb: int
    max_bytes: int

    @classmethod
    def from_env(cls) -> Budget:
        return cls(
            timeout_s=env_number("QMD_LOADER_TIMEOUT_S", TIMEOUT_S, float),
            memory_mb=int(env_number("QMD_LOADER_MEMORY_MB", MEMORY_MB, int)),
            max_bytes=int(env_number("QMD_MAX_PARSED_BYTES", MAX_PARSED_BYTES, int)),
        )


class _Child:
    """One loader process and its pipes."""

    def __init__(self, memory_mb: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qmd.server.ingest.sandbox", str(memory_mb), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C meant for a foreground qmdd is the daemon's to pass on
        )
        self.memory_mb = memory_mb
        self.idle_since = time.monotonic()

    def fresh(self, memory_mb: int) -> bool:
        """Alive, with this budget, and not about to exit for idleness."""
        return (
            self.proc.poll() is None
            and self.memory_mb == memory_mb
            and time.monotonic() - self.idle_since < IDLE_S * 0.8
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()

    def call(self, loader: str, path: str, data: bytes, timeout_s: float) -> dict[str, str]:
        """Send one file, wait for its answer; `TimeoutError` past the budget, `EOFError`
        when the child died (the caller kills and forgets it either way)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        head = json.dumps({"loader": loader, "path": path}).encode()
        try:
            self.proc.stdin.write(_LEN.pack(len(head)) + head + _LEN.pack(len(data)))
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise EOFError from None
        deadline = time.monotonic() + timeout_s
        out = self.proc.stdout
        size = _LEN.unpack(_read(out, _LEN.size, deadline))[0]
        answer: dict[str, str] = json.loads(_read(out, size, deadline))
        self.idle_since = time.monotonic()
        return answer


def _read(pipe: IO[bytes], n: int, deadline: float) -> bytes:
    """Exactly `n` bytes from the child, or `TimeoutError` at `deadline`, or `EOFError`."""
    chunks: list[bytes] = []
    fd = pipe.fileno()
    ready = select.poll()  # not select(): a daemon's descriptors may number past FD_SETSIZE
    ready.register(fd, select.POLLIN)
    while n:
        left = deadline - time.monotonic()
        if left <= 0 or not ready.poll(left * 1000):
            raise TimeoutError
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class Pool:
    """The loader processes of one daemon."""

    def __init__(self) -> None:
        self._idle: list[_Child] = []
        self._busy: set[_Child] = set()
        self._cond = threading.Condition()
        self._stopped = False

    def load(self, loader: loaders.Loader, path: str, data: bytes) -> loaders.Extracted:
        """`loader.read(path, data)` in a child, within the budget: its text, or `LoadError`
        with why not (its own reason, too long, too much memory, a crash)."""
        budget = Budget.from_env()
        if len(data) > budget.max_bytes:
            raise loaders.LoadError(
                f"too large to parse as {loader.name.upper()} ({len(data)} bytes > {budget.max_bytes};"
                " raise QMD_MAX_PARSED_BYTES)"
            )
        child = self._take(budget.memory_mb)
        try:
            answer = child.call(loader.name, path, data, budget.timeout_s)
        except TimeoutError:
            self._drop(child)
            self._check()
            raise loaders.LoadError(
                f"{loader.name.upper()} took longer than {budget.timeout_s:g} s to read (raise QMD_LOADER_TIMEOUT_S)"
            ) from None
        except EOFError:
            try:
                code: int | None = child.proc.wait(timeout=5)  # its pipe closes before it is reaped
            except subprocess.TimeoutExpired:
                code = None
            self._drop(child)
            self._check()
            how = "no answer" if code is None else f"signal {-code}" if code < 0 else f"exit code {code}"
            raise loaders.LoadError(f"{loader.name.upper()} could not be read (its parser crashed: {how})") from None
        self._give_back(child)
        if "skip" in answer:
            raise loaders.LoadError(answer["skip"])
        return loaders.Extracted(answer["text"], answer["title"])

    def _check(self) -> None:
        if self._stopped:
            raise Stopped("qmdd is stopping: indexing ends here and resumes on the next update")

    def _take(self, memory_mb: int) -> _Child:
        with self._cond:
            while True:
                self._check()
                while self._idle:
                    child = self._idle.pop()
                    if child.fresh(memory_mb):
                        self._busy.add(child)
                        return child
                    child.kill()
                if len(self._busy) < PROCS:
                    child = _Child(memory_mb)
                    self._busy.add(child)
                    return child
                self._cond.wait()

    def _give_back(self, child: _Child) -> None:
        with self._cond:
            self._busy.discard(child)
            if self._stopped:
                child.kill()
            else:
                self._idle.append(child)
            self._cond.notify()

    def _drop(self, child: _Child) -> None:
        child.kill()
        with self._cond:
            self._busy.discard(child)
            self._cond.notify()

    def stop(self) -> None:
        """Kill every child now; loads in flight and after raise `Stopped`."""
        with self._cond:
            self._stopped = True
            children = [*self._idle, *self._busy]
            self._idle.clear()
            self._cond.notify_all()
        for child in children:
            if child.proc.poll() is None:
                child.proc.kill()


POOL = Pool()
"""The daemon's loader processes (one set for all its indexes)."""


# -- the child --------------------------------------------------------------------


def _limit_memory(budget_mb: int) -> None:
    """Cap the address space at what the child maps now plus `budget_mb`."""
    with open("/proc/self/statm") as fh:
        mapped = int(fh.read().split()[0]) * resource.getpagesize()
    cap = mapped + budget_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _serve(budget_mb: int, parent: int) -> None:
    """Answer requests on stdin until it closes or stays quiet for `IDLE_S`; a daemon killed
    mid-parse (`kill -9`) leaves no parser running on for the rest of its budget."""
    exit_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import lxml.etree  # noqa: F401 - imported before the cap, which counts their mappings
    import pypdf  # noqa: F401

    _limit_memory(budget_mb)
    by_name = {loader.name: loader for loader in loaders.LOADERS}
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while select.select([stdin], [], [], IDLE_S)[0]:
        raw = stdin.read(_LEN.size)
        if len(raw) < _LEN.size:
            return
        head = json.loads(stdin.read(_LEN.unpack(raw)[0]))
        data = stdin.read(_LEN.unpack(stdin.read(_LEN.size))[0])
        loader = by_name[head["loader"]]
        try:
            got = loader.read(head["path"], data)
            answer = {"text": got.text, "title": got.title}
        except loaders.LoadError as e:
            answer = {"skip": e.reason}
        except MemoryError:
            answer = {"skip": f"needed more than {budget_mb} MB to read (raise QMD_LOADER_MEMORY_MB)"}
        except Exception as e:  # noqa: BLE001 - a parser of untrusted files: whatever it raises is this file's skip
            answer = {"skip": f"{loader.name.upper()} could not be read ({type(e).__name__}: {e})"}
        del data
        out = json.dumps(answer).encode()
        stdout.write(_LEN.pack(len(out)) + out)
        stdout.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
