"""Retrieval quality, measured: `qmd bench` (seed "Benchmarking", spec §23).

Two kinds of input:

- a **fixture** in the seed's format (``{"collection", "queries": [{id, query, type,
  expected_files, expected_in_top_k}]}``) against a collection already indexed;
- a **BEIR-format folder** (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``),
  indexed into a collection of its own so public sets and a user's own can be measured
  through the same pipeline the CLI runs.

Each query runs on four backends: ``bm25`` (keyword search), ``vector``, ``hybrid`` (the
query pipeline without reranking) and ``full`` (with it). Unlike the original, nothing
reads as a silent zero: a backend that cannot run is a skip with its reason, one that
fails says so, an expected file that is not in the collection is an error naming it, and
a stage the pipeline skipped (no expansion model, say) is reported with a count.

Metrics, with ``R`` the returned files in order and ``E`` the expected ones (graded for
BEIR, grade 1 for a fixture):

- the seed's: ``precision_at_k`` = hits in ``R[:k]`` / min(k, |E|), ``recall`` (anywhere
  in ``R``), ``recall_at_1/3/5``, ``mrr`` (first hit anywhere), ``f1`` of the two;
- BEIR's: ``ndcg_at_10`` with linear gains and log2 discounts (trec_eval's, as BEIR
  reports it), ``recall_at_100``, ``mrr_at_10``.

A returned file matches an expected one when the two paths are equal or one ends with
``/`` + the other, after lowercasing and stripping ``qmd://collection/`` (the original's
suffix test had no path boundary: ``a.md`` matched ``data.md``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from qmd.paths import IndexPaths
from qmd.server.config import Collection, Config, validate_collection_name
from qmd.server.errors import Conflict, InvalidInput, NotFound
from qmd.server.ingest.embed_job import EmbedReport
from qmd.server.search.hybrid import DEFAULT_CANDIDATES, HybridOutcome, QueryOptions
from qmd.server.search.pointers import Pointer, SearchOptions, SearchOutcome
from qmd.server.search.querydoc import QueryDoc, parse_query
from qmd.server.status import VectorState
from qmd.server.store import catalog
from qmd.server.store.db import IndexStore

BACKENDS = ("bm25", "vector", "hybrid", "full")
Backend = Literal["bm25", "vector", "hybrid", "full"]

FIXTURE_DEPTH = 10
"""Results a fixture query asks each backend for: max(k, this), as the seed does."""
BEIR_DEPTH = 100
"""Results a BEIR query asks for: Recall@100 needs the first hundred."""
MAX_QUERIES = 100_000


# -- input ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchQuery:
    id: str
    query: str
    type: str
    """The fixture's label (exact, semantic, ...), for the per-type summary; "beir" for BEIR."""
    expected: dict[str, int]
    """Collection-relative path → relevance grade (> 0)."""
    k: int


@dataclass(frozen=True)
class Fixture:
    description: str
    collection: str | None
    queries: list[BenchQuery]
    source: str
    """Where it came from: the fixture's file name or the BEIR folder."""


def _field(obj: Mapping[str, Any], key: str, kind: type, where: str, *, required: bool = True) -> Any:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise InvalidInput(f"Invalid fixture: {where}.{key} must be {kind.__name__}, got {json.dumps(value)}")
    return value


