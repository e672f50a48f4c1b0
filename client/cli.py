"""`qmd`: the thin command line. Every command is one or two HTTP calls to `qmdd`.

Imports stay light (click and the stdlib): the daemon holds the index and models,
so `qmd --help` and `qmd search` start as fast as Python allows. Paths typed by the
user are resolved here, against the user's working directory, before they are sent.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import Any, cast

import click

from qmd.client import api, formats
from qmd.client.mcp_config import CLIENTS, client_config
from qmd.connection import ClientError, Daemon, address
from qmd.defaults import (
    AGENT_RELEVANCE_FLOOR,
    CANDIDATE_LIMIT,
    CLI_RESULTS,
    CLI_STRUCTURED_RESULTS,
    VSEARCH_MIN_SCORE,
)
from qmd.paths import find_project
from qmd.version import __version__

FORMAT_FLAGS = ("csv", "md", "xml", "files", "json")  # precedence when several are given (spec §17.1)


class Ctx:
    def __init__(self, index: str | None, *, no_gpu: bool = False, verbose: bool = False) -> None:
        self.index = index
        self.no_gpu = no_gpu
        self.verbose = verbose
        self.began = time.time()
        self._daemon: Daemon | None = None

    @property
    def daemon(self) -> Daemon:
        if self._daemon is None:
            self._daemon = Daemon(self.index)
            if self.no_gpu:
                self._check_no_gpu(self._daemon)
            self._check_settings(self._daemon)
        return self._daemon

    def call(self, method: str, path: str, body: Any = None, params: dict | None = None) -> Any:
        t0 = time.perf_counter()
        out = self.daemon.call(method, path, body, params)
        self.note_started()
        self.note(f"{method} {path}: {(time.perf_counter() - t0) * 1000:.0f} ms (round trip)")
        return out

    def note(self, line: str) -> None:
        """A `-v` line on stderr."""
        if self.verbose:
            click.echo(line, err=True)

    def note_started(self) -> None:
        """Say (once, with -v) that this command started the daemon, and how long that took."""
        d = self._daemon
        if d is not None and d.spawned is not None:
            self.note(f"started qmdd (PID {d.spawned['pid']}) in {d.spawned['seconds']:.2f} s")
            d.spawned = None

    def _check_no_gpu(self, d: Daemon) -> None:
        """`--no-gpu` reaches a daemon this command starts (QMD_FORCE_CPU=1 in its environment); a daemon
        already running keeps the settings it started with, shared by every client, so say so."""
        if d.health() is None:
            return
        status: api.StatusOut = d.call("GET", "/v1/status")
        inf, pid = status["inference"], status["daemon"]["pid"]
        if inf["force_cpu"]:
            return
        no_gpu = inf["gpu_offload_supported"] is False
        anyway = " (its llama.cpp build has no GPU backend: it runs on the CPU anyway)" if no_gpu else ""
        click.echo(
            f"--no-gpu: the running daemon (PID {pid}) was started without it and keeps its setting{anyway}. "
            "Run 'qmd daemon stop', then this command again, to apply it.",
            err=True,
        )

    def _check_settings(self, d: Daemon) -> None:
        """A daemon-read `QMD_*` variable (qmd.settings) set here reaches a daemon this command
        starts; one already running keeps the value it started with, so say so, once per
        variable. Costs a /health only when this environment sets one of them."""
        from qmd.settings import DAEMON_SETTINGS, differences

        if not any(name in os.environ for name in DAEMON_SETTINGS):
            return
        try:
            health = d.health()
            if health is None:
                return  # none runs: the one this command starts inherits this environment
            started: api.SettingsOut = d.call("GET", "/v1/settings")
        except ClientError:
            return  # the command's own call says what is wrong (or a qmdd from before the report)
        skip = frozenset({"QMD_FORCE_CPU"}) if self.no_gpu else frozenset()  # --no-gpu says its own
        for name, theirs in differences(started["settings"], skip=skip):
            was = f"with {name}={theirs}" if theirs is not None else f"without {name}"
            click.echo(
                f"{name}: the running daemon (PID {health['pid']}) was started {was} and keeps its setting. "
                "Run 'qmd daemon restart' to apply yours.",
                err=True,
            )

    def summary(self) -> None:
        """With -v, after the command: the inference backend, the models loaded (and how long
        the loads this command caused took), and any setting the daemon could not honour."""
        if not self.verbose or self._daemon is None:
            return
        self.note_started()
        try:
            st: api.StatusOut = self._daemon.call("GET", "/v1/status")
            inf = st["inference"]
        except (ClientError, OSError):
            return
        for m in inf["models_loaded"]:
            name = Path(m["path"]).name
            contexts = f", {m['parallelism']} contexts embedding in parallel" if m.get("parallelism", 1) > 1 else ""
            when = f"loaded in {m['load_seconds']:.2f} s" if m.get("loaded_at", 0) >= self.began else "already loaded"
            self.note(f"model {name} ({m['role']}): {when}{contexts}")
        if inf.get("pid"):
            where = f"GPU ({inf['offload']})" if inf.get("offload") else "CPU"
            self.note(f"inference worker PID {inf['pid']}: {where}, {inf['n_threads']} threads")
        for warning in inf.get("warnings") or []:
            self.note(f"⚠ {warning}")


pass_ctx = click.make_pass_decorator(Ctx)
COMPLETE_VAR = "_QMD_COMPLETE"
"""The environment variable click's completion scripts set when they ask `qmd` for candidates."""
COMPLETION_TIMEOUT_S = 2.0


def complete_collections(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """Collection names, from the daemon if one is running: a TAB never starts one, and
    never waits more than a moment."""
    try:
        d = Daemon(ctx.find_root().params.get("index"))
        r = d.connect(read_timeout=COMPLETION_TIMEOUT_S).request("GET", "/v1/collections")
    except (ClientError, OSError):
        return []
    if r.status != 200 or not d.serves(r.index):
        return []
    return [c["name"] for c in r.json()["collections"] if c["name"].startswith(incomplete)]


only_collections = click.option(
    "-c",
    "--collection",
    "collections",
    multiple=True,
    shell_complete=complete_collections,
    help="Only these collections.",
)


def complete_indexes(_ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """Named indexes: each has its `NAME.yml` in the config folder."""
    from qmd.paths import config_root

    return sorted(p.stem for p in config_root().glob("*.yml") if p.stem.startswith(incomplete))


def _out(text: str) -> None:
    if text:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _warn(lines: list[str]) -> None:
    for line in lines:
        click.echo(line, err=True)


def format_options(fn: Callable) -> Callable:
    fn = click.option("--format", "fmt", type=click.Choice(formats.FORMATS), default=None, help="Output format.")(fn)
    for flag in reversed(FORMAT_FLAGS):
        fn = click.option(f"--{flag}", f"as_{flag}", is_flag=True, help=f"Same as --format {flag}.")(fn)
    return fn


def pick_format(fmt: str | None, flags: dict[str, bool]) -> str:
    if fmt:
        return fmt
    for flag in FORMAT_FLAGS:
        if flags.get(f"as_{flag}"):
            return flag
    return "cli"


def _style(editor_uri: str | None = None) -> formats.Style:
    """How to draw for this stdout; `editor_uri` is index.yml's, as the daemon sent it."""
    return formats.Style.detect(sys.stdout, editor_uri=editor_uri)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--index",
    "index",
    default=None,
    metavar="NAME",
    shell_complete=complete_indexes,
    help="Use a named index (own config and database).",
)
@click.option(
    "--no-gpu",
    is_flag=True,
    help="Run models on the CPU (QMD_FORCE_CPU=1) in the daemon this command starts; "
    "a running daemon keeps its setting, and says so.",
)
@click.option("-v", "--verbose", is_flag=True, help="Timings, the daemon's start and model loading on stderr.")
@click.version_option(__version__, prog_name="qmd")  # the daemon's own, not a stale install's metadata
@click.pass_context
def cli(ctx: click.Context, index: str | None, no_gpu: bool, verbose: bool) -> None:
    """qmd: on-device search for your markdown notes, docs and transcripts.

    The first command starts the qmd daemon (qmdd) if none is running.

    \b
    Quick start:
      qmd collection add ~/notes --name notes
      qmd search "how do I raise money for a startup"
      qmd get notes/fundraising.md:40:20
    """
    if no_gpu:
        os.environ["QMD_FORCE_CPU"] = "1"  # the environment a daemon started from here inherits
    ctx.obj = Ctx(index, no_gpu=no_gpu, verbose=verbose)
    ctx.call_on_close(ctx.obj.summary)


# -- search ----------------------------------------------------------------------


class JsonTree(click.ParamType):
    """A JSON object given inline or as `@file.json` (a filter or a match): parsed here so
    a typo is pointed at by line and column before anything is sent."""

    name = "JSON"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, dict):
            return value
        text = str(value)
        where = "the argument"
        if text.startswith("@"):
            where = text[1:]
            try:
                text = Path(where).expanduser().read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                self.fail(f"cannot read {where}: {getattr(e, 'strerror', None) or e}", param, ctx)
        try:
            tree = json.loads(text)
        except RecursionError:
            self.fail(f"{where} nests too deeply", param, ctx)
        except json.JSONDecodeError as e:
            self.fail(f"{where} is not JSON: {e.msg} at line {e.lineno}, column {e.colno}", param, ctx)
        if not isinstance(tree, dict):
            example = '{"field":"status","operator":"eq","value":"published"}'
            self.fail(f"{where} must be a JSON object, like '{example}'", param, ctx)
        return tree


FILTER_HELP = (
    "Only documents whose metadata satisfies this filter: JSON, or @file.json "
    "(see 'qmd collection metadata' for what to filter on)."
)


