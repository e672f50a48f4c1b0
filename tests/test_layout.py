"""The tree is the architecture: the docs' layout and command list match the code,
pyproject names every package, and the thin clients never import the server.

A newcomer reads the layout (docs/contributing.md) to find the room for a change; these
tests keep that map true as modules come and go.
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
"""Top-level source folders and the package each one is (through the links in `qmd/`)."""
LINKED = ("server", "client", "mcp_bridge")
"""The folders `qmd/` links in as its subpackages."""
THIN = ("client", "mcp_bridge")
"""Folders whose code runs in the CLI or the stdio bridge: stdlib (and click) only."""
HEAVY = ("fastapi", "uvicorn", "starlette", "pydantic", "httpx", "llama_cpp", "sqlite_vec", "pysqlite3", "mcp", "yaml")
ALLOWED_IN_THIN = {"click"}


def doc_block(page: str, heading: str) -> str:
    """The first fenced block under `## heading` of docs/`page`."""
    text = (ROOT / "docs" / page).read_text()
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


def documented_layout() -> set[str]:
    """The modules the layout names: an indented outline of folders (`name/`) and modules."""
    out: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in doc_block("contributing.md", "Layout").splitlines():
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


def test_layout_names_every_module_and_only_those() -> None:
    tree, documented = tree_modules(), documented_layout()
    assert not tree - documented, f"in the tree but not in docs/contributing.md's layout: {sorted(tree - documented)}"
    assert not documented - tree, f"in docs/contributing.md's layout but not in the tree: {sorted(documented - tree)}"


def test_pyproject_lists_every_package_and_the_links_make_one_tree() -> None:
    """`qmd/server`, `qmd/client` and `qmd/mcp_bridge` are links to the top-level folders,
    so every static reader (mypy, pyright, an IDE) sees the package pip installs."""
    for folder in LINKED:
        link = ROOT / "qmd" / folder
        assert link.is_symlink() and link.readlink() == Path("..") / folder, f"qmd/{folder} must link to ../{folder}"
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in cfg
    found = {
        FOLDERS[d.relative_to(ROOT).parts[0]] + "".join("." + p for p in d.relative_to(ROOT).parts[1:])
        for folder in FOLDERS
        for d in [ROOT / folder, *(ROOT / folder).rglob("*")]
        if d.is_dir() and not d.is_symlink() and (d / "__init__.py").exists()
    }
    assert set(cfg["packages"]) == found


# -- floors ---------------------------------------------------------------------------

FLOORS: tuple[tuple[str, int], ...] = (
    ("qmd.server.errors", 0),
    ("qmd.server.text", 1),
    ("qmd.server.config", 2),
    ("qmd.server.store", 3),
    ("qmd.server.models", 4),
    ("qmd.server.ingest", 5),
    ("qmd.server.search", 5),
    ("qmd.server.engine", 6),
    ("qmd.server.status", 6),
    ("qmd.server.trust", 6),
    ("qmd.server.quality", 6),
    ("qmd.server.library", 7),
    ("qmd.server.indexes", 7),
    ("qmd.server.http", 7),
    ("qmd.server.daemon", 8),
    ("qmd.client", 9),
    ("qmd.mcp_bridge", 9),
)
"""Each room's floor: a module imports only from its own floor or below (`qmd.paths`, the
other shared stdlib pieces and the package docstrings are the ground, 0; `import qmd`, the
library surface, is the roof). Ingest and search share a floor and never import each other."""
SIBLINGS = {"qmd.server.ingest", "qmd.server.search"}


def _floor(module: str) -> int:
    if module == "qmd":
        return 10
    for prefix, floor in FLOORS:
        if module == prefix or module.startswith(prefix + "."):
            return floor
    return 0


def _room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["qmd", "server"] and len(parts) > 2 else module


def import_graph() -> dict[str, set[str]]:
    """Module → the qmd modules it imports, lazy and TYPE_CHECKING imports included: a
    static reader follows those too."""
    modules: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            modules[".".join([package, *parts])] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for _, imported in _imports(path):
            module = imported.rsplit(".", 1)[0]
            targets |= {m for m in (imported, module) if m in modules and m != name}
        graph[name] = targets
    return graph


def test_no_import_runs_up_a_floor_or_across_to_a_sibling() -> None:
    bad = []
    for module, targets in import_graph().items():
        for target in targets:
            if _floor(target) > _floor(module):
                bad.append(f"{module} (floor {_floor(module)}) imports {target} (floor {_floor(target)})")
            elif {_room(module), _room(target)} == SIBLINGS:
                bad.append(f"{module} imports its sibling {target}")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_circle() -> None:
    graph = import_graph()
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for target in sorted(graph[module]):
            if circle := visit(target):
                return circle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        circle = visit(module)
        assert circle is None, " -> ".join(circle or [])


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


def test_command_list_matches_help() -> None:
    """Every command `qmd --help` lists is in the command list of docs/usage/index.md, and
    the list names no command that does not exist."""
    r = subprocess.run([sys.executable, "-m", "qmd.client.cli", "--help"], capture_output=True, text=True, check=True)
    listed = r.stdout.split("Commands:", 1)[1]
    commands = {m.group(1) for m in re.finditer(r"^  ([a-z][\w-]*)", listed, re.M)}
    block = doc_block("usage/index.md", "The commands")
    documented = {m.group(1) for m in re.finditer(r"^qmd ([a-z][\w-]*)", block, re.M)}
    assert commands - documented == set(), f"not in the command list: {sorted(commands - documented)}"
    assert documented - commands == set(), f"in the command list but not a command: {sorted(documented - commands)}"


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


def test_only_the_store_asks_which_backend_it_runs_on() -> None:
    """The backend is a seam, not a flag (docs/contributing.md, "Adding a backend"): above
    `server/store/`, code passes the store's dialect on (`IndexStore.dialect`,
    `db.dialect_of`) and never reads `is_postgres` or a store's `postgres` attribute."""
    bad = []
    for path in sorted((ROOT / "server").rglob("*.py")):
        if path.is_relative_to(ROOT / "server" / "store"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in ("is_postgres", "postgres"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
            elif isinstance(node, ast.ImportFrom) and any(a.name == "is_postgres" for a in node.names):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {node.module}")
    assert not bad, "\n".join(bad)
