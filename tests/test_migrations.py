"""Schema migrations: an index made by the first release upgrades in place, keeping its
documents; an index made by a newer qmd is refused and left alone; a failing
migration rolls the whole upgrade back; every migration runs once.

The first release wrote `user_version` 1 and its own tables (the vector tables came
from the engine, so a release index may lack them). Such an index is built here with
today's Store and real indexer, then rewound to what the release left on disk: the
tables are the same (migrations 1 and 2 are the release's statements, checked against
the list of objects the release created), only `user_version` and perhaps the vector
tables differ.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest
from conftest import NOTES, Env, write

from qmd.server.config import Collection
from qmd.server.errors import IndexTooNew, MigrationFailed
from qmd.server.ingest import loaders
from qmd.server.ingest.indexer import index_collection
from qmd.server.search.lexical import parse_lex, search_fts
from qmd.server.store import catalog, metadata, schema, vectors
from qmd.server.store.db import sqlite3
from qmd.server.store.sqlite import Store

LATEST = len(schema.MIGRATIONS)

# `sqlite_master` of an index made by the first release's Store and Engine (tables and
# indexes by name; FTS5's own shadow tables and SQLite's internal ones left out).
RELEASE_OBJECTS = {
    ("table", "content"),
    ("table", "documents"),
    ("index", "idx_documents_collection"),
    ("index", "idx_documents_hash"),
    ("index", "idx_documents_path"),
    ("table", "llm_cache"),
    ("table", "store_collections"),
    ("table", "store_config"),
    ("table", "skipped_files"),
    ("table", "collection_runs"),
    ("table", "documents_fts"),
    ("table", "vector_spaces"),
    ("table", "content_vectors"),
    ("index", "idx_content_vectors_hash"),
    ("table", "vector_collection_ids"),
    ("table", "vector_rows"),
    ("index", "idx_vector_rows_space"),
}
# What migration 3 (typed metadata) adds; the first release had none of it.
METADATA_OBJECTS = {
    ("table", "document_metadata"),
    ("index", "idx_metadata_value"),
    ("index", "idx_metadata_folded"),
}
DOCUMENTS_MARK_OBJECTS = {
    ("table", "documents_mark"),
    ("trigger", "documents_mark_insert"),
    ("trigger", "documents_mark_delete"),
    ("trigger", "documents_mark_update"),
}
KEYWORD_TERM_OBJECTS = {("table", "fts_rows"), ("table", "fts_terms"), ("table", "fts_counted")}
VECTOR_CHANGES_OBJECTS = {("table", "vector_changes"), ("table", "qmd_vector_synced")} | {
    ("trigger", f"vector_changes_{table}_{i}")
    for table in ("documents", "content_vectors", "chunkless_contents", "vector_rows", "vector_collection_ids")
    for i in range(3)
}
LATER_OBJECTS = (
    METADATA_OBJECTS
    | DOCUMENTS_MARK_OBJECTS
    | KEYWORD_TERM_OBJECTS
    | VECTOR_CHANGES_OBJECTS
    | {("index", "idx_content_vectors_chunk_key"), ("table", "chunkless_contents")}
)
"""What migrations after the first release add (3: metadata, 6: chunk keys, 7: chunkless contents,
8: the documents mark, 11: the keyword terms' counts, 12: the count of vector changes)."""
VECTOR_TABLES = ("vector_spaces", "content_vectors", "vector_collection_ids", "vector_rows")


@contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    with closing(sqlite3.connect(str(path), isolation_level=None)) as conn:
        yield conn


def user_version(path: Path) -> int:
    with raw(path) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


def objects(path: Path) -> set[tuple[str, str]]:
    with raw(path) as conn:
        rows = conn.execute("SELECT type, name FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
    return {(t, n) for t, n in rows if not n.startswith(("documents_fts_", "sqlite_"))}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def release_index(tmp_path: Path, *, with_vectors: bool = True) -> Path:
    """An index as the first release left it, with NOTES indexed by the real indexer."""
    db = tmp_path / "index.sqlite"
    store = Store(db)
    try:
        summary = index_collection(store, Collection(name="notes", path=str(write(tmp_path / "notes", NOTES))))
    finally:
        store.close()
    assert summary.indexed == len(NOTES)
    with raw(db) as conn:
        if not with_vectors:
            for table in VECTOR_TABLES:
                conn.execute(f"DROP TABLE {table}")
        conn.execute("DROP TABLE document_metadata")
        for name in sorted(n for _, n in KEYWORD_TERM_OBJECTS):
            conn.execute(f"DROP TABLE {name}")
        conn.execute("ALTER TABLE documents DROP COLUMN meta_state")
        conn.execute("ALTER TABLE documents DROP COLUMN meta_error")
        conn.execute("ALTER TABLE llm_cache DROP COLUMN model")
        conn.execute("PRAGMA user_version = 1")
    return db


def documents(store: Store) -> int:
    with store.read() as conn:
        return catalog.document_counts(conn).documents


def finds(store: Store, query: str) -> list[str]:
    """Paths of the documents keyword search finds for `query`."""
    with store.read() as conn:
        hits = search_fts(conn, parse_lex(query), None, 10)
        return [conn.execute("SELECT path FROM documents WHERE id = ?", (h.doc_id,)).fetchone()[0] for h in hits]


def test_a_new_index_has_the_release_schema_at_the_latest_version(tmp_path: Path) -> None:
    db = tmp_path / "index.sqlite"
    Store(db).close()
    assert user_version(db) == LATEST
    assert objects(db) == RELEASE_OBJECTS | LATER_OBJECTS


def test_the_value_index_carries_multi_for_discovery(tmp_path: Path) -> None:
    """Discovery counts a key's documents as its rows with `multi` < 2 while walking
    the value index, so the index holds `multi`, and `multi` is one of its three
    values (a scalar, an array's first value, its others)."""
    db = tmp_path / "index.sqlite"
    Store(db).close()
    with raw(db) as conn:
        columns = [r[2] for r in conn.execute("PRAGMA index_info(idx_metadata_value)")]
        assert columns == ["key", "type", "value", "multi", "doc_id"]
        conn.execute("INSERT INTO content(hash, doc, created_at) VALUES ('h', 'x', 'now')")
        conn.execute(
            "INSERT INTO documents(id, collection, path, title, hash, created_at, modified_at)"
            " VALUES (1, 'c', 'p', 't', 'h', 'now', 'now')"
        )
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute(
                "INSERT INTO document_metadata(doc_id, key, type, value, multi) VALUES (1, 'k', 'string', 'v', 3)"
            )


@pytest.mark.parametrize("with_vectors", [True, False], ids=["opened-by-engine", "opened-by-store"])
def test_a_release_index_upgrades_and_keeps_its_documents(tmp_path: Path, with_vectors: bool) -> None:
    db = release_index(tmp_path, with_vectors=with_vectors)
    store = Store(db)
    try:
        assert documents(store) == len(NOTES)
        assert finds(store, "sourdough") == ["cooking/bread.md"]
        with store.read() as conn:
            assert vectors.count_vectors(conn, None).stale_contents == 0
            assert metadata.extraction_counts(conn).pending == len(NOTES)  # until the next update
    finally:
        store.close()
    assert user_version(db) == LATEST
    assert objects(db) == RELEASE_OBJECTS | LATER_OBJECTS


def test_an_index_from_a_newer_qmd_is_refused_and_untouched(tmp_path: Path) -> None:
    db = release_index(tmp_path)
    with raw(db) as conn:
        conn.execute(f"PRAGMA user_version = {LATEST + 5}")
    before = digest(db)
    with pytest.raises(IndexTooNew) as refused:
        Store(db)
    assert f"schema is version {LATEST + 5}" in refused.value.message
    assert f"versions up to {LATEST}" in refused.value.message
    assert str(db) in refused.value.message
    assert digest(db) == before
    assert user_version(db) == LATEST + 5


@pytest.mark.slow
def test_the_daemon_refuses_a_newer_index_in_one_line(tmp_path: Path) -> None:
    db = release_index(tmp_path)
    with raw(db) as conn:
        conn.execute(f"PRAGMA user_version = {LATEST + 1}")
    env = Env(tmp_path / "env")
    r = env.qmdd(env={"INDEX_PATH": str(db)})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("qmdd: ") and "newer qmd" in lines[0]
    assert f"version {LATEST + 1}" in lines[0] and f"up to {LATEST}" in lines[0]


def test_a_failing_migration_rolls_the_whole_upgrade_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # from version 1 without vector tables, so migration 2 has work to undo too
    db = release_index(tmp_path, with_vectors=False)
    before = digest(db)

    def breaks(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x)")
        conn.execute("DELETE FROM documents")
        raise ValueError("disk on fire")

    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, breaks])
    with pytest.raises(MigrationFailed) as failed:
        Store(db)
    message = failed.value.message
    assert f"from schema version 1 to {LATEST + 1}" in message
    assert f"migration {LATEST + 1} failed (ValueError: disk on fire)" in message
    assert "unchanged" in message
    assert digest(db) == before
    assert user_version(db) == 1
    assert not {("table", t) for t in (*VECTOR_TABLES, "half_done")} & objects(db)

    monkeypatch.undo()
    store = Store(db)
    try:
        assert documents(store) == len(NOTES)
    finally:
        store.close()
    assert user_version(db) == LATEST


