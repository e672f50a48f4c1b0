"""Freshness: how long from saving a file to finding it by keyword, with the watcher on,
and what the watcher's ingest costs the queries that run meanwhile.

    .venv/bin/python bench/bench_freshness.py [--files 14000] [--seed 1] [--saves 40]
                                              [--burst 2000] [--rounds 3] [--keep]

Generates a corpus (bench/corpus.py), starts a fresh isolated `qmdd` with watching on
(default settings: 300 ms quiet period, 2 s longest wait), adds the corpus with the real
CLI, waits for the watcher's first sweep, then measures:

  freshness  --saves saves, alternating a new file and an edit appended to an existing
             one, each carrying a word found nowhere else; the time from the write's
             close to the first `POST /v1/keyword` (polled every 10 ms) that returns it.
             p50/p95/max, and how many passes the watcher ran for them.
  queries    bench_search.py's 20 queries over a warm HTTP client: idle (--rounds
             rounds), then again while --burst files are written at once (a checkout) and
             until the watcher has indexed them all; p50/p95 of each and the ratio
             during/idle, in the same run, plus how long the burst took to be searchable
             and in how many passes.

Figures, never assertions: machines are noisy. Output: a table, and bench/out/freshness.json.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus as corpus_mod  # noqa: E402
from _common import Daemon, Isolated, code_line, machine, summary_ms, table, write_json  # noqa: E402
from bench_search import QUERIES, search_body  # noqa: E402

NAME = "bench"


def watch_state(d: Daemon) -> dict[str, Any]:
    st = d.http.get("/v1/status").json()
    coll = next(c for c in st["collections"] if c["name"] == NAME)
    return {"files": coll["files"], **coll["watch"]}


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    sys.exit(f"timed out after {timeout:.0f}s waiting for {what}")


def found(d: Daemon, word: str) -> bool:
    r = d.http.post("/v1/keyword", json=search_body(word))
    return r.status_code == 200 and bool(r.json()["results"])


def freshness(d: Daemon, root: Path, paths: list[str], saves: int) -> tuple[list[float], int]:
    """Seconds from each save to its word being searchable; passes the watcher ran for them."""
    passes0 = watch_state(d)["passes"]
    out: list[float] = []
    for i in range(saves):
        word = f"freshzq{i:04d}x"
        if i % 2:
            p = root / paths[(i * 7919) % len(paths)]
            with open(p, "a", encoding="utf-8") as fh:
                fh.write(f"\n\nAn edit that mentions {word}.\n")
        else:
            p = root / "fresh" / f"note-{i:04d}.md"
            p.parent.mkdir(exist_ok=True)
            with open(p, "w", encoding="utf-8") as fh:
                fh.write(f"# Fresh note {i}\n\nA new note about {word}.\n")
        t0 = time.perf_counter()
        while not found(d, word):
            if time.perf_counter() - t0 > 30:
                sys.exit(f"save {i} ({p}) was not searchable after 30 s")
            time.sleep(0.01)
        out.append(time.perf_counter() - t0)
        time.sleep(0.5)  # one save at a time, as a person saves
    return out, watch_state(d)["passes"] - passes0


def query_round(d: Daemon, out: list[float]) -> None:
    for _, q in QUERIES:
        t0 = time.perf_counter()
        r = d.http.post("/v1/keyword", json=search_body(q))
        out.append(time.perf_counter() - t0)
        assert r.status_code == 200, r.text


def during_burst(d: Daemon, root: Path, burst: int, seed: int) -> tuple[list[float], float, float, int]:
    """Query latencies while `burst` new files are written and ingested; the seconds the
    writing took, until all were searchable, and the watcher's passes for them."""
    before = watch_state(d)
    target = before["files"] + burst
    written = threading.Event()
    write_s = 0.0
    # Made beforehand: the burst is the disk's work (a checkout), not this script's CPU.
    docs = [corpus_mod.make_document(100_000 + i, seed) for i in range(burst)]

    def write() -> None:
        nonlocal write_s
        t0 = time.perf_counter()
        for i, text in enumerate(docs):
            p = root / "burst" / f"b{i % 40:02d}" / f"n{i:05d}.md"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
        write_s = time.perf_counter() - t0
        written.set()

    latencies: list[float] = []
    t0 = time.perf_counter()
    writer = threading.Thread(target=write)
    writer.start()
    while True:
        query_round(d, latencies)
        if written.is_set():
            st = watch_state(d)
            if st["files"] >= target and st["queue"] == 0:
                break
        if time.perf_counter() - t0 > 600:
            sys.exit("the burst was not indexed within 600 s")
    ingest_s = time.perf_counter() - t0
    writer.join()
    return latencies, write_s, ingest_s, watch_state(d)["passes"] - before["passes"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=14_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--saves", type=int, default=40)
    ap.add_argument("--burst", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()

    iso = Isolated(keep=args.keep)
    iso.vars["QMD_WATCH"] = "1"
    corpus = iso.base / "corpus"
    stats = corpus_mod.generate(corpus, files=args.files, seed=args.seed)
    print(f"corpus: {stats.files} files, {stats.mb:.1f} MB in {stats.seconds:.1f}s", file=sys.stderr)
    d = Daemon(iso)
    try:
        t0 = time.perf_counter()
        iso.ok("collection", "add", str(corpus), "--name", NAME)
        add_s = time.perf_counter() - t0
        wait_for(lambda: (s := watch_state(d))["passes"] >= 1 and s["queue"] == 0, 120, "the first sweep")

        fresh, fresh_passes = freshness(d, corpus, stats.paths, args.saves)

        idle: list[float] = []
        query_round(d, [])  # warm-up
        for _ in range(args.rounds):
            query_round(d, idle)
        busy, write_s, ingest_s, burst_passes = during_burst(d, corpus, args.burst, args.seed)
        final = watch_state(d)
    finally:
        d.stop()
        iso.cleanup()

    fresh_ms, idle_ms, busy_ms = summary_ms(fresh), summary_ms(idle), summary_ms(busy)
    result = {
        "machine": machine(),
        "corpus": {"files": stats.files, "mb": round(stats.mb, 2), "seed": args.seed},
        "settings": {"quiet_ms": 300, "max_wait_ms": 2000, "poll_every_ms": 10},
        "collection_add_s": round(add_s, 2),
        "freshness": {**fresh_ms, "saves": args.saves, "passes": fresh_passes},
        "queries_idle": idle_ms,
        "queries_during_burst": busy_ms,
        "ratio_p50": round(busy_ms["p50_ms"] / idle_ms["p50_ms"], 2),
        "ratio_p95": round(busy_ms["p95_ms"] / idle_ms["p95_ms"], 2),
        "burst": {
            "files": args.burst,
            "write_s": round(write_s, 2),
            "searchable_s": round(ingest_s, 2),
            "passes": burst_passes,
        },
        "watch": final,
    }
    path = write_json("freshness", result)
    print(code_line())
    print(
        table(
            ["measure", "n", "p50 ms", "p95 ms", "max ms"],
            [
                [
                    "save -> keyword-searchable",
                    fresh_ms["n"],
                    fresh_ms["p50_ms"],
                    fresh_ms["p95_ms"],
                    fresh_ms["max_ms"],
                ],
                ["query, idle", idle_ms["n"], idle_ms["p50_ms"], idle_ms["p95_ms"], idle_ms["max_ms"]],
                [
                    f"query, during a {args.burst}-file burst",
                    busy_ms["n"],
                    busy_ms["p50_ms"],
                    busy_ms["p95_ms"],
                    busy_ms["max_ms"],
                ],
            ],
            title=f"{stats.files} files; watcher passes: {fresh_passes} for {args.saves} saves, "
            f"{burst_passes} for the burst",
        )
    )
    print(
        f"ratio during/idle: p50 {result['ratio_p50']}x, p95 {result['ratio_p95']}x; burst written in "
        f"{write_s:.1f}s, all searchable after {ingest_s:.1f}s"
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
