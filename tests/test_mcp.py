"""`/mcp` through the official SDK client over Streamable HTTP, against a real `qmdd`.

Both protocol eras are exercised: `mode="legacy"` speaks the 2025 `initialize`
handshake most MCP clients use today, `mode="auto"` the SDK's default 2026-07-28
per-request protocol. The guard is checked with raw HTTP, as a browser would hit it.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from conftest import NOTES, Daemon, Env, write
from mcp import Client, MCPError, types

from qmd.defaults import AGENT_RELEVANCE_FLOOR
from qmd.server.http.mcp import TOOLS
from qmd.version import __version__

T = TypeVar("T")

MANY = 12
GLOBAL_CONTEXT = "A founder's working notes"
MANY_CONTEXT = "Zebra counts,\none per file"
"""A folder context of two lines, under the global one: three lines and a blank one."""
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw-test", "version": "1"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def run(body: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(body())


@asynccontextmanager
async def connect(daemon: Daemon, mode: str = "legacy") -> AsyncIterator[Client]:
    async with Client(f"{daemon.env.url}/mcp", mode=mode, read_timeout_seconds=60) as client:
        yield client


async def call(daemon: Daemon, tool: str, arguments: dict[str, Any], mode: str = "legacy") -> types.CallToolResult:
    async with connect(daemon, mode) as client:
        return await client.call_tool(tool, arguments)


def tool(daemon: Daemon, name: str, arguments: dict[str, Any], mode: str = "legacy") -> types.CallToolResult:
    return run(lambda: call(daemon, name, arguments, mode))


def text_of(result: types.CallToolResult) -> str:
    assert len(result.content) == 1 and isinstance(result.content[0], types.TextContent), result.content
    return result.content[0].text


def resources_of(result: types.CallToolResult) -> list[types.TextResourceContents]:
    out = []
    for item in result.content:
        if isinstance(item, types.EmbeddedResource):
            assert isinstance(item.resource, types.TextResourceContents)
            out.append(item.resource)
    return out


def error_of(result: types.CallToolResult) -> str:
    assert result.is_error, result
    return text_of(result)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the read-only tests: the shared notes, a space in a path, a global
    context, and a collection with more matches than the default limit."""
    base = tmp_path_factory.mktemp("mcp")
    env = Env(base)
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    notes = write(base / "notes", {**NOTES, "my notes/a b.md": "# Spaced\n\nA file whose path has spaces.\n"})
    many = write(base / "many", {f"m{i:02}.md": f"# Zebra {i}\n\nzebra stripes number {i}\n" for i in range(MANY)})
    env.ok("collection", "add", str(notes), "--name", "notes")
    env.ok("collection", "add", str(many), "--name", "many")
    env.ok("context", "add", "/", GLOBAL_CONTEXT)
    env.ok("context", "add", "qmd://many/", MANY_CONTEXT)
    yield d
    d.stop()


# -- handshake and listing ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_initialize_names_the_server_and_describes_the_index(shared: Daemon, mode: str) -> None:
    async def body() -> tuple[str, types.Implementation | None, str | None]:
        async with connect(shared, mode) as client:
            return client.protocol_version, client.server_info, client.instructions

    version, info, instructions = run(body)
    assert version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    assert info is not None and info.name == "qmd" and info.version == __version__
    assert instructions is not None
    lines = instructions.split("\n")
    assert lines[0] == f"QMD is your local search engine over {5 + MANY} markdown documents."
    assert lines[1] == f"Context: {GLOBAL_CONTEXT}"
    assert "Collections (scope with `collections` parameter): notes, many" in lines
    assert "Note: No vector embeddings yet. Run `qmd embed` to enable semantic search (vec/hyde)." in lines
    assert "Read the range with `get` before stating a fact from it" in instructions


@pytest.mark.slow
def test_instructions_follow_the_live_index(env: Env, daemon: Daemon, notes: Path) -> None:
    async def instructions() -> str:
        async with connect(daemon) as client:
            assert client.instructions is not None
            return client.instructions

    empty = run(instructions)
    assert empty.startswith("QMD is your local search engine over 0 markdown documents.\n")
    assert "Collections (scope" not in empty
    env.ok("collection", "add", str(notes), "--name", "notes")
    filled = run(instructions)
    assert filled.startswith(f"QMD is your local search engine over {len(NOTES)} markdown documents.\n")
    assert "Collections (scope with `collections` parameter): notes\n" in filled


