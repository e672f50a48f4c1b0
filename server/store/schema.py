"""The index's schema, as a numbered list of migrations keyed on `PRAGMA user_version`.

Migration N takes an index from version N-1 to N; a new index runs them all. The
store applies the pending ones in order inside one transaction on the writer
connection and then sets `user_version`, so an interrupted or failed upgrade leaves
the index exactly as it was. An index at a version above the last known one was
written by a newer qmd and is refused: reading it could only misread it, and writing
it could damage it for the qmd that made it.

A migration, once released, never changes: a schema change is a new one appended to
`MIGRATIONS`. The table definitions below are therefore what each version first
created, not necessarily what the current schema looks like.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from qmd.server.errors import IndexTooNew, MigrationFailed
from qmd.server.store.db import sqlite3
from qmd.version import __version__

log = logging.getLogger("qmd.store")

Migration = Callable[[sqlite3.Connection], None]

TABLES = """
CREATE TABLE IF NOT EXISTS content (
    hash TEXT PRIMARY KEY,
    doc TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS documents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    collection TEXT NOT NULL,
    path TEXT NOT NULL,
    title TEXT NOT NULL,
    hash TEXT NOT NULL REFERENCES content(hash) ON DELETE CASCADE,
    created_at TEXT NOT NULL,
    modified_at TEXT NOT NULL,
    active INTEGER NOT NULL DEFAULT 1,
    size INTEGER NOT NULL DEFAULT 0,
    mtime_ns INTEGER NOT NULL DEFAULT 0,
    UNIQUE(collection, path)
);
CREATE INDEX IF NOT EXISTS idx_documents_collection ON documents(collection, active);
CREATE INDEX IF NOT EXISTS idx_documents_hash ON documents(hash);
CREATE INDEX IF NOT EXISTS idx_documents_path ON documents(path, active);
CREATE TABLE IF NOT EXISTS llm_cache (
    hash TEXT PRIMARY KEY,
    result TEXT,
    created_at TEXT
);
CREATE TABLE IF NOT EXISTS store_collections (
    name TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    pattern TEXT NOT NULL DEFAULT '**/*.md',
    ignore_patterns TEXT,
    include_by_default INTEGER NOT NULL DEFAULT 1,
    update_command TEXT,
    context TEXT
);
CREATE TABLE IF NOT EXISTS store_config (
    key TEXT PRIMARY KEY,
    value TEXT
);
CREATE TABLE IF NOT EXISTS skipped_files (
    collection TEXT NOT NULL,
    path TEXT NOT NULL,
    reason TEXT NOT NULL,
    seen_at TEXT NOT NULL,
    PRIMARY KEY (collection, path)
);
CREATE TABLE IF NOT EXISTS collection_runs (
    collection TEXT PRIMARY KEY,
    updated_at TEXT NOT NULL,
    summary TEXT NOT NULL
);
"""

# The FTS table holds only the index, not a third copy of every body (bodies live in
# `content`; snippets are cut from there): about a third of the index's size. Deleting
# rows from such a table needs SQLite 3.43; older builds keep a copy.
_FTS_OPTIONS = ", content='', contentless_delete=1" if sqlite3.sqlite_version_info >= (3, 43) else ""
FTS_TABLE = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS documents_fts"
    f" USING fts5(filepath, title, body, tokenize='porter unicode61'{_FTS_OPTIONS})"
)

CHUNKLESS_TABLE = """
CREATE TABLE IF NOT EXISTS chunkless_contents (
    space_id INTEGER NOT NULL REFERENCES vector_spaces(id) ON DELETE CASCADE,
    hash TEXT NOT NULL,
    PRIMARY KEY (space_id, hash)
)"""
"""Contents a space's chunker cut into no chunk: complete in that space with no vector."""

