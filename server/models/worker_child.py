"""The inference worker: the only process that loads llama.cpp.

`qmdd` starts it as `python -m qmd.server.models.worker_child` (see
`qmd.server.models.worker.WorkerClient`) so that a native crash in llama.cpp (a failed
GGML_ASSERT aborts, a bad GGUF can segfault) kills this child, never the daemon that
answers keyword search.

It reads requests from stdin and writes replies to stdout, in the frames and message
types of `qmd.server.models.protocol`, and dispatches each request through `OPERATIONS`:
request type → handler. `WorkerProcess` is the request loop's state (loaded models, the
GPU decision); `LoadedModel` is one GGUF with its weights resident.

Everything the child or llama.cpp writes goes to stderr, which the parent forwards to
the daemon's log: the protocol keeps private duplicates of fds 0 and 1, and fd 1 itself is
pointed at stderr, so a stray native `printf` can never corrupt a frame.

This module's top level imports only the standard library and the protocol; llama_cpp and
numpy are imported where they are used, in this process only.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import io
import math
import os
import pickle
import re
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

from qmd.server.children import exit_with_parent
from qmd.server.models.protocol import (
    MODELS_MISSING,
    RECEIPT,
    ChunkRequest,
    ChunkSpan,
    CompleteRequest,
    Completion,
    CountTokensRequest,
    DisposeRequest,
    EmbedRequest,
    EmbedResult,
    GenerationParams,
    Hello,
    LikelihoodRequest,
    LoadParams,
    RankRequest,
    RenderChatRequest,
    Reply,
    Request,
    Resident,
    YesNoRequest,
    YieldFlag,
    encode_frame,
    read_frame_body,
)

if TYPE_CHECKING:
    import numpy as np
    from llama_cpp import _internals
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

# ggml_log_level as this llama.cpp build numbers it (llama_cpp/_logger.py's table is stale:
# it maps real errors to DEBUG and drops them, and prints warnings as errors).
GGML_LOG_WARN, GGML_LOG_ERROR, GGML_LOG_CONT = 3, 4, 5

DECODE_ABORTED = 2
"""What `llama_decode` returns when its abort callback said stop."""
YIELDING = threading.Event()
"""Set once an embed has told llama.cpp to stop for a yield, until it returns: the errors llama.cpp
logs about the graph it abandoned are expected then, and not passed on."""

OUTPUT_ROWS = 32
"""Scored positions per decode in `LoadedModel._forward`. llama.cpp keeps an output buffer of one
vocabulary-sized row per output and never shrinks it: 32 rows of Gemma's 262k floats are
32 MiB, while a whole 512-token batch of outputs would pin 512 MiB."""


PREFIX_STATES = 8
"""Evaluated prompt prefixes kept per generative model (`LoadedModel._prefill`): the expansion
prompt's instructions and examples, a reranker's template head, a yes/no judge's head for the
query at hand."""
PREFIX_BYTES = 64 << 20
"""Their total size at most (the newest is always kept): each is the KV cache of its tokens,
about 20 KB per token for Gemma 270M and SmolLM2 (5 MB for the 272-token expansion prompt)."""


class Progress:
    """The child's progress counter in the page it shares with the parent (`YieldFlag.tick`), and
    the test faults of `QMD_TEST_WORKER_FAULT` (the parent's liveness tests simulate a loaded
    machine with the real child): `slow:S` sleeps S seconds before each item it reports,
    `stall:S` sleeps S seconds after a request's first item without reporting anything, and
    `crash:NAME` / `crash-always:NAME` make loading a model file whose name contains NAME end
    the process with SIGSEGV (unless loaded with the safe settings / always)."""

    def __init__(self) -> None:
        self.flag: YieldFlag | None = None
        self.lock = threading.Lock()
        kind, _, arg = os.environ.get("QMD_TEST_WORKER_FAULT", "").partition(":")
        self.fault = (kind, arg)
        self.ticks = 0
        """Items of the request in hand reported so far."""

    def seconds(self, kind: str) -> float:
        """The delay of fault `kind` (0 when another one, or none, is set)."""
        return float(self.fault[1]) if self.fault[0] == kind else 0.0

    def tick(self, items: int = 1) -> None:
        """`items` more units of the request are done: the parent sees the call is alive."""
        if delay := self.seconds("slow"):
            time.sleep(delay)
        with self.lock:  # parallel embed contexts tick from their own threads
            if self.flag is not None:
                self.flag.tick(items)
            self.ticks += items
            first = self.ticks == items
        if first and (delay := self.seconds("stall")):
            time.sleep(delay)

    def crash_on_load(self, params: LoadParams) -> None:
        """The `crash` faults: a native crash on loading a marked model file, as AMX repacking gives."""
        kind, name = self.fault
        marked = bool(name) and name in os.path.basename(params.path)
        if marked and (kind == "crash-always" or (kind == "crash" and not params.safe)):
            os.kill(os.getpid(), signal.SIGSEGV)


PROGRESS = Progress()


M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter number."""


def _mmap_large_buffers() -> None:
    """Serve every allocation of 1 MiB or more with its own mmap (glibc; elsewhere a no-op).

    glibc raises its mmap threshold after the first large free, so the buffers of a
    context rebuilt after idle disposal would come from the heap: they would stay resident
    after `llama_free`, and calloc would have to zero them page by page. Measured with
    MiniLM: disposal left 112 MB instead of 77 MB, and a rebuilt context in use took
    173 MB instead of 143 MB. A fixed threshold also turns the dynamic adjustment off.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return
    libc = ctypes.CDLL(name)
    if hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)


# --- devices: which GPU (QMD_LLAMA_GPU), and how many embedding contexts (QMD_EMBED_PARALLELISM) ---

DeviceKind = Literal["cpu", "gpu", "igpu", "accel", "meta"]
_DEVICE_KINDS: tuple[DeviceKind, ...] = ("cpu", "gpu", "igpu", "accel", "meta")
"""ggml's `enum ggml_backend_dev_type`, in order."""
GPU_BACKENDS = ("metal", "vulkan", "cuda", "rocm", "sycl", "musa", "opencl", "cann")
"""ggml's GPU backend registries (lower-cased): a QMD_LLAMA_GPU naming one this build lacks means
the CPU, not a typo."""
BACKEND_ALIASES = {"hip": "rocm"}
"""ggml's CUDA code built for AMD (HIP) registers as ROCm."""
MAX_PARALLELISM = 8


