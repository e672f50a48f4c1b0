"""Lex query language and disjunctive BM25 search (server/search/lexical.py), against real SQLite FTS5."""

from __future__ import annotations

import contextlib
import math
import random
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from conftest import write

from qmd.paths import IndexPaths
from qmd.server.engine import Engine
from qmd.server.ingest import indexer
from qmd.server.search import lexical
from qmd.server.search.lexical import (
    STOP_WORDS,
    Held,
    LexHit,
    LexQuery,
    indexed_rows,
    item_idfs,
    parse_lex,
    ranking_items,
    resolve_prefixes,
    search_fts,
)
from qmd.server.search.pointers import SearchOptions
from qmd.server.store import cores
from qmd.server.store.db import sqlite3 as sqlite_index
from qmd.server.store.fts import FtsDoc, fts_delete, fts_put, repair_fts_totals
from qmd.server.store.fts_tokens import fts5_varints
from qmd.server.store.schema import FTS_TABLE
from qmd.server.store.sqlite import ReadConnection, Store
from qmd.server.text.cjk import norm_cjk

SCHEMA = """
CREATE TABLE documents (id INTEGER PRIMARY KEY AUTOINCREMENT, collection TEXT NOT NULL,
    path TEXT NOT NULL, title TEXT NOT NULL, hash TEXT NOT NULL, active INTEGER NOT NULL DEFAULT 1);
CREATE VIRTUAL TABLE documents_fts USING fts5(filepath, title, body, tokenize='porter unicode61');
"""

# Unrelated documents so that the words under test are rare: FTS5's idf is
# log((N - n + 0.5) / (n + 0.5)) clamped to 1e-6, so a word in half the corpus or more
# contributes (almost) nothing to bm25 and ranking tests would compare noise.
FILLER = [
    "gardening tomatoes compost watering schedule",
    "bread sourdough starter flour hydration",
    "cycling route mountains weather forecast",
    "piano practice scales arpeggios metronome",
    "aquarium filter fish tank cleaning",
    "knitting scarf wool needles pattern",
    "chess opening gambit endgame tactics",
    "coffee roasting beans grinder espresso",
    "camping tent sleeping bag firewood",
    "pottery clay wheel glaze kiln",
    "birdwatching binoculars sparrow heron",
    "woodworking chisel plane dovetail joint",
]


# The stdlib SQLite, plus the bundled one the daemon prefers when installed (server/store/db.py):
# planners and FTS5 differ between versions, and both must behave.
DRIVERS: list[ModuleType] = [sqlite3]
try:
    import pysqlite3.dbapi2 as pysqlite3  # type: ignore[import-not-found]

    DRIVERS.append(pysqlite3)
except ImportError:
    pass


@pytest.fixture(params=DRIVERS, ids=lambda driver: f"sqlite-{driver.sqlite_version}")
def conn(request: pytest.FixtureRequest) -> Iterator[sqlite3.Connection]:
    db = request.param.connect(":memory:")
    db.executescript(SCHEMA)
    yield db
    db.close()


def add(
    db: sqlite3.Connection,
    body: str,
    *,
    title: str = "",
    collection: str = "notes",
    path: str | None = None,
) -> int:
    """Insert one active document the way the indexer does (CJK-normalised title and body)."""
    path = path or f"doc{db.execute('SELECT count(*) FROM documents').fetchone()[0]}.md"
    doc_id = db.execute(
        "INSERT INTO documents (collection, path, title, hash) VALUES (?, ?, ?, ?)",
        (collection, path, title, "h"),
    ).lastrowid
    assert doc_id is not None
    db.execute(
        "INSERT INTO documents_fts (rowid, filepath, title, body) VALUES (?, ?, ?, ?)",
        (doc_id, f"{collection}/{path}", norm_cjk(title), norm_cjk(body)),
    )
    return doc_id


def add_filler(db: sqlite3.Connection, times: int = 2) -> None:
    for _ in range(times):
        for body in FILLER:
            add(db, body, collection="filler")


def match(db: sqlite3.Connection, expr: str) -> list[int]:
    """Rowids a raw FTS5 expression selects (raises on an FTS5 syntax error)."""
    sql = "SELECT rowid FROM documents_fts WHERE documents_fts MATCH ?"
    return [row[0] for row in db.execute(sql, (expr,))]


def ids(db: sqlite3.Connection, query: str, collection: str | None = None, limit: int = 20) -> list[int]:
    return [h.doc_id for h in search_fts(db, parse_lex(query), collection, limit)]


def run_all(db: sqlite3.Connection, lq: LexQuery) -> None:
    """Execute every expression a LexQuery can produce; FTS5 raises on any syntax problem."""
    exprs = [lq.match_any(), lq.match_all(), *(lq.match_item(i) for i in range(len(lq.positives)))]
    for expr in exprs:
        if expr is not None:
            match(db, expr)
    search_fts(db, lq, None, 5)
    search_fts(db, lq, "notes", 5)


# --- norm_cjk ---------------------------------------------------------------------------


def test_norm_cjk_spaces_every_cjk_character() -> None:
    assert norm_cjk("中文") == " 中 文 "
    assert norm_cjk("abc漢字def") == "abc 漢 字 def"
    assert norm_cjk("日本語のテキスト") == " 日 本 語 の テ キ ス ト "
    assert norm_cjk("한국어 텍스트") == " 한 국 어   텍 스 트 "
    assert norm_cjk("𠀀𠀁") == " 𠀀 𠀁 "  # CJK Extension B, outside the BMP


def test_norm_cjk_returns_text_without_cjk_unchanged() -> None:
    for text in ("plain English", "café résumé", "Ελληνικά и русский", "It’s — ok", ""):
        assert norm_cjk(text) is text


def test_norm_cjk_is_fast_on_large_inputs() -> None:
    ascii_text = "The quick brown fox jumps over the lazy dog. " * 2_000_000  # 90 MB
    start = time.perf_counter()
    assert norm_cjk(ascii_text) is ascii_text
    ascii_ms = (time.perf_counter() - start) * 1000
    latin = "Übergrößenträger café naïve résumé " * 300_000  # 10 MB, non-ASCII, no CJK
    start = time.perf_counter()
    assert norm_cjk(latin) is latin
    latin_ms = (time.perf_counter() - start) * 1000
    print(f"\nnorm_cjk: 90 MB ASCII {ascii_ms:.1f} ms, 10 MB Latin-1 {latin_ms:.1f} ms")
    assert ascii_ms < 1000


# --- lex syntax -> FTS5 -----------------------------------------------------------------

