"""Filtered search latency of qmd: keyword and vector search under a metadata filter,
next to the same query unfiltered in the same run, at selectivity 50%, 5% and 0.1%.

    .venv/bin/python bench/bench_filter.py [--docs 100000] [--seed 1] [--rounds 3]
                                           [--vectors 20] [--cache DIR] [--rebuild]
                                           [--explain]

Build (cached). --docs generated markdown files (a title and a few paragraphs from
bench/corpus.py's vocabulary, ~1 KB each) with a `qmd: metadata:` frontmatter block:

    bucket50: a|b         exactly 50% "a"      (string)
    bucket5:  0..19       exactly  5% each     (number)
    bucket01: 0..999      exactly 0.1% each    (number)
    status:   draft|published|archived  (30/60/10%)
    topics:   [1-3 of 12 topics]        (string array)
    priority: 1..5                      (number)
    reviewed: true|false

each key drawn from its own seeded permutation, so the buckets are independent of one
another and of the text. The files are indexed by the real indexer
(`qmd.server.ingest.indexer.index_collection`: walk, load, FTS5, metadata extraction),
then every document gets 1-2 random 384-dim unit vectors written through
`qmd.server.store.vectors` (`ensure_space`, `write_document`, `sync_partitions`): no
model is needed to time a search. The index is cached under `--cache` (default
`$TMPDIR/qmd-bench-filter/`) in a folder named by --docs, --seed and BUILD_VERSION, so
a rerun skips the build; `--rebuild` throws the cached one away first. The first build
of 100,000 documents takes ~1.5 min on 2 cores (files 16 s, index_collection 50 s,
vectors 20 s) and ~1.3 GB of disk (the 940 MB index and 100k small files); `--docs 10000` is
a quick run.

Measure. In process, on a warm page cache, every query runs unfiltered and under each
filter back to back (interleaved, --rounds times), so noise from other processes on the
machine hits every variant alike:

  keyword  `lexical_hits(store, parse_lex(q), scope_of(config, None, parse_filter(f)), 10)`
           over 16 queries: common words, rare words, 2-3 words, a question, a phrase
  vector   `vector_hits(store, {collection: space}, v, scope, 10)` over --vectors random unit vectors

p50/p95 of each, and the ratio filtered/unfiltered (the issue's goal: <= 1.5x at every
selectivity). Beside them: a few realistic filters (status, topics, priority, an `and`
of them), the scope's id query alone (`ids_sql`: the eligible documents, or for the
unfiltered search the collection's), and the ratios per keyword query.

Exactness. For a few keyword queries and query vectors, the filtered top 10 is compared
with the unfiltered *full* ranking filtered in Python by the reference evaluator
(`qmd.server.search.filters.matches` over `metadata.fetch`): for keyword search the
full ranking is `lexical_hits` with no limit; for vectors it is a brute-force
`vector_codec.distances` over every chunk in `content_vectors` (not the vec0 KNN), each
document at its nearest chunk; ids and distances must be identical.

`--explain` prints SQLite's query plans of the filtered statements. Figures only,
never assertions; the JSON goes to bench/out/filter.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import corpus as corpus_mod  # noqa: E402
from _common import code_line, machine, summary_ms, table, write_json  # noqa: E402

BUILD_VERSION = 1
"""Bump when the generated documents or vectors change: it names the cache folder."""
DIMS = 384
LIMIT = 10
FINGERPRINT = "bench-filter-synthetic"
COLLECTION = "bench"
STATUS = [("draft", 0.3), ("published", 0.6), ("archived", 0.1)]
TOPICS = "sql sqlite search typescript python mcp vectors fts5 llama docker kubernetes rust".split()

SELECTIVE: list[tuple[str, dict[str, Any]]] = [
    ("50%", {"field": "bucket50", "operator": "eq", "value": "a"}),
    ("5%", {"field": "bucket5", "operator": "eq", "value": 7}),
    ("0.1%", {"field": "bucket01", "operator": "eq", "value": 123}),
]
REALISTIC: list[tuple[str, dict[str, Any]]] = [
    ("status=published", {"field": "status", "operator": "eq", "value": "published"}),
    ("topics all [sqlite, search]", {"field": "topics", "operator": "all", "value": ["sqlite", "search"]}),
    ("priority >= 4, not archived", {
        "operator": "and",
        "operands": [
            {"field": "priority", "operator": "gte", "value": 4},
            {"field": "status", "operator": "ne", "value": "archived"},
        ],
    }),
    ("published, rust|docker, p5, reviewed", {
        "operator": "and",
        "operands": [
            {"field": "status", "operator": "eq", "value": "published"},
            {"field": "topics", "operator": "in", "value": ["rust", "docker"]},
            {"field": "priority", "operator": "eq", "value": 5},
            {"field": "reviewed", "operator": "eq", "value": True},
        ],
    }),
]  # fmt: skip


# -- the corpus ----------------------------------------------------------------------


def permutation(n: int, seed: int, key: str) -> list[int]:
    p = list(range(n))
    random.Random(f"qmd-bench-filter-{seed}-{key}").shuffle(p)
    return p


def document_metadata(n: int, seed: int) -> list[dict[str, Any]]:
    """Every document's metadata, deterministic in (n, seed)."""
    p50, p5, p01 = (permutation(n, seed, k) for k in ("bucket50", "bucket5", "bucket01"))
    rng = random.Random(f"qmd-bench-filter-meta-{seed}")
    names, weights = zip(*STATUS)
    out = []
    for i in range(n):
        out.append(
            {
                "bucket50": "ab"[p50[i] % 2],
                "bucket5": p5[i] % 20,
                "bucket01": p01[i] % 1000,
                "status": rng.choices(names, weights)[0],
                "topics": sorted(rng.sample(TOPICS, rng.randint(1, 3))),
                "priority": rng.randint(1, 5),
                "reviewed": rng.random() < 0.5,
            }
        )
    return out


