"""The metadata filter language: one recursive JSON AST, parsed strictly, compiled to
SQL over `document_metadata`, and mirrored by a pure-Python evaluator.

One grammar serves two questions. A *filter* asks which documents to keep: a
condition's `field` names a metadata key, and the condition sees every value the
document holds under it. A *match* asks which metadata entries to report: `field` is
`"key"` or `"value"`, and the condition sees that one string or that one value. Both
are evaluated by the same rules below, in SQL (`filter_sql`, `match_sql`) and in
Python (`matches`, `entry_matches`); the Python side defines the semantics and the
tests hold SQL to it.

Rules (the seed's, and how the edges were decided):

- Typed and exact: string, number and boolean never equal each other (`"3"` is not
  `3`, `true` is not `1`); int and float are one type, so `3` equals `3.0`. A type
  mismatch never matches, `ne` and `nin` included.
- A key's values are a set; a condition holds when some value satisfies it. `all`
  needs every operand present. `ne`/`nin` need at least one value of an operand's type
  and no value equal to an operand, so a missing key or one holding only other types
  matches neither (pair them with `exists false` in an `or` to include those).
  `not` is plain negation: `not eq` keeps documents without the key.
- `gt`/`gte`/`lt`/`lte` order numbers numerically and strings by their UTF-8 bytes
  (SQLite's BINARY, which is also Python's code-point order).
- Text operators match string values only. An empty operand matches every string
  (`contains ""` is Python's `"" in s`), never a number or a boolean.
- `caseInsensitive` folds ASCII A-Z on both sides, nothing else (`Ä` is not `ä`); it
  is allowed only on conditions whose value is a string or an array of strings (on a
  `type` condition it changes nothing), and refused elsewhere, `false` included.
- Operand arrays may mix types (`in ["3", 3]`), except under `caseInsensitive`;
  repeated operands collapse. Integers outside 64 bits and non-finite numbers are
  refused: no document can hold them. A filter's `field` is a non-empty string.
- In a match, the key is a string: `key eq 3` and `key ne 3` never hold. A match
  refuses `exists` and `all`, which say nothing about one entry.

A filter arrives as a decoded JSON value or as JSON text. Caps keep a hostile one
from building an unbounded statement or parse: the text's size, nesting depth, node
count, operand count, string bytes and the SQL parameters it binds. Parsing recurses
at most `MAX_DEPTH` levels, and so do the compilers and evaluators over what it
returns; an AST built by hand is trusted to respect the same caps.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, NoReturn, TypeAlias, TypeVar, cast

from qmd.server.errors import InvalidInput
from qmd.server.store.dialect import SQLITE, Bound, Dialect, Sql
from qmd.server.text.frontmatter import Scalar, ValueType, fold, value_type

ConditionOperator: TypeAlias = Literal[
    "eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "all", "contains", "prefix", "suffix", "type", "exists"
]

MAX_JSON_BYTES: Final = 512 * 1024
"""JSON text longer than this is refused before it is decoded."""
MAX_DEPTH: Final = 32
MAX_NODES: Final = 1024
MAX_VALUES: Final = 4096
"""Scalars across every condition's value."""
MAX_STRING_BYTES: Final = 256 * 1024
"""UTF-8 bytes of every field and string value together."""
MAX_PARAMS: Final = 8192
"""The binding budget: SQL parameters one statement may spend on a filter and a match
together. SQLite allows 32766; the rest is left to the statement around them."""

LOGICAL: Final = ("and", "or", "not")
CONDITIONS: Final[tuple[ConditionOperator, ...]] = (
    "eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "all", "contains", "prefix", "suffix", "type", "exists",
)  # fmt: skip
TYPES: Final[tuple[ValueType, ...]] = ("string", "number", "boolean")
_ORDERING: Final = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_ARRAYS: Final = ("in", "nin", "all")
_TEXT: Final = ("contains", "prefix", "suffix")
_NOT_FOR_ENTRIES: Final = ("exists", "all")
_INT64: Final = 2**63
T = TypeVar("T")


class FilterError(InvalidInput):
    """A filter or match that cannot be evaluated as written; the message starts with
    the path to the offending part (`filter.operands[2].value: …`)."""


class BindingBudgetError(FilterError):
    """The predicates would bind more SQL parameters than `MAX_PARAMS`."""


@dataclass(frozen=True)
class Condition:
    field: str
    operator: ConditionOperator
    value: Scalar | tuple[Scalar, ...]
    """A tuple for `in`, `nin` and `all`; a type name for `type`; a bool for `exists`."""
    case_insensitive: bool = False


