"""The hybrid query (spec §13.2–13.3): probe, expand, route, fuse, rerank, within a budget.

Stages, in order:
- **probe**: BM25 for the original query; a strong, complete match skips expansion.
- **expand**: the generate model rewrites the query into typed lines (cached).
- **keyword** / **vector**: typed routing; lex lines to FTS, vec/hyde lines to vectors,
  the original query to both. Lists of the original query (or of the first sub-query of
  a typed document) weigh 2; identifier-like tokens (ids, dates, versions, paths) double
  the keyword weight, since a lookup must match them exactly (seeds/002).
- **fuse**: weighted RRF (`qmd.server.search.fusion`), top `candidate_limit` candidates.
- **rerank**: the best passage of each candidate, scored by the rerank model (cached).

A budget drops stages in the order the issue fixes: expansion first, then reranking
(fewer candidates before none), then vectors; keyword search always answers. Costs are
planned from running estimates of this machine's own timings (`CostModel`) and checked
again between rerank batches; time spent waiting for a busy or hung inference worker counts
too (`wait_at_most`: a model call gives up when the budget is spent, and its stage says so).
Every answer lists each stage with what it did, its time, and, when it did not run or ran
partly, why.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Literal, NamedTuple, TypeAlias

from qmd.server.config import Config
from qmd.server.errors import QmdError
from qmd.server.models.worker import wait_at_most
from qmd.server.search.expansion import Expander, Expansion, strong_signal
from qmd.server.search.filters import Filter
from qmd.server.search.fusion import Candidate, RankedList, blend, fuse
from qmd.server.search.keyword import KeywordHit, fuzzed, held_outside, lexical_hits
from qmd.server.search.lexical import LexQuery, identifier_tokens, intent_terms, parse_lex
from qmd.server.search.pointers import Pointer, point_at, within_answer
from qmd.server.search.querydoc import QueryDoc, SubQueryType
from qmd.server.search.relevance import CosineScale, Evidence, relevance, standout, terms
from qmd.server.search.rerank import NOT_BY_DEFAULT, SCORING, CosineScorer, Reranker, reranks
from qmd.server.search.scope import FilterReport, Scope, filter_report, filter_warnings, scope_of
from qmd.server.search.snippets import best_passage, passage_window
from qmd.server.search.vector import vector_score
from qmd.server.store import cores, llm_cache
from qmd.server.store.db import IndexStore
from qmd.server.store.documents import DocRow, fetch_ids
from qmd.server.store.vectors import VecHit
from qmd.server.text.chunking import DEFAULT_CHUNK_STRATEGY, ChunkStrategy
from qmd.server.text.split import code_unit

LIST_FETCH = 20
"""Results per ranked list (the original's 20): RRF barely counts rank 20 anyway."""
DEFAULT_CANDIDATES = 40
IDENTIFIER_BOOST = 2.0
RERANK_PASSAGE_CHARS = 600
"""About 150 tokens: the best passage and its neighbourhood (`QMD_RERANK_PASSAGE_CHARS`). Cost
is about linear in it (SmolLM2 135M on 2 cores: 0.69 s per passage at 600 characters, 0.40 s
at 300; query likelihood ranked as well at 300 on the man-page benchmark, README)."""
RERANK_BATCH = 4
"""Candidates scored per worker call; the deadline is checked between calls."""
SHAPE_RESERVE_S = 0.02
"""Kept back from the budget for snippets and the answer itself."""

_BESIDE = ThreadPoolExecutor(max_workers=4, thread_name_prefix="qmd-query-vectors")
"""Runs a query's vector leg beside its keyword leg: the embedding waits on the inference
worker, the scan on numpy and SQLite, the keyword leg on SQLite, all outside the GIL, so on
2 cores a query costs about its slower leg instead of the sum (issue 34)."""

Status = Literal["ran", "cached", "partial", "skipped", "off"]
"""`off`: the caller turned the stage off (`--no-rerank`); not a degradation, so not in `skipped`."""


@dataclass
class Stage:
    """One line of the answer's account of itself."""

    stage: str
    status: Status
    ms: float = 0.0
    detail: str = ""


@dataclass
class QueryOptions:
    collections: list[str] | None = None
    limit: int = 10
    min_score: float = 0.0
    min_relevance: float = 0.0
    """Drop results less likely than this to be relevant (`relevance`); MCP's default is `AGENT_FLOOR`."""
    all_results: bool = False
    candidate_limit: int = DEFAULT_CANDIDATES
    rerank: bool | None = None
    """None: the default, with a model trained to rank only (`rerank.reranks`)."""
    expand: bool | None = None
    """None: the default, with a fine-tuned expansion model only (`Expander.fine_tuned`)."""
    budget_ms: float | None = None
    explain: bool = False
    full: bool = False
    max_len: int = 300
    filter: Filter | None = None
    chunk_strategy: ChunkStrategy | None = None
    """How candidates are cut to pick the passage each is reranked on (`--chunk-strategy`);
    None: each collection's own (index.yml), the strategy its vectors were made with."""
    fuzzy: bool = False
    """Keyword lines search a word no document holds as its nearest indexed word (search/typos.py)."""


class Skipped(NamedTuple):
    stage: str
    reason: str


@dataclass
class HybridOutcome:
    hits: list[Pointer]
    stages: list[Stage]
    warnings: list[str] = field(default_factory=list)
    expansion: list[tuple[SubQueryType, str]] | None = None
    below_min_score: bool = False
    closest: Pointer | None = None
    """When `min_relevance` dropped every result: the most relevant of them, for the answer to name."""
    elapsed_ms: float = 0.0
    budget_ms: float | None = None
    filter: FilterReport | None = None

    @property
    def skipped(self) -> list[Skipped]:
        """Stages that did not run, or ran partly, with the reason."""
        return [Skipped(s.stage, s.detail) for s in self.stages if s.status in ("skipped", "partial")]


class CostModel:
    """What each stage costs on this machine, in seconds per unit: an exponentially
    weighted mean of observed timings, starting from priors measured on 2 CPU cores
    with the small test models (a first query plans conservatively)."""

    PRIORS = {"expand": 1.0, "embed": 0.03, "vsearch": 0.01, "rerank": 0.3, "fts": 0.005}
    ALPHA = 0.3

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._est: dict[str, float] = {}

    def estimate(self, key: str, model: str = "") -> float:
        with self._lock:
            return self._est.get(f"{key}:{model}", self.PRIORS[key])

    def observe(self, key: str, seconds: float, units: int = 1, model: str = "") -> None:
        if units < 1:
            return
        per = seconds / units
        name = f"{key}:{model}"
        with self._lock:
            old = self._est.get(name)
            self._est[name] = per if old is None else (1 - self.ALPHA) * old + self.ALPHA * per


@dataclass
class VectorLeg:
    """What the vector stage needs: query embedding and a KNN over the scope."""

    embed: Callable[[list[str]], list[list[float]]]
    search: Callable[[Sequence[float], int, Scope], list[VecHit]]
    nearest: Callable[[Sequence[float], Mapping[str, Sequence[int]]], dict[int, VecHit]]
    """Given documents' nearest chunks (ids by collection), exact: what cosine reranking reads."""
    model: str
    scale: Callable[[], CosineScale] | None = None
    """The embedder's cosine scale (`relevance.Scales`), what a hit's relevance reads its cosine on."""
    warning: str | None = None  # e.g. documents still pending


@dataclass
class Legs:
    """The optional stages and, for each one missing, why (announced, never silent)."""

    vector: VectorLeg | None
    vector_reason: str
    expander: Expander | None
    expander_reason: str
    reranker: Reranker | CosineScorer | None
    reranker_reason: str
    backlog: Callable[[], float] = lambda: 0.0
    """Seconds of other work the inference worker has ahead of a new call (`WorkerClient.backlog`)."""


class _Clock:
    def __init__(self, budget_ms: float | None) -> None:
        self.t0 = time.perf_counter()
        self.deadline = None if budget_ms is None else self.t0 + budget_ms / 1000

    def remaining(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.perf_counter()

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000

    def worker_wait(self) -> float | None:
        """How long a model call may wait for the inference worker (in line or for its answer): what
        the budget has left, less the reserve for shaping the answer; None without a budget."""
        return None if self.deadline is None else max(self.remaining() - SHAPE_RESERVE_S, 0.0)


@dataclass(frozen=True)
class _VectorWork:
    """Texts embedded and searched by the vector leg, with what each step took."""

    texts: list[str]
    qvecs: list[Sequence[float]]
    hits: list[list[VecHit]]
    embed_s: float
    search_s: float


@dataclass
class _Sub:
    """A sub-query to route: its type, text, and list weight."""

    kind: Literal["original", "lex", "vec", "hyde"]
    text: str
    weight: float


RerankScores: TypeAlias = dict[int, tuple[float, float, bool]]
"""doc id → (normalised rerank score, raw score, cached) for the candidates the rerank stage scored."""


ScoredBy = Literal["relevance", "fusion", "blend"]
"""What a hybrid result's score is (`_shape`): its relevance, the fusion, or the fusion blended
with the rerank."""


@dataclass
class _Run:
    """What one query run carries from stage to stage: each stage takes the run and adds
    its own line to `stages`, so no stage needs the others' pieces passed one by one."""

    opts: QueryOptions
    clock: _Clock
    stages: list[Stage]
    query: str
    """The primary text (`primary_text`): the one passages are picked for and reranked against."""
    intent: str | None
    terms: tuple[str, ...]
    iterms: tuple[str, ...]
    vec_hits: dict[int, VecHit] = field(default_factory=dict)
    """Each document's nearest chunk over every vector list: where a vector-only candidate's passage lies."""
    candidates: list[Candidate] = field(default_factory=list)
    """The fused candidates, in fused order, less any whose document is gone since fusion."""
    plain: bool = False
    """Only the query's own keyword and vector lists were fused (no expansion, no typed lines):
    what the relevance model was fitted on, so what may be ranked by it."""
    held: float = 1.0
    """How much of the query's own text the collections searched hold (`lexical.Held`), from
    its keyword probe; a probe that found nothing held none of it. Typed lines have no such
    text: 1."""
    outside: _Outside | None = None
    """What the probe searched, for an answer that keeps no result (`HybridQuery._elsewhere`)."""
    docs: dict[int, DocRow] = field(default_factory=dict)

    @property
    def rerank_query(self) -> str:
        """The intent goes first: it says what the query is for, which its words alone may not."""
        return f"{self.intent}\n\n{self.query}" if self.intent else self.query


@dataclass(frozen=True)
class _Outside:
    """The probe's query and scope, kept so that only an answer that keeps no result looks
    for the words that documents outside the search hold (`HybridQuery._elsewhere`)."""

    lexq: LexQuery
    scope: Scope
    words: tuple[str, ...] | None
    """From the probe's hits (`KeywordHit.elsewhere`); None when it found nothing."""


@dataclass
class _RerankWork:
    """A rerank stage in progress: what it scores, what it found cached or scored, and
    what the budget decisions last saw (the stage's report quotes them)."""

    passages: dict[int, str]
    keys: dict[int, str]
    """Each candidate's cache key: the query, the model and the passage it is scored on."""
    raw: dict[int, tuple[float, bool]]
    """doc id → (raw score, cached)."""
    per: float
    """Seconds per candidate, re-estimated after each batch."""
    new: dict[str, str] = field(default_factory=dict)
    """Scores to cache: key → score."""
    scored: int = 0
    ahead: float = 0.0
    error: str = ""


class HybridQuery:
    """One query run over one index; the engine builds it with the legs it has."""

    def __init__(
        self,
        store: IndexStore,
        config: Config,
        legs: Legs,
        costs: CostModel,
        *,
        index_name: str | None = None,
        passage_chars: int = RERANK_PASSAGE_CHARS,
    ) -> None:
        self.store = store
        self.config = config
        self.legs = legs
        self.costs = costs
        self.index_name = index_name
        self.passage_chars = passage_chars
        self._qvecs: dict[str, Sequence[float]] = {}
        """Each embedded sub-query's vector by its text (one query per instance): cosine reranking reuses one."""
        self._typos: list[str] | None = None
        """`--fuzzy`: the notes of the words corrected in this query's keyword searches."""
        self._parsed: dict[str, LexQuery] = {}

    def run(self, doc: QueryDoc, opts: QueryOptions) -> HybridOutcome:
        clock = _Clock(opts.budget_ms)
        self._typos = [] if opts.fuzzy else None
        primary = primary_text(doc)
        run = _Run(
            opts=opts,
            clock=clock,
            stages=[],
            query=primary,
            intent=doc.intent,
            terms=self._lexq(primary).terms,  # a corrected word is what a passage holds
            iterms=intent_terms(doc.intent),
        )
        stages = run.stages
        out = HybridOutcome(hits=[], stages=stages, budget_ms=opts.budget_ms)
        scope = scope_of(self.config, opts.collections, opts.filter, dialect=self.store.dialect)
        with self.store.read() as conn:
            out.filter = filter_report(conn, scope)
        lists: list[RankedList] = []
        expansion_lists: list[int] = []

        with cores.sharing() if self.legs.vector is not None else nullcontext():  # the legs run side by side
            beside = self._vectors_beside(doc, scope, run)
            subs = self._expand_mode(doc, scope, run, lists, out) if doc.mode == "expand" else _typed_subs(doc)
            self._keyword(subs, scope, stages, lists, expansion_lists, typed=doc.mode == "typed")
            self._vectors(subs, scope, run, lists, expansion_lists, out, beside)
        if (
            out.expansion
            and expansion_lists
            and self.legs.expander
            and not any(lists[i].items for i in expansion_lists)
        ):
            self.legs.expander.forget(doc.query)  # expansions that found nothing are not worth keeping (§12)

        run.plain = all(ranked.query_type == "original" for ranked in lists)
        t = time.perf_counter()
        fused = fuse(lists)
        candidates = fused[: opts.candidate_limit]  # --all returns every candidate, never more (spec §17.2)
        stages.append(
            Stage(
                "fuse",
                "ran",
                (time.perf_counter() - t) * 1000,
                f"{sum(1 for r in lists if r.items)} lists, {len(fused)} documents, "
                f"{len(candidates)} candidates (limit {opts.candidate_limit})",
            )
        )
        with self.store.read() as conn:
            run.docs = fetch_ids(conn, [c.doc_id for c in candidates])
        run.candidates = [c for c in candidates if c.doc_id in run.docs]
        self._shape(run, self._rerank(run), out)
        out.warnings += filter_warnings(out.filter, len(out.hits), opts.limit) + (self._typos or [])
        out.warnings = list(dict.fromkeys(out.warnings))
        out.elapsed_ms = clock.elapsed_ms()
        return out

    # -- stages ---------------------------------------------------------------

    def _expand_mode(
        self, doc: QueryDoc, scope: Scope, run: _Run, lists: list[RankedList], out: HybridOutcome
    ) -> list[_Sub]:
        """Probe BM25, then expand unless the probe is conclusive or the budget says no."""
        opts, clock, stages = run.opts, run.clock, run.stages
        query = doc.query
        idents = identifier_tokens(query)
        t = time.perf_counter()
        expander = self.legs.expander
        lexq = self._lexq(query)
        probe = self._fts(lexq, scope, count_matched=self._may_expand(opts))
        run.held = probe[0].held if probe else 0.0
        run.outside = _Outside(lexq, scope, probe[0].elsewhere if probe else None) if lexq.positives else None
        weight = 2.0 * (IDENTIFIER_BOOST if idents else 1.0)
        lists.append(RankedList("fts", "original", query, weight, [(h.doc.id, h.score) for h in probe]))
        detail = f"{len(probe)} keyword hits"
        if idents:
            detail += f"; identifier-like {', '.join(idents)}: keyword weight doubled"
        stages.append(Stage("probe", "ran", (time.perf_counter() - t) * 1000, detail))
        subs = [_Sub("original", query, 2.0)]

        t = time.perf_counter()
        if opts.expand is False:
            stages.append(Stage("expand", "off", 0, "not requested (--no-expand / expand: false)"))
            return subs
        if expander is not None and opts.expand is None and not expander.fine_tuned:
            stages.append(
                Stage(
                    "expand",
                    "off",
                    0,
                    "not run by default: a general small model's expansions measured no gain "
                    "(README, 'What each stage buys'); --expand (expand: true) runs it",
                )
            )
            return subs
        if expander is None:
            stages.append(Stage("expand", "skipped", 0, self.legs.expander_reason))
            return subs
        scores, top_matched_all = _signal(probe)
        if strong_signal(scores, doc.intent, top_matched_all=top_matched_all):
            second = scores[1] if len(scores) > 1 else 0.0
            stages.append(Stage("expand", "skipped", 0, f"strong keyword signal ({scores[0]:.2f} vs {second:.2f})"))
            return subs
        cached = expander.cached(query)
        if cached is None:
            need = self.costs.estimate("expand", expander.model_uri)
            after = self._reserve_after_expand(opts, scope, out.filter)
            ahead = self.legs.backlog() if clock.deadline is not None else 0.0
            if ahead + need + after > clock.remaining():
                stages.append(
                    Stage(
                        "expand",
                        "skipped",
                        0,
                        f"budget: expansion takes ~{need * 1000:.0f} ms and the later stages ~{after * 1000:.0f} ms"
                        + _behind(ahead)
                        + f"; {max(clock.remaining(), 0) * 1000:.0f} ms left",
                    )
                )
                return subs
        try:
            with wait_at_most(clock.worker_wait()):
                exp: Expansion = cached or expander.expand(query)
        except QmdError as e:
            stages.append(Stage("expand", "skipped", (time.perf_counter() - t) * 1000, e.message))
            return subs
        if not exp.cached:
            self.costs.observe("expand", exp.seconds, model=expander.model_uri)
        out.expansion = exp.lines
        text = ", ".join(f"{k}: {v}" for k, v in exp.lines)
        if exp.fallback:
            detail = "the model gave no usable line; searching the query as it is"
        else:
            detail = f"{len(exp.lines)} lines ({text})"
        stages.append(Stage("expand", "cached" if exp.cached else "ran", (time.perf_counter() - t) * 1000, detail))
        if not exp.fallback:
            subs += [_Sub(k, v, 1.0) for k, v in exp.lines]
        return subs

    def _reserve_after_expand(self, opts: QueryOptions, scope: Scope, report: FilterReport | None) -> float:
        """What must still fit after expansion: vectors for a few texts, rerank of the candidates."""
        total = SHAPE_RESERVE_S + 3 * self.costs.estimate("fts")
        if self.legs.vector:
            total += 3 * self._vector_cost(scope)
        rr = self.legs.reranker
        if rr and not isinstance(rr, CosineScorer) and reranks(rr, opts.rerank):
            eligible = report.eligible if report is not None else self._documents_in(scope)
            total += min(opts.candidate_limit, eligible) * self.costs.estimate("rerank", rr.uri)
        return total

    def _documents_in(self, scope: Scope) -> int:
        """Active documents in the collections of `scope` (a filter's report counts its own)."""
        with self.store.read() as conn:
            marks = ",".join("?" * len(scope.collections))
            return conn.execute(
                f"SELECT COUNT(*) FROM documents WHERE active = 1 AND collection IN ({marks})", scope.collections
            ).fetchone()[0]

    def _lexq(self, text: str) -> LexQuery:
        """`text` parsed and, with `--fuzzy`, corrected: once a text, for the probe, the
        keyword lines and the words a passage is found by alike."""
        if text not in self._parsed:
            lexq = parse_lex(text)
            self._parsed[text] = lexq if self._typos is None else fuzzed(self.store, lexq, self._typos)
        return self._parsed[text]

    def _elsewhere(self, outside: _Outside) -> list[str]:
        """The words of the query that only documents outside the search hold, as a warning;
        a probe that found nothing asks the whole index (`held_outside`)."""
        words = outside.words
        if words is None:
            words = held_outside(self.store, outside.lexq, outside.scope)
        if not words:
            return []
        scope = (
            "collections not searched" if outside.scope.doc_filter is None else "documents the filter or scope left out"
        )
        return [f"only {scope} hold {', '.join(repr(w) for w in words)}: searching them may answer it"]

    def _fts(self, lexq: LexQuery, scope: Scope, *, count_matched: bool = False) -> list[KeywordHit]:
        if not lexq.positives:
            return []
        t = time.perf_counter()
        hits = lexical_hits(self.store, lexq, scope, LIST_FETCH, count_matched=count_matched)
        self.costs.observe("fts", time.perf_counter() - t)
        return hits

    def _keyword(
        self,
        subs: list[_Sub],
        scope: Scope,
        stages: list[Stage],
        lists: list[RankedList],
        expansion_lists: list[int],
        *,
        typed: bool,
    ) -> None:
        """FTS for every lex sub-query (the original query of an expand query went
        through the probe). A typed lex line with identifiers weighs double."""
        t = time.perf_counter()
        n = 0
        boosted: list[str] = []
        for sub in subs:
            if sub.kind != "lex":
                continue
            hits = self._fts(self._lexq(sub.text), scope)
            idents = identifier_tokens(sub.text) if typed else ()
            boosted += idents
            weight = sub.weight * (IDENTIFIER_BOOST if idents else 1.0)
            lists.append(RankedList("fts", "lex", sub.text, weight, [(h.doc.id, h.score) for h in hits]))
            expansion_lists.append(len(lists) - 1)
            n += 1
        if n:
            found = sum(len(r.items) for r in lists if r.source == "fts" and r.query_type == "lex")
            detail = f"{n} lex lists, {found} hits"
            if boosted:
                detail += f"; identifier-like {', '.join(dict.fromkeys(boosted))}: keyword weight doubled"
            stages.append(Stage("keyword", "ran", (time.perf_counter() - t) * 1000, detail))

    def _vector_cost(self, scope: Scope) -> float:
        """Seconds one text costs the vector leg: its embedding and a KNN per collection."""
        assert self.legs.vector is not None
        embed = self.costs.estimate("embed", self.legs.vector.model)
        return embed + len(scope.collections) * self.costs.estimate("vsearch")

    def _may_expand(self, opts: QueryOptions) -> bool:
        """Whether an expand-mode query may run the expansion model: asked for, or by default
        with a model fine-tuned for it (`_expand_mode` says why not otherwise)."""
        expander = self.legs.expander
        if expander is None or opts.expand is False:
            return False
        return bool(opts.expand) or expander.fine_tuned

    def _vectors_beside(self, doc: QueryDoc, scope: Scope, run: _Run) -> Future[_VectorWork] | None:
        """The vector leg of the texts known before the probe (a plain query's own text, a
        typed query's vec and hyde lines), started now on `_BESIDE`. None when there are
        none, when the budget may not fit them (`_vectors` then decides, as it always did),
        or when an expansion may run: its model call would queue behind this one's."""
        leg = self.legs.vector
        if leg is None:
            return None
        if doc.mode == "expand":
            texts = [] if self._may_expand(run.opts) else [doc.query]
        else:
            texts = [s.text for s in _typed_subs(doc) if s.kind in ("vec", "hyde")]
        clock = run.clock
        if not texts or (clock.deadline and len(texts) * self._vector_cost(scope) > clock.remaining()):
            return None
        context = contextvars.copy_context()  # the budget's `wait_at_most` travels with it
        return _BESIDE.submit(context.run, _vector_work, leg, texts, scope, clock)

    def _vectors(
        self,
        subs: list[_Sub],
        scope: Scope,
        run: _Run,
        lists: list[RankedList],
        expansion_lists: list[int],
        out: HybridOutcome,
        beside: Future[_VectorWork] | None,
    ) -> None:
        clock, stages, vec_hits = run.clock, run.stages, run.vec_hits
        wanted = [s for s in subs if s.kind in ("original", "vec", "hyde")]
        if not wanted:
            return
        leg = self.legs.vector
        not_run = ", ".join(f'{s.kind} "{s.text}"' for s in wanted)
        if leg is None:
            stages.append(Stage("vector", "skipped", 0, f"{self.legs.vector_reason}; not run: {not_run}"))
            return
        t = time.perf_counter()
        works: list[_VectorWork] = []
        try:
            if beside is not None:
                works.append(beside.result())
            done = {text for w in works for text in w.texts}
            rest = [s for s in wanted if s.text not in done]
            per_text = self._vector_cost(scope)
            fit = int(max(clock.remaining() - SHAPE_RESERVE_S, 0) / per_text) if clock.deadline else len(rest)
            if rest and fit < 1 and not works:
                stages.append(
                    Stage(
                        "vector",
                        "skipped",
                        0,
                        f"budget: vector search takes ~{per_text * 1000:.0f} ms per query; "
                        f"{max(clock.remaining(), 0) * 1000:.0f} ms left; not run: {not_run}",
                    )
                )
                return
            if rest[:fit]:
                works.append(_vector_work(leg, [s.text for s in rest[:fit]], scope, clock))
        except QmdError as e:
            stages.append(
                Stage("vector", "skipped", (time.perf_counter() - t) * 1000, f"{e.message}; not run: {not_run}")
            )
            return
        found: dict[str, tuple[Sequence[float], list[VecHit]]] = {}
        for w in works:
            self.costs.observe("embed", w.embed_s, len(w.texts), model=leg.model)
            self.costs.observe("vsearch", w.search_s, len(w.texts) * len(scope.collections))
            found.update(zip(w.texts, zip(w.qvecs, w.hits)))
        fitted = [s for s in wanted if s.text in found]
        for sub in fitted:
            qvec, hits = found[sub.text]
            self._qvecs.setdefault(sub.text, qvec)
            for h in hits:
                if h.doc_id not in vec_hits or h.distance < vec_hits[h.doc_id].distance:
                    vec_hits[h.doc_id] = h
            lists.append(
                RankedList("vec", sub.kind, sub.text, sub.weight, [(h.doc_id, vector_score(h.distance)) for h in hits])
            )
            if sub.kind != "original":
                expansion_lists.append(len(lists) - 1)
        embedded = sum(len(w.texts) for w in works)
        detail = f"{embedded} queries embedded in {sum(w.embed_s for w in works) * 1000:.0f} ms"
        if beside is not None:
            detail += " (beside the keyword leg)"
        if len(fitted) < len(wanted):
            detail += f"; budget: {len(wanted) - len(fitted)} of {len(wanted)} vector queries dropped"
        took = sum(w.embed_s + w.search_s for w in works) * 1000
        stages.append(Stage("vector", "partial" if len(fitted) < len(wanted) else "ran", took, detail))
        if leg.warning:
            out.warnings.append(leg.warning)

    def _rerank(self, run: _Run) -> RerankScores:
        """The rerank stage, or the reason it did not run: scores cached for these very
        passages are reused, the rest scored in batches while the budget lasts."""
        rr = self._reranker(run)
        if isinstance(rr, CosineScorer):
            return self._cosine(rr, run)
        if rr is None or not run.candidates:
            return {}
        t = time.perf_counter()
        work = self._cached_scores(rr, run)
        self._score_within_budget(rr, run, work)
        llm_cache.put_many(self.store, work.new, model=rr.uri)
        return _rerank_report(rr, run, work, (time.perf_counter() - t) * 1000)

    def _reranker(self, run: _Run) -> Reranker | CosineScorer | None:
        """The reranker this run uses; None, with the stage's line saying why, when it runs none."""
        rr = self.legs.reranker
        if run.opts.rerank is False:
            run.stages.append(Stage("rerank", "off", 0, "not requested (--no-rerank / rerank: false)"))
            return None
        if rr is not None and not reranks(rr, run.opts.rerank):
            run.stages.append(Stage("rerank", "off", 0, NOT_BY_DEFAULT[rr.method]))
            return None
        if rr is None:
            run.stages.append(Stage("rerank", "skipped", 0, self.legs.reranker_reason))
        return rr

    def _cached_scores(self, rr: Reranker, run: _Run) -> _RerankWork:
        """Each candidate's passage and the scores already cached for it: a score is kept
        per query, model (its scoring and passage length included) and passage, so a
        repeated query costs no model call."""
        passages = {
            c.doc_id: _rerank_passage(
                run.docs[c.doc_id],
                run.vec_hits.get(c.doc_id),
                c,
                run.terms,
                run.iterms,
                self._strategy(run.docs[c.doc_id], run.opts),
                self.passage_chars,
            )
            for c in run.candidates
        }
        model = f"{rr.uri}|{rr.method}|{rr.passage_tokens}|{SCORING}"
        keys = {
            d: llm_cache.cache_key("rerank", {"query": run.rerank_query, "model": model, "chunk": passage})
            for d, passage in passages.items()
        }
        cached = llm_cache.get_many(self.store, list(keys.values()))
        raw = {d: (float(cached[k]), True) for d, k in keys.items() if k in cached}
        return _RerankWork(passages, keys, raw, per=self.costs.estimate("rerank", rr.uri))

    def _score_within_budget(self, rr: Reranker, run: _Run, work: _RerankWork) -> None:
        """Score the uncached candidates a batch at a time, best first, checking the budget
        before each batch (the worker's backlog counts), so a slow model trims the tail."""
        todo = [c.doc_id for c in run.candidates if c.doc_id not in work.raw]
        if not todo and rr.learning:  # the scores' scale comes with an answer: one candidate asks for it
            todo = [run.candidates[0].doc_id]
        for i in range(0, len(todo), RERANK_BATCH):
            work.ahead = self.legs.backlog() if run.clock.deadline is not None else 0.0
            batch = _within_budget(todo[i : i + RERANK_BATCH], work.per, work.ahead, run.clock)
            if not batch or not self._score_batch(rr, run, work, batch):
                break

    def _score_batch(self, rr: Reranker, run: _Run, work: _RerankWork, batch: list[int]) -> bool:
        """One worker call; False when the model failed (its message becomes the stage's reason)."""
        t = time.perf_counter()
        try:
            with wait_at_most(run.clock.worker_wait()):
                scores = rr.score(run.rerank_query, [work.passages[d] for d in batch])
        except QmdError as e:
            work.error = e.message
            return False
        self.costs.observe("rerank", time.perf_counter() - t, len(batch), model=rr.uri)
        work.per = self.costs.estimate("rerank", rr.uri)
        for d, s in zip(batch, scores):
            work.raw[d] = (s, False)
            work.new[work.keys[d]] = repr(s)
        work.scored += len(batch)
        return True

    def _cosine(self, rr: CosineScorer, run: _Run) -> RerankScores:
        """doc id → (clipped cosine, cosine, False): the rerank stage by the embedder's
        similarity to each candidate's nearest chunk, against the reranked text's vector
        (the one the vector stage embedded, else embedded now)."""
        t = time.perf_counter()
        leg = self.legs.vector
        candidates, stages = run.candidates, run.stages
        if leg is None:
            stages.append(Stage("rerank", "skipped", 0, f"cosine scoring needs vectors: {self.legs.vector_reason}"))
            return {}
        if not candidates:
            return {}
        rquery = run.rerank_query
        qvec = self._qvecs.get(rquery)
        if qvec is None:
            try:
                with wait_at_most(run.clock.worker_wait()):
                    qvec = leg.embed([rquery])[0]
            except QmdError as e:
                stages.append(Stage("rerank", "skipped", (time.perf_counter() - t) * 1000, e.message))
                return {}
        by_collection: dict[str, list[int]] = {}
        for c in candidates:
            by_collection.setdefault(run.docs[c.doc_id].collection, []).append(c.doc_id)
        nearest = leg.nearest(qvec, by_collection)
        ids = [c.doc_id for c in candidates if c.doc_id in nearest]
        # the cosine, not `vector_score`: clipped, it is an absolute relevance in [0, 1] for the
        # blend, where 1/(1 + d) would give every candidate at least 1/3 and reorder the blend
        raw = [1.0 - nearest[d].distance for d in ids]
        detail = (
            f"cosine: the embedder's similarity to each candidate's nearest chunk"
            f" ({len(ids)} of {len(candidates)} candidates)"
        )
        if len(ids) < len(candidates):
            detail += f"; the other {len(candidates) - len(ids)} have no vectors yet and count 0 for the rerank term"
        status: Status = "partial" if len(ids) < len(candidates) else "ran"
        stages.append(Stage("rerank", status, (time.perf_counter() - t) * 1000, detail))
        return {d: (n, r, False) for d, n, r in zip(ids, rr.normalize(raw), raw)}

    def _strategy(self, doc: DocRow, opts: QueryOptions) -> ChunkStrategy:
        coll = self.config.collections.get(doc.collection)
        return opts.chunk_strategy or (coll.chunk_strategy if coll else DEFAULT_CHUNK_STRATEGY)

    def _relevance(self, run: _Run, out: HybridOutcome) -> tuple[dict[int, Evidence], bool]:
        """Each candidate's `relevance` evidence, and whether it had vector evidence: without (no
        vector list ran, or the embedder's scale could not be measured) it comes from keywords alone."""
        cosines = {d: 1.0 - h.distance for d, h in run.vec_hits.items()}
        scale = None
        if cosines and self.legs.vector is not None and self.legs.vector.scale is not None:
            try:
                with wait_at_most(run.clock.worker_wait()):
                    scale = self.legs.vector.scale()
            except QmdError as e:
                out.warnings.append(f"relevance from keyword evidence alone: {e.message}")
        # a candidate no vector list found is at most as near as the least near one listed
        floor = min(cosines.values(), default=0.0)
        evidence = {c.doc_id: _evidence(c, cosines.get(c.doc_id, floor), scale) for c in run.candidates}
        keyword = [e.keyword for e in evidence.values() if e.keyword > 0]
        stands = standout(keyword, map(scale, cosines.values()) if scale is not None else [])
        return {d: replace(e, standout=stands, held=run.held) for d, e in evidence.items()}, scale is not None

    def _shape(self, run: _Run, rerank: RerankScores, out: HybridOutcome) -> None:
        """Order and cut the candidates. Without a rerank, a plain query's candidates are
        ranked by their relevance when it has vector evidence: a sum of the two legs'
        calibrated scores, which beat rank fusion on every set measured (nDCG@10 held out:
        node 0.871 -> 0.879, pydoc 0.780 -> 0.803, man 0.927 -> 0.929; the eval's hard
        questions MRR 0.940 -> 0.960), and their score is that relevance."""
        opts = run.opts
        reranked = bool(rerank)
        evidence, vector_evidence = self._relevance(run, out)
        chance = {d: relevance(e) for d, e in evidence.items()}
        by_relevance = not reranked and run.plain and vector_evidence
        scored_by: ScoredBy = "blend" if reranked else "relevance" if by_relevance else "fusion"
        scored: list[tuple[float, float, Candidate]] = []
        for c in run.candidates:
            if reranked:
                got = rerank.get(c.doc_id)
                score, w = blend(c, got[0] if got else None)
            else:
                score, w = (chance[c.doc_id] if by_relevance else c.fusion), 1.0
            scored.append((score, w, c))
        scored.sort(key=lambda x: (-x[0], x[2].rrf_rank))
        above = [x for x in scored if x[0] >= opts.min_score]
        out.below_min_score = bool(scored) and not above
        kept = [x for x in above if chance[x[2].doc_id] >= opts.min_relevance]
        if len(kept) < len(above) and not vector_evidence:
            out.warnings.append("the relevance floor read keyword evidence alone (no vector search ran): less sure")
        if not opts.all_results:
            kept = kept[: opts.limit]

        def pointer(score: float, w: float, c: Candidate) -> Pointer:
            got = rerank.get(c.doc_id)
            why = _explain(c, got, w, score, scored_by, evidence[c.doc_id], chance[c.doc_id]) if opts.explain else None
            hit = point_at(
                run.docs[c.doc_id],
                score,
                self.config,
                run.terms,
                full=opts.full,
                index_name=self.index_name,
                max_len=opts.max_len,
                lines_within=_vector_region(c, run.vec_hits.get(c.doc_id)),
                intent_terms=run.iterms,
                explain=why,
            )
            hit.fusion = c.fusion
            hit.rerank = got[0] if got else None
            hit.relevance = round(chance[c.doc_id], 4)
            return hit

        if above and not kept:
            out.closest = pointer(*max(above, key=lambda x: chance[x[2].doc_id]))
        out.hits, cut = within_answer((pointer(*x) for x in kept), len(kept))
        out.warnings += [cut] if cut else []
        if not kept and run.outside is not None:
            out.warnings += self._elsewhere(run.outside)


def _evidence(c: Candidate, cosine: float, scale: CosineScale | None) -> Evidence:
    """A candidate's keyword score and its cosine on the embedder's scale (none without one)."""
    keyword = max((k.backend_score for k in c.contributions if k.source == "fts"), default=0.0)
    return Evidence(keyword, None if scale is None else scale(cosine))


def _signal(probe: list[KeywordHit]) -> tuple[list[float], bool]:
    """Spec §13.2's strong-signal inputs, on the original's scores: the coordination of
    BM25's top hit and the best of the rest's, and whether the top hit holds every item.
    The probe counted its items (`count_matched`)."""
    coordinations = [h.coordination for h in probe]
    if None in coordinations:
        raise RuntimeError("the strong-signal test needs a probe that counted its items")
    scores = [c for c in coordinations if c is not None]
    top_matched_all = bool(probe) and probe[0].matched == probe[0].total
    return scores[:1] + sorted(scores[1:], reverse=True)[:1], top_matched_all


def _behind(ahead: float) -> str:
    """What a budget decision says about the inference worker's other work, when it counted."""
    return f", behind ~{ahead * 1000:.0f} ms of other work in the inference worker" if ahead >= 0.05 else ""


def _within_budget(batch: list[int], per: float, ahead: float, clock: _Clock) -> list[int]:
    """The head of `batch` the budget still has time to score, after the reserve for the
    answer and the worker's other work: an empty one ends the stage early."""
    if clock.deadline is None:
        return batch
    room = clock.remaining() - SHAPE_RESERVE_S - ahead
    return batch if room >= per * len(batch) else batch[: int(max(room, 0) / per)]


def _rerank_report(rr: Reranker, run: _Run, work: _RerankWork, ms: float) -> RerankScores:
    """The stage's line and its scores, normalised together: a candidate left unscored (budget
    or a failed call) counts 0 for the rerank term, and the line says how many and why."""
    if not work.raw:
        why = work.error or (
            f"budget: scoring takes ~{work.per * 1000:.0f} ms per candidate{_behind(work.ahead)}; "
            f"{max(run.clock.remaining(), 0) * 1000:.0f} ms left"
        )
        run.stages.append(Stage("rerank", "skipped", ms, why))
        return {}
    candidates = run.candidates
    ids = [c.doc_id for c in candidates if c.doc_id in work.raw]
    norm = rr.normalize([work.raw[d][0] for d in ids])
    n_cached = sum(1 for d in ids if work.raw[d][1])
    detail = f"{rr.method}: {len(ids)} of {len(candidates)} candidates ({n_cached} cached, {work.scored} scored)"
    if len(ids) < len(candidates):
        detail += f"; {work.error or 'budget'}: the other {len(candidates) - len(ids)} count 0 for the rerank term"
    run.stages.append(Stage("rerank", "partial" if len(ids) < len(candidates) else "ran", ms, detail))
    return {d: (n, work.raw[d][0], work.raw[d][1]) for d, n in zip(ids, norm)}


def _vector_work(leg: VectorLeg, texts: list[str], scope: Scope, clock: _Clock) -> _VectorWork:
    """Embed `texts` (within what the budget lets a model call wait) and search each."""
    t = time.perf_counter()
    with wait_at_most(clock.worker_wait()):
        qvecs = leg.embed(texts)
    t_embed = time.perf_counter() - t
    hits = [leg.search(q, LIST_FETCH, scope) for q in qvecs]
    return _VectorWork(texts, list(qvecs), hits, t_embed, time.perf_counter() - t - t_embed)


def primary_text(doc: QueryDoc) -> str:
    """The text that picks passages and is reranked against (§13.3 step 5)."""
    if doc.mode == "expand":
        return doc.query
    for kind in ("lex", "vec"):
        for s in doc.searches:
            if s.type == kind:
                return s.text
    return doc.searches[0].text


def _typed_subs(doc: QueryDoc) -> list[_Sub]:
    """The first sub-query's lists weigh 2 whatever its type (§13.3, [P])."""
    return [_Sub(s.type, s.text, 2.0 if i == 0 else 1.0) for i, s in enumerate(doc.searches)]


def _vector_region(c: Candidate, vh: VecHit | None) -> tuple[int, int] | None:
    """The lines of the chunk a vector search matched, when only vectors found the
    candidate: no keyword line to point at, so its passage lies there."""
    if vh is None or any(k.source != "vec" for k in c.contributions):
        return None
    return vh.start_line, vh.end_line


def _rerank_passage(
    doc: DocRow,
    vh: VecHit | None,
    c: Candidate,
    terms: tuple[str, ...],
    iterms: tuple[str, ...],
    strategy: ChunkStrategy = DEFAULT_CHUNK_STRATEGY,
    chars: int = RERANK_PASSAGE_CHARS,
) -> str:
    """The candidate's best chunk: around its best keyword line, or the chunk its
    vector match came from when only vectors found it; under the `auto` strategy a code
    file's window stays inside the syntax unit (function, class, imports) holding that line."""
    within = _vector_region(c, vh)
    passage = best_passage(doc.body, terms, max_len=10**9, lines_within=within, intent_terms=iterms)
    unit = code_unit(doc.body, doc.path, passage.line, chars) if strategy == "auto" else None
    text = passage_window(doc.body, passage, chars, within=unit)
    return f"{doc.title}\n{text}" if doc.title and doc.title not in text else text


def _explain(
    c: Candidate,
    got: tuple[float, float, bool] | None,
    weight: float,
    score: float,
    scored_by: ScoredBy,
    evidence: Evidence,
    probability: float,
) -> dict:
    """Why this result ranked where it did, in the original's `--explain` shape (§14.4), and
    what its score is (`scoredBy`) with its relevance (`probability`, from `evidence`) and that
    relevance's terms; `positionScore` is the fused
    score as a fraction of its maximum (see `qmd.server.search.fusion`)."""
    summed, bias = terms(evidence)
    return {
        "scoredBy": scored_by,
        "relevance": {
            "probability": round(probability, 4),
            "bias": bias,
            "terms": [{"name": t.name, "weight": t.weight, "value": round(t.value, 4)} for t in summed],
        },
        "ftsScores": [round(k.backend_score, 4) for k in c.contributions if k.source == "fts"],
        "vectorScores": [round(k.backend_score, 4) for k in c.contributions if k.source == "vec"],
        "rrf": {
            "rank": c.rrf_rank,
            "positionScore": round(c.fusion, 4),
            "weight": weight,
            "baseScore": round(c.base, 6),
            "topRankBonus": c.bonus,
            "totalScore": round(c.total, 6),
            "contributions": [
                {
                    "listIndex": k.list_index,
                    "source": k.source,
                    "queryType": k.query_type,
                    "query": k.query,
                    "rank": k.rank,
                    "weight": k.weight,
                    "backendScore": round(k.backend_score, 4),
                    "rrfContribution": round(k.rrf, 6),
                }
                for k in sorted(c.contributions, key=lambda k: -k.rrf)
            ],
        },
        "rerankScore": round(got[0], 4) if got else 0.0,
        "rerankRaw": round(got[1], 4) if got else None,
        "rerankCached": got[2] if got else None,
        "blendedScore": round(score, 4),
    }
