"""The `QMD_*` settings only the daemon reads, and how it reports the ones it started with.

A daemon keeps the environment it started with, whichever client talks to it later: a
`QMD_EMBED_MODEL` exported in the shell after it started changes nothing. The daemon
reports these (`GET /v1/settings`) and the CLI compares them with its own
environment, so such a change is said rather than silently ignored. Stdlib only: both
sides import this list, and the CLI must not import the server.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

DAEMON_SETTINGS: tuple[str, ...] = (
    "QMD_ALLOWED_HOSTS",
    "QMD_ALLOWED_ORIGINS",
    "QMD_TRUST_LOCAL_CONFIG",
    "QMD_TRUST_UPDATE_HOOKS",
    "QMD_INDEX_URL",
    "QMD_INDEX_IDLE_S",
    "QMD_MAX_FILE_BYTES",
    "QMD_MAX_PARSED_BYTES",
    "QMD_LOADER_TIMEOUT_S",
    "QMD_LOADER_MEMORY_MB",
    "QMD_MAX_ANSWER_BYTES",
    "QMD_MODEL_THREADS",
    "QMD_WATCH",
    "QMD_WATCH_EMBED",
    "QMD_WATCH_QUIET_MS",
    "QMD_WATCH_MAX_WAIT_MS",
    "QMD_WATCH_SWEEP_S",
    "QMD_WATCH_POLL",
    "QMD_WATCH_POLL_MS",
    "QMD_EMBED_MODEL",
    "QMD_GENERATE_MODEL",
    "QMD_RERANK_MODEL",
    "QMD_EMBED_API_KEY",
    "QMD_GENERATE_API_KEY",
    "QMD_RERANK_API_KEY",
    "QMD_GENERATE_TIMEOUT",
    "QMD_RERANK_TIMEOUT",
    "QMD_RERANK_PASSAGE_CHARS",
    "QMD_THREADS",
    "QMD_FORCE_CPU",
    "QMD_LLAMA_GPU",
    "QMD_EMBED_PARALLELISM",
    "QMD_IDLE_SECONDS",
    "QMD_WORKER_TIMEOUT",
    "QMD_WORKER_ITEM_TIMEOUT",
    "QMD_WORKER_LOAD_TIMEOUT",
    "QMD_WORKER_START_TIMEOUT",
    "QMD_WORKER_QUEUE",
    "QMD_PG_LOCK_WAIT_S",
    "QMD_PG_POOL_SIZE",
    "QMD_PG_STATEMENT_TIMEOUT_MS",
)
"""Every `QMD_*` variable the daemon reads and the CLI does not (configuration.md's table,
"read by: daemon"; tests/test_settings.py keeps the two equal). `QMD_HOST`, `QMD_PORT`,
`QMD_CONFIG_DIR` and `QMD_TOKEN` are read by both sides: a client with another value
reaches another daemon, or none."""

SECRET_SETTINGS = frozenset({"QMD_EMBED_API_KEY", "QMD_GENERATE_API_KEY", "QMD_RERANK_API_KEY", "QMD_INDEX_URL"})
"""Reported as a hash, never as the value (an index URL may carry a password)."""


def shown(name: str, value: str) -> str:
    """A setting's value as the daemon reports it: secrets as `sha256:` and 12 hex digits."""
    if name in SECRET_SETTINGS:
        return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return value


def daemon_settings(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The daemon-read settings set in `environ`, as reported (an unset one is absent)."""
    return {name: shown(name, environ[name]) for name in DAEMON_SETTINGS if name in environ}


def differences(
    reported: Mapping[str, str], environ: Mapping[str, str] = os.environ, skip: frozenset[str] = frozenset()
) -> list[tuple[str, str | None]]:
    """The settings set in `environ` (a client's) that the daemon started with otherwise:
    (name, the daemon's reported value or None when it has none), in the list's order."""
    mine = daemon_settings(environ)
    return [
        (name, reported.get(name)) for name, value in mine.items() if name not in skip and reported.get(name) != value
    ]
