"""The Postgres keyword leg (server/store/pg_lexical.py, server/search/lexical_pg.py) against
the SQLite one, on a real Postgres (conftest's embedded server) and a real SQLite index made
by the real indexer: the same documents, the same queries, the same hits and scores."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from conftest import NOTES, assert_terms_counted, eval_spec, write

import qmd
from qmd.server.errors import IndexTooNew, Unavailable
from qmd.server.quality import BenchQuery, score
from qmd.server.search.lexical import BM25, Bm25, LexHit, indexed_rows, parse_lex, search_fts
from qmd.server.search.lexical_pg import search_pg
from qmd.server.store import pg
from qmd.server.store.db import sqlite3
from qmd.server.store.fts_tokens import other_tokenizer, tokenize_phrases
from qmd.server.store.pg_lexical import LexDoc, Totals, delete_documents, put_documents, sqlite_documents, totals


@pytest.fixture
def pg_url(postgres_url: str) -> Iterator[str]:
    """A database of its own on the session's server, dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
        yield postgres_url.replace("/postgres?", f"/{name}?", 1)
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


@dataclass
class Both:
    """One corpus in a SQLite index (through `qmd.open` and its indexer) and in Postgres."""

    sqlite: sqlite3.Connection
    pg: psycopg.Connection
    index: qmd.Index
    paths: dict[int, str]

    def sync(self) -> None:
        """Postgres fed from the SQLite index's document rows, as a copy would be."""
        docs = list(sqlite_documents(self.sqlite))
        indexed = [row[0] for row in self.pg.execute("SELECT doc_id FROM lex_docs")]
        delete_documents(self.pg, sorted(set(indexed) - {d.doc_id for d in docs}))
        put_documents(self.pg, docs)
        self.paths = {d.doc_id: d.filepath for d in docs}

    def both(
        self, query: str, limit: int = 10, collection: str | None = None, bm25: Bm25 = BM25
    ) -> tuple[list[LexHit], list[LexHit]]:
        lq = parse_lex(query)
        return search_fts(self.sqlite, lq, collection, limit, bm25=bm25), search_pg(
            self.pg, lq, limit, collection, bm25=bm25
        )

    def agree(self, query: str, limit: int = 10, collection: str | None = None, bm25: Bm25 = BM25) -> list[LexHit]:
        """Assert the two legs return the same hits: the same documents in the same order,
        the same match counts, and bm25 and scores equal to the last bit (both sum FTS5's
        terms in the same order, so equal scores stay ties that fall to the lower id);
        the SQLite hits."""
        lite, post = self.both(query, limit, collection, bm25)
        assert post == lite, (query, lite, post)
        return lite


@pytest.fixture
def make_both(tmp_path: Path, pg_url: str) -> Iterator[object]:
    opened: list[Both] = []

    def make(collections: dict[str, Path]) -> Both:
        index = qmd.open(tmp_path / "i.sqlite", collections={n: {"path": str(p)} for n, p in collections.items()})
        index.update()
        b = Both(sqlite3.connect(str(tmp_path / "i.sqlite")), pg.connect(pg_url), index, {})
        b.sync()
        opened.append(b)
        return b

    yield make
    for b in opened:
        b.pg.close()
        b.sqlite.close()
        b.index.close()


def eval_queries() -> list[BenchQuery]:
    """The eval corpus's queries with judgments: the 24 eval, 10 fixture and 25 deep-research ones."""
    spec = eval_spec()
    rows = spec["eval_queries"] + spec["fixture_queries"] + spec["deep_research_queries"]
    return [BenchQuery(q["id"], q["query"], "eval", {f: 1 for f in q["expected_files"]}, 10) for q in rows]


