"""Section read-back, `get FILE#heading`: a markdown section whole, with its real line
range, through the CLI, HTTP, MCP and the library; and every way to ask wrongly."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from conftest import Daemon, Env, write
from mcp import Client, types

import qmd
from qmd.server.errors import InvalidInput, NotFound
from qmd.server.text.lines import sections

pytestmark = [pytest.mark.slow, pytest.mark.contract]

GUIDE = """\
---
title: Guide
# a YAML comment, not a heading
---
# Kubernetes guide

Kubernetes runs containers.

## Getting Started!

Install kubectl first.

```sh
# a shell comment, not a heading
kubectl get pods
```

### Details

More details here.

## Getting Started

The second one.

# Appendix

The end.
"""
"""28 lines; its sections' lines are listed in the first test."""

FILES: dict[str, str | bytes] = {
    "guide.md": GUIDE,
    "code.py": "def f():\n    # a comment\n    return 1\n",
    "C#.md": "# Sharp\n\nA file whose name holds a hash.\n",
    "flat.md": "No headings at all.\n",
    "many.md": "".join(f"## Part {i}\n\ntext {i}\n\n" for i in range(25)),
}


def numbered(first: int, last: int) -> str:
    """Lines `first`..`last` of GUIDE as `get` numbers them."""
    lines = GUIDE.split("\n")
    return "\n".join(f"{n}: {lines[n - 1]}" for n in range(first, last + 1))


@pytest.fixture
def indexed(env: Env, daemon: Daemon, tmp_path: Path) -> Env:
    env.ok("collection", "add", str(write(tmp_path / "docs", FILES)), "--name", "docs", "--mask", "**/*")
    return env


def test_sections_follow_github_anchors_and_skip_code_and_frontmatter() -> None:
    found = [(s.anchor, s.first, s.last) for s in sections(GUIDE)]
    assert found == [
        ("kubernetes-guide", 5, 25),
        ("getting-started", 9, 21),
        ("details", 18, 21),
        ("getting-started-1", 22, 25),
        ("appendix", 26, 28),
    ]
    # GitHub's slug: punctuation but - and _ dropped, a link's text kept, repeats numbered past a real -1
    body = "# A `b` [link](http://x) C.D_e-f?\n# x\n# x-1\n# x\n"
    assert [s.anchor for s in sections(body)] == ["a-b-link-cd_e-f", "x", "x-1", "x-2"]


def test_cli_reads_a_section_whole_by_anchor_text_or_link(indexed: Env) -> None:
    out = indexed.ok("get", "docs/guide.md#getting-started")
    assert out.splitlines()[0].startswith("qmd://docs/guide.md")
    assert out.endswith(numbered(9, 21) + "\n")  # the fenced `# a shell comment` stays inside
    assert indexed.ok("get", "docs/guide.md#getting-started-1").endswith(numbered(22, 25) + "\n")
    assert indexed.ok("get", "docs/guide.md#Getting Started!").endswith(numbered(9, 21) + "\n")
    assert indexed.ok("get", "qmd://docs/guide.md#details").endswith(numbered(18, 21) + "\n")
    assert indexed.ok("get", "docs/guide.md#appendix").endswith(numbered(26, 28) + "\n")
    assert "A file whose name holds a hash." in indexed.ok("get", "docs/C#.md")