def frontmatter(meta: dict[str, Any]) -> str:
    lines = []
    for k, v in meta.items():
        if isinstance(v, list):
            lines.append(f"    {k}: [{', '.join(v)}]")
        elif isinstance(v, bool):
            lines.append(f"    {k}: {'true' if v else 'false'}")
        else:
            lines.append(f"    {k}: {v}")
    return "---\nqmd:\n  metadata:\n" + "\n".join(lines) + "\n---\n"


def body(i: int, seed: int) -> str:
    """A short note: a title, a paragraph, one or two sections (~1 KB)."""
    rng = random.Random(f"qmd-bench-filter-doc-{seed}-{i}")
    vocab = corpus_mod.vocabulary(seed)
    parts = [f"# {corpus_mod._title(rng, vocab)}\n\n{corpus_mod._paragraph(rng, vocab, [])}\n"]
    for _ in range(rng.randint(1, 2)):
        parts.append(f"\n## {corpus_mod._title(rng, vocab, 1, 4)}\n\n{corpus_mod._paragraph(rng, vocab, [])}\n")
    return "".join(parts)


def write_files(root: Path, metas: list[dict[str, Any]], seed: int) -> int:
    total = 0
    for i, meta in enumerate(metas):
        d = root / f"d{i // 1000:03}"
        if i % 1000 == 0:
            d.mkdir(parents=True, exist_ok=True)
        text = frontmatter(meta) + "\n" + body(i, seed)
        (d / f"n{i:06}.md").write_text(text)
        total += len(text)
    return total


def unit_vector(rng: random.Random) -> array:
    raw = array("b", rng.randbytes(DIMS))
    norm = math.hypot(*raw) or 1.0
    return array("f", [x / norm for x in raw])


