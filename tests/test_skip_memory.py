"""A skipped file is remembered in the index by its size and mtime (issue 35): a PDF that
takes its whole parse budget to be skipped is not read again by the next update, nor after
the daemon restarts, and is read again once it changes. On whichever backend the run is for."""

from __future__ import annotations

import os
from typing import Any

from conftest import Daemon, Env, write
from test_hostile_files import hostile_pdf, skipped


def update(env: Env) -> dict[str, Any]:
    """The one collection's report of `qmd update --json`."""
    report = env.json("update", "--json", timeout=60)
    [coll] = report["collections"]
    return dict(coll)


def test_a_skip_outlives_the_daemon_and_ends_when_the_file_changes(env: Env) -> None:
    root = write(env.home / "docs", {"a.md": "# A\n", "dense.pdf": hostile_pdf(20_000_000, 1, compress=True)})
    settings = {"QMD_LOADER_TIMEOUT_S": "1"}
    env.vars["QMD_NO_AUTOSTART"] = "1"
    d = Daemon(env, extra_env=settings)
    try:
        env.ok("collection", "add", str(root), "--name", "docs", "--mask", "**/*.{md,pdf}", timeout=60)
        assert "took longer than 1 s" in skipped(env, "docs")["dense.pdf"]
    finally:
        d.stop()

    d = Daemon(env, extra_env=settings)
    try:
        again = update(env)
        # timing-free evidence: the skip was decided from its size and mtime, not by a read
        assert again["remembered"] == 1 and again["loaders"] == {}, again
        assert [s["path"] for s in again["skipped"]] == ["dense.pdf"], again
        assert "took longer than 1 s" in skipped(env, "docs")["dense.pdf"]

        st = (root / "dense.pdf").stat()
        os.utime(root / "dense.pdf", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        changed = update(env)
        assert changed["remembered"] == 0 and [s["path"] for s in changed["skipped"]] == ["dense.pdf"], changed

        (root / "dense.pdf").write_bytes(pdf_of_words())
        fixed = update(env)
        assert fixed["new"] == 1 and fixed["skipped"] == [] and fixed["loaders"] == {"pdf": 1}, fixed
        assert "dense.pdf" not in skipped(env, "docs")
        assert "zanzibar" in env.ok("get", "docs/dense.pdf")
    finally:
        d.stop()


def test_a_skip_ends_when_the_size_changes_at_the_same_mtime(env: Env) -> None:
    """A file too large is remembered too, and read again once its size differs, even with
    its mtime put back."""
    root = write(env.home / "notes", {"a.md": "# A\n", "big.md": "# Big\n" + "zanzibar words\n" * 200})
    env.vars["QMD_NO_AUTOSTART"] = "1"
    d = Daemon(env, extra_env={"QMD_MAX_FILE_BYTES": "1000"})
    try:
        env.ok("collection", "add", str(root), "--name", "notes")
        assert "too large" in skipped(env, "notes")["big.md"]
        again = update(env)
        assert again["remembered"] == 1, again
        st = (root / "big.md").stat()
        (root / "big.md").write_text("# Big\nzanzibar\n")
        os.utime(root / "big.md", ns=(st.st_atime_ns, st.st_mtime_ns))
        smaller = update(env)
        assert smaller["remembered"] == 0 and smaller["new"] == 1, smaller
        assert "big.md" not in skipped(env, "notes")
    finally:
        d.stop()


def pdf_of_words() -> bytes:
    """A small PDF whose one page reads `zanzibar`."""
    return hostile_pdf(200, 1, compress=False).replace(b"hostile words here", b"zanzibar word here")
