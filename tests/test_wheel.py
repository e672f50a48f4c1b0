"""qmd as users install it: the sdist and the wheel `python -m build` makes, checked by twine,
the wheel the sdist builds the same as the one the tree builds and holding every file of the
package, then installed (not editable) into a clean venv whose own `qmd` and `qmdd` do what a
new user does, in a temporary HOME on a free port.

Every other test runs the editable checkout, which would never notice a file the wheel
forgets. The build runs on a copy of the tree, so the checkout gets no `build/` or
`*.egg-info` of it; the venv gets its dependencies as a user's would, through pip (and its
cache, which holds the llama.cpp wheel `.ci/run` compiled for the test extra)."""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest
from conftest import MODELS_DIR, NOTES, ROOT, Env, daemons_on, require, write
from packaging.requirements import Requirement
from test_mcp_config import launch_of, reach

from qmd.client.mcp_config import Stdio
from qmd.version import __version__

pytestmark = [pytest.mark.slow, pytest.mark.sqlite_only("builds and installs the package; no backend is involved")]

BUILT_NOISE = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*_cache", ".hypothesis")
"""What a checkout holds beyond a fresh clone: left out of the copy the build runs on."""


@dataclass
class Built:
    sdist: Path
    wheel: Path
    """Built from the sdist, as `python -m build` does."""
    tree_wheel: Path
    """Built straight from the tree (`--wheel`)."""
    log: str


def run(argv: list[str], timeout: float = 600) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(argv)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return str(r.stdout + r.stderr)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    base = tmp_path_factory.mktemp("wheel")
    src = shutil.copytree(ROOT, base / "src", symlinks=True, ignore=shutil.ignore_patterns(*BUILT_NOISE))
    log = run([sys.executable, "-m", "build", "--outdir", str(base / "dist"), str(src)])
    log += run([sys.executable, "-m", "build", "--wheel", "--outdir", str(base / "tree"), str(src)])
    ((sdist,),) = [list((base / "dist").glob("*.tar.gz"))]
    ((wheel,), (tree_wheel,)) = [list((base / d).glob("*.whl")) for d in ("dist", "tree")]
    return Built(sdist, wheel, tree_wheel, log)


