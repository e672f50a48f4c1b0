"""Metadata discovery: which keys, types and values the index holds, so a filter can be
written from what is there instead of guessed.

The answer is one sentence: show metadata matching X for documents filtered by Y.
`filter` decides which documents count (the same rule as filtered search: active, in
scope, extracted, passing the filter); `match` decides which of their entries are
reported (the filter grammar over one entry's `key` and `value`). Decisions on what
the seed leaves open:

- Counts are documents. A key's `documents` are those holding at least one matching
  entry of the key; a type's the same per type. A document holds a key under one
  type (a scalar, or an array of one type), so a key's count is the sum of its
  types'. With `match` `value eq docs-team`, every key holding that value appears,
  each counting the documents where it does: "which keys hold this value".
- `multi_valued` says some counted document declared the key (under that type) as an
  array, whichever of its entries matched: it describes the key, so `reviewers` stays
  `string[]` when a match keeps one of its values. A one-element array counts.
- `distinct_values` counts values held by at least `min_count` documents; the value
  window and `remaining_values` page through exactly those. `range` ignores
  `min_count`: it is over every matching entry, one per (document, value), so a
  document with `[1, 5]` contributes both. Its median is the middle entry, or the
  mean of the two middle entries when their number is even (`[1, 5]` gives 3).
- Keys are ordered by documents (descending), then by key (BINARY, which is code
  point order); types within a key by documents, then name; values by documents then
  value (`sort="count"`), or by value (`sort="value"`: numbers numerically, strings
  by code point, false before true).
- `documents` is every active document in scope (pending and rejected ones too, as
  they are documents a search covers); with a filter, `filtered_documents` is the
  denominator instead. Pending and rejected documents are counted apart, and never
  hold entries.

Every figure of one answer comes from one read transaction, so one snapshot. The work
is done in SQLite, in a census over `documents` and one statement of CTEs over
`document_metadata`: values are grouped while walking the (key, type, value, multi,
doc_id) index in order, and in the same walk a key's documents are counted as its first
entries (`multi` < 2: a scalar, or an array's first value; `index.metadata.store`
writes exactly one per document and key). Only a match that tests values can keep an
array's other entries and not its first: then the counted documents' array entries are
grouped as well, while walking the table in (doc_id, ...) order. Neither grouping needs
a sort over every entry. How the eligible documents are joined is chosen from the
census (see `_plan`), as the cheapest way depends on how many of the index's documents
they are; the answer never does. The plans and the collection flags rely on what the
index guarantees: a document holds entries only while its `meta_state` is 1
(`metadata.store` replaces both in one transaction; a document leaving the index loses
its entries and turns pending, `index.indexer._deactivate`). So when every document
holding entries counts, no entry's document is tested at all; an index that still held
an inactive document's entries would be read with a plan that tests them.

The cost, for 100k documents with 850k entries and no filter or match, is about 2
walks of the value index (~160 ms on 2 cores, bench/bench_discovery.py; it was 4.4
when array documents were grouped in a second walk): the walk itself, reading `multi`
and counting first entries (~0.3 of one), the census of the documents (~0.25), the
values' rank windows (~0.25) and their running windows.

On Postgres the answer is the same, from `_pg_report_statement`: there is no index in
value order to walk (a 4,096-character string does not fit a btree entry), so the
eligible entries are hashed by value once and the windows run over the distinct values;
about 570 ms for the same 100k documents.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

from qmd.server.errors import InvalidInput
from qmd.server.search.filters import Bound, Condition, Filter, Not, check_binding_budget, filter_sql, match_sql
from qmd.server.store.db import Connection, dialect_of, snapshot
from qmd.server.store.dialect import Dialect
from qmd.server.store.metadata import Rejection, read_value
from qmd.server.text.frontmatter import Scalar, ValueType

Sort: TypeAlias = Literal["count", "value"]
Number: TypeAlias = int | float

DEFAULT_KEY_LIMIT: Final = 50
DEFAULT_VALUE_LIMIT: Final = 10
REJECTED_EXAMPLES: Final = 5
TYPE_ORDER: Final[tuple[ValueType, ...]] = ("boolean", "number", "string")


# -- options --------------------------------------------------------------------------


def _option_error(name: str, expected: str, got: object) -> InvalidInput:
    shown = repr(got) if isinstance(got, str) else str(got)
    return InvalidInput(f"Invalid {name}: expected {expected}, got {shown}", option=name)


def _whole(name: str, value: object, *, least: int, none_means: str | None = None) -> None:
    """Python's bool is an int, and a float such as 2.0 is not a count: both are
    refused rather than read as a number."""
    if value is None and none_means is not None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        what = "a positive integer" if least == 1 else "a non-negative integer"
        raise _option_error(name, what + (f" or None ({none_means})" if none_means else ""), value)


@dataclass(frozen=True)
class MetadataOptions:
    """What to report; validated on construction, so a bad option fails before any
    SQL runs and names itself (`detail["option"]`, for a surface to respell it as
    `--key-limit` or `keyLimit`)."""

    collections: Sequence[str]
    """The collections in scope, already resolved by the caller (named ones checked,
    or the default ones); empty means nothing is in scope."""
    match: Filter | None = None
    filter: Filter | None = None
    key_limit: int | None = DEFAULT_KEY_LIMIT
    """None: every key (`--all-keys`)."""
    key_offset: int = 0
    value_limit: int | None = DEFAULT_VALUE_LIMIT
    """Values per key and type; None: every value (`--all-values`)."""
    value_offset: int = 0
    sort: Sort = "count"
    min_count: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.collections, str) or not all(isinstance(c, str) for c in self.collections):
            raise _option_error("collections", "a list of collection names", self.collections)
        _whole("key_limit", self.key_limit, least=1, none_means="every key")
        _whole("key_offset", self.key_offset, least=0)
        _whole("value_limit", self.value_limit, least=1, none_means="every value")
        _whole("value_offset", self.value_offset, least=0)
        _whole("min_count", self.min_count, least=1)
        if self.sort not in ("count", "value"):
            raise _option_error("sort", "'count' or 'value'", self.sort)
        # Each was checked alone when parsed. The statement binds the filter twice at
        # most and the match twice (for the values and for the arrays), which stays
        # far under SQLite's limit while their sum is within the budget.
        fparams = filter_sql(self.filter)[1] if self.filter is not None else []
        mparams = match_sql(self.match)[1] if self.match is not None else []
        check_binding_budget(len(fparams) + len(mparams))
        object.__setattr__(self, "collections", tuple(dict.fromkeys(self.collections)))


# -- the answer -----------------------------------------------------------------------


@dataclass(frozen=True)
class ValueCount:
    value: Scalar
    documents: int


@dataclass(frozen=True)
class NumberRange:
    min: Number
    median: Number
    max: Number


@dataclass(frozen=True)
class TypeReport:
    type: ValueType
    multi_valued: bool
    documents: int
    distinct_values: int
    values: list[ValueCount]
    remaining_values: int
    range: NumberRange | None
    """Numbers only."""
    collections: list[str]
    """The collections in scope with a counted document holding a matching entry of
    this type, by name."""


@dataclass(frozen=True)
class KeyReport:
    key: str
    documents: int
    types: list[TypeReport]


@dataclass(frozen=True)
class MetadataReport:
    collections: list[str]
    """The scope the report covers."""
    documents: int
    """Active documents in scope."""
    filtered_documents: int | None
    """Documents passing the filter (the coverage denominator); None without one."""
    total_keys: int
    """Keys with a matching entry, before the key window."""
    remaining_keys: int
    keys: list[KeyReport]
    with_metadata: int
    """Active documents in scope that hold metadata (not narrowed by the filter)."""
    pending: int
    """Active documents in scope not yet extracted: no filter or discovery sees them."""
    rejected: int
    """Active documents in scope whose metadata was refused."""
    rejected_examples: list[Rejection] = field(default_factory=list)
    """The first few rejected documents, by collection and path, with the reason."""


# -- reading --------------------------------------------------------------------------


def discover(conn: Connection, options: MetadataOptions) -> MetadataReport:
    """The metadata report for `options`, read from one snapshot of the index on
    `conn` (a reader: it never writes)."""
    with snapshot(conn):
        return _discover(conn, options)


@dataclass(frozen=True)
class _Census:
    """The documents side of an answer, and what the plan is chosen from."""

    documents: int
    with_metadata: int
    pending: int
    rejected: int
    eligible: int
    eligible_with_rows: int
    """Eligible documents that hold entries (meta_state 1)."""
    with_rows: int
    """Documents of the whole index, in scope or not, that hold entries."""


def _census(conn: Connection, scope_json: str, flt: Filter | None) -> tuple[_Census, list[Bound]]:
    """One pass over the scope's active documents (each count costs a few ms over 100k).
    `+` keeps SQLite's planner off the collection index, whose seeks would each cost a
    row lookup: a scan of the table is cheaper unless the scope is a small part of the
    index. Without a filter, the counted documents are the extracted ones (states 0
    and 1), so they follow from the other counts."""
    scope = "FROM documents d WHERE d.active = 1 AND +d.collection IN (SELECT value FROM json_each(?))"
    with_rows = "(SELECT count(*) FROM documents WHERE meta_state = 1)"
    if flt is None:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE d.meta_state = 1), count(*) FILTER (WHERE d.meta_state IS NULL),"
            f" count(*) FILTER (WHERE d.meta_state = 2), {with_rows} {scope}",
            [scope_json],
        ).fetchone()
        documents, with_metadata, pending, rejected, rows = (int(v) for v in row)
        return _Census(
            documents, with_metadata, pending, rejected, documents - pending - rejected, with_metadata, rows
        ), []
    # The subquery's fence keeps it from being flattened, which would copy the filter into
    # both counts that read `ok` and so evaluate it twice a document.
    dialect = dialect_of(conn)
    fsql, fparams = filter_sql(flt, "d", dialect=dialect)
    fence = dialect.subquery_fence
    row = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE s = 1), count(*) FILTER (WHERE s IS NULL),"
        " count(*) FILTER (WHERE s = 2), coalesce(sum(ok), 0), count(*) FILTER (WHERE ok = 1 AND s = 1),"
        f" {with_rows} FROM (SELECT d.meta_state AS s,"
        f" CASE WHEN d.meta_state IN (0, 1) AND ({fsql}) THEN 1 ELSE 0 END AS ok {scope} {fence}) c",
        [*fparams, scope_json],
    ).fetchone()
    documents, with_metadata, pending, rejected, eligible, eligible_with_rows, rows = (int(v) for v in row)
    return _Census(documents, with_metadata, pending, rejected, eligible, eligible_with_rows, rows), fparams


def _rejections(conn: Connection, scope_json: str) -> list[Rejection]:
    rows = conn.execute(
        "SELECT collection, path, coalesce(meta_error, '') FROM documents"
        " WHERE active = 1 AND meta_state = 2 AND collection IN (SELECT value FROM json_each(?))"
        " ORDER BY collection, path LIMIT ?",
        (scope_json, REJECTED_EXAMPLES),
    ).fetchall()
    return [Rejection(c, p, r) for c, p, r in rows]


Plan: TypeAlias = Literal["all", "drive", "probe", "exclude"]


def _plan(census: _Census) -> Plan:
    """How the statement joins the eligible documents to their entries; it changes
    the time an answer takes, never the answer. The choice is by the eligible share
    of the documents holding entries: walking the whole value index costs about the
    same whatever the share, and testing an entry's document on top of it costs
    little when a Bloom filter rules the document out, a b-tree probe when not.

    - drive (share <= 7%): start from the eligible documents, fetch their entries by
      primary key and sort them into groups, about 1 us an entry, but only theirs.
    - probe (<= 65%): walk the index, probing the set of eligible documents.
    - exclude: walk the index, probing the (smaller) set of the other documents, so
      the Bloom filter alone passes most entries.
    - all: every document holding entries counts (the whole index in scope and no
      filter; the indexer leaves no entries of a deleted file): walk the index
      testing nothing.

    The crossovers are where the plans' times met on 100k documents with 860k
    entries (bench/bench_discovery.py), at shares from 2% to 99%; re-timed with one
    walk per plan (first entries counted in it) at 0.5-80%, they still hold."""
    if census.eligible_with_rows == census.with_rows:
        return "all"
    share = census.eligible_with_rows / census.with_rows if census.with_rows else 0.0
    if share <= 0.07:
        return "drive"
    return "probe" if share <= 0.65 else "exclude"


def _per_pair(f: Filter) -> bool:
    """Whether the match decides by an entry's key and type alone (conditions on the
    key, and `type` tests of the value), so keeps every entry of a document's key or
    none: an array's first entry then stands for its document."""
    if isinstance(f, Condition):
        return f.field == "key" or f.operator == "type"
    if isinstance(f, Not):
        return _per_pair(f.operand)
    return all(_per_pair(o) for o in f.operands)