@dataclass(frozen=True)
class And:
    operands: tuple[Filter, ...]


@dataclass(frozen=True)
class Or:
    operands: tuple[Filter, ...]


@dataclass(frozen=True)
class Not:
    operand: Filter


Filter: TypeAlias = And | Or | Not | Condition


# -- parsing ------------------------------------------------------------------------


def parse_filter(raw: object) -> Filter:
    """A document filter from its decoded JSON (or JSON text), or a FilterError."""
    return _parse(raw, "filter", entry=False)


def parse_match(raw: object) -> Filter:
    """A metadata-entry match from its decoded JSON (or JSON text), or a FilterError."""
    return _parse(raw, "match", entry=True)


def check_binding_budget(params: int, what: str = "the filter and the match together") -> None:
    """For a caller binding a filter and a match in one statement: each was checked
    alone when parsed, but only their sum says whether the statement fits."""
    if params > MAX_PARAMS:
        raise BindingBudgetError(
            f"{what}: binds {params} SQL parameters, more than the binding budget of {MAX_PARAMS}"
            " (use fewer conditions or fewer values)",
            params=params,
        )


def _fail(path: str, what: str) -> NoReturn:
    raise FilterError(f"{path}: {what}", path=path)


def _kind(raw: object) -> str:
    """What a value is, in JSON's words; never its contents, which may be huge or deep."""
    if raw is None:
        return "null"
    if isinstance(raw, bool):
        return "a boolean"
    if isinstance(raw, int | float):
        return "a number"
    if isinstance(raw, str):
        return "a string"
    if isinstance(raw, list | tuple):
        return "an array"
    if isinstance(raw, dict):
        return "an object"
    return f"a {type(raw).__name__}"


def _show(raw: object) -> str:
    if isinstance(raw, str):
        return repr(raw) if len(raw) <= 40 else repr(raw[:40]) + "…"
    return _kind(raw)


