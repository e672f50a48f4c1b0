"""Relevance: a score with the same meaning for every query, which an agent can threshold.

The fused score (`fusion`) ranks, but it is relative to one query's lists: without a
reranker any query's first result scores near 1, relevant or not. `relevance` is instead
the probability that a hit is relevant, from evidence whose scale does not depend on the
query:

    keyword  the hit's `LexHit.score`: the fraction of the query's attainable BM25 it reaches
             (0 when the keyword lists did not find it)
    vector   the cosine of its nearest chunk on the embedder's own scale (`CosineScale`):
             0 where the model puts unrelated texts, 1 where it puts a question and the
             passage that answers it. A raw cosine means something else for every model
             (MiniLM's relevant notes sit at 0.4-0.8; another model's unrelated ones may sit
             at 0.5); the model's cosines of `ANCHORS`, measured once, say where.

    standout how far the query's best keyword score and best cosine stand above the mean of
             the next nine of their lists (`standout`; a document the keyword list lacks
             matched nothing and counts 0 there): a question the collection answers has a
             document that stands out; a question about something else, even on the same
             subject, finds many about as near
    held     the share of the query's idf that some document of the collections searched
             holds (`lexical.Held`): the keyword score leaves out the words no document
             holds, so that a misspelt word lowers nothing, and an everyday question asked of
             software docs can reach 0.9 of its attainable score from one stray word; a
             word only a collection not searched holds is, to this search, such a word

    relevance = 1 / (1 + exp(-(W_KEYWORD * keyword + W_VECTOR * vector
                               + W_HELD_STANDOUT_KEYWORD * standout.keyword * held
                               + W_STANDOUT_VECTOR * standout.vector + W_HELD * held + BIAS)))

The keyword standout counts as far as the question is held: among six notes one stray word
is the only keyword hit and stands out by the whole of its score, though it matched a tenth
of the question. The standout and held are the query's, the same for every hit, so the order
of a plain query is the sum of the first two terms alone, in the ratio chosen over rank fusion
(docs/benchmarks.md#across-sets-contextual-chunks-and-fusion). The rest is fitted by logistic
regression (bench/relevance_fit.py over bench/bench_fusion.py's lists) with that ratio held,
on three BEIR sets made from this machine's docs (Node.js API markdown, pydoc, man pages,
MiniLM): each set's first results for its own questions (one relevant document each), for
the other two sets' questions and for 149 everyday questions no software manual answers
(bench/data/offtopic_queries.txt). Held out one set at a time, the agents' floor
(`AGENT_FLOOR`, 0.02: the lowest floor at which each set, indexed alone as a user's folder is,
refused at least 80% of the everyday questions) refused 83-99% of them while dropping 0-2% of
the right first answers. Asked of one collection of an index holding all three, the other
sets' questions were refused 39-66% (19-61% asked of a set indexed alone); small folders of 5
to 30 documents cut from each set (bench/small_beir.py), held out with it, refused 90-99%
and dropped 0-2%. Never fitted nor used to choose the floor: GNU info manuals
(bench/infodocs_beir.py) 88% refused and none of 71 dropped; the eval notes in an index of
their own (six notes) 95% and 2 of 47, hard paraphrases written without the notes' words that
MiniLM puts at cosines of 0.2-0.3 (docs/benchmarks.md#relevance). A floor cuts, so the
closest result is still named: a question phrased unlike the notes can score low and be right.

Without vector evidence (no embedder, nothing embedded yet) the keyword score and its
standout, each times held, and held are fitted alone (`KEYWORD_ONLY_*`): held out, 0.02
refused 58-71% of the everyday questions on the sets alone and dropped 0-1%, 33-54% of the
other sets' questions asked of one collection, 65-75% in the small folders and 70% on the
eval notes (dropping 1 of 41). The keyword score alone refused only what nothing matched (52
of 149 on the eval notes).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from qmd.defaults import AGENT_RELEVANCE_FLOOR

W_KEYWORD = 3.40
W_VECTOR = 4.98
W_HELD_STANDOUT_KEYWORD = 7.10
W_STANDOUT_VECTOR = 4.73
W_HELD = 0.84
BIAS = -9.00
STANDOUT_DEPTH = 9
"""How many of each list's next results the best one is measured against, at most."""
KEYWORD_ONLY_HELD_KEYWORD = 1.72
KEYWORD_ONLY_HELD_STANDOUT = 15.43
KEYWORD_ONLY_HELD = 1.49
KEYWORD_ONLY_BIAS = -5.97
"""The weights when the query had no vector evidence (no embedder, nothing embedded yet):
fitted on the same lists, the keyword list's order and first result, without the vector
terms. It separates less well, and an answer a floor cut says relevance came from keywords
alone."""
AGENT_FLOOR = AGENT_RELEVANCE_FLOOR
"""MCP `query`'s default `minRelevance` (qmd/defaults.py, which the CLI's help quotes too)."""

