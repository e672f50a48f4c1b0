"""What the index holds per collection, and the changes that span a whole collection.

The engine decides *whether* a collection is removed, renamed or listed; this module
is the only place that knows which tables a collection touches, so a new per-collection
table (metadata, say) is added here once instead of in every engine method.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from qmd.server.config import Collection, Config
from qmd.server.store import vectors
from qmd.server.store.db import Connection
from qmd.server.store.fts import FtsDoc, fts_delete, fts_put


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str


@dataclass(frozen=True)
class LastRun:
    """The indexer's one-line report of a collection's last update, and its warnings."""

    line: str
    warnings: list[str]


@dataclass(frozen=True)
class CollectionState:
    """The index's side of a collection; a collection never indexed has the defaults."""

    files: int = 0
    updated_at: str | None = None
    last_run: LastRun | None = None
    skipped: tuple[SkippedFile, ...] = ()


@dataclass(frozen=True)
class DocumentCounts:
    documents: int
    unique_contents: int


@dataclass(frozen=True)
class FileEntry:
    path: str
    modified_at: str
    bytes: int
    hash: str


def collection_states(conn: Connection) -> dict[str, CollectionState]:
    """Every collection the index knows of, in three scans rather than three per collection."""
    counts: dict[str, int] = dict(
        conn.execute("SELECT collection, COUNT(*) FROM documents WHERE active = 1 GROUP BY collection").fetchall()
    )
    runs: dict[str, tuple[str, LastRun]] = {}
    for name, updated_at, summary in conn.execute("SELECT collection, updated_at, summary FROM collection_runs"):
        run = json.loads(summary)
        runs[name] = (updated_at, LastRun(line=run["line"], warnings=run["warnings"]))
    skipped: dict[str, list[SkippedFile]] = {}
    rows = conn.execute("SELECT collection, path, reason FROM skipped_files ORDER BY collection, path")
    for name, path, reason in rows:
        skipped.setdefault(name, []).append(SkippedFile(path, reason))
    return {
        name: CollectionState(
            files=counts.get(name, 0),
            updated_at=runs[name][0] if name in runs else None,
            last_run=runs[name][1] if name in runs else None,
            skipped=tuple(skipped.get(name, ())),
        )
        for name in counts.keys() | runs.keys() | skipped.keys()
    }


def document_counts(conn: Connection) -> DocumentCounts:
    documents, unique = conn.execute("SELECT COUNT(*), COUNT(DISTINCT hash) FROM documents WHERE active = 1").fetchone()
    return DocumentCounts(documents=documents, unique_contents=unique)


def list_files(conn: Connection, collection: str, prefix: str) -> list[FileEntry]:
    """Active files of a collection at `prefix` (a file, or a folder without its
    trailing slash; "" for all), by path. Sizes are in bytes of UTF-8, as `get` returns them."""
    rows = conn.execute(
        "SELECT d.path, d.modified_at, LENGTH(CAST(c.doc AS BLOB)), d.hash FROM documents d "
        "JOIN content c ON c.hash = d.hash WHERE d.collection = ? AND d.active = 1 "
        "AND (? = '' OR d.path = ? OR substr(d.path, 1, ?) = ?) ORDER BY d.path",
        (collection, prefix, prefix, len(prefix) + 1, prefix + "/"),
    )
    return [FileEntry(path, modified_at, size, digest) for path, modified_at, size, digest in rows]


def sync_collections(conn: Connection, cfg: Config) -> None:
    """Mirror the YAML collections into `store_collections` (spec §2.2), so another
    reader of the index file sees the collections without the YAML.

    An upsert, not a plain insert after the delete: two daemons on one Postgres index mirror
    the same config at once, and the second's delete does not see the first's uncommitted rows,
    so its insert of the same name would fail on the key (CI, test_postgres_backend)."""
    conn.execute("DELETE FROM store_collections")
    conn.executemany(
        "INSERT INTO store_collections(name, path, pattern, ignore_patterns, include_by_default,"
        " update_command, context) VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (name) DO UPDATE SET path = excluded.path, pattern = excluded.pattern,"
        " ignore_patterns = excluded.ignore_patterns, include_by_default = excluded.include_by_default,"
        " update_command = excluded.update_command, context = excluded.context",
        [
            (
                c.name,
                str(c.root),
                c.pattern,
                json.dumps(list(c.ignore)),
                int(c.include_by_default),
                c.update,
                json.dumps(c.context),
            )
            for c in cfg.collections.values()
        ],
    )
    if cfg.global_context:
        conn.execute(
            "INSERT INTO store_config(key, value) VALUES ('global_context', ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (cfg.global_context,),
        )
    else:
        conn.execute("DELETE FROM store_config WHERE key = 'global_context'")


def mirrored_config(conn: Connection) -> Config:
    """The collections and global context as `sync_collections` last recorded them: what
    an index file says about itself when no YAML comes with it (the library's index-only mode)."""
    collections = {
        r[0]: Collection(
            name=r[0],
            path=r[1],
            pattern=r[2],
            ignore=tuple(json.loads(r[3] or "[]")),
            include_by_default=bool(r[4]),
            update=r[5],
            context=json.loads(r[6] or "{}"),
        )
        for r in conn.execute(
            "SELECT name, path, pattern, ignore_patterns, include_by_default, update_command, context"
            " FROM store_collections ORDER BY rowid"
        )
    }
    row = conn.execute("SELECT value FROM store_config WHERE key = 'global_context'").fetchone()
    return Config(collections=collections, global_context=row[0] if row else None)


def delete_collection(conn: Connection, name: str) -> int:
    """Remove every trace of a collection; returns how many active documents it had.
    Bodies another collection still shares stay."""
    fts_delete(
        conn, [r[0] for r in conn.execute("SELECT id FROM documents WHERE collection = ? AND active = 1", (name,))]
    )
    deleted: int = conn.execute("DELETE FROM documents WHERE collection = ? AND active = 1", (name,)).rowcount
    conn.execute("DELETE FROM documents WHERE collection = ?", (name,))
    conn.execute("DELETE FROM skipped_files WHERE collection = ?", (name,))
    conn.execute("DELETE FROM collection_runs WHERE collection = ?", (name,))
    delete_orphan_content(conn)
    return deleted


def rename_collection(conn: Connection, old: str, new: str) -> None:
    """Rename in place, keeping bodies and vectors. The FTS rows are rewritten because
    their `filepath` column carries the collection name."""
    conn.execute("UPDATE documents SET collection = ? WHERE collection = ?", (new, old))
    vectors.rename_collection(conn, old, new)
    rows = conn.execute(
        "SELECT d.id, d.path, d.title, c.doc, d.hash FROM documents d JOIN content c ON c.hash = d.hash"
        " WHERE d.collection = ? AND d.active = 1",
        (new,),
    )
    fts_put(conn, [FtsDoc(doc_id, new, path, title, body, h) for doc_id, path, title, body, h in rows.fetchall()])
    for table in ("skipped_files", "collection_runs"):
        conn.execute(f"UPDATE {table} SET collection = ? WHERE collection = ?", (new, old))


def delete_orphan_content(conn: Connection) -> int:
    """Bodies no document row points at any more (inactive rows keep theirs)."""
    # NOT EXISTS: an anti-join on both backends (Postgres ran NOT IN over 100k contents as a nested loop, 10+ min)
    return conn.execute(
        "DELETE FROM content WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE d.hash = content.hash)"
    ).rowcount
