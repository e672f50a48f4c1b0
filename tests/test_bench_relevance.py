"""The relevance bench's scripts: the eval notes as a BEIR set qmd reads, and relevance_fit.py
fitting on some sets and checking on others (with the real embedder's scale)."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EVAL_DIR, MODELS_DIR, ROOT, eval_docs_dir, require

from qmd.server.quality import load_beir


def bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_the_eval_notes_are_a_beir_set_qmd_reads(tmp_path: Path) -> None:
    eval_docs_dir()  # skips without the eval corpus (fails under CI)
    r = bench("evalnotes_beir.py", str(tmp_path / "notes"), "--eval", str(EVAL_DIR))
    assert r.returncode == 0, r.stderr
    docs, fixture, warnings = load_beir(tmp_path / "notes")
    assert len(docs) == 6 and len(fixture.queries) == 49 and warnings == []
    files = {d.file for d in docs}
    assert all(len(q.expected) == 1 and set(q.expected) <= files for q in fixture.queries)


def lists(sets: list[str], rng: random.Random, kinds: tuple[str, ...] = ("own", "other", "off")) -> list[dict]:
    """bench_fusion.py's shape: each set's own questions (the answer stands out in both legs),
    the other sets' and everyday ones (a crowd of near neighbours)."""
    rows = []
    for home in sets:
        for kind in kinds * 30:
            docs = [f"d{i}" for i in rng.sample(range(100), 20)]
            clear = kind == "own"
            fts = [
                (d, (0.7 if clear and i == 0 else 0.25) - 0.01 * i + rng.uniform(0, 0.05)) for i, d in enumerate(docs)
            ]
            cosines = [(0.6 if clear and i == 0 else 0.3) - 0.005 * i + rng.uniform(0, 0.05) for i in range(20)]
            vec = [(d, 1 / (1 + (1 - c))) for d, c in zip(docs, cosines, strict=True)]  # 1/(1 + distance)
            held = {"own": 0.95, "other": 0.9, "off": 0.35}[kind] + rng.uniform(0, 0.05)  # idf share held
            row = {"set": home, "own": clear, "offtopic": kind == "off", "query": "q", "fts": fts, "vec": vec}
            row["held"] = held
            rows.append({**row, "relevant": [docs[0]] if clear else []})
    return rows