def _decode(text: str, root: str) -> object:
    if len(text) > MAX_JSON_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_JSON_BYTES:
        _fail(root, f"more than {MAX_JSON_BYTES} bytes of JSON")

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in items:
            if key in out:
                _fail(root, f"the key {_show(key)} appears twice in one object")
            out[key] = value
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        _fail(root, f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
    except RecursionError:
        _fail(root, f"nested far deeper than the {MAX_DEPTH} levels a filter may have")


def _parse(raw: object, root: str, *, entry: bool) -> Filter:
    if isinstance(raw, str):
        raw = _decode(raw, root)
    parsed = _Parser(root, entry).node(raw, root, 1)
    _, params = match_sql(parsed) if entry else filter_sql(parsed)
    check_binding_budget(len(params), root)
    return parsed


_CONDITION_KEYS: Final = ("field", "operator", "value", "caseInsensitive")
_KEYS: Final = {"and": ("operator", "operands"), "or": ("operator", "operands"), "not": ("operator", "operand")}


class _Parser:
    """One pass over the raw tree, counting what the caps limit as it goes, so the
    first cap crossed stops it however large the rest is."""

    def __init__(self, root: str, entry: bool) -> None:
        self.root = root
        self.entry = entry
        self.nodes = 0
        self.values = 0
        self.string_bytes = 0
        allowed = [op for op in (*LOGICAL, *CONDITIONS) if not (entry and op in _NOT_FOR_ENTRIES)]
        self.expected = ", ".join(allowed)

    def node(self, raw: object, path: str, depth: int) -> Filter:
        if depth > MAX_DEPTH:
            _fail(path, f"nested more than {MAX_DEPTH} levels deep")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            _fail(path, f"the {self.root} has more than {MAX_NODES} nodes")
        if not isinstance(raw, dict):
            _fail(path, f"expected an object (a condition or an and/or/not group), got {_kind(raw)}")
        if "operator" not in raw:
            _fail(
                f"{path}.operator",
                "missing: every node names its operator (there is no implicit AND: put several conditions"
                " in an 'and' group)",
            )
        op = raw["operator"]
        if not isinstance(op, str):
            _fail(f"{path}.operator", f"expected a string, got {_kind(op)}")
        if op not in LOGICAL and op not in CONDITIONS:
            _fail(f"{path}.operator", f"unknown operator {_show(op)} (expected one of: {self.expected})")
        if self.entry and op in _NOT_FOR_ENTRIES:
            _fail(f"{path}.operator", f"{op!r} has no meaning for a single entry (a match tests one key or value)")
        allowed = _KEYS.get(op, _CONDITION_KEYS)
        for key in raw:
            if key not in allowed:
                hint = " (there are no $ shorthands)" if isinstance(key, str) and key.startswith("$") else ""
                _fail(path, f"unknown key {_show(key)} in {op!r}{hint} (allowed: {', '.join(allowed)})")
        if op == "not":
            if "operand" not in raw:
                _fail(f"{path}.operand", "missing: 'not' negates one node")
            return Not(self.node(raw["operand"], f"{path}.operand", depth + 1))
        if op in ("and", "or"):
            return self.group(op, raw, path, depth)
        return self.condition(cast(ConditionOperator, op), raw, path)

    def group(self, op: str, raw: dict[object, object], path: str, depth: int) -> Filter:
        where = f"{path}.operands"
        if "operands" not in raw:
            _fail(where, f"missing: {op!r} needs a non-empty array of nodes")
        items = raw["operands"]
        if not isinstance(items, list | tuple) or not items:
            got = "an empty array" if isinstance(items, list | tuple) else _kind(items)
            _fail(where, f"expected a non-empty array of nodes for {op!r}, got {got}")
        if self.nodes + len(items) > MAX_NODES:
            _fail(where, f"the {self.root} has more than {MAX_NODES} nodes")
        operands = tuple(self.node(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(items))
        return And(operands) if op == "and" else Or(operands)

    def condition(self, op: ConditionOperator, raw: dict[object, object], path: str) -> Condition:
        if "field" not in raw:
            _fail(f"{path}.field", "missing: a condition names what it tests")
        field = raw["field"]
        if not isinstance(field, str) or not field or (self.entry and field not in ("key", "value")):
            wanted = (
                '"key" or "value" (a match tests one entry)' if self.entry else "a non-empty string (a metadata key)"
            )
            _fail(f"{path}.field", f"expected {wanted}, got {_show(field)}")
        self.count_string(field, f"{path}.field")
        if "value" not in raw:
            _fail(f"{path}.value", f"missing: {op!r} compares against a value")
        value = self.value(op, raw["value"], f"{path}.value")
        folds = "caseInsensitive" in raw
        if folds:
            ci = raw["caseInsensitive"]
            if not isinstance(ci, bool):
                _fail(f"{path}.caseInsensitive", f"expected true or false, got {_show(ci)}")
            if isinstance(value, tuple) and not all(isinstance(v, str) for v in value):
                _fail(f"{path}.caseInsensitive", "applies only to string values, and this array holds others")
            if not isinstance(value, str | tuple):
                _fail(f"{path}.caseInsensitive", f"applies only to string values, and this value is {_kind(value)}")
            folds = ci
        return Condition(field, op, value, folds)

    def value(self, op: ConditionOperator, raw: object, path: str) -> Scalar | tuple[Scalar, ...]:
        if op in _ARRAYS:
            if not isinstance(raw, list | tuple) or not raw:
                got = "an empty array" if isinstance(raw, list | tuple) else _kind(raw)
                _fail(path, f"expected a non-empty array for {op!r}, got {got}")
            if self.values + len(raw) > MAX_VALUES:
                _fail(path, f"the {self.root} has more than {MAX_VALUES} values")
            return tuple(self.scalar(v, f"{path}[{i}]") for i, v in enumerate(raw))
        if op == "exists":
            if not isinstance(raw, bool):
                _fail(path, f"expected true or false for 'exists', got {_show(raw)}")
            return raw
        if op == "type":
            if not isinstance(raw, str) or raw not in TYPES:
                _fail(path, f'expected "string", "number" or "boolean" for \'type\', got {_show(raw)}')
            return raw
        if op in _TEXT and not isinstance(raw, str):
            _fail(path, f"expected a string for {op!r}, got {_kind(raw)}")
        if op in _ORDERING and isinstance(raw, bool):
            _fail(path, f"a boolean has no order: {op!r} takes a number or a string")
        return self.scalar(raw, path)

    def scalar(self, raw: object, path: str) -> Scalar:
        self.values += 1
        if self.values > MAX_VALUES:
            _fail(path, f"the {self.root} has more than {MAX_VALUES} values")
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, int):
            if not -_INT64 <= raw < _INT64:
                _fail(path, "a number outside the 64-bit integer range (no document can hold it)")
            return raw
        if isinstance(raw, float):
            if not math.isfinite(raw):
                _fail(path, f"{raw} is not a finite number")
            return raw
        if isinstance(raw, str):
            self.count_string(raw, path)
            return raw
        _fail(path, f"expected a string, a number or a boolean, got {_kind(raw)}")

    def count_string(self, text: str, path: str) -> None:
        left = MAX_STRING_BYTES - self.string_bytes
        if len(text) > left:
            _fail(path, f"the {self.root}'s strings exceed {MAX_STRING_BYTES} bytes")
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            _fail(path, "not valid Unicode text (it holds a lone surrogate)")
        if size > left:
            _fail(path, f"the {self.root}'s strings exceed {MAX_STRING_BYTES} bytes")
        self.string_bytes += size


# -- shared by the compilers and the evaluators ---------------------------------------


def _operands(c: Condition) -> tuple[Scalar, ...]:
    """Every condition's value as a tuple: `eq` is `in` of one, `ne` is `nin` of one."""
    return c.value if isinstance(c.value, tuple) else (c.value,)


def _distinct(values: Sequence[Scalar], ci: bool) -> list[Scalar]:
    """Operands as a set, with the typed equality of the rules (1 and 1.0 are one)."""
    seen: set[tuple[str, Scalar]] = set()
    out: list[Scalar] = []
    for v in values:
        k = (value_type(v), fold(v) if ci and isinstance(v, str) else v)
        if k not in seen:
            seen.add(k)
            out.append(v)
    return out


def _tree(
    f: Filter, leaf: Callable[[Condition], T], group: Callable[[str, Iterator[T]], T], negate: Callable[[T], T]
) -> T:
    """Fold the AST; `group` gets a lazy iterator, so the evaluators short-circuit."""
    if isinstance(f, Condition):
        return leaf(f)
    if isinstance(f, Not):
        return negate(_tree(f.operand, leaf, group, negate))
    kind = "AND" if isinstance(f, And) else "OR"
    return group(kind, (_tree(o, leaf, group, negate) for o in f.operands))


# -- SQL ------------------------------------------------------------------------------

_TRUE: Final[Sql] = ("true", [])
_FALSE: Final[Sql] = ("false", [])
"""Spelled as both SQLite and Postgres read a boolean (a filter may fold to one)."""
_TYPE_SQL: Final = {t: f"'{t}'" for t in TYPES}
"""Type names are SQL literals taken only from this table, never from the AST."""


def filter_sql(
    f: Filter, doc: str = "d", *, per_document: bool = False, dialect: Dialect = SQLITE
) -> tuple[str, list[Bound]]:
    """A boolean SQL expression true for the documents (alias `doc` of `documents`) the
    filter keeps. It sees only `document_metadata`: the caller adds
    `{doc}.active = 1 AND {doc}.meta_state IN (0, 1)` itself, which is what keeps
    pending (NULL) and rejected (2) documents out, since to this expression they look
    like documents without metadata (and `not`/`exists false` would admit them).

    Two forms, one meaning. By default each condition is `{doc}.id IN (…)`, a list of
    the documents holding a matching value, built once per statement from the
    (key, type, value) index: the cheap form when many documents are to be tested.
    `per_document` makes each an `EXISTS` probe of the document's own rows (the
    primary key): the cheap form when few are, such as the hits of a rare word.

    `dialect`: the index's (`IndexStore.dialect`), which says where a number or a boolean
    is compared and how a suffix is (server/store/dialect.py)."""

    def has(c: Condition, pred: Sql) -> Sql:
        if pred == _FALSE:
            return _FALSE
        where = "key = ?" if pred == _TRUE else f"key = ? AND {pred[0]}"
        if per_document:
            return f"EXISTS (SELECT 1 FROM document_metadata WHERE doc_id = {doc}.id AND {where})", [c.field, *pred[1]]
        return f"{doc}.id IN (SELECT doc_id FROM document_metadata WHERE {where})", [c.field, *pred[1]]

    row = _Row("type", "value", "folded", dialect.number_column, dialect)
    return _tree(f, lambda c: _condition_sql(c, row, lambda p: has(c, p)), _join, _negate)


def match_sql(f: Filter, entry: str = "m", *, dialect: Dialect = SQLITE) -> tuple[str, list[Bound]]:
    """A boolean SQL expression true for the rows (alias `entry` of
    `document_metadata`) the match selects. Never NULL, so it can be negated or
    combined with a filter in one statement. `dialect` as for `filter_sql`."""
    key_row = _Row(None, f"{entry}.key", _sql_fold(f"{entry}.key"), f"{entry}.key", dialect)
    number = f"{entry}.{dialect.number_column}"
    value_row = _Row(f"{entry}.type", f"{entry}.value", f"{entry}.folded", number, dialect)
    return _tree(
        f, lambda c: _condition_sql(c, key_row if c.field == "key" else value_row, lambda p: p), _join, _negate
    )


@dataclass(frozen=True)
class _Row:
    """Where one metadata value sits in SQL: the columns of a `document_metadata` row,
    or a match's key (always a string, so its type tests are constants)."""

    type: str | None
    value: str
    folded: str
    number: str
    """Where a number or a boolean is compared (`Dialect.number_column`)."""
    dialect: Dialect
    """How a suffix is tested (by UTF-8 bytes or by characters)."""

    def column(self, t: ValueType, ci: bool) -> str:
        if ci:
            return self.folded
        return self.number if t in ("number", "boolean") else self.value


def _sql_fold(expr: str) -> str:
    """ASCII folding in SQL, for keys (which have no folded column): `lower()` may be
    ICU's and fold everything, and `COLLATE NOCASE` stops comparing at a NUL."""
    for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ":
        expr = f"replace({expr}, '{c}', '{c.lower()}')"
    return expr


def _join(op: str, parts: Iterable[Sql]) -> Sql:
    """`op` over `parts`, folding constants, nested as a balanced tree: SQLite parses a
    flat chain of 1,000 ORs as an expression 1,000 deep, past its limit."""
    identity, absorbing = (_TRUE, _FALSE) if op == "AND" else (_FALSE, _TRUE)
    kept = []
    for p in parts:
        if p == absorbing:
            return absorbing
        if p != identity:
            kept.append(p)
    if not kept:
        return identity

    def balanced(lo: int, hi: int) -> Sql:
        if hi - lo == 1:
            return kept[lo]
        mid = (lo + hi) // 2
        (left, lp), (right, rp) = balanced(lo, mid), balanced(mid, hi)
        return f"({left} {op} {right})", lp + rp

    return balanced(0, len(kept))


def _negate(p: Sql) -> Sql:
    if p == _TRUE:
        return _FALSE
    if p == _FALSE:
        return _TRUE
    return f"NOT ({p[0]})", p[1]


def _is(row: _Row, types: Sequence[ValueType]) -> Sql:
    if row.type is None:
        return _TRUE if "string" in types else _FALSE
    names = [_TYPE_SQL[t] for t in dict.fromkeys(types)]
    if len(names) == 1:
        return f"{row.type} = {names[0]}", []
    return f"{row.type} IN ({', '.join(names)})", []


def _bind(v: Scalar, ci: bool) -> Bound:
    if isinstance(v, bool):
        return int(v)
    return fold(v) if ci and isinstance(v, str) else v


def _members(row: _Row, values: Sequence[Scalar], ci: bool) -> list[Sql]:
    """One predicate per operand type, each `type = t AND value IN (…)`, so each can
    use the (key, type, value) or (key, folded) index."""
    by_type: dict[ValueType, list[Bound]] = {}
    for v in _distinct(values, ci):
        by_type.setdefault(value_type(v), []).append(_bind(v, ci))
    out = []
    for t, bound in by_type.items():
        col = row.column(t, ci)
        test = f"{col} = ?" if len(bound) == 1 else f"{col} IN ({', '.join('?' * len(bound))})"
        out.append(_join("AND", [_is(row, [t]), (test, bound)]))
    return out


def _successor(prefix: str) -> str | None:
    """The least string above every string starting with `prefix` (None: no bound), so
    a prefix is a range the index can seek. Surrogates cannot occur in stored text."""
    chars = list(prefix)
    while chars:
        nxt = ord(chars.pop()) + 1
        if nxt == 0xD800:
            nxt = 0xE000
        if nxt <= 0x10FFFF:
            return "".join(chars) + chr(nxt)
    return None


def _text_sql(row: _Row, op: str, operand: str, ci: bool) -> Sql:
    """Exact text tests: `instr` and ranges compare the stored text as it is; a suffix is
    the dialect's test, as SQLite's `length()` and text `substr()` stop at a NUL."""
    col = row.column("string", ci)
    s = fold(operand) if ci else operand
    if not s:
        return _is(row, ["string"])
    if op == "contains":
        test: Sql = f"instr({col}, ?) > 0", [s]
    elif op == "prefix":
        upper = _successor(s)
        test = (f"{col} >= ?", [s]) if upper is None else (f"({col} >= ? AND {col} < ?)", [s, upper])
    else:
        test = row.dialect.ends_with(col, s)
    return _join("AND", [_is(row, ["string"]), test])


def _condition_sql(c: Condition, row: _Row, has: Callable[[Sql], Sql]) -> Sql:
    """`has(pred)`: some value of the condition's field satisfies the row predicate
    `pred` (a subquery for a document, the predicate itself for one entry)."""
    op, ci, values = c.operator, c.case_insensitive, _operands(c)
    if op == "exists":
        return has(_TRUE) if c.value else _negate(has(_TRUE))
    if op == "type":
        return has(_is(row, [cast(ValueType, c.value)]))
    if op == "all":
        return _join("AND", [has(_join("OR", _members(row, [v], ci))) for v in _distinct(values, ci)])
    if op in ("ne", "nin"):
        some_of_type = has(_is(row, [value_type(v) for v in values]))
        return _join("AND", [some_of_type, _negate(_join("OR", [has(p) for p in _members(row, values, ci)]))])
    if op in ("eq", "in"):
        return _join("OR", [has(p) for p in _members(row, values, ci)])
    operand = values[0]
    if op in _ORDERING:
        test = f"{row.column(value_type(operand), ci)} {_ORDERING[op]} ?", [_bind(operand, ci)]
        return has(_join("AND", [_is(row, [value_type(operand)]), test]))
    assert isinstance(operand, str)
    return has(_text_sql(row, op, operand, ci))


# -- Python ---------------------------------------------------------------------------

_COMPARE: Final[dict[str, Callable[[Scalar, Scalar], bool]]] = {
    "gt": operator.gt,
    "gte": operator.ge,
    "lt": operator.lt,
    "lte": operator.le,
}


def matches(f: Filter, metadata: Mapping[str, Scalar | Sequence[Scalar]]) -> bool:
    """Whether a document with this metadata passes the filter: the reference the SQL
    is tested against."""

    def values(key: str) -> list[Scalar]:
        v = metadata.get(key)
        if v is None:
            return []
        return [v] if isinstance(v, str | int | float) else list(v)

    return _tree(f, lambda c: _holds(c, values(c.field)), _group, operator.not_)


def entry_matches(f: Filter, key: str, type: str, value: Scalar) -> bool:
    """Whether one stored entry passes the match; `type` decides how `value` reads, as
    a boolean is stored as 0 or 1."""
    read: Scalar = bool(value) if type == "boolean" else value
    return _tree(f, lambda c: _holds(c, [key] if c.field == "key" else [read]), _group, operator.not_)


def _group(kind: str, results: Iterator[bool]) -> bool:
    return all(results) if kind == "AND" else any(results)


def _equal(v: Scalar, x: Scalar, ci: bool) -> bool:
    if value_type(v) != value_type(x):
        return False
    if ci and isinstance(v, str) and isinstance(x, str):
        return fold(v) == fold(x)
    return v == x


def _holds(c: Condition, values: list[Scalar]) -> bool:
    op, ci, operands = c.operator, c.case_insensitive, _operands(c)
    if op == "exists":
        return bool(values) == c.value
    if op == "type":
        return any(value_type(v) == c.value for v in values)
    if op == "all":
        return all(any(_equal(v, x, ci) for v in values) for x in operands)
    if op in ("eq", "in"):
        return any(_equal(v, x, ci) for v in values for x in operands)
    if op in ("ne", "nin"):
        types = {value_type(x) for x in operands}
        some_of_type = any(value_type(v) in types for v in values)
        return some_of_type and not any(_equal(v, x, ci) for v in values for x in operands)
    x = operands[0]
    if op in _COMPARE:
        same = [v for v in values if value_type(v) == value_type(x)]
        if ci and isinstance(x, str):
            return any(_COMPARE[op](fold(v), fold(x)) for v in same if isinstance(v, str))
        return any(_COMPARE[op](v, x) for v in same)
    assert isinstance(x, str)
    texts = [fold(v) if ci else v for v in values if isinstance(v, str)]
    s = fold(x) if ci else x
    if op == "contains":
        return any(s in t for t in texts)
    if op == "prefix":
        return any(t.startswith(s) for t in texts)
    return any(t.endswith(s) for t in texts)
