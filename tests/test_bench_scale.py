"""bench/bench_scale.py at a small size: the one command of the scale bench runs end to end
(corpus, daemon, vectors through the store's code, HTTP figures), on SQLite and on Postgres,
and writes the figures the issue names, with sane values; bad arguments are refused before
anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MODELS_DIR, ROOT, require

SCRIPT = ROOT / "bench" / "bench_scale.py"
KEYS = (
    "size",
    "vector_p50_ms",
    "recall_at_10",
    "keyword_p50_ms",
    "query_p50_ms",
    "embed_noop_ms",
    "embed_noop_restart_ms",
    "first_search_after_embed_ms",
    "warm_search_ms",
    "rss_mb",
    "cold_start_ms",
    "disk_mb",
)


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
@pytest.mark.sqlite_only("the scale bench measures the SQLite index: its file, vec0 and the in-memory index")
def test_a_small_scale_run_writes_every_figure(tmp_path: Path) -> None:
    model = require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM embedder GGUF (the daemon's embed model)")
    out = tmp_path / "scale.json"
    r = run(
        "--sizes", "2000", "--queries", "10", "--exact-queries", "5", "--keyword-queries", "5", "--rounds", "1",
        "--model", str(model), "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    [figures] = json.loads(out.read_text())
    assert all(figures.get(k) is not None for k in KEYS), figures
    assert figures["size"] == 2000
    assert figures["recall_at_10"] >= 0.99
    for key in KEYS[1:]:
        assert figures[key] > 0, key
    assert figures["update_1pct_files"] > 0 and figures["embed_batch_vectors"] > 0
    assert "2,000 chunks" in r.stdout and "recall@10" in r.stdout


@pytest.mark.slow
def test_a_small_scale_run_on_postgres(tmp_path: Path, postgres_url: str) -> None:
    """`--backend postgres` on the test server: the same figures, from a Postgres index, with
    pgvector's HNSW walk timed beside the daemon's index."""
    model = require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM embedder GGUF (the daemon's embed model)")
    out = tmp_path / "scale.json"
    r = run(
        "--sizes", "2000", "--queries", "10", "--exact-queries", "5", "--keyword-queries", "5", "--rounds", "1",
        "--model", str(model), "--json", str(out), "--backend", "postgres", "--url", postgres_url,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    [figures] = json.loads(out.read_text())
    assert figures["backend"] == "postgres"
    assert all(figures.get(k) is not None for k in KEYS), figures
    assert figures["recall_at_10"] >= 0.99
    assert figures["hnsw_build_s"] > 0 and 0 <= figures["hnsw_recall_at_10"] <= 1
    assert "2,000 chunks, postgres" in r.stdout and "HNSW walk" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--sizes", "10k"), "--sizes must be comma-separated integers"),
        (("--sizes", "50"), "sizes must be at least 100 chunks"),
        (("--queries", "5", "--exact-queries", "6"), "1 <= --exact-queries <= --queries"),
        (("--no-hnsw",), "--no-hnsw is for --backend postgres"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(args: tuple[str, ...], message: str) -> None:
    r = run(*args, timeout=60)
    assert r.returncode == 2 and message in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.sqlite_only("it measures SQLite files: qmd's layout and the original's vec0 tables")
def test_vectors_take_fewer_bytes_than_the_original_s(tmp_path: Path) -> None:
    """bench/bench_vector_disk.py at a small size: qmd's layout of the same vectors is smaller
    on disk than the original's, and schema 10 smaller than schema 9."""
    out = tmp_path / "disk.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_vector_disk.py"), "--vectors", "3000", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    size = json.loads(out.read_text())["bytes_per_vector"]
    assert size["qmd"] < 0.75 * size["original"] and size["qmd"] < 0.6 * size["qmd_schema_9"]
