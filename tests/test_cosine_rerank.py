"""Reranking by the embedder's cosine (`models.rerank: cosine`), through the real daemon with
the real MiniLM GGUF: what it scores, how it blends, what it needs, and the settings it
refuses. A contract module: it runs on Postgres too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EVAL_DIR, Daemon, Env, embedded_eval_and_notes, require

from qmd.server.errors import InvalidInput
from qmd.server.models.refs import CosineRef, ensure_local, resolve_model
from qmd.server.search.fusion import position_weight
from qmd.server.search.rerank import CosineScorer

pytestmark = pytest.mark.slow

QUERY = "teams that fail to agree on a leader"


def stages(answer: dict) -> dict[str, dict]:
    return {s["stage"]: s for s in answer["stages"]}


def vsearch_cosines(d: Daemon, text: str) -> dict[str, float]:
    """Each document's cosine to `text` as `vsearch` measured it: its score is 1/(1 + d), the
    cosine 1 − d."""
    vsearch = d.http.post("/v1/vector", json={"query": text, "limit": 100}).raise_for_status().json()
    return {h["file"]: 2 - 1 / h["score"] for h in vsearch["results"]}


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, Daemon]]:
    """Eval corpus + notes embedded with MiniLM; reranking by cosine, no generative model."""
    env, d = embedded_eval_and_notes(tmp_path_factory.mktemp("cosine"), QMD_RERANK_MODEL="cosine")
    yield env, d
    d.stop()


def test_scores_are_the_vector_searchs_own_and_blend_by_position(embedded: tuple[Env, Daemon]) -> None:
    """Each candidate's rerank raw score is its nearest chunk's cosine, of the very distance
    `vsearch` scores it by (bit for bit), clipped to [0, 1] for the blend; keyword-only
    candidates are scored too, since the cosine is looked up per candidate, not taken from
    the vector list."""
    _, d = embedded
    answer = d.http.post(
        "/v1/query", json={"query": QUERY, "explain": True, "limit": 40, "expand": False, "rerank": True}
    ).raise_for_status()
    body = answer.json()
    st = stages(body)["rerank"]
    assert st["status"] == "ran" and st["detail"].startswith("cosine: the embedder's similarity"), st
    assert body["skipped"] == []
    cosine = vsearch_cosines(d, QUERY)
    hits = body["results"]
    assert len(hits) == len(cosine) > 5  # every document is a candidate in so small a corpus
    for h in hits:
        ex = h["explain"]
        assert ex["rerankRaw"] == pytest.approx(cosine[h["file"]], abs=1e-4)
        assert h["rerank"] == pytest.approx(min(max(ex["rerankRaw"], 0.0), 1.0), abs=1e-4)
        w = position_weight(ex["rrf"]["rank"])
        assert h["score"] == pytest.approx(w * h["fusion"] + (1 - w) * h["rerank"], abs=1e-3)
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert "distributed-systems-overview.md" in hits[0]["file"]


def test_typed_query_and_intent_score_against_the_reranked_text(embedded: tuple[Env, Daemon]) -> None:
    """A typed document with no vec line, or an intent, reranks against a text no vector
    list embedded: it is embedded for the rerank stage, and the scores are its cosines."""
    _, d = embedded
    body = d.http.post(
        "/v1/query",
        json={
            "searches": [{"type": "lex", "query": "consensus"}],
            "intent": "leader election",
            "explain": True,
            "rerank": True,
        },
    ).raise_for_status()
    answer = body.json()
    assert stages(answer)["rerank"]["status"] == "ran", answer["stages"]
    text = "leader election\n\nconsensus"
    cosine = vsearch_cosines(d, text)
    assert answer["results"]
    for h in answer["results"]:
        assert h["explain"]["rerankRaw"] == pytest.approx(cosine[h["file"]], abs=1e-4)


def test_runs_when_asked_and_bench_full_runs_it(embedded: tuple[Env, Daemon]) -> None:
    """Unasked it does not run (it measured no gain), and says so; `--rerank` runs it,
    `--no-rerank` turns it off; `qmd bench -b full` runs it (no generative model needed)."""
    env, d = embedded
    unasked = stages(d.http.post("/v1/query", json={"query": QUERY}).json())["rerank"]
    assert unasked["status"] == "off" and "the embedder's cosine measured no gain" in unasked["detail"]
    off = d.http.post("/v1/query", json={"query": QUERY, "rerank": False}).json()
    assert stages(off)["rerank"]["detail"] == "not requested (--no-rerank / rerank: false)"
    r = env.qmd("query", QUERY, "--rerank", "--explain")
    assert r.returncode == 0, r.stderr
    assert "rerank: ran" in r.stdout + r.stderr and "cosine: the embedder's similarity" in r.stdout + r.stderr
    fixture = require(EVAL_DIR / "example.json", "eval fixture")
    report = env.json("bench", str(fixture), "-c", "eval", "-b", "hybrid", "-b", "full", "--json")
    assert {b["name"]: b["status"] for b in report["backends"]} == {"hybrid": "ran", "full": "ran"}
    means = {name: report["summary"][name]["means"]["ndcg_at_10"] for name in ("hybrid", "full")}
    assert means["full"] >= means["hybrid"] - 0.05, means


def test_without_vectors_it_is_skipped_and_says_why(tmp_path: Path, notes: Path) -> None:
    env = Env(tmp_path / "novec")
    env.vars.update(QMD_RERANK_MODEL="cosine")
    d = Daemon(env)
    try:
        env.ok("collection", "add", str(notes), "--name", "notes")
        answer = d.http.post("/v1/query", json={"query": "angel investors", "rerank": True}).json()
        st = stages(answer)["rerank"]
        assert st["status"] == "skipped" and "cosine scoring needs vectors" in st["detail"], st
        assert answer["results"] and answer["results"][0]["rerank"] is None
    finally:
        d.stop()


def test_settings(embedded: tuple[Env, Daemon]) -> None:
    """`cosine` is a rerank setting only, with no file to open; doctor says what it is."""
    assert isinstance(resolve_model("rerank", {}, {"QMD_RERANK_MODEL": " Cosine "}).ref, CosineRef)
    for role in ("embed", "generate"):
        with pytest.raises(InvalidInput, match=f"cosine is a rerank scorer .*not a {role} model"):
            resolve_model(role, {role: "cosine"})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="no model file"):
        ensure_local(CosineRef())
    assert CosineScorer.normalize([-0.2, 0.0, 0.5, 1.0000001]) == [0.0, 0.0, 0.5, 1.0]
    _, d = embedded
    doctor = d.http.get("/v1/doctor").raise_for_status().json()
    [row] = [m for m in doctor["models"] if m["role"] == "rerank"]
    assert row["uri"] == "cosine" and row["method"] == "cosine" and row["problem"] is None
    env, _ = embedded
    text = env.ok("doctor")
    assert "rerank: cosine (env) — reranks by the embedder's cosine: no model to load" in text