class Device(NamedTuple):
    """One device of this llama.cpp build, as ggml's backend registry lists it."""

    name: str
    """`CPU`, `CUDA0`, `Vulkan1`, …"""
    description: str
    kind: DeviceKind
    backend: str
    """The registry it belongs to: `CPU`, `CUDA`, `Vulkan`, `Metal`, …"""
    free_bytes: int
    handle: int
    """The `ggml_backend_dev_t`, for `llama_model_params.devices`."""

    def label(self) -> str:
        return f"{self.name} ({self.description}, {self.kind}, {self.backend})"


def list_devices() -> list[Device]:
    """Every device ggml registered, through libggml itself: llama-cpp-python 0.3.36 binds none of
    ggml's device API (its `llama_model_params.devices` is a bare pointer it never sets)."""
    from llama_cpp._ggml import libggml as g

    ptr, text = ctypes.c_void_p, ctypes.c_char_p
    for name, args, result in (
        ("ggml_backend_dev_count", [], ctypes.c_size_t),
        ("ggml_backend_dev_get", [ctypes.c_size_t], ptr),
        ("ggml_backend_dev_name", [ptr], text),
        ("ggml_backend_dev_description", [ptr], text),
        ("ggml_backend_dev_type", [ptr], ctypes.c_int),
        ("ggml_backend_dev_backend_reg", [ptr], ptr),
        ("ggml_backend_reg_name", [ptr], text),
        ("ggml_backend_dev_memory", [ptr, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], None),
    ):
        fn = getattr(g, name)
        fn.argtypes, fn.restype = args, result
    out = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = g.ggml_backend_dev_type(dev)
        out.append(
            Device(
                name=g.ggml_backend_dev_name(dev).decode("utf-8", "replace"),
                description=g.ggml_backend_dev_description(dev).decode("utf-8", "replace"),
                kind=_DEVICE_KINDS[kind] if 0 <= kind < len(_DEVICE_KINDS) else "accel",
                backend=g.ggml_backend_reg_name(g.ggml_backend_dev_backend_reg(dev)).decode("utf-8", "replace"),
                free_bytes=free.value,
                handle=dev,
            )
        )
    return out


class GpuPlan(NamedTuple):
    """Where model layers go, decided once per worker."""

    n_gpu_layers: int
    """-1 = all, 0 = none (the CPU)."""
    devices: tuple[Device, ...] | None
    """The devices to offload to; None leaves the choice to llama.cpp (every GPU it finds)."""
    offload: str | None
    """What `status` says about it; None on the CPU."""
    warnings: tuple[str, ...] = ()


def plan_gpu(choice: str, *, force_cpu: bool, gpu_supported: bool, devices: Sequence[Device]) -> GpuPlan:
    """QMD_FORCE_CPU, then QMD_LLAMA_GPU (`auto`, `cpu`, or a backend name such as `cuda`, `vulkan`,
    `metal`), against the devices this build has.

    A backend the build lacks falls back to the CPU, with a warning; a word that names no
    backend at all is a typo, warned about, and treated as `auto` (spec §1.2).
    """
    if force_cpu or choice == "cpu":
        return GpuPlan(0, None, None)
    choice = BACKEND_ALIASES.get(choice, choice)
    gpus = [d for d in devices if d.kind in ("gpu", "igpu") and d.backend.lower() != "rpc"]
    warnings: tuple[str, ...] = ()
    if choice != "auto" and choice not in GPU_BACKENDS and all(d.backend.lower() != choice for d in devices):
        known = ", ".join(GPU_BACKENDS)
        warnings = (f"QMD_LLAMA_GPU={choice} names no llama.cpp backend (auto, false, or one of {known}); using auto",)
        choice = "auto"
    if not gpu_supported:
        if choice != "auto":
            warnings = (f"QMD_LLAMA_GPU={choice}: this llama.cpp build has no GPU backend; running on the CPU",)
        return GpuPlan(0, None, None, warnings)
    if choice == "auto":
        return GpuPlan(-1, None, ", ".join(d.label() for d in gpus) or "llama.cpp's choice", warnings)
    chosen = tuple(d for d in gpus if d.backend.lower() == choice)
    if any(d.kind == "gpu" for d in chosen):  # as llama.cpp does: integrated GPUs only when there is no other
        chosen = tuple(d for d in chosen if d.kind == "gpu")
    if chosen:
        return GpuPlan(-1, chosen, ", ".join(d.label() for d in chosen))
    present = ", ".join(sorted({d.backend for d in gpus})) or "none"
    why = f"QMD_LLAMA_GPU={choice}: this llama.cpp build has no {choice} device (GPU backends: {present}); on the CPU"
    return GpuPlan(0, None, None, (why,))


