"""Query documents: the text of `qmd query` read as one expand query or as typed sub-queries (spec §11).

A query is either plain text, which the engine expands with the generative model, or a
document of `lex:`/`vec:`/`hyde:` lines (plus an optional `intent:` line) that says exactly
what to search. The grammar and every error message follow the original's
`parseStructuredQuery`, so users and agents who learned its messages see the same ones,
with these changes:

- an `expand:` prefix is stripped before searching (the original searched for the literal
  text `expand: …`, §26);
- an empty query is an error, not a silent "no results": the API needs to say why;
- lines are capped at `MAX_LINE_CHARS` and documents at `MAX_SEARCHES` typed lines, because
  every typed line costs an index scan or an embedding.

The sub-query checks (`validate_subquery`) are shared with the MCP/REST `searches` lists, so a
sub-query is accepted or refused the same way whichever door it came in by.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, NamedTuple, cast

from qmd.server.errors import InvalidInput

__all__ = [
    "MAX_LINE_CHARS",
    "MAX_SEARCHES",
    "QueryDoc",
    "SubQuery",
    "SUBQUERY_TYPES",
    "SubQueryType",
    "parse_query",
    "typed_query",
    "validate_searches",
    "validate_subquery",
]

SubQueryType = Literal["lex", "vec", "hyde"]
SUBQUERY_TYPES: tuple[SubQueryType, ...] = ("lex", "vec", "hyde")

MAX_LINE_CHARS = 2000
"""Longest accepted line (or `searches` entry); matches the `intent` cap of the wire models."""
MAX_SEARCHES = 10
"""Most typed lines per document (or entries per `searches` list); each one is a separate search."""

_TYPED = re.compile(r"^(lex|vec|hyde):\s*", re.IGNORECASE)
_EXPAND = re.compile(r"^expand:\s*", re.IGNORECASE)
_INTENT = re.compile(r"^intent:\s*", re.IGNORECASE)
# A "-" at the start or after whitespace, glued to a word or a quote: lex negation syntax.
# Hyphenated words (real-time, node-llama-cpp) have no whitespace before the "-" and pass.
_NEGATION = re.compile(r'(^|\s)-[\w"]')


class SubQuery(NamedTuple):
    """One typed search of a query document."""

    type: SubQueryType
    text: str
    line: int | None = None
    """1-based line in the original text; None when the sub-query did not come from a document."""


@dataclass(frozen=True)
class QueryDoc:
    """What `parse_query` read: either an expand query or typed sub-queries, plus the intent."""

    mode: Literal["expand", "typed"]
    query: str
    """Expand mode: the text to expand, `expand:` prefix removed. Typed mode: the document as given, trimmed,
    or rendered from an API list (for echoing back; searches run from `searches`)."""
    searches: tuple[SubQuery, ...] = ()
    """Typed mode only, in document order."""
    intent: str | None = None


def _clean(intent: str | None) -> str | None:
    """An explicit intent, trimmed; a blank one counts as not given."""
    return intent.strip() if intent and intent.strip() else None


def validate_subquery(kind: SubQueryType, text: str, loc: str) -> None:
    """Refuse a sub-query whose syntax its backend cannot honour (spec §11), naming where it is.

    `loc` is `Line N` for a document line or `Structured search` for an API `searches` entry.
    Negation is refused in vec/hyde because an embedding cannot exclude anything: the user
    would silently get documents about the excluded term.
    """
    if "\n" in text or "\r" in text:
        raise InvalidInput(f"{loc} ({kind}): queries must be single-line. Remove newline characters.")
    if kind == "lex" and text.count('"') % 2:
        raise InvalidInput(
            f'{loc} (lex): Lex query has an unmatched double quote ("). Add the closing quote or remove it.'
        )
    if kind in ("vec", "hyde") and _NEGATION.search(text):
        raise InvalidInput(
            f"{loc} ({kind}): Negation (-term) is not supported in vec/hyde queries. Use lex for exclusions."
        )


def validate_searches(searches: list[tuple[str, str]]) -> None:
    """Check an API caller's `[(type, text)]` list with the same rules as document lines.

    The wire models may already restrict the type; it is checked here too because the
    original left it unvalidated (§26) and this is the one place every caller passes through.
    An empty list is valid: it searches nothing (spec §13.3).
    """
    if len(searches) > MAX_SEARCHES:
        raise InvalidInput(f"Structured search: at most {MAX_SEARCHES} sub-queries are allowed, got {len(searches)}.")
    for kind, text in searches:
        if kind not in SUBQUERY_TYPES:
            raise InvalidInput(f"Structured search: type must be lex, vec or hyde, got {kind!r}.")
        if not text.strip():
            raise InvalidInput(f"Structured search ({kind}:) must include text.")
        if len(text) > MAX_LINE_CHARS:
            raise InvalidInput(
                f"Structured search ({kind}): the query is {len(text)} characters long; "
                f"the limit is {MAX_LINE_CHARS}. Shorten it or split it into several sub-queries."
            )
        validate_subquery(kind, text, "Structured search")  # narrowed by the SUBQUERY_TYPES check


def parse_query(text: str, intent: str | None = None) -> QueryDoc:
    """Read the `query` argument as an expand query or a query document (spec §11).

    Lines are numbered from 1 over the original text, blank lines included, so a message
    points at the line the user sees in their editor. An explicit `intent` (from `--intent`
    or an API field) wins over an `intent:` line. Raises `InvalidInput` with the spec's
    messages.
    """
    explicit_intent = _clean(intent)
    lines = [(number, line.strip()) for number, line in enumerate(text.split("\n"), start=1)]
    lines = [(number, line) for number, line in lines if line]
    if not lines:
        raise InvalidInput(
            "query is empty: give search text, or a query document of lex:/vec:/hyde: lines (see qmd query --help)."
        )

    typed: list[SubQuery] = []
    doc_intent: str | None = None
    for number, line in lines:
        if len(line) > MAX_LINE_CHARS:
            raise InvalidInput(
                f"Line {number} is {len(line)} characters long; the limit is {MAX_LINE_CHARS}. "
                "Shorten it or split it into several lex:/vec:/hyde: lines."
            )
        if _EXPAND.match(line):
            if len(lines) > 1:
                raise InvalidInput(
                    f"Line {number} starts with expand:, but query documents cannot mix expand with typed lines. "
                    "Submit a single expand query instead."
                )
            query = _EXPAND.sub("", line, count=1).strip()
            if not query:
                raise InvalidInput("expand: query must include text.")
            return QueryDoc(mode="expand", query=query, intent=explicit_intent)

        if _INTENT.match(line):
            if doc_intent is not None:
                raise InvalidInput(f"Line {number}: only one intent: line is allowed per query document.")
            doc_intent = _INTENT.sub("", line, count=1).strip()
            if not doc_intent:
                raise InvalidInput(f"Line {number}: intent: must include text.")
            continue

        match = _TYPED.match(line)
        if match:
            kind = cast(SubQueryType, match.group(1).lower())
            query = line[match.end() :].strip()
            if not query:
                raise InvalidInput(f"Line {number} ({kind}:) must include text.")
            if len(typed) == MAX_SEARCHES:
                raise InvalidInput(
                    f"Line {number}: a query document may have at most {MAX_SEARCHES} lex:/vec:/hyde: lines."
                )
            validate_subquery(kind, query, f"Line {number}")
            typed.append(SubQuery(kind, query, number))
            continue

        if len(lines) == 1:  # a single plain line is an implicit expand query
            return QueryDoc(mode="expand", query=line, intent=explicit_intent)
        raise InvalidInput(
            f"Line {number} is missing a lex:/vec:/hyde:/intent: prefix. "
            "Each line in a query document must start with one."
        )

    if not typed:  # the loop returns or raises for everything but a lone intent: line
        raise InvalidInput("intent: cannot appear alone. Add at least one lex:, vec:, or hyde: line.")
    return QueryDoc(mode="typed", query=text.strip(), searches=tuple(typed), intent=explicit_intent or doc_intent)


def typed_query(searches: list[tuple[str, str]], intent: str | None = None) -> QueryDoc:
    """A typed `QueryDoc` from an API caller's `[(type, text)]` list (MCP/REST `searches`), validated.

    An empty list is refused: the wire models already require one entry, and a query that
    searches nothing is a caller's mistake worth naming rather than an empty answer.
    """
    if not searches:
        raise InvalidInput("Structured search: give at least one lex, vec or hyde sub-query.")
    validate_searches(searches)
    subs = tuple(SubQuery(cast(SubQueryType, kind), text.strip()) for kind, text in searches)
    return QueryDoc(
        mode="typed",
        query="\n".join(f"{s.type}: {s.text}" for s in subs),
        searches=subs,
        intent=_clean(intent),
    )
