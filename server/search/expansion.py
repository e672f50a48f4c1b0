"""Query expansion: one plain query becomes a few typed searches written by a small generative model (spec §12).

The expansions are lex keyword strings, vec questions and hyde passages that the hybrid
pipeline (§13.2) runs next to the original query. Three kinds of model are supported, each
with the prompt that works for it (measured in `shared/models/README.md`):

- a base model without a chat template (Gemma 3 270M): a four-example completion prompt;
- a chat model (SmolLM2 instruct): the same four examples as user/assistant turns, since a
  single user turn holding the instructions only gets them echoed back;
- the original's fine-tuned expansion model: its training prompt, sampled as the original does.

Small models break the format: a line repeats itself until `max_tokens`, an example is
copied, a type is missing, chatter is added. So the parser keeps only well-formed lines that
look like a search about the query, and when nothing survives the caller gets the plain
`lex`/`vec` fallback and is told so (the original dropped that fallback silently, §26).
Expansions are cached in `llm_cache` by query and model, never by intent: the intent is not
part of the prompt either, so it cannot change the answer.

The model runs in one of two places behind the Expander's `generate`: the local inference
worker (`worker_generate`) or an OpenAI-compatible chat completions endpoint
(`remote_expander`). Both go through the same prompts, parser and cache; only the prompt's
form differs (an endpoint applies its own chat template, so it always gets chat messages).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qmd.server.models.protocol import GenerationParams
from qmd.server.models.refs import RemoteRef
from qmd.server.models.remote import RemoteGenerator
from qmd.server.search.lexical import STOP_WORDS
from qmd.server.search.querydoc import SUBQUERY_TYPES, SubQueryType
from qmd.server.store import llm_cache
from qmd.server.store.db import IndexStore

if TYPE_CHECKING:
    from qmd.server.models.worker import ModelSpec, WorkerClient

__all__ = [
    "EXAMPLE_LINES",
    "FEW_SHOT",
    "Expander",
    "Expansion",
    "Prompt",
    "build_prompt",
    "fallback",
    "parse_expansion",
    "remote_expander",
    "strong_signal",
]

log = logging.getLogger("qmd.expansion")

INSTRUCTIONS = """\
Rewrite a search query for a hybrid search engine. Output exactly three lines:
lex: keywords for full-text search
vec: the query rephrased as a natural question
hyde: one sentence that a relevant document would contain"""

FEW_SHOT: tuple[tuple[str, str, str, str], ...] = (
    (
        "python virtual environment setup",
        "python venv virtualenv activate pip",
        "how do I create and activate a Python virtual environment?",
        "Run python -m venv .venv and then source .venv/bin/activate before installing packages with pip.",
    ),
    (
        "slow postgres queries",
        "postgres slow query explain analyze index",
        "why are my PostgreSQL queries slow and how can I speed them up?",
        "Use EXPLAIN ANALYZE to find sequential scans and add an index on the filtered columns.",
    ),
    (
        "chocolate chip cookies",
        "chocolate chip cookie recipe bake butter sugar",
        "what is a good recipe for chocolate chip cookies?",
        "Cream the butter and sugar, fold in the chocolate chips and bake at 180C for 10 minutes.",
    ),
    (
        "quarterly sales report",
        "Q2 sales revenue report quarter",
        "where is the report on sales figures for the last quarter?",
        "Revenue for the quarter grew 12% compared with the previous quarter, driven by new enterprise customers.",
    ),
)
"""The worked examples of both few-shot prompts: (query, lex, vec, hyde)."""

MAX_CHARS = {"lex": 200, "vec": 300, "hyde": 500}
"""Longest kept text per type: a keyword string, a question, a one-sentence passage."""
MAX_PER_TYPE = 2
"""Each expansion line is one more search (an FTS scan or an embedding); more adds latency, not recall."""
_FALLBACK = {"fallback": True}
"""What the cache holds for a query the model gave no usable line for."""
FINE_TUNED_MARKER = "qmd-query-expansion"
"""Substring of the original's fine-tuned expansion model names (`qmd-query-expansion-1.7B`, …)."""


def _norm(text: str) -> str:
    """Case- and whitespace-insensitive form, for duplicate and copy tests."""
    return " ".join(text.lower().split())


EXAMPLE_LINES: frozenset[str] = frozenset(_norm(text) for example in FEW_SHOT for text in example[1:])
"""Every expansion line of the few-shot examples, normalised: a copy of one is not about the user's query."""
_EXAMPLE_QUERIES = frozenset(_norm(example[0]) for example in FEW_SHOT)


# --- parsing ---------------------------------------------------------------------------------------

