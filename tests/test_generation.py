"""Generative models in the inference worker, and the rerankers built on them, with real GGUFs.

Gemma 3 270M (a base model, no chat template) and SmolLM2-135M-Instruct (ChatML) come from
PyPI packages (../shared/models/README.md §2-3). Assertions are about formats, orderings
and determinism, never the exact text a 135M-270M model writes.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MODELS_DIR, cross_encoder, require

from qmd.server.errors import InvalidInput
from qmd.server.models.protocol import GenerationParams
from qmd.server.models.worker import Completion, InferenceError, ModelSpec, WorkerClient
from qmd.server.search.rerank import (
    PASSAGE_TOKENS,
    CrossEncoderReranker,
    QueryLikelihoodReranker,
    YesNoReranker,
    make_reranker,
)

# Every test loads a GGUF model in an inference worker: outside the fast run (-m "not slow").
pytestmark = pytest.mark.slow

EXAMPLES = [
    (
        "python virtual environment setup",
        "lex: python venv virtualenv activate pip\n"
        "vec: how do I create and activate a Python virtual environment?\n"
        "hyde: Run python -m venv .venv and then source .venv/bin/activate before installing packages with pip.",
    ),
    (
        "slow postgres queries",
        "lex: postgres slow query explain analyze index\n"
        "vec: why are my PostgreSQL queries slow and how can I speed them up?\n"
        "hyde: Use EXPLAIN ANALYZE to find sequential scans and add an index on the filtered columns.",
    ),
    (
        "chocolate chip cookies",
        "lex: chocolate chip cookie recipe bake butter sugar\n"
        "vec: what is a good recipe for chocolate chip cookies?\n"
        "hyde: Cream the butter and sugar, fold in the chocolate chips and bake at 180C for 10 minutes.",
    ),
    (
        "quarterly sales report",
        "lex: Q2 sales revenue report quarter\n"
        "vec: where is the report on sales figures for the last quarter?\n"
        "hyde: Revenue for the quarter grew 12% compared with the previous quarter, "
        "driven by new enterprise customers.",
    ),
]
INSTRUCTIONS = (
    "Rewrite a search query for a hybrid search engine. Output exactly three lines:\n"
    "lex: keywords for full-text search\n"
    "vec: the query rephrased as a natural question\n"
    "hyde: one sentence that a relevant document would contain"
)
EXPANSION = GenerationParams(max_tokens=96, stop=["\nQuery:", "\n\n"])
LINE = re.compile(r"^\s*(lex|vec|hyde)\s*:\s*\S", re.MULTILINE)

QUERY = "how do I raise money for my startup"
FUNDRAISING = (
    "Raising a seed round. Angel investors fund early startups: we raise money from angels and VCs, "
    "and keep the pitch deck short."
)
BREAD = "Sourdough bread. Mix flour, water and salt, then bake at 230C for 40 minutes."
BIKE = "Fixing a flat bicycle tyre. Remove the wheel, find the puncture and patch the inner tube."


def expansion_prompt(query: str) -> str:
    """The few-shot expansion prompt of models README §2 (for a base model)."""
    shots = "".join(f"Query: {q}\n{a}\n\n" for q, a in EXAMPLES)
    return f"{INSTRUCTIONS}\n\n{shots}Query: {query}\n"


def expansion_messages(query: str) -> list[dict[str, str]]:
    """The same examples as chat turns (models README §3: what SmolLM2 follows)."""
    turns = [{"role": "system", "content": INSTRUCTIONS}]
    for q, a in EXAMPLES:
        turns += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return [*turns, {"role": "user", "content": query}]


@pytest.fixture(scope="session")
def gemma_path(gemma_model: Path) -> str:
    return str(gemma_model)


@pytest.fixture(scope="session")
def smol_path(smollm_model: Path) -> str:
    return str(smollm_model)


@pytest.fixture(scope="module")
def gemma_worker() -> Iterator[WorkerClient]:
    """One child per model file for the module: loading once keeps the file fast."""
    w = WorkerClient(n_threads=2)
    yield w
    w.close()


@pytest.fixture(scope="module")
def smol_worker() -> Iterator[WorkerClient]:
    """One child per model file for the module: loading once keeps the file fast."""
    w = WorkerClient(n_threads=2)
    yield w
    w.close()


@pytest.fixture
def gemma(gemma_path: str) -> ModelSpec:
    return ModelSpec("generate", gemma_path)


@pytest.fixture
def smol(smol_path: str) -> ModelSpec:
    return ModelSpec("generate", smol_path)


def test_model_info_says_which_scorer_fits(gemma_worker: WorkerClient, gemma: ModelSpec, smol: ModelSpec) -> None:
    """The header facts a caller picks a scorer by, read without a child."""
    base, chat = gemma_worker.model_info(gemma), gemma_worker.model_info(smol)
    assert base["arch"] == "gemma3" and chat["arch"] == "llama"
    assert base["pooling"] == chat["pooling"] == "none"
    assert base["chat_template"] is False and chat["chat_template"] is True
    assert base["rerank_template"] is False and chat["rerank_template"] is False
    assert base["has_bos"] is True and chat["has_bos"] is True
    assert base["n_ctx"] == 2048 and base["n_ctx_train"] == 32768
    assert base["name"] == "Gemma 3 270m"


def test_greedy_expansion_is_valid_and_deterministic(gemma_worker: WorkerClient, gemma: ModelSpec) -> None:
    """README §2's prompt, greedy: the query expander's contract (format, repeatability)."""
    first = gemma_worker.complete(gemma, expansion_prompt("raising a seed round"), params=EXPANSION)
    assert isinstance(first, Completion)
    assert LINE.search(first.text), first.text
    assert first.prompt_tokens > 250 and 1 <= first.completion_tokens <= 96 and first.seconds > 0
    again = gemma_worker.complete(gemma, expansion_prompt("raising a seed round"), params=EXPANSION)
    assert again.text == first.text, "temperature 0 is greedy and each call starts from an empty cache"
    other = gemma_worker.complete(gemma, expansion_prompt("sourdough bread baking"), params=EXPANSION)
    assert other.text != first.text


def test_chat_messages_use_the_models_template(smol_worker: WorkerClient, smol: ModelSpec) -> None:
    """Messages go through the GGUF's own ChatML template; seeds make sampling repeatable."""
    prompt = smol_worker.render_chat(smol, [{"role": "user", "content": "hello"}])
    assert prompt.endswith("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"), prompt
    first = smol_worker.complete(smol, messages=expansion_messages("raising a seed round"), params=EXPANSION)
    assert LINE.search(first.text), first.text
    again = smol_worker.complete(smol, messages=expansion_messages("raising a seed round"), params=EXPANSION)
    assert again.text == first.text
    one, same, two = (
        smol_worker.complete(
            smol,
            "Write a poem about the sea.",
            params=GenerationParams(max_tokens=24, stop=[], temperature=1.0, seed=s),
        )
        for s in (1, 1, 2)
    )
    assert one.text == same.text and one.text != two.text, "a seed fixes what sampling picks"


