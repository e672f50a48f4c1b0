"""Upkeep (issue 11): `qmd cleanup` drops what nothing needs and says what it freed, `qmd
doctor` and `qmd status` count the orphans (none after a cleanup), and `qmd status --files`
reports each collection's folder against the index.

The engine tests run in-process on a real SQLite index (fast); the CLI paths run the real
daemon, with the real MiniLM embedder where vectors are involved (slow)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import MODELS_DIR, NOTES, Daemon, Env, require, write
from harness import BACKEND

from qmd.paths import IndexPaths
from qmd.server.engine import Engine
from qmd.server.errors import Conflict, InvalidInput
from qmd.server.ingest import upkeep
from qmd.server.store import llm_cache
from qmd.server.store.db import sqlite3
from qmd.server.store.sqlite import Store, index_bytes

MODEL = "all-MiniLM-L6-v2-Q8_0.gguf"
NO_WATCH = {"QMD_WATCH": "0"}
"""The tests change files and then look: a watcher re-indexing behind them would race the look."""


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    monkeypatch.setenv("QMD_WATCH", "0")
    e = Engine(IndexPaths("t", tmp_path / "index.sqlite", tmp_path / "index.yml", tmp_path))
    yield e
    e.close()


def _orphans(e: Engine) -> dict[str, int]:
    o = e.orphans()
    return {
        "unconfigured": o.unconfigured_documents,
        "inactive": o.inactive_documents,
        "contents": o.orphan_contents,
        "chunks": o.orphan_chunks,
        "spaces": len(o.stale_spaces),
        "cache": o.stale_cache_entries,
    }


NONE = {"unconfigured": 0, "inactive": 0, "contents": 0, "chunks": 0, "spaces": 0, "cache": 0}


# -- the engine, in-process ------------------------------------------------------


def test_deleted_files_leave_rows_until_cleanup_drops_them(engine: Engine, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", NOTES)
    engine.create_collection(str(notes), name="notes")
    engine.update()
    assert _orphans(engine) == NONE
    (notes / "ideas.md").unlink()
    (notes / "fundraising.md").write_text("# Raising\n\nA new version.\n")
    engine.update()
    # the deleted file's row stays (soft delete), and its body with it; the edit's old body went with the update
    assert _orphans(engine) == {**NONE, "inactive": 1, "contents": 1}
    report = engine.cleanup()
    assert (report.found.inactive_documents, report.found.orphan_contents) == (1, 1)
    assert report.left is not None and _orphans(engine) == NONE
    # Postgres' postings have no segments to merge
    assert report.fts_optimized == (BACKEND == "sqlite") and report.vacuum is not None
    assert [h.doc.display_path for h in engine.search("version").hits] == ["notes/fundraising.md"]
    (notes / "ideas.md").write_text("# Ideas\n\nBack again.\n")
    engine.update()  # a file restored after cleanup is simply new
    assert [h.doc.display_path for h in engine.search("again").hits] == ["notes/ideas.md"]


def test_dry_run_changes_nothing(engine: Engine, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", NOTES)
    engine.create_collection(str(notes), name="notes")
    engine.update()
    (notes / "ideas.md").unlink()
    engine.update()
    generation = engine.store.generation
    report = engine.cleanup(dry_run=True)
    assert report.dry_run and report.found.inactive_documents == 1 and report.left is None
    assert report.vacuum is None and engine.store.generation == generation
    assert _orphans(engine)["inactive"] == 1


def test_a_collection_removed_from_the_yaml_by_hand_is_dropped(engine: Engine, tmp_path: Path) -> None:
    engine.create_collection(str(write(tmp_path / "a", NOTES)), name="a")
    engine.create_collection(str(write(tmp_path / "b", {"x.md": "# X\n\nzebra crossing\n"})), name="b")
    engine.update()
    yaml = engine.paths.config.read_text()
    engine.paths.config.write_text(yaml[: yaml.index("  b:")])  # the user deletes b's block
    assert _orphans(engine)["unconfigured"] == 1
    report = engine.cleanup()
    assert report.collections_removed == ["b"] and _orphans(engine) == NONE
    with engine.store.read() as conn:
        assert conn.execute("SELECT count(*) FROM documents WHERE collection = 'b'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM content WHERE doc LIKE '%zebra%'").fetchone()[0] == 0


@pytest.mark.sqlite_only("the index file shrinks")
def test_vacuum_shrinks_the_file_after_mass_deletion(engine: Engine, tmp_path: Path) -> None:
    para = "Replicas agree on a log even when a minority of nodes fail or lag behind. "
    docs = write(tmp_path / "docs", {f"d{i:04}.md": f"# Doc {i}\n\n{para * 30} token{i}\n" for i in range(1500)})
    engine.create_collection(str(docs), name="docs")
    engine.update()
    for i in range(1400):
        (docs / f"d{i:04}.md").unlink()
    engine.update()
    before = index_bytes(engine.paths.db)
    report = engine.cleanup()
    assert report.vacuum is not None and report.vacuum.ran, report.vacuum
    assert report.found.inactive_documents == 1400 and report.found.orphan_contents == 1400
    assert report.bytes_before == before and report.bytes_after == index_bytes(engine.paths.db)
    assert report.bytes_after < before / 3, (before, report.bytes_after)
    assert not Path(f"{engine.paths.db}-wal").exists() or Path(f"{engine.paths.db}-wal").stat().st_size == 0
    # the index still works, reads and writes
    assert [h.doc.display_path for h in engine.search("token1450").hits] == ["docs/d1450.md"]
    (docs / "new.md").write_text("# New\n\nafter the vacuum\n")
    engine.update()
    assert [h.doc.display_path for h in engine.search("vacuum").hits] == ["docs/new.md"]
    # nothing left to free: the next one does not vacuum, and says why
    again = engine.cleanup()
    assert again.vacuum is not None and not again.vacuum.ran and "VACUUM runs from 10%" in again.vacuum.reason


def test_vacuum_can_be_forced_or_refused(engine: Engine, tmp_path: Path) -> None:
    engine.create_collection(str(write(tmp_path / "notes", NOTES)), name="notes")
    engine.update()
    forced = engine.cleanup(vacuum=True)
    assert forced.vacuum is not None and forced.vacuum.ran and "asked for" in forced.vacuum.reason
    refused = engine.cleanup(vacuum=False)
    assert refused.vacuum is not None and not refused.vacuum.ran and "--no-vacuum" in refused.vacuum.reason


def _cache(store: Store, rows: dict[str, tuple[str | None, str]]) -> None:
    """Cache entries key → (model, created_at), written as the cache writes them."""

    def put(conn: object) -> None:
        for key, (model, created) in rows.items():
            conn.execute(  # type: ignore[attr-defined]
                "INSERT INTO llm_cache(hash, result, created_at, model) VALUES (?, '[]', ?, ?)", (key, created, model)
            )

    store.write(put, bump=False)


def test_cache_entries_of_unconfigured_models_and_old_ones_are_pruned(engine: Engine) -> None:
    models = engine.models.resolved(engine.usable_config())
    expander, reranker = models["generate"].ref.uri, models["rerank"].ref.uri
    now = datetime.now(UTC)
    fresh, old = now.isoformat(), (now - timedelta(days=45)).isoformat()
    _cache(
        engine.store,
        {
            "expansion": (expander, fresh),
            "rerank": (reranker, fresh),
            "gone-model": ("hf:someone/old-reranker.gguf", fresh),
            "old": (expander, old),
            "legacy-fresh": (None, fresh),  # made before entries named their model: judged by age
            "legacy-old": (None, old),
        },
    )
    llm_cache.put_many(engine.store, {"put": "[]"}, model=expander)  # the cache's own writer names the model
    assert _orphans(engine)["cache"] == 3
    assert engine.cleanup(dry_run=True).found.stale_cache_entries == 3
    report = engine.cleanup()
    assert report.cache_entries_removed == 3
    with engine.store.read() as conn:
        left = {r[0] for r in conn.execute("SELECT hash FROM llm_cache")}
    assert left == {"expansion", "rerank", "legacy-fresh", "put"}
    assert engine.cleanup(cache_days=0).cache_entries_removed == 4  # 0 days: the whole cache


def test_cache_entries_from_before_schema_5_survive_the_upgrade_and_age_out(tmp_path: Path) -> None:
    db = tmp_path / "index.sqlite"
    Store(db).close()
    conn = sqlite3.connect(db)
    try:  # as schema 4 left it: entries without a model
        conn.execute("ALTER TABLE llm_cache DROP COLUMN model")
        now, old = datetime.now(UTC), datetime.now(UTC) - timedelta(days=31)
        conn.executemany(
            "INSERT INTO llm_cache VALUES (?, '[1]', ?)", [("new", now.isoformat()), ("old", old.isoformat())]
        )
        conn.execute("PRAGMA user_version = 4")
        conn.commit()
    finally:
        conn.close()
    store = Store(db)
    try:
        assert llm_cache.get(store, "new") == "[1]"
        cutoff = (now - timedelta(days=upkeep.CACHE_MAX_AGE_DAYS)).isoformat()
        with store.read() as reader:
            assert reader.execute("SELECT count(*) FROM llm_cache WHERE model IS NULL").fetchone()[0] == 2
            assert llm_cache.count_stale(reader, ["hf:any/model.gguf"], cutoff) == 1
        assert store.write(lambda w: llm_cache.prune(w, None, cutoff)) == 1
    finally:
        store.close()


def test_cleanup_waits_for_a_running_update_or_refuses(engine: Engine, tmp_path: Path) -> None:
    engine.create_collection(str(write(tmp_path / "notes", NOTES)), name="notes")
    engine.set_collection("notes", update_cmd="sleep 1.5")
    runner = threading.Thread(target=engine.update)
    runner.start()
    time.sleep(0.3)  # the update holds its lock, in its hook
    with pytest.raises(Conflict, match="an update is running, so cleanup did not start"):
        engine.cleanup(wait_s=0)
    t0 = time.monotonic()
    report = engine.cleanup(wait_s=30)  # waits for the update, then runs
    assert time.monotonic() - t0 > 0.5 and report.left is not None
    runner.join()
    with engine._embed:  # an embed in progress: refused, and the update lock is released again
        with pytest.raises(Conflict, match="an embed is running"):
            engine.cleanup(wait_s=0.1)
    assert engine._update.acquire(timeout=0)
    engine._update.release()


def test_bad_arguments_are_clear_errors(engine: Engine) -> None:
    with pytest.raises(InvalidInput, match="--cache-days must be 0 or more"):
        engine.cleanup(cache_days=-1)
    with pytest.raises(InvalidInput, match="--wait must be 0 or more"):
        engine.cleanup(wait_s=-2)


def test_coverage_reports_every_file_by_state(engine: Engine, tmp_path: Path) -> None:
    notes = write(
        tmp_path / "notes",
        {
            **NOTES,
            "empty.md": "  \n",
            "broken.pdf": b"%PDF-1.4 not really",
            "bad-meta.md": "---\nqmd:\n  metadata:\n    nested: {a: 1}\n---\n# Bad\n\nbody\n",
        },
    )
    engine.create_collection(str(notes), name="notes", pattern="**/*.{md,pdf}")
    engine.update()
    (notes / "ideas.md").write_text("# Ideas\n\nchanged, not updated yet\n")
    (notes / "later.md").write_text("# Later\n\nnot indexed yet\n")
    (notes / "cooking" / "bread.md").unlink()
    [cov] = engine.coverage("notes")
    states = {f.path: f.state for f in cov.files}
    assert states == {
        "bad-meta.md": "indexed",
        "broken.pdf": "failed",
        "cooking/bread.md": "missing",
        "empty.md": "skipped",
        "fundraising.md": "indexed",
        "ideas.md": "changed",
        "later.md": "new",
        "work/meeting-2026-04-10.md": "indexed",
    }
    reasons = {f.path: f.reason for f in cov.files if f.reason}
    assert reasons["empty.md"] == "empty" and reasons["broken.pdf"].startswith("PDF could not be read")
    assert (cov.discovered, cov.indexed, cov.skipped, cov.failed, cov.pending_update) == (7, 5, 1, 1, 3)
    assert cov.metadata_errors == 1 and "nested" in next(f.metadata_error for f in cov.files if f.metadata_error)
    # no embedder here: every indexed file is pending vectors, and the report says why
    assert cov.pending_vectors == 5 and cov.vectors_note
    engine.update()
    [cov] = engine.coverage()
    assert cov.pending_update == 0 and cov.indexed == 5 and cov.discovered == 7


def test_coverage_of_a_missing_folder_never_says_missing(engine: Engine, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", NOTES)
    engine.create_collection(str(notes), name="notes")
    engine.update()
    notes.rename(tmp_path / "elsewhere")  # an unmounted disk: the next update keeps everything
    [cov] = engine.coverage("notes")
    assert cov.root_missing and cov.discovered == 0 and cov.pending_update == 0
    assert {f.state for f in cov.files} == {"indexed"}


# -- the CLI through the daemon -------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Path:
    return require(MODELS_DIR / MODEL, "the MiniLM test embedder (../shared/models)")


def start(env: Env, model: Path, name: str = MODEL) -> Daemon:
    env.vars.update(NO_WATCH, QMD_EMBED_MODEL=str(model.parent / name))
    return Daemon(env)


def _para(topic: str) -> str:
    return f"{topic.capitalize()} matters in distributed systems because replicas must agree. " * 40


def _job(d: Daemon, route: str) -> dict:
    """A streamed job's `done` event."""
    events = [json.loads(line) for line in d.http.post(route, json={}).text.splitlines()]
    assert events[-1]["event"] == "done", events[-1]
    return events[-1]


