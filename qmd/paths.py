"""Where qmd keeps its files.

Stdlib only: the thin CLI imports this module to find the daemon (address, pidfile,
log, lock) and must stay fast to start.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

DEFAULT_INDEX = "index"
DEFAULT_PORT = 8181
DEFAULT_HOST = "localhost"
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
_INDEX_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
PROJECT_DIR = ".qmd"
PROJECT_CONFIGS = ("index.yml", "index.yaml")
PROJECT_PREFIX = "project:"
"""A project-local index's name: `project:/absolute/root` (a named index never has ':')."""


def home() -> Path:
    return Path(os.environ.get("HOME") or os.path.expanduser("~") or "/tmp")


def cache_root(environ: dict[str, str] | os._Environ = os.environ) -> Path:
    base = environ.get("XDG_CACHE_HOME") or str(home() / ".cache")
    return Path(base) / "qmd"


def config_root(environ: dict[str, str] | os._Environ = os.environ) -> Path:
    if environ.get("QMD_CONFIG_DIR"):
        return Path(environ["QMD_CONFIG_DIR"])
    base = environ.get("XDG_CONFIG_HOME") or str(home() / ".config")
    return Path(base) / "qmd"


def private_dir(path: Path) -> Path:
    """A folder of qmd's own (cache, config) that only its user can enter: the index,
    the log and the config hold the user's notes, queries and commands."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


class ForeignFile(OSError):
    """A path qmd would write that is not a plain file of its user's own."""


