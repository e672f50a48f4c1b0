"""Typed metadata from a document's frontmatter (`qmd: metadata: {…}`), and its storage.

A document opts in through the namespaced block; everything else in the frontmatter
stays plain searchable text, and the frontmatter itself is never cut out of the body
(chunks, embeddings and line numbers do not change).

Values are strings, numbers, booleans, or flat arrays of one of those (a set: repeats
are dropped). Anything else — a nested object, null, an empty or mixed array, a date
tag, a key that is not a string — rejects the document's metadata as a whole, with the
reason recorded: the document still indexes and is searchable, but a filtered search
never sees it, so no filter silently matches half of what its author wrote.

The YAML is read with the YAML 1.2 core schema, not PyYAML's 1.1 default: `status: on`
stays the string "on", `when: 2025-01-02` the string "2025-01-02" (so `prefix "2025-"`
works), `time: 1:30` is not 90 and `012` is twelve. Only `true`/`false` are booleans.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

import yaml

from qmd.server.index.db import Connection, is_postgres

Scalar: TypeAlias = str | int | float | bool
Metadata: TypeAlias = dict[str, Scalar | list[Scalar]]
ValueType: TypeAlias = Literal["string", "number", "boolean"]

# documents.meta_state (schema migration 3); NULL means not yet extracted.
NONE: Final = 0
OK: Final = 1
REJECTED: Final = 2

MARKDOWN_EXTENSIONS = frozenset({"md", "markdown", "mdx"})
MAX_FRONTMATTER_CHARS = 64 * 1024
MAX_KEYS = 256
MAX_ARRAY = 1024
MAX_STRING = 4096
MAX_KEY = 256
_INT64 = 2**63

FRONTMATTER_RE = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.S)
"""A leading `---` block, closed by `---` or `...` (after an optional BOM)."""

_QMD_KEY = re.compile(r"^['\"]?qmd['\"]?[ \t]*:", re.M)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def fold(text: str) -> str:
    """ASCII case folding, the only folding `caseInsensitive` does: `Ä` stays `Ä`."""
    return text.translate(_ASCII_LOWER)


def value_type(value: Scalar) -> ValueType:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    return "number"


# -- YAML 1.2 core schema -------------------------------------------------------------

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _CoreLoader(_BaseLoader):
    """SafeLoader with the YAML 1.2 core schema's implicit types."""


_YAML_11_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "timestamp")}
_CoreLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _YAML_11_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_CORE_RESOLVERS = (
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
)
for _tag, _rx, _first in _CORE_RESOLVERS:
    _CoreLoader.add_implicit_resolver(_tag, re.compile(_rx), list(_first))


def _construct_int(loader: Any, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


def _construct_float(loader: Any, node: yaml.ScalarNode) -> float:
    text = str(loader.construct_scalar(node)).lower()
    if text.endswith(".inf"):
        return -math.inf if text.startswith("-") else math.inf
    if text == ".nan":
        return math.nan
    return float(text)


def _construct_bool(loader: Any, node: yaml.ScalarNode) -> bool:
    return str(loader.construct_scalar(node)).lower() == "true"


_CoreLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_CoreLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_CoreLoader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)


# -- extraction ---------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One stored value: a row of `document_metadata`."""

    key: str
    type: ValueType
    value: Scalar
    multi: bool


@dataclass(frozen=True)
class Extracted:
    state: int
    """NONE, OK or REJECTED."""
    entries: tuple[Entry, ...] = ()
    error: str | None = None
    """Why the metadata was rejected."""


class _Rejected(Exception):
    pass


def _scalar(where: str, value: object) -> Scalar:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise _Rejected(f"{where}: the number {value} is outside the 64-bit integer range")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Rejected(f"{where}: {value} is not a finite number")
        return value
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            raise _Rejected(f"{where}: a string of {len(value)} characters (the limit is {MAX_STRING})")
        return value
    if value is None:
        raise _Rejected(f"{where}: null is not a value (use a string, number, boolean, or a flat array of one)")
    if isinstance(value, dict):
        raise _Rejected(f"{where}: nested objects are not supported (flatten it into its own keys)")
    if isinstance(value, list):
        raise _Rejected(f"{where}: nested arrays are not supported")
    raise _Rejected(f"{where}: a {type(value).__name__} is not supported (quote it to make it a string)")


