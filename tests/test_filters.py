"""The metadata filter language: every rule, checked in real SQLite and against the
Python evaluator, every parse error with its path, the caps, and a seeded property
test holding the SQL to the evaluator over random documents, filters and matches."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from qmd.server.errors import InvalidInput
from qmd.server.search.filters import (
    MAX_DEPTH,
    MAX_NODES,
    MAX_PARAMS,
    MAX_VALUES,
    And,
    BindingBudgetError,
    Condition,
    Filter,
    FilterError,
    Not,
    Or,
    check_binding_budget,
    entry_matches,
    filter_sql,
    match_sql,
    matches,
    parse_filter,
    parse_match,
)
from qmd.server.store.db import sqlite3
from qmd.server.store.sqlite import Store
from qmd.server.text.frontmatter import Scalar, value_type

Meta = dict[str, Any]

DOCS: dict[str, Meta] = {
    "pub": {"status": "published", "priority": 3, "reviewed": True, "topics": ["typescript", "programming"]},
    "draft": {"status": "draft", "priority": 1, "reviewed": False, "topics": ["sql", "SQLite"]},
    "strprio": {"status": "Published", "priority": "high", "topics": ["Typescript"]},
    "floatprio": {"priority": 3.0, "topics": ["ä"], "audience": "internal"},
    "bools": {"flags": [True, False], "reviewed": True},
    "numstr": {"code": "3", "priority": [2, 5]},
    "umlaut": {"name": "Äpfel", "topics": ["Ä"]},
    "abc": {"word": "ABC"},
    "nul": {"name": "a\x00b", "tags": ["", "x\x00y"], "K\x00Ey": "v"},
    "empty": {},
}
HIDDEN: dict[str, tuple[int, int | None, Meta]] = {
    "inactive": (0, 1, {"status": "published"}),
    "pending": (1, None, {}),
    "rejected": (1, 2, {}),
}
"""Documents the caller's `active = 1 AND meta_state IN (0, 1)` keeps out: (active, meta_state, metadata)."""


def ascii_lower(text: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)


def rows_of(meta: Meta) -> list[tuple[str, str, Scalar, str | None, int]]:
    """The rows extraction stores: one per value, an array as a set of them (the
    folding written out again here, so a filter's folding is checked against it)."""
    out = []
    for key, raw in meta.items():
        many = isinstance(raw, list)
        for v in dict.fromkeys(raw) if many else [raw]:
            stored = int(v) if isinstance(v, bool) else v
            out.append((key, value_type(v), stored, ascii_lower(v) if isinstance(v, str) else None, int(many)))
    return out


def fill(store: Store, docs: dict[str, tuple[int, int | None, Meta]]) -> dict[str, int]:
    def write(conn: sqlite3.Connection) -> dict[str, int]:
        conn.execute("INSERT OR IGNORE INTO content(hash, doc, created_at) VALUES ('h', '', '')")
        ids = {}
        for path, (active, state, meta) in docs.items():
            cur = conn.execute(
                "INSERT INTO documents(collection, path, title, hash, created_at, modified_at, active, meta_state)"
                " VALUES ('c', ?, ?, 'h', '', '', ?, ?)",
                (path, path, active, state),
            )
            assert cur.lastrowid is not None
            ids[path] = cur.lastrowid
            conn.executemany(
                "INSERT OR IGNORE INTO document_metadata(doc_id, key, type, value, folded, multi)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(cur.lastrowid, *row) for row in rows_of(meta)],
            )
        return ids

    return store.write(write)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store(tmp_path_factory.mktemp("filters") / "i.sqlite")
    fill(s, {name: (1, 1 if meta else 0, meta) for name, meta in DOCS.items()} | HIDDEN)
    yield s
    s.close()


def sql_docs(store: Store, f: Filter) -> set[str]:
    where, params = filter_sql(f)
    with store.read() as conn:
        rows = conn.execute(
            f"SELECT d.path FROM documents d WHERE d.active = 1 AND d.meta_state IN (0, 1) AND {where}", params
        ).fetchall()
    return {r[0] for r in rows}


def docs(store: Store, raw: object) -> set[str]:
    """The documents a filter keeps, from SQL, after checking Python agrees."""
    f = parse_filter(raw)
    found = sql_docs(store, f)
    assert found == {name for name, meta in DOCS.items() if matches(f, meta)}, raw
    return found


def cond(field: str, op: str, value: object, ci: bool | None = None) -> dict[str, object]:
    out: dict[str, object] = {"field": field, "operator": op, "value": value}
    if ci is not None:
        out["caseInsensitive"] = ci
    return out


ALL = set(DOCS)


