"""Indexing: what gets in, what stays out, and that the index never lies about its corpus.

Integration tests drive the real `qmdd` through the real `qmd` CLI and assert the exact
counts of the summary line `Indexed: A new, B updated, C unchanged, D removed`, then
check by searching that the index answers from what is on disk now (seeds/001, spec
§6). The pure pieces (`split_mask`, `extract_title`, `discover`) are unit-tested
directly, as is `index_collection` on a throwaway store where a failure cannot be
produced through the CLI (we run as root, so permissions cannot make a folder
unreadable).
"""

from __future__ import annotations

import errno
import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Daemon, Env, write

from qmd.server.config import Collection
from qmd.server.errors import HookFailed
from qmd.server.ingest.indexer import discover, index_collection, run_hook, split_mask
from qmd.server.ingest.loaders import extract_title
from qmd.server.store.sqlite import Store

SUMMARY_RE = re.compile(r"Indexed: (\d+) new, (\d+) updated, (\d+) unchanged, (\d+) removed")
Counts = tuple[int, int, int, int]


# -- helpers ----------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One finished CLI call, with every summary line parsed in collection order."""

    stdout: str
    stderr: str
    counts: list[Counts]

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run(env: Env, *args: str, code: int = 0) -> Run:
    """Run `qmd`, insist on the exit code and on no traceback, parse summary lines."""
    r = env.qmd(*args)
    assert r.returncode == code, f"qmd {' '.join(args)} exited {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    counts = [(int(a), int(b), int(c), int(d)) for a, b, c, d in SUMMARY_RE.findall(r.stdout)]
    return Run(r.stdout, r.stderr, counts)


def update(env: Env) -> Counts:
    """`qmd update` over a single collection: its one summary."""
    out = run(env, "update")
    assert len(out.counts) == 1, out.output
    return out.counts[0]


def add(env: Env, folder: Path, name: str, *mask: str) -> Run:
    """`qmd collection add`, which indexes the new collection at once (one summary)."""
    out = run(env, "collection", "add", str(folder), "--name", name, *mask)
    assert len(out.counts) == 1, out.output
    return out


def found(env: Env, query: str) -> dict[str, str]:
    """`file` (without `qmd://`) → docid of every hit for `query`."""
    hits = env.json("search", query, "--json", "--all")
    assert isinstance(hits, list)
    return {h["file"].removeprefix("qmd://"): h["docid"] for h in hits}


def config_path(env: Env) -> Path:
    """The daemon's YAML config (XDG_CONFIG_HOME/qmd/index.yml)."""
    return env.config / "qmd" / "index.yml"


def edit_collection(env: Env, name: str, **changes: object) -> None:
    """Hand-edit the YAML the way a user would; the daemon must notice on its next request."""
    cfg = yaml.safe_load(config_path(env).read_text(encoding="utf-8"))
    cfg["collections"][name].update(changes)
    config_path(env).write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")


def skipped_in_status(env: Env) -> dict[str, str]:
    """`path → reason` from the `Skipped:` block of `qmd status`."""
    lines = run(env, "status").stdout.splitlines()
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        if line.strip().startswith("Skipped:"):
            for item in lines[i + 1 :]:
                if not item.startswith("      "):
                    break
                path, _, reason = item.strip().rpartition(": ")
                out[path] = reason
    return out


def same_stat_rewrite(path: Path, text: str) -> None:
    """Replace a file's content with text of the same size and put its mtime back."""
    st = path.stat()
    assert len(text.encode()) == st.st_size
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def content_rows(env: Env, docid: str) -> int:
    """Rows of the `content` table whose hash starts with `docid`, read straight from the file."""
    with closing(sqlite3.connect(f"file:{env.db}?mode=ro", uri=True)) as conn:
        return conn.execute("SELECT COUNT(*) FROM content WHERE hash LIKE ?", (docid.lstrip("#") + "%",)).fetchone()[0]