def test_the_eval_corpus_ranks_the_same_on_both(make_both: object, eval_docs: Path) -> None:
    both = make_both({"eval": eval_docs})  # type: ignore[operator]
    ndcg = {"sqlite": 0.0, "postgres": 0.0}
    queries = eval_queries()
    for q in queries:
        lite, post = both.both(q.query)
        both.agree(q.query)
        for name, hits in (("sqlite", lite), ("postgres", post)):
            ndcg[name] += score([both.paths[h.doc_id] for h in hits], q).ndcg_at_10 / len(queries)
    print(f"\neval corpus, {len(queries)} queries: nDCG@10 sqlite {ndcg['sqlite']:.4f} postgres {ndcg['postgres']:.4f}")
    assert abs(ndcg["sqlite"] - ndcg["postgres"]) <= 0.01 and ndcg["sqlite"] > 0.5
    assert totals(both.pg).docs == indexed_rows(both.sqlite) == 6


EXTRA: dict[str, str | bytes] = {
    "cjk/笔记.md": "# 会议笔记\n\n我们讨论了搜索引擎的设计。日本語のテキストも。\n",
    "cjk/other.md": "# 记录\n\n笔和纸。\n",
    "phrases.md": "# Investors\n\nInvestors angel. Angel money is not angel investors' money.\nRunning runners run.\n",
    "tools/node.md": "# Node\n\nnode.js and src/app.py and hello!world; café and cafe and CAFÉ.\n",
}


@pytest.mark.parametrize(
    "query",
    [
        '"angel investors"',  # a phrase: adjacent tokens of one column
        '"investors angel"',
        "invest",  # a one-word query: a prefix
        "runn",  # a prefix stemmed as FTS5 stems it
        "running",
        "bread -sourdough",  # negation
        'startup -"pitch deck" -cooking',
        "笔记",  # CJK: a phrase of characters
        "会议",
        "テキスト",
        "2026.4.10",  # punctuation inside a token: one phrase of its parts
        "multi-agent",
        "node.js",
        "src/app.py",
        "hello!world",
        "cafe",  # diacritics folded by unicode61
        "how do I raise money for a startup",  # stop words dropped
        "angel investors money pitch",  # more than two items: a prefix resolved to the exact word
        "angel invest mon pitch",  # ... or kept a prefix when no document holds the word
        "notes",  # the file path column
        "bread bake flour water salt",
        "zzzunknown",
        "zzzunknown angel",  # an item no document holds adds nothing to the normaliser
        "the",  # only stop words: searched as they are
    ],
)
def test_query_language_matches_sqlite(make_both: object, tmp_path: Path, query: str) -> None:
    notes = write(tmp_path / "notes", {**NOTES, **EXTRA})
    both = make_both({"notes": notes})  # type: ignore[operator]
    assert bool(both.agree(query)) == (query != "zzzunknown")


def test_items_most_documents_hold_follow_on_both(make_both: object, tmp_path: Path) -> None:
    """Words most documents hold do not rank beside a rarer one (`ranking_items`): both legs
    find the rarer word's documents first and those holding only common words after them,
    whether the list ends among the first, among the rest, or holds them all."""
    files = {
        f"n{i:02d}.md": f"# Note {i}\n\nThe river by the stone{' mill' * (i % 3)}.{' Otters swim.' * (i % 5 == 0)}\n"
        + ("A beaver dam.\n" if i % 10 == 0 else "")
        for i in range(30)
    }
    both = make_both({"notes": write(tmp_path / "notes", files)})  # type: ignore[operator]
    for limit in (2, 6, 10, 40):
        hits = both.agree("river stone otters", limit)
        assert len(hits) == min(limit, 30)
        assert all(h.score > 0.1 for h in hits[:6]) and all(h.score < 1e-5 for h in hits[6:])
    assert len(both.agree("river stone otters -beaver", 40)) == 27
    assert len(both.agree("river mill", 40)) == 30