# -- the rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (cond("status", "eq", "published"), {"pub"}),
        (cond("status", "eq", "published", True), {"pub", "strprio"}),
        (cond("priority", "eq", 3), {"pub", "floatprio"}),  # 3 == 3.0
        (cond("priority", "eq", 3.0), {"pub", "floatprio"}),
        (cond("priority", "eq", "3"), set()),
        (cond("code", "eq", 3), set()),
        (cond("code", "eq", "3"), {"numstr"}),
        (cond("reviewed", "eq", True), {"pub", "bools"}),
        (cond("reviewed", "eq", 1), set()),  # a boolean is never a number
        (cond("priority", "eq", True), set()),
        (cond("flags", "eq", False), {"bools"}),
        (cond("topics", "eq", "typescript"), {"pub"}),
        (cond("word", "eq", "abc"), set()),
        (cond("word", "eq", "abc", True), {"abc"}),
        (cond("topics", "eq", "ä", True), {"floatprio"}),  # Ä is not folded to ä
        (cond("topics", "eq", "Ä", True), {"umlaut"}),
        (cond("name", "eq", "a\x00b"), {"nul"}),
        (cond("name", "eq", "a"), set()),
    ],
)
def test_eq_is_typed_and_exact(store: Store, raw: object, expected: set[str]) -> None:
    assert docs(store, raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (cond("status", "ne", "published"), {"draft", "strprio"}),  # documents without status: no
        (cond("status", "ne", "PUBLISHED", True), {"draft"}),
        # a string priority is not a number: strprio has none of the operand's type
        (cond("priority", "ne", 3), {"draft", "numstr"}),
        (cond("priority", "ne", "high"), set()),
        (cond("priority", "ne", "low"), {"strprio"}),
        (cond("reviewed", "ne", True), {"draft"}),
        (cond("reviewed", "ne", 1), set()),
        (cond("flags", "ne", True), set()),  # one element equals: the set does not match
        (cond("topics", "ne", "sql"), {"pub", "strprio", "floatprio", "umlaut"}),
        (cond("status", "nin", ["draft", "archived"]), {"pub", "strprio"}),
        (cond("priority", "nin", [3]), {"draft", "numstr"}),
        # several operand types: an element of one of them is enough
        (cond("priority", "nin", [3, "low"]), {"draft", "strprio", "numstr"}),
        (cond("priority", "nin", [1, 2, 3]), set()),
        (cond("topics", "nin", ["TYPESCRIPT"], True), {"draft", "floatprio", "umlaut"}),
        (cond("missing", "ne", "x"), set()),
        (cond("missing", "nin", ["x", 1, True]), set()),
    ],
)
def test_ne_and_nin_need_the_operand_type_and_no_equal_element(store: Store, raw: object, expected: set[str]) -> None:
    assert docs(store, raw) == expected


