"""`relevance`: each hybrid result's probability of being relevant, and the floor MCP agents
get by default. The math in process; the floor through a real daemon with the MiniLM
embedder, over HTTP, the CLI and the MCP SDK's client."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    MODELS_DIR,
    ROOT,
    Daemon,
    Env,
    embedded_eval_and_notes,
    embedded_install,
    eval_docs_dir,
    eval_spec,
    require,
)
from mcp import Client, types

import qmd
from qmd.defaults import AGENT_RELEVANCE_FLOOR
from qmd.server.http.mcp import TOOLS
from qmd.server.search import hybrid
from qmd.server.search.keyword import held_outside
from qmd.server.search.relevance import (
    ANCHORS,
    NO_STANDOUT,
    STANDOUT_DEPTH,
    W_KEYWORD,
    CosineScale,
    Evidence,
    Scales,
    Standout,
    relevance,
    standout,
    terms,
)

OFF_TOPIC = "how long should I boil an egg for a runny yolk"
ON_TOPIC = "Series A fundraising"


def everyday_questions() -> list[str]:
    """bench/data/offtopic_queries.txt: questions no notes of ours answer (a line each, `#` comments)."""
    lines = (ROOT / "bench" / "data" / "offtopic_queries.txt").read_text().splitlines()
    return [t for t in lines if t and t[0] != "#"]


def test_relevance_grows_with_each_kind_of_evidence() -> None:
    assert relevance(Evidence(0.2, 0.3)) < relevance(Evidence(0.6, 0.3)) < relevance(Evidence(0.6, 0.8))
    assert 0.0 < relevance(Evidence(0.0, 0.0)) < AGENT_RELEVANCE_FLOOR < relevance(Evidence(0.7, 0.9)) < 1.0
    # without vector evidence, keywords alone (a separate fit)
    assert relevance(Evidence(0.1, None)) < relevance(Evidence(0.5, None)) < relevance(Evidence(0.9, None))
    assert relevance(Evidence(0.9, None, standout([0.9], []))) > 0.5  # the only document the words match


def test_a_best_result_that_stands_out_is_likelier_relevant() -> None:
    """A question about something else finds many documents about as near as its best."""
    crowded = standout([0.5] * 10, [0.8] * 10)
    assert crowded.keyword == pytest.approx(0.0) and crowded.vector == pytest.approx(0.0)
    clear = standout([0.2, 0.5, 0.1], [0.3, 0.8, 0.2])  # any order
    assert clear.keyword == pytest.approx(0.5 - 0.3 / STANDOUT_DEPTH) and clear.vector == pytest.approx(0.8 - 0.25)
    assert relevance(Evidence(0.5, 0.8, crowded)) < relevance(Evidence(0.5, 0.8, clear))
    # the mean of the next STANDOUT_DEPTH at most
    deep = standout([1.0] + [0.5] * STANDOUT_DEPTH + [0.0] * 5, [])
    assert deep.keyword == pytest.approx(0.5) and deep.vector == 0.0
    assert standout([], []) == NO_STANDOUT
    # the documents a keyword list lacks matched nothing: 0 among the next nine; a vector list
    # holds the whole collection (up to its depth), so one of one has nothing to stand above
    assert standout([0.4], [0.6]) == Standout(keyword=pytest.approx(0.4), vector=0.0)
    assert standout([0.5, 0.4], []).keyword == pytest.approx(0.5 - 0.4 / STANDOUT_DEPTH)
    assert standout([], [-0.2, -0.3]).vector == pytest.approx(0.1)
    # keyword evidence alone reads the keyword standout, not the vector's
    assert relevance(Evidence(0.5, None, crowded)) < relevance(Evidence(0.5, None, clear))
    assert relevance(Evidence(0.5, None, Standout(0.3, 0.0))) == relevance(Evidence(0.5, None, Standout(0.3, 0.9)))


def test_a_question_the_index_holds_little_of_is_likelier_irrelevant() -> None:
    """`held` (lexical.Held): a cooking question asked of software docs matches a stray
    word, and the score leaves out the words no document holds; held says how much that was."""
    assert relevance(Evidence(0.9, 0.3, held=0.2)) < relevance(Evidence(0.9, 0.3, held=1.0))
    assert relevance(Evidence(0.9, 0.3)) == relevance(Evidence(0.9, 0.3, held=1.0))  # unread: all held
    assert relevance(Evidence(0.9, None, held=0.2)) < relevance(Evidence(0.9, None))  # keywords alone read it too


def test_a_keyword_match_stands_out_only_as_far_as_the_question_is_held() -> None:
    """Among six notes one stray word is the only keyword hit, so it stands out by the whole of
    its score; it matched a tenth of the question's idf. The standout is read times held."""
    alone = standout([0.84], [])  # "what documents do I need to rent an apartment": one note, one word
    stray, matched = Evidence(0.84, None, alone, held=0.07), Evidence(0.84, None, alone, held=0.9)
    assert relevance(stray) < AGENT_RELEVANCE_FLOOR < 0.5 < relevance(matched)
    summed, _ = terms(Evidence(0.5, 0.4, alone, held=0.5))
    read = {t.name: t for t in summed}["held_standout_keyword"]
    assert read.value == pytest.approx(0.84 * 0.5) and read.weight > 0
    with_vectors = [Evidence(0.84, 0.1, standout([0.84], [0.1, 0.05]), held=h) for h in (0.07, 0.9)]
    assert relevance(with_vectors[0]) < AGENT_RELEVANCE_FLOOR < relevance(with_vectors[1])


