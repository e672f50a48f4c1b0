"""16 clients at once against one daemon while it indexes a few thousand files from nothing and
then embeds a collection (issue 13): keyword searches, gets, status and metadata discovery all
answer, well-formed, with no server error and no SQLITE_BUSY; the figures (requests, latency
per kind) are printed."""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from conftest import MODELS_DIR, Daemon, Env, require

pytestmark = pytest.mark.slow

MODEL = "all-MiniLM-L6-v2-Q8_0.gguf"
CLIENTS = 16
BIG = 3000
SMALL = 48
VOCAB = "river stone cloud market engine garden ledger signal harbor forest lantern meadow copper".split()
STATUSES = ["draft", "published", "archived"]


def corpus(root: Path, n: int, rng: random.Random, prefix: str, words: int) -> list[str]:
    names = []
    for i in range(n):
        rel = f"d{i % 25:02}/{prefix}{i:05}.md"
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        tags = ", ".join(rng.sample(VOCAB, 2))
        filler = " ".join(rng.choice(VOCAB) for _ in range(words))
        p.write_text(
            f"---\nqmd:\n  metadata:\n    status: {rng.choice(STATUSES)}\n    priority: {rng.randint(1, 5)}\n"
            f"    tags: [{tags}]\n---\n# {prefix} note {i}\n\n{prefix}{i:05}q {filler}.\n\n## More\n\n{filler}\n",
            encoding="utf-8",
        )
        names.append(rel)
    return names


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = {}
        self.errors: list[str] = []
        self.not_yet = 0

    def add(self, kind: str, seconds: float, error: str | None = None) -> None:
        with self.lock:
            self.latency.setdefault(kind, []).append(seconds)
            if error:
                self.errors.append(f"{kind}: {error}")


def well_formed(kind: str, r: httpx.Response) -> str | None:
    """None if `r` is a good answer to `kind`, else what is wrong with it."""
    if "locked" in r.text or "SQLITE_BUSY" in r.text:
        return f"{r.status_code} {r.text[:200]}"
    try:
        body = r.json()
    except json.JSONDecodeError:
        return f"{r.status_code} not JSON: {r.text[:200]}"
    if kind == "get" and r.status_code == 404:  # a file the index has not reached yet
        return None if isinstance(body.get("error"), str) else f"404 without an error: {body}"
    if r.status_code != 200:
        return f"{r.status_code} {r.text[:200]}"
    ok = {
        "search": lambda b: isinstance(b["results"], list) and all("file" in h and "score" in h for h in b["results"]),
        "get": lambda b: isinstance(b["body"], str) and b["file"].startswith("qmd://"),
        "status": lambda b: isinstance(b["documents"], int) and "pending" in b["vector"],
        "metadata": lambda b: isinstance(b["documents"], int) and isinstance(b["keys"], list),
    }[kind]
    try:
        return None if ok(body) else f"malformed: {r.text[:200]}"
    except (KeyError, TypeError):
        return f"malformed: {r.text[:200]}"


def client(url: str, seed: int, names: list[str], stop: threading.Event, tally: Tally) -> None:
    rng = random.Random(seed)
    requests: list[tuple[str, Callable[[httpx.Client], httpx.Response]]] = [
        ("search", lambda c: c.post("/v1/keyword", json={"query": rng.choice(VOCAB), "limit": 10})),
        ("search", lambda c: c.post("/v1/keyword", json={"query": rng.choice(names).split("/")[1][:-3] + "q"})),
        ("get", lambda c: c.post("/v1/get", json={"file": "qmd://" + rng.choice(names), "max_lines": 20})),
        ("status", lambda c: c.get("/v1/status")),
        ("metadata", lambda c: c.post("/v1/metadata", json={"collections": ["big"]})),
        (
            "metadata",
            lambda c: c.post("/metadata", json={"match": {"field": "key", "operator": "eq", "value": "tags"}}),
        ),
    ]
    with httpx.Client(base_url=url, timeout=120) as c:
        while not stop.is_set():
            kind, call = rng.choice(requests)
            t = time.perf_counter()
            try:
                r = call(c)
            except httpx.HTTPError as e:
                tally.add(kind, time.perf_counter() - t, f"{type(e).__name__}: {e}")
                continue
            error = well_formed(kind, r)
            if kind == "get" and r.status_code == 404 and error is None:
                with tally.lock:
                    tally.not_yet += 1
            tally.add(kind, time.perf_counter() - t, error)


def job(d: Daemon, route: str, body: dict) -> dict:
    with d.http.stream("POST", route, json=body, timeout=600) as r:
        events = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert events and events[-1]["event"] == "done", events[-3:]
    return events[-1]


@pytest.mark.timeout(300)
def test_sixteen_clients_during_a_full_index_and_an_embed(env: Env) -> None:
    model = require(MODELS_DIR / MODEL, "the MiniLM test embedder (../shared/models)")
    rng = random.Random(1313)
    big = corpus(env.base / "big", BIG, rng, "b", 30)
    small = corpus(env.base / "small", SMALL, rng, "s", 8)
    names = [f"big/{n}" for n in big] + [f"small/{n}" for n in small]
    env.vars["QMD_EMBED_MODEL"] = str(model)
    d = Daemon(env)
    stop = threading.Event()
    tally = Tally()
    threads = []
    try:
        for name in ("big", "small"):
            d.http.post("/v1/collections", json={"path": str(env.base / name), "name": name}).raise_for_status()
        threads = [
            threading.Thread(target=client, args=(env.url, i, names, stop, tally), daemon=True) for i in range(CLIENTS)
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(1)
        summaries = job(d, "/v1/update", {})["report"]["collections"]
        t_index = time.monotonic() - t0
        assert sum(s["new"] for s in summaries) == BIG + SMALL
        report = job(d, "/v1/embed", {"collections": ["small"]})["report"]
        t_embed = time.monotonic() - t0 - t_index
        assert report["documents"] == SMALL and report["pending_after"] == 0
        time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=150)
        d.stop()
    elapsed = time.monotonic() - t0
    total = sum(len(v) for v in tally.latency.values())
    print(
        f"\n{CLIENTS} clients, {total} requests in {elapsed:.1f}s ({total / elapsed:.0f}/s) during a full index of"
        f" {BIG + SMALL} files ({t_index:.1f}s from the clients' start) and an embed of {SMALL} ({t_embed:.1f}s);"
        f" errors: {len(tally.errors)}; gets before their file was indexed (404): {tally.not_yet}"
    )
    for kind, lat in sorted(tally.latency.items()):
        ms = sorted(x * 1000 for x in lat)
        p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
        print(
            f"  {kind:<9} {len(ms):6} requests  p50 {statistics.median(ms):7.1f} ms"
            f"  p95 {p95:7.1f} ms  max {ms[-1]:7.1f} ms"
        )
    assert not any(t.is_alive() for t in threads)
    assert tally.errors == [], tally.errors[:10]
    log = (env.log.read_text() if env.log.exists() else "") + d.output.read_text()
    assert "database is locked" not in log and "Traceback" not in log, log[-3000:]
    assert total > CLIENTS * 10