def test_missing_keys_join_ne_through_exists_false(store: Store) -> None:
    either = {"operator": "or", "operands": [cond("status", "ne", "published"), cond("status", "exists", False)]}
    assert docs(store, either) == ALL - {"pub"}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (cond("priority", "gt", 2), {"pub", "floatprio", "numstr"}),
        (cond("priority", "gte", 3), {"pub", "floatprio", "numstr"}),
        (cond("priority", "gt", 3), {"numstr"}),
        (cond("priority", "lt", 2), {"draft"}),
        (cond("priority", "lt", 2.5), {"draft", "numstr"}),
        (cond("priority", "lte", 1.0), {"draft"}),
        (cond("priority", "gt", 2.5), {"pub", "floatprio", "numstr"}),
        (cond("priority", "gt", "a"), {"strprio"}),  # only the string side of a mixed key
        (cond("code", "gt", 1), set()),
        # BINARY order: uppercase sorts before lowercase, non-ASCII after both
        (cond("status", "lt", "Z"), {"strprio"}),
        (cond("status", "lt", "Z", True), {"pub", "draft", "strprio"}),
        (cond("name", "gt", "Z"), {"umlaut", "nul"}),
        (cond("name", "lt", "a\x00c"), {"nul"}),
        (cond("name", "gt", "a"), {"umlaut", "nul"}),  # "a\0b" > "a": longer with an equal start
        (cond("reviewed", "gt", 0), set()),  # booleans are not numbers
    ],
)
def test_ordering_is_numeric_or_bytewise_within_one_type(store: Store, raw: object, expected: set[str]) -> None:
    assert docs(store, raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (cond("status", "in", ["draft", "Published"]), {"draft", "strprio"}),
        (cond("priority", "in", [3, "high"]), {"pub", "floatprio", "strprio"}),
        (cond("priority", "in", [5, 5.0, 5]), {"numstr"}),
        (cond("topics", "in", ["TYPESCRIPT"], True), {"pub", "strprio"}),
        (cond("reviewed", "in", [1, "true"]), set()),
        (cond("topics", "all", ["typescript", "programming"]), {"pub"}),
        (cond("topics", "all", ["typescript", "sql"]), set()),
        (cond("topics", "all", ["typescript", "TypeScript"], True), {"pub", "strprio"}),
        (cond("flags", "all", [True, False]), {"bools"}),
        (cond("priority", "all", [2, 5.0]), {"numstr"}),
        (cond("priority", "all", [2, "2"]), set()),
    ],
)
def test_membership_treats_arrays_as_sets(store: Store, raw: object, expected: set[str]) -> None:
    assert docs(store, raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (cond("topics", "prefix", "sql"), {"draft"}),
        (cond("topics", "prefix", "SQL"), {"draft"}),
        (cond("topics", "prefix", "SQL", True), {"draft"}),
        (cond("status", "prefix", "pub"), {"pub"}),
        (cond("status", "prefix", "pub", True), {"pub", "strprio"}),
        (cond("name", "prefix", "Ä"), {"umlaut"}),
        (cond("name", "prefix", "ä", True), set()),
        (cond("name", "suffix", "pfel"), {"umlaut"}),
        (cond("name", "suffix", "PFEL", True), {"umlaut"}),
        (cond("name", "suffix", "Äpfel"), {"umlaut"}),
        (cond("name", "suffix", "xÄpfel"), set()),
        (cond("name", "contains", "\x00"), {"nul"}),
        (cond("name", "prefix", "a\x00"), {"nul"}),
        (cond("tags", "suffix", "\x00y"), {"nul"}),
        (cond("tags", "contains", "x\x00z"), set()),
        (cond("word", "contains", "bc", True), {"abc"}),
        (cond("code", "contains", "3"), {"numstr"}),
        (cond("priority", "contains", "3"), set()),  # numbers are not text
        (cond("priority", "prefix", "h"), {"strprio"}),
        # an empty operand matches every string value, and nothing else
        (cond("topics", "contains", ""), {"pub", "draft", "strprio", "floatprio", "umlaut"}),
        (cond("priority", "prefix", ""), {"strprio"}),
        (cond("tags", "suffix", ""), {"nul"}),
    ],
)
def test_text_operators_match_strings_only(store: Store, raw: object, expected: set[str]) -> None:
    assert docs(store, raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (cond("priority", "type", "number"), {"pub", "draft", "floatprio", "numstr"}),
        (cond("priority", "type", "string"), {"strprio"}),
        (cond("priority", "type", "boolean"), set()),
        (cond("flags", "type", "boolean"), {"bools"}),
        (cond("status", "type", "string", True), {"pub", "draft", "strprio"}),
        (cond("audience", "exists", True), {"floatprio"}),
        (cond("audience", "exists", False), ALL - {"floatprio"}),
        (cond("missing", "exists", False), ALL),
    ],
)
def test_type_and_exists(store: Store, raw: object, expected: set[str]) -> None:
    assert docs(store, raw) == expected


def test_not_is_plain_negation_and_keeps_documents_without_the_key(store: Store) -> None:
    assert docs(store, {"operator": "not", "operand": cond("audience", "eq", "internal")}) == ALL - {"floatprio"}
    assert docs(store, {"operator": "not", "operand": cond("status", "ne", "draft")}) == ALL - {"pub", "strprio"}
    twice = {"operator": "not", "operand": {"operator": "not", "operand": cond("priority", "gt", 2)}}
    assert docs(store, twice) == {"pub", "floatprio", "numstr"}


def test_the_seed_example_composes(store: Store) -> None:
    raw = {
        "operator": "and",
        "operands": [
            cond("topics", "all", ["typescript", "programming"]),
            cond("status", "nin", ["draft", "archived"]),
            {"operator": "or", "operands": [cond("priority", "gte", 3), cond("reviewed", "eq", True)]},
            cond("topics", "prefix", "TYPE", True),
            {"operator": "not", "operand": cond("audience", "eq", "internal")},
        ],
    }
    assert docs(store, raw) == {"pub"}
    assert docs(store, json.dumps(raw)) == {"pub"}


def test_documents_the_caller_excludes_never_come_back(store: Store) -> None:
    """Pending and rejected documents have no rows, so `not`/`exists false` would
    admit them; the caller's clause keeps them out (and the inactive one too)."""
    for raw in (cond("x", "exists", False), {"operator": "not", "operand": cond("status", "eq", "x")}):
        assert not sql_docs(store, parse_filter(raw)) & set(HIDDEN)
    assert "inactive" not in sql_docs(store, parse_filter(cond("status", "eq", "published")))


