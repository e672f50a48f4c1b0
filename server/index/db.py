"""The sqlite3 module the index uses.

Python builds often ship an SQLite without extension loading (so no sqlite-vec) and
an old FTS5. `pysqlite3-binary` bundles a current SQLite with both; the stdlib
module is the fallback, and the store announces when vectors are unavailable.
"""

from __future__ import annotations

try:
    import pysqlite3.dbapi2 as sqlite3  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - platforms without the wheel
    import sqlite3  # type: ignore[no-redef]

__all__ = ["sqlite3"]