TRANSLATIONS = [
    # (input, match_all) — spec §10.1 table, adapted: one phrase per item, dotted and
    # punctuated tokens are single phrases.
    ("foo bar", '"foo"* AND "bar"*'),
    ('"machine learning" -sports', '"machine learning" NOT "sports"*'),
    ('performance -"sports athlete"', '"performance"* NOT "sports athlete"'),
    ("multi-agent memory", '"multi agent" AND "memory"*'),
    ("DEC-0054", '"dec 0054"'),
    ("gpt-4", '"gpt 4"'),
    ("performance -multi-agent", '"performance"* NOT "multi agent"'),
    ('"C++ performance"', '"c performance"'),
    ("hello!world", '"hello world"'),
    ("snake_case", '"snake_case"*'),
    ("Don't", '"don\'t"*'),
    ("2026.4.10", '"2026 4 10"'),
    ("node.js", '"node js"'),
    ("v1.2.3", '"v1 2 3"'),
    ("release v1.2.3-beta", '"release"* AND "v1 2 3 beta"'),
    ('"version 2026.4.10 notes"', '"version 2026 4 10 notes"'),
    ("src/app.py", '"src app py"'),
    ("HELLO World", '"hello"* AND "world"*'),
    ("café", '"café"*'),
    ("漢字", '"漢 字"'),
    ("漢字abc", '"漢 字 abc"'),
    ("機械学習 tutorial", '"機 械 学 習" AND "tutorial"*'),
    ('"東京 tower"', '"東 京 tower"'),
    ("foo -bar -baz", '"foo"* NOT ("bar"* OR "baz"*)'),
    ('foo"bar baz"', '"foo"* AND "bar baz"'),
    ('"unclosed phrase', '"unclosed phrase"'),
    ("foo.", '"foo"*'),
    ("C++", '"c"*'),
]


@pytest.mark.parametrize(("query", "expected"), TRANSLATIONS)
def test_lex_translation(query: str, expected: str) -> None:
    assert parse_lex(query).match_all() == expected


@pytest.mark.parametrize("query", ["-sports -athlete", "", "   ", "-", "--", '-"', '""', "!!! ... ---", "😀🎉"])
def test_unsearchable_queries_give_none(query: str) -> None:
    lq = parse_lex(query)
    assert lq.positives == ()
    assert lq.match_any() is None and lq.match_all() is None


def test_match_any_parenthesises_positives_before_not() -> None:
    lq = parse_lex("alpha beta -gamma")
    assert lq.match_any() == '("alpha"* OR "beta"*) NOT "gamma"*'
    assert lq.match_all() == '"alpha"* AND "beta"* NOT "gamma"*'
    assert lq.match_item(1) == '"beta"*'
    assert parse_lex("alpha -gamma -delta").match_any() == '"alpha"* NOT ("gamma"* OR "delta"*)'


def test_fts5_binds_not_tighter_than_or(conn: sqlite3.Connection) -> None:
    """Why match_any parenthesises: unparenthesised, the negation only guards the last item."""
    only_alpha = add(conn, "alpha gamma")
    add(conn, "beta gamma")
    assert match(conn, "alpha OR beta NOT gamma") == [only_alpha]
    assert match(conn, parse_lex("alpha beta -gamma").match_any() or "") == []


def test_terms_and_item_words() -> None:
    lq = parse_lex('"Machine Learning" multi-agent 漢字 -sports')
    assert lq.terms == ("machine", "learning", "multi", "agent", "漢", "字")
    assert lq.negatives == ('"sports"*',)


def test_marks_are_kept_so_the_tokenizer_splits_query_like_text(conn: sqlite3.Connection) -> None:
    """unicode61 splits Devanagari at vowel signs; dropping the signs would glue a non-word."""
    doc = add(conn, "हिन्दी भाषा सीखें")
    add_filler(conn)
    assert parse_lex("हिन्दी").positives == ('"हिन्दी"*',)
    assert ids(conn, "हिन्दी") == [doc]


# --- stop words ---------------------------------------------------------------------------


def test_stop_words_dropped_when_content_words_remain() -> None:
    lq = parse_lex("how do I raise money for a startup")
    assert lq.positives == ('"raise"*', '"money"*', '"startup"*')
    assert lq.dropped_stopwords == ("how", "do", "i", "for", "a")
    assert lq.terms == ("raise", "money", "startup")


def test_only_stop_words_are_all_kept() -> None:
    lq = parse_lex("The Who")
    assert lq.positives == ('"the"*', '"who"*')
    assert lq.dropped_stopwords == ()


def test_quoted_and_negated_stop_words_are_kept() -> None:
    lq = parse_lex('"the who" live -the concert')
    assert lq.positives == ('"the who"', '"live"*', '"concert"*')
    assert lq.negatives == ('"the"*',)
    assert lq.dropped_stopwords == ()


def test_phrase_or_hyphenated_item_counts_as_content() -> None:
    lq = parse_lex("what is multi-agent")
    assert lq.positives == ('"multi agent"',)
    assert lq.dropped_stopwords == ("what", "is")


def test_negation_alone_does_not_rescue_stop_words() -> None:
    lq = parse_lex("the -cat")
    assert lq.positives == ('"the"*',) and lq.negatives == ('"cat"*',)


def test_stop_list_is_the_intent_list_plus_i_and_a() -> None:
    assert {"i", "a", "the", "how", "which"} <= STOP_WORDS
    # content words a notes search engine needs (the original's intent list drops them)
    assert not {"money", "notes", "search", "find", "show", "need", "want"} & STOP_WORDS


# --- limits and duplicates ---------------------------------------------------------------


def test_duplicates_removed_first_wins() -> None:
    lq = parse_lex("foo Foo FOO bar foo")
    assert lq.positives == ('"foo"*', '"bar"*')
    assert not lq.truncated


def test_truncation_keeps_first_items() -> None:
    words = [f"word{i}" for i in range(40)]
    lq = parse_lex(" ".join(words))
    assert len(lq.positives) == 32 and lq.truncated
    assert lq.positives[0] == '"word0"*' and lq.positives[-1] == '"word31"*'
    assert lq.terms == tuple(words[:32])
    small = parse_lex("alpha beta gamma", max_terms=2)
    assert small.positives == ('"alpha"*', '"beta"*') and small.truncated
    assert not parse_lex("alpha beta", max_terms=2).truncated


def test_stop_words_are_dropped_before_truncation() -> None:
    lq = parse_lex("the a an alpha beta", max_terms=2)
    assert lq.positives == ('"alpha"*', '"beta"*')
    assert not lq.truncated


def test_negatives_are_capped_too() -> None:
    lq = parse_lex("alpha " + " ".join(f"-n{i}" for i in range(50)), max_terms=10)
    assert len(lq.negatives) == 10 and lq.truncated


def test_max_terms_must_be_positive() -> None:
    with pytest.raises(ValueError):
        parse_lex("alpha", max_terms=0)


# --- hostile input: never raises, always valid FTS5 ---------------------------------------

ITEM = re.compile(r'^"[^"]+"\*?$')