@pytest.mark.parametrize(
    "raw",
    [
        cond("a", "eq", "x"),
        cond("a", "eq", "x", True),
        cond("a", "nin", ["x", 3]),
        cond("a", "all", [1, 2]),
        cond("a", "gte", 2),
        cond("a", "lt", "x", True),
        cond("a", "prefix", "ab"),
        cond("a", "prefix", "ab", True),
        cond("a", "contains", "b"),
        cond("a", "suffix", "b"),
        cond("a", "type", "boolean"),
        cond("a", "exists", False),
    ],
)
def test_every_condition_seeks_an_index(store: Store, raw: object) -> None:
    where, params = filter_sql(parse_filter(raw))
    with store.read() as conn:
        plan = [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN SELECT d.id FROM documents d WHERE {where}", params)]
    reads = [step for step in plan if "document_metadata" in step]
    assert reads and all(step.startswith("SEARCH document_metadata USING") and "INDEX" in step for step in reads), plan


def test_the_ast_is_typed() -> None:
    f = parse_filter(
        {
            "operator": "and",
            "operands": [
                cond("s", "eq", "x", True),
                {"operator": "not", "operand": cond("t", "in", ["a", 1, True])},
                {"operator": "or", "operands": [cond("n", "exists", False)]},
            ],
        }
    )
    assert f == And(
        (
            Condition("s", "eq", "x", True),
            Not(Condition("t", "in", ("a", 1, True))),
            Or((Condition("n", "exists", False),)),
        )
    )
    assert parse_filter('{"field": "s", "operator": "eq", "value": "x"}') == Condition("s", "eq", "x")


def test_python_never_lets_a_boolean_pass_for_a_number() -> None:
    for meta, raw in [
        ({"n": 1}, cond("n", "eq", True)),
        ({"b": True}, cond("b", "eq", 1)),
        ({"b": True}, cond("b", "in", [1])),
        ({"b": [True]}, cond("b", "gt", 0)),
        ({"b": False}, cond("b", "lte", 0)),
        ({"n": 0}, cond("n", "nin", [False])),
    ]:
        assert not matches(parse_filter(raw), meta), (meta, raw)
    assert entry_matches(parse_match(cond("value", "eq", True)), "k", "boolean", 1)
    assert not entry_matches(parse_match(cond("value", "eq", 1)), "k", "boolean", 1)


# -- matches over metadata entries ----------------------------------------------------

Entry = tuple[int, str, str, Scalar]


def entries(store: Store) -> list[Entry]:
    with store.read() as conn:
        return [tuple(r) for r in conn.execute("SELECT doc_id, key, type, value FROM document_metadata")]


def match_rows(store: Store, raw: object) -> set[Entry]:
    """The entries a match selects, from SQL, after checking Python agrees."""
    f = parse_match(raw)
    where, params = match_sql(f)
    with store.read() as conn:
        found = {
            tuple(r)
            for r in conn.execute(f"SELECT doc_id, key, type, value FROM document_metadata m WHERE {where}", params)
        }
    assert found == {e for e in entries(store) if entry_matches(f, e[1], e[2], e[3])}, raw
    return found


def keys_of(rows: set[Entry]) -> set[str]:
    return {r[1] for r in rows}


def test_match_on_the_key(store: Store) -> None:
    assert keys_of(match_rows(store, cond("key", "eq", "topics"))) == {"topics"}
    assert keys_of(match_rows(store, cond("key", "eq", "TOPICS", True))) == {"topics"}
    assert keys_of(match_rows(store, cond("key", "prefix", "pri"))) == {"priority"}
    assert keys_of(match_rows(store, cond("key", "in", ["tags", "topics", "labels"]))) == {"tags", "topics"}
    assert keys_of(match_rows(store, cond("key", "eq", "k\x00ey", True))) == {"K\x00Ey"}
    assert match_rows(store, cond("key", "eq", "k\x00ez", True)) == set()
    assert keys_of(match_rows(store, cond("key", "suffix", "EY", True))) == {"K\x00Ey"}
    # the key is a string: a number never equals it, and `ne` needs a string operand
    assert match_rows(store, cond("key", "eq", 3)) == set()
    assert match_rows(store, cond("key", "ne", 3)) == set()
    everything = set(entries(store))
    assert match_rows(store, {"operator": "not", "operand": cond("key", "eq", 3)}) == everything
    assert match_rows(store, cond("key", "type", "string")) == everything
    assert match_rows(store, cond("key", "type", "number")) == set()


def test_match_on_the_value(store: Store) -> None:
    assert keys_of(match_rows(store, cond("value", "eq", "published"))) == {"status"}
    assert keys_of(match_rows(store, cond("value", "type", "boolean"))) == {"reviewed", "flags"}
    above = {"operator": "and", "operands": [cond("key", "eq", "priority"), cond("value", "gte", 3)]}
    assert sorted(r[3] for r in match_rows(store, above)) == [3, 3.0, 5]
    numeric = {"operator": "and", "operands": [cond("key", "eq", "priority"), cond("value", "type", "number")]}
    assert len(match_rows(store, numeric)) == 5
    assert all(r[2] == "number" for r in match_rows(store, cond("value", "ne", 3)))
    # negating a case-insensitive test keeps the numbers: the expression is never NULL
    ci = cond("value", "eq", "PUBLISHED", True)
    assert keys_of(match_rows(store, ci)) == {"status"}
    assert match_rows(store, {"operator": "not", "operand": ci}) == set(entries(store)) - match_rows(store, ci)
    # and so is a suffix test on the empty string
    assert "" in {r[3] for r in match_rows(store, {"operator": "not", "operand": cond("value", "suffix", "x")})}


def test_a_filter_and_a_match_share_one_statement(store: Store) -> None:
    f = parse_filter(cond("status", "eq", "published", True))
    m = parse_match(cond("key", "eq", "topics"))
    fw, fp = filter_sql(f)
    mw, mp = match_sql(m)
    check_binding_budget(len(fp) + len(mp))
    with store.read() as conn:
        rows = conn.execute(
            "SELECT m.value FROM document_metadata m JOIN documents d ON d.id = m.doc_id"
            f" WHERE d.active = 1 AND d.meta_state IN (0, 1) AND {fw} AND {mw}",
            [*fp, *mp],
        ).fetchall()
    assert sorted(r[0] for r in rows) == ["Typescript", "programming", "typescript"]


# -- parse errors ---------------------------------------------------------------------

OK = cond("a", "eq", 1)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (None, "filter: expected an object (a condition or an and/or/not group), got null"),
        ([OK], "filter: expected an object (a condition or an and/or/not group), got an array"),
        ({"field": "a", "value": 1}, "filter.operator: missing"),
        ({"status": "published"}, "filter.operator: missing: every node names its operator (there is no implicit AND"),
        ({"operator": 3}, "filter.operator: expected a string, got a number"),
        (
            cond("a", "equals", 1),
            "filter.operator: unknown operator 'equals' (expected one of: and, or, not, eq, ne, gt, gte, lt, lte,"
            " in, nin, all, contains, prefix, suffix, type, exists)",
        ),
        ({"operator": "$eq", "field": "a", "value": 1}, "filter.operator: unknown operator '$eq'"),
        ({"operator": "and"}, "filter.operands: missing"),
        (
            {"operator": "and", "operands": []},
            "filter.operands: expected a non-empty array of nodes for 'and', got an empty array",
        ),
        (
            {"operator": "or", "operands": OK},
            "filter.operands: expected a non-empty array of nodes for 'or', got an object",
        ),
        ({"operator": "not"}, "filter.operand: missing"),
        ({"operator": "not", "operand": [OK]}, "filter.operand: expected an object"),
        ({"operator": "not", "operands": [OK]}, "filter: unknown key 'operands' in 'not' (allowed: operator, operand)"),
        ({"operator": "and", "operands": [OK], "field": "a"}, "filter: unknown key 'field' in 'and'"),
        ({**OK, "extra": 1}, "filter: unknown key 'extra' in 'eq' (allowed: field, operator, value, caseInsensitive)"),
        ({**OK, "$eq": 1}, "filter: unknown key '$eq' in 'eq' (there are no $ shorthands)"),
        (
            {"operator": "and", "operands": [OK, OK, cond("x", "in", [])]},
            "filter.operands[2].value: expected a non-empty array for 'in', got an empty array",
        ),
        (
            {"operator": "and", "operands": [OK, {"operator": "not", "operand": cond("x", "nin", "a")}]},
            "filter.operands[1].operand.value: expected a non-empty array for 'nin', got a string",
        ),
        (cond("x", "all", {}), "filter.value: expected a non-empty array for 'all', got an object"),
        ({"operator": "eq", "value": 1}, "filter.field: missing"),
        (cond("", "eq", 1), "filter.field: expected a non-empty string (a metadata key), got ''"),
        (
            {"field": 3, "operator": "eq", "value": 1},
            "filter.field: expected a non-empty string (a metadata key), got a number",
        ),
        ({"field": "a", "operator": "eq"}, "filter.value: missing: 'eq' compares against a value"),
        (cond("a", "eq", None), "filter.value: expected a string, a number or a boolean, got null"),
        (cond("a", "ne", [1]), "filter.value: expected a string, a number or a boolean, got an array"),
        (cond("a", "eq", {}), "filter.value: expected a string, a number or a boolean, got an object"),
        (cond("a", "in", [1, None]), "filter.value[1]: expected a string, a number or a boolean, got null"),
        (cond("a", "in", [1, [2]]), "filter.value[1]: expected a string, a number or a boolean, got an array"),
        (cond("a", "gt", True), "filter.value: a boolean has no order: 'gt' takes a number or a string"),
        (cond("a", "lte", None), "filter.value: expected a string, a number or a boolean, got null"),
        (cond("a", "contains", 3), "filter.value: expected a string for 'contains', got a number"),
        (cond("a", "suffix", ["x"]), "filter.value: expected a string for 'suffix', got an array"),
        (
            cond("a", "type", "text"),
            'filter.value: expected "string", "number" or "boolean" for \'type\', got \'text\'',
        ),
        (cond("a", "type", 1), 'filter.value: expected "string", "number" or "boolean" for \'type\', got a number'),
        (cond("a", "exists", "yes"), "filter.value: expected true or false for 'exists', got 'yes'"),
        (cond("a", "exists", 1), "filter.value: expected true or false for 'exists', got a number"),
        (cond("a", "eq", float("nan")), "filter.value: nan is not a finite number"),
        (cond("a", "in", [float("inf")]), "filter.value[0]: inf is not a finite number"),
        (cond("a", "eq", 2**63), "filter.value: a number outside the 64-bit integer range"),
        (cond("a", "eq", "\ud800"), "filter.value: not valid Unicode text (it holds a lone surrogate)"),
        (cond("a", "eq", 3, True), "filter.caseInsensitive: applies only to string values, and this value is a number"),
        (cond("a", "eq", 3, False), "filter.caseInsensitive: applies only to string values"),
        (
            cond("a", "exists", True, True),
            "filter.caseInsensitive: applies only to string values, and this value is a boolean",
        ),
        (
            cond("a", "in", ["x", 1], True),
            "filter.caseInsensitive: applies only to string values, and this array holds others",
        ),
        (
            {**cond("a", "eq", "x"), "caseInsensitive": "yes"},
            "filter.caseInsensitive: expected true or false, got 'yes'",
        ),
        (
            {**cond("a", "eq", "x"), "caseInsensitive": 1},
            "filter.caseInsensitive: expected true or false, got a number",
        ),
        ("{", "filter: not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
        (
            '{"field": "a", "field": "b", "operator": "eq", "value": 1}',
            "filter: the key 'field' appears twice in one object",
        ),
        ('"eq"', "filter: expected an object (a condition or an and/or/not group), got a string"),
        ("[" * 100_000, "filter: nested far deeper than the 32 levels a filter may have"),
    ],
)
def test_filter_errors_name_the_path(raw: object, message: str) -> None:
    with pytest.raises(FilterError) as e:
        parse_filter(raw)
    assert str(e.value).startswith(message), str(e.value)
    assert isinstance(e.value, InvalidInput)
    assert e.value.detail["path"] == message.split(":", 1)[0]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (cond("status", "eq", "x"), 'match.field: expected "key" or "value" (a match tests one entry), got \'status\''),
        (cond("key", "exists", True), "match.operator: 'exists' has no meaning for a single entry"),
        (
            {"operator": "and", "operands": [cond("key", "eq", "t"), cond("value", "all", ["a"])]},
            "match.operands[1].operator: 'all' has no meaning for a single entry",
        ),
        (
            cond("key", "equals", 1),
            "match.operator: unknown operator 'equals' (expected one of: and, or, not, eq, ne,"
            " gt, gte, lt, lte, in, nin, contains, prefix, suffix, type)",
        ),
        (cond("value", "eq", 1, True), "match.caseInsensitive: applies only to string values"),
        ("[", "match: not valid JSON"),
    ],
)
def test_match_errors_name_the_path(raw: object, message: str) -> None:
    with pytest.raises(FilterError) as e:
        parse_match(raw)
    assert str(e.value).startswith(message), str(e.value)


