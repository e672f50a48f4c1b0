"""qmd: on-device search for markdown notes, docs and transcripts.

As a library, without the daemon:

    import qmd

    with qmd.open("notes.sqlite", collections={"notes": {"path": "~/notes"}}) as index:
        index.update()
        for hit in index.search("raise money").hits:
            print(hit.doc.file, hit.lines, round(hit.score, 2))   # a pointer: file and line range
        print(index.get("notes/fundraising.md:40:5").body)       # read the range before citing it

The names below are loaded on first use: `import qmd` itself loads nothing heavy,
since the CLI (`qmd.client`) and the stdio bridge import this package too.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from qmd.version import __version__

if TYPE_CHECKING:
    from qmd.server.config import Context
    from qmd.server.errors import (
        Conflict,
        Forbidden,
        HookFailed,
        InvalidInput,
        NotFound,
        QmdError,
        Unavailable,
    )
    from qmd.server.ingest.embed_job import EmbedReport
    from qmd.server.ingest.update import CollectionReport, UpdateReport
    from qmd.server.library import ExpandedQuery, Index, open
    from qmd.server.quality import BenchReport
    from qmd.server.search.discovery import KeyReport, MetadataReport, TypeReport
    from qmd.server.search.hybrid import HybridOutcome, Stage
    from qmd.server.search.pointers import DocumentRef, DocumentText, Pointer, Retrieved, SearchOutcome
    from qmd.server.status import CollectionInfo, IndexStatus, VectorState

_EXPORTS = {
    "open": "qmd.server.library",
    "Index": "qmd.server.library",
    "ExpandedQuery": "qmd.server.library",
    "Context": "qmd.server.config",
    "Pointer": "qmd.server.search.pointers",
    "DocumentRef": "qmd.server.search.pointers",
    "DocumentText": "qmd.server.search.pointers",
    "Retrieved": "qmd.server.search.pointers",
    "SearchOutcome": "qmd.server.search.pointers",
    "MetadataReport": "qmd.server.search.discovery",
    "KeyReport": "qmd.server.search.discovery",
    "TypeReport": "qmd.server.search.discovery",
    "HybridOutcome": "qmd.server.search.hybrid",
    "Stage": "qmd.server.search.hybrid",
    "UpdateReport": "qmd.server.ingest.update",
    "CollectionReport": "qmd.server.ingest.update",
    "EmbedReport": "qmd.server.ingest.embed_job",
    "BenchReport": "qmd.server.quality",
    "CollectionInfo": "qmd.server.status",
    "IndexStatus": "qmd.server.status",
    "VectorState": "qmd.server.status",
    "QmdError": "qmd.server.errors",
    "InvalidInput": "qmd.server.errors",
    "NotFound": "qmd.server.errors",
    "Conflict": "qmd.server.errors",
    "Forbidden": "qmd.server.errors",
    "HookFailed": "qmd.server.errors",
    "Unavailable": "qmd.server.errors",
}

__all__ = [
    "__version__",
    "open",
    "Index",
    "ExpandedQuery",
    "Context",
    "Pointer",
    "DocumentRef",
    "DocumentText",
    "Retrieved",
    "SearchOutcome",
    "MetadataReport",
    "KeyReport",
    "TypeReport",
    "HybridOutcome",
    "Stage",
    "UpdateReport",
    "CollectionReport",
    "EmbedReport",
    "BenchReport",
    "CollectionInfo",
    "IndexStatus",
    "VectorState",
    "QmdError",
    "InvalidInput",
    "NotFound",
    "Conflict",
    "Forbidden",
    "HookFailed",
    "Unavailable",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'qmd' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
