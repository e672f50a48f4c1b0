"""`qmd index copy` (server/store/copy.py): SQLite → Postgres → SQLite gives the same
answers, vectors included; a copy is all or nothing; bad destinations are refused."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest
from conftest import MODELS_DIR, NOTES, Daemon, Env, assert_terms_counted, require, write

import qmd
from qmd.server.errors import Conflict, InvalidInput, NotFound, QmdError
from qmd.server.store import copy as index_copy
from qmd.server.store import fts
from qmd.server.store.pg_store import PgStore
from qmd.server.store.sqlite import Store

EMBED = "all-MiniLM-L6-v2-Q8_0.gguf"


def answers(index: qmd.Index, query: str) -> list[tuple[str, str, int, dict]]:
    """Each hit's pointer and metadata."""
    return [(h.doc.display_path, h.doc.docid, h.start_line, h.metadata) for h in index.search(query).hits]


def sqlite_index(tmp_path: Path) -> Path:
    db = tmp_path / "src.sqlite"
    meta = "qmd:\n  metadata:\n    tags: [b, a]\n    sizes: [10, 9]\n    year: 2024\n    done: true\n"
    notes = write(tmp_path / "notes", {**NOTES, "tagged.md": f"---\n{meta}---\n# T\n\nfundraising\n"})
    with qmd.open(db, collections={"notes": {"path": str(notes)}}) as index:
        index.update()
    return db


def test_sqlite_to_postgres_and_back_gives_the_same_answers(tmp_path: Path, pg_index: str) -> None:
    db = sqlite_index(tmp_path)
    with qmd.open(db) as index:
        before = {q: answers(index, q) for q in ("fundraising", "seed round", "meeting notes")}
        assert any(m for *_, m in before["fundraising"])
    src = Store(db)
    try:
        report = index_copy.copy_index(src, pg_index)
    finally:
        src.close()
    assert report.rows["documents"] == len(NOTES) + 1 and report.keyword_documents == len(NOTES) + 1
    with qmd.open(pg_index) as index:
        assert {q: answers(index, q) for q in before} == before
    back = tmp_path / "back.sqlite"
    pg = PgStore(pg_index)
    try:
        index_copy.copy_index(pg, back)
    finally:
        pg.close()
    with qmd.open(back) as index:
        assert {q: answers(index, q) for q in before} == before
    assert not (tmp_path / "back.sqlite.copying").exists()
    copied = Store(back)
    try:
        with copied.read() as conn:  # the copy's keyword term counts, made once after its rows
            assert fts.counts_kept(conn) and fts.term_count_check(conn)[0]
    finally:
        copied.close()


def test_a_destination_that_holds_an_index_is_refused_unless_replaced(tmp_path: Path, pg_index: str) -> None:
    db = sqlite_index(tmp_path)
    src = Store(db)
    try:
        index_copy.copy_index(src, pg_index)
        with pytest.raises(Conflict, match="already holds an index"):
            index_copy.copy_index(src, pg_index)
        other = tmp_path / "other.sqlite"
        index_copy.copy_index(src, other)
        with pytest.raises(Conflict, match="already holds an index"):
            index_copy.copy_index(src, other)
        again = index_copy.copy_index(src, pg_index, replace=True)
        assert again.rows["documents"] == len(NOTES) + 1
    finally:
        src.close()
    with psycopg.connect(pg_index) as conn:
        assert conn.execute("SELECT count(*) FROM documents").fetchone() == (len(NOTES) + 1,)
        assert conn.execute("SELECT docs FROM lex_totals").fetchone() == (len(NOTES) + 1,)
        assert_terms_counted(conn)  # counted once, not on top of the replaced index's counts


def test_an_interrupted_copy_leaves_the_destination_as_it_was(tmp_path: Path, pg_index: str) -> None:
    db = sqlite_index(tmp_path)
    src = Store(db)
    stop = threading.Event()

    def progress(ev: dict) -> None:
        if ev.get("table") == "documents":
            stop.set()  # Ctrl-C half-way

    try:
        for dst in (pg_index, tmp_path / "dst.sqlite"):
            stop.clear()
            with pytest.raises(QmdError, match="interrupted"):
                index_copy.copy_index(src, dst, progress=progress, cancel=stop)
    finally:
        src.close()
    with psycopg.connect(pg_index) as conn:
        assert conn.execute("SELECT count(*) FROM content").fetchone() == (0,)
    assert not (tmp_path / "dst.sqlite").exists() and not (tmp_path / "dst.sqlite.copying").exists()


def test_the_engine_refuses_what_cannot_be_copied(tmp_path: Path, pg_index: str) -> None:
    db = sqlite_index(tmp_path)
    with qmd.open(db) as index:
        engine = index.engine
        with pytest.raises(InvalidInput, match="the same index"):
            engine.copy_index(str(db), str(db))
        with pytest.raises(Conflict, match="the index this daemon serves"):
            engine.copy_index(str(tmp_path / "nothing.sqlite"), str(db))
        with pytest.raises(NotFound, match="there is no index at"):
            engine.copy_index(str(tmp_path / "nothing.sqlite"), pg_index)
        with pytest.raises(InvalidInput, match="postgresql://"):
            engine.copy_index(str(db), "mysql://host/db")


@pytest.mark.slow
def test_qmd_index_copy_moves_vectors_and_the_daemon_serves_the_copy(tmp_path: Path, pg_index: str) -> None:
    """The user's path: embed on SQLite, `qmd index copy index postgresql://…`, point the
    config at the server, restart: the same hybrid answers, no re-embedding."""
    model = require(MODELS_DIR / EMBED, "the MiniLM test embedder (../shared/models)")
    env = Env(tmp_path / "home")
    notes = write(tmp_path / "notes", NOTES)
    yml = env.config / "qmd" / "index.yml"
    d = Daemon(env)
    try:
        env.ok("collection", "add", str(notes), "--name", "notes")
        text = yml.read_text()
        yml.write_text(f"models:\n  embed: {model}\n{text}")
        env.ok("embed", timeout=300)
        before = env.json("query", "how do we raise money", "--no-rerank", "--no-expand", "--json")
        out = env.ok("index", "copy", "index", pg_index)
        assert "documents" in out and "Checked: every table" in out
        r = env.qmd("index", "copy", "index", pg_index)
        assert r.returncode == 1 and "already holds an index" in r.stderr and "Traceback" not in r.stderr
    finally:
        d.stop()
    yml.write_text(f"index_url: {pg_index}\n{yml.read_text()}")
    d = Daemon(env)
    try:
        status = env.json("status", "--json")
        assert status["index_path"].startswith("postgresql://")
        assert status["vector"]["available"] and status["vector"]["pending"] == 0
        after = env.json("query", "how do we raise money", "--no-rerank", "--no-expand", "--json")
        assert [(h["file"], h["docid"]) for h in after] == [(h["file"], h["docid"]) for h in before]
    finally:
        d.stop()
