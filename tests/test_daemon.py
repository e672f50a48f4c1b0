"""The daemon as a process and an HTTP server: health, lifecycle, guard, bad input."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import httpx
import pytest
from conftest import Daemon, Env, write

# Every test runs a real qmdd: integration, outside the fast run (-m "not slow").
pytestmark = pytest.mark.slow

FORBIDDEN_ORIGIN = (
    b'{"jsonrpc":"2.0","error":{"code":-32003,"message":"Forbidden: Origin not allowed: http://evil.com"},"id":null}'
)


def test_health_shape(daemon: Daemon) -> None:
    r = daemon.http.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    assert isinstance(body["uptime"], int) and body["uptime"] >= 0
    assert body["pid"] == daemon.proc.pid
    assert body["version"]
    assert body["index"] == "index"


def test_openapi_docs_served(daemon: Daemon) -> None:
    assert daemon.http.get("/docs").status_code == 200
    paths = daemon.http.get("/openapi.json").json()["paths"]
    assert {"/health", "/query", "/search", "/v1/keyword"} <= set(paths)


def test_unknown_route_is_404(daemon: Daemon) -> None:
    assert daemon.http.get("/nope").status_code == 404


@pytest.mark.parametrize(
    "path,method", [("/health", "GET"), ("/query", "POST"), ("/v1/status", "GET"), ("/nope", "GET")]
)
def test_guard_rejects_foreign_origin_on_every_route(daemon: Daemon, path: str, method: str) -> None:
    r = daemon.http.request(method, path, headers={"Origin": "http://evil.com"}, json={"searches": []})
    assert r.status_code == 403
    assert r.headers["content-type"] == "application/json"
    assert r.content == FORBIDDEN_ORIGIN


@pytest.mark.parametrize("origin", ["null", "http://127.0.0.1.evil.com", "file://x", "http://0.0.0.0:8181"])
def test_guard_rejects_hostile_origins(daemon: Daemon, origin: str) -> None:
    r = daemon.http.get("/health", headers={"Origin": origin})
    assert r.status_code == 403
    assert r.json()["error"]["code"] == -32003


def test_guard_rejects_rebound_host(daemon: Daemon) -> None:
    r = daemon.http.get("/health", headers={"Host": f"evil.example:{daemon.env.port}"})
    assert r.status_code == 403
    assert "Host not allowed" in r.json()["error"]["message"]


def test_guard_allows_local_browser_and_clients(daemon: Daemon) -> None:
    assert daemon.http.get("/health", headers={"Origin": "http://localhost:3000"}).status_code == 200
    assert daemon.http.get("/health", headers={"Host": f"localhost:{daemon.env.port}"}).status_code == 200


def test_allowed_hosts_env(env: Env) -> None:
    d = Daemon(env, extra_env={"QMD_ALLOWED_HOSTS": "qmd.internal"})
    try:
        assert d.http.get("/health", headers={"Host": "qmd.internal:8181"}).status_code == 200
        assert d.http.get("/health", headers={"Host": "other.internal"}).status_code == 403
    finally:
        d.stop()


def test_wildcard_bind_warns(env: Env) -> None:
    d = Daemon(env, "--host", "0.0.0.0")
    try:
        assert d.http.get("/health").status_code == 200
    finally:
        d.stop()
    assert "no QMD_ALLOWED_HOSTS" in d.output.read_text()


# -- bad input: clear 4xx, nothing changed ------------------------------------------


@pytest.mark.parametrize(
    "body,status,needle",
    [
        (b"{not json", 400, "malformed JSON"),
        (b'{"searches": [{"type": "lex", "query": "x"}], "collection": "notes"}', 400, "unknown field 'collection'"),
        (b'{"searches": [{"type": "lex", "query": "x"}], "limit": "many"}', 400, "limit"),
        (b'{"searches": [{"type": "lex", "query": "x"}], "limit": 0}', 400, "limit"),
        (b'{"searches": [{"type": "regex", "query": "x"}]}', 400, "searches.0.type"),
        (b'{"searches": []}', 400, "searches"),
        (b"{}", 400, "provide either 'query' (plain text) or 'searches' (typed sub-queries)"),
        (b"[]", 400, ""),
    ],
)
def test_query_bad_bodies(daemon: Daemon, body: bytes, status: int, needle: str) -> None:
    r = daemon.http.post("/query", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]


def test_query_accepts_camel_and_snake_case_and_answers_in_camel_case(env: Env, daemon: Daemon, notes: Path) -> None:
    """One request model for every surface: the original's camelCase, or the CLI's snake_case."""
    env.ok("collection", "add", str(notes), "--name", "notes")
    lex = [{"type": "lex", "query": "angel investors"}]
    camel = daemon.http.post("/query", json={"searches": lex, "minScore": 0.5, "budgetMs": 5000, "limit": 1}).json()
    snake = daemon.http.post("/query", json={"searches": lex, "min_score": 0.5, "budget_ms": 5000, "limit": 1}).json()
    assert camel["results"] == snake["results"] and len(camel["results"]) == 1
    for answer in (camel, snake):
        assert answer["belowMinScore"] is False and answer["budgetMs"] == 5000
        assert "elapsedMs" in answer and "elapsed_ms" not in answer
    top = daemon.http.post("/query", json={"searches": lex}).json()["results"][0]
    assert top["file"] == "qmd://notes/fundraising.md" and top["docid"].startswith("#")
    assert round(top["score"], 2) == top["score"]


def test_unknown_fields_are_listed(daemon: Daemon) -> None:
    r = daemon.http.post("/search", json={"searches": [{"type": "lex", "query": "x"}], "colections": ["a"], "lim": 3})
    assert r.status_code == 400
    assert sorted(r.json()["unknown_fields"]) == ["colections", "lim"]


def test_body_over_limit_is_413(daemon: Daemon) -> None:
    big = json.dumps({"searches": [{"type": "lex", "query": "x" * (2 * 1024 * 1024)}]})
    r = daemon.http.post("/query", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert "too large" in r.json()["error"]


def test_chunked_body_over_limit_is_413(daemon: Daemon) -> None:
    def gen():  # no content-length: the limit must hold for streamed bodies too
        for _ in range(40):
            yield b"x" * 65536

    r = daemon.http.post("/query", content=gen(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_bad_collection_requests_change_nothing(daemon: Daemon, env: Env, notes: Path) -> None:
    cfg = env.config / "qmd" / "index.yml"
    env.ok("collection", "add", str(notes), "--name", "notes")
    before = cfg.read_text()
    cases = [
        ({"path": str(notes), "name": "a/b"}, 400),
        ({"path": str(notes / "missing"), "name": "x"}, 400),
        ({"path": str(notes / "ideas.md"), "name": "x"}, 400),
        ({"path": str(notes), "name": "notes"}, 409),
        ({"path": str(notes)}, 409),
        ({"path": str(notes), "name": "y", "mask": "*.md"}, 400),
    ]
    for body, status in cases:
        r = daemon.http.post("/v1/collections", json=body)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]
    assert daemon.http.delete("/v1/collections/missing").status_code == 404
    assert daemon.http.post("/v1/collections/missing/rename", json={"new_name": "z"}).status_code == 404
    assert daemon.http.post("/v1/collections/notes/rename", json={"new_name": "bad/name"}).status_code == 400
    assert cfg.read_text() == before


def test_get_outside_collections_is_refused(daemon: Daemon, env: Env, notes: Path) -> None:
    env.ok("collection", "add", str(notes), "--name", "notes")
    for name in ("../../etc/passwd", "/etc/passwd", str(notes.parent / "elsewhere.md"), "qmd://notes/../../etc/passwd"):
        r = daemon.http.post("/v1/get", json={"file": name, "cwd": str(notes)})
        assert r.status_code in (403, 404), (name, r.text)
        assert "root:" not in r.text


def test_query_runs_lex_and_reports_vectors_skipped(daemon: Daemon, env: Env, notes: Path) -> None:
    env.ok("collection", "add", str(notes), "--name", "notes")
    r = daemon.http.post(
        "/query",
        json={
            "searches": [{"type": "lex", "query": "angel investors"}, {"type": "vec", "query": "who funds startups"}],
            "limit": 3,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    top = body["results"][0]
    assert top["file"] == "qmd://notes/fundraising.md"
    assert top["docid"].startswith("#") and len(top["docid"]) == 7
    assert top["lines"] == "6-9"
    assert top["snippet"].splitlines()[1] == "6: "
    assert "7: Angel investors fund early startups." in top["snippet"]
    stages = {s["stage"]: s["reason"] for s in body["skipped"]}
    assert "vector search unavailable" in stages["vector"] and "documents pending" in stages["vector"]
    assert 'not run: vec "who funds startups"' in stages["vector"]
    assert "rerank" in stages


# -- lifecycle ------------------------------------------------------------------------


def test_busy_port_is_one_line_and_exit_1(daemon: Daemon, env: Env) -> None:
    r = env.qmdd()
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "already in use" in lines[0], r.stderr


@pytest.mark.parametrize("setting", ["QMD_RERANK_PASSAGE_CHARS", "QMD_THREADS"])
def test_a_bad_setting_is_one_line_and_exit_1(env: Env, setting: str) -> None:
    r = env.qmdd(env={setting: "lots"})
    assert r.returncode == 1
    assert r.stderr.strip() == f"qmdd: {setting} must be a positive int, got 'lots'", r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_shut_down_cleanly(env: Env, sig: int) -> None:
    d = Daemon(env)
    pidfile = env.cache / "qmd" / "qmdd.pid"
    info = json.loads(pidfile.read_text())
    assert info["pid"] == d.proc.pid and info["start_time"]
    assert d.stop(sig) == 0
    assert not pidfile.exists()
    assert "Traceback" not in d.output.read_text()


def test_reads_never_see_locked_database_during_update(daemon: Daemon, env: Env, tmp_path: Path) -> None:
    corpus = write(
        tmp_path / "big",
        {
            f"d{i:04}/n{j}.md": f"# Note {i} {j}\n\nalpha beta gamma {i} {j}\n" * 20
            for i in range(60)
            for j in range(10)
        },
    )
    env.ok("collection", "add", str(corpus), "--name", "big")
    for p in list(corpus.rglob("*.md"))[:300]:
        p.write_text(p.read_text() + "\ndelta epsilon\n")
    statuses: list[int] = []

    def reader() -> None:
        with httpx.Client(base_url=env.url, timeout=60) as c:
            for _ in range(25):
                statuses.append(c.post("/v1/keyword", json={"query": "alpha delta"}).status_code)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    out = env.ok("update")
    for t in threads:
        t.join()
    assert "300 updated" in out
    assert statuses and set(statuses) == {200}
    assert "database is locked" not in daemon.output.read_text()
