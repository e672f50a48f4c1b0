"""A BEIR-format known-item set made of this machine's man pages, for `qmd bench --beir`.

    .venv/bin/python bench/manpages_beir.py OUT_DIR [--docs 5000] [--queries 400] [--seed 7] [--max-chars 60000]
    .venv/bin/qmd bench --beir OUT_DIR

Real text with real judgments, offline: each page's NAME line is split into the command
and its one-line description; the description becomes a query, the rest of the page
(NAME section removed) its one relevant document. The queries are short natural
descriptions ("delay for a specified amount of time"), the documents long technical
prose, and many pages share words, so the set separates rankings that weigh rare words
from ones that count matched words. Pages are read from /usr/share/man (gzipped roff,
macros stripped by regular expressions: no groff needed); generated SDK pages (gcloud,
bq, gsutil), `.so` redirects, short pages and repeated descriptions are left out. Which
pages a machine has varies, so figures are comparable within one machine's set.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import sys
from pathlib import Path

SECTIONS = ("man1", "man3", "man5", "man7", "man8")
GENERATED = ("gcloud", "bq", "gsutil")
_FONT = re.compile(r"\\f[BIRP]|\\f\(..|\\f\[[^]]*\]")
_ESCAPE = re.compile(r"\\\(..|\\\[[^]]*\]|\\[&e|^]|\\\*\(..|\\\*.")
_SECTION = re.compile(r"\.(?:SH|Sh)\s+\"?([^\"]*)\"?")
_TEXT_MACRO = re.compile(r"[.'](?:B|I|BR|IR|RB|RI|BI|IB|Nm|Nd|Fl|Ar|Cm|Pa|Xr|It|TP|IP)\b\s*(.*)")


def _text(line: str) -> str:
    return _ESCAPE.sub(" ", _FONT.sub("", line.replace("\\-", "-")))


def page(path: Path) -> tuple[str, str] | None:
    """(description, body) of one man page, or None when it has no usable NAME line."""
    try:
        raw = gzip.open(path, "rt", errors="replace").read()
    except (OSError, EOFError):
        return None
    if raw.startswith(".so ") or len(raw) < 800:
        return None
    name: list[str] = []
    body: list[str] = []
    section = None
    for line in raw.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if m := _SECTION.match(line):
            section = m.group(1).strip().upper()
            body.append("\n" + section.title() + "\n")
            continue
        if line.startswith((".", "'")):
            m = _TEXT_MACRO.match(line)
            if not m or not m.group(1):
                continue
            line = m.group(1).replace('"', "")
        (name if section == "NAME" else body).append(_text(line))
    parts = re.split(r"\s+-+\s+", " ".join(name), maxsplit=1)
    if len(parts) != 2:
        return None
    description, text = parts[1].strip(), "\n".join(body).strip()
    if len(description.split()) < 3 or len(text) < 500:
        return None
    return description, text[:60_000]


def build(out: Path, docs: int, queries: int, seed: int, max_chars: int = 60_000) -> tuple[int, int]:
    """Write the set; each page's text is cut at a line end before `max_chars` (a smaller
    corpus to embed, where a benchmark runs every query through the models)."""
    files = sorted(
        p for d in SECTIONS for p in Path("/usr/share/man", d).glob("*.gz") if not p.name.startswith(GENERATED)
    )
    rng = random.Random(seed)
    rng.shuffle(files)
    corpus: list[dict[str, str]] = []
    asked: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for path in files:
        if len(corpus) >= docs:
            break
        found = page(path)
        if found is None or found[0].lower() in seen:
            continue
        seen.add(found[0].lower())
        doc_id = f"d{len(corpus)}"
        text = (
            found[1] if len(found[1]) <= max_chars else found[1][: found[1].rfind("\n", 0, max_chars) + 1 or max_chars]
        )
        corpus.append({"_id": doc_id, "title": "", "text": text.rstrip()})
        asked.append((f"q{len(corpus)}", found[0], doc_id))
    rng.shuffle(asked)
    asked = asked[:queries]
    return write_beir(out, corpus, asked)


def write_beir(out: Path, corpus: list[dict[str, str]], asked: list[tuple[str, str, str]]) -> tuple[int, int]:
    """A known-item BEIR folder: the documents, the (query id, text, relevant document id)
    questions, each judged 1 for its document; returns (documents, queries)."""
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    (out / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (out / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t, _ in asked))
    qrels = "".join(f"{q}\t{d}\t1\n" for q, _, d in asked)
    (out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return len(corpus), len(asked)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-chars", type=int, default=60_000, help="cut each page's text at a line end before this")
    args = ap.parse_args(argv)
    docs, queries = build(args.out, args.docs, args.queries, args.seed, args.max_chars)
    print(f"{args.out}: {docs} documents, {queries} queries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
