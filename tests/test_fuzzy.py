"""Typo tolerance (`--fuzzy`): a word no document holds searched as its nearest indexed
word, announced in every surface's notes; and everything it must leave alone."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from conftest import Daemon, Env, write
from mcp import Client, types

import qmd
from qmd.server.search.typos import nearest

pytestmark = [pytest.mark.slow, pytest.mark.contract]

FILES: dict[str, str | bytes] = {
    "k8s.md": "# Kubernetes\n\nKubernetes runs containers on a cluster.\n",
    "ops.md": "# Operations\n\nWe deploy with kubernetes and helm.\n",
    "bread.md": "# Bread\n\nSourdough needs flour and water.\n",
}
NOTE = "searched 'kubernetes' for 'kuberentes'"


@pytest.fixture
def indexed(env: Env, daemon: Daemon, tmp_path: Path) -> Env:
    env.ok("collection", "add", str(write(tmp_path / "docs", FILES)), "--name", "docs")
    return env


def files(r: subprocess.CompletedProcess[str]) -> list[str]:
    """The file names of a `--json` answer's results."""
    return sorted(h["file"].rsplit("/", 1)[-1] for h in json.loads(r.stdout))


def test_nearest_counts_a_swap_as_one_edit_and_keeps_ties() -> None:
    assert nearest("kuberent", ["kubernet", "kubectl", "kube"], 1) == ["kubernet"]
    assert nearest("recieve", ["receiv", "recip"], 2) == ["receiv"]
    assert nearest("teh", ["the", "tea", "ten"], 1) == ["the", "tea", "ten"]
    assert nearest("abcdef", ["uvwxyz", "abc"], 2) == []


def _osa(a: str, b: str) -> int:
    """Optimal string alignment distance, cell by cell: the reference `nearest` must agree with."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[-1][-1]


def test_nearest_agrees_with_the_reference_distance() -> None:
    rng = random.Random(7)
    letters = "abcé😀"  # beyond ASCII and the BMP: the candidates are compared as code points
    for _ in range(500):
        stem = "".join(rng.choice(letters) for _ in range(rng.randint(2, 7)))
        terms = sorted({"".join(rng.choice(letters) for _ in range(rng.randint(1, 8))) for _ in range(20)})
        for reach in (1, 2):
            within = {t: _osa(stem, t) for t in terms if t != stem and _osa(stem, t) <= reach}
            least = min(within.values(), default=0)
            assert sorted(nearest(stem, terms, reach)) == sorted(t for t, n in within.items() if n == least)


def test_cli_search_corrects_and_says_so_only_when_asked(indexed: Env) -> None:
    plain = indexed.qmd("search", "kuberentes", "--json")
    assert plain.returncode == 0 and json.loads(plain.stdout) == [] and NOTE not in plain.stderr
    fuzzy = indexed.qmd("search", "kuberentes", "--fuzzy", "--json")
    assert fuzzy.returncode == 0, fuzzy.stderr
    assert files(fuzzy) == ["k8s.md", "ops.md"] and NOTE in fuzzy.stderr
    text = indexed.qmd("search", "sourdogh", "--fuzzy")
    assert "qmd://docs/bread.md" in text.stdout and "searched 'sourdough' for 'sourdogh'" in text.stderr
    far = indexed.qmd("search", "zzzzzzzz", "--fuzzy")
    assert far.returncode == 0 and "no indexed word is near 'zzzzzzzz'" in far.stderr


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("kubernetes", ["k8s.md", "ops.md"]),  # matches: never fuzzed
        ("flou", ["bread.md"]),  # a prefix of an indexed word matches
        ('"kuberentes"', []),  # a quoted phrase is exact
        ("bread -kuberentes", ["bread.md"]),  # a negation is exact
        ("kub3rnetes", []),  # a word with a digit is an identifier
        ("brd", []),  # under four letters: too many neighbours
    ],
)
def test_fuzzy_leaves_alone_what_it_must(indexed: Env, query: str, found: list[str]) -> None:
    r = indexed.qmd("search", query, "--fuzzy", "--json")
    assert r.returncode == 0 and files(r) == found, r.stderr
    assert "searched '" not in r.stderr and "no indexed word" not in r.stderr


def test_http_and_query_carry_the_note(indexed: Env, daemon: Daemon) -> None:
    keyword = daemon.http.post("/v1/keyword", json={"query": "kuberentes helm", "fuzzy": True}).json()
    assert keyword["warnings"] == [NOTE] and keyword["results"][0]["file"] == "qmd://docs/ops.md"
    public = daemon.http.post("/query", json={"searches": [{"type": "lex", "query": "kuberentes"}], "fuzzy": True})
    assert public.status_code == 200 and NOTE in public.json()["warnings"], public.text
    exact = daemon.http.post("/query", json={"searches": [{"type": "lex", "query": "kuberentes"}]}).json()
    assert exact["results"] == [] and NOTE not in exact["warnings"]
    bad = daemon.http.post("/v1/keyword", json={"query": "kuberentes", "fuzzy": "perhaps"})
    assert bad.status_code in (400, 422) and "fuzzy" in bad.text, bad.text
    cli = indexed.qmd("query", "kuberentes", "--fuzzy", "--json")
    assert cli.returncode == 0 and "k8s.md" in {f for f in files(cli)} and NOTE in cli.stderr, cli.stderr


def test_mcp_query_takes_fuzzy(indexed: Env, daemon: Daemon) -> None:
    async def body() -> types.CallToolResult:
        async with Client(f"{daemon.env.url}/mcp", mode="legacy", read_timeout_seconds=60) as client:
            return await client.call_tool(
                "query", {"searches": [{"type": "lex", "query": "kuberentes"}], "fuzzy": True}
            )

    result = asyncio.run(body())
    assert not result.is_error, result
    [text] = [c.text for c in result.content if isinstance(c, types.TextContent)]
    assert f"Warnings:\n  - {NOTE}" in text and "qmd://docs/k8s.md" in text
    assert result.structured_content is not None and NOTE in result.structured_content["warnings"]


def test_library_search_and_query_take_fuzzy(tmp_path: Path) -> None:
    docs = write(tmp_path / "docs", FILES)
    with qmd.open(
        os.environ.get("QMD_INDEX_URL") or tmp_path / "i.sqlite", collections={"docs": {"path": str(docs)}}
    ) as index:
        index.update()
        out = index.search("kuberentes", fuzzy=True)
        assert {h.doc.path for h in out.hits} == {"k8s.md", "ops.md"} and out.warnings == [NOTE]
        assert out.terms == ("kubernetes",)
        assert index.search("kuberentes").hits == []
        hybrid = index.query(searches=[("lex", "kuberentes")], fuzzy=True)
        assert hybrid.hits and NOTE in hybrid.warnings
        # the passage is found by the word searched, not the one typed
        (docs / "long.md").write_text("# Cluster notes\n\n" + "Some other line.\n" * 30 + "Then kubernetes.\n")
        index.update()
        for answer in (index.query("kuberentes", fuzzy=True), index.search("kuberentes", fuzzy=True)):
            [long] = [h for h in answer.hits if h.doc.path == "long.md"]
            assert long.line == 33 and "kubernetes" in long.snippet, long
