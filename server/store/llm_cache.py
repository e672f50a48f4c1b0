"""Model outputs worth keeping: query expansions and rerank scores (`llm_cache`).

Keys are content hashes of what produced the output (spec §12, §14.2), so the cache is
never stale: a different model, query or passage is a different key. `qmd update`
leaves the table alone (the original wiped it, §26), and a cache write does not bump
`Store.generation`, since no document changed.

What does go stale is the table's size: entries of a model no longer configured can
never be hit again, and one-off queries leave entries nobody asks for twice. Each entry
therefore names its model, and `qmd cleanup` (`index.upkeep`) drops those of other
models and those older than a month (`prune`).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

from qmd.server.store.db import Connection, IndexStore


def cache_key(kind: str, payload: dict) -> str:
    """sha256 of `kind` + compact JSON of `payload` in its given key order (the original's scheme)."""
    return hashlib.sha256((kind + json.dumps(payload, separators=(",", ":"), ensure_ascii=False)).encode()).hexdigest()


def get_many(store: IndexStore, keys: list[str]) -> dict[str, str]:
    """Cached results by key; absent keys are missing from the answer."""
    out: dict[str, str] = {}
    with store.read() as conn:
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            marks = ",".join("?" * len(part))
            out.update(conn.execute(f"SELECT hash, result FROM llm_cache WHERE hash IN ({marks})", part).fetchall())
    return out


def get(store: IndexStore, key: str) -> str | None:
    return get_many(store, [key]).get(key)


def put_many(store: IndexStore, items: dict[str, str], *, model: str) -> None:
    """Store results of `model` (its URI) without waiting for the writer: a lost cache
    entry costs only a recomputation."""
    if not items:
        return
    now = datetime.now(UTC).isoformat()
    rows = [(k, v, now, model) for k, v in items.items()]
    store.submit(
        lambda conn: conn.executemany(
            "INSERT INTO llm_cache(hash, result, created_at, model) VALUES (?, ?, ?, ?) ON CONFLICT (hash) DO UPDATE"
            " SET result = excluded.result, created_at = excluded.created_at, model = excluded.model",
            rows,
        ),
        bump=False,
    )


def delete(store: IndexStore, key: str) -> None:
    store.submit(lambda conn: conn.execute("DELETE FROM llm_cache WHERE hash = ?", (key,)), bump=False)


def _stale(models: list[str] | tuple[str, ...] | None, before: str) -> tuple[str, tuple[str, ...]]:
    """An entry older than `before` (an ISO timestamp) or, when `models` (URIs) are known,
    of another model. Entries made before they named their model are judged by age alone."""
    old = "created_at IS NULL OR created_at < ?"
    if models is None:
        return old, (before,)
    return f"{old} OR (model IS NOT NULL AND model NOT IN (SELECT value FROM json_each(?)))", (
        before,
        json.dumps(list(models)),
    )


def count_stale(conn: Connection, models: list[str] | tuple[str, ...] | None, before: str) -> int:
    where, args = _stale(models, before)
    return int(conn.execute(f"SELECT count(*) FROM llm_cache WHERE {where}", args).fetchone()[0])


def prune(conn: Connection, models: list[str] | tuple[str, ...] | None, before: str) -> int:
    """Drop what `count_stale` counts; returns how many (writer only)."""
    where, args = _stale(models, before)
    return conn.execute(f"DELETE FROM llm_cache WHERE {where}", args).rowcount
