"""What a search may return: the collections in scope, narrowed by a metadata filter,
and what the answer must say about the documents a filter cannot see.

Every search leg (keyword, vector, each list of the hybrid query) takes one `Scope`,
so a filter narrows every leg the same way, before fusion and reranking.
"""

from __future__ import annotations

from dataclasses import dataclass

from qmd.server.config import Config
from qmd.server.errors import NotFound
from qmd.server.search.filters import Filter, filter_sql
from qmd.server.store import metadata
from qmd.server.store.db import Connection
from qmd.server.store.dialect import SQLITE, Dialect
from qmd.server.store.metadata import DocFilter


@dataclass(frozen=True)
class Scope:
    collections: list[str]
    filter: Filter | None = None
    doc_filter: DocFilter | None = None
    """`filter`, compiled for the store."""


def resolve_scope(config: Config, collections: list[str] | None) -> list[str]:
    """Named collections (each must exist), else the default ones (`includeByDefault`)."""
    if collections:
        for name in collections:
            config.get(name)
        return list(dict.fromkeys(collections))
    return config.default_names()


def searchable(config: Config, collections: list[str] | None) -> list[str]:
    """`resolve_scope` for a search, which cannot run over nothing: an empty scope is the
    caller's error (404), not an empty answer that looks like "nothing matched"."""
    names = resolve_scope(config, collections)
    if names:
        return names
    if not config.collections:
        raise NotFound("no collections to search: add one with 'qmd collection add <folder>'")
    raise NotFound(
        f"no collection is searched by default (includeByDefault is off for all {len(config.collections)}):"
        " name one with -c NAME"
    )


def scope_of(
    config: Config, collections: list[str] | None, f: Filter | None = None, *, dialect: Dialect = SQLITE
) -> Scope:
    """A search's scope (see `searchable`). `dialect`: the index's (`IndexStore.dialect`),
    which the filter is compiled for."""
    names = searchable(config, collections)
    if f is None:
        return Scope(names)
    sql, params = filter_sql(f, "d", dialect=dialect)
    per_doc, per_doc_params = filter_sql(f, "d", per_document=True, dialect=dialect)
    return Scope(names, f, DocFilter(sql, tuple(params), per_doc, tuple(per_doc_params)))


@dataclass(frozen=True)
class FilterReport:
    """How much of the scope a filter could see and admitted."""

    documents: int
    """Active documents in scope."""
    eligible: int
    """Documents the filter admits."""
    pending: int
    """Documents whose metadata is not extracted yet (run `qmd update`): no filter sees them."""
    rejected: int
    """Documents whose metadata was rejected (`qmd status` says why): no filter sees them."""


def filter_report(conn: Connection, scope: Scope) -> FilterReport | None:
    if scope.doc_filter is None:
        return None
    counts = metadata.extraction_counts(conn, scope.collections, examples=0)
    eligible = metadata.count_eligible(conn, scope.collections, scope.doc_filter)
    return FilterReport(counts.documents, eligible, counts.pending, counts.rejected)


def filter_warnings(report: FilterReport | None, returned: int, limit: int) -> list[str]:
    """What a filtered answer must say: documents the filter could not see yet (they may
    hold better answers until `qmd update` reads them), and why a short list is short.
    Documents whose metadata was rejected stay so until fixed: `qmd status` lists them,
    and an answer mentions them only when it is short."""
    if report is None:
        return []
    out = []
    short = returned < limit
    if report.pending:
        out.append(
            f"{report.pending} documents in scope are pending metadata extraction and cannot match a filter;"
            " run 'qmd update'"
        )
    if report.rejected and short:
        out.append(
            f"{report.rejected} documents in scope have metadata that could not be read and cannot match a filter;"
            " 'qmd status' says which and why"
        )
    if short and report.eligible < limit:
        out.append(f"the filter admits {report.eligible} of {report.documents} documents")
    return out
