"""The remote generate backend: query expansion on an OpenAI-compatible `/v1/chat/completions` endpoint.

Against `python -m llama_cpp.server` serving SmolLM2-135M-Instruct (a chat model: the endpoint
applies its ChatML template) on loopback, in process and end to end through the real CLI and
daemon; the failures a real server will not produce on demand (HTTP 500, a malformed answer, an
answer that never comes) against small servers on loopback sockets, in process.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_expansion
from conftest import (
    ECHOED_KEY,
    NOTES,
    Daemon,
    Env,
    Scripted,
    endpoint_error,
    free_port,
    require_llama_server,
    write,
)
from harness import LlamaServer, Reply, llama_cpp_server

from qmd.server.models.refs import RemoteRef, resolve_model
from qmd.server.models.remote import RemoteGenerateError, RemoteGenerator
from qmd.server.models.worker import wait_at_most
from qmd.server.search.expansion import (
    Expander,
    Prompt,
    build_prompt,
    parse_expansion,
    remote_expander,
    remote_generate,
)
from qmd.server.store.sqlite import Store

SECRET = "qmd-gen-secret-5d1e0b"
QUERY = "how do founders raise money"
SLOW_CPU = {"QMD_GENERATE_TIMEOUT": "180"}
"""SmolLM2 behind llama_cpp.server generated 6 tokens/s on 2 cores shared with other runs: 96 tokens take 20 s."""

store = test_expansion.store
"""A real index's Store for the expansion cache (the fixture of the local expander's tests)."""
settle = test_expansion.settle


# --- a real server on loopback ---


@pytest.fixture
def server(smollm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """SmolLM2 behind `llama_cpp.server` with its own chat template and an API key; stopped after the test."""
    require_llama_server()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    served = llama_cpp_server(smollm_model, log, "--n_ctx", "2048", alias="smollm", api_key=SECRET)
    yield served
    served.stop()


@pytest.mark.slow
def test_real_server_expands_through_the_shared_parser_and_cache(
    server: LlamaServer, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = RemoteGenerator(server.url, "smollm", environ={"QMD_GENERATE_API_KEY": SECRET, **SLOW_CPU})
    raws: list[str] = []
    chat = remote_generate(client)

    def recording(p: Prompt) -> str:
        raws.append(chat(p))
        return raws[-1]

    uri = f"{server.url}#smollm"
    expander = Expander(recording, uri, "smollm", True, store)
    first = expander.expand(QUERY)
    assert not first.cached and first.raw == raws[0] and raws[0].strip()
    # The very parser and fallback of the local model decide what is kept.
    assert first.lines == (parse_expansion(raws[0], QUERY) or [("lex", QUERY), ("vec", QUERY)])
    assert all(kind in ("lex", "vec", "hyde") for kind, _ in first.lines)
    assert "\n\n" not in raws[0]  # stopped at the end of its answer, as the prompt's stop asks
    if not first.fallback:
        settle(store)
        again = expander.expand(QUERY)
        assert again.cached and again.lines == first.lines and len(raws) == 1
        # Another model on the same endpoint, or the same model elsewhere, never gets those lines.
        for other in (f"{server.url}#other", uri.replace("127.0.0.1", "localhost")):
            assert Expander(recording, other, "smollm", True, store).cached(QUERY) is None

    refused = RemoteGenerator(server.url, "smollm", environ={"QMD_GENERATE_API_KEY": "wrong-key-9876"})
    with pytest.raises(RemoteGenerateError) as err:
        refused.chat([{"role": "user", "content": "hi"}], build_prompt(QUERY, "smollm", True).params)
    assert err.value.message == (
        f"the chat completions endpoint {server.url} refused the API key in QMD_GENERATE_API_KEY (401: Invalid API key)"
    )
    assert "HTTP Request: POST" in caplog.text  # debug logging was on: the check below means something
    assert SECRET not in caplog.text and "wrong-key-9876" not in caplog.text + err.value.message


@pytest.mark.slow
def test_cli_query_expands_on_the_endpoint_then_says_why_not(server: LlamaServer, env: Env, tmp_path: Path) -> None:
    env.vars.update(QMD_GENERATE_MODEL=f"{server.url}#smollm", QMD_GENERATE_API_KEY=SECRET, **SLOW_CPU)
    d = Daemon(env, "--log-level", "debug")
    env.vars["QMD_NO_AUTOSTART"] = "1"
    said: list[str] = []
    try:
        env.ok("collection", "add", str(write(tmp_path / "notes", NOTES)), "--name", "notes")
        r = env.qmd("query", QUERY, "--explain", "--no-rerank", "--expand")
        said.append(r.stdout + r.stderr)
        assert r.returncode == 0, r.stderr
        assert "expand: ran (" in r.stderr and "fundraising.md" in r.stdout, r.stderr
        answer = d.http.post("/v1/query", json={"query": QUERY, "rerank": False, "expand": True}).json()
        said.append(json.dumps(answer))
        expand = next(s for s in answer["stages"] if s["stage"] == "expand")
        # cached, unless its lines found nothing (then it is not kept)
        assert expand["status"] in ("ran", "cached") and answer["expansion"], expand

        server.stop()  # the endpoint goes away under a running daemon: keyword search still answers
        r = env.qmd("query", "sourdough loaf baking times", "--no-rerank", "--expand")
        said.append(r.stdout + r.stderr)
        assert r.returncode == 0 and "bread.md" in r.stdout and "Traceback" not in r.stderr
        assert "expand: skipped" in r.stderr, r.stderr
        assert f"cannot reach the chat completions endpoint {server.url} (" in r.stderr
        assert "is the server running?" in r.stderr
    finally:
        d.stop()
    said.append(d.output.read_text())
    assert "HTTP Request: POST" in said[-1]  # the daemon logged its requests at debug level
    for text in said:
        assert SECRET not in text


# --- failures, against loopback servers that misbehave on purpose ---


def completion(content: str | None) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}).encode()


def test_answer_goes_through_the_local_parser_and_sampling(
    scripted: Scripted, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QMD_GENERATE_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-for-openai-only")
    answer = (
        "lex: founders seed funding\nvec: how do startup founders raise money?\nchatter\nlex: founders seed funding"
    )
    scripted.replies = [(200, {}, completion(answer)), (200, {}, completion("I cannot help with that."))]
    expander = remote_expander(RemoteRef(scripted.url, "qwen"), store)
    exp = expander.expand(QUERY)
    assert (
        exp.lines
        == parse_expansion(answer, QUERY)
        == [
            ("lex", "founders seed funding"),
            ("vec", "how do startup founders raise money?"),
        ]
    )
    assert exp.raw == answer and not exp.fallback and expander.model_uri == f"{scripted.url}#qwen"
    prompt = build_prompt(QUERY, "qwen", True)
    body = scripted.bodies[0]
    assert body["model"] == "qwen" and body["messages"] == prompt.messages and body["stream"] is False
    assert (body["max_tokens"], body["stop"], body["temperature"], body["top_k"]) == (96, ["\n\n", "<|im_end|>"], 0, 40)
    assert (body["min_p"], body["repeat_penalty"]) == (0.0, 1.0)  # what the local worker fixes
    assert scripted.auth == [None]  # an OpenAI key is sent to OpenAI only
    other = remote_expander(RemoteRef(scripted.url, "qwen-other"), store).expand(QUERY)
    assert other.fallback and other.lines == [("lex", QUERY), ("vec", QUERY)]  # nothing usable; not the cache


def test_fine_tuned_name_gets_its_training_prompt(scripted: Scripted, store: Store) -> None:
    scripted.replies = [(200, {}, completion("lex: founders raise money"))]
    remote_expander(RemoteRef(scripted.url, "qmd-query-expansion-1.7B"), store).expand(QUERY)
    assert scripted.bodies[0]["messages"] == [
        {"role": "user", "content": f"/no_think Expand this search query: {QUERY}"}
    ]
    assert scripted.bodies[0]["temperature"] == 0.7


@pytest.mark.parametrize(
    ("replies", "message"),
    [
        ([(500, {}, b'{"error": {"message": "oops"}}')] * 2, "kept failing (500: oops) after 2 attempts"),
        ([(200, {}, b"<html>login</html>")], "not an OpenAI chat completion: no JSON in the answer (application/json)"),
        ([(200, {}, b'{"data": []}')], "not an OpenAI chat completion: no 'choices' list"),
        ([(200, {}, completion(None))], "not an OpenAI chat completion: the first choice has no message text"),
        (
            [(404, {}, b'{"error": "model not found"}')],
            "answered 404: model not found: it does not serve the model 'm'",
        ),
        (
            [(401, {}, b'{"detail": "bad key sk-echoed"}')],
            "refused the API key in QMD_GENERATE_API_KEY (401: bad key ***)",
        ),
    ],
)
def test_errors_name_the_endpoint_and_never_the_key(
    scripted: Scripted, replies: list[Reply], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = RemoteGenerator(scripted.url, "m", environ={"QMD_GENERATE_API_KEY": ECHOED_KEY})
    params = build_prompt(QUERY, "m", True).params
    said = endpoint_error(
        scripted, replies, lambda: client.chat([{"role": "user", "content": "hi"}], params), RemoteGenerateError, caplog
    )
    assert said.startswith(f"the chat completions endpoint {scripted.url} ")
    assert message in said


def test_endpoint_down_fails_at_once() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    t = time.monotonic()
    with pytest.raises(RemoteGenerateError) as err:
        RemoteGenerator(url, "m", environ={}).chat(
            [{"role": "user", "content": "hi"}], build_prompt("q", "m", True).params
        )
    assert time.monotonic() - t < 1.0  # no retry: waiting will not start a server
    assert err.value.message.startswith(f"cannot reach the chat completions endpoint {url} (")
    assert err.value.message.endswith("Connection refused): is the server running?")


def test_an_answer_that_never_comes_times_out_then_the_budget_ends_it_sooner(silent: str) -> None:
    params = build_prompt("q", "m", True).params
    t = time.monotonic()
    with pytest.raises(RemoteGenerateError) as err:
        RemoteGenerator(silent, "m", environ={"QMD_GENERATE_TIMEOUT": "0.6"}).chat(
            [{"role": "user", "content": "hi"}], params
        )
    assert 0.6 <= time.monotonic() - t < 1.5  # one deadline for every attempt: no retry after it
    assert err.value.message == f"the chat completions endpoint {silent} did not answer within 0.6 s (1 attempt)"

    t = time.monotonic()
    with wait_at_most(0.3), pytest.raises(RemoteGenerateError) as err:
        RemoteGenerator(silent, "m", environ={}).chat([{"role": "user", "content": "hi"}], params)
    assert 0.3 <= time.monotonic() - t < 1.0
    assert err.value.message == f"budget: gave up waiting for the chat completions endpoint {silent} (1 attempt)"


def test_settings_resolve_and_unusable_ones_fail_before_any_request(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("QMD_GENERATE_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    ref = resolve_model("generate", {}, {"QMD_GENERATE_MODEL": "http://127.0.0.1:9/v1/#qwen3:1.7b"}).ref
    assert ref == RemoteRef("http://127.0.0.1:9/v1", "qwen3:1.7b")
    assert resolve_model("generate", {"generate": "openai:gpt-4o-mini"}, {}).ref.uri == "openai:gpt-4o-mini"
    with pytest.raises(RemoteGenerateError, match="needs a model name: write it as http://127.0.0.1:9/v1#<model>"):
        remote_expander(RemoteRef("http://127.0.0.1:9/v1", None), store)
    with pytest.raises(RemoteGenerateError, match="openai:gpt-4o-mini needs an API key: set QMD_GENERATE_API_KEY"):
        RemoteGenerator("https://api.openai.com/v1", "gpt-4o-mini")
    for bad in ("soon", "0", "-1", "inf"):
        with pytest.raises(
            RemoteGenerateError, match=f"QMD_GENERATE_TIMEOUT must be a positive number of seconds, got '{bad}'"
        ):
            RemoteGenerator("http://127.0.0.1:9/v1", "m", environ={"QMD_GENERATE_TIMEOUT": bad})