def _folds(f: Filter) -> bool:
    """Whether the match tests an entry's `folded` column (a caseInsensitive value test)."""
    if isinstance(f, Condition):
        return f.case_insensitive and f.field == "value"
    if isinstance(f, Not):
        return _folds(f.operand)
    return any(_folds(o) for o in f.operands)


class _Statement:
    """SQL text and its positional parameters, kept in step: a fragment's `?`s are
    bound in the order the fragments are added."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.params: list[Bound] = []

    def add(self, text: str, params: Sequence[Bound] = ()) -> None:
        assert text.count("?") == len(params), text
        self.parts.append(text)
        self.params.extend(params)

    @property
    def sql(self) -> str:
        return "\n".join(self.parts)


_TOTAL_ROW: Final = "SELECT 'total', NULL, NULL, NULL, (SELECT count(*) FROM keys), NULL, NULL, NULL, NULL, NULL, NULL"
"""Both statements' first row: the number of keys (`keys`, a CTE of both)."""


def _add_key_window(s: _Statement, options: MetadataOptions) -> None:
    """Both statements' `keys` (ranked by documents, then key) and `shown` (the key
    window), from their `pairs`."""
    s.add(
        "keys(key, docs, rank) AS MATERIALIZED ("
        " SELECT key, sum(docs), row_number() OVER (ORDER BY sum(docs) DESC, key) FROM pairs GROUP BY key),"
    )
    key_end = -1 if options.key_limit is None else options.key_offset + options.key_limit
    s.add(
        "shown(key, docs, rank) AS MATERIALIZED ("
        " SELECT key, docs, rank FROM keys WHERE rank > ? AND (? < 0 OR rank <= ?))",
        [options.key_offset, key_end, key_end],
    )


