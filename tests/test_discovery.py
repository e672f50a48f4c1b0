"""Metadata discovery (search/discovery): the seed's examples and the upstream CLI's exact
output reproduced, the windows and their remainder lines, the bare-string rule, what is
excluded and counted apart, bad options, one snapshot per answer, and the SQL held to a
pure-Python reference on random corpora under every join plan.

Rows go in through plain SQL on the store's writer; reads use the store's own
query_only reader, as the daemon does.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import pytest

from qmd.server.errors import InvalidInput
from qmd.server.search import discovery
from qmd.server.search.discovery import (
    KeyReport,
    MetadataOptions,
    MetadataReport,
    NumberRange,
    TypeReport,
    ValueCount,
    discover,
    render,
    render_key_names,
    render_overview,
    string_text,
    top_keys,
    warnings,
)
from qmd.server.search.filters import entry_matches, matches, parse_filter, parse_match
from qmd.server.store import metadata
from qmd.server.store.db import Connection, IndexStore, sqlite3
from qmd.server.text import frontmatter
from qmd.server.text.frontmatter import Entry, Scalar, value_type

Meta = dict[str, Scalar | list[Scalar]]


@dataclass(frozen=True)
class Doc:
    collection: str
    path: str
    meta: Meta | None = None
    state: int | None = -1
    """-1: 1 with metadata, 0 without; None pending; 2 rejected."""
    active: bool = True
    error: str | None = None


def add(store: IndexStore, docs: Sequence[Doc]) -> list[int]:
    def fn(conn: Connection) -> list[int]:
        ids = []
        for d in docs:
            h = f"{d.collection}/{d.path}"
            conn.execute(
                "INSERT INTO content(hash, doc, created_at) VALUES (?, 'x', 'now') ON CONFLICT DO NOTHING", (h,)
            )
            state = (1 if d.meta else 0) if d.state == -1 else d.state
            doc_id = int(
                conn.execute(
                    "INSERT INTO documents(collection, path, title, hash, created_at, modified_at, active, meta_state,"
                    " meta_error) VALUES (?, ?, ?, ?, 'now', 'now', ?, ?, ?) RETURNING id",
                    (d.collection, d.path, d.path, h, int(d.active), state, d.error),
                ).fetchone()[0]
            )
            ids.append(doc_id)
            if d.meta:
                # The rows as the indexer writes them (an array's first entry marked).
                entries = tuple(
                    Entry(key, value_type(v), v, isinstance(raw, list))
                    for key, raw in d.meta.items()
                    for v in (dict.fromkeys(raw) if isinstance(raw, list) else [raw])
                )
                metadata.store(conn, doc_id, frontmatter.Extracted(frontmatter.OK, entries))
                conn.execute(
                    "UPDATE documents SET meta_state = ?, meta_error = ? WHERE id = ?", (state, d.error, doc_id)
                )
        return ids

    return store.write(fn)


@pytest.fixture
def store(open_store: Callable[[str], IndexStore]) -> IndexStore:
    return open_store("i")


def report(store: IndexStore, collections: Sequence[str] = ("notes",), **kw: Any) -> MetadataReport:
    if isinstance(kw.get("match"), dict):
        kw["match"] = parse_match(kw["match"])
    if isinstance(kw.get("filter"), dict):
        kw["filter"] = parse_filter(kw["filter"])
    with store.read() as conn:
        return discover(conn, MetadataOptions(list(collections), **kw))


def text(store: IndexStore, collections: Sequence[str] = ("notes",), **kw: Any) -> str:
    r = report(store, collections, **kw)
    return render(r, filtered="filter" in kw, matched="match" in kw, key_offset=kw.get("key_offset", 0))


def body_lines(out: str) -> list[str]:
    return [line for line in out.split("\n") if line.startswith("  ") and not line.startswith("   ")]


KEY = {"field": "key", "operator": "eq", "value": "topics"}
TOPICS = [
    "typescript", "sqlite", "search", "architecture", "embeddings", "mcp",
    "cli", "testing", "agents", "indexing", "chunking", "reranking",
]  # fmt: skip

# The upstream CLI test's corpus (six documents in one collection).
NOTES = [
    Doc("notes", "published.md", {"status": "published", "topics": ["typescript", "programming"]}),
    Doc("notes", "draft.md", {"status": "draft"}),
    Doc("notes", "plain.md"),
    Doc("notes", "discovery.md", {"status": "published", "topics": TOPICS, "priority": 5, "owner": "docs-team"}),
    Doc(
        "notes",
        "priority.md",
        {"status": "draft", "priority": 1, "reviewed": False, "reviewers": ["docs-team", "security-team"]},
    ),
    Doc("notes", "conflict.md", {"status": "archived", "priority": "high"}),
]


@pytest.fixture
def notes(store: IndexStore) -> IndexStore:
    add(store, NOTES)
    return store


# -- the report and its text ----------------------------------------------------------


def test_every_key_with_coverage_type_and_a_value_window(notes: IndexStore) -> None:
    out = text(notes)
    assert out.startswith(
        "status  string  5 of 6 documents  3 distinct\n  draft      2\n  published  2\n  archived   1\n"
    )
    assert "topics  string[]  2 of 6 documents  13 distinct" in out
    assert "reviewed  boolean  1 of 6 documents\n  false 1" in out
    assert "reviewers  string[]  1 of 6 documents  2 distinct\n  docs-team      1\n  security-team  1" in out
    headers = [line.split("  ")[0] for line in out.split("\n") if " of 6 documents" in line]
    assert headers == ["status", "priority", "topics", "owner", "reviewed", "reviewers"]


def test_the_report_fields(notes: IndexStore) -> None:
    r = report(notes, match=KEY, value_limit=2)
    assert (r.documents, r.filtered_documents, r.total_keys, r.remaining_keys, r.with_metadata) == (6, None, 1, 0, 5)
    assert r.keys == [
        KeyReport(
            "topics",
            2,
            [
                TypeReport(
                    "string", True, 2, 13, [ValueCount("typescript", 2), ValueCount("agents", 1)], 11, None, ["notes"]
                )
            ],
        )
    ]
    p = report(notes, match={"field": "key", "operator": "eq", "value": "priority"}).keys[0]
    assert [(t.type, t.documents, t.multi_valued, t.range) for t in p.types] == [
        ("number", 2, False, NumberRange(1, 3, 5)),
        ("string", 1, False, None),
    ]
    assert p.types[0].values == [ValueCount(1, 1), ValueCount(5, 1)]
    b = report(notes, match={"field": "key", "operator": "eq", "value": "reviewed"}).keys[0].types[0]
    assert b.values == [ValueCount(False, 1)] and b.values[0].value is False


def test_a_type_conflict_within_one_collection_is_split(notes: IndexStore) -> None:
    assert text(notes, match={"field": "key", "operator": "eq", "value": "priority"}) == (
        "priority  number | string  3 of 6 documents\n"
        "  number  2 docs  min 1  median 3  max 5\n"
        "  string  1 doc   high (1)"
    )


def test_the_value_window_ends_with_the_exact_remainder(notes: IndexStore) -> None:
    out = text(notes, match=KEY)
    lines = body_lines(out)
    assert len(lines) == 10 and lines[0] == "  typescript    2"
    assert out.endswith("\n3 more values, use --value-limit <n>, --value-offset <n>, or --all-values")
    assert "status" not in out
    assert "11 more values, use" in text(notes, match=KEY, value_limit=2)
    paged = text(notes, match=KEY, value_limit=2, value_offset=11)
    assert len(body_lines(paged)) == 2 and "more values" not in paged
    everything = text(notes, match=KEY, value_limit=None)
    assert len(body_lines(everything)) == 13 and "more values" not in everything
    assert "1 more value, use --value-limit" in text(notes, match=KEY, value_limit=12)


def test_the_key_window_pages_in_coverage_order(notes: IndexStore) -> None:
    def headers(out: str) -> list[str]:
        return [line.split("  ")[0] for line in out.split("\n") if " of 6 documents" in line]

    assert "more keys" not in text(notes)
    limited = text(notes, key_limit=2)
    assert headers(limited) == ["status", "priority"]
    assert limited.endswith("\n\n4 more keys, use --key-limit <n>, --key-offset <n>, or --all-keys")
    paged = text(notes, key_limit=2, key_offset=2)
    assert headers(paged) == ["topics", "owner"] and "2 more keys, use" in paged
    last = text(notes, key_limit=2, key_offset=4)
    assert headers(last) == ["reviewed", "reviewers"] and "more keys" not in last
    assert text(notes, key_offset=6) == "No keys at --key-offset 6, 6 keys in total."
    assert len(headers(text(notes, key_limit=None))) == 6
    assert text(notes, key_limit=5).endswith("\n\n1 more key, use --key-limit <n>, --key-offset <n>, or --all-keys")
    r = report(notes, key_limit=2, key_offset=2)
    assert (r.total_keys, r.remaining_keys, [k.key for k in r.keys]) == (6, 2, ["topics", "owner"])


def test_each_surface_names_the_options_its_user_types(notes: IndexStore) -> None:
    """The hints name options as the surface showing the text spells them (issue 31):
    the CLI's flags by default, any other surface's names when it passes them."""
    names = discovery.OptionNames(
        key_limit="K=<n>",
        key_offset="KO=<n>",
        all_keys="K=all",
        value_limit="V=<n>",
        value_offset="VO=<n>",
        all_values="V=all",
        match="M",
        filter="F",
        rerun="Ask again",
    )

    def spelled(**kw: Any) -> str:
        r = report(notes, **kw)
        return render(
            r, filtered="filter" in kw, matched="match" in kw, key_offset=kw.get("key_offset", 0), names=names
        )

    windowed = spelled(key_limit=2, value_limit=1)
    assert "\n1 more value, use V=<n>, VO=<n>, or V=all\n" in windowed
    assert windowed.endswith("\n\n4 more keys, use K=<n>, KO=<n>, or K=all")
    assert "--" not in windowed
    assert spelled(key_offset=6) == "No keys at KO=6, 6 keys in total."
    missing = {"field": "key", "operator": "eq", "value": "missing"}
    assert spelled(match=missing) == "No metadata matches. Ask again without M or F to see which keys exist."
    assert discovery.NO_MATCH == (
        "No metadata matches. Run 'qmd collection metadata' without --match or --filter to see which keys exist."
    )


def test_a_value_match_is_a_reverse_lookup_across_keys(notes: IndexStore) -> None:
    # reviewers stays string[]: array-ness describes the key, not the matched entries
    assert text(notes, match={"field": "value", "operator": "eq", "value": "docs-team"}) == (
        "owner  string  1 of 6 documents  1 distinct\n"
        "  docs-team  1\n"
        "\n"
        "reviewers  string[]  1 of 6 documents  1 distinct\n"
        "  docs-team  1"
    )


def test_a_filter_counts_only_its_documents_and_says_so(notes: IndexStore) -> None:
    published = {"field": "status", "operator": "eq", "value": "published"}
    assert text(notes, match={"field": "key", "operator": "eq", "value": "priority"}, filter=published) == (
        "filter: 2 of 6 documents\n\npriority  number  1 of 2 documents  1 distinct\n  min 5  median 5  max 5\n  5 (1)"
    )
    r = report(notes, filter=published)
    assert (r.documents, r.filtered_documents) == (6, 2)
    assert [(k.key, k.documents) for k in r.keys] == [("status", 2), ("topics", 2), ("owner", 1), ("priority", 1)]


def test_the_filter_line_stays_when_nothing_is_left(notes: IndexStore) -> None:
    no_status = {"field": "status", "operator": "exists", "value": False}
    assert text(notes, filter=no_status) == f"filter: 1 of 6 documents\n\n{discovery.NO_MATCH}"


def test_sort_value_and_min_count_reshape_the_window(notes: IndexStore) -> None:
    assert "  agents        1\n  architecture  1\n" in text(notes, match=KEY, sort="value", value_limit=2)
    common = text(notes, match=KEY, min_count=2)
    assert common == "topics  string[]  2 of 6 documents  1 distinct\n  typescript  2"
    r = report(notes, match=KEY, min_count=2).keys[0].types[0]
    assert (r.documents, r.distinct_values, r.remaining_values) == (2, 1, 0)
    numbers = report(notes, match={"field": "value", "operator": "type", "value": "number"}, sort="value")
    assert [vc.value for vc in numbers.keys[0].types[0].values] == [1, 5]


def test_matches_by_key_family_set_value_prefix_and_type(notes: IndexStore) -> None:
    def keys(match: dict[str, Any]) -> list[str]:
        return [k.key for k in report(notes, match=match).keys]

    assert keys({"field": "key", "operator": "prefix", "value": "review"}) == ["reviewed", "reviewers"]
    assert keys({"field": "key", "operator": "in", "value": ["tags", "topics", "labels"]}) == ["topics"]
    assert keys({"field": "value", "operator": "prefix", "value": "docs-"}) == ["owner", "reviewers"]
    assert keys({"field": "value", "operator": "type", "value": "boolean"}) == ["reviewed"]
    threshold = {
        "operator": "and",
        "operands": [
            {"field": "key", "operator": "eq", "value": "priority"},
            {"field": "value", "operator": "gte", "value": 3},
        ],
    }
    assert (
        text(notes, match=threshold)
        == "priority  number  1 of 6 documents  1 distinct\n  min 5  median 5  max 5\n  5 (1)"
    )
    assert text(notes, match={"field": "value", "operator": "type", "value": "number"}) == (
        "priority  number  2 of 6 documents  2 distinct\n  min 1  median 3  max 5\n  1 (1)  5 (1)"
    )
    composed = {
        "operator": "and",
        "operands": [
            KEY,
            {
                "operator": "or",
                "operands": [
                    {"field": "value", "operator": "prefix", "value": "sql"},
                    {"field": "value", "operator": "contains", "value": "ARCH", "caseInsensitive": True},
                ],
            },
        ],
    }
    assert text(notes, match=composed) == (
        "topics  string[]  1 of 6 documents  3 distinct\n  architecture  1\n  search        1\n  sqlite        1"
    )
    assert text(notes, match={"field": "key", "operator": "prefix", "value": "missing-"}) == discovery.NO_MATCH


def test_a_match_counts_documents_with_a_matching_entry(store: IndexStore) -> None:
    add(store, [Doc("notes", f"{i}.md", {"tags": ["a", "b", "c"][: i % 3 + 1]}) for i in range(9)])
    r = report(store, match={"field": "value", "operator": "in", "value": ["b", "c"]})
    t = r.keys[0].types[0]
    assert (r.keys[0].documents, t.documents, t.multi_valued) == (6, 6, True)
    assert t.values == [ValueCount("b", 6), ValueCount("c", 3)]


def test_the_seed_example_numbers_booleans_and_separators(store: IndexStore) -> None:
    rnd = random.Random(7)
    prios = [1] * 12 + [2] * 40 + [3] * 88 + [4] * 50 + [5] * 15
    docs = []
    for i in range(1480):
        meta: Meta = {"reviewed": i < 61}
        if i < len(prios):
            meta["priority"] = prios[i]
        if i < 1388:
            meta["topics"] = ["typescript"] if i < 1204 else ["sqlite", f"t{i}"]
        docs.append(Doc("notes", f"{i:04}.md", meta))
    rnd.shuffle(docs)
    add(store, docs)
    out = text(store)
    assert out.startswith(
        "reviewed  boolean  1,480 of 1,480 documents\n  true 61  false 1,419\n\n"
        "topics  string[]  1,388 of 1,480 documents  186 distinct\n  typescript  1,204\n  sqlite        184\n"
    )
    assert "\n176 more values, use --value-limit <n>, --value-offset <n>, or --all-values\n" in out
    assert out.endswith(
        "priority  number  205 of 1,480 documents  5 distinct\n"
        "  min 1  median 3  max 5\n"
        "  1 (12)  2 (40)  3 (88)  4 (50)  5 (15)"
    )


def test_numbers_not_all_shown_keep_count_order_and_medians_average(store: IndexStore) -> None:
    add(
        store,
        [Doc("notes", f"{i}.md", {"n": i % 12 + 0.5 * (i % 2), "even": [2, 4] if i == 0 else 4}) for i in range(24)],
    )
    r = report(store, value_limit=3)
    n = next(k for k in r.keys if k.key == "n").types[0]
    assert n.range == NumberRange(0, 5.75, 11.5) and n.remaining_values == 9
    assert "  min 0  median 5.75  max 11.5\n  0 (2)  1.5 (2)  2 (2)\n9 more values" in render(r, filtered=False)
    even = next(k for k in r.keys if k.key == "even").types[0]
    # entries: doc 0 holds 2 and 4, 23 documents hold 4: 25 entries, the 13th is 4
    assert (even.documents, even.multi_valued, even.range) == (24, True, NumberRange(2, 4, 4))


def test_a_number_is_one_value_however_written_and_large_integers_stay_apart(store: IndexStore) -> None:
    """3 and 3.0 are one number (typed equality), 2**53 and 2**53 + 1 two, and numbers order
    numerically, never as their text (10 after 9): on Postgres as on SQLite."""
    big = 2**53
    values: list[Scalar] = [3, 3.0, 3, big, big + 1, 10, 9, -0.5]
    add(store, [Doc("notes", f"{i}.md", {"n": v}) for i, v in enumerate(values)])
    n = report(store, sort="value", value_limit=None).keys[0].types[0]
    assert [(v.value, v.documents) for v in n.values] == [(-0.5, 1), (3, 3), (9, 1), (10, 1), (big, 1), (big + 1, 1)]
    assert n.range == NumberRange(-0.5, 6, big + 1) and n.distinct_values == 6
    by_count = report(store, value_limit=2).keys[0].types[0]
    assert [(v.value, v.documents) for v in by_count.values] == [(3, 3), (-0.5, 1)]


def test_a_type_conflict_across_collections_names_its_collections(store: IndexStore) -> None:
    numbers = [1] * 40 + [2] * 50 + [3] * 53 + [4] * 40 + [5] * 40
    labels = ["high"] * 700 + ["medium"] * 380 + ["low"] * 124
    docs = [Doc("notes", f"n{i}.md", {"priority": v}) for i, v in enumerate(numbers[:100])]
    docs += [Doc("notes", f"x{i}.md") for i in range(673)]
    docs += [Doc("work", f"w{i}.md", {"priority": v}) for i, v in enumerate(numbers[100:] + labels)]
    add(store, docs)
    out = text(store, ["notes", "work"], match={"field": "key", "operator": "eq", "value": "priority"})
    # types in document order (the string side has more), each with its collections
    assert out == (
        "priority  string | number  1,427 of 2,100 documents\n"
        "  string  1,204 docs  high (700), medium (380), low (124)  work\n"
        "  number    223 docs  min 1  median 3  max 5               notes, work"
    )
    one_side = {
        "operator": "and",
        "operands": [
            {"field": "key", "operator": "eq", "value": "priority"},
            {"field": "value", "operator": "type", "value": "number"},
        ],
    }
    t = report(store, ["notes", "work"], match=one_side).keys[0].types
    assert [(x.type, x.documents, x.collections) for x in t] == [("number", 223, ["notes", "work"])]
    assert report(store, ["work"], match=one_side).keys[0].types[0].collections == ["work"]


def test_bare_strings_are_exactly_the_value(store: IndexStore) -> None:
    ambiguous = ["42", "", "a, b", " padded", "trail ", "two  spaces", "tab\there", "true", "null", "1e3", ".5",
                 "0x1F", "inf", "NaN", 'say "hi"', "back\\slash", "line\nbreak", "\x1b[31mred", "(x)", "...",
                 "3 more", "[1]", "{}"]  # fmt: skip
    bare = ["published", "docs-team", "two words", "é", "v1.2.3", "-", "2025-01-02", "C++", "a:b"]
    for s in ambiguous:
        assert string_text(s) != s, s
        assert string_text(s).startswith('"'), s
    for s in bare:
        assert string_text(s) == s, s
    assert string_text("\x1b[31mred") == '"\\u001b[31mred"'
    assert string_text("\u202eevil") == '"\\u202eevil"'
    add(
        store, [Doc("notes", "a.md", {"v": "42"}), Doc("notes", "b.md", {"v": 42}), Doc("notes", "c.md", {"v": "a, b"})]
    )
    assert text(store) == (
        "v  string | number  3 of 3 documents\n"
        '  string  2 docs  "42" (1), "a, b" (1)\n'
        "  number  1 doc   min 42  median 42  max 42"
    )


def test_keys_that_do_not_print_as_themselves_are_quoted(store: IndexStore) -> None:
    add(store, [Doc("notes", "a.md", {"bad\x1bkey": "x", "42": "y"})])
    out = text(store)
    assert '"bad\\u001bkey"  string  1 of 1 documents  1 distinct' in out
    assert out.startswith("42  string  1 of 1 documents  1 distinct\n  y  1\n\n")
    assert "\x1b" not in out


# -- what the answer excludes and counts apart -----------------------------------------


def test_pending_rejected_inactive_and_other_collections_are_excluded(store: IndexStore) -> None:
    add(
        store,
        [
            Doc("notes", "ok.md", {"k": "a"}),
            Doc("notes", "none.md"),
            Doc("notes", "pending.md", state=None),
            Doc("notes", "z-bad.md", state=2, error="qmd.metadata.k: null is not a value"),
            Doc("notes", "a-bad.md", state=2, error="mixed array"),
            Doc("notes", "gone.md", {"k": "gone", "old": 1}, active=False),
            Doc("work", "w.md", {"k": "elsewhere", "w": True}),
        ],
    )
    r = report(store)
    assert (r.documents, r.with_metadata, r.pending, r.rejected) == (5, 1, 1, 2)
    assert [(k.key, k.documents, [v.value for v in k.types[0].values]) for k in r.keys] == [("k", 1, ["a"])]
    assert [(x.path, x.reason) for x in r.rejected_examples] == [
        ("a-bad.md", "mixed array"),
        ("z-bad.md", "qmd.metadata.k: null is not a value"),
    ]
    assert warnings(r) == [
        "Warning: 1 document in scope not yet read for metadata (excluded until 'qmd update' runs)",
        "Warning: 2 documents in scope with rejected metadata (excluded):",
        "  notes/a-bad.md: mixed array",
        "  notes/z-bad.md: qmd.metadata.k: null is not a value",
    ]
    everything = report(store, ["notes", "work"], filter={"field": "k", "operator": "exists", "value": True})
    assert (everything.documents, everything.filtered_documents, everything.total_keys) == (6, 2, 2)
    assert warnings(report(store, ["work"])) == []


def test_empty_answers_say_why_in_one_line(store: IndexStore) -> None:
    assert text(store, ["nothing"]) == "No documents in scope."
    assert text(store, []) == "No documents in scope."
    add(store, [Doc("notes", "a.md"), Doc("notes", "b.md")])
    assert (
        text(store)
        == "No metadata in scope: none of the 2 documents declares a 'qmd: metadata:' block in its frontmatter."
    )
    assert text(store, match=KEY) == discovery.NO_MATCH


# -- options ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("key_limit", 0),
        ("key_limit", -1),
        ("key_limit", True),
        ("key_limit", 2.0),
        ("key_limit", "5"),
        ("key_offset", -1),
        ("key_offset", None),
        ("value_limit", 0),
        ("value_offset", -3),
        ("min_count", 0),
        ("min_count", None),
        ("sort", "size"),
        ("collections", "notes"),
        ("collections", [1]),
    ],
)
def test_a_bad_option_is_refused_by_name(option: str, value: object) -> None:
    kw: dict[str, Any] = {"collections": ["notes"], option: value}
    with pytest.raises(InvalidInput) as e:
        MetadataOptions(**kw)
    assert e.value.message.startswith(f"Invalid {option}: expected ")
    assert e.value.detail["option"] == option
    assert repr(value) in e.value.message or str(value) in e.value.message


def test_no_limit_is_spelled_none_and_scope_repeats_collapse() -> None:
    o = MetadataOptions(["a", "b", "a"], key_limit=None, value_limit=None)
    assert o.collections == ("a", "b")
    with pytest.raises(InvalidInput, match="Invalid n: expected a positive integer"):
        top_keys(sqlite3.connect(":memory:"), ["a"], 0)


# -- one snapshot, a constant number of statements ------------------------------------


class Counting:
    """A reader's connection that notes each statement run on it, and may run a write
    just before one (`before`), whichever the backend."""

    def __init__(self, conn: Connection, before: Callable[[str], None] = lambda sql: None) -> None:
        self.conn, self.before, self.statements = conn, before, list[str]()

    def execute(self, sql: str, params: Sequence[object] = ()) -> Any:
        self.statements.append(sql)
        self.before(sql)
        return self.conn.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def test_one_answer_is_read_from_one_snapshot(notes: IndexStore) -> None:
    """A write that lands between the census and the entries' statement is not seen by
    either: the document counts and the keys come from the same index."""

    def sneak_in(sql: str) -> None:
        if sql.lstrip().startswith("WITH"):
            add(notes, [Doc("notes", "late.md", {"late": "x", "status": "late"})])

    with notes.read() as conn:
        counting = Counting(conn, sneak_in)
        r = discover(cast(Connection, counting), MetadataOptions(["notes"]))
        assert not conn.in_transaction
        assert counting.statements[0] == "BEGIN" and counting.statements[-1] == "COMMIT"
        assert (r.documents, r.total_keys) == (6, 6)
        assert r.keys[0].types[0].values[0] == ValueCount("draft", 2)
        after = discover(conn, MetadataOptions(["notes"]))
    assert (after.documents, after.total_keys) == (7, 7)


def count_statements(store: IndexStore, options: MetadataOptions) -> int:
    with store.read() as conn:
        counting = Counting(conn)
        discover(cast(Connection, counting), options)
    return len(counting.statements)


def test_at_scale_the_statements_stay_few_and_the_answer_exact(open_store: Callable[[str], IndexStore]) -> None:
    """20k documents with ~8 keys each, arrays, many values: the same number of
    statements as for six documents (no per-key queries), and the reference's answer."""
    small = open_store("small")
    big = open_store("big")
    add(small, NOTES + [Doc("work", "w.md", {"status": "x"}), Doc("notes", "r.md", state=2, error="e")])
    docs = random_corpus(random.Random(3), 20_000, keys=40, values=400)
    add(big, docs)
    for opts in (
        MetadataOptions(["notes", "work"]),
        MetadataOptions(
            ["notes", "work"],
            match=parse_match(KEY),
            filter=parse_filter(
                {
                    "operator": "or",
                    "operands": [
                        {"field": "k1", "operator": "exists", "value": True},
                        {"field": "status", "operator": "exists", "value": True},
                    ],
                }
            ),
        ),  # fmt: skip
    ):
        # Postgres' one more is its memory for the grouping (SET LOCAL work_mem)
        assert count_statements(small, opts) == count_statements(big, opts) == (6 if small.postgres else 5)
    opts = MetadataOptions(["notes", "work"], key_limit=None, value_limit=25, sort="count")
    with big.read() as conn:
        got = discover(conn, opts)
    assert got == reference(docs, opts)
    assert got.total_keys == 40 and sum(len(t.values) for k in got.keys for t in k.types) > 500


