"""qmd daemon (qmdd): owns the index and the models."""

__version__ = "0.1.0"
