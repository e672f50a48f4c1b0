"""OpenAI-compatible endpoints as models: `/v1/embeddings` for the embed role,
`/v1/chat/completions` for the generate role (query expansion), and a rerank endpoint for
the rerank role (`RemoteReranker`: `/v1/rerank` as llama.cpp's server, vLLM, Jina and Cohere
serve it, or TEI's `/rerank`).

llama.cpp's server, Ollama, vLLM, llama-cpp-python's `llama_cpp.server` and OpenAI itself
all answer both in OpenAI's shapes, so one small client covers them. What the local worker
learns from the GGUF file has to be decided here instead:

- **Tokens.** No tokenizer is reachable, so chunks are measured with a conservative
  character estimate (`CharEstimateTokenizer`); the estimate's parameters are part of
  the vector space's identity, like the chunker version.
- **Dimensions.** Asked of the endpoint once, with a short probe, when the embedder is
  resolved.
- **Prompt format.** A chat endpoint applies its model's own chat template, so expansion
  sends chat messages (`search.expansion.build_prompt` with a template), never a raw prompt.
- **Identity.** The endpoint and the model name: nothing else is knowable about a
  remote model, so switching either starts a new vector space, and cached expansions
  are keyed by both (the model URI). The API key is never part of it (rotating a key
  must not re-embed anything), never logged, never put in a message.
- **Scale.** Vectors come back at whatever length the server likes (llama-cpp-python
  does not normalise); they are normalised here, so cosine scores mean the same as
  the local worker's.

Failures are `RemoteEmbedError`s / `RemoteGenerateError`s / `RemoteRerankError`s that name the endpoint and say
what to do. 429 and 5xx answers, read timeouts and dropped connections are retried with
backoff (longer for the embed job than for a probe or a query, which have a person
waiting); a connection that cannot be opened is not (the server is not running or not
reachable: waiting will not change that, and a search should fall back at once). A
generation or a rerank call has one deadline for all its attempts, its own timeout or the
query's budget (`worker.wait_at_most`), whichever ends first: a retry never outlives the budget.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import httpx

from qmd.server.errors import Unavailable
from qmd.server.models.protocol import GenerationParams
from qmd.server.models.refs import OPENAI_ENDPOINT
from qmd.server.models.worker import Embeddings, _wait_until, format_document
from qmd.server.text.chunking import CharEstimateTokenizer, Chunk
from qmd.server.text.split import split

log = logging.getLogger("qmd.remote")

CHARS_PER_TOKEN = 3.0
"""Conservative for prose and code (English BPE/WordPiece averages ~4): an estimate
that errs high keeps chunks inside what the remote model reads."""
SPECIAL_TOKENS = 2
"""Room for the [CLS]/[SEP] or BOS/EOS the server adds around each input."""
CHUNK_TOKENS = 512
"""The remote model's context is unknown: 512 is the smallest common one (BERT-family
embedders such as bge, e5, mxbai, MiniLM's GGUF), and larger models read it whole."""
BATCH = 32
"""Inputs per request: well under every server's limit (OpenAI: 2048), and small
enough that one slow request does not hold the job's progress for long."""
JOB_ATTEMPTS = 4
"""An embed job can wait out a busy server: every completed batch is kept anyway."""
INTERACTIVE_ATTEMPTS = 2
"""A probe (run by `status`), a query embedding or an expansion has a person waiting: fail soon."""
BACKOFF_SECONDS = 0.5
"""First retry delay, doubled per attempt (0.5, 1, 2 s) unless the server sends Retry-After."""
MAX_RETRY_AFTER = 30.0
TIMEOUT = httpx.Timeout(60.0, connect=5.0)
"""Generous read timeout: Ollama loads the model on the first request."""
INTERACTIVE_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
GENERATE_TIMEOUT_S = 20.0
"""All attempts of one expansion together. A small expansion model answers in about a
second; 20 s leaves room for Ollama loading the model on the first query, and a hung
server costs a query no more than that (a budget, when set, ends it sooner)."""
TIMEOUT_VAR = "QMD_GENERATE_TIMEOUT"
"""Seconds instead of `GENERATE_TIMEOUT_S`: a CPU-only server running a large model is slower."""
RERANK_TIMEOUT_S = 20.0
"""All attempts of one rerank call (a few passages: `search.hybrid.RERANK_BATCH`). A
cross-encoder scores them in well under a second; the rest is room for a server loading
its model on the first query, as for expansion."""
RERANK_TIMEOUT_VAR = "QMD_RERANK_TIMEOUT"
GENERATE_CONNECT_S = 3.0
"""Opening a connection to a running server takes milliseconds; longer means it is not there."""
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
PROBE_TEXT = "qmd embedding dimension probe"
KEY_VARS = ("QMD_EMBED_API_KEY", "OPENAI_API_KEY")
GENERATE_KEY_VARS = ("QMD_GENERATE_API_KEY", "OPENAI_API_KEY")
RERANK_KEY_VARS = ("QMD_RERANK_API_KEY",)
"""OpenAI serves no rerank endpoint, so `OPENAI_API_KEY` has no place to go here."""
LLAMA_SAMPLING = {"min_p": 0.0, "repeat_penalty": 1.0}
"""The sampling the local worker fixes (`LoadedModel.complete`), for llama.cpp-family servers
whose own defaults differ (llama-cpp-python: min_p 0.05, repeat_penalty 1.1); servers that do
not know a field ignore it. OpenAI's API refuses unknown fields, so it gets only OpenAI's."""

