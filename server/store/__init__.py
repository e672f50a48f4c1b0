"""The cellar: persistence for both backends (SQLite by default, Postgres for a shared
index). Schema and migrations, the one writer thread, documents, the catalog, metadata
rows, the keyword and vector tables, caches, and copying an index between backends.
Every SQL statement of the daemon lives here; nothing here loads a model or walks a folder."""
