"""The hybrid pipeline in process, on a real index, with scripted expansion and rerank
scorers: routing weights, partial rerank under a budget, failures reported as skipped
stages. (The real models run the same code in test_query.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import NOTES, write

from qmd.paths import IndexPaths
from qmd.server.engine import Engine
from qmd.server.errors import QmdError
from qmd.server.search import lexical
from qmd.server.search.expansion import Expander, Prompt
from qmd.server.search.hybrid import RERANK_PASSAGE_CHARS, CostModel, HybridQuery, Legs, QueryOptions, VectorLeg
from qmd.server.search.querydoc import parse_query, typed_query
from qmd.server.store import cores

MORE = {f"extra/note-{i}.md": f"# Note {i}\n\nInvestors and bread, item {i}.\n" for i in range(8)}


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    paths = IndexPaths("test", tmp_path / "index.sqlite", tmp_path / "index.yml", tmp_path)
    e = Engine(paths)
    e.create_collection(str(write(tmp_path / "notes", {**NOTES, **MORE})), name="notes")
    e.update()
    yield e
    e.close()


class ScriptedReranker:
    """Scores by whether the passage mentions 'angel'; takes `cost` seconds per passage."""

    uri = "scripted"
    passage_tokens = 256
    learning = False

    def __init__(self, cost: float = 0.0, fail: bool = False, method: str = "cross-encoder") -> None:
        self.cost = cost
        self.fail = fail
        self.calls = 0
        self.passages: list[str] = []
        self.method = method

    def score(self, query: str, passages: list[str]) -> list[float]:
        self.calls += 1
        self.passages = passages
        if self.fail:
            raise QmdError("the inference worker crashed (SIGKILL) while scoring")
        time.sleep(self.cost * len(passages))
        return [-2.0 if "angel" in p.lower() else -9.0 for p in passages]

    def normalize(self, raw: list[float]) -> list[float]:
        return [1.0 if r > -5 else 0.1 for r in raw]


def run(engine: Engine, text: str, legs: Legs, costs: CostModel | None = None, **opts: object):  # noqa: ANN201
    q = HybridQuery(engine.store, engine.config, legs, costs or CostModel())
    return q.run(parse_query(text), QueryOptions(**opts))  # type: ignore[arg-type]


def legs(reranker: object = None, expander: Expander | None = None) -> Legs:
    return Legs(None, "no vectors in this test", expander, "no generator", reranker, "no reranker")  # type: ignore[arg-type]


def test_expansion_lines_route_to_keyword_lists_with_weight_one(engine: Engine) -> None:
    def generate(p: Prompt) -> str:
        return (
            "lex: angel investors\nvec: who gives money to startups\nhyde: Angel investors put money into seed rounds."
        )

    expander = Expander(generate, "scripted", None, False, engine.store)
    out = run(engine, "money investors", legs(expander=expander), rerank=False, expand=True, explain=True)
    st = {s.stage: s for s in out.stages}
    assert st["expand"].status == "ran" and "3 lines" in st["expand"].detail
    assert st["vector"].status == "skipped" and "no vectors in this test" in st["vector"].detail
    explain = out.hits[0].explain
    assert explain is not None
    contributions = explain["rrf"]["contributions"]
    assert {(c["queryType"], c["weight"]) for c in contributions} == {("original", 2.0), ("lex", 1.0)}
    assert out.expansion == [
        ("lex", "angel investors"),
        ("vec", "who gives money to startups"),
        ("hyde", "Angel investors put money into seed rounds."),
    ]


def test_expansion_failure_is_a_skipped_stage(engine: Engine) -> None:
    def generate(p: Prompt) -> str:
        raise QmdError("the inference worker exited with status 1 while generating")

    out = run(engine, "money investors", legs(expander=Expander(generate, "x", None, False, engine.store)), expand=True)
    st = {s.stage: s for s in out.stages}
    assert st["expand"].status == "skipped" and "exited with status 1" in st["expand"].detail
    assert out.hits


def answering(text: str) -> tuple[list[Prompt], Callable[[Prompt], str]]:
    """A scripted generate model that always answers `text`, and the prompts it was given."""
    calls: list[Prompt] = []

    def generate(p: Prompt) -> str:
        calls.append(p)
        return text

    return calls, generate


def test_no_expand_turns_the_stage_off_and_asks_no_model(engine: Engine) -> None:
    calls, generate = answering("lex: angel investors")
    expander = Expander(generate, "scripted", None, False, engine.store)
    out = run(engine, "money investors", legs(expander=expander), rerank=False, expand=False)
    st = {s.stage: s for s in out.stages}
    assert st["expand"].status == "off" and "--no-expand" in st["expand"].detail
    assert calls == [] and out.expansion is None and out.hits
    # Unasked, a general model does not expand (it measured no gain); one trained to, does.
    plain = {s.stage: s for s in run(engine, "money investors", legs(expander=expander), rerank=False).stages}
    assert plain["expand"].status == "off" and "--expand" in plain["expand"].detail and calls == []
    trained = Expander(generate, "hf:tobil/qmd-query-expansion-1.7B-gguf", None, False, engine.store)
    out = run(engine, "money investors", legs(expander=trained), rerank=False)
    assert {s.stage: s for s in out.stages}["expand"].status == "ran" and len(calls) == 1


def test_a_strong_keyword_signal_skips_the_expansion(engine: Engine, tmp_path: Path) -> None:
    """The probe counts its hits' items only when an expansion may run (they feed spec §13.2's
    strong-signal test, and cost a pass over each item's documents): words one note holds in
    its title and throughout answer without the model, where a weaker match still expands."""
    text = "# Zephyrine quillwort\n\nZephyrine and quillwort, zephyrine by quillwort: zephyrine, quillwort.\n"
    write(tmp_path / "notes", {"zephyr.md": text})
    engine.update()
    calls, generate = answering("lex: angel investors")
    expander = Expander(generate, "scripted", None, False, engine.store)
    out = run(engine, "zephyrine quillwort", legs(expander=expander), rerank=False, expand=True)
    st = {s.stage: s for s in out.stages}
    assert st["expand"].status == "skipped" and "strong keyword signal" in st["expand"].detail, st["expand"]
    assert calls == [] and out.hits[0].doc.path == "zephyr.md"
    weak = run(engine, "money investors", legs(expander=expander), rerank=False, expand=True)
    assert {s.stage: s for s in weak.stages}["expand"].status == "ran" and len(calls) == 1


def test_a_fallback_expansion_is_kept_for_the_next_query(engine: Engine) -> None:
    calls, chatter = answering("Sure! Happy to help.")
    expander = Expander(chatter, "scripted", None, False, engine.store)
    first = run(engine, "money investors", legs(expander=expander), rerank=False, expand=True)
    engine.store.write(lambda conn: None, bump=False)  # the cache write ahead of it has landed
    again = run(engine, "money investors", legs(expander=expander), rerank=False, expand=True)
    st = {s.stage: s for s in again.stages}
    assert st["expand"].status == "cached" and "no usable line" in st["expand"].detail
    assert len(calls) == 1 and [h.doc.path for h in again.hits] == [h.doc.path for h in first.hits]


def test_a_busy_worker_is_part_of_the_budget_plan(engine: Engine) -> None:
    """Another client's calls ahead in the inference worker (5 s of them) leave no time within a
    2 s budget: expansion and rerank are dropped at once, saying why, and no model is asked."""
    calls, generate = answering("lex: angel investors")

    rr = ScriptedReranker()
    busy = Legs(None, "no vectors", Expander(generate, "x", None, False, engine.store), "", rr, "", lambda: 5.0)
    out = run(engine, "money investors", busy, budget_ms=2000, expand=True)
    st = {s.stage: s for s in out.stages}
    assert st["expand"].status == "skipped" and "behind ~5000 ms of other work" in st["expand"].detail
    assert st["rerank"].status == "skipped" and "behind ~5000 ms" in st["rerank"].detail
    assert calls == [] and rr.calls == 0 and out.hits
    idle = Legs(None, "no vectors", Expander(generate, "x", None, False, engine.store), "", rr, "", lambda: 0.0)
    again = {s.stage: s for s in run(engine, "money investors", idle, budget_ms=60_000, expand=True).stages}
    assert again["expand"].status == "ran" and again["rerank"].status == "ran"


def test_rerank_reorders_and_caches(engine: Engine) -> None:
    rr = ScriptedReranker()
    out = run(engine, "investors", legs(rr), explain=True)
    by_path = {h.doc.path: h for h in out.hits}
    assert by_path["fundraising.md"].rerank == 1.0 and by_path["ideas.md"].rerank == pytest.approx(0.1)
    for h in out.hits:  # the documented blend, position-weighted
        w = h.explain["rrf"]["weight"]
        assert h.score == pytest.approx(w * h.fusion + (1 - w) * h.rerank, abs=1e-3)
    assert [h.score for h in out.hits] == sorted((h.score for h in out.hits), reverse=True)
    engine.store.write(lambda conn: None, bump=False)  # let the cache writes land
    calls = rr.calls
    again = run(engine, "investors", legs(rr))
    assert rr.calls == calls
    assert "10 cached, 0 scored" in {s.stage: s for s in again.stages}["rerank"].detail


def test_budget_reranks_only_what_fits_and_says_so(engine: Engine) -> None:
    costs = CostModel()
    costs.observe("rerank", 0.1, model="scripted")
    out = run(engine, "investors bread", legs(ScriptedReranker(cost=0.1)), costs, budget_ms=300, limit=20)
    st = {s.stage: s for s in out.stages}["rerank"]
    assert st.status == "partial", st
    assert "count 0 for the rerank term" in st.detail
    scored = [h for h in out.hits if h.rerank is not None]
    assert 1 <= len(scored) < len(out.hits)
    assert out.elapsed_ms < 1000


def test_rerank_failure_keeps_the_fused_order(engine: Engine) -> None:
    out = run(engine, "investors", legs(ScriptedReranker(fail=True)))
    st = {s.stage: s for s in out.stages}["rerank"]
    assert st.status == "skipped" and "SIGKILL" in st.detail
    assert out.hits and all(h.rerank is None for h in out.hits)
    assert out.hits[0].score == out.hits[0].fusion


def test_min_score_and_limit(engine: Engine) -> None:
    out = run(engine, "investors", legs(), min_score=0.99)
    assert len(out.hits) == 1 and out.hits[0].score >= 0.99
    none = run(engine, "investors", legs(ScriptedReranker()), min_score=0.99, limit=3)
    assert none.hits == [] and none.below_min_score


def test_unknown_collection_is_the_callers_error(engine: Engine) -> None:
    with pytest.raises(QmdError, match="nope"):
        engine.query(parse_query("investors"), QueryOptions(collections=["nope"]))


def test_a_general_models_likelihood_reranks_only_when_asked(engine: Engine) -> None:
    """A query that says nothing is reranked by a model trained to rank only: a general model's
    query likelihood (seconds per query on a CPU for a small gain) is off and says why;
    `rerank=True` runs it."""
    rr = ScriptedReranker(cost=0.5, method="query-likelihood")
    unasked = run(engine, "money investors", legs(rr), budget_ms=600)
    st = {s.stage: s for s in unasked.stages}
    assert st["rerank"].status == "off" and "not run by default" in st["rerank"].detail
    assert "--rerank (rerank: true) runs it" in st["rerank"].detail
    assert rr.calls == 0 and "rerank" not in {s.stage for s in unasked.skipped}
    assert unasked.hits and all(h.rerank is None for h in unasked.hits)
    asked = run(engine, "money investors", legs(rr), rerank=True)
    assert {s.stage: s for s in asked.stages}["rerank"].status == "ran" and rr.calls > 0
    trained = run(engine, "money investors", legs(ScriptedReranker()))
    assert {s.stage: s for s in trained.stages}["rerank"].status == "ran"


def test_the_engine_cuts_passages_to_its_setting(
    tmp_path: Path, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`QMD_RERANK_PASSAGE_CHARS` sets how much of each candidate a reranker reads (its cost
    is about linear in it); the default is `RERANK_PASSAGE_CHARS`."""
    long = "angel investors " + "and their seed rounds " * 80
    engine.create_collection(str(write(tmp_path / "long", {"long.md": long})), name="long")
    engine.update()
    for setting, cap in (("", RERANK_PASSAGE_CHARS), ("120", 120)):
        monkeypatch.setenv("QMD_RERANK_PASSAGE_CHARS", setting)
        e = Engine(engine.paths)
        try:
            rr = ScriptedReranker()
            HybridQuery(e.store, e.config, legs(rr), CostModel(), passage_chars=e.rerank_passage_chars).run(
                parse_query("angel investors"), QueryOptions(collections=["long"], rerank=True)
            )
            assert e.rerank_passage_chars == cap
            assert rr.passages and cap * 0.8 <= max(len(p) for p in rr.passages) <= cap + len(
                "long\n"
            )  # the title goes first
        finally:
            e.close()


