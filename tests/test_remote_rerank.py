"""The remote rerank backend: a rerank endpoint (`/v1/rerank` as llama.cpp's server, vLLM,
Jina and Cohere serve it, or TEI's `/rerank`) as the rerank model.

The third-party server is llama.cpp's own `llama-server --reranking` (built by
`.ci/llama-server`) with a rank-pooling GGUF: its scores must be the local worker's on the same
file, in both wire formats and through the CLI (slow tests). A loopback server scoring with
MiniLM's cosine checks that a real model's judgment survives the trip; the failures a server
will not produce on demand (500, a malformed answer, the wrong count, an answer that never
comes) come from scripted loopback servers, in process, and through the daemon, which must
still answer.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ECHOED_KEY,
    MODELS_DIR,
    NOTES,
    Daemon,
    Env,
    Scripted,
    cross_encoder,
    endpoint_error,
    free_port,
    require,
    unavailable,
    write,
)
from harness import LlamaServer, Reply, llama_server, scripted_endpoint

from qmd.server.errors import InvalidInput
from qmd.server.models.refs import RemoteRef, resolve_model
from qmd.server.models.remote import RemoteReranker, RemoteRerankError
from qmd.server.models.worker import ModelSpec, WorkerClient, wait_at_most
from qmd.server.search.rerank import RemoteScorer, remote_reranker

SECRET = "qmd-rerank-secret-0c4d2e"
QUERY = "how do founders raise money"
EMBEDDER = "all-MiniLM-L6-v2-Q8_0.gguf"


def jina(scores: list[float], order: list[int] | None = None) -> Reply:
    """A `/v1/rerank` answer: results sorted by score (as servers send them), each with its input index."""
    order = order or sorted(range(len(scores)), key=lambda i: -scores[i])
    return 200, {}, json.dumps({"results": [{"index": i, "relevance_score": scores[i]} for i in order]}).encode()


def tei(scores: list[float]) -> Reply:
    """TEI's `/rerank` answer: a bare list, sorted by score."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return 200, {}, json.dumps([{"index": i, "score": scores[i]} for i in order]).encode()


# --- the client and the scorer, against scripted endpoints ---


