"""Keyword search through the daemon: hostile input, pointers, scope, ranking."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import NOTES, Daemon, Env, write

# Every test searches through a real qmdd: integration, outside the fast run (-m "not slow").
pytestmark = pytest.mark.slow

HOSTILE = [
    '"unbalanced',
    'a "b',
    '"',
    '""',
    "*",
    "**",
    "a*b",
    "NEAR(",
    "NEAR(a b)",
    "NEAR(a, 2)",
    ":",
    "col:term",
    "title:foo",
    "^",
    "^start",
    "-",
    "--",
    "- -",
    '-"',
    "-a",
    "AND",
    "OR",
    "NOT",
    "a AND",
    "OR b",
    "NOT NOT",
    "a OR OR b",
    "(",
    ")",
    "(a",
    "{a b}",
    "[x]",
    "+",
    "a+b",
    "\\",
    "'",
    "''",
    "don't",
    "🙂",
    "🙂🙂 rocket 🚀",
    "日本語",
    "東京 tokyo",
    "한국어 검색",
    # "a\x00b": a NUL is refused with a 400 like in every body (test_hostile_input.py)
    "\t\n",
    "   ",
    "a.b.c.",
    "..",
    ".",
    "-.-",
    "#",
    "#abc",
    "%",
    "_",
    "__init__",
    "C++",
    "c#",
    "f(x)=y",
    "x" * 300,
    "word " * 2000,
    "é" * 50,
    "ß straße",
]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, Daemon, Path]]:
    """One daemon for the read-only tests of this module."""
    base = tmp_path_factory.mktemp("search")
    env = Env(base)
    d = Daemon(env)
    notes = write(base / "notes", NOTES)
    env.ok("collection", "add", str(notes), "--name", "notes")
    yield env, d, notes
    d.stop()


@pytest.fixture
def corpus(shared: tuple[Env, Daemon, Path]) -> Path:
    return shared[2]


@pytest.fixture
def shared_daemon(shared: tuple[Env, Daemon, Path]) -> Daemon:
    return shared[1]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_never_fail(shared_daemon: Daemon, corpus: Path, query: str) -> None:
    r = shared_daemon.http.post("/v1/keyword", json={"query": query})
    assert r.status_code == 200, r.text
    r = shared_daemon.http.post("/query", json={"searches": [{"type": "lex", "query": query}]})
    assert r.status_code in (200, 400), r.text


def test_random_unicode_queries_never_fail(shared_daemon: Daemon, corpus: Path) -> None:
    rng = random.Random(7)
    alphabet = "abc XYZ 0123 \"-*():^.,+_#@!?'\\/{}[]<>~`|&;日本🙂é\t"
    for _ in range(150):
        q = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        r = shared_daemon.http.post("/v1/keyword", json={"query": q})
        assert r.status_code == 200, (q, r.text)


def test_ten_kilobytes_of_text(shared_daemon: Daemon, corpus: Path) -> None:
    text = (Path(__file__).read_text() * 3)[:10_240]
    r = shared_daemon.http.post("/v1/keyword", json={"query": text})
    assert r.status_code == 200
    assert any("only the first" in w for w in r.json()["warnings"])
    assert shared_daemon.http.post("/v1/keyword", json={"query": "x" * 30_000}).status_code == 400


def test_pointer_line_ranges_are_real(shared_daemon: Daemon, corpus: Path) -> None:
    for q in ("angel investors", "sourdough", "multi-agent memory", "startup"):
        for hit in shared_daemon.http.post("/v1/keyword", json={"query": q, "limit": 10}).json()["results"]:
            lines = (corpus / hit["path"]).read_text().split("\n")
            assert hit["snippet"] == "\n".join(lines[hit["start_line"] - 1 : hit["end_line"]])
            assert hit["start_line"] <= hit["line"] <= hit["end_line"]


def test_natural_language_question_finds_partial_matches(shared_daemon: Daemon, corpus: Path) -> None:
    hits = shared_daemon.http.post(
        "/v1/keyword", json={"query": "how do I raise money for a startup", "limit": 5}
    ).json()
    files = [h["path"] for h in hits["results"]]
    assert files[0] == "fundraising.md"
    assert "ideas.md" in files  # matches only "startup"


def test_all_terms_rank_first(env: Env, daemon: Daemon, tmp_path: Path) -> None:
    root = write(
        tmp_path / "rank",
        {
            "all.md": "# Doc\n\nalpha beta gamma\n",
            "two.md": "# Doc\n\nalpha beta\n" + "alpha beta\n" * 30,
            "one.md": "# Doc\n\n" + "alpha\n" * 100,
        },
    )
    env.ok("collection", "add", str(root), "--name", "rank")
    hits = env.json("search", "alpha beta gamma", "--json")
    assert [h["file"] for h in hits] == ["qmd://rank/all.md", "qmd://rank/two.md", "qmd://rank/one.md"]
    raw = daemon.http.post("/v1/keyword", json={"query": "alpha beta gamma"}).json()["results"]
    # "alpha" and "beta" are in most of the three documents: BM25 gives them no weight
    # (FTS5 clamps their idf to 1e-6), so only the document with "gamma" scores.
    assert raw[0]["score"] > 0.5 and raw[1]["score"] < 0.01 and raw[2]["score"] < 0.01
    # --explain counts each hit's items (a search without it does not pay that pass)
    explained = env.ok("search", "alpha beta gamma", "--explain", "-n", "3")
    assert [line for line in explained.splitlines() if "Explain" in line] == [
        "Explain: BM25 matched 3 of 3 terms",
        "Explain: BM25 matched 2 of 3 terms",
        "Explain: BM25 matched 1 of 3 terms",
    ]


def test_syntax_phrases_negation_dots_hyphens(shared_daemon: Daemon, corpus: Path) -> None:
    def files(q: str) -> list[str]:
        return [
            h["path"] for h in shared_daemon.http.post("/v1/keyword", json={"query": q, "limit": 10}).json()["results"]
        ]

    assert files('"pitch deck"') == ["fundraising.md"]
    assert "fundraising.md" not in files("investors -angel")
    assert files("2026.4.10") == ["work/meeting-2026-04-10.md"]
    assert files("multi-agent") == ["work/meeting-2026-04-10.md"]
    assert files("sourd") == ["cooking/bread.md"]
    assert files("-bread") == []


def test_small_collection_not_starved(env: Env, daemon: Daemon, tmp_path: Path) -> None:
    big = write(
        tmp_path / "big", {f"n{i}.md": f"# Kubernetes {i}\n\nkubernetes kubernetes cluster\n" for i in range(300)}
    )
    small = write(tmp_path / "small", {"one.md": "# Notes\n\na passing mention of kubernetes\n"})
    env.ok("collection", "add", str(big), "--name", "big")
    env.ok("collection", "add", str(small), "--name", "small")
    hits = env.json("search", "kubernetes", "--json", "-c", "small", "-n", "5")
    assert [h["file"] for h in hits] == ["qmd://small/one.md"]
    merged = env.json("search", "kubernetes", "--json", "--all")
    assert len(merged) == 301


def test_inactive_and_removed_documents_do_not_match(env: Env, daemon: Daemon, notes: Path) -> None:
    env.ok("collection", "add", str(notes), "--name", "notes")
    (notes / "cooking" / "bread.md").unlink()
    assert "1 removed" in env.ok("update")
    assert env.json("search", "sourdough", "--json") == []
