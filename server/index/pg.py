"""An index on a Postgres server: the connection and the schema, as numbered migrations
keyed on a version table (issue 14; SQLite stays the default, server/index/store.py).

The same rules as the SQLite schema (server/index/schema.py): migration N takes the
schema from version N-1 to N, a released migration never changes, pending ones run in
one transaction with the new version, and a schema newer than this qmd knows is refused
before anything is written. Many daemons may open one server at once, so the version is
read and migrated under a transaction-scoped advisory lock: the second daemon waits for
the first's upgrade and then finds nothing to do.

Connections are psycopg 3 in autocommit mode; every write and every multi-statement read
opens its own transaction (``conn.transaction()``), so a failed write rolls back whole and
a search reads one snapshot.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit, urlunsplit

import psycopg

from qmd import __version__
from qmd.server.errors import IndexTooNew, MigrationFailed, Unavailable

log = logging.getLogger("qmd.pg")

_MIGRATION_LOCK = 0x716D645F736368  # "qmd_sch": the advisory lock the upgrade holds

LEXICAL_V1 = """
CREATE TABLE lex_docs (
    doc_id bigint PRIMARY KEY,
    collection text NOT NULL,
    len_filepath integer NOT NULL,
    len_title integer NOT NULL,
    len_body integer NOT NULL
);
CREATE INDEX lex_docs_collection ON lex_docs (collection, doc_id);
CREATE TABLE lex_postings (
    term text COLLATE "C" NOT NULL,
    doc_id bigint NOT NULL REFERENCES lex_docs ON DELETE CASCADE,
    col smallint NOT NULL,
    tf integer NOT NULL,
    positions integer[] NOT NULL,
    PRIMARY KEY (term, doc_id, col) INCLUDE (tf)
);
CREATE INDEX lex_postings_doc ON lex_postings (doc_id);
CREATE TABLE lex_totals (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    docs bigint NOT NULL,
    tokens bigint NOT NULL
);
INSERT INTO lex_totals (docs, tokens) VALUES (0, 0);
"""
"""BM25's statistics, kept by server/index/pg_lexical.py: per document its column lengths
(FTS5's ``_docsize``), per (term, document, column) the frequency and offsets (phrases need
them; a term's ``C`` collation makes a prefix one index range), and the row count and total
tokens (FTS5's totals record: N and the average length), updated in each write's transaction."""

MIGRATIONS: tuple[str, ...] = (LEXICAL_V1,)


def describe(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def connect(url: str) -> psycopg.Connection:
    """An autocommit connection to the index at `url`, its schema migrated to the latest
    version. A server that does not answer is `Unavailable`, naming it (never its password)."""
    try:
        conn = psycopg.connect(url, autocommit=True)
    except psycopg.Error as e:
        raise Unavailable(f"Postgres index {describe(url)} is not reachable: {str(e).strip()}") from None
    try:
        migrate(conn, describe(url))
    except BaseException:
        conn.close()
        raise
    return conn


def schema_version(conn: psycopg.Connection) -> int:
    """The version the schema is at; 0 for a database qmd has not written."""
    row = conn.execute("SELECT to_regclass('qmd_schema') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    found = conn.execute("SELECT version FROM qmd_schema").fetchone()
    return found[0] if found else 0


def migrate(conn: psycopg.Connection, where: str) -> None:
    """Bring the schema on `conn` to the latest version, or refuse it if a newer qmd made it."""
    latest = len(MIGRATIONS)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        found = schema_version(conn)
        if found > latest:
            raise IndexTooNew(
                f"{where} was made by a newer qmd: its schema is version {found}, and qmd {__version__}"
                f" knows versions up to {latest}. Upgrade qmd, or use another index.",
                found=found,
                latest=latest,
            )
        if found == latest:
            return
        for version in range(found + 1, latest + 1):
            try:
                conn.execute(MIGRATIONS[version - 1])
            except psycopg.Error as e:
                raise MigrationFailed(
                    f"could not upgrade {where} from schema version {found} to {latest}: migration {version}"
                    f" failed ({type(e).__name__}: {str(e).strip()}). The index is unchanged.",
                    found=found,
                    latest=latest,
                    failed=version,
                ) from e
        conn.execute("CREATE TABLE IF NOT EXISTS qmd_schema (version integer NOT NULL)")
        conn.execute("DELETE FROM qmd_schema")
        conn.execute("INSERT INTO qmd_schema (version) VALUES (%s)", (latest,))
    log.info("upgraded %s from schema version %d to %d", where, found, latest)
