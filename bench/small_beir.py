"""Small folders cut from a BEIR-format set: a few documents each, as a user's notes may be.

    .venv/bin/python bench/small_beir.py SET OUT_DIR [--sizes 5,6,8,10,12,16,20,30] [--seed 7]

A relevance floor fitted on collections of hundreds of documents may read a small one
differently: among six notes, one stray word match is the only keyword hit and so stands out
by the whole of its score. Each folder `OUT_DIR/<set>-<size>-<k>` holds `size` documents of
SET: the relevant documents of half as many of its judged questions (at least two), chosen
at random, and other documents drawn at random to fill it. Its questions are those, judged as
in SET. `bench_fusion.py` indexes each alone (`--ask` adds other sets' questions, which no
document there answers), and `relevance_fit.py --small-lists` checks the floor on them,
grouped under `<set> (small)` and held out with SET (docs/benchmarks.md#relevance).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path


def read_set(home: Path) -> tuple[list[dict[str, str]], dict[str, dict[str, str]], dict[str, list[str]]]:
    """(documents, questions by id, each judged question's relevant document ids)."""
    corpus = [json.loads(line) for line in (home / "corpus.jsonl").read_text().splitlines() if line.strip()]
    queries = {q["_id"]: q for q in map(json.loads, (home / "queries.jsonl").read_text().splitlines()) if q}
    judged: dict[str, list[str]] = {}
    for line in (home / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        q, d, score = line.split("\t")
        if int(score) > 0 and q in queries:
            judged.setdefault(q, []).append(d)
    return corpus, queries, judged


def cut(home: Path, out: Path, sizes: list[int], seed: int) -> list[tuple[Path, int, int]]:
    """Write one folder per size; returns (folder, documents, questions) of each."""
    corpus, queries, judged = read_set(home)
    ids = [d["_id"] for d in corpus]
    rng = random.Random(seed)
    made = []
    for k, size in enumerate(sizes):
        asked = rng.sample(sorted(judged), k=min(len(judged), max(2, size // 2)))
        keep = {d for q in asked for d in judged[q]}
        keep |= set(rng.sample([d for d in ids if d not in keep], k=max(0, min(size, len(ids)) - len(keep))))
        asked = [q for q in asked if set(judged[q]) <= keep]
        folder = out / f"{home.name}-{size}-{k}"
        (folder / "qrels").mkdir(parents=True, exist_ok=True)
        (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus if d["_id"] in keep))
        (folder / "queries.jsonl").write_text("".join(json.dumps(queries[q]) + "\n" for q in asked))
        qrels = "".join(f"{q}\t{d}\t1\n" for q in asked for d in judged[q])
        (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
        made.append((folder, len(keep), len(asked)))
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("set", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", default="5,6,8,10,12,16,20,30", help="documents in each folder, comma-separated")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    if not (args.set / "corpus.jsonl").is_file():
        sys.exit(f"{args.set} is not a BEIR-format set (no corpus.jsonl): make one with bench/*_beir.py")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 2:
        sys.exit(f"--sizes takes whole numbers of 2 or more, separated by commas, not {args.sizes!r}")
    for folder, docs, questions in cut(args.set, args.out, sizes, args.seed):
        print(f"{folder}: {docs} documents, {questions} questions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
