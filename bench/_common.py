"""Shared pieces of the benchmarks: an isolated daemon (the tests' harness), the CLI,
/proc readings, percentiles, plain-text tables and JSON output. Stdlib + httpx only."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = Path(__file__).resolve().parent / "out"
PYTHON = sys.executable

# The daemon harness is the tests' own (tests/harness.py): one way to isolate qmd and
# start `qmdd`, so what the benchmarks time is what the tests check.
sys.path.insert(0, str(ROOT / "tests"))
try:
    from harness import Daemon, Env  # noqa: F401 - Daemon is the bench scripts' too
except ModuleNotFoundError as e:  # pragma: no cover - run with the project's venv
    if e.name != "httpx":
        raise
    sys.exit(f"httpx is missing: run the benchmarks with the project's venv, e.g. {ROOT}/.venv/bin/python")


SHARED_EMBED_MODEL = ROOT.parent / "shared" / "models" / "all-MiniLM-L6-v2-Q8_0.gguf"


def embed_model_path(given: str | None = None) -> str:
    """The embed GGUF for benchmarks: `given`, else $QMD_BENCH_EMBED_MODEL, else the
    shared MiniLM Q8_0 next to the checkout (../shared/models/)."""
    path = Path(given or os.environ.get("QMD_BENCH_EMBED_MODEL") or SHARED_EMBED_MODEL).resolve()
    if not path.is_file():
        sys.exit(f"embed model not found: {path} (pass --model or set QMD_BENCH_EMBED_MODEL)")
    return str(path)


class Isolated(Env):
    """The harness's isolated installation in its own temporary folder, removed afterwards
    unless kept. Autostart is off, so a CLI run never times the start of a second daemon.
    The code measured is the venv's `qmd`: the editable install of this checkout."""

    def __init__(self, keep: bool = False) -> None:
        super().__init__(Path(tempfile.mkdtemp(prefix="qmd-bench-")))
        self.keep = keep
        self.vars["QMD_NO_AUTOSTART"] = "1"

    def db_bytes(self) -> dict[str, int]:
        """Sizes of index.sqlite, its -wal and -shm, by suffix ('' for the main file)."""
        return {
            p.name[len("index.sqlite") :]: p.stat().st_size for p in self.db.parent.glob("index.sqlite*") if p.is_file()
        }

    def cli(self, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
        """Run the CLI once as a fresh process, timed from outside as a user waits for it;
        return (wall seconds, result)."""
        t0 = time.perf_counter()
        r = self.qmd(*args, timeout=900)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"qmd {' '.join(args)} exited {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}")
        return wall, r

    def cleanup(self) -> None:
        if not self.keep:
            shutil.rmtree(self.base, ignore_errors=True)


def pg_database(server: str, name: str) -> str:
    """A new empty database `name` with pgvector on the Postgres server at `server`; its URL."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    url = urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    return url


def pg_database_bytes(url: str) -> int:
    """The size of the database at `url` on disk (`pg_database_size`)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    assert row is not None
    return int(row[0])


# -- /proc --------------------------------------------------------------------------


def proc_status_kb(pid: int, field: str) -> int | None:
    """A `kB` field of /proc/PID/status (VmRSS, VmHWM); None off Linux."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds the process has used (all its threads)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def system_cpu_s() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine since boot, from /proc/stat: busy
    counts every process (ours and others), steal the time the hypervisor gave away."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    tck = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tck, steal / tck


class CpuWindow:
    """CPU used by the machine during a measurement, split into ours and everyone else's.

    `ours(...)` is given the CPU seconds of the processes under test; `others_s` is the
    rest of the machine's busy time (other sessions, tests, indexers): the noise that
    makes a timing on a shared machine unreliable. `others_share` is it as a fraction of
    the machine's capacity over the window."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.start = system_cpu_s()
        self.seconds = 0.0
        self.busy_s: float | None = None
        self.steal_s: float | None = None

    def stop(self) -> CpuWindow:
        self.seconds = time.perf_counter() - self.t0
        end = system_cpu_s()
        if self.start and end:
            self.busy_s = end[0] - self.start[0]
            self.steal_s = end[1] - self.start[1]
        return self

    def others(self, ours_s: float | None) -> dict[str, float | None]:
        if self.busy_s is None or ours_s is None:
            return {"others_cpu_s": None, "others_share": None, "steal_s": self.steal_s}
        others = max(self.busy_s - ours_s, 0.0)
        capacity = self.seconds * (os.cpu_count() or 1)
        return {
            "others_cpu_s": round(others, 2),
            "others_share": round(others / capacity, 3) if capacity else None,
            "steal_s": round(self.steal_s or 0.0, 2),
        }


def children_cpu_s() -> float:
    """User + system CPU of this process's reaped children (the CLI processes run so far)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def mb(kb: int | None) -> float | None:
    return None if kb is None else round(kb / 1024, 1)


# -- numbers ----------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank-with-interpolation percentile (p in 0..100)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    """p50/p95/min/max/mean of second values, in milliseconds."""
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 50) * 1000, 2),
        "p95_ms": round(percentile(values, 95) * 1000, 2),
        "min_ms": round(min(values) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
        "mean_ms": round(statistics.fmean(values) * 1000, 2),
    }


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    title: str | None = None,
    formats: Sequence[str | None] | None = None,
) -> str:
    """Aligned plain text; numbers right-aligned, text left-aligned. `formats` holds an
    optional format spec per column (e.g. ",.0f", ".3f") for numeric cells."""

    def cell(v: Any, i: int) -> str:
        if v is None:
            return "-"
        spec = formats[i] if formats and i < len(formats) else None
        if spec and isinstance(v, (int, float)):
            return format(v, spec)
        if isinstance(v, float):
            return f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    cells = [[cell(v, i) for i, v in enumerate(r)] for r in rows]
    numeric = [
        all(isinstance(r[i], (int, float)) or r[i] is None for r in rows) if rows else False
        for i in range(len(headers))
    ]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def fmt(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths))
        ).rstrip()

    lines = []
    if title:
        lines.append(title)
    lines.append(fmt(headers))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(fmt(r) for r in cells)
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    try:
        from qmd.server.store.db import sqlite3 as qsqlite

        sqlite_version = qsqlite.sqlite_version
        sqlite_module = qsqlite.__name__
    except Exception:  # noqa: BLE001 - informational only
        import sqlite3 as qsqlite  # type: ignore[no-redef]

        sqlite_version, sqlite_module = qsqlite.sqlite_version, "sqlite3"
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "sqlite_module": sqlite_module,
        "sqlite_version": sqlite_version,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "code": code_version(),
    }


def code_version() -> dict[str, Any]:
    """Which code is measured: the checkout's HEAD and any files changed on top of it
    (read-only git commands; empty when git is unavailable)."""

    def git(*args: str) -> str:
        try:
            r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return r.stdout.rstrip() if r.returncode == 0 else ""

    dirty = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines() if line[3:]]
    return {"root": str(ROOT), "head": git("rev-parse", "--short", "HEAD").strip(), "changed": dirty}


def code_line() -> str:
    v = code_version()
    changed = f" + uncommitted changes in {', '.join(v['changed'])}" if v["changed"] else ""
    return f"code: {v['root']} @ {v['head'] or '?'}{changed}"


def write_json(name: str, data: dict[str, Any]) -> Path:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path
