"""The remote embed backend: an OpenAI-compatible `/v1/embeddings` endpoint as the embed model.

End to end against `python -m llama_cpp.server` serving the MiniLM test GGUF on loopback
(a real daemon, the real CLI); error shapes a real server will not produce on demand
(404 for a model, 429, a malformed answer) against a small scripted server, in process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import (
    ECHOED_KEY,
    MODELS_DIR,
    NOTES,
    Daemon,
    Env,
    Scripted,
    endpoint_error,
    require,
    require_llama_server,
    write,
)
from harness import LlamaServer, Reply, llama_cpp_server, scripted_endpoint

from qmd.server.config import Config
from qmd.server.models.embedders import Embedders, EmbedderUnavailable
from qmd.server.models.remote import RemoteBackend, RemoteEmbedError
from qmd.server.models.worker import WorkerClient

MODEL = "all-MiniLM-L6-v2-Q8_0.gguf"
SECRET = "qmd-test-secret-7f3a9c"


@pytest.fixture(scope="module")
def model() -> Path:
    """The test GGUF, and the `server` extra of llama-cpp-python that serves it."""
    require_llama_server()
    return require(MODELS_DIR / MODEL, "the MiniLM test embedder (../shared/models)")


@contextmanager
def llama_server(model: Path, tmp_path: Path, api_key: str | None = None) -> Iterator[LlamaServer]:
    """`python -m llama_cpp.server --embedding true` on a free loopback port, until the block ends."""
    served = llama_cpp_server(
        model, tmp_path / "llama-server.log", "--embedding", "true", alias="minilm", api_key=api_key
    )
    try:
        yield served
    finally:
        served.stop()


def remote_env(env: Env, url: str, key: str | None = None) -> Env:
    """The daemon's env: the endpoint as its embed model, a key only when given."""
    env.vars.pop("OPENAI_API_KEY", None)
    env.vars["QMD_EMBED_MODEL"] = f"{url}#minilm"
    if key is None:
        env.vars.pop("QMD_EMBED_API_KEY", None)
    else:
        env.vars["QMD_EMBED_API_KEY"] = key
    return env