@pytest.mark.slow
def test_tools_are_listed_in_order_with_annotations_and_schemas(shared: Daemon) -> None:
    async def body() -> list[types.Tool]:
        async with connect(shared) as client:
            return (await client.list_tools()).tools

    tools = run(body)
    assert [t.name for t in tools] == ["query", "get", "multi_get", "metadata", "status"]
    assert [t.title for t in tools] == [
        "Query",
        "Get Document",
        "Multi-Get Documents",
        "Metadata Discovery",
        "Index Status",
    ]
    for t in tools:
        assert t.annotations is not None
        assert (t.annotations.read_only_hint, t.annotations.open_world_hint) == (True, False), t.name
        assert t.input_schema["type"] == "object" and t.input_schema["additionalProperties"] is False
    by_name = {t.name: t for t in tools}
    query = by_name["query"].input_schema
    assert list(query["properties"]) == [
        "searches",
        "query",
        "limit",
        "minScore",
        "minRelevance",
        "candidateLimit",
        "collections",
        "intent",
        "rerank",
        "expand",
        "budgetMs",
        "filter",
        "chunkStrategy",
        "fuzzy",
    ]
    assert query["properties"]["limit"]["default"] == 8
    assert query["properties"]["budgetMs"]["default"] == 4000
    assert query["properties"]["minRelevance"]["default"] == AGENT_RELEVANCE_FLOOR
    # the tool's text quotes the defaults the schema holds
    text = by_name["query"].description or ""
    assert "At most 8 results" in text and "(default 4000)" in text
    assert f"(default {AGENT_RELEVANCE_FLOOR:g})" in text
    assert query["properties"]["rerank"].get("default") is None  # as asked, else with a model trained to rank
    assert query["properties"]["searches"]["maxItems"] == 10
    assert query["properties"]["searches"]["items"]["properties"]["type"]["enum"] == ["lex", "vec", "hyde"]
    assert "required" not in query
    get = by_name["get"].input_schema
    assert list(get["properties"]) == ["file", "fromLine", "maxLines", "full", "lineNumbers"]
    assert get["required"] == ["file"] and get["properties"]["lineNumbers"]["default"] is True
    multi = by_name["multi_get"].input_schema
    assert list(multi["properties"]) == ["pattern", "maxLines", "maxBytes", "lineNumbers"]
    assert multi["required"] == ["pattern"] and multi["properties"]["maxBytes"]["default"] == 65536
    assert by_name["status"].input_schema["properties"] == {}
    assert by_name["query"].output_schema is not None and by_name["status"].output_schema is not None


def test_listed_schemas_and_argument_models_name_the_same_parameters() -> None:
    """The schema is what agents read, the model is what validates: they must agree."""
    for name, spec in TOOLS.items():
        schema = spec.definition.input_schema
        fields = {info.alias or f: info for f, info in spec.args.model_fields.items()}
        assert list(schema["properties"]) == list(fields), name
        assert schema.get("required", []) == [f for f, info in fields.items() if info.is_required()], name
        for field, info in fields.items():
            if "default" in schema["properties"][field]:
                assert schema["properties"][field]["default"] == info.default, (name, field)


