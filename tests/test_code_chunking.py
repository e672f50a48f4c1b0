"""`--chunk-strategy auto`: code cut at its syntax by the real tree-sitter grammars.

The unit tests chunk real source (this project's own `server/` tree, measured with the real
MiniLM tokenizer) and samples of each language written here, and check what a pointer
needs: `body[start:end] == chunk.text`, whole lines, cuts only where a statement starts,
every definition that fits the budget kept whole. The end-to-end test goes through the
real CLI and daemon with the MiniLM embedder.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import tree_sitter
import yaml
from conftest import MODELS_DIR, ROOT, Daemon, Env, require, write

from qmd.server.config import Config
from qmd.server.errors import InvalidInput
from qmd.server.models.embedders import Embedder
from qmd.server.models.remote import RemoteBackend
from qmd.server.search.snippets import best_passage, passage_window
from qmd.server.text import code_chunks
from qmd.server.text.chunking import CharEstimateTokenizer, Chunk, LlamaTokenizer, Tokenizer
from qmd.server.text.code_chunks import GRAMMARS, grammar_status, language_for
from qmd.server.text.split import code_unit, split

MINILM = MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf"
BUDGET = 256  # what the embed job gives MiniLM


def cut(text: str, **options: Any) -> list[Chunk]:
    """Every chunk of `text`, as the worker cuts it (`split`: code at its syntax for a `language`)."""
    return list(split(text, **options))


@pytest.fixture(scope="module")
def minilm() -> LlamaTokenizer:
    return LlamaTokenizer.from_model_path(require(MINILM, "the MiniLM embedder GGUF (../shared/models)"))


def parse(text: str, language: str) -> tree_sitter.Tree:
    loaded = code_chunks._load(language)
    assert not isinstance(loaded, str), loaded
    return tree_sitter.Parser(loaded).parse(text.encode("utf-8", "surrogatepass"))


def walk(node: tree_sitter.Node) -> Iterator[tree_sitter.Node]:
    yield node
    for child in node.children:
        yield from walk(child)


def statement_rows(text: str, language: str) -> set[int]:
    """0-based rows on which a named node starts with only indentation before it."""
    lines = text.encode("utf-8", "surrogatepass").split(b"\n")
    return {
        n.start_point.row
        for n in walk(parse(text, language).root_node)
        if n.is_named and not lines[n.start_point.row][: n.start_point.column].strip()
    }


def check(text: str, chunks: list[Chunk], tokenizer: Tokenizer, max_tokens: int, language: str) -> None:
    """What every code chunk must be: located, tiling, whole lines, on statement lines, in budget."""
    assert chunks and chunks[0].start == 0 and chunks[-1].end == len(text)
    rows = statement_rows(text, language)
    for prev, c in zip([None, *chunks], chunks):
        assert text[c.start : c.end] == c.text
        if prev is not None:
            assert prev.start < c.start <= prev.end < c.end
        body = c.text.rstrip("\r\n")
        first = c.start + len(body) - len(body.lstrip("\r\n"))
        assert c.start_line == text.count("\n", 0, first) + 1
        assert c.end_line == text.count("\n", 0, c.start + max(len(body) - 1, 0)) + 1
        assert c.tokens == tokenizer.count(c.text) and (c.tokens <= max_tokens or c.clipped)
        if prev is not None and prev.end == c.start:  # a syntax cut (the smart chunker's overlap)
            assert text[c.start - 1] == "\n" and text.count("\n", 0, c.start) in rows, f"line {c.start_line}"


def definitions(text: str, language: str, types: set[str]) -> list[tuple[int, int, str]]:
    """(start, end, first line) in characters of every node of these types, decorators included."""
    data = text.encode("utf-8", "surrogatepass")
    out = []
    for n in walk(parse(text, language).root_node):
        if n.type in types and (n.parent is None or n.parent.type != "decorated_definition"):
            start = len(data[: n.start_byte].decode("utf-8", "surrogatepass"))
            end = len(data[: n.end_byte].decode("utf-8", "surrogatepass"))
            out.append((start, end, text[start : text.find("\n", start)]))
    return out


def whole(chunks: list[Chunk], start: int, end: int) -> bool:
    return any(c.start <= start and end <= c.end for c in chunks)


# -- grammars and detection ---------------------------------------------------


def test_language_by_extension() -> None:
    assert [language_for(p) for p in ("a.py", "b.PY", "c.ts", "d.tsx", "e.jsx", "f.mjs", "g.go", "h.rs")] == [
        "python",
        "python",
        "typescript",
        "tsx",
        "tsx",
        "javascript",
        "go",
        "rust",
    ]
    assert language_for("notes.md") is None and language_for("Makefile") is None and language_for("x.py.md") is None


def test_every_grammar_loads_here() -> None:
    status = grammar_status()
    assert [s.language for s in status] == list(GRAMMARS)
    assert all(s.available and s.version and s.error is None for s in status), status


# -- real source --------------------------------------------------------------


def test_the_projects_own_sources(minilm: LlamaTokenizer) -> None:
    """Every .py file under server/ with the embedder's real tokenizer and budget: the
    invariants hold, and every function and class that fits the budget is in one chunk
    (the smart chunker cuts through a good share of them)."""
    files = sorted((ROOT / "server").rglob("*.py"))
    assert len(files) > 40
    kinds = {"function_definition", "class_definition", "decorated_definition"}
    fitting = split_auto = split_regex = 0
    t0 = time.perf_counter()
    for f in files:
        text = f.read_text(encoding="utf-8")
        chunks = cut(text, max_tokens=BUDGET, tokenizer=minilm, language="python")
        check(text, chunks, minilm, BUDGET, "python")
        regex = cut(text, max_tokens=BUDGET, tokenizer=minilm)
        for start, end, _ in definitions(text, "python", kinds):
            if minilm.count(text[start:end]) <= BUDGET - 16:
                fitting += 1
                split_auto += not whole(chunks, start, end)
                split_regex += not whole(regex, start, end)
    print(
        f"{len(files)} files, {fitting} definitions within the budget: {split_auto} cut by auto, "
        f"{split_regex} by regex; {time.perf_counter() - t0:.2f}s for both"
    )
    assert fitting > 300 and split_auto == 0 and split_regex > fitting // 10


def test_an_over_long_function_is_cut_at_its_statements() -> None:
    tok = CharEstimateTokenizer(3.0)
    body = "".join(f"    total_{i} = compute(value, {i})  # step {i}\n" for i in range(300))
    text = (
        f"import os\n\n\ndef huge(value):\n    '''Many steps.'''\n{body}    return total_0\n\n\ndef tail():\n    pass\n"
    )
    chunks = cut(text, max_tokens=64, tokenizer=tok, language="python")
    check(text, chunks, tok, 64, "python")
    assert len(chunks) > 10
    assert chunks[-1].text.startswith("def tail") or "def tail" in chunks[-1].text
    assert chunks[0].text.startswith("import os") and "def huge(value):" in chunks[0].text


def test_a_line_with_no_structure_falls_to_the_smart_chunker() -> None:
    tok = CharEstimateTokenizer(3.0)
    text = "def f():\n    return '" + "x" * 5000 + "'\n\n\ndef g():\n    return 1\n"
    chunks = cut(text, max_tokens=64, tokenizer=tok, language="python")
    check(text, chunks, tok, 64, "python")
    assert all(c.tokens <= 64 for c in chunks) and chunks[-1].text.startswith("def g")


# -- other languages ------------------------------------------------------------

TS = """import { readFile } from "fs";
import type { Config } from "./config";

