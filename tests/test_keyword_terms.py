"""The keyword index's term counts (`fts_terms`, store/fts.py): each term's documents, kept
by every write beside FTS5's index, equal to what FTS5's own vocabulary counts, and what a
search reads for a whole word instead of a pass over its documents."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from pathlib import Path

import pytest
from conftest import Daemon, Env, write

from qmd.server.config import Collection
from qmd.server.ingest import indexer
from qmd.server.ingest.indexer import index_collection
from qmd.server.search import lexical
from qmd.server.search.lexical import FtsVocabulary, item_idfs, parse_lex, search_fts
from qmd.server.search.typos import correct
from qmd.server.store import catalog, fts
from qmd.server.store.db import sqlite3
from qmd.server.store.fts import indexed_rows
from qmd.server.store.sqlite import Store

pytestmark = pytest.mark.sqlite_only("the term counts sit beside FTS5's index; Postgres keeps postings of its own")

NOTES = {
    "garden/tomatoes.md": "# Tomatoes\n\nWater the tomatoes at dawn; compost twice a season.\n",
    "garden/roses.md": "# Roses\n\nPrune roses in March. Roses like compost and sun.\n",
    "kitchen/bread.md": "# Sourdough bread\n\nFeed the starter, then bake the bread at dawn.\n",
    "kitchen/漢字.md": "# 漢字メモ\n\n東京で食べたパンの記録。Bread in Tokyo.\n",
    "notes/running.md": "# Running log\n\nRan ten kilometres; running at dawn is quiet.\n",
}


FILLER = {f"filler/{i}.md": f"# Filler {i}\n\nGravel path number {i}, raked at noon.\n" for i in range(40)}
"""Enough other notes that a note's edit is a small write (`fts.RECOUNT_SHARE`)."""


def indexed(tmp_path: Path, store: Store) -> tuple[Path, Collection]:
    """The filler, then the notes: the `home` collection, returned for edits."""
    index_collection(store, Collection(name="filler", path=str(write(tmp_path / "filler", FILLER))))
    root = write(tmp_path / "notes", NOTES)
    coll = Collection(name="home", path=str(root))
    index_collection(store, coll)
    return root, coll


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "index.sqlite")
    yield s
    s.close()


@pytest.fixture
def recounts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every time the counts are made again from FTS5's vocabulary."""
    calls: list[int] = []
    real = fts.recount_terms

    def counted(conn: sqlite3.Connection) -> None:
        calls.append(1)
        real(conn)

    monkeypatch.setattr(fts, "recount_terms", counted)
    return calls


def kept(store: Store) -> dict[str, int]:
    with store.read() as conn:
        return {t: int(n) for t, n in conn.execute("SELECT term, docs FROM fts_terms")}


def vocabulary(store: Store) -> dict[str, int]:
    """What FTS5 itself counts: each term's rows, in any column."""
    with store.read() as conn:
        FtsVocabulary(conn)
        return {t: int(n) for t, n in conn.execute("SELECT term, doc FROM temp.qmd_vocab")}


def agree(store: Store) -> None:
    counts = kept(store)
    assert counts == vocabulary(store)
    assert counts and all(n > 0 for n in counts.values())


