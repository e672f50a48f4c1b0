"""Indexing speed of qmd against floors measured in the same run.

    .venv/bin/python bench/bench_index.py [--files 5000] [--seed 1] [--no-phases] [--keep]

Generates a corpus (bench/corpus.py), starts a fresh isolated `qmdd` (temporary
HOME/XDG dirs, free port) and times, through the real CLI:

  cold         `qmd collection add CORPUS` (walk, read, hash, insert, FTS5)
  no change    `qmd update` with nothing changed (walk + stat only)
  touch 1%     `qmd update` after bumping the mtime of 1% of the files (re-read + re-hash)
  edit 1%      `qmd update` after appending a paragraph to another 1% (re-index those)

Floors, measured in this process on the same files (warm page cache, like qmd):

  read+sha256  read every file and sha256 it: the least any content-hashing indexer does
  walk+stat    os.walk + stat every file: the least an incremental update does
  FTS5 insert  read + decode + INSERT into an FTS5 table (same tokenizer) in one
               transaction of a temp file DB: the "no-daemon floor"
  schema       read + hash + qmd's own schema (content, documents, FTS5) with the same
               statements, in batches of 400 per transaction, no daemon

`ratio` = qmd's time / the floor's. Figures, never assertions: machines are noisy.
Then (unless --no-phases) it runs the indexer's own functions in-process, one phase
after the other, timing each phase and each SQL statement kind: where the time goes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus as corpus_mod  # noqa: E402
from _common import (  # noqa: E402
    Daemon,
    Isolated,
    code_line,
    machine,
    mb,
    proc_cpu_s,
    proc_status_kb,
    table,
    write_json,
)

# -- floors ---------------------------------------------------------------------------


def list_files(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        out.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".md"))
    return out


def floor_read_hash(root: Path) -> float:
    t0 = time.perf_counter()
    for p in list_files(root):
        with open(p, "rb") as fh:
            hashlib.sha256(fh.read()).hexdigest()
    return time.perf_counter() - t0


def floor_walk_stat(root: Path) -> float:
    t0 = time.perf_counter()
    for p in list_files(root):
        os.stat(p)
    return time.perf_counter() - t0


def _sqlite():
    from qmd.server.store.db import sqlite3

    return sqlite3


def _connect(path: Path):
    sqlite3 = _sqlite()
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def floor_fts5(root: Path, db: Path) -> tuple[float, float]:
    """(total seconds, seconds inside INSERT) for read + decode + FTS5 insert, one transaction."""
    from qmd.server.store.schema import FTS_TABLE

    conn = _connect(db)
    # the same table definition as the index's (with or without a copy of the bodies)
    conn.execute(FTS_TABLE.replace("IF NOT EXISTS documents_fts", "fts"))
    t0 = time.perf_counter()
    insert_s = 0.0
    conn.execute("BEGIN")
    for i, p in enumerate(list_files(root), 1):
        with open(p, "rb") as fh:
            text = fh.read().decode("utf-8")
        t1 = time.perf_counter()
        conn.execute(
            "INSERT INTO fts(rowid, filepath, title, body) VALUES (?, ?, ?, ?)", (i, os.path.relpath(p, root), "", text)
        )
        insert_s += time.perf_counter() - t1
    conn.execute("COMMIT")
    total = time.perf_counter() - t0
    conn.close()
    return total, insert_s


def floor_schema(root: Path, db: Path) -> float:
    """qmd's schema and statements, in one process, batches of 400 files per transaction."""
    from qmd.server.store.schema import FTS_TABLE, TABLES

    conn = _connect(db)
    conn.executescript(TABLES)
    conn.execute(FTS_TABLE)
    files = list_files(root)
    t0 = time.perf_counter()
    now = "2026-01-01T00:00:00+00:00"
    for start in range(0, len(files), 400):
        conn.execute("BEGIN IMMEDIATE")
        for p in files[start : start + 400]:
            with open(p, "rb") as fh:
                data = fh.read()
            text = data.decode("utf-8")
            digest = hashlib.sha256(data).hexdigest()
            rel = os.path.relpath(p, root)
            conn.execute("INSERT OR IGNORE INTO content(hash, doc, created_at) VALUES (?, ?, ?)", (digest, text, now))
            cur = conn.execute(
                "INSERT INTO documents(collection, path, title, hash, created_at, modified_at, active, size, mtime_ns)"
                " VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?)",
                ("bench", rel, rel, digest, now, now, len(data), 0),
            )
            conn.execute(
                "INSERT INTO documents_fts(rowid, filepath, title, body) VALUES (?, ?, ?, ?)",
                (cur.lastrowid, "bench/" + rel, rel, text),
            )
        conn.execute("COMMIT")
    total = time.perf_counter() - t0
    conn.close()
    return total


