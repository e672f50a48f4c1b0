"""Keyword ranking's parameters, each measured against what ships (issue 33): bm25's k1
and b, the column weights, and porter's stemming, on BEIR-format sets.

    .venv/bin/python bench/bench_bm25.py /tmp/node /tmp/man /tmp/pydoc /tmp/info [--max-queries N] [--url ...]

Each set is indexed into SQLite through the library (`qmd.open`: the real indexer), and an
embedded Postgres (tests/pg_server.py, unless --url names a server) is fed from that
index's rows twice: cut by the index's tokenizer (``porter unicode61``) and by
``unicode61`` alone, no stemmer (`fts_tokens.other_tokenizer`). FTS5 fixes bm25's b, so
the variants run on Postgres, whose ranking is FTS5's to the bit at the shipped parameters
(checked first: every query's top 100 on SQLite equal to Postgres', ids, bm25 and score).
k1 moves on both backends the same way, through the column weights (`lexical.Bm25`), so a
better k1 could ship on SQLite; a better b could not without a ranking of our own.

Variants, each run over every query, top 100:

  k1 x b    k1 0.9, 1.2 (shipped), 1.6, 2.0, 2.4, 3.0 and b 0.3, 0.5, 0.75 (shipped), 0.9
  weights   (path, title, body) against the original's (1.5, 4, 1): title 1, 2, 6, 8;
            path 0; body 2
  stemming  none against porter

Printed per set: the shipped parameters' nDCG@10, MRR@10 and Recall@100, then each variant's
difference from them in nDCG@10 (the table) and all three in bench/out/bench_bm25.json.
Figures only, never assertions; a variant is worth shipping only where it helps more than
one set and hurts none by more than noise (the issue's rule).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
from _common import code_line, machine, pg_database, table, write_json  # noqa: E402
from bench_postgres_lexical import feed, sqlite_set  # noqa: E402
from pg_server import embedded_postgres  # noqa: E402 - tests/ is on the path through _common

from qmd.server.quality import Fixture, load_beir, score  # noqa: E402
from qmd.server.search.lexical import BM25, Bm25, LexHit, parse_lex, search_fts  # noqa: E402
from qmd.server.search.lexical_pg import search_pg  # noqa: E402
from qmd.server.store import pg  # noqa: E402
from qmd.server.store.fts_tokens import PhraseTokenizer, other_tokenizer, tokenize_documents, tokenize_phrases  # noqa: E402

K1S = (0.9, 1.2, 1.6, 2.0, 2.4, 3.0)
BS = (0.3, 0.5, 0.75, 0.9)
WEIGHTS = {
    "title 1": (1.5, 1.0, 1.0),
    "title 2": (1.5, 2.0, 1.0),
    "title 6": (1.5, 6.0, 1.0),
    "title 8": (1.5, 8.0, 1.0),
    "path 0": (0.0, 4.0, 1.0),
    "body 2": (1.5, 4.0, 2.0),
}
DEPTH = 100
Search = Callable[[str], list[LexHit]]


@dataclass(frozen=True)
class Figures:
    """One variant's means over a set's queries."""

    ndcg_at_10: float
    mrr_at_10: float
    recall_at_100: float


def measure(fixture: Fixture, paths: dict[int, str], search: Search) -> Figures:
    scores = [score([paths[h.doc_id] for h in search(q.query)], q) for q in fixture.queries]
    n = len(scores)
    return Figures(
        sum(s.ndcg_at_10 for s in scores) / n,
        sum(s.mrr_at_10 for s in scores) / n,
        sum(s.recall_at_100 for s in scores) / n,
    )


@dataclass(frozen=True)
class SetResult:
    set: str
    documents: int
    queries: int
    top100_equal_to_sqlite: int
    figures: dict[str, Figures]
    """Variant name → its figures; "shipped" first."""


def on_postgres(conn: psycopg.Connection, bm25: Bm25, tokenize: PhraseTokenizer = tokenize_phrases) -> Search:
    return lambda text: search_pg(conn, parse_lex(text), DEPTH, "bench", tokenize=tokenize, bm25=bm25)


def one_set(beir: Path, url: str, number: int, max_queries: int | None, stack: ExitStack) -> SetResult:
    docs, fixture, warnings = load_beir(beir, max_queries=max_queries)
    for w in warnings:
        print(f"warning: {beir}: {w}", file=sys.stderr)
    lite, rows = sqlite_set(docs, Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="qmd-bench-bm25-"))))
    paths = {d.doc_id: d.filepath for d in rows}
    porter = stack.enter_context(pg.connect(pg_database(url, f"qmd_bench_bm25_{number}_porter")))
    plain = stack.enter_context(pg.connect(pg_database(url, f"qmd_bench_bm25_{number}_plain")))
    plain_docs, plain_phrases = other_tokenizer("unicode61")
    feed(porter, rows, tokenize_documents)
    feed(plain, rows, plain_docs)

    shipped = {q.query: on_postgres(porter, BM25)(q.query) for q in fixture.queries}
    same = sum(search_fts(lite, parse_lex(q.query), "bench", DEPTH) == shipped[q.query] for q in fixture.queries)
    figures = {"shipped": measure(fixture, paths, shipped.__getitem__)}
    for k1 in K1S:
        for b in BS:
            if (k1, b) != (BM25.k1, BM25.b):
                figures[f"k1 {k1} b {b}"] = measure(fixture, paths, on_postgres(porter, Bm25(k1, b, BM25.weights)))
    for name, weights in WEIGHTS.items():
        figures[name] = measure(fixture, paths, on_postgres(porter, Bm25(BM25.k1, BM25.b, weights)))
    figures["no stemmer"] = measure(fixture, paths, on_postgres(plain, BM25, plain_phrases))
    lite.close()
    return SetResult(str(beir), len(rows), len(fixture.queries), same, figures)


def report(results: Sequence[SetResult]) -> str:
    names = [Path(r.set).name for r in results]
    shipped = [r.figures["shipped"] for r in results]
    head = [
        ["documents", *(r.documents for r in results)],
        ["queries", *(r.queries for r in results)],
        ["top 100 = SQLite's", *(r.top100_equal_to_sqlite for r in results)],
        ["shipped nDCG@10", *(s.ndcg_at_10 for s in shipped)],
        ["shipped MRR@10", *(s.mrr_at_10 for s in shipped)],
        ["shipped R@100", *(s.recall_at_100 for s in shipped)],
    ]
    rows = [
        [name, *(r.figures[name].ndcg_at_10 - s.ndcg_at_10 for r, s in zip(results, shipped, strict=True))]
        for name in results[0].figures
        if name != "shipped"
    ]
    return "\n\n".join(
        [
            table(["", *names], head, formats=[None, *(".4g" for _ in names)]),
            table(
                ["nDCG@10 minus shipped", *names],
                rows,
                formats=[None, *("+.4f" for _ in names)],
                title=f"shipped: k1 {BM25.k1}, b {BM25.b}, weights {BM25.weights}, porter",
            ),
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("beir", type=Path, nargs="+", help="BEIR-format folders (bench/*_beir.py make them)")
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument(
        "--url", help="a Postgres server to use (a superuser: it creates databases) instead of an embedded one"
    )
    args = ap.parse_args()
    print(code_line())
    with ExitStack() as stack:
        url = args.url or stack.enter_context(embedded_postgres())
        results = [one_set(beir, url, i, args.max_queries, stack) for i, beir in enumerate(args.beir)]
    print(report(results))
    out = write_json(
        "bench_bm25", {"machine": machine(), "shipped": asdict(BM25), "sets": [asdict(r) for r in results]}
    )
    print(f"written: {out}")


if __name__ == "__main__":
    main()
