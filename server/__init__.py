"""The daemon's side of qmd (`qmd.server`): everything that opens the index or loads a model.

Its subpackages are floors, and a module imports only from its own floor or below:
`text` (pure text handling), `config`, `store` (persistence for both backends), `models`
(the supervised llama.cpp worker, endpoints), then `ingest` (files → rows → vectors) beside
`search` (keyword, vectors, hybrid), then `engine`, the composition root that `http` and
the library API (`import qmd`) call. tests/test_layout.py keeps the floors true.
"""