def auto_parallelism(*, cores: int, gpu_free_bytes: int | None, file_bytes: int, n_ctx: int) -> int:
    """Embedding contexts run side by side, as the original sizes them (spec §9.2).

    CPU: floor(cores / 4), 1 to 4, each with cores / n threads (1 on 2 cores: llama.cpp's
    own threads already use them). GPU: a quarter of the free VRAM above 1 GB over what one
    context takes (150 MB for a model file up to 350 MB, else 1.85 × the file, scaled by
    the context size over 2048), 1 to 8.
    """
    if gpu_free_bytes is None:
        return max(1, min(cores // 4, 4))
    file_mb = file_bytes / 2**20
    per_context_mb = (150.0 if file_mb <= 350 else round(file_mb * 1.85)) * n_ctx / 2048
    return max(1, min(int(0.25 * (gpu_free_bytes / 2**20 - 1000) / per_context_mb), MAX_PARALLELISM))


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has AMX tiles: llama.cpp's AMX repacking of Q8_0/Q4_1 weights has
    crashed such CPUs (SIGSEGV on the first embed) where the plain CPU kernels work."""
    try:
        with open(cpuinfo) as f:
            return any(line.startswith("flags") and "amx_tile" in line.split() for line in f)
    except OSError:
        return False


@contextlib.contextmanager
def model_params(devices: tuple[Device, ...] | None = None, *, repack: bool | None = None) -> Iterator[None]:
    """While a `Llama` is built, give its model params these devices (NULL-terminated), as llama.cpp's
    `--device` does, and weight repacking (llama.cpp's extra buffer types) only when `repack`
    (by default: unless the CPU has AMX); `Llama()` takes neither argument, so its defaults are
    patched for the load. Tests and benchmarks that build a `Llama` themselves load through it too."""
    if repack is None:
        repack = not cpu_has_amx()
    if devices is None and repack:
        yield
        return
    import llama_cpp.llama_cpp as lib

    handles = None if devices is None else (ctypes.c_void_p * (len(devices) + 1))(*(d.handle for d in devices), None)
    default = lib.llama_model_default_params

    def patched() -> Any:
        params = default()
        if handles is not None:
            params.devices = ctypes.addressof(handles)
        params.use_extra_bufts = repack
        return params

    lib.llama_model_default_params = patched
    try:
        yield
    finally:
        lib.llama_model_default_params = default


def _tick_per_token(_ids: Any, _logits: Any) -> bool:
    """A stopping criterion that never stops: llama-cpp-python calls it once per generated token."""
    PROGRESS.tick()
    return False


def _logsumexp(values: np.ndarray) -> float:
    """log(sum(exp(values))) without overflow, in float64 for a 262k-entry vocabulary."""
    import numpy as np

    top = float(values.max())
    return top + math.log(float(np.exp(values - top).sum()))


def _sigmoid(x: float) -> float:
    """1 / (1 + e^-x), written so that neither branch overflows."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


class LoadedModel:
    """One loaded GGUF: weights stay resident, the inference context comes and goes.

    llama-cpp-python's `Llama` owns a `LlamaModel` (weights) and a `LlamaContext`
    (compute buffers, KV cache). The context can be closed and a new one built on the
    same `LlamaModel` with the same parameters: no weights are re-read. This reaches into
    `Llama._ctx`, which is why llama-cpp-python is pinned; the tests check the rebuilt
    context gives identical vectors.
    """

    def __init__(self, params: LoadParams, gpu: GpuPlan, parallelism: int = 1) -> None:
        """`parallelism` contexts embed side by side (embed models only), sharing the threads on a CPU."""
        from llama_cpp import Llama

        self.params = params
        self.parallelism = parallelism if params.role == "embed" else 1
        threads = params.n_threads if gpu.n_gpu_layers else max(1, params.n_threads // self.parallelism)
        started = time.perf_counter()
        # verbose=True keeps llama-cpp-python from pointing fd 2 at /dev/null during the load,
        # so the native log (filtered to warnings and errors by `WorkerProcess`) says why a load
        # failed; its own Python-level prints (system info, the metadata dict) are dropped.
        # `params.safe` (the parent's answer to repeated crashes): llama.cpp's plainest way to run
        # the weights, read into memory, on the CPU, with no repacked kernels or fused attention.
        PROGRESS.crash_on_load(params)
        safe = params.safe
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            with model_params(None if safe else gpu.devices, repack=False if safe else None):
                self.llm = Llama(
                    model_path=params.path,
                    embedding=params.embedding,
                    n_ctx=params.n_ctx,
                    n_batch=params.n_batch,
                    n_ubatch=params.n_ubatch,
                    n_threads=threads,
                    n_threads_batch=threads,
                    n_gpu_layers=0 if safe else gpu.n_gpu_layers,
                    flash_attn=not safe,
                    use_mmap=not safe,
                    verbose=True,
                )
        self.load_seconds = time.perf_counter() - started
        self.loaded_at = time.time()
        self.llm.verbose = False
        self.context_live = True
        self._side: list[tuple[_internals.LlamaContext, _internals.LlamaBatch]] = []
        """The contexts beyond the first that embed in parallel: made on first use, freed with it."""
        self.tail = self._special_tail()
        self._chat: Jinja2ChatFormatter | None = None
        self._yes_no: tuple[list[int], list[int]] | None = None
        self._prefixes: OrderedDict[tuple[int, ...], ctypes.Array[ctypes.c_uint8]] = OrderedDict()
        """Sequence states of evaluated prompt prefixes, least recently used first (`_prefill`)."""

    def _special_tail(self) -> int:
        """How many special tokens the tokenizer appends after the text ([SEP] for BERT, EOS for some).

        Clipping keeps them: a BERT sequence without its [SEP] is not what the model was
        trained on, which is what `Llama.embed(truncate=True)` would feed it.
        """
        probe = b"probe"
        bare = self.llm.tokenize(probe, add_bos=False, special=False)
        full = self.llm.tokenize(probe, add_bos=True, special=False)
        for head in range(len(full) - len(bare) + 1):
            if full[head : head + len(bare)] == bare:
                return len(full) - head - len(bare)
        return 0

    def tokenize(self, text: str) -> list[int]:
        """Token ids as the model reads them, special tokens included; never fails on odd text."""
        return self.llm.tokenize(text.encode("utf-8", "replace"), add_bos=True, special=False)

    def count(self, text: str) -> int:
        """Tokens the model reads for `text`: the chunker's `Tokenizer` protocol."""
        return len(self.tokenize(text))

    def ensure_context(self) -> None:
        """Rebuild the context freed by `free_context`, on the same weights."""
        if self.context_live:
            return
        from llama_cpp import _internals

        self.llm._ctx = _internals.LlamaContext(model=self.llm._model, params=self.llm.context_params, verbose=False)
        self.llm.reset()
        self.context_live = True

    def free_context(self) -> None:
        """Free the compute buffers and KV cache (every parallel context's) and the kept prefix states;
        the weights and tokenizer stay loaded."""
        self._prefixes.clear()
        for ctx, batch in self._side:
            ctx.close()
            batch.close()
        self._side = []
        if self.context_live:
            self.llm._ctx.close()
            self.context_live = False

    def _contexts(self, n: int) -> list[tuple[_internals.LlamaContext, _internals.LlamaBatch]]:
        """`n` contexts with a batch each: the model's own and `n - 1` more on the same weights."""
        from llama_cpp import _internals

        llm = self.llm
        while len(self._side) < n - 1:
            params = type(llm.context_params).from_buffer_copy(llm.context_params)
            batch = _internals.LlamaBatch(n_tokens=llm.n_batch, embd=0, n_seq_max=1, verbose=False)
            self._side.append((_internals.LlamaContext(model=llm._model, params=params, verbose=False), batch))
        return [(llm._ctx, llm._batch), *self._side[: n - 1]]

    def embed(self, texts: list[str], yield_after: int | None = None, flag: YieldFlag | None = None) -> EmbedResult:
        """L2-normalised vectors as float32 bytes, plus token counts and the indices that were clipped.

        One sequence per decode: on CPU, packing several sequences into one batch makes
        attention span the whole batch and is slower (models README), and it lets a
        sequence use the full context. With `yield_after`, the embedding stops once that
        many texts are done and `flag` is raised, inside a decode too (llama.cpp's abort
        callback, checked between graph nodes): the answer covers the texts done in order
        so far, and an aborted decode leaves nothing behind (the next starts from a cleared
        cache), so the parent's resend embeds the rest to the same vectors.
        """
        import llama_cpp
        import numpy as np

        self.ensure_context()
        llm = self.llm
        pooling = llm._ctx.pooling_type()  # the context's int; `Llama.pooling_type` is annotated as str
        if pooling not in (
            llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            llama_cpp.LLAMA_POOLING_TYPE_CLS,
            llama_cpp.LLAMA_POOLING_TYPE_LAST,
        ):
            raise ValueError(f"{os.path.basename(self.params.path)} has pooling type {pooling}: not an embedding model")
        n_embd = llm.n_embd()
        limit = min(llm.n_ctx(), llm.context_params.n_ubatch)
        out = np.empty((len(texts), n_embd), dtype=np.float32)
        n_tokens: list[int] = []
        clipped: list[int] = []
        inputs: list[list[int]] = []
        for i, text in enumerate(texts):
            tokens = self.tokenize(text)
            n_tokens.append(len(tokens))
            if not tokens:  # add_sequence would write before the batch arrays
                raise ValueError(f"input {i} has no tokens and this tokenizer adds no special tokens")
            if len(tokens) > limit:
                tokens = tokens[: limit - self.tail] + tokens[len(tokens) - self.tail :]
                clipped.append(i)
            inputs.append(tokens)
        order = iter(range(len(texts)))
        taking = threading.Lock()
        finished = [False] * len(texts)
        answered = 0
        """Texts done in order from the first: what a yielding answer covers."""

        def must_yield() -> bool:
            return flag is not None and yield_after is not None and answered >= yield_after and flag.is_set()

        def drain(ctx: _internals.LlamaContext, batch: _internals.LlamaBatch) -> None:
            """Embed the next input not yet taken, until none is left (ctypes lets the decodes run in parallel)."""
            nonlocal answered
            while True:
                with taking:
                    i = None if must_yield() else next(order, None)
                if i is None:
                    break
                batch.reset()
                batch.add_sequence(inputs[i], 0, True)
                ctx.kv_cache_clear()
                status = llama_cpp.llama_decode(ctx.ctx, batch.batch)
                if status == DECODE_ABORTED:
                    break
                if status != 0:
                    raise RuntimeError(f"llama_decode returned {status}")
                out[i] = np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_seq(ctx.ctx, 0), shape=(n_embd,))
                PROGRESS.tick()
                with taking:
                    finished[i] = True
                    while answered < len(texts) and finished[answered]:
                        answered += 1
            ctx.kv_cache_clear()

        @llama_cpp.ggml_abort_callback
        def abort(_data: ctypes.c_void_p) -> bool:
            if not must_yield():
                return False
            YIELDING.set()
            return True

        contexts = self._contexts(min(self.parallelism, len(texts)))
        # The callback is this call's only: an interactive decode never pays for it.
        watched = contexts if flag is not None and yield_after is not None else []
        for ctx, _ in watched:
            llama_cpp.llama_set_abort_callback(ctx.ctx, abort, None)
        try:
            if len(contexts) == 1:
                drain(*contexts[0])
            else:
                with ThreadPoolExecutor(len(contexts), thread_name_prefix="embed") as pool:
                    for done in [pool.submit(drain, ctx, batch) for ctx, batch in contexts]:
                        done.result()
        finally:
            for ctx, _ in watched:
                llama_cpp.llama_set_abort_callback(ctx.ctx, llama_cpp.ggml_abort_callback(), None)
            YIELDING.clear()
        out = out[:answered]
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out /= np.where(norms > 0, norms, 1)
        return EmbedResult(
            dims=n_embd,
            vectors=out.tobytes(),
            n_tokens=n_tokens[:answered],
            clipped=[i for i in clipped if i < answered],
            limit=limit,
        )

    # -- generative models: completion, likelihoods, yes/no, and rank pooling --

    def _begin(self) -> None:
        """Start from an empty KV cache, so no request sees (or reuses) another's tokens."""
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()

    def _shared_split(self, tokens: list[int], shared: str, limit: int) -> int:
        """How many leading `tokens` to take from a kept prefix state: as many as the tokens of
        `shared` (the text the caller says repeats between calls) have in common with them, at most `limit`.

        The common prefix of the two tokenizations, not the tokens of `shared` itself: a word
        that runs on past `shared` tokenizes differently, and the prompt's own tokens are what
        the model reads. The split depends on the prompt and `shared` alone, never on history.
        """
        if not shared:
            return 0
        n = 0
        for a, b in zip(self.prompt_tokens(shared), tokens):
            if a != b:
                break
            n += 1
        return min(n, limit)

    def _prefill(self, tokens: list[int], split: int) -> int:
        """Start from a KV cache holding exactly `tokens[:split]`; how many of them came from a kept state.

        The prefix is evaluated on its own (`n_batch` batches from position 0, no outputs), its
        sequence state copied out, and then copied back in, on its first use as on every later
        one: the rest of the prompt is evaluated on the same cache bits however often the
        prefix was seen, so results are bit-identical to a cold start's. (Reusing whatever the
        previous request left in the cache, as llama-cpp-python's `generate` does, moves the
        split with the history and changes results in their last bits.)
        """
        import llama_cpp

        self._begin()
        if split == 0:
            return 0
        llm, key = self.llm, tuple(tokens[:split])
        state = self._prefixes.pop(key, None)
        reused = split if state is not None else 0
        if state is None:
            for _ in self._decode(tokens[:split], 0, split):
                pass
            size = llama_cpp.llama_state_seq_get_size(llm._ctx.ctx, 0)
            state = (ctypes.c_uint8 * size)()
            if llama_cpp.llama_state_seq_get_data(llm._ctx.ctx, state, size, 0) != size:
                raise RuntimeError("llama.cpp could not copy out the state of the prompt prefix")
            self._begin()
        self._prefixes[key] = state
        while len(self._prefixes) > 1 and (
            len(self._prefixes) > PREFIX_STATES or sum(map(len, self._prefixes.values())) > PREFIX_BYTES
        ):
            self._prefixes.popitem(last=False)
        if llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, state, len(state), 0) != len(state):
            raise RuntimeError("llama.cpp could not restore the state of the prompt prefix")
        # What llama-cpp-python's generate() matches a prompt against: it then evaluates only the rest.
        llm.input_ids[:split] = tokens[:split]
        llm.n_tokens = split
        return reused

    def _require_logits(self, op: str) -> None:
        """Logit-based ops need a context built for generation, not one that pools embeddings; and a live one.

        Every op starts here, before anything touches the context: one freed while idle is
        rebuilt first (calling into a freed context segfaults).
        """
        if self.params.embedding:
            raise ValueError(f"{op} needs a generative model; {self.name} is loaded for embeddings or ranking")
        self.ensure_context()

    @property
    def name(self) -> str:
        """The file name, for error messages."""
        return os.path.basename(self.params.path)

    def prompt_tokens(self, text: str) -> list[int]:
        """A prompt as the model reads it: BOS if its vocabulary adds one, special tokens parsed.

        Special tokens are parsed because prompts carry chat-template markers (`<|im_start|>`).
        A rendered chat template may already begin with the BOS text; the tokenizer would add
        a second one, which the model never saw in training, so one is dropped.
        """
        tokens = self.llm.tokenize(text.encode("utf-8", "replace"), add_bos=True, special=True)
        bos = self.llm.token_bos()
        if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
            tokens = tokens[1:]
        return tokens

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """`messages` rendered into a raw prompt by the GGUF's own chat template, ready for the reply.

        `enable_thinking=False` is passed to every template: qmd never wants a reasoning trace,
        and templates that know the flag (Qwen3) then emit the empty think block their models
        were trained to see; templates that do not know it ignore it.
        """
        if self._chat is None:
            import llama_cpp
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            template = llama_cpp.llama_model_chat_template(self.llm._model.model, None)
            if not template:
                raise ValueError(f"{self.name} has no chat template; send a prompt")
            bos, eos = self.llm.token_bos(), self.llm.token_eos()
            self._chat = Jinja2ChatFormatter(
                template=template.decode("utf-8", "replace"),
                bos_token=self.llm._model.token_get_text(bos) if bos != -1 else "",
                eos_token=self.llm._model.token_get_text(eos) if eos != -1 else "",
                add_generation_prompt=True,
            )
        # llama-cpp-python types `messages` as its OpenAI-style TypedDicts; plain dicts are what it reads.
        return self._chat(messages=messages, enable_thinking=False).prompt  # type: ignore[arg-type]

    def complete(
        self, prompt: str | None, messages: list[dict[str, str]] | None, params: GenerationParams, shared: int = 0
    ) -> Completion:
        """Generated text for a raw prompt (or chat messages rendered by the model's template).

        The prompt is tokenized here and handed over as tokens, so the length check below
        measures exactly what is evaluated. min_p is 0 so the sampling is what the caller
        named (llama-cpp-python would add its own 0.05); repeat_penalty stays 1.0 because a
        penalty punishes the format tokens the prompt's examples repeat (models README §2).
        `shared` (characters of `prompt`, or leading `messages`) is the part that repeats
        between calls, evaluated once and reused (`_prefill`).
        """
        from llama_cpp import StoppingCriteriaList

        self._require_logits("complete")
        max_tokens = params.max_tokens
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        text = prompt if messages is None else self.render_chat(messages)
        assert text is not None
        started = time.perf_counter()
        tokens = self.prompt_tokens(text)
        if not tokens:
            raise ValueError("the prompt is empty")
        n_ctx = self.llm.n_ctx()
        if len(tokens) + max_tokens > n_ctx:
            raise ValueError(
                f"the prompt is {len(tokens)} tokens and max_tokens is {max_tokens}: "
                f"{len(tokens) + max_tokens} is more than the context of {n_ctx} tokens"
            )
        head = text[:shared] if messages is None else self.render_chat(messages[:shared]) if shared else ""
        reused = self._prefill(tokens, self._shared_split(tokens, head, len(tokens) - 1))
        out = self.llm.create_completion(
            tokens,
            max_tokens=max_tokens,
            stop=params.stop,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            min_p=0.0,
            repeat_penalty=1.0,
            seed=params.seed,
            stopping_criteria=StoppingCriteriaList([_tick_per_token]),
        )
        # create_completion is typed "a dict or an iterator of chunks"; without stream=True it is the dict.
        usage = out["usage"]  # type: ignore[index]
        return Completion(
            text=out["choices"][0]["text"],  # type: ignore[index]
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            seconds=time.perf_counter() - started,
            reused_tokens=reused,
        )

    def _forward(self, tokens: list[int], first_output: int, shared: str) -> Iterator[Any]:
        """Evaluate `tokens` as one sequence, those of the text `shared` from a kept prefix state
        (`_prefill`); yield the logits of each position from `first_output`."""
        split = self._shared_split(tokens, shared, first_output)
        self._prefill(tokens, split)
        yield from self._decode(tokens, split, first_output)

    def _decode(self, tokens: list[int], start: int, first_output: int) -> Iterator[Any]:
        """Decode `tokens[start:]` onto a cache holding `tokens[:start]`; yield the logits from position `first_output`.

        Each row is a view into llama.cpp's output buffer, valid only until the generator
        resumes, so callers reduce it at once. Rows come from `llama_get_logits_ith`, never
        `logits_all` (n_ctx × 262k floats = 2 GiB for Gemma). Positions before `first_output`
        go in full batches without outputs; scored positions go at most OUTPUT_ROWS per decode,
        which caps the output buffer llama.cpp keeps (one vocabulary-sized row each).
        """
        import llama_cpp
        import numpy as np

        llm = self.llm
        n_vocab = llm.n_vocab()
        batch = llm._batch.batch
        starts = [*range(start, first_output, llm.n_batch), *range(first_output, len(tokens), OUTPUT_ROWS)]
        for begin, end in zip(starts, [*starts[1:], len(tokens)]):
            batch.n_tokens = end - begin
            for j, pos in enumerate(range(begin, end)):
                batch.token[j] = tokens[pos]
                batch.pos[j] = pos
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = pos >= first_output
            llm._ctx.decode(llm._batch)
            PROGRESS.tick()
            for j in range(max(first_output - begin, 0), end - begin):
                yield np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, j), shape=(n_vocab,))

    def likelihood(self, prefixes: list[str], continuation: str, shared: int = 0) -> list[float]:
        """Mean log P(continuation tokens | prefix) per prefix: query likelihood (UPR, models README §4).

        The continuation is tokenized without BOS and without special-token parsing (it is
        user text that follows the prefix). Positions from the prefix's last token to the
        continuation's second-to-last are decoded with logits: row i predicts continuation
        token i, so the last continuation token itself is never evaluated. The first `shared`
        characters of each prefix (a template's head) are evaluated once and reused.
        """
        import numpy as np

        self._require_logits("likelihood")
        target = self.llm.tokenize(continuation.encode("utf-8", "replace"), add_bos=False, special=False)
        if not target:
            raise ValueError("the continuation is empty")
        n_ctx = self.llm.n_ctx()
        scores: list[float] = []
        for i, prefix in enumerate(prefixes):
            tokens = self.prompt_tokens(prefix)
            if not tokens:
                raise ValueError(f"prefix {i} is empty")
            if len(tokens) + len(target) - 1 > n_ctx:
                raise ValueError(
                    f"prefix {i} is {len(tokens)} tokens and the continuation {len(target)}: "
                    f"more than the context of {n_ctx} tokens; shorten the prefix"
                )
            total = 0.0
            rows = self._forward(tokens + target[:-1], len(tokens) - 1, prefix[:shared])
            for token, row in zip(target, rows, strict=True):
                total += float(row[token]) - _logsumexp(np.asarray(row, dtype=np.float64))
            scores.append(total / len(target))
            PROGRESS.tick()
        return scores

    def _answer_tokens(self) -> tuple[list[int], list[int]]:
        """Token ids that mean "yes" and "no" right after a prompt: the variants that are one token each."""
        if self._yes_no is None:

            def single(words: tuple[str, ...]) -> list[int]:
                ids = {tuple(self.llm.tokenize(w.encode(), add_bos=False, special=False)) for w in words}
                return sorted(t[0] for t in ids if len(t) == 1)

            yes, no = single((" yes", "yes")), single((" no", "no"))
            if not yes or not no:
                raise ValueError(f"{self.name} has no single-token 'yes'/'no'; it cannot answer yes/no")
            self._yes_no = (yes, no)
        return self._yes_no

    def yes_no(self, prompts: list[str], shared: int = 0) -> list[float]:
        """P(yes) / (P(yes) + P(no)) at the position after each prompt (qmd's generative reranker formula).

        Each side is the logsumexp of its single-token variants (" yes" and "yes"), so the
        answer counts whether or not the model would put a space first. The softmax
        normaliser cancels, so raw logits suffice: the ratio is sigmoid(lse(yes) - lse(no)).
        The first `shared` characters of each prompt are evaluated once and reused.
        """
        import numpy as np

        self._require_logits("yes_no")
        yes, no = self._answer_tokens()
        n_ctx = self.llm.n_ctx()
        scores: list[float] = []
        for i, prompt in enumerate(prompts):
            tokens = self.prompt_tokens(prompt)
            if not tokens:
                raise ValueError(f"prompt {i} is empty")
            if len(tokens) > n_ctx:
                raise ValueError(f"prompt {i} is {len(tokens)} tokens: more than the context of {n_ctx} tokens")
            (row,) = self._forward(tokens, len(tokens) - 1, prompt[:shared])
            logits = np.asarray(row, dtype=np.float64)
            scores.append(_sigmoid(_logsumexp(logits[yes]) - _logsumexp(logits[no])))
            PROGRESS.tick()
        return scores

    def rank(self, query: str, documents: list[str]) -> list[float]:
        """Cross-encoder relevance in [0, 1] per document, through llama.cpp's rank pooling.

        The pair is joined the way llama-server's `format_rerank` does: the GGUF's
        `tokenizer.chat_template.rerank` with {query}/{document} substituted (special tokens
        parsed, none added), else [BOS] query [EOS] [SEP] document [EOS] with each special
        token only where the vocabulary says to add it. Qwen3 rerankers get a softmax over
        their (yes, no) head inside llama.cpp, so their first output already is P(yes); a
        single-logit head (BERT-style cross-encoders) is passed through a sigmoid.
        """
        import llama_cpp
        import numpy as np

        llm = self.llm
        if not self.params.embedding:
            raise ValueError(f"{self.name} is loaded for generation: it is not a cross-encoder")
        self.ensure_context()
        if llm._ctx.pooling_type() != llama_cpp.LLAMA_POOLING_TYPE_RANK:
            raise ValueError(f"{self.name} has no rank pooling: it is not a cross-encoder")
        model, vocab = llm._model.model, llm._model.vocab
        arch = llm.metadata.get("general.architecture", "")
        n_cls = llama_cpp.llama_model_n_cls_out(model)
        softmaxed = arch in ("qwen3", "qwen3vl")
        if n_cls != 1 and not softmaxed:
            raise ValueError(f"{self.name} has a {n_cls}-output head; which output means relevant is unknown")
        template = llama_cpp.llama_model_chat_template(model, b"rerank")
        # Split once and fill per pair in one pass, so a query containing "{document}" stays as written.
        pieces = re.split(r"(\{query\}|\{document\})", template.decode("utf-8", "replace")) if template else []
        eos = llama_cpp.llama_vocab_eos(vocab)
        if eos == -1:
            eos = llama_cpp.llama_vocab_sep(vocab)
        add_bos, add_eos, add_sep = (
            llama_cpp.llama_vocab_get_add_bos(vocab),
            llama_cpp.llama_vocab_get_add_eos(vocab),
            llama_cpp.llama_vocab_get_add_sep(vocab),
        )

        def text(s: str) -> list[int]:
            return llm.tokenize(s.encode("utf-8", "replace"), add_bos=False, special=False)

        limit = min(llm.n_ctx(), llm.context_params.n_ubatch)
        scores: list[float] = []
        for i, document in enumerate(documents):
            if pieces:
                fill = {"{query}": query, "{document}": document}
                prompt = "".join(fill.get(piece, piece) for piece in pieces)
                tokens = llm.tokenize(prompt.encode("utf-8", "replace"), add_bos=False, special=True)
            else:
                tokens = (
                    [llama_cpp.llama_vocab_bos(vocab)] * add_bos
                    + text(query)
                    + [eos] * add_eos
                    + [llama_cpp.llama_vocab_sep(vocab)] * add_sep
                    + text(document)
                    + [eos] * add_eos
                )
            if len(tokens) > limit:
                raise ValueError(f"query and document {i} are {len(tokens)} tokens: more than the {limit} that fit")
            llm._batch.reset()
            llm._batch.add_sequence(tokens, 0, True)
            llm._ctx.kv_cache_clear()
            llm._ctx.decode(llm._batch)
            out = np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0), shape=(n_cls,))
            scores.append(float(out[0]) if softmaxed else _sigmoid(float(out[0])))
            PROGRESS.tick()
        llm._ctx.kv_cache_clear()
        return scores

    def close(self) -> None:
        """Free context and weights in llama.cpp's order (context first) before the process exits."""
        self.llm.close()