def nested(depth: int, leaf: dict[str, object] = OK) -> dict[str, object]:
    """`leaf` at `depth`, under `not`s."""
    node = leaf
    for _ in range(depth - 1):
        node = {"operator": "not", "operand": node}
    return node


def test_depth_is_capped_without_recursing_into_the_rest() -> None:
    parse_filter(nested(MAX_DEPTH))
    for depth in (MAX_DEPTH + 1, 10_000):
        with pytest.raises(FilterError) as e:
            parse_filter(nested(depth))
        assert str(e.value) == "filter" + ".operand" * MAX_DEPTH + f": nested more than {MAX_DEPTH} levels deep"
    deep_text = '{"operator": "not", "operand": ' * 5_000 + json.dumps(OK) + "}" * 5_000
    with pytest.raises(FilterError, match="^filter: nested far deeper"):
        parse_filter(deep_text)


def test_a_megabyte_filter_is_refused_quickly() -> None:
    big_text = json.dumps(cond("a", "in", ["x" * 100] * 10_000))
    huge = [cond("a", "in", list(range(1_000_000))), cond("a", "eq", "x" * 1_000_000)]
    start = time.perf_counter()
    with pytest.raises(FilterError, match=r"^filter: more than 524288 bytes of JSON"):
        parse_filter(big_text)
    with pytest.raises(FilterError, match=rf"^filter.value: the filter has more than {MAX_VALUES} values"):
        parse_filter(huge[0])
    with pytest.raises(FilterError, match=r"^filter.value: the filter's strings exceed 262144 bytes"):
        parse_filter(huge[1])
    wide = {"operator": "or", "operands": [OK] * 1_000_000}
    with pytest.raises(FilterError, match=rf"^filter.operands: the filter has more than {MAX_NODES} nodes"):
        parse_filter(wide)
    assert time.perf_counter() - start < 0.5


