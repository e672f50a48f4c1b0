"""The documents mark (SQLite schema migration 8, Postgres 6) and the vector bookkeeping kept by
it (issue 34): what the active documents hold is read again only when the mark moved, and what
the first search after an embed batch counts is the batch. Every answer, cached or not, is
checked against the same question asked of the tables from scratch, after each kind of write
an index sees: documents added, edited, removed, moved, their collection renamed or removed,
contents cut into no chunk, half-written vectors, `embed -f` (one collection, or the space),
cleanup, a write rolled back, and the index copied over a file a daemon had read. Real SQLite
(and a real Postgres where one starts), the real indexer and embed job; the embed backend is
the real chunker with a constant vector, as tests/test_embed_parallel.py's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_embed_parallel import Recording
from test_vector_deltas import complete_in

from qmd.server.config import Collection
from qmd.server.ingest import upkeep
from qmd.server.ingest.embed_job import EmbedReport, embed_pending
from qmd.server.ingest.indexer import index_collection
from qmd.server.models.embedders import Embedder
from qmd.server.status import VectorStates
from qmd.server.store import catalog, vectors
from qmd.server.store.copy import copy_index
from qmd.server.store.db import Connection, IndexStore, sqlite3
from qmd.server.store.sqlite import Store, utcnow

SCOPES: tuple[list[str] | None, ...] = (None, ["a"], ["b"], ["a", "b"])
PARAGRAPH = "Sourdough wants a warm kitchen and a patient baker. " * 6


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IndexStore]:
    """An empty index on each backend (Postgres: the tests' embedded server, skipped where it
    does not start, a failure under CI)."""
    if request.param == "sqlite":
        opened: IndexStore = Store(tmp_path / "index.sqlite")
    else:
        from qmd.server.store.pg_store import PgStore

        opened = PgStore(request.getfixturevalue("pg_index"))
    try:
        yield opened
    finally:
        opened.close()


class Notes:
    """Markdown folders `a` and `b` under `root`, indexed and embedded by the real code."""

    def __init__(self, store: IndexStore, root: Path) -> None:
        self.store = store
        self.root = root
        self.embedder = Embedder("fake", Recording(), 64, "f" * 64, 4, "fake")

    def write(self, coll: str, name: str, text: str) -> None:
        path = self.root / coll / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    def note(self, coll: str, name: str, words: str = "") -> None:
        self.write(coll, name, f"# {name}\n\n{words or name} {PARAGRAPH}\n\n## More\n\n{PARAGRAPH}\n")

    def update(self, *colls: str) -> None:
        for coll in colls:
            index_collection(self.store, Collection(name=coll, path=str(self.root / coll)))

    def embed(self, collections: list[str] | None = None, *, force: bool = False) -> EmbedReport:
        return embed_pending(self.store, self.embedder, collections=collections, force=force)

    def space(self) -> vectors.Space | None:
        with self.store.read() as conn:
            return vectors.find_space(conn, self.embedder.fingerprint)

    def hash_of(self, coll: str, name: str) -> str:
        with self.store.read() as conn:
            row = conn.execute(
                "SELECT hash FROM documents WHERE collection = ? AND path = ? AND active = 1", (coll, name)
            ).fetchone()
        return str(row[0])


Answer = tuple[set[str], int, int, int]
"""(pending contents, embedded chunks, orphan chunks, stale contents)."""


def truth(conn: Connection, space: vectors.Space | None, scope: list[str] | None) -> Answer:
    """The answer from the tables, with no tally, mark or cache."""
    where, args = "", []
    if scope is not None:
        where, args = f" AND collection IN ({','.join('?' * len(scope))})", scope
    active = {r[0] for r in conn.execute(f"SELECT DISTINCT hash FROM documents WHERE active = 1{where}", args)}
    if space is None:
        return active, 0, 0, conn.execute("SELECT COUNT(DISTINCT hash) FROM content_vectors").fetchone()[0]
    complete = complete_in(conn, space)
    held = {r[0] for r in conn.execute("SELECT DISTINCT hash FROM documents WHERE active = 1")}
    embedded = orphans = 0
    for h, n, total in conn.execute(
        "SELECT hash, COUNT(*), MAX(total_chunks) FROM content_vectors WHERE space_id = ? GROUP BY hash", (space.id,)
    ):
        if h not in held:
            orphans += n
        elif n == total:
            embedded += n
    stale = conn.execute(
        "SELECT COUNT(DISTINCT hash) FROM content_vectors WHERE space_id <> ?", (space.id,)
    ).fetchone()[0]
    return active - complete, embedded, orphans, stale


def counted(conn: Connection, space: vectors.Space | None, scope: list[str] | None) -> Answer:
    """The same through the store's functions (their caches, on SQLite)."""
    counts = vectors.count_vectors(conn, space)
    return (
        vectors.pending_hashes(conn, space, scope),
        counts.embedded_chunks,
        counts.orphan_chunks,
        counts.stale_contents,
    )


