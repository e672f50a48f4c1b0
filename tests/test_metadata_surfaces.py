"""Metadata as a user meets it, through a real qmdd: frontmatter in notes, `--filter` on
the CLI, `filter` on `/query` and the CLI routes, the MCP `query` tool and the library;
the answer carries each result's metadata; bad filters are clear 4xx errors that change
nothing; discovery (`qmd collection metadata`, `POST /metadata`, the MCP `metadata` tool)
reports what a filter can be written from."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import MODELS_DIR, Daemon, Env, require, write
from test_mcp import error_of, tool

import qmd

pytestmark = pytest.mark.slow


def note(meta: str, body: str) -> str:
    return "---\ntitle: t\nqmd:\n  metadata:\n" + meta + "---\n\n" + body + "\n"


NOTES = {
    "ts-guide.md": note(
        "    topics: [typescript, programming]\n    status: published\n    priority: 3\n    reviewed: true\n",
        "# TypeScript guide\n\nDependency injection in typescript services.",
    ),
    "ts-draft.md": note(
        "    topics: [typescript]\n    status: draft\n    priority: 5\n",
        "# TypeScript draft\n\nDependency injection, a first draft.",
    ),
    "sql.md": note(
        "    topics: [sql, sqlite]\n    status: published\n    priority: high\n",
        "# SQL notes\n\nDependency injection has nothing to do with sqlite.",
    ),
    "plain.md": "# Plain\n\nDependency injection without any metadata.\n",
    "broken.md": note("    owner: null\n", "# Broken\n\nDependency injection with a broken block."),
}
PUBLISHED = {"field": "status", "operator": "eq", "value": "published"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, Daemon, Path]]:
    base = tmp_path_factory.mktemp("meta")
    env = Env(base)
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    root = write(base / "notes", NOTES)
    env.ok("collection", "add", str(root), "--name", "notes")
    yield env, d, root
    d.stop()


def files(results: list[dict[str, Any]]) -> set[str]:
    return {r["file"].rsplit("/", 1)[-1] for r in results}


def test_cli_filter_returns_only_eligible_results_with_their_metadata(served: tuple[Env, Daemon, Path]) -> None:
    env, _, root = served
    hits = env.json("search", "dependency injection", "--json", "--filter", json.dumps(PUBLISHED))
    assert files(hits) == {"ts-guide.md", "sql.md"}
    by_file = {h["file"].rsplit("/", 1)[-1]: h for h in hits}
    assert by_file["ts-guide.md"]["metadata"] == {
        "priority": 3,
        "reviewed": True,
        "status": "published",
        "topics": ["programming", "typescript"],
    }
    spec = root.parent / "filter.json"
    spec.write_text(
        json.dumps(
            {"operator": "and", "operands": [PUBLISHED, {"field": "priority", "operator": "type", "value": "number"}]}
        )
    )
    assert files(env.json("search", "dependency", "--json", "--filter", f"@{spec}")) == {"ts-guide.md"}
    r = env.qmd(
        "search", "dependency", "--filter", json.dumps({"field": "topics", "operator": "all", "value": ["sql"]})
    )
    assert r.returncode == 0 and "sql.md" in r.stdout and "ts-guide" not in r.stdout
    assert "1 documents in scope have metadata that could not be read" in r.stderr  # broken.md, announced


def test_cli_filter_errors_name_the_problem_without_a_traceback(served: tuple[Env, Daemon, Path]) -> None:
    env, _, _ = served
    r = env.qmd("search", "x", "--filter", '{"field": "status", "operator": "eq", ')
    assert r.returncode == 2 and "is not JSON" in r.stderr and "line 1, column" in r.stderr
    r = env.qmd("search", "x", "--filter", "@/nonexistent/f.json")
    assert r.returncode == 2 and "cannot read /nonexistent/f.json" in r.stderr
    r = env.qmd(
        "query",
        "x",
        "--filter",
        json.dumps(
            {"operator": "and", "operands": [PUBLISHED, PUBLISHED, {"field": "t", "operator": "in", "value": 1}]}
        ),
    )
    assert r.returncode != 0 and "filter.operands[2].value" in r.stderr and "Traceback" not in r.stderr
    r = env.qmd("vsearch", "x", "--filter", json.dumps({"field": "t", "operator": "equals", "value": 1}))
    assert r.returncode != 0 and "unknown operator 'equals'" in r.stderr and "Traceback" not in r.stderr


def test_http_query_filters_and_carries_metadata(served: tuple[Env, Daemon, Path]) -> None:
    _, d, _ = served
    r = d.http.post(
        "/query", json={"searches": [{"type": "lex", "query": "dependency injection"}], "filter": PUBLISHED}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert files(body["results"]) == {"ts-guide.md", "sql.md"}
    assert all(res["metadata"]["status"] == "published" for res in body["results"])
    assert body["filter"] == {"documents": 5, "eligible": 2, "pending": 0, "rejected": 1}
    plain = d.http.post("/query", json={"searches": [{"type": "lex", "query": "dependency injection"}]}).json()
    assert len(plain["results"]) == 5 and plain["filter"] is None
    keyword = d.http.post("/v1/keyword", json={"query": "dependency", "filter": PUBLISHED, "limit": 10}).json()
    assert files(keyword["results"]) == {"ts-guide.md", "sql.md"}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"field": "status", "operator": "eq"}, "filter.value"),
        ({"field": "status", "operator": "in", "value": "x"}, "filter.value"),
        ({"operator": "and", "operands": [{"field": "a", "operator": "eq", "value": [1]}]}, "filter.operands[0].value"),
        ({"field": "a", "operator": "eq", "value": 1, "caseInsensitive": True}, "caseInsensitive"),
        ({"operator": "not", "operand": {"field": "a", "operator": "nope", "value": 1}}, "filter.operand.operator"),
        ({"$eq": 1}, "filter"),
        ("status = published", "filter"),
    ],
)
def test_http_bad_filters_are_400s_that_name_the_node(served: tuple[Env, Daemon, Path], bad: Any, message: str) -> None:
    _, d, _ = served
    for path, body in (
        ("/query", {"query": "dependency", "filter": bad}),
        ("/v1/keyword", {"query": "dependency", "filter": bad}),
    ):
        r = d.http.post(path, json=body)
        assert r.status_code in (400, 422), (path, r.text)
        assert message in r.json()["error"], (path, r.json())


def test_hostile_filters_are_refused_and_change_nothing(served: tuple[Env, Daemon, Path]) -> None:
    _, d, _ = served
    before = d.http.get("/v1/status").json()["documents"]
    deep = '{"operator": "not", "operand": ' * 10_000 + '{"field": "a", "operator": "eq", "value": 1}' + "}" * 10_000
    r = d.http.post(
        "/query", content='{"query": "x", "filter": ' + deep + "}", headers={"content-type": "application/json"}
    )
    assert 400 <= r.status_code < 500 and "error" in r.json(), r.text[:300]
    huge = {"field": "a", "operator": "in", "value": ["v" * 100] * 10_500}
    r = d.http.post("/query", json={"query": "x", "filter": huge})
    assert 400 <= r.status_code < 500 and "error" in r.json(), r.text[:300]
    assert d.http.get("/health").status_code == 200
    assert d.http.get("/v1/status").json()["documents"] == before


def test_mcp_query_takes_the_filter(served: tuple[Env, Daemon, Path]) -> None:
    _, d, _ = served
    res = tool(d, "query", {"searches": [{"type": "lex", "query": "dependency injection"}], "filter": PUBLISHED})
    assert not res.is_error
    structured = res.structured_content
    assert structured is not None
    assert files(structured["results"]) == {"ts-guide.md", "sql.md"}
    assert all(r["metadata"]["status"] == "published" for r in structured["results"])
    assert 'metadata: {"priority": 3' in res.content[0].text  # type: ignore[union-attr]
    bad = tool(d, "query", {"query": "x", "filter": {"field": "a", "operator": "in", "value": 3}})
    assert "filter.value" in error_of(bad)


def test_library_filters_like_every_surface(served: tuple[Env, Daemon, Path], tmp_path: Path) -> None:
    _, _, root = served
    with qmd.open(tmp_path / "lib.sqlite", collections={"notes": {"path": str(root)}}) as index:
        index.update()
        out = index.search("dependency injection", filter=PUBLISHED, limit=10)
        assert {h.doc.path for h in out.hits} == {"ts-guide.md", "sql.md"}
        assert {h.doc.path: h.metadata.get("priority") for h in out.hits} == {"ts-guide.md": 3, "sql.md": "high"}
        with pytest.raises(qmd.InvalidInput, match=r"filter\.operator"):
            index.search("x", filter={"field": "a", "operator": "like", "value": "b"})


def test_status_says_what_a_filter_can_and_cannot_see(served: tuple[Env, Daemon, Path]) -> None:
    env, _, _ = served
    out = env.ok("status")
    assert "3 files with metadata, 1 rejected" in out
    assert "broken.md: qmd.metadata.owner: null is not a value" in out


# -- discovery ---------------------------------------------------------------------------

PRIORITY = {"field": "key", "operator": "eq", "value": "priority"}


def test_cli_discovery_prints_the_seeds_report(served: tuple[Env, Daemon, Path]) -> None:
    env, _, _ = served
    r = env.qmd("collection", "metadata", "notes")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(
        "priority  number | string  3 of 5 documents\n"
        "  number  2 docs  min 3  median 4  max 5\n"
        "  string  1 doc   high (1)\n"
        "\n"
        "status  string  3 of 5 documents  2 distinct\n"
        "  published  2\n"
        "  draft      1\n"
    )
    assert "topics  string[]  3 of 5 documents  4 distinct" in r.stdout
    assert "reviewed  boolean  1 of 5 documents\n  true 1" in r.stdout
    assert "notes/broken.md: qmd.metadata.owner: null" in r.stderr  # what discovery cannot see, on stderr
    filtered = env.ok(
        "collection",
        "metadata",
        "--match",
        json.dumps({"field": "key", "operator": "eq", "value": "topics"}),
        "--filter",
        json.dumps(PUBLISHED),
        "--value-limit",
        "2",
    )
    assert filtered.startswith("filter: 2 of 5 documents\n\ntopics  string[]  2 of 2 documents  4 distinct\n")
    assert "2 more values, use --value-limit <n>, --value-offset <n>, or --all-values" in filtered
    paged = env.ok("collection", "metadata", "notes", "--key-limit", "1")
    assert "3 more keys, use --key-limit <n>, --key-offset <n>, or --all-keys" in paged
    r = env.qmd("collection", "metadata", "notes", "--json")
    assert r.returncode == 2 and "No such option" in r.stderr  # text only, as the seed says
    r = env.qmd("collection", "metadata", "--match", json.dumps({"field": "key", "operator": "all", "value": ["a"]}))
    assert r.returncode != 0 and "match.operator: 'all' has no meaning for a single entry" in r.stderr
    r = env.qmd("collection", "metadata", "nope")
    assert r.returncode != 0 and "nope" in r.stderr and "Traceback" not in r.stderr


def test_listings_name_the_top_keys(served: tuple[Env, Daemon, Path]) -> None:
    env, _, _ = served
    assert "  Metadata: priority, status, topics, reviewed" in env.ok("collection", "list")
    shown = env.ok("collection", "show", "notes")
    assert "  Metadata: 4 keys, 3 of 5 documents" in shown and "published (2), draft (1)" in shown
    assert "    Metadata: priority, status, topics, reviewed" in env.ok("status")


def test_http_metadata_returns_the_structured_report(served: tuple[Env, Daemon, Path]) -> None:
    _, d, _ = served
    r = d.http.post("/metadata", json={"match": PRIORITY, "filter": PUBLISHED})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["documents"], body["filteredDocuments"], body["totalKeys"], body["remainingKeys"]) == (5, 2, 1, 0)
    (key,) = body["keys"]
    assert key["key"] == "priority" and key["documents"] == 2
    number, string = key["types"]
    assert number == {
        "type": "number",
        "multiValued": False,
        "documents": 1,
        "distinctValues": 1,
        "values": [{"value": 3, "documents": 1}],
        "remainingValues": 0,
        "range": {"min": 3, "median": 3, "max": 3},
        "collections": ["notes"],
    }
    assert string["values"] == [{"value": "high", "documents": 1}] and string["range"] is None
    assert body["rejected"] == 1 and body["rejectedExamples"][0]["path"] == "broken.md"
    for bad, message in (
        ({"keyLimit": 0}, "keyLimit"),
        ({"sort": "random"}, "sort"),
        ({"match": {"field": "title", "operator": "eq", "value": "x"}}, "match.field"),
        ({"match": {"field": "key", "operator": "exists", "value": True}}, "match.operator"),
        ({"filter": {"field": "a", "operator": "eq"}}, "filter.value"),
        ({"collections": ["nope"]}, "nope"),
        ({"keyLimt": 5}, "keyLimt"),
    ):
        r = d.http.post("/metadata", json=bad)
        assert r.status_code in (400, 404), (bad, r.text)
        assert message in r.json()["error"], (bad, r.json())


def test_mcp_metadata_tool_and_status_reveal_the_keys(served: tuple[Env, Daemon, Path]) -> None:
    _, d, _ = served
    res = tool(d, "metadata", {"match": PRIORITY})
    assert not res.is_error
    assert res.content[0].text.startswith("priority  number | string  3 of 5 documents")  # type: ignore[union-attr]
    assert res.structured_content is not None and res.structured_content["keys"][0]["key"] == "priority"
    assert "valueLimit" in error_of(tool(d, "metadata", {"valueLimit": -1}))
    status = tool(d, "status", {})
    assert status.structured_content is not None
    (notes,) = status.structured_content["collections"]
    assert [k["key"] for k in notes["metadataKeys"]] == ["priority", "status", "topics", "reviewed"]
    assert {"key": "topics", "documents": 3, "types": ["string[]"]} in notes["metadataKeys"]
    assert "metadata keys to filter on: priority (number|string, 3 docs)" in status.content[0].text  # type: ignore[union-attr]


def test_library_discovery(served: tuple[Env, Daemon, Path], tmp_path: Path) -> None:
    _, _, root = served
    with qmd.open(tmp_path / "lib.sqlite", collections={"notes": {"path": str(root)}}) as index:
        index.update()
        report = index.metadata(match=PRIORITY)
        assert isinstance(report, qmd.MetadataReport)
        assert [(t.type, t.documents) for t in report.keys[0].types] == [("number", 2), ("string", 1)]
        with pytest.raises(qmd.InvalidInput, match="key_limit"):
            index.metadata(key_limit=0)


def test_vector_and_hybrid_search_filter_with_a_real_embedder(tmp_path: Path) -> None:
    """The paths a user takes with vectors: `qmd embed`, then `vsearch` and `query`
    with a filter, through the real MiniLM embedder."""
    model = require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM test embedder (../shared/models)")
    env = Env(tmp_path)
    env.vars["QMD_EMBED_MODEL"] = str(model)
    d = Daemon(env)
    try:
        env.ok("collection", "add", str(write(tmp_path / "notes", NOTES)), "--name", "notes")
        env.ok("embed")
        hits = env.json(
            "vsearch", "injecting dependencies", "--json", "--min-score", "0", "--filter", json.dumps(PUBLISHED)
        )
        assert files(hits) == {"ts-guide.md", "sql.md"}
        r = env.qmd("vsearch", "injecting dependencies", "--json", "--min-score", "0")
        assert len(json.loads(r.stdout)) == 5 and "keyword results instead" not in r.stderr  # vectors ran, unfiltered
        body = d.http.post(
            "/query",
            json={
                "query": "injecting dependencies",
                "filter": {"field": "topics", "operator": "in", "value": ["typescript"]},
            },
        ).json()
        assert files(body["results"]) == {"ts-guide.md", "ts-draft.md"}
        assert next(s for s in body["stages"] if s["stage"] == "vector")["status"] == "ran"
    finally:
        d.stop()
