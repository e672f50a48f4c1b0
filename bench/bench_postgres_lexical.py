"""Keyword search on Postgres against SQLite, on a BEIR-format set, in one run (issue 14).

    .venv/bin/python bench/manpages_beir.py /tmp/man
    .venv/bin/python bench/bench_postgres_lexical.py /tmp/man [--max-queries N] [--url postgresql://...]

The set's documents are indexed into a SQLite index through the library (`qmd.open`, the
real indexer), and Postgres (an embedded server, tests/pg_server.py, unless --url names
one) is fed from that index's document rows twice, into two databases:

  fts5      postings cut by FTS5's own tokenizer (server/store/fts_tokens.py): what qmd ships;
  tsvector  postings cut by Postgres' `to_tsvector` with the closest configuration it has
            (default parser, unaccent, the snowball `porter` stemmer, hyphenated words as
            their parts only): the alternative the issue names, measured to see what it loses.

Every query runs on SQLite (`search_fts`) and on both Postgres variants (`search_pg`), top 10.
Printed: nDCG@10 of each, how many queries' top 10 equal SQLite's (for fts5 the very hits,
bm25 to the last bit; for tsvector the documents and their order), keyword latency
p50/p95 of SQLite and of the fts5 variant (its ratio to SQLite in the same run), and the
time to fill each index. Figures only, never assertions.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
from _common import code_line, machine, percentile, pg_database, table, write_json  # noqa: E402
from pg_server import embedded_postgres  # noqa: E402 - tests/ is on the path through _common

import qmd  # noqa: E402
from qmd.server.quality import BeirDoc, load_beir, materialize, score  # noqa: E402
from qmd.server.search.lexical import parse_lex, search_fts  # noqa: E402
from qmd.server.search.lexical_pg import search_pg  # noqa: E402
from qmd.server.store import pg  # noqa: E402
from qmd.server.store.db import sqlite3  # noqa: E402
from qmd.server.store.fts_tokens import DocumentTokenizer, TokenBatch, copy_line, tokenize_documents  # noqa: E402
from qmd.server.store.pg_lexical import LexDoc, put_documents, sqlite_documents  # noqa: E402
from qmd.server.text.cjk import norm_cjk  # noqa: E402

TS_CONFIG = """
CREATE EXTENSION IF NOT EXISTS unaccent;
CREATE TEXT SEARCH DICTIONARY qmd_porter (TEMPLATE = snowball, LANGUAGE = porter);
CREATE TEXT SEARCH CONFIGURATION qmd_porter (COPY = simple);
ALTER TEXT SEARCH CONFIGURATION qmd_porter
    ALTER MAPPING FOR asciiword, word, numword, hword_asciipart, hword_part, hword_numpart WITH unaccent, qmd_porter;
ALTER TEXT SEARCH CONFIGURATION qmd_porter DROP MAPPING FOR asciihword, hword, numhword;
"""
"""The nearest Postgres comes to `porter unicode61`: its parser still keeps paths, versions,
URLs, e-mail addresses and numbers with a dot whole, and a tsvector keeps 256 positions a lexeme."""


class TsvectorTokenizer:
    """Postings and query phrases cut by Postgres' `to_tsvector('qmd_porter', ...)`."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def documents(self, docs: Sequence[tuple[int, str, str, str]]) -> TokenBatch:
        lengths: dict[int, tuple[int, int, int]] = {}
        lines: list[str] = []
        for doc_id, filepath, title, body in docs:
            counts = [0, 0, 0]
            for col, lexeme, positions in self.conn.execute(
                "SELECT t.col - 1, u.lexeme, u.positions FROM unnest(%s::text[]) WITH ORDINALITY AS t(txt, col),"
                " unnest(to_tsvector('qmd_porter', t.txt)) AS u",
                ([filepath, norm_cjk(title), norm_cjk(body)],),
            ):
                lines.append(copy_line(lexeme, doc_id, col, [p - 1 for p in positions]))
                counts[col] += len(positions)
            lengths[doc_id] = (counts[0], counts[1], counts[2])
        return TokenBatch(lengths, "".join(lines))

    def phrases(self, texts: Sequence[str]) -> list[tuple[str, ...]]:
        return [
            tuple(
                row[0]
                for row in self.conn.execute(
                    "SELECT u.lexeme FROM unnest(to_tsvector('qmd_porter', %s)) AS u, unnest(u.positions) AS p"
                    " ORDER BY p",
                    (text,),
                )
            )
            for text in texts
        ]


def sqlite_set(docs: list[BeirDoc], tmp: Path) -> tuple[sqlite3.Connection, list[LexDoc]]:
    """A set's documents indexed into SQLite under `tmp` through the library (`qmd.open`, the
    real indexer), and that index's document rows as a copy to Postgres reads them."""
    materialize(docs, tmp / "corpus")
    with qmd.open(tmp / "i.sqlite", collections={"bench": {"path": str(tmp / "corpus")}}) as index:
        index.update()
    lite = sqlite3.connect(str(tmp / "i.sqlite"))
    return lite, list(sqlite_documents(lite))


