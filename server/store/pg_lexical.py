"""The keyword index in Postgres: BM25's statistics kept as tables (schema in server/store/pg.py),
written the way ``store.fts_put`` / ``store.fts_delete`` write ``documents_fts``.

Postgres' own ``to_tsvector`` would not do: its parser keeps ``src/app.py`` or
``2026.4.10`` whole where unicode61 splits them, it indexes hyphenated words twice (whole
and parts), its porter is Snowball's (which stems ``is`` and ``ls``), and a ``tsvector``
keeps at most 256 positions per lexeme. With the closest configuration it ranks three
man-page queries in four differently (bench/bench_postgres_lexical.py). Tokens come from
FTS5's tokenizer instead (server/store/fts_tokens.py), so a document's terms, offsets and
lengths are the ones the SQLite index holds, and BM25 over them is FTS5's to the last bit.

Every write is one transaction that also moves the totals (N and the total token count) and
each of its terms' document count (``lex_terms``: a one-word item's idf),
so a reader never sees postings without their statistics, and the row lock on the totals
orders concurrent writers: two daemons indexing at once queue here instead of deadlocking.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import psycopg

from qmd.server.store.db import sqlite3
from qmd.server.store.fts_tokens import DocumentTokenizer, tokenize_documents


@dataclass(frozen=True)
class LexDoc:
    """One document's three indexed columns, as ``fts_put`` takes them."""

    doc_id: int
    """``documents.id``: the id a hit names."""
    collection: str
    """Kept with the statistics so a search restricted to a collection ranks inside Postgres."""
    filepath: str
    """``collection/path``, the FTS ``filepath`` column."""
    title: str
    body: str


@dataclass(frozen=True)
class Totals:
    """BM25's corpus statistics: FTS5's totals record."""

    docs: int
    tokens: int

    @property
    def avgdl(self) -> float:
        """Average document length in tokens, all columns together (FTS5's ``avgdl``)."""
        return self.tokens / self.docs if self.docs else 0.0


def totals(conn: psycopg.Connection) -> Totals:
    row = conn.execute("SELECT docs, tokens FROM lex_totals").fetchone()
    assert row is not None  # written by the migration that made the table
    return Totals(row[0], row[1])


def _remove(conn: psycopg.Connection, doc_ids: list[int]) -> tuple[Totals, list[str]]:
    """Delete these documents and their postings; what they counted in the totals, and the
    terms no document holds any more (`_drop_unheld`)."""
    unheld = conn.execute(
        "WITH gone AS (DELETE FROM lex_postings WHERE doc_id = ANY(%s) RETURNING term, doc_id),"
        " held AS (SELECT term, count(DISTINCT doc_id) AS docs FROM gone GROUP BY term)"
        " UPDATE lex_terms t SET docs = t.docs - held.docs FROM held WHERE t.term = held.term"
        " RETURNING t.term, t.docs",
        (doc_ids,),
    ).fetchall()
    row = conn.execute(
        "WITH gone AS (DELETE FROM lex_docs WHERE doc_id = ANY(%s)"
        " RETURNING len_filepath + len_title + len_body AS tokens)"
        " SELECT count(*), coalesce(sum(tokens), 0) FROM gone",
        (doc_ids,),
    ).fetchone()
    assert row is not None
    return Totals(row[0], int(row[1])), [term for term, docs in unheld if docs == 0]


def _add_terms(conn: psycopg.Connection, doc_ids: list[int]) -> None:
    """Count these (just written) documents in their terms' document counts."""
    conn.execute(
        "INSERT INTO lex_terms (term, docs) SELECT term, count(DISTINCT doc_id) FROM lex_postings"
        " WHERE doc_id = ANY(%s) GROUP BY term"
        " ON CONFLICT (term) DO UPDATE SET docs = lex_terms.docs + excluded.docs",
        (doc_ids,),
    )


def _drop_unheld(conn: psycopg.Connection, terms: list[str]) -> None:
    """Forget the terms whose count fell to 0 and stayed there, so `lex_terms` stays the vocabulary."""
    if terms:
        conn.execute("DELETE FROM lex_terms WHERE term = ANY(%s) AND docs = 0", (terms,))


def _move_totals(conn: psycopg.Connection, added: Totals, removed: Totals) -> None:
    conn.execute(
        "UPDATE lex_totals SET docs = docs + %s, tokens = tokens + %s",
        (added.docs - removed.docs, added.tokens - removed.tokens),
    )


def put_documents(
    conn: psycopg.Connection, docs: Sequence[LexDoc], tokenize: DocumentTokenizer = tokenize_documents
) -> None:
    """(Re)index `docs` in one transaction: a document already indexed is replaced; of two
    with one id in `docs`, the last wins."""
    latest = list({d.doc_id: d for d in docs}.values())
    if not latest:
        return
    tokens = tokenize([(d.doc_id, d.filepath, d.title, d.body) for d in latest])
    with conn.transaction():
        conn.execute("SELECT 1 FROM lex_totals FOR UPDATE")
        ids = [d.doc_id for d in latest]
        removed, unheld = _remove(conn, ids)
        with conn.cursor() as cur:
            with cur.copy("COPY lex_docs (doc_id, collection, len_filepath, len_title, len_body) FROM STDIN") as copy:
                for d in latest:
                    copy.write_row((d.doc_id, d.collection, *tokens.lengths[d.doc_id]))
            # the tokenizer's COPY text, whole: psycopg's per-row dump of offset arrays took 4× longer
            with cur.copy("COPY lex_postings (term, doc_id, col, tf, positions) FROM STDIN") as copy:
                copy.write(tokens.postings)
        _add_terms(conn, ids)
        _drop_unheld(conn, unheld)
        _move_totals(conn, Totals(len(latest), sum(sum(n) for n in tokens.lengths.values())), removed)


def delete_documents(conn: psycopg.Connection, doc_ids: Sequence[int]) -> None:
    """Take documents out of the keyword index and its statistics; ids not indexed are ignored."""
    if not doc_ids:
        return
    with conn.transaction():
        conn.execute("SELECT 1 FROM lex_totals FOR UPDATE")
        removed, unheld = _remove(conn, list(doc_ids))
        _drop_unheld(conn, unheld)
        _move_totals(conn, Totals(0, 0), removed)


def sqlite_documents(conn: sqlite3.Connection) -> Iterator[LexDoc]:
    """The active documents of a SQLite index as its FTS table was fed them (`fts_put`'s
    columns, from ``documents`` and ``content``), in id order: what a copy to Postgres indexes."""
    for doc_id, collection, path, title, body in conn.execute(
        "SELECT d.id, d.collection, d.path, d.title, c.doc FROM documents d JOIN content c ON c.hash = d.hash"
        " WHERE d.active = 1 ORDER BY d.id"
    ):
        yield LexDoc(doc_id, collection, f"{collection}/{path}", title, body)
