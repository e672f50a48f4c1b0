"""Models: which model each role uses and getting it onto disk, each role's ready model in
one place (`registry`), the supervised llama.cpp worker (parent side and child process),
and the remote backends."""
