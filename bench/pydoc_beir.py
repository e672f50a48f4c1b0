"""A BEIR-format known-item set made of the Python standard library's docstrings, for `qmd bench --beir`.

    .venv/bin/python bench/pydoc_beir.py OUT_DIR [--docs 2000] [--queries 400] [--seed 7]
    .venv/bin/qmd bench --beir OUT_DIR

A second real set beside bench/manpages_beir.py, offline and of another shape: API
reference entries of a few hundred characters instead of long manual pages. Every public
function, class and method of the importable standard library whose docstring has a
summary (its first paragraph, at most 200 characters) and a body is one document: its
qualified name and signature, then the docstring without its summary. The summary
("Convert a wait status to an exit code.") is the query, its entry the one relevant
document. Summaries that two entries share, and entries whose body is short, are left
out. Which entries there are depends on the Python version, so figures are comparable
within one interpreter's set.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import io
import random
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from manpages_beir import write_beir  # noqa: E402

SKIP = ("antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "ensurepip", "pydoc_data", "lib2to3")
"""Modules that act on import (a browser, a poem), need a display, or are data only."""
MIN_BODY = 120
"""Characters of docstring after the summary, so that a document says more than its query."""
MAX_SUMMARY = 200
"""A longer first paragraph is a description, not a summary line."""
_WORDS = re.compile(r"[A-Za-z]{2,}")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def entries() -> Iterator[tuple[str, str, str]]:
    """(qualified name with signature, summary, body) of every documented public callable."""
    warnings.simplefilter("ignore")
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name.split(".")[0] in SKIP:
            continue
        try:
            with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
                module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module this platform lacks (winreg, msvcrt) or cannot import
            continue
        for attr, obj in sorted(vars(module).items()):
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isclass(obj):
                yield from _entry(f"{name}.{attr}", obj)
                for meth, fn in sorted(vars(obj).items()):
                    if not meth.startswith("_") and callable(fn):
                        yield from _entry(f"{name}.{attr}.{meth}", fn)
            elif callable(obj):
                yield from _entry(f"{name}.{attr}", obj)


def _entry(qualname: str, obj: Any) -> Iterator[tuple[str, str, str]]:
    doc = inspect.getdoc(obj)
    if not doc:
        return
    summary, _, body = doc.partition("\n\n")
    summary, body = " ".join(summary.split()), body.strip()
    if len(_WORDS.findall(summary)) < 4 or len(summary) > MAX_SUMMARY or len(body) < MIN_BODY:
        return
    try:
        signature = _ADDRESS.sub("", str(inspect.signature(obj)))  # a default's repr may hold its address
    except (TypeError, ValueError):
        signature = ""
    yield f"{qualname}{signature}", summary, body


def build(out: Path, docs: int, queries: int, seed: int) -> tuple[int, int]:
    """Write the set: `docs` entries drawn at random, `queries` of their summaries."""
    found = list(entries())
    counts: dict[str, int] = {}
    for _, summary, _ in found:
        counts[summary.lower()] = counts.get(summary.lower(), 0) + 1
    unique = [e for e in found if counts[e[1].lower()] == 1]
    rng = random.Random(seed)
    rng.shuffle(unique)
    corpus, asked = [], []
    for i, (head, summary, body) in enumerate(unique[:docs]):
        corpus.append({"_id": f"d{i}", "title": "", "text": f"{head}\n\n{body}"})
        asked.append((f"q{i}", summary, f"d{i}"))
    rng.shuffle(asked)
    asked = asked[:queries]
    return write_beir(out, corpus, asked)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    docs, queries = build(args.out, args.docs, args.queries, args.seed)
    print(f"{args.out}: {docs} documents, {queries} queries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
