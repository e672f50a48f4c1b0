"""qmd: on-device search for markdown notes, docs and transcripts.

Placeholder until the library API lands.
"""

__version__ = "0.1.0"
