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
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from qmd.server.models.protocol import (
    MODELS_MISSING,
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
    encode_frame,
    read_frame,
)

if TYPE_CHECKING:
    import numpy as np
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

# ggml_log_level as this llama.cpp build numbers it (llama_cpp/_logger.py's table is stale:
# it maps real errors to DEBUG and drops them, and prints warnings as errors).
GGML_LOG_WARN, GGML_LOG_ERROR, GGML_LOG_CONT = 3, 4, 5

OUTPUT_ROWS = 32
"""Scored positions per decode in `LoadedModel._forward`. llama.cpp keeps an output buffer of one
vocabulary-sized row per output and never shrinks it: 32 rows of Gemma's 262k floats are
32 MiB, while a whole 512-token batch of outputs would pin 512 MiB."""


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

    def __init__(self, params: LoadParams, n_gpu_layers: int) -> None:
        from llama_cpp import Llama

        self.params = params
        # verbose=True keeps llama-cpp-python from pointing fd 2 at /dev/null during the load,
        # so the native log (filtered to warnings and errors by `WorkerProcess`) says why a load
        # failed; its own Python-level prints (system info, the metadata dict) are dropped.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            self.llm = Llama(
                model_path=params.path,
                embedding=params.embedding,
                n_ctx=params.n_ctx,
                n_batch=params.n_batch,
                n_ubatch=params.n_ubatch,
                n_threads=params.n_threads,
                n_threads_batch=params.n_threads,
                n_gpu_layers=n_gpu_layers,
                flash_attn=True,
                verbose=True,
            )
        self.llm.verbose = False
        self.context_live = True
        self.tail = self._special_tail()
        self._chat: Jinja2ChatFormatter | None = None
        self._yes_no: tuple[list[int], list[int]] | None = None

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

    def embed(self, texts: list[str]) -> EmbedResult:
        """L2-normalised vectors as float32 bytes, plus token counts and the indices that were clipped.

        One sequence per decode: on CPU, packing several sequences into one batch makes
        attention span the whole batch and is slower (models README), and it lets a
        sequence use the full context.
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
        return EmbedResult(dims=n_embd, vectors=out.tobytes(), n_tokens=n_tokens, clipped=clipped, limit=limit)

    # -- generative models: completion, likelihoods, yes/no, and rank pooling --

    def _begin(self) -> None:
        """Start from an empty KV cache, so no request sees (or reuses) another's tokens."""
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()

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
        self, prompt: str | None, messages: list[dict[str, str]] | None, params: GenerationParams
    ) -> Completion:
        """Generated text for a raw prompt (or chat messages rendered by the model's template).

        The prompt is tokenized here and handed over as tokens, so the length check below
        measures exactly what is evaluated. min_p is 0 so the sampling is what the caller
        named (llama-cpp-python would add its own 0.05); repeat_penalty stays 1.0 because a
        penalty punishes the format tokens the prompt's examples repeat (models README §2).
        """
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
        self._begin()
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
        )
        # create_completion is typed "a dict or an iterator of chunks"; without stream=True it is the dict.
        usage = out["usage"]  # type: ignore[index]
        return Completion(
            text=out["choices"][0]["text"],  # type: ignore[index]
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            seconds=time.perf_counter() - started,
        )

    def _forward(self, tokens: list[int], first_output: int) -> Iterator[Any]:
        """Decode `tokens` as one sequence from an empty cache; yield the logits of each position from `first_output`.

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
        self._begin()
        starts = [*range(0, first_output, llm.n_batch), *range(first_output, len(tokens), OUTPUT_ROWS)]
        for start, end in zip(starts, [*starts[1:], len(tokens)]):
            batch.n_tokens = end - start
            for j, pos in enumerate(range(start, end)):
                batch.token[j] = tokens[pos]
                batch.pos[j] = pos
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = pos >= first_output
            llm._ctx.decode(llm._batch)
            for j in range(max(first_output - start, 0), end - start):
                yield np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, j), shape=(n_vocab,))

    def likelihood(self, prefixes: list[str], continuation: str) -> list[float]:
        """Mean log P(continuation tokens | prefix) per prefix: query likelihood (UPR, models README §4).

        The continuation is tokenized without BOS and without special-token parsing (it is
        user text that follows the prefix). Positions from the prefix's last token to the
        continuation's second-to-last are decoded with logits: row i predicts continuation
        token i, so the last continuation token itself is never evaluated.
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
            rows = self._forward(tokens + target[:-1], len(tokens) - 1)
            for token, row in zip(target, rows, strict=True):
                total += float(row[token]) - _logsumexp(np.asarray(row, dtype=np.float64))
            scores.append(total / len(target))
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

    def yes_no(self, prompts: list[str]) -> list[float]:
        """P(yes) / (P(yes) + P(no)) at the position after each prompt (qmd's generative reranker formula).

        Each side is the logsumexp of its single-token variants (" yes" and "yes"), so the
        answer counts whether or not the model would put a space first. The softmax
        normaliser cancels, so raw logits suffice: the ratio is sigmoid(lse(yes) - lse(no)).
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
            (row,) = self._forward(tokens, len(tokens) - 1)
            logits = np.asarray(row, dtype=np.float64)
            scores.append(_sigmoid(_logsumexp(logits[yes]) - _logsumexp(logits[no])))
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
        llm._ctx.kv_cache_clear()
        return scores

    def close(self) -> None:
        """Free context and weights in llama.cpp's order (context first) before the process exits."""
        self.llm.close()