def test_messages_need_a_chat_template(gemma_worker: WorkerClient, gemma: ModelSpec) -> None:
    """A base model given messages says what to do instead, and bad arguments fail before any round trip."""
    with pytest.raises(InferenceError, match="has no chat template; send a prompt"):
        gemma_worker.complete(
            gemma, messages=[{"role": "user", "content": "hi"}], params=GenerationParams(max_tokens=8, stop=[])
        )
    with pytest.raises(ValueError, match="exactly one of prompt or messages"):
        gemma_worker.complete(
            gemma, "hi", messages=[{"role": "user", "content": "hi"}], params=GenerationParams(max_tokens=8, stop=[])
        )
    with pytest.raises(ValueError, match="exactly one of prompt or messages"):
        gemma_worker.complete(gemma, params=GenerationParams(max_tokens=8, stop=[]))


def test_overlong_prompt_fails_that_request_only(gemma_worker: WorkerClient, gemma: ModelSpec) -> None:
    """An input error is an answered error: the same child serves the next request."""
    gemma_worker.complete(gemma, "Hello", params=GenerationParams(max_tokens=1, stop=[]))
    pid = gemma_worker.status()["pid"]
    with pytest.raises(InferenceError, match=r"max_tokens is 96: \d+ is more than the context of 2048 tokens"):
        gemma_worker.complete(gemma, "word " * 2000, params=GenerationParams(max_tokens=96, stop=[]))
    with pytest.raises(InferenceError, match="more than the context of 2048"):
        gemma_worker.likelihood(gemma, ["word " * 2100], "a query")
    answer = gemma_worker.complete(gemma, expansion_prompt("raising a seed round"), params=EXPANSION)
    assert LINE.search(answer.text)
    status = gemma_worker.status()
    assert status["pid"] == pid and status["restarts"] == 0 and status["last_crash"] is None


