"""The hybrid query's optional legs, built from ready models: the vector leg from the
embedder and the collections' vector spaces, the expander and the reranker around the
generate and rerank models that `models.registry` found.

The models floor says where a model runs and knows nothing of queries; what a query does
with it (prompts and their cache, scoring methods, KNN over spaces) lives on this floor,
so the engine only hands one to the other.
"""

from __future__ import annotations

from qmd.server.config import Config
from qmd.server.errors import QmdError
from qmd.server.models.embedders import Embedder, EmbedderUnavailable, embed_query
from qmd.server.models.refs import CosineRef, RemoteRef
from qmd.server.models.registry import LocalModel, Ready
from qmd.server.models.worker import WorkerClient
from qmd.server.search.expansion import Expander, remote_expander, worker_generate
from qmd.server.search.hybrid import VectorLeg
from qmd.server.search.pointers import SearchOptions, SearchOutcome
from qmd.server.search.relevance import Scales
from qmd.server.search.rerank import CosineScorer, Reranker, make_reranker, remote_reranker
from qmd.server.search.vector import VectorUnavailable, index_loading, nearest_chunks, vector_hits, vector_search
from qmd.server.store import vectors
from qmd.server.store.db import IndexStore
from qmd.server.text.chunking import ChunkStrategy


def spaces(store: IndexStore, emb: Embedder, strategies: dict[str, ChunkStrategy]) -> dict[str, vectors.Space]:
    """Each collection (of `strategies`, collection → its chunk strategy) whose strategy's
    space exists → that space: a collection is searched only in the space of the strategy
    it is cut by now."""
    with store.read() as conn:
        found = {s: vectors.find_space(conn, emb.fingerprint_for(s)) for s in set(strategies.values())}
    return {n: space for n, s in strategies.items() if (space := found[s]) is not None}


def vector_leg(
    store: IndexStore,
    emb: Embedder,
    spaces: dict[str, vectors.Space],
    scales: Scales,
    warning: str | None = None,
) -> VectorLeg:
    """KNN over `spaces` with queries embedded by `emb`; a query that cannot be embedded
    makes the leg unavailable (`VectorUnavailable`), never the request. Its cosines are read
    on `emb`'s scale (`relevance.Scales`), measured by the same backend on first use."""

    def embed(texts: list[str]) -> list[list[float]]:
        try:
            return [list(v) for v in emb.backend.embed(texts, "query")]
        except QmdError as e:
            raise VectorUnavailable(f"vector search unavailable — the query could not be embedded: {e.message}") from e

    return VectorLeg(
        embed=embed,
        search=lambda qvec, k, scope: vector_hits(store, spaces, qvec, scope, k),
        nearest=lambda qvec, docs: nearest_chunks(store, spaces, qvec, docs),
        model=emb.uri,
        scale=lambda: scales.of(emb.fingerprint, emb.backend.embed),
        warning="; ".join(w for w in (warning, index_loading(store, spaces)) if w) or None,
    )


def vector_answer(
    store: IndexStore,
    cfg: Config,
    emb: Embedder,
    strategies: dict[str, ChunkStrategy],
    query: str,
    opts: SearchOptions,
    label: str | None,
) -> SearchOutcome:
    """`qmd vsearch` over the collections' spaces (`strategies` of them all); a query that
    cannot be embedded is a `VectorUnavailable`, which the caller answers with keywords."""
    try:
        qvec = embed_query(emb, query)
    except EmbedderUnavailable as e:
        raise VectorUnavailable(f"vector search unavailable — {e.message}") from e
    return vector_search(store, cfg, spaces(store, emb, strategies), qvec, query, opts, label)


def expander(model: LocalModel | RemoteRef, worker: WorkerClient, store: IndexStore) -> Expander:
    """The expander of a ready generate model, its expansions cached in `store`."""
    if isinstance(model, RemoteRef):
        return remote_expander(model, store)
    info = worker.model_info(model.spec)
    return Expander(worker_generate(worker, model.spec), model.uri, info["name"], info["chat_template"], store)


def reranker(model: Ready, worker: WorkerClient) -> Reranker | CosineScorer:
    """The scorer of a ready rerank model: its method chosen from the file (`make_reranker`)."""
    if isinstance(model, CosineRef):
        return CosineScorer()
    if isinstance(model, RemoteRef):
        return remote_reranker(model)
    return make_reranker(worker, str(model.path), model.uri)