def test_scores_come_back_in_input_order(scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-for-openai-only")
    monkeypatch.delenv("QMD_RERANK_API_KEY", raising=False)
    scripted.replies = [jina([-2.5, 7.0, 0.25])]
    rr = remote_reranker(resolve_model("rerank", {}, {"QMD_RERANK_MODEL": f"{scripted.url}#bge"}).ref)
    assert rr.score(QUERY, ["a", "b", "c"]) == [-2.5, 7.0, 0.25]
    assert scripted.paths == ["/v1/rerank"]
    assert scripted.bodies == [{"model": "bge", "query": QUERY, "documents": ["a", "b", "c"], "top_n": 3}]
    assert scripted.auth == [None]  # an OpenAI key goes to OpenAI only, and OpenAI has no rerank endpoint
    assert (rr.uri, rr.method, rr.passage_tokens) == (f"{scripted.url}#bge", "cross-encoder", 256)
    assert rr.score(QUERY, []) == [] and len(scripted.bodies) == 1  # nothing to score: no request


def test_bare_host_speaks_tei(scripted: Scripted) -> None:
    scripted.replies = [tei([0.9, 0.1])]
    client = RemoteReranker(scripted.root, "bge-reranker-base", environ={"QMD_RERANK_API_KEY": SECRET})
    assert client.rerank(QUERY, ["a", "b"]) == [0.9, 0.1]
    assert scripted.paths == ["/rerank"] and scripted.auth == [f"Bearer {SECRET}"]
    assert scripted.bodies == [{"query": QUERY, "texts": ["a", "b"], "truncate": True}]


def test_passages_are_cut_by_characters(scripted: Scripted) -> None:
    scripted.replies = [jina([0.5, 0.5])]
    rr = RemoteScorer(RemoteReranker(scripted.url, "m", environ={}), f"{scripted.url}#m")
    rr.score(QUERY, ["x" * 2000, "short"])
    assert scripted.bodies[0]["documents"] == ["x" * 768, "short"]  # 256 tokens at 3 characters each


def test_probabilities_stay_and_logits_go_through_a_sigmoid() -> None:
    rr = RemoteScorer(RemoteReranker("http://127.0.0.1:9/v1", "m", environ={}), "u")
    assert rr.normalize([0.9, 0.2, 0.0, 1.0]) == [0.9, 0.2, 0.0, 1.0]
    assert [round(s, 4) for s in rr.normalize([4.0, 0.0, -3.0, -800.0])] == [0.982, 0.5, 0.0474, 0.0]
    # logits once, logits always: a later set that falls inside [0, 1] is not taken for probabilities
    assert [round(s, 4) for s in rr.normalize([0.9, 0.2])] == [0.7109, 0.5498]


def test_llama_cpp_answers_are_logits_from_the_first(scripted: Scripted) -> None:
    """llama-server sends raw logits, tagged `"object": "list"`: logits inside [0, 1] are mapped too."""
    reply = {"model": "m", "object": "list", "results": [{"index": 0, "relevance_score": 0.87}]}
    scripted.replies = [jina([0.87]), (200, {}, json.dumps(reply).encode())]
    rr = RemoteScorer(RemoteReranker(scripted.url, "m", environ={}), "u")
    assert rr.learning  # nothing heard yet: cached scores alone would not tell the scale
    assert rr.normalize(rr.score(QUERY, ["a"])) == [0.87]  # untagged, inside [0, 1]: a probability
    assert not rr.learning
    assert [round(s, 4) for s in rr.normalize(rr.score(QUERY, ["a"]))] == [0.7047]


def test_retries_a_busy_server_then_succeeds(scripted: Scripted) -> None:
    scripted.replies = [(503, {"Retry-After": "0"}, b"loading model"), jina([0.3])]
    assert RemoteReranker(scripted.url, "m", environ={}).rerank(QUERY, ["a"]) == [0.3]
    assert len(scripted.bodies) == 2


@pytest.mark.parametrize(
    ("replies", "message"),
    [
        ([(500, {}, b'{"error": {"message": "oops"}}')] * 2, "kept failing (500: oops) after 2 attempts"),
        ([(200, {}, b"<html>login</html>")], "not a Jina/Cohere-style /rerank response: no JSON in the answer"),
        ([(200, {}, b'{"data": []}')], "not a Jina/Cohere-style /rerank response: no 'results' list"),
        ([jina([0.1])], "not a Jina/Cohere-style /rerank response: 1 scores for 2 passages"),
        ([jina([0.1, 0.2], order=[0, 0])], "bad or repeated index 0"),
        ([(200, {}, b'[{"index": 0, "score": 0.1}, {"index": 2, "score": 0.2}]')], "bad or repeated index 2"),
        ([(200, {}, b'{"results": [{"index": 0, "relevance_score": "high"}, {"index": 1}]}')], "passage 0 is not a fi"),
        ([(200, {}, b'{"results": [{"index": 0, "relevance_score": NaN}, {"index": 1, "score": 1}]}')], "not a finite"),
        (
            [(404, {}, b'{"error": "File Not Found"}')],
            "answered 404: File Not Found: it does not serve the model 'm', ",
        ),
        ([(422, {}, b'{"detail": "field required: texts"}')], "rejected the request (422: field required: texts); it"),
        (
            [(401, {}, b'{"detail": "bad key sk-echoed"}')],
            "refused the API key in QMD_RERANK_API_KEY (401: bad key ***)",
        ),
    ],
)
def test_errors_name_the_endpoint_and_never_the_key(
    scripted: Scripted, replies: list[Reply], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = RemoteReranker(scripted.url, "m", environ={"QMD_RERANK_API_KEY": ECHOED_KEY})
    said = endpoint_error(scripted, replies, lambda: client.rerank(QUERY, ["a", "b"]), RemoteRerankError, caplog)
    assert said.startswith(f"the rerank endpoint {scripted.url} ")
    assert message in said


def test_a_refused_format_says_how_to_choose_the_other(scripted: Scripted) -> None:
    scripted.replies = [(404, {}, b"Not Found")]
    with pytest.raises(RemoteRerankError) as err:
        RemoteReranker(scripted.root, "m", environ={}).rerank(QUERY, ["a"])
    assert err.value.message == (
        f"the rerank endpoint {scripted.root} answered 404: Not Found: it does not serve the model 'm', or it has no "
        f"TEI /rerank endpoint at {scripted.root}/rerank (a URI with a path such as /v1 speaks Jina/Cohere's format, "
        "http://host:port#model speaks TEI's)"
    )


def test_endpoint_down_fails_at_once() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    t = time.monotonic()
    with pytest.raises(RemoteRerankError) as err:
        RemoteReranker(url, "m", environ={}).rerank(QUERY, ["a"])
    assert time.monotonic() - t < 1.0  # no retry: waiting will not start a server
    assert err.value.message.startswith(f"cannot reach the rerank endpoint {url} (")
    assert err.value.message.endswith("Connection refused): is the server running?")


def test_an_answer_that_never_comes_times_out_then_the_budget_ends_it_sooner(silent: str) -> None:
    t = time.monotonic()
    with pytest.raises(RemoteRerankError) as err:
        RemoteReranker(silent, "m", environ={"QMD_RERANK_TIMEOUT": "0.6"}).rerank(QUERY, ["a"])
    assert 0.6 <= time.monotonic() - t < 1.5  # one deadline for every attempt: no retry after it
    assert err.value.message == f"the rerank endpoint {silent} did not answer within 0.6 s (1 attempt)"

    t = time.monotonic()
    with wait_at_most(0.3), pytest.raises(RemoteRerankError) as err:
        RemoteReranker(silent, "m", environ={}).rerank(QUERY, ["a"])
    assert 0.3 <= time.monotonic() - t < 1.0
    assert err.value.message == f"budget: gave up waiting for the rerank endpoint {silent} (1 attempt)"


def test_settings_resolve_and_unusable_ones_fail_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QMD_RERANK_TIMEOUT", raising=False)
    ref = resolve_model("rerank", {"rerank": "http://127.0.0.1:9/v1/#bge-reranker-v2-m3"}, {}).ref
    assert ref == RemoteRef("http://127.0.0.1:9/v1", "bge-reranker-v2-m3")
    assert remote_reranker(ref).uri == "http://127.0.0.1:9/v1#bge-reranker-v2-m3"
    assert remote_reranker(RemoteRef("http://localhost:9/v1", "bge-reranker-v2-m3")).uri != remote_reranker(ref).uri
    with pytest.raises(InvalidInput, match="QMD_RERANK_MODEL: OpenAI has no rerank endpoint: write http"):
        resolve_model("rerank", {}, {"QMD_RERANK_MODEL": "openai:text-embedding-3-small"})
    with pytest.raises(RemoteRerankError, match="needs a model name: write it as http://127.0.0.1:9#<model>"):
        remote_reranker(RemoteRef("http://127.0.0.1:9", None))
    for bad in ("soon", "0", "-1", "nan"):
        with pytest.raises(
            RemoteRerankError, match=f"QMD_RERANK_TIMEOUT must be a positive number of seconds, got '{bad}'"
        ):
            RemoteReranker("http://127.0.0.1:9/v1", "m", environ={"QMD_RERANK_TIMEOUT": bad})


# --- through the daemon and the CLI ---


def by_keyword(body: dict[str, Any]) -> Reply:
    """Logits that put the passage about bread first whatever the query: the rerank decides the order."""
    docs = body["documents"]
    return jina([6.0 if "flour" in d.lower() else -4.0 for d in docs])


def test_cli_query_reranks_on_the_endpoint_then_says_why_not(env: Env, tmp_path: Path) -> None:
    said: list[str] = []
    d: Daemon | None = None
    query = "startup investors bread"
    try:
        with scripted_endpoint(by_keyword) as server:
            env.vars.update(QMD_RERANK_MODEL=f"{server.url}#bge", QMD_RERANK_API_KEY=SECRET)
            d = Daemon(env, "--log-level", "debug")
            env.vars["QMD_NO_AUTOSTART"] = "1"
            env.ok("collection", "add", str(write(tmp_path / "notes", NOTES)), "--name", "notes")
            plain = [h["file"] for h in env.json("query", query, "--json", "--no-rerank")]
            r = env.qmd("query", query, "--explain", "--json")
            said.append(r.stdout + r.stderr)
            assert r.returncode == 0, r.stderr
            hits = {h["file"]: h["explain"] for h in json.loads(r.stdout)}
            bread = "qmd://notes/cooking/bread.md"
            # the endpoint's logits, mapped through a sigmoid; the blend moves the passage it favours up
            assert {f: (e["rerankRaw"], e["rerankScore"]) for f, e in hits.items()} == {
                f: (6.0, 0.9975) if f == bread else (-4.0, 0.018) for f in hits
            }
            assert list(hits).index(bread) < plain.index(bread), (plain, list(hits))
            assert server.auth and set(server.auth) == {f"Bearer {SECRET}"}
            answer = d.http.post("/v1/query", json={"query": query, "explain": True}).json()
            rerank = next(s for s in answer["stages"] if s["stage"] == "rerank")
            assert rerank["status"] == "ran" and rerank["detail"].startswith("cross-encoder: "), rerank
            assert ", 0 scored)" in rerank["detail"]  # the scores were cached under the endpoint's URI

            server.replies = [(500, {}, b'{"error": {"message": "CUDA out of memory"}}')] * 2
            r = env.qmd("query", "sourdough loaf baking times", "--explain")
            said.append(r.stdout + r.stderr)
            assert r.returncode == 0 and "bread.md" in r.stdout and "Traceback" not in r.stderr
            assert "rerank: skipped" in r.stderr, r.stderr
            assert f"the rerank endpoint {server.url} kept failing (500: CUDA out of memory)" in r.stderr

        # the endpoint goes away under a running daemon: the query still answers, and says why
        r = env.qmd("query", "flour water salt", "--explain")
        said.append(r.stdout + r.stderr)
        assert r.returncode == 0 and "bread.md" in r.stdout and "Traceback" not in r.stderr
        assert f"cannot reach the rerank endpoint {server.url} (" in r.stderr and "is the server running?" in r.stderr
    finally:
        if d is not None:
            d.stop()
    assert d is not None
    said.append(d.output.read_text())
    assert "HTTP Request: POST" in said[-1]  # the daemon logged its requests at debug level
    for text in said:
        assert SECRET not in text


# --- a real model behind a real wire format ---


class CosineRanker:
    """Scores with MiniLM through llama_cpp: cosine of the query's and the passage's unit
    embeddings, the way an embedding-similarity reranker serves it, in the wire format the
    request came in (as llama.cpp's server answers a TEI request in TEI's shape)."""

    def __init__(self, path: Path) -> None:
        from llama_cpp import Llama

        from qmd.server.models.worker_child import model_params

        with model_params():  # as the worker loads it: no AMX weight repacking where that crashes
            self.llm = Llama(
                model_path=str(path), embedding=True, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2, verbose=False
            )
        self.lock = threading.Lock()  # one llama context: requests are scored one at a time

    def __call__(self, body: dict[str, Any]) -> Reply:
        texts = body.get("documents", body.get("texts"))
        with self.lock:
            vectors = [self.llm.embed(t, normalize=True) for t in [body["query"], *texts]]
        q, docs = vectors[0], vectors[1:]
        scores = [sum(a * b for a, b in zip(q, v, strict=True)) for v in docs]
        return jina(scores) if "documents" in body else tei(scores)


@pytest.fixture(scope="module")
def cosine() -> CosineRanker:
    """The real scorer; missing llama_cpp or the model fails under CI, skips elsewhere."""
    if importlib.util.find_spec("llama_cpp") is None:
        unavailable("llama_cpp is missing: pip install -e '.[test]'")
    return CosineRanker(require(MODELS_DIR / EMBEDDER, "the MiniLM test embedder (../shared/models)"))


@pytest.mark.slow
def test_real_model_ranks_through_both_formats(cosine: CosineRanker) -> None:
    passages = [str(NOTES[name]) for name in ("cooking/bread.md", "fundraising.md", "work/meeting-2026-04-10.md")]
    with scripted_endpoint(cosine) as server:
        for url in (server.url, server.root):
            rr = remote_reranker(RemoteRef(url, "minilm"))
            money, bread = rr.score(QUERY, passages), rr.score("sourdough baking temperature", passages)
            assert max(range(3), key=money.__getitem__) == 1 and max(range(3), key=bread.__getitem__) == 0
        assert server.paths == ["/v1/rerank"] * 2 + ["/rerank"] * 2


def query_through_the_daemon(env: Env, tmp_path: Path, model: str) -> tuple[list[dict[str, Any]], str]:
    """`qmd query QUERY --explain --json` over the notes, `model` the rerank model: the hits and stderr."""
    env.vars["QMD_RERANK_MODEL"] = model
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    try:
        env.ok("collection", "add", str(write(tmp_path / "notes", NOTES)), "--name", "notes")
        r = env.qmd("query", QUERY, "--explain", "--json")
        assert r.returncode == 0, r.stderr
        assert "rerank: ran" in r.stderr and "cross-encoder: " in r.stderr, r.stderr
        return json.loads(r.stdout), r.stderr
    finally:
        d.stop()


@pytest.mark.slow
def test_cli_query_with_a_real_model_endpoint(cosine: CosineRanker, env: Env, tmp_path: Path) -> None:
    with scripted_endpoint(cosine) as server:
        env.vars["QMD_RERANK_API_KEY"] = SECRET
        hits, _ = query_through_the_daemon(env, tmp_path, f"{server.url}#minilm")
        assert all(0.0 <= h["rerank"] <= 1.0 for h in hits)
        best = max(hits, key=lambda h: h["explain"]["rerankRaw"])  # the model's own judgment
        assert best["file"] == hits[0]["file"] == "qmd://notes/fundraising.md", hits
        assert server.auth and set(server.auth) == {f"Bearer {SECRET}"}


# --- llama.cpp's own server, a rerank server we did not write ---


@dataclass
class Served:
    """`llama-server --reranking` on loopback with a rank-pooling GGUF, and that GGUF."""

    server: LlamaServer
    model: Path


@pytest.fixture(scope="module")
def llama_reranker(llama_server_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Small head weights keep every logit inside [0, 1], where only the answer's shape can tell
    llama-server's logits from probabilities."""
    rng = random.Random(1)
    folder = tmp_path_factory.mktemp("llama-server")
    model = Path(cross_encoder(folder / "ce.gguf", [rng.gauss(0, 0.3 * 384**-0.5) for _ in range(384)], 0.5))
    served = llama_server(llama_server_binary, model, folder / "server.log", "--reranking", alias="ce")
    try:
        yield Served(served, model)
    finally:
        served.stop()


@pytest.mark.slow
def test_llama_server_scores_as_the_local_cross_encoder_does(llama_reranker: Served) -> None:
    """Same GGUF, same pair format, same sigmoid: the endpoint's scores are the local worker's."""
    passages = [str(NOTES[name]) for name in ("cooking/bread.md", "fundraising.md", "work/meeting-2026-04-10.md")]
    url = llama_reranker.server.url
    for base in (url, url.removesuffix("/v1")):  # Jina/Cohere shape at /v1/rerank, TEI's at /rerank
        rr = remote_reranker(RemoteRef(base, "ce"))
        raw = rr.score(QUERY, passages)
        assert all(0.0 <= s <= 1.0 for s in raw) and len(set(raw)) == 3, raw
        remote = rr.normalize(raw)
        assert remote == [pytest.approx(1 / (1 + math.exp(-s)), abs=1e-9) for s in raw]
    w = WorkerClient(n_threads=2)
    try:
        local = w.rank(ModelSpec("rerank", str(llama_reranker.model)), QUERY, passages)
    finally:
        w.close()
    assert remote == [pytest.approx(s, abs=1e-3) for s in local], (remote, local)


@pytest.mark.slow
def test_cli_query_reranks_on_llama_server(llama_reranker: Served, env: Env, tmp_path: Path) -> None:
    """Mapped as logits from the first answer, on what llama-server's reply says of itself; after
    a restart, from cached scores too, which is what one candidate scored anew is for."""
    hits, said = query_through_the_daemon(env, tmp_path, f"{llama_reranker.server.url}#ce")
    n = len(hits)
    assert f"cross-encoder: {n} of {n} candidates (0 cached, {n} scored)" in said, said
    d = Daemon(env)  # a restart: the cache stays, what the endpoint said of itself is forgotten
    try:
        r = env.qmd("query", QUERY, "--explain", "--json")
        assert r.returncode == 0, r.stderr
        assert f"cross-encoder: {n} of {n} candidates ({n - 1} cached, 1 scored)" in r.stderr, r.stderr
        again = json.loads(r.stdout)
    finally:
        d.stop()
    for answer in (hits, again):
        raw = [h["explain"]["rerankRaw"] for h in answer]
        assert all(0.0 <= s <= 1.0 for s in raw), raw
        scores = [h["explain"]["rerankScore"] for h in answer]
        assert scores == [pytest.approx(1 / (1 + math.exp(-s)), abs=1e-3) for s in raw]
