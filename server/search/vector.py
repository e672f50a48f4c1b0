"""Vector search over collections, shaped into pointers.

Each collection's partition is searched on its own and the lists merged by distance,
so one big collection never starves a small one. Every hit points at the line range
of its nearest chunk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from qmd.server.config import Config
from qmd.server.errors import Unavailable
from qmd.server.search.lexical import parse_lex
from qmd.server.search.pointers import SearchOptions, SearchOutcome, point_at, within_answer
from qmd.server.search.scope import Scope, filter_report, filter_warnings, scope_of
from qmd.server.store import vectors
from qmd.server.store.db import IndexStore
from qmd.server.store.documents import fetch_ids


class VectorUnavailable(Unavailable):
    """Vector search cannot run (no embedder, no vectors yet); the message says why."""


def vector_score(distance: float) -> float:
    """The public score of a cosine distance d (0 to 2): the seed's 1/(1 + d), in [1/3, 1].
    A raw cosine is negative for unrelated text, so `min_score 0` dropped results; this
    never is, and being monotone in d it ranks exactly as the distance does. Rounding can
    put d a hair below 0 for a text equal to the query, hence the clamp."""
    return 1.0 / (1.0 + max(distance, 0.0))


def vector_search(
    store: IndexStore,
    config: Config,
    spaces: Mapping[str, vectors.Space],
    query_vector: Sequence[float],
    query: str,
    opts: SearchOptions,
    index_name: str | None,
) -> SearchOutcome:
    """Nearest documents by cosine distance (scored by `vector_score`), each pointing at
    the line range of its nearest chunk; per collection, then merged."""
    scope = scope_of(config, opts.collections, opts.filter, dialect=store.dialect)
    terms = parse_lex(query).terms
    out = SearchOutcome(hits=[], terms=terms)
    fetch = vectors.MAX_K if opts.all_results else max(20, 2 * opts.limit)
    loading = index_loading(store, {n: spaces[n] for n in scope.collections if n in spaces})
    out.warnings += [loading] if loading else []
    ranked = vector_hits(store, spaces, query_vector, scope, fetch)
    with store.read() as conn:
        docs = fetch_ids(conn, [h.doc_id for h in ranked])
        out.filter = filter_report(conn, scope)
    scored = [(h, vector_score(h.distance)) for h in ranked if h.doc_id in docs]
    kept = [(h, sc) for h, sc in scored if sc >= opts.min_score]
    out.below_min_score = bool(scored) and not kept
    if not opts.all_results:
        kept = kept[: opts.limit]
    out.hits, cut = within_answer(
        (
            point_at(
                docs[h.doc_id],
                sc,
                config,
                terms,
                full=opts.full,
                index_name=index_name,
                max_len=opts.max_len,
                lines_within=(h.start_line, h.end_line),
                explain=(
                    {
                        "cosine_distance": round(h.distance, 6),
                        "chunk_lines": [h.start_line, h.end_line],
                        "score": round(sc, 6),  # unrounded by the answer's 2 dp, for the trace
                    }
                    if opts.explain
                    else None
                ),
            )
            for h, sc in kept
        ),
        len(kept),
    )
    out.warnings += [cut] if cut else []
    out.warnings += filter_warnings(out.filter, len(out.hits), opts.limit)
    return out


def vector_hits(
    store: IndexStore, spaces: Mapping[str, vectors.Space], query_vector: Sequence[float], scope: Scope, fetch: int
) -> list[vectors.VecHit]:
    """Each document's nearest chunk over the collections in `scope`, nearest first; each
    collection in the space of its chunk strategy (`spaces`; one without is not embedded).
    The spaces share the embedder, so their distances compare."""
    # numpy (60 ms) loads with the first vector search, not with the daemon: keyword-only
    # use never pays it
    from qmd.server.store.vector_index import index_of

    best: dict[int, vectors.VecHit] = {}
    index = index_of(store)
    with store.read() as conn:
        for name in scope.collections:
            if name not in spaces:
                continue
            for h in vectors.search(conn, spaces[name], query_vector, name, fetch, scope.doc_filter, index):
                if h.doc_id not in best or h.distance < best[h.doc_id].distance:
                    best[h.doc_id] = h
    return sorted(best.values(), key=lambda h: (h.distance, h.doc_id))[:fetch]


def index_loading(store: IndexStore, spaces: Mapping[str, vectors.Space]) -> str | None:
    """Why a search of these collections (name → space) is slower or approximate now, if it
    is: the in-memory index still loading (`vectors.loading`)."""
    from qmd.server.store.vector_index import index_of

    with store.read() as conn:
        return vectors.loading(conn, spaces, index_of(store))


def nearest_chunks(
    store: IndexStore,
    spaces: Mapping[str, vectors.Space],
    query_vector: Sequence[float],
    docs: Mapping[str, Sequence[int]],
) -> dict[int, vectors.VecHit]:
    """Each given document's nearest chunk (`docs`: ids by collection), exact; a document
    whose collection has no vectors, or that has none yet, is absent."""
    out: dict[int, vectors.VecHit] = {}
    with store.read() as conn:
        for name, ids in docs.items():
            if name in spaces:
                out.update((h.doc_id, h) for h in vectors.nearest_of(conn, spaces[name], query_vector, name, ids))
    return out
