"""Filtered search is exact: for random documents and random filters, the filtered
result equals the unfiltered ranking with the filter applied in Python (the filter
module's reference evaluator), for keyword search, vector search (both its dense and
sparse plans) and the hybrid query's lists, however selective the filter."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from conftest import new_database, write

from qmd.paths import IndexPaths
from qmd.server.engine import Engine
from qmd.server.search import lexical
from qmd.server.search.filters import Filter, matches, parse_filter
from qmd.server.search.hybrid import CostModel, HybridQuery, Legs, QueryOptions
from qmd.server.search.keyword import lexical_hits
from qmd.server.search.lexical import parse_lex
from qmd.server.search.pointers import SearchOptions
from qmd.server.search.querydoc import typed_query
from qmd.server.search.rerank import CosineScorer
from qmd.server.search.scope import Scope, scope_of
from qmd.server.search.vector import nearest_chunks, vector_hits
from qmd.server.store import vectors
from qmd.server.store.db import IndexStore
from qmd.server.store.pg_store import PgStore
from qmd.server.text.frontmatter import Metadata

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
STATUS = ["draft", "published", "archived", "Published"]
TOPICS = ["sql", "sqlite", "search", "typescript", "mcp", "Ägypten"]
DOCS = 240
DIMS = 8


def frontmatter(rng: random.Random) -> tuple[str, Metadata | None]:
    """Random metadata (or none, or a rejected block) as YAML, and what it should index as."""
    roll = rng.random()
    if roll < 0.1:
        return "", {}
    if roll < 0.15:
        return "---\nqmd:\n  metadata:\n    bad: null\n---\n", None
    meta: Metadata = {}
    if rng.random() < 0.8:
        meta["status"] = rng.choice(STATUS)
    if rng.random() < 0.7:
        meta["priority"] = rng.choice([1, 2, 3, 4, 5, 2.5])
    if rng.random() < 0.2:
        meta["priority"] = rng.choice(["high", "low"])  # a type conflict across documents
    if rng.random() < 0.6:
        meta["topics"] = sorted(set(rng.sample(TOPICS, rng.randint(1, 3))))
    if rng.random() < 0.5:
        meta["reviewed"] = rng.random() < 0.5
    lines = []
    for k, v in meta.items():
        if isinstance(v, list):
            lines.append(f"    {k}: [{', '.join(v)}]")  # type: ignore[arg-type]
        elif isinstance(v, bool):
            lines.append(f"    {k}: {'true' if v else 'false'}")
        else:
            lines.append(f"    {k}: {v}")
    if not lines:
        return "", {}
    return "---\nqmd:\n  metadata:\n" + "\n".join(lines) + "\n---\n", meta


def random_filter(rng: random.Random, depth: int = 0) -> dict:
    if depth < 2 and rng.random() < 0.35:
        op = rng.choice(["and", "or", "not"])
        if op == "not":
            return {"operator": "not", "operand": random_filter(rng, depth + 1)}
        return {"operator": op, "operands": [random_filter(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    field = rng.choice(["status", "priority", "topics", "reviewed", "missing"])
    kind = rng.random()
    if field in ("status", "topics", "missing"):
        pool = STATUS if field == "status" else TOPICS
        if kind < 0.3:
            cond = {"field": field, "operator": rng.choice(["eq", "ne"]), "value": rng.choice(pool)}
        elif kind < 0.55:
            cond = {"field": field, "operator": rng.choice(["in", "nin", "all"]), "value": rng.sample(pool, 2)}
        elif kind < 0.8:
            cond = {"field": field, "operator": rng.choice(["prefix", "suffix", "contains"]), "value": "s"}
        else:
            return {"field": field, "operator": "exists", "value": rng.random() < 0.5}
        if rng.random() < 0.3:
            cond["caseInsensitive"] = True
        return cond
    if field == "priority":
        if kind < 0.6:
            return {"field": field, "operator": rng.choice(["gt", "gte", "lt", "lte", "eq", "ne"]), "value": 3}
        return {"field": field, "operator": "type", "value": rng.choice(["number", "string"])}
    return {"field": field, "operator": rng.choice(["eq", "ne"]), "value": rng.random() < 0.5}


class Corpus:
    def __init__(self, engine: Engine, meta: dict[str, Metadata | None]) -> None:
        self.engine = engine
        with engine.store.read() as conn:
            self.ids = {r[1]: r[0] for r in conn.execute("SELECT id, path FROM documents")}
        self.meta = {self.ids[p]: m for p, m in meta.items()}
        self.by_path = meta

    def spaces(self) -> dict[str, vectors.Space]:
        """Every collection's vector space: the one the corpus's vectors were written in."""
        with self.engine.store.read() as conn:
            space = vectors.find_space(conn, "fp-test")
        assert space is not None
        return dict.fromkeys(self.engine.config.collections, space)

    def admits(self, f: Filter, doc_id: int) -> bool:
        m = self.meta[doc_id]
        return m is not None and matches(f, m)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, postgres_template: str | None) -> Iterator[Corpus]:
    """On the backend the run is for (module-wide, so its own database on Postgres)."""
    with ExitStack() as stack:
        store = None
        if postgres_template is not None:
            store = PgStore(stack.enter_context(new_database(postgres_template, template="qmd_template")))
        yield from _corpus(tmp_path_factory.mktemp("filtered"), store)


def _corpus(tmp: Path, store: IndexStore | None) -> Iterator[Corpus]:
    rng = random.Random(7)
    files: dict[str, str | bytes] = {}
    meta: dict[str, Metadata | None] = {}
    for i in range(DOCS):
        fm, m = frontmatter(rng)
        body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))
        files[f"d{i:03}.md"] = f"{fm}# Doc {i}\n\n{body}\n"
        meta[f"d{i:03}.md"] = m
    engine = Engine(IndexPaths("t", tmp / "index.sqlite", tmp / "index.yml", tmp), store=store)
    engine.create_collection(str(write(tmp / "docs", files)), name="docs")
    engine.update()
    # Vectors without a model: one random unit-ish vector per document, through the
    # real vec0 tables the embedder writes.
    vrng = random.Random(11)

    def fill(conn: object) -> None:
        space = vectors.ensure_space(conn, "fp-test", "test", DIMS)  # type: ignore[arg-type]
        for h, start, end in conn.execute(  # type: ignore[attr-defined]
            "SELECT DISTINCT d.hash, 1, 2 FROM documents d WHERE d.active = 1"
        ).fetchall():
            chunks = [
                vectors.ChunkVector(seq, 0, 1, start, end, 4, False, [vrng.uniform(-1, 1) for _ in range(DIMS)])
                for seq in range(vrng.randint(1, 3))
            ]
            vectors.write_document(conn, space, h, chunks, len(chunks))  # type: ignore[arg-type]
        vectors.sync_partitions(conn, space)  # type: ignore[arg-type]

    engine.store.write(fill)
    yield Corpus(engine, meta)
    engine.close()


def scoped(engine: Engine, f: Filter | None = None) -> Scope:
    """Every collection, under `f`, compiled for the engine's backend."""
    return scope_of(engine.config, None, f, dialect=engine.store.dialect)


