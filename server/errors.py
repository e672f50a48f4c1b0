"""Every error the engine raises on purpose, in one place.

The engine and the library raise these; they know nothing of HTTP. The HTTP layer
maps each class to a status (`http.app.STATUS`) and anything else is a server fault
(500). The message is written for the person who has to fix the input, and is shown
verbatim by the CLI, MCP and the library.

    QmdError
    ├── InvalidInput   the request cannot be carried out as written (400)
    ├── NotFound       no such collection, document or context (404)
    ├── Conflict       clashes with the current state: a name taken (409)
    ├── Forbidden      would reach outside what the index serves (403)
    ├── HookFailed     a collection's update command failed; the run was aborted (422)
    ├── IndexTooNew    the index was made by a newer qmd; refused, untouched (at open)
    ├── MigrationFailed upgrading the index's schema failed; rolled back (at open)
    └── Unavailable    a model, the worker or an endpoint cannot serve now (503)
        ├── VectorUnavailable     (search.vector) no embedder or no vectors yet
        ├── EmbedderUnavailable   (models.embedders) the embed model cannot be had
        ├── InferenceError        (models.worker) the llama.cpp worker failed
        ├── RemoteEmbedError      (models.remote) the embeddings endpoint failed
        ├── RemoteGenerateError   (models.remote) the chat completions endpoint failed
        └── RemoteRerankError     (models.remote) the rerank endpoint failed
"""

from __future__ import annotations

from typing import Any


class QmdError(Exception):
    """Base class: an expected failure with a message fit for a user."""

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class InvalidInput(QmdError):
    """The request cannot be carried out as written (bad name, bad path, bad query)."""


class InvalidSetting(InvalidInput, ValueError):
    """An environment setting that cannot be honoured as written (`QMD_THREADS=many`): said at
    startup, never replaced by a default in silence. A `ValueError` too, as settings parsers raise."""


class NotFound(QmdError):
    """No such collection, document or context; `detail` may name similar ones."""


class Conflict(QmdError):
    """The request clashes with the current state (name taken, collection exists)."""


class Forbidden(QmdError):
    """The request would reach outside what the index serves."""


class HookFailed(QmdError):
    """A collection's update command exited non-zero; the run was aborted."""


class Unavailable(QmdError):
    """Something the request needs (a model, the inference worker, an embeddings
    endpoint, vectors) cannot serve it now; keyword search still can."""


class IndexTooNew(QmdError):
    """The index's schema version is above every one this qmd knows: a newer qmd made
    it. Opening is refused before anything is written, so that qmd can still use it."""


class MigrationFailed(QmdError):
    """A schema migration raised; the upgrade was rolled back whole, so the index is
    still at the version it had, and usable by the qmd that made it."""
