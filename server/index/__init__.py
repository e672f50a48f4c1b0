"""Files → index: the SQLite store (one writer thread), its schema, the indexer, documents
read back, chunking, the embed job, vectors, config and caches. Every SQL statement of
the daemon lives here."""
