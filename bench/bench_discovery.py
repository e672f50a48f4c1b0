"""Metadata discovery latency (`qmd collection metadata`) on a large index, in process.

    .venv/bin/python bench/bench_discovery.py [--docs 100000] [--seed 1] [--rounds 15] [--stale] [--keep]
        [--postgres [URL]]

Builds a temporary `qmd.server.store.sqlite.Store` holding --docs documents in two
collections (`notes` two thirds, `work` one third; ~1% inactive, ~1% pending
extraction, ~0.5% rejected) with generated metadata written straight through SQL as
the indexer writes it (an array's smallest value `multi` 1, its others 2; a document
that left the index holds no rows and is pending), about 8 keys a document, mixed
types and arrays —

    status    string, 5 values           owner     string, 50 values
    created   string, ~340 dates         reviewed  boolean
    priority  number 1-5 (60%), or the string high/low (5%): a type conflict
    topics    string[], 1-4 of 2,000 words drawn Zipf-like (90%)
    tags      string[], 1-3 of 300 (60%)  score    number 0-100, 2 decimals (50%)
    mem-N     one of 40 rare keys (30%)

— about 8.5 entries a document. `--stale` leaves the inactive documents' rows behind
instead (extracted, `meta_state` 1), which no index qmd makes holds: the answers are
the same, read with a plan that tests each entry's document instead of `all`. Then
`discovery.discover` runs on the store's own query_only reader, over both
collections, --rounds times per case, the cases
interleaved: no filter; a filter admitting ~5% of the documents (`score gte 90`); a
key match (`key eq topics`, the largest key); a value match (`value eq team-7`, a
reverse lookup over every key); one collection. Each answer is one read transaction
(a census of the documents, then one statement for the entries).

Baselines from the same run: `SELECT count(*)` of the scope's active documents (what
any answer pays to say how many documents there are), and one walk of the whole
(key, type, value, multi, doc_id) index grouping entries by value with no scope or filter
(the floor of any exact per-value count). Figures only, never assertions.

`--postgres` runs the same on a Postgres index instead (an embedded server,
tests/pg_server.py, or the server at URL, in a database of its own), analyzed after the
build; its value-index baseline is the same grouping, planned by Postgres.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import CpuWindow, code_line, machine, summary_ms, table, write_json  # noqa: E402

from qmd.server.search import discovery  # noqa: E402
from qmd.server.search.filters import parse_filter, parse_match  # noqa: E402
from qmd.server.store import metadata  # noqa: E402
from qmd.server.store.db import Connection, IndexStore  # noqa: E402
from qmd.server.store.sqlite import Store  # noqa: E402

SCOPE = ["notes", "work"]
Row = tuple[int, str, str, str | int | float, str | None, int]


def build(store: IndexStore, docs: int, seed: int, *, stale: bool = False) -> dict[str, int]:
    """Documents and their metadata rows, as the indexer would leave them (a string's
    `folded` is its ASCII lowercase, a boolean is 0/1, an array's smallest value has
    `multi` 1 and its others 2); with `stale`, inactive documents keep theirs."""
    rnd = random.Random(seed)
    vocab = [f"topic-{i}" for i in range(2000)]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    tags = [f"tag{i}" for i in range(300)]
    owners = [f"team-{i}" for i in range(50)]
    statuses = ["draft", "published", "archived", "review", "42"]

    def fn(conn: Connection) -> dict[str, int]:
        conn.executemany(
            "INSERT INTO content(hash, doc, created_at) VALUES (?, 'x', 'now')", [(f"h{i}",) for i in range(docs)]
        )
        documents, rows = [], []
        for i in range(1, docs + 1):
            collection = "work" if i % 3 == 0 else "notes"
            r = rnd.random()
            state = None if r < 0.01 else 2 if r < 0.015 else 0 if r < 0.03 else 1
            active = int(rnd.random() >= 0.01)
            gone = not active and not stale
            documents.append(
                (i, collection, f"d/{i}.md", f"h{i - 1}", active, None if gone else state,
                 "bad value" if state == 2 and not gone else None)
            )  # fmt: skip
            if state != 1:
                continue
            held: list[Row] = []

            def put(
                key: str, value: str | int | float, multi: int = 0, *, doc: int = i, into: list[Row] = held
            ) -> None:
                t = "boolean" if isinstance(value, bool) else "string" if isinstance(value, str) else "number"
                folded = value.lower() if isinstance(value, str) else None
                into.append((doc, key, t, int(value) if isinstance(value, bool) else value, folded, multi))

            def put_array(key: str, values: set[str]) -> None:
                for j, v in enumerate(sorted(values)):
                    put(key, v, 1 if j == 0 else 2)

            put("status", rnd.choice(statuses))
            put("owner", rnd.choice(owners))
            put("created", f"2025-{rnd.randint(1, 12):02d}-{rnd.randint(1, 28):02d}")
            put("reviewed", rnd.random() < 0.2)
            r = rnd.random()
            if r < 0.6:
                put("priority", rnd.randint(1, 5))
            elif r < 0.65:
                put("priority", rnd.choice(["high", "low"]))
            if rnd.random() < 0.9:
                put_array("topics", set(rnd.choices(vocab, weights, k=rnd.randint(1, 4))))
            if rnd.random() < 0.6:
                put_array("tags", set(rnd.choices(tags, k=rnd.randint(1, 3))))
            if rnd.random() < 0.5:
                put("score", round(rnd.random() * 100, 2))
            if rnd.random() < 0.3:
                put(f"mem-{rnd.randint(0, 39)}", rnd.choice(["x", "y", "z"]))
            if not gone:
                rows.extend(held)
        conn.executemany(
            "INSERT INTO documents(id, collection, path, title, hash, created_at, modified_at, active, meta_state,"
            " meta_error) VALUES (?, ?, ?, 't', ?, 'now', 'now', ?, ?, ?)",
            documents,
        )
        metadata.store_rows(conn, rows)
        return {"documents": docs, "entries": len(rows)}

    return store.write(fn)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--stale", action="store_true", help="inactive documents keep their metadata rows")
    ap.add_argument("--keep", action="store_true", help="leave the temporary index behind")
    ap.add_argument(
        "--postgres", nargs="?", const="embedded", metavar="URL", help="on a Postgres index (embedded server or URL)"
    )
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="qmd-bench-discovery-"))
    stack = contextlib.ExitStack()
    store: IndexStore = (
        Store(tmp / "index.sqlite") if args.postgres is None else stack.enter_context(postgres_store(args.postgres))
    )
    try:
        t0 = time.perf_counter()
        sizes = build(store, args.docs, args.seed, stale=args.stale)
        if store.postgres:
            store.maintain(lambda conn: conn.execute("ANALYZE"))
        build_s = time.perf_counter() - t0
        print(code_line())
        print(
            f"index: {sizes['documents']:,} documents, {sizes['entries']:,} entries"
            f"{' (inactive ones keep theirs)' if args.stale else ''}, built in {build_s:.1f} s ({tmp})"
        )

        five_percent = parse_filter({"field": "score", "operator": "gte", "value": 90})
        cases: dict[str, discovery.MetadataOptions] = {
            "no filter": discovery.MetadataOptions(SCOPE),
            "filter ~5%": discovery.MetadataOptions(SCOPE, filter=five_percent),
            "key match": discovery.MetadataOptions(
                SCOPE, match=parse_match({"field": "key", "operator": "eq", "value": "topics"})
            ),
            "value match": discovery.MetadataOptions(
                SCOPE, match=parse_match({"field": "value", "operator": "eq", "value": "team-7"})
            ),
            "one collection": discovery.MetadataOptions(["work"]),
        }
        with store.read() as conn:
            scope_json = json.dumps(SCOPE)
            baselines: dict[str, Callable[[], object]] = {
                "count(*) of the scope": lambda: conn.execute(
                    "SELECT count(*) FROM documents"
                    " WHERE active = 1 AND collection IN (SELECT value FROM json_each(?))",
                    (scope_json,),
                ).fetchone(),
                "one walk of the value index": lambda: conn.execute(
                    "SELECT key, type, value, count(*) FROM document_metadata"
                    f"{'' if store.postgres else ' INDEXED BY idx_metadata_value'} GROUP BY key, type, value"
                ).fetchall(),
            }
            runs: dict[str, Callable[[], object]] = {
                **baselines,
                **{name: (lambda o=o: discovery.discover(conn, o)) for name, o in cases.items()},
            }
            answers = {name: discovery.discover(conn, o) for name, o in cases.items()}  # warm-up, and what is shown
            plans = {}
            for name, o in cases.items():
                census, _ = discovery._census(conn, json.dumps(list(o.collections)), o.filter)
                plans[name] = "one (Postgres)" if store.postgres else discovery._plan(census)
            samples: dict[str, list[float]] = {name: [] for name in runs}
            window = CpuWindow()
            for _ in range(args.rounds):
                for name, fn in runs.items():
                    samples[name].append(timed(fn))
            window.stop()
            ours = sum(sum(v) for v in samples.values())
        floor = summary_ms(samples["one walk of the value index"])["p50_ms"]
        rows: list[list[Any]] = []
        figures: dict[str, Any] = {}
        for name, values in samples.items():
            s = summary_ms(values)
            a = answers.get(name)
            what = (
                f"{a.total_keys} keys, {sum(len(t.values) for k in a.keys for t in k.types)} values"
                + (f", {a.filtered_documents:,} docs pass" if a.filtered_documents is not None else "")
                if a
                else "baseline"
            )
            rows.append([name, plans.get(name, "-"), s["p50_ms"], s["p95_ms"], s["p50_ms"] / floor, what])
            figures[name] = {**s, "plan": plans.get(name), "answer": what}
        print()
        print(
            table(
                ["case", "plan", "p50 ms", "p95 ms", "x index walk", "answer"],
                rows,
                title=f"discovery over {', '.join(SCOPE)}: {args.rounds} rounds, cases interleaved",
                formats=[None, None, ",.1f", ",.1f", ".2f", None],
            )
        )
        noise = window.others(ours)
        print(
            f"\nother processes used {noise['others_share']} of the machine during the runs"
            f" (steal {noise['steal_s']} s)"
        )
        out = write_json(
            "discovery",
            {"machine": machine(),
             "index": {**sizes, "stale": args.stale, "build_s": round(build_s, 1),
                       "backend": "postgres" if store.postgres else "sqlite"},
             "rounds": args.rounds,
             "figures": figures, "noise": noise},
        )  # fmt: skip
        print(f"figures: {out}")
    finally:
        store.close()
        stack.close()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def postgres_store(url: str) -> Iterator[IndexStore]:
    """A Postgres index in a new database on the server at `url` (or an embedded one),
    dropped afterwards."""
    import psycopg
    from bench_postgres import database
    from pg_server import embedded_postgres

    from qmd.server.store.pg_store import PgStore

    with contextlib.ExitStack() as stack:
        server = stack.enter_context(embedded_postgres()) if url == "embedded" else url
        name = f"qmd_bench_discovery_{os.getpid()}"
        store = PgStore(database(server, name))
        try:
            yield store
        finally:
            store.close()
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