def test_node_value_and_string_caps() -> None:
    parse_filter({"operator": "or", "operands": [OK] * (MAX_NODES - 1)})
    with pytest.raises(FilterError, match=r"^filter.operands: the filter has more than 1024 nodes"):
        parse_filter({"operator": "or", "operands": [OK] * MAX_NODES})
    deep_wide = {"operator": "and", "operands": [{"operator": "or", "operands": [OK] * 600}] * 2}
    with pytest.raises(FilterError, match=r"^filter.operands\[1\].operands: the filter has more than 1024 nodes"):
        parse_filter(deep_wide)
    parse_filter(cond("a", "in", list(range(MAX_VALUES))))
    with pytest.raises(FilterError, match=r"^filter.value: the filter has more than 4096 values"):
        parse_filter(cond("a", "in", list(range(MAX_VALUES + 1))))
    split = {"operator": "and", "operands": [cond("a", "in", list(range(MAX_VALUES))), cond("b", "eq", 1)]}
    with pytest.raises(FilterError, match=r"^filter.operands\[1\].value: the filter has more than 4096 values"):
        parse_filter(split)
    many = {"operator": "and", "operands": [cond("a", "eq", "é" * 60_000)] * 3}
    with pytest.raises(FilterError, match=r"^filter.operands\[2\].value: the filter's strings exceed"):
        parse_filter(many)