HOSTILE = [
    '"unbalanced',
    'unbalanced"',
    '"""',
    '""""',
    '"a" "b',
    "*",
    "**",
    "foo*",
    "*foo",
    "NEAR(",
    "NEAR(a b)",
    "NEAR(a b, 3)",
    "a NEAR b",
    ":",
    "::",
    "title:foo",
    "col:term",
    "body:",
    "^foo",
    "^",
    "-",
    "--",
    "---",
    '-"',
    '-""',
    "- -",
    "-foo-",
    "AND",
    "OR",
    "NOT",
    "AND OR NOT",
    "a AND",
    "OR b",
    "NOT c",
    "foo AND bar",
    "foo OR bar",
    "foo NOT bar",
    "(",
    ")",
    "()",
    "(foo)",
    "(foo OR bar",
    "{}",
    "{title body}: foo",
    "{title}:foo",
    "[]",
    "+",
    "+foo",
    "foo+bar",
    "\\",
    '\\"',
    "'",
    "''",
    "'foo'",
    "%",
    "_",
    "__init__",
    "a'b'c",
    ";DROP TABLE x;--",
    "😀",
    "foo😀bar",
    "👍🏽 thumbs",
    "中文",
    "中文English混合",
    "한국어-텍스트",
    "日本語.テキスト",
    "\x00",
    "foo\x00bar",
    "\x00\x00\x00",
    "\ud800",
    "foo\udfffbar",
    "\t\n\r",
    "\u200b",
    "\u2028foo\u2029",
    "ﷺ",
    "٣.١٤",
    "x" * 10_000,
    "a-" * 3000,
    "." * 5000,
    '"' * 999,
    "ᦰᦱᦲ",
    "a ᦰ",
    "NEAR",
    "near(foo",
    "foo:bar:baz",
    "e.g.",
    "U.S.A.",
    "-foo.bar",
]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_input_is_safe(conn: sqlite3.Connection, query: str) -> None:
    add(conn, "foo bar baz near and or not title body")
    lq = parse_lex(query)
    for expr in (*lq.positives, *lq.negatives):
        assert ITEM.match(expr), expr
    run_all(conn, lq)


def test_random_text_10kb(conn: sqlite3.Connection) -> None:
    add(conn, "foo bar")
    rng = random.Random(7)
    alphabet = "abcXYZ019 \"*-:^(){}+.,;'_\\/!?\t\n中文한국😀\x00"
    for _ in range(5):
        query = "".join(rng.choice(alphabet) for _ in range(10_000))
        run_all(conn, parse_lex(query))


def _random_query(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randint(0, 12)):
        kind = rng.random()
        if kind < 0.3:
            pieces.append(rng.choice("\"-*():^{} .+'_\x00"))
        elif kind < 0.45:
            pieces.append(rng.choice(["AND", "OR", "NOT", "NEAR", "NEAR(", "title:", '-"', "--"]))
        elif kind < 0.7:
            pieces.append("".join(rng.choices("abcdefghij0123456789", k=rng.randint(1, 6))))
        elif kind < 0.85:
            pieces.append("".join(chr(rng.randint(0x20, 0x7E)) for _ in range(rng.randint(1, 6))))
        else:
            # any code point, lone surrogates included
            pieces.append("".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(1, 4))))
    return "".join(pieces)


def test_property_random_strings_never_break_fts5(conn: sqlite3.Connection) -> None:
    for body in ("alpha beta gamma", "abc 012 def", "中 文 混 合", "near and or not"):
        add(conn, body)
    rng = random.Random(20260410)
    for _ in range(3000):
        query = _random_query(rng)
        lq = parse_lex(query)
        for expr in (*lq.positives, *lq.negatives):
            assert ITEM.match(expr), (query, expr)
        run_all(conn, lq)


# --- search: basics -----------------------------------------------------------------------


def test_no_match_is_empty(conn: sqlite3.Connection) -> None:
    add(conn, "alpha beta")
    assert ids(conn, "zebra") == []


def test_keyword_found_and_limit_respected(conn: sqlite3.Connection) -> None:
    docs = [add(conn, f"kubernetes cluster note {i}") for i in range(8)]
    add_filler(conn)
    assert set(ids(conn, "kubernetes")) == set(docs)
    assert len(ids(conn, "kubernetes", limit=3)) == 3
    assert search_fts(conn, parse_lex("kubernetes"), None, 0) == []


def test_unsearchable_query_searches_nothing(conn: sqlite3.Connection) -> None:
    add(conn, "sports athlete")
    add(conn, "chess")
    assert ids(conn, "-sports -athlete") == []
    assert ids(conn, "") == []


def test_negation_excludes(conn: sqlite3.Connection) -> None:
    keep = add(conn, "performance tuning for databases")
    add(conn, "performance of sports athletes")
    add(conn, "performance of a multi-agent system")
    add_filler(conn)
    assert ids(conn, "performance -sports -multi-agent") == [keep]
    assert ids(conn, 'performance -"sports athletes" -multi-agent') == [keep]


def test_prefix_matching(conn: sqlite3.Connection) -> None:
    doc = add(conn, "deploying kubernetes clusters")
    add_filler(conn)
    assert ids(conn, "kube") == [doc]
    assert ids(conn, "deploy") == [doc]
    assert ids(conn, '"kube"') == []  # quoted phrases are exact, no prefix


def test_porter_stemming_real_behaviour(conn: sqlite3.Connection) -> None:
    """Porter stems both sides, prefix included: "running" -> "run" finds "runs". But a prefix
    is matched against stems, so "runn" (its own stem) finds nothing: the index holds "run"."""
    runs = add(conn, "she runs every morning")
    running = add(conn, "running shoes")
    add(conn, "connection pooling")
    add_filler(conn)
    assert sorted(ids(conn, "running")) == [runs, running]
    assert sorted(ids(conn, "runs")) == [runs, running]
    assert ids(conn, "runn") == []
    assert ids(conn, "connections") != []
    assert ids(conn, "connecti") == []


def test_cjk_exact_and_mixed(conn: sqlite3.Connection) -> None:
    zh = add(conn, "我喜欢机器学习和深度学习")
    ja = add(conn, "東京タワーは高い")
    mixed = add(conn, "机器学习 tutorial for beginners")
    add_filler(conn)
    assert sorted(ids(conn, "机器学习")) == [zh, mixed]
    assert ids(conn, "学习机器") == []  # character order matters: it is a phrase
    assert ids(conn, "タワー") == [ja]
    assert ids(conn, "机器学习 tutorial")[0] == mixed
    assert ids(conn, "机器学习tutorial") == [mixed]


def test_english_unaffected_by_cjk_normalisation(conn: sqlite3.Connection) -> None:
    text = "Plain English notes about résumé writing"
    assert norm_cjk(text) is text
    doc = add(conn, text)
    add(conn, "中文 note")
    add_filler(conn)
    assert ids(conn, "resume writing") == [doc]


