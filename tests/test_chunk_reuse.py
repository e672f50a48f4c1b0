"""Chunk-level reuse (issue 11): an edited document's unchanged chunks take their vectors
from its previous version instead of the model, with the real MiniLM embedder in process."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MODELS_DIR, require

import qmd
from qmd.server.store import vectors

EMBED = "all-MiniLM-L6-v2-Q8_0.gguf"


def long_note(sections: int) -> str:
    """A note of `sections` distinct paragraphs, long enough for one chunk each or so."""
    return "# Field notes\n\n" + "\n\n".join(
        f"## Day {i}\n\n"
        + " ".join(f"Observation {i}.{j}: the heron at pond {i} stood by reed {j}." for j in range(18))
        for i in range(sections)
    )


def chunk_rows(index: qmd.Index) -> dict[str, bytes]:
    """chunk_key → packed embedding of each chunk of the indexed document, as it is now."""
    with index.engine.store.read() as conn:
        return dict(
            conn.execute(
                "SELECT cv.chunk_key, cv.embedding FROM content_vectors cv"
                " JOIN documents d ON d.hash = cv.hash AND d.active = 1"
            )
        )


@pytest.mark.slow
def test_appending_a_line_re_embeds_only_the_changed_chunks(tmp_path: Path) -> None:
    embed = require(MODELS_DIR / EMBED, "the MiniLM test embedder (../shared/models)")
    notes = tmp_path / "notes"
    notes.mkdir()
    doc = notes / "field.md"
    doc.write_text(long_note(32))
    with qmd.open(
        tmp_path / "i.sqlite", collections={"n": {"path": str(notes)}}, models={"embed": str(embed)}
    ) as index:
        index.update()
        first = index.embed()
        assert first.embedded == first.chunks >= 30 and first.reused == 0
        before = chunk_rows(index)

        doc.write_text(doc.read_text() + "\nOne more line at the very end.\n")
        index.update()
        second = index.embed()
        assert second.chunks >= first.chunks
        assert second.embedded <= 2 and second.reused == second.chunks - second.embedded, second
        assert f"· reused {second.reused} ·" in second.line()
        after = chunk_rows(index)
        shared = set(before) & set(after)
        assert len(shared) == second.reused
        assert all(before[k] == after[k] for k in shared)  # the very vectors, copied

        # the reused vectors serve search exactly as fresh ones would
        hits = index.vsearch("heron at pond 17 by reed 5", limit=1, min_score=0).hits
        assert hits and hits[0].doc.path == "field.md"

        # a new title changes every chunk's input: nothing is reused
        doc.write_text(doc.read_text().replace("# Field notes", "# Pond journal", 1))
        index.update()
        third = index.embed()
        assert third.reused == 0 and third.embedded == third.chunks


def test_the_key_covers_what_the_embedder_reads() -> None:
    assert vectors.chunk_key("T", "text") == vectors.chunk_key("T", "text")
    assert len({vectors.chunk_key("T", "text"), vectors.chunk_key("U", "text"), vectors.chunk_key("T", "texts")}) == 3
    assert vectors.chunk_key(None, "x") == vectors.chunk_key("", "x")
