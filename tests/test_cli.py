"""The `qmd` CLI as a user runs it: a subprocess talking to a real daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import NOTES, Daemon, Env, daemons_on, write

HEAVY = (
    "fastapi",
    "uvicorn",
    "starlette",
    "llama_cpp",
    "sqlite_vec",
    "numpy",
    "mcp",
    "pydantic",
    "yaml",
    "sqlite3",
    "pysqlite3",
    "wcmatch",
)


def test_cli_imports_nothing_heavy() -> None:
    code = f"import sys, qmd.client.cli; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_lists_commands(env: Env) -> None:
    out = env.ok("--help")
    for cmd in ("collection", "context", "get", "ls", "multi-get", "search", "status", "update"):
        assert cmd in out
    assert "--name" in env.ok("collection", "add", "--help")


@pytest.fixture
def added(env: Env, daemon: Daemon, notes: Path) -> Path:
    env.ok("collection", "add", str(notes), "--name", "notes")
    return notes


# -- collections ------------------------------------------------------------------------


@pytest.mark.slow
def test_collection_add_relative_path_and_list(env: Env, daemon: Daemon, notes: Path) -> None:
    out = env.ok("collection", "add", ".", cwd=notes)
    assert "Creating collection 'notes'" in out and "4 new, 0 updated, 0 unchanged, 0 removed" in out
    assert "✓ Collection 'notes' created successfully" in out
    listing = env.ok("collection", "list")
    assert "notes (qmd://notes/)" in listing and "Files:    4" in listing
    cols = json.loads(env.ok("collection", "list", "--json"))
    assert cols[0]["path"] == str(notes.resolve())


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,needle",
    [
        (("collection", "add", "/no/such/folder"), "Folder not found"),
        (("collection", "add", "{notes}/ideas.md"), "Not a folder"),
        (("collection", "add", "{notes}", "--name", "a/b"), "invalid collection name"),
        (("collection", "add", "{notes}", "--name", "notes"), "already exists"),
        (("collection", "remove", "nope"), "Collection not found: nope"),
        (("collection", "rename", "nope", "x"), "Collection not found: nope"),
        (("collection", "show", "nope"), "Collection not found: nope"),
        (("search", "x", "-c", "nope"), "Collection not found: nope"),
        (("get", "../../etc/passwd"), "outside every collection"),
        (("get", "/etc/passwd"), "outside every collection"),
        (("context", "rm", "qmd://notes/none"), "No context found"),
        (("context", "add", "/tmp", "text"), "not in any indexed collection"),
        (("multi-get", "nothing/*.md"), "No files matched pattern"),
    ],
)
def test_errors_are_one_clear_line(env: Env, added: Path, args: tuple[str, ...], needle: str) -> None:
    cfg = env.config / "qmd" / "index.yml"
    before = cfg.read_text()
    r = env.qmd(*(a.replace("{notes}", str(added)) for a in args), cwd=added)
    assert r.returncode == 1, r
    assert needle in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert cfg.read_text() == before


@pytest.mark.slow
def test_collection_rename_remove_show(env: Env, added: Path) -> None:
    env.ok("collection", "rename", "notes", "journal")
    assert "qmd://journal/fundraising.md" in env.ok("search", "angel")
    show = env.ok("collection", "show", "journal")
    assert "Collection: journal" in show and "Include:  yes (default)" in show
    out = env.ok("collection", "remove", "journal")
    assert "Deleted 4 documents" in out
    gone = env.qmd("search", "angel")
    assert gone.returncode == 1 and "no collections to search" in gone.stderr


@pytest.mark.slow
def test_include_exclude(env: Env, added: Path, tmp_path: Path) -> None:
    other = write(tmp_path / "other", {"angel.md": "# Angel\n\nangel angel angel\n"})
    env.ok("collection", "add", str(other), "--name", "other")
    env.ok("collection", "exclude", "other")
    files = [h["file"] for h in env.json("search", "angel", "--json")]
    assert files and all(f.startswith("qmd://notes/") for f in files)
    named = [h["file"] for h in env.json("search", "angel", "--json", "-c", "other")]
    assert named == ["qmd://other/angel.md"]
    both = {h["file"].split("/")[2] for h in env.json("search", "angel", "--json", "-c", "other", "-c", "notes")}
    assert both == {"notes", "other"}
    assert "[excluded]" in env.ok("collection", "list")
    env.ok("collection", "include", "other")
    assert "qmd://other/angel.md" in env.ok("search", "angel", "--files")


@pytest.mark.slow
def test_update_cmd_set_and_clear(env: Env, added: Path) -> None:
    env.ok("collection", "update-cmd", "notes", "echo", "hello")
    assert "Update:   echo hello" in env.ok("collection", "show", "notes")
    out = env.ok("update")
    assert "Running update command: echo hello" in out and "    hello" in out
    env.ok("collection", "update-cmd", "notes")
    assert "Update:   (none)" in env.ok("collection", "show", "notes")


# -- get / multi-get / ls ----------------------------------------------------------------


@pytest.mark.slow
def test_get_forms(env: Env, added: Path) -> None:
    want = "7: Angel investors fund early startups."
    docid = env.json("search", "angel", "--json")[0]["docid"]
    for name in (
        "qmd://notes/fundraising.md",
        "notes/fundraising.md",
        "fundraising.md",
        docid,
        docid[1:],
        f'"{docid}"',
        str(added / "fundraising.md"),
        "qmd:////notes/fundraising.md",
        "//notes/fundraising.md",
    ):
        out = env.ok("get", name, cwd=added)
        assert out.startswith(f"qmd://notes/fundraising.md  {docid}\n"), (name, out)
        assert want in out
    assert env.ok("get", "./fundraising.md", cwd=added).count("\n") > 5


@pytest.mark.slow
def test_get_ranges_and_numbers(env: Env, added: Path) -> None:
    out = env.ok("get", "notes/fundraising.md:7:2")
    assert out.splitlines()[-2:] == [
        "7: Angel investors fund early startups.",
        "8: We raise money from angels and VCs.",
    ]
    out = env.ok("get", "notes/fundraising.md", "--from", "8", "-l", "1")
    assert out.splitlines()[-1] == "8: We raise money from angels and VCs."
    out = env.ok("get", "notes/fundraising.md:8", "-l", "1", "--no-line-numbers")
    assert out.splitlines()[-1] == "We raise money from angels and VCs."


@pytest.mark.slow
def test_get_miss_suggests(env: Env, added: Path) -> None:
    r = env.qmd("get", "fundrasing.md")
    assert r.returncode == 1
    assert "Document not found: fundrasing.md" in r.stderr and "qmd://notes/fundraising.md" in r.stderr


@pytest.mark.slow
def test_get_past_the_end_is_an_error(env: Env, added: Path) -> None:
    """An empty range numbered from a line that does not exist would read as a real one."""
    total = len((added / "fundraising.md").read_text().splitlines())
    r = env.qmd("get", "notes/fundraising.md:9999:2")
    assert r.returncode == 1 and r.stdout == ""
    assert f"notes/fundraising.md has {total} lines; line 9999 is past the end" in r.stderr
    assert env.qmd("get", f"notes/fundraising.md:{total}:2").returncode == 0  # the last line is still a line


@pytest.mark.slow
def test_multi_get_with_no_names_is_an_error(env: Env, added: Path) -> None:
    for pattern in (",", " , ,"):
        r = env.qmd("multi-get", pattern)
        assert r.returncode == 1 and "no file names" in r.stderr, pattern


def test_query_starting_with_a_dash_says_how(env: Env) -> None:
    r = env.qmd("search", "-only")
    assert r.returncode == 2 and "No such option" in r.stderr
    assert "goes after '--': qmd search -- -only" in r.stderr
    r = env.qmd("status", "--bogus")
    assert r.returncode == 2 and "'--'" not in r.stderr  # no query there: no hint


def test_another_server_on_the_port_is_named_as_such(env: Env) -> None:
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = env.qmd("status", env={"QMD_PORT": str(server.server_address[1]), "QMD_NO_AUTOSTART": "1"})
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 1 and "something other than a qmd daemon answers" in r.stderr
    assert "None" not in r.stderr


@pytest.mark.slow
def test_multi_get(env: Env, added: Path) -> None:
    items = env.json("multi-get", "notes/**/*.md", "--json")
    assert sorted(i["file"] for i in items) == [
        "qmd://notes/cooking/bread.md",
        "qmd://notes/fundraising.md",
        "qmd://notes/ideas.md",
        "qmd://notes/work/meeting-2026-04-10.md",
    ]
    docid = env.json("search", "sourdough", "--json")[0]["docid"]
    items = env.json("multi-get", f"fundraising.md, {docid}", "--json")
    assert [i["file"] for i in items] == ["qmd://notes/fundraising.md", "qmd://notes/cooking/bread.md"]
    items = env.json("multi-get", "qmd://notes/*.md", "--json", "--max-bytes", "60")
    skipped = {i["file"]: i for i in items if i.get("skipped")}
    size = len(str(NOTES["fundraising.md"]).encode())
    # The sizes compare truly as printed: never "(0KB > 0KB)".
    assert skipped["qmd://notes/fundraising.md"]["reason"].startswith(f"File too large ({size} bytes > 60 bytes)")
    out = env.ok("multi-get", "notes/fundraising.md", "-l", "2")
    # Numbered lines are the file's lines; the cut is an unnumbered line after them.
    assert out.endswith("\n1: # Raising a seed round\n2: \n\n[... truncated 7 more lines]\n")
    (item,) = env.json("multi-get", "notes/fundraising.md", "-l", "2", "--json")
    assert item["body"] == "1: # Raising a seed round\n2: " and item["truncated_lines"] == 7
    r = env.qmd("multi-get", "fundraising.md,missing.md")
    assert r.returncode == 0 and "Document not found: missing.md" in r.stderr
    assert "qmd://notes/fundraising.md" in r.stdout


@pytest.mark.slow
def test_ls(env: Env, added: Path) -> None:
    assert "qmd://notes/  (4 files)" in env.ok("ls")
    out = env.ok("ls", "notes")
    assert "qmd://notes/cooking/bread.md" in out and "qmd://notes/ideas.md" in out
    out = env.ok("ls", "qmd://notes/work")
    assert out.strip().endswith("qmd://notes/work/meeting-2026-04-10.md") and "ideas" not in out
    assert "No files found" in env.ok("ls", "notes/zzz")


# -- contexts ------------------------------------------------------------------------------


@pytest.mark.slow
def test_contexts(env: Env, added: Path) -> None:
    env.ok("context", "add", "/", "My personal notes")
    env.ok("context", "add", "qmd://notes/cooking", "Recipes I have tried")
    env.ok("context", "add", "Work meetings", cwd=added / "work")
    listing = env.ok("context", "list")
    assert "Recipes I have tried" in listing and "Work meetings" in listing and "My personal notes" in listing
    hit = env.json("search", "sourdough", "--json")[0]
    assert hit["context"] == "My personal notes\n\nRecipes I have tried"
    # Every level, on one line: no blank line splits the header.
    assert "\nFolder Context: My personal notes | Work meetings\n---\n" in env.ok(
        "get", "notes/work/meeting-2026-04-10.md"
    )
    assert env.ok("search", "sourdough", "--files").endswith(',"My personal notes | Recipes I have tried"\n')
    assert "Context: My personal notes | Recipes I have tried\nScore:" in env.ok("search", "sourdough")
    env.ok("context", "rm", "qmd://notes/cooking")
    env.ok("context", "rm", "/")
    assert "context" not in env.json("search", "sourdough", "--json")[0]


# -- search ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_search_formats(env: Env, added: Path) -> None:
    q = ("search", "angel investors")
    hits = env.json(*q, "--json")
    assert hits[0]["file"] == "qmd://notes/fundraising.md" and hits[0]["lines"] == "6-9"
    assert env.ok(*q, "--csv").startswith("docid,score,file,title,context,line,snippet\n")
    assert env.ok(*q, "--files").startswith(f"{hits[0]['docid']},")
    assert "**docid:** `" in env.ok(*q, "--md")
    assert env.ok(*q, "--xml").startswith("<file docid=")
    assert env.ok(*q, "--format", "json") == env.ok(*q, "--json")
    cli = env.ok(*q)
    assert cli.startswith(f"qmd://notes/fundraising.md:7 {hits[0]['docid']}\n") and "\x1b" not in cli
    r = env.qmd(*q, "--format", "yaml")
    assert r.returncode == 2 and "yaml" in r.stderr


@pytest.mark.slow
def test_search_limits_and_scores(env: Env, added: Path) -> None:
    assert len(env.json("search", "a", "--json", "-n", "1")) == 1
    all_hits = env.json("search", "bread startup investors", "--json", "--all")
    assert len(all_hits) >= 3
    scores = [h["score"] for h in all_hits]
    assert scores == sorted(scores, reverse=True)
    assert env.ok("search", "angel", "--min-score", "0.99") == "No results found above minimum score threshold.\n"
    assert env.ok("search", "zzzzqqq") == "No results found.\n"
    assert env.ok("search", "zzzzqqq", "--json") == "[]\n"


@pytest.mark.slow
def test_status(env: Env, added: Path) -> None:
    out = env.ok("status")
    assert "Total:    4 files indexed" in out
    assert "vector search unavailable — 4 documents pending" in out
    info = json.loads((env.cache / "qmd" / "qmdd.pid").read_text())
    assert f"Daemon: running (PID {info['pid']}" in out
    assert "notes (qmd://notes/)" in out


# -- autostart -------------------------------------------------------------------------------


@pytest.mark.slow
def test_autostart_ten_clis_start_one_daemon(env: Env, notes: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "qmd.client.cli", "status"],
            env=env.vars,
            cwd=env.home,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(10)
    ]
    try:
        results = [p.communicate(timeout=60) for p in procs]
        assert all(p.returncode == 0 for p in procs), results
        pids = {line for out, _ in results for line in out.splitlines() if line.startswith("Daemon:")}
        assert len(pids) == 1, pids
        assert len(daemons_on(env.port)) == 1
        info = json.loads((env.cache / "qmd" / "qmdd.pid").read_text())
        assert f"PID {info['pid']}" in next(iter(pids))
        env.ok("collection", "add", str(notes), "--name", "notes")
        assert "fundraising.md" in env.ok("search", "angel")
    finally:
        for pid in daemons_on(env.port):
            os.kill(pid, 15)
        time.sleep(0.5)


def test_no_autostart_is_a_clear_error(env: Env) -> None:
    r = env.qmd("status", env={"QMD_NO_AUTOSTART": "1"})
    assert r.returncode == 1
    assert "no qmd daemon answers" in r.stderr and "QMD_NO_AUTOSTART" in r.stderr
    assert "Traceback" not in r.stderr
    assert not daemons_on(env.port)


def _run_on_tty(env: Env, *args: str) -> str:
    """Run qmd with stdout and stderr on a pseudo-terminal; return what it drew."""
    import pty
    import select

    master, slave = pty.openpty()
    vars_ = {k: v for k, v in env.vars.items() if k != "NO_COLOR"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "qmd.client.cli", *args],
        env=vars_,
        cwd=env.home,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    assert proc.returncode == 0
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow
def test_tty_progress_colour_and_links(env: Env, daemon: Daemon, tmp_path: Path) -> None:
    corpus = write(tmp_path / "many", {f"n{i}.md": f"# Note {i}\n\nsearchable words {i}\n" for i in range(400)})
    out = _run_on_tty(env, "collection", "add", str(corpus), "--name", "many")
    assert "files/s" in out and "400/400 files" in out
    assert "400 new" in out
    out = _run_on_tty(env, "search", "searchable", "-n", "1")
    assert "\x1b]8;;vscode://file/" in out  # OSC 8 link to the file
    assert "\x1b[" in out  # colour
    plain = env.ok("search", "searchable", "-n", "1")
    assert "\x1b" not in plain


@pytest.mark.slow
def test_editor_uri_from_index_yml_and_env(env: Env, added: Path) -> None:
    """Links follow `QMD_EDITOR_URI` > `editor_uri` in index.yml > the VS Code default (§18.2)."""
    yml = env.config / "qmd" / "index.yml"
    yml.write_text(yml.read_text() + 'editor_uri: "zed://file/{path}:{line}"\n')
    for argv in (("search", "angel", "-n", "1"), ("multi-get", "notes/ideas.md")):
        assert "\x1b]8;;zed://file/" in _run_on_tty(env, *argv), argv
    env.vars["QMD_EDITOR_URI"] = "cursor://file/{path}:{line}:{col}"
    assert "\x1b]8;;cursor://file/" in _run_on_tty(env, "search", "angel", "-n", "1")


@pytest.mark.slow
@pytest.mark.sqlite_only("a named index's own file (on Postgres, QMD_INDEX_URL names one database for every index)")
def test_named_index_has_its_own_files_and_daemon(env: Env, notes: Path) -> None:
    try:
        env.ok("--index", "work", "collection", "add", str(notes), "--name", "notes")
        assert (env.cache / "qmd" / "work.sqlite").exists()
        assert (env.config / "qmd" / "work.yml").exists()
        assert not (env.config / "qmd" / "index.yml").exists()
        assert "fundraising.md" in env.ok("--index", "work", "search", "angel")
        # the default index, same port: the daemon started for 'work' serves it too
        assert "no collections to search" in env.qmd("search", "angel", "--json").stderr
        assert not (env.config / "qmd" / "index.yml").exists()
    finally:
        for pid in daemons_on(env.port):
            os.kill(pid, 15)
        time.sleep(0.5)
