"""Whether a search may cut its own work across the cores.

A search on its own leaves the other core idle, so the vector index's passes
(`vector_index._in_parts`) and a large keyword ranking (`search.lexical._Halves`) run in
parts at once: at 1M chunks on 2 cores, the vector leg took 0.65x and keyword search 0.54x
the time of the code before (docs/benchmarks.md#scale). A hybrid query already runs its
two legs side by side; cutting them as well measured no faster there (in process at 1M,
alternate queries: 69.6 against 68.0 ms p50 for the keyword halves, 64.7 against 61.6 for
the vector parts), so its legs run marked as sharing the cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

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