# One space per embedder fingerprint; vec0 tables (`vectors_s<space id>`) are made per
# space when it is first used, by `vectors.ensure_space`.
VECTOR_TABLES = """
CREATE TABLE IF NOT EXISTS vector_spaces (
    id INTEGER PRIMARY KEY,
    fingerprint TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    dims INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS content_vectors (
    id INTEGER PRIMARY KEY,
    space_id INTEGER NOT NULL REFERENCES vector_spaces(id) ON DELETE CASCADE,
    hash TEXT NOT NULL,
    seq INTEGER NOT NULL,
    pos INTEGER NOT NULL,
    end_pos INTEGER NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    clipped INTEGER NOT NULL DEFAULT 0,
    total_chunks INTEGER NOT NULL,
    embed_fingerprint TEXT NOT NULL,
    embedded_at TEXT NOT NULL,
    embedding BLOB NOT NULL,
    UNIQUE (space_id, hash, seq)
);
CREATE INDEX IF NOT EXISTS idx_content_vectors_hash ON content_vectors(space_id, hash, total_chunks);
CREATE TABLE IF NOT EXISTS vector_collection_ids (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS vector_rows (
    id INTEGER PRIMARY KEY,
    space_id INTEGER NOT NULL,
    chunk_id INTEGER NOT NULL,
    collection_id INTEGER NOT NULL,
    UNIQUE (chunk_id, collection_id)
);
CREATE INDEX IF NOT EXISTS idx_vector_rows_space ON vector_rows(space_id, collection_id);
"""


def run_script(conn: sqlite3.Connection, sql: str) -> None:
    """Run a script statement by statement: `executescript` would commit the
    migration's transaction half-way. Statements are split where SQLite says one is
    complete, so a `;` inside a trigger body or a string does not cut it."""
    pending = ""
    for piece in sql.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip().strip(";").strip():
                conn.execute(pending)
            pending = ""


def _v1_first_release(conn: sqlite3.Connection) -> None:
    """The first release's schema. It wrote user_version 1 but never read it, and
    created its tables one autocommitted statement at a time, so an index of it at
    version 0 may hold some of them already: hence IF NOT EXISTS."""
    run_script(conn, TABLES)
    conn.execute(FTS_TABLE)


def _v2_vector_tables(conn: sqlite3.Connection) -> None:
    """The vector tables join the store's schema. The first release created them from
    the engine after the store opened, so its indexes may or may not have them."""
    run_script(conn, VECTOR_TABLES)


# Typed frontmatter metadata (`qmd: metadata:`), one row per (document, key, value).
# `multi` is 0 for a scalar; an array is a set of rows, its first in stored order
# (the smallest value) with `multi` 1 and the others 2, so each document holding a key
# has exactly one row of it with `multi` < 2. `value` has no declared type, so SQLite
# keeps each value's own storage class and `'3'` never equals `3`; `type` says which
# of string / number / boolean it is (booleans are stored as 0 / 1). `folded` is the
# ASCII-lowercased string, for `caseInsensitive`. `documents.meta_state` records the
# extraction: NULL pending (an index made before this migration, or a document that
# left the index), 0 no metadata, 1 extracted, 2 rejected (`meta_error` says why); a
# document holds rows only while it is 1. The value index carries `multi`, so one walk
# of it counts the documents holding each (key, type): discovery's
# `count(*) FILTER (WHERE multi < 2)`.
METADATA_TABLES = """
ALTER TABLE documents ADD COLUMN meta_state INTEGER;
ALTER TABLE documents ADD COLUMN meta_error TEXT;
CREATE TABLE document_metadata (
    doc_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    type TEXT NOT NULL CHECK (type IN ('string', 'number', 'boolean')),
    value NOT NULL,
    folded TEXT,
    multi INTEGER NOT NULL DEFAULT 0 CHECK (multi IN (0, 1, 2)),
    PRIMARY KEY (doc_id, key, type, value)
) WITHOUT ROWID;
CREATE INDEX idx_metadata_value ON document_metadata(key, type, value, multi, doc_id);
CREATE INDEX idx_metadata_folded ON document_metadata(key, folded, doc_id) WHERE folded IS NOT NULL;
"""


