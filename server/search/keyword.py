"""Keyword (BM25) search over collections, shaped into pointers.

Each collection is searched on its own and the lists merged by score (spec §10.4),
so one big collection never starves a small one; when the collections searched hold
every active document, one ranking of the whole index gives the same list for less.
Every hit names a file, a docid and the line range of its best passage.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import cast

from qmd.server.config import Config
from qmd.server.errors import InvalidInput
from qmd.server.search.lexical import Held, LexHit, LexQuery, parse_lex, search_fts
from qmd.server.search.pointers import SearchOptions, SearchOutcome, point_at, within_answer
from qmd.server.search.scope import Scope, filter_report, filter_warnings, scope_of
from qmd.server.search.typos import correct
from qmd.server.store.db import Connection, IndexStore, sqlite3
from qmd.server.store.documents import DocRow, fetch_ids
from qmd.server.store.metadata import ids_sql
from qmd.server.store.sqlite import remembered

MAX_QUERY_CHARS = 20_000
ALL_LIMIT = 100_000


@dataclass
class KeywordHit:
    """A document BM25 found, before it is shaped into a pointer."""

    doc: DocRow
    score: float
    matched: int | None
    """How many of the query's items it holds, where the search counted them (`LexHit.matched`)."""
    total: int
    coordination: float | None
    """The original's score (`LexHit.coordination`), for spec §13.2's strong-signal test."""
    held: float
    """The query's share of idf that the documents searched hold (`lexical.Held`)."""
    elsewhere: tuple[str, ...] = ()
    """The query's words that only collections not searched hold (`lexical.Held.elsewhere`)."""


def _whole_index(conn: Connection, collections: list[str]) -> bool:
    """Whether every active document is in `collections`: then their search is the index's,
    one ranking with no scope test (each collection's own ranking, then the lists merged,
    gives the same top `fetch`: the scores share the index's statistics), where a scoped one
    tests each match against a list of every document in scope (15 ms at 125k documents).
    Kept on a reading connection until the index changes."""
    sql = f"SELECT 1 FROM documents WHERE active = 1 AND collection NOT IN ({','.join('?' * len(collections))}) LIMIT 1"
    key = "\x00whole-index\x00" + "\x00".join(sorted(collections))
    return bool(remembered(conn, key, lambda: int(conn.execute(sql, collections).fetchone() is None)))


def _search(
    store: IndexStore,
    conn: Connection,
    query: LexQuery,
    collection: str | None,
    fetch: int,
    scope: Scope,
    count_matched: bool,
) -> list[LexHit]:
    """One collection's best `fetch` by bm25, from FTS5 (a large ranking in two halves, the
    second on the store's reading connection of another thread) or from the Postgres
    postings (whose ranking counts each hit's items anyway)."""
    if isinstance(conn, sqlite3.Connection):
        beside = cast("Callable[[], AbstractContextManager[sqlite3.Connection]]", store.read)  # a SQLite store's
        return search_fts(conn, query, collection, fetch, scope.doc_filter, count_matched=count_matched, beside=beside)
    from qmd.server.search.lexical_pg import search_pg
    from qmd.server.store.pg_store import raw

    eligible = None
    if scope.doc_filter is not None:
        sql, params = ids_sql(collection, scope.doc_filter)
        eligible = [int(r[0]) for r in conn.execute(sql, params)]
    return search_pg(raw(conn), query, fetch, collection=collection, doc_ids=eligible)


def fuzzed(store: IndexStore, query: LexQuery, notes: list[str]) -> LexQuery:
    """`query` as `--fuzzy` searches it: a word no document holds replaced by its nearest
    indexed word (search/typos.py), and the note saying so added to `notes` once, however
    many of a hybrid query's lines had that word."""
    with store.read() as conn:
        query, fixed = correct(conn, query)
    notes += [c.note for c in fixed if c.note not in notes]
    return query


def lexical_hits(
    store: IndexStore, query: LexQuery, scope: Scope, fetch: int, *, count_matched: bool = False
) -> list[KeywordHit]:
    """The best `fetch` documents of the scope; `count_matched` for each hit's item count."""
    with store.read() as conn:
        best: dict[int, LexHit] = {}
        held: Held | None = None
        whole = scope.doc_filter is None and _whole_index(conn, scope.collections)
        names: list[str | None] = [None] if whole else list(scope.collections)
        for name in names:
            hits = _search(store, conn, query, name, fetch, scope, count_matched)
            if hits:
                held = hits[0].held if held is None else held | hits[0].held
            for h in hits:
                if h.doc_id not in best or h.score > best[h.doc_id].score:
                    best[h.doc_id] = h
        ranked = sorted(best.values(), key=lambda h: (-h.score, h.doc_id))[:fetch]
        docs = fetch_ids(conn, [h.doc_id for h in ranked])
    share, elsewhere = (held.share, held.elsewhere()) if held is not None else (0.0, ())
    return [
        KeywordHit(docs[h.doc_id], h.score, h.matched, h.total, h.coordination, share, elsewhere)
        for h in ranked
        if h.doc_id in docs
    ]


def held_outside(store: IndexStore, query: LexQuery, scope: Scope) -> tuple[str, ...]:
    """For a search of `scope` that found nothing: the words of `query` that documents outside
    it hold (`KeywordHit.elsewhere` where it found something), from one hit of the whole index."""
    with store.read() as conn:
        if scope.doc_filter is None and _whole_index(conn, scope.collections):
            return ()
        hits = _search(store, conn, query, None, 1, replace(scope, doc_filter=None), False)
    return hits[0].held.nowhere_in_scope().elsewhere() if hits else ()


def search(store: IndexStore, config: Config, query: str, opts: SearchOptions, index_name: str | None) -> SearchOutcome:
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidInput(f"query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
    if opts.limit < 1:
        raise InvalidInput("limit must be at least 1")
    scope = scope_of(config, opts.collections, opts.filter, dialect=store.dialect)
    lexq = parse_lex(query)
    out = SearchOutcome(hits=[])
    if opts.fuzzy:
        lexq = fuzzed(store, lexq, out.warnings)
    out.terms = lexq.terms
    if lexq.truncated:
        out.warnings.append(
            f"query has more than {len(lexq.positives)} terms; only the first {len(lexq.positives)} were searched"
        )
    if not lexq.positives:
        out.warnings.append("the query has no searchable terms (only negations, punctuation or nothing)")
        return out
    # the best `limit` by BM25 are the best `limit` by score (`hit_score` keeps the order): the
    # original's max(50, 2 × limit) read 50 documents' bodies to show 10, and ranked deeper
    fetch = ALL_LIMIT if opts.all_results else opts.limit
    hits = lexical_hits(store, lexq, scope, fetch, count_matched=opts.explain)
    with store.read() as conn:
        out.filter = filter_report(conn, scope)
    kept = [h for h in hits if h.score >= opts.min_score]
    out.below_min_score = bool(hits) and not kept
    if not opts.all_results:
        kept = kept[: opts.limit]
    out.hits, cut = within_answer(
        (
            point_at(
                h.doc,
                h.score,
                config,
                lexq.terms,
                full=opts.full,
                index_name=index_name,
                max_len=opts.max_len,
                explain={"bm25_terms_matched": h.matched, "terms": h.total} if opts.explain else None,
            )
            for h in kept
        ),
        len(kept),
    )
    out.warnings += [cut] if cut else []
    out.warnings += filter_warnings(out.filter, len(out.hits), opts.limit)
    return out