@pytest.mark.parametrize("model", ["gemma", "smol"])
def test_likelihood_prefers_the_passage_that_answers(model: str, request: pytest.FixtureRequest) -> None:
    """Query likelihood (README §4) separates a relevant passage from an unrelated one."""
    spec: ModelSpec = request.getfixturevalue(model)
    worker: WorkerClient = request.getfixturevalue(f"{model}_worker")
    prefixes = [f"Passage: {p}\nA question that this passage answers: " for p in (FUNDRAISING, BREAD)]
    relevant, unrelated = worker.likelihood(spec, prefixes, QUERY)
    assert all(math.isfinite(v) and v < 0 for v in (relevant, unrelated))
    assert relevant > unrelated
    assert worker.likelihood(spec, prefixes[:1], QUERY) == [relevant], "each prefix is scored independently"
    with pytest.raises(ValueError, match="non-empty continuation"):
        worker.likelihood(spec, prefixes, "")


def test_likelihood_matches_llama_cpps_own_logits(smol_path: str) -> None:
    """Against llama-cpp-python's `logits_all` evaluation of the same tokens (affordable with SmolLM2's
    49k vocabulary at n_ctx 1024): a prefix over one 512-token batch and a continuation over one
    32-row output chunk, so every chunk boundary of the worker's decode is crossed."""
    import numpy as np
    from llama_cpp import Llama

    from qmd.server.models.worker_child import model_params

    prefix = "Notes on fundraising. " + " ".join(f"Item {i}: angel investors back seed rounds." for i in range(60))
    continuation = " " + " ".join(["how do I raise money for my startup from angel investors"] * 4)
    spec = ModelSpec("generate", smol_path, n_ctx=1024)
    w = WorkerClient(n_threads=2)
    try:
        assert w.count_tokens(spec, [prefix])[0] > 512
        (ours,) = w.likelihood(spec, [prefix], continuation)
    finally:
        w.close()
    with model_params():  # as the worker loads it: no AMX weight repacking where that crashes
        ref = Llama(model_path=smol_path, n_ctx=1024, n_batch=512, n_threads=2, logits_all=True, verbose=False)
    head = ref.tokenize(prefix.encode(), add_bos=True, special=True)
    tail = ref.tokenize(continuation.encode(), add_bos=False, special=False)
    assert len(tail) > 32
    ref.eval(head + tail)
    rows = ref.scores[len(head) - 1 : len(head) + len(tail) - 1].astype(np.float64)
    top = rows.max(axis=1, keepdims=True)
    logprobs = rows - top - np.log(np.exp(rows - top).sum(axis=1, keepdims=True))
    expected = float(logprobs[np.arange(len(tail)), tail].mean())
    ref.close()
    assert ours == pytest.approx(expected, abs=0.02)


@pytest.mark.parametrize("model", ["gemma", "smol"])
def test_yes_no_is_a_probability(model: str, request: pytest.FixtureRequest) -> None:
    """P(yes) / (P(yes) + P(no)) stays in [0, 1] and is repeatable."""
    spec: ModelSpec = request.getfixturevalue(model)
    worker: WorkerClient = request.getfixturevalue(f"{model}_worker")
    prompts = [f"Query: {QUERY}\nDocument: {p}\nRelevant (yes/no):" for p in (FUNDRAISING, BREAD)]
    scores = worker.yes_no(spec, prompts)
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores), scores
    assert worker.yes_no(spec, prompts) == scores