Kind = Literal["query", "document"]


class RemoteEmbedError(Unavailable):
    """The embeddings endpoint could not be used; the message names it and says why."""


class RemoteGenerateError(Unavailable):
    """The chat completions endpoint could not be used; the message names it and says why."""


class RemoteRerankError(Unavailable):
    """The rerank endpoint could not be used; the message names it and says why."""


def api_key(
    endpoint: str, environ: Mapping[str, str] = os.environ, key_vars: tuple[str, ...] = KEY_VARS
) -> tuple[str | None, str | None]:
    """The key to send and the variable it came from (for messages; the value is never shown).

    The role's own variable (`QMD_EMBED_API_KEY`, `QMD_GENERATE_API_KEY`) goes to whichever
    endpoint is configured. `OPENAI_API_KEY` goes only to OpenAI's own endpoint: sending it
    to another host (a LAN Ollama over plain http, a third-party proxy) would hand the user's
    OpenAI credentials to a server that was never meant to see them.
    """
    for var in key_vars:
        if var == "OPENAI_API_KEY" and endpoint != OPENAI_ENDPOINT:
            continue
        value = environ.get(var, "").strip()
        if value:
            return value, var
    return None, None


@dataclass(frozen=True)
class Deadline:
    """When a request must be answered (`time.monotonic()`), and what set it: the query's
    budget, or the client's own timeout of `seconds`."""

    until: float
    budget: bool
    seconds: float

    def left(self) -> float:
        return self.until - time.monotonic()

    @classmethod
    def interactive(cls, seconds: float) -> Deadline:
        """`seconds` from now, or the query's budget (`worker.wait_at_most`) when that ends first."""
        own = time.monotonic() + seconds
        budget = _wait_until.get()
        if budget is not None and budget < own:
            return cls(budget, True, budget - time.monotonic())
        return cls(own, False, seconds)


def timeout_setting(environ: Mapping[str, str], var: str, default: float, error: type[Unavailable]) -> float:
    """Seconds from `var`, else `default`; a bad value is refused, never replaced by the default
    (a typo would otherwise silently keep the old limit)."""
    raw = environ.get(var, "").strip()
    try:
        seconds = float(raw) if raw else default
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise error(f"{var} must be a positive number of seconds, got {raw!r}")
    return seconds