/** A server that answers requests. */
export class Server {
  private port: number;

  constructor(port: number) {
    this.port = port;
  }

  async handle(request: Request): Promise<Response> {
    const body = await readFile(request.path, "utf8");
    return new Response(body, { status: 200 });
  }
}

export interface Route {
  method: string;
  path: string;
}

export type Handler = (req: Request) => Promise<Response>;

export enum Method {
  Get = "GET",
  Post = "POST",
}

export function route(method: Method, path: string): Route {
  return { method, path };
}
"""

JS = """const fs = require("fs");

// Reads the configuration file from disk.
function loadConfig(path) {
  const text = fs.readFileSync(path, "utf8");
  return JSON.parse(text);
}

class Cache {
  constructor() {
    this.items = new Map();
  }
  get(key) {
    return this.items.get(key);
  }
}

export const double = (x) => x * 2;

module.exports = { loadConfig, Cache };
"""

TSX = """import React from "react";

export function Button({ label }: { label: string }) {
  return <button className="primary">{label}</button>;
}

export default function App() {
  return (
    <main>
      <Button label="Save" />
    </main>
  );
}
"""

GO = """package server

import (
\t"fmt"
\t"net/http"
)

// Server answers HTTP requests on one port.
type Server struct {
\tPort int
\tName string
}

