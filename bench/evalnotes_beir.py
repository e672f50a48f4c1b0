"""The eval notes as a BEIR-format set, for checking a relevance floor on a small collection.

    .venv/bin/python bench/evalnotes_beir.py OUT_DIR [--eval DIR]

`../shared/eval/qmd-eval` holds six notes, 24 eval queries (`queries.json`) and 25 hard
questions written without the notes' words (`deep-research.jsonl`), each with the note that
answers it. A folder of six is where a score measured against the collection goes wrong, so
`bench/relevance_fit.py --check` reads it beside the three large sets: checked, never fitted.
Each note is one document, written as it is (title and headings included).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import ROOT

EVAL = ROOT.parent / "shared" / "eval" / "qmd-eval"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--eval", type=Path, default=EVAL, help="the qmd-eval folder")
    a = ap.parse_args()
    notes = {p.stem: p.read_text(encoding="utf-8") for p in sorted((a.eval / "docs").glob("*.md"))}
    asked: list[tuple[str, str, str]] = []
    for q in json.loads((a.eval / "queries.json").read_text())["eval_queries"]:
        asked += [(q["id"], q["query"], Path(f).stem) for f in q["expected_files"]]
    for n, line in enumerate((a.eval / "deep-research.jsonl").read_text().splitlines()):
        q = json.loads(line)
        (stem,) = (s for s in notes if q["expected_doc"] in s)
        asked.append((f"hard-{n:02d}", q["query"], stem))
    (a.out / "qrels").mkdir(parents=True, exist_ok=True)
    (a.out / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": s, "title": "", "text": t}) + "\n" for s, t in notes.items())
    )
    queries = dict.fromkeys((qid, text) for qid, text, _ in asked)
    (a.out / "queries.jsonl").write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in queries))
    qrels = "".join(f"{qid}\t{stem}\t1\n" for qid, _, stem in asked)
    (a.out / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    print(f"{a.out}: {len(notes)} documents, {len(queries)} queries")


if __name__ == "__main__":
    main()