class _Endpoint:
    """One OpenAI-compatible API base and model: the key, the connection pool, retries and
    the messages of failures, shared by the embed and generate clients. Safe to share
    between threads (httpx.Client is)."""

    what: ClassVar[str]
    """How messages name the endpoint (`embeddings endpoint`)."""
    error: ClassVar[type[Unavailable]]
    key_vars: ClassVar[tuple[str, ...]]

    def __init__(self, endpoint: str, model: str | None, environ: Mapping[str, str]) -> None:
        """Checks what can be checked without a request: a model name, and a key for OpenAI."""
        if not model:
            raise self.error(f"the {self.what} {endpoint} needs a model name: write it as {endpoint}#<model>")
        self.endpoint = endpoint
        self.model = model
        self._key, self._key_var = api_key(endpoint, environ, self.key_vars)
        self._openai_key_withheld = endpoint != OPENAI_ENDPOINT and bool(environ.get("OPENAI_API_KEY", "").strip())
        if self._key is None and endpoint == OPENAI_ENDPOINT:
            raise self.error(f"openai:{model} needs an API key: set {self.key_vars[0]} or OPENAI_API_KEY")
        headers = {"User-Agent": "qmd"}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key}"
        self._client = httpx.Client(headers=headers)

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()

    def _post(
        self, path: str, body: dict[str, Any], *, attempts: int, timeout: httpx.Timeout, deadline: Deadline | None
    ) -> httpx.Response:
        """One call, retried on transient failures; the 200 answer, or an error naming the endpoint."""
        url = f"{self.endpoint}{path}"
        where = f"the {self.what} {self.endpoint}"
        for attempt in range(1, attempts + 1):
            last = attempt == attempts
            limit = timeout
            if deadline is not None:
                left = deadline.left()
                if left <= 0:
                    raise self.error(self._late(deadline, attempt - 1))
                limit = httpx.Timeout(min(timeout.read or left, left), connect=min(timeout.connect or left, left))
            try:
                resp = self._client.post(url, json=body, timeout=limit)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                raise self.error(f"cannot reach {where} ({_reason(e)}): is the server running?") from None
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as e:
                if deadline is not None and deadline.left() <= 0:
                    raise self.error(self._late(deadline, attempt)) from None
                if last:
                    raise self.error(f"{where} did not answer ({_reason(e)}) after {attempts} attempts") from None
                self._wait(attempt, None, deadline)
                continue
            except httpx.HTTPError as e:
                raise self.error(f"the request to {where} failed: {_reason(e)}") from None
            if resp.status_code in RETRY_STATUSES and not last:
                log.warning("%s answered %d; retrying (%d/%d)", where, resp.status_code, attempt, attempts - 1)
                self._wait(attempt, resp.headers.get("retry-after"), deadline)
                continue
            if resp.status_code != 200:
                raise self.error(self._status_message(resp, attempts))
            return resp
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _late(self, deadline: Deadline, attempts: int) -> str:
        """Why a request with a deadline gave up; a budget's reason starts `budget:` like the worker's."""
        tries = f" ({attempts} attempt{'s' * (attempts != 1)})" if attempts else ""
        if deadline.budget:
            return f"budget: gave up waiting for the {self.what} {self.endpoint}{tries}"
        return f"the {self.what} {self.endpoint} did not answer within {deadline.seconds:g} s{tries}"

    def _wait(self, attempt: int, retry_after: str | None, deadline: Deadline | None) -> None:
        """Back off before the next attempt, as the server asks when it says, never past the deadline."""
        delay = BACKOFF_SECONDS * 2 ** (attempt - 1)
        if retry_after is not None:
            try:
                delay = float(retry_after)
            except ValueError:
                pass  # an HTTP date: keep the exponential delay
        cap = MAX_RETRY_AFTER if deadline is None else max(min(MAX_RETRY_AFTER, deadline.left()), 0.0)
        time.sleep(min(max(delay, 0.0), cap))

    def _status_message(self, resp: httpx.Response, attempts: int) -> str:
        """What an error status means for the user, with the server's own words."""
        code, said = resp.status_code, self._server_said(resp)
        where = f"the {self.what} {self.endpoint}"
        if code in (401, 403):
            if self._key_var is None:
                withheld = " (OPENAI_API_KEY is sent only to api.openai.com)" if self._openai_key_withheld else ""
                return f"{where} requires an API key ({code}{said}): set {self.key_vars[0]}{withheld}"
            return f"{where} refused the API key in {self._key_var} ({code}{said})"
        if code == 404:
            return f"{where} answered 404{said}: it does not serve the model {self.model!r}, or {self._not_found()}"
        if code in RETRY_STATUSES:
            return f"{where} kept failing ({code}{said}) after {attempts} attempts"
        return f"{where} rejected the request ({code}{said})"

    def _not_found(self) -> str:
        """The other reason for a 404: the URI is not what the client takes it for."""
        return "it is not an OpenAI-compatible API base (that usually ends in /v1)"

    def _server_said(self, resp: httpx.Response) -> str:
        """`: <message>` from the error body (OpenAI, FastAPI and plain-text shapes), short, key redacted."""
        try:
            payload: Any = resp.json()
        except ValueError:
            payload = resp.text
        if isinstance(payload, dict):
            error = payload.get("error")
            payload = (
                error.get("message")
                if isinstance(error, dict)
                else error or payload.get("detail") or payload.get("message")
            )
        text = " ".join(str(payload or "").split())[:200]
        if self._key:
            text = text.replace(self._key, "***")
        return f": {text}" if text else ""


