"""Reports in seed 001's words (issue 31): `qmd update` and `qmd embed` print the seed's
counters and take `--json` (the daemon's report as it sends it); `qmd update` counts what
changed since the last report, the watcher's passes included; `collection add` says when
it starts embedding in the background, and `qmd status` / `qmd embed --follow` show that
embed's progress. Through the CLI against a real daemon, with the MiniLM test GGUF."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import MODELS_DIR, NOTES, require, write
from harness import Daemon, Env
from test_watcher import FAST, eventually, paths_for, settled

import qmd

REPORT_KEYS = {
    "collection",
    "since",
    "discovered",
    "loaded",
    "new",
    "updated",
    "unchanged",
    "removed",
    "skipped",
    "remembered",
    "watcher",
    "loaders",
    "warnings",
    "orphans_cleaned",
    "metadata_extracted",
    "seconds",
    "line",
    "watcher_line",
}


def minilm() -> Path:
    return require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM test embedder (../shared/models)")


@pytest.fixture
def watching(env: Env) -> Iterator[Daemon]:
    """A daemon whose watcher is on, with short quiet periods."""
    env.vars.update(FAST)
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    yield d
    d.stop()


def job_report(d: Daemon, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A streamed job's `done` report over HTTP."""
    with d.http.stream("POST", path, json=body, timeout=300) as r:
        events = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert events[-1]["event"] == "done", events[-1]
    report: dict[str, Any] = events[-1]["report"]
    return report


def test_update_reports_what_the_watcher_indexed_first(env: Env, watching: Daemon, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {"a.md": "# A\n\nalpha\n", "b.md": "# B\n\nbravo\n", "c.md": "# C\n\ncharlie\n"})
    env.ok("collection", "add", str(notes), "--name", "notes")
    eventually(lambda: settled(watching, "notes"), what="the watch of notes")

    (notes / "a.md").write_text("# A\n\nalpha edited with a quokka\n")
    (notes / "b.md").unlink()
    eventually(
        lambda: paths_for(watching, "quokka") == ["a.md"] and not paths_for(watching, "bravo"),
        what="the watcher indexing the edit and the deletion",
    )

    [report] = env.json("update", "--json")["collections"]
    assert set(report) == REPORT_KEYS
    assert (report["new"], report["updated"], report["removed"]) == (0, 1, 1), report
    assert (report["discovered"], report["unchanged"], report["skipped"]) == (2, 2, [])
    assert (report["watcher"]["updated"], report["watcher"]["removed"]) == (1, 1), report["watcher"]
    assert report["loaded"] >= 1 and report["watcher_line"].startswith("of which the watcher indexed 0 new, 1 updated")

    # Reported once: the next update counts from here, and says so in the seed's words.
    out = env.ok("update")
    assert "Indexed: 0 new, 0 updated, 2 unchanged, 0 removed · discovered 2 · loaded 0 · skipped 0" in out
    assert "watcher indexed" not in out


def test_update_json_is_the_http_report_and_counts_each_run(env: Env, daemon: Daemon, notes: Path) -> None:
    env.ok("collection", "add", str(notes), "--name", "notes")
    (notes / "fundraising.md").write_text("# Raising a seed round\n\nAngels, edited.\n")
    (notes / "ideas.md").unlink()
    (notes / "new.md").write_text("# New\n\nfresh\n")
    write(notes, {"broken.md": b"\xff\xfe not utf-8 \x00"})

    env.ok("collection", "update-cmd", "notes", "echo", "hook-said-hi")
    r = env.qmd("update", "--json")
    assert r.returncode == 0 and "hook-said-hi" in r.stderr, r.stderr  # stdout is the JSON alone
    cli = json.loads(r.stdout)
    [report] = cli["collections"]
    assert set(report) == REPORT_KEYS
    assert (report["new"], report["updated"], report["removed"]) == (1, 1, 1)
    assert report["discovered"] == len(NOTES) + 1 and report["loaded"] == 2
    assert [s["path"] for s in report["skipped"]] == ["broken.md"] and report["skipped"][0]["reason"]
    assert report["watcher"] == {"passes": 0, "new": 0, "updated": 0, "removed": 0, "loaded": 0}
    assert report["watcher_line"] is None

    again = job_report(daemon, "/v1/update", {})
    assert set(again) == set(cli) and set(again["collections"][0]) == REPORT_KEYS  # one shape on both
    assert (again["collections"][0]["new"], again["collections"][0]["updated"]) == (0, 0)
    assert again["collections"][0]["since"] >= report["since"]


def test_update_and_embed_errors_are_clean(env: Env, daemon: Daemon, notes: Path) -> None:
    env.ok("collection", "add", str(notes), "--name", "notes")
    r = env.qmd("update", "--json", "-c", "nope")
    assert r.returncode == 1 and "nope" in r.stderr and "Traceback" not in r.stderr and r.stdout == ""
    r = env.qmd("embed", "--follow", "-c", "notes")
    assert r.returncode == 2 and "--follow starts nothing" in r.stderr
    r = env.qmd("embed", "--follow")
    assert r.returncode == 0 and r.stdout == "No embed is running.\n", r.stdout
    assert env.json("embed", "--follow", "--json") is None