def test_query_likelihood_reranker_ranks_the_answer_first(smol_worker: WorkerClient, smol_path: str) -> None:
    """The default scorer for a chat model ranks the one relevant passage first."""
    reranker = make_reranker(smol_worker, smol_path, "hf:test/smollm2")
    assert isinstance(reranker, QueryLikelihoodReranker) and reranker.chat
    assert reranker.uri == "hf:test/smollm2" and reranker.method == "query-likelihood"
    raw = reranker.score(QUERY, [BREAD, FUNDRAISING, BIKE])
    assert max(range(3), key=raw.__getitem__) == 1, raw
    norm = reranker.normalize(raw)
    assert all(0.0 <= s <= 1.0 for s in norm) and norm[1] == 1.0
    assert reranker.normalize([-4.2]) == [1.0] and reranker.normalize([-3.0, -3.0]) == [1.0, 1.0]
    assert reranker.score(QUERY, []) == [] and reranker.normalize([]) == []


def test_passages_are_cut_to_the_token_cap(smol_worker: WorkerClient, smol_path: str) -> None:
    """Long passages are cut to the cap by the model's own token count, short ones untouched."""
    reranker = QueryLikelihoodReranker(smol_worker, smol_path, "u", chat=True)
    long = " ".join(f"sentence {i} about angel investors and seed rounds." for i in range(200))
    short, cut = reranker.fit([FUNDRAISING, long])
    assert short == FUNDRAISING and long.startswith(cut)
    n = smol_worker.count_tokens(reranker.spec, [cut])[0]
    assert PASSAGE_TOKENS * 0.8 < n <= PASSAGE_TOKENS
    assert len(reranker.score(QUERY, [long])) == 1
    tight = QueryLikelihoodReranker(smol_worker, smol_path, "u", chat=True, passage_tokens=8)
    (tiny,) = tight.fit([FUNDRAISING])
    assert FUNDRAISING.startswith(tiny) and 0 < smol_worker.count_tokens(tight.spec, [tiny])[0] <= 8


def test_yes_no_reranker_renders_the_judge_prompt(smol_worker: WorkerClient, smol_path: str) -> None:
    """A forced yes-no scorer renders its system + user turns through the chat template."""
    reranker = make_reranker(smol_worker, smol_path, "u", method="yes-no")
    assert isinstance(reranker, YesNoReranker)
    scores = reranker.score(QUERY, [FUNDRAISING, BREAD])
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores)
    assert reranker.normalize(scores) == scores