def parse_fixture(raw: Any, source: str) -> Fixture:
    """A fixture from its parsed JSON; errors name the field to fix."""
    if not isinstance(raw, dict):
        raise InvalidInput("Invalid fixture: expected a JSON object with a 'queries' array")
    if not isinstance(raw.get("queries"), list):
        raise InvalidInput("Invalid fixture: missing 'queries' array")
    if not raw["queries"]:
        raise InvalidInput("Invalid fixture: 'queries' is empty")
    if len(raw["queries"]) > MAX_QUERIES:
        raise InvalidInput(f"Invalid fixture: {len(raw['queries'])} queries; the limit is {MAX_QUERIES}")
    collection = _field(raw, "collection", str, "fixture", required=False)
    queries, seen = [], set()
    for i, q in enumerate(raw["queries"]):
        where = f"queries[{i}]"
        if not isinstance(q, dict):
            raise InvalidInput(f"Invalid fixture: {where} must be an object")
        qid = q.get("id", str(i + 1))
        if not isinstance(qid, str | int) or isinstance(qid, bool):
            raise InvalidInput(f"Invalid fixture: {where}.id must be a string")
        qid = str(qid)
        if qid in seen:
            raise InvalidInput(f"Invalid fixture: {where}.id {qid!r} is used twice")
        seen.add(qid)
        text = _field(q, "query", str, where)
        if not text.strip():
            raise InvalidInput(f"Invalid fixture: {where}.query is empty")
        files = _field(q, "expected_files", list, where)
        if not files or not all(isinstance(f, str) and f.strip() for f in files):
            raise InvalidInput(f"Invalid fixture: {where}.expected_files must be a non-empty array of paths")
        k = q.get("expected_in_top_k", 1)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise InvalidInput(f"Invalid fixture: {where}.expected_in_top_k must be a positive integer")
        label = q.get("type") or "untyped"
        if not isinstance(label, str):
            raise InvalidInput(f"Invalid fixture: {where}.type must be a string")
        queries.append(BenchQuery(qid, text, label, {_norm(f): 1 for f in files}, k))
    description = raw["description"] if isinstance(raw.get("description"), str) else ""
    return Fixture(description, collection, queries, source)


@dataclass(frozen=True)
class BeirDoc:
    id: str
    title: str
    text: str

    @property
    def file(self) -> str:
        """The file it is indexed as: its id when that is a safe file name, else a hash of it."""
        safe = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,100}", self.id) and not self.id.endswith(".")
        return f"{self.id if safe else hashlib.sha1(self.id.encode()).hexdigest()}.md"

    def markdown(self) -> str:
        body = self.text.strip()
        return f"# {self.title.strip()}\n\n{body}\n" if self.title.strip() else f"{body}\n"


