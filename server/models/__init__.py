"""Models: which model each role uses and getting it onto disk, the supervised llama.cpp
worker (parent side and child process), and the remote embeddings backend."""