ANCHORS: tuple[tuple[str, str], ...] = (
    (
        "how do I undo the last commit",
        "To undo the most recent commit but keep its changes, run git reset --soft HEAD~1; the files stay staged.",
    ),
    (
        "symptoms of dehydration",
        "Signs of dehydration include thirst, dark urine, dizziness, tiredness and a dry mouth; drink water and rest.",
    ),
    (
        "when was the printing press invented",
        "Johannes Gutenberg built his movable-type printing press in Mainz around 1440.",
    ),
    (
        "set a timeout on an HTTP request",
        "Pass timeout=5 to the client's get() call; it raises a Timeout error when the server has not "
        "answered in five seconds.",
    ),
    (
        "how to repot a houseplant",
        "Water the plant a day before, ease it out of the old pot, loosen the roots and set it in a pot "
        "one size larger with fresh soil.",
    ),
    (
        "what causes inflation",
        "Inflation rises when demand outpaces supply, when production costs climb, or when the money "
        "supply grows faster than output.",
    ),
    (
        "rotate log files every day",
        "Configure logrotate with the daily directive and rotate 7 so each log file is rotated once a day"
        " and a week of old logs is kept.",
    ),
    (
        "rules for a penalty kick",
        "A penalty kick is taken from the penalty mark; every player but the kicker and the goalkeeper "
        "stays outside the area until the ball is kicked.",
    ),
    (
        "reset a forgotten database password",
        "Stop the server, start it with authentication disabled, set a new password for the user with "
        "ALTER USER, then restart it normally.",
    ),
    (
        "how long to bake banana bread",
        "Bake the loaf at 175 C for 55 to 65 minutes, until a skewer in the centre comes out clean.",
    ),
    (
        "meeting notes about the hiring plan",
        "Hiring plan sync: we agreed to open two backend roles this quarter and postpone the designer "
        "hire until the budget review.",
    ),
    (
        "why is the sky blue",
        "Sunlight scatters off air molecules, and short blue wavelengths scatter far more than red ones, "
        "so the sky looks blue.",
    ),
    (
        "list the files in a directory",
        "The ls command lists a directory's contents; ls -la also shows hidden files, permissions and sizes.",
    ),
    (
        "train a dog to sit",
        "Hold a treat above the dog's nose and move it back; as its bottom lowers, say sit and give the "
        "treat. Repeat in short sessions.",
    ),
    (
        "how does a vaccine work",
        "A vaccine shows the immune system a harmless piece or copy of a pathogen, so it makes antibodies"
        " and memory cells in advance.",
    ),
    (
        "parse a date string",
        "Use datetime.strptime(text, '%Y-%m-%d') to turn a string such as 2024-03-01 into a datetime object.",
    ),
)
"""Questions and the passages that answer them, on unrelated topics: an embedder's cosine of
each pair is where it puts relevant text, of the crossed pairs where it puts unrelated text."""


@dataclass(frozen=True)
class Standout:
    """How far a query's best result stands above the mean of the next `STANDOUT_DEPTH` of
    each list (0 for a list of one: nothing to stand above)."""

    keyword: float
    vector: float


NO_STANDOUT = Standout(0.0, 0.0)