def test_make_reranker_picks_and_validates(gemma_worker: WorkerClient, gemma_path: str, smol_path: str) -> None:
    """Method choice from the GGUF header, and clear refusals for what a model cannot do."""
    base = make_reranker(gemma_worker, gemma_path, "u")
    assert isinstance(base, QueryLikelihoodReranker) and not base.chat
    assert base.score(QUERY, [FUNDRAISING, BREAD])[0] > base.score(QUERY, [BREAD])[0]
    assert isinstance(make_reranker(gemma_worker, smol_path, "u"), QueryLikelihoodReranker)
    with pytest.raises(InvalidInput, match="unknown rerank method 'bm25'"):
        make_reranker(gemma_worker, gemma_path, "u", method="bm25")
    with pytest.raises(InvalidInput, match="no rank pooling"):
        make_reranker(gemma_worker, gemma_path, "u", method="cross-encoder")
    minilm = str(require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM embedder GGUF"))
    with pytest.raises(InvalidInput, match="embedding model"):
        make_reranker(gemma_worker, minilm, "u")


def wait_until_idle(w: WorkerClient, spec: ModelSpec) -> None:
    """Until the idle timer has freed every context (the weights stay loaded)."""
    deadline = time.monotonic() + 10
    while w.status()["contexts_live"]:
        assert time.monotonic() < deadline, "the idle timer did not free the context"
        time.sleep(0.05)
    assert w.model_info(spec)["loaded"] and not w.model_info(spec)["context_live"]


def test_contexts_freed_when_idle_give_the_same_results(smol_path: str) -> None:
    """Each op may be the first on a freed context: it must rebuild it, not call into freed memory."""
    w = WorkerClient(idle_seconds=1, n_threads=2)
    spec = ModelSpec("generate", smol_path)
    messages = [{"role": "user", "content": "Name three fruits."}]
    try:
        text = w.complete(spec, messages=messages, params=GenerationParams(max_tokens=16, stop=[])).text
        scores = w.likelihood(spec, [FUNDRAISING, BREAD], QUERY)
        wait_until_idle(w, spec)
        assert w.complete(spec, messages=messages, params=GenerationParams(max_tokens=16, stop=[])).text == text
        wait_until_idle(w, spec)
        assert w.likelihood(spec, [FUNDRAISING, BREAD], QUERY) == scores
        wait_until_idle(w, spec)
        assert len(w.yes_no(spec, [FUNDRAISING])) == 1
        assert w.status()["restarts"] == 0 and w.status()["last_crash"] is None
    finally:
        w.close()


def test_a_shared_prefix_is_evaluated_once_and_changes_no_answer(gemma_path: str) -> None:
    """The expansion prompt's instructions and examples (`shared`) are evaluated by the first call
    and restored by every later one, for any query; each answer is the same, bit for bit, whether
    the state was fresh, kept, or rebuilt after the idle timer freed it."""
    w = WorkerClient(idle_seconds=1, n_threads=2)
    spec = ModelSpec("generate", gemma_path)
    head = len(expansion_prompt(QUERY)) - len(f"Query: {QUERY}\n")

    def expand(query: str, shared: int = head) -> Completion:
        return w.complete(spec, expansion_prompt(query), params=EXPANSION, shared=shared)

    try:
        first = expand(QUERY)
        assert first.reused_tokens == 0 and LINE.search(first.text), first
        other = expand("sourdough bread baking")
        assert other.reused_tokens > 250, "the examples are the same for every query"
        assert expand("fixing a flat tyre", shared=0).reused_tokens == 0
        again = expand(QUERY)
        assert again.reused_tokens == other.reused_tokens and again.text == first.text
        assert expand("sourdough bread baking").text == other.text
        wait_until_idle(w, spec)
        cold = expand(QUERY)
        assert cold.reused_tokens == 0, "kept states go with the context"
        assert cold.text == first.text
        with pytest.raises(ValueError, match="shared must be 0 or more"):
            expand(QUERY, shared=-1)
    finally:
        w.close()


def test_scores_after_a_shared_head_do_not_depend_on_the_other_candidates(
    smol_worker: WorkerClient, smol_path: str
) -> None:
    """Reranking restores the template's head for each candidate: a candidate's score is the same
    bits alone, among others, or in another order."""
    spec = ModelSpec("generate", smol_path)
    reranker = QueryLikelihoodReranker(smol_worker, smol_path, f"file:{smol_path}", chat=True)
    passages = [FUNDRAISING, BREAD, BIKE]
    scores = reranker.score(QUERY, passages)
    assert scores[0] == max(scores)
    assert reranker.score(QUERY, passages[::-1]) == scores[::-1]
    assert reranker.score(QUERY, passages[1:2]) == scores[1:2]
    head = f"Query: {QUERY}\nDocument: "
    prompts = [f"{head}{p}\nRelevant (yes/no):" for p in passages]
    judged = smol_worker.yes_no(spec, prompts, shared=len(head))
    assert smol_worker.yes_no(spec, prompts[2:], shared=len(head)) == judged[2:]
    assert smol_worker.yes_no(spec, prompts[::-1], shared=len(head)) == judged[::-1]
    with pytest.raises(ValueError, match="shared must be 0 or more"):
        smol_worker.likelihood(spec, prompts, QUERY, shared=-3)


def test_a_shared_head_is_decoded_once_per_model(smol_path: str) -> None:
    """In the worker's own process: ten candidates after one template head decode the head once
    and keep one state for it, whose tokens are the head's; the rest is decoded per candidate."""
    from qmd.server.models.protocol import LoadParams
    from qmd.server.models.worker_child import GpuPlan, LoadedModel

    model = LoadedModel(LoadParams("generate", smol_path, False, 2048, 512, 512, 2), GpuPlan(0, None, None))
    try:
        head = "<|im_start|>user\nWrite a search query that this document answers.\nDocument: "
        prefixes = [f"{head}{p} ({i})<|im_end|>\n<|im_start|>assistant\n" for i, p in enumerate([FUNDRAISING] * 10)]
        starts: list[int] = []
        decode = model._decode

        def counted(tokens: list[int], start: int, first_output: int) -> Iterator[object]:
            starts.append(start)
            return decode(tokens, start, first_output)

        model._decode = counted  # type: ignore[method-assign]
        scores = model.likelihood(prefixes, QUERY, shared=len(head))
        (kept,) = model._prefixes
        assert list(kept) == model.prompt_tokens(head)[: len(kept)] and len(kept) >= 10
        assert starts == [0] + [len(kept)] * 10, "the head once from position 0, then each candidate after it"
        assert len(set(scores)) > 1
    finally:
        model.close()


@pytest.fixture(scope="module")
def rank_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """(a head with fixed random weights; the same with a rerank template spelling out BERT's pair
    format; a head that ignores its input and outputs the logit 2.0)."""
    import random

    rng = random.Random(0)
    folder = tmp_path_factory.mktemp("cross-encoders")
    weights = [rng.gauss(0, 384**-0.5) for _ in range(384)]
    random_head = cross_encoder(folder / "random-head.gguf", weights, 0.0)
    templated = cross_encoder(folder / "templated.gguf", weights, 0.0, "[CLS]{query}[SEP]{document}[SEP]")
    constant_head = cross_encoder(folder / "constant-head.gguf", [0.0] * 384, 2.0)
    return random_head, templated, constant_head


def test_rank_pooling_scores_query_document_pairs(rank_models: tuple[str, str, str]) -> None:
    """rank() on a real rank-pooling graph: pair format, rerank template, head and sigmoid, size limit."""
    random_head, templated, constant_head = rank_models
    spec = ModelSpec("rerank", random_head)
    w = WorkerClient(n_threads=2)
    try:
        info = w.model_info(spec)
        assert info["pooling"] == "rank" and info["has_bos"] and not info["rerank_template"]
        scores = w.rank(spec, QUERY, [FUNDRAISING, BREAD, FUNDRAISING])
        assert len(scores) == 3 and all(0.0 < s < 1.0 for s in scores), scores
        assert scores[0] == scores[2] != scores[1]
        assert w.rank(spec, QUERY, [BREAD]) == [scores[1]], "a pair's score does not depend on its batch"
        assert w.rank(spec, "sourdough bread recipe", [BREAD]) != [scores[1]], "the query is part of the input"
        # [CLS] query [SEP] document [SEP] is what the vocabulary's add_bos/add_eos flags build without a template.
        tspec = ModelSpec("rerank", templated)
        assert w.model_info(tspec)["rerank_template"]
        assert w.rank(tspec, QUERY, [FUNDRAISING, BREAD]) == pytest.approx(scores[:2], abs=1e-6)
        odd = "{document} in the query"
        assert w.rank(tspec, odd, [BREAD]) == pytest.approx(w.rank(spec, odd, [BREAD]), abs=1e-6)
        constant = w.rank(ModelSpec("rerank", constant_head), QUERY, [FUNDRAISING, BREAD])
        assert constant == pytest.approx([1 / (1 + math.exp(-2.0))] * 2), "one logit goes through a sigmoid"
        with pytest.raises(InferenceError, match="more than the 512 that fit"):
            w.rank(spec, QUERY, ["word " * 600])

        reranker = make_reranker(w, random_head, "hf:test/cross-encoder")
        assert isinstance(reranker, CrossEncoderReranker) and reranker.method == "cross-encoder"
        assert reranker.score(QUERY, [FUNDRAISING, BREAD]) == scores[:2]
        assert len(reranker.score(QUERY, ["word " * 600])) == 1, "the reranker cuts passages to fit"
        assert reranker.normalize(scores) == scores
        with pytest.raises(InvalidInput, match="is a cross-encoder"):
            make_reranker(w, random_head, "u", method="query-likelihood")
        with pytest.raises(ValueError, match="needs a generative model"):
            w.complete(spec, "hi", params=GenerationParams(max_tokens=4, stop=[]))
        assert w.status()["restarts"] == 0
    finally:
        w.close()


def test_rank_needs_a_cross_encoder(gemma_worker: WorkerClient, gemma_path: str) -> None:
    """rank() on a generative model is refused before a round trip."""
    with pytest.raises(ValueError, match="needs a cross-encoder"):
        gemma_worker.rank(ModelSpec("rerank", gemma_path), QUERY, [FUNDRAISING])
