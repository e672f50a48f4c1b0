"""Model inference for the daemon, run in a supervised child process.

The daemon never imports llama_cpp: a native crash in llama.cpp (SIGABRT on a failed
GGML_ASSERT, SIGSEGV on a bad file) would otherwise take keyword search down with it.
`WorkerClient` is the daemon's side: it starts `python -m qmd.server.models.worker_child` on
first use, sends it typed requests over its stdin/stdout (`qmd.server.models.protocol`), and
when the child dies fails only the request in flight, with the signal named; the next request
starts a fresh child.

Lifecycle: models load lazily and stay loaded; their inference contexts (compute buffers,
KV cache) are freed after `idle_seconds` without a request and rebuilt on the next one.
A single lock serialises requests, so one model object is never used by two threads,
and the idle timer takes the same lock: it cannot free a context while work is in flight
(the original races here, qmd#938).

GGUF metadata (architecture, dimensions, pooling, prompt format) is read here in pure
Python, so `model_info` and `fingerprint` answer without starting the child or loading
weights.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import mmap
import os
import pickle
import re
import selectors
import shlex
import signal
import struct
import subprocess
import sys
import threading
import time
from array import array
from collections import deque
from typing import Any, Literal, NamedTuple, TypeVar
from urllib.parse import unquote, urlparse

from qmd.server.errors import Unavailable
from qmd.server.index.chunking import Chunk
from qmd.server.models.protocol import (
    HEADER,
    MODELS_MISSING,
    ChunkRequest,
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
    Role,
    YesNoRequest,
    encode_frame,
)

log = logging.getLogger("qmd.inference")

PromptFormat = Literal["embeddinggemma", "qwen3-embedding", "plain"]

DEFAULT_IDLE_SECONDS = 300.0
CONTEXT = {"embed": 2048, "rerank": 4096, "generate": 2048}
"""Context ceiling per role (spec §9.2); a model gets min(ceiling, its trained context).
An embed input longer than its model's context is clipped."""
START_TIMEOUT = 60.0
"""How long a new child may take to import llama_cpp and say hello."""


class InferenceError(Unavailable):
    """An inference request failed; the message says why and what happens next."""


class ModelsNotInstalled(InferenceError):
    """llama-cpp-python is not installed (qmd without its `models` extra): no local model can
    run, keyword search still answers, and the message says what to install."""


def models_install_command() -> str:
    """The command that adds model support to this very installation of qmd.

    Read from how qmd itself was installed (its `direct_url.json`, PEP 610): an editable
    checkout gets `pip install -e '<checkout>[models]'`, a local folder `pip install
    '<folder>[models]'`, anything else `pip install 'qmd[models]'`; always with the pip of
    the interpreter the daemon runs on, so the extra lands where qmd is.
    """
    target, editable = "qmd[models]", False
    # Every `qmd` metadata on the path, not just the first: a checkout's own `qmd.egg-info`
    # (a build leftover, found first from inside it) has no direct_url.json.
    for dist in importlib.metadata.distributions(name="qmd"):
        try:
            direct = json.loads(dist.read_text("direct_url.json") or "null")
        except ValueError:
            continue
        if isinstance(direct, dict) and str(direct.get("url", "")).startswith("file://"):
            target = unquote(urlparse(direct["url"]).path) + "[models]"
            editable = bool((direct.get("dir_info") or {}).get("editable"))
            break
    return f"{shlex.quote(sys.executable)} -m pip install {'-e ' * editable}{shlex.quote(target)}"


def models_missing_message(why: str) -> str:
    """What every model-needing command says when llama.cpp is not there: why, and the command that fixes it."""
    return (
        f"{MODELS_MISSING}: {why}. Keyword search works without it; install it with: {models_install_command()}"
        " — it compiles llama.cpp, a few minutes"
    )


class ModelSpec(NamedTuple):
    """Which model to run and how: everything that decides the loaded object."""

    role: Role
    path: str
    n_threads: int | None = None
    """CPU threads; None = the worker's default (QMD_THREADS, else the usable cores)."""
    n_ctx: int | None = None
    """Context size; None = min(role ceiling, the model's trained context)."""


R = TypeVar("R")


