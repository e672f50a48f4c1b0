"""Defaults and limits every surface shares: the daemon's routes, the engine, the library,
the CLI and the MCP tools read them here, so a default changed once is changed everywhere.
Stdlib only and a leaf, so the thin clients import it without pulling in the server.

How many results a surface returns differs on purpose: a person reads a terminal screen, a
program parses every line, an agent pays for every token of an MCP answer.
"""

from typing import Final

MAX_QUERY_CHARS: Final = 20_000
"""A query longer than this is refused (422), not truncated: nobody types 20k characters,
and FTS and the embedder would silently read only part of it."""

CANDIDATE_LIMIT: Final = 40
"""Candidates a hybrid query keeps after fusion (and reranks, for `full`)."""

RESULTS: Final = 10
"""Results of `/query`, `/search` and `import qmd`'s query."""

CLI_RESULTS: Final = 5
"""Results `qmd search`, `vsearch` and `query` print for a person (`/v1` routes)."""

CLI_STRUCTURED_RESULTS: Final = 20
"""The same with `--json` or `--files`: a program reads them, not a screen."""

MCP_RESULTS: Final = 8
"""Results of the MCP `query` tool: enough to choose from, few enough for an agent's context."""

MCP_BUDGET_MS: Final = 4000
"""The MCP `query` tool's default `budgetMs`: agents call it in loops, so it answers within ~4 s,
dropping expansion, then reranking, then vectors as needed, each drop reported."""

AGENT_RELEVANCE_FLOOR: Final = 0.02
"""MCP `query`'s default `minRelevance`: results less likely than this to be relevant are
dropped, and an answer left empty names the closest one (server/search/relevance.py says
how the probability is made and what this floor measured)."""

VSEARCH_MIN_SCORE: Final = 0.0
"""`vsearch`'s default floor: none, as for `search` and `query`. Where a similarity sits
depends on the model (MiniLM's cosine for the right note of an eval query is 0.19-0.30; other
embedders run higher), so a fixed floor empties correct answers under one model and keeps
noise under another; the ranking is what every model shares."""


def snippet_header(start: int, count: int, total_lines: int) -> str:
    """The unified-diff style hunk header, `@@ -start,count @@ (B before, A after)`, that says
    where a passage sits in its file: the server writes it into snippets and the CLI prints it
    over a shown range, and the two must never disagree."""
    after = max(0, total_lines - (start + count - 1))
    return f"@@ -{start},{count} @@ ({start - 1} before, {after} after)"
