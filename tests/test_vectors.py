"""Embeddings and vector search through the real daemon with the real MiniLM GGUF."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EVAL_DIR, MODELS_DIR, NOTES, Daemon, Env, require, write

# Every test runs a real qmdd with the embedder: integration, outside the fast run (-m "not slow").
pytestmark = pytest.mark.slow

MODEL = "all-MiniLM-L6-v2-Q8_0.gguf"


@pytest.fixture(scope="module")
def model() -> Path:
    return require(MODELS_DIR / MODEL, "the MiniLM test embedder (../shared/models)")


def start(env: Env, model: Path, name: str = MODEL) -> Daemon:
    env.vars["QMD_EMBED_MODEL"] = str(model.parent / name)
    return Daemon(env)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Iterator[tuple[Env, Daemon]]:
    """Eval corpus + notes, embedded once for the read-only tests."""
    env = Env(tmp_path_factory.mktemp("vec"))
    d = start(env, model)
    env.ok("collection", "add", str(require(EVAL_DIR / "docs", "eval corpus")), "--name", "eval")
    env.ok("collection", "add", str(write(env.base / "notes", NOTES)), "--name", "notes")
    out = env.ok("embed")
    assert "0 pending" in out
    yield env, d
    d.stop()


def test_before_embedding_everything_is_announced(env: Env, model: Path, notes: Path) -> None:
    d = start(env, model)
    try:
        env.ok("collection", "add", str(notes), "--name", "notes")
        r = env.qmd("vsearch", "who funds startups")
        assert r.returncode == 0
        assert "vector search unavailable — 4 documents pending (run 'qmd embed')" in r.stderr
        assert "showing keyword results instead" in r.stderr
        assert "vector search unavailable — 4 documents pending" in env.ok("status")
        body = d.http.post("/query", json={"searches": [{"type": "vec", "query": "who funds startups"}]}).json()
        assert body["skipped"][0]["stage"] == "vector" and "4 documents pending" in body["skipped"][0]["reason"]
    finally:
        d.stop()


def test_vsearch_returns_pointers(embedded: tuple[Env, Daemon]) -> None:
    env, _ = embedded
    hits = env.json("vsearch", "how do I raise money for my company", "--json", "-c", "eval")
    assert "startup-fundraising-memo.md" in hits[0]["file"]
    assert 0.3 <= hits[0]["score"] <= 1.0
    start_line, end_line = map(int, hits[0]["lines"].split("-"))
    body = (EVAL_DIR / "docs" / "startup-fundraising-memo.md").read_text().split("\n")
    snippet_lines = hits[0]["snippet"].split("\n")[1:]
    assert snippet_lines == body[start_line - 1 : end_line][: len(snippet_lines)]


def test_vsearch_scores_and_min_score(embedded: tuple[Env, Daemon]) -> None:
    env, d = embedded
    raw = d.http.post("/v1/vector", json={"query": "sourdough bread baking", "limit": 3, "min_score": 0}).json()
    assert raw["results"][0]["path"] == "cooking/bread.md"
    scores = [h["score"] for h in raw["results"]]
    assert scores == sorted(scores, reverse=True) and all(-1 <= s <= 1 for s in scores)
    assert env.ok("vsearch", "sourdough", "--min-score", "0.99") == "No results found above minimum score threshold.\n"


def test_query_runs_vec_and_hyde(embedded: tuple[Env, Daemon]) -> None:
    _, d = embedded
    body = d.http.post(
        "/query",
        json={
            "searches": [
                {"type": "vec", "query": "how do teams decide who leads in a cluster"},
                {"type": "hyde", "query": "The leader is elected by a majority of votes among the nodes."},
            ],
            "rerank": False,
        },
    ).json()
    assert [s["stage"] for s in body["skipped"]] == []
    assert "distributed-systems" in body["results"][0]["file"]


def test_vector_floors_on_eval(embedded: tuple[Env, Daemon]) -> None:
    env, d = embedded
    spec = json.loads((EVAL_DIR / "queries.json").read_text())
    floors = spec["thresholds_in_upstream_tests"]["vector"]
    rates: dict[str, list[int]] = {}
    for q in spec["eval_queries"]:
        r = d.http.post("/v1/vector", json={"query": q["query"], "limit": 5, "collections": ["eval"]}).json()
        files = [h["file"].lower() for h in r["results"]]
        rank = next((i for i, f in enumerate(files) if q["expected_doc_substring"] in f), None)
        row = rates.setdefault(q["difficulty"], [0, 0, 0])
        row[0] += rank is not None and rank < 3
        row[1] += rank is not None and rank < 5
        row[2] += 1
    figures = {
        "easy_hit@3": rates["easy"][0] / rates["easy"][2],
        "medium_hit@3": rates["medium"][0] / rates["medium"][2],
        "hard_hit@5": rates["hard"][1] / rates["hard"][2],
        "overall_hit@3": sum(v[0] for v in rates.values()) / sum(v[2] for v in rates.values()),
    }
    print("\nvector search (MiniLM) on qmd-eval, ours vs upstream floor:")
    for k, v in figures.items():
        print(f"  {k:<14} {v:6.1%}   floor {floors[k]:.0%}")
    for k, v in figures.items():
        assert v >= floors[k], f"{k} = {v:.1%} below the floor {floors[k]:.0%}"


def test_incremental_shared_content_rename(env: Env, model: Path, notes: Path, tmp_path: Path) -> None:
    d = start(env, model)
    try:
        env.ok("collection", "add", str(notes), "--name", "notes")
        assert "from 4 documents" in env.ok("embed")
        assert "Embedded 0 chunks from 0 documents" in env.ok("embed")
        (notes / "ideas.md").write_text("# Ideas\n\nA bakery that delivers croissants by drone.\n")
        env.ok("update")
        assert "1 documents pending" in env.ok("status")
        assert "from 1 documents" in env.ok("embed")
        twin = write(tmp_path / "twin", {"copy.md": NOTES["cooking/bread.md"]})
        env.ok("collection", "add", str(twin), "--name", "twin")
        # Content embedded already is searchable in its new collection as soon as it is
        # indexed: nothing is pending, so no `qmd embed` would ever add it.
        assert "nothing pending" in env.ok("status")
        assert [h["file"] for h in env.json("vsearch", "sourdough bread", "--json", "-c", "twin")] == [
            "qmd://twin/copy.md"
        ]
        assert "Embedded 0 chunks from 0 documents" in env.ok("embed")  # same content: no new vectors
        env.ok("collection", "rename", "twin", "recipes")
        assert env.json("vsearch", "sourdough bread", "--json", "-c", "recipes")[0]["file"] == "qmd://recipes/copy.md"
        (notes / "cooking" / "bread.md").unlink()
        env.ok("update")
        files = [h["file"] for h in env.json("vsearch", "sourdough bread", "--json", "--min-score", "0")]
        assert "qmd://notes/cooking/bread.md" not in files and "qmd://recipes/copy.md" in files
    finally:
        d.stop()


def test_fingerprint_change_never_mixes(env: Env, model: Path, notes: Path) -> None:
    require(MODELS_DIR / "all-MiniLM-L6-v2-F16.gguf", "the F16 MiniLM")
    d = start(env, model)
    env.ok("collection", "add", str(notes), "--name", "notes")
    env.ok("embed")
    d.stop()
    d = start(env, model, "all-MiniLM-L6-v2-F16.gguf")
    try:
        assert "vector search unavailable — 4 documents pending" in env.ok("status")
        r = env.qmd("vsearch", "sourdough")
        assert "showing keyword results instead" in r.stderr
        assert "from 4 documents" in env.ok("embed")
        assert "nothing pending" in env.ok("status")
        assert env.json("vsearch", "sourdough bread", "--json")[0]["file"] == "qmd://notes/cooking/bread.md"
    finally:
        d.stop()


def _corpus(tmp_path: Path, n: int = 60) -> Path:
    para = "Distributed consensus keeps replicas in agreement even when nodes fail. " * 12
    return write(
        tmp_path / "big", {f"n{i:03}.md": f"# Note {i}\n\n{para}\n\n## Part two {i}\n\n{para}\n" for i in range(n)}
    )


def _wait_for_chunks(d: Daemon, at_least: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = d.http.get("/v1/status").json()
        if st["vector"]["embedded_chunks"] >= at_least:
            return st
        time.sleep(0.1)
    raise AssertionError("embedding made no progress")


def test_worker_crash_during_embed_keeps_daemon_and_work(env: Env, model: Path, tmp_path: Path) -> None:
    d = start(env, model)
    try:
        env.ok("collection", "add", str(_corpus(tmp_path)), "--name", "big")
        proc = env.qmd_background("embed")
        st = _wait_for_chunks(d, 10)
        os.kill(st["inference"]["pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1 and "crashed (SIGKILL)" in err, (out, err)
        assert "Traceback" not in err
        assert d.http.get("/health").status_code == 200
        assert env.json("search", "consensus", "--json")  # keyword search still answers
        done = d.http.get("/v1/status").json()["vector"]["embedded_chunks"]
        assert done >= 10
        out = env.ok("embed")  # the next request starts a new worker and resumes
        assert "0 pending" in out
        assert d.http.get("/v1/status").json()["inference"]["restarts"] >= 1
    finally:
        d.stop()


def test_daemon_killed_mid_embed_resumes(env: Env, model: Path, tmp_path: Path) -> None:
    d = start(env, model)
    env.ok("collection", "add", str(_corpus(tmp_path)), "--name", "big")
    proc = env.qmd_background("embed")
    _wait_for_chunks(d, 10)
    d.stop(signal.SIGKILL)
    proc.communicate(timeout=60)
    d = start(env, model)
    try:
        before = d.http.get("/v1/status").json()["vector"]
        assert before["embedded_chunks"] >= 10 and 0 < before["pending"] < 60
        out = env.ok("embed")
        assert f"from {before['pending']} documents" in out and "0 pending" in out
    finally:
        d.stop()


def test_ctrl_c_cancels_embed_cleanly(env: Env, model: Path, tmp_path: Path) -> None:
    d = start(env, model)
    try:
        env.ok("collection", "add", str(_corpus(tmp_path, 80)), "--name", "big")
        proc = env.qmd_background("embed")
        _wait_for_chunks(d, 5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Cancelled" in err and "Traceback" not in err
        time.sleep(3)  # the job stops at its next batch boundary
        first = d.http.get("/v1/status").json()["vector"]["embedded_chunks"]
        time.sleep(2)
        assert d.http.get("/v1/status").json()["vector"]["embedded_chunks"] == first  # it really stopped
        assert 0 < first < 160
        assert "0 pending" in env.ok("embed")  # and resumes
    finally:
        d.stop()


def test_force_one_collection_leaves_others(env: Env, model: Path, notes: Path, tmp_path: Path) -> None:
    d = start(env, model)
    try:
        other = write(tmp_path / "other", {"a.md": "# A\n\nalpha notes\n", "b.md": "# B\n\nbeta notes\n"})
        env.ok("collection", "add", str(notes), "--name", "notes")
        env.ok("collection", "add", str(other), "--name", "other")
        assert "from 6 documents" in env.ok("embed")
        assert "from 2 documents" in env.ok("embed", "-f", "-c", "other")
        assert "nothing pending" in env.ok("status")
        assert "from 6 documents" in env.ok("embed", "-f")
    finally:
        d.stop()


def test_worker_killed_between_queries_restarts(embedded: tuple[Env, Daemon]) -> None:
    env, d = embedded
    assert env.json("vsearch", "sourdough bread", "--json")  # the worker is up
    before = d.http.get("/v1/status").json()["inference"]
    os.kill(before["pid"], signal.SIGKILL)
    time.sleep(0.2)
    hits = env.json("vsearch", "sourdough bread", "--json")  # a fresh worker answers
    assert hits and hits[0]["file"] == "qmd://notes/cooking/bread.md"
    after = d.http.get("/v1/status").json()["inference"]
    assert after["pid"] != before["pid"] and after["restarts"] == before["restarts"] + 1


def test_vsearch_refuses_explain(embedded: tuple[Env, Daemon]) -> None:
    _, d = embedded
    r = d.http.post("/v1/vector", json={"query": "bread", "explain": True})
    assert r.status_code == 400 and "explain is not available for vector search" in r.json()["error"]