def _add_value_rows(s: _Statement, options: MetadataOptions) -> None:
    """Both statements' last rows: the value window of each shown pair, from `ranked`."""
    value_end = -1 if options.value_limit is None else options.value_offset + options.value_limit
    s.add(
        "UNION ALL SELECT 'value', r.key, r.type, r.value, r.docs, r.pos, NULL, NULL, NULL, NULL, NULL FROM ranked r"
        " WHERE r.pos > ? AND (? < 0 OR r.pos <= ?)",
        [options.value_offset, value_end, value_end],
    )


def _report_statement(
    options: MetadataOptions, dialect: Dialect, scope_json: str, fparams: list[Bound], plan: Plan
) -> _Statement:
    """The one statement that reads the entries. It returns rows of four kinds, told
    apart by their first column: one `total` (the number of keys), a `pair` per
    (key, type) in the key window, a `middle` per number pair (its median's two
    middle entries), a `value` per value in a value window."""
    s = _Statement()
    fsql = filter_sql(options.filter, "d", dialect=dialect)[0] if options.filter is not None else "1"
    msql, mparams = match_sql(options.match, "m", dialect=dialect) if options.match is not None else ("true", [])

    s.add("WITH")
    s.add(
        "elig(id, collection) AS MATERIALIZED (SELECT d.id, d.collection FROM documents d"
        " WHERE d.active = 1 AND d.meta_state IN (0, 1) AND +d.collection IN (SELECT value FROM json_each(?))"
        f" AND ({fsql})),",
        [scope_json, *fparams],
    )
    # `test`: whether the document of an entry (alias `{}`) counts, by the plan.
    if plan == "exclude":
        # Every document the answer does not count, by the same test as `elig`
        # negated (the CASE makes it 0 or 1, never NULL, for a pending document).
        s.add(
            "other(id) AS MATERIALIZED (SELECT d.id FROM documents d WHERE NOT CASE WHEN d.active = 1"
            " AND d.meta_state IN (0, 1) AND d.collection IN (SELECT value FROM json_each(?))"
            f" THEN ({fsql}) ELSE 0 END),",
            [scope_json, *fparams],
        )
        test = "NOT EXISTS (SELECT 1 FROM other o WHERE o.id = {}.doc_id)"
    elif plan == "all":
        test = "1"
    else:
        test = "{}.doc_id IN (SELECT id FROM elig)"
    counted = test.format("m")

    # vals: per matching (key, type, value) of the counted documents, its documents,
    # and in value order the running count of entries, of values held by at least
    # min_count documents, of first entries (`multi` < 2, one per document holding the
    # key) and of arrays' first entries (`multi` 1, one per array), and the pair's
    # least value. Grouped while walking the (key, type, value, multi, doc_id) index,
    # the rows come out in that order, which the windows reuse without sorting again.
    if plan == "drive":
        entries = f"FROM elig e CROSS JOIN document_metadata m ON m.doc_id = e.id WHERE ({msql})"
    elif options.match is not None and _folds(options.match):
        # The value index holds key, type, value, multi and doc_id, not `folded`: a
        # match that folds case reads every row it tests, which one walk of the table
        # does at a fraction of the cost of looking each up from the index. Wrapped in
        # a CASE, the match offers the planner no index to seek.
        entries = f"FROM document_metadata m WHERE {counted} AND CASE WHEN ({msql}) THEN 1 ELSE 0 END"
    else:
        entries = f"FROM document_metadata m INDEXED BY idx_metadata_value WHERE {counted} AND ({msql})"
    s.add(
        "vals(key, type, value, docs, upto, kept, lowest, heads, firsts) AS MATERIALIZED ("
        " SELECT m.key, m.type, m.value, count(*), sum(count(*)) OVER w, sum(count(*) >= ?) OVER w,"
        "  first_value(m.value) OVER w,"
        "  sum(count(*) FILTER (WHERE m.multi < 2)) OVER w, sum(count(*) FILTER (WHERE m.multi = 1)) OVER w"
        f" {entries} GROUP BY m.key, m.type, m.value"
        " WINDOW w AS (PARTITION BY m.key, m.type ORDER BY m.value ROWS UNBOUNDED PRECEDING)),",
        [options.min_count, *mparams],
    )

    # pairs: a pair's last value (in value order) carries its totals. It is the row of
    # the pair's largest running count of entries, whose columns SQLite returns with
    # `max()` (a bare column of an aggregate with one max() is from the max's row).
    last = (
        "SELECT v.key AS key, v.type AS type, max(v.upto) AS entries, v.heads AS heads, v.firsts AS firsts,"
        " v.kept AS kept, v.lowest AS lowest, v.value AS highest FROM vals v GROUP BY v.key, v.type"
    )
    if options.match is None or _per_pair(options.match):
        # Without a match, or with one that keeps all of a document's entries of a
        # key or none (it tests keys and types only), a pair's documents are its first
        # entries, and it is an array when one of them is.
        s.add(
            "pairs(key, type, docs, entries, distinct_values, multi, lowest, highest) AS MATERIALIZED ("
            f" SELECT key, type, heads, entries, kept, firsts > 0, lowest, highest FROM ({last})),"
        )
    else:
        # A match that tests values may keep an array's other entries (`multi` 2) and
        # not its first. A pair without such an entry has at most one matching entry
        # a document: its documents are its entries. For the others, `arrays` groups
        # the counted documents' array entries by document: per (key, type), those
        # with a matching entry, and their matching entries (these documents alone
        # hold several, so they turn entry counts into document counts). In the
        # table's own (doc_id, key, type, value) order, a document's entries of a key
        # are adjacent, so grouping them needs no sort: the walk is held to the table
        # (SQLite's name for a WITHOUT ROWID table's primary key), as the value index
        # covers these columns too but would need a sort of every entry it passes. The
        # walk does not start (LIMIT 0 ends a statement before its loop) when no pair
        # needs it.
        if plan == "drive":
            arrays = "FROM elig e CROSS JOIN document_metadata m ON m.doc_id = e.id WHERE m.multi > 0"
        else:
            arrays = (
                "FROM document_metadata m INDEXED BY sqlite_autoindex_document_metadata_1"
                f" WHERE m.multi > 0 AND {counted}"
            )
        s.add(
            "arrays(key, type, docs_match, rows_match) AS MATERIALIZED ("
            " SELECT key, type, sum(n > 0), sum(n) FROM ("
            f"  SELECT m.key AS key, m.type AS type, sum({msql}) AS n {arrays}"
            "  AND +m.key IN (SELECT key FROM vals WHERE upto > heads) GROUP BY m.doc_id, m.key, m.type"
            "  LIMIT (CASE WHEN EXISTS (SELECT 1 FROM vals WHERE upto > heads) THEN -1 ELSE 0 END))"
            " GROUP BY key, type),",
            mparams,
        )
        # The pair is an array when a matching entry is one's; else when a counted
        # document holds it as one whatever matched: the first array entry of a
        # counted document found in the pair's part of the value index.
        in_pair = "x.key = t.key AND x.type = t.type AND x.multi = 1"
        s.add(
            "pairs(key, type, docs, entries, distinct_values, multi, lowest, highest) AS MATERIALIZED ("
            " SELECT t.key, t.type,"
            "  CASE WHEN t.entries = t.heads THEN t.entries ELSE t.entries - a.rows_match + a.docs_match END,"
            "  t.entries, t.kept,"
            "  CASE WHEN t.firsts > 0 OR t.entries > t.heads THEN 1"
            f"   WHEN EXISTS (SELECT 1 FROM document_metadata x INDEXED BY idx_metadata_value WHERE {in_pair}"
            f"   AND {test.format('x')}) THEN 1 ELSE 0 END,"
            "  t.lowest, t.highest"
            f" FROM ({last}) t LEFT JOIN arrays a ON a.key = t.key AND a.type = t.type),"
        )
    _add_key_window(s, options)
    if options.sort == "count":
        s.add(
            ", ranked(key, type, value, docs, pos) AS ("
            " SELECT v.key, v.type, v.value, v.docs,"
            "  row_number() OVER (PARTITION BY v.key, v.type ORDER BY v.docs DESC, v.value)"
            " FROM vals v WHERE v.key IN (SELECT key FROM shown) AND v.docs >= ?)",
            [options.min_count],
        )
    else:
        s.add(
            ", ranked(key, type, value, docs, pos) AS ("
            " SELECT v.key, v.type, v.value, v.docs, v.kept FROM vals v WHERE v.key IN (SELECT key FROM shown)"
            " AND v.docs >= ?)",
            [options.min_count],
        )

    # Which collections contribute: one flag per collection in scope, read from the
    # pair's matching values (a match depends on key, type and value alone, so `vals`
    # says which entries match and the match is not bound again). Most pairs are found
    # in a collection among their first entries, so those are looked up first, one
    # document each; only a pair not found there reads all its entries, against the
    # set of the collection's documents, built on first use (once a statement).
    # Without a filter, a collection's counted documents are its active ones (only
    # extracted documents hold entries).
    colls = options.collections
    entries_of = (
        "SELECT x.doc_id AS id FROM vals w CROSS JOIN document_metadata x"
        " ON x.key = w.key AND x.type = w.type AND x.value = w.value WHERE w.key = p.key AND w.type = p.type"
    )
    flag_params: list[Bound] = []
    if len(colls) <= 1:
        flags = "NULL"
    elif options.filter is None:
        flags = " || ".join(
            f"(CASE WHEN EXISTS (SELECT 1 FROM ({entries_of} LIMIT 64) y CROSS JOIN documents d ON d.id = y.id"
            " WHERE d.collection = ? AND d.active = 1) THEN '1'"
            f" WHEN EXISTS ({entries_of} AND +x.doc_id IN"
            " (SELECT id FROM documents WHERE collection = ? AND active = 1)) THEN '1' ELSE '0' END)"
            for _ in colls
        )
        flag_params = [c for c in colls for _ in (0, 1)]
    else:
        flags = " || ".join(
            f"(CASE WHEN EXISTS ({entries_of} AND +x.doc_id IN (SELECT id FROM elig WHERE collection = ?))"
            " THEN '1' ELSE '0' END)"
            for _ in colls
        )
        flag_params = list(colls)
    s.add(_TOTAL_ROW)
    s.add(
        "UNION ALL SELECT 'pair', p.key, p.type, NULL, p.docs, k.rank, p.distinct_values, p.multi,"
        f" p.lowest, p.highest, {flags} FROM pairs p JOIN shown k ON k.key = p.key",
        flag_params,
    )
    # The median's one or two middle entries: the values whose running count of
    # entries first reaches the middle positions, (n + 1) / 2 and n / 2 + 1 (integer
    # halves): one row of `vals` each.
    s.add(
        "UNION ALL SELECT 'middle', v.key, v.type, NULL, NULL, NULL, NULL, NULL,"
        " max(v.value) FILTER (WHERE v.upto - v.docs < (p.entries + 1) / 2),"
        " max(v.value) FILTER (WHERE v.upto - v.docs < p.entries / 2 + 1), NULL"
        " FROM pairs p CROSS JOIN vals v ON v.key = p.key AND v.type = p.type"
        " WHERE p.type = 'number' AND p.key IN (SELECT key FROM shown)"
        " AND v.upto >= (p.entries + 1) / 2 AND v.upto - v.docs < p.entries / 2 + 1 GROUP BY v.key, v.type"
    )
    _add_value_rows(s, options)
    return s


