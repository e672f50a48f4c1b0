"""The user's `index.yml`: collections, contexts, models.

The YAML file is the source of truth; the daemon re-reads it whenever it changes on
disk (so a hand edit takes effect without a restart) and writes it atomically
(temp file + rename) so a crash never leaves half a config.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import yaml

from qmd.paths import DEFAULT_INDEX, PROJECT_CONFIGS, PROJECT_DIR, IndexPaths, config_root, home, project_config
from qmd.server.errors import Conflict, Forbidden, InvalidInput, NotFound
from qmd.server.text.chunking import CHUNK_STRATEGIES, DEFAULT_CHUNK_STRATEGY, ChunkStrategy

DEFAULT_PATTERN = "**/*.md"
_NAME_RE = re.compile(r"[\w][\w.\-]{0,99}")


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable(value: Any) -> str | None:
    """What in `value` (a string, or lists and dicts of them) UTF-8, SQLite and a shell
    command cannot hold — a NUL or a lone surrogate, which JSON and YAML can both
    spell as escapes — or None. Such text saved once would break every later read."""
    if isinstance(value, str):
        bad = _UNSTORABLE.search(value)
        if bad is None:
            return None
        what = "a NUL character" if bad.group() == "\x00" else f"a lone surrogate (U+{ord(bad.group()):04X})"
        return f"contains {what} at position {bad.start()}; send valid UTF-8 text"
    if isinstance(value, dict):
        parts = [part for pair in value.items() for part in pair]
    elif isinstance(value, list):
        parts = value
    else:
        return None
    return next((problem for problem in map(unstorable, parts) if problem is not None), None)


def validate_collection_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidInput(
            f"invalid collection name {name!r}: use letters, digits, '_', '-' or '.' "
            "(no '/', no spaces, at most 100 characters, not starting with '.' or '-')"
        )
    return name


def expand_path(raw: str, base: Path | None = None) -> Path:
    """`~` expanded; relative paths resolved against `base` (default: home)."""
    return _expanded(raw, base, os.environ.get("HOME"))


@functools.lru_cache(maxsize=1024)
def _expanded(raw: str, base: Path | None, home_var: str | None) -> Path:  # noqa: ARG001 - part of the key
    """`expand_path`, remembered: every hit names its file's absolute path through its
    collection's root (20-30 µs of pathlib a hit, a tenth of a small keyword search)."""
    p = Path(os.path.expanduser(raw))
    if not p.is_absolute():
        p = (base or home()) / p
    return Path(os.path.normpath(p))


def check_chunk_strategy(strategy: str | None) -> None:
    """A chunk strategy from a caller that pydantic did not check (the library)."""
    if strategy is not None and strategy not in CHUNK_STRATEGIES:
        raise InvalidInput(f'--chunk-strategy must be "auto" or "regex" (got "{strategy}")')


def collection_folder(path: str) -> Path:
    """The folder a new collection indexes, links resolved: it must exist and be a folder."""
    root = expand_path(path)
    if not root.exists():
        raise InvalidInput(f"Folder not found: {root}")
    if not root.is_dir():
        raise InvalidInput(f"Not a folder: {root}")
    return Path(os.path.realpath(root))


def stored_path(root: Path, project: Path | None) -> str:
    """A folder as index.yml records it: relative to a project's folder when inside it
    (the checked-in config then works wherever the project is cloned), else absolute."""
    if project is not None and (root == project or project in root.parents):
        return root.relative_to(project).as_posix() or "."
    return str(root)


