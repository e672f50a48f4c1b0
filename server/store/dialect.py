"""Where the SQL the search floor writes over the index's tables differs between the two
backends, as one value chosen when a store or a connection opens (`IndexStore.dialect`,
`db.dialect_of`): the floors above pass it on and never ask which backend they run on.

Most SQL needs none of this: both backends read the dialect of server/store/db.py, and
the Postgres adapter rewrites the few spellings only SQLite has (`pg_store._REWRITES`).
What is here differs in meaning, so no rewrite of the text can bridge it:

- a metadata number or boolean: SQLite keeps each value's own storage class, so it is
  compared in the ``value`` column; Postgres' column has one type, so it is compared as
  its ``num`` column (server/store/pg.py);
- a text suffix: SQLite compares UTF-8 bytes, and its `length()` and text `substr()` stop
  at a NUL, so the suffix is tested on the bytes; Postgres' text holds no NUL, so on the
  characters;
- the fence that keeps a subquery from being flattened into the statement around it;
- how metadata values are grouped: SQLite walks its index in value order; Postgres has none
  (a 4,096-character value fits no btree entry) and hashes them, with the memory for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

Bound: TypeAlias = str | int | float | bytes
"""A value bound to a statement's parameter."""
Sql: TypeAlias = tuple[str, list[Bound]]
"""A piece of SQL and the values its ``?`` placeholders take, in order."""


def _suffix_in_bytes(column: str, suffix: str) -> Sql:
    """A UTF-8 suffix is a character suffix; `substr()` of the empty blob is NULL, which
    `not` would keep NULL, hence the `coalesce`."""
    raw = suffix.encode("utf-8")
    return f"coalesce(substr(CAST({column} AS BLOB), ?) = ?, 0)", [-len(raw), raw]


def _suffix_in_chars(column: str, suffix: str) -> Sql:
    return f"right({column}, ?) = ?", [len(suffix), suffix]


@dataclass(frozen=True)
class Dialect:
    """What the search floor's SQL builders differ on between backends (module docstring)."""

    name: str
    """The backend, as `qmd doctor` names it."""
    number_column: str
    """The column of `document_metadata` a number or a boolean is compared in."""
    ends_with: Callable[[str, str], Sql]
    """`ends_with(column, suffix)`: true where the text in `column` ends with `suffix`."""
    subquery_fence: str
    """Appended to a subquery so the planner keeps it whole instead of copying its
    expressions into the statement around it."""
    values_in_order: bool
    """Whether the metadata values have an index in value order (key, type, value) that a
    grouping can walk; without one they are hashed."""
    grouping_memory: str
    """Run first in a transaction that hashes the metadata values (not `values_in_order`),
    so the groups fit in memory rather than a sort spilling to disk."""


SQLITE: Final = Dialect(
    name="sqlite",
    number_column="value",
    ends_with=_suffix_in_bytes,
    subquery_fence="LIMIT -1",
    values_in_order=True,
    grouping_memory="",
)
POSTGRES: Final = Dialect(
    name="postgres",
    number_column="num",
    ends_with=_suffix_in_chars,
    subquery_fence="OFFSET 0",
    values_in_order=False,
    # The planner estimates a grouping's rows as the entries' (no reduction), so with the
    # default 4 MB it sorts every entry on disk; the groups, one a value, fit in a fraction
    # of this (18 MB at 850k entries).
    grouping_memory="SET LOCAL work_mem = '64MB'",
)
