"""Model inference for the daemon, run in a supervised child process.

The daemon never imports llama_cpp: a native crash in llama.cpp (SIGABRT on a failed
GGML_ASSERT, SIGSEGV on a bad file) would otherwise take keyword search down with it.
`WorkerClient` is the daemon's side: it starts `python -m qmd.server.models.worker_child` on
first use, sends it typed requests over its stdin/stdout (`qmd.server.models.protocol`), and
when the child dies fails only the request in flight, with the signal named; the next request
starts a fresh child.

Lifecycle: models load lazily and stay loaded; their inference contexts (compute buffers,
KV cache) are freed after `idle_seconds` without a request and rebuilt on the next one.

One thread, the dispatcher, owns the child: it starts it, sends each request and reads its
reply, and frees idle contexts, so one model object is never used by two requests and the
idle timer can never free a context while work is in flight (the original races here,
qmd#938). Callers put their requests in its queue and wait for the answer:

- **Lanes.** Interactive calls (a query's embedding, expansion, rerank) are taken before
  background ones (the embed job's batches, marked with `background_lane()`). A background
  embed is sent in slices of about `BACKGROUND_SLICE_S` by the model's measured pace, and
  a slice in flight yields: a queued interactive call raises the `YieldFlag` the child
  shares, and the slice answers for the texts it has done, stopping its decode between
  graph nodes (llama.cpp's abort callback); the rest is sent again after the query. So a
  query issued during `qmd embed` waits for about a millisecond of the job's work, not a
  chunk's decode (tens of ms) nor a whole batch. A search announced with `searching()`
  (the HTTP layer does so from a request's arrival) raises the flag too, and while it runs
  no background call starts, for up to `HOLD_S`: its work between model calls has the
  cores as well. While a background call waits, it is owed `BACKGROUND_SHARE` of the
  worker's time: interactive work earns it credit, and with credit it goes next, ahead of
  any query, and runs its slice to the end; a stream of queries slows the embed job but
  never stops it.
- **Liveness by progress.** Once sent, a call must be answered within `QMD_WORKER_TIMEOUT`
  (30 s) plus `QMD_WORKER_ITEM_TIMEOUT` (2 s) per item (text, document, prompt, 16 generated
  tokens), plus `QMD_WORKER_LOAD_TIMEOUT` (120 s) when it loads its model first, unless the
  child reports progress: it ticks a counter in the page it shares with the parent as each
  item (each generated token) is done, and a call that ticks is hung only once it has not
  ticked for `QMD_WORKER_TIMEOUT`, or at `CEILING_FACTOR` times its deadline (`_Watch`), so
  a loaded machine is slow, not hung. A caller's own `timeout` stays wall time. A new child
  has `QMD_WORKER_START_TIMEOUT` (60 s) to say hello. A child that is hung (stopped,
  looping, swapping) is killed, the call fails saying so (`WorkerLost`, which a background
  job may send again), and the next call starts a new child. An interactive call waits in
  line at most `QMD_WORKER_TIMEOUT`, and within `wait_at_most(seconds)` (a query's budget)
  at most that long; `QMD_WORKER_QUEUE` (64) calls may wait at once, and one more fails at once.
- **Crashes that repeat.** A model that ends the worker with the same native signal twice
  (SIGSEGV from llama.cpp's repacked kernels on AMX CPUs) is loaded from then on with
  llama.cpp's safe settings (`LoadParams.safe`); one that crashes even so is reported with
  the files of the same model to use instead. `status()["last_crash"]` is a `WorkerCrash`.
- **Receipts.** The child acknowledges each request as soon as it starts reading it; a child
  found dead before its receipt had died between requests, so the request goes to a new
  child instead of failing.
- **Parent death.** The child asks the kernel for SIGKILL when the dispatcher thread (its
  parent) ends (Linux `PR_SET_PDEATHSIG`) and watches its parent pid as a fallback, so a
  `kill -9` of the daemon takes the worker with it, even one that is stopped or busy.

GGUF metadata (architecture, dimensions, pooling, prompt format) is read here in pure
Python, so `model_info` and `fingerprint` answer without starting the child or loading
weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import heapq
import importlib.metadata
import importlib.util
import itertools
import json
import logging
import mmap
import os
import pickle
import re
import select
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
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar
from urllib.parse import unquote, urlparse

from qmd.server.errors import InvalidSetting, Unavailable
from qmd.server.models.protocol import (
    HEADER,
    MODELS_MISSING,
    RECEIPT,
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
    YieldFlag,
    encode_frame,
)
from qmd.server.text.chunking import Chunk

log = logging.getLogger("qmd.inference")

PromptFormat = Literal["embeddinggemma", "qwen3-embedding", "plain"]

DEFAULT_IDLE_SECONDS = 300.0
CONTEXT = {"embed": 2048, "rerank": 4096, "generate": 2048}
"""Context ceiling per role (spec §9.2); a model gets min(ceiling, its trained context).
An embed input longer than its model's context is clipped."""
START_TIMEOUT = 60.0
"""How long a new child may take to import llama_cpp and say hello (`QMD_WORKER_START_TIMEOUT`)."""
CALL_TIMEOUT = 30.0
"""The deadline of a small call once the child has it (`QMD_WORKER_TIMEOUT`); also the longest an
interactive call waits in line for the worker."""
ITEM_TIMEOUT = 2.0
"""Added to a call's deadline per item it carries (`QMD_WORKER_ITEM_TIMEOUT`): an embed batch of
32 texts may take 30 + 64 s before the child counts as hung."""
LOAD_TIMEOUT = 120.0
"""Added to the deadline of a call that must load its model first (`QMD_WORKER_LOAD_TIMEOUT`):
reading a few GB of weights from a cold disk legitimately takes a while."""
QUEUE_LIMIT = 64
"""Calls that may wait for the worker at once (`QMD_WORKER_QUEUE`); one more fails at once."""
DISPOSE_TIMEOUT = 30.0
RECENT_CALLS = 100
"""Calls `status()["recent"]` remembers: lane, activity, when queued, started and ended, outcome."""
BACKGROUND_SLICE_S = 0.05
"""What one background embed request may take, sized by the model's measured pace: the bound on
a query's wait where the slice in flight cannot yield (no `YieldFlag`), and in any case a
reply every few chunks, so the job's progress and its deadline are per slice. Measured with MiniLM
on 2 cores: 700 man pages embedded in 110.8 s at 0.05 s slices and 113.3 s at 0.25 s, while a
plain query's embedding waited 31-63 ms for its turn against 114-275 ms before slices yielded
(`bench/bench_rerank.py`'s scheduling phase)."""
HOLD_S = 0.25
"""How long a search in progress (`WorkerClient.searching`) may keep background calls from starting:
past it one goes, so a stream of searches slows the embed job but never stops it."""
BACKGROUND_SHARE = 0.3
"""The share of the worker's time a waiting background call is owed, however many queries are
in line: a steady stream of them (8 clients) kept the embed job from ever reaching the head of
the line, and it wrote 0 rows in 240 s."""
CEILING_FACTOR = 10.0
"""A call whose child keeps reporting progress is still hung at this many times its deadline."""
NATIVE_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"})
"""Signals of a crash in native code (llama.cpp): the same one twice with a model reloads it safely."""
TOKENS_PER_ITEM = 16
"""Generated tokens that count as one item of a completion's deadline."""