@pytest.mark.slow
def test_edit_after_embedding_then_cleanup_leaves_no_orphans(env: Env, model: Path, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {f"{t}.md": f"# {t}\n\n{_para(t)}\n" for t in ("raft", "paxos", "gossip")})
    d = start(env, model)
    try:
        env.ok("collection", "add", str(notes), "--name", "notes")
        env.ok("embed")
        embedded = env.json("status", "--json")["vector"]["embedded_chunks"]
        assert env.json("status", "--json")["vector"]["orphan_chunks"] == 0
        (notes / "raft.md").write_text(f"# raft\n\n{_para('leader election')}\n")
        (notes / "gossip.md").unlink()
        [summary] = _job(d, "/v1/update")["report"]["collections"]  # seed 001's names in the reports
        assert (summary["discovered"], summary["updated"], summary["removed"]) == (2, 1, 1)
        vector = env.json("status", "--json")["vector"]
        # the old versions' chunks are orphans, never counted as embedded
        assert vector["orphan_chunks"] > 0 and vector["embedded_chunks"] < embedded
        assert "Orphaned:" in env.ok("status")
        doctor = env.ok("doctor")
        assert "orphaned embedding chunk" in doctor and "inactive document record" in doctor
        embed = _job(d, "/v1/embed")["report"]
        assert embed["documents"] == 1 and embed["embedded"] == embed["chunks"] > 0 and embed["skipped"] == 0
        assert embed["truncated"] == [] and embed["truncated_count"] == 0
        report = env.json("cleanup", "--json", "--vacuum")
        assert report["found"]["orphan_chunks"] == vector["orphan_chunks"]
        assert report["found"]["inactive_documents"] == 1 and report["vacuum"]["ran"]
        assert report["left"]["orphan_chunks"] == 0 and report["bytes_after"] <= report["bytes_before"]
        assert "✓ orphans: none" in env.ok("doctor") and "Orphaned:" not in env.ok("status")
        assert env.json("status", "--json")["vector"]["pending"] == 0
        hits = env.json("vsearch", "leader election", "--json")
        assert hits[0]["file"] == "qmd://notes/raft.md"
        text = env.ok("cleanup")
        assert "No orphans found." in text and "Size:" in text
    finally:
        d.stop()