# A typed line, allowing a markdown bullet or number before it and emphasis around the type
# ("- lex: …", "1. vec: …", "**hyde:** …", "**lex**: …").
_LINE = re.compile(
    r"^\s*(?:(?:[-*+•]|\d{1,2}[.)])\s+)?[*_]{0,2}(lex|vec|hyde)[*_]{0,2}\s*:(?:[*_]{1,2}(?=\s))?\s*(\S.*)$",
    re.IGNORECASE,
)
_PAIRS = (('"', '"'), ("'", "'"), ("`", "`"), ("“", "”"), ("‘", "’"), ("**", "**"), ("*", "*"))


def _unwrap(text: str) -> str:
    """Remove quotes or emphasis around the whole text, as in `lex: "python venv"`.

    A pair is removed only when its marks do not occur inside, so lex phrases such as
    `"rate limit" "retry after"` keep their meaning.
    """
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for left, right in _PAIRS:
            inner = text[len(left) : -len(right)]
            if (
                len(text) > len(left) + len(right)
                and text.startswith(left)
                and text.endswith(right)
                and left not in inner
                and right not in inner
            ):
                text, changed = inner.strip(), True
    return text


_CHAR_LOOP = re.compile(r"(.{1,4}?)\1{9,}")


def _runaway(text: str) -> bool:
    """Whether the line is a repetition loop rather than content.

    Three tests: a word or a phrase of up to three words repeated 4+ times in a row (`-t -t -t -t`,
    `rust rust rust rust`, `2022-01-12 2022-01-12 …`); for longer lines, fewer than half distinct
    word trigrams (a sentence that restarts itself until `max_tokens`); and a unit of up to four
    characters repeated 10+ times inside a word (`1000000000000…`, `-x-x-x-x…`).
    """
    if _CHAR_LOOP.search(text):
        return True
    words = re.findall(r"\w+", text.lower())
    for n in (1, 2, 3):
        run = 1
        for i in range(n, len(words) - n + 1):
            run = run + 1 if words[i : i + n] == words[i - n : i] else 1
            if run >= 4:
                return True
    trigrams = list(zip(words, words[1:], words[2:], strict=False))
    return len(words) >= 16 and len(set(trigrams)) < len(trigrams) / 2


def _cap(text: str, limit: int) -> str:
    """Cut to `limit` characters at a word boundary; `text` has single spaces only."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    if text[limit] != " " and " " in cut:  # the cut falls inside a word: end at the previous one
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:-")


def _terms(text: str) -> set[str]:
    """The spec's query terms: lowercase, anything but ASCII letters, digits and spaces is a separator."""
    return set(re.sub(r"[^a-z0-9\s]", " ", text.lower()).split())


def _shares_term(query_terms: set[str], text: str) -> bool:
    """Whether the line shares a term with the query, also across a plural or suffix (cookie ~ cookies).

    The prefix match needs four letters, so short words cannot match everything.
    """
    for term in _terms(text):
        for q in query_terms:
            shorter, longer = (term, q) if len(term) <= len(q) else (q, term)
            if term == q or (len(shorter) >= 4 and longer.startswith(shorter)):
                return True
    return False


def parse_expansion(raw: str, query: str) -> list[tuple[SubQueryType, str]]:
    """The usable `(type, text)` lines of a model's answer, in the order lex, vec, hyde.

    Keeps a line only if it is well formed, not a repetition loop, not the query itself, not a
    copy of a few-shot example, not a duplicate, and shares a term with the query (spec §12; when
    the query has no ASCII terms, as in CJK, every line passes). Stop words do not count as shared
    terms unless the query has nothing else. At most `MAX_PER_TYPE` lines per type.
    """
    terms = _terms(query)
    content_terms = terms - STOP_WORDS or terms
    copies_allowed = _norm(query) in _EXAMPLE_QUERIES  # the user asked exactly an example's query
    seen: set[tuple[str, str]] = set()
    kept: dict[SubQueryType, list[str]] = {kind: [] for kind in SUBQUERY_TYPES}
    for line in raw.splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        kind = next(k for k in SUBQUERY_TYPES if k == match.group(1).lower())  # the pattern allows only these
        text = " ".join(_unwrap(match.group(2)).split())
        if _runaway(text):
            continue
        text = _cap(text, MAX_CHARS[kind])
        key = _norm(text)
        if (
            not re.search(r"\w", text)
            or key == _norm(query)
            or (key in EXAMPLE_LINES and not copies_allowed)
            or (content_terms and not _shares_term(content_terms, text))
            or (kind, key) in seen
            or len(kept[kind]) >= MAX_PER_TYPE
        ):
            continue
        seen.add((kind, key))
        kept[kind].append(text)
    return [(kind, text) for kind in SUBQUERY_TYPES for text in kept[kind]]