def search_options(min_score_default: float) -> Callable[[Callable], Callable]:
    """The options `search` and `vsearch` share."""

    def wrap(fn: Callable) -> Callable:
        decorators: list[Callable[[Callable], Callable]] = [
            click.argument("query", nargs=-1, required=True),
            click.option(
                "-n",
                "limit",
                type=click.IntRange(min=1),
                default=None,
                help=f"Number of results [{CLI_RESULTS}; {CLI_STRUCTURED_RESULTS} for --json/--files].",
            ),
            click.option(
                "-c",
                "--collection",
                "collections",
                multiple=True,
                shell_complete=complete_collections,
                help="Search this collection (repeatable).",
            ),
            click.option("--all", "all_results", is_flag=True, help="Return every match."),
            click.option("--min-score", type=click.FloatRange(0, 1), default=min_score_default, show_default=True),
            click.option("--full", is_flag=True, help="Show whole documents instead of passages."),
            click.option("--line-numbers", is_flag=True, help="Number passage lines with their file line numbers."),
            click.option("--full-path", is_flag=True, help="Show on-disk paths instead of qmd:// links."),
            click.option("--filter", "metadata_filter", type=JsonTree(), default=None, help=FILTER_HELP),
            format_options,
            pass_ctx,
        ]
        for decorator in reversed(decorators):
            fn = decorator(fn)
        return fn

    return wrap


def run_search(
    c: Ctx,
    endpoint: str,
    query: tuple[str, ...],
    limit: int | None,
    fmt: str | None,
    flags: dict[str, bool],
    *,
    full: bool,
    line_numbers: bool,
    full_path: bool,
    collections: tuple[str, ...],
    min_score: float,
    all_results: bool,
    metadata_filter: dict[str, Any] | None,
    **body: Any,
) -> api.SearchResponse | api.CliQueryResponse:
    fmt = pick_format(fmt, flags)
    limit = limit or (CLI_STRUCTURED_RESULTS if fmt in ("json", "files") else CLI_RESULTS)
    body.update(collections=list(collections) or None, min_score=min_score, all=all_results, filter=metadata_filter)
    if endpoint != "/v1/keyword":  # the models: a project's own are asked about first
        ask_trust(c)
    res: api.SearchResponse | api.CliQueryResponse = c.call(
        "POST", endpoint, {"query": " ".join(query), "limit": limit, "full": full, **body}
    )
    _warn(res.get("warnings", []))
    text, warnings = formats.render_search(
        res["results"],
        fmt,
        _style(res.get("editor_uri")),
        full=full,
        line_numbers=line_numbers,
        full_path=full_path,
        cwd=os.getcwd(),
        below_min_score=res.get("below_min_score", False),
    )
    _warn(warnings)
    _out(text)
    return res


@cli.command()
@search_options(min_score_default=0.0)
@click.option("--explain", is_flag=True, help="Show how each score was made.")
@click.option(
    "--fuzzy",
    is_flag=True,
    help="Search a word no document holds as its nearest indexed word, and say so (typo tolerance).",
)
def search(
    c: Ctx,
    query: tuple[str, ...],
    limit: int | None,
    collections: tuple[str, ...],
    all_results: bool,
    min_score: float,
    full: bool,
    line_numbers: bool,
    full_path: bool,
    metadata_filter: dict[str, Any] | None,
    explain: bool,
    fuzzy: bool,
    fmt: str | None,
    **flags: bool,
) -> None:
    """Keyword search (BM25). Syntax: words (prefix match), "exact phrases", -excluded.

    Documents matching every word rank first; documents matching some still rank.
    """
    run_search(
        c,
        "/v1/keyword",
        query,
        limit,
        fmt,
        flags,
        full=full,
        line_numbers=line_numbers,
        full_path=full_path,
        collections=collections,
        min_score=min_score,
        all_results=all_results,
        metadata_filter=metadata_filter,
        explain=explain,
        fuzzy=fuzzy,
    )


@cli.command()
@search_options(min_score_default=VSEARCH_MIN_SCORE)
@click.option("--explain", is_flag=True, help="Show how each score was made.")
def vsearch(
    c: Ctx,
    query: tuple[str, ...],
    limit: int | None,
    collections: tuple[str, ...],
    all_results: bool,
    min_score: float,
    full: bool,
    line_numbers: bool,
    full_path: bool,
    metadata_filter: dict[str, Any] | None,
    explain: bool,
    fmt: str | None,
    **flags: bool,
) -> None:
    """Vector (semantic) search. Needs embeddings ('qmd embed'); without them it says so
    and answers with keyword results."""
    run_search(
        c,
        "/v1/vector",
        query,
        limit,
        fmt,
        flags,
        full=full,
        line_numbers=line_numbers,
        full_path=full_path,
        collections=collections,
        min_score=min_score,
        all_results=all_results,
        metadata_filter=metadata_filter,
        explain=explain,
    )


cli.add_command(vsearch, "vector-search")


_QUERY_HELP = """Hybrid search: keyword and vector results fused into one list; query
expansion and reranking too where the models are made for them (see --expand, --rerank).

\b
QUERY is plain text (expanded when expansion runs) or a query document,
one typed line per sub-query (spec grammar):
  query           = expand_query | query_document ;
  expand_query    = text | explicit_expand ;
  explicit_expand = "expand:" text ;
  query_document  = [ intent_line ] { typed_line } ;
  intent_line     = "intent:" text newline ;
  typed_line      = type ":" text newline ;
  type            = "lex" | "vec" | "hyde" ;
lex: keywords, "exact phrase", -excluded (BM25); vec: a question;
hyde: a sentence the answer would contain; intent: what the search is for.

\b
Examples:
  qmd query "how do I raise money for a startup"
  qmd query $'lex: "series a" term sheet\\nvec: how do seed rounds work'
  qmd query $'intent: web page load times\\nlex: performance\\nhyde: The page renders in under a second.'
  qmd query "release notes" --intent "the 2026.4 launch" --budget-ms 2000

Each stage's time, and why a stage was skipped, go to stderr
(all of them with --explain). Scores are 0-1: fusion of the result
lists blended with the reranker's relevance (see README)."""


CHUNK_STRATEGIES = ("auto", "regex")
"""`auto`: code files (Python, TypeScript/JavaScript, Go, Rust) cut at functions, classes and
imports by tree-sitter; `regex`: every file by the smart (markdown) chunker."""


def chunk_strategy_option(help: str) -> Callable[[Callable], Callable]:  # noqa: A002 - click's word
    """`--chunk-strategy` as `embed` and `query` take it (a typo is click's usage error)."""
    return click.option("--chunk-strategy", type=click.Choice(CHUNK_STRATEGIES), default=None, help=help)


def pipeline_options(candidates_help: str, expand_help: str) -> Callable[[Callable], Callable]:
    """`-C/--candidate-limit` and `--expand/--no-expand`, as `query` and `bench` take them."""

    def wrap(f: Callable) -> Callable:
        f = click.option("--expand/--no-expand", default=None, help=expand_help)(f)
        return click.option(
            "-C",
            "--candidate-limit",
            type=click.IntRange(min=1, max=1000),
            default=CANDIDATE_LIMIT,
            show_default=True,
            help=candidates_help,
        )(f)

    return wrap


