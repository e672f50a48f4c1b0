"""HTTP routes: validate (pydantic), call the engine, shape the answer.

`/health`, `/query` and `/search` are the public surface of spec §21; `/v1/...` is
the versioned API the thin CLI speaks. Long jobs (`update`) stream NDJSON events so
the CLI can draw a progress bar.

Routes that may wait on the inference worker (vector search, the hybrid query, MCP's
`query` tool) run on threads of their own (`on_model_thread`, `QMD_MODEL_THREADS`), never
on the shared pool the other routes use (anyio's 40 threads): a busy or hung worker then
holds up only them, and `/health`, keyword search and status keep answering.
"""

from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread
from anyio.lowlevel import RunVar
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from qmd.server import trust
from qmd.server.config import Context, init_project
from qmd.server.engine import Engine
from qmd.server.errors import NotFound, QmdError
from qmd.server.http.wire import (
    CLI_SNIPPET_CHARS,
    ApprovalOut,
    ApprovalsOut,
    BackgroundEmbedRequest,
    BenchRequest,
    CleanupRequest,
    CliGetRequest,
    CliMetadataResponse,
    CliMultiGetRequest,
    CliQueryRequest,
    CliQueryResponse,
    CollectionCreate,
    CollectionCreated,
    CollectionDeleted,
    CollectionOut,
    CollectionPatch,
    CollectionPatched,
    CollectionRenamed,
    CollectionShown,
    CollectionsOut,
    ContextAdd,
    ContextRemove,
    ContextsOut,
    CopyRequest,
    CoverageOut,
    DaemonOut,
    DocumentOut,
    EmbedProgressOut,
    EmbedRequest,
    Health,
    HitOut,
    InitOut,
    InitRequest,
    LsOut,
    MetadataRequest,
    MetadataResponse,
    MultiGetOut,
    PullRequest,
    QueryRequest,
    QueryResponse,
    RenameRequest,
    ResultOut,
    SearchRequest,
    SearchResponse,
    SettingsOut,
    StatusOut,
    TrustApprove,
    TrustOut,
    TrustRevoke,
    UpdateRequest,
    approval_out,
    document_answer,
    extended,
    hit_out,
    http_status,
    ls_answer,
    metadata_response,
    metadata_text,
    public_result,
    query_plan,
    query_response,
    retrieved_answer,
    search_response,
    trust_out,
)
from qmd.server.indexes import linked_index
from qmd.server.ingest.embed_job import BackgroundStart
from qmd.server.quality import parse_fixture
from qmd.server.quality import render as render_bench
from qmd.server.search.discovery import render_key_names, render_overview
from qmd.server.search.hybrid import HybridOutcome, QueryOptions
from qmd.server.search.querydoc import QueryDoc
from qmd.server.status import CollectionInfo, Doctor
from qmd.settings import daemon_settings
from qmd.version import __version__

router = APIRouter()
T = TypeVar("T")

MODEL_THREADS = 16
"""Model-bound requests served at once (`QMD_MODEL_THREADS`); more wait for a turn without holding a thread."""


def model_threads() -> int:
    """QMD_MODEL_THREADS, a whole number of at least 1; anything else is an error at start-up."""
    raw = os.environ.get("QMD_MODEL_THREADS", "").strip()
    if not raw:
        return MODEL_THREADS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"QMD_MODEL_THREADS must be a whole number of at least 1, got {raw!r}")
    return int(raw)


