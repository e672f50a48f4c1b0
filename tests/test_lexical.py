"""Lex query language and disjunctive BM25 search (server/search/lexical.py), against real SQLite FTS5."""

from __future__ import annotations

import random
import re
import sqlite3
import time
from collections.abc import Iterator
from types import ModuleType

import pytest

from qmd.server.search.lexical import (
    STOP_WORDS,
    LexQuery,
    lex_score,
    norm_cjk,
    parse_lex,
    search_fts,
)

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


# The stdlib SQLite, plus the bundled one the daemon prefers when installed (server/index/db.py):
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
    one = add(conn, "alpha " * 20)
    two = add(conn, "alpha beta and a lot of other words that dilute the document length")
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


def test_ranking_is_exact_not_a_candidate_pool(conn: sqlite3.Connection) -> None:
    """A top-``limit`` OR pool would miss the 2-of-3 document: 30 documents with the first
    item in the title outscore it on bm25. Ranking by items matched must still find it."""
    for i in range(30):
        add(conn, f"zephyr {'zephyr ' * 10} entry {i}", title="zephyr")
    for i in range(60):
        add(conn, f"common words {'quill' if i % 2 else 'ember'} note {i}")
    both = add(conn, "quill and ember " + "padding words " * 100)
    add_filler(conn, 10)
    lq = parse_lex("zephyr quill ember")
    or_pool = [
        r[0]
        for r in conn.execute(
            "SELECT rowid FROM documents_fts WHERE documents_fts MATCH ?"
            " ORDER BY bm25(documents_fts, 1.5, 4.0, 1.0) LIMIT 5",
            (lq.match_any(),),
        )
    ]
    assert both not in or_pool
    hits = search_fts(conn, lq, None, 5)
    assert hits[0].doc_id == both and hits[0].matched == 2
    assert [h.matched for h in hits[1:]] == [1, 1, 1, 1]


def test_negation_applies_to_partial_matches(conn: sqlite3.Connection) -> None:
    keep = add(conn, "alpha note")
    add(conn, "alpha beta gamma but also banned")
    add(conn, "beta banned")
    add_filler(conn)
    hits = search_fts(conn, parse_lex("alpha beta gamma -banned"), None, 10)
    assert [h.doc_id for h in hits] == [keep]
    assert hits[0].matched == 1


def test_bm25_is_the_same_in_and_and_or_queries(conn: sqlite3.Connection) -> None:
    docs = [add(conn, f"alpha beta {'alpha ' * i}words", title="beta" if i % 2 else "") for i in range(6)]
    add(conn, "alpha only here")
    add_filler(conn)
    lq = parse_lex("alpha beta -gamma")
    sql = "SELECT rowid, bm25(documents_fts, 1.5, 4.0, 1.0) FROM documents_fts WHERE documents_fts MATCH ?"
    and_scores = dict(conn.execute(sql, (lq.match_all(),)).fetchall())
    or_scores = dict(conn.execute(sql, (lq.match_any(),)).fetchall())
    assert set(and_scores) == set(docs)
    for doc_id, score in and_scores.items():
        assert or_scores[doc_id] == score
    # search_fts answers from the AND statement when it fills the limit, else from the
    # ranked one: both give the same bm25 for the same document.
    from_and = {h.doc_id: h.bm25 for h in search_fts(conn, lq, None, 3)}
    from_ranked = {h.doc_id: h.bm25 for h in search_fts(conn, lq, None, 50)}
    assert len(from_and) == 3 and len(from_ranked) == 7
    for doc_id, score in from_and.items():
        assert from_ranked[doc_id] == score == and_scores[doc_id]


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
    assert [(h.doc_id, h.matched) for h in search_fts(conn, lq, "small", 2)] == [(two, 2), (one, 1)]
    assert two not in ids(conn, "nebula orion telescope", limit=5)
    assert ids(conn, "nebula", collection="nowhere") == []


# --- score --------------------------------------------------------------------------------


def test_score_formula() -> None:
    assert lex_score(-10.0, 1, 1) == pytest.approx(10 / 11)
    assert lex_score(-2.0, 1, 1) == pytest.approx(2 / 3)
    assert lex_score(-0.5, 1, 1) == pytest.approx(1 / 3)
    assert lex_score(-3.0, 2, 3) == pytest.approx((1 + 0.75) / 3)
    assert lex_score(-1e9, 1, 3) < lex_score(-1e-9, 2, 3)


def test_single_item_score_is_normalised_bm25(conn: sqlite3.Connection) -> None:
    add(conn, "otters otters hold hands")
    add(conn, "otters")
    add_filler(conn)
    for hit in search_fts(conn, parse_lex("otters"), None, 10):
        b = abs(hit.bm25) / (1 + abs(hit.bm25))
        assert hit.bm25 < 0 and hit.total == 1 and hit.score == b


def test_scores_monotone_and_levels_separated(conn: sqlite3.Connection) -> None:
    rng = random.Random(3)
    words = ["alpha", "beta", "gamma", "delta"]
    for _ in range(80):
        body = " ".join(rng.choice(words + FILLER[0].split()) for _ in range(rng.randint(3, 30)))
        add(conn, body)
    add_filler(conn, 5)
    hits = search_fts(conn, parse_lex("alpha beta gamma delta"), None, 200)
    assert len(hits) > 20
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert [h.matched for h in hits] == sorted((h.matched for h in hits), reverse=True)
    for h in hits:
        assert (h.matched - 1) / h.total <= h.score < h.matched / h.total
        assert h.score == lex_score(h.bm25, h.matched, h.total)
    for a, b in zip(hits, hits[1:]):
        if a.matched == b.matched:
            assert a.bm25 <= b.bm25


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