def test_dotted_versions_and_phrases_with_dots(conn: sqlite3.Connection) -> None:
    rel = add(conn, "Released version 2026.4.10 today")
    add(conn, "Released version 2026.4.11 and 10 more")
    node = add(conn, "Using node.js for scripting")
    add_filler(conn)
    assert ids(conn, "2026.4.10") == [rel]
    assert ids(conn, '"version 2026.4.10"') == [rel]
    assert ids(conn, "2026.4.12") == []
    assert ids(conn, "node.js") == [node]


def test_punctuated_token_matches_its_own_text(conn: sqlite3.Connection) -> None:
    doc = add(conn, "the config lives in src/app.py and says hello!world")
    add_filler(conn)
    assert ids(conn, "src/app.py") == [doc]
    assert ids(conn, "hello!world") == [doc]


def test_title_match_outranks_body_frequency(conn: sqlite3.Connection) -> None:
    titled = add(conn, "a short guide to deployment", title="Kubernetes")
    frequent = add(conn, "kubernetes " * 5 + "setup and more words about it")
    add_filler(conn)
    assert ids(conn, "kubernetes") == [titled, frequent]


# --- search: disjunctive ranking ----------------------------------------------------------


def test_all_terms_beat_one_term_repeated(conn: sqlite3.Connection) -> None:
    spam = add(conn, "quantum " * 50)
    both = add(conn, "quantum computing basics")
    add_filler(conn)
    hits = search_fts(conn, parse_lex("quantum computing"), None, 10)
    assert [h.doc_id for h in hits] == [both, spam]
    assert [(h.matched, h.total) for h in hits] == [(2, 2), (1, 2)]


def test_more_items_matched_ranks_higher(conn: sqlite3.Connection) -> None:
    """Among documents alike but for the items they hold, more items rank higher. (BM25
    still lets a very short document repeating one word beat a long one holding two.)"""
    one = add(conn, "alpha and a few other words in a note")
    two = add(conn, "alpha beta and a few other words in a note")
    add_filler(conn)
    hits = search_fts(conn, parse_lex("alpha beta gamma"), None, 10)
    assert [h.doc_id for h in hits] == [two, one]
    assert [h.matched for h in hits] == [2, 1]


def test_partial_matches_are_returned_for_questions(conn: sqlite3.Connection) -> None:
    doc = add(conn, "How we raise money for an early startup: a seed round checklist")
    other = add(conn, "Money management basics")
    add_filler(conn)
    hits = search_fts(conn, parse_lex("how do I raise money for a startup"), None, 10)
    assert [h.doc_id for h in hits] == [doc, other]
    assert [h.matched for h in hits] == [3, 1]


def test_rare_items_outrank_common_ones(conn: sqlite3.Connection) -> None:
    """Where "most items matched first" and BM25 disagree: three common words against the
    two rare words that matter. BM25 puts the rare pair first."""
    for i in range(40):
        add(conn, f"report about the system design and process number {i}")
    common = add(conn, "system design process overview")
    rare = add(conn, "zephyrine quillwort")
    add_filler(conn, 5)
    hits = search_fts(conn, parse_lex("system design process zephyrine quillwort"), None, 10)
    assert hits[0].doc_id == rare and hits[0].matched == 2
    assert common in [h.doc_id for h in hits[1:]]
    assert next(h for h in hits if h.doc_id == common).matched == 3


def test_ranking_is_exact_bm25_over_the_disjunction(conn: sqlite3.Connection) -> None:
    """The hits are exactly the top `limit` of the OR statement under bm25, in its order,
    scoped inside SQL: no candidate pool to fall out of."""
    rng = random.Random(5)
    words = ["zephyr", "quill", "ember", "lantern"]
    for i in range(120):
        body = " ".join(rng.choice(words + FILLER[i % len(FILLER)].split()) for _ in range(rng.randint(3, 40)))
        add(conn, body, collection="a" if i % 3 else "b")
    add_filler(conn, 10)
    lq = resolve_prefixes(conn, parse_lex("zephyr quill ember -lantern"))
    sql = (
        "SELECT documents_fts.rowid FROM documents_fts JOIN documents ON documents.id = documents_fts.rowid"
        " WHERE documents_fts MATCH ? AND (? IS NULL OR collection = ?)"
        " ORDER BY bm25(documents_fts, 1.5, 4.0, 1.0), documents_fts.rowid LIMIT ?"
    )
    for collection in (None, "b"):
        for limit in (1, 7, 50):
            expected = [r[0] for r in conn.execute(sql, (lq.match_any(), collection, collection, limit))]
            assert ids(conn, "zephyr quill ember -lantern", collection, limit) == expected


def test_negation_applies_to_partial_matches(conn: sqlite3.Connection) -> None:
    keep = add(conn, "alpha note")
    add(conn, "alpha beta gamma but also banned")
    add(conn, "beta banned")
    add_filler(conn)
    hits = search_fts(conn, parse_lex("alpha beta gamma -banned"), None, 10)
    assert [h.doc_id for h in hits] == [keep]
    assert hits[0].matched == 1


def test_equal_scores_tie_break_by_doc_id(conn: sqlite3.Connection) -> None:
    first = add(conn, "identical text about otters")
    second = add(conn, "identical text about otters")
    add_filler(conn)
    hits = search_fts(conn, parse_lex("otters"), None, 10)
    assert [h.doc_id for h in hits] == [first, second]
    assert hits[0].score == hits[1].score


# --- collections --------------------------------------------------------------------------


def test_collection_filter_is_inside_sql_no_starvation(conn: sqlite3.Connection) -> None:
    for i in range(300):
        add(conn, f"nebula nebula nebula report {i}", title="nebula", collection="big")
    small = add(conn, "a long note that mentions a nebula once among many other words " * 3, collection="small")
    add_filler(conn, 30)
    assert small not in ids(conn, "nebula", limit=5)
    assert ids(conn, "nebula", collection="small", limit=5) == [small]
    big = ids(conn, "nebula", collection="big", limit=5)
    assert len(big) == 5 and small not in big


def test_collection_filter_on_partial_matches(conn: sqlite3.Connection) -> None:
    for i in range(300):
        add(conn, f"nebula nebula orion report {i}", title="nebula orion", collection="big")
    two = add(conn, "a nebula photo near orion, among many other words " * 3, collection="small")
    one = add(conn, "a telescope", collection="small")
    add_filler(conn, 30)
    lq = parse_lex("nebula orion telescope")
    # "telescope" is in one document, "nebula" and "orion" in 301: the rare word ranks first.
    assert [(h.doc_id, h.matched) for h in search_fts(conn, lq, "small", 2)] == [(one, 1), (two, 2)]
    assert two not in ids(conn, "nebula orion telescope", limit=5)
    assert ids(conn, "nebula", collection="nowhere") == []


# --- score --------------------------------------------------------------------------------