# -- query ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_query_returns_pointers_that_get_reads_back(shared: Daemon, mode: str) -> None:
    async def body() -> tuple[types.CallToolResult, types.CallToolResult]:
        async with connect(shared, mode) as client:
            found = await client.call_tool("query", {"searches": [{"type": "lex", "query": "angel investors"}]})
            assert found.structured_content is not None
            top = found.structured_content["results"][0]
            start, end = (int(x) for x in top["lines"].split("-"))
            return found, await client.call_tool("get", {"file": f"{top['file']}:{start}:{end - start + 1}"})

    found, read = run(body)
    assert not found.is_error
    assert found.structured_content is not None
    top = found.structured_content["results"][0]
    assert re.fullmatch(r"#[0-9a-f]{6}", top["docid"])
    assert (top["file"], top["title"], top["line"], top["lines"]) == (
        "qmd://notes/fundraising.md",
        "Raising a seed round",
        7,
        "6-9",
    )
    assert top["context"] == GLOBAL_CONTEXT
    assert 0 < top["score"] <= 1 and round(top["score"], 2) == top["score"]
    assert top["snippet"].split("\n")[:3] == [
        "@@ -6,4 @@ (5 before, 0 after)",
        "6: ",
        "7: Angel investors fund early startups.",
    ]
    text = text_of(found)
    assert text.startswith('Found 2 result(s) for "angel investors":\n\nNot run:\n  - rerank: ')
    line = r"^#[0-9a-f]{6} \d+% qmd://notes/fundraising\.md:6-9 - Raising a seed round \(relevance 0\.\d\d\)$"
    assert re.search(line, text, re.M)
    assert "7: Angel investors fund early startups." in text
    assert 'get file="qmd://notes/fundraising.md:6:4"' in text and "before citing" in text.lower().replace("\n", " ")
    [doc] = resources_of(read)
    assert doc.uri == "qmd://notes/fundraising.md" and doc.mime_type == "text/markdown"
    assert doc.text == (
        f"<!-- Context: {GLOBAL_CONTEXT} -->\n\n6: \n7: Angel investors fund early startups.\n"
        "8: We raise money from angels and VCs.\n9: Keep the pitch deck short."
    )


@pytest.mark.slow
def test_query_files_are_the_uris_http_gives_and_get_takes_back(shared: Daemon) -> None:
    """Issue 31: a result names its file as `/query` and the CLI do, and that name, as
    it is, reads the document back with `get` and `multi_get`."""
    searches = [{"type": "lex", "query": "zebra"}, {"type": "lex", "query": "angel investors"}]
    # MCP's default floor, given to HTTP too: the same request on both surfaces
    over_http = shared.http.post(
        "/query", json={"searches": searches, "limit": 20, "min_relevance": AGENT_RELEVANCE_FLOOR}
    )
    assert over_http.status_code == 200, over_http.text
    answer = tool(shared, "query", {"searches": searches, "limit": 20})
    assert answer.structured_content is not None
    results = answer.structured_content["results"]
    assert results == over_http.json()["results"]  # the same pointers, field for field
    files = [r["file"] for r in results]
    assert "qmd://notes/fundraising.md" in files and "qmd://many/m00.md" in files
    assert all(f.startswith("qmd://") for f in files)
    text = text_of(answer)
    for r in results:
        chance = f" (relevance {r['relevance']:.2f})"
        assert f"{r['docid']} {round(r['score'] * 100)}% {r['file']}:{r['lines']} - {r['title']}{chance}\n" in text

    for r in results[:3]:
        start, end = (int(x) for x in r["lines"].split("-"))
        [doc] = resources_of(tool(shared, "get", {"file": f"{r['file']}:{start}:{end - start + 1}"}))
        assert doc.uri == r["file"]
        assert doc.text.endswith("\n".join(r["snippet"].split("\n")[1:]))  # the pointed lines, numbered alike
    listed = tool(shared, "multi_get", {"pattern": ", ".join(files[:3])})
    assert not listed.is_error, listed
    assert [d.uri for d in resources_of(listed)] == files[:3]
    [single] = resources_of(tool(shared, "multi_get", {"pattern": files[0]}))
    assert single.uri == files[0]


@pytest.mark.slow
def test_query_text_shows_each_results_context_in_its_block(shared: Daemon) -> None:
    """Issue 31: the text carries each result's context as the CLI shows it (`Context: …`
    under the result's line), a context of several lines kept inside its result's block."""
    answer = tool(shared, "query", {"searches": [{"type": "lex", "query": "zebra"}, {"type": "lex", "query": "angel"}]})
    assert answer.structured_content is not None
    results = answer.structured_content["results"]
    contexts = {r["file"].removeprefix("qmd://").split("/")[0]: r["context"] for r in results}
    assert contexts == {"notes": GLOBAL_CONTEXT, "many": f"{GLOBAL_CONTEXT}\n\n{MANY_CONTEXT}"}
    blocks = text_of(answer).split("\n\n")
    for r in results:
        [block] = [b for b in blocks if b.startswith(f"{r['docid']} ")]
        lines = block.split("\n")
        if r["file"].removeprefix("qmd://").startswith("notes/"):
            assert lines[1] == f"Context: {GLOBAL_CONTEXT}"
            passage = lines[2:]
        else:
            assert lines[1:4] == [f"Context: {GLOBAL_CONTEXT}", "  Zebra counts,", "  one per file"]
            passage = lines[4:]
        assert passage == r["snippet"].split("\n")  # the passage whole, after the context


