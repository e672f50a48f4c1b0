"""Every error the engine raises on purpose, in one place.

Routes map these to HTTP statuses; anything else is a server fault (500). The
message is written for the person who has to fix the input, and is shown verbatim
by the CLI.
"""

from __future__ import annotations

from typing import Any


class QmdError(Exception):
    """Base class: an expected failure with a message fit for a user."""

    status = 400

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class InvalidInput(QmdError):
    """The request cannot be carried out as written (bad name, bad path, bad query)."""


class NotFound(QmdError):
    status = 404


class Conflict(QmdError):
    """The request clashes with the current state (name taken, collection exists)."""

    status = 409


class Forbidden(QmdError):
    """The request would reach outside what the index serves."""

    status = 403


class HookFailed(QmdError):
    """A collection's update command exited non-zero; the run was aborted."""

    status = 422
