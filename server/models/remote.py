"""An OpenAI-compatible `/v1/embeddings` endpoint as the embed model.

llama.cpp's server, Ollama, vLLM and OpenAI itself all answer `POST <base>/embeddings`
with `{"data": [{"index", "embedding"}]}`, so one small client covers them. What the
local worker learns from the GGUF file has to be decided here instead:

- **Tokens.** No tokenizer is reachable, so chunks are measured with a conservative
  character estimate (`CharEstimateTokenizer`); the estimate's parameters are part of
  the vector space's identity, like the chunker version.
- **Dimensions.** Asked of the endpoint once, with a short probe, when the embedder is
  resolved.
- **Identity.** The endpoint and the model name: nothing else is knowable about a
  remote model, so switching either starts a new vector space. The API key is never
  part of it (rotating a key must not re-embed anything), never logged, never put in
  a message.
- **Scale.** Vectors come back at whatever length the server likes (llama-cpp-python
  does not normalise); they are normalised here, so cosine scores mean the same as
  the local worker's.

Failures are `RemoteEmbedError`s that name the endpoint and say what to do. 429 and
5xx answers, read timeouts and dropped connections are retried with backoff (longer for
the embed job than for a probe or a query, which have a person waiting); a connection
that cannot be opened is not (the server is not running or not reachable: waiting will
not change that, and a search should fall back to keywords at once).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Any, Literal

import httpx

from qmd.server.errors import Unavailable
from qmd.server.index.chunking import CharEstimateTokenizer, Chunk, chunk_document
from qmd.server.models.refs import OPENAI_ENDPOINT
from qmd.server.models.worker import Embeddings

log = logging.getLogger("qmd.remote_embed")

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
"""A probe (run by `status`) or a query embedding has a person waiting: fail soon, fall back to keywords."""
BACKOFF_SECONDS = 0.5
"""First retry delay, doubled per attempt (0.5, 1, 2 s) unless the server sends Retry-After."""
MAX_RETRY_AFTER = 30.0
TIMEOUT = httpx.Timeout(60.0, connect=5.0)
"""Generous read timeout: Ollama loads the model on the first request."""
INTERACTIVE_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
PROBE_TEXT = "qmd embedding dimension probe"
KEY_VARS = ("QMD_EMBED_API_KEY", "OPENAI_API_KEY")

Kind = Literal["query", "document"]


class RemoteEmbedError(Unavailable):
    """The embeddings endpoint could not be used; the message names it and says why."""


def api_key(endpoint: str, environ: Mapping[str, str] = os.environ) -> tuple[str | None, str | None]:
    """The key to send and the variable it came from (for messages; the value is never shown).

    `QMD_EMBED_API_KEY` goes to whichever endpoint is configured. `OPENAI_API_KEY` goes
    only to OpenAI's own endpoint: sending it to another host (a LAN Ollama over plain
    http, a third-party proxy) would hand the user's OpenAI credentials to a server that
    was never meant to see them.
    """
    for var in KEY_VARS:
        if var == "OPENAI_API_KEY" and endpoint != OPENAI_ENDPOINT:
            continue
        value = environ.get(var, "").strip()
        if value:
            return value, var
    return None, None


class RemoteBackend:
    """Chunks in-process and embeds over HTTP; safe to share between threads (httpx.Client is)."""

    def __init__(self, endpoint: str, model: str | None, *, environ: Mapping[str, str] = os.environ) -> None:
        """Checks what can be checked without a request: a model name, and a key for OpenAI."""
        if not model:
            raise RemoteEmbedError(
                f"the embeddings endpoint {endpoint} needs a model name: write it as {endpoint}#<model>"
            )
        self.endpoint = endpoint
        self.model = model
        self._key, self._key_var = api_key(endpoint, environ)
        self._openai_key_withheld = endpoint != OPENAI_ENDPOINT and bool(environ.get("OPENAI_API_KEY", "").strip())
        if self._key is None and endpoint == OPENAI_ENDPOINT:
            raise RemoteEmbedError(f"openai:{model} needs an API key: set QMD_EMBED_API_KEY or OPENAI_API_KEY")
        self._tokenizer = CharEstimateTokenizer(CHARS_PER_TOKEN, SPECIAL_TOKENS)
        headers = {"User-Agent": "qmd-embed"}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key}"
        self._client = httpx.Client(headers=headers)
        self.dims: int | None = None

    @property
    def identity(self) -> str:
        """What names the vector space this backend writes (the caller adds chunker version
        and chunk size). Only valid after `probe`: the dimensions are part of it, so a
        different model served under the same name cannot land in the old space."""
        return (
            f"remote:{self.endpoint}\nmodel:{self.model}\ndims:{self.dims}\nformat:plain\n"
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

    def close(self) -> None:
        """Release the connection pool (a backend whose probe failed is dropped, then rebuilt)."""
        self._client.close()

    def chunk(self, text: str, max_tokens: int, language: str | None = None) -> list[Chunk]:
        """`qmd.server.index.chunking` chunks measured by the character estimate (no tokenizer is reachable)."""
        return chunk_document(text, max_tokens=max_tokens, tokenizer=self._tokenizer, language=language)

    def embed(self, texts: list[str], kind: Kind, titles: list[str | None] | None = None) -> Embeddings:
        """Unit vectors for `texts`, in order, `BATCH` per request.

        Texts are sent as they are (the plain prompt format): the model family behind an
        endpoint is unknown, and a prefix a model never saw only adds noise. `kind` and
        `titles` are therefore not used to shape the input; `kind` only picks how long to
        retry (a query has a person waiting). An input whose estimate exceeds
        `CHUNK_TOKENS` is reported clipped, as the server will likely cut it.
        """
        vectors: list[list[float]] = []
        for i in range(0, len(texts), BATCH):
            vectors.extend(self._request(texts[i : i + BATCH], interactive=kind == "query"))
        n_tokens = [self._tokenizer.count(t) for t in texts]
        clipped = tuple(i for i, n in enumerate(n_tokens) if n > CHUNK_TOKENS)
        return Embeddings(vectors, clipped=clipped, n_tokens=n_tokens, limit=CHUNK_TOKENS)

    # -- HTTP --

    def _request(self, texts: list[str], *, interactive: bool) -> list[list[float]]:
        """One `/embeddings` call, retried on transient failures, answered as unit vectors."""
        url = f"{self.endpoint}/embeddings"
        body = {"model": self.model, "input": texts}
        attempts = INTERACTIVE_ATTEMPTS if interactive else JOB_ATTEMPTS
        timeout = INTERACTIVE_TIMEOUT if interactive else TIMEOUT
        for attempt in range(1, attempts + 1):
            last = attempt == attempts
            try:
                resp = self._client.post(url, json=body, timeout=timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                raise RemoteEmbedError(
                    f"cannot reach the embeddings endpoint {self.endpoint} ({_reason(e)}): is the server running?"
                ) from None
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as e:
                if last:
                    raise RemoteEmbedError(
                        f"the embeddings endpoint {self.endpoint} did not answer ({_reason(e)}) "
                        f"after {attempts} attempts"
                    ) from None
                self._wait(attempt, None)
                continue
            except httpx.HTTPError as e:
                raise RemoteEmbedError(
                    f"the request to the embeddings endpoint {self.endpoint} failed: {_reason(e)}"
                ) from None
            if resp.status_code in RETRY_STATUSES and not last:
                log.warning(
                    "embeddings endpoint %s answered %d; retrying (%d/%d)",
                    self.endpoint,
                    resp.status_code,
                    attempt,
                    attempts - 1,
                )
                self._wait(attempt, resp.headers.get("retry-after"))
                continue
            if resp.status_code != 200:
                raise RemoteEmbedError(self._status_message(resp, attempts))
            return self._parse(resp, len(texts))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _wait(self, attempt: int, retry_after: str | None) -> None:
        """Back off before the next attempt, as the server asks when it says."""
        delay = BACKOFF_SECONDS * 2 ** (attempt - 1)
        if retry_after is not None:
            try:
                delay = float(retry_after)
            except ValueError:
                pass  # an HTTP date: keep the exponential delay
        time.sleep(min(max(delay, 0.0), MAX_RETRY_AFTER))

    def _status_message(self, resp: httpx.Response, attempts: int) -> str:
        """What an error status means for the user, with the server's own words."""
        code, said = resp.status_code, self._server_said(resp)
        where = f"the embeddings endpoint {self.endpoint}"
        if code in (401, 403):
            if self._key_var is None:
                withheld = " (OPENAI_API_KEY is sent only to api.openai.com)" if self._openai_key_withheld else ""
                return f"{where} requires an API key ({code}{said}): set QMD_EMBED_API_KEY{withheld}"
            return f"{where} refused the API key in {self._key_var} ({code}{said})"
        if code == 404:
            return (
                f"{where} answered 404{said}: it does not serve the model {self.model!r}, "
                "or it is not an OpenAI-compatible API base (that usually ends in /v1)"
            )
        if code in RETRY_STATUSES:
            return f"{where} kept failing ({code}{said}) after {attempts} attempts"
        return f"{where} rejected the request ({code}{said})"

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


def _reason(exc: httpx.HTTPError) -> str:
    """The transport error in a few words (`[Errno 111] Connection refused`), or its kind."""
    return str(exc) or type(exc).__name__
