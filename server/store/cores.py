"""Whether, and on which threads, a search may cut its own work across the cores.

A search on its own leaves the other core idle, so the vector index's passes
(`vector_index._in_parts`) and a large keyword ranking (`search.lexical._Halves`) run in
parts at once, on this module's pool: at 1M chunks on 2 cores, the vector leg took 0.52x
and keyword search 0.49x the time of the code before (docs/benchmarks.md#scale). A hybrid
query already runs its two legs side by side; cutting them as well measured no faster there
(in process at 1M, alternate queries: 69.6 against 68.0 ms p50 for the keyword halves, 64.7
against 61.6 for the vector parts), so its legs run marked as sharing the cores, and get no
helper.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")

THREADS = min(os.cpu_count() or 1, 4)
"""Threads one search may cut its work across: its own and up to THREADS - 1 helpers."""
_POOL = ThreadPoolExecutor(max(1, THREADS - 1), thread_name_prefix="qmd-search-part")
_FREE = threading.Semaphore(max(1, THREADS - 1))
"""The pool's workers not running a part: a search takes the free ones and never waits for one
another search holds (its work then runs in fewer parts), so no search queues behind another's."""
_SHARED: ContextVar[bool] = ContextVar("qmd_cores_shared", default=False)


def shared() -> bool:
    """Whether this search shares the cores with work of its own (a hybrid query's legs)."""
    return _SHARED.get()


@contextmanager
def sharing() -> Iterator[None]:
    """Mark what runs inside, and work started from a copy of its context, as sharing the cores."""
    token = _SHARED.set(True)
    try:
        yield
    finally:
        _SHARED.reset(token)


@contextmanager
def helpers(wanted: int) -> Iterator[int]:
    """Up to `wanted` of the pool's free workers, held while inside (none while this search
    shares the cores): their number, each to `submit` one part to."""
    got = 0
    while not shared() and got < wanted and _FREE.acquire(blocking=False):
        got += 1
    try:
        yield got
    finally:
        for _ in range(got):
            _FREE.release()


def submit(fn: Callable[..., T], *args: object) -> Future[T]:
    """Run a part on the pool: only for a worker `helpers` gave."""
    return _POOL.submit(fn, *args)