@pytest.mark.slow
def test_remote_embed_search_switch_and_server_down(env: Env, model: Path, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", NOTES)
    with llama_server(model, tmp_path) as server:
        d = Daemon(remote_env(env, server.url))
        try:
            env.ok("collection", "add", str(notes), "--name", "notes")
            out = env.ok("embed")  # a local endpoint needs no key
            assert "documents 4 ·" in out and "0 pending" in out, out
            assert env.json("vsearch", "sourdough bread", "--json")[0]["file"] == "qmd://notes/cooking/bread.md"
            hits = env.json("vsearch", "who funds early startups", "--json")
            assert hits[0]["file"] == "qmd://notes/fundraising.md"
            assert 0.3 <= hits[0]["score"] <= 1.0
            remote = d.http.get("/v1/status").json()["vector"]
            assert remote["model"] == f"{server.url}#minilm" and "nothing pending" in remote["message"]

            server.stop()  # the endpoint goes away under a running daemon
            r = env.qmd("vsearch", "sourdough bread")
            assert r.returncode == 0
            assert "vector search unavailable — the query could not be embedded: " in r.stderr
            assert f"cannot reach the embeddings endpoint {server.url} (" in r.stderr
            assert "Connection refused): is the server running?" in r.stderr
            assert "showing keyword results instead" in r.stderr and "bread.md" in r.stdout
            (notes / "new.md").write_text("# New\n\nA note written while the server was down.\n")
            env.ok("update")
            r = env.qmd("embed")
            assert r.returncode == 1 and "Traceback" not in r.stderr
            assert f"cannot reach the embeddings endpoint {server.url}" in r.stderr
            assert "is the server running?" in r.stderr
        finally:
            d.stop()

    env.vars["QMD_EMBED_MODEL"] = str(model)  # back to the same model, run locally: another space
    d = Daemon(env)
    try:
        local = d.http.get("/v1/status").json()["vector"]
        assert local["fingerprint"] != remote["fingerprint"]
        assert "vector search unavailable — 5 documents pending" in env.ok("status")
    finally:
        d.stop()


@pytest.mark.slow
def test_api_key_checked_and_never_shown(env: Env, model: Path, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", NOTES)
    said: list[str] = []
    with llama_server(model, tmp_path, api_key=SECRET) as server:
        url = server.url
        with pytest.raises(RemoteEmbedError) as err:  # OPENAI_API_KEY is not sent to a non-OpenAI host
            RemoteBackend(url, "minilm", environ={"OPENAI_API_KEY": SECRET}).probe()
        assert "requires an API key (401: Invalid API key): set QMD_EMBED_API_KEY" in err.value.message
        assert "(OPENAI_API_KEY is sent only to api.openai.com)" in err.value.message

        d = Daemon(remote_env(env, url, "wrong-key-1234"), "--log-level", "debug")
        try:
            env.ok("collection", "add", str(notes), "--name", "notes")
            refused = f"the embeddings endpoint {url} refused the API key in QMD_EMBED_API_KEY (401: Invalid API key)"
            status, embed, vsearch = env.qmd("status"), env.qmd("embed"), env.qmd("vsearch", "sourdough")
            assert status.returncode == 0 and refused in status.stdout
            assert embed.returncode == 1 and refused in embed.stderr and "Traceback" not in embed.stderr
            assert vsearch.returncode == 0 and "showing keyword results instead" in vsearch.stderr
            said += [r.stdout + r.stderr for r in (status, embed, vsearch)]
        finally:
            d.stop()
        said.append(d.output.read_text())  # the next daemon on this port writes the same file

        d = Daemon(remote_env(env, url, SECRET), "--log-level", "debug")
        try:
            runs = [env.qmd("embed"), env.qmd("vsearch", "sourdough bread"), env.qmd("status")]
            assert [r.returncode for r in runs] == [0, 0, 0] and "0 pending" in runs[0].stdout
            assert "bread.md" in runs[1].stdout and not runs[1].stderr  # real vector results, no fallback
            said += [r.stdout + r.stderr for r in runs] + [json.dumps(d.http.get("/v1/status").json())]
        finally:
            d.stop()
        said.append(d.output.read_text())
    assert "HTTP Request: POST" in said[-1]  # debug logging was on: the check below means something
    for text in said:
        assert SECRET not in text and "wrong-key-1234" not in text


# --- error shapes, against a scripted endpoint ---


def good_vectors(body: dict) -> Reply:
    """Reversed order, explicit indices, lengths 5 * (i + 1): the client must sort and normalise."""
    data = [{"index": i, "embedding": [3.0 * (i + 1), 4.0 * (i + 1)]} for i in range(len(body["input"]))]
    return 200, {}, json.dumps({"data": data[::-1]}).encode()


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    """A scripted `/v1/embeddings` endpoint that answers with good vectors once its script is done."""
    with scripted_endpoint(good_vectors) as server:
        yield server


def test_vectors_are_sorted_and_unit_length(scripted: Scripted) -> None:
    got = RemoteBackend(scripted.url, "m", environ={}).embed(["a", "b", "c"], "document")
    assert [[round(x, 6) for x in v] for v in got] == [[0.6, 0.8]] * 3
    assert got.clipped == () and got.limit == 512 and scripted.auth == [None]


def test_retries_429_and_5xx_then_succeeds(scripted: Scripted) -> None:
    again = (429, {"Retry-After": "0"}, b'{"error": {"message": "slow down"}}')
    scripted.replies = [again, (503, {"Retry-After": "0"}, b"busy"), again]
    assert len(RemoteBackend(scripted.url, "m", environ={}).embed(["a"], "document")) == 1
    assert len(scripted.auth) == 4


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ((404, {}, b'{"error": {"message": "model \\"m\\" not found"}}'), 'answered 404: model "m" not found: it does'),
        ((503, {"Retry-After": "0"}, b"overloaded"), "kept failing (503: overloaded) after 2 attempts"),
        ((200, {"Content-Type": "text/html"}, b"<html>login</html>"), "no JSON 'data' list"),
        ((200, {}, b'{"data": []}'), "0 embeddings for 1 inputs"),
        ((200, {}, b'{"data": [{"embedding": "AAAA"}]}'), "not a list of numbers"),
        ((200, {}, b'{"data": [{"embedding": [0, 0]}]}'), "zero or not finite"),
        ((401, {}, b'{"detail": "bad key sk-echoed"}'), "refused the API key in QMD_EMBED_API_KEY (401: bad key ***)"),
    ],
)
def test_errors_name_the_endpoint(
    scripted: Scripted, reply: Reply, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = RemoteBackend(scripted.url, "m", environ={"QMD_EMBED_API_KEY": ECHOED_KEY})
    said = endpoint_error(scripted, [reply, reply], lambda: backend.embed(["a"], "query"), RemoteEmbedError, caplog)
    assert said.startswith(f"the embeddings endpoint {scripted.url} ")
    assert message in said


def test_fingerprint_names_endpoint_and_model_not_key(scripted: Scripted, monkeypatch: pytest.MonkeyPatch) -> None:
    def fingerprint(uri: str, key: str | None = None) -> str:
        monkeypatch.delenv("QMD_EMBED_API_KEY", raising=False)
        if key:
            monkeypatch.setenv("QMD_EMBED_API_KEY", key)
        emb = Embedders(WorkerClient()).get(Config(models={"embed": uri}), Path("/"))
        assert emb.dims == 2 and emb.chunk_tokens == 512 and emb.model_name == uri
        return emb.fingerprint

    base = fingerprint(f"{scripted.url}#m")
    assert fingerprint(f"{scripted.url}#m", key="k1") == fingerprint(f"{scripted.url}#m", key="k2") == base
    assert fingerprint(f"{scripted.url}#other") != base
    assert fingerprint(scripted.url.replace("127.0.0.1", "localhost") + "#m") != base


def test_unusable_settings_fail_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("QMD_EMBED_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    embedders = Embedders(WorkerClient())
    with pytest.raises(EmbedderUnavailable, match="openai:text-embedding-3-small needs an API key"):
        embedders.get(Config(models={"embed": "openai:text-embedding-3-small"}), Path("/"))
    with pytest.raises(EmbedderUnavailable, match="needs a model name: write it as http://127.0.0.1:9/v1#<model>"):
        embedders.get(Config(models={"embed": "http://127.0.0.1:9/v1"}), Path("/"))
