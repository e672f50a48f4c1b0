"""The trust gate of project-local configs (seed 000, "Checked-in .qmd config is not
trusted by default").

A `.qmd/index.yml` travels with `git clone`, and every command run in the tree adopts
it, so three of its fields could make qmd reach outside the project on a stranger's
say: `update` commands (a shell script), collection paths outside the project folder,
and models other than the defaults (a download, or a local GGUF the project names).
Those are the *gated* items. The daemon decides what is used: a gated item is used only
when the user approved exactly this set (its fingerprint, recorded per project root in
`trusted.json` in the user's config folder) or an environment override says so;
otherwise it is skipped, in-project indexing carries on, and the answer says what was
skipped. Any edit of a gated item changes the fingerprint and so asks again. The user's
own `~/.config/qmd/*.yml` is never gated (its engine has no project root).

The project's index files (`index_file_states`) are not gated items: they are refused
outright when the project made them anything but qmd's own (a link to another program's
database, a FIFO), because no approval makes writing through one safe. `qmd trust` lists
them with their state, so what a clone planted in `.qmd/` is seen, not only refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import threading
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

from qmd.paths import PROJECT_DIR, IndexPaths, config_root, file_kind, private_dir, project_config
from qmd.server.config import Config, ConfigFile, write_whole
from qmd.server.errors import Conflict, Forbidden, InvalidInput, QmdError
from qmd.server.models.refs import ROLES, parse_model_ref, resolve_model
from qmd.server.store.sqlite import SIDE_FILES, own_files

log = logging.getLogger("qmd.server")

TRUST_FILE = "trusted.json"
TRUST_ALL_VAR: Final = "QMD_TRUST_LOCAL_CONFIG"
TRUST_HOOKS_VAR: Final = "QMD_TRUST_UPDATE_HOOKS"

Kind = Literal["update", "path", "model"]
Override = Literal["QMD_TRUST_LOCAL_CONFIG", "QMD_TRUST_UPDATE_HOOKS"]
_HOW = "untrusted project config; run 'qmd trust'"


@dataclass(frozen=True)
class Gated:
    """One field of a project config that is not used unattended."""

    kind: Kind
    name: str
    """The collection (update, path) or the model's role (model)."""
    value: str
    """The command, the folder it resolves to, or the model URI."""

    @property
    def shown(self) -> str:
        """The item as the prompt, `qmd trust` and `trust list` show it."""
        if self.kind == "update":
            return f"update command of collection {self.name}: {self.value}"
        if self.kind == "path":
            return f"collection {self.name}: {self.value} (outside the project)"
        return f"{self.name} model: {self.value} (not the default)"

    def skipped(self) -> str:
        """What the answer says when it was not used."""
        if self.kind == "update":
            return f"skipped: update command of collection {self.name} ({_HOW})"
        if self.kind == "path":
            return f"skipped: collection {self.name} at {self.value}, outside the project ({_HOW})"
        return (
            f"skipped: {self.name} model {self.value} (untrusted project config: the default is used; run 'qmd trust')"
        )


@dataclass(frozen=True)
class Gate:
    """A project config's gated items, and which of them are trusted now."""

    root: Path | None
    """The project folder; None for the user's own config, where nothing is gated."""
    items: tuple[Gated, ...] = ()
    fingerprint: str = ""
    approved: bool = False
    """The recorded approval covers exactly these items."""
    override: Override | None = None
    approved_at: str | None = None
    blocked: frozenset[tuple[Kind, str]] = field(init=False)

    def __post_init__(self) -> None:
        blocked = frozenset((i.kind, i.name) for i in self.items if not self._trusted(i))
        object.__setattr__(self, "blocked", blocked)

    def _trusted(self, item: Gated) -> bool:
        return (
            self.approved
            or self.override == TRUST_ALL_VAR
            or (self.override == TRUST_HOOKS_VAR and item.kind == "update")
        )

    def blocks(self, kind: Kind, name: str) -> bool:
        return (kind, name) in self.blocked

    @property
    def skipped(self) -> list[Gated]:
        return [i for i in self.items if self.blocks(i.kind, i.name)]

    def notes(self) -> list[str]:
        return [i.skipped() for i in self.skipped]

    def models(self, models: dict[str, str]) -> dict[str, str]:
        """The config's model overrides that may be used: an untrusted one falls back to
        the default (never downloaded, never loaded)."""
        return {role: uri for role, uri in models.items() if not self.blocks("model", role)}


OPEN = Gate(None)
"""The gate of a config that is the user's own: nothing gated."""


