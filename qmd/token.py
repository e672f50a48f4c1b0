"""The optional bearer token: where it comes from, and refusing one others can read.

It comes from `QMD_TOKEN`, or from a token file only its owner can read. The daemon
(which demands it, `qmd.server.http.auth`), the CLI and the stdio bridge (which send
it) all read it here, so setting one up is
`umask 077; openssl rand -hex 32 > ~/.config/qmd/token`. Stdlib only: the thin
clients import this and must stay fast to start.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from qmd.paths import config_root

TOKEN_ENV = "QMD_TOKEN"
TOKEN_FILE = "token"


class TokenError(Exception):
    """The configured token cannot be used; the message says what to fix."""


def token_path(environ: dict[str, str] | os._Environ = os.environ) -> Path:
    """Where the token file lives: beside the index config (`$XDG_CONFIG_HOME/qmd/token`)."""
    return config_root(environ) / TOKEN_FILE


def load_token(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """The bearer token in force, or None when none is configured.

    `QMD_TOKEN` wins over the file. A token file that group or others can read is
    refused rather than used: a secret anyone on the machine can read protects
    nothing, and silently ignoring it would leave the daemon open while the user
    believes it is closed.
    """
    value = (environ.get(TOKEN_ENV) or "").strip()
    if value:
        return value
    path = token_path(environ)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TokenError(f"cannot read the token file {path}: {e.strerror or e}") from e
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TokenError(
                f"the token file {path} is accessible by group or others (mode {stat.filemode(mode)}); "
                f"make it private with: chmod 600 {path}"
            )
        token = fh.read().decode("utf-8", "replace").strip()
    if not token:
        raise TokenError(f"the token file {path} is empty; put a token in it or remove it")
    return token