def _pg_report_statement(options: MetadataOptions, dialect: Dialect, scope_json: str) -> _Statement:
    """`_report_statement`'s rows, on Postgres. One plan: the eligible documents are
    hashed and their matching entries grouped by their stored text and collection in
    one pass of the table (a hash aggregate, one row per distinct value); values are
    then grouped the way SQLite compares them and what a pair needs is read off them by
    windows, in value order. A string is its text (bytewise, the C collation); a number
    or boolean is the exact numeric of its JSON text, so 3 and 3.0 are one value and
    integers past 2**53 stay apart, which ``num`` (a float) would not keep. Which
    collections hold a pair is a bit string, a bit per collection in scope."""
    s = _Statement()
    fsql, fparams = filter_sql(options.filter, "d", dialect=dialect) if options.filter is not None else ("true", [])
    msql, mparams = match_sql(options.match, "m", dialect=dialect) if options.match is not None else ("true", [])
    colls = options.collections
    k = len(colls)
    position = "CASE d.collection " + " ".join(f"WHEN ? THEN {i}" for i in range(k)) + " END" if k > 1 else "0"
    mask = f"bit_or(set_bit(repeat('0', {k})::bit({k}), ci, 1))" if k > 1 else "NULL::bit(1)"
    s.add("WITH")
    s.add(
        f"elig(id, ci) AS MATERIALIZED (SELECT d.id, {position} FROM documents d"
        " WHERE d.active = 1 AND d.meta_state = 1 AND d.collection IN (SELECT value FROM json_each(?))"
        f" AND ({fsql})),",
        [*(colls if k > 1 else []), scope_json, *fparams],
    )
    entries = f"FROM elig e JOIN document_metadata m ON m.doc_id = e.id WHERE {msql}"
    # A pair's documents are its first entries (`multi` < 2) unless the match tests
    # values: it may then keep an array's later entries and not its first, and the
    # documents are counted apart (`spread`).
    per_pair = options.match is None or _per_pair(options.match)
    # written: per matching value as stored (its text) and collection, its documents (one
    # entry each), first entries and whether an array's. Grouping by the column itself
    # is what Postgres does fast; the numbers' numeric is then taken of these few rows.
    s.add(
        "written(key, type, value, ci, docs, heads, arr) AS (SELECT m.key, m.type, m.value, e.ci, count(*),"
        f" count(*) FILTER (WHERE m.multi < 2), bool_or(m.multi > 0) {entries} GROUP BY 1, 2, 3, 4),",
        mparams,
    )
    # vals: per value, the same and the collections holding it; in value order the
    # running counts (entries, values held by at least min_count documents) and the
    # least value; the pair's totals. Counts are bigint (a sum's numeric would not
    # halve as an integer).
    s.add(
        "vals(key, type, n, s, value, docs, upto, kept, lowest, entries, highest, pair_heads, pair_arr, pair_mask)"
        " AS MATERIALIZED (SELECT g.key, g.type, g.n, g.s, g.value, g.docs, (sum(g.docs) OVER w)::bigint,"
        " sum(CASE WHEN g.docs >= ? THEN 1 ELSE 0 END) OVER w, first_value(g.value) OVER w,"
        " (sum(g.docs) OVER p)::bigint, last_value(g.value) OVER p, sum(g.heads) OVER p, bool_or(g.arr) OVER p,"
        " bit_or(g.mask) OVER p FROM ("
        "  SELECT key, type, CASE WHEN type <> 'string' THEN value::numeric END AS n,"
        "   CASE WHEN type = 'string' THEN value END AS s, min(value) AS value, sum(docs)::bigint AS docs,"
        f"   sum(heads)::bigint AS heads, bool_or(arr) AS arr, {mask} AS mask FROM written GROUP BY 1, 2, 3, 4) g"
        " WINDOW w AS (PARTITION BY g.key, g.type ORDER BY g.n, g.s ROWS UNBOUNDED PRECEDING),"
        " p AS (PARTITION BY g.key, g.type ORDER BY g.n, g.s"
        " ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)),",
        [options.min_count],
    )
    if per_pair:
        docs, multi, spread = "v.pair_heads", "v.pair_arr", ""
    else:
        s.add(
            f"spread(key, type, docs) AS MATERIALIZED (SELECT m.key, m.type, count(DISTINCT m.doc_id) {entries}"
            " GROUP BY m.key, m.type),",
            mparams,
        )
        docs = "t.docs"
        multi = (
            "CASE WHEN v.pair_arr THEN true ELSE EXISTS (SELECT 1 FROM document_metadata x JOIN elig e"
            " ON e.id = x.doc_id WHERE x.key = v.key AND x.type = v.type AND x.multi = 1) END"
        )
        spread = " JOIN spread t ON t.key = v.key AND t.type = v.type"
    # A pair's last value (its running count reaching its entries) carries its totals.
    s.add(
        "pairs(key, type, docs, entries, distinct_values, multi, lowest, highest, flags) AS MATERIALIZED ("
        f" SELECT v.key, v.type, {docs}, v.entries, v.kept, {multi}, v.lowest, v.highest, v.pair_mask::text"
        f" FROM vals v{spread} WHERE v.upto = v.entries),"
    )
    _add_key_window(s, options)
    pos = "row_number() OVER (PARTITION BY v.key, v.type ORDER BY v.docs DESC, v.n, v.s)"
    s.add(
        f", ranked(key, type, value, docs, pos) AS (SELECT v.key, v.type, v.value, v.docs,"
        f" {pos if options.sort == 'count' else 'v.kept'}"
        " FROM vals v WHERE v.key IN (SELECT key FROM shown) AND v.docs >= ?)",
        [options.min_count],
    )
    s.add(_TOTAL_ROW)
    s.add(
        "UNION ALL SELECT 'pair', p.key, p.type, NULL, p.docs, k.rank, p.distinct_values, p.multi,"
        " p.lowest, p.highest, p.flags FROM pairs p JOIN shown k ON k.key = p.key"
    )
    # The median's middle entries, (n + 1) / 2 and n / 2 + 1: the value whose entries
    # span each position (one row each).
    s.add(
        "UNION ALL SELECT 'middle', v.key, v.type, NULL, NULL, NULL, NULL, NULL,"
        " min(v.value) FILTER (WHERE v.upto - v.docs < (v.entries + 1) / 2),"
        " min(v.value) FILTER (WHERE v.upto >= v.entries / 2 + 1), NULL"
        " FROM vals v WHERE v.type = 'number' AND v.key IN (SELECT key FROM shown)"
        " AND v.upto >= (v.entries + 1) / 2 AND v.upto - v.docs < v.entries / 2 + 1 GROUP BY v.key, v.type"
    )
    _add_value_rows(s, options)
    return s