// Handle writes a greeting.
func (s *Server) Handle(w http.ResponseWriter, r *http.Request) {
\tfmt.Fprintf(w, "hello from %s", s.Name)
}

type Handler interface {
\tServeHTTP(w http.ResponseWriter, r *http.Request)
}

func NewServer(port int) *Server {
\treturn &Server{Port: port, Name: "qmd"}
}
"""

RUST = """use std::collections::HashMap;
use std::fmt;

/// A cache of parsed documents.
#[derive(Debug, Default)]
pub struct Cache {
    items: HashMap<String, String>,
}

impl Cache {
    pub fn new() -> Self {
        Cache { items: HashMap::new() }
    }

    pub fn get(&self, key: &str) -> Option<&String> {
        self.items.get(key)
    }
}

pub enum Kind {
    Markdown,
    Code,
}

pub trait Chunker {
    fn chunk(&self, text: &str) -> Vec<String>;
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "kind")
    }
}

mod tests {
    fn it_works() {}
}
"""

SAMPLES = {
    "typescript": (
        TS,
        [
            "/** A server that answers requests. */",
            "  async handle(request: Request)",
            "export interface Route {",
            "export type Handler",
            "export function route(",
        ],
    ),
    "javascript": (JS, ["const fs = require", "class Cache {", "export const double"]),
    "tsx": (TSX, ["export function Button(", "export default function App()"]),
    "go": (
        GO,
        [
            "// Server answers HTTP requests on one port.",
            "// Handle writes a greeting.",
            "type Handler interface {",
            "func NewServer(",
        ],
    ),
    "rust": (
        RUST,
        ["/// A cache of parsed documents.", "impl Cache {", "pub enum Kind {", "impl fmt::Display", "mod tests {"],
    ),
}


@pytest.mark.parametrize("language", list(SAMPLES))
def test_each_language_is_cut_at_its_definitions(language: str) -> None:
    """A budget of about one definition: each of these lines opens a chunk, the comment or
    attribute above a definition leads its chunk, and no chunk starts elsewhere."""
    text, opens = SAMPLES[language]
    tok = CharEstimateTokenizer(3.0)
    chunks = cut(text, max_tokens=40, tokenizer=tok, language=language)
    check(text, chunks, tok, 40, language)
    firsts = [c.text.split("\n", 1)[0] for c in chunks]
    for line in opens:
        assert any(f.startswith(line) for f in firsts), (line, firsts)
    assert len(chunks) < len(cut(text, max_tokens=8, tokenizer=tok, language=language))


@pytest.mark.parametrize("language", list(SAMPLES))
def test_small_neighbours_share_a_chunk(language: str) -> None:
    text, _ = SAMPLES[language]
    tok = CharEstimateTokenizer(3.0)
    whole_file = tok.count(text)
    chunks = cut(text, max_tokens=whole_file // 2 + 20, tokenizer=tok, language=language)
    check(text, chunks, tok, whole_file // 2 + 20, language)
    assert 2 <= len(chunks) <= 3


# -- hostile input ------------------------------------------------------------


@pytest.mark.parametrize(
    ("language", "text"),
    [
        (
            "python",
            "def ok():\n    return 1\n\n\ndef broken(:\n    x = (1, 2\n\n" + "def later():\n    return 2\n" * 40,
        ),
        ("typescript", "class A {\n  m() { return 1; }\n\nfunction f( {\n" + "export const x = 1;\n" * 60),
        ("go", "package p\n\nfunc f() {\n\treturn\n" + "func g() int { return 1 }\n" * 50),
        ("rust", "fn a() {\n    let x = ;\n}\n" + "fn b() -> u8 { 1 }\n" * 60 + "impl {{{\n"),
        ("javascript", "}}}}\n" + "function f() { return 1 }\n" * 60),
    ],
    ids=["python", "typescript", "go", "rust", "javascript"],
)
def test_syntax_errors_still_chunk(language: str, text: str) -> None:
    tok = CharEstimateTokenizer(3.0)
    chunks = cut(text, max_tokens=48, tokenizer=tok, language=language)
    check(text, chunks, tok, 48, language)
    assert len(chunks) > 2


def test_mixed_line_endings() -> None:
    """CRLF and LF in one file: cuts fall after a full line break (never between its \\r and
    \\n), and line numbers count lines as `get` does."""
    parts = [f"def f{i}(x):{nl}    return x + {i}{nl}{nl}" for i, nl in zip(range(60), ["\r\n", "\n"] * 30)]
    text = "import os\r\n\r\n" + "".join(parts)
    tok = CharEstimateTokenizer(3.0)
    chunks = cut(text, max_tokens=40, tokenizer=tok, language="python")
    check(text, chunks, tok, 40, "python")
    assert len(chunks) > 5
    for c in chunks[1:]:
        assert text[c.start - 1] == "\n" and c.text.startswith("def f")
        lines = text.split("\n")
        assert lines[c.start_line - 1].startswith("def f")


def test_non_ascii_identifiers_and_text() -> None:
    """Offsets are code points although tree-sitter counts bytes: a cut after accented
    identifiers, CJK strings and an astral character still starts on its `def` line."""
    head = 'ÉTÉ = "été ☀"\nπ = 3.14159\n'
    defs = "".join(f'def grüße_{i}(naïve: str) -> str:\n    return naïve + "世界 {i} 😀"\n\n\n' for i in range(40))
    text = head + defs + "class Ünïcode:\n    ñ = 1\n"
    tok = CharEstimateTokenizer(3.0)
    chunks = cut(text, max_tokens=40, tokenizer=tok, language="python")
    check(text, chunks, tok, 40, "python")
    assert all(c.text.startswith(("def grüße_", "class Ünïcode")) for c in chunks[1:])
    for start, end, _ in definitions(text, "python", {"function_definition", "class_definition"}):
        assert whole(chunks, start, end)
    lone = "def a():\n    s = '\ud800'\n    return s\n\n\n" + "def b():\n    return 2\n\n\n" * 30
    check(lone, cut(lone, max_tokens=30, tokenizer=tok, language="python"), tok, 30, "python")


def twenty_thousand_lines(shape: str) -> str:
    if shape == "functions":  # 2,000 of 10 lines: each fits, the file does not
        fn = (
            "def handler_{i}(request, context):\n    '''Handle request {i}.'''\n    value = request.get('k{i}')\n"
            "    if value is None:\n        return None\n    result = context.process(value, {i})\n"
            "    context.log('handled', {i})\n    return result\n\n\n"
        )
        return "".join(fn.format(i=i) for i in range(2000))
    if shape == "class":  # one class of 4,000 methods: cut at its methods
        fn = "    def handler_{i}(self, request):\n        return self.process(request, {i})\n\n\n\n"
        return "class Big:\n" + "".join(fn.format(i=i) for i in range(4000))[:-1]
    # one function of 20,000 statements: cut at its statements
    return "def one(x_0):\n" + "".join(f"    x_{i} = f(x_{i - 1}, {i})\n" for i in range(1, 20000))


@pytest.mark.parametrize("shape", ["functions", "class", "function"])
def test_a_20k_line_file_in_bounded_time(minilm: LlamaTokenizer, shape: str) -> None:
    """20,000 lines with the embedder's own tokenizer, timed against the smart chunker."""
    text = twenty_thousand_lines(shape)
    assert text.count("\n") == 20_000
    t0 = time.perf_counter()
    chunks = cut(text, max_tokens=BUDGET, tokenizer=minilm, language="python")
    seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    regex = cut(text, max_tokens=BUDGET, tokenizer=minilm)
    regex_seconds = time.perf_counter() - t0
    print(f"20k lines ({shape}): {len(chunks)} chunks in {seconds:.2f}s (regex: {len(regex)} in {regex_seconds:.2f}s)")
    check(text, chunks, minilm, BUDGET, "python")
    if shape != "function":
        assert all(c.text.lstrip().startswith(("def handler_", "class Big")) for c in chunks)
    assert seconds < 30