@pytest.mark.slow
def test_a_removed_models_space_is_dropped(env: Env, model: Path, notes: Path) -> None:
    require(MODELS_DIR / "all-MiniLM-L6-v2-F16.gguf", "the F16 MiniLM")
    d = start(env, model)
    env.ok("collection", "add", str(notes), "--name", "notes")
    env.ok("embed")
    d.stop()
    d = start(env, model, "all-MiniLM-L6-v2-F16.gguf")  # the user switches models
    try:
        env.ok("embed")
        assert "vector space of models no longer configured (all-MiniLM-L6-v2-Q8_0.gguf" in env.ok("doctor")
        text = env.ok("cleanup", "--dry-run")
        assert "Would remove 1 vector space" in text
        report = env.json("cleanup", "--json")
        assert [s["model"] for s in report["found"]["stale_spaces"]] == ["all-MiniLM-L6-v2-Q8_0.gguf"]
        assert report["left"]["stale_spaces"] == []  # its few rows free too little to VACUUM (no vec0 table now)
        assert "✓ orphans: none" in env.ok("doctor")
        assert env.json("vsearch", "sourdough bread", "--json")[0]["file"] == "qmd://notes/cooking/bread.md"
    finally:
        d.stop()


@pytest.mark.slow
def test_status_files_lists_skipped_and_pending_vector_files(env: Env, model: Path, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {**NOTES, "empty.md": " \n", "broken.pdf": b"%PDF-1.4 broken"})
    d = start(env, model)
    try:
        env.ok("collection", "add", str(notes), "--name", "notes", "--mask", "**/*.{md,pdf}")
        env.ok("embed")
        (notes / "later.md").write_text(f"# Later\n\n{_para('later')}\n")
        env.ok("update")
        text = env.ok("status", "--files")
        assert "discovered 7 · indexed 5 · skipped 1 · failed 1 · pending update 0 · pending vectors 1" in text
        assert "    empty.md: empty" in text and "    broken.pdf: PDF could not be read" in text
        assert "  Pending vectors (1)\n    later.md\n" in text
        got = env.json("status", "--files", "notes", "--json")
        [cov] = got
        assert cov["collection"] == "notes" and cov["pending_vectors"] == 1
        assert {f["path"] for f in cov["files"] if f["pending_vectors"]} == {"later.md"}
        assert {f["path"]: f["state"] for f in cov["files"]}["empty.md"] == "skipped"
        missing = env.qmd("status", "--files", "nope")
        assert missing.returncode == 1 and "Collection not found: nope" in missing.stderr
        assert "Traceback" not in missing.stderr
    finally:
        d.stop()