def test_other_bm25_parameters_rank_alike_on_both(make_both: object, tmp_path: Path) -> None:
    """k1 and the column weights move both backends the same way (k1 through the weights,
    `Bm25.fts5_weights`); b moves Postgres only, and SQLite refuses it rather than
    rank by FTS5's b while claiming another (bench/bench_bm25.py measures them)."""
    files = {
        **NOTES,
        **EXTRA,
        "angels.md": "# Notes\n\nangel " * 6 + "investors\n",
        "pitch.md": "# Angel investors\n\nA pitch deck for angel investors, and a long tail of words about"
        " bread, flour, water and salt that makes this note longer than most.\n",
    }
    both = make_both({"notes": write(tmp_path / "notes", files)})  # type: ignore[operator]
    other = Bm25(k1=3.0, weights=(1.0, 8.0, 1.0))
    moved = 0
    for query in ("angel investors", "angel investors pitch bread", "running runners", "notes angel", "cafe"):
        lite, post = both.both(query, 20, bm25=other)
        # weights such as 0.4 are inexact in binary, and the two sum a document's columns in
        # different orders: equal to rounding, where the shipped weights are equal to the bit
        assert [(h.doc_id, h.matched) for h in post] == [(h.doc_id, h.matched) for h in lite]
        assert [h.bm25 for h in post] == pytest.approx([h.bm25 for h in lite], rel=1e-12)
        moved += [h.bm25 for h in lite] != [h.bm25 for h in both.agree(query, 20)]
        assert all(0 < h.score < 1 for h in lite)
    assert moved >= 4
    flat = Bm25(b=0.3)
    lq = parse_lex("angel investors pitch bread")
    assert [h.bm25 for h in search_pg(both.pg, lq, 20, bm25=flat)] != [
        h.bm25 for h in both.agree("angel investors pitch bread", 20)
    ]
    with pytest.raises(ValueError, match="FTS5 fixes bm25's b at 0.75"):
        search_fts(both.sqlite, lq, None, 20, bm25=flat)


def test_postings_cut_by_another_tokenizer_search_as_it_cuts(pg_url: str) -> None:
    """`other_tokenizer("unicode61")` (no stemmer) feeds and searches a Postgres index the way
    bench_bm25.py measures porter's worth: `running` then finds only the word as written."""
    docs, phrases = other_tokenizer("unicode61")
    rows = [LexDoc(1, "notes", "notes/a.md", "", "running fast"), LexDoc(2, "notes", "notes/b.md", "", "she runs")]
    with pg.connect(pg_url) as conn:
        put_documents(conn, rows, docs)
        assert [h.doc_id for h in search_pg(conn, parse_lex("running"), 10, tokenize=phrases)] == [1]
        assert [h.doc_id for h in search_pg(conn, parse_lex("runs"), 10, tokenize=phrases)] == [2]
    assert phrases(["Running runs"]) == [("running", "runs")]
    assert tokenize_phrases(["Running runs"]) == [("run", "run")]  # the index's own: porter


def test_collection_and_id_restrictions_rank_with_the_whole_index(make_both: object, tmp_path: Path) -> None:
    a = write(tmp_path / "a", NOTES)
    b = write(tmp_path / "b", {**EXTRA, "more.md": "# Angels\n\nangel angel investors bread\n"})
    both = make_both({"a": a, "b": b})  # type: ignore[operator]
    for query in ("angel investors", "bread", "investors -sourdough", "angel cafe"):
        everything = both.agree(query, limit=50)
        assert len({both.paths[h.doc_id].split("/")[0] for h in everything}) == 2
        for collection in ("a", "b"):
            scoped = both.agree(query, collection=collection)
            assert scoped and all(both.paths[h.doc_id].startswith(f"{collection}/") for h in scoped)
        ids = [h.doc_id for h in everything][1::2]
        chosen = search_pg(both.pg, parse_lex(query), 10, doc_ids=ids)
        assert [h.doc_id for h in chosen] == [h.doc_id for h in everything if h.doc_id in ids][:10]
        assert search_pg(both.pg, parse_lex(query), 10, doc_ids=[]) == []
    # what the collection searched holds, on both: "cafe" only b holds, by a prefix here and
    # exactly in a longer query; a list of one looks for the item its hit lacks
    for query in ("angel cafe", "angel investors cafe", "angel investors cafe -bread"):
        for limit in (1, 10):
            held = {name: both.agree(query, limit, name)[0].held for name in ("a", "b")}
            assert held["a"].present[-1] is False and held["b"].present[-1] is True
            assert held["a"] | held["b"] == both.agree(query, limit)[0].held
        ids = [h.doc_id for h in both.agree(query, 50, "a")]
        assert search_pg(both.pg, parse_lex(query), 10, doc_ids=ids)[0].held == both.agree(query, 10, "a")[0].held