# -- fallback -------------------------------------------------------------------


def test_a_missing_grammar_falls_back_to_the_smart_chunker(monkeypatch: pytest.MonkeyPatch) -> None:
    text, _ = SAMPLES["rust"]
    tok = CharEstimateTokenizer(3.0)
    real = code_chunks._load
    monkeypatch.setattr(
        code_chunks,
        "_load",
        lambda language: "tree-sitter-rust: ModuleNotFoundError: no module" if language == "rust" else real(language),
    )
    assert cut(text, max_tokens=40, tokenizer=tok, language="rust") == cut(text, max_tokens=40, tokenizer=tok)
    rust = next(s for s in grammar_status() if s.language == "rust")
    assert not rust.available and "ModuleNotFoundError" in (rust.error or "")


def test_a_grammar_that_fails_on_a_file_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def parse(self, data: bytes) -> None:
            raise RuntimeError("parse failed")

    monkeypatch.setattr(code_chunks, "_parser", lambda language: Broken())
    text, _ = SAMPLES["go"]
    tok = CharEstimateTokenizer(3.0)
    assert cut(text, max_tokens=40, tokenizer=tok, language="go") == cut(text, max_tokens=40, tokenizer=tok)


def test_a_remote_embedder_chunks_code_in_the_daemon() -> None:
    """No tokenizer is reachable for an endpoint: the daemon cuts code by the same syntax,
    measured by the character estimate (nothing is sent to construct or chunk)."""
    backend = RemoteBackend("http://127.0.0.1:9/v1", "m", environ={})
    try:
        text, _ = SAMPLES["rust"]
        chunks = backend.chunk(text, 24, "rust")
        assert chunks != backend.chunk(text, 24)
        assert any(c.text.startswith("impl Cache {") for c in chunks)
    finally:
        backend.close()


