"""Embeds scheduled, not starved or serialized (issue 35): a real `qmdd` with the real MiniLM
embedder and its real worker.

What must hold: a steady stream of searches from several clients slows `qmd embed` but never
stops it (the background lane's guaranteed turn); a user's `qmd embed -c small` runs ahead of
the watcher's background embed of a big collection, saying that it waits for a slice boundary,
and finishes long before it; a model that crashes the worker twice the same way is loaded
again with safe settings, the embed job sends its batch again instead of failing, and
`qmd doctor` says what happened in words.

The figures (rows/s alone and under 8 query clients) are printed with `-s`:
`.venv/bin/python -m pytest tests/test_embed_schedule.py -k stream -s`.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import MODELS_DIR, NOTES, require, write
from harness import Daemon, Env
from test_watcher import FAST, eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WORDS = "river stone cloud market engine garden ledger signal harbor forest lantern meadow copper bread".split()


@pytest.fixture
def minilm() -> Path:
    return require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM test embedder (../shared/models)")


def notes(folder: Path, count: int, seed: int) -> Path:
    """`count` one-chunk notes of random words."""
    rng = random.Random(seed)
    return write(
        folder, {f"n{i:04d}.md": f"# Note {i}\n\n{' '.join(rng.choices(WORDS, k=40))}\n" for i in range(count)}
    )


def pending(d: Daemon, collection: str) -> int:
    by_name = {c["name"]: c for c in d.http.get("/v1/status").json()["collections"]}
    return int(by_name[collection]["watch"]["pending_vectors"])


def rows(d: Daemon) -> int:
    return int(d.http.get("/v1/status").json()["vector"]["embedded_chunks"])


class Searchers:
    """`n` clients each sending vector searches (a query embedding each) back to back."""

    def __init__(self, env: Env, n: int) -> None:
        self.stop = threading.Event()
        self.answered = 0
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(env.url, i)) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, url: str, i: int) -> None:
        rng = random.Random(i)
        with httpx.Client(base_url=url, timeout=120) as http:
            while not self.stop.is_set():
                query = " ".join(rng.choices(WORDS, k=4)) + f" {rng.random()}"  # never the same: no cache hit
                r = http.post("/v1/vector", json={"query": query})
                if r.status_code != 200:
                    self.errors.append(r.text)
                self.answered += 1

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


def test_an_embed_progresses_under_a_stream_of_searches(env: Env, tmp_path: Path, minilm: Path) -> None:
    count, clients = 120, 8
    env.vars["QMD_EMBED_MODEL"] = str(minilm)
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    searchers = None
    try:
        env.ok("collection", "add", str(notes(tmp_path / "alone", count, 1)), "--name", "alone")
        d.http.post("/v1/vector", json={"query": "warm the model"})
        started = time.monotonic()
        env.ok("embed", timeout=600)
        alone = count / (time.monotonic() - started)
        env.ok("collection", "add", str(notes(tmp_path / "loaded", count, 2)), "--name", "loaded")

        searchers = Searchers(env, clients)
        time.sleep(3)  # the stream is steady before the embed starts
        started = time.monotonic()
        embed = env.qmd_background("embed")
        eventually(lambda: rows(d) > count, 120, "rows written while 8 clients search")
        first_rows_s = time.monotonic() - started
        _, err = embed.communicate(timeout=400)
        took = time.monotonic() - started
        assert embed.returncode == 0, err
        answered = searchers.answered
        searchers.close()
        assert not searchers.errors, searchers.errors[:3]
        print(
            f"\nembed of {count} one-chunk notes with MiniLM: {alone:.1f} rows/s alone; {count / took:.1f} rows/s "
            f"under {clients} search clients ({answered} searches answered meanwhile, first rows after "
            f"{first_rows_s:.1f} s, done in {took:.1f} s)"
        )
        assert rows(d) == 2 * count
    finally:
        if searchers is not None:
            searchers.close()
        d.stop()


def test_a_users_embed_runs_ahead_of_a_background_embed(env: Env, tmp_path: Path, minilm: Path) -> None:
    env.vars.update({**FAST, "QMD_EMBED_MODEL": str(minilm)})
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    try:
        out = env.ok("collection", "add", str(notes(tmp_path / "big", 1500, 2)), "--name", "big")
        assert "Embedding 1500 documents in the background" in out, out

        def background() -> dict[str, Any] | None:
            run: dict[str, Any] | None = d.http.get("/v1/embed/progress").json()["running"]
            return run if run and run["source"] == "background" and run["documents_done"] else None

        eventually(background, 180, "the background embed of big to get going")
        env.ok("collection", "add", str(notes(tmp_path / "small", 10, 3)), "--name", "small")
        started = time.monotonic()
        r = env.qmd("embed", "-c", "small", timeout=300)
        took = time.monotonic() - started
        assert r.returncode == 0, r.stderr
        assert "waiting for the background embed of 'big' to reach a slice boundary" in r.stderr, r.stderr
        assert "documents 10" in r.stdout, r.stdout
        left = pending(d, "big")
        assert left > 500, f"small was embedded in {took:.1f} s, with {left} of big's documents still pending"
        assert pending(d, "small") == 0
        eventually(lambda: background() is not None, 60, "the background embed of big to go on afterwards")
    finally:
        d.stop()


def test_follow_shows_what_the_running_embed_says(env: Env, tmp_path: Path, minilm: Path) -> None:
    """`qmd embed --follow` shows the running embed's notices, as the embed's own stream does:
    here the background embed's model crashing the worker, and its batch sent again."""
    env.vars.update({**FAST, "QMD_EMBED_MODEL": str(minilm), "QMD_TEST_WORKER_FAULT": "crash:MiniLM"})
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    try:
        out = env.ok("collection", "add", str(notes(tmp_path / "big", 1500, 5)), "--name", "big")
        assert "Embedding 1500 documents in the background" in out, out
        eventually(lambda: d.http.get("/v1/embed/progress").json()["running"], 60, "the background embed")
        r = env.qmd("embed", "--follow", timeout=600)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert "crashed (SIGSEGV) while " in r.stderr and r.stderr.count("again (try 2 of 3)") == 1, r.stderr
        assert pending(d, "big") == 0
    finally:
        d.stop()