def gated_items(config: Config, root: Path, config_dir: Path, environ: dict[str, str] | None = None) -> list[Gated]:
    """Every gated item of `config`, a project's config with its folder at `root`.

    A collection counts as inside when its folder, symlinks resolved, is `root` or under
    it (a checked-in symlink to /etc is outside). A model is default when it is what the
    role resolves to without the config (the built-in default, or the user's own
    `QMD_<ROLE>_MODEL`); a setting that does not parse is gated as written."""
    defaults = default_models(environ)
    inside = os.path.realpath(root)
    items: list[Gated] = []
    for coll in config.collections.values():
        if coll.update:
            items.append(Gated("update", coll.name, coll.update))
        real = os.path.realpath(coll.root)
        if real != inside and not real.startswith(inside.rstrip(os.sep) + os.sep):
            items.append(Gated("path", coll.name, real))
    for role, uri in config.models.items():
        if role not in ROLES or not uri.strip():
            continue  # an unknown role is refused where models are resolved
        try:
            value = parse_model_ref(uri.strip(), config_dir).uri
        except QmdError:
            value = uri
        if value != defaults[role]:
            items.append(Gated("model", role, value))
    return items


def default_models(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Each role's model without any config: the built-in default, or the user's own
    `QMD_<ROLE>_MODEL`. These are never gated, and `qmd init` pre-fills them."""
    env = dict(os.environ if environ is None else environ)
    return {role: resolve_model(role, None, env).ref.uri for role in ROLES}


def fingerprint(root: Path, items: list[Gated]) -> str:
    """What an approval covers: the project folder and its exact gated items."""
    exact = sorted((i.kind, i.name, i.value) for i in items)
    return hashlib.sha256(json.dumps([str(root), exact]).encode()).hexdigest()


def override(environ: dict[str, str] | None = None) -> Override | None:
    """The environment's blanket trust (for CI), read by the daemon."""
    env = os.environ if environ is None else environ

    def on(var: str) -> bool:
        return env.get(var, "").strip().lower() not in ("", "0", "false", "no", "off")

    if on(TRUST_ALL_VAR):
        return TRUST_ALL_VAR
    return TRUST_HOOKS_VAR if on(TRUST_HOOKS_VAR) else None


@dataclass(frozen=True)
class Approval:
    """One approved project: the exact gated set the user saw (`items`, for `trust list`)."""

    root: str
    fingerprint: str
    approved_at: str
    items: tuple[str, ...]


_WRITE = threading.Lock()


class TrustFile:
    """`trusted.json`: approvals by project root. Only the daemon writes it (atomically,
    0600); reading it again only when it changed keeps the gate cheap on every query."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or config_root() / TRUST_FILE
        self._stamp: tuple[int, int] | None = None
        self._approvals: dict[str, Approval] = {}

    def approvals(self) -> dict[str, Approval]:
        """Approvals now. An unreadable file approves nothing (every gate asks again)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return {}
        if (st.st_mtime_ns, st.st_size) != self._stamp:
            try:
                self._approvals = self._read()
            except InvalidInput as e:
                log.warning("%s", e.message)
                self._approvals = {}
            self._stamp = (st.st_mtime_ns, st.st_size)
        return self._approvals

    def _read(self) -> dict[str, Approval]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return {
                root: Approval(root, str(a["fingerprint"]), str(a["approved_at"]), tuple(map(str, a["items"])))
                for root, a in raw["projects"].items()
            }
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise InvalidInput(
                f"{self.path} is not a valid trust file ({e}): no project is trusted until it is fixed or removed"
            ) from e

    def _write(self, approvals: dict[str, Approval]) -> None:
        private_dir(self.path.parent)
        data = {
            "version": 1,
            "projects": {
                a.root: {"fingerprint": a.fingerprint, "approved_at": a.approved_at, "items": list(a.items)}
                for a in approvals.values()
            },
        }
        write_whole(self.path, (json.dumps(data, indent=2) + "\n").encode("utf-8"))

    def approve(self, gate: Gate, seen: str) -> Approval:
        """Record `gate`'s set as approved, if it is still the set the user was shown
        (`seen`, its fingerprint): an edit in between must be shown, not approved blind."""
        if gate.root is None:
            raise InvalidInput("this index's config is your own (not a project's): nothing in it is gated")
        if not gate.items:
            raise InvalidInput(f"nothing in {gate.root}/.qmd needs approval: it has no gated items")
        if seen != gate.fingerprint:
            raise Conflict(
                "the project's config changed since its gated items were listed; nothing was approved. "
                "Run 'qmd trust' again to see them as they are now"
            )
        with _WRITE:
            approvals = dict(self._read())
            entry = Approval(
                str(gate.root),
                gate.fingerprint,
                datetime.now(UTC).isoformat(timespec="seconds"),
                tuple(i.shown for i in gate.items),
            )
            approvals[entry.root] = entry
            self._write(approvals)
        return entry

    def revoke(self, root: Path) -> Approval | None:
        """Drop the approval of the project at `root` (None when there was none)."""
        with _WRITE:
            approvals = dict(self._read())
            gone = approvals.pop(str(root), None)
            if gone is not None:
                self._write(approvals)
        return gone


def gate(config: Config, root: Path, config_dir: Path, trust: TrustFile) -> Gate:
    """The gate of the project at `root` as its config and the user's approvals are now."""
    items = gated_items(config, root, config_dir)
    fp = fingerprint(root, items)
    approval = trust.approvals().get(str(root))
    approved = bool(items) and approval is not None and approval.fingerprint == fp
    return Gate(
        root,
        tuple(items),
        fp,
        approved,
        override(),
        approval.approved_at if approved and approval else None,
    )


BENCH_CACHE = "bench"
"""The folder in a project's `.qmd` where `qmd bench` keeps its indexes (server/quality.py)."""

FileState = Literal["ok", "missing", "refused"]


@dataclass(frozen=True)
class IndexFile:
    """One path a project's index is kept in, as it is now: qmd's own (`ok`: a regular
    file, or a folder, of this user's), `missing` (made when needed), or `refused` (a link,
    another kind of file, another user's: never written through, and every command says so)."""

    path: str
    role: str
    """What qmd keeps there: `folder`, `index`, its SQLite side files, `bench cache`."""
    state: FileState
    why: str
    """Why it is refused ('' otherwise)."""


def index_file_states(paths: IndexPaths) -> list[IndexFile]:
    """The project's `.qmd` folder, index, side files and bench cache, each as `lstat`
    finds it (never through a link), for `qmd trust` and the refusal's answer."""
    folder = paths.db.parent
    wanted = [
        (folder, "folder", True),
        (paths.db, "index", False),
        *((Path(f"{paths.db}{suffix}"), f"index {suffix[1:]}", False) for suffix in SIDE_FILES),
        (folder / BENCH_CACHE, "bench cache", True),
    ]
    return [IndexFile(str(path), role, *_state(path, is_folder)) for path, role, is_folder in wanted]


def _state(path: Path, is_folder: bool) -> tuple[FileState, str]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing", ""
    except OSError as e:
        return "refused", f"it cannot be looked at: {e.strerror or e}"
    if stat.S_ISLNK(st.st_mode):
        return "refused", f"a symbolic link (to {os.readlink(path)})"
    if not (stat.S_ISDIR(st.st_mode) if is_folder else stat.S_ISREG(st.st_mode)):
        return "refused", f"{file_kind(st.st_mode)}, not {'a folder' if is_folder else 'a regular file'}"
    if st.st_uid != os.geteuid():
        return "refused", f"it belongs to another user (uid {st.st_uid})"
    return "ok", ""


def own_project_index(paths: IndexPaths) -> None:
    """Refuse (`Forbidden`) a project whose `.qmd` folder or index files are not qmd's
    own to write: a checked-in `.qmd` that links elsewhere would put the index (and its
    writes) outside the project, and a linked `index.sqlite`, `-wal` or `-shm` would write
    into whatever it names. Checked on every request, before the index is opened."""
    folder = paths.db.parent
    try:
        if os.path.islink(folder):
            raise Forbidden(
                f"{folder} is a symbolic link (to {os.readlink(folder)}): a project's index is kept in its own"
                f" {PROJECT_DIR} folder, never through a link. Replace the link with a folder holding the config"
                " and run the command again"
            )
        own_files(paths.db, create=False)
    except Forbidden as e:
        raise Forbidden(e.message, files=[asdict(f) for f in index_file_states(paths)]) from None


ApprovalState = Literal["current", "changed", "no project"]


@dataclass(frozen=True)
class Reviewed:
    """An approval as `qmd trust list` shows it: still covering the project's gated items
    (`current`), not any more (`changed`: the next command asks again), or of a folder
    that is no project now."""

    approval: Approval
    state: ApprovalState


def review(trust: TrustFile) -> list[Reviewed]:
    """Every recorded approval, each checked against its project's config as it is now."""
    out: list[Reviewed] = []
    for root, approval in sorted(trust.approvals().items()):
        folder = Path(root)
        found = project_config(folder)
        if found is None:
            out.append(Reviewed(approval, "no project"))
            continue
        try:
            items = gated_items(ConfigFile(found, base=folder).load(), folder, found.parent)
        except QmdError:  # a config that does not read covers nothing
            out.append(Reviewed(approval, "changed"))
            continue
        out.append(Reviewed(approval, "current" if fingerprint(folder, items) == approval.fingerprint else "changed"))
    return out