def idf(conn: sqlite3.Connection, expr: str) -> float:
    """FTS5's idf of one item, from a plain count: what the score's normaliser must equal."""
    n = conn.execute("SELECT count(*) FROM documents_fts WHERE documents_fts MATCH ?", (expr,)).fetchone()[0]
    rows = conn.execute("SELECT count(*) FROM documents").fetchone()[0]
    value = math.log((rows - n + 0.5) / (n + 0.5))
    return value if value > 0 else 1e-6


def test_score_is_bm25_over_the_attainable(conn: sqlite3.Connection) -> None:
    rng = random.Random(3)
    words = ["alpha", "beta", "gamma", "delta"]
    for _ in range(80):
        body = " ".join(rng.choice(words + FILLER[0].split()) for _ in range(rng.randint(3, 30)))
        add(conn, body, title=rng.choice(["", "alpha", "beta gamma"]))
    add_filler(conn, 5)
    lq = resolve_prefixes(conn, parse_lex("alpha beta gamma delta"))
    attainable = 2.2 * sum(idf(conn, expr) for expr in lq.positives)
    hits = search_fts(conn, lq, None, 200)
    assert len(hits) > 20
    assert [h.bm25 for h in hits] == sorted(h.bm25 for h in hits)
    for h in hits:
        assert h.score == pytest.approx(abs(h.bm25) / attainable)
        assert 0 < h.score < 1
        have = sum(
            bool(
                conn.execute(
                    "SELECT 1 FROM documents_fts WHERE documents_fts MATCH ? AND rowid = ?", (expr, h.doc_id)
                ).fetchone()
            )
            for expr in lq.positives
        )
        assert h.matched == have and h.total == 4


def test_k1_is_reached_through_the_column_weights(conn: sqlite3.Connection) -> None:
    """FTS5 fixes k1 at 1.2; `Bm25(k1=...)` scales the column weights instead, which ranks as
    textbook bm25 at that k1: every hit's raw bm25 is the textbook's times (1.2 + 1) / (k1 + 1),
    computed here from the lengths FTS5 records. The score stays a share of the attainable."""
    for i in range(40):
        words = ["alpha"] * (i % 5) * (i % 3 == 0) + ["beta"] * (i % 4 == 1) + ["gamma", "gamma"] * (i % 10 == 7)
        words += ["filler"] * (1 + i * 7 % 23)
        add(conn, " ".join(words))
    lengths = {doc: sum(fts5_varints(sz)) for doc, sz in conn.execute("SELECT id, sz FROM documents_fts_docsize")}
    avgdl = sum(lengths.values()) / len(lengths)
    idfs = {word: idf(conn, f'"{word}"') for word in ("alpha", "beta", "gamma")}

    def textbook(doc: int, k1: float) -> float:
        body = conn.execute("SELECT body FROM documents_fts WHERE rowid = ?", (doc,)).fetchone()
        counts = {word: (body[0].split().count(word) if body else 0) for word in idfs}
        norm = k1 * (1 - 0.75 + 0.75 * lengths[doc] / avgdl)
        return sum(idfs[w] * f * (k1 + 1) / (f + norm) for w, f in counts.items())

    lq = resolve_prefixes(conn, parse_lex("alpha beta gamma"))
    for k1 in (1.2, 2.0, 3.0):
        hits = search_fts(conn, lq, None, 100, bm25=lexical.Bm25(k1=k1))
        assert len(hits) == len(match(conn, "alpha OR beta OR gamma")) > 15
        for h in hits:
            assert abs(h.bm25) == pytest.approx(textbook(h.doc_id, k1) * 2.2 / (k1 + 1), rel=1e-9)
            assert 0 < h.score < 1
    with pytest.raises(ValueError, match="FTS5 fixes bm25's b"):
        search_fts(conn, lq, None, 10, bm25=lexical.Bm25(b=0.5))


def test_a_word_no_document_holds_leaves_the_scores_alone(conn: sqlite3.Connection) -> None:
    doc = add(conn, "deployment checklist for kubernetes clusters")
    add_filler(conn)
    plain = search_fts(conn, parse_lex("kubernetes deployment"), None, 1)[0]
    typo = search_fts(conn, parse_lex("kubernetes deployment zzqxv"), None, 1)[0]
    assert plain.doc_id == typo.doc_id == doc
    assert typo.score == pytest.approx(plain.score)
    assert (typo.matched, typo.total) == (2, 3)


