"""Fusion measured from each leg's own ranked lists on BEIR-format sets.

    .venv/bin/python bench/bench_fusion.py /tmp/node /tmp/pydoc /tmp/man [--queries 200] [--base DIR] [--lists FILE]
                                           [--offtopic bench/data/offtopic_queries.txt] [--ask DIR ...]

Each set is indexed and embedded (MiniLM) into an isolated daemon as its own collection
(`qmd bench --beir DIR --embed --keep`), and every query is sent to both legs as the
hybrid query sends it (`POST /v1/keyword` and `/v1/vector`: the top `FLOOR_FETCH` with
their scores, of which fusion reads the first `LIST_FETCH`). The set's own queries are
asked, whose one relevant document is known, and the other sets' queries too, which have
no relevant document there ("questions about another corpus"): kept in the saved lists
for measuring a relevance floor. So are the
`--offtopic` questions (everyday topics no software manual answers), asked of every set, and
the questions of each `--ask` set, asked as another set's but not indexed (a small folder cut
by `small_beir.py`, indexed alone, is asked the questions of the other sets that way).

From those lists, offline and in the same run, nDCG@10 of each leg and of each fusion
variant (RRF constants and weights, score-aware combinations), the rank fusion
(`fusion.fuse`) and the default ranking of a plain query (by `relevance`, on the scale the
lists' embedder is measured to have) among them: the goal (issue 33) is a fused list above
its better leg on every set.

Each question's row also holds its `held` share (`lexical.Held`), read from its keyword
search of the set's collection after the daemon stops, for `relevance_fit.py`.

`--base DIR` reuses an installation made by an earlier run (vectors kept); `--lists FILE`
saves the lists, or reads them when the file exists, so a fusion change is measured again
in seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from _common import Daemon, Env, Isolated, embed_model_path

from qmd.server.quality import load_beir
from qmd.server.search.fusion import RankedList, fuse
from qmd.server.search.hybrid import LIST_FETCH
from qmd.server.search.relevance import W_KEYWORD, W_VECTOR

Lists = dict[str, list[tuple[str, float]]]
FLOOR_FETCH = 100
"""Each leg's list is kept this deep (fusion reads the first `LIST_FETCH`): a relevance
floor may compare the top of a list with its tail."""


def queries_of(beir: Path, limit: int) -> list[tuple[str, str, list[str]]]:
    """(id, text, relevant documents as indexed file stems) of a set's first `limit` judged
    queries, read as `qmd bench --beir` reads them."""
    _, fixture, _ = load_beir(beir, max_queries=limit)
    return [(q.id, q.query, [Path(f).stem for f in q.expected]) for q in fixture.queries]


def offtopic_queries(path: Path) -> list[tuple[str, str, list[str]]]:
    """The file's questions (a line each; `#` lines are comments), with nothing relevant."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [(f"off{i}", text, []) for i, text in enumerate(t for t in lines if t and not t.startswith("#"))]


def leg(client: httpx.Client, route: str, collection: str, text: str) -> list[tuple[str, float]]:
    body = {"query": text, "collections": [collection], "limit": FLOOR_FETCH, "min_score": 0.0}
    r = client.post(route, json=body, timeout=120)
    r.raise_for_status()
    return [(Path(h["path"]).stem, h["score"]) for h in r.json()["results"]]


def collect(
    env: Env, sets: list[Path], limit: int, offtopic: list[tuple[str, str, list[str]]], also: Sequence[Path] = ()
) -> list[dict[str, Any]]:
    """Each set's lists for its own questions, the other sets' and `also`'s (asked, never
    indexed) and the `offtopic` ones."""
    rows = []
    with httpx.Client(base_url=env.url) as client:
        for home in sets:
            collection = f"bench-{home.name}"
            asked = [(other, q) for other in (*sets, *also) for q in queries_of(other, limit)]
            for other, (qid, text, relevant) in asked + [(None, q) for q in offtopic]:
                own = other == home
                lists = {
                    "fts": leg(client, "/v1/keyword", collection, text),
                    "vec": leg(client, "/v1/vector", collection, text),
                }
                rows.append(
                    {
                        "set": home.name,
                        "own": own,
                        "offtopic": other is None,
                        "query": qid,
                        "text": text,
                        "relevant": relevant if own else [],
                        **lists,
                    }
                )
            print(f"{home.name}: lists collected", file=sys.stderr)
    return rows


