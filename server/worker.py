"""The inference worker: the only process that loads llama.cpp.

`qmdd` starts it as `python -m server.worker` (see `server.inference.Worker`) so that a
native crash in llama.cpp (a failed GGML_ASSERT aborts, a bad GGUF can segfault) kills
this child, never the daemon that answers keyword search.

Protocol: the child's stdin and stdout carry frames, each a 4-byte big-endian length
followed by a pickle. Pickle rather than JSON because a batch of vectors travels as one
float32 byte string (1.5 KB per MiniLM vector instead of ~8 KB of JSON text and a parse),
and both ends are this package talking over a private pipe, so nothing untrusted is
unpickled. Requests carry only builtins (dicts, lists, str, int), so the child never
imports the daemon's modules. The first frame is a hello with the backend facts; after
that each request gets exactly one reply, in order.

Everything the child or llama.cpp writes goes to stderr, which the parent forwards to
the daemon's log: the protocol keeps private duplicates of fds 0 and 1, and fd 1 itself is
pointed at stderr, so a stray native `printf` can never corrupt a frame.

This module's top level imports only the standard library: the daemon imports it for
`encode_frame`/`HEADER` and must not pull in llama_cpp.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import io
import os
import pickle
import signal
import struct
import sys
from typing import Any, BinaryIO

HEADER = struct.Struct(">I")
"""Frame header: the pickle's length in bytes."""

# ggml_log_level as this llama.cpp build numbers it (llama_cpp/_logger.py's table is stale:
# it maps real errors to DEBUG and drops them, and prints warnings as errors).
GGML_LOG_WARN, GGML_LOG_ERROR, GGML_LOG_CONT = 3, 4, 5


def encode_frame(message: dict[str, Any]) -> bytes:
    """One protocol frame: length header + pickle."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def read_frame(stream: BinaryIO) -> dict[str, Any] | None:
    """The next frame from a blocking stream, or None at a clean end of input (the parent closed the pipe)."""
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        return None
    (size,) = HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)


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


class Model:
    """One loaded GGUF: weights stay resident, the inference context comes and goes.

    llama-cpp-python's `Llama` owns a `LlamaModel` (weights) and a `LlamaContext`
    (compute buffers, KV cache). The context can be closed and a new one built on the
    same `LlamaModel` with the same parameters: no weights are re-read. This reaches into
    `Llama._ctx`, which is why llama-cpp-python is pinned; the tests check the rebuilt
    context gives identical vectors.
    """

    def __init__(self, params: dict[str, Any], n_gpu_layers: int) -> None:
        from llama_cpp import Llama

        self.params = params
        # verbose=True keeps llama-cpp-python from pointing fd 2 at /dev/null during the load,
        # so the native log (filtered to warnings and errors by `Server`) says why a load
        # failed; its own Python-level prints (system info, the metadata dict) are dropped.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            self.llm = Llama(
                model_path=params["path"],
                embedding=params["embedding"],
                n_ctx=params["n_ctx"],
                n_batch=params["n_batch"],
                n_ubatch=params["n_ubatch"],
                n_threads=params["n_threads"],
                n_threads_batch=params["n_threads"],
                n_gpu_layers=n_gpu_layers,
                flash_attn=True,
                verbose=True,
            )
        self.llm.verbose = False
        self.context_live = True
        self.tail = self._special_tail()

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
        """Free the compute buffers and KV cache; the weights and tokenizer stay loaded."""
        if self.context_live:
            self.llm._ctx.close()
            self.context_live = False

    def embed(self, texts: list[str]) -> dict[str, Any]:
        """L2-normalised vectors as float32 bytes, plus token counts and the indices that were clipped.

        One sequence per decode: on CPU, packing several sequences into one batch makes
        attention span the whole batch and is slower (models README), and it lets a
        sequence use the full context.
        """
        import llama_cpp
        import numpy as np

        self.ensure_context()
        llm = self.llm
        pooling = llm.pooling_type()
        if pooling not in (
            llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            llama_cpp.LLAMA_POOLING_TYPE_CLS,
            llama_cpp.LLAMA_POOLING_TYPE_LAST,
        ):
            raise ValueError(
                f"{os.path.basename(self.params['path'])} has pooling type {pooling}: not an embedding model"
            )
        n_embd = llm.n_embd()
        limit = min(llm.n_ctx(), llm.context_params.n_ubatch)
        out = np.empty((len(texts), n_embd), dtype=np.float32)
        n_tokens: list[int] = []
        clipped: list[int] = []
        for i, text in enumerate(texts):
            tokens = self.tokenize(text)
            n_tokens.append(len(tokens))
            if not tokens:  # add_sequence would write before the batch arrays
                raise ValueError(f"input {i} has no tokens and this tokenizer adds no special tokens")
            if len(tokens) > limit:
                tokens = tokens[: limit - self.tail] + tokens[len(tokens) - self.tail :]
                clipped.append(i)
            llm._batch.reset()
            llm._batch.add_sequence(tokens, 0, True)
            llm._ctx.kv_cache_clear()
            llm._ctx.decode(llm._batch)
            pointer = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)
            out[i] = np.ctypeslib.as_array(pointer, shape=(n_embd,))
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out /= np.where(norms > 0, norms, 1)
        llm._ctx.kv_cache_clear()
        return {"dims": n_embd, "vectors": out.tobytes(), "n_tokens": n_tokens, "clipped": clipped, "limit": limit}

    def close(self) -> None:
        """Free context and weights in llama.cpp's order (context first) before the process exits."""
        self.llm.close()