def by_bm25(conn: sqlite3.Connection, expression: str, limit: int) -> list[int]:
    """Every document `expression` matches, by a plain ORDER BY bm25: no first pass."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT rowid FROM documents_fts WHERE documents_fts MATCH ?"
            " ORDER BY bm25(documents_fts, 1.5, 4.0, 1.0), rowid LIMIT ?",
            (expression, limit),
        )
    ]


def test_maxscore_first_pass_is_exact(conn: sqlite3.Connection) -> None:
    """Long queries over a corpus where common and rare items mix: the ranked list equals a
    plain ORDER BY bm25 over the documents holding a rarer item, then over those holding only
    the items most documents hold (`ranking_items`), whichever pass answered."""
    rng = random.Random(9)
    common, rare = ["river", "stone", "market", "lamp"], ["quasar", "ferrule", "gimbal"]
    for i in range(400):
        words = rng.choices(common, k=rng.randint(1, 12)) + (
            rng.choices(rare, k=rng.randint(1, 3)) if i % 7 == 0 else []
        )
        add(conn, " ".join(words + FILLER[i % len(FILLER)].split()))
    lq = resolve_prefixes(conn, parse_lex("river stone market lamp quasar ferrule gimbal"))
    counts = [
        conn.execute("SELECT count(*) FROM documents_fts WHERE documents_fts MATCH ?", (e,)).fetchone()[0]
        for e in lq.positives
    ]
    ranked, tail = ranking_items(item_idfs(counts, indexed_rows(conn)))
    assert [lq.positives[i] for i in tail] == ['"river"', '"stone"', '"market"', '"lamp"']
    first, then = lq.of_items(ranked).match_any(), lq.of_items(tail, excluding=ranked).match_any()
    assert first is not None and then is not None
    for limit in (1, 5, 20, 60, 400):
        expected = by_bm25(conn, first, limit)
        expected += by_bm25(conn, then, limit - len(expected))
        assert [h.doc_id for h in search_fts(conn, lq, None, limit)] == expected
    assert len(search_fts(conn, lq, None, 1000)) == len(by_bm25(conn, lq.match_any() or "", 1000)) == 400


def test_items_most_documents_hold_follow_the_others(conn: sqlite3.Connection) -> None:
    """A word in most documents does not rank beside a rarer one (its idf is clamped to
    1e-6): the rarer word's documents come first, by it alone, and those holding only the
    common word follow; the same documents are found. Alone, the common word ranks."""
    rare_once = add(conn, "river otters river river")
    rare_twice = add(conn, "otters otters, and a river")
    rest = [add(conn, f"the river flows past stone {i}") for i in range(3)]
    add(conn, "nothing to see")
    hits = search_fts(conn, parse_lex("river otters"), None, 10)
    assert [h.doc_id for h in hits][:2] == [rare_twice, rare_once]
    assert sorted(h.doc_id for h in hits[2:]) == rest
    assert all(h.score < 1e-5 for h in hits[2:]) and hits[1].score > 0.1
    assert [h.matched for h in hits] == [2, 2, 1, 1, 1]
    assert len(search_fts(conn, parse_lex("river otters"), None, 2)) == 2
    assert {h.doc_id for h in search_fts(conn, parse_lex("river"), None, 10)} == {rare_once, rare_twice, *rest}


def test_a_ranking_in_halves_is_the_whole_ranking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a second connection at hand, a large ranking runs as two rowid halves at once
    (`_Halves`): the hits, their order and their bm25 to the bit are the whole statement's,
    for first passes and full ones, scoped, with negations and common items; and a search
    that finds the other half's thread taken runs whole, with the same answer."""
    db = sqlite_index.connect(str(tmp_path / "halves.sqlite"), isolation_level=None)
    db.executescript(SCHEMA)
    rng = random.Random(12)
    words = ["river", "stone", "market", "lamp", "quasar", "ferrule", "gimbal", "otter", "cedar", "basalt"]
    for i in range(600):
        body = " ".join(rng.choices(words, weights=[40, 30, 20, 10, 3, 2, 2, 5, 4, 1], k=rng.randint(3, 30)))
        add(db, body, title=rng.choice(words), collection="a" if i % 3 else "b")
    other = sqlite_index.connect(str(tmp_path / "halves.sqlite"), check_same_thread=False)

    @contextlib.contextmanager
    def beside() -> Iterator[sqlite3.Connection]:
        yield other

    upper = []
    monkeypatch.setattr(lexical, "HALVES_FROM", 1)
    monkeypatch.setattr(cores, "_FREE", threading.Semaphore(1))  # one helper, as on 2 cores
    monkeypatch.setattr(lexical._Halves, "_upper", lambda self, *a: upper.append(1) or halves_upper(self, *a))  # noqa: SLF001
    queries = ["quasar river", "otter cedar basalt stone market", "lamp -river", "gimbal ferrule quasar otter", "river"]
    for query in queries:
        lq = resolve_prefixes(db, parse_lex(query))
        for collection in (None, "b"):
            for limit in (1, 7, 50, 600):
                whole = search_fts(db, lq, collection, limit)
                assert search_fts(db, lq, collection, limit, beside=beside) == whole
                assert cores._FREE.acquire(blocking=False)  # noqa: SLF001 - another search's half
                try:
                    assert search_fts(db, lq, collection, limit, beside=beside) == whole
                finally:
                    cores._FREE.release()  # noqa: SLF001
    assert len(upper) >= 2 * len(queries) * 4
    upper.clear()
    with cores.sharing():  # a hybrid query's legs already run side by side
        assert search_fts(db, parse_lex("quasar river"), None, 50, beside=beside) == search_fts(
            db, parse_lex("quasar river"), None, 50
        )
    assert upper == []
    other.close()
    db.close()


halves_upper = lexical._Halves._upper  # noqa: SLF001


def test_small_corpus_scores_are_not_zero(conn: sqlite3.Connection) -> None:
    """Three documents, a word in two of them: FTS5 clamps its idf to 1e-6, so the original's
    |bm25|/(1+|bm25|) scores both hits 0.00 and any --min-score drops them. Ours divides the
    clamp out: the hits score by how often and where they hold the word."""
    often = add(conn, "otters otters otters", title="otters")
    once = add(conn, "a note that mentions otters once among other words")
    add(conn, "nothing relevant")
    hits = search_fts(conn, parse_lex("otters"), None, 10)
    assert [h.doc_id for h in hits] == [often, once]
    assert hits[0].score > 0.5 and 0.1 < hits[1].score < hits[0].score


def test_score_is_independent_of_corpus_size(conn: sqlite3.Connection) -> None:
    """The same document against the same query scores alike in a small and a large corpus."""
    doc = add(conn, "deployment checklist for kubernetes clusters", title="Deployment")
    add_filler(conn, 2)
    small = search_fts(conn, parse_lex("kubernetes deployment"), None, 1)[0]
    add_filler(conn, 40)
    large = search_fts(conn, parse_lex("kubernetes deployment"), None, 1)[0]
    assert small.doc_id == large.doc_id == doc
    assert abs(small.score - large.score) < 0.1
    assert abs(small.bm25) < abs(large.bm25)  # the raw bm25 grows with the corpus


def test_indexed_rows_reads_what_bm25_counts() -> None:
    """`indexed_rows` counts FTS5's docsize table; held to a plain count on the index's own
    table (contentless, with deletes, in and out of a transaction) so a change fails here."""
    db = sqlite_index.connect(":memory:")
    db.execute(FTS_TABLE)
    assert indexed_rows(db) == 0
    for i in range(1, 301):
        db.execute("INSERT INTO documents_fts (rowid, filepath, title, body) VALUES (?, 'p', 't', 'word')", (i,))
    assert indexed_rows(db) == 300
    for i in range(1, 301, 3):
        db.execute("DELETE FROM documents_fts WHERE rowid = ?", (i,))
    assert (
        indexed_rows(db)
        == 200
        == db.execute("SELECT count(*) FROM documents_fts WHERE documents_fts MATCH 'word'").fetchone()[0]
    )
    db.execute("INSERT INTO documents_fts (rowid, filepath, title, body) VALUES (100000, 'p', 't', 'word')")
    assert indexed_rows(db) == 201


def test_long_queries_search_words_exactly_unless_partial(conn: sqlite3.Connection) -> None:
    """A word in a long query is its exact stem: `cell` no longer finds `cellar`. A partial
    word, which no document holds exactly, stays a prefix; short queries keep prefixes."""
    cell = add(conn, "cell biology notes")
    cellar = add(conn, "wine cellar inventory")
    kube = add(conn, "kubernetes growth metrics")
    add_filler(conn)
    long = resolve_prefixes(conn, parse_lex("cell growth kube metrics"))
    assert long.positives == ('"cell"', '"growth"', '"kube"*', '"metrics"')
    assert cellar not in ids(conn, "cell growth kube metrics")
    assert set(ids(conn, "cell growth kube metrics")) == {cell, kube}
    assert resolve_prefixes(conn, parse_lex("cell")).positives == ('"cell"*',)
    assert set(ids(conn, "cell")) == {cell, cellar}