def add_held(db: Path, rows: list[dict[str, Any]]) -> None:
    """Each question's share of idf its set's collection holds (`lexical.Held`), read as the
    hybrid query reads it: from its keyword search of that collection, 0 when that found nothing."""
    import qmd
    from qmd.server.search.lexical import parse_lex, search_fts

    with qmd.open(db) as index, index.engine.store.read() as conn:
        for r in rows:
            hits = search_fts(conn, parse_lex(r["text"]), f"bench-{r['set']}", 1, count_matched=False)
            r["held"] = hits[0].held.share if hits else 0.0


# -- fusion variants ------------------------------------------------------------------


def rrf_fused(row: Lists) -> list[str]:
    """`fusion.fuse` as the hybrid query calls it without expansion: both lists weigh 2."""
    ids: dict[str, int] = {}
    lists = [
        RankedList(src, "original", "", 2.0, [(ids.setdefault(d, len(ids)), s) for d, s in row[src]])
        for src in ("fts", "vec")
    ]
    names = {i: d for d, i in ids.items()}
    return [names[c.doc_id] for c in fuse(lists)]


def cosines_of(row: Lists) -> dict[str, float]:
    """The vector list's cosines (it holds each `1/(1 + distance)`)."""
    return {d: 2 - 1 / s for d, s in row["vec"]}


def by_relevance(
    related: float, unrelated: float, w_keyword: float = W_KEYWORD, w_vector: float = W_VECTOR
) -> Callable[[Lists], list[str]]:
    """A plain query's default order (`hybrid._shape`): the relevance model's sum of the
    keyword score and the cosine on the embedder's scale (`relevance.CosineScale`); a
    document the keyword list lacks counts 0 there, one the vector list lacks its least near
    cosine."""

    def ranked(row: Lists) -> list[str]:
        keyword = dict(row["fts"])
        cosines = cosines_of(row)
        least = min(cosines.values(), default=0.0)

        def logit(d: str) -> float:
            vector = (cosines.get(d, least) - unrelated) / ((related - unrelated) or 1.0)
            return w_keyword * keyword.get(d, 0.0) + w_vector * vector

        return sorted(set(keyword) | set(cosines), key=lambda d: -logit(d))

    return ranked


def scale_of(model: str) -> tuple[float, float]:
    """(related, unrelated) cosines of `model` over the anchors, through qmd's own embedder."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as home:
        for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
            os.environ[var] = home
        os.environ["QMD_EMBED_MODEL"] = model
        import qmd
        from qmd.server.search.relevance import Scales

        index = qmd.open(str(Path(home) / "scale.sqlite"), collections={})
        try:
            emb = index.engine.embedder()
            scale = Scales().of(emb.fingerprint, emb.backend.embed)
        finally:
            index.close()
    return scale.related, scale.unrelated


def rrf(k: int, w_fts: float = 1.0, w_vec: float = 1.0) -> Callable[[Lists], list[str]]:
    def ranked(row: Lists) -> list[str]:
        score: dict[str, float] = {}
        for src, w in (("fts", w_fts), ("vec", w_vec)):
            for r, (d, _) in enumerate(row[src], 1):
                score[d] = score.get(d, 0.0) + w / (k + r)
        return sorted(score, key=lambda d: -score[d])

    return ranked


def minmax(items: Sequence[tuple[str, float]]) -> dict[str, float]:
    if not items:
        return {}
    lo, hi = min(s for _, s in items), max(s for _, s in items)
    return {d: (s - lo) / (hi - lo) if hi > lo else 1.0 for d, s in items}


def combsum(alpha: float) -> Callable[[Lists], list[str]]:
    """alpha × keyword + (1 − alpha) × vector, each min-max normalised within its list."""

    def ranked(row: Lists) -> list[str]:
        f, v = minmax(row["fts"]), minmax(row["vec"])
        docs = set(f) | set(v)
        return sorted(docs, key=lambda d: -(alpha * f.get(d, 0.0) + (1 - alpha) * v.get(d, 0.0)))

    return ranked


def zscores(items: Sequence[tuple[str, float]]) -> tuple[dict[str, float], float]:
    """Each score as standard deviations from its list's mean, and the list's lowest."""
    if len(items) < 2:
        return {d: 0.0 for d, _ in items}, 0.0
    values = [s for _, s in items]
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) or 1e-9
    return {d: (s - mean) / sd for d, s in items}, (min(values) - mean) / sd


def zsum(alpha: float) -> Callable[[Lists], list[str]]:
    """alpha × keyword + (1 − alpha) × vector, each a z-score within its list; a document a
    list lacks counts as that list's lowest."""

    def ranked(row: Lists) -> list[str]:
        (f, f_low), (v, v_low) = zscores(row["fts"]), zscores(row["vec"])
        docs = set(f) | set(v)
        return sorted(docs, key=lambda d: -(alpha * f.get(d, f_low) + (1 - alpha) * v.get(d, v_low)))

    return ranked