_KINDS = {
    stat.S_IFREG: "a file",
    stat.S_IFDIR: "a folder",
    stat.S_IFLNK: "a link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


def file_kind(mode: int) -> str:
    """What a file of `mode` is, in words ("a FIFO"), for refusals and skips."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def private_file(path: Path, *, create: bool = True) -> Path:
    """Create `path` empty as 0600 if missing (when `create`), or take group and other
    access away from it. Only a regular file of this user's, opened without following a
    link, is touched: a cloned project's `.qmd/index.sqlite` that links to another
    program's database (or is a FIFO, or someone else's file) must never be written or
    chmod'ed through, so it is `ForeignFile`, naming the path and the fix."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600) if create else os.open(path, flags)
        except FileExistsError:
            fd = os.open(path, flags)
    except FileNotFoundError:
        if create:
            raise
        return path
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            raise ForeignFile(
                f"{path} is a symbolic link (to {os.readlink(path)}): qmd never writes through a link."
                f" Remove the link (rm '{path}') and run the command again; qmd makes its own file"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ForeignFile(
                f"{path} is {file_kind(st.st_mode)}, not a file qmd made: remove it and run the command again"
            )
        if st.st_uid != os.geteuid():
            raise ForeignFile(
                f"{path} belongs to another user (uid {st.st_uid}): qmd writes only its user's own files;"
                " remove it (or have its owner remove it) and run the command again"
            )
        if st.st_mode & 0o077:
            os.fchmod(fd, st.st_mode & 0o700)
    finally:
        os.close(fd)
    return path


def connect_host(host: str) -> str:
    """The address to connect to for a daemon bound to `host` (a wildcard or
    `localhost` means loopback; brackets come off IPv6 literals)."""
    if host in WILDCARD_HOSTS or host == "localhost":
        return "127.0.0.1"
    return host.strip("[]")


def normalize_index_name(name: str | None, cwd: str | None = None) -> str:
    """Map `--index NAME` to a file-safe name (spec §1.1: a NAME with `/` is a path)."""
    if not name:
        return DEFAULT_INDEX
    if "/" in name:
        resolved = os.path.normpath(os.path.join(cwd or os.getcwd(), name))
        name = resolved.replace("/", "_").lstrip("_")
    if not _INDEX_NAME_RE.match(name):
        raise ValueError(f"invalid index name {name!r}: use letters, digits, '.', '_' or '-' (at most 100)")
    return name


class IndexPaths(NamedTuple):
    """Every file that belongs to one named index. (A NamedTuple: the CLI imports this,
    and `dataclasses` costs it ~6 ms of start-up.)"""

    name: str
    db: Path
    config: Path
    cache_dir: Path

    @property
    def _suffix(self) -> str:
        return "" if self.name == DEFAULT_INDEX else f"-{self.name}"

    @property
    def pidfile(self) -> Path:
        return self.cache_dir / f"qmdd{self._suffix}.pid"

    @property
    def logfile(self) -> Path:
        return self.cache_dir / f"qmdd{self._suffix}.log"

    @property
    def lockfile(self) -> Path:
        return self.cache_dir / f"qmdd{self._suffix}.lock"

    @classmethod
    def resolve(cls, index: str | None = None, environ: dict[str, str] | os._Environ = os.environ) -> IndexPaths:
        name = normalize_index_name(index)
        cache = cache_root(environ)
        db = Path(environ["INDEX_PATH"]) if environ.get("INDEX_PATH") else cache / f"{name}.sqlite"
        return cls(name=name, db=db, config=config_root(environ) / f"{name}.yml", cache_dir=cache)

    @classmethod
    def for_project(cls, root: Path | str) -> IndexPaths:
        """A project-local index (`qmd init`): config and index both in `<root>/.qmd/`, so
        the config can be checked in beside the notes it indexes (the index is ignored)."""
        root = Path(os.path.normpath(root))
        folder = root / PROJECT_DIR
        return cls(
            name=PROJECT_PREFIX + str(root),
            db=folder / "index.sqlite",
            config=project_config(root) or folder / PROJECT_CONFIGS[0],
            cache_dir=folder,
        )

    @property
    def project_root(self) -> Path | None:
        """The project folder of a project-local index (None for a named one)."""
        return Path(self.name[len(PROJECT_PREFIX) :]) if self.name.startswith(PROJECT_PREFIX) else None


def project_config(root: Path) -> Path | None:
    """The config file of the project at `root`, `index.yml` before `index.yaml`."""
    for name in PROJECT_CONFIGS:
        path = root / PROJECT_DIR / name
        if path.is_file():
            return path
    return None


def is_project_root(path: Path | str, environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether `path` is an absolute folder holding `.qmd/index.yml` (or `.yaml`) that is
    not the user's own config folder: a `QMD_CONFIG_DIR` named `.qmd` holds the user's
    configs, never a project's (and those are never gated)."""
    path = Path(path)
    if not path.is_absolute() or project_config(path) is None:
        return False
    return not _users_config(path, environ)


def _users_config(path: Path, environ: dict[str, str] | os._Environ) -> bool:
    try:
        return (path / PROJECT_DIR).resolve() == config_root(environ).resolve()
    except OSError:
        return True


def _broken_config(path: Path, environ: dict[str, str] | os._Environ) -> Path | None:
    """A project config at `path`, or its `.qmd` folder, that is a link to nothing of its
    kind (the target moved, or never came with a clone): the folder means to be a project
    and cannot be read as one."""
    folder = path / PROJECT_DIR
    links = [folder] if folder.is_symlink() and not folder.exists() else []
    links += [config for name in PROJECT_CONFIGS if (config := folder / name).is_symlink() and not config.is_file()]
    return links[0] if links and not _users_config(path, environ) else None


def find_project(start: Path, environ: dict[str, str] | os._Environ = os.environ) -> Path | None:
    """The nearest folder at or above `start` that is a project root, or None. The walk
    stops below the home folder's parent: a `.qmd` in /home (another user's, or one
    planted in a shared parent) must not capture every command run under $HOME. Raises
    ValueError, saying what to mend, at a project config that is a broken link."""
    here = Path(os.path.realpath(start))
    stop = Path(os.path.realpath(home())).parent
    for folder in (here, *here.parents):
        if folder == stop:
            return None
        if is_project_root(folder, environ):
            return folder
        if (broken := _broken_config(folder, environ)) is not None:
            # read as no project, every command would use the default index instead
            raise ValueError(
                f"{broken} is a link to {os.readlink(broken)}, which qmd cannot read as"
                f" {'a folder' if broken.name == PROJECT_DIR else 'a config file'}:"
                " fix the link, or remove it if this folder is no qmd project"
            )
    return None