@pytest.mark.slow
def test_query_reports_vec_and_hyde_as_skipped(shared: Daemon) -> None:
    result = tool(
        shared,
        "query",
        {
            "searches": [
                {"type": "lex", "query": "sourdough"},
                {"type": "vec", "query": "how do I bake bread"},
                {"type": "hyde", "query": "Bake the loaf at a high temperature."},
            ],
            "intent": "baking at home",
        },
    )
    assert not result.is_error
    assert result.structured_content is not None
    assert [r["file"] for r in result.structured_content["results"]] == ["qmd://notes/cooking/bread.md"]
    skipped = {s["stage"]: s["reason"] for s in result.structured_content["skipped"]}
    assert set(skipped) == {"vector", "rerank"}
    assert skipped["vector"].startswith("vector search unavailable")
    assert 'not run: vec "how do I bake bread", hyde "Bake the loaf at a high temperature."' in skipped["vector"]
    stages = {s["stage"]: s["status"] for s in result.structured_content["stages"]}
    assert stages == {"keyword": "ran", "vector": "skipped", "fuse": "ran", "rerank": "skipped"}
    text = text_of(result)
    assert "Not run:\n  - vector: vector search unavailable" in text


@pytest.mark.slow
def test_plain_query_is_hybrid_and_says_what_did_not_run(shared: Daemon) -> None:
    result = tool(shared, "query", {"query": "sourdough", "rerank": False})
    assert result.structured_content is not None
    assert [r["file"] for r in result.structured_content["results"]] == ["qmd://notes/cooking/bread.md"]
    assert [s["stage"] for s in result.structured_content["skipped"]] == ["expand", "vector"]
    stages = {s["stage"]: s["status"] for s in result.structured_content["stages"]}
    assert stages["probe"] == "ran" and stages["rerank"] == "off"
    assert text_of(result).startswith('Found 1 result(s) for "sourdough":\n\nNot run:\n  - expand: ')


@pytest.mark.slow
def test_query_returns_at_most_eight_unless_limit_says_otherwise(shared: Daemon) -> None:
    async def counts() -> list[int]:
        async with connect(shared) as client:
            out = []
            for args in ({}, {"limit": 10}, {"limit": 3}):
                result = await client.call_tool("query", {"query": "zebra", **args})
                assert result.structured_content is not None
                out.append(len(result.structured_content["results"]))
            return out

    assert run(counts) == [8, 10, 3]


@pytest.mark.slow
def test_query_with_no_results_still_reports_what_did_not_run(shared: Daemon) -> None:
    result = tool(shared, "query", {"searches": [{"type": "lex", "query": "xylophone"}]})
    assert not result.is_error
    assert result.structured_content is not None and result.structured_content["results"] == []
    text = text_of(result)
    assert text.startswith('No results found for "xylophone"')
    assert "rerank" in text and "get file=" not in text


@pytest.mark.slow
def test_query_scoped_to_collections(shared: Daemon) -> None:
    searches = [{"type": "lex", "query": "zebra"}, {"type": "lex", "query": "bread"}]
    result = tool(shared, "query", {"searches": searches, "collections": ["notes"]})
    assert result.structured_content is not None
    assert {r["file"].split("/")[2] for r in result.structured_content["results"]} == {"notes"}
    assert "Collection not found: nope" in error_of(tool(shared, "query", {"query": "x", "collections": ["nope"]}))


@pytest.mark.slow
def test_query_and_searches_are_mutually_exclusive(shared: Daemon) -> None:
    both = tool(shared, "query", {"query": "bread", "searches": [{"type": "lex", "query": "bread"}]})
    assert error_of(both) == "Error: 'query' and 'searches' are mutually exclusive; provide only one"
    neither = tool(shared, "query", {"limit": 3})
    assert error_of(neither) == "Error: provide either 'query' (plain text) or 'searches' (typed sub-queries)"
    # Grammar errors (spec §11) reach the agent verbatim, without the "Error: " of the two above.
    bad = tool(shared, "query", {"query": "lex: bread\nvec: -crust"})
    assert error_of(bad).startswith("Line 2 (vec): Negation (-term) is not supported")


