"""Typed metadata from a document's frontmatter (`qmd: metadata: {…}`): what the block holds.
(Its rows in the index are server/store/metadata.py.)

A document opts in through the namespaced block; everything else in the frontmatter
stays plain searchable text, and the frontmatter itself is never cut out of the body
(chunks, embeddings and line numbers do not change).

Values are strings, numbers, booleans, or flat arrays of one of those (a set: repeats
are dropped). Anything else — a nested object, null, an empty or mixed array, a date
tag, a key that is not a string — rejects the document's metadata as a whole, with the
reason recorded: the document still indexes and is searchable, but a filtered search
never sees it, so no filter silently matches half of what its author wrote.

The YAML is read with the YAML 1.2 core schema, not PyYAML's 1.1 default: `status: on`
stays the string "on", `when: 2025-01-02` the string "2025-01-02" (so `prefix "2025-"`
works), `time: 1:30` is not 90 and `012` is twelve. Only `true`/`false` are booleans.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

import yaml

Scalar: TypeAlias = str | int | float | bool
Metadata: TypeAlias = dict[str, Scalar | list[Scalar]]
ValueType: TypeAlias = Literal["string", "number", "boolean"]

# documents.meta_state (schema migration 3); NULL means not yet extracted.
NONE: Final = 0
OK: Final = 1
REJECTED: Final = 2

MARKDOWN_EXTENSIONS = frozenset({"md", "markdown", "mdx"})
MAX_FRONTMATTER_CHARS = 64 * 1024
MAX_KEYS = 256
MAX_ARRAY = 1024
MAX_STRING = 4096
MAX_KEY = 256
_INT64 = 2**63

FRONTMATTER_RE = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.S)
"""A leading `---` block, closed by `---` or `...` (after an optional BOM)."""

_QMD_KEY = re.compile(r"^['\"]?qmd['\"]?[ \t]*:", re.M)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def fold(text: str) -> str:
    """ASCII case folding, the only folding `caseInsensitive` does: `Ä` stays `Ä`."""
    return text.translate(_ASCII_LOWER)


def value_type(value: Scalar) -> ValueType:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    return "number"


# -- YAML 1.2 core schema -------------------------------------------------------------

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _CoreLoader(_BaseLoader):
    """SafeLoader with the YAML 1.2 core schema's implicit types."""


_YAML_11_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "timestamp")}
_CoreLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _YAML_11_TAGS]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_CORE_RESOLVERS = (
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
)
for _tag, _rx, _first in _CORE_RESOLVERS:
    _CoreLoader.add_implicit_resolver(_tag, re.compile(_rx), list(_first))


def _construct_int(loader: Any, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


def _construct_float(loader: Any, node: yaml.ScalarNode) -> float:
    text = str(loader.construct_scalar(node)).lower()
    if text.endswith(".inf"):
        return -math.inf if text.startswith("-") else math.inf
    if text == ".nan":
        return math.nan
    return float(text)


def _construct_bool(loader: Any, node: yaml.ScalarNode) -> bool:
    return str(loader.construct_scalar(node)).lower() == "true"


_CoreLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_CoreLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_CoreLoader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)


# -- extraction ---------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One stored value: a row of `document_metadata`."""

    key: str
    type: ValueType
    value: Scalar
    multi: bool


@dataclass(frozen=True)
class Extracted:
    state: int
    """NONE, OK or REJECTED."""
    entries: tuple[Entry, ...] = ()
    error: str | None = None
    """Why the metadata was rejected."""


class _Rejected(Exception):
    pass


def _scalar(where: str, value: object) -> Scalar:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise _Rejected(f"{where}: the number {value} is outside the 64-bit integer range")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Rejected(f"{where}: {value} is not a finite number")
        return value
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            raise _Rejected(f"{where}: a string of {len(value)} characters (the limit is {MAX_STRING})")
        return value
    if value is None:
        raise _Rejected(f"{where}: null is not a value (use a string, number, boolean, or a flat array of one)")
    if isinstance(value, dict):
        raise _Rejected(f"{where}: nested objects are not supported (flatten it into its own keys)")
    if isinstance(value, list):
        raise _Rejected(f"{where}: nested arrays are not supported")
    raise _Rejected(f"{where}: a {type(value).__name__} is not supported (quote it to make it a string)")