def _scalar(type_: ValueType, value: object) -> Scalar:
    if type_ == "boolean":
        return bool(value)
    assert isinstance(value, str | int | float), value
    return value


def _number(value: object) -> Number:
    assert isinstance(value, int | float) and not isinstance(value, bool), value
    return value


def _median(lower: Number, upper: Number) -> Number:
    """Exact for integers: the mean of 1 and 5 is the int 3, of 1 and 4 the float 2.5."""
    if isinstance(lower, int) and isinstance(upper, int):
        total = lower + upper
        return total // 2 if total % 2 == 0 else total / 2
    return (lower + upper) / 2


def _type(name: object) -> ValueType:
    assert name in TYPE_ORDER, name
    return name


@dataclass
class _Pair:
    """One (key, type) of the key window as the statement returns it."""

    key: str
    type: ValueType
    documents: int
    rank: int
    distinct: int
    multi: bool
    lowest: object
    highest: object
    flags: str | None
    middle: tuple[Number, Number] | None = None
    values: list[tuple[int, ValueCount]] = field(default_factory=list)

    def report(self, scope: list[str], value_offset: int) -> TypeReport:
        window = [vc for _, vc in sorted(self.values, key=lambda pv: pv[0])]
        remaining = max(0, self.distinct - value_offset - len(window))
        rng = None
        if self.type == "number" and self.middle is not None:
            rng = NumberRange(_number(self.lowest), _median(*self.middle), _number(self.highest))
        if self.flags is None:
            contributing = scope[:1]
        else:
            contributing = sorted(c for c, flag in zip(scope, self.flags, strict=True) if flag == "1")
        return TypeReport(self.type, self.multi, self.documents, self.distinct, window, remaining, rng, contributing)