def test_a_model_that_crashes_the_worker_twice_is_reloaded_safely(env: Env, tmp_path: Path, minilm: Path) -> None:
    """The child's own fault: SIGSEGV on loading MiniLM unless with safe settings, as AMX repacking does."""
    env.vars.update({"QMD_EMBED_MODEL": str(minilm), "QMD_TEST_WORKER_FAULT": "crash:MiniLM"})
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    try:
        env.ok("collection", "add", str(write(tmp_path / "notes", NOTES)), "--name", "notes")
        r = env.qmd("embed", timeout=300)
        assert r.returncode == 0, r.stderr
        assert "crashed (SIGSEGV) while " in r.stderr and "again (try 2 of 3)" in r.stderr, r.stderr
        assert "it is loaded next time without CPU repack buffers" in r.stderr, r.stderr
        assert "0 pending" in r.stdout or f"documents {len(NOTES)}" in r.stdout, r.stdout
        doctor = env.ok("doctor")
        line = next(x for x in doctor.splitlines() if "crashed the worker" in x)
        assert f"the embed model {minilm.name} crashed the worker with SIGSEGV at " in line, line
        assert f"; {minilm.name} crashed it 2 times: it is loaded next time without CPU repack" in line
        assert "(2 times)" not in line  # said once
        assert "{" not in line, "in words, not a dict"
        assert not d.http.post("/v1/vector", json={"query": "sourdough bread"}).json()["degraded"]
    finally:
        d.stop()