def test_a_link_into_another_index_takes_an_anchor_before_or_after_its_query(
    env: Env, daemon: Daemon, tmp_path: Path
) -> None:
    env.ok("--index", "work", "collection", "add", str(write(tmp_path / "work", FILES)), "--name", "plans")
    for link in ("qmd://plans/guide.md?index=work#details", "qmd://plans/guide.md#details?index=work"):
        assert env.ok("get", link).endswith(numbered(18, 21) + "\n"), link
    r = env.qmd("get", "qmd://plans/guide.md?index=work#nope")
    assert r.returncode != 0 and "has no section #nope" in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("name", "args", "says"),
    [
        ("docs/guide.md#nope", (), "has no section #nope; its sections: #kubernetes-guide, #getting-started"),
        ("docs/guide.md#details:18", (), "pick one"),
        ("docs/guide.md:18#details", (), "pick one"),
        ("docs/guide.md#details", ("--from", "3"), "pick one"),
        ("docs/guide.md#details", ("-l", "3"), "pick one"),
        ("docs/guide.md#details", ("--full",), "pick one"),
        ("docs/guide.md#", (), "an empty #anchor names no section"),
        ("docs/code.py#f", (), "docs/code.py is not markdown"),
        ("docs/flat.md#intro", (), "docs/flat.md has no headings"),
        ("docs/many.md#nope", (), "#part-19 (and 5 more)"),
        ("docs/missing.md#intro", (), "not found"),
    ],
)
def test_cli_refuses_a_bad_section_cleanly(indexed: Env, name: str, args: tuple[str, ...], says: str) -> None:
    r = indexed.qmd("get", name, *args)
    assert r.returncode != 0 and says.lower() in r.stderr.lower(), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_http_get_reads_a_section_and_answers_4xx_for_bad_ones(indexed: Env, daemon: Daemon) -> None:
    ok = daemon.http.post("/v1/get", json={"file": "qmd://docs/guide.md#details"})
    assert ok.status_code == 200, ok.text
    doc = ok.json()
    assert (doc["from_line"], doc["to_line"], doc["body"]) == (18, 21, "### Details\n\nMore details here.\n")
    public = daemon.http.post("/v1/get", json={"file": "docs/guide.md#getting-started-1"}).json()
    assert (public["from_line"], public["to_line"]) == (22, 25)
    unknown = daemon.http.post("/v1/get", json={"file": "docs/guide.md#nope"})
    assert unknown.status_code == 404 and "#getting-started-1, #appendix" in unknown.text, unknown.text
    both = daemon.http.post("/v1/get", json={"file": "docs/guide.md#details", "from_line": 2})
    assert both.status_code == 400 and "pick one" in both.text, both.text
    code = daemon.http.post("/v1/get", json={"file": "docs/code.py#f"})
    assert code.status_code == 400 and "not markdown" in code.text, code.text


def test_mcp_get_takes_an_anchor(indexed: Env, daemon: Daemon) -> None:
    async def body() -> tuple[types.CallToolResult, types.CallToolResult]:
        async with Client(f"{daemon.env.url}/mcp", mode="legacy", read_timeout_seconds=60) as client:
            found = await client.call_tool("get", {"file": "qmd://docs/guide.md#getting-started"})
            missing = await client.call_tool("get", {"file": "qmd://docs/guide.md#nope"})
            return found, missing

    found, missing = asyncio.run(body())
    assert not found.is_error, found
    [resource] = [c.resource for c in found.content if isinstance(c, types.EmbeddedResource)]
    assert isinstance(resource, types.TextResourceContents)
    assert numbered(9, 21) in resource.text and "22:" not in resource.text
    assert missing.is_error
    [text] = [c.text for c in missing.content if isinstance(c, types.TextContent)]
    assert "has no section #nope" in text and "#details" in text


def test_library_get_reads_a_section(tmp_path: Path) -> None:
    docs = write(tmp_path / "docs", FILES)
    with qmd.open(
        os.environ.get("QMD_INDEX_URL") or tmp_path / "i.sqlite",
        collections={"docs": {"path": str(docs), "pattern": "**/*"}},
    ) as index:
        index.update()
        section = index.get("docs/guide.md#details")
        assert (section.from_line, section.to_line, section.total_lines) == (18, 21, 28)
        assert section.body == "### Details\n\nMore details here.\n"
        with pytest.raises(NotFound, match="its sections: #kubernetes-guide"):
            index.get("docs/guide.md#nope")
        with pytest.raises(InvalidInput, match="pick one"):
            index.get("docs/guide.md#details", max_lines=2)