def test_relevance_fit_fits_on_some_sets_and_checks_the_others(tmp_path: Path) -> None:
    model = require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM embedder (../shared/models)")
    rng = random.Random(3)
    (tmp_path / "lists.json").write_text(json.dumps(lists(["a", "b", "c", "notes"], rng)))
    (tmp_path / "alone.json").write_text(json.dumps(lists(["notes"], rng, ("own", "off"))))
    (tmp_path / "a-alone.json").write_text(json.dumps(lists(["a"], rng, ("own", "off"))))
    for k in range(2):  # folders small_beir.py cut from b, each indexed alone
        (tmp_path / f"b-6-{k}.json").write_text(json.dumps(lists([f"b-6-{k}"], rng)))
    r = bench(
        "relevance_fit.py",
        *("--lists", str(tmp_path / "lists.json"), "--check", "notes"),
        *("--check-lists", str(tmp_path / "alone.json"), "--check-lists", str(tmp_path / "a-alone.json")),
        *("--small-lists", str(tmp_path / "b-6-0.json"), "--small-lists", str(tmp_path / "b-6-1.json")),
        *("--model", str(model)),
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "fitted on a, b, c: W_KEYWORD" in out and "W_STANDOUT_VECTOR" in out and "W_HELD" in out
    full, alone = out.split("keyword evidence alone (no embedder)")
    assert "KEYWORD_ONLY_HELD_STANDOUT" in alone and "KEYWORD_ONLY_HELD" in alone and "W_VECTOR" not in alone
    for table in (full, alone):
        held = {line.split(" | ")[0]: line for line in table.splitlines() if " | " in line and "%" in line}
        assert set(held) == {"a", "b", "c", "notes", "notes (own index)", "a (own index)", "b (small)"}
        assert " / - / " in held["notes (own index)"]  # no other sets' questions were asked of it alone
        # separable lists: a high floor refuses every question without an answer
        assert held["a"].split(" | ")[-1].startswith("100% / 100% / ")


def test_page_titles_are_queries_with_every_section_of_the_page_relevant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nodedocs_beir.py --by-page: a title is asked when enough chosen sections are its page's."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from nodedocs_beir import PAGE_SECTIONS, Section, write_by_page

    chosen = [Section("Crypto", f"## part {i}\n\nabout ciphers {i}\n", []) for i in range(PAGE_SECTIONS)]
    chosen.insert(1, Section("Path", "## join\n\njoins paths\n", []))
    assert write_by_page(tmp_path, chosen, queries=10) == 1
    docs, fixture, warnings = load_beir(tmp_path)
    assert len(docs) == PAGE_SECTIONS + 1 and warnings == []
    (q,) = fixture.queries
    assert q.query == "Crypto" and len(q.expected) == PAGE_SECTIONS  # "Path" has one section: not asked
    by_file = {d.file: d for d in docs}
    assert all("about ciphers" in by_file[f].text for f in q.expected)  # sections are kept whole


INFO = (
    "\x1f\nFile: demo.info,  Node: Top,  Next: wc invocation\n\nThe demo manual.\n\n* Menu:\n\n* wc::\n"
    "\x1f\nFile: demo.info,  Node: wc invocation,  Next: Index,  Up: Top\n\n"
    "1 'wc': Print newline, word, and byte counts\n============================================\n\n"
    "'wc' counts the number of bytes, characters, words, and newlines in\neach given FILE, or standard input"
    " if none are given.  It prints one line\nof counts per file.\n\n     wc [OPTION]... [FILE]...\n\n"
    + "   Each count is printed right-justified in a field with at least one\nspace between fields.\n"
    * 4
    + "\n* Menu:\n\n* wc options::\n"
    "\x1f\nFile: demo.info,  Node: Index,  Prev: wc invocation\n\nIndex\n*****\n\n"
    + "* wc:   wc invocation.   (line 6)\n" * 40
    + "\x1f\nTag Table:\nNode: Top\x7f1\n\x1f\nEnd Tag Table\n"
)


def test_info_manuals_are_nodes_asked_by_their_first_sentence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """infodocs_beir.py: a node is a document titled by its name, without its own underlined
    title and its menu; the first sentence of its first paragraph of prose is its query, and
    is taken out of it. Top, index nodes and the tag table are not documents."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import infodocs_beir

    (node,) = infodocs_beir.nodes(INFO, max_chars=20_000)
    assert node.title == "wc invocation" and "=====" not in node.text and "Menu" not in node.text
    assert node.sentence is not None and node.sentence[2] == (
        "'wc' counts the number of bytes, characters, words, and newlines in each given FILE, or standard input"
        " if none are given."
    )
    (tmp_path / "info").mkdir()
    with gzip.open(tmp_path / "info" / "demo.info.gz", "wt") as f:
        f.write(INFO)
    monkeypatch.setattr(infodocs_beir, "ROOT", tmp_path / "info")
    assert infodocs_beir.build(tmp_path / "set", docs=10, queries=10, seed=1, max_chars=20_000) == (1, 1)
    docs, fixture, warnings = load_beir(tmp_path / "set")
    assert warnings == [] and fixture.queries[0].query == node.sentence[2]
    assert docs[0].text.startswith("It prints one line of counts per file.")  # the rest of its paragraph stays


def test_small_folders_are_cut_around_judged_questions(tmp_path: Path) -> None:
    """small_beir.py: each folder holds its size in documents, every question asked of it
    has all its relevant documents there, and the same seed cuts the same folders."""
    home = tmp_path / "set"
    (home / "qrels").mkdir(parents=True)
    (home / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": f"doc {i}"}) + "\n" for i in range(40))
    )
    (home / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": f"q {i}"}) + "\n" for i in range(20))
    )
    qrels = "".join(f"q{i}\td{2 * i}\t1\n" for i in range(20)) + "q0\td1\t1\nq1\td3\t0\n"  # two for q0; d3 judged 0
    (home / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    for out in ("a", "b"):
        r = bench("small_beir.py", str(home), str(tmp_path / out), "--sizes", "5,12")
        assert r.returncode == 0, r.stderr
    for name in ("set-5-0", "set-12-1"):
        docs, fixture, warnings = load_beir(tmp_path / "a" / name)
        assert len(docs) == int(name.split("-")[1]) and warnings == []
        assert len(fixture.queries) >= 2 and all(set(q.expected) <= {d.file for d in docs} for q in fixture.queries)
        assert (tmp_path / "a" / name / "corpus.jsonl").read_text() == (
            tmp_path / "b" / name / "corpus.jsonl"
        ).read_text()
    for bad in ("1,5", "five", ""):
        r = bench("small_beir.py", str(home), str(tmp_path / "c"), "--sizes", bad)
        assert (
            r.returncode != 0 and "--sizes takes whole numbers of 2 or more" in r.stderr and "Traceback" not in r.stderr
        )
    r = bench("small_beir.py", str(tmp_path / "none"), str(tmp_path / "c"))
    assert r.returncode != 0 and "is not a BEIR-format set" in r.stderr and not (tmp_path / "c").exists()


def test_relevance_fit_says_which_lists_are_missing(tmp_path: Path) -> None:
    r = bench("relevance_fit.py", "--lists", str(tmp_path / "none.json"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f"no lists at {tmp_path / 'none.json'}: make them with bench/bench_fusion.py" in r.stderr