def _read(block: dict[Any, Any]) -> list[Entry]:
    if len(block) > MAX_KEYS:
        raise _Rejected(f"qmd.metadata has {len(block)} keys (the limit is {MAX_KEYS})")
    entries: list[Entry] = []
    for key, raw in block.items():
        if not isinstance(key, str) or not key:
            raise _Rejected(f"qmd.metadata: the key {key!r} is not a non-empty string")
        if len(key) > MAX_KEY:
            raise _Rejected(f"qmd.metadata: a key of {len(key)} characters (the limit is {MAX_KEY})")
        where = f"qmd.metadata.{key}"
        if isinstance(raw, list):
            if not raw:
                raise _Rejected(f"{where}: an empty array (remove the key, or give it a value)")
            if len(raw) > MAX_ARRAY:
                raise _Rejected(f"{where}: an array of {len(raw)} values (the limit is {MAX_ARRAY})")
            items = [_scalar(f"{where}[{i}]", v) for i, v in enumerate(raw)]
            types = list(dict.fromkeys(value_type(v) for v in items))
            if len(types) > 1:
                raise _Rejected(f"{where}: a mixed array ({' and '.join(types)}); arrays hold one type")
            entries.extend(Entry(key, types[0], v, True) for v in _dedupe(items))
        else:
            value = _scalar(where, raw)
            entries.append(Entry(key, value_type(value), value, False))
    return entries


def _dedupe(items: Sequence[Scalar]) -> list[Scalar]:
    """Set semantics with typed equality (1 and 1.0 are one number)."""
    seen: set[Scalar] = set()
    unique: list[Scalar] = []
    for v in items:
        if v not in seen:
            seen.add(v)
            unique.append(v)
    return unique


def extract(path: str, text: str) -> Extracted:
    """The document's `qmd.metadata`, or why it was rejected. Cheap for the common
    case: a document whose frontmatter never mentions `qmd:` is not parsed as YAML."""
    ext = path.rsplit(".", 1)[-1].lower() if "." in path.rsplit("/", 1)[-1] else ""
    if ext not in MARKDOWN_EXTENSIONS:
        return Extracted(NONE)
    head = text.removeprefix("\ufeff")[:MAX_FRONTMATTER_CHARS]
    fm = FRONTMATTER_RE.match(head)
    if not fm:
        if head.startswith("---") and len(head) == MAX_FRONTMATTER_CHARS and _QMD_KEY.search(head):
            return Extracted(REJECTED, error=f"the frontmatter is longer than {MAX_FRONTMATTER_CHARS} characters")
        return Extracted(NONE)
    if not _QMD_KEY.search(fm.group(1)):
        return Extracted(NONE)
    try:
        raw = yaml.load(fm.group(1), Loader=_CoreLoader)  # noqa: S506 - a safe loader with the core schema
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "syntax error"
        return Extracted(REJECTED, error=f"the frontmatter is not valid YAML{where}: {problem}")
    except RecursionError:
        return Extracted(REJECTED, error="the frontmatter nests too deeply")
    if not isinstance(raw, dict) or "qmd" not in raw:
        return Extracted(NONE)
    qmd = raw["qmd"]
    if not isinstance(qmd, dict):
        return Extracted(REJECTED, error="qmd: expected a mapping holding 'metadata'")
    if "metadata" not in qmd:
        return Extracted(NONE)
    block = qmd["metadata"]
    if block is None or block == {}:
        return Extracted(NONE)
    if not isinstance(block, dict):
        return Extracted(REJECTED, error="qmd.metadata: expected a mapping of keys to values")
    try:
        entries = _read(block)
    except _Rejected as e:
        return Extracted(REJECTED, error=str(e))
    return Extracted(OK, tuple(entries))