def test_a_letter_no_document_holds_is_not_a_prefix_in_a_long_query(conn: sqlite3.Connection) -> None:
    """`"d"*` would find every document with a word in d, and score it as if it held the
    query where nothing holds the rest (`vitamin d` asked of notes on data design)."""
    add(conn, "data design decisions")
    add_filler(conn)
    assert resolve_prefixes(conn, parse_lex("symptoms of vitamin d deficiency")).positives == (
        '"symptoms"*',
        '"vitamin"*',
        '"d"',
        '"deficiency"*',
    )
    assert ids(conn, "symptoms of vitamin d deficiency") == []
    two = resolve_prefixes(conn, parse_lex("which db package to open")).positives
    assert '"db"*' in two  # two letters stay a partial word: `db` finds `dbm`
    assert resolve_prefixes(conn, parse_lex("vitamin d")).positives == ('"vitamin"*', '"d"*')  # typed partly: a prefix


def test_held_is_the_idf_of_what_some_document_in_scope_holds() -> None:
    def held(counts: list[int], rows: int, present: list[bool] | None = None) -> Held:
        return Held.of(parse_lex(" ".join(f"w{i}" for i in range(len(counts)))), counts, rows, present)

    def share(counts: list[int], rows: int, present: list[bool] | None = None) -> float:
        return held(counts, rows, present).share

    assert share([3, 10], 100) == 1.0 and share([], 100) == 1.0
    assert share([0, 0], 100) == 0.0
    absent = math.log(100.5 / 0.5)
    rare = math.log((100 - 1 + 0.5) / 1.5)
    assert share([1, 0], 100) == pytest.approx(rare / (rare + absent))
    # a word most documents hold weighs next to nothing either way
    assert share([90, 0], 100) == pytest.approx(0.0, abs=1e-6)
    assert share([0], 0) == 0.0  # an empty index holds nothing
    # an item the index holds only outside the scope is left out of the share, at its idf
    assert share([1, 1], 100, [True, False]) == pytest.approx(0.5)
    assert share([1, 10], 100, [False, True]) == pytest.approx(math.log(90.5 / 10.5) / (rare + math.log(90.5 / 10.5)))
    assert share([1, 0], 100, [True, True]) == share([1, 0], 100)  # a count of 0 is never held
    # two collections searched hold what either holds
    one, other = held([1, 1], 100, [True, False]), held([1, 1], 100, [False, True])
    assert (one | other).share == 1.0 and (one | other) == held([1, 1], 100)


def test_every_hit_carries_how_much_of_the_query_the_index_holds(conn: sqlite3.Connection) -> None:
    """The score leaves out a word no document holds; `held` says how much was left out."""
    doc = add(conn, "the rules of the game", title="rules")
    add_filler(conn)
    full = search_fts(conn, parse_lex("rules game"), None, 5)
    part = search_fts(conn, parse_lex("rules of blitzchess castlings"), None, 5)
    assert full[0].doc_id == part[0].doc_id == doc
    assert all(h.held.share == 1.0 for h in full) and all(0.0 < h.held.share < 0.5 for h in part)
    assert part[0].score == pytest.approx(search_fts(conn, parse_lex("rules"), None, 5)[0].score)  # left out


def test_held_is_read_over_the_collection_searched(conn: sqlite3.Connection) -> None:
    """A word the index holds only in another collection is, to a search of this one, a
    word no document holds: found among the hits, or looked for where the list is full."""
    rules = add(conn, "the rules of the game", title="rules", collection="games")
    add(conn, "castling moves the king two squares", title="chess", collection="chess")
    add_filler(conn)
    query = parse_lex("rules castling")
    whole = search_fts(conn, query, None, 5)[0].held
    games, chess = (search_fts(conn, query, name, 5)[0].held for name in ("games", "chess"))
    assert whole.present == (True, True) and whole.share == 1.0
    assert games.present == (True, False) and chess.present == (False, True) and games.share < 0.6
    assert games | chess == whole
    assert games.elsewhere() == ("castling",) and whole.elsewhere() == () == (games | chess).elsewhere()
    assert games.nowhere_in_scope().elsewhere() == ("rules", "castling")
    negated = search_fts(conn, parse_lex("rules castling -openings"), "games", 5)[0].held
    assert negated.present == (True, False) and negated.elsewhere() == ()  # a negation may have left holders out
    assert search_fts(conn, query, "games", 1)[0].held == games  # a full list: castling looked for
    assert search_fts(conn, query, "filler", 5) == []
    add(conn, "after castling, the rook stands beside the king in a long note about openings", collection="games")
    for limit in (1, 5):  # now held by a second note of the games, found or looked for
        hits = search_fts(conn, query, "games", limit)
        assert hits[0].doc_id == rules and hits[0].held.present == (True, True)
    hits = search_fts(conn, parse_lex("rules castling -rook"), "games", 5)  # left out by the negation, still held
    assert [h.doc_id for h in hits] == [rules] and hits[0].held.present == (True, True)
    # a quoted word and the same word plain are one item once the prefix is made exact
    twice = search_fts(conn, parse_lex('the "castling" rules of castling openings'), "chess", 5)[0].held
    assert len(twice.items) == len(twice.present) == 3 and twice.elsewhere() == ("rules", "openings")


# --- timing (printed, not asserted) -------------------------------------------------------


def test_timing_sanity_5k_docs(conn: sqlite3.Connection) -> None:
    rng = random.Random(11)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(5000)]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    for i in range(5000):
        add(
            conn,
            " ".join(rng.choices(vocab, weights, k=150)),
            title=" ".join(rng.choices(vocab, weights, k=4)),
            collection="big" if i % 10 else "small",
        )
    conn.commit()
    queries = {
        "one common word": vocab[1],
        "two rare words": f"{vocab[900]} {vocab[1500]}",
        "common + rare": f"{vocab[2]} {vocab[40]} {vocab[3000]}",
        "question": f"how do I {vocab[10]} {vocab[400]} for a {vocab[2500]}",
    }
    print()
    for label, query in queries.items():
        lq = parse_lex(query)
        for collection in (None, "small"):
            start = time.perf_counter()
            for _ in range(5):
                hits = search_fts(conn, lq, collection, 20)
            ms = (time.perf_counter() - start) / 5 * 1000
            scope = f"collection={collection!s:5}"
            print(f"search_fts 5k docs, {label:16} {scope}: {ms:6.2f} ms, {len(hits)} hits")


