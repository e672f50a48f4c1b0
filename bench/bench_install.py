"""Install time: the README's first command on a fresh clone, from an empty pip cache and a warm one.

    .venv/bin/python bench/bench_install.py [--runs cold,warm] [--pypi] [--models] [--keep]

Each run `git clone`s this checkout's HEAD into a new temporary folder (with `../shared`
beside it: a symlink to the real one, as the README assumes), then runs the README's first
command (its first ```sh block) with bash in the clone, one `&&` step after another, each
timed: `python3 -m venv`, `pip install -e .`, `qmd collection add` (which starts the
daemon) and the closing `qmd search`, whose output must name a result. HOME, the XDG dirs
and the port are the harness's isolated ones (tests/harness.py), and `PIP_CACHE_DIR` is

  cold  a new, empty folder: nothing downloaded or built yet, what a new user has
        (not `--no-cache-dir`, which still lets pip build and use wheels within the run)
  warm  the folder the cold run filled: every download and built wheel cached

`--models` adds a last step to each run, the README's line for semantic search
(`pip install -e '.[models]'`, which compiles llama.cpp when no wheel is cached: minutes).

pip runs as configured on this machine (indexes, find-links: printed), so the cold figure
includes its downloads; a local mirror or wheel folder (file://) is never cached, so there
cold and warm are alike. `--pypi` ignores that configuration (PIP_CONFIG_FILE=/dev/null,
no PIP_INDEX_URL/PIP_EXTRA_INDEX_URL/PIP_FIND_LINKS): everything comes from pypi.org, as
for a new user on a laptop. Every step also records the CPU the rest of the machine used
meanwhile (`others`, /proc/stat), since a compile or a download on a shared 2-core machine
is slowed by anything else running. Do not run it beside the slow tests: it uses both
cores. The daemon each run starts is stopped (`qmd daemon stop`) and its folder removed.
Figures only, never assertions.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, CpuWindow, Env, code_line, machine, table, write_json  # noqa: E402


def readme_commands() -> tuple[str, str]:
    """The README's first command (the first line of its first ```sh block) and its line that adds
    semantic search (the first line of a ```sh block that installs `[models]`)."""
    blocks = [b.split("```", 1)[0].strip() for b in (ROOT / "README.md").read_text().split("```sh\n")[1:]]
    models = next(line for b in blocks for line in b.splitlines() if "[models]" in line and "install" in line)
    return blocks[0].splitlines()[0], models


def steps_of(command: str) -> list[str]:
    """The command's `&&` steps, in order (the README keeps each step free of `&&` inside quotes)."""
    return [s.strip() for s in command.split(" && ")]


def label(step: str) -> str:
    """A short name for a step: `python3 -m venv`, `pip install -e .`, `qmd search`."""
    words = shlex.split(step)
    prog = Path(words[0]).name
    if prog.startswith("python"):
        return " ".join([prog, *words[1:3]])
    if prog == "pip":
        return " ".join(["pip", *(w for w in words[1:] if w != "-q")])
    return " ".join([prog, *words[1 : 3 if words[1:2] == ["collection"] else 2]])


PIP_SOURCES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_NO_INDEX")


def pypi_only(env: dict[str, str]) -> dict[str, str]:
    """`env` with this machine's pip configuration ignored: pip's defaults, pypi.org."""
    out = {k: v for k, v in env.items() if k not in PIP_SOURCES}
    out["PIP_CONFIG_FILE"] = os.devnull
    return out


def pip_config(env: dict[str, str] | None = None) -> str:
    """Where pip looks (its config and PIP_ variables), for the record."""
    r = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, env=env
    )
    keep = ("index-url", "extra-index-url", "find-links", "constraint", "no-binary", "only-binary")
    return "; ".join(line for line in r.stdout.splitlines() if any(k in line for k in keep)) or "(pip defaults)"


def run_once(name: str, cache: Path, steps: list[str], keep: bool, pypi: bool) -> dict:
    """One fresh clone and the steps in it; each step timed, the run stopped at the first failure."""
    base = Path(tempfile.mkdtemp(prefix=f"qmd-install-{name}-"))
    env = Env(base / "env")
    env.vars.pop("VIRTUAL_ENV", None)
    env.vars["PIP_CACHE_DIR"] = str(cache)
    if pypi:
        env.vars = pypi_only(env.vars)
    (base / "shared").symlink_to(ROOT.parent / "shared")
    clone = base / "qmd"
    rows: list[dict] = []
    try:
        t0 = time.perf_counter()
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=300)
        rows.append({"step": "git clone", "wall_s": round(time.perf_counter() - t0, 2), "ok": True})
        for step in steps:
            window = CpuWindow()
            before = os.times()
            r = subprocess.run(
                ["bash", "-c", step], cwd=clone, env=env.vars, capture_output=True, text=True, timeout=3600
            )
            window.stop()
            after = os.times()
            ours = (after.children_user - before.children_user) + (after.children_system - before.children_system)
            row = {
                "step": label(step),
                "command": step,
                "wall_s": round(window.seconds, 2),
                "cpu_s": round(ours, 1),
                "ok": r.returncode == 0,
                **window.others(ours),
            }
            if "search" in step and r.returncode == 0:
                hits = re.findall(r"^qmd://\S+", r.stdout, re.M)
                row["first_hit"] = hits[0] if hits else None
                row["ok"] = bool(hits)
            rows.append(row)
            print(f"  {name}: {row['step']:<28} {row['wall_s']:7.1f} s  (cpu {ours:.0f} s)", flush=True)
            if not row["ok"]:
                row["output"] = (r.stdout + r.stderr)[-2000:]
                print(row["output"], file=sys.stderr)
                break
    finally:
        qmd = clone / ".venv" / "bin" / "qmd"
        if qmd.exists():
            subprocess.run([str(qmd), "daemon", "stop"], env=env.vars, capture_output=True, timeout=60)
        if keep:
            print(f"  kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    # The clone is not part of the README's command (a user has done it already), nor is the [models] line.
    total = sum(row["wall_s"] for row in rows[1:] if "[models]" not in row.get("command", ""))
    return {"run": name, "steps": rows, "command_s": round(total, 2), "ok": all(r["ok"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="cold,warm", help="which runs, in order: cold, warm (default both)")
    ap.add_argument("--pypi", action="store_true", help="ignore this machine's pip config: everything from pypi.org")
    ap.add_argument("--models", action="store_true", help="also time the README's [models] install in each run")
    ap.add_argument("--keep", action="store_true", help="keep the clones, venvs and pip cache")
    args = ap.parse_args(argv)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    if not runs or set(runs) - {"cold", "warm"}:
        ap.error("--runs takes cold and/or warm")

    command, models = readme_commands()
    steps = steps_of(command) + ([models] if args.models else [])
    print(f"README's first command: {command}")
    pip = pip_config(pypi_only(dict(os.environ)) if args.pypi else None)
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; pip: {pip}")
    print(code_line(), flush=True)

    cache = Path(tempfile.mkdtemp(prefix="qmd-pip-cache-"))
    results = []
    try:
        for name in runs:
            if name == "cold" and any(cache.iterdir()):
                shutil.rmtree(cache)
                cache.mkdir()
            size = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
            print(f"{name} run (PIP_CACHE_DIR={cache}: {size / 1e6:.1f} MB cached)")
            results.append(run_once(name, cache, steps, args.keep, args.pypi))
    finally:
        if not args.keep:
            shutil.rmtree(cache, ignore_errors=True)

    names = [row["step"] for row in results[0]["steps"]]
    rows = []
    for i, step in enumerate(names):
        cells: list = [step]
        for res in results:
            row = res["steps"][i] if i < len(res["steps"]) else None
            cells += [row["wall_s"], row.get("cpu_s")] if row else [None, None]
        rows.append(cells)
    rows.append(["the README's first command", *[x for res in results for x in (res["command_s"], None)]])
    headers = ["step"] + [h for res in results for h in (f"{res['run']} wall s", f"{res['run']} cpu s")]
    print()
    print(table(headers, rows, title="Install, from git clone to a first search"))
    for res in results:
        busy = [r["others_share"] for r in res["steps"] if r.get("others_share") is not None]
        noise = f"others used {max(busy):.0%} of the machine at most" if busy else ""
        print(f"{res['run']}: {'ok' if res['ok'] else 'FAILED'}; {noise}")
    path = write_json(
        "install-pypi" if args.pypi else "install",
        {"machine": machine(), "command": command, "pip": pip, "pypi_only": args.pypi, "runs": results},
    )
    print(f"figures: {path}")
    return 0 if all(res["ok"] for res in results) else 1


if __name__ == "__main__":
    sys.exit(main())
