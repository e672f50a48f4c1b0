"""Rerankers: relevance of a passage to a query from a local model, three ways behind one interface.

- **cross-encoder**: a GGUF with rank pooling (Qwen3-Reranker from ggml-org, bge/ms-marco
  conversions) scores the joined pair in one pass; the best scorer when there is one.
- **yes-no**: a generative reranker (a "...Reranker" GGUF without rank pooling) is asked
  whether the document meets the query; score P(yes) / (P(yes) + P(no)).
- **query-likelihood**: any other generative model scores how likely it finds the query
  as a question the passage answers (UPR). With the 135M-270M models the project can run
  offline this ranks well (models README §4: MRR 0.88-0.94) where yes-no is near random.

A fourth needs no model: **cosine** (`CosineScorer`, `models.rerank: cosine`), the
embedder's similarity between the query and each candidate's nearest chunk, from vectors
the index already holds (about a millisecond for 40 candidates). Reciprocal rank fusion
keeps only ranks; this puts the vector match's strength back. Measured, it buys about
nothing over fusion (README, "What each stage buys"), so it runs only when asked for.

A fifth runs elsewhere: **remote** (`RemoteScorer`), a rerank endpoint (llama.cpp's server,
vLLM, TEI, Jina, Cohere) scoring pairs with whatever cross-encoder it serves; its method is
"cross-encoder", since that is what such an endpoint runs, and its URI says where.

`make_reranker` picks the method from the GGUF's metadata; the caller may force one.
Every scorer cuts passages to `PASSAGE_TOKENS` tokens first: only a candidate's best
chunk is scored, the cost is linear in its length, and the prompt must fit the context.
Generative scorers run the model under the "generate" role, so a file that also expands
queries is loaded once, not twice.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Literal, Protocol

from qmd.server.errors import InvalidInput
from qmd.server.models.refs import COSINE, RemoteRef
from qmd.server.models.remote import CHARS_PER_TOKEN, RemoteReranker
from qmd.server.models.worker import ModelSpec, WorkerClient

Method = Literal["cross-encoder", "yes-no", "query-likelihood"]
METHODS: tuple[Method, ...] = ("cross-encoder", "yes-no", "query-likelihood")
"""What a model reranks by; `CosineScorer` is the model-free one."""

PASSAGE_TOKENS = 256
"""Passage cap per scored pair, in the model's own tokens (the beginning is kept)."""
SCORING = 2
"""Which way of computing scores the cached ones came from, part of their cache key: bumped when
the same model and passage would score differently, so that a query never ranks old scores
against new ones. 2: a prompt's head evaluated apart and reused (`LikelihoodRequest.shared`)."""

_EMBEDDING_POOLING = ("mean", "cls", "last")
_PASSAGE = "\x00qmd-passage\x00"
_QUERY = "\x00qmd-query\x00"
"""Placeholders rendered through a chat template once, then replaced per pair (no round trip each)."""

# Qwen3-Reranker's own instructions: what a generative reranker named so was trained on.
_JUDGE = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the "
    'answer can only be "yes" or "no".'
)
_INSTRUCT = "Given a web search query, retrieve relevant passages that answer the query"


class Reranker(Protocol):
    """What the hybrid query needs of a reranker."""

    uri: str
    """Model identity for cache keys (the caller passes the resolved URI)."""
    method: Method
    passage_tokens: int
    """Passages are cut to this many tokens before scoring (part of a score's cache key)."""

    def score(self, query: str, passages: list[str]) -> list[float]:
        """Raw scores, one per passage, higher = more relevant (cacheable per (query, passage))."""
        ...

    def normalize(self, raw: list[float]) -> list[float]:
        """Map one query's raw scores to [0, 1] for blending (identity for probabilities)."""
        ...

    @property
    def learning(self) -> bool:
        """True while the scorer needs an answer from its model before `normalize` knows the
        scores' scale: a query whose scores all come from the cache scores one candidate anew."""
        ...


