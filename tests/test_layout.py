"""The tree is the architecture: the README's layout and command list match the code,
pyproject names every package, and the thin clients never import the server.

A newcomer reads the README's layout to find the room for a change; these tests keep
that map true as modules come and go.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"qmd": "qmd", "server": "qmd.server", "client": "qmd.client", "mcp_bridge": "qmd.mcp_bridge"}
"""Top-level source folders and the package each one is (pyproject's package-dir)."""
THIN = ("client", "mcp_bridge")
"""Folders whose code runs in the CLI or the stdio bridge: stdlib (and click) only."""
HEAVY = ("fastapi", "uvicorn", "starlette", "pydantic", "httpx", "llama_cpp", "sqlite_vec", "pysqlite3", "mcp", "yaml")
ALLOWED_IN_THIN = {"click"}


def readme_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1]
    return section.split("```", 2)[1].removeprefix("text").removeprefix("sh")


def tree_modules() -> set[str]:
    """Every module and package folder under the source folders, as `server/http/app`."""
    out: set[str] = set()
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            if rel.name == "__main__":
                continue
            out.add(str(rel))
            if rel.name == "__init__":
                out.add(str(rel.parent) + "/")
    return out


def readme_layout() -> set[str]:
    """The modules the README's layout names: an indented outline of folders (`name/`) and modules."""
    out: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in readme_block("Layout").splitlines():
        m = re.match(r"^( *)([A-Za-z_][\w]*/?)(\s|$)", line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        if parent == "" and name.rstrip("/") not in FOLDERS:
            continue  # tests/, bench/, deploy/: described, not modules
        full = parent + name
        out.add(full)
        if name.endswith("/"):
            stack.append((indent, full))
    return out


def test_readme_layout_names_every_module_and_only_those() -> None:
    tree, readme = tree_modules(), readme_layout()
    assert not tree - readme, f"in the tree but not in the README's layout: {sorted(tree - readme)}"
    assert not readme - tree, f"in the README's layout but not in the tree: {sorted(readme - tree)}"


def test_pyproject_lists_every_package() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert cfg["package-dir"] == {pkg: folder for folder, pkg in FOLDERS.items()}
    found = {
        FOLDERS[d.relative_to(ROOT).parts[0]] + "".join("." + p for p in d.relative_to(ROOT).parts[1:])
        for folder in FOLDERS
        for d in [ROOT / folder, *(ROOT / folder).rglob("*")]
        if d.is_dir() and (d / "__init__.py").exists()
    }
    assert set(cfg["packages"]) == found


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
    return out


def test_thin_clients_import_no_server_code_and_no_heavy_dependency() -> None:
    """Checked on the source, imports inside functions included: a lazy import of the
    server from the CLI is still the CLI depending on the server."""
    shared = [p for p in (ROOT / "qmd").glob("*.py") if p.name != "__init__.py"]
    bad = []
    for path in [*shared, *(p for folder in THIN for p in (ROOT / folder).rglob("*.py"))]:
        for line, name in _imports(path):
            top = name.split(".")[0]
            if name.startswith("qmd.server") or top in HEAVY:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
            elif top != "qmd" and top not in ALLOWED_IN_THIN and top not in sys.stdlib_module_names:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {name} (not stdlib)")
    assert not bad, "\n".join(bad)


def test_importing_qmd_loads_nothing_heavy() -> None:
    """`import qmd` (the library) and the CLI's own imports stay light until the API is used."""
    code = (
        "import sys, qmd, qmd.client.cli, qmd.mcp_bridge.bridge, qmd.paths, qmd.token, qmd.pidfile; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m.startswith('qmd.server')))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_readme_command_list_matches_help() -> None:
    """Every command `qmd --help` lists is in the README's command list, and the list
    names no command that does not exist."""
    r = subprocess.run([sys.executable, "-m", "qmd.client.cli", "--help"], capture_output=True, text=True, check=True)
    listed = r.stdout.split("Commands:", 1)[1]
    commands = {m.group(1) for m in re.finditer(r"^  ([a-z][\w-]*)", listed, re.M)}
    documented = {m.group(1) for m in re.finditer(r"^qmd ([a-z][\w-]*)", readme_block("Using it"), re.M)}
    assert commands - documented == set(), f"not in the README's command list: {sorted(commands - documented)}"
    assert documented - commands == set(), f"in the README but not a command: {sorted(documented - commands)}"


@pytest.mark.slow
def test_install_puts_one_name_in_site_packages(tmp_path: Path) -> None:
    """A real (non-editable) install: `qmd` and its dist-info, no `server`, `client`, …"""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    names = {p.name for p in target.iterdir() if p.name not in ("bin", "__pycache__")}
    assert {n for n in names if not n.endswith(".dist-info")} == {"qmd"}
    code = "import qmd.server.http.app, qmd.client.cli, qmd.mcp_bridge.bridge, qmd.server.models.worker_child"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, env={"PYTHONPATH": str(target)}, timeout=120)