def write_whole(path: Path, data: bytes, *, mode: int = 0o600, clobber: bool = True) -> None:
    """Write `path` so that a reader (or a crash) only ever sees all of `data` or the file
    as it was: a temp file beside it, synced, then renamed over it; with `clobber=False`
    linked instead, which fails with FileExistsError when `path` exists."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        if clobber:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def normalize_context_key(key: str) -> str:
    """Context keys are stored without leading/trailing slashes; '' is the collection root."""
    return key.strip().strip("/")


@dataclass(frozen=True)
class Collection:
    name: str
    path: str
    pattern: str = DEFAULT_PATTERN
    ignore: tuple[str, ...] = ()
    update: str | None = None
    include_by_default: bool = True
    context: dict[str, str] = field(default_factory=dict)
    chunk_strategy: ChunkStrategy = DEFAULT_CHUNK_STRATEGY
    """How its documents are cut for embedding (`chunking.ChunkStrategy`); vectors of each
    strategy live in a space of their own."""
    watch: bool = True
    """Whether the daemon keeps it fresh as its files change (`index.watcher`); `watch: false`
    leaves it to `qmd update` (a folder too big or too busy to watch, a network share)."""
    base: Path | None = field(default=None, compare=False, repr=False)
    """What a relative `path` is relative to: a project config's folder (`path: .` is the
    project, wherever it was cloned), else None for the home folder. Not written to YAML."""

    @property
    def root(self) -> Path:
        return expand_path(self.path, self.base)

    def to_yaml(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "pattern": self.pattern}
        if self.ignore:
            out["ignore"] = list(self.ignore)
        if self.update:
            out["update"] = self.update
        if not self.include_by_default:
            out["includeByDefault"] = False
        if self.context:
            out["context"] = dict(self.context)
        if self.chunk_strategy != DEFAULT_CHUNK_STRATEGY:
            out["chunk_strategy"] = self.chunk_strategy
        if not self.watch:
            out["watch"] = False
        return out

    @classmethod
    def from_yaml(cls, name: str, raw: Any, source: Path, base: Path | None = None) -> Collection:
        if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
            raise InvalidInput(f"{source}: collection {name!r} needs a 'path' string")
        ignore = raw.get("ignore") or []
        if isinstance(ignore, str):
            ignore = [ignore]
        context = raw.get("context") or {}
        if not isinstance(context, dict):
            raise InvalidInput(f"{source}: collection {name!r}: 'context' must be a mapping")
        strategy = raw.get("chunk_strategy", DEFAULT_CHUNK_STRATEGY)
        if strategy not in CHUNK_STRATEGIES:
            raise InvalidInput(
                f'{source}: collection {name!r}: chunk_strategy must be "auto" or "regex" (got {strategy!r})'
            )
        watch = raw.get("watch", True)
        if not isinstance(watch, bool):
            raise InvalidInput(f"{source}: collection {name!r}: watch must be true or false (got {watch!r})")
        return cls(
            name=str(name),
            path=raw["path"],
            pattern=str(raw.get("pattern") or DEFAULT_PATTERN),
            ignore=tuple(str(g) for g in ignore),
            update=str(raw["update"]) if raw.get("update") else None,
            include_by_default=raw.get("includeByDefault", True) is not False,
            context={normalize_context_key(str(k)): str(v) for k, v in context.items()},
            chunk_strategy=strategy,
            watch=watch,
            base=base,
        )


@dataclass(frozen=True)
class Context:
    """A description that search results carry for every document under `path` of
    `collection` (None: the global context, which every result carries)."""

    collection: str | None
    path: str
    text: str


@dataclass(frozen=True)
class Config:
    collections: dict[str, Collection] = field(default_factory=dict)
    global_context: str | None = None
    editor_uri: str | None = None
    models: dict[str, str] = field(default_factory=dict)
    query_budget_ms: int | None = None
    """The hybrid query's budget when a request gives none (`query_budget_ms:`)."""
    index_url: str | None = None
    """A Postgres server that holds this index (`index_url: postgresql://…`) instead of the
    SQLite file; `QMD_INDEX_URL` overrides it."""
    extra: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str) -> Collection:
        try:
            return self.collections[name]
        except KeyError:
            known = ", ".join(sorted(self.collections)) or "none yet"
            raise NotFound(f"Collection not found: {name} (known: {known})") from None

    def default_names(self) -> list[str]:
        return [c.name for c in self.collections.values() if c.include_by_default]

    def with_collection(self, coll: Collection) -> Config:
        return replace(self, collections={**self.collections, coll.name: coll})

    def without_collection(self, name: str) -> Config:
        return replace(self, collections={k: v for k, v in self.collections.items() if k != name})

    def check_new(self, name: str, root: Path, pattern: str) -> None:
        """Refuse a new collection whose name is taken, or whose folder and mask another
        collection already indexes (its documents would be indexed twice)."""
        if name in self.collections:
            raise Conflict(f"Collection '{name}' already exists. Pick another --name, or remove it first.")
        for other in self.collections.values():
            if os.path.realpath(other.root) == str(root) and other.pattern == pattern:
                raise Conflict(f"Folder {root} is already collection '{other.name}' with mask '{pattern}'.")

    def chunk_strategies(self, collections: list[str] | None = None) -> dict[str, ChunkStrategy]:
        """Each collection named (all when None; an unknown name is left out) → how its
        documents are cut for vectors, which names the vector space they live in."""
        names = collections if collections is not None else list(self.collections)
        return {n: self.collections[n].chunk_strategy for n in names if n in self.collections}

    def with_chunk_strategy(self, collections: list[str] | None, strategy: ChunkStrategy) -> tuple[Config, list[str]]:
        """`strategy` as the chunk strategy of these collections (all when None), and the
        names of those it changed."""
        changed = [
            c.name
            for c in self.collections.values()
            if (collections is None or c.name in collections) and c.chunk_strategy != strategy
        ]
        cfg = self
        for name in changed:
            cfg = cfg.with_collection(replace(cfg.collections[name], chunk_strategy=strategy))
        return cfg, changed

    def collection_at(self, path: Path) -> tuple[str, str] | None:
        """(collection, path relative to its folder) of the innermost collection holding
        `path` on disk, links resolved; None when no collection does."""
        real = os.path.realpath(path)
        best: tuple[int, str, str] | None = None
        for c in self.collections.values():
            root = os.path.realpath(c.root)
            if real == root or real.startswith(root + os.sep):
                rel = os.path.relpath(real, root).replace(os.sep, "/")
                cand = (len(root), c.name, "" if rel == "." else rel)
                best = max(best, cand) if best else cand
        return (best[1], best[2]) if best else None

    def with_context(self, collection: str | None, key: str, text: str) -> Config:
        """`text` as the context of `key` in `collection` (the global context when None)."""
        if collection is None:
            return replace(self, global_context=text)
        coll = self.get(collection)
        return self.with_collection(replace(coll, context={**coll.context, key: text}))

    def without_context(self, collection: str | None, key: str, target: str) -> tuple[Config, Context]:
        """The context of `key` in `collection` (the global one when None) removed, and what
        was removed; `target` is what the user named, for the error when there is none."""
        if collection is None:
            if not self.global_context:
                raise NotFound(f"No context found for: {target}")
            return replace(self, global_context=None), Context(None, "", self.global_context)
        coll = self.get(collection)
        if key not in coll.context:
            raise NotFound(f"No context found for: {target}")
        kept = {k: v for k, v in coll.context.items() if k != key}
        return self.with_collection(replace(coll, context=kept)), Context(collection, key, coll.context[key])

    def contexts(self) -> list[Context]:
        """Every context: the global one first, then each collection's by key."""
        out = [Context(None, "", self.global_context)] if self.global_context else []
        for c in self.collections.values():
            out.extend(Context(c.name, k, v) for k, v in sorted(c.context.items()))
        return out

    def context_for(self, collection: str, path: str) -> str | None:
        """Global context plus every context whose key is a path-segment prefix of `path`.

        Unlike the original, `docs` does not match `docs-old/x.md` (spec §26.11).
        """
        parts: list[str] = [self.global_context] if self.global_context else []
        coll = self.collections.get(collection)
        if coll:
            for key in sorted(coll.context, key=len):
                if key == "" or path == key or path.startswith(key + "/"):
                    parts.append(coll.context[key])
        return "\n\n".join(parts) if parts else None

    def to_yaml(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        if self.global_context:
            out["global_context"] = self.global_context
        if self.editor_uri:
            out["editor_uri"] = self.editor_uri
        if self.models:
            out["models"] = dict(self.models)
        if self.query_budget_ms is not None:
            out["query_budget_ms"] = self.query_budget_ms
        if self.index_url is not None:
            out["index_url"] = self.index_url
        out["collections"] = {n: c.to_yaml() for n, c in self.collections.items()}
        return out

    @classmethod
    def from_yaml(cls, raw: Any, source: Path, base: Path | None = None) -> Config:
        """`base`: the project folder relative collection paths start from (None: home)."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise InvalidInput(f"{source}: expected a mapping at the top level")
        raw = dict(raw)
        colls_raw = raw.pop("collections", None) or {}
        if not isinstance(colls_raw, dict):
            raise InvalidInput(f"{source}: 'collections' must be a mapping")
        editor = None
        for alias in ("editor_uri", "editor_uri_template", "editorUri", "editor-uri"):
            if alias in raw:
                editor = editor or raw.pop(alias)
        models = raw.pop("models", None) or {}
        budget = raw.pop("query_budget_ms", None)
        if budget is not None and (
            not isinstance(budget, int) or isinstance(budget, bool) or not 1 <= budget <= 600_000
        ):
            raise InvalidInput(
                f"{source}: query_budget_ms must be a whole number of milliseconds from 1 to 600000, got {budget!r}"
            )
        url = raw.pop("index_url", None)
        if url is not None:
            url = check_index_url(url, f"{source}: index_url")
        return cls(
            index_url=url,
            collections={str(n): Collection.from_yaml(str(n), c, source, base) for n, c in colls_raw.items()},
            global_context=raw.pop("global_context", None),
            editor_uri=editor,
            models={str(k): str(v) for k, v in models.items() if v is not None} if isinstance(models, dict) else {},
            query_budget_ms=budget,
            extra=raw,
        )


def is_index_url(value: str) -> bool:
    """Whether `value` names a Postgres server (else it is an index name or a file)."""
    return value.startswith(("postgresql://", "postgres://"))


def check_index_url(value: object, what: str) -> str:
    """A Postgres URL as `index_url` / `QMD_INDEX_URL` take it, or a clear error."""
    if not isinstance(value, str) or not is_index_url(value):
        raise InvalidInput(f"{what} must be a postgresql://… URL (user, host, port and database), got {value!r}")
    return value


_SCHEMA_OPTION = re.compile(r'\s*-c search_path="(qmd_[\w.-]+)",public')


def schema_url(url: str, index: str) -> str:
    """`url` for the named index `index`: the default index lives in the database's ``public``
    schema, any other in a schema of its own (``qmd_<name>``, named in the connection's
    options), so two indexes given one server never share a table."""
    if index == DEFAULT_INDEX:
        return url
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = " ".join([*(v for k, v in query if k == "options"), f'-c search_path="qmd_{index}",public'])
    kept = [(k, v) for k, v in query if k != "options"]
    return urlunsplit(parts._replace(query=urlencode([*kept, ("options", options)], quote_via=quote)))


def server_of(index: str, configured: str | None) -> str | None:
    """The Postgres URL of the named index (not a project's): `QMD_INDEX_URL`, else its
    config's `index_url`, in the index's own schema of that database (`schema_url`)."""
    url = os.environ.get("QMD_INDEX_URL")
    url = check_index_url(url, "QMD_INDEX_URL") if url else configured
    return schema_url(url, index) if url else None


def index_server(paths: IndexPaths, cfg: Config) -> str | None:
    """The Postgres server of the index at `paths`, if it has one: `QMD_INDEX_URL`, else
    the config's `index_url`. A project's index (`qmd init`) stays in its `.qmd/` folder:
    QMD_INDEX_URL is not for it, and its own config may not name a server, so a cloned
    repository never makes the daemon connect to a server its user did not choose."""
    project = paths.project_root is not None
    if cfg.index_url is not None and project:
        raise Forbidden(
            f"{paths.config} names a Postgres server (index_url), and a project's config may not:"
            " set index_url in your own config (~/.config/qmd/<index>.yml) or QMD_INDEX_URL"
        )
    return None if project else server_of(paths.name, cfg.index_url)


def describe_url(url: str) -> str:
    """The URL for messages and logs: without its password, and a named index's schema
    (`schema_url`) said in words."""
    parts = urlsplit(url)
    schema = ""
    if "options=" in parts.query:
        query = []
        for k, v in parse_qsl(parts.query, keep_blank_values=True):
            if k == "options" and (m := _SCHEMA_OPTION.search(v)):
                schema, v = f" (schema {m.group(1)})", _SCHEMA_OPTION.sub("", v).strip()
                if not v:
                    continue
            query.append((k, v))
        parts = parts._replace(query="&".join(f"{k}={v}" for k, v in query))
    if parts.password is not None:
        netloc = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{netloc}")
    return urlunsplit(parts) + schema


class ConfigSource(Protocol):
    """Where an engine's config lives: the YAML file, or memory."""

    def load(self) -> Config: ...

    def save(self, config: Config) -> None: ...


class ConfigFile:
    """Loads `index.yml` when it changed on disk; saves atomically. A project's config
    (`.qmd/index.yml`) has its folder as `base`, for relative collection paths."""

    def __init__(self, path: Path, base: Path | None = None) -> None:
        self.path = path
        self.base = base
        self._lock = threading.RLock()
        self._stamp: tuple[int, int] | None = None
        self._config = Config()

    def _current_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def load(self) -> Config:
        with self._lock:
            stamp = self._current_stamp()
            if stamp != self._stamp:
                self._config = self._read() if stamp else Config()
                self._stamp = stamp
            return self._config

    def _read(self) -> Config:
        try:
            raw = yaml.safe_load(self.path.read_text(encoding="utf-8"))
        except yaml.YAMLError as e:
            raise InvalidInput(f"Failed to parse {self.path}: {e}") from e
        return Config.from_yaml(raw, self.path, self.base)

    def save(self, config: Config) -> None:
        """Write `config` atomically, and only if reading the file back gives `config`:
        a value YAML or UTF-8 cannot hold must be refused here, not found unreadable by
        the next start."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            raw = config.to_yaml()
            if (problem := unstorable(raw)) is not None:
                raise InvalidInput(
                    f"this change cannot be saved to {self.path}: a value {problem}; nothing was changed"
                )
            text = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True, width=10**6, indent=2)
            try:
                data = text.encode("utf-8")
                back = Config.from_yaml(yaml.safe_load(data.decode("utf-8")), self.path, self.base)
            except (UnicodeError, yaml.YAMLError, InvalidInput) as e:
                raise InvalidInput(f"this change cannot be saved to {self.path}: {e}; nothing was changed") from e
            if back != config:
                raise InvalidInput(f"this change cannot be saved to {self.path} as written; nothing was changed")
            write_whole(self.path, data)
            self._config = config
            self._stamp = self._current_stamp()


class MemoryConfig:
    """A config held in memory: the library's inline mode (collections given as a dict)
    and index-only mode (collections as the index last recorded them). Nothing is
    written to disk but the index's own mirror of it (`store_collections`)."""

    def __init__(self, config: Config) -> None:
        self._lock = threading.Lock()
        self._config = config

    def load(self) -> Config:
        with self._lock:
            return self._config

    def save(self, config: Config) -> None:
        with self._lock:
            self._config = config


PROJECT_GITIGNORE = """\
# qmd (qmd init): index.yml is the project's config, to check in; the index is
# rebuilt from the files by 'qmd update' and stays on each machine.
index.sqlite*
bench/
.index.*.yml
"""


@dataclass(frozen=True)
class NewProject:
    """What `qmd init` wrote."""

    root: Path
    config: Path
    collection: str


def init_project(root: Path, models: dict[str, str]) -> NewProject:
    """`qmd init`: write `<root>/.qmd/index.yml`, the `models:` block pre-filled with
    `models` (the defaults as resolved now) and one collection, the project folder (`.`),
    plus a `.gitignore` that keeps the index out of version control. Refuses when the
    folder already has a project config; never overwrites one (the file appears whole,
    by link, or not at all)."""
    if not root.is_absolute():
        raise InvalidInput(f"qmd init needs an absolute folder, got {str(root)!r}")
    if not root.is_dir():
        raise InvalidInput(f"Not a folder: {root}" if root.exists() else f"Folder not found: {root}")
    if (found := project_config(root)) is not None:
        raise Conflict(f"{root} is already a qmd project: {found} exists (edit it, or remove it to start over)")
    folder = root / PROJECT_DIR
    if folder.exists() and folder.resolve() == config_root().resolve():
        raise InvalidInput(f"{folder} is your own qmd config folder (QMD_CONFIG_DIR), not a project's")
    name = re.sub(r"[^\w.\-]+", "-", root.name).strip(".-") or "project"
    validate_collection_name(name)
    lines = [
        "# qmd project index (written by 'qmd init'). Check this file in: anyone who runs qmd",
        "# inside this folder uses it, with the index kept beside it in .qmd/ (not checked in).",
        "# Collection paths are relative to the project folder.",
        "#",
        "# On another machine, update commands, collection paths outside the project and models",
        "# other than the defaults are not used until its user approves them ('qmd trust').",
        "models:",
        *(f"  {role}: {json.dumps(uri)}" for role, uri in models.items()),
        "",
        "collections:",
        f"  {name}:",
        "    path: .",
        f"    pattern: {json.dumps(DEFAULT_PATTERN)}",
        "",
    ]
    text = "\n".join(lines)
    Config.from_yaml(yaml.safe_load(text), folder / PROJECT_CONFIGS[0], root)  # what is written reads back
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):  # a dangling link too
        what = f"a symbolic link (to {os.readlink(folder)})" if folder.is_symlink() else "not a folder"
        raise Conflict(f"{folder} is {what}: a project keeps its config in a folder of its own; remove it, then init")
    folder.mkdir(exist_ok=True)
    ignore = folder / ".gitignore"
    if not ignore.exists():
        ignore.write_text(PROJECT_GITIGNORE, encoding="utf-8")
    target = folder / PROJECT_CONFIGS[0]
    try:  # 0644: a file to check in, not one of qmd's private ones
        write_whole(target, text.encode("utf-8"), mode=0o644, clobber=False)
    except FileExistsError:
        raise Conflict(f"{root} is already a qmd project: {target} exists") from None
    return NewProject(root, target, name)