def _read_pairs(conn: Connection, stmt: _Statement) -> tuple[int, list[_Pair]]:
    total = 0
    pairs: dict[tuple[str, str], _Pair] = {}
    rows = conn.execute(stmt.sql, stmt.params).fetchall()

    # Pairs first: SQLite returns UNION ALL branches in order, but nothing promises it.
    rows = sorted(rows, key=lambda row: row[0] != "pair")
    for kind, key, type_, value, a, b, c, d, lo, hi, flags in rows:
        if kind == "pair":
            pairs[(key, type_)] = _Pair(
                key,
                _type(type_),
                int(a),
                int(b),
                int(c),
                bool(d),
                read_value(conn, type_, lo),
                read_value(conn, type_, hi),
                flags,
            )
        elif kind == "total":
            total = int(a)
        elif kind == "middle":
            pairs[(key, type_)].middle = (_number(read_value(conn, type_, lo)), _number(read_value(conn, type_, hi)))
        else:
            pair = pairs[(key, type_)]
            pair.values.append((int(b), ValueCount(_scalar(pair.type, read_value(conn, type_, value)), int(a))))
    return total, list(pairs.values())


def _discover(conn: Connection, options: MetadataOptions) -> MetadataReport:
    scope = list(options.collections)
    scope_json = json.dumps(scope)
    dialect = dialect_of(conn)
    census, fparams = _census(conn, scope_json, options.filter)
    rejected = _rejections(conn, scope_json) if census.rejected else []

    total_keys, pairs = 0, list[_Pair]()
    if census.eligible_with_rows:
        if dialect.values_in_order:
            stmt = _report_statement(options, dialect, scope_json, fparams, _plan(census))
        else:
            conn.execute(dialect.grouping_memory)
            stmt = _pg_report_statement(options, dialect, scope_json)
        total_keys, pairs = _read_pairs(conn, stmt)

    by_key: dict[str, tuple[int, list[TypeReport]]] = {}
    for pair in pairs:
        by_key.setdefault(pair.key, (pair.rank, []))[1].append(pair.report(scope, options.value_offset))
    keys = []
    for key, (_, types) in sorted(by_key.items(), key=lambda kv: kv[1][0]):
        types.sort(key=lambda t: (-t.documents, t.type))
        keys.append(KeyReport(key, sum(t.documents for t in types), types))
    return MetadataReport(
        collections=scope,
        documents=census.documents,
        filtered_documents=census.eligible if options.filter is not None else None,
        total_keys=total_keys,
        remaining_keys=max(0, total_keys - options.key_offset - len(keys)),
        keys=keys,
        with_metadata=census.with_metadata,
        pending=census.pending,
        rejected=census.rejected,
        rejected_examples=rejected,
    )


@dataclass(frozen=True)
class CollectionKeys:
    """A collection's most covered keys, for `qmd status`, `collection list` and
    `collection show`, and the MCP status tool: enough for a first look to reveal
    that metadata exists, and what to drill into."""

    collection: str
    documents: int
    with_metadata: int
    pending: int
    total_keys: int
    keys: list[KeyReport]
    """The top keys by coverage, each type with up to `values` values (none by default)."""
    remaining_keys: int


def top_keys(conn: Connection, collections: Sequence[str], n: int = 5, *, values: int = 0) -> list[CollectionKeys]:
    """Each collection's `n` most covered keys with their document counts (and a
    preview of `values` values per type, for `collection show`), all from one
    snapshot. Costs a discovery per collection: linear in the collection's entries."""
    _whole("n", n, least=1)
    _whole("values", values, least=0)
    out = []
    with snapshot(conn):
        for name in dict.fromkeys(collections):
            r = _discover(conn, MetadataOptions([name], key_limit=n, value_limit=max(values, 1)))
            keys = r.keys
            if values == 0:
                keys = [KeyReport(k.key, k.documents, [_without_values(t) for t in k.types]) for k in r.keys]
            out.append(
                CollectionKeys(name, r.documents, r.with_metadata, r.pending, r.total_keys, keys, r.remaining_keys)
            )
    return out


def _without_values(t: TypeReport) -> TypeReport:
    return TypeReport(t.type, t.multi_valued, t.documents, t.distinct_values, [], 0, t.range, t.collections)


# -- text -----------------------------------------------------------------------------