class RemoteBackend(_Endpoint):
    """Chunks in-process and embeds over HTTP."""

    what = "embeddings endpoint"
    error = RemoteEmbedError
    key_vars = KEY_VARS

    def __init__(self, endpoint: str, model: str | None, *, environ: Mapping[str, str] = os.environ) -> None:
        super().__init__(endpoint, model, environ)
        self._tokenizer = CharEstimateTokenizer(CHARS_PER_TOKEN, SPECIAL_TOKENS)
        self.dims: int | None = None

    @property
    def identity(self) -> str:
        """What names the vector space this backend writes (the caller adds chunker version
        and chunk size). Only valid after `probe`: the dimensions are part of it, so a
        different model served under the same name cannot land in the old space."""
        return (
            f"remote:{self.endpoint}\nmodel:{self.model}\ndims:{self.dims}\nformat:titled\n"
            f"tokens:chars/{CHARS_PER_TOKEN}+{SPECIAL_TOKENS}"
        )

    def probe(self) -> int:
        """Learn (once) how many dimensions the model answers with."""
        if self.dims is None:
            self.dims = len(self._request([PROBE_TEXT], interactive=True)[0])
            log.info(
                "embed model %s at %s: %d dimensions (API key: %s)",
                self.model,
                self.endpoint,
                self.dims,
                self._key_var or "none",
            )
        return self.dims

    def chunk(self, text: str, max_tokens: int, language: str | None = None) -> list[Chunk]:
        """`qmd.server.text.chunking` chunks measured by the character estimate (no tokenizer is reachable)."""
        return list(split(text, max_tokens=max_tokens, tokenizer=self._tokenizer, language=language))

    def embed(self, texts: list[str], kind: Kind, titles: list[str | None] | None = None) -> Embeddings:
        """Unit vectors for `texts`, in order, `BATCH` per request.

        No prompt prefix is added (the plain format): the model family behind an endpoint
        is unknown, and a prefix a model never saw only adds noise. A document chunk's
        context (`titles`) leads it as a line of text, as for a local plain model; `kind`
        otherwise only picks how long to retry (a query has a person waiting). An input
        whose estimate exceeds `CHUNK_TOKENS` is reported clipped, as the server will
        likely cut it.
        """
        if titles is not None:
            texts = [format_document("plain", t, titles[i]) for i, t in enumerate(texts)]
        vectors: list[list[float]] = []
        for i in range(0, len(texts), BATCH):
            vectors.extend(self._request(texts[i : i + BATCH], interactive=kind == "query"))
        n_tokens = [self._tokenizer.count(t) for t in texts]
        clipped = tuple(i for i, n in enumerate(n_tokens) if n > CHUNK_TOKENS)
        return Embeddings(vectors, clipped=clipped, n_tokens=n_tokens, limit=CHUNK_TOKENS)

    def _request(self, texts: list[str], *, interactive: bool) -> list[list[float]]:
        """One `/embeddings` call, answered as unit vectors."""
        resp = self._post(
            "/embeddings",
            {"model": self.model, "input": texts},
            attempts=INTERACTIVE_ATTEMPTS if interactive else JOB_ATTEMPTS,
            timeout=INTERACTIVE_TIMEOUT if interactive else TIMEOUT,
            deadline=None,
        )
        return self._parse(resp, len(texts))

    def _parse(self, resp: httpx.Response, n: int) -> list[list[float]]:
        """The vectors of an OpenAI-shaped answer, in input order, at unit length."""
        try:
            data = resp.json()["data"]
        except (ValueError, KeyError, TypeError):
            raise self._shape(
                f"no JSON 'data' list in the answer ({resp.headers.get('content-type', 'no type')})"
            ) from None
        if not isinstance(data, list) or len(data) != n:
            raise self._shape(f"{len(data) if isinstance(data, list) else 'no'} embeddings for {n} inputs")
        vectors: list[list[float] | None] = [None] * n
        for pos, item in enumerate(data):
            if not isinstance(item, dict):
                raise self._shape("an entry of 'data' is not an object")
            index, values = item.get("index", pos), item.get("embedding")
            if not isinstance(index, int) or not 0 <= index < n or vectors[index] is not None:
                raise self._shape(f"bad or repeated index {index!r}")
            if (
                not isinstance(values, list)
                or not values
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            ):
                raise self._shape("an embedding is not a list of numbers")
            norm = math.sqrt(math.fsum(float(v) * float(v) for v in values))
            if not math.isfinite(norm) or norm == 0.0:
                raise self._shape("an embedding is zero or not finite")
            vectors[index] = [float(v) / norm for v in values]
        dims = {len(v) for v in vectors if v is not None}
        if len(dims) != 1 or (self.dims is not None and dims != {self.dims}):
            raise self._shape(
                f"embeddings of {sorted(dims)} dimensions where {self.dims or 'one size'} was expected "
                "(a different model behind the same name? restart qmdd to re-probe)"
            )
        return [v for v in vectors if v is not None]

    def _shape(self, what: str) -> RemoteEmbedError:
        return RemoteEmbedError(
            f"the embeddings endpoint {self.endpoint} sent an answer that is not an OpenAI embeddings response: {what}"
        )


