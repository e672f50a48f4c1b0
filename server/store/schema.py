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


def fts_table(tokenize: str = "porter unicode61") -> str:
    """The FTS table's statement; another `tokenize` only to measure what porter is worth
    (bench/bench_bm25.py): the index is always written with the default."""
    return (
        "CREATE VIRTUAL TABLE IF NOT EXISTS documents_fts"
        f" USING fts5(filepath, title, body, tokenize='{tokenize}'{_FTS_OPTIONS})"
    )


FTS_TABLE = fts_table()

CHUNKLESS_TABLE = """
CREATE TABLE IF NOT EXISTS chunkless_contents (
    space_id INTEGER NOT NULL REFERENCES vector_spaces(id) ON DELETE CASCADE,
    hash TEXT NOT NULL,
    PRIMARY KEY (space_id, hash)
)"""
"""Contents a space's chunker cut into no chunk: complete in that space with no vector."""

# One space per embedder fingerprint. Until migration 9, `vectors.ensure_space` also made a
# vec0 table (`vectors_s<space id>`) per space, holding a second copy of its vectors.
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


DOCUMENTS_MARK = """
CREATE TABLE IF NOT EXISTS documents_mark (
    only_row INTEGER PRIMARY KEY CHECK (only_row = 1),
    value TEXT NOT NULL
);
INSERT OR IGNORE INTO documents_mark (only_row, value) VALUES (1, lower(hex(randomblob(8))));
CREATE TRIGGER IF NOT EXISTS documents_mark_insert AFTER INSERT ON documents WHEN new.active = 1
BEGIN UPDATE documents_mark SET value = lower(hex(randomblob(8))); END;
CREATE TRIGGER IF NOT EXISTS documents_mark_delete AFTER DELETE ON documents WHEN old.active = 1
BEGIN UPDATE documents_mark SET value = lower(hex(randomblob(8))); END;
CREATE TRIGGER IF NOT EXISTS documents_mark_update AFTER UPDATE OF collection, hash, active ON documents
WHEN (old.active = 1 OR new.active = 1)
    AND (old.collection IS NOT new.collection OR old.hash IS NOT new.hash OR old.active IS NOT new.active)
BEGIN UPDATE documents_mark SET value = lower(hex(randomblob(8))); END;
"""
"""A mark of what the active documents hold, (collection, hash): a new random value whenever
that may have changed, written by triggers in the writer's transaction, so a reader's snapshot
sees the mark with the rows it marks. Random, not counted: a write rolled back, an index copied
or made again at the same path never brings back a value a cache was keyed by."""


def _v8_documents_mark(conn: sqlite3.Connection) -> None:
    """The documents mark (`DOCUMENTS_MARK`): what lets `vectors` keep what it derives from the
    active documents until they change (issue 34). IF NOT EXISTS, as migration 7's table: an
    index the tests make as an older release left it keeps the newer objects."""
    run_script(conn, DOCUMENTS_MARK)


def _v9_vectors_stored_once(conn: sqlite3.Connection) -> None:
    """Each chunk vector is stored once, in `content_vectors` (issue 34): the sqlite-vec vec0
    table in which each space kept a second copy (a row per chunk and collection: with it the
    index held 2.1x the original qmd's bytes for the same vectors) is dropped; searches read
    `vector_rows` and `content_vectors`. Dropping a virtual table needs its module, and keyword
    search runs without sqlite-vec: then its shadow tables are dropped and its schema row
    deleted (`_forget_virtual_table`). The pages they held stay free pages of the file until a
    VACUUM, which `qmd cleanup` runs from `sqlite.VACUUM_FREE_SHARE` on: logged here, and
    `qmd doctor` says so while they are free."""
    page_size, free_before = conn.execute("PRAGMA page_size").fetchone()[0], _free_pages(conn)
    loaded = conn.execute("SELECT 1 FROM pragma_module_list WHERE name = 'vec0'").fetchone() is not None
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE 'CREATE VIRTUAL TABLE % USING vec0(%'"
        ).fetchall()
    ]
    for name in tables:
        if loaded:
            conn.execute(f'DROP TABLE "{name}"')
        else:
            _forget_virtual_table(conn, name)
    if tables:
        log.warning(
            "dropped the second copy of the vectors (%s): %.0f MB of the index file are free pages now;"
            " `qmd cleanup` gives them back to the disk",
            ", ".join(tables),
            (_free_pages(conn) - free_before) * page_size / 1e6,
        )


CONTENT_VECTORS_V10 = """
CREATE TABLE content_vectors_v10 (
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
    embedded_at TEXT NOT NULL,
    embedding BLOB NOT NULL,
    chunk_key TEXT,
    UNIQUE (space_id, hash, seq)
);
INSERT INTO content_vectors_v10 (id, space_id, hash, seq, pos, end_pos, start_line, end_line, tokens, clipped,
    total_chunks, embedded_at, embedding, chunk_key)
SELECT cv.id, cv.space_id, cv.hash, cv.seq, cv.pos, cv.end_pos, cv.start_line, cv.end_line, cv.tokens, cv.clipped,
    cv.total_chunks, cv.embedded_at, qmd_half(cv.embedding, vs.dims), cv.chunk_key
FROM content_vectors cv JOIN vector_spaces vs ON vs.id = cv.space_id ORDER BY cv.id;
DROP TABLE content_vectors;
ALTER TABLE content_vectors_v10 RENAME TO content_vectors;
CREATE INDEX idx_content_vectors_hash ON content_vectors(space_id, hash, total_chunks);
CREATE INDEX idx_content_vectors_chunk_key ON content_vectors(space_id, chunk_key) WHERE chunk_key IS NOT NULL;
"""