@dataclass(frozen=True)
class OptionNames:
    """How a surface names discovery's options in the report's hints, so each tells its
    user what to type there: the CLI its flags (`CLI_OPTIONS`), MCP its tool's
    parameters. `<n>` stands for a number."""

    key_limit: str
    key_offset: str
    all_keys: str
    value_limit: str
    value_offset: str
    all_values: str
    match: str
    filter: str
    rerun: str
    """How to ask again, e.g. `Run 'qmd collection metadata'`."""

    def value_hint(self) -> str:
        return f"{self.value_limit}, {self.value_offset}, or {self.all_values}"

    def key_hint(self) -> str:
        return f"{self.key_limit}, {self.key_offset}, or {self.all_keys}"

    def no_match(self) -> str:
        return f"No metadata matches. {self.rerun} without {self.match} or {self.filter} to see which keys exist."


CLI_OPTIONS: Final = OptionNames(
    key_limit="--key-limit <n>",
    key_offset="--key-offset <n>",
    all_keys="--all-keys",
    value_limit="--value-limit <n>",
    value_offset="--value-offset <n>",
    all_values="--all-values",
    match="--match",
    filter="--filter",
    rerun="Run 'qmd collection metadata'",
)
VALUE_HINT: Final = CLI_OPTIONS.value_hint()
KEY_HINT: Final = CLI_OPTIONS.key_hint()
NO_MATCH: Final = CLI_OPTIONS.no_match()

# Characters that do not print as themselves: C0, DEL, C1, the line and paragraph
# separators, and the bidirectional controls that reorder what follows them.
_UNPRINTABLE: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# Whitespace other than single spaces between other characters.
_LOOSE_SPACE: Final = re.compile(r"^\s|\s$|\s\s|[^\S ]")
# The compact `value (count), ...` list's own marks, and its tails.
_LIST_MARKS: Final = re.compile(r"[,()]")
_LIST_TAIL: Final = re.compile(r"^(?:\.\.\.|[\d,]+ more)$")


def count_text(n: int) -> str:
    return f"{n:,}"


def _reads_as_other(text: str) -> bool:
    """Whether `text` printed bare could be taken for a number, a boolean or null: by
    JSON (`42`, `true`, `null`, `1e3`), or by the looser readings of Python and YAML
    (`.5`, `1_000`, `0x1F`, `inf`)."""
    try:
        json.loads(text)
        return True
    except ValueError:
        pass
    try:
        float(text)
        return True
    except ValueError:
        pass
    try:
        int(text, 0)
        return True
    except ValueError:
        return text.lower() in ("true", "false", "null", "nan", ".nan", ".inf", "-.inf", "+.inf")


def string_text(text: str) -> str:
    """A string as it prints: bare when that is exactly the value and nothing else,
    else as a JSON string, which is how it is written in a filter. Quoted: the
    empty string, padded or oddly spaced text, quotes and backslashes, what does not
    print as itself, the list's `,` `(` `)`, and text another type could claim."""
    if (
        text
        and '"' not in text
        and "\\" not in text
        and not _UNPRINTABLE.search(text)
        and not _LOOSE_SPACE.search(text)
        and not _LIST_MARKS.search(text)
        and not _LIST_TAIL.match(text)
        and not _reads_as_other(text)
    ):
        return text
    quoted = json.dumps(text, ensure_ascii=False)
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def key_text(key: str) -> str:
    """Keys print bare unless they would not print as themselves, so a header always
    shows the key (`"42"` is a fine key name and prints as 42)."""
    if key and not _UNPRINTABLE.search(key) and not _LOOSE_SPACE.search(key) and '"' not in key:
        return key
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(key, ensure_ascii=False))


def number_text(value: Number) -> str:
    """As JSON writes it, so it can be pasted into a filter; an integral float prints
    as an integer (a median of 3.0 is 3; `eq 3` matches 3.0)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return json.dumps(value)


def value_text(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return string_text(value)
    return number_text(value)


def _docs(n: int) -> str:
    """Padded so `doc` and `docs` rows keep their columns."""
    return "doc " if n == 1 else "docs"


def _more(n: int, noun: str, hint: str) -> str:
    return f"{count_text(n)} more {noun if n == 1 else noun + 's'}, use {hint}"


def _type_label(t: TypeReport) -> str:
    return f"{t.type}[]" if t.multi_valued else t.type


def _booleans(t: TypeReport) -> str:
    by_value = {bool(vc.value): vc.documents for vc in t.values}
    return "  ".join(
        f"{name} {count_text(by_value[flag])}" for flag, name in ((True, "true"), (False, "false")) if flag in by_value
    )


def _range(t: TypeReport) -> str:
    if t.range is None:
        return ""
    r = t.range
    return f"min {number_text(r.min)}  median {number_text(r.median)}  max {number_text(r.max)}"


def _inline(values: Sequence[ValueCount]) -> list[str]:
    return [f"{value_text(vc.value)} ({count_text(vc.documents)})" for vc in values]


def _numbers(t: TypeReport) -> list[ValueCount]:
    """Value order when the window holds the whole distribution (it reads as one),
    else the window's own order, so the most common values stay in view."""
    if len(t.values) == t.distinct_values:
        return sorted(t.values, key=lambda vc: vc.value)
    return t.values


def _single(t: TypeReport) -> list[str]:
    """The body of a key with one type: a line per string, one line of range and one
    of values for numbers, one line for booleans."""
    if t.type == "boolean":
        return [f"  {_booleans(t)}"] if t.values else []
    if t.type == "number":
        lines = [f"  {_range(t)}"] if t.range else []
        if t.values:
            lines.append("  " + "  ".join(_inline(_numbers(t))))
        return lines
    shown = [(value_text(vc.value), count_text(vc.documents)) for vc in t.values]
    if not shown:
        return []
    width = max(len(v) for v, _ in shown)
    counts = max(len(c) for _, c in shown)
    return [f"  {v.ljust(width)}  {c.rjust(counts)}" for v, c in shown]


def _split(types: Sequence[TypeReport], with_collections: bool) -> list[str]:
    """A key whose documents disagree on type: a row per type with its own count and
    a compact summary, and its collections when several are in scope."""
    type_width = max(len(t.type) for t in types)
    docs_width = max(len(count_text(t.documents)) for t in types)
    rows = []
    for t in types:
        if t.type == "boolean":
            summary = _booleans(t)
        elif t.type == "number":
            summary = _range(t)
        else:
            items = _inline(t.values)
            if t.remaining_values:
                items.append(f"{count_text(t.remaining_values)} more")
            summary = ", ".join(items)
        rows.append(
            f"  {t.type.ljust(type_width)}  {count_text(t.documents).rjust(docs_width)} {_docs(t.documents)}  {summary}"
        )
    if not with_collections:
        return [row.rstrip() for row in rows]
    width = max(len(row) for row in rows)
    return [f"{row.ljust(width)}  {', '.join(t.collections)}" for row, t in zip(rows, types, strict=True)]