def package_files() -> set[str]:
    """Every file of the `qmd` package in the tree, through its links, as the wheel names them."""
    out = set()
    for folder, dirs, files in os.walk(ROOT / "qmd", followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = Path(folder).relative_to(ROOT)
        out |= {(rel / f).as_posix() for f in files}
    return out


def test_the_sdist_and_wheel_pass_twine_and_build_without_deprecations(built: Built) -> None:
    run([sys.executable, "-m", "twine", "check", "--strict", str(built.sdist), str(built.wheel)])
    assert "deprecated" not in built.log.lower(), built.log
    assert built.wheel.name == f"qmd-{__version__}-py3-none-any.whl"
    assert built.sdist.name == f"qmd-{__version__}.tar.gz"


def test_the_wheel_holds_every_file_of_the_package_and_the_sdist_builds_the_same(built: Built) -> None:
    names = zipfile.ZipFile(built.wheel).namelist()
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(zipfile.ZipFile(built.tree_wheel).namelist())
    info = f"qmd-{__version__}.dist-info/"
    assert {n for n in names if not n.startswith(info)} == package_files()
    assert {n.removeprefix(info) for n in names if n.startswith(info)} >= {"METADATA", "entry_points.txt", "RECORD"}


def test_the_wheel_metadata_is_the_projects(built: Built) -> None:
    with zipfile.ZipFile(built.wheel) as whl:
        meta = email.message_from_bytes(whl.read(f"qmd-{__version__}.dist-info/METADATA"))
        scripts = whl.read(f"qmd-{__version__}.dist-info/entry_points.txt").decode()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["Name"] == "qmd" and meta["Version"] == __version__
    assert meta["Requires-Python"] == project["requires-python"]
    assert meta["Description-Content-Type"] == "text/markdown"
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    plain = {str(r) for r in requires if "extra" not in str(r.marker)}
    assert plain == {str(Requirement(d)) for d in project["dependencies"]}
    assert set(meta.get_all("Provides-Extra") or []) == set(project["optional-dependencies"])
    assert "qmd = qmd.client.cli:main" in scripts and "qmdd = qmd.server.daemon:main" in scripts


# -- installed: what a new user does ---------------------------------------------------------------


@pytest.fixture(scope="module")
def venv(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean venv with the wheel and its `models` extra installed by pip, as a user installs it; its bin."""
    where = tmp_path_factory.mktemp("venv") / "v"
    run([sys.executable, "-m", "venv", str(where)])
    run([str(where / "bin" / "python"), "-m", "pip", "install", "-q", f"{built.wheel}[models]"], timeout=1200)
    return where / "bin"


@pytest.fixture
def user(venv: Path, tmp_path: Path) -> Iterator[Env]:
    """A new user's HOME on a free port, the MiniLM test embedder set; no daemon outlives it."""
    env = Env(tmp_path)
    env.vars["QMD_EMBED_MODEL"] = str(require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM test embedder"))
    yield env
    for pid in daemons_on(env.port):
        os.kill(pid, 9)


def qmd(env: Env, venv: Path, *args: str, timeout: float = 300) -> str:
    r = env.run([str(venv / "qmd"), *args], timeout=timeout)
    assert r.returncode == 0, f"qmd {' '.join(args)} exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.mark.timeout(1500)  # pip compiles llama.cpp (minutes) when its cache lacks the wheel
def test_the_installed_qmd_does_what_a_new_user_does(venv: Path, user: Env, tmp_path: Path) -> None:
    site = Path(user.run([str(venv / "python"), "-c", "import qmd; print(qmd.__file__)"]).stdout.strip())
    assert site.is_relative_to(venv.parent) and not site.is_relative_to(ROOT), site
    assert qmd(user, venv, "--version") == f"qmd, version {__version__}\n"
    assert "--port" in run([str(venv / "qmdd"), "--help"])

    notes = write(tmp_path / "notes", NOTES)
    qmd(user, venv, "collection", "add", str(notes), "--name", "notes")  # starts the installed daemon
    status = json.loads(qmd(user, venv, "daemon", "status", "--json"))
    assert (Path(f"/proc/{status['pid']}/cmdline").read_bytes().split(b"\0")[0]).decode() == str(venv / "python")
    health = httpx.get(f"{user.url}/health").json()
    assert health["version"] == __version__ == status["version"]

    hits = json.loads(qmd(user, venv, "search", "sourdough", "--json"))
    assert hits[0]["file"] == "qmd://notes/cooking/bread.md"
    qmd(user, venv, "embed")  # with the MiniLM test GGUF, on the wheel's llama.cpp extra
    hits = json.loads(qmd(user, venv, "vsearch", "baking bread with flour", "--json", "--min-score", "0"))
    assert hits[0]["file"] == "qmd://notes/cooking/bread.md"

    page = httpx.get(qmd(user, venv, "ui", "--no-browser").strip())
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assets = re.findall(r'(?:src|href)="/ui/([^"]+)"', page.text)
    assert assets, page.text
    for name in assets:  # the page's files, which only package data puts in the wheel
        served = httpx.get(f"{user.url}/ui/{name}")
        assert served.content == (ROOT / "server" / "http" / "static" / name).read_bytes(), name

    config = launch_of("claude-desktop", qmd(user, venv, "mcp", "--print-config", "claude-desktop"))
    assert isinstance(config, Stdio) and config.command == str(venv / "qmd")
    tools, top = anyio.run(reach, config)
    assert "query" in tools and top == "qmd://notes/cooking/bread.md"

    assert qmd(user, venv, "daemon", "stop")
    assert not daemons_on(user.port), "the daemon outlived 'qmd daemon stop'"