def test_a_cosine_scale_is_measured_once_per_embedder() -> None:
    calls: list[str] = []

    def embed(texts: list[str], kind: str) -> list[list[float]]:
        calls.append(kind)
        # each question points where its own answer does, and nowhere near the others'
        return [[1.0 if i == j else 0.1 for j in range(len(ANCHORS))] for i in range(len(texts))]

    scales = Scales()
    scale = scales.of("fp", embed)  # type: ignore[arg-type]
    assert scales.of("fp", embed) is scale and calls == ["query", "document"]  # type: ignore[arg-type]
    assert scale.related == pytest.approx(1.0) and 0 < scale.unrelated < 0.3
    assert scale(scale.unrelated) == pytest.approx(0.0) and scale(scale.related) == pytest.approx(1.0)
    assert CosineScale(related=0.5, unrelated=0.5)(0.7) == pytest.approx(0.2)  # a degenerate scale does not divide by 0


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, Daemon]]:
    env, d = embedded_eval_and_notes(tmp_path_factory.mktemp("relevance"))
    yield env, d
    d.stop()


def query(d: Daemon, text: str, **body: object) -> dict:
    r = d.http.post("/v1/query", json={"query": text, "collections": ["eval"], **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_every_hybrid_result_carries_its_relevance(embedded: tuple[Env, Daemon]) -> None:
    _, d = embedded
    on = query(d, ON_TOPIC)
    assert on["results"][0]["path"] == "startup-fundraising-memo.md"
    chances = [h["relevance"] for h in on["results"]]
    assert all(0.0 <= c <= 1.0 for c in chances) and chances[0] > 0.5
    off = query(d, OFF_TOPIC)
    assert off["results"] and off["results"][0]["relevance"] < AGENT_RELEVANCE_FLOOR  # no floor: every result
    assert off.get("closest") is None
    public = d.http.post("/query", json={"query": ON_TOPIC, "collections": ["eval"]}).json()
    assert public["results"][0]["relevance"] == pytest.approx(chances[0], abs=0.01)  # rounded as scores are


def test_a_plain_query_is_ranked_and_scored_by_relevance(embedded: tuple[Env, Daemon]) -> None:
    """Without a rerank, a plain query's order is its relevance's, and so is its score; typed
    lines keep the rank fusion's order and score (the fusion), which relevance was not fitted on."""
    _, d = embedded
    for text in (ON_TOPIC, OFF_TOPIC, "how do teams decide who leads a project"):
        hits = query(d, text, limit=10, rerank=False)["results"]
        assert len(hits) > 2
        assert [h["relevance"] for h in hits] == sorted((h["relevance"] for h in hits), reverse=True)
        assert all(h["score"] == pytest.approx(h["relevance"], abs=1e-4) for h in hits)
    typed = query(d, f"lex: fundraising\nvec: {ON_TOPIC}", limit=10, rerank=False)["results"]
    assert typed[0]["score"] == typed[0]["fusion"]


def test_explain_shows_what_the_score_is_and_the_terms_of_the_relevance(embedded: tuple[Env, Daemon]) -> None:
    """A plain query is ranked by its relevance: `--explain` says so (not a fusion/rerank blend
    whose sum would not be the score) and gives the logistic's terms, which add up to it."""
    env, d = embedded
    [top] = query(d, ON_TOPIC, limit=1, rerank=False, explain=True)["results"]
    ex = top["explain"]
    assert ex["scoredBy"] == "relevance" and ex["blendedScore"] == pytest.approx(top["score"], abs=1e-4)
    chance = ex["relevance"]
    names = ["keyword", "vector", "held_standout_keyword", "standout_vector", "held"]
    assert [t["name"] for t in chance["terms"]] == names
    logit = sum(t["weight"] * t["value"] for t in chance["terms"]) + chance["bias"]
    assert 1 / (1 + math.exp(-logit)) == pytest.approx(top["relevance"], abs=1e-3) == chance["probability"]
    r = env.qmd("query", "-c", "eval", "--no-rerank", "--explain", "-n", "1", ON_TOPIC)
    assert r.returncode == 0, r.stderr
    assert f"Score: relevance = {top['score']:.4f}" in r.stdout and "Blend:" not in r.stdout
    assert f"  Relevance: logistic({W_KEYWORD:g}*" in r.stdout and f") = {top['relevance']:.4f}" in r.stdout
    reranked = query(d, ON_TOPIC, limit=1, rerank=True, explain=True)["results"][0]["explain"]
    assert reranked["scoredBy"] in ("blend", "relevance")  # "relevance" when no reranker is configured


def test_a_floor_keeps_what_is_relevant_and_names_the_closest_when_nothing_is(embedded: tuple[Env, Daemon]) -> None:
    _, d = embedded
    on = query(d, ON_TOPIC, min_relevance=0.3)
    assert on["results"] and all(h["relevance"] >= 0.3 for h in on["results"]) and on.get("closest") is None
    off = query(d, OFF_TOPIC, min_relevance=AGENT_RELEVANCE_FLOOR)
    assert off["results"] == []
    assert off["closest"]["relevance"] < AGENT_RELEVANCE_FLOOR and off["closest"]["file"].startswith("qmd://eval/")
    bad = d.http.post("/v1/query", json={"query": ON_TOPIC, "min_relevance": 2})
    assert bad.status_code == 400 and "min_relevance" in bad.text


@pytest.fixture(scope="module")
def eval_alone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The eval notes in an index of their own, as the floor was measured on them."""
    _, d = embedded_install(tmp_path_factory.mktemp("eval-alone"), {"eval": eval_docs_dir()})
    yield d
    d.stop()


def test_the_agents_floor_on_the_eval_notes_alone(eval_alone: Daemon) -> None:
    """Issue 33's goal where a user's notes are indexed alone: the floor answers "nothing" to at
    least 80% of the everyday questions (bench/data/offtopic_queries.txt; it answers 142 of
    149 so, docs/benchmarks.md#relevance, and this holds 90%) and drops under 5% of the right
    first answers of all 49 questions, the 25 hard ones written without the notes' words
    included (it drops 2 of 47); of the 24 eval queries at most one is not answered right."""
    everyday = everyday_questions()
    answered = [t for t in everyday if query(eval_alone, t, limit=1, min_relevance=AGENT_RELEVANCE_FLOOR)["results"]]
    assert len(answered) <= 0.1 * len(everyday), answered
    spec = eval_spec()
    wrong, right, dropped = [], [], []
    for q in spec["eval_queries"] + spec["deep_research_queries"]:
        got = query(eval_alone, q["query"], limit=1, min_relevance=AGENT_RELEVANCE_FLOOR)
        first = got["results"][0] if got["results"] else got["closest"]
        if first["path"] in q["expected_files"]:
            right.append(q["query"])
            dropped += [] if got["results"] else [(q["query"], first["relevance"])]
        if q in spec["eval_queries"] and not (got["results"] and first["path"] in q["expected_files"]):
            wrong.append((q["query"], first["relevance"]))
    assert len(wrong) <= 1, wrong
    assert len(right) >= 45 and len(dropped) < 0.05 * len(right), dropped


def test_the_cli_says_nothing_is_above_the_floor(embedded: tuple[Env, Daemon]) -> None:
    env, _ = embedded
    r = env.qmd("query", "-c", "eval", "--min-relevance", str(AGENT_RELEVANCE_FLOOR), OFF_TOPIC)
    assert r.returncode == 0 and r.stdout.strip() == "No results found.", r.stdout
    assert f"no result above the relevance floor ({AGENT_RELEVANCE_FLOOR:g}); the closest: qmd://eval/" in r.stderr
    listed = env.qmd("query", "-c", "eval", "--json", ON_TOPIC)
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["relevance"] > 0.5
    bad = env.qmd("query", "--min-relevance", "1.5", ON_TOPIC)
    assert bad.returncode == 2 and "--min-relevance" in bad.stderr and "Traceback" not in bad.stderr


def mcp_query(d: Daemon, arguments: dict) -> types.CallToolResult:
    async def body() -> types.CallToolResult:
        async with Client(f"{d.env.url}/mcp", mode="legacy", read_timeout_seconds=60) as client:
            return await client.call_tool("query", arguments)

    return asyncio.run(body())


def test_agents_get_the_floor_by_default(embedded: tuple[Env, Daemon]) -> None:
    _, d = embedded
    assert f"(default {AGENT_RELEVANCE_FLOOR:g})" in (TOOLS["query"].definition.description or "")
    off = mcp_query(d, {"query": OFF_TOPIC, "collections": ["eval"]})
    text = off.content[0].text  # type: ignore[union-attr]
    assert not off.is_error and f"is above the relevance floor ({AGENT_RELEVANCE_FLOOR:g})" in text
    assert "qmd://eval/" in text and "(relevance 0.0" in text  # the closest, still named and numbered
    structured = off.structured_content or {}
    assert structured["results"] == [] and structured["closest"]["relevance"] < AGENT_RELEVANCE_FLOOR
    on = mcp_query(d, {"query": ON_TOPIC, "collections": ["eval"]})
    assert "Found" in on.content[0].text and "startup-fundraising-memo.md" in on.content[0].text  # type: ignore[union-attr]
    everything = mcp_query(d, {"query": OFF_TOPIC, "collections": ["eval"], "minRelevance": 0})
    assert (everything.structured_content or {})["results"]


def test_the_agents_floor_on_keyword_evidence_alone(tmp_path: Path, env: Env, daemon: Daemon) -> None:
    """No embedder (or nothing embedded yet): the floor reads the keyword score, how far it
    stands out and how much of the question the notes hold. It refuses fewer everyday
    questions than with vectors (docs/benchmarks.md#relevance: on the eval notes alone 120 of
    149, where the keyword score alone refused only those nothing matched, 52; this holds 75%),
    and drops no eval query's right first answer; an answer it cut says it read keywords alone."""
    env.ok("collection", "add", str(eval_docs_dir()), "--name", "eval")
    everyday = everyday_questions()
    answers = [query(daemon, t, limit=1, min_relevance=AGENT_RELEVANCE_FLOOR) for t in everyday]
    answered = [t for t, a in zip(everyday, answers, strict=True) if a["results"]]
    assert len(answered) <= 0.25 * len(everyday), answered
    cut = [a for a in answers if a.get("closest")]
    assert cut and all(any("keyword evidence alone" in w for w in a["warnings"]) for a in cut)
    spec = eval_spec()
    dropped = []
    for q in spec["eval_queries"]:
        got = query(daemon, q["query"], limit=1, min_relevance=AGENT_RELEVANCE_FLOOR)
        if not got["results"] and got.get("closest") and got["closest"]["path"] in q["expected_files"]:
            dropped.append((q["query"], got["closest"]["relevance"]))
    assert not dropped, dropped


def test_held_is_read_over_the_collections_searched(tmp_path: Path, env: Env, daemon: Daemon) -> None:
    """A question's words that only a collection not searched holds count as words no note
    holds: asked of the baking notes, a question about sourdough and castling holds only
    part of its idf, and is less likely relevant than asked of the baking and chess notes.
    A floor that cuts every result names those words, so an agent knows to search wider."""
    for name, text in {
        "baking": "---\nqmd:\n  metadata:\n    kind: bread\n---\n# Sourdough\n\nFeed the sourdough starter daily.\n",
        "chess": "# Castling\n\nCastling moves the king two squares.\n",
        "errands": "# Errands\n\nBuy stamps.\n",
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.md").write_text(text)
        env.ok("collection", "add", str(tmp_path / name), "--name", name)

    def held(*names: str) -> tuple[float, float]:
        [top] = query(daemon, "sourdough starter castling", collections=list(names), explain=True, limit=1)["results"]
        terms = {t["name"]: t["value"] for t in top["explain"]["relevance"]["terms"]}
        return terms["held"], top["relevance"]

    both = held("baking", "chess")  # two collections of three: searched one by one, then joined
    assert both[0] == held("baking", "chess", "errands")[0] == 1.0  # the whole index
    baking = held("baking")
    assert (
        baking[0] == pytest.approx(2 / 3, abs=1e-4) and held("baking", "errands") == baking
    )  # three words, each in one note
    assert baking[1] < both[1]

    def warnings(floor: float, **scope: object) -> list[str]:
        answer = query(daemon, "sourdough starter castling", min_relevance=floor, limit=1, **scope)
        return answer["warnings"] if not answer["results"] else ["(answered)"]

    named = "hold 'castling': searching them may answer it"
    assert any(w == f"only collections not searched {named}" for w in warnings(1.0, collections=["baking"]))
    assert not any(named in w for w in warnings(1.0, collections=["baking", "chess"]))
    assert not any(named in w for w in warnings(0.0, collections=["baking"]))  # nothing cut: nothing to say
    kind = {"field": "kind", "operator": "eq", "value": "bread"}
    filtered = warnings(1.0, collections=["baking", "chess", "errands"], filter=kind)
    assert f"only documents the filter or scope left out {named}" in filtered
    r = env.qmd("query", "-c", "baking", "--min-relevance", "1", "sourdough starter castling")
    assert r.returncode == 0 and f"only collections not searched {named}" in r.stderr
    # nothing searched matched at all: the words held elsewhere are still named, without a floor
    nothing = query(daemon, "castling kings", collections=["baking"])
    assert nothing["results"] == [] and "only collections not searched hold 'castling', 'kings'" in " ".join(
        nothing["warnings"]
    )
    assert not any("collections not searched" in w for w in query(daemon, "zebras", collections=["baking"])["warnings"])
    # a quoted word and the same word plain (one item once searched), on the keyword and hybrid routes
    twice = 'the "castling" moves and castling rules of the king'
    for route in ("/v1/keyword", "/v1/query"):
        r = daemon.http.post(route, json={"query": twice, "collections": ["baking"], "min_score": 0})
        assert r.status_code == 200, r.text


def test_words_held_elsewhere_are_looked_for_only_when_nothing_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe that found nothing in a narrowed search leaves the look-up over the whole index
    (`held_outside`) to an answer that keeps no result: when the vector leg's results are kept,
    the words are never shown, so the look-up is never run."""
    embed = require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM test embedder (../shared/models)")
    for name, text in {
        "baking": "# Sourdough\n\nFeed the sourdough starter daily.\n",
        "chess": "# Castling\n\nCastling moves the king two squares.\n",
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.md").write_text(text)
    looked: list[str] = []

    def counted(store: object, lexq: object, scope: object) -> tuple[str, ...]:
        words = held_outside(store, lexq, scope)  # type: ignore[arg-type]
        looked.append(",".join(words))
        return words

    monkeypatch.setattr(hybrid, "held_outside", counted)
    folders = {name: {"path": str(tmp_path / name)} for name in ("baking", "chess")}
    with qmd.open(tmp_path / "i.sqlite", collections=folders, models={"embed": str(embed)}) as index:
        index.update()
        index.embed()
        kept = index.query("castling kings", collections=["baking"], rerank=False)
        assert kept.hits and looked == [] and not any("not searched" in w for w in kept.warnings)
        cut = index.query("castling kings", collections=["baking"], rerank=False, min_relevance=1.0)
        assert not cut.hits and looked == ["castling,kings"]
        assert "only collections not searched hold 'castling', 'kings': searching them may answer it" in cut.warnings


def test_keyword_evidence_alone_is_announced_under_a_floor(tmp_path: Path, env: Env, daemon: Daemon) -> None:
    """No embedder: relevance comes from keywords alone, which a floor's answer says."""
    notes = tmp_path / "kw"
    notes.mkdir()
    (notes / "a.md").write_text("# Fundraising\n\nSeries A fundraising closes in March.\n")
    env.ok("collection", "add", str(notes), "--name", "kw")
    r = daemon.http.post("/v1/query", json={"query": ON_TOPIC, "collections": ["kw"], "min_relevance": 0.01})
    body = r.json()
    assert r.status_code == 200 and body["results"][0]["relevance"] is not None
    assert not any("keyword evidence alone" in w for w in body["warnings"])  # the floor dropped nothing
    r = daemon.http.post("/v1/query", json={"query": "march", "collections": ["kw"], "min_relevance": 0.99})
    body = r.json()
    assert body["results"] == [] and body["closest"]["path"] == "a.md"
    assert any("read keyword evidence alone" in w for w in body["warnings"])