def agrees(notes: Notes, store: IndexStore | None = None) -> Answer:
    """Every scope's answer equals the tables', asked twice (the second from what the first kept);
    the whole index's answer."""
    with (store or notes.store).read() as conn:
        space = vectors.find_space(conn, notes.embedder.fingerprint)
        for scope in SCOPES:
            want = truth(conn, space, scope)
            assert counted(conn, space, scope) == want, scope
            assert counted(conn, space, scope) == want, scope
        return truth(conn, space, None)


def mark(store: IndexStore) -> str:
    with store.read() as conn:
        return str(conn.execute("SELECT value FROM documents_mark").fetchone()[0])


def moves(store: IndexStore, write: Callable[[Connection], None]) -> bool:
    """Whether committing `write` moves the documents mark."""
    before = mark(store)
    store.write(write)
    return mark(store) != before


def test_counts_stay_exact_across_every_kind_of_write(store: IndexStore, tmp_path: Path) -> None:
    notes = Notes(store, tmp_path / "notes")
    for i in range(6):
        notes.note("a", f"a{i}.md")
    for i in range(3):
        notes.note("b", f"b{i}.md")
    notes.update("a", "b")
    assert len(agrees(notes)[0]) == 9  # no space yet: everything pending

    assert notes.embed().pending_after == 0
    pending, embedded, orphans, _ = agrees(notes)
    assert pending == set() and embedded > 0 and orphans == 0
    other = Embedder("other", Recording(), 64, "o" * 64, 4, "other")  # a model no longer configured
    embed_pending(store, other, collections=["b"])
    assert agrees(notes)[3] == 3

    # new documents, one of nothing but headings: pending, then embedded or marked chunkless
    notes.note("a", "a6.md")
    notes.write("a", "headings.md", "# Only\n\n## Headings\n")
    notes.update("a")
    assert len(agrees(notes)[0]) == 2
    notes.embed()
    assert agrees(notes)[0] == set()
    with store.read() as conn:
        assert conn.execute("SELECT COUNT(*) FROM chunkless_contents").fetchone()[0] == 1

    # an edit: the old content's chunks are orphans, the new one pending until embedded
    notes.note("a", "a0.md", "edited")
    notes.update("a")
    pending, _, orphans, _ = agrees(notes)
    assert pending == {notes.hash_of("a", "a0.md")} and orphans > 0
    notes.embed()
    agrees(notes)

    # half of a content's chunks written (a killed embed): it stays pending
    notes.note("b", "b3.md")
    notes.update("b")
    space = notes.space()
    assert space is not None
    half = notes.hash_of("b", "b3.md")
    chunk = vectors.ChunkVector(0, 0, 1, 1, 1, 1, False, [1.0, 0.0, 0.0, 0.0])
    store.write(lambda conn: vectors.write_document(conn, space, half, [chunk], 3))
    assert agrees(notes)[0] == {half}
    notes.embed()
    assert agrees(notes)[0] == set()

    # a file deleted; a content copied into the other collection; a collection renamed
    (notes.root / "a" / "a1.md").unlink()
    notes.write("b", "copy.md", (notes.root / "a" / "a2.md").read_text(encoding="utf-8"))
    notes.update("a", "b")
    agrees(notes)
    store.write(lambda conn: catalog.rename_collection(conn, "b", "c"))
    assert agrees(notes)[0] == set()
    store.write(lambda conn: catalog.rename_collection(conn, "c", "b"))
    agrees(notes)

    # a write rolled back after the writer read (and kept) what it had changed
    class RolledBack(Exception):
        pass

    def changes_then_fails(conn: Connection) -> None:
        conn.execute("UPDATE documents SET active = 0 WHERE collection = 'a'")
        assert vectors.pending_hashes(conn, space, ["a"]) == set()
        assert vectors.count_vectors(conn, space).orphan_chunks > 0
        raise RolledBack

    before = agrees(notes)
    with pytest.raises(RolledBack):
        store.write(changes_then_fails)
    assert agrees(notes) == before

    # ... or what it had marked chunkless: the rows committed next take the same rowids
    notes.note("a", "n.md")
    notes.note("a", "m.md")
    notes.update("a")
    n, m = notes.hash_of("a", "n.md"), notes.hash_of("a", "m.md")

    def marks_then_fails(conn: Connection) -> None:
        vectors.mark_chunkless(conn, space, [n])
        assert vectors.pending_hashes(conn, space) == {m}
        raise RolledBack

    assert agrees(notes)[0] == {n, m}
    with pytest.raises(RolledBack):
        store.write(marks_then_fails)
    store.write(lambda conn: vectors.mark_chunkless(conn, space, [m]))
    assert agrees(notes)[0] == {n}
    headings = notes.hash_of("a", "headings.md")  # chunkless, below m's rowid
    store.write(lambda conn: vectors.forget_hashes(conn, space, [headings]))
    assert agrees(notes)[0] == {n, headings}
    notes.embed()

    # `embed -f -c a` drops collection a's contents' vectors; `embed -f` the whole space
    store.write(lambda conn: vectors.forget_hashes(conn, space, vectors.pending_hashes(conn, None, ["a"])))
    assert agrees(notes)[0] == truth_active(store, ["a"])  # what the forced embed does first
    notes.embed(["a"], force=True)
    assert agrees(notes)[0] == set()
    notes.embed(force=True)
    assert agrees(notes)[0] == set()
    store.write(lambda conn: vectors.drop_space(conn, space))
    agrees(notes)
    notes.embed()
    assert agrees(notes)[0] == set()

    # a collection removed, then cleanup: its chunks are orphans, then gone
    store.write(lambda conn: catalog.delete_collection(conn, "b"))
    assert agrees(notes)[2] > 0
    keep = upkeep.Configured(frozenset({"a"}), None, "", None)
    upkeep.cleanup(store, keep)
    assert agrees(notes)[2] == 0


