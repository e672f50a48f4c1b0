"""The daemon's side of qmd (`qmd.server`): everything that opens the index or loads a model.

Data flows one way through its subpackages: files → `index` (store, indexer, vectors)
← `search` (keyword, vectors, hybrid) ← `http` (routes, MCP) — with `models` (the
supervised llama.cpp worker, embed backends) beside them. `engine.Engine` is the facade
that `http` and the library API (`import qmd`) call.
"""