# -- list, show, status ---------------------------------------------------------------


def test_collection_list_and_show_lines(notes: IndexStore) -> None:
    add(notes, [Doc("work", "w.md", state=None)])
    with notes.read() as conn:
        [ck] = top_keys(conn, ["notes"], 5, values=3)
        [bare] = top_keys(conn, ["notes"])
        [work] = top_keys(conn, ["work"])
    assert render_key_names(ck) == "  Metadata: status, priority, topics, owner, reviewed, +1 more"
    assert render_overview(ck) == "\n".join(
        [
            "  Metadata: 6 keys, 5 of 6 documents",
            "    status    string           5 docs   3 distinct  draft (2), published (2), archived (1)",
            "    priority  number | string  3 docs   3 distinct  types disagree, see: qmd collection metadata notes"
            """ --match '{"field":"key","operator":"eq","value":"priority"}'""",
            "    topics    string[]         2 docs  13 distinct  typescript (2), agents (1), architecture (1), ...",
            "    owner     string           1 doc    1 distinct",
            "    reviewed  boolean          1 doc    1 distinct  false 1",
            "    1 more key, see 'qmd collection metadata notes'",
        ]
    )
    assert [(k.key, k.documents) for k in bare.keys] == [
        ("status", 5),
        ("priority", 3),
        ("topics", 2),
        ("owner", 1),
        ("reviewed", 1),
    ]
    assert all(t.values == [] for k in bare.keys for t in k.types)
    assert (bare.total_keys, bare.remaining_keys, bare.with_metadata) == (6, 1, 5)
    assert render_overview(work) == "  Metadata: none (1 pending extraction)" and render_key_names(work) == ""