class _Scorer:
    """What every scorer shares: the worker, the model, and cutting passages to the token cap."""

    def __init__(self, worker: WorkerClient, spec: ModelSpec, uri: str, passage_tokens: int) -> None:
        self.worker = worker
        self.spec = spec
        self.uri = uri
        self.passage_tokens = passage_tokens

    def fit(self, passages: list[str]) -> list[str]:
        """Each passage cut to at most `passage_tokens` tokens by the model's tokenizer, its beginning kept.

        Measured in the worker (special tokens included, so the cap is conservative by one or
        two), cut here by characters in proportion (5% under, since tokens are not spread
        evenly), and measured again until every passage fits: usually one extra round trip
        for the long ones only. A passage shrinks every round until it fits or is empty, so
        this ends even for a cap below the tokenizer's own special tokens.
        """
        out = list(passages)
        todo = list(range(len(out)))
        while todo:
            counts = self.worker.count_tokens(self.spec, [out[i] for i in todo])
            over = [(i, n) for i, n in zip(todo, counts, strict=True) if n > self.passage_tokens and out[i]]
            for i, n in over:
                out[i] = out[i][: int(len(out[i]) * self.passage_tokens / n * 0.95)]
            todo = [i for i, _ in over]
        return out

    def normalize(self, raw: list[float]) -> list[float]:
        """Already probabilities in [0, 1]: unchanged, and comparable across queries."""
        return list(raw)

    @property
    def learning(self) -> bool:
        """A local model's scale is known from its method."""
        return False


class CrossEncoderReranker(_Scorer):
    """A rank-pooling GGUF scoring each (query, passage) pair: `WorkerClient.rank`, probabilities in [0, 1]."""

    method: Method = "cross-encoder"

    def __init__(self, worker: WorkerClient, path: str, uri: str, *, passage_tokens: int = PASSAGE_TOKENS) -> None:
        super().__init__(worker, ModelSpec("rerank", path), uri, passage_tokens)

    def score(self, query: str, passages: list[str]) -> list[float]:
        """P(relevant) per passage from the model's classification head."""
        if not passages:
            return []
        return self.worker.rank(self.spec, query, self.fit(passages))


class _GenerativeScorer(_Scorer):
    """A scorer reading token probabilities of a generative model, under the "generate"
    role; a chat model gets its prompt rendered once by its own template."""

    def __init__(
        self, worker: WorkerClient, path: str, uri: str, *, chat: bool, passage_tokens: int = PASSAGE_TOKENS
    ) -> None:
        super().__init__(worker, ModelSpec("generate", path), uri, passage_tokens)
        self.chat = chat
        self._template: tuple[str, str] | None = None

    def _chat_template(self, messages: list[dict[str, str]]) -> tuple[str, str]:
        """`messages` (with the passage placeholder) rendered by the model, split around the
        placeholder; rendered on first use only."""
        if self._template is None:
            self._template = _split(self.worker.render_chat(self.spec, messages), self.spec.path)
        return self._template


class YesNoReranker(_GenerativeScorer):
    """A generative reranker asked "does this document meet the query?": P(yes) / (P(yes) + P(no)).

    With a chat template the pair goes in Qwen3-Reranker's format (a judging system turn,
    then Instruct/Query/Document), rendered by the model's own template; without one, a
    plain "Query: … Document: … Relevant (yes/no):" prompt.
    """

    method: Method = "yes-no"

    def _around(self, query: str) -> tuple[str, str]:
        """What goes before and after the passage in the prompt whose next token is the model's yes or no."""
        if not self.chat:
            return f"Query: {query}\nDocument: ", "\nRelevant (yes/no):"
        user = f"<Instruct>: {_INSTRUCT}\n<Query>: {_QUERY}\n<Document>: {_PASSAGE}"
        head, tail = self._chat_template([{"role": "system", "content": _JUDGE}, {"role": "user", "content": user}])
        return head.replace(_QUERY, query), tail.replace(_QUERY, query)

    def score(self, query: str, passages: list[str]) -> list[float]:
        """P(yes) / (P(yes) + P(no)) per passage; the judge's instructions and the query are evaluated once."""
        if not passages:
            return []
        head, tail = self._around(query)
        prompts = [head + p + tail for p in self.fit(passages)]
        return self.worker.yes_no(self.spec, prompts, shared=len(head))