def build(folder: Path, docs: int, seed: int) -> dict[str, Any]:
    from qmd.server.config import Collection
    from qmd.server.ingest.indexer import index_collection
    from qmd.server.store import vectors
    from qmd.server.store.sqlite import Store

    if folder.exists():
        shutil.rmtree(folder)
    files = folder / "files"
    files.mkdir(parents=True)
    stats: dict[str, Any] = {"docs": docs, "seed": seed, "version": BUILD_VERSION}
    t0 = time.perf_counter()
    metas = document_metadata(docs, seed)
    stats["files_bytes"] = write_files(files, metas, seed)
    stats["write_files_s"] = time.perf_counter() - t0
    print(f"build: wrote {docs:,} files ({stats['files_bytes'] / 1e6:.0f} MB) in {stats['write_files_s']:.1f}s")

    store = Store(folder / "index.sqlite")
    try:
        t0 = time.perf_counter()
        last = [0.0]

        def progress(ev: dict[str, Any]) -> None:
            if time.perf_counter() - last[0] > 15 or ev["done"] == ev["total"]:
                last[0] = time.perf_counter()
                print(f"  indexing {ev['done']:,}/{ev['total']:,} ({ev['files_per_s']:.0f} files/s)", flush=True)

        summary = index_collection(store, Collection(name=COLLECTION, path=str(files)), progress)
        stats["index_s"] = time.perf_counter() - t0
        stats["indexed"] = summary.indexed
        stats["metadata_extracted"] = summary.metadata_extracted
        print(f"build: index_collection indexed {summary.indexed:,} files in {stats['index_s']:.1f}s", flush=True)

        t0 = time.perf_counter()
        rng = random.Random(f"qmd-bench-filter-vectors-{seed}")
        space = store.write(lambda c: vectors.ensure_space(c, FINGERPRINT, "synthetic", DIMS))
        with store.read() as conn:
            hashes = [r[0] for r in conn.execute("SELECT DISTINCT hash FROM documents WHERE active = 1 ORDER BY id")]
        chunks_total = 0
        for i in range(0, len(hashes), 1000):
            batch = []
            for h in hashes[i : i + 1000]:
                n = rng.randint(1, 2)
                batch.append(
                    (h, [vectors.ChunkVector(s, s * 500, s * 500 + 500, 8 + s * 4, 11 + s * 4, 120, False,
                                             unit_vector(rng)) for s in range(n)])
                )  # fmt: skip
                chunks_total += n

            def write(conn, batch=batch) -> None:  # noqa: ANN001
                for h, chunks in batch:
                    vectors.write_document(conn, space, h, chunks, len(chunks))

            store.write(write)
        stats["write_vectors_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        added, _ = store.write(lambda c: vectors.sync_partitions(c, space))
        stats["sync_partitions_s"] = time.perf_counter() - t0
        stats["vectors"] = added
        print(
            f"build: {chunks_total:,} vectors written in {stats['write_vectors_s']:.1f}s,"
            f" sync_partitions {stats['sync_partitions_s']:.1f}s",
            flush=True,
        )
        store.write(lambda c: c.execute("ANALYZE"))
    finally:
        store.close()
    stats["db_mb"] = sum(p.stat().st_size for p in folder.glob("index.sqlite*")) / 1e6
    (folder / "built.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def cached(args: argparse.Namespace) -> tuple[Path, dict[str, Any], bool]:
    folder = Path(args.cache) / f"docs{args.docs}-seed{args.seed}-v{BUILD_VERSION}"
    marker = folder / "built.json"
    if marker.is_file() and not args.rebuild:
        return folder, json.loads(marker.read_text()), True
    t0 = time.perf_counter()
    stats = build(folder, args.docs, args.seed)
    stats["build_s"] = time.perf_counter() - t0
    marker.write_text(json.dumps(stats, indent=2) + "\n")
    return folder, stats, False


# -- queries -------------------------------------------------------------------------


def keyword_queries(seed: int) -> list[tuple[str, str]]:
    """(category, query). Common and rare words are picked by their rank in the seed's
    vocabulary (corpus.py draws content words Zipf-like), the rest are bench_search's."""
    content = corpus_mod.vocabulary(seed).content
    return [
        ("common", content[0]),
        ("common", content[1]),
        ("common", content[3]),
        ("mid", content[60]),
        ("mid", content[200]),
        ("rare", content[-1]),
        ("rare", content[-40]),
        ("rare", content[-300]),
        ("2 words", f"{content[0]} {content[2]}"),
        ("2 words", "connection pool"),
        ("2 words", f"{content[5]} {content[150]}"),
        ("3 words", "rate limit retry"),
        ("3 words", f"{content[1]} {content[40]} {content[900]}"),
        ("question", "how do I configure the access token for the api"),
        ("phrase", '"circuit breaker"'),
        ("negation", f"{content[0]} -{content[1]}"),
    ]


def timed(fn, *a) -> tuple[float, Any]:  # noqa: ANN001
    t0 = time.perf_counter()
    out = fn(*a)
    return time.perf_counter() - t0, out


def measure(store, config, space, args: argparse.Namespace) -> dict[str, Any]:  # noqa: ANN001
    from qmd.server.search.filters import parse_filter
    from qmd.server.search.keyword import lexical_hits
    from qmd.server.search.lexical import parse_lex
    from qmd.server.search.scope import scope_of
    from qmd.server.search.vector import vector_hits
    from qmd.server.store.metadata import ids_sql

    variants = [("unfiltered", None), *SELECTIVE, *REALISTIC]
    scopes = {name: scope_of(config, None, None if raw is None else parse_filter(raw)) for name, raw in variants}
    queries = keyword_queries(args.seed)
    lexqs = [parse_lex(q) for _, q in queries]
    qrng = random.Random(f"qmd-bench-filter-queries-{args.seed}")
    qvecs = [unit_vector(qrng) for _ in range(args.vectors)]

    with store.read() as conn:
        total = conn.execute("SELECT count(*) FROM documents WHERE active = 1").fetchone()[0]
        eligible = {}
        for name, _raw in variants:
            sc = scopes[name]
            if sc.doc_filter is None:
                eligible[name] = total
                continue
            sql, params = ids_sql(COLLECTION, sc.doc_filter)
            eligible[name] = conn.execute(f"SELECT count(*) FROM ({sql})", params).fetchone()[0]
        df = {}
        for (_, q), lq in zip(queries, lexqs):
            # documents holding every positive term (the AND statement's matches)
            df[q] = conn.execute(
                "SELECT count(*) FROM documents_fts WHERE documents_fts MATCH ?", (lq.match_all(),)
            ).fetchone()[0]

    kw: dict[str, list[float]] = {name: [] for name, _ in variants}
    kw_by_query: dict[str, dict[str, list[float]]] = {q: {name: [] for name, _ in variants} for _, q in queries}
    vec: dict[str, list[float]] = {name: [] for name, _ in variants}
    # the scope's document list: for "unfiltered" the collection's ids (what the keyword
    # statements build as `+rowid IN (...)` even without a filter), else the eligible ids
    elig_t: dict[str, list[float]] = {name: [] for name, _ in variants}
    elig_fetch: dict[str, list[float]] = {name: [] for name, _ in variants}

    # warm-up: page cache and statement cache, one pass of everything
    for lq in lexqs:
        for name, _ in variants:
            lexical_hits(store, lq, scopes[name], LIMIT)
    for v in qvecs[:3]:
        for name, _ in variants:
            vector_hits(store, {COLLECTION: space}, v, scopes[name], LIMIT)

    t_start = time.perf_counter()
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]  # neither side always runs first
        for (_, q), lq in zip(queries, lexqs):
            for name, _ in order:
                s, _hits = timed(lexical_hits, store, lq, scopes[name], LIMIT)
                kw[name].append(s)
                kw_by_query[q][name].append(s)
        for v in qvecs:
            for name, _ in order:
                s, _hits = timed(vector_hits, store, {COLLECTION: space}, v, scopes[name], LIMIT)
                vec[name].append(s)
        with store.read() as conn:
            for name, _ in order:
                sql, params = ids_sql(COLLECTION, scopes[name].doc_filter)
                s, _ = timed(
                    lambda sql=sql, params=params: conn.execute(f"SELECT count(*) FROM ({sql})", params).fetchone()
                )
                elig_t[name].append(s)
                s, _ = timed(lambda sql=sql, params=params: conn.execute(sql, params).fetchall())
                elig_fetch[name].append(s)
        print(f"  round {r + 1}/{args.rounds} done ({time.perf_counter() - t_start:.0f}s)", flush=True)
    return {
        "documents": total,
        "eligible": eligible,
        "keyword": kw,
        "keyword_by_query": kw_by_query,
        "vector": vec,
        "eligible_query": elig_t,
        "eligible_fetch": elig_fetch,
        "queries": queries,
        "doc_freq": df,
    }


# -- exactness ---------------------------------------------------------------------------


def exactness(store, config, space, seed: int, n_queries: int) -> list[dict[str, Any]]:  # noqa: ANN001
    """Filtered top 10 == the unfiltered full ranking, filtered in Python."""
    from qmd.server.search.filters import matches, parse_filter
    from qmd.server.search.keyword import lexical_hits
    from qmd.server.search.lexical import parse_lex
    from qmd.server.search.scope import scope_of
    from qmd.server.search.vector import vector_hits
    from qmd.server.store import metadata, vector_codec

    with store.read() as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM documents WHERE active = 1")]
        meta = metadata.fetch(conn, ids)
        doc_of_hash: dict[str, list[int]] = {}
        for doc_id, h in conn.execute(
            "SELECT id, hash FROM documents WHERE active = 1 AND collection = ?", (COLLECTION,)
        ):
            doc_of_hash.setdefault(h, []).append(doc_id)
    full = scope_of(config, None)
    filters = [(name, parse_filter(raw)) for name, raw in SELECTIVE + REALISTIC]
    out = []
    picked = [q for _, q in keyword_queries(seed)]
    picked = [picked[0], picked[4], picked[9], picked[12], picked[13]][:n_queries]
    for q in picked:
        lq = parse_lex(q)
        everything = lexical_hits(store, lq, full, 1_000_000)
        for name, f in filters:
            expected = [h.doc.id for h in everything if h.doc.id in meta and matches(f, meta[h.doc.id])][:LIMIT]
            got = [h.doc.id for h in lexical_hits(store, lq, scope_of(config, None, f), LIMIT)]
            out.append({"kind": "keyword", "query": q, "filter": name, "same": got == expected, "n": len(expected)})
    qrng = random.Random(f"qmd-bench-filter-exact-{seed}")
    for i in range(n_queries):
        v = unit_vector(qrng)
        with store.read() as conn:
            best: dict[int, float] = {}
            rows = conn.execute(
                "SELECT hash, embedding FROM content_vectors WHERE space_id = ?", (space.id,)
            ).fetchall()
            dist = vector_codec.distances(
                vector_codec.decode([r[1] for r in rows], space.dims), vector_codec.unit(v)
            ).tolist()
            for (h, _), d in zip(rows, dist, strict=True):
                for doc_id in doc_of_hash.get(h, ()):
                    if doc_id not in best or d < best[doc_id]:
                        best[doc_id] = d
        ranking = sorted(best, key=lambda k: (best[k], k))
        for name, f in filters:
            expected = [d for d in ranking if d in meta and matches(f, meta[d])][:LIMIT]
            hits = vector_hits(store, {COLLECTION: space}, v, scope_of(config, None, f), LIMIT)
            got = [h.doc_id for h in hits]
            # every SQLite path measures by `vector_codec.distances`, bit for bit, and both
            # sides break ties by document id: the lists must be identical
            same = got == expected and all(best[a] == h.distance for a, h in zip(expected, hits))
            out.append({"kind": "vector", "query": f"random #{i}", "filter": name, "same": same, "n": len(expected)})
    return out


# -- query plans ---------------------------------------------------------------------------


def explain(store, config, space) -> None:  # noqa: ANN001
    from qmd.server.search.filters import parse_filter
    from qmd.server.search.scope import scope_of
    from qmd.server.store.metadata import ids_sql

    with store.read() as conn:
        for name, raw in SELECTIVE:
            sc = scope_of(config, None, parse_filter(raw))
            sql, params = ids_sql(COLLECTION, sc.doc_filter)
            print(f"-- eligible set, {name}: {sql}")
            for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params):
                print("   ", row[-1])
            fts = (
                "SELECT rowid, bm25(documents_fts, 1.5, 4.0, 1.0) AS s FROM documents_fts"
                f" WHERE documents_fts MATCH ? AND +rowid IN ({sql}) ORDER BY s, rowid LIMIT ?"
            )
            print(f"-- keyword AND statement, {name}")
            for row in conn.execute(f"EXPLAIN QUERY PLAN {fts}", ("x", *params, LIMIT)):
                print("   ", row[-1])