@cli.command(help=_QUERY_HELP)
@search_options(min_score_default=0.0)
@click.option("--intent", default=None, help="What the search is for: steers passages and reranking.")
@pipeline_options(
    "Candidates kept after fusion and reranked.",
    "Search model-written variants of the query too, or the query as it is [default: with a "
    "model trained to expand only; a general small model's expansions measured no gain].",
)
@click.option(
    "--rerank/--no-rerank",
    default=None,
    help="Rerank the candidates, or rank by fusion alone [default: with a model trained to rank only; "
    "a general small model's query likelihood costs seconds per query on a CPU].",
)
@click.option(
    "--budget-ms",
    type=click.IntRange(min=1, max=600_000),
    default=None,
    help="Answer within this many ms: drop expansion, then reranking, then vectors as needed.",
)
@click.option("--explain", is_flag=True, help="Show how each score was made, and every stage's time.")
@click.option(
    "--min-relevance",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Drop results less likely than this to be relevant; when none is left, name the closest (MCP's default: "
    f"{AGENT_RELEVANCE_FLOOR:g}).",
)
@click.option(
    "--fuzzy",
    is_flag=True,
    help="Search a word no document holds as its nearest indexed word, and say so (typo tolerance).",
)
@chunk_strategy_option(
    "How candidates are cut to pick the passage reranked: auto keeps a code file's inside its "
    "function or class [default: each collection's chunk_strategy]."
)
def query(
    c: Ctx,
    query: tuple[str, ...],
    limit: int | None,
    collections: tuple[str, ...],
    all_results: bool,
    min_score: float,
    full: bool,
    line_numbers: bool,
    full_path: bool,
    metadata_filter: dict[str, Any] | None,
    intent: str | None,
    candidate_limit: int,
    rerank: bool | None,
    expand: bool | None,
    budget_ms: int | None,
    explain: bool,
    min_relevance: float,
    fuzzy: bool,
    chunk_strategy: str | None,
    fmt: str | None,
    **flags: bool,
) -> None:
    res = run_search(
        c,
        "/v1/query",
        query,
        limit,
        fmt,
        flags,
        full=full,
        line_numbers=line_numbers,
        full_path=full_path,
        collections=collections,
        min_score=min_score,
        all_results=all_results,
        metadata_filter=metadata_filter,
        explain=explain,
        intent=intent,
        candidate_limit=candidate_limit,
        rerank=rerank,
        expand=expand,
        budget_ms=budget_ms,
        chunk_strategy=chunk_strategy,
        fuzzy=fuzzy,
        min_relevance=min_relevance,
    )
    answer = cast(api.CliQueryResponse, res)
    _warn(formats.stage_lines(answer, verbose=explain or c.verbose))
    if (near := answer.get("closest")) is not None:
        _warn([formats.closest_line(near, min_relevance)])


cli.add_command(query, "deep-search")


# -- retrieval -------------------------------------------------------------------


@cli.command()
@click.argument("name")
@click.option("--from", "from_line", type=int, default=None, help="First line to show.")
@click.option("-l", "--lines", "max_lines", type=click.IntRange(min=1), default=None, help="Number of lines.")
@click.option("--line-numbers/--no-line-numbers", default=True, show_default=True)
@click.option("--full", is_flag=True, help="The whole document, whatever range NAME names (a result's file:line).")
@click.option("--full-path", is_flag=True, help="Show the on-disk path in the header.")
@pass_ctx
def get(
    c: Ctx, name: str, from_line: int | None, max_lines: int | None, line_numbers: bool, full: bool, full_path: bool
) -> None:
    """Show a document: a path, qmd://collection/path, #docid, or path:from:count;
    path#heading-anchor (or path#Heading text) shows that markdown section whole."""
    body = {"file": name, "from_line": from_line, "max_lines": max_lines, "full": full, "cwd": os.getcwd()}
    doc: api.DocumentOut = c.call("POST", "/v1/get", body)
    _out(
        formats.render_document(
            doc, from_line=doc["from_line"], line_numbers=line_numbers, full_path=full_path, cwd=os.getcwd()
        )
    )


@cli.command("multi-get")
@click.argument("pattern")
@click.option("-l", "--lines", "max_lines", type=click.IntRange(min=1), default=None, help="Keep the first N lines.")
@click.option(
    "--max-bytes", type=click.IntRange(min=1), default=65536, show_default=True, help="Skip documents larger than this."
)
@click.option("--line-numbers/--no-line-numbers", default=True, show_default=True)
@click.option("--full-path", is_flag=True)
@format_options
@pass_ctx
def multi_get(
    c: Ctx,
    pattern: str,
    max_lines: int | None,
    max_bytes: int,
    line_numbers: bool,
    full_path: bool,
    fmt: str | None,
    **flags: bool,
) -> None:
    """Show several documents: a glob ("notes/**/*.md"), or a comma list of names and #docids."""
    res: api.MultiGetOut = c.call(
        "POST",
        "/v1/multi-get",
        {"pattern": pattern, "max_bytes": max_bytes, "max_lines": max_lines, "cwd": os.getcwd()},
    )
    found: list[api.RetrievedOut] = []
    errors: list[api.UnmatchedOut] = []
    for i in res["items"]:
        if "error" in i:
            errors.append(cast(api.UnmatchedOut, i))
        else:
            found.append(i)
    _warn([e["reason"] for e in errors if e["reason"]])
    text, warnings = formats.render_multi_get(
        found,
        pick_format(fmt, flags),
        _style(res.get("editor_uri")),
        full_path=full_path,
        cwd=os.getcwd(),
        line_numbers=line_numbers,
    )
    _warn(warnings)
    _out(text)
    if errors and not found and "," not in pattern:
        sys.exit(1)


_fmt_bytes = formats.fmt_bytes


def _crash_sentence(crash: dict[str, Any]) -> str:
    """The worker's last crash (the daemon's `WorkerCrash`) in words: which model, how, when, how often, what next."""
    at = time.strftime("%H:%M", time.localtime(crash["at"]))
    if not crash.get("model") or crash.get("signal") in (None, "SIGKILL"):
        return f"last worker crash, at {at}: {crash['reason']}"
    # a recovery says how often itself ("… crashed it 2 times: it is loaded next time …")
    times = f" ({crash['times']} times)" if crash["times"] > 1 and not crash.get("recovery") else ""
    sentence = f"the {crash['role']} model {os.path.basename(crash['model'])} crashed the worker with {crash['signal']}"
    return f"{sentence} at {at}{times}" + (f"; {crash['recovery']}" if crash.get("recovery") else "")


def _ago(iso: str | None) -> str:
    if not iso:
        return "never"
    from datetime import datetime

    secs = (datetime.now(UTC) - datetime.fromisoformat(iso)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{int(secs // size)}{unit} ago"
    return "just now"


@cli.command()
@click.argument("target", required=False)
@pass_ctx
def ls(c: Ctx, target: str | None) -> None:
    """List collections, or the files of one (`ls notes`, `ls qmd://notes/sub`)."""
    res: api.LsOut = c.call("GET", "/v1/ls", params={"target": target} if target else None)
    if not target:
        if not res["collections"]:
            _out("No collections. Add one with: qmd collection add <folder> --name <name>")
            return
        _out("Collections:\n" + "\n".join(f"  qmd://{x['name']}/  ({x['files']} files)" for x in res["collections"]))
        return
    if not res["files"]:
        where = f"qmd://{res['collection']}/{res['prefix']}" if res["prefix"] else res["collection"]
        _out(f"No files found under {where}")
        return
    lines = []
    for f in res["files"]:
        lines.append(f"{_fmt_bytes(f['bytes']):>9}  {f['modified_at'][:16].replace('T', ' ')}  {f['file']}")
    _out("\n".join(lines))


# -- indexing --------------------------------------------------------------------


class ProgressBar:
    """One line on stderr, redrawn in place; only on a TTY."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self.drawn = False

    def draw(self, done: int, total: int, rate: str) -> None:
        if not self.enabled:
            return
        width = 30
        filled = int(width * done / total) if total else width
        sys.stderr.write(f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {rate} ")
        sys.stderr.flush()
        self.drawn = True

    def clear(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
            self.drawn = False


def run_update(c: Ctx, collections: list[str] | None, *, as_json: bool = False) -> None:
    """The update's events as they come; with `as_json`, only its report, as the daemon sent it."""
    ask_trust(c)
    bar = ProgressBar()
    t0 = time.monotonic()
    total_skipped = 0
    try:
        for ev in c.daemon.stream("/v1/update", {"collections": collections}):
            kind = ev["event"]
            if as_json and kind in ("collection", "summary"):
                continue  # the report holds them
            if kind == "collection":
                bar.clear()
                click.echo(f"[{ev['index']}/{ev['count']}] {ev['name']} ({ev['pattern']})")
            elif kind == "hook":
                bar.clear()
                click.echo(f"    Running update command: {ev['command']}", err=as_json)
            elif kind == "gated":
                bar.clear()
                click.echo(f"⚠ {ev['note']}", err=True)
            elif kind == "hook_done":
                if ev["output"].strip():
                    click.echo("\n".join("    " + line for line in ev["output"].rstrip().splitlines()), err=as_json)
            elif kind == "progress":
                bar.draw(ev["done"], ev["total"], f"files  {ev['files_per_s']:.0f} files/s")
            elif kind == "summary":
                bar.clear()
                for w in ev["warnings"]:
                    click.echo(f"  ⚠ {w}", err=True)
                click.echo(f"  {ev['line']}")
                if ev["watcher_line"]:
                    click.echo(f"  ({ev['watcher_line']})")
                if len(ev["loaders"]) > 1 or set(ev["loaders"]) - {"markdown"}:
                    click.echo("  Read: " + ", ".join(f"{n} {kind}" for kind, n in sorted(ev["loaders"].items())))
                for s in ev["skipped"][:20]:
                    click.echo(f"  ⚠ Skipped {s['path']}: {s['reason']}", err=True)
                if len(ev["skipped"]) > 20:
                    click.echo(f"  ⚠ … and {len(ev['skipped']) - 20} more skipped (see 'qmd status')", err=True)
                total_skipped += len(ev["skipped"])
                if ev["orphans_cleaned"]:
                    click.echo(f"  Cleaned up {ev['orphans_cleaned']} orphaned content hash(es)")
            elif kind == "done":
                bar.clear()
                if as_json:
                    _out(json.dumps(ev["report"], indent=2))
                    return
                n, held = len(ev["report"]["collections"]), len(ev["report"]["not_updated"])
                if n + held == 0:
                    click.echo("No collections found. Run 'qmd collection add .' to index markdown files.")
                    return
                took = f"{time.monotonic() - t0:.1f}s, {total_skipped} skipped"
                if held:  # said above, one line each: never "all updated" over one left out
                    click.echo(f"⚠ {n} of {n + held} collections updated ({took}); {held} not, as said above.")
                else:
                    click.echo(f"✓ All collections updated ({took}).")
    except ClientError as e:
        bar.clear()
        if e.detail.get("exit_code") is not None:
            if e.detail.get("output"):
                click.echo("\n".join("    " + line for line in e.detail["output"].rstrip().splitlines()), err=True)
            click.echo(f"✗ {e.message}", err=True)
            sys.exit(int(e.detail["exit_code"]) or 1)
        raise


@cli.command()
@only_collections
@click.option("--json", "as_json", is_flag=True, help="The report as JSON (the daemon's, as sent).")
@pass_ctx
def update(c: Ctx, collections: tuple[str, ...], as_json: bool) -> None:
    """Re-index collections (running their update commands first). Reports, per collection,
    what changed since its last report, including what the watcher indexed meanwhile."""
    run_update(c, list(collections) or None, as_json=as_json)


@cli.command()
@only_collections
@click.option(
    "-f", "--force", is_flag=True, help="Drop the current model's vectors (of the -c collections) and embed again."
)
@click.option("--max-docs-per-batch", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--max-batch-mb", type=click.FloatRange(min=0, min_open=True), default=4.0, show_default=True)
@chunk_strategy_option(
    "auto: cut code files at functions, classes and imports (tree-sitter); regex: as prose. "
    "Saved as the collections' chunk_strategy in index.yml [default: theirs, else regex]."
)
@click.option("--json", "as_json", is_flag=True, help="The report as JSON (the daemon's, as sent).")
@click.option(
    "--follow",
    is_flag=True,
    help="Start nothing: follow the embed running now (the background one after 'collection add') until it ends.",
)
@pass_ctx
def embed(
    c: Ctx,
    collections: tuple[str, ...],
    force: bool,
    max_docs_per_batch: int,
    max_batch_mb: float,
    chunk_strategy: str | None,
    as_json: bool,
    follow: bool,
) -> None:
    """Embed documents for vector search (only what changed; resumable; Ctrl-C stops cleanly)."""
    if follow:
        if collections or force or chunk_strategy:
            raise click.UsageError("--follow starts nothing: it takes no -c, --force or --chunk-strategy")
        follow_embed(c, as_json)
        return
    bar = ProgressBar()
    body = {
        "collections": list(collections) or None,
        "force": force,
        "max_docs_per_batch": max_docs_per_batch,
        "max_batch_mb": max_batch_mb,
        "chunk_strategy": chunk_strategy,
    }
    _model_notes(c)
    try:
        for ev in c.daemon.stream("/v1/embed", body):
            if ev["event"] == "download":
                total = ev["total"] or 0
                bar.draw(ev["done"] // 2**20, total // 2**20, "MB  downloading the embed model")
            elif ev["event"] == "notice":  # waiting for another embed, or a batch sent again to a new worker
                bar.clear()
                click.echo(ev["message"], err=True)
            elif ev["event"] == "progress":
                eta = f"ETA {ev['eta_s']:.0f}s" if ev["eta_s"] is not None and ev["done"] < ev["total"] else ""
                bar.draw(
                    ev["done"], ev["total"], f"docs  {ev['chunks']} chunks  {ev['chunks_per_s']:.1f} chunks/s  {eta}"
                )
            elif ev["event"] == "done":
                bar.clear()
                r = ev["report"]
                if as_json:
                    _out(json.dumps(r, indent=2))
                if r["switched"]:
                    click.echo(
                        f"Chunk strategy {chunk_strategy} for {', '.join(r['switched'])} (saved in index.yml): "
                        "searched in that strategy's vector space from now on, embedded there where missing.",
                        err=True,
                    )
                if r["truncated_count"]:
                    names = ", ".join(sorted({x["file"] for x in r["truncated"]})[:10])
                    click.echo(
                        f"⚠ {r['truncated_count']} chunk(s) were longer than the embedder reads and were embedded "
                        f"clipped: {names}",
                        err=True,
                    )
                if r["cancelled"]:
                    click.echo("Stopped early; what was embedded is kept. Run 'qmd embed' again to continue.", err=True)
                if not as_json:
                    click.echo(f"✓ {r['line']}")
    except KeyboardInterrupt:
        bar.clear()
        click.echo("Cancelled; every completed batch is kept. Run 'qmd embed' again to continue.", err=True)
        sys.exit(130)


FOLLOW_POLL_S = 0.5
FOLLOW_LINE_S = 5.0
"""Without a terminal (a log, a pipe), `--follow` prints a progress line this often."""


def follow_embed(c: Ctx, as_json: bool) -> None:
    """`qmd embed --follow`: poll the running embed's progress until none runs, then print
    the report of the one that finished (text, or with `as_json` the report as sent)."""
    bar = ProgressBar()
    followed = False
    printed = 0.0
    said: tuple[str, int] = ("", 0)  # the run followed (its start) and how many of its notices are shown
    try:
        while True:
            state: api.EmbedProgressOut = c.call("GET", "/v1/embed/progress")
            run = state["running"]
            if run is None:
                break
            shown = said[1] if said[0] == run["started_at"] else 0
            total = run.get("notices_total", 0)
            for message in run.get("notices", [])[shown - total :] if total > shown else []:
                bar.clear()
                click.echo(message, err=True)
            said = (run["started_at"], total)
            line = formats.embed_progress_line(run)
            if bar.enabled:
                bar.draw(run["documents_done"], run["documents_total"], line.split(" · ", 1)[-1])
            elif time.monotonic() - printed >= FOLLOW_LINE_S:
                click.echo(f"Embedding: {line}", err=True)
                printed = time.monotonic()
            followed = True
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        bar.clear()
        click.echo("Stopped following; the embed goes on (see 'qmd status').", err=True)
        sys.exit(130)
    bar.clear()
    last = state["last"]
    if as_json:
        _out(json.dumps(last, indent=2))
    elif not followed:
        click.echo("No embed is running." + ("" if last is None else f" The last one ({state['last_source']}):"))
        if last is not None:
            click.echo(f"  {last['line']}")
    elif last is not None:
        click.echo(f"✓ {last['line']}")


@cli.command()
@click.option("--refresh", is_flag=True, help="Re-check cached models and download changed ones.")
@pass_ctx
def pull(c: Ctx, refresh: bool) -> None:
    """Download the configured models now (resumable), instead of on first use."""
    bar = ProgressBar()
    failed = False
    _model_notes(c)
    for ev in c.daemon.stream("/v1/pull", {"refresh": refresh}):
        if ev["event"] == "model":
            click.echo(f"{ev['role']}: {ev['uri']} ({ev['source']})")
        elif ev["event"] == "download":
            bar.draw(ev["done"] // 2**20, (ev["total"] or 0) // 2**20, "MB")
        elif ev["event"] == "pulled":
            bar.clear()
            if ev.get("error"):
                failed = True
                click.echo(f"  ✗ {ev['error']}", err=True)
            elif ev.get("path"):
                how = "downloaded" if ev["downloaded"] else "present"
                click.echo(f"  ✓ {how}: {ev['path']} ({_fmt_bytes(ev['size'])})")
            else:
                click.echo(f"  ✓ {ev.get('note') or 'nothing to do'}")
    st: api.StatusOut = c.call("GET", "/v1/status")
    missing = st["inference"].get("models_missing")
    if missing:
        click.echo(f"⚠ The models are on disk but cannot run yet: {missing}", err=True)
    if failed:
        sys.exit(1)


BENCH_BACKENDS = ("bm25", "vector", "hybrid", "full")


class NdcgFloor(click.ParamType):
    """`0.8` (every backend that ran) or `bm25=0.8` (that backend, which must run)."""

    name = "[BACKEND=]X"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        backend, _, number = str(value).rpartition("=")
        if backend and backend not in BENCH_BACKENDS:
            self.fail(f"{backend!r} is not a backend: one of {', '.join(BENCH_BACKENDS)}", param, ctx)
        try:
            floor = float(number)
        except ValueError:
            floor = -1.0
        if not 0 <= floor <= 1:
            self.fail(f"{value!r}: the floor is a number from 0 to 1, like 0.8 or bm25=0.8", param, ctx)
        return (backend or None, floor)


@cli.command()
@click.argument("fixture", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--beir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="A BEIR-format folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv) instead of a fixture; "
    "it is indexed into a collection of its own, removed afterwards unless --keep.",
)
@click.option("-c", "--collection", help="The collection to measure [default: the fixture's; for --beir, bench-DIR].")
@click.option(
    "-b", "--backend", "backends", multiple=True, type=click.Choice(BENCH_BACKENDS), help="Only these (repeatable)."
)
@click.option("--split", default="test", show_default=True, help="--beir: which qrels/SPLIT.tsv.")
@click.option("--max-queries", type=click.IntRange(min=1), help="--beir: the first N judged queries only.")
@click.option("--embed", "embed_first", is_flag=True, help="--beir: embed the corpus first (vector, hybrid, full).")
@click.option("--keep", is_flag=True, help="--beir: keep the collection and its vectors for the next run.")
@pipeline_options(
    "hybrid and full: candidates kept after fusion (and reranked, for full).",
    "hybrid and full: expand each query, or not [default: as a query does].",
)
@click.option("--json", "as_json", is_flag=True, help="The whole report as JSON: per query, per backend, summaries.")
@click.option(
    "--min-ndcg",
    "floors",
    multiple=True,
    type=NdcgFloor(),
    help="Exit 1 when a backend's mean nDCG@10 is below X: 'X' for every backend that ran, "
    "'BACKEND=X' for one, which must then run (repeatable).",
)
@pass_ctx
def bench(
    c: Ctx,
    fixture: Path | None,
    beir: Path | None,
    collection: str | None,
    backends: tuple[str, ...],
    split: str,
    max_queries: int | None,
    embed_first: bool,
    keep: bool,
    candidate_limit: int,
    expand: bool | None,
    as_json: bool,
    floors: tuple[tuple[str | None, float], ...],
) -> None:
    """Measure search quality: precision, recall, MRR, F1 and nDCG@10 per backend (bm25,
    vector, hybrid, full), on a fixture of queries with expected files or a BEIR-format set."""
    if (fixture is None) == (beir is None):
        raise click.UsageError("give a FIXTURE file or --beir DIR (one of them)")
    body: dict[str, object] = {
        "collection": collection,
        "backends": list(backends) or None,
        "split": split,
        "maxQueries": max_queries,
        "candidateLimit": candidate_limit,
        "expand": expand,
    }
    if fixture is not None:
        if embed_first or keep or max_queries:
            raise click.UsageError("--embed, --keep and --max-queries apply to --beir only")
        try:
            body |= {"fixture": json.loads(fixture.read_text(encoding="utf-8")), "source": fixture.name}
        except OSError as e:
            raise click.UsageError(f"cannot read {fixture}: {e.strerror or e}") from e
        except (ValueError, UnicodeDecodeError) as e:
            raise click.UsageError(f"{fixture} is not JSON: {e}") from e
    else:
        assert beir is not None
        body |= {"beir": str(beir.resolve()), "embed": embed_first, "keep": keep}
    bar = ProgressBar()
    try:
        for ev in c.daemon.stream("/v1/bench", body):
            if ev["event"] == "progress" and "backend" in ev:
                bar.draw(ev["done"], ev["total"], f"queries  {ev['backend']}")
            elif ev["event"] == "progress" and "files_per_s" in ev:
                bar.draw(ev["done"], ev["total"], "files indexed")
            elif ev["event"] == "done":
                bar.clear()
                click.echo(json.dumps(ev["report"], indent=2) if as_json else ev["text"], nl=as_json)
                for warning in ev["report"]["warnings"] if as_json else []:
                    click.echo(f"⚠ {warning}", err=True)
                if below := below_floors(ev["report"], floors):
                    click.echo("\n".join(f"✗ {line}" for line in below), err=True)
                    sys.exit(1)
    except KeyboardInterrupt:
        bar.clear()
        click.echo("Cancelled.", err=True)
        sys.exit(130)


def below_floors(report: dict[str, Any], floors: tuple[tuple[str | None, float], ...]) -> list[str]:
    """Each `--min-ndcg` floor the report does not reach (seed 002: the eval stays at or
    above its floor). A floor named for a backend that did not run is not reached."""
    ran = {b["name"] for b in report["backends"] if b["status"] in ("ran", "partial")}
    out = []
    for backend, floor in floors:
        for name in [backend] if backend else sorted(ran):
            if name not in ran:
                out.append(f"{name}: did not run, so its nDCG@10 floor {floor:.3f} is not met")
                continue
            ndcg = report["summary"][name]["means"]["ndcg_at_10"]
            if ndcg < floor:
                out.append(f"{name}: nDCG@10 {ndcg:.3f} is below the floor {floor:.3f}")
    return out


@cli.command()
@click.option("--dry-run", is_flag=True, help="Show what would be dropped; change nothing.")
@click.option(
    "--vacuum/--no-vacuum",
    default=None,
    help="VACUUM always / never [default: when free pages are 10% or more of the file].",
)
@click.option(
    "--cache-days",
    type=click.IntRange(min=0, max=36_500),
    default=30,
    show_default=True,
    help="Drop cached model outputs older than this many days (0: all of them).",
)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0, max=3600),
    default=30.0,
    show_default=True,
    help="Seconds to wait for a running update or embed before refusing.",
)
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
@pass_ctx
def cleanup(c: Ctx, dry_run: bool, vacuum: bool | None, cache_days: int, wait_s: float, as_json: bool) -> None:
    """Drop orphaned documents, content and vectors, unused vector spaces and stale cache; optimize; VACUUM."""
    body = {"dry_run": dry_run, "vacuum": vacuum, "cache_days": cache_days, "wait_s": wait_s}
    for ev in c.daemon.stream("/v1/cleanup", body):
        if ev["event"] == "step":
            c.note(f"cleanup: {ev['step']}")
        elif ev["event"] == "done":
            _out(json.dumps(ev["report"], indent=2) if as_json else formats.render_cleanup(ev["report"]))


@cli.command()
@pass_ctx
def doctor(c: Ctx) -> None:
    """Versions, SQLite and sqlite-vec, the llama.cpp build, each model, pending vectors."""
    d: api.Doctor = c.call("GET", "/v1/doctor")
    inf = d["inference"]
    ok, warn = "✓", "⚠"
    lines = [f"{ok} Python {d['python']}"]
    lines += [f"{ok} {k} {v}" for k, v in d["packages"].items() if v]
    lines += [f"{warn} {k} not installed" for k, v in d["packages"].items() if not v]
    lines.append(f"{ok} SQLite {d['sqlite']}")
    lines += [f"{ok if c['ok'] else warn} {c['what']}" for c in d["index"]]
    if d["backend"] == "sqlite":
        lines.append(
            f"{ok} sqlite-vec {d['sqlite_vec']}" if d["sqlite_vec"] else f"{warn} sqlite-vec could not load: no vectors"
        )
    if inf.get("models_missing"):
        lines.append(f"{warn} {inf['models_missing']}")
    backend = inf.get("backend") or "not started yet"
    choice = inf.get("gpu_choice") or "auto"
    if inf["force_cpu"]:
        gpu = "GPU refused (QMD_FORCE_CPU / --no-gpu)"
    elif choice == "cpu":
        gpu = "GPU refused (QMD_LLAMA_GPU)"
    else:
        gpu = "GPU if the build has one" if choice == "auto" else f"GPU backend {choice} (QMD_LLAMA_GPU)"
    lines.append(
        f"{ok} llama.cpp worker: {backend}; {inf['n_threads']} threads; {gpu}; "
        f"embed parallelism {inf.get('embed_parallelism', 'auto')}; restarts {inf['restarts']}"
    )
    if inf.get("offload"):
        lines.append(f"    offload to: {inf['offload']}")
    if inf.get("devices"):
        lines.append(f"    devices: {', '.join(inf['devices'])}")
    lines += [f"{warn} {w}" for w in inf.get("warnings") or []]
    if inf.get("last_crash"):
        lines.append(f"{warn} {_crash_sentence(inf['last_crash'])}")
    for m in d["models"]:
        if m.get("error"):
            lines.append(f"{warn} models: {m['error']}")
            continue
        head = f"{m['role']}: {m['uri']} ({m['source']})"
        if m.get("problem"):
            lines.append(f"{warn} {head} — {m['problem']}")
        elif m.get("method") == "cosine":
            lines.append(f"{ok} {head} — reranks by the embedder's cosine: no model to load")
        else:
            state = "loaded" if m.get("loaded") else "not loaded"
            fp = f", fingerprint {m['fingerprint'][:12]}" if m["fingerprint"] else ""
            fp += f", reranks by {m['method']}" if m["method"] else ""
            lines.append(f"{ok} {head}\n    {m['file']} ({_fmt_bytes(m['size'] or 0)}, {m['arch']}, {state}{fp})")
    v = d["vector"]
    lines.append(f"{ok if not v['pending'] else warn} vectors: {v['message']}")
    if v["stale_contents"]:
        lines.append(
            f"{warn} {v['stale_contents']} documents have vectors from an earlier vector space (another model,"
            " chunker or chunk context): re-embedded by 'qmd embed'"
        )
    lines += formats.orphan_lines(d["orphans"])
    _out("\n".join(lines))


def _models_line(inf: dict) -> str:
    if inf.get("models_missing"):
        return inf["models_missing"]
    loaded = [
        f"{Path(m['path']).name} ({m['role']}" + (f", {m['parallelism']} contexts)" if m["parallelism"] > 1 else ")")
        for m in inf["models_loaded"]
    ]
    if not loaded:
        return "none loaded (they load on first use)"
    return f"{', '.join(loaded)}; {inf['contexts_live']} context(s) live; worker PID {inf['pid']}"


@cli.command()
@click.argument("name", required=False, shell_complete=complete_collections)
@click.option("--json", "as_json", is_flag=True, help="The status as JSON (the daemon's /v1/status).")
@click.option(
    "--files",
    "files",
    is_flag=True,
    help="Each file by state: indexed, pending, skipped, failed (NAME: one collection).",
)
@pass_ctx
def status(c: Ctx, name: str | None, as_json: bool, files: bool) -> None:
    """Index, daemon and collection health; with --files, what the index holds of each folder."""
    if files:
        coverage: api.CoverageOut = c.call("GET", "/v1/coverage", params={"collection": name} if name else None)
        got = coverage["collections"]
        _out(json.dumps(got, indent=2) if as_json else formats.render_coverage(got))
        return
    if name:
        raise click.UsageError(f"a collection name ({name}) goes with --files: qmd status --files {name}")
    s: api.StatusOut = c.call("GET", "/v1/status")
    if as_json:
        _out(json.dumps(s, indent=2))
        return
    d = s["daemon"]
    lines = [
        "QMD Status",
        "",
        f"Index:  {s['index_path']}",
        f"Size:   {_fmt_bytes(s['size_bytes'])}",
        f"Daemon: running (PID {d['pid']}, up {d['uptime']}s) at {d['url']}",
        f"Models: {_models_line(s['inference'])}",
        "",
        "Documents",
        f"  Total:    {s['documents']} files indexed",
        f"  Vectors:  {s['vector']['message']}",
        *([f"  Embedding: {formats.embed_progress_line(run)}"] if (run := s.get("embedding")) else []),
        *_orphaned_line(s["vector"]),
        *_grammar_lines(s.get("grammars") or []),
        *(["", "Project config"] if s.get("warnings") else []),
        *(f"  ⚠ {w}" for w in s.get("warnings") or []),
    ]
    if s["collections"]:
        lines += ["", "Collections"]
        for col in s["collections"]:
            excluded = "" if col["include_by_default"] else " [excluded]"
            lines.append(f"  {col['name']} (qmd://{col['name']}/){excluded}")
            lines.append(f"    Pattern:  {col['pattern']}")
            lines.append(f"    Files:    {col['files']} (updated {_ago(col['updated_at'])})")
            lines += _watch_lines(col.get("watch"))
            if col.get("chunk_strategy", "regex") != "regex":
                lines.append(f"    Chunking: {col['chunk_strategy']} (code files at functions, classes, imports)")
            if col["contexts"]:
                lines.append(f"    Contexts: {len(col['contexts'])}")
            lines += _metadata_lines(col)
            last_run = col.get("last_run")
            for w in last_run["warnings"] if last_run else []:
                lines.append(f"    ⚠ {w}")
            if col["skipped"]:
                lines.append(f"    Skipped:  {len(col['skipped'])}")
                lines += [f"      {x['path']}: {x['reason']}" for x in col["skipped"][:10]]
                if len(col["skipped"]) > 10:
                    lines.append(f"      … and {len(col['skipped']) - 10} more")
    else:
        lines += ["", "No collections yet. Add one with: qmd collection add <folder> --name <name>"]
    _out("\n".join(lines))


def _watch_lines(watch: api.WatchInfo | None) -> list[str]:
    """`qmd status`: does the daemon keep the collection fresh, how, and how far behind it is."""
    if not watch:
        return []
    how = watch["mode"] + (f" ({watch['reason']})" if watch["reason"] else "")
    if watch["mode"] != "off":
        seen = f"last change {_ago(watch['last_change'])}" if watch["last_change"] else "no change seen yet"
        how += f"; {seen}, {watch['queue']} queued, {watch['passes']} passes"
    lines = [f"    Watch:    {how}"]
    if watch["pending_vectors"]:
        lines.append(
            f"    Vectors:  {watch['pending_vectors']} documents pending (background embedding {watch['embedding']})"
        )
    return lines


def _grammar_lines(grammars: list[api.GrammarStatus]) -> list[str]:
    """`qmd status`: which code grammars `--chunk-strategy auto` can use here (a missing one's
    files are chunked as prose), and why the others cannot load."""
    ok = [g["language"] for g in grammars if g["available"]]
    lines = ["", "AST Chunking (--chunk-strategy auto)", f"  Grammars: {', '.join(ok) or 'none'}"]
    missing = [g for g in grammars if not g["available"]]
    lines += [f"  Missing:  {g['language']}: {g['error']} (its files fall back to regex)" for g in missing]
    return lines


def _metadata_lines(col: api.CollectionOut | api.CollectionShown) -> list[str]:
    """`qmd status`: a collection's top keys, and what a filter cannot see there (and why)."""
    meta, keys = col.get("metadata"), col.get("metadata_keys") or ""
    if not meta or not (meta["with_metadata"] or meta["pending"] or meta["rejected"]):
        return []
    parts = [f"{meta['with_metadata']} files with metadata"]
    if meta["pending"]:
        parts.append(f"{meta['pending']} documents pending extraction (run 'qmd update')")
    if meta["rejected"]:
        parts.append(f"{meta['rejected']} rejected")
    lines = ["  " + keys if keys else "    Metadata: no keys", "              " + ", ".join(parts)]
    lines += [f"      {x['path']}: {x['reason']}" for x in meta["examples"]]
    if meta["rejected"] > len(meta["examples"]):
        lines.append(f"      … and {meta['rejected'] - len(meta['examples'])} more")
    return lines


def _orphaned_line(vector: api.VectorState) -> list[str]:
    """`qmd status`: vector chunks no document holds any more (not counted as embedded)."""
    n = vector["orphan_chunks"]
    return [f"  Orphaned: {n} embedding chunks of old or deleted documents (run 'qmd cleanup')"] if n else []


# -- collections -----------------------------------------------------------------


@cli.group()
def collection() -> None:
    """Add, list, remove and configure collections."""


@collection.command("add")
@click.argument("path", type=click.Path(file_okay=True, dir_okay=True, path_type=str))
@click.option("--name", default=None, help="Collection name [folder name].")
@click.option(
    "--mask", "--glob", "mask", default=None, help="Glob(s) of files to index [**/*.md]; comma list or {a,b}."
)
@pass_ctx
def collection_add(c: Ctx, path: str, name: str | None, mask: str | None) -> None:
    """Index a folder as a new collection."""
    absolute = os.path.abspath(os.path.expanduser(path))
    res: api.CollectionCreated = c.call("POST", "/v1/collections", {"path": absolute, "name": name, "pattern": mask})
    click.echo(f"Creating collection '{res['name']}'...")
    run_update(c, [res["name"]])
    click.echo(f"✓ Collection '{res['name']}' created successfully")
    _background_embed_note(c, res["name"])


def _background_embed_note(c: Ctx, name: str) -> None:
    """Where the daemon embeds what its watcher indexes, start the new collection's embed now
    and say so: how much, with which model, and how to follow it."""
    try:
        started: api.BackgroundStart = c.call("POST", "/v1/embed/background", {"collection": name})
    except ClientError as e:  # the collection is added and indexed: only its vectors wait
        click.echo(f"⚠ No background embedding started ({e.message}); run 'qmd embed'.", err=True)
        return
    if started["started"]:
        click.echo(
            f"Embedding {started['documents']} documents in the background with {started['model']}: "
            "'qmd status' shows its progress, 'qmd embed --follow' follows it."
        )


@collection.command("list")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def collection_list(c: Ctx, as_json: bool) -> None:
    """List collections."""
    listed: api.CollectionsOut = c.call("GET", "/v1/collections")
    colls = listed["collections"]
    if as_json:
        import json

        _out(json.dumps(colls, indent=2))
        return
    if not colls:
        _out("No collections found. Run 'qmd collection add .' to create one.")
        return
    lines = [f"Collections ({len(colls)}):", ""]
    for col in colls:
        lines.append(f"{col['name']} (qmd://{col['name']}/)" + ("" if col["include_by_default"] else " [excluded]"))
        lines.append(f"  Pattern:  {col['pattern']}")
        if col["ignore"]:
            lines.append(f"  Ignore:   {', '.join(col['ignore'])}")
        lines.append(f"  Files:    {col['files']}")
        lines.append(f"  Updated:  {_ago(col['updated_at'])}")
        if col.get("metadata_keys"):
            lines.append(col["metadata_keys"])
        lines.append("")
    _out("\n".join(lines).rstrip())


@collection.command("show")
@click.argument("name", shell_complete=complete_collections)
@pass_ctx
def collection_show(c: Ctx, name: str) -> None:
    """Show one collection's settings."""
    col: api.CollectionShown = c.call("GET", f"/v1/collections/{_seg(name)}")
    lines = [
        f"Collection: {col['name']}",
        f"  Path:     {col['path']}",
        f"  Pattern:  {col['pattern']}",
        f"  Ignore:   {', '.join(col['ignore']) or '(none)'}",
        f"  Include:  {'yes (default)' if col['include_by_default'] else 'no'}",
        f"  Update:   {col['update_command'] or '(none)'}",
        f"  Files:    {col['files']}",
        f"  Contexts: {len(col['contexts'])}",
    ]
    lines += [f"    /{k}: {v}" for k, v in col["contexts"].items()]
    lines.append(col["metadata_overview"])
    _out("\n".join(lines))


@collection.command("metadata")
@click.argument("name", required=False, shell_complete=complete_collections)
@click.option(
    "--match", "match", type=JsonTree(), default=None, help="Report only entries matching this (field: key|value)."
)
@click.option(
    "--filter", "metadata_filter", type=JsonTree(), default=None, help="Count only documents matching this filter."
)
@click.option("--key-limit", type=click.IntRange(min=1), default=50, show_default=True, help="Keys reported.")
@click.option("--key-offset", type=click.IntRange(min=0), default=0, help="Keys skipped before the window.")
@click.option("--all-keys", is_flag=True, help="Remove the key window.")
@click.option(
    "--value-limit", type=click.IntRange(min=1), default=10, show_default=True, help="Values per key and type."
)
@click.option("--value-offset", type=click.IntRange(min=0), default=0, help="Values skipped per key and type.")
@click.option("--all-values", is_flag=True, help="Remove the value window.")
@click.option("--sort", type=click.Choice(["count", "value"]), default="count", show_default=True)
@click.option("--min-count", type=click.IntRange(min=1), default=1, help="Drop values held by fewer documents.")
@pass_ctx
def collection_metadata(
    c: Ctx,
    name: str | None,
    match: dict[str, Any] | None,
    metadata_filter: dict[str, Any] | None,
    key_limit: int,
    key_offset: int,
    all_keys: bool,
    value_limit: int,
    value_offset: int,
    all_values: bool,
    sort: str,
    min_count: int,
) -> None:
    """Which metadata keys, types and values the documents hold: what to filter on.

    \b
    Without NAME: the default collections, as an unscoped search.
      qmd collection metadata notes
      qmd collection metadata notes --match '{"field":"key","operator":"eq","value":"topics"}'
      qmd collection metadata notes --match '{"field":"value","operator":"eq","value":"docs-team"}'
      qmd collection metadata notes --filter '{"field":"status","operator":"eq","value":"published"}'
    """
    res: api.CliMetadataResponse = c.call(
        "POST",
        "/v1/metadata",
        {
            "collections": [name] if name else None,
            "match": match,
            "filter": metadata_filter,
            "key_limit": None if all_keys else key_limit,
            "key_offset": key_offset,
            "value_limit": None if all_values else value_limit,
            "value_offset": value_offset,
            "sort": sort,
            "min_count": min_count,
        },
    )
    _warn(res["warnings"])
    _out(res["text"])


def _seg(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


@collection.command("remove")
@click.argument("name", shell_complete=complete_collections)
@pass_ctx
def collection_remove(c: Ctx, name: str) -> None:
    """Remove a collection and its documents from the index (files are untouched)."""
    res: api.CollectionDeleted = c.call("DELETE", f"/v1/collections/{_seg(name)}")
    click.echo(f"✓ Removed collection '{name}'\n  Deleted {res['deleted_documents']} documents")


@collection.command("rename")
@click.argument("old", shell_complete=complete_collections)
@click.argument("new")
@pass_ctx
def collection_rename(c: Ctx, old: str, new: str) -> None:
    """Rename a collection."""
    c.call("POST", f"/v1/collections/{_seg(old)}/rename", {"new_name": new})
    click.echo(f"✓ Renamed collection '{old}' to '{new}'")


@collection.command("include")
@click.argument("name", shell_complete=complete_collections)
@pass_ctx
def collection_include(c: Ctx, name: str) -> None:
    """Search this collection by default."""
    c.call("PATCH", f"/v1/collections/{_seg(name)}", {"include_by_default": True})
    click.echo(f"✓ Collection '{name}' is searched by default")


@collection.command("exclude")
@click.argument("name", shell_complete=complete_collections)
@pass_ctx
def collection_exclude(c: Ctx, name: str) -> None:
    """Search this collection only when named with -c."""
    c.call("PATCH", f"/v1/collections/{_seg(name)}", {"include_by_default": False})
    click.echo(f"✓ Collection '{name}' is excluded from default searches (use -c {name})")


@collection.command("update-cmd")
@click.argument("name", shell_complete=complete_collections)
@click.argument("command", nargs=-1)
@pass_ctx
def collection_update_cmd(c: Ctx, name: str, command: tuple[str, ...]) -> None:
    """Set (or, with no command, clear) the bash command run before re-indexing."""
    cmd = " ".join(command).strip()
    body = {"update_command": cmd} if cmd else {"clear_update_command": True}
    c.call("PATCH", f"/v1/collections/{_seg(name)}", body)
    click.echo(f"✓ Update command for '{name}' set: {cmd}" if cmd else f"✓ Update command for '{name}' cleared")


for _alias, _cmd in (
    ("rm", collection_remove),
    ("mv", collection_rename),
    ("info", collection_show),
    ("set-update", collection_update_cmd),
):
    collection.add_command(_cmd, _alias)


# -- contexts --------------------------------------------------------------------


@cli.group()
def context() -> None:
    """Describe folders so results carry context (qmd:// paths, folders, or / for global)."""


@context.command("add")
@click.argument("args", nargs=-1, required=True)
@pass_ctx
def context_add(c: Ctx, args: tuple[str, ...]) -> None:
    """context add [PATH] TEXT  (PATH defaults to the current folder)."""
    target, text = (args[0], " ".join(args[1:])) if len(args) > 1 else (".", args[0])
    res: api.Context = c.call("POST", "/v1/contexts", {"target": target, "text": text, "cwd": os.getcwd()})
    where = "global" if res["collection"] is None else f"qmd://{res['collection']}/{res['path']}"
    click.echo(f"✓ Added context for {where}")


@context.command("list")
@pass_ctx
def context_list(c: Ctx) -> None:
    """List contexts."""
    contexts: api.ContextsOut = c.call("GET", "/v1/contexts")
    items = contexts["contexts"]
    if not items:
        _out('No contexts configured. Add one with: qmd context add <path> "description"')
        return
    lines = ["Configured Contexts", ""]
    last = object()
    for it in items:
        if it["collection"] != last:
            lines.append("*" if it["collection"] is None else it["collection"])
            last = it["collection"]
        lines.append(f"  {it['path'] or '/ (root)'}")
        lines.append(f"    {it['text']}")
    _out("\n".join(lines))


@context.command("rm")
@click.argument("target")
@pass_ctx
def context_rm(c: Ctx, target: str) -> None:
    """Remove a context."""
    res: api.Context = c.call("POST", "/v1/contexts/remove", {"target": target, "cwd": os.getcwd()})
    where = "global" if res["collection"] is None else f"qmd://{res['collection']}/{res['path']}"
    click.echo(f"✓ Removed context for {where}")


context.add_command(context_rm, "remove")


# -- projects and trust ------------------------------------------------------------


def _interactive() -> bool:
    """A person at a terminal who can answer a question (not an agent, CI or MCP)."""
    return sys.stdin.isatty() and sys.stderr.isatty()


def _file_lines(files: list[api.IndexFileOut]) -> list[str]:
    """A project's index files and their states, for `qmd trust` (also when one is refused)."""
    if not files:
        return []
    lines = ["Index files:"]
    for f in files:
        why = f": {f['why']}" if f["why"] else ""
        lines.append(f"  {f['state']:<8} {f['path']} ({f['role']}{why})")
    return lines


def _gated_lines(t: api.TrustOut) -> list[str]:
    lines = [f"  - {i['shown']}" for i in t["items"]]
    if t["override"]:
        lines.append(f"  ({t['override']} is set in the daemon's environment: what it covers is trusted)")
    return lines


def ask_trust(c: Ctx) -> list[str]:
    """Before a command that would use a project config's gated items: on a terminal, list
    the untrusted ones and ask (y/N), recording a yes through the daemon; anywhere else
    the daemon skips them. Returns what is skipped (empty outside a project)."""
    if c.daemon.project is None:
        return []
    t: api.TrustOut = c.call("GET", "/v1/trust")
    if not t["skipped"] or not _interactive():
        return list(t["skipped"])
    if not _approve(c, t, err=True):
        click.echo("Not approved: they are skipped this time ('qmd trust' to approve later).", err=True)
        return list(t["skipped"])
    return []


def _approve(c: Ctx, t: api.TrustOut, *, err: bool) -> bool:
    """List a project's gated items, ask, and record a yes (on stderr when a command's own
    output follows on stdout)."""
    click.echo(f"This project's config ({t['project']}/.qmd) asks for what qmd does not do unapproved:", err=err)
    for line in _gated_lines(t):
        click.echo(line, err=err)
    if not _interactive():
        raise ClientError(
            "qmd trust asks at a terminal, and there is none here; until someone approves at one, these are "
            "skipped (CI: set QMD_TRUST_LOCAL_CONFIG=1 or QMD_TRUST_UPDATE_HOOKS=1 for the daemon)"
        )
    if not click.confirm("Trust these for this project?", default=False, err=err):
        return False
    c.call("POST", "/v1/trust", {"fingerprint": t["fingerprint"]})
    click.echo(
        "Approved (recorded in trusted.json; an edit of them asks again; 'qmd trust revoke' undoes it).", err=err
    )
    return True


def _model_notes(c: Ctx) -> None:
    """`embed` and `pull` without a terminal: say which project models fall back to the defaults."""
    _warn([f"⚠ {n}" for n in ask_trust(c) if " model " in n])


@cli.command()
@click.argument("path", required=False, type=click.Path(file_okay=False, path_type=Path))
@pass_ctx
def init(c: Ctx, path: Path | None) -> None:
    """Make a folder (default: here) a project with its own index in .qmd/ (index.yml to check in)."""
    root = os.path.realpath(path or os.getcwd())
    made: api.InitOut = c.call("POST", "/v1/init", {"path": root})
    click.echo(f"Initialized a qmd project in {made['root']}")
    click.echo(f"  Config:     {made['config']} (check it in; .qmd/.gitignore keeps the index out)")
    click.echo(f"  Collection: {made['collection']} (the project folder, **/*.md)")
    for role, uri in made["models"].items():
        click.echo(f"  Model:      {role} {uri}")
    click.echo("Every qmd command run in this folder now uses it. Next: qmd update, then qmd embed.")


@cli.group(invoke_without_command=True)
@click.pass_context
def trust(ctx: click.Context) -> None:
    """Approve this project's gated config (update commands, paths outside it, models); list, revoke."""
    if ctx.invoked_subcommand is not None:
        return
    c = ctx.find_object(Ctx)
    assert c is not None
    if c.index:
        raise ClientError("--index names one of your own configs, which are never gated: nothing to approve")
    if c.daemon.project is None:
        raise ClientError("not inside a qmd project (no .qmd/index.yml here or above; 'qmd init' makes one)")
    try:
        t: api.TrustOut = c.call("GET", "/v1/trust")
    except ClientError as e:  # a refused index file: the error names it, the list shows them all
        _warn(_file_lines(e.detail.get("files") or []))
        raise
    _out("\n".join(_file_lines(t["files"])))
    where = f"{t['project']}/.qmd"
    if not t["items"]:
        click.echo(f"Nothing to approve in {where}: no update commands, no paths outside it, default models.")
        return
    if t["approved"]:
        click.echo(f"Approved for {t['project']} on {t['approved_at']}:")
        _out("\n".join(_gated_lines(t)))
        return
    if not _approve(c, t, err=False):
        click.echo("Not approved.")
        sys.exit(1)


@trust.command("list")
@pass_ctx
def trust_list(c: Ctx) -> None:
    """Every approved project, and whether its config still has the approved set."""
    listed: api.ApprovalsOut = c.call("GET", "/v1/trust/approvals")
    approvals = listed["approvals"]
    if not approvals:
        click.echo("No project config is approved.")
        return
    states = {"current": "approved", "changed": "changed since (asks again)", "no project": "no .qmd config there now"}
    for a in approvals:
        click.echo(f"{a['root']}  {states[a.get('state') or 'current']}  (approved {a['approved_at']})")
        _out("\n".join(f"  - {item}" for item in a["items"]))


@trust.command("revoke")
@click.argument("path", required=False, type=click.Path(file_okay=False, path_type=Path))
@pass_ctx
def trust_revoke(c: Ctx, path: Path | None) -> None:
    """Drop the approval of this project (or the one at PATH)."""
    if path is not None:
        real = Path(os.path.realpath(path))
        try:
            root = find_project(real) or real
        except ValueError as e:  # a broken config link
            raise ClientError(str(e)) from e
    elif c.daemon.project is not None:
        root = c.daemon.project
    else:
        raise ClientError("not inside a qmd project: give its folder, 'qmd trust revoke PATH' ('qmd trust list')")
    gone: api.ApprovalOut = c.call("POST", "/v1/trust/revoke", {"root": str(root)})
    click.echo(f"Revoked the approval of {gone['root']}: its gated items are skipped until approved again.")


# -- MCP and daemon lifecycle ----------------------------------------------------------
# Lazy imports below: `qmd search` must not pay for the bridge or the pidfile helpers.


def _exec_qmdd(c: Ctx, *args: str) -> None:
    """Become `qmdd ARGS`: the same process, so signals and the exit code are the daemon's."""
    from qmd.spawn import DAEMON_MODULE

    index = ["--index", c.index] if c.index else []
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", DAEMON_MODULE, *index, *args])


def _locate(c: Ctx) -> tuple[Any, dict | None, dict | None]:
    """The daemon `qmd daemon stop|status|restart` means: (the paths of the index whose pidfile
    names it, that record, its /health). Found by the index's pidfile, else by asking the port's
    unauthenticated /health which index started it, so a daemon a `qmd --index work …` started is
    found from any index; one no pidfile names (another user's) is an error, never signalled."""
    from qmd.paths import IndexPaths
    from qmd.pidfile import locate_daemon
    from qmd.spawn import probe_health

    try:
        paths = IndexPaths.resolve(c.index)
    except ValueError as e:
        raise ClientError(str(e)) from e
    on_port = probe_health(*address())
    paths, info, problem = locate_daemon(paths, on_port)
    if problem is not None:
        raise ClientError(problem)
    health = on_port
    if info is not None and (on_port or {}).get("pid") != info["pid"]:
        health = probe_health(info.get("host") or "localhost", int(info.get("port") or 0))  # it serves another port
    return paths, info, health


def _settings_of(c: Ctx) -> dict[str, str]:
    """The running daemon's settings (`/v1/settings`, behind the same-user check), or none
    when it will not say (another user's token, or a qmdd from before the report)."""
    try:
        started: api.SettingsOut = c.daemon.call("GET", "/v1/settings")
    except ClientError:
        return {}
    return started["settings"]


def _stop(c: Ctx) -> None:
    """Stop by pidfile: no authenticated connection, so no token is needed to stop your own daemon."""
    from qmd.pidfile import stop_daemon

    paths, _info, _health = _locate(c)
    code, message = stop_daemon(paths)
    click.echo(message, err=code != 0)
    sys.exit(code)


@cli.group("mcp", invoke_without_command=True)
@click.option("--http", "over_http", is_flag=True, help="Serve MCP over HTTP at /mcp (runs the daemon) instead.")
@click.option("--daemon", "detach", is_flag=True, help="With --http: start it in the background.")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="With --http: port [QMD_PORT or 8181].")
@click.option("--host", default=None, help="With --http: interface [QMD_HOST or localhost].")
@click.option(
    "--print-config",
    "client",
    type=click.Choice(list(CLIENTS)),
    default=None,
    help="Print the entry CLIENT's MCP config needs to start this bridge (with --http: to reach /mcp), "
    "and on stderr the file it goes in.",
)
@click.pass_context
def mcp(
    ctx: click.Context, over_http: bool, detach: bool, port: int | None, host: str | None, client: str | None
) -> None:
    """MCP server for agents: stdio here, forwarding to the daemon's /mcp.

    \b
    Agent config:  qmd mcp --print-config claude-desktop   (claude-code, cursor, vscode, codex)
    or over HTTP:  http://localhost:8181/mcp  (the daemon serves it; --http --print-config CLIENT)
    `qmd mcp --http [--daemon]` is the original's spelling of `qmdd [--daemon]`.
    """
    if ctx.invoked_subcommand is not None:
        return
    if client is not None:
        if detach or port is not None or host is not None:
            raise click.UsageError(
                "--daemon, --port and --host do not go with --print-config: it names the daemon QMD_PORT reaches"
            )
        text, note = client_config(client, ctx.obj.index, over_http=over_http)
        click.echo(note, err=True)
        click.echo(text)
        return
    if not over_http:
        if detach or port is not None or host is not None:
            raise click.UsageError("--daemon, --port and --host go with --http")
        from qmd.mcp_bridge.bridge import main as bridge_main

        if ctx.obj.no_gpu:
            ctx.obj.daemon  # noqa: B018 - says whether a running daemon ignores --no-gpu; the bridge starts one otherwise

        sys.exit(bridge_main(ctx.obj.index))
    args = [*(["--host", host] if host else []), *(["--port", str(port)] if port else [])]
    _exec_qmdd(ctx.obj, *args, *(["--daemon"] if detach else []))


@mcp.command("stop")
@pass_ctx
def mcp_stop(c: Ctx) -> None:
    """Stop the daemon (same as `qmd daemon stop`)."""
    _stop(c)


@cli.group("index")
def index_group() -> None:
    """Move an index between backends (SQLite and Postgres)."""


def _index_spec(spec: str) -> str:
    """A file given relative to here, made absolute (the daemon has another working directory)."""
    if spec.startswith(("postgresql://", "postgres://")) or ("/" not in spec and not spec.endswith((".sqlite", ".db"))):
        return spec
    return os.path.abspath(os.path.expanduser(spec))


@index_group.command("copy")
@click.argument("source")
@click.argument("destination")
@click.option("--replace", is_flag=True, help="Empty a destination that already holds an index (else refused).")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
@pass_ctx
def index_copy(c: Ctx, source: str, destination: str, replace: bool, as_json: bool) -> None:
    """Copy the index SOURCE into DESTINATION, vectors included.

    Each is an index name, a SQLite file or a postgresql:// URL: `qmd index copy index
    postgresql://host/qmd` moves the default index to a Postgres server (then set
    `index_url:` in its config). All or nothing: interrupted, the destination is as it was.
    """
    bar = ProgressBar()
    body = {"source": _index_spec(source), "destination": _index_spec(destination), "replace": replace}
    try:
        for ev in c.daemon.stream("/v1/index/copy", body):
            if ev["event"] == "progress":
                bar.draw(ev["done"], ev["total"], ev["table"])
            elif ev["event"] == "step":
                bar.clear()
                c.note(f"copy: {ev['step']}")
            elif ev["event"] == "done":
                bar.clear()
                _out(json.dumps(ev["report"], indent=2) if as_json else formats.render_copy(ev["report"]))
    finally:
        bar.clear()


@cli.group()
def daemon() -> None:
    """The background daemon (qmdd): its status, stop and restart. Any command starts it.

    One daemon serves every index, whichever index started it: these find it by the
    pidfile of the index given, else by asking the daemon on the port.
    """


@daemon.command("stop")
@pass_ctx
def daemon_stop(c: Ctx) -> None:
    """SIGTERM the daemon and wait for it to exit.

    Only a process whose pid and start time both match its pidfile is signalled,
    so a pid the system has since given to another program is left alone.
    """
    _stop(c)


@daemon.command("status")
@click.option("--json", "as_json", is_flag=True, help="As JSON: pid, index, address, version, uptime, settings.")
@pass_ctx
def daemon_status(c: Ctx, as_json: bool) -> None:
    """Whether a daemon runs (exit 0) or not (exit 1): its PID, the index it started for,
    the indexes it has open, and the QMD_* settings it started with."""
    paths, info, health = _locate(c)
    if info is None:
        if as_json:
            _out(json.dumps({"running": False}))
        else:
            click.echo("Not running.")
        sys.exit(1)
    host, port = info.get("host") or "localhost", info.get("port")
    out = {
        "running": True,
        "pid": info["pid"],
        "index": paths.name,
        "url": f"http://{host}:{port}",
        "version": (health or {}).get("version", info.get("version")),
        "uptime": (health or {}).get("uptime"),
        "indexes": (health or {}).get("indexes", []),
        "settings": _settings_of(c),
        "log": str(paths.logfile),
    }
    if as_json:
        _out(json.dumps(out, indent=2))
        return
    up = f", up {out['uptime']} s" if out["uptime"] is not None else ""
    click.echo(f"Running: qmdd {out['version']} (PID {out['pid']}) on {out['url']}{up}")
    click.echo(f"Started for index: {paths.name}")
    if out["indexes"]:
        click.echo(f"Indexes open: {', '.join(out['indexes'])}")
    settings = out["settings"]
    click.echo("Settings: " + (", ".join(f"{k}={v}" for k, v in settings.items()) if settings else "(none set)"))
    click.echo(f"Log: {out['log']}")


@daemon.command("restart")
@pass_ctx
def daemon_restart(c: Ctx) -> None:
    """Stop the daemon and start it again, as a command would (this environment's QMD_*
    settings, the same index and port): how a changed setting reaches it.

    Starts one if none runs.
    """
    from qmd.paths import DEFAULT_HOST, DEFAULT_INDEX
    from qmd.pidfile import stop_daemon
    from qmd.spawn import SpawnError, daemon_lock, spawn_daemon

    paths, info, _health = _locate(c)
    if info is not None:
        host, port = str(info.get("host") or DEFAULT_HOST), int(info["port"])
    else:
        host, port = os.environ.get("QMD_HOST") or DEFAULT_HOST, address()[1]
    with daemon_lock(paths):
        if info is not None:
            code, message = stop_daemon(paths)
            click.echo(message, err=code != 0)
            if code != 0:
                sys.exit(code)
        try:
            health = spawn_daemon(paths, host, port, ["--index", paths.name] if paths.name != DEFAULT_INDEX else [])
        except SpawnError as e:
            raise ClientError(e.message) from None
    click.echo(f"Started on http://{host}:{port} (PID {health['pid']})")


@cli.command("ui")
@click.option("--no-browser", is_flag=True, help="Only print the page's URL.")
@pass_ctx
def ui(c: Ctx, no_browser: bool) -> None:
    """Open the daemon's search page in your browser (prints its URL when no browser opens).

    With a token set (QMD_TOKEN or the token file) the URL carries a one-time ticket, good
    for a minute, which the page trades for a cookie: the token itself never enters a URL.
    """
    import webbrowser
    from urllib.parse import quote, urlencode

    if "Authorization" in c.daemon.headers:
        url = c.daemon.url + c.call("POST", "/v1/ui/ticket")["path"]
    else:
        c.call("GET", "/health")  # started if need be, so the page answers
        url = c.daemon.url + "/"
    # the index every command here serves: a named one, else the project's own
    named = {"index": c.index} if c.index else {"project": str(c.daemon.project)} if c.daemon.project else {}
    if named:
        url += ("&" if "?" in url else "?") + urlencode(named, safe="/", quote_via=quote)
    if no_browser:
        click.echo(url)
    elif webbrowser.open(url):
        click.echo(f"Opened in your browser: {url}")
    else:
        click.echo(f"No browser opened; visit {url}")


@cli.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script (commands, options, collection and index names).

    \b
    bash:  eval "$(qmd completion bash)"      in ~/.bashrc
    zsh:   eval "$(qmd completion zsh)"       in ~/.zshrc
    fish:  qmd completion fish | source       in ~/.config/fish/config.fish
    """
    from click.shell_completion import get_completion_class

    script = get_completion_class(shell)
    assert script is not None  # every name the Choice allows has a class
    click.echo(script(cli, {}, "qmd", COMPLETE_VAR).source())


def _negation_taken_for_option(e: click.UsageError) -> str | None:
    """The argument a query command read as options although it is a lex negation: `-api`
    (no option `-a`), or `-cats` (`-c ats`, leaving no query). `--foo` is a mistyped option."""
    if e.ctx is None or not any(p.name == "query" for p in e.ctx.command.params):
        return None
    if isinstance(e, click.MissingParameter) and (e.param is None or e.param.name != "query"):
        return None
    names = {n for p in e.ctx.command.params for n in getattr(p, "opts", [])}
    for arg in sys.argv[1:]:
        if arg == "--":
            break
        negation = arg.startswith("-") and not arg.startswith("--") and arg not in names and not arg[2:].isdigit()
        if negation and (isinstance(e, click.MissingParameter) or arg.startswith(getattr(e, "option_name", "-"))):
            return arg
    return None


def main() -> None:
    """Entry point: user errors are one line on stderr, never a traceback."""
    try:
        cli.main(standalone_mode=False, complete_var=COMPLETE_VAR)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except (click.NoSuchOption, click.MissingParameter) as e:
        e.show()
        if (word := _negation_taken_for_option(e)) is not None and e.ctx is not None:
            click.echo(
                f"A query that starts with '-' (a negation such as {word}) goes after '--': "
                f"qmd {e.ctx.info_name} -- {word} …",
                err=True,
            )
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except ClientError as e:
        click.echo(f"Error: {e.message}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as e:  # noqa: BLE001 - a bug must still not print a traceback at a user
        click.echo(f"qmd: internal error: {type(e).__name__}: {e}. Please report it.", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