# -- the SQL against a reference ------------------------------------------------------


def random_corpus(rnd: random.Random, n: int, *, keys: int = 8, values: int = 6) -> list[Doc]:
    """Documents in three collections, some inactive, pending or rejected, holding
    keys of a drifting type (the same key is a string here, a number there), arrays
    among them, values drawn from small pools so counts tie and repeat."""
    pools: dict[str, list[Scalar]] = {
        "string": [f"v{i}" for i in range(values)] + ["sql", "SQLite", "42", "a, b"],
        "number": [i * 0.5 for i in range(values)] + list(range(values)),
        "boolean": [True, False],
    }
    docs = []
    for i in range(n):
        meta: Meta = {}
        for k in rnd.sample(range(keys), rnd.randint(0, min(keys, 8))):
            t = ("string", "number", "boolean")[(k + (rnd.random() < 0.15)) % 3]
            if t != "boolean" and rnd.random() < 0.3:
                meta[f"k{k}"] = rnd.sample(pools[t], rnd.randint(1, 3))
            else:
                meta[f"k{k}"] = rnd.choice(pools[t])
        roll = rnd.random()
        state: int | None = -1 if roll > 0.1 else (None if roll < 0.05 else 2)
        docs.append(
            Doc(rnd.choice(["notes", "work", "other"]), f"{i}.md", meta if state == -1 else None, state,
                active=rnd.random() > 0.05)
        )  # fmt: skip
        if not docs[-1].active and rnd.random() < 0.5:
            docs[-1] = replace(docs[-1], meta=meta or {"gone": 1}, state=1)
    return docs