# -- unknown and invalid parameters ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,arguments,message",
    [
        (
            "query",
            {"query": "bread", "collection": "notes"},
            "unknown parameter 'collection' (did you mean 'collections'?)",
        ),
        ("query", {"query": "bread", "min_score": 0.5}, "unknown parameter 'min_score' (did you mean 'minScore'?)"),
        (
            "query",
            {"searches": [{"type": "lex", "query": "bread", "text": "x"}]},
            "unknown parameter 'searches[0].text' (expected one of: type, query)",
        ),
        (
            "query",
            {"searches": [{"type": "lex", "querry": "bread"}]},
            "unknown parameter 'searches[0].querry' (did you mean 'query'?)",
        ),
        ("get", {"file": "notes/ideas.md", "from_line": 2}, "unknown parameter 'from_line' (did you mean 'fromLine'?)"),
        ("get", {"path": "notes/ideas.md"}, "missing required parameter 'file'"),
        ("multi_get", {"pattern": "*.md", "maxbytes": 10}, "unknown parameter 'maxbytes' (did you mean 'maxBytes'?)"),
        ("status", {"verbose": True}, "unknown parameter 'verbose' (this tool takes no parameters)"),
    ],
)
def test_unknown_parameters_are_named_not_dropped(
    shared: Daemon, name: str, arguments: dict[str, Any], message: str
) -> None:
    assert message in error_of(tool(shared, name, arguments))


@pytest.mark.slow
def test_invalid_values_name_the_parameter(shared: Daemon) -> None:
    assert error_of(tool(shared, "query", {"query": "bread", "limit": 0})).startswith("invalid value for 'limit':")
    bad_type = error_of(tool(shared, "query", {"searches": [{"type": "regex", "query": "b.*"}]}))
    assert bad_type.startswith("invalid value for 'searches[0].type':")
    assert error_of(tool(shared, "get", {"file": "notes/ideas.md", "fromLine": 0})).startswith(
        "invalid value for 'fromLine':"
    )


@pytest.mark.slow
def test_unknown_tool_is_a_protocol_error(shared: Daemon) -> None:
    async def body() -> MCPError:
        async with connect(shared) as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("search", {"query": "bread"})
            return caught.value

    error = run(body)
    assert error.code == types.INVALID_PARAMS
    assert error.message == "Unknown tool: search (tools: query, get, multi_get, metadata, status)"


# -- get -----------------------------------------------------------------------------


def get_text(daemon: Daemon, arguments: dict[str, Any]) -> str:
    result = tool(daemon, "get", arguments)
    assert not result.is_error, result
    [doc] = resources_of(result)
    return doc.text.removeprefix(f"<!-- Context: {GLOBAL_CONTEXT} -->\n\n")


@pytest.mark.slow
def test_get_reads_ranges_with_line_numbers(shared: Daemon) -> None:
    assert get_text(shared, {"file": "notes/fundraising.md:5:3"}) == (
        "5: ## Investors\n6: \n7: Angel investors fund early startups."
    )
    assert get_text(shared, {"file": "notes/fundraising.md:8"}) == (
        "8: We raise money from angels and VCs.\n9: Keep the pitch deck short."
    )
    # Explicit arguments win over the suffix.
    assert get_text(shared, {"file": "notes/fundraising.md:1:2", "fromLine": 7, "maxLines": 1}) == (
        "7: Angel investors fund early startups."
    )
    assert get_text(shared, {"file": "qmd://notes/cooking/bread.md", "lineNumbers": False}) == (
        "# Sourdough bread\n\nMix flour, water and salt.\nBake at 230C for 40 minutes."
    )


@pytest.mark.slow
def test_get_past_the_end_is_an_error(shared: Daemon) -> None:
    message = error_of(tool(shared, "get", {"file": "notes/ideas.md:50:2"}))
    assert message == "notes/ideas.md has 3 lines; line 50 is past the end"