def test_deletes_and_edits_move_the_statistics(make_both: object, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {**NOTES, **EXTRA})
    both = make_both({"notes": notes})  # type: ignore[operator]
    before = totals(both.pg)
    assert both.pg.execute("SELECT docs FROM lex_terms WHERE term = 'runner'").fetchone() == (1,)
    (notes / "phrases.md").unlink()
    write(notes, {"ideas.md": "# Ideas\n\nAngel investors like bread, and angel bread likes investors.\n"})
    both.index.update()
    both.sync()
    after = totals(both.pg)
    assert after.docs == before.docs - 1 == indexed_rows(both.sqlite)
    postings = both.pg.execute("SELECT sum(tf), count(DISTINCT doc_id) FROM lex_postings").fetchone()
    lengths = both.pg.execute("SELECT sum(len_filepath + len_title + len_body) FROM lex_docs").fetchone()
    assert postings == (after.tokens, after.docs) and lengths == (after.tokens,)
    assert_terms_counted(both.pg)
    assert both.pg.execute("SELECT docs FROM lex_terms WHERE term = 'runner'").fetchone() is None  # note gone
    for query in ("angel investors", '"angel investors"', "running", "bread -sourdough", "ideas"):
        both.agree(query)
    put_documents(both.pg, list(sqlite_documents(both.sqlite)))  # indexing again changes nothing
    assert totals(both.pg) == after
    assert_terms_counted(both.pg)
    delete_documents(both.pg, [*both.paths, 10**9])
    assert totals(both.pg).docs == 0 and both.pg.execute("SELECT count(*) FROM lex_postings").fetchone() == (0,)
    assert both.pg.execute("SELECT count(*) FROM lex_terms").fetchone() == (0,)
    assert search_pg(both.pg, parse_lex("angel"), 10) == []


def test_postings_hold_each_terms_offsets_in_order(pg_url: str) -> None:
    """The tokenizer writes COPY lines straight from FTS5's vocabulary: each offset list
    ascending, each frequency its length, tabs and backslashes in a path escaped."""
    conn = pg.connect(pg_url)
    body = " ".join(["zeta alpha beta alpha"] * 40) + " tab\tpath back\\slash"
    put_documents(conn, [LexDoc(7, "c", "c/dir\\x.md", "Alpha alpha", body)])
    rows = conn.execute("SELECT term, col, tf, positions FROM lex_postings WHERE doc_id = 7").fetchall()
    assert rows and all(positions == sorted(positions) and tf == len(positions) for _, _, tf, positions in rows)
    by = {(term, col): positions for term, col, _, positions in rows}
    assert by[("alpha", 2)][:4] == [1, 3, 5, 7] and by[("alpha", 1)] == [0, 1]
    assert ("dir", 0) in by and ("x", 0) in by
    assert conn.execute("SELECT len_title, len_body FROM lex_docs WHERE doc_id = 7").fetchone() == (2, 164)