class QueryLikelihoodReranker(_GenerativeScorer):
    """Mean log P(query tokens | passage prompt) (UPR; models README §4), higher = more relevant.

    Prompts: a chat model gets "Write a search query that this document answers." with the
    passage as its user turn, rendered by its own template, the query being the reply; a
    base model (no template, e.g. Gemma 270M) gets "Passage: …\\nA question that this passage
    answers: " followed by the query.
    """

    method: Method = "query-likelihood"

    def _around(self) -> tuple[str, str]:
        """What goes before and after the passage in the prompt the query is scored after."""
        if not self.chat:
            return "Passage: ", "\nA question that this passage answers: "
        user = f"Write a search query that this document answers.\nDocument: {_PASSAGE}"
        return self._chat_template([{"role": "user", "content": user}])

    def score(self, query: str, passages: list[str]) -> list[float]:
        """Mean log-probability per query token, per passage: negative, roughly -3 to -16; the
        template's head is evaluated once."""
        if not passages:
            return []
        head, tail = self._around()
        prefixes = [head + p + tail for p in self.fit(passages)]
        return self.worker.likelihood(self.spec, prefixes, query, shared=len(head))

    def normalize(self, raw: list[float]) -> list[float]:
        """exp(lp - max lp): each candidate's per-token likelihood of the query relative to the best candidate.

        The scores are relative within one query's candidate set: their level depends on
        the query (how predictable its words are), so only differences mean anything, and a
        1.0 says "best of these candidates", not "relevant". Because the raw score is a mean
        per token, exp of a difference is the per-token likelihood ratio: 1 nat/token worse
        gives 0.37, 2 nats 0.14. Chosen over min-max, which stretches any spread to the full
        [0, 1] and so would let a 0.01-nat difference between equally good passages move a
        blended ranking as much as a real gap does. A single candidate, or candidates that
        all score the same, get 1.0 each: a constant, so the rerank term reorders nothing.
        """
        if not raw:
            return []
        best = max(raw)
        return [math.exp(lp - best) for lp in raw]


class RemoteScorer:
    """A rerank endpoint's cross-encoder (`models.remote.RemoteReranker`), behind the same interface.

    No tokenizer is reachable, so passages are cut by characters: `passage_tokens` times
    `CHARS_PER_TOKEN` (3, the embed role's conservative estimate; English averages about 4),
    768 characters for the usual 256, which keeps the pair inside a 512-token cross-encoder.
    """

    method: Method = "cross-encoder"

    def __init__(self, client: RemoteReranker, uri: str, *, passage_tokens: int = PASSAGE_TOKENS) -> None:
        self.client = client
        self.uri = uri
        self.passage_tokens = passage_tokens
        self._logits = False

    def score(self, query: str, passages: list[str]) -> list[float]:
        """The endpoint's raw scores: probabilities or logits, whichever it sends."""
        cap = int(self.passage_tokens * CHARS_PER_TOKEN)
        return self.client.rerank(query, [p[:cap] for p in passages])

    def normalize(self, raw: list[float]) -> list[float]:
        """Probabilities unchanged; logits through a sigmoid, once the endpoint is known to send them.

        Endpoints differ: TEI and vLLM apply the model's sigmoid and send probabilities,
        llama.cpp's server sends the classification head's raw logit. A cross-encoder is
        trained with a sigmoid on that one logit, so sigmoid(logit) is the probability it
        was trained to give, the local cross-encoder's score (`worker_child.rank`) and, like
        it, absolute: comparable across queries, never stretched as min-max would. Which
        scale an endpoint uses is learned and kept: an answer from llama.cpp's server says
        logits from the first answer on; elsewhere one score outside [0, 1] proves logits, and from
        then on every set is mapped, so the scale does not flip between queries whose logits
        happen to fall inside [0, 1].
        """
        self._logits = self._logits or self.client.sends_logits or any(not 0.0 <= s <= 1.0 for s in raw)
        if not self._logits:
            return list(raw)
        return [1.0 / (1.0 + math.exp(-s)) if s >= 0 else math.exp(s) / (1.0 + math.exp(s)) for s in raw]

    @property
    def learning(self) -> bool:
        """Until the endpoint has answered in this process (a daemon restart forgets what it
        said of itself), cached raw scores alone could be logits taken for probabilities."""
        return not self.client.answered


