"""The inference worker on a loaded machine and under repeated native crashes (issue 35): the real
child with the real MiniLM embedder, slowed down or crashed by its own test faults
(`QMD_TEST_WORKER_FAULT`, `worker_child.Progress`), never a mock of the worker.

What must hold: a call whose child keeps reporting progress is slow, not hung, however long it
takes past its deadline; one whose child reports nothing is hung at its deadline; a model that
crashes the worker the same way twice is loaded again with llama.cpp's safe settings, and says so;
one that crashes even so names the files to try instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MODELS_DIR, require

from qmd.server.models.worker import SAFE_SETTINGS, ModelSpec, WorkerClient, WorkerLost

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MINILM = MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf"


@pytest.fixture
def spec() -> ModelSpec:
    return ModelSpec("embed", str(require(MINILM, "the MiniLM test embedder (../shared/models)")), n_threads=2)


@pytest.fixture
def faulty(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[WorkerClient]]:
    """Workers made under a fault: QMD_WORKER_TIMEOUT 1.5 s, 0.05 s per item, 20 s to load."""
    monkeypatch.setenv("QMD_WORKER_TIMEOUT", "1.5")
    monkeypatch.setenv("QMD_WORKER_ITEM_TIMEOUT", "0.05")
    monkeypatch.setenv("QMD_WORKER_LOAD_TIMEOUT", "20")
    made: list[WorkerClient] = []
    yield made
    for w in made:
        w.close()


def worker(made: list[WorkerClient], monkeypatch: pytest.MonkeyPatch, fault: str) -> WorkerClient:
    monkeypatch.setenv("QMD_TEST_WORKER_FAULT", fault)
    made.append(WorkerClient(n_threads=2, parallelism=1))
    return made[-1]


def test_a_slow_call_that_reports_progress_is_not_hung(
    faulty: list[WorkerClient], monkeypatch: pytest.MonkeyPatch, spec: ModelSpec
) -> None:
    """8 texts at 1 s each: 8 s, far past the 3.4 s deadline, but never 3 s without progress."""
    monkeypatch.setenv("QMD_WORKER_TIMEOUT", "3")
    w = worker(faulty, monkeypatch, "slow:1")
    w.embed(spec, ["warm"], kind="query")  # the load has its own allowance
    started = time.monotonic()
    vectors = w.embed(spec, [f"note {i} about bread" for i in range(8)], kind="document")
    took = time.monotonic() - started
    assert len(vectors) == 8 and took > 3 + 8 * 0.05, f"the fault slowed it down ({took:.1f} s)"
    status = w.status()
    assert status["hangs"] == 0 and status["restarts"] == 0 and status["last_crash"] is None


def test_a_call_without_progress_is_hung_at_its_deadline(
    faulty: list[WorkerClient], monkeypatch: pytest.MonkeyPatch, spec: ModelSpec
) -> None:
    w = worker(faulty, monkeypatch, "")
    w.embed(spec, ["warm"], kind="query")
    os.kill(w.status()["pid"], signal.SIGSTOP)
    started = time.monotonic()
    hung = r"did not answer within 1.55 s while embedding 1 text with .* \(its process was stopped\)"
    with pytest.raises(WorkerLost, match=hung):
        w.embed(spec, ["stuck"], kind="query")
    assert time.monotonic() - started < 10
    assert w.status()["hangs"] == 1 and w.status()["last_crash"].signal == "SIGKILL"


def test_progress_that_stops_is_a_hang(
    faulty: list[WorkerClient], monkeypatch: pytest.MonkeyPatch, spec: ModelSpec
) -> None:
    """The first text is done, then nothing for 60 s: hung 1.5 s after that one, saying how far it got."""
    w = worker(faulty, monkeypatch, "stall:60")
    w.embed(spec, ["warm"], kind="query", timeout=90)  # an exact deadline: the stall waits it out
    started = time.monotonic()
    stalled = r"made no progress for 1.5 s while embedding 3 texts with .* \(1 item done in \d+ s\)"
    with pytest.raises(WorkerLost, match=stalled):
        w.embed(spec, ["a", "b", "c"], kind="document")
    assert time.monotonic() - started < 10


def test_progress_has_a_ceiling(faulty: list[WorkerClient], monkeypatch: pytest.MonkeyPatch, spec: ModelSpec) -> None:
    """Ticking forever is not enough: at 10 times its deadline (2.5 + 40 * 0.01 s = 2.9 s) a call is hung."""
    monkeypatch.setenv("QMD_WORKER_TIMEOUT", "2.5")
    monkeypatch.setenv("QMD_WORKER_ITEM_TIMEOUT", "0.01")
    w = worker(faulty, monkeypatch, "slow:0.8")
    w.embed(spec, ["warm"], kind="query")
    with pytest.raises(WorkerLost, match=r"did not finish within 29 s while embedding 40 texts with .* done in 29 s"):
        w.embed(spec, [f"text {i}" for i in range(40)], kind="document")


def test_a_model_that_crashes_twice_is_loaded_safely(
    faulty: list[WorkerClient], monkeypatch: pytest.MonkeyPatch, spec: ModelSpec
) -> None:
    w = worker(faulty, monkeypatch, "crash:MiniLM")
    with pytest.raises(
        WorkerLost, match=r"crashed \(SIGSEGV\) while embedding 1 text .*restarted on the next request$"
    ):
        w.embed(spec, ["one"], kind="query")
    first = w.status()["last_crash"]
    # the worker names the file it opened (../shared may be a link)
    assert (first.signal, first.times, first.recovery, first.model) == ("SIGSEGV", 1, None, os.path.realpath(MINILM))
    with pytest.raises(WorkerLost, match=f"crashed it 2 times: it is loaded next time {SAFE_SETTINGS}"):
        w.embed(spec, ["two"], kind="query")
    assert w.status()["last_crash"].times == 2
    assert len(w.embed(spec, ["three"], kind="query")[0]) == 384, "the safe load is spared by the fault, as on AMX"
    assert w.status()["restarts"] == 2


def test_a_model_that_crashes_even_when_safe_names_the_files_to_try(
    faulty: list[WorkerClient], monkeypatch: pytest.MonkeyPatch, spec: ModelSpec, tmp_path: Path
) -> None:
    quantized = tmp_path / "tiny-embedder-Q8_0.gguf"
    shutil.copy(spec.path, quantized)
    (tmp_path / "tiny-embedder-F16.gguf").touch()
    (tmp_path / "other-model-F16.gguf").touch()
    w = worker(faulty, monkeypatch, "crash-always:tiny-embedder")
    for _ in range(2):
        with pytest.raises(WorkerLost):
            w.embed(spec._replace(path=str(quantized)), ["x"], kind="query")
    with pytest.raises(WorkerLost) as err:
        w.embed(spec._replace(path=str(quantized)), ["x"], kind="query")
    crash = w.status()["last_crash"]
    assert crash.recovery == (
        f"tiny-embedder-Q8_0.gguf crashes even with llama.cpp's safe settings ({SAFE_SETTINGS}); use another file "
        f"of the model: {tmp_path / 'tiny-embedder-F16.gguf'} (plain kernels, no repacked weights)"
    )
    assert crash.recovery in err.value.message