def test_markdown_and_small_files_are_unchanged() -> None:
    tok = CharEstimateTokenizer(3.0)
    short = "def f():\n    return 1\n"
    assert cut(short, max_tokens=40, tokenizer=tok, language="python") == cut(short, max_tokens=40, tokenizer=tok)
    assert cut("  \n", max_tokens=40, tokenizer=tok, language="python") == []


# -- strategy identity, config, query-time passages ------------------------------------


def test_the_strategy_names_its_own_vector_space() -> None:
    emb = Embedder("fake", None, 64, "f" * 64, 4, "fake")  # type: ignore[arg-type]  # no backend is used
    assert emb.fingerprint_for("regex") == emb.fingerprint
    auto = emb.fingerprint_for("auto")
    assert auto != emb.fingerprint and auto == emb.fingerprint_for("auto")
    assert replace(emb, fingerprint="e" * 64).fingerprint_for("auto") != auto


def test_chunk_strategy_in_index_yml(tmp_path: Path) -> None:
    raw = {"collections": {"code": {"path": "/src", "chunk_strategy": "auto"}, "notes": {"path": "/n"}}}
    cfg = Config.from_yaml(raw, tmp_path / "index.yml")
    assert cfg.get("code").chunk_strategy == "auto" and cfg.get("notes").chunk_strategy == "regex"
    back = cfg.to_yaml()["collections"]
    assert back["code"]["chunk_strategy"] == "auto" and "chunk_strategy" not in back["notes"]
    raw["collections"]["code"]["chunk_strategy"] = "ast"
    with pytest.raises(InvalidInput, match=r"collection 'code': chunk_strategy must be \"auto\" or \"regex\""):
        Config.from_yaml(raw, tmp_path / "index.yml")