class Embeddings(list[list[float]]):
    """Unit vectors in input order, plus what the caller must report about clipping.

    A list subclass so callers that only want vectors can treat it as one, while a
    caller running an embed job reads `clipped` (input indices that exceeded `limit`
    tokens and were cut at the token level) and reports them once per run.
    """

    def __init__(self, vectors: list[list[float]], *, clipped: tuple[int, ...], n_tokens: list[int], limit: int):
        super().__init__(vectors)
        self.clipped = clipped
        self.n_tokens = n_tokens
        self.limit = limit


# --- GGUF metadata, read in pure Python: a malformed file cannot crash the daemon, and no child is needed ---

_GGUF_SCALARS = {
    0: struct.Struct("<B"),
    1: struct.Struct("<b"),
    2: struct.Struct("<H"),
    3: struct.Struct("<h"),
    4: struct.Struct("<I"),
    5: struct.Struct("<i"),
    6: struct.Struct("<f"),
    7: struct.Struct("<?"),
    10: struct.Struct("<Q"),
    11: struct.Struct("<q"),
    12: struct.Struct("<d"),
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def read_gguf_metadata(path: str) -> dict[str, Any]:
    """The scalar key/values of a GGUF (v2/v3) header; arrays (vocabularies) are skipped."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m[:4] != b"GGUF" or _U32.unpack_from(m, 4)[0] not in (2, 3):
                raise InferenceError(f"{path} is not a GGUF v2/v3 model file")
            (n_kv,) = _U64.unpack_from(m, 16)
            pos = 24
            meta: dict[str, Any] = {}

            def string(at: int) -> tuple[str, int]:
                (n,) = _U64.unpack_from(m, at)
                return m[at + 8 : at + 8 + n].decode("utf-8", "replace"), at + 8 + n

            def skip(kind: int, at: int) -> tuple[Any, int]:
                if kind == _GGUF_STRING:
                    return string(at)
                if kind == _GGUF_ARRAY:
                    item, count = _U32.unpack_from(m, at)[0], _U64.unpack_from(m, at + 4)[0]
                    at += 12
                    if item in _GGUF_SCALARS:
                        return None, at + count * _GGUF_SCALARS[item].size
                    for _ in range(count):
                        _, at = skip(item, at)
                    return None, at
                fmt = _GGUF_SCALARS[kind]
                return fmt.unpack_from(m, at)[0], at + fmt.size

            for _ in range(n_kv):
                key, pos = string(pos)
                (kind,) = _U32.unpack_from(m, pos)
                value, pos = skip(kind, pos + 4)
                if kind != _GGUF_ARRAY:
                    meta[key] = value
            return meta
    except FileNotFoundError:
        raise InferenceError(f"model file not found: {path}") from None
    except (OSError, ValueError, KeyError, struct.error) as e:
        raise InferenceError(f"cannot read GGUF metadata from {path}: {e}") from None


_cache_lock = threading.Lock()
_meta_cache: dict[tuple[str, int, int], dict[str, Any]] = {}
_sha_cache: dict[tuple[str, int, int], str] = {}


def _file_key(path: str) -> tuple[str, int, int]:
    """Cache key that changes when the file is replaced (a refreshed download)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InferenceError(f"model file not found: {path}") from None
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


def gguf_metadata(path: str) -> dict[str, Any]:
    """`read_gguf_metadata`, cached per file version (a big vocabulary takes ~0.1 s to walk)."""
    key = _file_key(path)
    with _cache_lock:
        if key in _meta_cache:
            return _meta_cache[key]
    meta = read_gguf_metadata(path)
    with _cache_lock:
        _meta_cache[key] = meta
    return meta


def file_sha256(path: str) -> str:
    """sha256 of the model file, cached per file version (hashing 600 MB takes a second or two)."""
    key = _file_key(path)
    with _cache_lock:
        if key in _sha_cache:
            return _sha_cache[key]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    with _cache_lock:
        _sha_cache[key] = digest.hexdigest()
    return _sha_cache[key]


def _is_rank_model(meta: dict[str, Any]) -> bool:
    """A cross-encoder: the GGUF asks for rank pooling (`{arch}.pooling_type` 4)."""
    return meta.get(f"{meta.get('general.architecture', '')}.pooling_type") == 4


# --- prompt formats (spec §8.1) ---


def prompt_format(path: str) -> PromptFormat:
    """The embedding prompt family, from `general.architecture` and `general.name` (then the file name).

    Anything not recognised as embeddinggemma or Qwen3-Embedding is embedded plain: BERT-like
    models (MiniLM) were trained without prefixes, and a prefix a model never saw only adds noise.
    """
    meta = gguf_metadata(path)
    arch = str(meta.get("general.architecture", ""))
    name = f"{meta.get('general.name', '')} {os.path.basename(path)}"
    if arch == "gemma-embedding" or re.search(r"embedding-?gemma", name, re.IGNORECASE):
        return "embeddinggemma"
    if re.search(r"qwen.*embed|embed.*qwen", name, re.IGNORECASE):
        return "qwen3-embedding"
    return "plain"


def format_query(fmt: PromptFormat, query: str) -> str:
    """A search query as the model family was trained to see one (spec §8.1)."""
    if fmt == "embeddinggemma":
        return f"task: search result | query: {query}"
    if fmt == "qwen3-embedding":
        return f"Instruct: Retrieve relevant documents for the given query\nQuery: {query}"
    return query


def format_document(fmt: PromptFormat, text: str, title: str | None) -> str:
    """A document chunk as the model family was trained to see one; every chunk of a document gets its title."""
    if fmt == "embeddinggemma":
        return f"title: {title or 'none'} | text: {text}"
    if fmt == "qwen3-embedding":
        return f"{title}\n{text}" if title else text
    return text


def fingerprint(spec: ModelSpec) -> str:
    """Identity of the vector space this model and prompt format produce (sha256 hex).

    The file's content hash, not its path or URI, so a re-downloaded or replaced file
    counts as a new model; the formatted probes, not just the format's name, so editing
    a template changes the fingerprint too. The caller adds the chunker version.
    """
    fmt = prompt_format(spec.path)
    payload = (
        f"model:sha256:{file_sha256(spec.path)}\nformat:{fmt}\n"
        f"query:{format_query(fmt, '__qmd_embedding_query_probe__')}\n"
        f"doc:{format_document(fmt, '__qmd_embedding_document_probe__', '__qmd_embedding_title_probe__')}"
    )
    return hashlib.sha256(payload.encode()).hexdigest()


# --- the supervised worker ---


def _env_number(name: str, default: float, kind: type[int] | type[float]) -> float:
    """A positive number from the environment; a bad value is an error at startup, not a silent default."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{name} must be a positive {kind.__name__}, got {raw!r}")
    return value


FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})


def _env_flag(name: str) -> bool:
    """A switch from the environment, off when unset or false-ish: `QMD_FORCE_CPU=false` must not force the CPU."""
    return os.environ.get(name, "").strip().lower() not in FALSE_WORDS


GPU_OFF_WORDS = FALSE_WORDS | {"none", "disable", "disabled", "cpu"}
MAX_EMBED_PARALLELISM = 8


def gpu_choice(raw: str | None) -> tuple[str, str | None]:
    """QMD_LLAMA_GPU read: (`auto`, `cpu` or a lower-case backend name, a warning or None).

    Blank and `auto` are llama.cpp's own choice; false-ish words (`false off none disable
    disabled 0`) the CPU; a backend name (`cuda`, `vulkan`, `metal`, …) is checked by the
    worker against the backends its build has. Anything that is not a word is warned about
    and read as `auto` (spec §1.2).
    """
    value = (raw or "").strip().lower()
    if value in ("", "auto"):
        return "auto", None
    if value in GPU_OFF_WORDS:
        return "cpu", None
    if re.fullmatch(r"[a-z][a-z0-9_-]*", value):
        return value, None
    return "auto", f"QMD_LLAMA_GPU={raw!r} is not a backend name (auto, false, cuda, vulkan, metal, …); using auto"


def embed_parallelism(raw: str | None) -> tuple[int, str | None]:
    """QMD_EMBED_PARALLELISM read: (contexts that embed side by side, 0 = sized to the hardware; a warning or None).

    An integer of at least 1, clamped to 8; anything else is warned about and read as automatic.
    """
    value = (raw or "").strip()
    if not value or value.lower() == "auto":
        return 0, None
    if not value.isdigit() or int(value) < 1:
        return 0, f"QMD_EMBED_PARALLELISM={raw!r} is not a whole number of at least 1; sizing it to the hardware"
    if int(value) > MAX_EMBED_PARALLELISM:
        return MAX_EMBED_PARALLELISM, f"QMD_EMBED_PARALLELISM={value} is over {MAX_EMBED_PARALLELISM}; using 8"
    return int(value), None


def usable_cores() -> int:
    """Cores this process may run on (a container's CPU set, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class _ChildGone(Exception):
    """The child's stdout reached EOF or its stdin broke: it has exited."""


class WorkerClient:
    """The daemon's handle on the inference child: lazy start, one request at a time, restart after a crash."""

    def __init__(
        self,
        *,
        idle_seconds: float | None = None,
        n_threads: int | None = None,
        force_cpu: bool | None = None,
        gpu: str | None = None,
        parallelism: int | None = None,
    ) -> None:
        """Arguments left as None come from QMD_IDLE_SECONDS (300), QMD_THREADS (usable cores),
        QMD_FORCE_CPU, QMD_LLAMA_GPU (`gpu_choice`) and QMD_EMBED_PARALLELISM (`embed_parallelism`)."""
        self.idle_seconds = (
            idle_seconds if idle_seconds is not None else _env_number("QMD_IDLE_SECONDS", DEFAULT_IDLE_SECONDS, float)
        )
        self.n_threads = n_threads or int(_env_number("QMD_THREADS", usable_cores(), int))
        self.force_cpu = force_cpu if force_cpu is not None else _env_flag("QMD_FORCE_CPU")
        self.warnings: list[str] = []
        """Settings read but not honoured as written; said in the log once and in every `status`."""
        if gpu is None:
            gpu, warning = gpu_choice(os.environ.get("QMD_LLAMA_GPU"))
            self.warnings += [warning] if warning else []
        self.gpu = gpu
        if parallelism is None:
            parallelism, warning = embed_parallelism(os.environ.get("QMD_EMBED_PARALLELISM"))
            self.warnings += [warning] if warning else []
        self.parallelism = parallelism
        """Contexts that embed side by side; 0 = the worker sizes it to the hardware."""
        for warning in self.warnings:
            log.warning("%s", warning)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._proc: subprocess.Popen[bytes] | None = None
        self._selector: selectors.BaseSelector | None = None
        self._stderr_thread: threading.Thread | None = None
        self._stderr_tail: deque[str] = deque(maxlen=20)
        self._idle_thread: threading.Thread | None = None
        self._closed = False
        self._hello: Hello | None = None
        self._resident: tuple[Resident, ...] = ()
        self._starts = 0
        self._last_crash: dict[str, Any] | None = None
        self._last_used = time.monotonic()
        self._missing: tuple[tuple[str, int], str] | None = None
        """(the llama_cpp install it was, why) once a child could not import llama_cpp."""

    # -- public API --

    def embed(
        self,
        spec: ModelSpec,
        texts: list[str],
        *,
        kind: Literal["query", "document"],
        titles: list[str | None] | None = None,
        timeout: float | None = None,
    ) -> Embeddings:
        """Unit vectors for `texts` in the model family's prompt format; overlong inputs are clipped, not fatal."""
        if spec.role != "embed":
            raise ValueError(f"embed() needs an embed-role model, got role {spec.role!r}")
        if kind not in ("query", "document"):
            raise ValueError(f"kind must be 'query' or 'document', got {kind!r}")
        if titles is not None and len(titles) != len(texts):
            raise ValueError(f"{len(titles)} titles for {len(texts)} texts")
        params = self._load_params(spec)
        if not texts:
            return Embeddings([], clipped=(), n_tokens=[], limit=params.n_ctx)
        fmt = prompt_format(spec.path)
        if kind == "query":
            prompts = [format_query(fmt, t) for t in texts]
        else:
            prompts = [format_document(fmt, t, titles[i] if titles else None) for i, t in enumerate(texts)]
        activity = f"embedding {len(texts)} text{'s' * (len(texts) != 1)} with {os.path.basename(spec.path)}"
        result: EmbedResult = self._call(EmbedRequest(params, prompts), timeout, activity)
        flat = array("f")
        flat.frombytes(result.vectors)
        values, dims = flat.tolist(), result.dims
        return Embeddings(
            [values[i * dims : (i + 1) * dims] for i in range(len(texts))],
            clipped=tuple(result.clipped),
            n_tokens=result.n_tokens,
            limit=result.limit,
        )

    def count_tokens(self, spec: ModelSpec, texts: list[str], *, timeout: float | None = None) -> list[int]:
        """Token counts by the model's own tokenizer, special tokens ([CLS]/[SEP], BOS) included."""
        if not texts:
            return []
        activity = f"counting tokens with {os.path.basename(spec.path)}"
        return self._call(CountTokensRequest(self._load_params(spec), texts), timeout, activity)

    def chunk(self, spec: ModelSpec, text: str, *, max_tokens: int, timeout: float | None = None) -> list[Chunk]:
        """Chunks of `text` (`index.chunking`), each within `max_tokens` as the model's own tokenizer counts them.

        The chunker runs in the worker, next to the tokenizer, so it costs one round trip per
        document instead of one per measurement, and the daemon still never loads llama.cpp.
        """
        activity = f"chunking a {len(text)}-character document with {os.path.basename(spec.path)}"
        request = ChunkRequest(self._load_params(spec), text, max_tokens)
        return [
            Chunk(
                text=text[span.start : span.end],
                start=span.start,
                end=span.end,
                start_line=span.start_line,
                end_line=span.end_line,
                tokens=span.tokens,
                clipped=span.clipped,
            )
            for span in self._call(request, timeout, activity)
        ]

    def complete(
        self,
        spec: ModelSpec,
        prompt: str | None = None,
        *,
        messages: list[dict[str, str]] | None = None,
        params: GenerationParams,
        timeout: float | None = None,
    ) -> Completion:
        """Text generated after a raw `prompt`, or after `messages` rendered by the GGUF's own chat template.

        `params` travels to llama.cpp as the caller chose it. Each call starts from an empty
        KV cache: calls are independent. The prompt plus `params.max_tokens` must fit the
        context; the worker says by how much it does not (an `InferenceError`, and the
        worker stays up).
        """
        if (prompt is None) == (messages is None):
            raise ValueError("complete() takes exactly one of prompt or messages")
        load = self._generative_params(spec, "complete")
        activity = f"generating up to {params.max_tokens} tokens with {os.path.basename(spec.path)}"
        return self._call(CompleteRequest(load, prompt, messages, params), timeout, activity)

    def render_chat(self, spec: ModelSpec, messages: list[dict[str, str]], *, timeout: float | None = None) -> str:
        """`messages` as the raw prompt the model's chat template makes of them, ending where the reply starts.

        Rendered in the worker, where the template and the BOS/EOS token texts are; a model
        without a chat template is an `InferenceError` that says so.
        """
        activity = f"rendering a chat prompt with {os.path.basename(spec.path)}"
        return self._call(RenderChatRequest(self._generative_params(spec, "render_chat"), messages), timeout, activity)

    def likelihood(
        self, spec: ModelSpec, prefixes: list[str], continuation: str, *, timeout: float | None = None
    ) -> list[float]:
        """Mean log P(continuation tokens | prefix) for each prefix: query likelihood (models README §4).

        Higher is more likely; values are negative. The prefix gets BOS (if the vocabulary adds
        one) and its special tokens parsed; the continuation neither. A prefix too long for the
        context with the continuation is an error: shortening it is the caller's call.
        """
        if not continuation:
            raise ValueError("likelihood() needs a non-empty continuation")
        params = self._generative_params(spec, "likelihood")
        if not prefixes:
            return []
        activity = f"scoring {len(prefixes)} prefix{'es' * (len(prefixes) != 1)} with {os.path.basename(spec.path)}"
        return self._call(LikelihoodRequest(params, prefixes, continuation), timeout, activity)

    def yes_no(self, spec: ModelSpec, prompts: list[str], *, timeout: float | None = None) -> list[float]:
        """P(yes) / (P(yes) + P(no)) for the token after each prompt, in [0, 1]."""
        params = self._generative_params(spec, "yes_no")
        if not prompts:
            return []
        activity = f"asking yes/no of {len(prompts)} prompt{'s' * (len(prompts) != 1)} of {os.path.basename(spec.path)}"
        return self._call(YesNoRequest(params, prompts), timeout, activity)

    def rank(self, spec: ModelSpec, query: str, documents: list[str], *, timeout: float | None = None) -> list[float]:
        """Cross-encoder relevance of each document to `query`, in [0, 1], by llama.cpp rank pooling.

        Needs a GGUF whose `{arch}.pooling_type` is rank (4). A query and document pair that
        does not fit the context is an error; the caller truncates documents.
        """
        if not _is_rank_model(gguf_metadata(spec.path)):
            raise ValueError(f"rank() needs a cross-encoder (rank pooling); {os.path.basename(spec.path)} is not one")
        params = self._load_params(spec)
        if not documents:
            return []
        activity = f"ranking {len(documents)} document{'s' * (len(documents) != 1)} with {os.path.basename(spec.path)}"
        return self._call(RankRequest(params, query, documents), timeout, activity)

    def require_models(self) -> None:
        """`ModelsNotInstalled` unless llama.cpp can run here; cheap, never imports llama_cpp or starts the child.

        No `llama_cpp` on the path is decided here. One that is there but failed to import in
        a child is remembered until that install changes (the extra installed or repaired
        while the daemon runs), so one request does not start a doomed child after another.
        """
        install = _llama_cpp_install()
        if install is None:
            raise ModelsNotInstalled(models_missing_message("llama-cpp-python is not installed"))
        if self._missing is not None and self._missing[0] == install:
            raise ModelsNotInstalled(self._missing[1])

    def models_missing(self) -> str | None:
        """Why no local model can run here, or None when llama.cpp looks installed (for `status` and `doctor`)."""
        try:
            self.require_models()
        except ModelsNotInstalled as e:
            return e.message
        return None

    def model_info(self, spec: ModelSpec) -> dict[str, Any]:
        """What the file is and what the worker holds of it; never starts the child or loads weights."""
        meta = gguf_metadata(spec.path)
        arch = str(meta.get("general.architecture", ""))
        params = self._load_params(spec)
        resident = [m for m in self._resident if m.path == params.path and m.role == spec.role]
        info: dict[str, Any] = {
            "path": params.path,
            "role": spec.role,
            "name": meta.get("general.name"),
            "arch": arch,
            "n_embd": meta.get(f"{arch}.embedding_length"),
            "n_ctx_train": meta.get(f"{arch}.context_length"),
            "n_ctx": params.n_ctx,
            "pooling": _POOLING.get(meta.get(f"{arch}.pooling_type", 0)),
            "chat_template": "tokenizer.chat_template" in meta,
            "rerank_template": "tokenizer.chat_template.rerank" in meta,
            "has_bos": "tokenizer.ggml.bos_token_id" in meta,
            "file_size": os.path.getsize(spec.path),
            "sha256": file_sha256(spec.path),
            "loaded": bool(resident),
            "context_live": any(m.context_live for m in resident),
        }
        if spec.role == "embed":
            info["prompt_format"] = prompt_format(spec.path)
            info["fingerprint"] = fingerprint(spec)
        return info

    def status(self) -> dict[str, Any]:
        """A snapshot for `doctor`/`status`; never waits for an in-flight request."""
        proc = self._proc
        running = proc is not None and proc.poll() is None
        models = self._resident if running else ()
        hello = self._hello
        return {
            "pid": proc.pid if running and proc else None,
            "backend": hello.backend if hello else None,
            "gpu_offload_supported": hello.gpu_offload_supported if hello else None,
            "force_cpu": self.force_cpu,
            "gpu_choice": self.gpu,
            "offload": hello.offload if hello else None,
            "devices": list(hello.devices) if hello else None,
            "embed_parallelism": self.parallelism or "auto",
            "warnings": [*self.warnings, *(hello.warnings if hello else ())],
            "n_threads": self.n_threads,
            "idle_seconds": self.idle_seconds,
            "llama_cpp_version": hello.llama_cpp_version if hello else None,
            "system_info": hello.system_info if hello else None,
            "models_loaded": [
                {
                    "path": m.path,
                    "role": m.role,
                    "parallelism": m.parallelism,
                    "load_seconds": round(m.load_seconds, 3),
                    "loaded_at": m.loaded_at,
                }
                for m in models
            ],
            "contexts_live": sum(m.context_live for m in models),
            "rss_bytes": _rss(proc.pid) if running and proc else None,
            "restarts": max(self._starts - 1, 0),
            "last_crash": self._last_crash,
            "models_missing": self.models_missing(),
        }

    def close(self, grace: float = 10.0) -> None:
        """Stop the child: politely (EOF) once in-flight work is done, or killed after `grace` seconds."""
        got = self._lock.acquire(timeout=grace)
        try:
            self._closed = True
            proc = self._proc
            if proc is not None and proc.poll() is None:
                if got:
                    assert proc.stdin is not None
                    proc.stdin.close()
                    try:
                        proc.wait(timeout=grace)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                else:  # a request is stuck: the thread running it will see EOF and fail
                    proc.kill()
                proc.wait()
            if got:
                self._release_child()
                self._cond.notify_all()
        finally:
            if got:
                self._lock.release()
        if self._idle_thread is not None and self._idle_thread is not threading.current_thread():
            self._idle_thread.join(timeout=grace)

    # -- internals --

    def _load_params(self, spec: ModelSpec) -> LoadParams:
        """Everything the child needs to load the model; decided here, where the metadata is."""
        meta = gguf_metadata(spec.path)
        arch = meta.get("general.architecture", "")
        ceiling = CONTEXT[spec.role]
        n_ctx = spec.n_ctx or min(ceiling, int(meta.get(f"{arch}.context_length") or ceiling))
        # A cross-encoder (rank pooling) is run like an embedder: its output is pooled, not logits.
        embedding = spec.role == "embed" or _is_rank_model(meta)
        # A pooled sequence must fit one micro-batch (non-causal attention), so the batch is
        # the whole context; generation streams through 512-token batches.
        n_batch = n_ctx if embedding else min(512, n_ctx)
        return LoadParams(
            role=spec.role,
            path=os.path.realpath(spec.path),
            embedding=embedding,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_ubatch=n_batch,
            n_threads=spec.n_threads or self.n_threads,
        )

    def _generative_params(self, spec: ModelSpec, op: str) -> LoadParams:
        """Load parameters for an op that reads logits; an embedder or cross-encoder has none to read."""
        params = self._load_params(spec)
        if params.embedding:
            raise ValueError(
                f"{op}() needs a generative model; {os.path.basename(spec.path)} is run as an embedder or cross-encoder"
            )
        return params

    def _call(self, request: Request[R], timeout: float | None, activity: str) -> R:
        """Send one request and wait for its result, starting the child if there is none."""
        with self._cond:
            if self._closed:
                raise InferenceError("the inference worker is shut down")
            if self._proc is not None and self._proc.poll() is not None:
                self._child_died("while idle")  # died between requests: nothing in flight to fail
            if self._proc is None:
                self._start()
            try:
                return self._exchange(request, timeout, activity)
            finally:
                self._last_used = time.monotonic()
                self._cond.notify_all()

    def _exchange(self, request: Request[Any] | None, timeout: float | None, activity: str) -> Any:
        """Round trip on the current child (request None: just read the hello); the lock is held.

        A dead or stuck child fails this request only.
        """
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            data = memoryview(encode_frame(request) if request is not None else b"")
            while data:
                data = data[os.write(proc.stdin.fileno(), data) :]
            header = self._read(HEADER.size, deadline)
            reply: Reply = pickle.loads(self._read(HEADER.unpack(header)[0], deadline))
        except (_ChildGone, BrokenPipeError):
            raise InferenceError(self._child_died(f"while {activity}")) from None
        except TimeoutError:
            proc.kill()
            proc.wait()
            message = (
                f"the inference worker did not answer within {timeout:g} s while {activity}; "
                "it was stopped and will be restarted on the next request"
            )
            self._child_died(f"while {activity}", message)
            raise InferenceError(message) from None
        self._resident = reply.resident
        if reply.error is not None and reply.error.startswith(MODELS_MISSING):
            raise ModelsNotInstalled(models_missing_message(reply.error.removeprefix(MODELS_MISSING + ": ")))
        if reply.error is not None:
            raise InferenceError(f"{activity} failed: {reply.error}")
        return reply.result

    def _read(self, n: int, deadline: float | None) -> bytes:
        """Exactly n bytes of the child's stdout, or _ChildGone at EOF, or TimeoutError at the deadline."""
        assert self._proc is not None and self._proc.stdout is not None and self._selector is not None
        fd = self._proc.stdout.fileno()
        chunks: list[bytes] = []
        while n:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0)
            if not self._selector.select(wait):
                raise TimeoutError
            chunk = os.read(fd, min(n, 1 << 20))
            if not chunk:
                raise _ChildGone
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _start(self) -> None:
        """Start a child and wait for its hello; the lock is held."""
        # The same interpreter finds `qmd` the way this process did (the install's path entry or
        # editable finder). No PYTHONPATH is added: the `server/` folder on the path would let its
        # `http` package shadow the standard library's in the child.
        self.require_models()
        args = [
            *(["--force-cpu"] if self.force_cpu else []),
            f"--gpu={self.gpu}",
            f"--embed-parallelism={self.parallelism}",
        ]
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "qmd.server.models.worker_child", *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
            )
        except OSError as e:
            raise InferenceError(f"cannot start the inference worker: {e}") from None
        assert proc.stdout is not None and proc.stderr is not None
        self._proc = proc
        self._starts += 1
        self._selector = selectors.DefaultSelector()
        self._selector.register(proc.stdout, selectors.EVENT_READ)
        self._stderr_tail.clear()
        self._stderr_thread = threading.Thread(
            target=self._forward_stderr, args=(proc,), name=f"qmd-worker-stderr-{proc.pid}", daemon=True
        )
        self._stderr_thread.start()
        try:
            hello: Hello = self._exchange(None, START_TIMEOUT, "starting")
        except ModelsNotInstalled as e:  # the child said so and exits: not a crash, and not worth retrying
            install = _llama_cpp_install()
            if install is not None:
                self._missing = (install, e.message)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self._release_child()
            raise
        self._hello = hello
        log.info("inference worker %d started (%s)", proc.pid, hello.offload or hello.backend)
        for warning in hello.warnings:
            log.warning("inference worker %d: %s", proc.pid, warning)
        if self._idle_thread is None:
            self._idle_thread = threading.Thread(target=self._idle_loop, name="qmd-inference-idle", daemon=True)
            self._idle_thread.start()

    def _forward_stderr(self, proc: subprocess.Popen[bytes]) -> None:
        """llama.cpp's and the child's stderr go to the daemon's log, never to a client."""
        assert proc.stderr is not None
        # Buffered over the raw pipe (bufsize=0) so lines are read in blocks, not a byte per syscall;
        # the pipe itself stays open until `_release_child` closes it.
        with open(proc.stderr.fileno(), "rb", closefd=False) as lines:
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip()
                if line:
                    self._stderr_tail.append(line)
                    log.warning("inference worker %d: %s", proc.pid, line)

    def _child_died(self, when: str, message: str | None = None) -> str:
        """Reap the child, record why it ended, and forget it so the next request starts a new one."""
        proc = self._proc
        assert proc is not None
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # EOF on stdout but still running: no longer usable
            proc.kill()
            code = proc.wait()
        if self._stderr_thread is not None:
            self._stderr_thread.join(timeout=2)  # the last lines often say why (GGML_ASSERT ...)
        if message is None:
            if self._closed:
                message = f"the inference worker was shut down {when}"
            elif code < 0:
                message = (
                    f"the inference worker crashed ({signal.Signals(-code).name}) {when}; "
                    "it will be restarted on the next request"
                )
            else:
                message = (
                    f"the inference worker exited with status {code} {when}; it will be restarted on the next request"
                )
        self._last_crash = {
            "reason": message,
            "exit_code": code,
            "at": time.time(),
            "stderr_tail": list(self._stderr_tail)[-5:],
        }
        log.error("%s", message)
        self._release_child()
        return message

    def _release_child(self) -> None:
        """Drop the handles of a child that has exited."""
        proc = self._proc
        if proc is None:
            return
        if self._selector is not None:
            self._selector.close()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        if self._stderr_thread is not None:
            self._stderr_thread.join(timeout=2)
            if not self._stderr_thread.is_alive() and proc.stderr is not None:
                proc.stderr.close()
        self._proc = None
        self._selector = None
        self._resident = ()

    def _idle_loop(self) -> None:
        """Free contexts after `idle_seconds` without a request; holds the request lock while it does."""
        with self._cond:
            while not self._closed:
                if not any(m.context_live for m in self._resident):
                    self._cond.wait()
                    continue
                remaining = self._last_used + self.idle_seconds - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                if self._proc is not None and self._proc.poll() is not None:
                    self._child_died("while idle")
                    continue
                try:
                    self._exchange(DisposeRequest(), 30.0, "freeing idle contexts")
                except InferenceError as e:
                    log.warning("%s", e.message)


def _llama_cpp_install() -> tuple[str, int] | None:
    """Where `llama_cpp` would be imported from, and when that file last changed; None when it is not installed.

    Found the way an import would find it, without importing it (the daemon never does).
    """
    try:
        found = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    origin = found.origin or ""
    try:
        return origin, os.stat(origin).st_mtime_ns
    except OSError:
        return origin, 0


def _rss(pid: int) -> int | None:
    """Resident set size of a process, where /proc exists (Linux); None elsewhere."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
