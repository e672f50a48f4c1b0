"""The one place the version is written: pyproject reads it (so the wheel's metadata has it),
and `qmd --version`, `qmdd --version`, /health, MCP's server info and the index schema report
it; CHANGELOG.md's first entry names it. A leaf, so any floor may import it."""

__version__ = "0.2.0"