def test_a_bad_strategy_is_refused_before_anything_changes(tmp_path: Path) -> None:
    """Through the library (no pydantic in front): a clear error, the config untouched, no
    model loaded; the inline config takes the setting as index.yml does."""
    import qmd

    src = write(tmp_path / "src", {"a.py": "def a():\n    return 1\n"})
    with qmd.open(tmp_path / "i.sqlite", collections={"code": {"path": str(src), "chunk_strategy": "auto"}}) as index:
        assert index.engine.chunk_strategies() == {"code": "auto"}
        with pytest.raises(InvalidInput, match=r'--chunk-strategy must be "auto" or "regex" \(got "ast"\)'):
            index.embed(chunk_strategy="ast")  # type: ignore[arg-type]  # what an untyped caller sends
        with pytest.raises(InvalidInput, match='got "words"'):
            index.query(searches=[("lex", "a")], chunk_strategy="words")  # type: ignore[arg-type]
        assert index.engine.chunk_strategies() == {"code": "auto"}
        assert index.query(searches=[("lex", "a")], chunk_strategy="auto", rerank=False).hits == []


def test_a_query_passage_stays_inside_its_function() -> None:
    """`qmd query --chunk-strategy auto`: the reranked window around the best line is
    bounded by the chunk that line is in (here of about one definition)."""
    text, _ = SAMPLES["go"]
    passage = best_passage(text, ["greeting"])
    unit = code_unit(text, "server.go", passage.line, 150)
    assert unit is not None
    lines = text.split("\n")
    assert lines[unit[0] - 1] == "// Handle writes a greeting."
    window = passage_window(text, passage, 600, within=unit)
    assert "func (s *Server) Handle" in window and "type Handler interface" not in window
    assert "type Handler interface" in passage_window(text, passage, 600)
    assert code_unit("# Notes\n\ntext\n", "notes.md", 1, 600) is None


# -- end to end -----------------------------------------------------------------

SOURCE = '''"""Billing helpers."""

import decimal
from dataclasses import dataclass


@dataclass
class Invoice:
    """One customer invoice with its line items."""

    customer: str
    items: list[tuple[str, decimal.Decimal]]


def invoice_total(invoice: Invoice) -> decimal.Decimal:
    """Sum the prices of an invoice's line items, with the sales tax added."""
    subtotal = sum(price for _, price in invoice.items)
    tax = subtotal * decimal.Decimal("0.2")
    return subtotal + tax


def sourdough_schedule(hours: int) -> list[str]:
    """When to feed the starter, fold the dough and bake the loaf."""
    steps = ["feed starter", "mix flour and water", "stretch and fold"]
    steps += ["shape the loaf", "bake in a hot dutch oven"]
    return steps[: max(1, hours // 4)]


def ship_parcel(address: str, weight_kg: float) -> str:
    """Book a courier for a parcel and return its tracking number."""
    label = f"{address}|{weight_kg:.1f}"
    return "TRACK-" + str(abs(hash(label)) % 10_000)
''' + "".join(
    f'\n\ndef helper_{i}(value: int) -> int:\n    """Filler helper {i}: arithmetic on a counter."""\n'
    f"    value = value * {i} + 1\n    value = value - {i}\n    return value % 97\n"
    for i in range(12)
)


def space_chunks(env: Env, fingerprint: str) -> list[tuple[int, int]]:
    conn = sqlite3.connect(env.db)
    try:
        return conn.execute(
            "SELECT cv.start_line, cv.end_line FROM content_vectors cv JOIN vector_spaces s ON s.id = cv.space_id"
            " WHERE s.fingerprint = ? ORDER BY cv.seq",
            (fingerprint,),
        ).fetchall()
    finally:
        conn.close()


