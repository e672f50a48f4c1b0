"""The one place the version is written: pyproject reads it, the index schema and the
daemon's /health report it. A leaf, so any floor may import it."""

__version__ = "0.1.0"