def truth_active(store: IndexStore, scope: list[str]) -> set[str]:
    with store.read() as conn:
        return truth(conn, None, scope)[0]


def test_a_copied_index_is_counted_as_it_is_not_as_a_file_at_its_path_was(store: IndexStore, tmp_path: Path) -> None:
    """`qmd index copy --replace` puts another index at a path a daemon has read: what was kept
    for the file before is not the new one's."""
    notes = Notes(store, tmp_path / "notes")
    for i in range(4):
        notes.note("a", f"a{i}.md")
    notes.update("a")
    notes.embed()
    target = tmp_path / "copy.sqlite"
    copy_index(store, target)
    copied = Store(target)
    try:
        assert agrees(notes, copied) == agrees(notes)
    finally:
        copied.close()
    notes.note("a", "a4.md")
    notes.note("b", "b0.md")
    (notes.root / "a" / "a0.md").unlink()
    notes.update("a", "b")
    notes.embed(["a"])
    copy_index(store, target, replace=True)
    copied = Store(target)
    try:
        assert agrees(notes, copied) == agrees(notes)
        assert len(agrees(notes, copied)[0]) == 1  # b0.md
    finally:
        copied.close()


def test_the_documents_mark_moves_with_what_the_active_documents_hold(store: IndexStore) -> None:
    """Each write that may change an active document's (collection, hash) moves the mark, in the
    writer's transaction (a write rolled back leaves it as it was). On SQLite, by row: writes
    that cannot change it leave it; Postgres moves it once a statement, for more than it must."""
    now = utcnow()

    def run(sql: str, *args: object) -> Callable[[Connection], None]:
        def write(conn: Connection) -> None:
            conn.execute(sql, args)

        return write

    store.write(run("INSERT INTO content(hash, doc, created_at) VALUES ('h1', 'one', ?), ('h2', 'two', ?)", now, now))
    insert = "INSERT INTO documents(collection, path, title, hash, created_at, modified_at, active) VALUES"
    moving = [
        run(f"{insert} ('a', 'x.md', 'x', 'h1', ?, ?, 1)", now, now),
        run("UPDATE documents SET hash = 'h2' WHERE path = 'x.md'"),
        run("UPDATE documents SET collection = 'b' WHERE path = 'x.md'"),
        run("UPDATE documents SET active = 0 WHERE path = 'x.md'"),
        run("UPDATE documents SET active = 1 WHERE path = 'x.md'"),
        run("DELETE FROM documents WHERE path = 'x.md'"),
    ]
    for write in moving:
        assert moves(store, write)

    def fails(conn: Connection) -> None:
        conn.execute(f"{insert} ('a', 'y.md', 'y', 'h1', ?, ?, 1)", (now, now))
        raise RuntimeError("rolled back")

    before = mark(store)
    with pytest.raises(RuntimeError):
        store.write(fails)
    assert mark(store) == before
    if store.postgres:
        return
    store.write(run(f"{insert} ('a', 'z.md', 'z', 'h1', ?, ?, 1)", now, now))
    still = [
        run(f"{insert} ('a', 'gone.md', 'gone', 'h1', ?, ?, 0)", now, now),
        run("UPDATE documents SET title = 'Z', modified_at = 'later', size = 9 WHERE path = 'z.md'"),
        run("UPDATE documents SET hash = 'h1', active = 1 WHERE path = 'z.md'"),
        run("UPDATE documents SET hash = 'h2' WHERE path = 'gone.md'"),
        run("DELETE FROM documents WHERE path = 'gone.md'"),
    ]
    for write in still:
        assert not moves(store, write)