class WorkerProcess:
    """The child's request loop state: models by load parameters, and the GPU decision made once."""

    def __init__(
        self, force_cpu: bool, gpu: str = "auto", embed_parallelism: int = 0, yield_flag: YieldFlag | None = None
    ) -> None:
        """`gpu`: QMD_LLAMA_GPU as the parent read it (`auto`, `cpu` or a backend name);
        `embed_parallelism`: QMD_EMBED_PARALLELISM (0 = `auto_parallelism`); `yield_flag`: the
        parent's (None: a background embed never stops early)."""
        import llama_cpp

        self.native_error: str | None = None
        shown = False

        @llama_cpp.llama_log_callback
        def forward_native_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
            """Warnings and errors to stderr (the daemon's log); an error also goes into the reply."""
            nonlocal shown
            shown = shown if level == GGML_LOG_CONT else level >= GGML_LOG_WARN and not YIELDING.is_set()
            if shown:
                os.write(2, text)
            if level == GGML_LOG_ERROR and self.native_error is None and shown:  # the first error names the cause
                self.native_error = text.decode("utf-8", "replace").strip()

        self._log_callback = forward_native_log  # ctypes must keep it alive as long as llama.cpp may call it
        llama_cpp.llama_log_set(forward_native_log, ctypes.c_void_p(0))
        gpu_supported = bool(llama_cpp.llama_supports_gpu_offload())
        self.devices = list_devices()
        self.gpu = plan_gpu(gpu, force_cpu=force_cpu, gpu_supported=gpu_supported, devices=self.devices)
        self.n_gpu_layers = self.gpu.n_gpu_layers
        self.embed_parallelism = embed_parallelism
        self.yield_flag = yield_flag
        PROGRESS.flag = yield_flag
        self.models: dict[LoadParams, LoadedModel] = {}
        self.hello = Hello(
            backend="GPU" if self.n_gpu_layers else "CPU",
            gpu_offload_supported=gpu_supported,
            llama_cpp_version=llama_cpp.__version__,
            system_info=llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
            devices=tuple(d.label() for d in self.devices),
            offload=self.gpu.offload,
            warnings=self.gpu.warnings,
        )

    def parallelism(self, params: LoadParams) -> int:
        """How many contexts embed side by side for this model: QMD_EMBED_PARALLELISM, else sized to the hardware."""
        if params.role != "embed":
            return 1
        if self.embed_parallelism:
            return self.embed_parallelism
        gpus = self.gpu.devices or tuple(d for d in self.devices if d.kind in ("gpu", "igpu"))
        free = min(d.free_bytes for d in gpus) if self.n_gpu_layers and gpus else None
        size = os.path.getsize(params.path)
        return auto_parallelism(cores=params.n_threads, gpu_free_bytes=free, file_bytes=size, n_ctx=params.n_ctx)

    def model(self, params: LoadParams) -> LoadedModel:
        """The loaded model for these parameters, loading it on first use."""
        if params not in self.models:
            self.models[params] = LoadedModel(params, self.gpu, self.parallelism(params))
        return self.models[params]

    def dispose(self) -> None:
        """Free every context (the parent's idle timer asks); weights stay, so the next request is fast."""
        for m in self.models.values():
            m.free_context()

    def reply(self, result: object = None, error: str | None = None) -> Reply:
        """A reply with what is resident now attached."""
        resident = tuple(
            Resident(m.params.path, m.params.role, m.context_live, m.parallelism, m.load_seconds, m.loaded_at)
            for m in self.models.values()
        )
        return Reply(result=result, error=error, resident=resident)

    def handle(self, body: bytes) -> Reply:
        """One reply per request (still pickled); Python-level failures are answered, not fatal."""
        self.native_error = None
        try:
            request: Request[Any] = pickle.loads(body)
            PROGRESS.ticks = 0
            handler = OPERATIONS.get(type(request))
            if handler is None:
                raise ValueError(f"unknown request {type(request).__name__}")
            result = handler(self, request)
        except Exception as e:  # the request failed; the worker and its models are still fine
            error = f"{type(e).__name__}: {e}" + (f" (llama.cpp: {self.native_error})" if self.native_error else "")
            return self.reply(error=error)
        return self.reply(result)

    def close(self) -> None:
        """Unload every model: a clean exit, so a shutdown is never mistaken for a crash in native code."""
        for m in self.models.values():
            m.close()