def filters(n: int, seed: int) -> list[tuple[dict, Filter]]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        raw = random_filter(rng)
        out.append((raw, parse_filter(raw)))
    return out


@pytest.mark.parametrize("per_row", [0, 10**9], ids=["listed-scope", "per-row-scope"])
def test_keyword_search_under_a_filter_is_the_filtered_ranking(
    corpus: Corpus, per_row: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both forms of the scope test, each forced on every statement."""
    monkeypatch.setattr(lexical, "PER_ROW_SCOPE", per_row)
    engine = corpus.engine
    rng = random.Random(3)
    full_scope = scoped(engine)
    checked = 0
    for raw, f in filters(150, seed=1):
        query = " ".join(rng.sample(WORDS, rng.randint(1, 3)))
        lexq = parse_lex(query)
        limit = rng.choice([1, 5, 20])
        everything = lexical_hits(engine.store, lexq, full_scope, 10_000)
        expected = [h.doc.id for h in everything if corpus.admits(f, h.doc.id)][:limit]
        got = [h.doc.id for h in lexical_hits(engine.store, lexq, scoped(engine, f), limit)]
        assert got == expected, (raw, query)
        checked += bool(expected)
    assert checked > 50  # most filters admit something: the comparison is not vacuous


@pytest.mark.parametrize("dense", [0.0, 2.0], ids=["widened-knn", "restricted-knn"])
def test_vector_search_under_a_filter_is_the_filtered_ranking(
    corpus: Corpus, dense: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both plans, each forced on every filter: the share threshold only picks the faster."""
    monkeypatch.setattr(vectors, "DENSE", dense)
    engine = corpus.engine
    spaces = corpus.spaces()
    rng = random.Random(5)
    full_scope = scoped(engine)
    for raw, f in filters(100, seed=2):
        q = [rng.uniform(-1, 1) for _ in range(DIMS)]
        limit = rng.choice([1, 5, 20])
        everything = vector_hits(engine.store, spaces, q, full_scope, DOCS)
        expected = [h.doc_id for h in everything if corpus.admits(f, h.doc_id)][:limit]
        got = [h.doc_id for h in vector_hits(engine.store, spaces, q, scoped(engine, f), limit)]
        assert got == expected, raw


def test_every_hybrid_list_is_filtered_before_fusion(corpus: Corpus) -> None:
    """A one-list hybrid query keeps that list's order, so it must equal the filtered
    keyword ranking; with vectors too, every result satisfies the filter."""
    engine = corpus.engine
    vleg_rng = random.Random(9)
    from qmd.server.search.hybrid import VectorLeg

    spaces = corpus.spaces()
    leg = VectorLeg(
        embed=lambda texts: [[vleg_rng.uniform(-1, 1) for _ in range(DIMS)] for _ in texts],
        search=lambda qvec, k, scope: vector_hits(engine.store, spaces, qvec, scope, k),
        nearest=lambda qvec, docs: nearest_chunks(engine.store, spaces, qvec, docs),
        model="test",
    )
    full_scope = scoped(engine)
    for raw, f in filters(40, seed=4):
        lex_only = HybridQuery(engine.store, engine.config, Legs(None, "off", None, "off", None, "off"), CostModel())
        out = lex_only.run(typed_query([("lex", "alpha beta")], None), QueryOptions(limit=10, rerank=False, filter=f))
        everything = lexical_hits(engine.store, parse_lex("alpha beta"), full_scope, 10_000)
        expected = [h.doc.path for h in everything if corpus.admits(f, h.doc.id)][:10]
        assert [h.doc.path for h in out.hits] == expected, raw
        both = HybridQuery(engine.store, engine.config, Legs(leg, "", None, "off", None, "off"), CostModel())
        out = both.run(
            typed_query([("lex", "gamma"), ("vec", "anything")], None), QueryOptions(limit=10, rerank=False, filter=f)
        )
        assert all(corpus.admits(f, corpus.ids[h.doc.path]) for h in out.hits), raw
        assert all(h.metadata == corpus.by_path[h.doc.path] for h in out.hits)
        cosine = HybridQuery(engine.store, engine.config, Legs(leg, "", None, "off", CosineScorer(), ""), CostModel())
        out = cosine.run(typed_query([("vec", "anything")], None), QueryOptions(limit=10, filter=f, rerank=True))
        assert all(corpus.admits(f, corpus.ids[h.doc.path]) for h in out.hits), raw
        assert all(h.rerank is not None and 0 <= h.rerank <= 1 for h in out.hits), raw


def test_nearest_chunks_are_the_vector_searchs_own(corpus: Corpus) -> None:
    """What cosine reranking reads, for any set of documents (near or far from the query),
    is each one's nearest chunk exactly as the exact vector search finds it: the same
    distance and the same chunk, on either backend."""
    engine = corpus.engine
    spaces = corpus.spaces()
    rng = random.Random(11)
    ids = sorted(corpus.ids.values())
    for _ in range(20):
        q = [rng.uniform(-1, 1) for _ in range(DIMS)]
        exact = {h.doc_id: h for h in vector_hits(engine.store, spaces, q, scoped(engine), DOCS)}
        chosen = rng.sample(ids, rng.choice([1, 7, 40]))
        got = nearest_chunks(engine.store, spaces, q, {"docs": chosen})
        assert set(got) == {d for d in chosen if d in exact}
        for d, h in got.items():
            assert h.distance == pytest.approx(exact[d].distance, abs=1e-6)
            assert (h.start_line, h.end_line) == (exact[d].start_line, exact[d].end_line)
    assert nearest_chunks(engine.store, spaces, q, {"docs": []}) == {}
    assert nearest_chunks(engine.store, spaces, q, {"elsewhere": ids[:3]}) == {}  # a collection without vectors


def test_results_carry_their_metadata_and_a_short_answer_says_why(corpus: Corpus) -> None:
    engine = corpus.engine
    f = {"field": "status", "operator": "eq", "value": "Published"}
    out = engine.search("alpha", SearchOptions(limit=200, filter=parse_filter(f)))
    assert out.hits and all(h.metadata.get("status") == "Published" for h in out.hits)
    assert out.filter is not None and out.filter.rejected > 0
    assert out.filter.eligible == sum(1 for m in corpus.meta.values() if m and m.get("status") == "Published")
    assert any(f"the filter admits {out.filter.eligible} of {DOCS} documents" in w for w in out.warnings)
    assert any("could not be read" in w for w in out.warnings)
    plain = engine.search("alpha", SearchOptions(limit=200))
    assert plain.filter is None and not any("filter" in w for w in plain.warnings)
    full = engine.search("alpha", SearchOptions(limit=1, filter=parse_filter(f)))
    assert len(full.hits) == 1 and full.warnings == []  # a full answer has nothing to explain
