"""How a `qmd://` pointer is spelled, for the daemon that writes it and the clients that
print and parse it. Stdlib only: the thin clients import it without the server.

A pointer outside the default index names its index in a query string, and a line range
goes before that query, where a path's suffix belongs:
`qmd://work/a.md:40:5?index=work`, `qmd://docs/w.md:12?index=project:~/src/site`. A
project's index is named by its folder, shortened to `~/…` under the home directory;
`:`, `/`, `~` and `@` stay as they are (RFC 3986 allows them in a query), so a pointer
stays readable and short enough to cite.
"""

from __future__ import annotations

import os
from urllib.parse import quote

from qmd.paths import PROJECT_PREFIX

_QUERY_SAFE = "/:~@"


def index_label(name: str) -> str:
    """The index as a pointer names it: a project's folder as `~/…` under the home directory."""
    if not name.startswith(PROJECT_PREFIX):
        return name
    root, home = name[len(PROJECT_PREFIX) :], os.path.expanduser("~")
    if home not in ("", "/", "~") and root.startswith(home + "/"):
        return PROJECT_PREFIX + "~" + root[len(home) :]
    return name


def index_name(label: str) -> str:
    """The inverse of `index_label`: the index's own name (a project's absolute folder)."""
    if label.startswith(PROJECT_PREFIX + "~/"):
        return PROJECT_PREFIX + os.path.expanduser(label[len(PROJECT_PREFIX) :])
    return label


def file_uri(collection: str, path: str, index: str | None = None) -> str:
    """`qmd://collection/path`, plus `?index=LABEL` outside the default index."""
    uri = f"qmd://{collection}/{path}"
    return uri + f"?index={quote(index_label(index), safe=_QUERY_SAFE)}" if index else uri


def with_range(file: str, *numbers: int | str) -> str:
    """`file:from[:count]`, the range before a link's query string (`qmd://w/a.md:3?index=w`);
    an on-disk path keeps any `?` of its name."""
    suffix = "".join(f":{n}" for n in numbers)
    if not file.startswith("qmd:"):
        return file + suffix
    base, sep, query = file.partition("?")
    return f"{base}{suffix}{sep}{query}"


def is_link(name: str) -> bool:
    """Whether `name` is a `qmd://` link (also spelt `qmd:c/p` or `//c/p`), whose `?` opens
    a query, where in a path on disk it is a character of the name."""
    return name.startswith(("qmd:", "//"))


def section_in_query(name: str) -> bool:
    """Whether a link's section anchor follows its query, as in a URL (`…?index=w#intro`):
    a query names no file, so that `#` can only be an anchor."""
    return is_link(name) and "#" in name.partition("?")[2]


def split_section(name: str) -> tuple[str, str | None]:
    """`notes/a.md#getting-started` → (`notes/a.md`, `getting-started`): the section a name
    points into, or None. The anchor may sit where a range does, before a link's query
    (`qmd://w/a.md#intro?index=w`), or after it, as in a URL (`…?index=w#intro`). A docid's
    own `#` (`#abc123`) and a page (`#page=3`) are not sections."""
    base, sep, query = name.partition("?") if is_link(name) else (name, "", "")
    if "#" in query:
        query, anchor = query.rsplit("#", 1)
        return base + sep + query, anchor
    at = base.rfind("#")
    if at <= 0 or base[at + 1 :].startswith("page="):
        return name, None
    return base[:at] + sep + query, base[at + 1 :]