def fallback(query: str) -> list[tuple[SubQueryType, str]]:
    """What runs when the model gave nothing usable: the query itself on both backends."""
    return [("lex", query), ("vec", query)]


# --- prompts ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """One generation request: a raw `prompt` or chat `messages` (exactly one is set), and its sampling.

    The sampling is chosen here, next to the prompt it suits, and travels whole to the worker.
    """

    prompt: str | None
    messages: list[dict[str, str]] | None
    params: GenerationParams
    shared: int = 0
    """The part that is the same for every query (characters of `prompt`, or leading `messages`):
    the instructions and examples, which a local worker evaluates once (`CompleteRequest.shared`)."""


def _answer(lex: str, vec: str, hyde: str) -> str:
    return f"lex: {lex}\nvec: {vec}\nhyde: {hyde}"


def build_prompt(query: str, name: str | None, chat_template: bool) -> Prompt:
    """The expansion prompt that suits the model, from its GGUF facts (`model_info`'s `name`, `chat_template`).

    Greedy decoding for the small models: it gave the most complete answers in the README's
    measurements, and repetition loops are dealt with by the parser. The fine-tuned model is
    sampled as the original samples it (§12), since greedy decoding loops with it.
    """
    if name and FINE_TUNED_MARKER in name.lower():
        # Its training prompt: one user turn, no system prompt (finetune/README.md), no few-shot.
        return Prompt(
            prompt=None,
            messages=[{"role": "user", "content": f"/no_think Expand this search query: {query}"}],
            params=GenerationParams(max_tokens=300, stop=[], temperature=0.7, top_k=20, top_p=0.8),
        )
    if chat_template:
        # The instructions ride in the first user turn rather than a system message: some chat
        # templates (older Gemma) refuse a system role, and the examples carry the format anyway.
        messages: list[dict[str, str]] = []
        for i, (example, lex, vec, hyde) in enumerate(FEW_SHOT):
            user = f"Query: {example}" if i else f"{INSTRUCTIONS}\n\nQuery: {example}"
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": _answer(lex, vec, hyde)}]
        shared = len(messages)
        messages.append({"role": "user", "content": f"Query: {query}"})
        params = GenerationParams(max_tokens=96, stop=["\n\n", "<|im_end|>"])
        return Prompt(prompt=None, messages=messages, params=params, shared=shared)
    shots = "".join(f"Query: {example}\n{_answer(lex, vec, hyde)}\n\n" for example, lex, vec, hyde in FEW_SHOT)
    head = f"{INSTRUCTIONS}\n\n{shots}"
    return Prompt(
        prompt=f"{head}Query: {query}\n",
        messages=None,
        params=GenerationParams(max_tokens=96, stop=["\nQuery:", "\n\n"]),
        shared=len(head),
    )


# --- the expander ----------------------------------------------------------------------------------


@dataclass
class Expansion:
    """What `Expander.expand` produced, with enough facts for `--explain` and the stage report."""

    lines: list[tuple[SubQueryType, str]]
    cached: bool
    fallback: bool
    """True when the model gave nothing usable and `lines` is `fallback(query)`; the caller reports it."""
    raw: str | None
    """The model's answer as generated; None when the lines came from the cache."""
    seconds: float


def worker_generate(worker: WorkerClient, spec: ModelSpec, timeout: float | None = None) -> Callable[[Prompt], str]:
    """An Expander's `generate`: the prompt run by `WorkerClient.complete` on the generate model."""

    def generate(p: Prompt) -> str:
        return worker.complete(
            spec, p.prompt, messages=p.messages, params=p.params, shared=p.shared, timeout=timeout
        ).text

    return generate


def remote_generate(client: RemoteGenerator) -> Callable[[Prompt], str]:
    """An Expander's `generate` on an OpenAI-compatible chat endpoint: the prompt's messages and sampling.

    The endpoint applies its model's own chat template, so its Expander is built with
    `chat_template=True` and `build_prompt` always gives messages (the few-shot turns, or the
    fine-tuned model's prompt when the served name says it is that model).
    """

    def generate(p: Prompt) -> str:
        assert p.messages is not None, "build_prompt gives messages whenever chat_template is set"
        return client.chat(p.messages, p.params)

    return generate


def remote_expander(ref: RemoteRef, store: IndexStore) -> Expander:
    """The Expander of a generate model served by an endpoint; a `RemoteGenerateError` when
    the setting cannot work (no model name, no key for OpenAI).

    Its cache key and cost estimate use `ref.uri`, which names the endpoint and the model:
    expansions of one served model are never answered for another.
    """
    client = RemoteGenerator(ref.endpoint, ref.model)
    return Expander(remote_generate(client), ref.uri, client.model, True, store)


class Expander:
    """Expands queries with one generate model, through the `llm_cache`.

    `generate` runs a `Prompt` on the model and returns its text (the daemon wires it to
    `WorkerClient.complete`); a `QmdError` from it propagates, and the pipeline reports expansion as
    skipped. Fallbacks are never cached, so a model that failed once gets another chance.
    """

    def __init__(
        self,
        generate: Callable[[Prompt], str],
        model_uri: str,
        name: str | None,
        chat_template: bool,
        store: IndexStore,
    ) -> None:
        self.generate = generate
        self.model_uri = model_uri
        self.name = name
        self.chat_template = chat_template
        self.store = store

    @property
    def fine_tuned(self) -> bool:
        """Whether this is a model trained to expand queries (the original's qmd-query-expansion),
        the only kind a query expands with unless it asks: a general small model's expansions
        measured no gain for their second (`bench/bench_rerank.py`)."""
        return FINE_TUNED_MARKER in f"{self.name or ''} {self.model_uri}".lower()

    def key(self, query: str) -> str:
        """The original's cache key (§12): `expandQuery` + `{"query", "model"}` in that order."""
        return llm_cache.cache_key("expandQuery", {"query": query, "model": self.model_uri})

    def cached(self, query: str) -> Expansion | None:
        """The cached expansion of `query`, or None; lets the pipeline skip its time-budget check on a hit.

        Accepts the legacy `[{type, text}]` form; an unreadable entry counts as absent.
        """
        start = time.monotonic()
        key = self.key(query)
        value = llm_cache.get(self.store, key)
        if value is None:
            return None
        try:
            items = json.loads(value)
            if items == _FALLBACK:
                lines = fallback(query)
                return Expansion(lines=lines, cached=True, fallback=True, raw=None, seconds=time.monotonic() - start)
            lines = [(item["type"], item.get("query", item.get("text"))) for item in items]
        except (ValueError, TypeError, KeyError, AttributeError):
            log.warning("ignoring an unreadable cached expansion %s", key[:12])
            return None
        lines = [(t, q) for t, q in lines if t in SUBQUERY_TYPES and isinstance(q, str) and q.strip()]
        if not lines:
            return None
        return Expansion(lines=lines, cached=True, fallback=False, raw=None, seconds=time.monotonic() - start)

    def expand(self, query: str) -> Expansion:
        """The cached expansion, else a fresh one, cached either way: a model that gave nothing
        usable for a query gives the same again (generation is greedy), so the fallback is
        remembered instead of costing the model call on every repeat."""
        hit = self.cached(query)
        if hit is not None:
            return hit
        start = time.monotonic()
        raw = self.generate(build_prompt(query, self.name, self.chat_template))
        lines = parse_expansion(raw, query)
        value = json.dumps([{"type": t, "query": q} for t, q in lines] if lines else _FALLBACK)
        llm_cache.put_many(self.store, {self.key(query): value}, model=self.model_uri)
        return Expansion(
            lines=lines or fallback(query), cached=False, fallback=not lines, raw=raw, seconds=time.monotonic() - start
        )

    def forget(self, query: str) -> None:
        """Drop the cached expansion of `query`: the pipeline calls it when none of its lines found anything (§12)."""
        llm_cache.delete(self.store, self.key(query))


def strong_signal(scores: list[float], intent: str | None, *, top_matched_all: bool) -> bool:
    """Whether the BM25 probe is so decisive that expansion can be skipped (spec §13.2 step 1).

    The spec's test is top ≥ 0.85 and top − second ≥ 0.15, with no intent (an intent asks for a
    reading the keywords alone may not have). It was set for the original's scores, where every
    hit matched every query term (its FTS query is an AND) and score = b = |bm25| / (1 + |bm25|).
    Our lexical search is disjunctive BM25 with its own normalisation, so the test reads each
    hit's `coordination` instead: (m − 1 + b) / T for m matched of T terms. With many terms a
    document missing one still reaches 0.85 there (T = 8, m = 7 scores at least 0.75 + b/8):
    without the extra condition a partial match could skip expansion, the case expansion is for.
    With it the test reads "one document has every term and stands clear of the rest": a top hit
    needs b ≥ 1 − 0.15·T (easier than the original's 0.85 once T > 1), and a runner-up that also has
    every term is only (b₁ − b₂)/T behind, so ties among full matches keep expansion on.
    `scores` are those values for BM25's top hit, then the best of the others.
    """
    if intent and intent.strip():
        return False
    if not scores or not top_matched_all:
        return False
    top = scores[0]
    second = scores[1] if len(scores) > 1 else 0.0
    return top >= 0.85 and top - second >= 0.15