def _block(k: KeyReport, denominator: int, with_collections: bool, names: OptionNames) -> str:
    label = " | ".join(_type_label(t) for t in k.types)
    header = [key_text(k.key), label, f"{count_text(k.documents)} of {count_text(denominator)} documents"]
    if len(k.types) == 1:
        t = k.types[0]
        if t.type != "boolean":
            header.append(f"{count_text(t.distinct_values)} distinct")
        body = _single(t)
    else:
        body = _split(k.types, with_collections)
    remaining = sum(t.remaining_values for t in k.types)
    tail = [_more(remaining, "value", names.value_hint())] if remaining else []
    return "\n".join(["  ".join(header), *body, *tail])


def render(
    report: MetadataReport,
    *,
    filtered: bool,
    matched: bool = False,
    key_offset: int = 0,
    names: OptionNames = CLI_OPTIONS,
) -> str:
    """The text for a report (no trailing newline): the `filter:` line when a filter
    was given, one block per key in coverage order, and the remainder of each windowed
    list with the options that reach it. An empty report says why in one line.
    `matched`: a match was given (an empty answer then means nothing matched);
    `key_offset`: the offset asked for, named when it is past the last key; `names`:
    how the surface showing the text spells its options (the CLI's flags by default)."""
    blocks = []
    if filtered and report.filtered_documents is not None:
        blocks.append(f"filter: {count_text(report.filtered_documents)} of {count_text(report.documents)} documents")
    if report.total_keys == 0:
        if filtered or matched:
            blocks.append(names.no_match())
        elif report.documents == 0:
            blocks.append("No documents in scope.")
        else:
            n = report.documents
            blocks.append(
                f"No metadata in scope: none of the {count_text(n)} document{'' if n == 1 else 's'}"
                " declares a 'qmd: metadata:' block in its frontmatter."
            )
    elif not report.keys:
        total = report.total_keys
        noun = "key" if total == 1 else "keys"
        at = names.key_offset.replace("<n>", count_text(key_offset))
        blocks.append(f"No keys at {at}, {count_text(total)} {noun} in total.")
    denominator = report.filtered_documents if report.filtered_documents is not None else report.documents
    with_collections = len(report.collections) > 1
    blocks.extend(_block(k, denominator, with_collections, names) for k in report.keys)
    if report.remaining_keys:
        blocks.append(_more(report.remaining_keys, "key", names.key_hint()))
    return "\n\n".join(blocks)


def warnings(report: MetadataReport) -> list[str]:
    """What the answer cannot see, for stderr: documents awaiting extraction and
    documents whose metadata was rejected, with the first few reasons."""
    lines = []
    if report.pending:
        n = report.pending
        lines.append(
            f"Warning: {count_text(n)} document{'' if n == 1 else 's'} in scope not yet read for metadata"
            " (excluded until 'qmd update' runs)"
        )
    if report.rejected:
        n = report.rejected
        lines.append(
            f"Warning: {count_text(n)} document{'' if n == 1 else 's'} in scope with rejected metadata (excluded):"
        )
        lines.extend(f"  {r.collection}/{r.path}: {r.reason}" for r in report.rejected_examples)
        if n > len(report.rejected_examples):
            lines.append(f"  and {count_text(n - len(report.rejected_examples))} more")
    return lines


def _shell_quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def render_key_names(ck: CollectionKeys) -> str:
    """The `collection list` line: `  Metadata: status, priority, topics, +3 more`
    (empty when the collection has no metadata)."""
    if not ck.total_keys:
        return ""
    names = ", ".join(key_text(k.key) for k in ck.keys)
    more = ck.total_keys - len(ck.keys)
    return f"  Metadata: {names}" + (f", +{count_text(more)} more" if more > 0 else "")


def _preview(k: KeyReport, drill_down: str) -> str:
    """One line of values: strings as `value (count), ...` (nothing when every value is
    held by one document, as a list of unique values says nothing), numbers as a
    range, booleans as their two counts, and a type conflict as where to look."""
    if len(k.types) > 1:
        match = json.dumps(
            {"field": "key", "operator": "eq", "value": k.key}, ensure_ascii=False, separators=(",", ":")
        )
        return f"types disagree, see: {drill_down} --match {_shell_quoted(match)}"
    t = k.types[0]
    if t.type == "boolean":
        return _booleans(t).replace("  ", ", ")
    if t.type == "number":
        r = t.range
        return "" if r is None else f"{number_text(r.min)} to {number_text(r.max)}, median {number_text(r.median)}"
    if t.distinct_values == t.documents or not t.values:
        return ""
    items = _inline(t.values)
    if t.remaining_values:
        items.append("...")
    return ", ".join(items)


def render_overview(ck: CollectionKeys) -> str:
    """The `collection show` block: a coverage line, a row per top key with a value
    preview (from `top_keys(..., values=3)`), and where the rest is."""
    drill_down = f"qmd collection metadata {ck.collection}"
    pending = f" ({count_text(ck.pending)} pending extraction)" if ck.pending else ""
    if not ck.total_keys:
        return f"  Metadata: none{pending}"
    noun = "key" if ck.total_keys == 1 else "keys"
    lines = [
        f"  Metadata: {count_text(ck.total_keys)} {noun}, {count_text(ck.with_metadata)} of"
        f" {count_text(ck.documents)} documents{pending}"
    ]
    labels = [" | ".join(_type_label(t) for t in k.types) for k in ck.keys]
    distinct = [sum(t.distinct_values for t in k.types) for k in ck.keys]
    key_w = max(len(key_text(k.key)) for k in ck.keys)
    label_w = max(len(label) for label in labels)
    docs_w = max(len(count_text(k.documents)) for k in ck.keys)
    distinct_w = max(len(count_text(d)) for d in distinct)
    for k, label, d in zip(ck.keys, labels, distinct, strict=True):
        cols = [
            key_text(k.key).ljust(key_w),
            label.ljust(label_w),
            f"{count_text(k.documents).rjust(docs_w)} {_docs(k.documents)}",
            f"{count_text(d).rjust(distinct_w)} distinct",
        ]
        preview = _preview(k, drill_down)
        if preview:
            cols.append(preview)
        lines.append("    " + "  ".join(cols))
    if ck.remaining_keys:
        n = ck.remaining_keys
        lines.append(f"    {count_text(n)} more {'key' if n == 1 else 'keys'}, see '{drill_down}'")
    return "\n".join(lines)