@dataclass(frozen=True)
class CosineScorer:
    """The embedder's cosine between the query and each candidate's nearest chunk (`models.rerank: cosine`).

    Not a `Reranker`: it reads the vectors the index holds, not passages, so the hybrid
    query scores it itself (`HybridQuery._cosine`).
    """

    uri: str = COSINE
    method: Literal["cosine"] = "cosine"

    @staticmethod
    def normalize(similarities: list[float]) -> list[float]:
        """Cosines clipped to [0, 1]: absolute like a cross-encoder's probability, so a
        candidate set of weak matches stays weak (never stretched to the top)."""
        return [min(max(s, 0.0), 1.0) for s in similarities]


NOT_BY_DEFAULT: dict[str, str] = {
    "query-likelihood": "not run by default: a general model's query likelihood is seconds per query on a CPU "
    "for a small gain (README, 'What each stage buys'); --rerank (rerank: true) runs it",
    "cosine": "not run by default: the embedder's cosine measured no gain over fusion "
    "(README, 'What each stage buys'); --rerank (rerank: true) runs it",
}
"""Why a query that does not ask is not reranked by a scorer of this method."""


def reranks(rr: Reranker | CosineScorer, asked: bool | None) -> bool:
    """Whether a query reranks with `rr`: as `asked` (`rerank: true|false`), or, when it says
    nothing, with a model trained to rank (a cross-encoder, a yes/no "…Reranker", an
    endpoint) only; a general model's query likelihood or the embedder's cosine runs when
    asked (`NOT_BY_DEFAULT` says why)."""
    return asked if asked is not None else rr.method not in NOT_BY_DEFAULT


def remote_reranker(ref: RemoteRef) -> Reranker:
    """The reranker of a rerank endpoint; a `RemoteRerankError` when the setting cannot work
    (no model name, a bad `QMD_RERANK_TIMEOUT`). Its URI, the cache key of its scores,
    names the endpoint and the model, never the key."""
    return RemoteScorer(RemoteReranker(ref.endpoint, ref.model), ref.uri)


def _split(rendered: str, path: str) -> tuple[str, str]:
    """A rendered chat prompt split around the passage placeholder, which must appear exactly once."""
    parts = rendered.split(_PASSAGE)
    if len(parts) != 2:
        raise InvalidInput(f"the chat template of {os.path.basename(path)} does not pass a user message through intact")
    return parts[0], parts[1]


def make_reranker(worker: WorkerClient, path: str, uri: str, *, method: str | None = None) -> Reranker:
    """The scorer for the GGUF at `path`: rank pooling → cross-encoder; a generative model named
    "…rerank…" → yes-no; any other generative model → query-likelihood. `method` overrides
    the choice and is checked against what the model can do.
    """
    info = worker.model_info(ModelSpec("rerank", path))
    name = f"{info['name'] or ''} {os.path.basename(path)}"
    label = os.path.basename(path)
    pooling = info["pooling"]
    if method is not None and method not in METHODS:
        raise InvalidInput(f"unknown rerank method {method!r}; choose one of {', '.join(METHODS)}")
    if pooling in _EMBEDDING_POOLING:
        raise InvalidInput(f"{label} is an embedding model ({pooling} pooling); it cannot rerank")
    if method is None:
        if pooling == "rank":
            method = "cross-encoder"
        else:
            method = "yes-no" if re.search(r"rerank", name, re.IGNORECASE) else "query-likelihood"
    if method == "cross-encoder":
        if pooling != "rank":
            raise InvalidInput(f"{label} has no rank pooling, so it cannot run as a cross-encoder")
        return CrossEncoderReranker(worker, path, uri)
    if pooling == "rank":
        raise InvalidInput(f"{label} is a cross-encoder (rank pooling); it has no token probabilities for {method}")
    if method == "yes-no":
        return YesNoReranker(worker, path, uri, chat=info["chat_template"])
    return QueryLikelihoodReranker(worker, path, uri, chat=info["chat_template"])
