"""The supervised inference worker, with the real MiniLM GGUF (../shared/models).

Crash isolation is tested by killing the child for real, idle disposal with a 1 s
timer; the vectors are checked against sentence-transformers' reference output.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MODELS_DIR, ROOT, require

from qmd.server.config import Config
from qmd.server.models import worker as inference
from qmd.server.models.embedders import Embedders, EmbedderUnavailable
from qmd.server.models.worker import (
    Embeddings,
    InferenceError,
    ModelsNotInstalled,
    ModelSpec,
    WorkerClient,
    fingerprint,
    format_document,
    format_query,
    prompt_format,
    read_gguf_metadata,
)

MINILM = MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf"
MINILM_F16 = MODELS_DIR / "all-MiniLM-L6-v2-F16.gguf"
MINILM_SHA256 = "1f9c645d3589f8cd64e436d73078a9f3478c7d2ae5795994135bba9f8b58555d"
REFERENCE = MODELS_DIR / "all-MiniLM-L6-v2.reference.json"
LONG = "word " * 5000


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return ModelSpec("embed", str(require(MINILM, "the MiniLM embedder GGUF (../shared/models/README.md)")))


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(require(REFERENCE, "sentence-transformers reference vectors").read_text())


@pytest.fixture(scope="module")
def worker() -> Iterator[WorkerClient]:
    w = WorkerClient(n_threads=2)
    yield w
    w.close()


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def wait_for(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def gguf(path: Path, kv: dict[str, str | int | list[int]]) -> Path:
    """A header-only GGUF v3 file with the given metadata (str, uint32 or uint32-array values)."""

    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s.encode())) + s.encode()

    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv))
    for key, value in kv.items():
        out += string(key)
        if isinstance(value, str):
            out += struct.pack("<I", 8) + string(value)
        elif isinstance(value, list):
            out += struct.pack("<IIQ", 9, 4, len(value)) + b"".join(struct.pack("<I", v) for v in value)
        else:
            out += struct.pack("<II", 4, value)
    path.write_bytes(out)
    return path


def test_daemon_side_never_imports_llama_cpp(spec: ModelSpec) -> None:
    """model_info and fingerprint answer from the GGUF header; only the child loads llama.cpp."""
    code = (
        "import sys\nfrom qmd.server.models.worker import WorkerClient, ModelSpec, fingerprint\n"
        f"spec = ModelSpec('embed', {spec.path!r})\nw = WorkerClient()\ninfo = w.model_info(spec)\nfingerprint(spec)\n"
        "assert not info['loaded'] and w.status()['pid'] is None\n"
        "heavy = {'llama_cpp', 'numpy'} & set(sys.modules)\nassert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_model_info_reads_the_gguf(spec: ModelSpec) -> None:
    info = WorkerClient().model_info(spec)
    assert info["arch"] == "bert"
    assert info["n_embd"] == 384
    assert info["n_ctx_train"] == 512 and info["n_ctx"] == 512
    assert info["pooling"] == "mean"
    assert info["chat_template"] is False
    assert info["file_size"] == 25_285_312
    assert info["sha256"] == MINILM_SHA256
    assert info["prompt_format"] == "plain"
    assert info["loaded"] is False and info["context_live"] is False
    assert info["fingerprint"] == fingerprint(spec)


def test_fingerprint_follows_file_content_and_format(
    spec: ModelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f16 = ModelSpec("embed", str(require(MINILM_F16, "the F16 MiniLM GGUF")))
    assert fingerprint(spec) != fingerprint(f16)
    link = tmp_path / "same-model.gguf"
    link.symlink_to(spec.path)
    assert fingerprint(ModelSpec("embed", str(link))) == fingerprint(spec), "identity is content, not path"
    plain = fingerprint(spec)
    monkeypatch.setattr(inference, "prompt_format", lambda path: "embeddinggemma")
    assert fingerprint(spec) != plain, "the same file with another prompt format is another vector space"


def test_prompt_format_per_family(tmp_path: Path) -> None:
    cases = {
        "gemma.gguf": (
            {"general.architecture": "gemma-embedding", "general.name": "EmbeddingGemma 300m"},
            "embeddinggemma",
        ),
        "qwen.gguf": ({"general.architecture": "qwen3", "general.name": "Qwen3-Embedding-0.6B"}, "qwen3-embedding"),
        "bert.gguf": ({"general.architecture": "bert", "general.name": "all-MiniLM-L6-v2"}, "plain"),
    }
    for name, (kv, expected) in cases.items():
        path = gguf(tmp_path / name, {**kv, "tokenizer.ggml.token_type": [1, 2, 3], "bert.context_length": 512})
        assert prompt_format(str(path)) == expected, name
        assert read_gguf_metadata(str(path))["general.architecture"] == kv["general.architecture"]
    assert format_query("embeddinggemma", "q") == "task: search result | query: q"
    assert format_document("embeddinggemma", "body", None) == "title: none | text: body"
    assert format_document("embeddinggemma", "body", "T") == "title: T | text: body"
    assert format_query("qwen3-embedding", "q") == "Instruct: Retrieve relevant documents for the given query\nQuery: q"
    assert format_document("qwen3-embedding", "body", "T") == "T\nbody"
    assert format_document("qwen3-embedding", "body", None) == "body"
    # a plain model (MiniLM) reads the chunk's context as its first line: no prompt prefix
    assert format_query("plain", "q") == "q" and format_document("plain", "body", "T › Sec") == "T › Sec\nbody"
    assert format_document("plain", "body", None) == format_document("plain", "body", "") == "body"


def test_bad_model_files_fail_cleanly(tmp_path: Path) -> None:
    w = WorkerClient()
    with pytest.raises(InferenceError, match="not found"):
        w.embed(ModelSpec("embed", str(tmp_path / "missing.gguf")), ["x"], kind="query")
    html = tmp_path / "captive-portal.gguf"
    html.write_text("<html>sign in</html>")
    with pytest.raises(InferenceError, match="not a GGUF"):
        w.model_info(ModelSpec("embed", str(html)))
    assert w.status()["pid"] is None, "no child was needed to refuse these"


@pytest.mark.slow
def test_embeddings_match_sentence_transformers(worker: WorkerClient, spec: ModelSpec, reference: dict) -> None:
    vectors = worker.embed(spec, reference["texts"], kind="document")
    assert isinstance(vectors, Embeddings) and vectors.clipped == ()
    for text, got, want in zip(reference["texts"], vectors, reference["embeddings"], strict=True):
        assert len(got) == 384
        assert math.isclose(math.sqrt(dot(got, got)), 1.0, abs_tol=1e-5)
        assert dot(got, want) > 0.99, text
    query = worker.embed(spec, [reference["texts"][0]], kind="query")[0]
    fundraising, bread, bootstrapping = (dot(query, vectors[i]) for i in (1, 2, 3))
    assert fundraising > bootstrapping > bread
    assert fundraising == pytest.approx(0.594, abs=0.02) and bread == pytest.approx(0.119, abs=0.02)


@pytest.mark.slow
def test_token_counts_match_reference(worker: WorkerClient, spec: ModelSpec, reference: dict) -> None:
    counts = worker.count_tokens(spec, reference["texts"])
    assert counts == [len(ids) for ids in reference["token_ids"]]


@pytest.mark.slow
def test_overlong_and_odd_inputs_embed(worker: WorkerClient, spec: ModelSpec) -> None:
    texts = [
        "",
        " \n\t",
        "日本語の検索エンジン",
        "🚀🔥 emoji only 👍🏽",
        LONG,
        "NUL\x00byte [SEP] [CLS] \ud800 lone surrogate",
    ]
    vectors = worker.embed(spec, texts, kind="document")
    assert len(vectors) == len(texts)
    for v in vectors:
        assert len(v) == 384 and math.isclose(math.sqrt(dot(v, v)), 1.0, abs_tol=1e-5)
    assert vectors.clipped == (4,), "only the 5000-word input exceeds the model's 512 tokens"
    assert vectors.limit == 512 and vectors.n_tokens[4] == 5002
    # Clipping cuts at the token level and keeps [SEP]: the same as embedding the first 510 words.
    head = worker.embed(spec, ["word " * 510], kind="document")
    assert head.clipped == () and dot(head[0], vectors[4]) > 0.9999
    assert worker.count_tokens(spec, [LONG]) == [5002]


@pytest.mark.slow
def test_chunking_runs_with_the_models_tokenizer(worker: WorkerClient, spec: ModelSpec) -> None:
    body = "# Fundraising\n\n" + "\n\n".join(
        f"## Round {i}\n\nAngel investors and venture firms fund seed rounds; founders pitch, negotiate "
        f"a valuation and sell equity or SAFEs. Paragraph {i} adds traction figures and a 日本語 note."
        for i in range(40)
    )
    chunks = worker.chunk(spec, body, max_tokens=128)
    assert len(chunks) > 5
    assert chunks[0].start == 0 and chunks[-1].end == len(body)
    assert all(c.text == body[c.start : c.end] for c in chunks)
    assert worker.count_tokens(spec, [c.text for c in chunks]) == [c.tokens for c in chunks]
    assert all(c.tokens <= 128 and not c.clipped for c in chunks)
    assert worker.chunk(spec, "   \n", max_tokens=128) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGABRT], ids=["SIGKILL", "SIGABRT"])
def test_crash_mid_batch_fails_that_request_only(worker: WorkerClient, spec: ModelSpec, sig: signal.Signals) -> None:
    expected = worker.embed(spec, ["how to raise money for a startup"], kind="query")[0]
    pid = worker.status()["pid"]
    restarts = worker.status()["restarts"]
    failure: list[BaseException] = []

    def long_batch() -> None:
        try:
            worker.embed(spec, [LONG] * 400, kind="document")  # ~15 s of work
        except BaseException as e:
            failure.append(e)

    t = threading.Thread(target=long_batch)
    started = time.monotonic()
    t.start()
    time.sleep(0.5)
    os.kill(pid, sig)
    t.join(timeout=10)
    assert not t.is_alive() and time.monotonic() - started < 5, "the failure is immediate, not a timeout"
    assert len(failure) == 1 and isinstance(failure[0], InferenceError)
    message = str(failure[0])
    assert f"crashed ({sig.name}) while embedding 400 texts" in message, message
    assert "restarted on the next request" in message
    assert worker.status()["pid"] is None and sig.name in worker.status()["last_crash"].reason
    again = worker.embed(spec, ["how to raise money for a startup"], kind="query")[0]
    assert dot(again, expected) > 0.99999
    assert worker.status()["pid"] not in (None, pid)
    assert worker.status()["restarts"] == restarts + 1


@pytest.mark.slow
def test_child_killed_while_idle_restarts_transparently(worker: WorkerClient, spec: ModelSpec) -> None:
    worker.embed(spec, ["warm"], kind="query")
    pid = worker.status()["pid"]
    os.kill(pid, signal.SIGKILL)
    # Reapable, not just a zombie leader: llama.cpp's threads may still be exiting.
    wait_for(lambda: os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None)
    assert len(worker.embed(spec, ["still fine"], kind="query")[0]) == 384
    assert worker.status()["pid"] != pid
    assert "SIGKILL" in worker.status()["last_crash"].reason


@pytest.mark.slow
def test_timeout_stops_a_stuck_request(worker: WorkerClient, spec: ModelSpec) -> None:
    worker.embed(spec, ["warm"], kind="query")
    with pytest.raises(InferenceError, match=r"did not answer within 0.3 s while embedding 400 texts"):
        worker.embed(spec, [LONG] * 400, kind="document", timeout=0.3)
    assert len(worker.embed(spec, ["next"], kind="query", timeout=30)[0]) == 384


@pytest.mark.slow
def test_concurrent_callers_get_their_own_results(worker: WorkerClient, spec: ModelSpec) -> None:
    groups = [[f"note {g}-{i}: {topic}" for i in range(6)] for g, topic in enumerate(["bread", "git", "money", "sql"])]
    serial = [worker.embed(spec, texts, kind="document") for texts in groups]
    results: dict[int, list[list[float]]] = {}

    def run(g: int) -> None:
        for _ in range(3):
            results[g] = worker.embed(spec, groups[g], kind="document")
            assert all(dot(a, b) > 0.99999 for a, b in zip(results[g], serial[g], strict=True))

    threads = [threading.Thread(target=run, args=(g,)) for g in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1, 2, 3]
    for g in range(4):
        assert all(dot(a, b) > 0.99999 for a, b in zip(results[g], serial[g], strict=True))


def test_a_background_embed_goes_in_slices_a_query_can_pass(
    worker: WorkerClient, spec: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embed job's batch is sent in requests of about BACKGROUND_SLICE_S each (as many texts
    as the pace measured on earlier background calls fits: here one), and put back together
    exactly: the same vectors, clipping and token counts as one interactive request. A query's
    few words embed far faster than a chunk, and they do not set the background pace: when they
    did, the next slice took 50 chunks."""
    texts = [f"note {i}: sourdough starter and rye flour" for i in range(9)]
    texts[6] = LONG
    whole = worker.embed(spec, texts, kind="document")
    with inference.background_lane():
        worker.embed(spec, texts[:3], kind="document")  # the background pace, measured
    worker.embed(spec, ["rye"], kind="query")
    monkeypatch.setattr(inference, "BACKGROUND_SLICE_S", 1e-6)
    before = len(worker.status()["recent"])
    with inference.background_lane():
        sliced = worker.embed(spec, texts, kind="document")
    calls = [r for r in worker.status()["recent"][before:] if r["lane"] == "background"]
    assert [c["activity"].split()[1] for c in calls] == ["1"] * len(texts)
    chunks = [f"chunk {i}: " + "a paragraph on sourdough starters, rye flour and hydration " * 20 for i in range(12)]
    with inference.background_lane():
        worker.embed(spec, chunks[:2], kind="document")  # ~250 tokens each: tens of ms a chunk
    monkeypatch.setattr(inference, "BACKGROUND_SLICE_S", 0.02)
    for _ in range(3):
        worker.embed(spec, ["rye"], kind="query")  # a few ms each
    before = len(worker.status()["recent"])
    with inference.background_lane():
        worker.embed(spec, chunks, kind="document")
    sizes = [int(r["activity"].split()[1]) for r in worker.status()["recent"][before:] if r["lane"] == "background"]
    assert max(sizes) <= 2, sizes  # sliced by the chunks' own pace, not the queries'
    assert sliced.clipped == whole.clipped == (6,) and sliced.n_tokens == whole.n_tokens
    assert all(dot(a, b) > 0.99999 for a, b in zip(sliced, whole, strict=True))


