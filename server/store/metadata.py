"""Typed frontmatter metadata in the index: `document_metadata` rows, the filter's scope
SQL, and the counts a filtered search reports. What a document's block holds is read by
server/text/frontmatter.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from qmd.server.store.db import Connection, is_postgres
from qmd.server.text.frontmatter import Entry, Extracted, Metadata, Scalar, fold


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
    boolean goes in as its JSON text and as ``num`` too (server/store/pg.py, migration 4)."""
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