def test_the_binding_budget() -> None:
    all_values = cond("a", "all", list(range(MAX_VALUES)))  # two parameters a value
    _, fp = filter_sql(parse_filter(all_values))
    assert len(fp) == MAX_PARAMS
    with pytest.raises(BindingBudgetError) as e:
        parse_filter({"operator": "and", "operands": [all_values, cond("b", "exists", True)]})
    assert str(e.value).startswith(f"filter: binds {MAX_PARAMS + 1} SQL parameters, more than the binding budget")
    _, mp = match_sql(parse_match(cond("key", "eq", "a")))
    with pytest.raises(BindingBudgetError, match="^the filter and the match together: binds 8193 SQL parameters"):
        check_binding_budget(len(fp) + len(mp))


def test_a_filter_at_the_caps_runs(store: Store) -> None:
    """SQLite limits an expression's depth to 1000: a wide group is nested as a tree."""
    wide = parse_filter({"operator": "or", "operands": [cond(f"k{i}", "prefix", "x", True) for i in range(1023)]})
    assert sql_docs(store, wide) == set()
    keys = {"operator": "or", "operands": [cond("key", "suffix", f"K{i}", True) for i in range(300)]}
    deep = parse_match(nested(MAX_DEPTH - 1, keys))
    where, params = match_sql(deep)
    with store.read() as conn:
        conn.execute(f"SELECT count(*) FROM document_metadata m WHERE {where}", params).fetchone()


# -- SQL == Python over random documents, filters and matches -------------------------

KEYS = ["a", "b", "c", "Tag", "k\x00"]
STRINGS = [
    "", "a", "A", "b", "ab", "AB", "aB", "abc", "ä", "Ä", "é", "z", "Z", "3", "true",
    "a\x00", "a\x00b", "\ud7ff", "\ud7ffa", "\ue000", "\U0010ffff", "x\U0010ffff", "x\U0010ffffy",
]  # fmt: skip
NUMBERS: list[Scalar] = [0, 1, 2, 3, 3.0, 2.5, -1, -0.5, 10**12, 2**53, 2**53 + 1, float(2**53)]


