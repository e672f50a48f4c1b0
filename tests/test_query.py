"""The hybrid query through the real daemon: grammar errors, stages and their reasons,
expansion and rerank with real small models, caching, budgets, explain, and the
retrieval floors on qmd's eval corpus."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EVAL_DIR, Daemon, Env, embedded_eval_and_notes

from qmd.server.search.relevance import KEYWORD_ONLY_HELD_KEYWORD

# Every test runs a real qmdd, most with the generate model: outside the fast run (-m "not slow").
pytestmark = pytest.mark.slow


def stages(answer: dict) -> dict[str, dict]:
    return {s["stage"]: s for s in answer["stages"]}


# -- without models: keyword search answers, and every missing stage says why ---------


def test_plain_query_without_models_answers_and_explains_itself(env: Env, daemon: Daemon, notes: Path) -> None:
    env.ok("collection", "add", str(notes), "--name", "notes")
    r = env.qmd("query", "angel investors", "--json")
    assert r.returncode == 0, r.stderr
    hits = json.loads(r.stdout)
    assert "fundraising.md" in hits[0]["file"]
    assert "expand: skipped" in r.stderr and "not downloaded (run 'qmd pull')" in r.stderr
    assert "vector: skipped" in r.stderr and "'qmd embed'" in r.stderr
    assert "rerank: skipped" in r.stderr
    answer = daemon.http.post("/v1/query", json={"query": "angel investors"}).json()
    st = stages(answer)
    assert st["probe"]["status"] == "ran"
    assert {st[k]["status"] for k in ("expand", "vector", "rerank")} == {"skipped"}
    assert [s["stage"] for s in answer["skipped"]] == ["expand", "vector", "rerank"]
    # without rerank the score is the fusion, first in the only list = 1.0
    assert answer["results"][0]["score"] == pytest.approx(1.0)
    assert answer["results"][0]["rerank"] is None


def test_index_yml_sets_a_default_budget_a_request_overrides(env: Env, daemon: Daemon, notes: Path) -> None:
    env.ok("collection", "add", str(notes), "--name", "notes")
    yml = env.config / "qmd" / "index.yml"
    yml.write_text(yml.read_text() + "query_budget_ms: 1500\n")
    assert daemon.http.post("/query", json={"query": "angel investors"}).json()["budgetMs"] == 1500
    assert daemon.http.post("/query", json={"query": "angel", "budgetMs": 9000}).json()["budgetMs"] == 9000
    assert daemon.http.post("/v1/query", json={"query": "angel"}).json()["budget_ms"] == 1500  # the CLI's route
    yml.write_text(yml.read_text().replace("query_budget_ms: 1500", "query_budget_ms: soon"))
    r = daemon.http.post("/query", json={"query": "angel"})
    assert r.status_code == 400 and "query_budget_ms must be a whole number of milliseconds" in r.json()["error"]


def test_typed_document_and_explain(env: Env, daemon: Daemon, notes: Path) -> None:
    env.ok("collection", "add", str(notes), "--name", "notes")
    r = env.qmd("query", "lex: sourdough\nlex: flour water", "--explain", "--no-rerank")
    assert r.returncode == 0, r.stderr
    assert "cooking/bread.md" in r.stdout
    assert "Explain: fts=[" in r.stdout and "RRF: total=" in r.stdout and "Top RRF contributions: fts/lex#1" in r.stdout
    assert "keyword: ran" in r.stderr and "total:" in r.stderr
    assert "rerank: off - not requested (--no-rerank" in r.stderr
    body = daemon.http.post(
        "/query", json={"searches": [{"type": "lex", "query": "sourdough"}], "explain": True, "rerank": False}
    ).json()
    ex = body["results"][0]["explain"]
    assert ex["rrf"]["contributions"][0]["queryType"] == "lex"
    assert ex["rrf"]["contributions"][0]["weight"] == 2.0  # the first sub-query weighs double
    assert ex["blendedScore"] == pytest.approx(body["results"][0]["score"], abs=1e-3)
    # typed lines keep the fusion's score; no embedder: relevance from the keyword terms alone
    assert ex["scoredBy"] == "fusion" and "Blend: 100%*" in r.stdout and "Score: relevance" not in r.stdout
    assert [t["name"] for t in ex["relevance"]["terms"]] == ["held_keyword", "held_standout_keyword", "held"]
    assert ex["relevance"]["probability"] == pytest.approx(body["results"][0]["relevance"], abs=0.01)  # rounded
    assert f"  Relevance: logistic({KEYWORD_ONLY_HELD_KEYWORD:g}*" in r.stdout


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("expand: a\nlex: b", "Line 1 starts with expand:, but query documents cannot mix expand with typed lines"),
        ("lex: a\nintent: x\nintent: y", "Line 3: only one intent: line is allowed per query document."),
        ("lex: a\nplain words", "Line 2 is missing a lex:/vec:/hyde:/intent: prefix."),
        ("intent: x", "intent: cannot appear alone. Add at least one lex:, vec:, or hyde: line."),
        ('lex: "unclosed', 'Line 1 (lex): Lex query has an unmatched double quote (").'),
        ("vec: money -bread", "Line 1 (vec): Negation (-term) is not supported in vec/hyde queries."),
    ],
)
def test_grammar_errors_are_clear_and_change_nothing(env: Env, daemon: Daemon, text: str, message: str) -> None:
    r = env.qmd("query", text)
    assert r.returncode == 1
    assert message in r.stderr and "Traceback" not in r.stderr
    resp = daemon.http.post("/query", json={"query": text})
    assert resp.status_code == 400 and message in resp.json()["error"]


def test_http_query_needs_exactly_one_form(daemon: Daemon) -> None:
    both = daemon.http.post("/query", json={"query": "a", "searches": [{"type": "lex", "query": "a"}]})
    neither = daemon.http.post("/query", json={"limit": 3})
    assert both.status_code == 400 and "'query' and 'searches' are mutually exclusive" in both.text
    assert neither.status_code == 400 and "provide either 'query'" in neither.text
    bad = daemon.http.post("/query", json={"query": "a", "budgetMs": 0})
    assert bad.status_code == 400 and "budgetMs" in bad.text


# -- with real models ---------------------------------------------------------------


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory, gemma_model: Path) -> Iterator[tuple[Env, Daemon]]:
    """Eval corpus + notes, embedded with MiniLM; Gemma 270M expands and reranks (query
    likelihood: twice as fast as SmolLM2 here, and one model loaded for both roles)."""
    env, d = embedded_eval_and_notes(
        tmp_path_factory.mktemp("hybrid"), QMD_GENERATE_MODEL=str(gemma_model), QMD_RERANK_MODEL=str(gemma_model)
    )
    yield env, d
    d.stop()


def test_full_pipeline_then_cache(hybrid: tuple[Env, Daemon]) -> None:
    env, d = hybrid
    q = {"query": "teams that fail to agree on a leader", "collections": ["eval"], "explain": True}
    q |= {"rerank": True, "expand": True}
    first = d.http.post("/v1/query", json=q).json()
    st = stages(first)
    assert st["expand"]["status"] == "ran", st["expand"]
    assert st["vector"]["status"] == "ran" and st["rerank"]["status"] == "ran", first["stages"]
    assert "query-likelihood" in st["rerank"]["detail"]
    assert first["skipped"] == []
    assert all(e["type"] in ("lex", "vec", "hyde") for e in first["expansion"])
    assert any("distributed-systems-overview.md" in h["file"] for h in first["results"][:3])
    top = first["results"][0]
    assert 0 <= top["rerank"] <= 1 and 0 < top["fusion"] <= 1
    assert top["explain"]["rerankRaw"] < 0  # a mean log-probability
    second = d.http.post("/v1/query", json=q).json()
    st2 = stages(second)
    assert st2["expand"]["status"] == "cached"
    assert "0 scored" in st2["rerank"]["detail"]
    assert [h["file"] for h in second["results"]] == [h["file"] for h in first["results"]]
    # `update` keeps the model cache (the original wiped it, §26)
    env.ok("update")
    third = d.http.post("/v1/query", json=q).json()
    assert stages(third)["expand"]["status"] == "cached"
    # Unasked, a general model's expansion does not run (it measured no gain), and says so.
    plain = stages(d.http.post("/v1/query", json={**q, "expand": None}).json())
    assert plain["expand"]["status"] == "off" and "not run by default" in plain["expand"]["detail"], plain


def test_cli_query_and_deep_search_alias(hybrid: tuple[Env, Daemon]) -> None:
    env, _ = hybrid
    r = env.qmd("query", "how do I raise money for a startup", "-c", "eval", "-n", "3", "--json")
    assert r.returncode == 0, r.stderr
    hits = json.loads(r.stdout)
    assert len(hits) == 3 and "startup-fundraising-memo.md" in hits[0]["file"]
    assert {"score", "fusion", "rerank", "lines", "docid"} <= set(hits[0])
    assert "reranks by query-likelihood" in env.ok("doctor")
    r2 = env.qmd("deep-search", "lex: fundraising\nvec: how do startups raise a seed round", "-c", "eval", "--files")
    assert r2.returncode == 0 and "startup-fundraising-memo.md" in r2.stdout.splitlines()[0]


def test_tiny_budget_drops_stages_in_order_and_still_answers(hybrid: tuple[Env, Daemon]) -> None:
    env, d = hybrid
    q = "which policy covers working from home"  # an intent turns the strong-signal skip off
    body = {"query": q, "intent": "remote employees", "budget_ms": 1, "collections": ["eval"]}
    body |= {"rerank": True, "expand": True}
    answer = d.http.post("/v1/query", json=body).json()
    st = stages(answer)
    assert answer["results"], "keyword search always answers"
    for stage in ("expand", "rerank", "vector"):
        assert st[stage]["status"] == "skipped" and "budget" in st[stage]["detail"], st[stage]
    r = env.qmd("query", q, "-c", "eval", "--budget-ms", "1", "--intent", "remote employees", "--rerank", "--expand")
    assert r.returncode == 0 and "remote-work-policy.md" in r.stdout
    assert "expand: skipped" in r.stderr and "budget" in r.stderr


def test_budget_spends_on_vectors_before_rerank_and_expansion(hybrid: tuple[Env, Daemon]) -> None:
    _, d = hybrid
    # ~150 ms fits a query embedding and a KNN, never a 270M expansion or a rerank pass
    body = {"query": "nodes that cannot elect a coordinator", "intent": "consensus", "budget_ms": 150}
    body |= {"rerank": True, "expand": True}
    answer = d.http.post("/v1/query", json={**body, "collections": ["eval"]}).json()
    st = stages(answer)
    assert st["expand"]["status"] == "skipped" and "budget" in st["expand"]["detail"]
    assert st["vector"]["status"] == "ran"
    assert st["rerank"]["status"] in ("skipped", "partial")
    assert answer["elapsed_ms"] < 1000


def test_identifiers_double_the_keyword_weight(hybrid: tuple[Env, Daemon]) -> None:
    _, d = hybrid
    answer = d.http.post(
        "/v1/query", json={"query": "release 2026.4.10 memory", "explain": True, "rerank": False}
    ).json()
    assert "meeting-2026-04-10.md" in answer["results"][0]["file"]
    fts = [c for c in answer["results"][0]["explain"]["rrf"]["contributions"] if c["source"] == "fts"]
    assert fts[0]["weight"] == 4.0
    assert "identifier-like 2026.4.10: keyword weight doubled" in stages(answer)["probe"]["detail"]


def test_mcp_default_budget_and_stages(hybrid: tuple[Env, Daemon]) -> None:
    _, d = hybrid
    from qmd.server.http.wire import McpQueryArgs

    DEFAULT_BUDGET_MS = McpQueryArgs.model_fields["budget_ms"].default
    answer = d.http.post("/query", json={"query": "how do I raise money for a startup", "budgetMs": DEFAULT_BUDGET_MS})
    body = answer.json()
    assert answer.status_code == 200 and body["elapsedMs"] < DEFAULT_BUDGET_MS + 1500
    assert body["budgetMs"] == DEFAULT_BUDGET_MS
    assert {s["stage"] for s in body["stages"]} >= {"probe", "expand", "vector", "fuse", "rerank"}


def hit_rates(d: Daemon, queries: list[dict], body: dict) -> dict[str, float]:
    rows: dict[str, list[int]] = {}
    for q in queries:
        r = d.http.post("/v1/query", json={"query": q["query"], "limit": 5, "collections": ["eval"], **body})
        assert r.status_code == 200, r.text
        files = [h["file"].lower() for h in r.json()["results"]]
        rank = next((i for i, f in enumerate(files) if q["expected_doc_substring"] in f), None)
        row = rows.setdefault(q["difficulty"], [0, 0, 0])
        row[0] += rank is not None and rank < 3
        row[1] += rank is not None and rank < 5
        row[2] += 1
    non_fusion = [v for k, v in rows.items() if k != "fusion"]
    return {
        "easy_hit@3": rows["easy"][0] / rows["easy"][2],
        "medium_hit@3": rows["medium"][0] / rows["medium"][2],
        "hard_hit@5": rows["hard"][1] / rows["hard"][2],
        "fusion_hit@3": rows["fusion"][0] / rows["fusion"][2] if "fusion" in rows else 1.0,
        "overall_hit@3_non_fusion": sum(v[0] for v in non_fusion) / sum(v[2] for v in non_fusion),
    }


def test_hybrid_floors_on_eval(hybrid: tuple[Env, Daemon]) -> None:
    """At least the original's hybrid floors, and never below the better single leg."""
    _, d = hybrid
    spec = json.loads((EVAL_DIR / "queries.json").read_text())
    floors = spec["thresholds_in_upstream_tests"]["hybrid_rrf"]
    queries = spec["eval_queries"]
    lex = hit_rates_typed(d, queries, "lex")
    vec = hit_rates_typed(d, queries, "vec")
    full = hit_rates(d, queries, {"rerank": True, "expand": True})
    norerank = hit_rates(d, queries, {"rerank": False, "expand": True})
    print("\nhybrid query on qmd-eval (MiniLM + Gemma 270M expansion and QL rerank):")
    print(f"  {'':<26}{'bm25':>7}{'vec':>7}{'fused':>7}{'+rerank':>8}   floor")
    for k in floors:
        if k == "note":
            continue
        print(f"  {k:<26}{lex[k]:7.0%}{vec[k]:7.0%}{norerank[k]:7.0%}{full[k]:8.0%}   {floors[k]:.0%}")
    for k in floors:
        if k == "note":
            continue
        for name, rates in (("fused", norerank), ("fused+rerank", full)):
            assert rates[k] >= floors[k], f"{name} {k} = {rates[k]:.0%} below the floor {floors[k]:.0%}"
            assert rates[k] >= max(lex[k], vec[k]), f"{name} {k} = {rates[k]:.0%} below a single leg"


def hit_rates_typed(d: Daemon, queries: list[dict], kind: str) -> dict[str, float]:
    typed = [{**q, "query": f"{kind}: {q['query']}"} for q in queries]
    return hit_rates(d, typed, {"rerank": False})