def _chunk(process: WorkerProcess, request: ChunkRequest) -> list[ChunkSpan]:
    """Chunking runs here, not in the daemon: the chunker measures with the model's tokenizer, which
    lives in llama.cpp. Offsets only travel back; the parent slices its own copy of the text."""
    from qmd.server.text.split import split

    tokenizer = process.model(request.model)
    chunks = split(request.text, max_tokens=request.max_tokens, tokenizer=tokenizer, language=request.language)
    return [ChunkSpan(c.start, c.end, c.start_line, c.end_line, c.tokens, c.clipped) for c in chunks]


Q = TypeVar("Q", bound=Request[Any])
Handler = Callable[[WorkerProcess, Any], object]


def _operation(kind: type[Q], handler: Callable[[WorkerProcess, Q], object]) -> tuple[type[Request[Any]], Handler]:
    """One row of `OPERATIONS`; going through here lets mypy check each handler against its request type."""
    return kind, handler


OPERATIONS: dict[type[Request[Any]], Handler] = dict(
    [
        _operation(EmbedRequest, lambda w, r: w.model(r.model).embed(r.texts, r.yield_after, w.yield_flag)),
        _operation(CountTokensRequest, lambda w, r: [w.model(r.model).count(t) for t in r.texts]),
        _operation(ChunkRequest, _chunk),
        _operation(CompleteRequest, lambda w, r: w.model(r.model).complete(r.prompt, r.messages, r.params, r.shared)),
        _operation(RenderChatRequest, lambda w, r: w.model(r.model).render_chat(r.messages)),
        _operation(LikelihoodRequest, lambda w, r: w.model(r.model).likelihood(r.prefixes, r.continuation, r.shared)),
        _operation(YesNoRequest, lambda w, r: w.model(r.model).yes_no(r.prompts, r.shared)),
        _operation(RankRequest, lambda w, r: w.model(r.model).rank(r.query, r.documents)),
        _operation(DisposeRequest, lambda w, r: w.dispose()),
    ]
)
"""The worker's operations: each request type (`protocol`) and the handler that answers it."""


PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Exit when the daemon does, whatever this process is doing (busy in llama.cpp, or stopped).

    Linux: the kernel sends SIGKILL when the parent thread ends (`PR_SET_PDEATHSIG`; the
    daemon starts this child from its long-lived dispatcher thread). Elsewhere, and as a
    fallback, `children.exit_with_parent`. EOF on stdin (the parent's end closed) ends the
    request loop as well.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    exit_with_parent(parent)


def main() -> None:
    """Serve requests until the parent closes stdin (or dies: see `die_with_parent`)."""
    options = dict(arg.removeprefix("--").partition("=")[::2] for arg in sys.argv[1:])
    die_with_parent(int(options.get("parent") or os.getppid()))
    # Ctrl-C in the daemon's terminal reaches the whole process group; the daemon decides
    # when the worker stops, so an interrupt must not kill it mid-request.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _mmap_large_buffers()
    try:
        process = WorkerProcess(
            force_cpu="force-cpu" in options,
            gpu=options.get("gpu") or "auto",
            embed_parallelism=int(options.get("embed-parallelism") or 0),
            yield_flag=YieldFlag(int(options["yield-fd"])) if options.get("yield-fd") else None,
        )
    except ImportError as e:  # qmd without its `models` extra: say so, rather than die with a traceback
        replies.write(encode_frame(Reply(result=None, error=f"{MODELS_MISSING}: {e}", resident=())))
        replies.flush()
        return
    try:
        replies.write(encode_frame(process.reply(process.hello)))
        replies.flush()

        def receipt() -> None:  # before any work: a death from here on is this request's
            replies.write(RECEIPT)
            replies.flush()

        while (body := read_frame_body(requests, receipt)) is not None:
            replies.write(encode_frame(process.handle(body)))
            replies.flush()
    except BrokenPipeError:  # the parent is gone: nobody to answer
        pass
    finally:
        process.close()


if __name__ == "__main__":
    main()
