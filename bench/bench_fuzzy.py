"""What `--fuzzy` costs: correcting a misspelt word against a vocabulary of ~100k terms.

    .venv/bin/python bench/bench_fuzzy.py [--files 4000] [--words 300] [--terms 100000]
                                          [--queries 40] [--seed 1] [--postgres] [--url URL]

Generates --files notes of --words words drawn from --terms random pseudo-words (so the
index holds about that many distinct stems), indexes them through the library
(`qmd.open`), then for --queries words of the vocabulary with one letter swapped (never
the first) times, on one read connection:

  vocabulary   the stems sharing the typed stem's first letter (`Vocabulary.with_initial`;
               on Postgres the first read of a letter since the last write, kept after)
  distance     the edit distance to all of them (`typos.nearest`, numpy)
  correct      the whole correction (`typos.correct`: stems, prefix test, both of the
               above, the surface word)
  search       `search(q, fuzzy=True)` against `search(q)` of the same misspelt query

On SQLite, or with --postgres on an embedded PostgreSQL (or --url). Prints p50/p95 in ms.
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import qmd
from qmd.server.library import Index
from qmd.server.search.lexical import parse_lex
from qmd.server.search.typos import correct, nearest, vocabulary


def _pseudo_words(n: int, rng: random.Random) -> list[str]:
    """`n` distinct lowercase words of 5-12 letters, none a stem-changing English ending."""
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(5, 12))) + "q")
    return sorted(out)


def _swap(word: str, rng: random.Random) -> str:
    i = rng.randrange(1, len(word) - 2)  # the first letter and the final q stay
    return word[:i] + word[i + 1] + word[i] + word[i + 2 :]


def _ms(fn: Callable[[], object], runs: int = 1) -> float:
    t = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - t) * 1000 / runs


def _pct(values: list[float]) -> str:
    values = sorted(values)
    return f"p50 {statistics.median(values):7.2f} ms  p95 {values[int(0.95 * (len(values) - 1))]:7.2f} ms"


@contextmanager
def _index_location(args: argparse.Namespace, tmp: Path) -> Iterator[str]:
    if not args.postgres and not args.url:
        yield str(tmp / "index.sqlite")
        return
    if args.url:
        yield args.url
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from conftest import new_database
    from pg_server import embedded_postgres

    with embedded_postgres() as server, new_database(server) as url:
        yield url


def _time_corrections(index: Index, typed: list[str]) -> tuple[dict[str, list[float]], int]:
    """Each stage's time per misspelt word, and how many of the words were corrected."""
    timings: dict[str, list[float]] = {name: [] for name in ("vocabulary", "distance", "correct", "search", "exact")}
    corrected = 0
    with index.engine.store.read() as conn:
        v = vocabulary(conn)
        for word in typed:
            stem = word  # pseudo-words end in q: porter leaves them whole
            t = time.perf_counter()
            terms = v.with_initial(stem[0])
            timings["vocabulary"].append((time.perf_counter() - t) * 1000)
            timings["distance"].append(_ms(partial(nearest, stem, terms, 2)))
            query = parse_lex(word)
            timings["correct"].append(_ms(partial(correct, conn, query)))
            fixed = correct(conn, query)[1]
            corrected += bool(fixed and fixed[0].searched)
    for word in typed:
        timings["search"].append(_ms(partial(index.search, word, fuzzy=True)))
        timings["exact"].append(_ms(partial(index.search, word)))
    return timings, corrected


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--words", type=int, default=300)
    ap.add_argument("--terms", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--postgres", action="store_true")
    ap.add_argument("--url", default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    vocab = _pseudo_words(args.terms, rng)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        notes = tmp / "notes"
        notes.mkdir()
        for i in range(args.files):
            (notes / f"n{i:05}.md").write_text(f"# Note {i}\n\n" + " ".join(rng.choices(vocab, k=args.words)) + "\n")
        with _index_location(args, tmp) as where, qmd.open(where, collections={"n": {"path": str(notes)}}) as index:
            t = time.perf_counter()
            index.update()
            backend = "postgres" if "://" in where else "sqlite"
            print(f"indexed {args.files} files in {time.perf_counter() - t:.1f} s ({backend})")
            typed = [_swap(w, rng) for w in rng.sample(vocab, args.queries)]
            timings, corrected = _time_corrections(index, typed)
            print(f"{corrected} of {len(typed)} misspelt words corrected")
            for name, values in timings.items():
                print(f"{name:<11} {_pct(values)}")


if __name__ == "__main__":
    main()
