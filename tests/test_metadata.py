"""Metadata extraction: the `qmd: metadata:` frontmatter block becomes typed rows on
`update`, a bad block is rejected per document with the reason, and the body, title
and keyword search of a document are exactly what they were without metadata."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write

from qmd.server.config import Collection
from qmd.server.ingest.indexer import index_collection
from qmd.server.search import discovery
from qmd.server.search.lexical import parse_lex, search_fts
from qmd.server.store import metadata
from qmd.server.store.sqlite import Store
from qmd.server.text import frontmatter


def block(body: str) -> str:
    return "---\nqmd:\n  metadata:\n" + "".join(f"    {line}\n" for line in body.strip().split("\n")) + "---\n# T\n"


def entries(text: str, path: str = "a.md") -> set[tuple[str, str, object, bool]]:
    ex = frontmatter.extract(path, text)
    assert ex.state == frontmatter.OK, ex.error
    return {(e.key, e.type, e.value, e.multi) for e in ex.entries}


def test_the_seeds_example_is_typed() -> None:
    text = block("topics:\n  - typescript\n  - programming\nstatus: published\npriority: 3\nreviewed: true")
    assert entries(text) == {
        ("topics", "string", "typescript", True),
        ("topics", "string", "programming", True),
        ("status", "string", "published", False),
        ("priority", "number", 3, False),
        ("reviewed", "boolean", True, False),
    }


@pytest.mark.parametrize(
    ("yaml_value", "typed"),
    [
        ("on", ("string", "on")),  # YAML 1.1 would say True
        ("yes", ("string", "yes")),
        ("2025-01-02", ("string", "2025-01-02")),  # 1.1: a date
        ("1:30", ("string", "1:30")),  # 1.1: 90
        ("012", ("number", 12)),  # 1.1: octal 10
        ("0x1F", ("number", 31)),
        ("1e3", ("number", 1000.0)),  # 1.1: a string
        ("-2.5", ("number", -2.5)),
        ("False", ("boolean", False)),
        ('"42"', ("string", "42")),
        ('""', ("string", "")),
    ],
)
def test_values_follow_the_yaml_1_2_core_schema(yaml_value: str, typed: tuple[str, object]) -> None:
    ((key, type_, value, multi),) = entries(block(f"k: {yaml_value}"))
    assert (type_, value) == typed
    assert type(value) is type(typed[1])


def test_arrays_are_sets() -> None:
    assert entries(block("tags: [a, b, a]")) == {("tags", "string", "a", True), ("tags", "string", "b", True)}
    assert entries(block("n: [1, 1.0, 2]")) == {("n", "number", 1, True), ("n", "number", 2, True)}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("a: null", "qmd.metadata.a: null is not a value"),
        ("a: ~", "qmd.metadata.a: null is not a value"),
        ("a:", "qmd.metadata.a: null is not a value"),
        ("a: {b: 1}", "qmd.metadata.a: nested objects are not supported"),
        ("a: []", "qmd.metadata.a: an empty array"),
        ("a: [1, x]", "qmd.metadata.a: a mixed array (number and string)"),
        ("a: [true, 1]", "qmd.metadata.a: a mixed array (boolean and number)"),
        ("a: [[1]]", "qmd.metadata.a[0]: nested arrays are not supported"),
        ("a: .nan", "qmd.metadata.a: nan is not a finite number"),
        ("a: 99999999999999999999", "outside the 64-bit integer range"),
        ("1: x", "qmd.metadata: the key 1 is not a non-empty string"),
        ("a: !!binary aGVsbG8=", "qmd.metadata.a: a bytes is not supported"),
    ],
)
def test_a_bad_block_is_rejected_whole_with_the_reason(body: str, reason: str) -> None:
    ex = frontmatter.extract("a.md", block("ok: 1\n" + body))
    assert ex.state == frontmatter.REJECTED
    assert ex.entries == ()
    assert ex.error is not None and reason in ex.error


def test_frontmatter_that_is_not_yaml_is_rejected_only_when_it_names_qmd() -> None:
    bad = frontmatter.extract("a.md", "---\nqmd: [\n---\nbody\n")
    assert bad.state == frontmatter.REJECTED and bad.error and "not valid YAML at line" in bad.error
    assert frontmatter.extract("a.md", "---\ntitle: [\n---\nbody\n").state == frontmatter.NONE


@pytest.mark.parametrize(
    "text",
    [
        "# no frontmatter\n",
        "---\ntitle: x\n---\nbody\n",
        "---\nqmd:\n  other: 1\n---\n",
        "---\nqmd:\n  metadata: {}\n---\n",
        "text\n---\nqmd:\n  metadata:\n    a: 1\n---\n",  # not at the top: not frontmatter
    ],
)
def test_documents_without_a_block_have_none(text: str) -> None:
    assert frontmatter.extract("a.md", text).state == frontmatter.NONE


def test_only_markdown_files_carry_metadata() -> None:
    assert frontmatter.extract("a.txt", block("a: 1")).state == frontmatter.NONE
    assert frontmatter.extract("notes/a.MD", block("a: 1")).state == frontmatter.OK


def test_qmd_not_a_mapping_is_rejected() -> None:
    ex = frontmatter.extract("a.md", "---\nqmd: 3\n---\n")
    assert ex.state == frontmatter.REJECTED and ex.error == "qmd: expected a mapping holding 'metadata'"
    ex = frontmatter.extract("a.md", "---\nqmd:\n  metadata: [a]\n---\n")
    assert ex.state == frontmatter.REJECTED and ex.error == "qmd.metadata: expected a mapping of keys to values"


def test_fold_is_ascii_only() -> None:
    assert frontmatter.fold("ÄbC-É") == "Äbc-É"


def stored(store: Store) -> dict[str, dict[str, object]]:
    with store.read() as conn:
        ids = {r[0]: r[1] for r in conn.execute("SELECT id, path FROM documents WHERE active = 1")}
        got = metadata.fetch(conn, list(ids))
    return {ids[i]: dict(m) for i, m in got.items()}


def test_update_stores_rows_and_an_edit_replaces_them(tmp_path: Path) -> None:
    root = write(
        tmp_path / "n",
        {
            "a.md": block("status: draft\ntags: [x, y]"),
            "b.md": "# plain\n",
            "c.md": block("bad: null"),
        },
    )
    store = Store(tmp_path / "i.sqlite")
    try:
        coll = Collection(name="n", path=str(root))
        index_collection(store, coll)
        assert stored(store) == {"a.md": {"status": "draft", "tags": ["x", "y"]}}
        with store.read() as conn:
            counts = metadata.extraction_counts(conn)
            states = dict(conn.execute("SELECT path, meta_state FROM documents").fetchall())
        assert states == {"a.md": frontmatter.OK, "b.md": frontmatter.NONE, "c.md": frontmatter.REJECTED}
        assert (counts.with_metadata, counts.pending, counts.rejected) == (1, 0, 1)
        assert counts.examples[0].path == "c.md" and "null" in counts.examples[0].reason

        (root / "a.md").write_text(block("status: published\nreviewed: true"))
        index_collection(store, coll)
        assert stored(store) == {"a.md": {"status": "published", "reviewed": True}}
        (root / "a.md").unlink()
        index_collection(store, coll)
        assert stored(store) == {}
    finally:
        store.close()


def test_the_body_and_keyword_search_are_unchanged_by_metadata(tmp_path: Path) -> None:
    text = block("status: published") + "sourdough starter\n"
    root = write(tmp_path / "n", {"a.md": text})
    store = Store(tmp_path / "i.sqlite")
    try:
        index_collection(store, Collection(name="n", path=str(root)))
        with store.read() as conn:
            assert conn.execute("SELECT c.doc FROM documents d JOIN content c ON c.hash = d.hash").fetchone()[0] == text
            assert len(search_fts(conn, parse_lex("published"), None, 5)) == 1  # frontmatter stays searchable
    finally:
        store.close()


def test_documents_indexed_before_metadata_are_pending_until_the_next_update(tmp_path: Path) -> None:
    root = write(tmp_path / "n", {"a.md": block("status: draft"), "b.md": "# plain\n"})
    store = Store(tmp_path / "i.sqlite")
    try:
        coll = Collection(name="n", path=str(root))
        index_collection(store, coll)
        # What migration 3 leaves behind on an older index: state unknown, no rows.
        store.write(lambda conn: conn.execute("UPDATE documents SET meta_state = NULL"))
        store.write(lambda conn: conn.execute("DELETE FROM document_metadata"))
        with store.read() as conn:
            assert metadata.extraction_counts(conn).pending == 2
        summary = index_collection(store, coll)
        assert summary.unchanged == 2 and summary.metadata_extracted == 2
        with store.read() as conn:
            assert metadata.extraction_counts(conn).pending == 0
        assert stored(store) == {"a.md": {"status": "draft"}}
    finally:
        store.close()


def rows(store: Store) -> dict[str, list[tuple[str, object, int]]]:
    """Every stored row, by path (inactive documents too): (key, value, multi)."""
    with store.read() as conn:
        got: dict[str, list[tuple[str, object, int]]] = {}
        for path, key, value, multi in conn.execute(
            "SELECT d.path, m.key, m.value, m.multi FROM document_metadata m JOIN documents d ON d.id = m.doc_id"
            " ORDER BY d.path, m.key, m.type, m.value"
        ):
            got.setdefault(path, []).append((key, value, multi))
    return got


def test_an_arrays_first_value_is_marked_so_each_key_has_one_first_row(tmp_path: Path) -> None:
    """`multi`: 0 a scalar, 1 an array's smallest value (its first row in stored
    order), 2 its others; a one-element array is 1. Reading back is unchanged."""
    root = write(
        tmp_path / "n",
        {"a.md": block("tags: [zeta, Alpha, beta]\nn: [3, 1.5, 2]\nflags: [true, false]\none: [x]\ns: solo")},
    )
    store = Store(tmp_path / "i.sqlite")
    try:
        index_collection(store, Collection(name="n", path=str(root)))
        assert rows(store) == {
            "a.md": [
                ("flags", 0, 1),
                ("flags", 1, 2),
                ("n", 1.5, 1),
                ("n", 2, 2),
                ("n", 3, 2),
                ("one", "x", 1),
                ("s", "solo", 0),
                ("tags", "Alpha", 1),
                ("tags", "beta", 2),
                ("tags", "zeta", 2),
            ]
        }
        assert stored(store) == {
            "a.md": {
                "flags": [False, True],
                "n": [1.5, 2, 3],
                "one": ["x"],
                "s": "solo",
                "tags": ["Alpha", "beta", "zeta"],
            }
        }
    finally:
        store.close()


def test_an_arrays_first_row_is_written_before_its_others() -> None:
    """Were SQLite to hold two of an array's values equal, the one it ignores is the
    later, never the first: the key keeps exactly one row with `multi` < 2."""
    entries = (
        frontmatter.Entry("k", "number", 5, True),
        frontmatter.Entry("s", "string", "b", False),
        frontmatter.Entry("k", "number", 2, True),
        frontmatter.Entry("k", "number", 9, True),
    )
    assert [(r[1], r[3], r[5]) for r in metadata._rows(7, entries)] == [
        ("s", "b", metadata.SCALAR),
        ("k", 2, metadata.ARRAY_FIRST),
        ("k", 5, metadata.ARRAY_REST),
        ("k", 9, metadata.ARRAY_REST),
    ]


def test_a_document_that_leaves_the_index_leaves_its_metadata_and_extracts_again_on_return(tmp_path: Path) -> None:
    """Deactivation deletes the rows and makes the state pending, so only active
    documents hold metadata (discovery then reads the index testing nothing); the file
    coming back is re-extracted by the update that reactivates it."""
    text = block("status: draft\ntags: [x, y]")
    root = write(tmp_path / "n", {"a.md": text, "b.md": block("status: published"), "c.md": block("k: 1")})
    store = Store(tmp_path / "i.sqlite")
    try:
        coll = Collection(name="n", path=str(root))
        index_collection(store, coll)
        assert set(rows(store)) == {"a.md", "b.md", "c.md"}
        (root / "a.md").unlink()
        (root / "c.md").write_text("")  # skipped as empty: leaves the index too
        index_collection(store, coll)
        with store.read() as conn:
            states = {
                p: (a, s, e)
                for p, a, s, e in conn.execute("SELECT path, active, meta_state, meta_error FROM documents")
            }
            census, _ = discovery._census(conn, '["n"]', None)
            assert discovery._plan(census) == "all"
            assert metadata.extraction_counts(conn).pending == 0
        assert states == {"a.md": (0, None, None), "b.md": (1, frontmatter.OK, None), "c.md": (0, None, None)}
        assert set(rows(store)) == {"b.md"}

        (root / "a.md").write_text(text)
        summary = index_collection(store, coll)
        assert summary.indexed == 1
        assert stored(store) == {"a.md": {"status": "draft", "tags": ["x", "y"]}, "b.md": {"status": "published"}}
        assert rows(store)["a.md"] == [("status", "draft", 0), ("tags", "x", 1), ("tags", "y", 2)]
    finally:
        store.close()
