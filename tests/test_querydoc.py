"""Query documents (spec §11): the grammar, every error message verbatim, and the caps."""

from __future__ import annotations

import re

import pytest

from qmd.server.errors import InvalidInput
from qmd.server.search.querydoc import (
    MAX_LINE_CHARS,
    MAX_SEARCHES,
    QueryDoc,
    SubQuery,
    parse_query,
    typed_query,
    validate_searches,
    validate_subquery,
)


def error(text: str, intent: str | None = None) -> str:
    with pytest.raises(InvalidInput) as exc:
        parse_query(text, intent)
    return exc.value.message


def test_plain_single_line_is_an_expand_query() -> None:
    assert parse_query("  how do we rotate api keys  ") == QueryDoc(mode="expand", query="how do we rotate api keys")


def test_unknown_prefix_on_a_single_line_is_plain_text() -> None:
    assert parse_query("note: rotate keys") == QueryDoc(mode="expand", query="note: rotate keys")


@pytest.mark.parametrize(
    "text", ["expand: rotate api keys", "EXPAND:rotate api keys", "\n\n  Expand:   rotate api keys "]
)
def test_expand_prefix_is_stripped(text: str) -> None:
    # The original searched for the literal "expand: ..." (§26).
    assert parse_query(text) == QueryDoc(mode="expand", query="rotate api keys")


def test_typed_document_keeps_order_types_and_line_numbers() -> None:
    doc = parse_query('\nlex: "connection pool" timeout -redis\n\nVEC: why do connections time out\nHyde:  A pool.  \n')
    assert doc.mode == "typed"
    assert doc.searches == (
        SubQuery("lex", '"connection pool" timeout -redis', 2),
        SubQuery("vec", "why do connections time out", 4),
        SubQuery("hyde", "A pool.", 5),
    )
    assert doc.intent is None
    assert doc.query.startswith("lex:")


def test_single_typed_line_is_a_document() -> None:
    assert parse_query("lex: rotate").searches == (SubQuery("lex", "rotate", 1),)


def test_intent_line_anywhere_and_case_insensitive() -> None:
    doc = parse_query("lex: performance\nINTENT:  web page load times ")
    assert doc.intent == "web page load times"
    assert doc.searches == (SubQuery("lex", "performance", 1),)


def test_explicit_intent_wins_over_the_intent_line() -> None:
    assert parse_query("intent: from the line\nlex: x", intent="from the flag").intent == "from the flag"
    assert parse_query("intent: from the line\nlex: x", intent="  ").intent == "from the line"
    assert parse_query("plain words", intent="from the flag").intent == "from the flag"
    assert parse_query("expand: words", intent="from the flag").intent == "from the flag"


def test_crlf_line_endings() -> None:
    assert parse_query("lex: a\r\nvec: b\r\n").searches == (SubQuery("lex", "a", 1), SubQuery("vec", "b", 2))


@pytest.mark.parametrize("text", ["", "   ", "\n \n\t\n"])
def test_empty_query_is_an_error(text: str) -> None:
    assert error(text).startswith("query is empty: ")


# --- every §11 message, with line numbers counted over blank lines too ---


def test_expand_mixed_with_typed_lines() -> None:
    assert error("\nlex: a\n\nexpand: b") == (
        "Line 4 starts with expand:, but query documents cannot mix expand with typed lines. "
        "Submit a single expand query instead."
    )
    assert error("\n\nexpand: b\nlex: a").startswith("Line 3 starts with expand:")


def test_expand_without_text() -> None:
    assert error("\n  expand:   \n") == "expand: query must include text."


def test_second_intent_line() -> None:
    assert error("intent: a\nlex: x\n\nintent: b") == "Line 4: only one intent: line is allowed per query document."


def test_empty_intent_line() -> None:
    assert error("lex: x\n\n\nintent:  ") == "Line 4: intent: must include text."


@pytest.mark.parametrize("kind", ["lex", "vec", "hyde"])
def test_empty_typed_line(kind: str) -> None:
    assert error(f"lex: x\n\n{kind.upper()}:   ") == f"Line 3 ({kind}:) must include text."


def test_unprefixed_line_in_a_document() -> None:
    assert error("lex: x\n\njust words") == (
        "Line 3 is missing a lex:/vec:/hyde:/intent: prefix. Each line in a query document must start with one."
    )
    assert error("\njust words\nlex: x").startswith("Line 2 is missing")


def test_intent_alone() -> None:
    message = "intent: cannot appear alone. Add at least one lex:, vec:, or hyde: line."
    assert error("intent: web pages") == message
    assert error("\n\nintent: web pages\n") == message


def test_unmatched_quote_in_a_lex_line() -> None:
    assert error('vec: fine\n\nlex: "connection pool timeout') == (
        'Line 3 (lex): Lex query has an unmatched double quote ("). Add the closing quote or remove it.'
    )


