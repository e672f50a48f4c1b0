"""Reading the index: keyword (BM25) and vector search shaped into pointers, snippets,
query documents, the hybrid pipeline (expansion, fusion, rerank), and metadata
(the filter language, the scope a filter narrows, discovery)."""