def recording_leg(order: list[str]) -> VectorLeg:
    """A vector leg that finds nothing and records which thread embedded what, after what."""

    def embed(texts: list[str]) -> list[list[float]]:
        order.append(f"embed {texts} on {threading.current_thread().name}")
        return [[1.0, 0.0] for _ in texts]

    return VectorLeg(embed=embed, search=lambda q, k, scope: [], nearest=lambda q, docs: {}, model="scripted")


def test_the_vector_leg_runs_beside_the_keyword_leg(engine: Engine) -> None:
    order: list[str] = []
    vectors = Legs(recording_leg(order), "", None, "no generator", None, "no reranker")
    out = run(engine, "money investors", vectors, rerank=False, expand=False)
    st = {s.stage: s for s in out.stages}
    assert st["vector"].status == "ran" and "beside the keyword leg" in st["vector"].detail
    assert len(order) == 1 and order[0].startswith("embed ['money investors'] on qmd-query-vectors")
    order.clear()
    typed = HybridQuery(engine.store, engine.config, vectors, CostModel()).run(
        typed_query([("lex", "investors"), ("vec", "who funds startups")]), QueryOptions(rerank=False)
    )
    assert "beside the keyword leg" in {s.stage: s for s in typed.stages}["vector"].detail
    assert len(order) == 1 and order[0].startswith("embed ['who funds startups'] on qmd-query-vectors")