# -- qmd through the CLI -------------------------------------------------------------------

_SERVER_SECONDS = re.compile(r"(\d+) files in ([0-9.]+)s")
_SUMMARY = re.compile(r"Indexed: (\d+) new, (\d+) updated, (\d+) unchanged, (\d+) removed")


class CpuSampler:
    """Peak RSS of the daemon while a command runs (VmHWM is a lifetime high-water mark)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kb = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, proc_status_kb(self.pid, "VmRSS") or 0)
            self._stop.wait(0.05)

    def __enter__(self) -> CpuSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def run_cli(env: Isolated, daemon: Daemon, *args: str) -> dict:
    cpu0 = proc_cpu_s(daemon.pid)
    with CpuSampler(daemon.pid) as sampler:
        wall, r = env.cli(*args)
    cpu1 = proc_cpu_s(daemon.pid)
    out = r.stdout + r.stderr
    m = _SERVER_SECONDS.search(out)
    s = _SUMMARY.search(out)
    return {
        "wall_s": round(wall, 3),
        "server_s": float(m.group(2)) if m else None,
        "daemon_cpu_s": round(cpu1 - cpu0, 2) if cpu0 is not None and cpu1 is not None else None,
        "daemon_peak_rss_mb": mb(sampler.peak_kb) if sampler.peak_kb else None,
        "summary": dict(zip(("new", "updated", "unchanged", "removed"), map(int, s.groups()))) if s else None,
        "output": out.strip().splitlines()[-4:],
    }


def http_update(daemon: Daemon) -> dict:
    """The same no-change update straight over HTTP from this (warm) process: no CLI start-up."""
    import json

    cpu0 = proc_cpu_s(daemon.pid)
    t0 = time.perf_counter()
    summary = None
    with daemon.http.stream("POST", "/v1/update", json={"collections": None}) as r:
        for line in r.iter_lines():
            if line.strip():
                ev = json.loads(line)
                if ev.get("event") == "summary":
                    summary = ev
    wall = time.perf_counter() - t0
    cpu1 = proc_cpu_s(daemon.pid)
    return {
        "wall_s": round(wall, 4),
        "server_s": round(summary["seconds"], 4) if summary else None,
        "daemon_cpu_s": round(cpu1 - cpu0, 2) if cpu0 is not None and cpu1 is not None else None,
        "daemon_peak_rss_mb": None,
        "summary": None,
        "output": [summary.get("line")] if summary else [],
    }


def pick(paths: list[str], fraction: float, seed: int, avoid: set[str] = frozenset()) -> list[str]:
    rng = random.Random(seed)
    n = max(1, round(len(paths) * fraction))
    pool = [p for p in paths if p not in avoid]
    return sorted(rng.sample(pool, n))


# -- in-process phase breakdown -------------------------------------------------------------


class TimingConn:
    """Wraps a sqlite3 connection; times `execute` by statement kind."""

    def __init__(self, conn, times: dict[str, list[float]]) -> None:
        self._conn = conn
        self._times = times

    def execute(self, sql: str, params=()):  # noqa: ANN001
        key = " ".join(sql.split()[:5]).split("(")[0]
        t0 = time.perf_counter()
        cur = self._conn.execute(sql, params)
        slot = self._times.setdefault(key, [0.0, 0])
        slot[0] += time.perf_counter() - t0
        slot[1] += 1
        return cur

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._conn, name)


def phases(root: Path, work: Path) -> dict:
    """Run the indexer's parts in-process, one after the other (no overlap), on a fresh DB."""
    from qmd.server.config import Collection
    from qmd.server.ingest.indexer import BATCH_FILES, _apply, _finish, discover, load_file, max_file_bytes
    from qmd.server.store.sqlite import Store

    coll = Collection(name="bench", path=str(root), pattern="**/*.md")
    store = Store(work / "phases.sqlite")
    rows: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        walk = discover(coll)
        rows["walk (discover)"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        for f in walk.files:
            os.path.realpath(f.abs)
        rows["  of which os.path.realpath"] = time.perf_counter() - t0

        limit = max_file_bytes()
        t0 = time.perf_counter()
        loaded = [load_file(f, limit) for f in walk.files]
        rows["read+decode+sha256+title (load_file)"] = time.perf_counter() - t0

        sql: dict[str, list[float]] = {}
        t0 = time.perf_counter()
        for i in range(0, len(loaded), BATCH_FILES):
            ops = [("insert", x) for x in loaded[i : i + BATCH_FILES]]
            store.write(lambda conn, ops=ops: _apply(TimingConn(conn, sql), "bench", ops))
        rows["SQLite writes (_apply, 400/txn)"] = time.perf_counter() - t0
        for key, (secs, n) in sorted(sql.items(), key=lambda kv: -kv[1][0]):
            rows[f"  {key} (x{n})"] = secs

        t0 = time.perf_counter()
        store.write(lambda conn: _finish(conn, []))
        rows["finish (orphan-content sweep)"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        with store.read() as conn:
            n = len(
                conn.execute(
                    "SELECT id, path, hash, size, mtime_ns, title, active FROM documents WHERE collection = ?",
                    ("bench",),
                ).fetchall()
            )
        rows["load existing rows (incremental)"] = time.perf_counter() - t0
        assert n == len(loaded), (n, len(loaded))
    finally:
        store.close()
    return {k: round(v, 3) for k, v in rows.items()}


# -- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--phases",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the indexer's phases in-process (default: on)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (corpus, index, logs)")
    args = ap.parse_args(argv)

    env = Isolated(keep=args.keep)
    daemon: Daemon | None = None
    try:
        root = env.base / "corpus"
        stats = corpus_mod.generate(root, args.files, args.seed)
        total_mb = stats.mb
        print(
            f"corpus: {stats.files} files, {total_mb:.1f} MB (mean {stats.bytes / stats.files / 1000:.1f} KB, "
            f"largest {stats.largest / 1000:.0f} KB), seed {args.seed}, generated in {stats.seconds:.1f}s"
        )
        print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, sqlite {_sqlite().sqlite_version}")
        print(code_line(), flush=True)

        floors = {
            "read+sha256": min(floor_read_hash(root) for _ in range(3)),
            "walk+stat": min(floor_walk_stat(root) for _ in range(3)),
        }
        fts_total, fts_insert = floor_fts5(root, env.base / "floor-fts.sqlite")
        floors["FTS5 insert"] = fts_total
        floors["schema (no daemon)"] = floor_schema(root, env.base / "floor-schema.sqlite")
        print("floors measured", flush=True)

        daemon = Daemon(env)
        startup_s = daemon.startup_s
        time.sleep(1.0)
        rss_idle = proc_status_kb(daemon.pid, "VmRSS")

        runs: dict[str, dict] = {}
        runs["cold: collection add"] = run_cli(env, daemon, "collection", "add", str(root), "--name", "bench")
        rss_indexed = proc_status_kb(daemon.pid, "VmRSS")
        runs["no change: update"] = run_cli(env, daemon, "update")
        runs["no change: POST /v1/update"] = http_update(daemon)

        touched = pick(stats.paths, 0.01, args.seed + 101)
        bump = time.time_ns() + 5_000_000_000
        for rel in touched:
            os.utime(root / rel, ns=(bump, bump))
        runs["touch 1%: update"] = run_cli(env, daemon, "update")

        edited = pick(stats.paths, 0.01, args.seed + 202, avoid=set(touched))
        for i, rel in enumerate(edited):
            with open(root / rel, "a", encoding="utf-8") as fh:
                fh.write(f"\n## Edited section {i}\n\nThis paragraph was appended by the benchmark run {i}.\n")
        runs["edit 1%: update"] = run_cli(env, daemon, "update")

        status = daemon.http.get("/v1/status").json()
        rss_end = proc_status_kb(daemon.pid, "VmRSS")
        hwm = proc_status_kb(daemon.pid, "VmHWM")
        db_bytes = env.db_bytes()
        if status.get("documents") != stats.files:
            print(
                f"WARNING: the index holds {status.get('documents')} documents, expected {stats.files}", file=sys.stderr
            )
        daemon.stop()
        daemon = None

        # -- report ---------------------------------------------------------------------
        def rate(secs: float | None, amount: float) -> float | None:
            return amount / secs if secs else None

        rows = []
        for name, key, has_mb in (
            ("floor: read+sha256", "read+sha256", True),
            ("floor: walk+stat", "walk+stat", False),
            ("floor: FTS5 insert", "FTS5 insert", True),
            ("floor: schema, no daemon", "schema (no daemon)", True),
        ):
            secs = floors[key]
            rows.append(
                [
                    name,
                    secs,
                    rate(secs, stats.files),
                    rate(secs, total_mb) if has_mb else None,
                    None,
                    None,
                    "",
                    None,
                    None,
                ]
            )
        for name, r in runs.items():
            wall, server = r["wall_s"], r["server_s"]
            base = "read+sha256" if name.startswith("cold") else "walk+stat"
            rows.append(
                [
                    f"qmd {name}",
                    wall,
                    rate(wall, stats.files),
                    rate(wall, total_mb),
                    server,
                    r["daemon_cpu_s"],
                    base,
                    wall / floors[base],
                    server / floors[base] if server else None,
                ]
            )
        print()
        print(
            table(
                ["run", "wall s", "files/s", "MB/s", "server s", "daemon CPU s", "floor", "wall/floor", "server/floor"],
                rows,
                title=f"Indexing {stats.files} files / {total_mb:.1f} MB  (wall = the whole `qmd` process; "
                "server s = the daemon's own count for the collection)",
                formats=[None, ".3f", ",.0f", ".1f", ".3f", ".2f", None, ",.1f", ",.1f"],
            )
        )
        cold_r = runs["cold: collection add"]
        cold, cold_server = cold_r["wall_s"], cold_r["server_s"] or float("nan")
        print()
        print(
            table(
                ["cold index vs floor", "floor s", "qmd wall/floor", "qmd server/floor"],
                [
                    [
                        "read+sha256",
                        floors["read+sha256"],
                        cold / floors["read+sha256"],
                        cold_server / floors["read+sha256"],
                    ],
                    [
                        "FTS5 insert (no-daemon floor)",
                        floors["FTS5 insert"],
                        cold / floors["FTS5 insert"],
                        cold_server / floors["FTS5 insert"],
                    ],
                    ["  its INSERT statements alone", fts_insert, cold / fts_insert, cold_server / fts_insert],
                    [
                        "schema, no daemon",
                        floors["schema (no daemon)"],
                        cold / floors["schema (no daemon)"],
                        cold_server / floors["schema (no daemon)"],
                    ],
                ],
                formats=[None, ".3f", ".2f", ".2f"],
            )
        )
        print()
        print(
            table(
                ["daemon", "value"],
                [
                    ["startup to first /health (s)", round(startup_s, 2)],
                    ["RSS idle after startup (MB)", mb(rss_idle)],
                    ["RSS after cold index (MB)", mb(rss_indexed)],
                    ["RSS at end (MB)", mb(rss_end)],
                    ["peak RSS, kernel VmHWM (MB)", mb(hwm)],
                    ["peak RSS during cold index (MB)", cold_r["daemon_peak_rss_mb"]],
                    ["index on disk: index.sqlite (MB)", round(db_bytes.get("", 0) / 2**20, 1)],
                    ["index on disk: -wal (MB)", round(db_bytes.get("-wal", 0) / 2**20, 1)],
                ],
                formats=[None, ".2f"],
            )
        )
        print()
        for name, r in runs.items():
            if r["summary"]:
                print(f"{name}: {r['summary']}")

        result = {
            "machine": machine(),
            "corpus": {
                "files": stats.files,
                "mb": round(total_mb, 2),
                "seed": args.seed,
                "largest_kb": round(stats.largest / 1000),
                "over_50kb": stats.over_50k,
                "generate_s": round(stats.seconds, 2),
            },
            "floors_s": {k: round(v, 3) for k, v in floors.items()} | {"FTS5 INSERT alone": round(fts_insert, 3)},
            "runs": runs,
            "ratios": {
                "cold / read+sha256": round(cold / floors["read+sha256"], 2),
                "cold / FTS5 insert": round(cold / floors["FTS5 insert"], 2),
                "cold / schema": round(cold / floors["schema (no daemon)"], 2),
                **{
                    f"{k} / walk+stat": round(v["wall_s"] / floors["walk+stat"], 2)
                    for k, v in runs.items()
                    if k != "cold: collection add"
                },
            },
            "memory_mb": {
                "rss_idle": mb(rss_idle),
                "rss_after_index": mb(rss_indexed),
                "rss_end": mb(rss_end),
                "vm_hwm": mb(hwm),
            },
            "index_bytes": db_bytes,
            "daemon_startup_s": round(startup_s, 3),
            "documents_indexed": status.get("documents"),
        }

        if args.phases:
            print("\nphases, in-process and sequential (no HTTP, no read/write overlap):", flush=True)
            try:
                ph = phases(root, env.base)
            except Exception as e:  # noqa: BLE001 - uses the indexer's private functions, which may change
                print(f"phases skipped: the indexer's internals changed ({type(e).__name__}: {e})")
            else:
                print(table(["phase", "seconds"], [[k, v] for k, v in ph.items()], formats=[None, ".3f"]))
                result["phases_s"] = ph

        path = write_json("index", result)
        print(f"\nwrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
        if args.keep:
            print(f"kept {env.base}")
    finally:
        if daemon is not None:
            daemon.stop()
        env.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