def standout(keyword: Iterable[float], vector: Iterable[float]) -> Standout:
    """From one query's keyword scores and its scaled cosines (`CosineScale`), in any order.

    A keyword list is short because the documents it lacks matched nothing: they count 0
    among the next `STANDOUT_DEPTH`. A vector list is as deep as the collection: it is
    measured against what it holds (a list of one has nothing to stand above)."""
    return Standout(_above_the_rest(keyword, absent=0.0), _above_the_rest(vector, absent=None))


def _above_the_rest(scores: Iterable[float], absent: float | None) -> float:
    ranked = sorted(scores, reverse=True)
    if not ranked:
        return 0.0
    rest = ranked[1 : 1 + STANDOUT_DEPTH]
    if absent is not None:
        rest += [absent] * (STANDOUT_DEPTH - len(rest))
    return ranked[0] - sum(rest) / len(rest) if rest else 0.0


@dataclass(frozen=True)
class Evidence:
    """What a hit's relevance is computed from."""

    keyword: float
    """Its keyword score (`LexHit.score`), 0 when no keyword list found it."""
    vector: float | None
    """Its cosine on the embedder's scale (`CosineScale`); None without vector evidence."""
    standout: Standout = NO_STANDOUT
    """Its query's (`standout`); the vector part is read with vector evidence only."""
    held: float = 1.0
    """Its query's share of idf that the collections searched hold (`lexical.Held`; 1 for
    typed lines, which have no text of their own)."""


@dataclass(frozen=True)
class Term:
    """One term of the sum `relevance` passes through the logistic: what `--explain` shows."""

    name: str
    weight: float
    value: float


def terms(e: Evidence) -> tuple[list[Term], float]:
    """The terms `relevance` sums for `e`, and the bias: the one place the formula is written."""
    held_standout = e.standout.keyword * e.held  # a match stands out as far as the question is held
    if e.vector is None:
        return [
            Term("held_keyword", KEYWORD_ONLY_HELD_KEYWORD, e.keyword * e.held),
            Term("held_standout_keyword", KEYWORD_ONLY_HELD_STANDOUT, held_standout),
            Term("held", KEYWORD_ONLY_HELD, e.held),
        ], KEYWORD_ONLY_BIAS
    return [
        Term("keyword", W_KEYWORD, e.keyword),
        Term("vector", W_VECTOR, e.vector),
        Term("held_standout_keyword", W_HELD_STANDOUT_KEYWORD, held_standout),
        Term("standout_vector", W_STANDOUT_VECTOR, e.standout.vector),
        Term("held", W_HELD, e.held),
    ], BIAS


def relevance(e: Evidence) -> float:
    summed, bias = terms(e)
    return _sigmoid(sum(t.weight * t.value for t in summed) + bias)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@dataclass(frozen=True)
class CosineScale:
    """Where an embedder puts related and unrelated text (its mean cosine over `ANCHORS`)."""

    related: float
    unrelated: float

    def __call__(self, cosine: float) -> float:
        return (cosine - self.unrelated) / ((self.related - self.unrelated) or 1.0)


Embed = Callable[[list[str], Literal["query", "document"]], list[list[float]]]
"""An embedder's texts → vectors, as queries or as documents (`EmbedBackend.embed`)."""


class Scales:
    """Each embedder's `CosineScale`, measured on first use (32 short texts) and kept for the
    daemon's life: it depends on the model and its prompt format only (its fingerprint)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, CosineScale] = {}

    def of(self, fingerprint: str, embed: Embed) -> CosineScale:
        with self._lock:
            known = self._known.get(fingerprint)
        if known is not None:
            return known
        q = _unit(embed([a for a, _ in ANCHORS], "query"))
        p = _unit(embed([b for _, b in ANCHORS], "document"))
        cosines = q @ p.T
        n = len(ANCHORS)
        scale = CosineScale(
            related=float(np.trace(cosines)) / n,
            unrelated=float(cosines.sum() - np.trace(cosines)) / (n * n - n),
        )
        with self._lock:
            self._known[fingerprint] = scale
        return scale


def _unit(vectors: list[list[float]]) -> np.ndarray:
    x = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