class InferenceError(Unavailable):
    """An inference request failed; the message says why and what happens next."""


class WorkerLost(InferenceError):
    """The worker crashed or was killed as hung during this call: the call was not answered, and
    the next one starts a new worker, so a background job may send it again."""


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


def _check_shared(shared: int) -> None:
    """A request's `shared` counts characters or messages from the start: negative means nothing."""
    if shared < 0:
        raise ValueError(f"shared must be 0 or more (how much of the start repeats between calls), got {shared}")


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
    """A document chunk as the model family was trained to see one. `title` is the chunk's
    context (its document's title and the headings it sits under: `text.headings`), so a
    passage from the middle of a note still says what the note is about; embeddinggemma has
    a field for it, the others read it as the passage's first line."""
    if fmt == "embeddinggemma":
        return f"title: {title or 'none'} | text: {text}"
    return f"{title}\n{text}" if title else text


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


def env_number(name: str, default: float, kind: type[int] | type[float]) -> float:
    """A positive number from the environment; a bad value is an error at startup, not a silent default."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise InvalidSetting(f"{name} must be a positive {kind.__name__}, got {raw!r}")
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


class _NotDelivered(Exception):
    """The child was gone before it acknowledged the request: it died between requests, not of this one."""


Lane = Literal["interactive", "background"]
_LANE_ORDER: dict[Lane, int] = {"interactive": 0, "background": 1}
_lane: ContextVar[Lane] = ContextVar("qmd_inference_lane", default="interactive")
_wait_until: ContextVar[float | None] = ContextVar("qmd_inference_wait_until", default=None)


@contextlib.contextmanager
def background_lane() -> Iterator[None]:
    """Inference calls made inside wait behind every interactive call (the embed job's batches).

    A background call waits in line as long as it takes; it still has its deadline once sent.
    """
    token = _lane.set("background")
    try:
        yield
    finally:
        _lane.reset(token)


@contextlib.contextmanager
def wait_at_most(seconds: float | None) -> Iterator[None]:
    """Inference calls made inside give up after `seconds` (None: no limit), counted from here.

    A query's budget: a call still in line is dropped, one in flight is left to finish and
    its answer dropped, and either raises an `InferenceError` beginning `budget:`. Nested
    limits keep the earlier end.
    """
    if seconds is None:
        yield
        return
    until = time.monotonic() + max(seconds, 0.0)
    outer = _wait_until.get()
    token = _wait_until.set(until if outer is None else min(outer, until))
    try:
        yield
    finally:
        _wait_until.reset(token)


def _pace_of(request: Request[Any], lane: Lane) -> tuple[tuple[str, str, Lane], int]:
    """Which running mean a call's time belongs to (its request type, model file and lane), and
    how many items it is: an embed request's texts, one for any other call. The lane keeps a
    query's few words apart from the embed job's chunks: one mean for both let a 5 ms query
    set the pace, and the next background slice took 50 chunks (1.8 s) instead of 0.25 s."""
    model = getattr(request, "model", None)
    items = max(len(request.texts), 1) if isinstance(request, EmbedRequest) else 1
    return (type(request).__name__, model.path if isinstance(model, LoadParams) else "", lane), items


def _yielded(request: Request[Any], result: Any) -> str | None:
    """How far a background embed got before it yielded to a query, for `status()["recent"]`; None
    for any call that did all it was asked."""
    if not isinstance(request, EmbedRequest) or not isinstance(result, EmbedResult):
        return None
    answered, asked = len(result.n_tokens), len(request.texts)
    return f"yielded after {answered} of {asked} text{'s' * (asked != 1)}" if answered < asked else None


@dataclass(eq=False)
class _Job:
    """One call on its way through the dispatcher: queued, running, then done (or abandoned by its caller)."""

    request: Request[Any]
    activity: str
    seconds: float
    """Deadline once sent, before any allowance for loading its model."""
    exact: bool
    """The caller chose `seconds` itself: no load allowance is added."""
    lane: Lane
    owed: bool = False
    """A background call sent ahead of interactive ones on the lane's credit (`WorkerClient._turn`)."""
    submitted: float = field(default_factory=time.monotonic)
    state: Literal["queued", "running", "done", "abandoned"] = "queued"
    started: float = 0.0
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    times: list[float] = field(default_factory=list)
    """Wall-clock times it was queued, started and ended (set under the lock, so they order calls exactly)."""

    def record(self, outcome: str) -> dict[str, Any]:
        """What `status()["recent"]` says about it (`owed`: sent ahead of queries on the background lane's credit)."""
        queued, started, ended = [*self.times, None, None, None][:3]
        return {
            "lane": self.lane,
            "owed": self.owed,
            "activity": self.activity,
            "queued_at": queued,
            "started_at": started,
            "ended_at": ended,
            "outcome": outcome,
        }


class _Watch:
    """When a call in flight counts as hung: at its deadline, unless a stall window is given and
    the child has ticked its progress since the call was sent; then once it has not ticked for
    `stall` seconds, and in any case at `CEILING_FACTOR` times the deadline."""

    def __init__(self, sent: float, timeout: float, stall: float | None, flag: YieldFlag | None) -> None:
        self.sent = sent
        self.deadline = sent + timeout
        self.ceiling = sent + timeout * CEILING_FACTOR
        self.stall = stall
        self.flag = flag if stall is not None else None
        self._base = flag.progress()[0] if flag is not None else 0
        self.ticked: int | None = None
        """Items the child reported done for this call, once it reported any."""

    def left(self) -> float:
        """Seconds until the call counts as hung, as of the child's latest tick (0: it does now)."""
        end = self.deadline
        if self.flag is not None and self.stall is not None:
            done, at = self.flag.progress()
            if done > self._base:
                self.ticked = done - self._base
                end = min(max(end, at + self.stall), self.ceiling)
        return max(end - time.monotonic(), 0.0)


@dataclass(frozen=True)
class WorkerCrash:
    """The last time the inference worker ended unasked, and what qmd does about it: `status`
    carries it and `doctor` says it in words."""

    reason: str
    """The message the call in flight failed with."""
    exit_code: int
    """The child's exit status; negative: the signal that ended it."""
    signal: str | None
    """`SIGSEGV`, `SIGABRT`, … when a signal ended it (SIGKILL: killed as hung)."""
    at: float
    """When (`time.time()`)."""
    activity: str
    """What it was doing: `while embedding 4 texts with x.gguf`, `between requests`."""
    model: str | None
    """The model file of the call in flight, when that call had one."""
    role: Role | None
    times: int
    """How often this model has ended the worker with this signal since the daemon started."""
    recovery: str | None
    """What happens next for that model: a reload with safe settings, or the files and settings to try."""
    stderr_tail: list[str]


class WorkerClient:
    """The daemon's handle on the inference child: lazy start, one request at a time (interactive
    first), a deadline on each, restart after a crash or a hang."""

    def __init__(
        self,
        *,
        idle_seconds: float | None = None,
        n_threads: int | None = None,
        force_cpu: bool | None = None,
        gpu: str | None = None,
        parallelism: int | None = None,
        native_log_level: int = logging.WARNING,
    ) -> None:
        """Arguments left as None come from QMD_IDLE_SECONDS (300), QMD_THREADS (usable cores),
        QMD_FORCE_CPU, QMD_LLAMA_GPU (`gpu_choice`) and QMD_EMBED_PARALLELISM (`embed_parallelism`);
        the deadlines from QMD_WORKER_TIMEOUT, QMD_WORKER_ITEM_TIMEOUT, QMD_WORKER_LOAD_TIMEOUT,
        QMD_WORKER_START_TIMEOUT and the queue's length from QMD_WORKER_QUEUE (module docstring).
        `native_log_level`: the level the child's stderr (llama.cpp's own log) is logged at:
        the daemon's log takes it as warnings; the library passes DEBUG unless asked to be
        verbose, so a program's stderr does not get llama.cpp's notes about a GGUF. A crash
        report quotes the last lines whatever the level."""
        self.native_log_level = native_log_level
        self.idle_seconds = (
            idle_seconds if idle_seconds is not None else env_number("QMD_IDLE_SECONDS", DEFAULT_IDLE_SECONDS, float)
        )
        self.n_threads = n_threads or int(env_number("QMD_THREADS", usable_cores(), int))
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
        self.call_timeout = env_number("QMD_WORKER_TIMEOUT", CALL_TIMEOUT, float)
        self.item_timeout = env_number("QMD_WORKER_ITEM_TIMEOUT", ITEM_TIMEOUT, float)
        self.load_timeout = env_number("QMD_WORKER_LOAD_TIMEOUT", LOAD_TIMEOUT, float)
        self.start_timeout = env_number("QMD_WORKER_START_TIMEOUT", START_TIMEOUT, float)
        self.queue_limit = int(env_number("QMD_WORKER_QUEUE", QUEUE_LIMIT, int))
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        """Guards the queue and the job states; never held while talking to the child."""
        self._queue: list[tuple[int, int, _Job]] = []
        self._seq = itertools.count()
        self._running: _Job | None = None
        self._dispatcher: threading.Thread | None = None
        """The one thread that talks to the child (and so its parent, for PR_SET_PDEATHSIG)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._selector: selectors.BaseSelector | None = None
        self._stderr_thread: threading.Thread | None = None
        self._stderr_tail: deque[str] = deque(maxlen=20)
        self._hangs = 0
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT_CALLS)
        self._closed = False
        self._hello: Hello | None = None
        self._resident: tuple[Resident, ...] = ()
        self._starts = 0
        self._last_crash: WorkerCrash | None = None
        self._crashes: dict[tuple[str, str], int] = {}
        """Native crashes by (model file, signal) since the daemon started (`_recover`)."""
        self._safe: set[str] = set()
        """Model files loaded with llama.cpp's safe settings, having crashed the worker twice."""
        self._last_used = time.monotonic()
        self._pace: dict[tuple[str, str, Lane], float] = {}
        """Seconds per item (an embedded text; any other call is one), per (request type, model
        file): a running mean of what the child took, for `backlog` and the background slices."""
        self._searches = 0
        """Searches in progress (`searching`): while there are any, background calls wait, up to `HOLD_S`."""
        self._held_since: float | None = None
        """When the background call first in line was first held back; None when none is."""
        self._owed = 0.0
        """The background lane's credit in worker seconds: earned by interactive work done while a
        background call waited (`BACKGROUND_SHARE`), spent by the calls it sends ahead (`_turn`)."""
        self._yield: YieldFlag | None = None
        """Raised while an interactive call waits; shared with every child (`protocol.YieldFlag`)."""
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
        vectors: list[list[float]] = []
        clipped: list[int] = []
        n_tokens: list[int] = []
        limit = params.n_ctx
        # A background slice yields to a waiting query (`YieldFlag`); one that yielded before
        # finishing a text finishes one next time, so a stream of queries slows the job but never stops it.
        yield_after = 0 if _lane.get() == "background" else None
        while len(vectors) < len(prompts):
            part = prompts[len(vectors) : len(vectors) + self._slice(params, len(prompts) - len(vectors))]
            activity = f"embedding {len(part)} text{'s' * (len(part) != 1)} with {os.path.basename(spec.path)}"
            request = EmbedRequest(params, part, yield_after)
            result: EmbedResult = self._call(request, timeout, activity, items=len(part))
            flat = array("f")
            flat.frombytes(result.vectors)
            values, dims, answered = flat.tolist(), result.dims, len(result.n_tokens)
            clipped += [len(vectors) + i for i in result.clipped]
            n_tokens += result.n_tokens
            limit = result.limit
            vectors += [values[i * dims : (i + 1) * dims] for i in range(answered)]
            if yield_after is not None:
                yield_after = 0 if answered else 1
        return Embeddings(vectors, clipped=tuple(clipped), n_tokens=n_tokens, limit=limit)

    @contextlib.contextmanager
    def searching(self) -> Iterator[None]:
        """A search runs inside: the background call in flight, if any, yields at once, and no other
        starts meanwhile (for up to `HOLD_S` at a time), so the search's own work (parsing, BM25, the
        vector scan, fusion, shaping) has the cores the embed job's threads would take."""
        with self._cond:
            self._searches += 1
            if self._yield is not None:  # the background call in flight stops now, not at the first model call
                self._yield.set(True)
        try:
            yield
        finally:
            with self._cond:
                self._searches -= 1
                self._cond.notify_all()

    def backlog(self) -> float:
        """Seconds a new interactive call would wait for its turn: what the call running has left
        and the interactive calls already in line, each by the mean time of its kind (0 for a
        kind not seen yet). A query's budget plans with it: with another client's rerank ahead,
        there is no time to expand, and the answer says so at once instead of at its deadline."""
        now = time.monotonic()
        with self._lock:
            ahead = sum(self._expected(j) for *_, j in self._queue if j.state == "queued" and j.lane == "interactive")
            busy = self._running
            return ahead + (max(self._expected(busy) - (now - busy.started), 0.0) if busy is not None else 0.0)

    def _observe(self, job: _Job, seconds: float, result: Any) -> None:
        """Fold a finished call's time into its kind's mean (under the lock); a much faster call
        replaces the mean outright, since the first call of a model also loaded it. An embed that
        yielded is left out: its time includes a decode it gave up."""
        if _yielded(job.request, result) is not None:
            return
        key, items = _pace_of(job.request, job.lane)
        per, old = seconds / items, self._pace.get(key)
        self._pace[key] = per if old is None or per < old / 2 else 0.7 * old + 0.3 * per

    def _expected(self, job: _Job) -> float:
        """How long `job` should take, by its kind's mean (under the lock; 0 when not seen yet)."""
        key, items = _pace_of(job.request, job.lane)
        return self._pace.get(key, 0.0) * items

    def _slice(self, params: LoadParams, left: int) -> int:
        """Texts to send in the next embed request: all of them in the interactive lane; in the
        background, as many as the model embeds in `BACKGROUND_SLICE_S` (4 before it is measured)."""
        if _lane.get() != "background":
            return left
        with self._lock:
            pace = self._pace.get((EmbedRequest.__name__, params.path, "background"))
        return max(1, min(left, 4 if pace is None else int(BACKGROUND_SLICE_S / max(pace, 1e-4))))

    def count_tokens(self, spec: ModelSpec, texts: list[str], *, timeout: float | None = None) -> list[int]:
        """Token counts by the model's own tokenizer, special tokens ([CLS]/[SEP], BOS) included."""
        if not texts:
            return []
        activity = f"counting tokens with {os.path.basename(spec.path)}"
        request = CountTokensRequest(self._load_params(spec), texts)
        return self._call(request, timeout, activity, items=len(texts) / 64)

    def chunk(
        self, spec: ModelSpec, text: str, *, max_tokens: int, language: str | None = None, timeout: float | None = None
    ) -> list[Chunk]:
        """Chunks of `text` (`index.chunking`), each within `max_tokens` as the model's own tokenizer counts them;
        a code file's at its syntax when `language` names its grammar (`index.code_chunks`).

        The chunker runs in the worker, next to the tokenizer, so it costs one round trip per
        document instead of one per measurement, and the daemon still never loads llama.cpp.
        """
        activity = f"chunking a {len(text)}-character document with {os.path.basename(spec.path)}"
        request = ChunkRequest(self._load_params(spec), text, max_tokens, language)
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
            for span in self._call(request, timeout, activity, items=len(text) / 20_000)
        ]

    def complete(
        self,
        spec: ModelSpec,
        prompt: str | None = None,
        *,
        messages: list[dict[str, str]] | None = None,
        params: GenerationParams,
        shared: int = 0,
        timeout: float | None = None,
    ) -> Completion:
        """Text generated after a raw `prompt`, or after `messages` rendered by the GGUF's own chat template.

        `params` travels to llama.cpp as the caller chose it. Calls are independent: the same
        request gives the same answer whatever came before. `shared` names the part that
        repeats between calls (characters of `prompt`, or leading `messages`): the worker
        evaluates it once and keeps its state (`CompleteRequest.shared`). The prompt plus
        `params.max_tokens` must fit the context; the worker says by how much it does not
        (an `InferenceError`, and the worker stays up).
        """
        if (prompt is None) == (messages is None):
            raise ValueError("complete() takes exactly one of prompt or messages")
        _check_shared(shared)
        load = self._generative_params(spec, "complete")
        activity = f"generating up to {params.max_tokens} tokens with {os.path.basename(spec.path)}"
        items = params.max_tokens / TOKENS_PER_ITEM
        return self._call(CompleteRequest(load, prompt, messages, params, shared), timeout, activity, items=items)

    def render_chat(self, spec: ModelSpec, messages: list[dict[str, str]], *, timeout: float | None = None) -> str:
        """`messages` as the raw prompt the model's chat template makes of them, ending where the reply starts.

        Rendered in the worker, where the template and the BOS/EOS token texts are; a model
        without a chat template is an `InferenceError` that says so.
        """
        activity = f"rendering a chat prompt with {os.path.basename(spec.path)}"
        request = RenderChatRequest(self._generative_params(spec, "render_chat"), messages)
        return self._call(request, timeout, activity, items=0)

    def likelihood(
        self,
        spec: ModelSpec,
        prefixes: list[str],
        continuation: str,
        *,
        shared: int = 0,
        timeout: float | None = None,
    ) -> list[float]:
        """Mean log P(continuation tokens | prefix) for each prefix: query likelihood (models README §4).

        Higher is more likely; values are negative. The prefix gets BOS (if the vocabulary adds
        one) and its special tokens parsed; the continuation neither. A prefix too long for the
        context with the continuation is an error: shortening it is the caller's call. The
        first `shared` characters of every prefix (a template's head) are evaluated once.
        """
        if not continuation:
            raise ValueError("likelihood() needs a non-empty continuation")
        _check_shared(shared)
        params = self._generative_params(spec, "likelihood")
        if not prefixes:
            return []
        activity = f"scoring {len(prefixes)} prefix{'es' * (len(prefixes) != 1)} with {os.path.basename(spec.path)}"
        request = LikelihoodRequest(params, prefixes, continuation, shared)
        return self._call(request, timeout, activity, items=len(prefixes))

    def yes_no(
        self, spec: ModelSpec, prompts: list[str], *, shared: int = 0, timeout: float | None = None
    ) -> list[float]:
        """P(yes) / (P(yes) + P(no)) for the token after each prompt, in [0, 1]; the first `shared`
        characters of every prompt are evaluated once."""
        _check_shared(shared)
        params = self._generative_params(spec, "yes_no")
        if not prompts:
            return []
        activity = f"asking yes/no of {len(prompts)} prompt{'s' * (len(prompts) != 1)} of {os.path.basename(spec.path)}"
        return self._call(YesNoRequest(params, prompts, shared), timeout, activity, items=len(prompts))

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
        return self._call(RankRequest(params, query, documents), timeout, activity, items=len(documents))

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
        with self._lock:
            waiting = [job.lane for *_, job in self._queue if job.state == "queued"]
            busy = self._running
            recent = list(self._recent)
            searches = self._searches
        now = time.monotonic()
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
            "busy": None if busy is None else {"activity": busy.activity, "seconds": round(now - busy.started, 3)},
            "waiting": {lane: waiting.count(lane) for lane in _LANE_ORDER},
            "searches": searches,
            "hangs": self._hangs,
            "recent": recent,
            "deadlines": {
                "call_s": self.call_timeout,
                "item_s": self.item_timeout,
                "load_s": self.load_timeout,
                "start_s": self.start_timeout,
                "queue": self.queue_limit,
            },
        }

    def close(self, grace: float = 10.0) -> None:
        """Stop the child: politely (EOF) once in-flight work is done, or killed after `grace` seconds.

        Calls still waiting in line fail at once; new ones are refused.
        """
        with self._cond:
            self._closed = True
            for *_, job in self._queue:
                if job.state == "queued":
                    job.state, job.error = "done", InferenceError("the inference worker is shut down")
                    job.done.set()
            self._queue.clear()
            self._cond.notify_all()
            dispatcher = self._dispatcher
        if dispatcher is None or dispatcher is threading.current_thread():
            return
        dispatcher.join(timeout=grace)
        if dispatcher.is_alive():  # a request is stuck: its read ends at EOF, the dispatcher then stops
            proc = self._proc
            if proc is not None:
                proc.kill()
            dispatcher.join(timeout=grace)

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
            safe=os.path.realpath(spec.path) in self._safe,
        )

    def _generative_params(self, spec: ModelSpec, op: str) -> LoadParams:
        """Load parameters for an op that reads logits; an embedder or cross-encoder has none to read."""
        params = self._load_params(spec)
        if params.embedding:
            raise ValueError(
                f"{op}() needs a generative model; {os.path.basename(spec.path)} is run as an embedder or cross-encoder"
            )
        return params

    def _call(self, request: Request[R], timeout: float | None, activity: str, *, items: float = 1.0) -> R:
        """Queue one request for the child and wait for its result (module docstring: lanes, deadlines).

        `timeout` is the whole deadline once sent; None computes it from `items`
        (QMD_WORKER_TIMEOUT + QMD_WORKER_ITEM_TIMEOUT each, plus QMD_WORKER_LOAD_TIMEOUT when
        the request's model is not loaded yet).
        """
        exact = timeout is not None
        seconds = timeout if timeout is not None else self.call_timeout + self.item_timeout * max(items, 0.0)
        job = _Job(request, activity, seconds, exact, _lane.get())
        budget_end = _wait_until.get()
        if budget_end is not None and budget_end <= job.submitted:
            raise InferenceError(f"budget: no time left for {activity}")
        with self._cond:
            if self._closed:
                raise InferenceError("the inference worker is shut down")
            waiting = sum(1 for *_, j in self._queue if j.state == "queued")
            if waiting >= self.queue_limit:
                raise InferenceError(
                    f"the inference worker has {waiting} requests waiting (QMD_WORKER_QUEUE={self.queue_limit}); "
                    f"{activity} was not queued; retry"
                )
            heapq.heappush(self._queue, (_LANE_ORDER[job.lane], next(self._seq), job))
            job.times.append(time.time())
            if job.lane == "interactive" and self._yield is not None:
                self._yield.set(True)  # a background embed in flight answers now with what it has
            if self._dispatcher is None:
                self._dispatcher = threading.Thread(target=self._dispatch, name="qmd-inference", daemon=True)
                self._dispatcher.start()
            self._cond.notify_all()
        return self._await(job)

    def _await(self, job: _Job) -> Any:
        """Wait for `job`: in line at most QMD_WORKER_TIMEOUT (interactive), and never past `wait_at_most`."""
        budget_end = _wait_until.get()
        line_end = job.submitted + self.call_timeout if job.lane == "interactive" else None
        while True:
            with self._cond:
                if job.state == "done":
                    break
                queued = job.state == "queued"
                ends = [t for t in (budget_end, line_end if queued else None) if t is not None]
                limit = min(ends) if ends else None
                now = time.monotonic()
                if limit is not None and now >= limit:
                    job.state = "abandoned"  # the dispatcher skips it, or drops its answer
                    if queued:
                        self._recent.append(job.record("gave up in line"))
                    ahead = self._ahead(job) if queued else 0
                    busy = self._running
                    raise InferenceError(self._gave_up(job, now, queued, budget_end == limit, ahead, busy))
            job.done.wait(None if limit is None else limit - now)
        if job.error is not None:
            raise job.error
        return job.result

    def _ahead(self, job: _Job) -> int:
        """Calls that will go before `job` (the lock is held)."""
        key = next(k[:2] for k in self._queue if k[2] is job)
        return sum(1 for k in self._queue if k[:2] < key and k[2].state == "queued")

    def _gave_up(self, job: _Job, now: float, queued: bool, budget: bool, ahead: int, busy: _Job | None) -> str:
        """Why a caller stopped waiting, with what held the worker."""
        waited = now - job.submitted
        held = f"busy {busy.activity} for {now - busy.started:.1f} s" if busy is not None and busy is not job else ""
        if ahead:
            held += f"{', ' if held else ''}{ahead} request{'s' * (ahead != 1)} ahead"
        held = f" ({held})" if held else ""
        if budget:
            where = "in line" if queued else "for its answer"
            return f"budget: gave up {job.activity} after waiting {waited * 1000:.0f} ms {where}{held}"
        return (
            f"the inference worker did not take this request within {self.call_timeout:g} s{held}; "
            f"{job.activity} was not run; retry"
        )

    # -- the dispatcher thread: the only one that talks to the child --

    def _dispatch(self) -> None:
        """Serve the queue, interactive first, and free idle contexts; stop the child when closed."""
        try:
            while (job := self._take()) is not None:
                self._serve(job)
        finally:
            self._stop_child()

    def _take(self) -> _Job | None:
        """The next job to run (or an idle disposal of our own); None once closed."""
        with self._cond:
            while True:
                while self._queue and self._queue[0][2].state != "queued":
                    heapq.heappop(self._queue)
                now = time.monotonic()
                if self._queue and self._queue[0][2].lane == "background" and self._searches and not self._closed:
                    self._held_since = now if self._held_since is None else self._held_since
                    if (left := self._held_since + HOLD_S - now) > 0:
                        self._cond.wait(left)
                        continue
                if self._queue:
                    job = self._turn() or heapq.heappop(self._queue)[2]
                    if job.lane == "background":
                        if (job.owed or self._held_since is not None and self._searches) and isinstance(
                            job.request, EmbedRequest
                        ):
                            # its turn was owed or held its full HOLD_S: this slice runs to its end
                            job.request = dataclasses.replace(job.request, yield_after=None)
                        self._held_since = None
                        self._owed = self._owed if job.owed else 0.0  # uncontested: no credit or debt carries
                elif self._closed:
                    return None
                elif self._proc is None or not any(m.context_live for m in self._resident):
                    self._cond.wait()
                    continue
                elif (remaining := self._last_used + self.idle_seconds - now) > 0:
                    self._cond.wait(remaining)
                    continue
                else:
                    job = _Job(DisposeRequest(), "freeing idle contexts", DISPOSE_TIMEOUT, True, "background")
                job.state, job.started = "running", now
                job.times += [time.time()] * (2 - len(job.times))  # an idle disposal was never queued
                if self._yield is not None:  # no interactive call waits behind a background one it is given to
                    self._yield.set(False)
                self._running = job
                return job

    def _turn(self) -> _Job | None:
        """The oldest background call, taken out of line ahead of the interactive calls waiting,
        while the background lane has credit (the lock is held); else None."""
        if self._owed <= 0 or self._queue[0][2].lane == "background":  # none interactive waits
            return None
        waiting = [entry for entry in self._queue if entry[2].lane == "background" and entry[2].state == "queued"]
        if not waiting:
            self._owed = 0.0
            return None
        oldest = min(waiting)
        self._queue.remove(oldest)
        heapq.heapify(self._queue)
        oldest[2].owed = True
        return oldest[2]

    def _serve(self, job: _Job) -> None:
        """Run one job on the child and hand its outcome to its caller (if it is still waiting)."""
        result: Any = None
        error: BaseException | None = None
        try:
            result = self._run(job)
        except InferenceError as e:
            error = e
        except Exception as e:  # a bug here must fail this call, not stop the dispatcher
            log.exception("inference dispatcher: %s failed", job.activity)
            error = InferenceError(f"{job.activity} failed: {type(e).__name__}: {e}")
        with self._cond:
            self._running = None
            self._last_used = time.monotonic()
            if error is None:
                self._observe(job, self._last_used - job.started, result)
            waiting = any(j.lane == "background" and j.state == "queued" for *_, j in self._queue)
            if job.lane == "interactive" and waiting:
                self._owed += (self._last_used - job.started) * BACKGROUND_SHARE / (1 - BACKGROUND_SHARE)
            elif job.owed:
                self._owed -= self._last_used - job.started
            job.times.append(time.time())
            outcome = "failed" if error else _yielded(job.request, result) or "ok"
            self._recent.append(job.record(("gave up by its caller; " if job.state == "abandoned" else "") + outcome))
            if job.state == "running":
                job.state, job.result, job.error = "done", result, error
            elif error is not None:
                log.info("a request given up by its caller ended: %s", error)
            job.done.set()
            self._cond.notify_all()
        if isinstance(job.request, DisposeRequest) and isinstance(error, InferenceError):
            log.warning("%s", error.message)

    def _run(self, job: _Job) -> Any:
        """Start a child if there is none, then the round trip; a child that had died between
        requests (no receipt) is replaced and the request sent again, once."""
        if self._proc is not None and self._proc.poll() is not None:
            self._child_died("while idle")  # died between requests: nothing in flight to fail
        if isinstance(job.request, DisposeRequest) and self._proc is None:
            return None
        for attempt in (1, 2):
            if self._proc is None:
                self._start()
            seconds = job.seconds
            model = getattr(job.request, "model", None)
            if not job.exact and isinstance(model, LoadParams) and not self._holds(model):
                seconds += self.load_timeout
            try:
                stall = None if job.exact else self.call_timeout  # a caller's own deadline is wall time
                return self._exchange(job.request, seconds, job.activity, stall)
            except _NotDelivered as e:
                if attempt == 2:
                    raise InferenceError(f"{e}; {job.activity} was not run") from None
                log.warning("%s; sending %s to a new one", e, job.activity)
        raise AssertionError("unreachable")

    def _holds(self, model: LoadParams) -> bool:
        """Whether the child has this model loaded (as of its last reply)."""
        return any(m.path == model.path and m.role == model.role for m in self._resident)

    def _stop_child(self, grace: float = 10.0) -> None:
        """The dispatcher's last act: EOF to the child, then a kill if it has not exited within `grace`."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            assert proc.stdin is not None
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait()
        self._release_child()

    def _exchange(self, request: Request[Any] | None, timeout: float, activity: str, stall: float | None = None) -> Any:
        """Round trip on the current child (request None: just read the hello); dispatcher thread only.

        The call is hung at `timeout`, unless the child ticks its progress (`YieldFlag.tick`) and
        `stall` is given: then when it has not ticked for `stall` seconds (`_Watch`). A dead or
        stuck child fails this request only; one that was gone before its receipt raises `_NotDelivered`.
        """
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        watch = _Watch(time.monotonic(), timeout, stall, self._yield)
        received = request is None
        try:
            self._write(encode_frame(request) if request is not None else b"", watch)
            while True:
                (size,) = HEADER.unpack(self._read(HEADER.size, watch))
                if size or received:
                    break
                received = True  # the receipt (an empty frame): the child has the request
            reply: Reply = pickle.loads(self._read(size, watch))
        except (_ChildGone, BrokenPipeError):
            model = getattr(request, "model", None)
            if not received and not self._receipt_left():
                raise _NotDelivered(self._child_died("between requests")) from None
            loaded = model if isinstance(model, LoadParams) else None
            raise WorkerLost(self._child_died(f"while {activity}", model=loaded)) from None
        except TimeoutError:
            state = _process_state(proc.pid)
            proc.kill()
            proc.wait()
            self._hangs += 1
            took = time.monotonic() - watch.sent
            if watch.ticked is None:
                message = f"the inference worker did not answer within {timeout:g} s while {activity}"
            else:
                done = f"{watch.ticked} item{'s' * (watch.ticked != 1)} done in {took:.0f} s"
                ceiling = watch.ceiling - watch.sent
                stalled = took < ceiling
                stopped = f"made no progress for {stall:g} s" if stalled else f"did not finish within {ceiling:g} s"
                message = f"the inference worker {stopped} while {activity} ({done})"
            message += (
                f"{' (its process was stopped)' if state == 'T' else ''}; it was killed and a new one "
                "starts with the next request; retry"
            )
            self._child_died(f"while {activity}", message)
            raise WorkerLost(message) from None
        self._resident = reply.resident
        if reply.error is not None and reply.error.startswith(MODELS_MISSING):
            raise ModelsNotInstalled(models_missing_message(reply.error.removeprefix(MODELS_MISSING + ": ")))
        if reply.error is not None:
            raise InferenceError(f"{activity} failed: {reply.error}")
        return reply.result

    def _receipt_left(self) -> bool:
        """Whether a receipt waits unread in the pipe of a child that died while we were still writing."""
        try:
            return self._read(HEADER.size, _Watch(time.monotonic(), 0.0, None, None)) == RECEIPT
        except (_ChildGone, TimeoutError, OSError):
            return False

    def _write(self, frame: bytes, watch: _Watch) -> None:
        """All of `frame` into the child's stdin (non-blocking), or TimeoutError once `watch` says
        hung: a stopped child that reads nothing must not hold the dispatcher in a write."""
        assert self._proc is not None and self._proc.stdin is not None
        fd = self._proc.stdin.fileno()
        data = memoryview(frame)
        writable = select.poll()  # not select(): the daemon's fds may be numbered past FD_SETSIZE
        writable.register(fd, select.POLLOUT)
        while data:
            try:
                data = data[os.write(fd, data) :]
            except BlockingIOError:
                if not writable.poll(watch.left() * 1000) and not watch.left():
                    raise TimeoutError from None

    def _read(self, n: int, watch: _Watch) -> bytes:
        """Exactly n bytes of the child's stdout, or _ChildGone at EOF, or TimeoutError once `watch` says hung."""
        assert self._proc is not None and self._proc.stdout is not None and self._selector is not None
        fd = self._proc.stdout.fileno()
        chunks: list[bytes] = []
        while n:
            if not self._selector.select(watch.left()):
                if watch.left():  # the child ticked meanwhile: slow, not hung
                    continue
                raise TimeoutError
            chunk = os.read(fd, min(n, 1 << 20))
            if not chunk:
                raise _ChildGone
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _start(self) -> None:
        """Start a child and wait for its hello; dispatcher thread only (the child's parent for PR_SET_PDEATHSIG)."""
        # The same interpreter finds `qmd` the way this process did (the install's path entry or
        # editable finder). No PYTHONPATH is added: the `server/` folder on the path would let its
        # `http` package shadow the standard library's in the child.
        self.require_models()
        if self._yield is None:
            try:
                self._yield = YieldFlag.create()
            except OSError as e:  # no temporary file: background slices still bound a query's wait
                log.warning("no yield flag for the inference worker (%s): queries wait for embed slices", e)
        args = [
            *(["--force-cpu"] if self.force_cpu else []),
            f"--gpu={self.gpu}",
            f"--embed-parallelism={self.parallelism}",
            f"--parent={os.getpid()}",
            *([f"--yield-fd={self._yield.fd}"] if self._yield is not None else []),
        ]
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "qmd.server.models.worker_child", *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                pass_fds=() if self._yield is None else (self._yield.fd,),
            )
        except OSError as e:
            raise InferenceError(f"cannot start the inference worker: {e}") from None
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        os.set_blocking(proc.stdin.fileno(), False)
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
            hello: Hello = self._exchange(None, self.start_timeout, "starting")
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
                    log.log(self.native_log_level, "inference worker %d: %s", proc.pid, line)

    def _child_died(self, when: str, message: str | None = None, *, model: LoadParams | None = None) -> str:
        """Reap the child, record why it ended, and forget it so the next request starts a new one.

        `model`: the model of the call in flight. A native crash with it that repeats (the same
        signal twice) has the model loaded with llama.cpp's safe settings from then on; one
        that crashes even so gets the files and settings to try instead (`_recover`).
        """
        proc = self._proc
        assert proc is not None
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # EOF on stdout but still running: no longer usable
            proc.kill()
            code = proc.wait()
        if self._stderr_thread is not None:
            self._stderr_thread.join(timeout=2)  # the last lines often say why (GGML_ASSERT ...)
        name = signal.Signals(-code).name if code < 0 else None
        times, recovery = 0, None
        if message is None and name in NATIVE_SIGNALS and model is not None and not self._closed:
            times, recovery = self._recover(model, name)
        if message is None:
            if self._closed:
                message = f"the inference worker was shut down {when}"
            elif code < 0:
                message = f"the inference worker crashed ({name}) {when}; it will be restarted on the next request"
            else:
                message = (
                    f"the inference worker exited with status {code} {when}; it will be restarted on the next request"
                )
            message += f"; {recovery}" if recovery else ""
        self._last_crash = WorkerCrash(
            reason=message,
            exit_code=code,
            signal=name,
            at=time.time(),
            activity=when,
            model=model.path if model is not None else None,
            role=model.role if model is not None else None,
            times=times or 1,
            recovery=recovery,
            stderr_tail=list(self._stderr_tail)[-5:],
        )
        log.error("%s", message)
        self._release_child()
        return message

    def _recover(self, model: LoadParams, signal_name: str) -> tuple[int, str | None]:
        """Count a native crash of `model` and say what follows: the second of one kind has it
        loaded with llama.cpp's safe settings (`LoadParams.safe`); one under those settings
        names the files and settings left to try."""
        key = (model.path, signal_name)
        self._crashes[key] = times = self._crashes.get(key, 0) + 1
        file = os.path.basename(model.path)
        if model.safe:
            others = ", ".join(_plainer_files(model.path)) or "an F16 or F32 GGUF of the same model"
            return times, (
                f"{file} crashes even with llama.cpp's safe settings ({SAFE_SETTINGS}); "
                f"use another file of the model: {others} (plain kernels, no repacked weights)"
            )
        if times < 2:
            return times, None
        self._safe.add(model.path)
        return times, f"{file} crashed it {times} times: it is loaded next time {SAFE_SETTINGS}"

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


SAFE_SETTINGS = "without CPU repack buffers, memory mapping, flash attention or GPU offload"
"""What `LoadParams.safe` turns off, in words (`worker_child.LoadedModel`)."""
_QUANT = re.compile(r"[-._](?:I?Q\d\w*|B?F16|F32)(?=\.gguf$)", re.IGNORECASE)


def _plainer_files(path: str) -> list[str]:
    """Other files of the same model beside `path` whose weights llama.cpp runs with plain kernels
    (F16, BF16, F32): what to try when a quantized file crashes the worker however it is loaded."""
    folder, name = os.path.split(path)
    stem = _QUANT.sub("", name)
    try:
        names = sorted(os.listdir(folder or "."))
    except OSError:
        return []
    return [
        os.path.join(folder, other)
        for other in names
        if other != name
        and _QUANT.sub("", other) == stem
        and re.search(r"[-._](?:B?F16|F32)\.gguf$", other, re.IGNORECASE)
    ]


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


def _process_state(pid: int) -> str | None:
    """The one-letter state of a process (`T`: stopped), where /proc exists (Linux); None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None