def _jsonl(path: Path) -> Iterable[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidInput(f"{path}:{number}: not JSON ({e.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("_id"), str | int):
                raise InvalidInput(f"{path}:{number}: expected an object with an '_id'")
            yield number, row


def load_beir(
    folder: Path, split: str = "test", max_queries: int | None = None
) -> tuple[list[BeirDoc], Fixture, list[str]]:
    """A BEIR-format folder as documents to index and a fixture over them, plus warnings
    (judgments naming documents the corpus does not have are dropped, and counted)."""
    if not folder.is_dir():
        raise InvalidInput(f"BEIR folder not found: {folder}")
    paths = {name: folder / name for name in ("corpus.jsonl", "queries.jsonl")}
    qrels_path = folder / "qrels" / f"{split}.tsv"
    for path in (*paths.values(), qrels_path):
        if not path.is_file():
            splits = sorted(p.stem for p in (folder / "qrels").glob("*.tsv")) if (folder / "qrels").is_dir() else []
            hint = f" (splits here: {', '.join(splits)})" if splits and path == qrels_path else ""
            raise InvalidInput(f"{folder} is not a BEIR folder: {path.relative_to(folder)} is missing{hint}")
    docs: dict[str, BeirDoc] = {}
    for number, row in _jsonl(paths["corpus.jsonl"]):
        doc = BeirDoc(str(row["_id"]), str(row.get("title") or ""), str(row.get("text") or ""))
        if not (doc.title.strip() or doc.text.strip()):
            continue
        if doc.id in docs:
            raise InvalidInput(f"{paths['corpus.jsonl']}:{number}: document id {doc.id!r} is used twice")
        docs[doc.id] = doc
    texts = {str(row["_id"]): str(row.get("text") or "") for _, row in _jsonl(paths["queries.jsonl"])}
    judged: dict[str, dict[str, int]] = {}
    dropped = 0
    with qrels_path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            cols = line.rstrip("\n").split("\t")
            if number == 1 and len(cols) == 3 and not cols[2].lstrip("-").isdigit():
                continue  # the header
            if len(cols) != 3 or not cols[2].lstrip("-").isdigit():
                raise InvalidInput(f"{qrels_path}:{number}: expected 'query-id<TAB>corpus-id<TAB>score'")
            qid, did, grade = cols[0], cols[1], int(cols[2])
            if grade <= 0:
                continue
            if did not in docs:
                dropped += 1
                continue
            judged.setdefault(qid, {})[docs[did].file] = grade
    queries = [
        BenchQuery(qid, texts[qid], "beir", rel, 10) for qid, rel in judged.items() if texts.get(qid, "").strip()
    ]
    if not queries:
        raise InvalidInput(
            f"{qrels_path}: no judged query has both a text in queries.jsonl and a document in the corpus"
        )
    queries = queries[:max_queries] if max_queries else queries
    warnings = [f"{dropped} judgments name documents the corpus does not have; they were left out"] if dropped else []
    return list(docs.values()), Fixture("", None, queries, str(folder)), warnings


def materialize(docs: list[BeirDoc], root: Path) -> None:
    """Write each document as a markdown file under `root`, rewriting only those that
    changed (an unchanged corpus re-indexes as "unchanged"), and remove files the corpus
    no longer has."""
    root.mkdir(parents=True, exist_ok=True)
    wanted = {}
    for doc in docs:
        wanted[doc.file] = doc.markdown()
    for path in root.glob("*.md"):
        if path.name not in wanted:
            path.unlink()
    for name, text in wanted.items():
        path = root / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


@dataclass(frozen=True)
class BenchSpec:
    """What `qmd bench` was asked, whatever the surface."""

    fixture: Any = None
    """A fixture's parsed JSON (None with `beir`)."""
    source: str = "fixture"
    beir: str | None = None
    """A BEIR-format folder instead of a fixture."""
    collection: str | None = None
    backends: tuple[str, ...] = BACKENDS
    split: str = "test"
    max_queries: int | None = None
    embed: bool = False
    """BEIR: embed the bench collection first, so vector, hybrid and full can run."""
    keep: bool = False
    """BEIR: keep the bench collection (and its vectors) for the next run."""
    candidate_limit: int = DEFAULT_CANDIDATES
    """hybrid and full: candidates kept after fusion (and reranked, for full)."""
    expand: bool | None = None
    """hybrid and full: expand each query with the generate model (None: as a query does by default)."""


# -- metrics ----------------------------------------------------------------------------


def _norm(path: str) -> str:
    path = path.strip().lower()
    if path.startswith("qmd://"):
        path = path[len("qmd://") :].split("/", 1)[1] if "/" in path[len("qmd://") :] else ""
    return path.strip("/")


def _matches(returned: str, expected: str) -> bool:
    return returned == expected or returned.endswith("/" + expected) or expected.endswith("/" + returned)


@dataclass
class Metrics:
    precision_at_k: float
    recall: float
    recall_at_1: float
    recall_at_3: float
    recall_at_5: float
    mrr: float
    f1: float
    ndcg_at_10: float
    recall_at_100: float
    mrr_at_10: float
    hits_at_k: int
    total_expected: int
    latency_ms: float
    top_files: list[str]
    unmatched_expected_files: list[str]


def score(returned: list[str], q: BenchQuery, latency_ms: float = 0.0) -> Metrics:
    """Every metric of one query's answer (pure, so the arithmetic is tested on its own)."""
    files = [_norm(f) for f in returned]
    grade_at = [next((g for e, g in q.expected.items() if _matches(f, e)), 0) for f in files]
    first_rank: dict[str, int] = {}
    for rank, f in enumerate(files):
        for e in q.expected:
            if e not in first_rank and _matches(f, e):
                first_rank[e] = rank
    n = len(q.expected)

    def hits(depth: int) -> int:
        return sum(1 for r in first_rank.values() if r < depth)

    precision = hits(q.k) / min(q.k, n)
    recall = len(first_rank) / n
    first = min(first_rank.values(), default=None)
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(grade_at[:10]))
    ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(q.expected.values(), reverse=True)[:10]))
    return Metrics(
        precision_at_k=precision,
        recall=recall,
        recall_at_1=hits(1) / n,
        recall_at_3=hits(3) / n,
        recall_at_5=hits(5) / n,
        mrr=1 / (first + 1) if first is not None else 0.0,
        f1=2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        ndcg_at_10=dcg / ideal if ideal else 0.0,
        recall_at_100=hits(100) / n,
        mrr_at_10=1 / (first + 1) if first is not None and first < 10 else 0.0,
        hits_at_k=hits(q.k),
        total_expected=n,
        latency_ms=latency_ms,
        top_files=files[:10],
        unmatched_expected_files=sorted(e for e in q.expected if e not in first_rank),
    )


