"""Shell completion: `qmd completion bash|zsh|fish`, run in the shell it is for.

Each script is sourced in a real shell and its completion function called the way the
shell calls it on TAB (bash: `COMP_WORDS`/`COMPREPLY`; fish: `complete -C`; zsh: the
function with `words`/`CURRENT`, and `compadd`/`_describe` recording what it offers).
Collection names come from a running daemon; a TAB never starts one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NOTES, Daemon, Env, daemons_on, unavailable


def shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        unavailable(f"{name} is not installed (apt-get install {name}; .ci/run installs it)")
    return path


def in_shell(env: Env, argv: list[str]) -> list[str]:
    """Run a shell command line with the venv's `qmd` first on PATH; its output lines."""
    bin_dir = str(Path(sys.executable).parent)
    vars_ = {**env.vars, "PATH": bin_dir + os.pathsep + env.vars.get("PATH", "/usr/bin:/bin")}
    r = subprocess.run(argv, env=vars_, cwd=env.home, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if line]


def bash_complete(env: Env, words: str) -> list[str]:
    script = (
        'eval "$(qmd completion bash)"; '
        f"COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); "
        '_qmd_completion qmd; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    return in_shell(env, [shell("bash"), "--norc", "-c", script])


def fish_complete(env: Env, line: str) -> list[str]:
    out = in_shell(env, [shell("fish"), "--no-config", "-c", f"qmd completion fish | source; complete -C '{line}'"])
    return [o.split("\t")[0] for o in out]


def zsh_complete(env: Env, words: str) -> list[str]:
    """zsh offers candidates through `compadd` and `_describe`; these stand-ins print them."""
    script = (
        'compdef() { :; }; eval "$(qmd completion zsh)"; '
        "compadd() { print -l -- ${(P)${@[-1]}}; }; _describe() { print -l -- ${(P)3}; }; "
        f"words=({words}); CURRENT=${{#words}}; _qmd_completion"
    )
    return [o.split(":")[0] for o in in_shell(env, [shell("zsh"), "-f", "-c", script])]


def test_scripts_and_usage(env: Env) -> None:
    assert "complete -o nosort -F _qmd_completion qmd" in env.ok("completion", "bash")
    assert env.ok("completion", "zsh").startswith("#compdef qmd")
    assert "complete --no-files --command qmd" in env.ok("completion", "fish")
    r = env.qmd("completion", "tcsh")
    assert r.returncode == 2 and "'tcsh' is not one of 'bash', 'zsh', 'fish'" in r.stderr


def test_commands_options_and_index_names_in_every_shell(env: Env) -> None:
    for name in ("index", "work", "work-archive"):
        (env.config / "qmd" / f"{name}.yml").parent.mkdir(parents=True, exist_ok=True)
        (env.config / "qmd" / f"{name}.yml").write_text("collections: {}\n")
    assert "search" in bash_complete(env, "qmd sea") and "--collection" in bash_complete(env, "qmd search --col")
    assert bash_complete(env, "qmd --index wo") == ["work", "work-archive"]
    assert fish_complete(env, "qmd --index wo") == ["work", "work-archive"]
    assert zsh_complete(env, "qmd --index wo") == ["work", "work-archive"]
    assert "search" in fish_complete(env, "qmd sea") and "search" in zsh_complete(env, "qmd sea")


def test_collection_names_never_start_a_daemon(env: Env) -> None:
    assert bash_complete(env, "qmd search -c n") == []
    assert daemons_on(env.port) == []


@pytest.mark.slow
def test_collection_names_from_the_running_daemon(env: Env, daemon: Daemon, notes: Path, tmp_path: Path) -> None:
    env.ok("collection", "add", str(notes), "--name", "notes")
    other = tmp_path / "other"
    other.mkdir()
    (other / "a.md").write_text(NOTES["ideas.md"])
    env.ok("collection", "add", str(other), "--name", "numbers")
    assert bash_complete(env, "qmd search -c n") == ["notes", "numbers"]
    assert bash_complete(env, "qmd collection show no") == ["notes"]
    assert fish_complete(env, "qmd update -c nu") == ["numbers"]
    assert zsh_complete(env, "qmd collection rename n") == ["notes", "numbers"]