class _QueryEndpoint(_Endpoint):
    """An endpoint a query waits on (generate, rerank): one deadline for all attempts of a
    call, its own timeout (read from `timeout_var` at start) or the query's budget."""

    timeout_var: ClassVar[str]
    default_timeout_s: ClassVar[float]

    def __init__(self, endpoint: str, model: str | None, *, environ: Mapping[str, str] = os.environ) -> None:
        """Also reads `timeout_var`: a bad value is refused here, not replaced by the default."""
        super().__init__(endpoint, model, environ)
        self.timeout_s = timeout_setting(environ, self.timeout_var, self.default_timeout_s, self.error)

    def _ask(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """`_post` within this client's timeout and the query's budget (`wait_at_most`), whichever ends first."""
        timeout = httpx.Timeout(self.timeout_s, connect=GENERATE_CONNECT_S)
        deadline = Deadline.interactive(self.timeout_s)
        return self._post(path, body, attempts=INTERACTIVE_ATTEMPTS, timeout=timeout, deadline=deadline)


class RemoteGenerator(_QueryEndpoint):
    """A generate model behind `POST <base>/chat/completions`: messages in, the first choice's text out."""

    what = "chat completions endpoint"
    error = RemoteGenerateError
    key_vars = GENERATE_KEY_VARS
    timeout_var = TIMEOUT_VAR
    default_timeout_s = GENERATE_TIMEOUT_S

    def chat(self, messages: list[dict[str, str]], params: GenerationParams) -> str:
        """The reply to `messages`, sampled as `params` says, within this client's timeout and
        the query's budget (`wait_at_most`), whichever ends first."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": params.seed,
            "stream": False,
        }
        if params.stop:
            body["stop"] = params.stop
        if self.endpoint != OPENAI_ENDPOINT:
            body.update(top_k=params.top_k, **LLAMA_SAMPLING)
        return self._text(self._ask("/chat/completions", body))

    def _text(self, resp: httpx.Response) -> str:
        """The first choice's message content of an OpenAI-shaped answer."""
        try:
            payload = resp.json()
        except ValueError:
            raise self._shape(f"no JSON in the answer ({resp.headers.get('content-type', 'no type')})") from None
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._shape("no 'choices' list")
        message = choices[0].get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            raise self._shape("the first choice has no message text")
        return content

    def _shape(self, what: str) -> RemoteGenerateError:
        return RemoteGenerateError(
            f"the chat completions endpoint {self.endpoint} sent an answer that is not an OpenAI chat completion: "
            f"{what}"
        )


RerankFormat = Literal["jina", "tei"]
"""`jina`: `{model, query, documents, top_n}` → `{results: [{index, relevance_score}]}`, as
llama.cpp's server, vLLM, Jina, Cohere (v1 and v2) and LocalAI take it. `tei`: `{query, texts,
truncate}` → `[{index, score}]`, Hugging Face text-embeddings-inference, which serves one model
and takes no name."""
FORMAT_LABELS: dict[RerankFormat, str] = {"jina": "Jina/Cohere-style /rerank", "tei": "TEI /rerank"}


def rerank_format(endpoint: str) -> RerankFormat:
    """The URI chooses: an API base with a path (`http://host:8080/v1`, like the other roles)
    speaks the Jina/Cohere shape that llama.cpp's server, vLLM, Jina and Cohere share; a bare
    `http://host:port` is TEI, which serves `/rerank` at its root and nothing under `/v1`.
    Probing instead would spend a request per daemon start and guess wrong on a server
    that accepts both (llama.cpp answers TEI's request in TEI's shape)."""
    return "jina" if httpx.URL(endpoint).path.strip("/") else "tei"


class RemoteReranker(_QueryEndpoint):
    """A rerank model behind `POST <endpoint>/rerank`: a query and passages in, one raw score
    per passage out, in input order (the server's own scale; `search.rerank` maps logits to [0, 1])."""

    what = "rerank endpoint"
    error = RemoteRerankError
    key_vars = RERANK_KEY_VARS
    timeout_var = RERANK_TIMEOUT_VAR
    default_timeout_s = RERANK_TIMEOUT_S

    def __init__(self, endpoint: str, model: str | None, *, environ: Mapping[str, str] = os.environ) -> None:
        """Also picks the wire format from the URI."""
        super().__init__(endpoint, model, environ=environ)
        self.format = rerank_format(endpoint)
        # Set once an answer comes from llama.cpp's server (its `Server` header, or the
        # `"object": "list"` no other rerank server sends): it sends the head's raw logit.
        self.sends_logits = False
        # Set by the first well-formed answer: what the endpoint says of itself has been heard.
        self.answered = False

    def rerank(self, query: str, documents: list[str]) -> list[float]:
        """One score per document, within this client's timeout and the query's budget, whichever ends first."""
        if not documents:
            return []
        body: dict[str, Any]
        if self.format == "jina":
            body = {"model": self.model, "query": query, "documents": documents, "top_n": len(documents)}
        else:
            body = {"query": query, "texts": documents, "truncate": True}
        return self._scores(self._ask("/rerank", body), len(documents))

    def _scores(self, resp: httpx.Response, n: int) -> list[float]:
        """The scores of either shape (TEI's list, or a `results` object), placed by `index`."""
        try:
            payload = resp.json()
        except ValueError:
            raise self._shape(f"no JSON in the answer ({resp.headers.get('content-type', 'no type')})") from None
        items = payload.get("results") if isinstance(payload, dict) else payload
        self.sends_logits = self.sends_logits or (
            resp.headers.get("server", "").startswith("llama.cpp")
            or (isinstance(payload, dict) and payload.get("object") == "list")
        )
        if not isinstance(items, list):
            raise self._shape("no 'results' list")
        if len(items) != n:
            raise self._shape(f"{len(items)} scores for {n} passages")
        scores: list[float | None] = [None] * n
        for item in items:
            index = item.get("index") if isinstance(item, dict) else None
            value = item.get("relevance_score", item.get("score")) if isinstance(item, dict) else None
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n or scores[index] is not None:
                raise self._shape(f"bad or repeated index {index!r}")
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise self._shape(f"the score of passage {index} is not a finite number")
            scores[index] = float(value)
        self.answered = True
        return [s for s in scores if s is not None]

    def _shape(self, what: str) -> RemoteRerankError:
        label = FORMAT_LABELS[self.format]
        return RemoteRerankError(
            f"the rerank endpoint {self.endpoint} sent an answer that is not a {label} response: {what}"
        )

    def _not_found(self) -> str:
        return f"it has no {FORMAT_LABELS[self.format]} endpoint at {self.endpoint}/rerank ({_FORMAT_HINT})"

    def _status_message(self, resp: httpx.Response, attempts: int) -> str:
        """A refused request body most likely means the other wire format: say how to pick it."""
        message = super()._status_message(resp, attempts)
        if resp.status_code in (400, 422):
            message += f"; it was sent a {FORMAT_LABELS[self.format]} request ({_FORMAT_HINT})"
        return message


_FORMAT_HINT = "a URI with a path such as /v1 speaks Jina/Cohere's format, http://host:port#model speaks TEI's"


def _reason(exc: httpx.HTTPError) -> str:
    """The transport error in a few words (`[Errno 111] Connection refused`), or its kind."""
    return str(exc) or type(exc).__name__