def test_library_update_reports_since_the_last_report(tmp_path: Path, notes: Path) -> None:
    with qmd.open(tmp_path / "i.sqlite", collections={"notes": {"path": str(notes)}}) as index:
        [first] = index.update().collections
        assert (first.new, first.discovered, first.loaded) == (len(NOTES), len(NOTES), len(NOTES))
        (notes / "ideas.md").unlink()
        [second] = index.update().collections
        assert (second.new, second.removed, second.unchanged, second.loaded) == (0, 1, len(NOTES) - 1, 0)
        assert second.since >= first.since and second.watcher.passes == 0


@pytest.mark.slow
def test_embed_json_counters(env: Env, notes: Path) -> None:
    env.vars["QMD_EMBED_MODEL"] = str(minilm())
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    try:
        env.ok("collection", "add", str(notes), "--name", "notes")
        first = env.json("embed", "--json")
        assert first["documents"] == len(NOTES) and first["chunks"] == first["embedded"] > 0
        assert (first["skipped"], first["reused"], first["truncated_count"], first["pending_after"]) == (0, 0, 0, 0)
        assert first["line"].startswith(
            f"Embedded: documents {len(NOTES)} · chunks {first['chunks']} · embedded {first['embedded']} · "
            "skipped 0 · reused 0 · clipped 0"
        )

        (notes / "ideas.md").write_text("# Ideas\n\nA startup that sells sourdough to investors.\n")
        env.ok("update")
        text = env.ok("embed")
        assert text.startswith("✓ Embedded: documents 1 · chunks 1 · embedded 1 · skipped 0"), text
        assert job_report(d, "/v1/embed", {})["line"].startswith("Embedded: documents 0 · chunks 0 · embedded 0")
        last = env.json("embed", "--follow", "--json")  # nothing runs: the last report, as sent
        assert last["documents"] == 0 and set(last) == set(first)
    finally:
        d.stop()


@pytest.mark.slow
def test_collection_add_announces_background_embedding_and_follow_reports_it(env: Env, notes: Path) -> None:
    env.vars.update({**FAST, "QMD_EMBED_MODEL": str(minilm())})
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    try:
        out = env.ok("collection", "add", str(notes), "--name", "notes")
        assert f"Embedding {len(NOTES)} documents in the background with {minilm()}: " in out, out
        assert "'qmd embed --follow' follows it" in out

        # Followed to its end, or (on a fast machine) over already: its report either way.
        r = env.qmd("embed", "--follow", timeout=280)
        assert r.returncode == 0, r.stderr
        assert f"Embedded: documents {len(NOTES)} · chunks " in r.stdout, r.stdout
        st = d.http.get("/v1/status").json()
        assert st["embedding"] is None and st["vector"]["pending"] == 0
        last = d.http.get("/v1/embed/progress").json()
        assert last["last_source"] == "background" and last["last"]["documents"] == len(NOTES)
    finally:
        d.stop()


@pytest.mark.slow
def test_status_shows_a_running_embeds_rate_and_eta(env: Env, tmp_path: Path) -> None:
    """A folder of one-chunk notes large enough that an embed runs for seconds on 2 cores;
    the watcher is off, so `collection add` starts no embed and says none."""
    count = 800
    folder = write(
        tmp_path / "big", {f"n{i:03d}.md": f"# Note {i}\n\nSeed round {i} for a bakery.\n" for i in range(count)}
    )
    env.vars["QMD_EMBED_MODEL"] = str(minilm())
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    embed = None
    try:
        assert "Embedding" not in env.ok("collection", "add", str(folder), "--name", "big")
        assert d.http.post("/v1/embed/background", json={"collection": "big"}).json() == {
            "started": False,
            "documents": 0,
            "model": None,
            "reason": "the daemon does not embed this collection by itself",
        }
        embed = env.qmd_background("embed")

        def progressing() -> dict[str, Any] | None:
            run: dict[str, Any] | None = d.http.get("/v1/embed/progress").json()["running"]
            return run if run and run["documents_done"] else None

        run = eventually(progressing, timeout=200, what="the embed's first documents")
        assert run["source"] == "embed" and run["documents_total"] == count and run["collections"] is None
        line = next(x for x in env.ok("status").splitlines() if x.startswith("  Embedding: "))
        assert f"/{count} documents · " in line and " chunks/s · ETA " in line and "(qmd embed; " in line, line
    finally:
        if embed is not None:
            embed.send_signal(signal.SIGINT)
            embed.communicate(timeout=60)
        d.stop()


def test_embed_progress_is_on_http(daemon: Daemon) -> None:
    got = daemon.http.get("/v1/embed/progress")
    assert got.status_code == 200 and got.json() == {"running": None, "last_source": None, "last": None}
    assert daemon.http.post("/v1/embed/progress").status_code == 405