def _sort_key(v: Scalar) -> tuple[int, Scalar]:
    return (0, v) if not isinstance(v, str) else (1, v)


def reference(docs: Sequence[Doc], o: MetadataOptions) -> MetadataReport:
    """The report computed in Python from the documents, by the module's stated rules
    and the filter module's own evaluators."""
    scope = list(o.collections)
    live = [d for d in docs if d.active and d.collection in scope]
    counted = [d for d in live if d.state in (-1, 0, 1) and (o.filter is None or matches(o.filter, d.meta or {}))]
    entries: dict[tuple[str, str], dict[Scalar, set[int]]] = {}
    arrays: set[tuple[str, str]] = set()
    colls: dict[tuple[str, str], set[str]] = {}
    for i, d in enumerate(counted):
        for key, raw in (d.meta or {}).items():
            vs = list(dict.fromkeys(raw)) if isinstance(raw, list) else [raw]
            t = value_type(vs[0])
            if isinstance(raw, list):
                arrays.add((key, t))
            for v in vs:
                if o.match is None or entry_matches(o.match, key, t, int(v) if isinstance(v, bool) else v):
                    entries.setdefault((key, t), {}).setdefault(v, set()).add(i)
                    colls.setdefault((key, t), set()).add(d.collection)
    types: dict[str, list[TypeReport]] = {}
    for (key, t), by_value in entries.items():
        docs_of = set().union(*by_value.values())
        kept = [(v, len(ds)) for v, ds in by_value.items() if len(ds) >= o.min_count]
        if o.sort == "count":
            kept.sort(key=lambda vc: (-vc[1], _sort_key(vc[0])))
        else:
            kept.sort(key=lambda vc: _sort_key(vc[0]))
        end = None if o.value_limit is None else o.value_offset + o.value_limit
        window = [ValueCount(v, c) for v, c in kept[o.value_offset : end]]
        rng = None
        if t == "number":
            flat = sorted(v for v, ds in by_value.items() for _ in ds)
            n = len(flat)
            median = flat[n // 2] if n % 2 else (flat[n // 2 - 1] + flat[n // 2]) / 2
            rng = NumberRange(flat[0], median, flat[-1])  # type: ignore[arg-type]
        remaining = max(0, len(kept) - o.value_offset - len(window))
        report_t = TypeReport(
            t, (key, t) in arrays, len(docs_of), len(kept), window, remaining, rng, sorted(colls[(key, t)])
        )  # type: ignore[arg-type]
        types.setdefault(key, []).append(report_t)
    ranked = sorted(types.items(), key=lambda kv: (-sum(t.documents for t in kv[1]), kv[0]))
    end = None if o.key_limit is None else o.key_offset + o.key_limit
    keys = [
        KeyReport(k, sum(t.documents for t in ts), sorted(ts, key=lambda t: (-t.documents, t.type)))
        for k, ts in ranked[o.key_offset : end]
    ]
    rejected = sorted((d for d in live if d.state == 2), key=lambda d: (d.collection, d.path))
    return MetadataReport(
        collections=scope,
        documents=len(live),
        filtered_documents=len(counted) if o.filter is not None else None,
        total_keys=len(ranked),
        remaining_keys=max(0, len(ranked) - o.key_offset - len(keys)),
        keys=keys,
        with_metadata=sum(1 for d in live if d.state == -1 and d.meta or d.state == 1),
        pending=sum(1 for d in live if d.state is None),
        rejected=len(rejected),
        rejected_examples=[discovery.Rejection(d.collection, d.path, d.error or "") for d in rejected[:5]],
    )


FILTERS: list[Any] = [
    None,
    {"field": "k1", "operator": "exists", "value": True},
    {"field": "k0", "operator": "in", "value": ["v1", "v2", "sql"]},
    {"operator": "not", "operand": {"field": "k2", "operator": "gte", "value": 2}},
    {
        "operator": "or",
        "operands": [
            {"field": "k3", "operator": "eq", "value": True},
            {"field": "k4", "operator": "prefix", "value": "V", "caseInsensitive": True},
        ],
    },
]
MATCHES: list[Any] = [
    None,
    {"field": "key", "operator": "eq", "value": "k0"},
    {"field": "key", "operator": "in", "value": ["k1", "k5", "nope"]},
    {"field": "value", "operator": "type", "value": "number"},
    {"field": "value", "operator": "prefix", "value": "SQL", "caseInsensitive": True},
    {
        "operator": "and",
        "operands": [
            {"field": "key", "operator": "prefix", "value": "k"},
            {"operator": "not", "operand": {"field": "value", "operator": "lt", "value": 1.5}},
        ],
    },
    {"field": "value", "operator": "eq", "value": "42"},
]


@pytest.mark.parametrize("seed", range(10))
def test_the_sql_agrees_with_the_reference_under_every_plan(
    open_store: Callable[[str], IndexStore], seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rnd = random.Random(seed)
    docs = random_corpus(rnd, rnd.randint(1, 300))
    s = open_store("r")
    add(s, docs)
    for _ in range(12):
        f, m = rnd.choice(FILTERS), rnd.choice(MATCHES)
        opts = MetadataOptions(
            rnd.choice([["notes"], ["notes", "work"], ["work", "other", "notes"], ["none"]]),
            match=None if m is None else parse_match(m),
            filter=None if f is None else parse_filter(f),
            key_limit=rnd.choice([None, 1, 3, 50]),
            key_offset=rnd.choice([0, 0, 1, 4]),
            value_limit=rnd.choice([None, 1, 2, 10]),
            value_offset=rnd.choice([0, 0, 1, 3]),
            sort=rnd.choice(["count", "value"]),
            min_count=rnd.choice([1, 1, 2, 5]),
        )
        expected = reference(docs, opts)
        with s.read() as conn:
            assert discover(conn, opts) == expected, ("planned", f, m)
        for plan in ("drive", "probe", "exclude"):
            monkeypatch.setattr(discovery, "_plan", lambda _census, plan=plan: plan)
            with s.read() as conn:
                assert discover(conn, opts) == expected, (plan, f, m)
        monkeypatch.undo()
        render(expected, filtered=f is not None, matched=m is not None)


def test_a_filter_and_match_over_the_binding_budget_are_refused_together() -> None:
    """Each fits alone; together they would not fit in one statement."""
    f = parse_filter({"field": "k", "operator": "all", "value": [f"v{i}" for i in range(4000)]})  # 8,000 parameters
    m = parse_match({"field": "value", "operator": "in", "value": [f"w{i}" for i in range(400)]})
    with pytest.raises(InvalidInput, match="binding budget"):
        MetadataOptions(["notes"], filter=f, match=m)
    MetadataOptions(["notes"], filter=f)


def test_a_clean_index_is_read_without_testing_each_entry(
    open_store: Callable[[str], IndexStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every document holding entries counts (whole scope, no filter, no deleted
    file's entries, as the indexer leaves an index): the `all` plan, and under it and
    every other plan, for every match, the same answer as the reference."""
    docs = [
        d
        for d in random_corpus(random.Random(11), 400)
        if d.active and d.collection != "other" or (d.state in (None, 2, 0) and d.meta is None)
    ]
    s = open_store("clean")
    add(s, docs)
    for m in MATCHES:
        for sort in ("count", "value"):
            opts = MetadataOptions(
                ["notes", "work"],
                match=None if m is None else parse_match(m),
                sort=sort,
                min_count=2,
                value_limit=3,
            )
            expected = reference(docs, opts)
            with s.read() as conn:
                census, _ = discovery._census(conn, '["notes", "work"]', None)
                assert discovery._plan(census) == "all"
                assert discover(conn, opts) == expected, m
            for plan in ("drive", "probe", "exclude"):
                monkeypatch.setattr(discovery, "_plan", lambda _census, plan=plan: plan)
                with s.read() as conn:
                    assert discover(conn, opts) == expected, (plan, m)
            monkeypatch.undo()
            with s.read() as conn:
                narrower = replace(opts, collections=("notes",))
                census, _ = discovery._census(conn, '["notes"]', None)
                assert discovery._plan(census) != "all"
                assert discover(conn, narrower) == reference(docs, narrower)


def test_each_document_holds_one_first_row_of_each_of_its_keys(open_store: Callable[[str], IndexStore]) -> None:
    """What the counts rest on: a document's rows of a key are one scalar (0), or an
    array's smallest value (1) and its others (2)."""
    docs = random_corpus(random.Random(5), 300)
    s = open_store("rows")
    add(s, docs)
    with s.read() as conn:
        bad = conn.execute(
            "SELECT doc_id, key FROM document_metadata GROUP BY doc_id, key"
            " HAVING count(*) FILTER (WHERE multi < 2) != 1 OR min(value) FILTER (WHERE multi = 1) != min(value)"
            " OR (count(*) > 1 AND min(multi) = 0)"
        ).fetchall()
        arrays = conn.execute("SELECT count(*) FROM document_metadata WHERE multi = 2").fetchone()[0]
    assert bad == [] and arrays > 0