@pytest.mark.sqlite_only("the keyword ranking in halves is FTS5's; Postgres ranks in one statement")
def test_the_legs_share_the_cores_and_a_lone_leg_does_not(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Side by side, neither leg cuts its own work across the cores (store/cores.py): the
    keyword ranking asks `cores.shared` in the caller, the vector leg in its thread. With no
    vector leg the keyword leg has them to itself, and so does a search after the query."""
    seen: list[tuple[str, bool]] = []
    halves = lexical._halves  # noqa: SLF001

    def asked(*args: Any) -> Any:
        seen.append(("keyword", cores.shared()))
        return halves(*args)

    monkeypatch.setattr(lexical, "_halves", asked)
    vector = VectorLeg(
        embed=lambda texts: [[1.0, 0.0] for _ in texts],
        search=lambda q, k, scope: seen.append(("vector", cores.shared())) or [],
        nearest=lambda q, docs: {},
        model="scripted",
    )
    run(engine, "money investors", Legs(vector, "", None, "", None, ""), rerank=False, expand=False)
    assert sorted(set(seen)) == [("keyword", True), ("vector", True)]
    seen.clear()
    run(engine, "money investors", legs(), rerank=False, expand=False)
    assert set(seen) == {("keyword", False)} and not cores.shared()


def test_an_expansion_goes_first_and_the_vector_leg_waits_for_it(engine: Engine) -> None:
    """Both call the one inference worker: a vector leg started beside an expansion would
    queue behind it (or it behind the leg), so with an expansion possible the leg runs after."""
    order: list[str] = []

    def generate(p: Prompt) -> str:
        order.append("expand")
        return "vec: who gives money to startups"

    expander = Expander(generate, "scripted", None, False, engine.store)
    out = run(engine, "money investors", Legs(recording_leg(order), "", expander, "", None, ""), expand=True)
    st = {s.stage: s for s in out.stages}
    assert st["vector"].status == "ran" and "beside" not in st["vector"].detail
    caller = threading.current_thread().name
    assert order == ["expand", f"embed ['money investors', 'who gives money to startups'] on {caller}"]