def _v3_metadata(conn: sqlite3.Connection) -> None:
    """Typed metadata. Existing documents start pending (meta_state NULL) until the
    next update extracts theirs."""
    run_script(conn, METADATA_TABLES)


def _v4_reread_loaded_files(conn: sqlite3.Connection) -> None:
    """HTML and PDF files are read by loaders now (HTML was indexed with its tags, PDF
    skipped): their size is forgotten so the next update reads them again, and the
    loader's salted content key makes that text, and its vectors, new."""
    conn.execute(
        "UPDATE documents SET size = -1 WHERE lower(path) LIKE '%.html' OR lower(path) LIKE '%.htm'"
        " OR lower(path) LIKE '%.xhtml' OR lower(path) LIKE '%.pdf'"
    )


def _v5_cache_models(conn: sqlite3.Connection) -> None:
    """Each model-cache entry names the model that made it, so `qmd cleanup` can drop the
    entries of a model no longer configured. Older entries have none; they age out."""
    conn.execute("ALTER TABLE llm_cache ADD COLUMN model TEXT")


def _v6_chunk_keys(conn: sqlite3.Connection) -> None:
    """Each chunk vector records a key of exactly what was embedded (title and text), so an
    edited document's unchanged chunks take their vectors from its previous version
    instead of the model. Rows from before have none, and are never reused."""
    if "chunk_key" not in {row[1] for row in conn.execute("PRAGMA table_info(content_vectors)")}:
        conn.execute("ALTER TABLE content_vectors ADD COLUMN chunk_key TEXT")
    conn.execute(
        "CREATE INDEX IF NOT EXISTS idx_content_vectors_chunk_key ON content_vectors(space_id, chunk_key)"
        " WHERE chunk_key IS NOT NULL"
    )


def _v7_skip_memory_and_chunkless(conn: sqlite3.Connection) -> None:
    """A skipped file keeps the size and mtime it was skipped at, so an unchanged one is not
    read again by every update and sweep; and a content that cuts into no chunk at all (a
    note of nothing but headings, seeds/001) is recorded per space as embedded, instead of
    staying pending for want of a chunk row. Older skips have neither: read once more."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(skipped_files)")}
    for name in ("size", "mtime_ns"):
        if name not in columns:
            conn.execute(f"ALTER TABLE skipped_files ADD COLUMN {name} INTEGER")
    conn.execute(CHUNKLESS_TABLE)


MIGRATIONS: list[Migration] = [
    _v1_first_release,
    _v2_vector_tables,
    _v3_metadata,
    _v4_reread_loaded_files,
    _v5_cache_models,
    _v6_chunk_keys,
    _v7_skip_memory_and_chunkless,
]
"""MIGRATIONS[N - 1] takes an index from version N - 1 to N; append, never edit."""


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the index on `conn` (the writer, outside any transaction) to the latest
    version, or refuse it if a newer qmd made it. The version is read inside the
    write transaction, so two processes opening one file cannot both migrate it."""
    latest = len(MIGRATIONS)
    conn.execute("BEGIN IMMEDIATE")
    try:
        found: int = conn.execute("PRAGMA user_version").fetchone()[0]
        if found > latest:
            raise IndexTooNew(
                f"{path} was made by a newer qmd: its schema is version {found}, and qmd {__version__}"
                f" knows versions up to {latest}. Upgrade qmd, or use another index (--index NAME).",
                found=found,
                latest=latest,
            )
        for version in range(found + 1, latest + 1):
            try:
                MIGRATIONS[version - 1](conn)
            except Exception as e:
                raise MigrationFailed(
                    f"could not upgrade {path} from schema version {found} to {latest}: migration {version}"
                    f" failed ({type(e).__name__}: {e}). The index is unchanged.",
                    found=found,
                    latest=latest,
                    failed=version,
                ) from e
        if found != latest:
            conn.execute(f"PRAGMA user_version = {latest}")
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    if found != latest:
        log.info("upgraded %s from schema version %d to %d", path, found, latest)