def rand_scalar(rng: random.Random, kind: str | None = None, strings: list[str] = STRINGS) -> Scalar:
    kind = kind or rng.choice(["string", "string", "number", "boolean"])
    if kind == "string":
        return rng.choice(strings)
    if kind == "number":
        return rng.choice(NUMBERS)
    return rng.choice([True, False])


def rand_meta(rng: random.Random) -> Meta:
    meta: Meta = {}
    for key in KEYS:
        if rng.random() < 0.5:
            kind = rng.choice(["string", "string", "number", "boolean"])  # types differ across documents
            if rng.random() < 0.4:
                meta[key] = list(dict.fromkeys(rand_scalar(rng, kind) for _ in range(rng.randint(1, 4))))
            else:
                meta[key] = rand_scalar(rng, kind)
    return meta


def rand_condition(rng: random.Random, entry: bool) -> dict[str, object]:
    ops = ["eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains", "prefix", "suffix", "type"]
    op = rng.choice(ops if entry else [*ops, "all", "exists"])
    field = rng.choice(["key", "value"]) if entry else rng.choice([*KEYS, "missing"])
    pool = STRINGS + KEYS + ["T", "TAG", "K\x00"] if entry else STRINGS
    value: object
    if op in ("in", "nin", "all"):
        kind = rng.choice([None, "string"])
        value = [rand_scalar(rng, kind, pool) for _ in range(rng.randint(1, 3))]
    elif op in ("contains", "prefix", "suffix"):
        value = rng.choice(pool)
    elif op == "type":
        value = rng.choice(["string", "number", "boolean"])
    elif op == "exists":
        value = rng.random() < 0.5
    elif op in ("gt", "gte", "lt", "lte"):
        value = rand_scalar(rng, rng.choice(["string", "number"]), pool)
    else:
        value = rand_scalar(rng, None, pool)
    out: dict[str, object] = {"field": field, "operator": op, "value": value}
    stringy = value if isinstance(value, list) else [value]
    if op != "exists" and all(isinstance(v, str) for v in stringy) and rng.random() < 0.5:
        out["caseInsensitive"] = rng.random() < 0.8
    return out


def rand_tree(rng: random.Random, entry: bool, depth: int = 0) -> dict[str, object]:
    if depth < 4 and rng.random() < 0.4:
        op = rng.choice(["and", "or", "not"])
        if op == "not":
            return {"operator": "not", "operand": rand_tree(rng, entry, depth + 1)}
        return {"operator": op, "operands": [rand_tree(rng, entry, depth + 1) for _ in range(rng.randint(1, 3))]}
    return rand_condition(rng, entry)


@pytest.fixture(scope="module")
def random_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, dict[int, Meta]]]:
    rng = random.Random(20250214)
    metas = [rand_meta(rng) for _ in range(300)]
    s = Store(tmp_path_factory.mktemp("random") / "i.sqlite")
    ids = fill(s, {f"d{i}": (1, 1 if m else 0, m) for i, m in enumerate(metas)})
    yield s, {ids[f"d{i}"]: m for i, m in enumerate(metas)}
    s.close()


def test_sql_filters_agree_with_python(random_store: tuple[Store, dict[int, Meta]]) -> None:
    store, metas = random_store
    rng = random.Random(7)
    hits = 0
    with store.read() as conn:
        for _ in range(300):
            raw = rand_tree(rng, entry=False)
            f = parse_filter(raw)
            where, params = filter_sql(f, doc="x")
            got = {r[0] for r in conn.execute(f"SELECT x.id FROM documents x WHERE {where}", params)}
            assert got == {i for i, m in metas.items() if matches(f, m)}, raw
            hits += 0 < len(got) < len(metas)
    assert hits > 100  # many filters split the corpus: the comparison is not vacuous


def test_sql_matches_agree_with_python(random_store: tuple[Store, dict[int, Meta]]) -> None:
    store, _ = random_store
    rng = random.Random(11)
    hits = 0
    with store.read() as conn:
        some = "SELECT doc_id, key, type, value FROM document_metadata e WHERE doc_id <= 100"
        rows = [tuple(r) for r in conn.execute(some)]
        for _ in range(300):
            raw = rand_tree(rng, entry=True)
            f = parse_match(raw)
            where, params = match_sql(f, entry="e")
            got = {tuple(r) for r in conn.execute(f"{some} AND {where}", params)}
            assert got == {r for r in rows if entry_matches(f, r[1], r[2], r[3])}, raw
            hits += 0 < len(got) < len(rows)
    assert hits > 100