@pytest.mark.slow
def test_get_by_docid_and_encoded_uri(shared: Daemon) -> None:
    found = tool(shared, "query", {"query": "sourdough"})
    assert found.structured_content is not None
    docid = found.structured_content["results"][0]["docid"]
    assert get_text(shared, {"file": f"{docid}:1:1"}) == "1: # Sourdough bread"
    spaced = tool(shared, "get", {"file": "notes/my notes/a b.md"})
    [doc] = resources_of(spaced)
    assert doc.uri == "qmd://notes/my%20notes/a%20b.md"
    # The resource's URI, percent-encoded, reads the same document back, as `resources/read` does.
    assert get_text(shared, {"file": f"{doc.uri}:1:1"}) == "1: # Spaced"
    assert get_text(shared, {"file": "qmd://notes/my notes/a b.md:1:1"}) == "1: # Spaced"
    assert "Document not found: qmd://notes/my%20notes/nope.md" in error_of(
        tool(shared, "get", {"file": "qmd://notes/my%20notes/nope.md"})
    )


@pytest.mark.slow
def test_get_miss_suggests_similar_documents(shared: Daemon) -> None:
    message = error_of(tool(shared, "get", {"file": "notes/fundraisin.md"}))
    assert message.startswith("Document not found: notes/fundraisin.md\n\nDid you mean one of these?\n")
    assert "  - qmd://notes/fundraising.md" in message.split("\n")


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/etc/passwd", "../../../etc/passwd", "notes/../../etc/passwd"])
def test_get_outside_every_collection_is_an_error(shared: Daemon, path: str) -> None:
    message = error_of(tool(shared, "get", {"file": path}))
    assert "outside every collection" in message or "leaves its collection" in message
    assert "root:" not in message


# -- multi_get -------------------------------------------------------------------------


@pytest.mark.slow
def test_multi_get_by_glob_and_list(shared: Daemon) -> None:
    globbed = tool(shared, "multi_get", {"pattern": "cooking/*.md"})
    assert [r.uri for r in resources_of(globbed)] == ["qmd://notes/cooking/bread.md"]
    assert resources_of(globbed)[0].text.endswith(
        "\n1: # Sourdough bread\n2: \n3: Mix flour, water and salt.\n4: Bake at 230C for 40 minutes."
    )
    listed = tool(shared, "multi_get", {"pattern": "notes/fundraising.md, notes/ideas.md", "lineNumbers": False})
    assert [r.uri for r in resources_of(listed)] == ["qmd://notes/fundraising.md", "qmd://notes/ideas.md"]
    assert (
        resources_of(listed)[1].text
        == f"<!-- Context: {GLOBAL_CONTEXT} -->\n\n# Ideas\n\nA startup that sells bread to investors."
    )


@pytest.mark.slow
def test_multi_get_reports_errors_first_and_truncates(shared: Daemon) -> None:
    result = tool(shared, "multi_get", {"pattern": "notes/ideas.md, notes/nope.md", "maxLines": 1})
    assert not result.is_error
    first = result.content[0]
    assert isinstance(first, types.TextContent)
    assert first.text.startswith("Errors:\nDocument not found: notes/nope.md")
    [doc] = resources_of(result)
    assert doc.text.endswith("\n\n1: # Ideas\n\n[... truncated 2 more lines]")


@pytest.mark.slow
def test_multi_get_skips_large_files_naming_the_get_tool(shared: Daemon) -> None:
    result = tool(shared, "multi_get", {"pattern": "notes/fundraising.md, notes/ideas.md", "maxBytes": 100})
    [skipped] = [c.text for c in result.content if isinstance(c, types.TextContent)]
    assert re.fullmatch(
        r"\[SKIPPED: notes/fundraising\.md - File too large \([^)]+\)\. "
        r"Use 'get' with file=\"qmd://notes/fundraising\.md\" to retrieve\.\]",
        skipped,
    ), skipped
    assert [r.uri for r in resources_of(result)] == ["qmd://notes/ideas.md"]


@pytest.mark.slow
def test_multi_get_without_matches_is_an_error(shared: Daemon) -> None:
    assert error_of(tool(shared, "multi_get", {"pattern": "nowhere/*.md"})) == "No files matched pattern: nowhere/*.md"


# -- metadata ------------------------------------------------------------------------

TAGGED = {
    f"t{i}.md": f"---\nqmd:\n  metadata:\n    status: s{i % 3}\n    owner: o{i}\n    rank: {i}\n---\n\n# T{i}\n"
    for i in range(4)
}


