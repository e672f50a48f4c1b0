"""What the daemon and its inference child say to each other: frames, and one typed message per operation.

Frames: each is a 4-byte big-endian length followed by a pickle. Pickle rather than JSON
because a batch of vectors travels as one float32 byte string (1.5 KB per MiniLM vector
instead of ~8 KB of JSON text and a parse), and both ends are this package talking over a
private pipe, so nothing untrusted is unpickled.

Messages are the frozen dataclasses below. This module imports only the standard library,
so the child can unpickle them without importing any daemon module (FastAPI, SQLite), and
the daemon can build them without importing llama_cpp. A request type names the type of its
result (`EmbedRequest` is a `Request[EmbedResult]`), so the parent's call returns what the
child's handler produced; the child maps each request type to its handler in one table,
`worker_child.OPERATIONS`. Adding an operation is a request type here, its row in that
table, and the parent's method that sends it.

The first frame the child sends is a `Reply` carrying a `Hello`; after that each request
gets a receipt (`RECEIPT`, an empty frame) as soon as the child starts reading it, then
exactly one `Reply`, in order. The receipt tells the parent which deaths to blame on a
request: a child gone before it sent one had died between requests, and the request goes
to a new child; after it, a death fails the request.

Beside the pipe, one page of shared memory, the `YieldFlag`, tells a background embed in
flight that an interactive call is waiting, and tells the parent how far the call in flight
has got (`YieldFlag.tick`): the pipe is read only between requests.
"""

from __future__ import annotations

import mmap
import pickle
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, Generic, Literal, NamedTuple, TypeVar

HEADER = struct.Struct(">I")
"""Frame header: the pickle's length in bytes."""
RECEIPT = HEADER.pack(0)
"""The child has started reading a request (an empty frame; no message pickles to zero bytes)."""

Role = Literal["embed", "rerank", "generate"]

R = TypeVar("R")


def encode_frame(message: object) -> bytes:
    """One protocol frame: length header + pickle."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def read_frame_body(stream: BinaryIO, started: Callable[[], None] | None = None) -> bytes | None:
    """The next frame's pickle, still packed, or None at a clean end of input (the parent closed the pipe).

    `started` is called once the frame's header has arrived (the child sends its receipt then).
    """
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    if started is not None:
        started()
    (size,) = HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        return None
    return body


def read_frame(stream: BinaryIO) -> Any:
    """The next message from a blocking stream, or None at a clean end of input."""
    body = read_frame_body(stream)
    return None if body is None else pickle.loads(body)


PROGRESS = struct.Struct("<Qd")
"""Where the child counts its progress in the shared page: items done so far, and the
`time.monotonic()` of the last (CLOCK_MONOTONIC is one clock for every process of the machine)."""


class YieldFlag:
    """One page the parent and child share: a byte raised while an interactive call waits for
    the worker, and the child's progress counter.

    A background embed reads the byte between its texts and, through llama.cpp's abort callback,
    between the graph nodes of a decode, so a query waits for about one node of the embed
    job's work instead of a whole request (`EmbedRequest.yield_after`). The child ticks the
    counter as it finishes each item of a call (a text, a document, a prompt, a generated
    token), so the parent tells a slow call (ticking) from a hung one (silent). The memory is an
    unlinked temporary file; the child maps the same descriptor, inherited (`--yield-fd`).
    """

    def __init__(self, fd: int, file: IO[bytes] | None = None) -> None:
        self.fd = fd
        self._file = file
        """The creator's handle, kept so the descriptor stays open as long as the flag lives."""
        self._map = mmap.mmap(fd, mmap.PAGESIZE)

    @classmethod
    def create(cls) -> YieldFlag:
        """A new flag, lowered (the parent's side)."""
        file = tempfile.TemporaryFile()
        file.truncate(mmap.PAGESIZE)
        return cls(file.fileno(), file)

    def set(self, raised: bool) -> None:
        self._map[0] = raised

    def is_set(self) -> bool:
        return self._map[0] != 0

    def tick(self, items: int = 1) -> None:
        """The child finished `items` more units of work (the child's side)."""
        done, _ = PROGRESS.unpack_from(self._map, 8)
        PROGRESS.pack_into(self._map, 8, done + items, time.monotonic())

    def progress(self) -> tuple[int, float]:
        """Items the child has finished since it started, and when it finished the last (0.0: none yet)."""
        done, at = PROGRESS.unpack_from(self._map, 8)
        return done, at


# --- values carried by requests ---


@dataclass(frozen=True)
class LoadParams:
    """Everything that decides a loaded model object, chosen by the parent where the GGUF metadata is.

    Hashable, because it is also the child's key for the loaded model: requests with equal
    parameters share one load.
    """

    role: Role
    path: str
    """The real path, so a symlink and its target are one model."""
    embedding: bool
    """Pooled output (an embedder or a cross-encoder) rather than logits."""
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    safe: bool = False
    """Load with llama.cpp's most conservative settings (no CPU repack buffers, no mmap, on the
    CPU): the parent asks for it once the model has crashed the worker twice the same way."""


@dataclass(frozen=True)
class GenerationParams:
    """How to sample a completion, chosen once by the caller (query expansion) and carried whole to llama.cpp.

    Temperature 0 is greedy, so the same prompt gives the same text. min_p (0) and
    repeat_penalty (1.0) are not here because they are fixed: see `LoadedModel.complete`.
    """

    max_tokens: int
    stop: list[str]
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 1.0
    seed: int = 0