@pytest.mark.slow
def test_cli_errors(env: Env, notes: Path) -> None:
    env.vars.update(NO_WATCH)
    d = Daemon(env)
    try:
        env.ok("collection", "add", str(notes), "--name", "notes")
        for args, message in (
            (("cleanup", "--cache-days", "-1"), "Invalid value for '--cache-days'"),
            (("cleanup", "--wait", "nope"), "Invalid value for '--wait'"),
            (("status", "notes"), "a collection name (notes) goes with --files"),
        ):
            r = env.qmd(*args)
            assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
        r = d.http.post("/v1/cleanup", json={"cacheDays": -3})
        assert r.status_code == 400 and "cache" in r.json()["error"].lower()
        r = d.http.post("/v1/cleanup", json={"vacum": True})
        assert r.status_code == 400 and "vacum" in r.json()["error"]
        # an update in its hook holds the index: cleanup is refused, clearly, and runs once it is over
        env.ok("collection", "update-cmd", "notes", "sleep 3")
        running = env.qmd_background("update")
        time.sleep(1.0)
        r = env.qmd("cleanup", "--wait", "0")
        assert r.returncode == 1 and "an update is running, so cleanup did not start" in r.stderr, r.stderr
        assert running.wait(timeout=60) == 0
        assert json.loads(env.ok("cleanup", "--json"))["left"]["inactive_documents"] == 0
    finally:
        d.stop()