@contextmanager
def traced(conn: sqlite3.Connection) -> Iterator[list[str]]:
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        conn.set_trace_callback(None)


SCANS = ("FROM documents WHERE active = 1", "GROUP BY hash")
"""What the counts read from scratch: the active documents, the space's whole tally."""


@pytest.mark.sqlite_only("the caches are kept per SQLite file; Postgres counts from the tables each time")
def test_nothing_changed_reads_no_documents_and_an_embed_batch_reads_the_batch(tmp_path: Path) -> None:
    """An embed with nothing to do reads no documents and commits no write (so what is kept by
    the store's generation stays); after a batch of vectors, the counts read its rows."""
    store = Store(tmp_path / "index.sqlite")
    try:
        notes = Notes(store, tmp_path / "notes")
        for i in range(5):
            notes.note("a", f"a{i}.md")
        notes.update("a")
        notes.embed()
        states = VectorStates(store)
        with store.read() as conn:
            first = states.get(notes.embedder, "", None, {})
            generation = store.generation
            with traced(conn) as seen:
                assert notes.embed().pending_after == 0
            assert not [s for s in seen if any(scan in s for scan in SCANS)]
            assert store.generation == generation, "an embed with nothing to do wrote nothing"
            assert states.get(notes.embedder, "", None, {}) is first

            notes.note("a", "a5.md")
            notes.update("a")
            assert states.get(notes.embedder, "", None, {}).pending == 1
            space = notes.space()
            assert space is not None
            new = notes.hash_of("a", "a5.md")
            chunk = vectors.ChunkVector(0, 0, 1, 1, 1, 1, False, [1.0, 0.0, 0.0, 0.0])

            def batch(conn: Connection) -> None:
                """What an embed job's batch writes: the vectors and their search rows, no document."""
                vectors.write_document(conn, space, new, [chunk], 1)
                vectors.add_partitions(conn, space, [new])

            store.write(batch)
            with traced(conn) as seen:
                after = states.get(notes.embedder, "", None, {})
            assert not [s for s in seen if any(scan in s for scan in SCANS)]
            assert [s for s in seen if "FROM content_vectors WHERE id >" in s]
        with store.read() as conn:
            _, embedded, orphans, stale = truth(conn, space, None)
        assert (after.pending, after.embedded_chunks, after.orphan_chunks, after.stale_contents) == (
            0,
            embedded,
            orphans,
            stale,
        )
        assert after.embedded_chunks > first.embedded_chunks
    finally:
        store.close()


def test_an_embedder_of_other_dims_is_still_refused_when_the_space_exists(store: IndexStore, tmp_path: Path) -> None:
    """An embed finds its space with a read and writes only to make or empty one: a space whose
    dims differ from the embedder's still goes to `ensure_space`, which refuses it, writing nothing."""
    notes = Notes(store, tmp_path / "notes")
    notes.note("a", "a0.md")
    notes.update("a")
    notes.embed()
    before = agrees(notes)
    wider = Embedder("fake", Recording(), 64, notes.embedder.fingerprint, 8, "fake")
    with pytest.raises(RuntimeError, match="has 4 dims, the embedder gave 8"):
        embed_pending(store, wider, collections=None)
    assert agrees(notes) == before