# -- report --------------------------------------------------------------------------------


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def report(m: dict[str, Any]) -> tuple[list[list[Any]], dict[str, Any]]:
    rows: list[list[Any]] = []
    summary: dict[str, Any] = {}
    for kind in ("keyword", "vector"):
        base = summary_ms(m[kind]["unfiltered"])
        summary[kind] = {"unfiltered": base}
        for name, _ in [("unfiltered", None), *SELECTIVE, *REALISTIC]:
            s = summary_ms(m[kind][name])
            summary[kind][name] = s
            share = m["eligible"][name] / m["documents"]
            r50, r95 = ratio(s["p50_ms"], base["p50_ms"]), ratio(s["p95_ms"], base["p95_ms"])
            goal = "" if name == "unfiltered" else ("ok" if max(r50, r95) <= 1.5 else "MISSED")
            rows.append(
                [
                    kind,
                    name,
                    f"{share:.2%}",
                    s["p50_ms"],
                    s["p95_ms"],
                    "" if name == "unfiltered" else f"{r50:.2f}x",
                    "" if name == "unfiltered" else f"{r95:.2f}x",
                    goal,
                ]
            )
    return rows, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="passes over every query and filter")
    ap.add_argument("--vectors", type=int, default=20, help="random query vectors per round")
    ap.add_argument("--exact-queries", type=int, default=3, help="keyword queries and vectors checked for exactness")
    ap.add_argument(
        "--cache",
        default=str(Path(tempfile.gettempdir()) / "qmd-bench-filter"),
        help="where built indexes are kept, one folder per --docs/--seed [$TMPDIR/qmd-bench-filter]",
    )
    ap.add_argument("--rebuild", action="store_true", help="rebuild the cached index")
    ap.add_argument("--explain", action="store_true", help="print the filtered statements' query plans")
    args = ap.parse_args(argv)
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(code_line(), flush=True)

    from qmd.server.config import Collection, Config
    from qmd.server.store import vectors
    from qmd.server.store.sqlite import Store

    folder, stats, reused = cached(args)
    print(
        f"index: {folder} ({'cached' if reused else 'built'}; {stats['docs']:,} docs, {stats['vectors']:,} vectors,"
        f" {stats['db_mb']:.0f} MB; first build: files {stats['write_files_s']:.0f}s, index_collection"
        f" {stats['index_s']:.0f}s, vectors {stats['write_vectors_s'] + stats['sync_partitions_s']:.0f}s)",
        flush=True,
    )
    config = Config(collections={COLLECTION: Collection(name=COLLECTION, path=str(folder / "files"))})
    store = Store(folder / "index.sqlite")
    result: dict[str, Any] = {"machine": machine(), "build": stats, "cached": reused, "args": vars(args)}
    try:
        with store.read() as conn:
            space = vectors.find_space(conn, FINGERPRINT)
        assert space is not None
        if args.explain:
            explain(store, config, space)
        t0 = time.perf_counter()
        m = measure(store, config, space, args)
        print(f"measured in {time.perf_counter() - t0:.0f}s, load {os.getloadavg()[0]:.2f}")
        t0 = time.perf_counter()
        exact = exactness(store, config, space, args.seed, args.exact_queries)
        exact_s = time.perf_counter() - t0
    finally:
        store.close()

    rows, summary = report(m)
    print()
    print(
        table(
            ["search", "filter", "eligible", "p50 ms", "p95 ms", "p50 ratio", "p95 ratio", "<= 1.5x"],
            rows,
            title=(
                f"filtered vs unfiltered, limit {LIMIT}, {m['documents']:,} documents; keyword: {len(m['queries'])}"
                f" queries x {args.rounds} rounds, vector: {args.vectors} random vectors x {args.rounds} rounds"
            ),
            formats=[None, None, None, ".2f", ".2f", None, None, None],
        )
    )
    print()
    el_rows = []
    for name, ts in m["eligible_query"].items():
        s, f = summary_ms(ts), summary_ms(m["eligible_fetch"][name])
        el_rows.append([name, m["eligible"][name], s["p50_ms"], f["p50_ms"], f["p95_ms"]])
    print(
        table(
            ["filter", "docs in scope", "count(*) p50 ms", "fetch p50 ms", "fetch p95 ms"],
            el_rows,
            title=(
                "the scope's document-id query alone (metadata.ids_sql; unfiltered: the collection's ids),"
                " counted in SQLite and fetched into Python"
            ),
            formats=[None, "d", ".2f", ".2f", ".2f"],
        )
    )
    print()
    q_rows = []
    for cat, q in m["queries"]:
        per = m["keyword_by_query"][q]
        base = summary_ms(per["unfiltered"])["p50_ms"]
        q_rows.append(
            [cat, q, m["doc_freq"][q], base]
            + [f"{ratio(summary_ms(per[name])['p50_ms'], base):.2f}x" for name, _ in SELECTIVE]
        )
    print(
        table(
            ["kind", "keyword query", "docs with all", "unfiltered p50 ms", *(f"{n} ratio" for n, _ in SELECTIVE)],
            q_rows,
            title="keyword search per query (p50 over rounds)",
            formats=[None, None, "d", ".2f", None, None, None],
        )
    )
    print()
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in exact:
        by.setdefault((e["kind"], e["filter"]), []).append(e)
    print(
        table(
            ["search", "filter", "queries", "same as brute force", "results (min-max)"],
            [
                [
                    k,
                    f,
                    len(es),
                    f"{sum(e['same'] for e in es)}/{len(es)}",
                    f"{min(e['n'] for e in es)}-{max(e['n'] for e in es)}",
                ]
                for (k, f), es in by.items()
            ],  # fmt: skip
            title=f"exactness: filtered top {LIMIT} vs the full unfiltered ranking filtered in Python ({exact_s:.0f}s)",
        )
    )
    misses = [e for e in exact if not e["same"]]
    print(f"exactness: {len(exact) - len(misses)}/{len(exact)} identical" + (f"; differ: {misses}" if misses else ""))
    result["eligible"] = m["eligible"]
    result["documents"] = m["documents"]
    result["summary"] = summary
    result["eligible_query"] = {k: summary_ms(v) for k, v in m["eligible_query"].items()}
    result["eligible_fetch"] = {k: summary_ms(v) for k, v in m["eligible_fetch"].items()}
    result["exactness"] = exact
    path = write_json("filter", result)
    print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