@pytest.mark.slow
def test_metadata_text_names_the_tools_parameters_not_cli_flags(env: Env, daemon: Daemon, tmp_path: Path) -> None:
    """Issue 31: over MCP the report's hints name the `metadata` tool's parameters; the
    CLI's text for the same report keeps its flags."""
    env.ok("collection", "add", str(write(tmp_path / "tagged", TAGGED)), "--name", "tagged")
    windowed = tool(daemon, "metadata", {"keyLimit": 2, "valueLimit": 1})
    assert not windowed.is_error, windowed
    text = text_of(windowed)
    assert "3 more values, use valueLimit: <n>, valueOffset: <n>, or valueLimit: null" in text
    assert text.endswith("\n\n1 more key, use keyLimit: <n>, keyOffset: <n>, or keyLimit: null")
    assert "--" not in text
    cli = env.ok("collection", "metadata", "--key-limit", "2", "--value-limit", "1")
    assert "3 more values, use --value-limit <n>, --value-offset <n>, or --all-values" in cli
    assert "1 more key, use --key-limit <n>, --key-offset <n>, or --all-keys" in cli
    past = text_of(tool(daemon, "metadata", {"keyOffset": 5}))
    assert past == "No keys at keyOffset: 5, 3 keys in total."
    nothing = text_of(tool(daemon, "metadata", {"match": {"field": "key", "operator": "eq", "value": "nope"}}))
    assert nothing == "No metadata matches. Call `metadata` without `match` or `filter` to see which keys exist."


# -- status --------------------------------------------------------------------------


@pytest.mark.slow
def test_status_structured_content(shared: Daemon) -> None:
    result = tool(shared, "status", {})
    assert not result.is_error
    data = result.structured_content
    assert data is not None
    assert set(data) == {"totalDocuments", "needsEmbedding", "hasVectorIndex", "collections"}
    assert (data["totalDocuments"], data["needsEmbedding"], data["hasVectorIndex"]) == (5 + MANY, 5 + MANY, False)
    assert sorted((c["name"], c["documents"]) for c in data["collections"]) == [("many", MANY), ("notes", 5)]
    for c in data["collections"]:
        assert set(c) == {"name", "path", "pattern", "documents", "lastUpdated", "metadataKeys"}
        assert c["metadataKeys"] == []  # no metadata in these notes
        assert Path(c["path"]).is_dir() and c["pattern"] == "**/*.md"
        assert re.match(r"\d{4}-\d\d-\d\dT", c["lastUpdated"])
    stamps = [c["lastUpdated"] for c in data["collections"]]
    assert stamps == sorted(stamps, reverse=True)
    lines = text_of(result).split("\n")
    assert lines[:4] == [
        "QMD Index Status:",
        f"  Total documents: {5 + MANY}",
        f"  Needs embedding: {5 + MANY}",
        "  Vector index: no",
    ]
    assert lines[4].startswith("    vector search unavailable")
    assert "  Collections: 2" in lines
    assert any(re.fullmatch(r"    - notes: /.+/notes \(5 docs\)", line) for line in lines)


# -- resources -----------------------------------------------------------------------


@pytest.mark.slow
def test_resource_template_and_reads(shared: Daemon) -> None:
    async def body() -> tuple[list[types.ResourceTemplate], list[types.Resource], list[types.ReadResourceResult]]:
        async with connect(shared) as client:
            templates = (await client.list_resource_templates()).resource_templates
            listed = (await client.list_resources()).resources
            reads = [
                await client.read_resource(uri)
                for uri in (
                    "qmd://notes/fundraising.md",
                    "qmd://notes/my%20notes/a%20b.md",
                    "qmd://notes%2Fcooking%2Fbread.md",
                    "qmd://notes/nope.md",
                )
            ]
            return templates, listed, reads

    templates, listed, reads = run(body)
    [template] = templates
    assert (template.uri_template, template.title, template.mime_type) == (
        "qmd://{+path}",
        "QMD Document",
        "text/markdown",
    )
    assert listed == []
    texts = [r.contents[0].text for r in reads if isinstance(r.contents[0], types.TextResourceContents)]
    assert texts[0].startswith(f"<!-- Context: {GLOBAL_CONTEXT} -->\n\n1: # Raising a seed round\n2: \n")
    assert reads[1].contents[0].uri == "qmd://notes/my%20notes/a%20b.md" and "1: # Spaced" in texts[1]
    assert reads[2].contents[0].uri == "qmd://notes/cooking/bread.md" and "1: # Sourdough bread" in texts[2]
    assert texts[3].startswith("Document not found: notes/nope.md")