def _v10_half_float_vectors(conn: sqlite3.Connection) -> None:
    """Each chunk vector is stored as its unit vector in half floats (`vector_codec`, issue
    34): a row of 384 dimensions takes ~1 KB where float32's took ~1.75, four to a 4 KiB
    page where it fitted two, and no longer repeats its space's fingerprint. The table is
    made again, the same ids, so the old one's pages are free pages of the file until `qmd
    cleanup` VACUUMs them (logged here; `qmd doctor` says so while they are free). A row's
    distances move by rounding only (~1e-5 at 384 dimensions)."""
    from qmd.server.store import vector_codec

    page_size, free_before = conn.execute("PRAGMA page_size").fetchone()[0], _free_pages(conn)
    rows = int(conn.execute("SELECT count(*) FROM content_vectors").fetchone()[0])
    conn.create_function("qmd_half", 2, vector_codec.stored, deterministic=True)
    try:
        run_script(conn, CONTENT_VECTORS_V10)
    finally:
        conn.create_function("qmd_half", 2, None)
    if rows:
        log.warning(
            "stored %d chunk vectors as half floats: %.0f MB of the index file are free pages now;"
            " `qmd cleanup` gives them back to the disk",
            rows,
            (_free_pages(conn) - free_before) * page_size / 1e6,
        )


KEYWORD_TERMS = """
CREATE TABLE IF NOT EXISTS fts_rows (
    doc_id INTEGER PRIMARY KEY,
    filepath TEXT NOT NULL,
    title TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS fts_terms (
    term TEXT PRIMARY KEY,
    docs INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fts_counted (
    sqlite TEXT NOT NULL
);
"""


def _v11_keyword_term_counts(conn: sqlite3.Connection) -> None:
    """Each keyword term's document count is kept beside FTS5's index (store/fts.py, issue
    34), with the text of each row it holds: those of the active documents, as
    `store.fts_put` wrote them. The counts themselves are made from FTS5's own vocabulary
    as the store opens (`fts.check_term_counts`: `fts_counted` is empty; 1.4 s at a million
    chunks)."""
    run_script(conn, KEYWORD_TERMS)
    conn.execute("DELETE FROM fts_rows")
    conn.execute(
        "INSERT INTO fts_rows(doc_id, filepath, title, hash)"
        " SELECT id, collection || '/' || path, title, hash FROM documents WHERE active = 1"
    )
    conn.execute("DELETE FROM fts_counted")


VECTOR_CHANGES = """
CREATE TABLE IF NOT EXISTS vector_changes (
    only_row INTEGER PRIMARY KEY CHECK (only_row = 1),
    n INTEGER NOT NULL
);
INSERT OR IGNORE INTO vector_changes (only_row, n) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS qmd_vector_synced (
    space_id INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    changes INTEGER NOT NULL,
    PRIMARY KEY (space_id, fingerprint)
);
""" + "".join(
    f"CREATE TRIGGER IF NOT EXISTS vector_changes_{table}_{i} AFTER {event} ON {table}"
    " BEGIN UPDATE vector_changes SET n = n + 1; END;\n"
    for table, events in (
        ("documents", ("INSERT", "DELETE", "UPDATE OF collection, hash, active")),
        ("content_vectors", ("INSERT", "DELETE", "UPDATE")),
        ("chunkless_contents", ("INSERT", "DELETE", "UPDATE")),
        ("vector_rows", ("INSERT", "DELETE", "UPDATE")),
        ("vector_collection_ids", ("INSERT", "DELETE", "UPDATE")),
    )
    for i, event in enumerate(events)
)
"""A count of the rows changed in the tables `vectors.sync_partitions` reads, moved by every
writer's triggers, and what each space's last sync saw of it. Before it, the count was kept by
TEMP triggers on the writer's connection and checked against `PRAGMA data_version`, both gone
with the connection, so a daemon's first embed after a start reconciled every search row
again (3.4 s at a million chunks) on an index nothing had changed."""


def _v12_vector_changes(conn: sqlite3.Connection) -> None:
    """The count of vector changes and the syncs' records (`VECTOR_CHANGES`, issue 34)."""
    run_script(conn, VECTOR_CHANGES)


def _free_pages(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA freelist_count").fetchone()[0])


def _forget_virtual_table(conn: sqlite3.Connection, name: str) -> None:
    """Remove a virtual table whose module is not loaded: its shadow tables (`name_*`, plain
    tables that hold its rows) dropped, its own schema row deleted, and the schema cookie
    moved so every connection, this one included, reads the schema again."""
    for (shadow,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name GLOB ?", (f"{name}_*",)
    ).fetchall():
        conn.execute(f'DROP TABLE "{shadow}"')
    conn.execute("PRAGMA writable_schema = ON")
    try:
        conn.execute("DELETE FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    finally:
        conn.execute("PRAGMA writable_schema = OFF")
    (cookie,) = conn.execute("PRAGMA schema_version").fetchone()
    conn.execute(f"PRAGMA schema_version = {int(cookie) + 1}")


MIGRATIONS: list[Migration] = [
    _v1_first_release,
    _v2_vector_tables,
    _v3_metadata,
    _v4_reread_loaded_files,
    _v5_cache_models,
    _v6_chunk_keys,
    _v7_skip_memory_and_chunkless,
    _v8_documents_mark,
    _v9_vectors_stored_once,
    _v10_half_float_vectors,
    _v11_keyword_term_counts,
    _v12_vector_changes,
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