@pytest.mark.parametrize("kind", ["vec", "hyde"])
@pytest.mark.parametrize("text", ["-redis pool", "pool -redis", 'pool -"redis cache"'])
def test_negation_is_refused_in_vec_and_hyde(kind: str, text: str) -> None:
    assert error(f"lex: a\n{kind}: {text}") == (
        f"Line 2 ({kind}): Negation (-term) is not supported in vec/hyde queries. Use lex for exclusions."
    )


@pytest.mark.parametrize(
    "text", ["how does the rate-limiter handle burst traffic", "state-of-the-art node-llama-cpp", "a - b", "x--y"]
)
def test_hyphenated_words_pass_in_vec(text: str) -> None:
    assert parse_query(f"vec: {text}").searches == (SubQuery("vec", text, 1),)


def test_negation_is_fine_in_lex() -> None:
    assert parse_query("lex: pool -redis").searches == (SubQuery("lex", "pool -redis", 1),)


def test_carriage_return_inside_a_line() -> None:
    assert error("lex: a\rb") == "Line 1 (lex): queries must be single-line. Remove newline characters."


# --- caps ---


def test_line_length_cap() -> None:
    ok = "x" * MAX_LINE_CHARS
    assert parse_query(f"lex: a\nvec: {ok[5:]}").searches[1].text == ok[5:]
    message = error("lex: a\n\nvec: " + "y" * MAX_LINE_CHARS)
    assert message.startswith(f"Line 3 is {MAX_LINE_CHARS + 5} characters long; the limit is {MAX_LINE_CHARS}.")
    assert error("z" * (MAX_LINE_CHARS + 1)).startswith("Line 1 is ")


def test_typed_line_count_cap() -> None:
    lines = [f"lex: term{i}" for i in range(MAX_SEARCHES)]
    assert len(parse_query("intent: x\n" + "\n".join(lines)).searches) == MAX_SEARCHES
    assert error("\n".join([*lines, "vec: one more"])) == (
        f"Line {MAX_SEARCHES + 1}: a query document may have at most {MAX_SEARCHES} lex:/vec:/hyde: lines."
    )


# --- API sub-query lists ---


def test_validate_searches_uses_structured_search_location() -> None:
    validate_searches([])
    validate_searches([("lex", '"a b" -c'), ("vec", "real-time sync"), ("hyde", "A sentence.")])
    cases = {
        ("vec", "pool -redis"): "Structured search (vec): Negation (-term) is not supported in vec/hyde queries. "
        "Use lex for exclusions.",
        ("lex", 'a "b'): 'Structured search (lex): Lex query has an unmatched double quote ("). '
        "Add the closing quote or remove it.",
        ("hyde", "one\ntwo"): "Structured search (hyde): queries must be single-line. Remove newline characters.",
        ("sql", "x"): "Structured search: type must be lex, vec or hyde, got 'sql'.",
        ("lex", "  "): "Structured search (lex:) must include text.",
    }
    for search, message in cases.items():
        with pytest.raises(InvalidInput) as exc:
            validate_searches([("lex", "fine"), search])
        assert exc.value.message == message


def test_validate_searches_caps() -> None:
    with pytest.raises(InvalidInput, match=f"at most {MAX_SEARCHES} sub-queries"):
        validate_searches([("lex", "x")] * (MAX_SEARCHES + 1))
    with pytest.raises(InvalidInput, match=f"the limit is {MAX_LINE_CHARS}"):
        validate_searches([("vec", "x" * (MAX_LINE_CHARS + 1))])


def test_validate_subquery_with_a_line_location() -> None:
    with pytest.raises(InvalidInput) as exc:
        validate_subquery("vec", "-x", "Line 7")
    assert exc.value.message.startswith("Line 7 (vec): Negation")


def test_typed_query_from_an_api_list() -> None:
    doc = typed_query([("vec", " how do we size the pool "), ("lex", "pool")], intent=" tuning ")
    assert doc == QueryDoc(
        mode="typed",
        query="vec: how do we size the pool\nlex: pool",
        searches=(SubQuery("vec", "how do we size the pool"), SubQuery("lex", "pool")),
        intent="tuning",
    )
    with pytest.raises(InvalidInput, match="at least one"):
        typed_query([])
    with pytest.raises(InvalidInput, match=r"^Structured search \(hyde\): Negation"):
        typed_query([("hyde", "-x")])


def test_query_help_has_the_grammar_and_working_examples() -> None:
    """`qmd query --help` is the syntax reference: its grammar is §11's and its examples parse."""
    from click.testing import CliRunner

    from qmd.client.cli import cli

    text = CliRunner().invoke(cli, ["query", "--help"]).output
    assert 'explicit_expand = "expand:" text ;' in text
    assert 'type            = "lex" | "vec" | "hyde" ;' in text
    examples = re.findall(r"qmd query (?:\$'(.*?)'|\"(.*?)\")", text)
    assert len(examples) == 4
    modes = [parse_query((ansi or plain).replace("\\n", "\n")).mode for ansi, plain in examples]
    assert modes == ["expand", "typed", "typed", "expand"]