class Server:
    """The request loop's state: models by load key, and the GPU decision made once."""

    def __init__(self, force_cpu: bool) -> None:
        import llama_cpp

        self.native_error: str | None = None
        shown = False

        @llama_cpp.llama_log_callback
        def forward_native_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
            """Warnings and errors to stderr (the daemon's log); an error also goes into the reply."""
            nonlocal shown
            shown = shown if level == GGML_LOG_CONT else level >= GGML_LOG_WARN
            if shown:
                os.write(2, text)
            if level == GGML_LOG_ERROR and self.native_error is None:  # the first error names the cause
                self.native_error = text.decode("utf-8", "replace").strip()

        self._log_callback = forward_native_log  # ctypes must keep it alive as long as llama.cpp may call it
        llama_cpp.llama_log_set(forward_native_log, ctypes.c_void_p(0))
        self.gpu_supported = bool(llama_cpp.llama_supports_gpu_offload())
        self.n_gpu_layers = -1 if self.gpu_supported and not force_cpu else 0
        self.models: dict[tuple[Any, ...], Model] = {}
        self.hello = {
            "backend": "GPU" if self.n_gpu_layers else "CPU",
            "gpu_offload_supported": self.gpu_supported,
            "llama_cpp_version": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
        }

    def model(self, params: dict[str, Any]) -> Model:
        """The loaded model for these parameters, loading it on first use."""
        key = tuple(sorted(params.items()))
        if key not in self.models:
            self.models[key] = Model(params, self.n_gpu_layers)
        return self.models[key]

    def state(self) -> dict[str, Any]:
        """What is resident now, sent with every reply so the parent's `status()` never has to ask."""
        return {
            "models": [
                {"path": m.params["path"], "role": m.params["role"], "context_live": m.context_live}
                for m in self.models.values()
            ]
        }

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """One reply per request; Python-level failures are answered, not fatal."""
        self.native_error = None
        try:
            op = request["op"]
            if op == "embed":
                result: Any = self.model(request["model"]).embed(request["texts"])
            elif op == "count_tokens":
                model = self.model(request["model"])
                result = [model.count(t) for t in request["texts"]]
            elif op == "chunk":
                # Here, not in the daemon: the chunker measures with the model's tokenizer,
                # which lives in llama.cpp. Offsets only travel back; the parent slices.
                from .chunking import iter_chunks

                chunks = iter_chunks(
                    request["text"], max_tokens=request["max_tokens"], tokenizer=self.model(request["model"])
                )
                result = [(c.start, c.end, c.start_line, c.end_line, c.tokens, c.clipped) for c in chunks]
            elif op == "dispose":
                for m in self.models.values():
                    m.free_context()
                result = None
            else:
                raise ValueError(f"unknown request {op!r}")
        except Exception as e:  # the request failed; the worker and its models are still fine
            error = f"{type(e).__name__}: {e}" + (f" (llama.cpp: {self.native_error})" if self.native_error else "")
            return {"ok": False, "error": error, "state": self.state()}
        return {"ok": True, "result": result, "state": self.state()}

    def close(self) -> None:
        """Unload every model: a clean exit, so a shutdown is never mistaken for a crash in native code."""
        for m in self.models.values():
            m.close()


def main() -> None:
    """Serve requests until the parent closes stdin (or dies, which closes it too)."""
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
    server = Server(force_cpu="--force-cpu" in sys.argv[1:])
    try:
        replies.write(encode_frame({"ok": True, "result": server.hello, "state": server.state()}))
        replies.flush()
        while (request := read_frame(requests)) is not None:
            replies.write(encode_frame(server.handle(request)))
            replies.flush()
    except BrokenPipeError:  # the parent is gone: nobody to answer
        pass
    finally:
        server.close()


if __name__ == "__main__":
    main()