@dataclass(frozen=True)
class DocFilter:
    """A metadata filter compiled for this store, in its two forms (see
    `search.filters.filter_sql`): boolean SQL expressions over `documents d`, with
    their parameters."""

    sql: str
    params: tuple[object, ...]
    per_document_sql: str
    per_document_params: tuple[object, ...]


def _eligible(collection: str | None, doc_filter: DocFilter | None, *, per_document: bool) -> tuple[str, list[object]]:
    """The condition on `documents d` both forms of a scope test make, and its parameters."""
    where: list[str] = []
    params: list[object] = []
    if collection is not None:
        where.append("d.collection = ?")
        params.append(collection)
    if doc_filter is not None:
        sql, args = (
            (doc_filter.per_document_sql, doc_filter.per_document_params)
            if per_document
            else (doc_filter.sql, doc_filter.params)
        )
        where.append(f"d.active = 1 AND d.meta_state IN (0, 1) AND ({sql})")
        params.extend(args)
    return " AND ".join(where) or "1", params


def ids_sql(collection: str | None, doc_filter: DocFilter | None) -> tuple[str, list[object]]:
    """`SELECT id FROM documents …`: the documents a search of `collection` (None: every
    collection) may return. Under a filter only active documents whose metadata was
    extracted and accepted qualify: pending and rejected ones cannot satisfy a filter,
    not even `exists: false`."""
    cond, params = _eligible(collection, doc_filter, per_document=False)
    return f"SELECT d.id FROM documents d WHERE {cond}", params


def hit_check_sql(rowid: str, collection: str | None, doc_filter: DocFilter | None) -> tuple[str, list[object]]:
    """The test `ids_sql` makes, as a per-row check of `rowid` (a column of the
    statement's table): one primary-key probe per row instead of a list of every
    document in scope, for statements that look at few rows."""
    cond, params = _eligible(collection, doc_filter, per_document=True)
    return f"EXISTS (SELECT 1 FROM documents d WHERE d.id = {rowid} AND {cond})", params


# -- storage ------------------------------------------------------------------------


def _stored(value: Scalar) -> int | float | str:
    return int(value) if isinstance(value, bool) else value


# document_metadata.multi (schema migration 3): a scalar, an array's first element in
# stored order (its smallest value), the array's other elements.
SCALAR: Final = 0
ARRAY_FIRST: Final = 1
ARRAY_REST: Final = 2


MetadataRow = tuple[int, str, str, int | float | str, str | None, int]
"""(doc_id, key, type, value, folded, multi): a `document_metadata` row as SQLite holds it."""


def _rows(doc_id: int, entries: Sequence[Entry]) -> list[MetadataRow]:
    """The rows of a document's entries. Each array's smallest value (its first row in
    the table's (doc_id, key, type, value) order) is ARRAY_FIRST and is inserted before
    the others, so were SQLite to find a later value equal to it, the later one is the
    one ignored: every key the document holds keeps exactly one row with `multi` < 2.
    An array holds one type, and Python orders numbers, strings (code points, as
    BINARY orders UTF-8) and booleans (0 / 1) as SQLite does."""
    first: dict[str, int] = {}
    for i, e in enumerate(entries):
        if e.multi and (e.key not in first or _stored(e.value) < _stored(entries[first[e.key]].value)):  # type: ignore[operator]
            first[e.key] = i
    heads = set(first.values())
    rows = [
        (
            doc_id,
            e.key,
            e.type,
            _stored(e.value),
            fold(e.value) if isinstance(e.value, str) else None,
            (ARRAY_FIRST if i in heads else ARRAY_REST) if e.multi else SCALAR,
        )
        for i, e in enumerate(entries)
    ]
    return sorted(rows, key=lambda row: row[5] == ARRAY_REST)


def store(conn: Connection, doc_id: int, extracted: Extracted) -> None:
    """Replace a document's metadata (writer only)."""
    conn.execute("DELETE FROM document_metadata WHERE doc_id = ?", (doc_id,))
    store_rows(conn, _rows(doc_id, extracted.entries))
    conn.execute(
        "UPDATE documents SET meta_state = ?, meta_error = ? WHERE id = ?", (extracted.state, extracted.error, doc_id)
    )