def test_a_failed_write_changes_nothing(pg_url: str) -> None:
    conn = pg.connect(pg_url)
    put_documents(conn, [LexDoc(1, "c", "c/a.md", "Alpha", "alpha beta")])
    before = totals(conn)
    with pytest.raises(psycopg.DataError):  # Postgres text holds no NUL: the second row fails
        put_documents(conn, [LexDoc(2, "c", "c/b.md", "Beta", "beta"), LexDoc(3, "c\x00", "c/c.md", "", "gamma")])
    assert totals(conn) == before
    assert [row[0] for row in conn.execute("SELECT doc_id FROM lex_docs")] == [1]
    assert_terms_counted(conn)
    assert [h.doc_id for h in search_pg(conn, parse_lex("beta"), 10)] == [1]


def test_concurrent_writers_queue_on_the_totals_and_lose_nothing(pg_url: str) -> None:
    """Two daemons' writers at once (two connections, overlapping ids): each write is whole,
    and the statistics count every document once."""
    from concurrent.futures import ThreadPoolExecutor

    def writer(offset: int) -> None:
        with pg.connect(pg_url) as conn:
            for i in range(10):
                ids = range(offset + i * 5, offset + i * 5 + 8)  # overlaps the other writer's ids
                put_documents(conn, [LexDoc(n, "c", f"c/{n}.md", f"Doc {n}", f"shared words {n}") for n in ids])

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(writer, (0, 25)))
    conn = pg.connect(pg_url)
    docs = conn.execute("SELECT count(*), sum(len_filepath + len_title + len_body) FROM lex_docs").fetchone()
    assert docs is not None and totals(conn) == Totals(docs[0], docs[1]) and docs[0] == 78
    assert_terms_counted(conn)
    assert len(search_pg(conn, parse_lex("shared"), 100)) == 78


def test_an_unreachable_server_is_unavailable_without_its_password(tmp_path: Path) -> None:
    url = f"postgresql://qmd:s3cret@/qmd?host={tmp_path}&connect_timeout=2"
    with pytest.raises(Unavailable, match="is not reachable") as e:
        pg.connect(url)
    assert "s3cret" not in e.value.message and "qmd:***@" in e.value.message


def test_an_upgrade_counts_the_terms_of_the_documents_indexed_before(pg_url: str) -> None:
    """Migration 10 fills `lex_terms` from the postings an older qmd wrote, and a one-word
    item's idf is read from it: the same hits as counting the postings."""
    conn = pg.connect(pg_url)
    docs = [LexDoc(n, "c", f"c/{n}.md", f"Doc {n}", "alpha beta " * (n % 3) + f"gamma {n}") for n in range(1, 40)]
    put_documents(conn, docs)
    query = parse_lex("alpha gamma")
    before = search_pg(conn, query, 10)
    conn.execute("DROP TABLE lex_terms")
    conn.execute("UPDATE qmd_schema SET version = 9")
    conn = pg.connect(pg_url)
    assert pg.schema_version(conn) == len(pg.MIGRATIONS)
    assert_terms_counted(conn)
    assert conn.execute("SELECT docs FROM lex_terms WHERE term = 'alpha'").fetchone() == (26,)
    assert search_pg(conn, query, 10) == before


def test_the_schema_migrates_once_and_refuses_a_newer_one(pg_url: str) -> None:
    first = pg.connect(pg_url)
    assert pg.schema_version(first) == len(pg.MIGRATIONS)
    pg.connect(pg_url).close()  # a second daemon finds nothing to do
    first.execute("UPDATE qmd_schema SET version = 99")
    with pytest.raises(IndexTooNew, match="schema is version 99"):
        pg.connect(pg_url)
    assert pg.schema_version(first) == 99


def test_a_prefix_range_ends_where_its_strings_end() -> None:
    """The prefix's upper bound in the C collation's code-point order: past the last
    character's successor, skipping the surrogates no text holds; none past U+10FFFF."""
    from qmd.server.search.lexical import successor

    assert successor("ab") == "ac" and successor("a\ud7ff") == "a\ue000" and successor("a\U0010ffff") is None