VARIANTS: dict[str, Callable[[Lists], list[str]]] = {
    "keyword": lambda row: [d for d, _ in row["fts"]],
    "vector": lambda row: [d for d, _ in row["vec"]],
    "RRF (fusion.fuse)": rrf_fused,
    **{f"RRF k={k}": rrf(k) for k in (10, 30, 60)},
    **{f"RRF k=60 kw×{w}": rrf(60, w, 1.0) for w in (1.5, 2.0)},
    **{f"CombSUM α={a}": combsum(a) for a in (0.3, 0.5, 0.7)},
    **{f"z-score CombSUM α={a}": zsum(a) for a in (0.3, 0.4, 0.5)},
}


def ndcg10(ranked: list[str], relevant: list[str]) -> float:
    gains = [1.0 / math.log2(i + 2) for i, d in enumerate(ranked[:10]) if d in relevant]
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(10, len(relevant))))
    return sum(gains) / ideal if ideal else 0.0


def as_fused(row: dict[str, Any]) -> Lists:
    """The lists as the hybrid query fuses them: each leg's first `LIST_FETCH`."""
    return {src: row[src][:LIST_FETCH] for src in ("fts", "vec")}


def fusion_table(rows: list[dict[str, Any]], sets: list[str], scale: tuple[float, float]) -> None:
    print("\nnDCG@10 | " + " | ".join(sets))
    for name, variant in {**VARIANTS, "by relevance (the default)": by_relevance(*scale)}.items():
        cells = []
        for s in sets:
            own = [r for r in rows if r["set"] == s and r["own"]]
            cells.append(f"{sum(ndcg10(variant(as_fused(r)), r['relevant']) for r in own) / max(1, len(own)):.4f}")
        print(f"{name} | " + " | ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sets", type=Path, nargs="+")
    ap.add_argument("--queries", type=int, default=200, help="queries per set")
    ap.add_argument("--base", type=Path, help="reuse this installation (its vectors)")
    ap.add_argument("--model", help="embed GGUF (default: the shared MiniLM)")
    ap.add_argument("--lists", type=Path, help="save the collected lists here, or read them if it exists")
    ap.add_argument("--offtopic", type=Path, help="everyday questions to ask of every set too (a line each)")
    ap.add_argument(
        "--ask",
        type=Path,
        action="append",
        default=[],
        help="a set whose questions are asked of every set, not indexed",
    )
    a = ap.parse_args()
    if a.lists and a.lists.exists():
        rows = json.loads(a.lists.read_text())
    else:
        env: Env = Env(a.base) if a.base else Isolated(keep=True)
        env.vars["QMD_EMBED_MODEL"] = embed_model_path(a.model)
        daemon = Daemon(env)
        try:
            for home in a.sets:
                r = env.qmd("bench", "--beir", str(home), "--embed", "--keep", "-b", "bm25", timeout=7200)
                if r.returncode != 0:
                    sys.exit(f"indexing {home} failed: {r.stderr}")
            rows = collect(env, a.sets, a.queries, offtopic_queries(a.offtopic) if a.offtopic else [], a.ask)
        finally:
            daemon.stop()
        add_held(env.db, rows)
        print(f"installation: {env.base}", file=sys.stderr)
        if a.lists:
            a.lists.write_text(json.dumps(rows))
    names = [s.name for s in a.sets]
    fusion_table(rows, names, scale_of(embed_model_path(a.model)))


if __name__ == "__main__":
    main()