MEANS = (
    "precision_at_k",
    "recall",
    "recall_at_1",
    "recall_at_3",
    "recall_at_5",
    "mrr",
    "f1",
    "ndcg_at_10",
    "recall_at_100",
    "mrr_at_10",
    "latency_ms",
)


@dataclass
class Summary:
    """Arithmetic means over the queries a backend answered."""

    queries: int
    means: dict[str, float]
    latency_p50_ms: float


def summarize(metrics: list[Metrics]) -> Summary:
    if not metrics:
        return Summary(0, dict.fromkeys(MEANS, 0.0), 0.0)
    latencies = sorted(m.latency_ms for m in metrics)
    return Summary(
        len(metrics),
        {name: sum(getattr(m, name) for m in metrics) / len(metrics) for name in MEANS},
        latencies[len(latencies) // 2],
    )


# -- running ----------------------------------------------------------------------------


@dataclass
class Answer:
    """One backend's answer to one query: returned files in order, and stages the
    pipeline skipped or ran partly, with their reasons."""

    files: list[str]
    skipped: list[str] = field(default_factory=list)


Runner = Callable[[str, int], Answer]
"""(query, depth) → the backend's answer."""


@dataclass
class BackendPlan:
    name: Backend
    run: Runner | None
    """None: the backend cannot run here, and `reason` says why."""
    reason: str = ""


@dataclass
class BackendReport:
    name: str
    status: Literal["ran", "skipped", "failed", "partial"]
    reason: str = ""
    """Why it was skipped, or the first failure."""
    failed: int = 0
    """Queries it failed on (not scored)."""
    notes: list[str] = field(default_factory=list)
    """Stages skipped along the way, each with how many queries it hit."""


@dataclass
class QueryResult:
    id: str
    query: str
    type: str
    backends: dict[str, Metrics]


@dataclass
class BenchReport:
    timestamp: str
    fixture: str
    description: str
    collection: str
    kind: Literal["fixture", "beir"]
    backends: list[BackendReport]
    results: list[QueryResult]
    summary: dict[str, Summary]
    by_type: dict[str, dict[str, Summary]]
    warnings: list[str]
    documents: int
    """Documents in the collection measured."""
    candidate_limit: int = DEFAULT_CANDIDATES
    expand: bool | None = None


Progress = Callable[[dict], None]


def run(
    fixture: Fixture,
    plans: list[BackendPlan],
    *,
    collection: str,
    documents: int,
    kind: Literal["fixture", "beir"],
    warnings: list[str],
    candidate_limit: int = DEFAULT_CANDIDATES,
    expand: bool | None = None,
    progress: Progress | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> BenchReport:
    """Every query on every backend that can run; per-query metrics, summaries overall and
    per query type, and what each backend skipped or failed."""
    depth_floor = BEIR_DEPTH if kind == "beir" else FIXTURE_DEPTH
    results = [QueryResult(q.id, q.query, q.type, {}) for q in fixture.queries]
    reports = []
    for plan in plans:
        if plan.run is None:
            reports.append(BackendReport(plan.name, "skipped", plan.reason))
            continue
        report = BackendReport(plan.name, "ran")
        skips: dict[str, int] = {}
        for i, (q, result) in enumerate(zip(fixture.queries, results, strict=True)):
            if cancelled():
                raise InvalidInput("bench cancelled")
            start = time.perf_counter()
            try:
                answer = plan.run(q.query, max(q.k, depth_floor))
            except Exception as e:  # noqa: BLE001 - a failed query is reported, never scored as zero
                report.failed += 1
                report.reason = report.reason or f"{q.id}: {getattr(e, 'message', None) or e}"
                continue
            result.backends[plan.name] = score(answer.files, q, (time.perf_counter() - start) * 1000)
            for reason in answer.skipped:
                skips[reason] = skips.get(reason, 0) + 1
            if progress:
                progress(
                    {
                        "event": "progress",
                        "backend": plan.name,
                        "done": i + 1,
                        "total": len(fixture.queries),
                        "id": q.id,
                    }
                )
        report.notes = [
            f"{reason} ({n} of {len(fixture.queries)} queries)"
            for reason, n in sorted(skips.items(), key=lambda kv: -kv[1])
        ]
        if report.failed:
            report.status = "failed" if report.failed == len(fixture.queries) else "partial"
        reports.append(report)
    ran = [r.name for r in reports if r.status in ("ran", "partial")]
    summary = {b: summarize([r.backends[b] for r in results if b in r.backends]) for b in ran}
    types = sorted({q.type for q in fixture.queries})
    by_type = (
        {
            t: {b: summarize([r.backends[b] for r in results if r.type == t and b in r.backends]) for b in ran}
            for t in types
        }
        if len(types) > 1
        else {}
    )
    warnings = list(warnings)
    if ran and all(not any(s.means[m] for m in ("precision_at_k", "recall", "mrr")) for s in summary.values()):
        warnings.append(
            "All benchmark scores were 0.00: the expected files are indexed, but no backend found any of them."
        )
    return BenchReport(
        timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
        fixture=fixture.source,
        description=fixture.description,
        collection=collection,
        kind=kind,
        backends=reports,
        results=results,
        summary=summary,
        by_type=by_type,
        warnings=warnings,
        documents=documents,
        candidate_limit=candidate_limit,
        expand=expand,
    )


def missing_expected(fixture: Fixture, indexed: Iterable[str]) -> list[str]:
    """`query id: file` for each expected file no indexed path matches."""
    paths = [_norm(p) for p in indexed]
    return [f"{q.id}: {e}" for q in fixture.queries for e in q.expected if not any(_matches(p, e) for p in paths)]


def stage_note(stage: str, reason: str) -> str:
    """A pipeline stage's skip, with its figures blanked so that one reason counts once."""
    return f"{stage} skipped: " + re.sub(r"\d+(?:\.\d+)?", "N", reason)


# -- driving the engine -----------------------------------------------------------------


class BenchEngine(Protocol):
    """What `qmd bench` drives: the engine's own operations, so each figure is what a
    user's search or query gets (quality sits beside the engine, never under it)."""

    paths: IndexPaths
    store: IndexStore

    @property
    def config(self) -> Config: ...

    def create_collection(self, path: str, name: str | None = None, pattern: str | None = None) -> Collection: ...

    def remove_collection(self, name: str) -> int: ...

    def update(self, collections: list[str] | None = None, progress: Progress | None = None) -> object: ...

    def embed(
        self,
        *,
        collections: list[str] | None = None,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> EmbedReport: ...

    def scope(self, collections: list[str] | None) -> list[str]: ...

    def search(self, query: str, opts: SearchOptions = ...) -> SearchOutcome: ...

    def vsearch(self, query: str, opts: SearchOptions = ...) -> SearchOutcome: ...

    def query(self, doc: QueryDoc, opts: QueryOptions) -> HybridOutcome: ...

    def vector_state(self, collections: list[str] | None = None) -> VectorState: ...

    def reranker(self, cfg: Config) -> tuple[object | None, str]: ...


def bench(
    engine: BenchEngine, spec: BenchSpec, progress: Progress | None = None, cancel: threading.Event | None = None
) -> BenchReport:
    """`qmd bench`: a fixture against an indexed collection, or a BEIR folder indexed into
    a collection of its own (`bench-<folder>`, removed afterwards unless `keep`)."""
    cancelled = cancel.is_set if cancel else (lambda: False)
    if spec.beir is None:
        fixture = parse_fixture(spec.fixture, spec.source)
        name = spec.collection or fixture.collection
        return _measure(engine, fixture, name, "fixture", [], spec, progress, cancelled)
    folder = Path(spec.beir)
    docs, fixture, warnings = load_beir(folder, spec.split, spec.max_queries)
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", folder.resolve().name).strip("-") or "beir"
    name = spec.collection or validate_collection_name(f"bench-{slug}")
    root = engine.paths.cache_dir / "bench" / name
    existing = engine.config.collections.get(name)
    if existing is not None and Path(existing.root) != root:
        raise Conflict(f"Collection '{name}' exists and is not a bench collection: pass -c with another name")
    materialize(docs, root)
    if existing is None:
        engine.create_collection(str(root), name, "**/*.md")
    try:
        engine.update([name], progress=progress)
        if spec.embed:
            engine.embed(collections=[name], progress=progress, cancel=cancel)
        return _measure(engine, fixture, name, "beir", warnings, spec, progress, cancelled)
    finally:
        if not spec.keep:
            engine.remove_collection(name)
            shutil.rmtree(root, ignore_errors=True)


def _measure(
    engine: BenchEngine,
    fixture: Fixture,
    name: str | None,
    kind: Literal["fixture", "beir"],
    warnings: list[str],
    spec: BenchSpec,
    progress: Progress | None,
    cancelled: Callable[[], bool],
) -> BenchReport:
    """The fixture's queries on each backend asked for, over the collection `name` (every
    default one when None), once its documents are known to hold the expected files."""
    cfg = engine.config
    if name is not None and name not in cfg.collections:
        available = ", ".join(sorted(cfg.collections)) or "none"
        raise NotFound(f"Collection not found: {name}\nAvailable: {available}. Run 'qmd ls' to inspect.")
    names = [name] if name else engine.scope(None)
    with engine.store.read() as conn:
        paths = [f"{n}/{f.path}" for n in names for f in catalog.list_files(conn, n, "")]
    if not paths:
        raise InvalidInput(
            f"Collection '{name}' has no indexed documents.\nRun 'qmd update', then 'qmd ls {name}'."
            if name
            else "No indexed documents found.\nAdd one with 'qmd collection add <folder>', then 'qmd update'."
        )
    if missing := missing_expected(fixture, paths):
        shown = "; ".join(missing[:10]) + (f"; and {len(missing) - 10} more" if len(missing) > 10 else "")
        raise InvalidInput(
            f"{len(missing)} expected file(s) are not in {'collection ' + repr(name) if name else 'the index'}: "
            f"{shown}. Fix the fixture's expected_files (collection-relative paths, as 'qmd ls' shows them), "
            "or run 'qmd update'."
        )
    colls = [name] if name else None

    def files(hits: list[Pointer]) -> list[str]:
        return [h.doc.display_path for h in hits]

    def keyword(q: str, depth: int) -> Answer:
        return Answer(files(engine.search(q, SearchOptions(collections=colls, limit=depth)).hits))

    def vector(q: str, depth: int) -> Answer:
        return Answer(files(engine.vsearch(q, SearchOptions(collections=colls, limit=depth)).hits))

    def pipeline(rerank: bool) -> Runner:
        def answer(q: str, depth: int) -> Answer:
            opts = QueryOptions(
                collections=colls,
                limit=depth,
                rerank=rerank,
                expand=spec.expand,
                candidate_limit=spec.candidate_limit,
            )
            out = engine.query(parse_query(q), opts)
            return Answer(files(out.hits), [stage_note(s.stage, s.reason) for s in out.skipped])

        return answer

    state = engine.vector_state(colls)
    no_vectors = "" if state.available else state.message
    reranker, no_reranker = engine.reranker(cfg)
    plans = [
        BackendPlan("bm25", keyword),
        BackendPlan("vector", None if no_vectors else vector, no_vectors),
        BackendPlan("hybrid", None if no_vectors else pipeline(False), no_vectors),
        BackendPlan("full", pipeline(True) if reranker and not no_vectors else None, no_vectors or no_reranker),
    ]
    return run(
        fixture,
        [p for p in plans if p.name in spec.backends],
        collection=name or "all",
        documents=len(paths),
        kind=kind,
        warnings=warnings,
        candidate_limit=spec.candidate_limit,
        expand=spec.expand,
        progress=progress,
        cancelled=cancelled,
    )


# -- the report as text -----------------------------------------------------------------


def render(report: BenchReport) -> str:
    """The table a person reads: per query (fixtures; BEIR sets are summarised only), then
    each backend's summary overall and per type, then skips, failures and warnings."""
    lines = [
        f"Bench: {report.fixture} on collection '{report.collection}' ({report.documents} documents, "
        f"{len(report.results)} queries)"
    ]
    ran = list(report.summary)
    if {"hybrid", "full"} & set(ran):
        how = {True: "on", False: "off", None: "as by default"}[report.expand]
        lines.append(f"hybrid/full: {report.candidate_limit} candidates, expansion {how}")
    if report.kind == "fixture" and ran:
        lines += [
            "",
            f"{'Query':<24} {'Backend':<8} {'P@k':>5} {'R@1':>5} {'R@3':>5} {'R@5':>5} {'MRR':>5} {'F1':>5} {'ms':>7}",
        ]
        for r in report.results:
            for b in ran:
                m = r.backends.get(b)
                if m is None:
                    lines.append(f"{r.id[:24]:<24} {b:<8} {'failed':>5}")
                    continue
                lines.append(
                    f"{r.id[:24]:<24} {b:<8} {m.precision_at_k:5.2f} {m.recall_at_1:5.2f} {m.recall_at_3:5.2f} "
                    f"{m.recall_at_5:5.2f} {m.mrr:5.2f} {m.f1:5.2f} {m.latency_ms:7.0f}"
                )
    if ran:
        lines += ["", "Summary:"]
        lines += _summary_lines(report.summary, "  ")
        for label, per in report.by_type.items():
            lines += [f"  type {label}:"] + _summary_lines(per, "    ")
    for backend in report.backends:
        if backend.status == "skipped":
            lines.append(f"skipped {backend.name}: {backend.reason}")
        elif backend.failed:
            lines.append(
                f"{backend.name} failed on {backend.failed} of {len(report.results)} queries (not scored): "
                f"{backend.reason}"
            )
        lines += [f"{backend.name}: {note}" for note in backend.notes]
    lines += [f"⚠ {w}" for w in report.warnings]
    return "\n".join(lines) + "\n"


def _summary_lines(summary: Mapping[str, Summary], indent: str) -> list[str]:
    out = []
    for b, s in summary.items():
        m = s.means
        out.append(
            f"{indent}{b:<7} nDCG@10 {m['ndcg_at_10']:.3f}  MRR@10 {m['mrr_at_10']:.3f}  "
            f"R@100 {m['recall_at_100']:.3f}  P@k {m['precision_at_k']:.3f}  R@5 {m['recall_at_5']:.3f}  "
            f"MRR {m['mrr']:.3f}  F1 {m['f1']:.3f}  "
            f"p50 {s.latency_p50_ms:.0f} ms  ({s.queries} queries)"
        )
    return out
