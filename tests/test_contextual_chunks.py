"""Contextual chunks (issue 33) and the splitter's floor (issue 31, seeds/001): each chunk is
embedded with its document's title and the headings it sits under, while its snippet and
line range stay its own text; a note of nothing but headings has no vectors, is not
pending, and is still found by keyword search."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MODELS_DIR, Daemon, Env, require, write

import qmd
from qmd.server.store import vectors
from qmd.server.text.headings import CONTEXT_CHARS, HeadingPaths, chunk_context, headings

EMBED = "all-MiniLM-L6-v2-Q8_0.gguf"


def paragraphs(topic: str, n: int) -> str:
    return "\n\n".join(
        f"Step {i}: keep the {topic} warm, fold it gently and let it rest for {i + 2} hours." for i in range(n)
    )


HANDBOOK = (
    "# Kitchen handbook\n\nHow this kitchen works.\n\n"
    "## Bread\n\n"
    "```sh\n# not a heading: a shell comment\n```\n\n"
    "### Sourdough\n\n" + paragraphs("dough", 40) + "\n\n## Cleaning\n\n" + paragraphs("counter", 6) + "\n"
)


def test_headings_skip_fences_and_paths_close_deeper_levels() -> None:
    assert [(h.level, h.text) for h in headings(HANDBOOK)] == [
        (1, "Kitchen handbook"),
        (2, "Bread"),
        (3, "Sourdough"),
        (2, "Cleaning"),
    ]
    paths = HeadingPaths(HANDBOOK)
    assert paths.at(0) == []
    assert paths.at(HANDBOOK.index("Step 30")) == ["Kitchen handbook", "Bread", "Sourdough"]
    assert paths.at(HANDBOOK.rindex("Step 3")) == ["Kitchen handbook", "Cleaning"]  # ## closed the ###
    assert paths.at(HANDBOOK.index("Step 1")) == ["Kitchen handbook", "Bread", "Sourdough"]  # asked out of order


def test_context_says_only_what_the_chunk_does_not() -> None:
    # a first chunk holds its title's heading: nothing to add, embedded as it always was
    assert chunk_context("Kitchen handbook", ["Kitchen handbook"], "# Kitchen handbook\n\nHow…") == ""
    # a first heading repeating the title is said once
    assert chunk_context("Kitchen handbook", ["Kitchen handbook", "Bread"], "Step 3") == "Kitchen handbook › Bread"
    # a title the chunk does not hold leads it
    assert chunk_context("Kitchen handbook", [], "Step 3") == "Kitchen handbook"
    long = chunk_context("T", ["x" * 100, "y" * 100], "body")
    assert len(long) == CONTEXT_CHARS and long.endswith("…")


def stored_keys(index: qmd.Index, path: str) -> set[str]:
    with index.engine.store.read() as conn:
        return {
            r[0]
            for r in conn.execute(
                "SELECT cv.chunk_key FROM content_vectors cv JOIN documents d ON d.hash = cv.hash"
                " WHERE d.path = ? AND d.active = 1",
                (path,),
            )
        }


def test_chunks_are_embedded_with_their_heading_path_and_heading_only_notes_with_nothing(tmp_path: Path) -> None:
    embed = require(MODELS_DIR / EMBED, "the MiniLM test embedder (../shared/models)")
    notes = write(
        tmp_path / "notes",
        {
            "handbook.md": HANDBOOK,
            "agenda.md": "# Meeting 2026-05-01\n\n## Attendees\n\n## Decisions\n",
            "d123.md": "No heading here, so the title is the file name.\n",
        },
    )
    with qmd.open(
        tmp_path / "i.sqlite", collections={"n": {"path": str(notes)}}, models={"embed": str(embed)}
    ) as index:
        index.update()
        report = index.embed()
        assert report.documents == 3 and report.pending_after == 0, report
        assert index.embed().documents == 0  # the heading-only note is done, not pending for ever

        keys = stored_keys(index, "handbook.md")
        assert len(keys) > 3
        body = HANDBOOK
        # the chunk a key was made from is recovered by trying the contexts it could have had
        contexts = [
            "",
            "Kitchen handbook › Bread › Sourdough",
            "Kitchen handbook › Cleaning",
            "Kitchen handbook › Bread",
        ]
        with index.engine.store.read() as conn:
            spans = conn.execute(
                "SELECT cv.pos, cv.end_pos, cv.chunk_key FROM content_vectors cv JOIN documents d ON d.hash = cv.hash"
                " WHERE d.path = 'handbook.md' ORDER BY cv.seq"
            ).fetchall()
        used = [next(c for c in contexts if vectors.chunk_key(c, body[a:b]) == key) for a, b, key in spans]
        assert used[0] == ""  # the first chunk opens with the title's heading
        assert "Kitchen handbook › Bread › Sourdough" in used[1:]
        assert stored_keys(index, "agenda.md") == set()
        # a title made up from the file name is not the document's words: no context
        text = "No heading here, so the title is the file name.\n"
        assert stored_keys(index, "d123.md") == {vectors.chunk_key("", text)}

        # keyword search still finds the note; vector search, which has nothing of it, does not
        assert [h.doc.path for h in index.search("Attendees").hits] == ["agenda.md"]
        assert all(h.doc.path != "agenda.md" for h in index.vsearch("meeting attendees", min_score=0).hits)
        # the snippet and lines are the chunk's own text, never the context it was embedded with
        hit = index.vsearch("let the dough rest for hours", limit=1, min_score=0).hits[0]
        assert hit.doc.path == "handbook.md" and "›" not in hit.snippet


@pytest.mark.slow
def test_the_cli_reports_heading_only_notes_as_done(env: Env, tmp_path: Path) -> None:
    embed = require(MODELS_DIR / EMBED, "the MiniLM test embedder (../shared/models)")
    env.vars["QMD_EMBED_MODEL"] = str(embed)
    notes = write(tmp_path / "notes", {"agenda.md": "# Standup\n\n## Blockers\n", "log.md": "# Log\n\nShipped it.\n"})
    d = Daemon(env)
    try:
        env.ok("collection", "add", str(notes), "--name", "notes")
        env.ok("embed")
        assert "0 pending" in env.ok("embed")
        assert "nothing pending" in env.ok("status")
        assert env.json("search", "blockers", "--json")[0]["file"] == "qmd://notes/agenda.md"
    finally:
        d.stop()
