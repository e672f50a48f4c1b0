"""A BEIR-format known-item set made of this machine's GNU info manuals, for `qmd bench --beir`.

    .venv/bin/python bench/infodocs_beir.py OUT_DIR [--docs 600] [--queries 300] [--seed 7] [--max-chars 20000]
    .venv/bin/qmd bench --beir OUT_DIR

A set none of the relevance weights were fitted on, to check them on (docs/benchmarks.md
#relevance): each node of a manual under /usr/share/info (coreutils, find, sed, gettext,
gnupg, wget, …; gzipped, split manuals read part by part) is one document, titled by its
node's name ("wc invocation"). A query is the first sentence of a node's first prose
paragraph, removed from it: "wc counts the number of bytes, characters, words, and
newlines in each given FILE". Its node is the one relevant document. Index nodes, menus
and nodes too short to say much are left out. Which manuals a machine has varies, so
figures are comparable within one machine's set.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/usr/share/info")
_HEADER = re.compile(r"^File: [^,]+,\s+Node: ([^,\t\n]+)")
_UNDERLINE = re.compile(r"^([=*\-.])\1{2,}$")
_SENTENCE = re.compile(r"^(.{30,240}?[.!?:])(?:\s|$)")
_NOT_PROSE = ("* ", "'-", "-- ")
"""A menu entry, an option's entry in a table ('-c'), a definition (-- Function: …)."""
MIN_CHARS = 400
"""A node shorter than this (once its sentence is out) says too little to be found by."""


@dataclass
class Node:
    title: str
    text: str
    sentence: tuple[int, int, str] | None
    """(start, end, first sentence) of the first prose paragraph, the paragraph's span."""


def nodes(info: str, max_chars: int) -> list[Node]:
    """The nodes of one info file's text (chunks after a ``\\x1f`` line that name a node)."""
    found = []
    for chunk in info.split("\x1f\n"):
        header = _HEADER.match(chunk)
        if header is None:
            continue  # the tag table, an indirect table
        name = header.group(1).strip()
        if name == "Top" or "index" in name.lower():
            continue
        lines = chunk.split("\n")[1:]
        while lines and not lines[0].strip():
            lines.pop(0)
        if len(lines) > 1 and _UNDERLINE.match(lines[1].strip()):
            lines = lines[2:]  # the node's own title, underlined
        body = "\n".join(lines).split("* Menu:")[0].strip() + "\n"
        if MIN_CHARS <= len(body) <= max_chars:
            found.append(Node(name, body, first_sentence(body)))
    return found


def first_sentence(body: str) -> tuple[int, int, str] | None:
    """The first sentence of the first paragraph of prose (lines at the left margin, but for
    `_NOT_PROSE`; an indented one is an example or a table's), with the paragraph's span."""
    pos = 0
    lines: list[str] = []
    start = end = -1
    for line in body.split("\n"):
        offset, pos = pos, pos + len(line) + 1
        prose = bool(line.strip()) and not line[0].isspace() and not line.startswith(_NOT_PROSE)
        if lines:
            if not prose:
                break
            lines.append(line.strip())
            end = offset + len(line)
        elif prose:
            lines, start, end = [line.strip()], offset, offset + len(line)
    m = _SENTENCE.match(" ".join(lines))
    if m is None or len(m.group(1).split()) < 6:
        return None
    return start, end, m.group(1).rstrip(":")


def read_manuals(root: Path, max_chars: int) -> list[Node]:
    files = sorted(p for p in root.glob("*.info*.gz"))
    return [n for f in files for n in nodes(gzip.open(f, "rt", errors="replace").read(), max_chars)]


def build(out: Path, docs: int, queries: int, seed: int, max_chars: int) -> tuple[int, int]:
    pool = read_manuals(ROOT, max_chars)
    if not pool:
        sys.exit(f"no GNU info manuals in {ROOT}")
    rng = random.Random(seed)
    rng.shuffle(pool)
    chosen = pool[:docs]
    seen: set[str] = set()
    asked: dict[int, str] = {}
    for i in rng.sample(range(len(chosen)), len(chosen)):
        s = chosen[i].sentence
        if s is not None and s[2].lower() not in seen and len(asked) < queries:
            seen.add(s[2].lower())
            asked[i] = s[2]
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    with open(out / "corpus.jsonl", "w") as corpus:
        for i, n in enumerate(chosen):
            text = n.text
            if i in asked and n.sentence is not None:
                start, end, sentence = n.sentence
                paragraph = " ".join(line.strip() for line in text[start:end].split("\n"))
                text = text[:start] + paragraph[len(sentence) :].lstrip(":").strip() + text[end:]
            corpus.write(json.dumps({"_id": f"d{i}", "title": n.title, "text": text}) + "\n")
    with open(out / "queries.jsonl", "w") as q, open(out / "qrels" / "test.tsv", "w") as qrels:
        qrels.write("query-id\tcorpus-id\tscore\n")
        for n, i in enumerate(sorted(asked)):
            q.write(json.dumps({"_id": f"q{n}", "text": asked[i]}) + "\n")
            qrels.write(f"q{n}\td{i}\t1\n")
    return len(chosen), len(asked)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=int, default=600)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-chars", type=int, default=20000)
    a = ap.parse_args()
    n_docs, n_queries = build(a.out, a.docs, a.queries, a.seed, a.max_chars)
    print(f"{a.out}: {n_docs} documents, {n_queries} queries")


if __name__ == "__main__":
    main()
