"""Keyword search over collections, shaped into pointers.

Each collection is searched on its own and the lists merged by score (spec §10.4),
so one big collection never starves a small one. Every hit names a file, a docid
and the line range of its best passage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

from qmd.server.errors import InvalidInput, QmdError
from qmd.server.index import vectors
from qmd.server.index.config import Config
from qmd.server.index.documents import DocRow, fetch_ids
from qmd.server.index.store import Store
from qmd.server.search.lexical import LexQuery, parse_lex, search_fts
from qmd.server.search.snippets import best_passage, snippet_header

MAX_QUERY_CHARS = 20_000
ALL_LIMIT = 100_000


@dataclass
class Hit:
    doc: DocRow
    score: float
    matched: int
    total: int


@dataclass
class SearchOutcome:
    hits: list[dict]
    below_min_score: bool = False
    warnings: list[str] = field(default_factory=list)
    terms: tuple[str, ...] = ()
    degraded: bool = False  # a vector search answered with keyword results


def resolve_scope(config: Config, collections: list[str] | None) -> list[str]:
    """Named collections (each must exist), else the default ones (`includeByDefault`)."""
    if collections:
        for name in collections:
            config.get(name)
        return list(dict.fromkeys(collections))
    return config.default_names()


def file_uri(collection: str, path: str, index_name: str | None) -> str:
    uri = f"qmd://{collection}/{path}"
    return uri + f"?index={quote(index_name)}" if index_name else uri


def doc_fields(doc: DocRow, config: Config, index_name: str | None) -> dict:
    """What names a document on the wire: the pointer every result and `get` carries."""
    coll = config.collections.get(doc.collection)
    return {
        "file": file_uri(doc.collection, doc.path, index_name),
        "docid": doc.hash[:6],
        "collection": doc.collection,
        "path": doc.path,
        "abs_path": str(coll.root / doc.path) if coll else None,
        "title": doc.title,
        "context": config.context_for(doc.collection, doc.path),
    }


def shape_hit(
    doc: DocRow,
    score: float,
    config: Config,
    terms: tuple[str, ...],
    *,
    full: bool,
    index_name: str | None,
    max_len: int = 500,
    explain: dict | None = None,
    lines_within: tuple[int, int] | None = None,
    intent_terms: tuple[str, ...] = (),
) -> dict:
    passage = best_passage(doc.body, terms, max_len=max_len, lines_within=lines_within, intent_terms=intent_terms)
    return {
        **doc_fields(doc, config, index_name),
        "score": score,
        "line": passage.line,
        "start_line": passage.start_line,
        "end_line": passage.end_line,
        "total_lines": passage.total_lines,
        "snippet": passage.text,
        "body": doc.body if full else None,
        "terms": list(terms),
        "explain": explain,
    }


def lexical_hits(store: Store, query: LexQuery, scope: list[str], fetch: int) -> list[Hit]:
    with store.read() as conn:
        best: dict[int, tuple[float, int, int]] = {}
        for name in scope:
            for h in search_fts(conn, query, name, fetch):
                if h.doc_id not in best or h.score > best[h.doc_id][0]:
                    best[h.doc_id] = (h.score, h.matched, h.total)
        ranked = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[0]))[:fetch]
        docs = fetch_ids(conn, [doc_id for doc_id, _ in ranked])
    return [Hit(docs[i], s, m, t) for i, (s, m, t) in ranked if i in docs]


def search(
    store: Store,
    config: Config,
    query: str,
    *,
    collections: list[str] | None = None,
    limit: int = 5,
    min_score: float = 0.0,
    all_results: bool = False,
    full: bool = False,
    explain: bool = False,
    index_name: str | None = None,
    max_len: int = 500,
) -> SearchOutcome:
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidInput(f"query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
    if limit < 1:
        raise InvalidInput("limit must be at least 1")
    scope = resolve_scope(config, collections)
    lexq = parse_lex(query)
    out = SearchOutcome(hits=[], terms=lexq.terms)
    if lexq.truncated:
        out.warnings.append(
            f"query has more than {len(lexq.positives)} terms; only the first {len(lexq.positives)} were searched"
        )
    if not lexq.positives:
        out.warnings.append("the query has no searchable terms (only negations, punctuation or nothing)")
        return out
    if not scope:
        out.warnings.append("no collections to search: add one with 'qmd collection add <folder>'")
        return out
    fetch = ALL_LIMIT if all_results else max(50, 2 * limit)
    hits = lexical_hits(store, lexq, scope, fetch)
    kept = [h for h in hits if h.score >= min_score]
    out.below_min_score = bool(hits) and not kept
    if not all_results:
        kept = kept[:limit]
    out.hits = [
        shape_hit(
            h.doc,
            h.score,
            config,
            lexq.terms,
            full=full,
            index_name=index_name,
            max_len=max_len,
            explain={"bm25_terms_matched": h.matched, "terms": h.total} if explain else None,
        )
        for h in kept
    ]
    return out


class VectorUnavailable(QmdError):
    """Vector search cannot run (no embedder, no vectors yet); the message says why."""

    status = 503


def vector_search(
    store: Store,
    config: Config,
    space: vectors.Space,
    query_vector: Sequence[float],
    query: str,
    *,
    collections: list[str] | None = None,
    limit: int = 5,
    min_score: float = 0.0,
    all_results: bool = False,
    full: bool = False,
    index_name: str | None = None,
    max_len: int = 500,
) -> SearchOutcome:
    """Nearest documents by cosine similarity (score = 1 − cosine distance), each
    pointing at the line range of its nearest chunk; per collection, then merged."""
    scope = resolve_scope(config, collections)
    terms = parse_lex(query).terms
    out = SearchOutcome(hits=[], terms=terms)
    fetch = vectors.MAX_K if all_results else max(20, 2 * limit)
    ranked = vector_hits(store, space, query_vector, scope, fetch)
    with store.read() as conn:
        docs = fetch_ids(conn, [h.doc_id for h in ranked])
    scored = [(h, 1.0 - h.distance) for h in ranked if h.doc_id in docs]
    kept = [(h, sc) for h, sc in scored if sc >= min_score]
    out.below_min_score = bool(scored) and not kept
    if not all_results:
        kept = kept[:limit]
    out.hits = [
        shape_hit(
            docs[h.doc_id],
            sc,
            config,
            terms,
            full=full,
            index_name=index_name,
            max_len=max_len,
            lines_within=(h.start_line, h.end_line),
        )
        for h, sc in kept
    ]
    return out


def vector_hits(
    store: Store, space: vectors.Space, query_vector: Sequence[float], scope: list[str], fetch: int
) -> list[vectors.VecHit]:
    """Each document's nearest chunk over the collections in `scope`, nearest first."""
    best: dict[int, vectors.VecHit] = {}
    with store.read() as conn:
        for name in scope:
            for h in vectors.search(conn, space, query_vector, name, fetch):
                if h.doc_id not in best or h.distance < best[h.doc_id].distance:
                    best[h.doc_id] = h
    return sorted(best.values(), key=lambda h: (h.distance, h.doc_id))[:fetch]


def numbered_snippet(hit: dict) -> str:
    """The passage under its `@@` header, each line numbered with its real line number."""
    lines = hit["snippet"].split("\n")
    body = "\n".join(f"{hit['start_line'] + i}: {line}" for i, line in enumerate(lines))
    return snippet_header(hit["start_line"], len(lines), hit["total_lines"]) + "\n" + body