@pytest.fixture
def qenv(env: Env, daemon: Daemon) -> Iterator[Env]:
    """The env of a running daemon whose log must stay free of tracebacks."""
    yield env
    assert "Traceback" not in daemon.output.read_text(errors="replace")


@contextmanager
def daemon_with(env: Env, extra_env: dict[str, str]) -> Iterator[Daemon]:
    """A daemon started with extra environment (e.g. QMD_MAX_FILE_BYTES)."""
    d = Daemon(env, extra_env=extra_env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    try:
        yield d
    finally:
        d.stop()
    assert "Traceback" not in d.output.read_text(errors="replace")


# -- pure functions ---------------------------------------------------------------


@pytest.mark.parametrize(
    "mask,expected",
    [
        ("**/*.md", ["**/*.md"]),
        ("*.md,*.txt", ["*.md", "*.txt"]),
        (" a.md , ,*.txt ", ["a.md", "*.txt"]),
        ("{a,b}.md", ["{a,b}.md"]),
        ("{a,b}.md,notes/[a,b]*.txt", ["{a,b}.md", "notes/[a,b]*.txt"]),
        ("", []),
        (" , ", []),
    ],
)
def test_split_mask(mask: str, expected: list[str]) -> None:
    assert split_mask(mask) == expected


@pytest.mark.parametrize(
    "path,text,title",
    [
        ("a.md", "intro\n# Main Title\n## Sub\n", "Main Title"),
        ("a.md", "text\n## Second Level\n# Later H1\n", "Second Level"),
        ("a.md", "# Notes\n\n## Real Topic\n", "Real Topic"),
        ("a.md", "# 📝 Notes\n\n## Standup\n", "Standup"),
        ("a.md", '---\ntitle: "From Front"\ntags: [x]\n---\n# Heading\n', "From Front"),
        ("a.md", "---\n# a yaml comment\ntags: [x]\n---\n# Body Title\n", "Body Title"),
        ("a.md", "---\ntitle:\n---\n# Heading Wins\n", "Heading Wins"),
        ("a.md", "#   \n# Real\n", "Real"),
        ("a.md", "# Windows\r\nbody\r\n", "Windows"),
        ("a.md", "\ufeff# After BOM\n", "After BOM"),
        ("a.md", "\ufeff---\ntitle: BOM Front\n---\n", "BOM Front"),
        ("dir/meeting-notes.md", "no heading at all\n", "meeting-notes"),
        ("dir/README", "# Not markdown by name\n", "README"),
        ("x.txt", "# looks like a heading\n", "x"),
        ("x.org", "#+title: Org Title\n* Heading\n", "Org Title"),
        ("x.org", "* First Heading\n", "First Heading"),
        ("x.org", "#+TITLE:   \n* Blank Title Skipped\n", "Blank Title Skipped"),
    ],
)
def test_extract_title(path: str, text: str, title: str) -> None:
    assert extract_title(path, text) == title


def _coll(root: Path, pattern: str = "**/*.md", ignore: tuple[str, ...] = ()) -> Collection:
    return Collection(name="t", path=str(root), pattern=pattern, ignore=ignore)


def test_discover_masks_ignores_and_exclusions(tmp_path: Path) -> None:
    root = write(
        tmp_path / "root",
        {
            "a.md": "a",
            "b.txt": "b",
            "c.rst": "c",
            "sub/d.md": "d",
            "sub/deep/e.md": "e",
            **{f"{d}/x.md": "x" for d in ("node_modules", ".git", ".cache", "vendor", "dist", "build")},
            "sub/node_modules/y.md": "y",
            "sub/build/y.md": "y",
            ".hidden/x.md": "x",
            "sub/.hidden/x.md": "x",
            ".dot.md": "x",
            "sub/.dot.md": "x",
            "drafts/f.md": "f",
            "sub/drafts/g.md": "g",
            "private.md": "p",
        },
    )

    def rels(coll: Collection) -> list[str]:
        return sorted(f.rel for f in discover(coll).files)

    assert rels(_coll(root)) == [
        "a.md",
        "drafts/f.md",
        "private.md",
        "sub/d.md",
        "sub/deep/e.md",
        "sub/drafts/g.md",
    ]
    assert rels(_coll(root, "*.md,*.txt")) == ["a.md", "b.txt", "private.md"]
    assert rels(_coll(root, "{a,c}.*")) == ["a.md", "c.rst"]
    assert rels(_coll(root, "sub/**/*.md")) == ["sub/d.md", "sub/deep/e.md", "sub/drafts/g.md"]
    assert rels(_coll(root, ignore=("**/drafts/**", "private.md"))) == ["a.md", "sub/d.md", "sub/deep/e.md"]
    assert rels(_coll(root, "../*.md")) == []


def test_discover_symlinks_stay_inside_the_root(tmp_path: Path) -> None:
    outside = write(tmp_path / "outside", {"secret.md": "s", "dir/o.md": "o"})
    root = write(tmp_path / "root", {"inner.md": "i", "sub/n.md": "n"})
    (root / "link-in.md").symlink_to(root / "inner.md")
    (root / "rel-in.md").symlink_to("sub/n.md")
    (root / "link-out.md").symlink_to(outside / "secret.md")
    (root / "dotdot.md").symlink_to("../outside/secret.md")
    (root / "dirlink").symlink_to(outside / "dir")
    (root / "sublink").symlink_to(root / "sub")
    (root / "dangling.md").symlink_to(root / "nowhere.md")
    walk = discover(_coll(root))
    assert sorted(f.rel for f in walk.files) == ["inner.md", "link-in.md", "rel-in.md", "sub/n.md"]
    reasons = dict(walk.skipped)
    assert set(reasons) == {"link-out.md", "dotdot.md", "dangling.md"}
    assert "outside" in reasons["link-out.md"] and "outside" in reasons["dotdot.md"]
    assert "dangling symlink" in reasons["dangling.md"]


def test_discover_reports_a_missing_root(tmp_path: Path) -> None:
    walk = discover(_coll(tmp_path / "gone"))
    assert walk.root_missing and not walk.files


def test_unlistable_folder_keeps_its_documents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder that cannot be listed (permissions, a flaky mount) is not a deletion:
    its documents stay, like an unreadable file's. Root cannot chmod its way there,
    so the listing failure is injected."""
    root = write(tmp_path / "root", {"a.md": "# A\nkeepme\n", "locked/b.md": "# B\nkeepme too\n"})
    store = Store(tmp_path / "index.sqlite")
    try:
        coll = _coll(root)
        first = index_collection(store, coll)
        assert (first.indexed, first.removed) == (2, 0)
        real_scandir = os.scandir

        def scandir(path: str = ".") -> Any:
            if path.endswith(f"{os.sep}locked"):
                raise PermissionError(errno.EACCES, "Permission denied", path)
            return real_scandir(path)

        monkeypatch.setattr(os, "scandir", scandir)
        second = index_collection(store, coll)
        assert (second.indexed, second.updated, second.unchanged, second.removed) == (0, 0, 1, 0)
        assert any(p == "locked" and "Permission denied" in r for p, r in second.skipped)
        with store.read() as conn:
            active = {r[0] for r in conn.execute("SELECT path FROM documents WHERE active = 1")}
        assert active == {"a.md", "locked/b.md"}
    finally:
        store.close()


def test_walk_of_only_skipped_files_never_prunes(tmp_path: Path) -> None:
    """Every match skipped (here: now a symlink out of the root) is still an empty walk:
    nothing is pruned, and the warning says why instead of blaming the mask."""
    outside = write(tmp_path / "outside", {"o.md": "o"})
    root = write(tmp_path / "root", {"a.md": "# A\nonly\n"})
    store = Store(tmp_path / "index.sqlite")
    try:
        coll = _coll(root)
        assert index_collection(store, coll).indexed == 1
        (root / "a.md").unlink()
        (root / "a.md").symlink_to(outside / "o.md")
        second = index_collection(store, coll)
        assert (second.indexed, second.updated, second.unchanged, second.removed) == (0, 0, 0, 0)
        assert second.skipped == [("a.md", "outside the collection (symlink)")]
        assert "could be indexed (1 skipped)" in second.warnings[0] and "never prunes" in second.warnings[0]
    finally:
        store.close()


def test_run_hook_reports_exit_codes(tmp_path: Path) -> None:
    coll = Collection(name="h", path=str(tmp_path), update="echo out; echo err >&2")
    assert run_hook(coll) == "out\nerr\n"
    with pytest.raises(HookFailed) as failed:
        run_hook(Collection(name="h", path=str(tmp_path), update="echo boom; exit 3"))
    assert failed.value.detail["exit_code"] == 3 and failed.value.detail["output"] == "boom\n"
    with pytest.raises(HookFailed) as killed:
        run_hook(Collection(name="h", path=str(tmp_path), update="kill -KILL $$"))
    assert killed.value.detail["exit_code"] == 137 and "signal 9" in killed.value.message
    with pytest.raises(HookFailed) as unspawned:
        run_hook(Collection(name="h", path=str(tmp_path / "missing"), update="true"))
    assert "exit_code" not in unspawned.value.detail and "could not run" in unspawned.value.message


# -- masks and exclusions ---------------------------------------------------------


@pytest.mark.slow
def test_masks_union_brace_glob_alias_and_exclusions(qenv: Env, tmp_path: Path) -> None:
    union = write(
        tmp_path / "union",
        {"a.md": "unionword a", "b.txt": "unionword b", "c.rst": "unionword c", "sub/d.md": "unionword d"},
    )
    assert add(qenv, union, "u", "--mask", "*.md,*.txt").counts == [(2, 0, 0, 0)]
    assert set(found(qenv, "unionword")) == {"u/a.md", "u/b.txt"}

    brace = write(tmp_path / "brace", {"a.md": "braceword", "b.md": "braceword", "c.md": "braceword"})
    assert add(qenv, brace, "br", "--glob", "{a,b}.md").counts == [(2, 0, 0, 0)]
    assert set(found(qenv, "braceword")) == {"br/a.md", "br/b.md"}

    excluded = {f"{d}/x.md": "exclword" for d in ("node_modules", ".git", ".cache", "vendor", "dist", "build")}
    tree = write(
        tmp_path / "tree",
        {
            **excluded,
            "keep.md": "exclword keep",
            "deep/a/b/ok.md": "exclword deep",
            "sub/node_modules/y.md": "exclword",
            "sub/vendor/lib/y.md": "exclword",
            ".hidden/x.md": "exclword",
            "sub/.hidden/x.md": "exclword",
            ".dot.md": "exclword",
            "sub/deep/.dot.md": "exclword",
            "drafts/d.md": "exclword draft",
            "sub/drafts/e.md": "exclword draft",
            "private.md": "exclword private",
        },
    )
    assert add(qenv, tree, "tree").counts == [(5, 0, 0, 0)]
    assert set(found(qenv, "exclword")) == {
        "tree/keep.md",
        "tree/deep/a/b/ok.md",
        "tree/drafts/d.md",
        "tree/sub/drafts/e.md",
        "tree/private.md",
    }

    edit_collection(qenv, "tree", ignore=["**/drafts/**", "private.md"])
    out = run(qenv, "update")
    assert out.counts == [(0, 0, 2, 0), (0, 0, 2, 0), (0, 0, 2, 3)]
    assert set(found(qenv, "exclword")) == {"tree/keep.md", "tree/deep/a/b/ok.md"}
    assert "Ignore:   **/drafts/**, private.md" in run(qenv, "collection", "show", "tree").stdout


# -- incremental ------------------------------------------------------------------


@pytest.mark.slow
def test_incremental_unchanged_edit_delete_rename_shared_content(qenv: Env, tmp_path: Path) -> None:
    root = write(
        tmp_path / "inc",
        {
            "a.md": "# A\nquokkaone\n",
            "b.md": "# B\nbilbyword\n",
            "c.md": "# C\ncassowary\n",
        },
    )
    assert add(qenv, root, "x").counts == [(3, 0, 0, 0)]
    assert update(qenv) == (0, 0, 3, 0)

    # Stat-first: same size, same mtime → the file is not even read, so the old text stays.
    same_stat_rewrite(root / "a.md", "# A\nwombattwo\n")
    assert update(qenv) == (0, 0, 3, 0)
    assert set(found(qenv, "quokkaone")) == {"x/a.md"}
    assert found(qenv, "wombattwo") == {}

    (root / "a.md").write_text("# A\nplatypus edited\n", encoding="utf-8")
    assert update(qenv) == (0, 1, 2, 0)
    assert set(found(qenv, "platypus")) == {"x/a.md"}
    assert found(qenv, "quokkaone") == {}

    (root / "c.md").unlink()
    assert update(qenv) == (0, 0, 2, 1)
    assert found(qenv, "cassowary") == {}

    (root / "b.md").rename(root / "b2.md")
    assert update(qenv) == (1, 0, 1, 1)
    assert set(found(qenv, "bilbyword")) == {"x/b2.md"}

    # Back to a path that has an inactive row: reactivated, counted as new, no UNIQUE error.
    (root / "b2.md").rename(root / "b.md")
    assert update(qenv) == (1, 0, 1, 1)
    assert set(found(qenv, "bilbyword")) == {"x/b.md"}

    other = write(tmp_path / "other", {"copy.md": "# A\nplatypus edited\n"})
    assert add(qenv, other, "y").counts == [(1, 0, 0, 0)]
    hits = found(qenv, "platypus")
    assert set(hits) == {"x/a.md", "y/copy.md"}
    assert hits["x/a.md"] == hits["y/copy.md"]
    assert content_rows(qenv, hits["x/a.md"]) == 1


@pytest.mark.slow
def test_emptied_file_stops_matching_and_is_listed(qenv: Env, tmp_path: Path) -> None:
    root = write(tmp_path / "e", {"a.md": "# A\nemptyme\n", "b.md": "# B\nstays\n"})
    assert add(qenv, root, "x").counts == [(2, 0, 0, 0)]
    (root / "a.md").write_text("  \n\n", encoding="utf-8")
    out = run(qenv, "update")
    assert out.counts == [(0, 0, 1, 1)]
    assert found(qenv, "emptyme") == {}
    assert skipped_in_status(qenv) == {"a.md": "empty"}
    assert "⚠ Skipped a.md: empty" in out.stderr
    assert "1 skipped" in out.stdout

    (root / "a.md").write_text("# A\nrefilled\n", encoding="utf-8")
    assert update(qenv) == (1, 0, 1, 0)
    assert set(found(qenv, "refilled")) == {"x/a.md"}
    assert skipped_in_status(qenv) == {}


# -- an empty walk never prunes ---------------------------------------------------


@pytest.mark.slow
def test_empty_walk_never_prunes(qenv: Env, tmp_path: Path) -> None:
    root = write(tmp_path / "w", {"a.md": "# A\nwalkword one\n", "sub/b.md": "# B\nwalkword two\n"})
    assert add(qenv, root, "x").counts == [(2, 0, 0, 0)]
    both = {"x/a.md", "x/sub/b.md"}

    root.rename(tmp_path / "w-away")
    out = run(qenv, "update")
    assert out.counts == [(0, 0, 0, 0)]
    assert "missing" in out.stderr and "never prunes" in out.stderr and "keeping its 2" in out.stderr
    assert set(found(qenv, "walkword")) == both
    assert "never prunes" in run(qenv, "status").stdout

    (tmp_path / "w-away").rename(root)
    assert update(qenv) == (0, 0, 2, 0)
    assert "never prunes" not in run(qenv, "status").stdout

    edit_collection(qenv, "x", pattern="**/*.nomatch")
    out = run(qenv, "update")
    assert out.counts == [(0, 0, 0, 0)]
    assert "no file matches '**/*.nomatch'" in out.stderr and "never prunes" in out.stderr
    assert set(found(qenv, "walkword")) == both

    edit_collection(qenv, "x", pattern="**/*.md")
    assert update(qenv) == (0, 0, 2, 0)
    (root / "sub" / "b.md").unlink()
    assert update(qenv) == (0, 0, 1, 1)
    assert set(found(qenv, "walkword")) == {"x/a.md"}


# -- skipped files ----------------------------------------------------------------


@pytest.mark.slow
def test_skipped_files_have_reasons(env: Env, tmp_path: Path) -> None:
    root = write(
        tmp_path / "s",
        {
            "ok.md": "# Ok\nskipword fine\n",
            "turns.md": "# Turns\nskipword turnsbinary\n",
            "bin.md": b"# Bin\x00\x01\x02 skipword\n",
            "latin.md": "# Café\nskipword latin\n".encode("latin-1"),
            "big.md": "# Big\nskipword " + "x" * 3000 + "\n",
        },
    )
    (root / "dangling.md").symlink_to(root / "nowhere.md")
    with daemon_with(env, {"QMD_MAX_FILE_BYTES": "2048"}):
        out = add(env, root, "x")
        assert out.counts == [(2, 0, 0, 0)]
        assert "4 skipped" in out.stdout
        assert set(found(env, "skipword")) == {"x/ok.md", "x/turns.md"}
        reasons = skipped_in_status(env)
        assert set(reasons) == {"bin.md", "latin.md", "big.md", "dangling.md"}
        assert "binary" in reasons["bin.md"]
        assert "UTF-8" in reasons["latin.md"]
        assert "too large" in reasons["big.md"] and "QMD_MAX_FILE_BYTES" in reasons["big.md"]
        assert "dangling symlink" in reasons["dangling.md"]
        for path in reasons:
            assert f"⚠ Skipped {path}: " in out.stderr

        (root / "turns.md").write_bytes(b"# Turns\x00 skipword turnsbinary\n")
        assert update(env) == (0, 0, 1, 1)
        assert found(env, "turnsbinary") == {}
        assert "binary" in skipped_in_status(env)["turns.md"]


# -- symlinks ---------------------------------------------------------------------


@pytest.mark.slow
def test_symlinks_never_lead_outside(qenv: Env, tmp_path: Path) -> None:
    outside = write(
        tmp_path / "outside", {"secret.md": "# S\nlinkword outsidesecret\n", "dir/o.md": "# O\nlinkword outsidedir\n"}
    )
    root = write(tmp_path / "root", {"inner.md": "# I\nlinkword innerword\n", "esc.md": "# E\nlinkword escapee\n"})
    (root / "link-in.md").symlink_to(root / "inner.md")
    (root / "link-out.md").symlink_to(outside / "secret.md")
    (root / "dirlink").symlink_to(outside / "dir", target_is_directory=True)
    out = add(qenv, root, "x")
    assert out.counts == [(3, 0, 0, 0)]
    assert set(found(qenv, "linkword")) == {"x/inner.md", "x/link-in.md", "x/esc.md"}
    assert "outside" in skipped_in_status(qenv)["link-out.md"]

    # A file that was indexed and is now a symlink out of the root leaves the index.
    (root / "esc.md").unlink()
    (root / "esc.md").symlink_to(outside / "secret.md")
    assert update(qenv) == (0, 0, 2, 1)
    assert found(qenv, "escapee") == {} and found(qenv, "outsidesecret") == {}
    assert set(skipped_in_status(qenv)) == {"link-out.md", "esc.md"}


# -- update hooks -----------------------------------------------------------------


@pytest.mark.slow
def test_update_cmd_runs_first_and_a_failure_aborts(qenv: Env, tmp_path: Path) -> None:
    a = write(tmp_path / "a", {"one.md": "# One\nhookword\n"})
    b = write(tmp_path / "b", {"two.md": "# Two\nhookword\n"})
    add(qenv, a, "a")
    add(qenv, b, "b")
    run(qenv, "collection", "update-cmd", "a", "echo '# Made' > made.md; echo madetoken >> made.md; echo hook-says-hi")
    out = run(qenv, "update")
    assert "Running update command: echo '# Made' > made.md" in out.stdout
    assert "    hook-says-hi" in out.stdout
    assert out.counts == [(1, 0, 1, 0), (0, 0, 1, 0)]
    assert set(found(qenv, "madetoken")) == {"a/made.md"}

    run(qenv, "collection", "update-cmd", "a", "echo boom; echo bang >&2; exit 3")
    write(a, {"fresh.md": "# Fresh\nfreshaword\n"})
    write(b, {"fresh.md": "# Fresh\nfreshbword\n"})
    out = run(qenv, "update", code=3)
    assert "boom" in out.output and "bang" in out.output
    assert "exit code 3" in out.stderr
    assert out.counts == []
    assert found(qenv, "freshaword") == {} and found(qenv, "freshbword") == {}

    run(qenv, "collection", "update-cmd", "a")
    out = run(qenv, "update")
    assert out.counts == [(1, 0, 2, 0), (1, 0, 1, 0)]
    assert set(found(qenv, "freshaword")) == {"a/fresh.md"}


# -- titles and literal paths -----------------------------------------------------


@pytest.mark.slow
def test_titles_and_literal_paths(qenv: Env, tmp_path: Path) -> None:
    root = write(
        tmp_path / "lit",
        {
            "h1.md": "intro\n# First Heading\n\npathword\n",
            "h2.md": "## Only Second\n\npathword\n",
            "notes.md": "# Notes\n\n## Weekly Sync\n\npathword\n",
            "front.md": "---\ntitle: Front Matter Title\n---\n# Body\n\npathword\n",
            "plain-name.md": "pathword without headings\n",
            "my notes/a b.md": "pathword spaced\n",
            "ünïcødé/日本語.md": "pathword unicode\n",
            "50%_off.md": "pathword percent\n",
            "a_b.md": "pathword twin underscore\n",
            "a-b.md": "pathword twin hyphen\n",
        },
    )
    assert add(qenv, root, "x").counts == [(10, 0, 0, 0)]
    hits = qenv.json("search", "pathword", "--json", "--all")
    assert isinstance(hits, list)
    titles = {h["file"].removeprefix("qmd://x/"): h["title"] for h in hits}
    assert titles == {
        "h1.md": "First Heading",
        "h2.md": "Only Second",
        "notes.md": "Weekly Sync",
        "front.md": "Front Matter Title",
        "plain-name.md": "plain-name",
        "my notes/a b.md": "a b",
        "ünïcødé/日本語.md": "日本語",
        "50%_off.md": "50%_off",
        "a_b.md": "a_b",
        "a-b.md": "a-b",
    }
    twins = found(qenv, "twin")
    assert set(twins) == {"x/a_b.md", "x/a-b.md"} and twins["x/a_b.md"] != twins["x/a-b.md"]
    assert "underscore" in run(qenv, "get", "x/a_b.md").stdout
    assert "hyphen" in run(qenv, "get", "x/a-b.md").stdout
    assert "percent" in run(qenv, "get", "x/50%_off.md").stdout
    assert "spaced" in run(qenv, "get", "qmd://x/my notes/a b.md").stdout
    assert "unicode" in run(qenv, "get", "x/ünïcødé/日本語.md").stdout
    assert update(qenv) == (0, 0, 10, 0)