# --- results ---


@dataclass(frozen=True)
class EmbedResult:
    """Vectors as one float32 byte string (the reason the frames are pickles), and what was clipped.

    A request that yielded (`EmbedRequest.yield_after`) answers for its first `len(n_tokens)`
    texts only; the parent sends the rest again.
    """

    dims: int
    vectors: bytes
    """Row-major float32, `dims` values per input answered, L2-normalised."""
    n_tokens: list[int]
    clipped: list[int]
    """Indices of the inputs longer than `limit` tokens, cut at the token level."""
    limit: int


class ChunkSpan(NamedTuple):
    """A chunk as offsets only: the parent has the text and slices it, so the text never travels back."""

    start: int
    end: int
    start_line: int
    end_line: int
    tokens: int
    clipped: bool


class Completion(NamedTuple):
    """Generated text and what it cost, so callers can log latency and budget tokens."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    """Wall time in the worker from tokenizing to the last token (no model load, no pipe)."""
    reused_tokens: int = 0
    """Prompt tokens restored from the kept state of an earlier call's shared prefix, not evaluated again."""


# --- requests: one type per operation, each naming its result type ---


class Request(Generic[R]):
    """A request whose reply carries an `R`; the parent's `_call` returns that type."""


@dataclass(frozen=True)
class EmbedRequest(Request[EmbedResult]):
    model: LoadParams
    texts: list[str]
    """Already in the model family's prompt format."""
    yield_after: int | None = None
    """A background request's: once this many texts are embedded, stop as soon as the parent
    raises its yield flag (an interactive call is waiting), even in the middle of a decode, and
    answer for the texts done so far. None: never stop early (an interactive request)."""


@dataclass(frozen=True)
class CountTokensRequest(Request[list[int]]):
    model: LoadParams
    texts: list[str]


@dataclass(frozen=True)
class ChunkRequest(Request[list[ChunkSpan]]):
    model: LoadParams
    text: str
    max_tokens: int
    language: str | None = None
    """A code file's grammar (`index.code_chunks`): cut at its syntax, not as prose."""


@dataclass(frozen=True)
class CompleteRequest(Request[Completion]):
    model: LoadParams
    prompt: str | None
    messages: list[dict[str, str]] | None
    """Rendered by the GGUF's chat template; exactly one of `prompt` and `messages` is set."""
    params: GenerationParams
    shared: int = 0
    """The part that repeats from call to call (instructions, examples): characters of `prompt`,
    or leading `messages`. The worker evaluates it once, keeps its state and reuses it, with
    bit-identical results."""


@dataclass(frozen=True)
class RenderChatRequest(Request[str]):
    model: LoadParams
    messages: list[dict[str, str]]


@dataclass(frozen=True)
class LikelihoodRequest(Request[list[float]]):
    model: LoadParams
    prefixes: list[str]
    continuation: str
    shared: int = 0
    """Leading characters of each prefix that repeat between prefixes and calls (a template's
    head): evaluated once and reused, as in `CompleteRequest.shared`."""


@dataclass(frozen=True)
class YesNoRequest(Request[list[float]]):
    model: LoadParams
    prompts: list[str]
    shared: int = 0
    """As `LikelihoodRequest.shared`."""


@dataclass(frozen=True)
class RankRequest(Request[list[float]]):
    model: LoadParams
    query: str
    documents: list[str]


@dataclass(frozen=True)
class DisposeRequest(Request[None]):
    """Free every inference context; the weights stay loaded (the parent's idle timer sends it)."""


# --- replies ---

MODELS_MISSING = "model support is not installed"
"""How the error of the child's first reply begins when it cannot import llama_cpp: qmd was
installed without its `models` extra. The child then exits; it has nothing to serve."""


class Resident(NamedTuple):
    """One model the child holds, and whether its context is live (the idle timer's business)."""

    path: str
    role: Role
    context_live: bool
    parallelism: int = 1
    """Contexts that embed in parallel (`QMD_EMBED_PARALLELISM`); 1 for everything but embed models."""
    load_seconds: float = 0.0
    """How long loading the weights took."""
    loaded_at: float = 0.0
    """When it was loaded (`time.time()`), so a client can tell the loads its request caused."""


@dataclass(frozen=True)
class Hello:
    """Backend facts the child reports once, at start, for `status` and `doctor`."""

    backend: Literal["GPU", "CPU"]
    gpu_offload_supported: bool
    llama_cpp_version: str
    system_info: str
    devices: tuple[str, ...] = ()
    """Every device this llama.cpp build sees: `name (description, kind, backend)`."""
    offload: str | None = None
    """Where layers go: the chosen devices (`QMD_LLAMA_GPU`), llama.cpp's own choice, or None on the CPU."""
    warnings: tuple[str, ...] = ()
    """Settings the child could not honour (a GPU backend this build lacks), said once."""


@dataclass(frozen=True)
class Reply:
    """The answer to one request: its result or why it failed, and what is resident now.

    `resident` rides on every reply so the parent's `status()` never has to ask (and never
    waits behind a request in flight).
    """

    result: Any
    error: str | None
    resident: tuple[Resident, ...]
