"""QMD_LLAMA_GPU and QMD_EMBED_PARALLELISM: how they are read, the choices the worker makes from
them (a fake device list stands in for GPUs this machine lacks), and the embed job packing the
chunks of several documents into one request so parallel contexts have them to share."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MODELS_DIR, NOTES, require, write

import qmd
from qmd.server.ingest.embed_job import EMBED_SUB_BATCH, embed_pending
from qmd.server.models.embedders import Embedder
from qmd.server.models.protocol import DisposeRequest
from qmd.server.models.worker import Embeddings, ModelSpec, WorkerClient, embed_parallelism, gpu_choice
from qmd.server.models.worker_child import Device, auto_parallelism, plan_gpu
from qmd.server.text.chunking import Chunk
from qmd.server.text.split import split

CPU = Device("CPU", "AMD EPYC", "cpu", "CPU", 24 << 30, 1)
CUDA = Device("CUDA0", "NVIDIA RTX 4090", "gpu", "CUDA", 20 << 30, 2)
VULKAN = Device("Vulkan0", "NVIDIA RTX 4090", "gpu", "Vulkan", 20 << 30, 3)
ROCM = Device("ROCm0", "AMD Radeon RX 7900", "gpu", "ROCm", 16 << 30, 4)


@pytest.mark.parametrize(
    ("raw", "choice", "warned"),
    [
        (None, "auto", False),
        ("", "auto", False),
        (" Auto ", "auto", False),
        ("false", "cpu", False),
        ("OFF", "cpu", False),
        ("0", "cpu", False),
        ("none", "cpu", False),
        ("disabled", "cpu", False),
        ("CUDA", "cuda", False),
        ("vulkan", "vulkan", False),
        ("metal", "metal", False),
        ("cuda vulkan", "auto", True),
    ],
)
def test_qmd_llama_gpu_is_read_as_the_spec_says(raw: str | None, choice: str, warned: bool) -> None:
    got, warning = gpu_choice(raw)
    assert got == choice and bool(warning) is warned


@pytest.mark.parametrize(
    ("raw", "value", "warned"),
    [(None, 0, False), ("", 0, False), ("auto", 0, False), ("1", 1, False), ("3", 3, False), ("8", 8, False)]
    + [("20", 8, True), ("0", 0, True), ("-2", 0, True), ("two", 0, True), ("1.5", 0, True)],
)
def test_qmd_embed_parallelism_is_a_count_from_1_to_8(raw: str | None, value: int, warned: bool) -> None:
    got, warning = embed_parallelism(raw)
    assert got == value and bool(warning) is warned


def test_settings_come_from_the_environment_and_bad_ones_are_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QMD_LLAMA_GPU", "Vulkan")
    monkeypatch.setenv("QMD_EMBED_PARALLELISM", "3")
    w = WorkerClient()
    assert (w.gpu, w.parallelism, w.warnings) == ("vulkan", 3, [])
    assert w.status()["gpu_choice"] == "vulkan" and w.status()["embed_parallelism"] == 3
    monkeypatch.setenv("QMD_LLAMA_GPU", "!!")
    monkeypatch.setenv("QMD_EMBED_PARALLELISM", "lots")
    w = WorkerClient()
    assert (w.gpu, w.parallelism) == ("auto", 0)
    assert w.status()["embed_parallelism"] == "auto" and len(w.status()["warnings"]) == 2
    assert WorkerClient(gpu="cpu", parallelism=2).warnings == [], "explicit arguments read no environment"


def test_gpu_plan_picks_the_named_backend_among_several() -> None:
    devices = [CUDA, VULKAN, CPU]
    auto = plan_gpu("auto", force_cpu=False, gpu_supported=True, devices=devices)
    assert auto.n_gpu_layers == -1 and auto.devices is None, "auto leaves the choice to llama.cpp"
    vulkan = plan_gpu("vulkan", force_cpu=False, gpu_supported=True, devices=devices)
    assert vulkan.n_gpu_layers == -1 and vulkan.devices == (VULKAN,) and vulkan.warnings == ()
    assert "Vulkan0 (NVIDIA RTX 4090, gpu, Vulkan)" in (vulkan.offload or "")
    assert plan_gpu("cuda", force_cpu=False, gpu_supported=True, devices=devices).devices == (CUDA,)
    assert plan_gpu("hip", force_cpu=False, gpu_supported=True, devices=[ROCM, CPU]).devices == (ROCM,)
    igpu = Device("Vulkan1", "AMD Radeon 780M", "igpu", "Vulkan", 2 << 30, 5)
    assert plan_gpu("vulkan", force_cpu=False, gpu_supported=True, devices=[igpu, VULKAN, CPU]).devices == (VULKAN,)
    assert plan_gpu("vulkan", force_cpu=False, gpu_supported=True, devices=[igpu, CPU]).devices == (igpu,)


def test_gpu_plan_falls_back_loudly() -> None:
    devices = [CUDA, VULKAN, CPU]
    metal = plan_gpu("metal", force_cpu=False, gpu_supported=True, devices=devices)
    assert metal.n_gpu_layers == 0 and metal.offload is None
    assert metal.warnings == (
        "QMD_LLAMA_GPU=metal: this llama.cpp build has no metal device (GPU backends: CUDA, Vulkan); on the CPU",
    )
    typo = plan_gpu("cuad", force_cpu=False, gpu_supported=True, devices=devices)
    assert typo.n_gpu_layers == -1 and typo.devices is None, "a typo is auto (spec §1.2)"
    assert "QMD_LLAMA_GPU=cuad names no llama.cpp backend" in typo.warnings[0]
    cpu_build = plan_gpu("cuda", force_cpu=False, gpu_supported=False, devices=[CPU])
    assert cpu_build.n_gpu_layers == 0 and "has no GPU backend; running on the CPU" in cpu_build.warnings[0]
    assert plan_gpu("auto", force_cpu=False, gpu_supported=False, devices=[CPU]) == (0, None, None, ())
    assert plan_gpu("cuda", force_cpu=True, gpu_supported=True, devices=devices) == (0, None, None, ())
    assert plan_gpu("cpu", force_cpu=False, gpu_supported=True, devices=devices) == (0, None, None, ())


@pytest.mark.parametrize(
    ("cores", "gpu_free_gb", "file_mb", "n_ctx", "expected"),
    [
        (2, None, 25, 512, 1),  # this machine: 1 on 2 cores
        (4, None, 25, 512, 1),
        (8, None, 300, 2048, 2),
        (16, None, 300, 2048, 4),
        (64, None, 300, 2048, 4),
        (8, 8, 300, 2048, 8),  # 0.25 × (8192 − 1000) / 150 = 11.99 → 8
        (8, 2, 300, 2048, 1),  # 0.25 × 1048 / 150 = 1.7
        (8, 24, 600, 2048, 5),  # 0.25 × 23576 / 1110
        (8, 1, 300, 2048, 1),  # less than 1 GB free still gets one context
    ],
)
def test_automatic_parallelism_follows_the_hardware(
    cores: int, gpu_free_gb: int | None, file_mb: int, n_ctx: int, expected: int
) -> None:
    free = None if gpu_free_gb is None else gpu_free_gb << 30
    assert auto_parallelism(cores=cores, gpu_free_bytes=free, file_bytes=file_mb << 20, n_ctx=n_ctx) == expected


class Recording:
    """An embed backend that records each request: one 4-dimensional vector per text."""

    def __init__(self) -> None:
        self.requests: list[tuple[list[str], list[str | None]]] = []

    def chunk(self, text: str, max_tokens: int, language: str | None = None) -> list[Chunk]:
        return list(split(text, max_tokens=max_tokens, tokenizer=self, language=language))

    def count(self, text: str) -> int:
        return len(text) // 4 + 1

    def embed(self, texts: list[str], kind: str, titles: list[str | None] | None = None) -> Embeddings:
        self.requests.append((texts, list(titles or [])))
        return Embeddings([[1.0, 0.0, 0.0, 0.0]] * len(texts), clipped=(), n_tokens=[1] * len(texts), limit=512)


def test_the_embed_job_packs_several_documents_into_one_request(tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", {**NOTES, "long.md": "# Long\n\n" + "A paragraph of words.\n\n" * 900})
    backend = Recording()
    embedder = Embedder("fake", backend, 64, "f" * 64, 4, "fake")
    with qmd.open(tmp_path / "i.sqlite", collections={"notes": {"path": str(notes)}}) as index:
        index.update()
        report = embed_pending(index.engine.store, embedder, collections=None)
    sizes = [len(texts) for texts, _ in backend.requests]
    assert report.documents == 5 and report.embedded == report.chunks == sum(sizes) and report.pending_after == 0
    assert all(n == EMBED_SUB_BATCH for n in sizes[:-1]) and 0 < sizes[-1] <= EMBED_SUB_BATCH, "requests are full"
    mixed = [set(titles) for _, titles in backend.requests if len(set(titles)) > 1]
    assert mixed, "the small notes share a request (with the long one's tail, each with its own title)"


MINILM = MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf"


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return ModelSpec("embed", str(require(MINILM, "the MiniLM embedder GGUF (../shared/models/README.md)")))


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_parallel_contexts_embed_what_one_context_does(spec: ModelSpec) -> None:
    """Two contexts on one model's weights, each with one of the two threads, give the vectors one
    context gives (to float rounding), also after idle disposal freed both."""
    texts = [f"note {i}: " + "sourdough bread and seed rounds " * (i * 5 + 1) for i in range(9)]
    one, two = WorkerClient(n_threads=2, parallelism=0), WorkerClient(n_threads=2, parallelism=2)
    try:
        reference = one.embed(spec, texts, kind="document")
        assert [m["parallelism"] for m in one.status()["models_loaded"]] == [1], "automatic on 2 threads: 1"
        for _ in range(2):
            got = two.embed(spec, texts, kind="document")
            assert min(dot(a, b) for a, b in zip(reference, got, strict=True)) > 0.99999
            assert got.n_tokens == reference.n_tokens
            two._call(DisposeRequest(), None, "freeing idle contexts")
            assert two.status()["contexts_live"] == 0
        assert [m["parallelism"] for m in two.status()["models_loaded"]] == [2]
        assert two.status()["models_loaded"][0]["load_seconds"] > 0
    finally:
        one.close()
        two.close()


@pytest.mark.slow
def test_qmd_llama_gpu_on_this_build(spec: ModelSpec) -> None:
    """The devices this llama.cpp build has are listed; a GPU backend it lacks is said, and the CPU used."""
    w = WorkerClient(n_threads=2, gpu="vulkan")
    try:
        w.count_tokens(spec, ["x"])
        status = w.status()
        assert any(d.startswith("CPU (") for d in status["devices"]), status["devices"]
        if status["gpu_offload_supported"]:
            pytest.skip("this build has a GPU backend: the fallback cannot be seen here")
        assert status["backend"] == "CPU" and status["offload"] is None
        assert status["warnings"] == [
            "QMD_LLAMA_GPU=vulkan: this llama.cpp build has no GPU backend; running on the CPU"
        ]
    finally:
        w.close()
