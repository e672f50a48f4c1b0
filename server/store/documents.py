"""Reading documents back: names → documents, `get`, `multi-get`, `ls`.

Everything served comes from the index, never from an arbitrary path on disk: a
name that resolves outside every collection is refused, so `get ../../etc/passwd`
cannot read anything.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs

from wcmatch import glob as wglob

from qmd.server.config import Config
from qmd.server.errors import Conflict, Forbidden, InvalidInput, NotFound
from qmd.server.store import metadata
from qmd.server.store.db import Connection, sqlite3
from qmd.server.text.frontmatter import Metadata
from qmd.uri import index_name, is_link

_DOCID_RE = re.compile(r"^[0-9a-fA-F]{6,64}$")
_VIRTUAL_RE = re.compile(r"^qmd://([^/]+)/?(.*)$")
MATCH_FLAGS = wglob.GLOBSTAR | wglob.BRACE | wglob.EXTGLOB | wglob.DOTGLOB


def normalize_docid(raw: str) -> str | None:
    """`#abc123`, `"abc123"`, `'#abc123'` → `abc123`; None when it is not a docid."""
    s = raw.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'":
        s = s[1:-1]
    s = s[1:] if s.startswith("#") else s
    return s.lower() if _DOCID_RE.match(s) else None


def parse_virtual(raw: str) -> tuple[str, str] | None:
    """`qmd://c/p` (also `qmd:c/p`, `qmd:////c/p`, `//c/p`) → (collection, path)."""
    s = raw.strip()
    if s.startswith("qmd:"):
        s = "qmd://" + s[4:].lstrip("/")
    elif s.startswith("//"):
        s = "qmd://" + s.lstrip("/")
    else:
        return None
    s = s.split("?", 1)[0]
    m = _VIRTUAL_RE.match(s)
    if not m:
        raise InvalidInput(f"invalid qmd:// path: {raw}")
    return m.group(1), m.group(2).strip("/")


def link_index(raw: str) -> str | None:
    """The index a `qmd://collection/path[:from[:count]]?index=LABEL` link names (a named
    index, or a project's `project:/root`, `project:~/root`: returned as its index's
    name, `qmd.uri.index_name`); None for a link without one. The range may also follow
    the query (`?index=work:2`), as earlier versions printed it."""
    if not is_link(raw.strip()) or "?" not in raw:
        return None
    # a `#section` after the query is the link's anchor (a label's own `#` is percent-encoded)
    query = parse_qs(re.sub(r"(:\d+){1,2}$", "", raw.split("?", 1)[1].split("#", 1)[0]))
    label = query.get("index", [None])[0]
    return index_name(label) if label else None


def split_range(name: str) -> tuple[str, int | None, int | None]:
    """`path:from:count` / `path:from` suffixes (spec §16.2) → (name, from, count); in a
    link with a query the range sits before it (`qmd://w/a.md:3:2?index=w`)."""
    base, sep, query = name.partition("?")
    if sep and is_link(base):
        path, first, count = split_range(base)
        if first is not None:
            return path + sep + query, first, count
    parts = name.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], int(parts[1]), int(parts[2])
    parts = name.rsplit(":", 1)
    if len(parts) == 2 and parts[1].isdigit() and parts[0] and not parts[0].endswith(":"):
        return parts[0], int(parts[1]), None
    return name, None, None


def safe_relpath(path: str) -> str:
    """Refuse `..` segments in a collection-relative path."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise Forbidden(f"path leaves its collection: {path}")
    return "/".join(parts)


@dataclass(frozen=True)
class DocRow:
    id: int
    collection: str
    path: str
    title: str
    hash: str
    modified_at: str
    body: str
    metadata: Metadata = field(default_factory=dict)
    """Filled by `fetch_ids`, the lookup every search shapes its results from."""


_DOC_SELECT = (
    "SELECT d.id, d.collection, d.path, d.title, d.hash, d.modified_at, c.doc AS body "
    "FROM documents d JOIN content c ON c.hash = d.hash WHERE d.active = 1"
)


def _row(r: sqlite3.Row, meta: Metadata | None = None) -> DocRow:
    return DocRow(r["id"], r["collection"], r["path"], r["title"], r["hash"], r["modified_at"], r["body"], meta or {})


def fetch(conn: Connection, collection: str, path: str) -> DocRow | None:
    r = conn.execute(_DOC_SELECT + " AND d.collection = ? AND d.path = ?", (collection, path)).fetchone()
    return _row(r) if r else None


def fetch_ids(conn: Connection, ids: list[int]) -> dict[int, DocRow]:
    """These documents, with their metadata."""
    rows: list[sqlite3.Row] = []
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        rows += conn.execute(_DOC_SELECT + f" AND d.id IN ({','.join('?' * len(chunk))})", chunk).fetchall()
    metas = metadata.fetch(conn, [r["id"] for r in rows])
    return {r["id"]: _row(r, metas.get(r["id"])) for r in rows}


def by_docid(conn: Connection, docid: str, collections: list[str]) -> DocRow:
    rows = [
        _row(r)
        for r in conn.execute(_DOC_SELECT + " AND d.hash LIKE ? ORDER BY d.collection, d.path LIMIT 50", (docid + "%",))
        if r["collection"] in collections
    ]
    if not rows:
        raise NotFound(f"Document not found: #{docid}", similar=[])
    hashes = {r.hash for r in rows}
    if len(hashes) > 1:
        names = ", ".join(f"qmd://{r.collection}/{r.path} (#{r.hash[:8]})" for r in rows[:5])
        raise Conflict(f"Ambiguous docid #{docid}: {names}. Give more hex digits.")
    return rows[0]