@pytest.fixture
def tokenized(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows each write cut into terms to update the counts."""
    rows: list[int] = []
    real = fts.term_documents

    def counted(docs: Sequence[tuple[int, str, str, str]]) -> list[tuple[str, int]]:
        rows.append(len(docs))
        return real(docs)

    monkeypatch.setattr(fts, "term_documents", counted)
    return rows


def test_a_large_pass_counts_once_after_it(
    tmp_path: Path, store: Store, recounts: list[int], tokenized: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(indexer, "BATCH_FILES", 4)  # ten batches, each a small write beside the index
    index_collection(store, Collection(name="filler", path=str(write(tmp_path / "filler", FILLER))))
    agree(store)
    assert recounts == [1] and tokenized == []
    root = write(tmp_path / "notes", NOTES)
    index_collection(store, Collection(name="home", path=str(root)))  # 5 beside 40: kept batch by batch
    agree(store)
    assert recounts == [1] and sum(tokenized) == len(NOTES)


def test_a_pass_cut_short_leaves_the_counts_to_the_next_start(tmp_path: Path) -> None:
    db = tmp_path / "index.sqlite"
    store = Store(db)
    try:
        root, coll = indexed(tmp_path, store)
        assert store.write(fts.pause_term_counts)  # as a large pass does, then the process dies
        (root / "garden/roses.md").write_text("# Roses\n\nDeadhead them weekly.\n")
        index_collection(store, coll)  # a small pass while paused: rows written, counts left
        with store.read() as conn:
            assert not fts.counts_kept(conn)
            traced = statements(conn, lambda: search_fts(conn, parse_lex("compost roses bread dawn"), None, 5))
        assert len([s for s in traced if s.startswith("SELECT count(*) FROM documents_fts WHERE")]) == 4
    finally:
        store.close()
    store = Store(db)
    try:
        agree(store)
    finally:
        store.close()


def test_the_counts_follow_every_write_without_a_recount(tmp_path: Path, store: Store, recounts: list[int]) -> None:
    index_collection(store, Collection(name="filler", path=str(write(tmp_path / "filler", FILLER))))
    agree(store)  # a first index is a large pass: counted from FTS5's vocabulary after it
    assert recounts
    recounts.clear()
    root = write(tmp_path / "notes", NOTES)
    coll = Collection(name="home", path=str(root))
    index_collection(store, coll)
    agree(store)
    assert kept(store)["dawn"] == 3 and kept(store)["home"] == 5  # the collection name is in every file path
    (root / "garden/tomatoes.md").write_text("# Tomatoes\n\nHarvest in August.\n")  # an edit
    (root / "notes/running.md").rename(root / "notes/jogging.md")  # a new file path
    (root / "kitchen/bread.md").unlink()  # a removal
    index_collection(store, coll)
    agree(store)
    assert kept(store)["dawn"] == 1 and "harvest" in kept(store) and "kitchen" in kept(store)
    store.write(lambda c: catalog.rename_collection(c, "home", "house"))
    agree(store)
    assert "home" not in kept(store) and kept(store)["hous"] == 4
    store.write(lambda c: catalog.delete_collection(c, "house"))
    agree(store)
    assert "hous" not in kept(store) and kept(store)["gravel"] == len(FILLER)
    assert recounts == []
    store.write(lambda c: catalog.delete_collection(c, "filler"))  # all of it: recounted
    assert kept(store) == vocabulary(store) == {}
    assert recounts == [1]


def test_a_replaced_row_that_cannot_be_read_again_recounts(
    tmp_path: Path, store: Store, recounts: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    root, coll = indexed(tmp_path, store)
    recounts.clear()
    store.write(lambda c: c.execute("UPDATE fts_rows SET hash = 'gone' WHERE filepath = 'home/garden/roses.md'"))
    (root / "garden/roses.md").write_text("# Roses\n\nDeadhead them weekly.\n")
    index_collection(store, coll)
    agree(store)
    assert len(recounts) == 1
    # a count that drifted below what the index holds is caught when a write would take it under 0
    store.write(lambda c: c.execute("UPDATE fts_terms SET docs = 0 WHERE term = 'dawn'"))
    (root / "garden/tomatoes.md").unlink()
    with caplog.at_level(logging.WARNING, logger="qmd.store"):
        index_collection(store, coll)
    assert "drifted" in caplog.text
    agree(store)
    assert len(recounts) == 2


def test_another_sqlite_library_recounts_at_start(tmp_path: Path) -> None:
    db = tmp_path / "index.sqlite"
    store = Store(db)
    try:
        index_collection(store, Collection(name="home", path=str(write(tmp_path / "notes", NOTES))))

        def elsewhere(c: sqlite3.Connection) -> None:
            c.execute("UPDATE fts_counted SET sqlite = '3.0.0'")
            c.execute("UPDATE fts_terms SET docs = 99")

        store.write(elsewhere)
    finally:
        store.close()
    store = Store(db)
    try:
        agree(store)
        with store.read() as conn:
            assert [r[0] for r in conn.execute("SELECT sqlite FROM fts_counted")] == [sqlite3.sqlite_version]
    finally:
        store.close()


def test_an_index_of_version_10_gets_its_counts(tmp_path: Path, recounts: list[int]) -> None:
    db = tmp_path / "index.sqlite"
    store = Store(db)
    try:
        root, coll = indexed(tmp_path, store)
    finally:
        store.close()
    with sqlite3.connect(str(db), isolation_level=None) as conn:
        for table in ("fts_rows", "fts_terms", "fts_counted"):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("PRAGMA user_version = 10")
    recounts.clear()  # the new index's migration made its (empty) counts
    store = Store(db)
    try:
        agree(store)
        assert len(recounts) == 1  # this migration's
        (root / "garden/roses.md").write_text("# Roses\n\nDeadhead them weekly.\n")
        index_collection(store, coll)
        agree(store)
        assert len(recounts) == 1  # the rows the migration named are read again, not recounted
    finally:
        store.close()


def statements(conn: sqlite3.Connection, search: Callable[[], object]) -> list[str]:
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        search()
    finally:
        conn.set_trace_callback(None)
    return seen


def test_a_search_reads_a_words_count_and_ranks_as_a_count_would(tmp_path: Path, store: Store) -> None:
    index_collection(store, Collection(name="home", path=str(write(tmp_path / "notes", NOTES))))
    words = parse_lex("compost roses bread dawn")  # more than two items: whole words
    with store.read() as conn:
        traced = statements(conn, lambda: search_fts(conn, words, None, 5))
        hits = search_fts(conn, words, None, 5)
    assert not [s for s in traced if s.startswith("SELECT count(*) FROM documents_fts WHERE")]
    assert hits[0].doc_id and len(hits) == 5
    plain = sqlite3.connect(str(store.path))  # no term counts read: every item counted by a pass
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(lexical, "counts_kept", lambda conn: False)
            assert search_fts(plain, words, None, 5) == hits
    finally:
        plain.close()


def test_doctor_tells_counts_that_differ_and_cleanup_makes_them_again(env: Env, daemon: Daemon, notes: Path) -> None:
    env.ok("collection", "add", str(notes), "--name", "notes")
    assert "✓ keyword term counts:" in env.qmd("doctor").stdout
    with closing(sqlite3.connect(str(env.db), isolation_level=None)) as conn:
        conn.execute("UPDATE fts_terms SET docs = docs + 1 WHERE term = 'bread'")
        conn.execute("INSERT INTO fts_terms(term, docs) VALUES ('nowhere', 1)")
    doctor = env.qmd("doctor").stdout
    assert "⚠ 2 keyword term counts differ from FTS5's: `qmd cleanup` makes them again" in doctor
    env.ok("cleanup")
    assert "✓ keyword term counts:" in env.qmd("doctor").stdout


def test_typo_correction_reads_the_counts_and_corrects_as_the_vocabulary_does(tmp_path: Path, store: Store) -> None:
    """`--fuzzy` lists a letter's terms and ranks them by documents: from the counts where
    they are kept, from FTS5's vocabulary while they are paused, with the same answers."""
    indexed(tmp_path, store)
    typed = parse_lex("compsot rosess breed grivel")
    with store.read() as conn:
        vocab = FtsVocabulary(conn)
        assert vocab.terms == "fts_terms"
        kept_terms = (vocab.with_initial("g"), vocab.frequency("gravel"), vocab.has_prefix("rose"))
        with_counts = correct(conn, typed)
    assert store.write(fts.pause_term_counts)
    with store.read() as conn:
        vocab = FtsVocabulary(conn)
        assert vocab.terms == "temp.qmd_vocab"
        assert (vocab.with_initial("g"), vocab.frequency("gravel"), vocab.has_prefix("rose")) == kept_terms
        assert correct(conn, typed) == with_counts
    assert kept_terms[1] == len(FILLER)
    assert [c.searched for c in with_counts[1]] == ["compost", "roses", "bread", "gravel"]


def test_a_prefix_reads_the_counts_where_they_tell(tmp_path: Path, store: Store) -> None:
    """The words of a short query are prefixes. One that a single term starts with reads
    that term's count; one that a common term starts with reads that (the idf is clamped
    either way); one that several rarer terms start with is counted by a pass, as their
    documents overlap. Every idf, and so every hit, is the pass's."""
    indexed(tmp_path, store)
    with closing(sqlite3.connect(str(store.path))) as conn:  # no memory of earlier counts
        rows = indexed_rows(conn)
        sql = "SELECT count(*) FROM documents_fts WHERE documents_fts MATCH ?"
        for words, passes in (("compost dawn", 0), ("ra dawn", 0), ("b dawn", 1), ("b ro", 1)):
            query = parse_lex(words)
            assert all(e.endswith('"*') for e in query.positives)
            counted: list[int] = []
            traced = statements(conn, lambda q=query, c=counted: c.extend(lexical._counts(conn, q.positives, rows)))
            assert len([s for s in traced if s.startswith("SELECT count(*) FROM documents_fts WHERE")]) == passes
            by_pass = [conn.execute(sql, (e,)).fetchone()[0] for e in query.positives]
            assert item_idfs(counted, rows) == item_idfs(by_pass, rows), words
            hits = search_fts(conn, query, None, 10)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(lexical, "counts_kept", lambda conn: False)
                assert search_fts(conn, query, None, 10) == hits