class ModelLane:
    """Turns (a semaphore, awaited without a thread) and the threads that run them (a limiter as large)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.turns = anyio.Semaphore(size)
        self.threads = anyio.CapacityLimiter(size)


_lane: RunVar[ModelLane] = RunVar("qmd_model_lane")


def model_lane() -> ModelLane:
    """This event loop's model lane (made on first use, like anyio's own default limiter)."""
    try:
        return _lane.get()
    except LookupError:
        lane = ModelLane(model_threads())
        _lane.set(lane)
        return lane


async def on_model_thread(call: Callable[[], T], wait_s: float | None = None) -> T:
    """`call()` on a model thread, once one is free.

    With `wait_s` (a query's budget), a request that gets no turn in that time runs on the
    shared pool instead: its budget is spent by then, so none of its stages waits on the worker.
    """
    lane = model_lane()
    got = False
    with anyio.move_on_after(math.inf if wait_s is None else wait_s):
        await lane.turns.acquire()
        got = True
    if not got:
        return await anyio.to_thread.run_sync(call)
    try:
        return await anyio.to_thread.run_sync(call, limiter=lane.threads)
    finally:
        lane.turns.release()


async def run_query(e: Engine, doc: QueryDoc, opts: QueryOptions, shape: Callable[[HybridOutcome], T]) -> T:
    """The hybrid query on a model thread, shaped into its answer there; with a budget, the
    wait for a turn is part of it."""
    asked = time.monotonic()

    def run() -> T:
        waited_ms = (time.monotonic() - asked) * 1000
        if opts.budget_ms is None:
            return shape(e.query(doc, opts))
        out = e.query(doc, replace(opts, budget_ms=max(opts.budget_ms - waited_ms, 0.0)))
        out.elapsed_ms += waited_ms
        out.budget_ms = opts.budget_ms
        if waited_ms >= opts.budget_ms:
            out.warnings.append(
                f"the budget ({opts.budget_ms:g} ms) went waiting for a turn with the models "
                f"(QMD_MODEL_THREADS={model_threads()} requests at once): keyword results only"
            )
        return shape(out)

    return await on_model_thread(run, None if opts.budget_ms is None else opts.budget_ms / 1000)


def engine_of(request: Request) -> Engine:
    """The engine of the index the request names (`IndexRouter` put it there)."""
    engine: Engine = request.state.engine
    return engine


@router.get("/health", response_model=Health, tags=["public"])
def health(request: Request) -> Health:
    e = engine_of(request)
    return Health(
        status="ok",
        uptime=int(time.time() - e.started),
        pid=os.getpid(),
        version=__version__,
        index=e.paths.name,
        indexes=request.app.state.indexes.served(),
    )


@router.post("/query", response_model=QueryResponse[ResultOut], tags=["public"])
@router.post("/search", response_model=QueryResponse[ResultOut], tags=["public"])
async def query(body: QueryRequest, request: Request) -> QueryResponse[ResultOut]:
    """The hybrid query (spec §13): typed `searches` or a `query` to expand. The answer
    lists every stage with its time, and why any stage did not run."""
    return await run_query(engine_of(request), *query_plan(body), lambda out: query_response(out, public_result))


@router.post("/metadata", response_model=MetadataResponse, tags=["public"])
def metadata(body: MetadataRequest, request: Request) -> MetadataResponse:
    """Metadata discovery: which keys, types and values the documents in scope hold,
    so a filter can be written from what is indexed instead of guessed."""
    e = engine_of(request)
    return metadata_response(e.metadata(body.options(e.scope(body.collections))))


# The CLI's routes answer in snake_case and leave out what a result does not have
# (a keyword hit has no fusion score): `qmd --json` prints them as they come.
CLI_ANSWER: dict = {"response_model_by_alias": False, "response_model_exclude_unset": True, "tags": ["cli"]}
STREAM: dict = {
    "tags": ["cli"],
    "response_class": StreamingResponse,
    "responses": {
        200: {
            "description": "NDJSON: an event a line, the last one `done` (with the job's result) or `error`.",
            "content": {"application/x-ndjson": {}},
        }
    },
}
"""A long job's answer (`stream_job`): its events as they happen, for the CLI's progress."""


@router.post("/v1/query", response_model=CliQueryResponse, **CLI_ANSWER)
async def cli_query(body: CliQueryRequest, request: Request) -> QueryResponse[HitOut]:
    e = engine_of(request)
    doc, opts = query_plan(body, CLI_SNIPPET_CHARS)
    return await run_query(
        e, doc, opts, lambda out: query_response(out, hit_out, CliQueryResponse, editor_uri=e.config.editor_uri)
    )


@router.post("/v1/keyword", response_model=SearchResponse, **CLI_ANSWER)
def cli_search(body: SearchRequest, request: Request) -> SearchResponse:
    e = engine_of(request)
    return search_response(e.search(body.query, body.options()), e.config.editor_uri)


@router.post("/v1/metadata", response_model=CliMetadataResponse, **CLI_ANSWER)
def cli_metadata(body: MetadataRequest, request: Request) -> MetadataResponse:
    e = engine_of(request)
    report = e.metadata(body.options(e.scope(body.collections)))
    return metadata_response(report, CliMetadataResponse, text=metadata_text(report, body))


@router.get("/v1/status", response_model=StatusOut, **CLI_ANSWER)
def status(request: Request) -> StatusOut:
    e = engine_of(request)
    daemon = DaemonOut(pid=os.getpid(), uptime=int(time.time() - e.started), url=str(request.base_url).rstrip("/"))
    st = e.status()
    return extended(StatusOut, st, collections=_with_key_names(e, st.collections), daemon=daemon)


@router.get("/v1/settings", response_model=SettingsOut, **CLI_ANSWER)
def settings() -> SettingsOut:
    """The daemon-read settings it started with, for the CLI to compare with its own."""
    return SettingsOut(settings=daemon_settings())


def _with_key_names(e: Engine, collections: Sequence[CollectionInfo]) -> list[CollectionOut]:
    """Each collection's top keys as one line (`  Metadata: status, topics, +3 more`)."""
    keys = e.collection_keys([c.name for c in collections])
    return [extended(CollectionOut, c, metadata_keys=render_key_names(keys[c.name])) for c in collections]


@router.get("/v1/collections", response_model=CollectionsOut, **CLI_ANSWER)
def list_collections(request: Request) -> CollectionsOut:
    e = engine_of(request)
    return CollectionsOut(collections=_with_key_names(e, e.describe_collections()))


@router.post("/v1/collections", response_model=CollectionCreated, status_code=201, **CLI_ANSWER)
def create_collection(body: CollectionCreate, request: Request) -> CollectionCreated:
    c = engine_of(request).create_collection(body.path, body.name, body.pattern)
    return CollectionCreated(name=c.name, path=str(c.root), pattern=c.pattern)


@router.get("/v1/collections/{name}", response_model=CollectionShown, **CLI_ANSWER)
def show_collection(name: str, request: Request) -> CollectionShown:
    e = engine_of(request)
    e.config.get(name)
    (shown,) = _with_key_names(e, [c for c in e.describe_collections() if c.name == name])
    overview = render_overview(e.collection_keys([name], values=3)[name])
    return extended(CollectionShown, shown, metadata_overview=overview)


@router.patch("/v1/collections/{name}", response_model=CollectionPatched, **CLI_ANSWER)
def patch_collection(name: str, body: CollectionPatch, request: Request) -> CollectionPatched:
    c = engine_of(request).set_collection(
        name,
        include=body.include_by_default,
        update_cmd=body.update_command,
        clear_update=body.clear_update_command,
    )
    return CollectionPatched(name=c.name, include_by_default=c.include_by_default, update_command=c.update)


@router.delete("/v1/collections/{name}", response_model=CollectionDeleted, **CLI_ANSWER)
def delete_collection(name: str, request: Request) -> CollectionDeleted:
    return CollectionDeleted(name=name, deleted_documents=engine_of(request).remove_collection(name))


@router.post("/v1/collections/{name}/rename", response_model=CollectionRenamed, **CLI_ANSWER)
def rename_collection(name: str, body: RenameRequest, request: Request) -> CollectionRenamed:
    engine_of(request).rename_collection(name, body.new_name)
    return CollectionRenamed(old=name, new=body.new_name)


def stream_job(
    request: Request, name: str, run: Callable[[Callable[[dict], None], threading.Event], dict]
) -> StreamingResponse:
    """Run a long job on its own thread and stream its events as NDJSON, ending with
    `done` (the job's result) or `error`. A client that goes away (Ctrl-C) sets the
    job's cancel event; the job stops at its next batch boundary, work so far kept."""
    events: queue.Queue[dict | None] = queue.Queue()
    cancel = threading.Event()

    def job() -> None:
        try:
            events.put({"event": "done", **run(events.put, cancel)})
        except QmdError as err:
            events.put({"event": "error", "status": http_status(err), "error": err.message, **err.detail})
        except Exception as err:  # noqa: BLE001 - reported to the client, logged by the server
            request.app.state.log.exception("%s failed", name)
            events.put({"event": "error", "status": 500, "error": f"internal error: {err}"})
        finally:
            events.put(None)

    threading.Thread(target=job, name=f"qmd-{name}", daemon=True).start()

    async def stream() -> AsyncIterator[bytes]:
        # async, so that a disconnect (the task is cancelled, or the next send fails)
        # runs the `finally` right away instead of leaving a thread blocked on the queue
        try:
            while (ev := await anyio.to_thread.run_sync(events.get, abandon_on_cancel=True)) is not None:
                yield (json.dumps(ev) + "\n").encode()
        finally:
            cancel.set()

    return StreamingResponse(stream(), media_type="application/x-ndjson")


@router.post("/v1/update", **STREAM)
def update(body: UpdateRequest, request: Request) -> StreamingResponse:
    """Streams NDJSON events: `collection`, `hook`, `progress`, `summary` (a collection's
    report), then `done` with the whole report (or `error`). Each collection's counts are
    what changed since its last report, the watcher's passes included. Names are checked
    before the stream starts, so a typo is a 404."""
    e = engine_of(request)
    for name in body.collections or []:
        e.config.get(name)

    def run(progress: Callable[[dict], None], _cancel: threading.Event) -> dict:
        return {"report": e.update(body.collections, progress=progress).as_json()}

    return stream_job(request, "update", run)


@router.post("/v1/embed", **STREAM)
def embed(body: EmbedRequest, request: Request) -> StreamingResponse:
    """Streams `download`/`progress` events, then `done` with the report (rows written,
    clipped chunks, what is still pending) or `error`."""
    e = engine_of(request)
    for name in body.collections or []:
        e.config.get(name)

    def run(progress: Callable[[dict], None], cancel: threading.Event) -> dict:
        report = e.embed(
            collections=body.collections,
            force=body.force,
            max_docs_per_batch=body.max_docs_per_batch,
            max_batch_bytes=int(body.max_batch_mb * 1024 * 1024),
            chunk_strategy=body.chunk_strategy,
            progress=progress,
            cancel=cancel,
        )
        return {"report": report.as_json()}

    return stream_job(request, "embed", run)


@router.post("/v1/embed/background", response_model=BackgroundStart, **CLI_ANSWER)
def embed_in_background(body: BackgroundEmbedRequest, request: Request) -> BackgroundStart:
    """Start embedding a collection just added where the watcher would embed it anyway (its
    first sweep, seconds later): how many documents, with which model, or why not."""
    return engine_of(request).embed_in_background(body.collection)


@router.get("/v1/embed/progress", response_model=EmbedProgressOut, **CLI_ANSWER)
def embed_progress(request: Request) -> EmbedProgressOut:
    """The embed running now (`qmd embed`'s or the watcher's background one), with its
    rate and ETA, and the last finished one's report: what `qmd embed --follow` polls."""
    e = engine_of(request)
    last = e.embeds.last()
    return EmbedProgressOut(
        running=e.embeds.running(),
        last_source=last[0] if last else None,
        last=last[1].as_json() if last else None,
    )


@router.post("/v1/cleanup", **STREAM)
def cleanup(body: CleanupRequest, request: Request) -> StreamingResponse:
    """Streams a `step` event as each step starts, then `done` with the report (what was
    found, dropped and left; bytes before and after; whether VACUUM ran and why), or
    `error` (409 while an update or embed outlasts `waitS`)."""
    e = engine_of(request)

    def run(progress: Callable[[dict], None], _cancel: threading.Event) -> dict:
        report = e.cleanup(
            dry_run=body.dry_run, vacuum=body.vacuum, cache_days=body.cache_days, wait_s=body.wait_s, progress=progress
        )
        return {"report": asdict(report)}

    return stream_job(request, "cleanup", run)


@router.post("/v1/index/copy", **STREAM)
def copy_index(body: CopyRequest, request: Request) -> StreamingResponse:
    """Streams `progress` events (rows per table) and `step` events, then `done` with the
    report (rows per table, checked equal on both sides), or `error`: the destination is
    then as it was."""
    e = engine_of(request)

    def run(progress: Callable[[dict], None], cancel: threading.Event) -> dict:
        report = e.copy_index(body.source, body.destination, replace=body.replace, progress=progress, cancel=cancel)
        return {"report": asdict(report)}

    return stream_job(request, "copy", run)


@router.get("/v1/coverage", response_model=CoverageOut, **CLI_ANSWER)
def coverage(request: Request, collection: str | None = None) -> CoverageOut:
    """Each collection's folder against the index, file by file (`qmd status --files`)."""
    return CoverageOut(collections=engine_of(request).coverage(collection))


@router.post("/v1/bench", **STREAM)
def bench(body: BenchRequest, request: Request) -> StreamingResponse:
    """Streams `progress` events (per backend and query; indexing ones for a BEIR folder),
    then `done` with the report and its text, or `error`. The request is checked before
    the stream starts, so a malformed one is a 400."""
    e = engine_of(request)
    spec = body.spec()
    if spec.fixture is not None:
        parse_fixture(spec.fixture, spec.source)

    def run(progress: Callable[[dict], None], cancel: threading.Event) -> dict:
        report = e.bench(spec, progress=progress, cancel=cancel)
        return {"report": asdict(report), "text": render_bench(report)}

    return stream_job(request, "bench", run)


@router.post("/v1/pull", **STREAM)
def pull(body: PullRequest, request: Request) -> StreamingResponse:
    """Streams `model`, `download` and `pulled` events per role, then `done`."""
    e = engine_of(request)

    def run(progress: Callable[[dict], None], _cancel: threading.Event) -> dict:
        return {"models": [asdict(p) for p in e.pull(refresh=body.refresh, progress=progress)]}

    return stream_job(request, "pull", run)


@router.get("/v1/trust", response_model=TrustOut, **CLI_ANSWER)
def trust_status(request: Request) -> TrustOut:
    """The request's project config: its gated items, and which are trusted now; and its
    index files, each with its state."""
    e = engine_of(request)
    return trust_out(e.gate(), trust.index_file_states(e.paths) if e.paths.project_root is not None else [])


@router.post("/v1/trust", response_model=ApprovalOut, **CLI_ANSWER)
def trust_approve(body: TrustApprove, request: Request) -> ApprovalOut:
    """Record the user's approval of the gated set they were shown (`qmd trust`, or yes
    at a command's prompt)."""
    e = engine_of(request)
    return approval_out(e.trust.approve(e.gate(), body.fingerprint))


@router.get("/v1/trust/approvals", response_model=ApprovalsOut, **CLI_ANSWER)
def trust_approvals(request: Request) -> ApprovalsOut:
    return ApprovalsOut(approvals=[approval_out(r) for r in trust.review(engine_of(request).trust)])


@router.post("/v1/trust/revoke", response_model=ApprovalOut, **CLI_ANSWER)
def trust_revoke(body: TrustRevoke, request: Request) -> ApprovalOut:
    gone = engine_of(request).trust.revoke(Path(body.root))
    if gone is None:
        raise NotFound(f"no approval is recorded for {body.root} (see 'qmd trust list')")
    return approval_out(gone)


@router.post("/v1/init", response_model=InitOut, status_code=201, **CLI_ANSWER)
def init(body: InitRequest) -> InitOut:
    """`qmd init`: make a folder a project, its models block pre-filled with the defaults
    as this daemon resolves them."""
    models = trust.default_models()
    made = init_project(Path(body.path), models)
    return InitOut(root=str(made.root), config=str(made.config), collection=made.collection, models=models)


@router.get("/v1/doctor", response_model=Doctor, **CLI_ANSWER)
def doctor(request: Request) -> Doctor:
    return engine_of(request).doctor()


@router.post("/v1/vector", response_model=SearchResponse, **CLI_ANSWER)
async def cli_vsearch(body: SearchRequest, request: Request) -> SearchResponse:
    e = engine_of(request)
    return await on_model_thread(lambda: search_response(e.vsearch(body.query, body.options()), e.config.editor_uri))


@router.get("/v1/contexts", response_model=ContextsOut, **CLI_ANSWER)
def list_contexts(request: Request) -> ContextsOut:
    return ContextsOut(contexts=engine_of(request).list_contexts())


@router.post("/v1/contexts", response_model=Context, **CLI_ANSWER)
def add_context(body: ContextAdd, request: Request) -> Context:
    return engine_of(request).add_context(body.target, body.text, body.cwd)


@router.post("/v1/contexts/remove", response_model=Context, **CLI_ANSWER)
def remove_context(body: ContextRemove, request: Request) -> Context:
    """The context removed, its text included."""
    return engine_of(request).remove_context(body.target, body.cwd)


@contextmanager
def engine_for(request: Request, name: str) -> Iterator[Engine]:
    """The engine a document name points into: the index of a `qmd://…?index=NAME` link
    (results from another index carry one), else the request's own."""
    linked = linked_index(name)
    if linked is None:
        yield engine_of(request)
        return
    with request.app.state.indexes.use(linked) as engine:
        yield engine


@router.post("/v1/get", response_model=DocumentOut, **CLI_ANSWER)
def get(body: CliGetRequest, request: Request) -> DocumentOut:
    with engine_for(request, body.file) as e:
        return document_answer(
            e.get(body.file, from_line=body.from_line, max_lines=body.max_lines, cwd=body.cwd, full=body.full)
        )


@router.post("/v1/multi-get", response_model=MultiGetOut, **CLI_ANSWER)
def multi_get(body: CliMultiGetRequest, request: Request) -> MultiGetOut:
    e = engine_of(request)
    items = e.multi_get(body.pattern, max_bytes=body.max_bytes, max_lines=body.max_lines, cwd=body.cwd)
    return MultiGetOut(items=[retrieved_answer(r) for r in items], editor_uri=e.config.editor_uri)


@router.get("/v1/ls", response_model=LsOut, **CLI_ANSWER)
def ls(request: Request, target: str | None = None) -> LsOut:
    e = engine_of(request)
    return ls_answer(e.ls(target) if target else e.describe_collections())