def feed(conn: psycopg.Connection, rows: Sequence[LexDoc], tokenize: DocumentTokenizer) -> None:
    """Postgres fed `rows` in batches, as a copy feeds it, and analysed."""
    for i in range(0, len(rows), 200):
        put_documents(conn, rows[i : i + 200], tokenize)
    conn.execute("VACUUM ANALYZE")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("beir", type=Path, help="a BEIR-format folder (bench/manpages_beir.py makes one)")
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument(
        "--url", help="a Postgres server to use (a superuser: it creates two databases) instead of an embedded one"
    )
    args = ap.parse_args()

    docs, fixture, warnings = load_beir(args.beir, max_queries=args.max_queries)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(code_line())
    with tempfile.TemporaryDirectory(prefix="qmd-bench-pg-") as tmp, ExitStack() as stack:
        started = time.perf_counter()
        lite, rows = sqlite_set(docs, Path(tmp))
        sqlite_fill = time.perf_counter() - started
        paths = {d.doc_id: d.filepath for d in rows}

        url = args.url or stack.enter_context(embedded_postgres())
        fts5 = stack.enter_context(pg.connect(pg_database(url, "qmd_bench_fts5")))
        ts = stack.enter_context(pg.connect(pg_database(url, "qmd_bench_tsvector")))
        ts.execute(TS_CONFIG)
        tsvector = TsvectorTokenizer(ts)
        fill: dict[str, float] = {}
        for name, conn, tokenize in (("fts5", fts5, tokenize_documents), ("tsvector", ts, tsvector.documents)):
            started = time.perf_counter()
            feed(conn, rows, tokenize)
            fill[name] = time.perf_counter() - started

        ndcg = {"sqlite": 0.0, "fts5": 0.0, "tsvector": 0.0}
        same = {"fts5": 0, "tsvector": 0}
        latency: dict[str, list[float]] = {"sqlite": [], "fts5": []}
        for warm in fixture.queries[:20]:
            search_fts(lite, parse_lex(warm.query), "bench", 10)
            search_pg(fts5, parse_lex(warm.query), 10, "bench")
        for q in fixture.queries:
            started = time.perf_counter()
            a = search_fts(lite, parse_lex(q.query), "bench", 10)
            latency["sqlite"].append(time.perf_counter() - started)
            started = time.perf_counter()
            b = search_pg(fts5, parse_lex(q.query), 10, "bench")
            latency["fts5"].append(time.perf_counter() - started)
            c = search_pg(ts, parse_lex(q.query), 10, "bench", tokenize=tsvector.phrases)
            for name, hits in (("sqlite", a), ("fts5", b), ("tsvector", c)):
                ndcg[name] += score([paths[h.doc_id] for h in hits], q).ndcg_at_10 / len(fixture.queries)
            same["fts5"] += b == a  # the very hits: ids, order, bm25 and score to the last bit
            same["tsvector"] += [h.doc_id for h in c] == [h.doc_id for h in a]

    ms = {k: (percentile(v, 50) * 1000, percentile(v, 95) * 1000) for k, v in latency.items()}
    n = len(fixture.queries)
    print(f"{args.beir}: {len(rows)} documents, {n} queries, top 10")
    print(
        table(
            ["backend", "nDCG@10", "diff", "top10 = sqlite", "p50 ms", "p95 ms", "p50 x", "fill s"],
            [
                ["sqlite (FTS5)", ndcg["sqlite"], 0.0, n, *ms["sqlite"], 1.0, sqlite_fill],
                [
                    "postgres, fts5 tokens",
                    ndcg["fts5"],
                    ndcg["fts5"] - ndcg["sqlite"],
                    same["fts5"],
                    *ms["fts5"],
                    ms["fts5"][0] / ms["sqlite"][0],
                    fill["fts5"],
                ],
                [
                    "postgres, to_tsvector",
                    ndcg["tsvector"],
                    ndcg["tsvector"] - ndcg["sqlite"],
                    same["tsvector"],
                    None,
                    None,
                    None,
                    fill["tsvector"],
                ],
            ],
            formats=[None, ".4f", "+.4f", None, ".2f", ".2f", ".2f", ".1f"],
        )
    )
    print("(sqlite's fill is the whole indexer: files read, parsed, stored; postgres' is postings from those rows)")
    out = write_json(
        "postgres_lexical",
        {
            "machine": machine(),
            "set": str(args.beir),
            "documents": len(rows),
            "queries": n,
            "ndcg_at_10": ndcg,
            "top10_equal_to_sqlite": same,
            "latency_ms": {k: {"p50": v[0], "p95": v[1]} for k, v in ms.items()},
            "fill_s": {"sqlite": sqlite_fill, **fill},
        },
    )
    print(f"written: {out}")


if __name__ == "__main__":
    main()