def _read(block: dict[Any, Any]) -> list[Entry]:
    if len(block) > MAX_KEYS:
        raise _Rejected(f"qmd.metadata has {len(block)} keys (the limit is {MAX_KEYS})")
    entries: list[Entry] = []
    for key, raw in block.items():
        if not isinstance(key, str) or not key:
            raise _Rejected(f"qmd.metadata: the key {key!r} is not a non-empty string")
        if len(key) > MAX_KEY:
            raise _Rejected(f"qmd.metadata: a key of {len(key)} characters (the limit is {MAX_KEY})")
        where = f"qmd.metadata.{key}"
        if isinstance(raw, list):
            if not raw:
                raise _Rejected(f"{where}: an empty array (remove the key, or give it a value)")
            if len(raw) > MAX_ARRAY:
                raise _Rejected(f"{where}: an array of {len(raw)} values (the limit is {MAX_ARRAY})")
            items = [_scalar(f"{where}[{i}]", v) for i, v in enumerate(raw)]
            types = list(dict.fromkeys(value_type(v) for v in items))
            if len(types) > 1:
                raise _Rejected(f"{where}: a mixed array ({' and '.join(types)}); arrays hold one type")
            entries.extend(Entry(key, types[0], v, True) for v in _dedupe(items))
        else:
            value = _scalar(where, raw)
            entries.append(Entry(key, value_type(value), value, False))
    return entries


def _dedupe(items: Sequence[Scalar]) -> list[Scalar]:
    """Set semantics with typed equality (1 and 1.0 are one number)."""
    seen: set[Scalar] = set()
    unique: list[Scalar] = []
    for v in items:
        if v not in seen:
            seen.add(v)
            unique.append(v)
    return unique


def extract(path: str, text: str) -> Extracted:
    """The document's `qmd.metadata`, or why it was rejected. Cheap for the common
    case: a document whose frontmatter never mentions `qmd:` is not parsed as YAML."""
    ext = path.rsplit(".", 1)[-1].lower() if "." in path.rsplit("/", 1)[-1] else ""
    if ext not in MARKDOWN_EXTENSIONS:
        return Extracted(NONE)
    head = text.removeprefix("\ufeff")[:MAX_FRONTMATTER_CHARS]
    fm = FRONTMATTER_RE.match(head)
    if not fm:
        if head.startswith("---") and len(head) == MAX_FRONTMATTER_CHARS and _QMD_KEY.search(head):
            return Extracted(REJECTED, error=f"the frontmatter is longer than {MAX_FRONTMATTER_CHARS} characters")
        return Extracted(NONE)
    if not _QMD_KEY.search(fm.group(1)):
        return Extracted(NONE)
    try:
        raw = yaml.load(fm.group(1), Loader=_CoreLoader)  # noqa: S506 - a safe loader with the core schema
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "syntax error"
        return Extracted(REJECTED, error=f"the frontmatter is not valid YAML{where}: {problem}")
    except RecursionError:
        return Extracted(REJECTED, error="the frontmatter nests too deeply")
    if not isinstance(raw, dict) or "qmd" not in raw:
        return Extracted(NONE)
    qmd = raw["qmd"]
    if not isinstance(qmd, dict):
        return Extracted(REJECTED, error="qmd: expected a mapping holding 'metadata'")
    if "metadata" not in qmd:
        return Extracted(NONE)
    block = qmd["metadata"]
    if block is None or block == {}:
        return Extracted(NONE)
    if not isinstance(block, dict):
        return Extracted(REJECTED, error="qmd.metadata: expected a mapping of keys to values")
    try:
        entries = _read(block)
    except _Rejected as e:
        return Extracted(REJECTED, error=str(e))
    return Extracted(OK, tuple(entries))
