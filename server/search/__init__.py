"""Reading the index: keyword (BM25) and vector search shaped into pointers, snippets,
query documents, and the hybrid pipeline (expansion, fusion, rerank)."""
