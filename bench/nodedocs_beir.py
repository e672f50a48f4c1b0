"""A BEIR-format known-item set made of Node.js's API reference (markdown), for `qmd bench --beir`.

    .venv/bin/python bench/nodedocs_beir.py OUT_DIR [--docs 800] [--queries 400] [--seed 7] [--max-chars 40000]
    .venv/bin/qmd bench --beir OUT_DIR

A third real set beside bench/manpages_beir.py and bench/pydoc_beir.py, and the one of
their shape that notes have: long markdown documents with a deep heading structure. Each
`## ` section of a page under /usr/share/doc/nodejs/api (Debian's nodejs-doc; the npm
docs when it is missing) is one document, titled by its page's `# ` heading. A query is the
first sentence of one entry (a `###`/`####` section) of a document, removed from it: "Tests
a user's permissions for the file or directory specified by path." Its document is the one
relevant. The sentence sits in a long document under a heading path it is about, often
many chunks from the document's start: what contextual chunks are for. Which pages a
machine has varies, so figures are comparable within one machine's set.

`--by-page` makes the other kind of query instead: a page's title ("Crypto", "Worker
threads"), a word or two with every chosen section of that page relevant (those of pages
with at least `PAGE_SECTIONS` of them), the documents left whole. A query with many right
answers finds many documents about as near as its best, which is what `relevance.standout`
reads as a question the collection does not answer: this set checks the floor on it.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOTS = (Path("/usr/share/doc/nodejs/api"), Path("/usr/lib/node_modules/npm/docs/content"))
_H2 = re.compile(r"^## ", re.MULTILINE)
_ENTRY = re.compile(r"^#{3,4} .*$", re.MULTILINE)
_SENTENCE = re.compile(r"^(.{30,240}?[.!?])(?:\s|$)")
_NOT_PROSE = ("<!--", ">", "*", "-", "|", "```", "#", "[", "<")
PER_DOC = 3
"""Queries one document may answer: a long section holds many entries."""
PAGE_SECTIONS = 3
"""`--by-page`: a page title is a query when at least this many chosen sections are its page's."""


@dataclass
class Section:
    title: str
    text: str
    sentences: list[tuple[int, int, str]]
    """(start, end, first sentence) of each entry's first prose paragraph."""


def first_sentence(body: str, start: int) -> tuple[int, int, str] | None:
    """The first sentence of an entry's first prose paragraph after `start`, with the
    paragraph's span (its lines are hard-wrapped, so the sentence is read joined)."""
    in_comment = False
    pos = start
    lines: list[str] = []
    para_start = para_end = -1
    for line in body[start:].split("\n"):
        offset, pos = pos, pos + len(line) + 1
        stripped = line.strip()
        if lines:
            if not stripped or stripped.startswith(_NOT_PROSE):
                break
            lines.append(stripped)
            para_end = offset + len(line)
            continue
        if stripped.startswith("#"):
            return None  # the next heading came first: an entry without prose
        if "<!--" in stripped:
            in_comment = "-->" not in stripped
            continue
        if in_comment:
            in_comment = "-->" not in stripped
            continue
        if not stripped or stripped.startswith(_NOT_PROSE):
            continue
        lines, para_start, para_end = [stripped], offset, offset + len(line)
    m = _SENTENCE.match(" ".join(lines))
    if m is None or len(m.group(1).split()) < 6:
        return None
    return para_start, para_end, m.group(1)


def sections(page: Path, max_chars: int) -> list[Section]:
    text = page.read_text(encoding="utf-8", errors="replace")
    h1 = re.search(r"^# (.+)$", text, re.MULTILINE)
    title = h1.group(1).strip().strip("`") if h1 else page.stem
    starts = [m.start() for m in _H2.finditer(text)] + [len(text)]
    found = []
    for a, b in zip(starts, starts[1:]):
        body = text[a:b].rstrip() + "\n"
        if not 1000 <= len(body) <= max_chars:
            continue
        entries = [first_sentence(body, m.end() + 1) for m in _ENTRY.finditer(body)]
        found.append(Section(title, body, [e for e in entries if e is not None]))
    return found


def build(out: Path, docs: int, queries: int, seed: int, max_chars: int, by_page: bool = False) -> tuple[int, int]:
    pages = sorted(p for r in ROOTS if r.is_dir() for p in r.rglob("*.md"))
    if not pages:
        sys.exit(f"no Node.js or npm markdown docs here ({', '.join(map(str, ROOTS))}): apt-get install nodejs-doc")
    rng = random.Random(seed)
    pool = [s for page in pages for s in sections(page, max_chars)]
    rng.shuffle(pool)
    chosen = pool[:docs]
    if by_page:
        return len(chosen), write_by_page(out, chosen, queries)
    seen: set[str] = set()
    candidates = []
    for i, s in enumerate(chosen):
        for start, end, sentence in s.sentences:
            if sentence.lower() not in seen:
                seen.add(sentence.lower())
                candidates.append((i, start, end, sentence))
    rng.shuffle(candidates)
    picked: list[tuple[int, int, int, str]] = []
    per_doc: dict[int, int] = {}
    for i, start, end, sentence in candidates:
        if len(picked) < queries and per_doc.get(i, 0) < PER_DOC:
            per_doc[i] = per_doc.get(i, 0) + 1
            picked.append((i, start, end, sentence))
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with open(out / "corpus.jsonl", "w") as corpus:
        for i, s in enumerate(chosen):
            text = s.text
            for _, start, end, sentence in sorted((p for p in picked if p[0] == i), key=lambda p: -p[1]):
                rest = " ".join(line.strip() for line in text[start:end].split("\n"))[len(sentence) :].strip()
                text = text[:start] + rest + text[end:]
            corpus.write(json.dumps({"_id": f"d{i}", "title": s.title, "text": text}) + "\n")
    with open(out / "queries.jsonl", "w") as q, open(out / "qrels" / "test.tsv", "w") as qrels:
        qrels.write("query-id\tcorpus-id\tscore\n")
        for n, (i, _, _, sentence) in enumerate(sorted(picked)):
            q.write(json.dumps({"_id": f"q{n}", "text": sentence}) + "\n")
            qrels.write(f"q{n}\td{i}\t1\n")
    return len(chosen), len(picked)


def write_by_page(out: Path, chosen: list[Section], queries: int) -> int:
    """`--by-page`'s set: the sections whole, a query per page title with its sections relevant."""
    pages: dict[str, list[int]] = {}
    for i, s in enumerate(chosen):
        pages.setdefault(s.title, []).append(i)
    asked = [(title, ids) for title, ids in pages.items() if len(ids) >= PAGE_SECTIONS][:queries]
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w") as corpus:
        for i, s in enumerate(chosen):
            corpus.write(json.dumps({"_id": f"d{i}", "title": s.title, "text": s.text}) + "\n")
    with open(out / "queries.jsonl", "w") as q, open(out / "qrels" / "test.tsv", "w") as qrels:
        qrels.write("query-id\tcorpus-id\tscore\n")
        for n, (title, ids) in enumerate(asked):
            q.write(json.dumps({"_id": f"p{n}", "text": title}) + "\n")
            qrels.write("".join(f"p{n}\td{i}\t1\n" for i in ids))
    return len(asked)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=int, default=800)
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-chars", type=int, default=40000)
    ap.add_argument("--by-page", action="store_true", help="page titles as queries, every section of the page relevant")
    a = ap.parse_args()
    n_docs, n_queries = build(a.out, a.docs, a.queries, a.seed, a.max_chars, a.by_page)
    print(f"{a.out}: {n_docs} documents, {n_queries} queries")


if __name__ == "__main__":
    main()