def _under(path: Path, root: Path) -> str | None:
    """`path` relative to `root` after resolving symlinks, or None when outside."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real == real_root:
        return ""
    if real.startswith(real_root + os.sep):
        return os.path.relpath(real, real_root).replace(os.sep, "/")
    lexical = os.path.normpath(path)
    if lexical.startswith(str(root) + os.sep):
        return os.path.relpath(lexical, root).replace(os.sep, "/")
    return None


def find_document(conn: Connection, config: Config, name: str, cwd: str | None) -> DocRow:
    """Resolve what a user typed (docid, qmd:// path, file path, partial path)."""
    names = list(config.collections)
    raw = name.strip()
    if not raw:
        raise InvalidInput("no document name given")
    docid = normalize_docid(raw)
    if docid and "/" not in raw:
        return by_docid(conn, docid, names)
    virtual = parse_virtual(raw)
    if virtual:
        coll_name, path = virtual
        config.get(coll_name)
        doc = fetch(conn, coll_name, safe_relpath(path))
        if doc:
            return doc
        raise _not_found(conn, config, raw, path)
    expanded = os.path.expanduser(raw)
    looks_fs = expanded.startswith(("/", "./", "../")) or raw.startswith("~") or raw in (".", "..")
    fs_path = Path(os.path.normpath(os.path.join(cwd or "/", expanded)))
    for coll in config.collections.values():
        rel = _under(fs_path, coll.root)
        if rel:
            doc = fetch(conn, coll.name, rel)
            if doc:
                return doc
    if looks_fs:
        if not any(_under(fs_path, c.root) is not None for c in config.collections.values()):
            raise Forbidden(f"{raw} is outside every collection; qmd only serves indexed files")
        raise _not_found(conn, config, raw, raw)
    rel = safe_relpath(raw)
    first, _, rest = rel.partition("/")
    if first in config.collections and rest:
        doc = fetch(conn, first, rest)
        if doc:
            return doc
    rows = [
        _row(r)
        for r in conn.execute(
            _DOC_SELECT
            + " AND (d.path = ? OR d.path LIKE ? ESCAPE '\\') ORDER BY d.path = ? DESC, d.collection, d.path",
            (rel, "%/" + _like_escape(rel), rel),
        )
        if r["collection"] in config.collections
    ]
    exact = [r for r in rows if r.path == rel]
    pick = exact or rows
    if len(pick) == 1:
        return pick[0]
    if len(pick) > 1:
        names_ = ", ".join(f"qmd://{r.collection}/{r.path}" for r in pick[:5])
        raise Conflict(f"Ambiguous path {raw}: {names_}")
    raise _not_found(conn, config, raw, rel)


def _like_escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def similar_paths(conn: Connection, config: Config, query: str, limit: int = 5) -> list[str]:
    """'Did you mean' candidates: close matches on the whole path and on the file name."""
    rows = [
        (r["collection"], r["path"])
        for r in conn.execute("SELECT collection, path FROM documents WHERE active = 1")
        if r["collection"] in config.collections
    ]
    q = query.lower().rsplit("/", 1)[-1] if "/" not in query.strip("/") else query.lower()
    by_key: dict[str, list[str]] = {}
    for coll, path in rows:
        for key in (path.lower(), path.lower().rsplit("/", 1)[-1]):
            by_key.setdefault(key, []).append(f"qmd://{coll}/{path}")
    out: list[str] = []
    for key in difflib.get_close_matches(q, list(by_key), n=limit * 2, cutoff=0.6):
        for v in by_key[key]:
            if v not in out:
                out.append(v)
    return out[:limit]


def _not_found(conn: Connection, config: Config, raw: str, rel: str) -> NotFound:
    for coll in config.collections.values():
        # `notes/Archive/old.md` names collection `notes` as `qmd://notes/Archive/old.md` does
        inner = {rel, rel.removeprefix(f"{coll.name}/")}
        rule = next((g for g in coll.ignore for p in inner if wglob.globmatch(p, g, flags=MATCH_FLAGS)), None)
        if rule is not None:
            return NotFound(
                f"Document is excluded by ignore rule: {raw} (collection {coll.name}, rule {rule})", similar=[]
            )
    similar = similar_paths(conn, config, rel)
    hint = f" — did you mean: {', '.join(similar)}?" if similar else ""
    return NotFound(f"Document not found: {raw}{hint}", similar=similar)


def is_comma_list(pattern: str) -> bool:
    """Names joined by commas, not a glob: a link's `?index=` is not a wildcard."""
    names = [name.split("?index=", 1)[0] for name in pattern.split(",")]
    return "," in pattern and not any(ch in name for name in names for ch in "*?{")


def glob_documents(conn: Connection, config: Config, pattern: str) -> list[DocRow]:
    matcher = wglob.compile([pattern], flags=MATCH_FLAGS)
    out: list[DocRow] = []
    for r in conn.execute(
        "SELECT d.collection, d.path FROM documents d WHERE d.active = 1 ORDER BY d.collection, d.path"
    ):
        c, p = r["collection"], r["path"]
        if c in config.collections and (
            matcher.match(p) or matcher.match(f"{c}/{p}") or matcher.match(f"qmd://{c}/{p}")
        ):
            doc = fetch(conn, c, p)
            if doc:
                out.append(doc)
    return out