def test_bm25_after_edits_and_removals_equals_a_fresh_index(tmp_path: Path) -> None:
    """FTS5's contentless-delete tables keep their totals (bm25's N and average lengths)
    through a DELETE; the store repairs them after each write, so an index that saw edits
    ranks and scores exactly like one built from scratch."""
    docs = ["alpha beta gamma", "alpha delta", "beta beta epsilon", "gamma zeta", "eta theta alpha"]
    fresh, edited = Store(tmp_path / "fresh.sqlite"), Store(tmp_path / "edited.sqlite")
    try:
        fresh.write(lambda c: fts_put(c, [FtsDoc(i + 1, "c", "p", "", d, f"h{i}") for i, d in enumerate(docs)]))
        edited.write(
            lambda c: fts_put(c, [FtsDoc(i + 1, "c", "p", "", "old words " * (i + 1), "old") for i in range(8)])
        )
        edited.write(lambda c: fts_delete(c, list(range(1, 9))))
        edited.write(lambda c: fts_put(c, [FtsDoc(i + 11, "c", "p", "", d, f"h{i}") for i, d in enumerate(docs)]))
        edited.write(lambda c: fts_put(c, [FtsDoc(13, "c", "p", "", docs[2], "h2")]))  # an edit: delete and insert
        sql = "SELECT bm25(documents_fts, 1.5, 4.0, 1.0) FROM documents_fts WHERE documents_fts MATCH ? ORDER BY rowid"
        for query in ('"alpha" OR "gamma"', '"beta"'):
            with fresh.read() as a, edited.read() as b:
                assert [r[0] for r in a.execute(sql, (query,))] == pytest.approx(
                    [r[0] for r in b.execute(sql, (query,))]
                )
        with edited.read() as b:
            assert repair_fts_totals(b) is False  # nothing left to repair
    finally:
        fresh.close()
        edited.close()


def test_idf_survives_counts_read_across_a_write() -> None:
    """`indexed_rows` and an item's count are separate reads; a write between them can make
    the count exceed the rows. The idf is then the clamp, never a math domain error."""
    from qmd.server.search.lexical import _idf

    assert _idf(12, 10) == 1e-6 and _idf(0, 0) == 0.0 and _idf(1, 1000) > 6


def test_a_hit_whose_items_all_read_no_documents_still_scores() -> None:
    """A write between the item counts and the ranking can leave every idf 0 for a hit the
    ranking found (a 500 once, in test_load's sixteen clients): the score is in [0, 1], never
    a division by zero."""
    from qmd.server.search.lexical import hit_score

    assert hit_score(-3.2, [0.0, 0.0]) == 1.0 and 0 < hit_score(-0.5, [1.2, 0.8]) < 1


def test_reading_connection_keeps_counts_until_the_index_changes(tmp_path: Path) -> None:
    """A reader keeps each item's document count between searches (`ReadConnection.memo`),
    and a commit by another connection empties it: the scores after a write are a fresh
    connection's, to the last bit. Inside a transaction nothing is kept."""
    path = tmp_path / "index.sqlite"
    writer = sqlite_index.connect(str(path), isolation_level=None)
    writer.executescript(SCHEMA)
    for body in ("otters in rivers", "otters again", "rivers without them"):
        add(writer, body)
    add_filler(writer, 3)
    reader = sqlite_index.connect(str(path), isolation_level=None, factory=ReadConnection)
    reader.execute("PRAGMA query_only = 1")

    def fresh(query: str) -> list[LexHit]:
        other = sqlite_index.connect(str(path))
        try:
            return search_fts(other, parse_lex(query), None, 10)
        finally:
            other.close()

    before = search_fts(reader, parse_lex("otters rivers"), None, 10)
    assert before == fresh("otters rivers")
    memo = reader.memo()
    assert memo is not None and memo['"otters"*'] == 2
    for _ in range(4):
        add(writer, "otters everywhere")
    after = search_fts(reader, parse_lex("otters rivers"), None, 10)
    assert after == fresh("otters rivers") and after != before
    memo = reader.memo()
    assert memo is not None and (memo['"otters"*'], memo['"rivers"*']) == (6, 2)
    reader.execute("BEGIN")
    assert reader.memo() is None
    reader.execute("COMMIT")
    reader.close()
    writer.close()


def test_a_search_of_every_collection_is_one_ranking_of_the_index(tmp_path: Path) -> None:
    """Collections that hold every active document are searched as the whole index, with no
    scope test, and the same hits as collection by collection; that knowledge is dropped
    with the index's next change, so a collection added later is never searched unasked."""
    engine = Engine(IndexPaths("test", tmp_path / "index.sqlite", tmp_path / "index.yml", tmp_path))
    try:
        notes = {f"n{i}.md": f"# Note {i}\n\nOtters and rivers, note {i}.\n" for i in range(6)}
        engine.create_collection(str(write(tmp_path / "a", notes)), name="a")
        engine.update()
        first = engine.search("otters rivers", SearchOptions(collections=["a"], limit=10))
        assert len(first.hits) == 6
        engine.create_collection(str(write(tmp_path / "b", {"b.md": "# B\n\nOtters, otters, rivers.\n"})), name="b")
        engine.update()
        only_a = engine.search("otters rivers", SearchOptions(collections=["a"], limit=10))
        assert {h.doc.collection for h in only_a.hits} == {"a"} and len(only_a.hits) == 6
        both = engine.search("otters rivers", SearchOptions(collections=["a", "b"], limit=10))
        one_by_one = sorted(
            (
                h
                for name in ("a", "b")
                for h in engine.search("otters rivers", SearchOptions(collections=[name], limit=10)).hits
            ),
            key=lambda h: -h.score,
        )
        assert [(h.doc.file, h.score) for h in both.hits] == [(h.doc.file, h.score) for h in one_by_one]
    finally:
        engine.close()


@pytest.mark.sqlite_only("FTS5 keeps segments; Postgres' postings are one table, with nothing to merge")
def test_a_large_indexing_pass_leaves_the_keyword_index_in_one_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that changed a tenth of the documents or more merges FTS5's segments into one
    b-tree (a search reads every segment); a smaller one leaves them. Rankings and scores are
    the same, to the last bit, either way."""
    monkeypatch.setattr(indexer, "BATCH_FILES", 5)  # a transaction, so a segment, per 5 files
    engine = Engine(IndexPaths("test", tmp_path / "index.sqlite", tmp_path / "index.yml", tmp_path))

    def segments() -> int:
        with engine.store.read() as conn:
            return int(conn.execute("SELECT count(DISTINCT segid) FROM documents_fts_idx").fetchone()[0])

    def ranked() -> list[tuple[str, float]]:
        return [(h.doc.file, h.score) for h in engine.search("otters rivers", SearchOptions(limit=50)).hits]

    try:
        notes = {f"n{i}.md": f"# Note {i}\n\nOtters{' and rivers' * (i % 4)}, note {i}.\n" for i in range(60)}
        root = write(tmp_path / "notes", notes)
        engine.create_collection(str(root), name="notes")
        engine.update()
        assert segments() == 1
        merged = ranked()
        write(root, {"n0.md": "# Note 0\n\nOtters, edited.\n", "n1.md": "# Note 1\n\nRivers, edited.\n"})
        engine.update()
        assert segments() == 2  # 2 of 60 changed: the new segment stays
        write(root, {"n0.md": notes["n0.md"], "n1.md": notes["n1.md"]})
        engine.update()
        assert segments() == 3 and ranked() == merged
        assert not engine.store.merge_keyword_segments(0)
    finally:
        engine.close()