@pytest.mark.slow
def test_resource_outside_every_collection_is_refused(shared: Daemon) -> None:
    async def body() -> MCPError:
        async with connect(shared) as client:
            with pytest.raises(MCPError) as caught:
                await client.read_resource("qmd:///etc/passwd")
            return caught.value

    error = run(body)
    assert error.code == types.INVALID_PARAMS and "outside every collection" in error.message


# -- HTTP surface ----------------------------------------------------------------------


def raw_post(daemon: Daemon, body: dict[str, Any], **headers: str) -> httpx.Response:
    return daemon.http.post("/mcp", content=json.dumps(body), headers={**MCP_HEADERS, **headers})


@pytest.mark.slow
@pytest.mark.parametrize(
    "headers,reason",
    [
        ({"Origin": "http://evil.com"}, "Origin not allowed: http://evil.com"),
        ({"Origin": "null"}, "Origin not allowed: null"),
        ({"Origin": "http://127.0.0.1.evil.com"}, "Origin not allowed: http://127.0.0.1.evil.com"),
        ({"Host": "evil.example"}, "Host not allowed: evil.example"),
    ],
)
def test_guard_screens_mcp(shared: Daemon, headers: dict[str, str], reason: str) -> None:
    r = raw_post(shared, INITIALIZE, **headers)
    assert r.status_code == 403
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"jsonrpc": "2.0", "error": {"code": -32003, "message": f"Forbidden: {reason}"}, "id": None}


@pytest.mark.slow
@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1:8181", "https://[::1]"])
def test_local_origins_reach_mcp(shared: Daemon, origin: str) -> None:
    r = raw_post(shared, INITIALIZE, Origin=origin)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert "mcp-session-id" not in r.headers  # stateless: nothing to resume, nothing to expire
    result = r.json()["result"]
    assert result["serverInfo"] == {"name": "qmd", "version": __version__}
    assert result["instructions"].startswith("QMD is your local search engine over")


@pytest.mark.slow
def test_stateless_requests_need_no_handshake(shared: Daemon) -> None:
    r = raw_post(
        shared,
        {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "status", "arguments": {}}},
        **{"MCP-Protocol-Version": "2025-06-18"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["result"]["structuredContent"]["totalDocuments"] == 5 + MANY


@pytest.mark.slow
@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT"])
def test_only_post_is_served(shared: Daemon, method: str) -> None:
    r = shared.http.request(method, "/mcp", headers={"Accept": "text/event-stream, application/json"})
    assert r.status_code == 405
    assert r.headers["allow"] == "POST"


@pytest.mark.slow
def test_two_clients_at_once(shared: Daemon) -> None:
    async def client(query: str) -> list[list[str]]:
        async with connect(shared) as c:
            out = []
            for _ in range(5):
                result = await c.call_tool("query", {"query": query})
                assert result.structured_content is not None
                out.append([r["file"] for r in result.structured_content["results"]])
            return out

    async def both() -> tuple[list[list[str]], list[list[str]]]:
        return await asyncio.gather(client("sourdough"), client("angel"))

    breads, angels = run(both)
    assert breads == [["qmd://notes/cooking/bread.md"]] * 5
    assert all(files[0] == "qmd://notes/fundraising.md" for files in angels)


@pytest.mark.slow
def test_inspector_cli_lists_tools(shared: Daemon, tmp_path: Path) -> None:
    """The reference client, if npm can fetch it here."""
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("npx is not installed")
    package = "@modelcontextprotocol/inspector"
    home = {"npm_config_update_notifier": "false", "PATH": shared.env.vars["PATH"], "HOME": str(Path.home())}
    try:
        probe = subprocess.run([npx, "-y", package, "--help"], capture_output=True, text=True, timeout=300, env=home)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{package} did not install within 5 minutes")
    if probe.returncode != 0:
        pytest.skip(f"{package} cannot be installed here: {(probe.stderr or probe.stdout).strip()[-300:]}")
    r = subprocess.run(
        [npx, "-y", package, "--cli", f"{shared.env.url}/mcp", "--transport", "http", "--method", "tools/list"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=home,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert [t["name"] for t in json.loads(r.stdout)["tools"]] == ["query", "get", "multi_get", "metadata", "status"]
