"""The sqlite3 module the index uses.

Python builds often ship an SQLite without extension loading (so no sqlite-vec) and
an old FTS5. `pysqlite3-binary` bundles a current SQLite with both; the stdlib
module is the fallback, and the store announces when vectors are unavailable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # pysqlite3 ships no type information; its dbapi2 mirrors the stdlib module, so
    # the checker reads the stdlib stubs whichever one is loaded at run time.
    import sqlite3
else:
    try:
        import pysqlite3.dbapi2 as sqlite3
    except ImportError:  # pragma: no cover - platforms without the wheel
        import sqlite3

__all__ = ["sqlite3"]