CHUNKS = [f"chunk {i}: " + "a paragraph on sourdough starters, rye flour and hydration " * 20 for i in range(40)]
"""About 250 tokens each: tens of milliseconds a decode on 2 cores."""


def busy_with(worker: WorkerClient, activity: str) -> bool:
    """Whether the call running now is one whose activity starts with `activity`."""
    return str((worker.status()["busy"] or {}).get("activity", "")).startswith(activity)


def background_calls(worker: WorkerClient, since: int) -> list[dict[str, object]]:
    return [r for r in worker.status()["recent"][since:] if r["lane"] == "background"]


def test_a_query_takes_the_worker_from_a_background_embed_in_flight(
    worker: WorkerClient, spec: ModelSpec, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A background request in flight yields to an interactive call that comes in: it answers for
    the texts it has done, the query runs, and the rest goes again; put together, the vectors,
    token counts and clipping are those of one uninterrupted request. Here the slice is made
    large enough to carry all 40 chunks (a second or two of work) so that only yielding lets
    the query in before the end."""
    texts = [*CHUNKS[:30], LONG, *CHUNKS[30:]]
    whole = worker.embed(spec, texts, kind="document")
    with inference.background_lane():
        worker.embed(spec, CHUNKS[:2], kind="document")  # the background pace, measured
    monkeypatch.setattr(inference, "BACKGROUND_SLICE_S", 600.0)
    before = len(worker.status()["recent"])
    done: list[Embeddings] = []

    def embed() -> None:
        with inference.background_lane():
            done.append(worker.embed(spec, texts, kind="document"))

    thread = threading.Thread(target=embed)
    thread.start()
    wait_for(lambda: busy_with(worker, "embedding 41 texts"))
    worker.embed(spec, ["rye"], kind="query")
    thread.join()
    calls = worker.status()["recent"][before:]
    first, query, rest = calls[0], calls[1], calls[2:]
    assert first["lane"] == "background" and str(first["outcome"]).startswith("yielded after "), calls
    assert query["lane"] == "interactive" and query["started_at"] >= first["ended_at"]  # type: ignore[operator]
    assert rest and all(r["lane"] == "background" and r["outcome"] == "ok" for r in rest), calls
    (sliced,) = done
    assert sliced.clipped == whole.clipped == (30,) and sliced.n_tokens == whole.n_tokens
    assert all(dot(a, b) > 0.99999 for a, b in zip(sliced, whole, strict=True))
    worker.embed(spec, ["after"], kind="query")  # the child's stderr of the yield has been forwarded by now
    time.sleep(0.2)
    said = [r.getMessage() for r in caplog.records if r.name == "qmd.inference" and r.levelno >= logging.WARNING]
    assert not [m for m in said if "compute" in m or "decode" in m], f"a yield is not news in the daemon's log: {said}"


def test_a_background_embed_finishes_under_a_query_waiting_all_the_time(
    worker: WorkerClient, spec: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the yield flag raised throughout (queries arriving back to back), a background slice
    answers at once with nothing, and the next one then finishes a text before it yields: the
    job slows down but gets done, to the same vectors."""
    texts = CHUNKS[:4]
    whole = worker.embed(spec, texts, kind="document")
    with inference.background_lane():
        worker.embed(spec, CHUNKS[:2], kind="document")
    monkeypatch.setattr(inference, "BACKGROUND_SLICE_S", 600.0)
    flag = worker._yield
    assert flag is not None, "a started worker has its yield flag"
    flag.set(True)
    monkeypatch.setattr(flag, "set", lambda raised: None)  # nothing lowers it
    before = len(worker.status()["recent"])
    with inference.background_lane():
        sliced = worker.embed(spec, texts, kind="document")
    outcomes = [str(c["outcome"]) for c in background_calls(worker, before)]
    assert outcomes[-1] == "ok" and len(outcomes) <= 2 * len(texts), outcomes
    assert all(o.startswith("yielded after 0 of ") for o in outcomes[0:-1:2]), outcomes
    assert all(o.startswith("yielded after ") and " 0 of " not in o for o in outcomes[1:-1:2]), outcomes
    monkeypatch.undo()
    flag.set(False)
    assert sliced.n_tokens == whole.n_tokens
    assert all(dot(a, b) > 0.99999 for a, b in zip(sliced, whole, strict=True))


def test_every_route_that_answers_a_search_holds_background_work() -> None:
    """`SEARCHES` (the paths the HTTP layer wraps in `WorkerClient.searching`) is every route whose
    answer is a search result, and MCP, which the app mounts: a search route added or renamed
    without it would queue behind a background embed again."""
    from starlette.routing import Route

    from qmd.server.http.app import SEARCHES
    from qmd.server.http.routes import router
    from qmd.server.http.wire import QueryResponse, SearchResponse

    answers = {
        r.path
        for r in router.routes
        if isinstance(r, Route)
        and isinstance(getattr(r, "response_model", None), type)
        and issubclass(r.response_model, (QueryResponse, SearchResponse))  # type: ignore[attr-defined]
    }
    assert answers == {"/query", "/search", "/v1/query", "/v1/keyword", "/v1/vector"}
    assert answers | {"/mcp"} == SEARCHES


def test_background_calls_wait_while_a_search_runs_but_not_for_long(
    worker: WorkerClient, spec: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search that starts makes the background call in flight yield at once, before the search
    asks anything of a model; while it runs no background call starts and interactive calls still
    go; the background call goes when the search ends, or after HOLD_S of searches, and then runs
    its slice to the end."""
    done = threading.Event()

    def embed(texts: list[str]) -> None:
        with inference.background_lane():
            worker.embed(spec, texts, kind="document")
        done.set()

    def waiting() -> int:
        return int(worker.status()["waiting"]["background"])

    with inference.background_lane():
        worker.embed(spec, CHUNKS[:2], kind="document")  # the background pace, measured
    monkeypatch.setattr(inference, "BACKGROUND_SLICE_S", 600.0)
    monkeypatch.setattr(inference, "HOLD_S", 600.0)
    before = len(worker.status()["recent"])
    thread = threading.Thread(target=embed, args=(CHUNKS,))
    thread.start()
    wait_for(lambda: busy_with(worker, "embedding 40 texts"))
    with worker.searching():
        wait_for(lambda: waiting() == 1)  # it yielded, and what is left waits
        worker.embed(spec, ["rye"], kind="query")
        time.sleep(0.2)
        assert not done.is_set() and waiting() == 1
    thread.join(timeout=60)  # the search ended: the rest went
    calls = worker.status()["recent"][before:]
    assert str(calls[0]["outcome"]).startswith("yielded after ") and calls[1]["lane"] == "interactive", calls
    assert done.is_set() and calls[-1]["outcome"] == "ok"

    done.clear()
    monkeypatch.setattr(inference, "HOLD_S", 1.0)
    before = len(worker.status()["recent"])
    with worker.searching():
        thread = threading.Thread(target=embed, args=(CHUNKS[:10],))
        held = time.monotonic()
        thread.start()
        wait_for(lambda: waiting() == 1)
        time.sleep(0.2)
        assert not done.is_set()
        wait_for(lambda: busy_with(worker, "embedding 10 texts"))
        assert time.monotonic() - held >= 1.0  # held no longer than HOLD_S
        with worker.searching():  # another search starts: the slice that waited HOLD_S does not yield to it
            thread.join(timeout=30)
        assert done.is_set()
    assert [c["outcome"] for c in background_calls(worker, before)] == ["ok"]


def test_backlog_counts_the_call_running_and_the_interactive_calls_in_line(
    worker: WorkerClient, spec: ModelSpec
) -> None:
    texts = [f"note {i}: a paragraph on sourdough starters, rye flour and hydration" * 4 for i in range(120)]
    worker.embed(spec, texts, kind="document")  # the pace of this model, measured
    assert worker.backlog() == 0.0
    done = threading.Event()

    def embed() -> None:
        worker.embed(spec, texts, kind="document")
        done.set()

    thread = threading.Thread(target=embed)
    thread.start()
    wait_for(lambda: worker.status()["busy"] is not None or done.is_set())
    seen = worker.backlog()
    thread.join()
    assert done.is_set() and seen > 0.0, "a call of a measured kind was running"
    assert worker.backlog() == 0.0


@pytest.mark.slow
def test_idle_contexts_are_freed_and_rebuilt(spec: ModelSpec) -> None:
    w = WorkerClient(idle_seconds=1, n_threads=2)
    try:
        before = w.embed(spec, ["idle disposal keeps the weights", LONG], kind="document")
        busy = w.status()
        assert busy["contexts_live"] == 1 and len(busy["models_loaded"]) == 1
        wait_for(lambda: w.status()["contexts_live"] == 0, timeout=5)
        idle = w.status()
        assert idle["pid"] == busy["pid"] and idle["models_loaded"] == busy["models_loaded"]
        assert idle["rss_bytes"] < busy["rss_bytes"] - 20 * 2**20, (busy["rss_bytes"], idle["rss_bytes"])
        assert w.model_info(spec)["loaded"] and not w.model_info(spec)["context_live"]
        after = w.embed(spec, ["idle disposal keeps the weights", LONG], kind="document")
        assert after == before, "a rebuilt context gives identical vectors"
        assert w.status()["contexts_live"] == 1 and w.status()["restarts"] == 0
    finally:
        w.close()


@pytest.mark.slow
def test_idle_timer_waits_for_in_flight_work(spec: ModelSpec) -> None:
    """A timer far shorter than the request: freeing the context mid-decode would crash the child."""
    w = WorkerClient(idle_seconds=0.05, n_threads=2)
    try:
        first = w.embed(spec, ["x"], kind="query")
        for _ in range(3):
            vectors = w.embed(spec, ["x"] + [LONG] * 3, kind="document")
            assert vectors[0] == first[0]
            time.sleep(0.1)
        assert w.status()["restarts"] == 0 and w.status()["last_crash"] is None
    finally:
        w.close()


@pytest.mark.slow
def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch, spec: ModelSpec) -> None:
    monkeypatch.setenv("QMD_IDLE_SECONDS", "7.5")
    monkeypatch.setenv("QMD_THREADS", "3")
    monkeypatch.setenv("QMD_FORCE_CPU", "1")
    w = WorkerClient()
    assert (w.idle_seconds, w.n_threads, w.force_cpu) == (7.5, 3, True)
    try:
        w.count_tokens(spec, ["x"])
        assert w.status()["backend"] == "CPU"
    finally:
        w.close()
    monkeypatch.setenv("QMD_THREADS", "many")
    with pytest.raises(ValueError, match="QMD_THREADS must be a positive int"):
        WorkerClient()


@pytest.mark.parametrize(
    ("value", "forced"),
    [
        (None, False),
        ("", False),
        ("0", False),
        ("false", False),
        ("FALSE", False),
        ("No", False),
        (" off ", False),
        ("1", True),
        ("true", True),
        ("yes", True),
    ],
)
def test_force_cpu_reads_false_ish_values_as_off(
    monkeypatch: pytest.MonkeyPatch, value: str | None, forced: bool
) -> None:
    """`QMD_FORCE_CPU=false` once forced the CPU: only unset and false-ish values leave the GPU allowed."""
    if value is None:
        monkeypatch.delenv("QMD_FORCE_CPU", raising=False)
    else:
        monkeypatch.setenv("QMD_FORCE_CPU", value)
    assert WorkerClient().force_cpu is forced
    assert WorkerClient(force_cpu=not forced).force_cpu is not forced, "an explicit argument wins over the environment"


def test_without_llama_cpp_nothing_starts_and_the_message_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, spec: ModelSpec
) -> None:
    """qmd installed without its `models` extra: every model call fails at once with the command
    that installs it, no child is started, and the local embedder is unavailable, not an error."""
    monkeypatch.setattr(inference, "_llama_cpp_install", lambda: None)
    w = WorkerClient(n_threads=2)
    with pytest.raises(ModelsNotInstalled, match="llama-cpp-python is not installed") as caught:
        w.count_tokens(spec, ["x"])
    command = f"{shlex.quote(sys.executable)} -m pip install -e {shlex.quote(str(ROOT) + '[models]')}"
    assert command in caught.value.message, "this checkout's editable install, with the models extra"
    assert w.status()["pid"] is None and w.status()["models_missing"] == caught.value.message
    assert WorkerClient().model_info(spec)["arch"] == "bert", "GGUF metadata needs no llama.cpp"
    with pytest.raises(EmbedderUnavailable, match="model support is not installed"):
        Embedders(w).get(Config(models={"embed": spec.path}), ROOT)


@pytest.mark.slow
def test_failed_load_is_answered_and_native_log_reaches_the_daemon_log(
    spec: ModelSpec, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = gguf(tmp_path / "broken.gguf", {"general.architecture": "bert", "general.name": "no tensors"})
    w = WorkerClient(n_threads=2)
    try:
        with caplog.at_level(logging.WARNING, logger="qmd.inference"):
            with pytest.raises(InferenceError, match=r"failed: ValueError: Failed to load model .*llama.cpp: .*error"):
                w.embed(ModelSpec("embed", str(broken)), ["x"], kind="query")
            pid = w.status()["pid"]
            assert pid is not None, "a failed load is an error reply; the worker stays up"
            assert len(w.embed(spec, ["fine"], kind="query")[0]) == 384
            assert w.status()["pid"] == pid

            def logged(text: str) -> bool:
                return any(
                    f"inference worker {pid}: " in r.getMessage() and text in r.getMessage() for r in caplog.records
                )

            # llama.cpp's own lines: the load error, and MiniLM's tokenizer warning on every load.
            wait_for(lambda: logged("error loading model") and logged("special_eos_id is not in special_eog_ids"))
            assert not logged("print_info:"), "info-level chatter stays out of the daemon log"
    finally:
        w.close()


@pytest.mark.slow
def test_worker_that_cannot_start_says_so(spec: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inference.sys, "executable", "/bin/false")
    w = WorkerClient()
    with pytest.raises(InferenceError, match=r"inference worker exited with status 1 while starting"):
        w.embed(spec, ["x"], kind="query")
    assert w.status()["pid"] is None and w.status()["last_crash"].exit_code == 1
    monkeypatch.undo()
    assert len(w.embed(spec, ["x"], kind="query")[0]) == 384, "the next request tries again"
    w.close()


@pytest.mark.slow
def test_close_leaves_no_child(spec: ModelSpec) -> None:
    w = WorkerClient(n_threads=2)
    w.embed(spec, ["x"], kind="query")
    pid = w.status()["pid"]
    w.close()
    assert not Path(f"/proc/{pid}").exists(), "the child exited and was reaped"
    assert w.status()["pid"] is None
    with pytest.raises(InferenceError, match="shut down"):
        w.embed(spec, ["x"], kind="query")


@pytest.mark.slow
def test_child_exits_when_the_daemon_dies(spec: ModelSpec) -> None:
    """A SIGKILLed daemon closes the pipe; the orphaned worker sees EOF and exits."""
    code = (
        "import os, signal\nfrom qmd.server.models.worker import WorkerClient, ModelSpec\n"
        f"w = WorkerClient(n_threads=2)\nw.embed(ModelSpec('embed', {spec.path!r}), ['x'], kind='query')\n"
        "print(w.status()['pid'], flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL, r.stderr
    child = int(r.stdout)
    stat = Path(f"/proc/{child}/stat")
    wait_for(lambda: not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def test_weight_repacking_is_off_only_on_cpus_with_amx(tmp_path: Path) -> None:
    """llama.cpp's AMX repack of Q8_0 weights crashes on the first embed; the plain kernels do not."""
    from qmd.server.models.worker_child import cpu_has_amx

    amx, plain = tmp_path / "amx", tmp_path / "plain"
    amx.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n")
    plain.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert cpu_has_amx(str(amx)) and not cpu_has_amx(str(plain))
    assert not cpu_has_amx(str(tmp_path / "missing"))