class WorkerProcess:
    """The child's request loop state: models by load parameters, and the GPU decision made once."""

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
        gpu_supported = bool(llama_cpp.llama_supports_gpu_offload())
        self.n_gpu_layers = -1 if gpu_supported and not force_cpu else 0
        self.models: dict[LoadParams, LoadedModel] = {}
        self.hello = Hello(
            backend="GPU" if self.n_gpu_layers else "CPU",
            gpu_offload_supported=gpu_supported,
            llama_cpp_version=llama_cpp.__version__,
            system_info=llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
        )

    def model(self, params: LoadParams) -> LoadedModel:
        """The loaded model for these parameters, loading it on first use."""
        if params not in self.models:
            self.models[params] = LoadedModel(params, self.n_gpu_layers)
        return self.models[params]

    def dispose(self) -> None:
        """Free every context (the parent's idle timer asks); weights stay, so the next request is fast."""
        for m in self.models.values():
            m.free_context()

    def reply(self, result: object = None, error: str | None = None) -> Reply:
        """A reply with what is resident now attached."""
        resident = tuple(Resident(m.params.path, m.params.role, m.context_live) for m in self.models.values())
        return Reply(result=result, error=error, resident=resident)

    def handle(self, request: Request[Any]) -> Reply:
        """One reply per request; Python-level failures are answered, not fatal."""
        self.native_error = None
        try:
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
    from qmd.server.index.chunking import iter_chunks

    chunks = iter_chunks(request.text, max_tokens=request.max_tokens, tokenizer=process.model(request.model))
    return [ChunkSpan(c.start, c.end, c.start_line, c.end_line, c.tokens, c.clipped) for c in chunks]


Q = TypeVar("Q", bound=Request[Any])
Handler = Callable[[WorkerProcess, Any], object]


def _operation(kind: type[Q], handler: Callable[[WorkerProcess, Q], object]) -> tuple[type[Request[Any]], Handler]:
    """One row of `OPERATIONS`; going through here lets mypy check each handler against its request type."""
    return kind, handler


OPERATIONS: dict[type[Request[Any]], Handler] = dict(
    [
        _operation(EmbedRequest, lambda w, r: w.model(r.model).embed(r.texts)),
        _operation(CountTokensRequest, lambda w, r: [w.model(r.model).count(t) for t in r.texts]),
        _operation(ChunkRequest, _chunk),
        _operation(CompleteRequest, lambda w, r: w.model(r.model).complete(r.prompt, r.messages, r.params)),
        _operation(RenderChatRequest, lambda w, r: w.model(r.model).render_chat(r.messages)),
        _operation(LikelihoodRequest, lambda w, r: w.model(r.model).likelihood(r.prefixes, r.continuation)),
        _operation(YesNoRequest, lambda w, r: w.model(r.model).yes_no(r.prompts)),
        _operation(RankRequest, lambda w, r: w.model(r.model).rank(r.query, r.documents)),
        _operation(DisposeRequest, lambda w, r: w.dispose()),
    ]
)
"""The worker's operations: each request type (`protocol`) and the handler that answers it."""


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
    try:
        process = WorkerProcess(force_cpu="--force-cpu" in sys.argv[1:])
    except ImportError as e:  # qmd without its `models` extra: say so, rather than die with a traceback
        replies.write(encode_frame(Reply(result=None, error=f"{MODELS_MISSING}: {e}", resident=())))
        replies.flush()
        return
    try:
        replies.write(encode_frame(process.reply(process.hello)))
        replies.flush()
        while (request := read_frame(requests)) is not None:
            replies.write(encode_frame(process.handle(request)))
            replies.flush()
    except BrokenPipeError:  # the parent is gone: nobody to answer
        pass
    finally:
        process.close()


if __name__ == "__main__":
    main()