def store_rows(conn: Connection, rows: Sequence[MetadataRow]) -> None:
    """Write rows in SQLite's form; on Postgres, whose column has one type, a number or
    boolean goes in as its JSON text and as ``num`` too (server/index/pg.py, migration 4)."""
    if not is_postgres(conn):
        conn.executemany(
            "INSERT INTO document_metadata(doc_id, key, type, value, folded, multi) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            rows,
        )
        return
    conn.executemany(
        "INSERT INTO document_metadata(doc_id, key, type, value, folded, multi, num) VALUES (?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        [
            (d, k, t, v, f, m, None) if t == "string" else (d, k, t, json.dumps(v), f, m, float(v))
            for d, k, t, v, f, m in rows
        ],
    )


def read_value(conn: Connection, type_: str, stored: Any) -> int | float | str:
    """A stored value as SQLite's row holds it (the inverse of `store_rows`)."""
    return json.loads(str(stored)) if is_postgres(conn) and type_ != "string" else stored


def store_many(conn: Connection, extracted: Sequence[tuple[int, Extracted]]) -> None:
    for doc_id, ex in extracted:
        store(conn, doc_id, ex)


def _loaded(type_: str, value: Any) -> Scalar:
    return bool(value) if type_ == "boolean" else value


def fetch(conn: Connection, doc_ids: Sequence[int]) -> dict[int, Metadata]:
    """The stored metadata of these documents (those that have some), keys in name order."""
    out: dict[int, Metadata] = {}
    for i in range(0, len(doc_ids), 500):
        part = list(doc_ids[i : i + 500])
        rows = conn.execute(
            "SELECT doc_id, key, type, value, multi FROM document_metadata"
            f" WHERE doc_id IN ({','.join('?' * len(part))}) ORDER BY doc_id, key, type, value",
            part,
        ).fetchall()
        if is_postgres(conn):  # a number's JSON text there, so sorted again as SQLite orders values
            rows = sorted(((r[0], r[1], r[2], read_value(conn, r[2], r[3]), r[4]) for r in rows), key=lambda r: r[:4])
        for doc_id, key, type_, value, multi in rows:
            meta = out.setdefault(doc_id, {})
            v = _loaded(type_, value)
            if multi:  # ARRAY_FIRST or ARRAY_REST
                held = meta.setdefault(key, [])
                assert isinstance(held, list)
                held.append(v)
            else:
                meta[key] = v
    return out


@dataclass(frozen=True)
class Rejection:
    collection: str
    path: str
    reason: str


@dataclass(frozen=True)
class ExtractionCounts:
    """What a filtered search cannot see, for `status` and for the answer's warnings."""

    documents: int
    """Active documents in scope."""
    with_metadata: int
    pending: int
    rejected: int
    examples: tuple[Rejection, ...] = ()
    """The first few rejected documents, with the reason."""


def extraction_counts(
    conn: Connection, collections: Sequence[str] | None = None, examples: int = 5
) -> ExtractionCounts:
    scope, args = (
        ("", [])
        if collections is None
        else (
            f" AND collection IN ({','.join('?' * len(collections))})",
            list(collections),
        )
    )
    total, ok, pending, rejected = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE meta_state = 1), count(*) FILTER (WHERE meta_state IS NULL),"
        f" count(*) FILTER (WHERE meta_state = 2) FROM documents WHERE active = 1{scope}",
        args,
    ).fetchone()
    shown = conn.execute(
        f"SELECT collection, path, meta_error FROM documents WHERE active = 1 AND meta_state = 2{scope}"
        " ORDER BY collection, path LIMIT ?",
        [*args, examples],
    ).fetchall()
    return ExtractionCounts(total, ok, pending, rejected, tuple(Rejection(c, p, r or "") for c, p, r in shown))


def count_eligible(conn: Connection, collections: Sequence[str], doc_filter: DocFilter) -> int:
    total = 0
    for name in collections:
        sql, params = ids_sql(name, doc_filter)
        total += conn.execute(f"SELECT count(*) FROM ({sql})", params).fetchone()[0]
    return int(total)