@pytest.mark.slow
def test_embed_and_vsearch_through_the_cli(env: Env) -> None:
    """`qmd embed --chunk-strategy auto` on a Python collection: vectors per definition, a
    vector hit names the lines of the function that answers, status names the grammars;
    switching to regex re-embeds into another space, and back costs nothing."""
    require(MINILM, "the MiniLM embedder GGUF (../shared/models)")
    env.vars["QMD_EMBED_MODEL"] = str(MINILM)
    src = write(env.base / "src", {"billing.py": SOURCE, "README.md": "# Billing\n\nHelpers for invoices.\n"})
    d = Daemon(env)
    try:
        env.ok("collection", "add", str(src), "--name", "code", "--mask", "**/*.py")
        bad = env.qmd("embed", "--chunk-strategy", "ast")
        assert bad.returncode == 2 and "'ast' is not one of 'auto', 'regex'" in bad.stderr
        assert "chunk_strategy" not in (env.config / "qmd" / "index.yml").read_text()

        r = env.qmd("embed", "--chunk-strategy", "auto")
        assert r.returncode == 0, r.stderr
        assert "documents 1 ·" in r.stdout and "Chunk strategy auto for code (saved in index.yml)" in r.stderr
        saved = yaml.safe_load((env.config / "qmd" / "index.yml").read_text())
        assert saved["collections"]["code"]["chunk_strategy"] == "auto"

        status = env.json("status", "--json")
        assert {g["language"] for g in status["grammars"] if g["available"]} == set(GRAMMARS)
        assert status["collections"][0]["chunk_strategy"] == "auto"
        auto_fp = status["vector"]["spaces"]["auto"]
        assert status["vector"]["pending"] == 0 and auto_fp != status["vector"]["fingerprint"]
        text = env.ok("status")
        assert "AST Chunking" in text and "python, typescript, tsx, javascript, go, rust" in text
        assert "Chunking: auto" in text

        lines = SOURCE.split("\n")
        starts = {i + 1 for i, line in enumerate(lines) if line.startswith(('"""', "import", "@", "def ", "class "))}
        chunks = space_chunks(env, auto_fp)
        assert len(chunks) > 2 and all(s in starts for s, _ in chunks), (chunks, sorted(starts))

        first = lines.index("def invoice_total(invoice: Invoice) -> decimal.Decimal:") + 1
        last = lines.index("    return subtotal + tax") + 1
        hit = env.json("vsearch", "add up the prices on a bill including tax", "--json", "-c", "code")[0]
        assert hit["file"] == "qmd://code/billing.py"
        lo, hi = map(int, hit["lines"].split("-"))
        assert first <= lo <= hi <= last + 1, (hit["lines"], first, last)
        assert any(s <= first and last <= e for s, e in chunks), "the function is one chunk"

        q = env.qmd("query", "--chunk-strategy", "auto", "--no-rerank", "invoice total tax", "--json")
        assert q.returncode == 0, q.stderr
        bad = env.qmd("query", "--chunk-strategy", "words", "invoice")
        assert bad.returncode == 2 and "'words' is not one of 'auto', 'regex'" in bad.stderr
        for route, body in [
            ("/v1/embed", {"chunkStrategy": "ast"}),
            ("/query", {"query": "invoice", "chunkStrategy": "ast"}),
            ("/v1/query", {"query": "invoice", "chunk_strategy": "AUTO"}),
        ]:
            answer = d.http.post(route, json=body)
            assert answer.status_code == 400 and "auto" in answer.text and "regex" in answer.text, answer.text
        assert yaml.safe_load((env.config / "qmd" / "index.yml").read_text()) == saved

        r = env.qmd("embed", "--chunk-strategy", "regex")
        assert r.returncode == 0 and "documents 1 ·" in r.stdout, r.stdout + r.stderr
        regex_fp = env.json("status", "--json")["vector"]["spaces"]["regex"]
        assert regex_fp != auto_fp and space_chunks(env, regex_fp) != chunks
        assert "documents 0 ·" in env.ok("embed")
        hit = env.json("vsearch", "add up the prices on a bill including tax", "--json")[0]
        assert hit["file"] == "qmd://code/billing.py"

        r = env.qmd("embed", "--chunk-strategy", "auto")  # its vectors are still in the auto space
        assert "documents 0 ·" in r.stdout and "0 pending" in r.stdout, r.stdout
        assert env.json("status", "--json")["vector"]["pending"] == 0
    finally:
        d.stop()
