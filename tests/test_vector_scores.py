"""Vector scores an agent can threshold: `1/(1 + cosine distance)`, in (0, 1], and no default
floor tied to one model's cosine scale. Through the CLI, HTTP and the library, with the real
MiniLM GGUF over the eval corpus and the notes (slow), and the mapping itself (fast)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MODELS_DIR, NOTES, Daemon, Env, embedded_eval_and_notes, eval_spec, require, write

import qmd
from qmd.defaults import VSEARCH_MIN_SCORE
from qmd.server.search.vector import vector_score

UNRELATED = "quantum chromodynamics on a lattice of gluons"
"""About nothing in the notes: MiniLM's cosine to some of them is negative."""


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, Daemon]]:
    env, d = embedded_eval_and_notes(tmp_path_factory.mktemp("vscores"))
    yield env, d
    d.stop()


def test_distance_to_score() -> None:
    """The seed's mapping: 1 at distance 0, 1/2 for orthogonal, 1/3 for opposite; monotone,
    so it ranks as the distance does; a rounding error below 0 is still at most 1."""
    assert [vector_score(d) for d in (0.0, 1.0, 2.0)] == [1.0, 0.5, pytest.approx(1 / 3)]
    assert vector_score(-1e-7) == 1.0
    distances = [0.0, 0.1, 0.7, 1.0, 1.3, 2.0]
    scores = [vector_score(d) for d in distances]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)


def test_the_cli_default_filters_nothing_and_says_so(env: Env) -> None:
    """`vsearch --help` shows the default floor (none), the one in `qmd.defaults`; a floor
    outside [0, 1] is a clean usage error, before any daemon is asked."""
    assert VSEARCH_MIN_SCORE == 0.0
    assert "--min-score FLOAT RANGE [default: 0.0; 0<=x<=1]" in " ".join(env.ok("vsearch", "--help").split())
    for bad in ("-0.1", "1.5", "abc"):
        r = env.qmd("vsearch", "bread", "--min-score", bad)
        assert r.returncode == 2 and "Invalid value for '--min-score'" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert not env.db.exists()  # nothing was started or written


@pytest.mark.slow
def test_min_score_0_keeps_every_document_of_an_unrelated_query(embedded: tuple[Env, Daemon]) -> None:
    """On the 4 notes, a query about none of them still answers with all 4, in (0, 1], by
    default and with `--min-score 0` alike; the text output lists them too."""
    env, _ = embedded
    default = env.json("vsearch", UNRELATED, "--json", "-c", "notes")
    zero = env.json("vsearch", UNRELATED, "--json", "-c", "notes", "--min-score", "0")
    assert default == zero
    assert sorted(h["file"] for h in zero) == sorted(f"qmd://notes/{p}" for p in NOTES)
    assert all(0 < h["score"] <= 1 for h in zero)
    text = env.ok("vsearch", UNRELATED, "-c", "notes", "--min-score", "0")
    assert "No results found" not in text and "qmd://notes/fundraising.md" in text


@pytest.mark.slow
def test_every_vector_score_is_in_0_1(embedded: tuple[Env, Daemon]) -> None:
    """Every score `vsearch` gives, over the whole index, and every vector score `query
    --explain` shows, is in (0, 1]; a floor above all of them empties the answer and says so."""
    env, d = embedded
    for text in (UNRELATED, "how do I raise money for a startup", "sourdough"):
        hits = d.http.post("/v1/vector", json={"query": text, "all": True}).raise_for_status().json()["results"]
        assert len(hits) == 6 + len(NOTES)
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True) and all(1 / 3 <= s <= 1 for s in scores), scores
    explained = env.json("query", UNRELATED, "--json", "--explain", "-n", "20")
    vec = [s for h in explained for s in h["explain"]["vectorScores"]]
    assert len(vec) == 6 + len(NOTES) and all(0 < s <= 1 for s in vec), vec
    assert env.ok("vsearch", "sourdough", "--min-score", "0.99") == "No results found above minimum score threshold.\n"


@pytest.mark.slow
def test_default_vsearch_finds_every_eval_answer(embedded: tuple[Env, Daemon]) -> None:
    """`qmd vsearch` as a user runs it (no flags) puts the right note in the top 3 for all 24
    eval queries; the old 0.3 cosine floor answered nothing for 5 of them."""
    env, _ = embedded
    spec = eval_spec()
    missed = []
    for q in spec["eval_queries"]:
        files = [h["file"].lower() for h in env.json("vsearch", q["query"], "--json", "-c", "eval")]
        if not any(q["expected_doc_substring"] in f for f in files[:3]):
            missed.append((q["query"], files[:3]))
    assert not missed and len(spec["eval_queries"]) == 24, missed


@pytest.mark.slow
def test_library_vsearch_has_the_same_default(tmp_path: Path) -> None:
    """`import qmd`'s vsearch floors at the shared default too: every note, scored in (0, 1]."""
    embed = require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM test embedder (../shared/models)")
    notes = write(tmp_path / "notes", NOTES)
    with qmd.open(
        tmp_path / "i.sqlite", collections={"notes": {"path": str(notes)}}, models={"embed": str(embed)}
    ) as ix:
        ix.update()
        ix.embed()
        hits = ix.vsearch(UNRELATED).hits
    assert len(hits) == len(NOTES) and all(0 < h.score <= 1 for h in hits)
