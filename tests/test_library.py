"""`import qmd`: the library API over the engine, with no daemon and no HTTP (real SQLite)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MODELS_DIR, NOTES, ROOT, require, write

import qmd


def test_library_page_example_runs(tmp_path: Path, notes: Path) -> None:
    """The library page's example (docs/library.md), as a user would paste it (with its paths filled in)."""
    text = (ROOT / "docs" / "library.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    code = code.replace("~/notes", str(notes)).replace("notes.sqlite", str(tmp_path / "notes.sqlite"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "qmd://notes/fundraising.md" in r.stdout and "Angel investors fund early startups." in r.stdout


def test_inline_collections_index_search_get(tmp_path: Path, notes: Path) -> None:
    with qmd.open(tmp_path / "i.sqlite", collections={"notes": {"path": str(notes)}}) as index:
        [summary] = index.update().collections
        assert summary.new == len(NOTES)
        out = index.search("angel investors")
        top = out.hits[0]
        assert isinstance(top, qmd.Pointer)
        assert (top.doc.file, top.doc.collection, top.doc.path) == (
            "qmd://notes/fundraising.md",
            "notes",
            "fundraising.md",
        )
        assert 0 < top.score <= 1 and top.start_line <= top.line <= top.end_line
        lines = (notes / "fundraising.md").read_text().split("\n")
        assert top.snippet == "\n".join(lines[top.start_line - 1 : top.end_line])  # a pointer, checked
        doc = index.get(f"{top.doc.display_path}:{top.start_line}:2")
        assert isinstance(doc, qmd.DocumentText)
        assert doc.body == "\n".join(lines[top.start_line - 1 : top.start_line + 1])
        assert index.get(f"#{top.doc.docid}").doc.path == "fundraising.md"
        st = index.status()
        assert isinstance(st, qmd.IndexStatus) and st.documents == len(NOTES)
        assert [c.name for c in st.collections] == ["notes"] and st.collections[0].files == len(NOTES)
    assert not (tmp_path / "i.yml").exists(), "inline mode writes no config file"


def test_index_only_mode_reopens_recorded_collections(tmp_path: Path, notes: Path) -> None:
    db = tmp_path / "i.sqlite"
    with qmd.open(db, collections={"notes": {"path": str(notes), "pattern": "**/*.md"}}) as index:
        index.update()
        index.add_context("qmd://notes/work", "Work meetings")
    with qmd.open(db) as index:
        assert [c.name for c in index.collections()] == ["notes"]
        hits = index.search("release").hits
        assert hits[0].doc.path == "work/meeting-2026-04-10.md" and hits[0].doc.context == "Work meetings"


def test_yaml_config_mode_saves_to_the_file(tmp_path: Path, notes: Path) -> None:
    yml = tmp_path / "qmd.yml"
    with qmd.open(tmp_path / "i.sqlite", config=yml) as index:
        info = index.add_collection("notes", notes)
        assert isinstance(info, qmd.CollectionInfo) and info.files == 0
        index.update()
        assert index.collection("notes").files == len(NOTES)
    assert "notes:" in yml.read_text()
    with qmd.open(tmp_path / "i.sqlite", config=yml) as index:
        assert index.search("sourdough").hits[0].doc.path == "cooking/bread.md"


def test_query_multi_get_and_degradation_without_models(tmp_path: Path, notes: Path) -> None:
    with qmd.open(tmp_path / "i.sqlite", collections={"notes": {"path": str(notes)}}) as index:
        index.update()
        out = index.query(searches=[("lex", "sourdough bread")], rerank=False)
        assert isinstance(out, qmd.HybridOutcome) and out.hits[0].doc.path == "cooking/bread.md"
        vec = index.vsearch("baking")
        assert vec.degraded and "vector search unavailable" in vec.warnings[0]
        items = index.multi_get("notes/cooking/bread.md, notes/nope.md")
        found = [(i.doc.path if i.doc else None, i.error) for i in items]
        assert found == [(None, True), ("cooking/bread.md", False)]


def test_errors_are_the_engine_errors_and_change_nothing(tmp_path: Path, notes: Path) -> None:
    db = tmp_path / "i.sqlite"
    with pytest.raises(qmd.InvalidInput, match="not both"):
        qmd.open(db, collections={}, config=tmp_path / "x.yml")
    with pytest.raises(qmd.InvalidInput, match="needs a 'path'"):
        qmd.open(db, collections={"notes": {}})
    with qmd.open(db, collections={"notes": {"path": str(notes)}}) as index:
        index.update()
        with pytest.raises(qmd.NotFound, match="Collection not found: nope"):
            index.search("bread", collections=["nope"])
        with pytest.raises(qmd.NotFound):
            index.get("notes/missing.md")
        with pytest.raises(qmd.InvalidInput, match="past the end"):
            index.get("notes/ideas.md:99")
        with pytest.raises(qmd.Conflict):
            index.add_collection("notes", notes)
        with pytest.raises(qmd.InvalidInput):
            index.query()
        assert index.status().documents == len(NOTES)


def test_import_qmd_is_lazy_and_documents_its_names() -> None:
    code = "import sys, qmd; print(any(m.startswith('qmd.server') for m in sys.modules)); print(qmd.__all__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, names = r.stdout.splitlines()
    assert set(eval(names)) == {"__version__", *qmd._EXPORTS}  # noqa: S307 - our own printed list
    assert loaded == "False"
    for name in eval(names):  # noqa: S307 - our own printed list
        assert getattr(qmd, name) is not None
    with pytest.raises(AttributeError):
        qmd.nothing_here  # noqa: B018


def test_two_indexes_in_one_process(tmp_path: Path) -> None:
    a = write(tmp_path / "a", {"x.md": "# Alpha\n\nzebra crossing\n"})
    b = write(tmp_path / "b", {"y.md": "# Beta\n\nzebra stripes\n"})
    with (
        qmd.open(tmp_path / "a.sqlite", collections={"a": {"path": str(a)}}) as ia,
        qmd.open(tmp_path / "b.sqlite", collections={"b": {"path": str(b)}}) as ib,
    ):
        ia.update()
        ib.update()
        assert [h.doc.file for h in ia.search("zebra").hits] == ["qmd://a/x.md"]
        assert [h.doc.file for h in ib.search("zebra").hits] == ["qmd://b/y.md"]


def test_add_collection_ignore_leaves_files_out(tmp_path: Path, notes: Path) -> None:
    """The seed's `addCollection(name, {path, pattern, ignore})`: the globs are the collection's
    `ignore:`, saved in the YAML and recorded in the index, and `update` leaves those files out."""
    yml, db = tmp_path / "qmd.yml", tmp_path / "i.sqlite"
    with qmd.open(db, config=yml) as index:
        info = index.add_collection("notes", notes, pattern="**/*.md", ignore=["work/**", "ideas.md"])
        assert info.ignore == ["work/**", "ideas.md"] and info.pattern == "**/*.md"
        [summary] = index.update().collections
        assert summary.new == len(NOTES) - 2
        assert index.search("release").hits == [] and index.search("startup").hits[0].doc.path == "fundraising.md"
        assert index.add_collection("one", write(tmp_path / "one", {"a.md": "# A\n"}), ignore="x/**").ignore == [
            "x/**"
        ], "one glob as in YAML"
        with pytest.raises(qmd.InvalidInput, match="ignore"):
            index.add_collection("bad", write(tmp_path / "bad", {"b.md": "# B\n"}), ignore=[""])
        assert "bad" not in [c.name for c in index.collections()], "a refused ignore records nothing"
    assert "ignore:" in yml.read_text() and "work/**" in yml.read_text()
    with qmd.open(db) as index:  # index-only: the ignores the index recorded
        assert index.collection("notes").ignore == ["work/**", "ideas.md"]


def test_list_contexts(tmp_path: Path, notes: Path) -> None:
    """The seed's `listContexts()`: every context as a `qmd.Context` (collection, path, text),
    the global one first with collection None."""
    inline = {"notes": {"path": str(notes), "context": {"cooking": "Recipes"}}}
    with qmd.open(tmp_path / "i.sqlite", collections=inline) as index:
        assert index.list_contexts() == [qmd.Context("notes", "cooking", "Recipes")]
        index.add_context("/", "Personal notes")
        index.add_context("qmd://notes/work", "Work meetings")
        contexts = index.list_contexts()
        assert contexts == [
            qmd.Context(None, "", "Personal notes"),
            qmd.Context("notes", "cooking", "Recipes"),
            qmd.Context("notes", "work", "Work meetings"),
        ]
        assert all(isinstance(c, qmd.Context) for c in contexts)
        index.remove_context("qmd://notes/cooking")
        index.remove_context("/")
        assert index.list_contexts() == [qmd.Context("notes", "work", "Work meetings")]


@pytest.mark.slow
def test_expand_query_is_the_hybrid_querys_expansion(tmp_path: Path, notes: Path, smollm_model: Path) -> None:
    """The seed's `expandQuery`: typed sub-queries from the generate model, the very lines the
    hybrid query expands into, and a list `query(searches=…)` takes as it is."""
    with qmd.open(
        tmp_path / "i.sqlite", collections={"notes": {"path": str(notes)}}, models={"generate": str(smollm_model)}
    ) as index:
        index.update()
        expanded = index.expand_query("sourdough baking")
        assert expanded and all(isinstance(e, qmd.ExpandedQuery) for e in expanded)
        assert {e.type for e in expanded} <= {"lex", "vec", "hyde"} and all(e.query.strip() for e in expanded)
        out = index.query("sourdough baking", expand=True, rerank=False, intent="bread recipes")
        [stage] = [s for s in out.stages if s.stage == "expand"]
        assert stage.status in ("cached", "ran"), stage  # the cache is written behind the call (llm_cache)
        assert out.expansion == [tuple(e) for e in expanded]
        assert index.expand_query("expand: sourdough baking") == expanded, "the hybrid query's `expand:` form"
        typed = index.query(searches=[e for e in expanded if e.type == "lex"], rerank=False)
        assert typed.hits[0].doc.path == "cooking/bread.md"
        with pytest.raises(qmd.InvalidInput, match="query document"):
            index.expand_query("lex: bread\nvec: how to bake bread")


def test_expand_query_without_a_generate_model_is_unavailable(tmp_path: Path, notes: Path) -> None:
    missing = tmp_path / "missing.gguf"
    with qmd.open(
        tmp_path / "i.sqlite", collections={"notes": {"path": str(notes)}}, models={"generate": str(missing)}
    ) as index:
        with pytest.raises(qmd.Unavailable, match="query expansion unavailable"):
            index.expand_query("sourdough")
        with pytest.raises(qmd.InvalidInput, match="empty"):
            index.expand_query("  ")


_EMBED_AND_SEARCH = """
import sys, qmd
kw = {"verbose": True} if sys.argv[1] == "verbose" else {}
with qmd.open(sys.argv[2], collections={"notes": {"path": sys.argv[3]}}, models={"embed": sys.argv[4]}, **kw) as ix:
    ix.update()
    ix.embed()
    print(ix.vsearch("angel investors").hits[0].doc.path)
"""


@pytest.mark.slow
def test_llama_cpp_log_is_silent_unless_verbose(tmp_path: Path, notes: Path) -> None:
    """llama.cpp's own log (the MiniLM GGUF makes it say `special_eos_id is not in special_eog_ids`)
    stays off a library user's stderr; `verbose=True` lets it through."""
    embed = require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM test embedder (../shared/models)")

    def run(mode: str) -> str:
        args = [mode, str(tmp_path / f"{mode}.sqlite"), str(notes), str(embed)]
        r = subprocess.run(
            [sys.executable, "-c", _EMBED_AND_SEARCH, *args], capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "fundraising.md"
        return r.stderr

    quiet = run("quiet")
    assert "special_eos_id" not in quiet and "inference worker" not in quiet, quiet
    assert "special_eos_id is not in special_eog_ids" in run("verbose")