def test_each_migration_runs_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[int] = []

    def counted(version: int, migration: schema.Migration) -> schema.Migration:
        def run(conn: sqlite3.Connection) -> None:
            runs.append(version)
            migration(conn)

        return run

    def adds_a_column(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE documents ADD COLUMN note TEXT")

    migrations = [*schema.MIGRATIONS, adds_a_column]
    monkeypatch.setattr(schema, "MIGRATIONS", [counted(v, m) for v, m in enumerate(migrations, 1)])
    db = tmp_path / "index.sqlite"
    for _ in range(3):
        Store(db).close()
    assert runs == list(range(1, len(migrations) + 1))
    assert user_version(db) == len(migrations)


def test_only_the_pending_migrations_run_on_a_release_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = release_index(tmp_path)
    runs: list[str] = []
    monkeypatch.setattr(schema, "MIGRATIONS", [lambda conn, v=v: runs.append(f"v{v}") for v in range(1, LATEST + 1)])
    Store(db).close()
    assert runs == [f"v{v}" for v in range(2, LATEST + 1)]


def test_scripts_split_where_a_statement_is_complete(tmp_path: Path) -> None:
    with raw(tmp_path / "t.sqlite") as conn:
        conn.execute("BEGIN")
        schema.run_script(
            conn,
            """
            CREATE TABLE t (x TEXT);
            CREATE TABLE log (x TEXT);
            CREATE TRIGGER t_log AFTER INSERT ON t BEGIN INSERT INTO log VALUES (new.x || ';'); END;
            INSERT INTO t VALUES ('a;b');
            """,
        )
        assert conn.in_transaction
        conn.execute("COMMIT")
        assert conn.execute("SELECT x FROM log").fetchall() == [("a;b;",)]


def test_html_indexed_before_the_loaders_is_read_again(tmp_path: Path) -> None:
    """Version 4: HTML was indexed with its tags before it had a loader. Its documents are
    re-read on the next update, under the loader's own content key (so the tag-filled
    text and any vectors made from it are never reused for the loader's text)."""
    root = write(
        tmp_path / "site",
        {"page.html": "<html><body><script>var secret;</script><p>harbour</p></body></html>", "a.md": "# A\n\nalpha\n"},
    )
    coll = Collection(name="site", path=str(root), pattern="**/*.{md,html}")
    db = tmp_path / "index.sqlite"
    store = Store(db)
    try:
        index_collection(store, coll)
    finally:
        store.close()
    html = (root / "page.html").read_bytes()
    with raw(db) as conn:  # as version 3 left it: the file's bytes as text, under their plain hash
        conn.execute("UPDATE documents SET hash = ? WHERE path = 'page.html'", (hashlib.sha256(html).hexdigest(),))
        conn.execute("ALTER TABLE llm_cache DROP COLUMN model")
        conn.execute("PRAGMA user_version = 3")
    store = Store(db)
    try:
        with store.read() as conn:
            sizes = dict(conn.execute("SELECT path, size FROM documents").fetchall())
        assert sizes["page.html"] == -1 and sizes["a.md"] > 0
        summary = index_collection(store, coll)
        assert (summary.updated, summary.unchanged) == (1, 1)
        with store.read() as conn:
            key = conn.execute("SELECT hash FROM documents WHERE path = 'page.html'").fetchone()[0]
        assert key == loaders.HTML.content_key(html) != hashlib.sha256(html).hexdigest()
        assert finds(store, "harbour") == ["page.html"] and finds(store, "secret") == []
    finally:
        store.close()
