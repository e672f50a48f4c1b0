"""An index on Postgres (issue 14): the store contract behind `index_url` / QMD_INDEX_URL,
as the CLI, the library and several daemons use it. (The whole suite also runs with every
test's index on Postgres: `QMD_TEST_BACKEND=postgres`, tests/conftest.py.)"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from conftest import NOTES, Daemon, Env, new_database, write

import qmd
from qmd.server.config import Config, describe_url
from qmd.server.engine import Engine
from qmd.server.errors import Conflict, Forbidden, InvalidInput, Unavailable
from qmd.server.search.discovery import NumberRange
from qmd.server.store import vectors
from qmd.server.store.pg_store import PgStore, translate


def test_translate_speaks_psycopg_and_leaves_literals_alone() -> None:
    assert translate("SELECT a FROM t WHERE b = ? AND c LIKE '%?%'") == (
        "SELECT a FROM t WHERE b = %s AND c ILIKE '%%?%%'"
    )
    assert translate("SELECT 1 WHERE x NOT IN () AND y IN ()") == (
        "SELECT 1 WHERE x NOT IN (SELECT x WHERE false) AND y IN (SELECT y WHERE false)"
    )
    assert translate("SELECT LENGTH(CAST(c.doc AS BLOB)) FROM c") == "SELECT LENGTH(convert_to(c.doc, 'UTF8')) FROM c"
    assert translate("SELECT a.x + a.y, b.x+c.y FROM t") == "SELECT a.x + a.y, b.x+c.y FROM t"  # sums stay sums
    assert translate("SELECT instr(a, ?) FROM d WHERE +d.collection IN (SELECT value FROM json_each(?))") == (
        "SELECT strpos(a, %s) FROM d WHERE d.collection IN"
        " (SELECT value FROM json_array_elements_text(%s::json) AS value)"
    )
    assert translate("SELECT json_group_array(v.id) FROM vector_rows v CROSS JOIN content_vectors c ON c.id = 1") == (
        "SELECT coalesce(json_agg(v.id)::text, '[]') FROM vector_rows v JOIN content_vectors c ON c.id = 1"
    )
    assert translate("SELECT 1 FROM t CROSS JOIN LATERAL unnest(t.a) AS s(p)") == (  # no ON: left as it is
        "SELECT 1 FROM t CROSS JOIN LATERAL unnest(t.a) AS s(p)"
    )
    assert translate("SELECT id FROM t WHERE id IN (SELECT CAST(value AS BIGINT) FROM json_each(?))") == (
        "SELECT id FROM t WHERE id IN (SELECT CAST(value AS BIGINT) FROM json_array_elements_text(%s::json) AS value)"
    )


def test_the_library_opens_a_postgres_index_by_url(pg_index: str, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", NOTES)
    with qmd.open(pg_index, collections={"notes": {"path": str(notes)}}) as index:
        index.update()
        hits = index.search("fundraising").hits
        assert hits and hits[0].doc.display_path == "notes/fundraising.md"
        assert index.status().index_path == describe_url(pg_index)
    with qmd.open(pg_index) as index:  # the collections as the index recorded them
        assert [c.name for c in index.collections()] == ["notes"]
        assert index.search("fundraising").hits


def test_an_unreachable_server_is_a_clear_error_without_the_password(tmp_path: Path) -> None:
    url = f"postgresql://qmd:s3cret@/qmd?host={tmp_path}&port=1"
    with pytest.raises(Unavailable) as e:
        qmd.open(url)
    assert "is not reachable" in e.value.message and "s3cret" not in e.value.message
    assert "qmd:***@" in e.value.message


def test_index_url_must_be_a_postgres_url(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="index_url must be a postgresql://"):
        Config.from_yaml({"index_url": "mysql://x"}, tmp_path / "index.yml")
    assert Config.from_yaml({"index_url": "postgresql://h/db"}, tmp_path / "index.yml").index_url == "postgresql://h/db"


def test_a_projects_config_may_not_name_a_server(tmp_path: Path, pg_index: str) -> None:
    """A cloned repository's `.qmd/index.yml` never makes the daemon connect anywhere."""
    from qmd.paths import IndexPaths

    project = tmp_path / "repo"
    (project / ".qmd").mkdir(parents=True)
    (project / ".qmd" / "index.yml").write_text(f"index_url: {pg_index}\ncollections: {{}}\n")
    with pytest.raises(Forbidden, match="a project's config may not"):
        Engine(IndexPaths.for_project(project))


def test_named_indexes_on_one_server_keep_to_their_own_schemas(
    pg_index: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qmd.paths import IndexPaths

    monkeypatch.setenv("QMD_INDEX_URL", pg_index)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    a = write(tmp_path / "a", {"a.md": "# A\n\nalpha only here\n"})
    b = write(tmp_path / "b", {"b.md": "# B\n\nbeta only here\n"})
    default, work = Engine(IndexPaths.resolve(None)), Engine(IndexPaths.resolve("work"))
    try:
        default.create_collection(str(a), name="notes")
        work.create_collection(str(b), name="notes")  # the same collection name, another index
        default.update()
        work.update()
        assert [h.doc.path for h in default.search("only").hits] == ["a.md"]
        assert [h.doc.path for h in work.search("only").hits] == ["b.md"]
        assert work.store.location == f"{describe_url(pg_index)} (schema qmd_work)"
        with default.store.exclusive("update:notes"), work.store.exclusive("update:notes"):
            pass  # one lock per index
    finally:
        default.close()
        work.close()
    with psycopg.connect(pg_index) as conn:
        schemas = {
            r[0]
            for r in conn.execute("SELECT table_schema FROM information_schema.tables WHERE table_name = 'documents'")
        }
    assert schemas == {"public", "qmd_work"}


def test_filters_compare_values_as_sqlite_does(pg_index: str, tmp_path: Path) -> None:
    """Strings, numbers (3 against 10, not "3" against "10"), booleans, a long string, arrays,
    suffixes: each filter keeps on Postgres the documents it keeps on SQLite."""
    long = "x" * 4000 + "tail"
    docs = {
        f"{name}.md": f"---\nqmd:\n  metadata:\n{meta}---\n# {name}\n\nalpha words\n"
        for name, meta in {
            "a": "    status: done\n    n: 3\n    ok: true\n    tags: [x, y]\n",
            "b": "    status: open\n    n: 10\n    ok: false\n    tags: [y]\n",
            "c": f"    status: Done\n    n: 2.5\n    note: {long}\n",
            "d": "    status: '3'\n",
        }.items()
    }
    notes = write(tmp_path / "notes", docs)
    filters = [
        {"field": "status", "operator": "eq", "value": "done"},
        {"field": "status", "operator": "eq", "value": "done", "caseInsensitive": True},
        {"field": "status", "operator": "eq", "value": 3},
        {"field": "n", "operator": "gt", "value": 2.9},
        {"field": "n", "operator": "lt", "value": 10},
        {"field": "ok", "operator": "eq", "value": True},
        {"field": "tags", "operator": "all", "value": ["x", "y"]},
        {"field": "tags", "operator": "nin", "value": ["x"]},
        {"field": "note", "operator": "suffix", "value": "xtail"},
        {"field": "status", "operator": "prefix", "value": "do"},
        {"field": "status", "operator": "contains", "value": "pe"},
        {"operator": "not", "operand": {"field": "n", "operator": "exists", "value": True}},
    ]
    kept, found = {}, {}
    for where in (tmp_path / "i.sqlite", pg_index):
        with qmd.open(where, collections={"notes": {"path": str(notes)}}) as index:
            index.update()
            kept[str(where)] = [
                sorted(h.doc.path for h in index.search("alpha", filter=f, limit=10).hits) for f in filters
            ]
            assert index.get("notes/c.md") is not None
            found[str(where)] = [
                index.metadata(),
                index.metadata(sort="value", value_limit=None),
                index.metadata(match={"field": "value", "operator": "eq", "value": "y"}),
                index.metadata(filter={"field": "ok", "operator": "exists", "value": True}, min_count=2),
            ]
    sqlite, postgres = kept.values()
    assert postgres == sqlite
    assert sqlite[:4] == [["a.md"], ["a.md", "c.md"], [], ["a.md", "b.md"]]
    on_sqlite, on_postgres = found.values()
    assert on_postgres == on_sqlite
    n = next(t for k in on_postgres[0].keys if k.key == "n" for t in k.types)
    by_value = next(t for k in on_postgres[1].keys if k.key == "n" for t in k.types)
    assert (n.range, [v.value for v in by_value.values]) == (NumberRange(2.5, 3, 10), [2.5, 3, 10])


_ROLES = itertools.count()


@contextmanager
def plain_role(server: str, database: str) -> Iterator[str]:
    """`database` (a URL) as a role of its own: LOGIN, not a superuser, not the database's owner,
    allowed to make tables in its schema public (Postgres 15 grants nobody that); dropped after,
    with what it made."""
    role = f"qmd_plain_{os.getpid()}_{next(_ROLES)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    try:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute(f"GRANT CREATE ON SCHEMA public TO {role}")
        parts = urlsplit(database)
        yield urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname or ''}"))
    finally:
        with psycopg.connect(database, autocommit=True) as conn:  # what it made there, and its grant
            conn.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")


def test_an_index_creates_the_vector_extension_when_its_role_may(postgres_url: str) -> None:
    """pgvector installed on the server but not created in the database: opening the index
    creates it (the tests' role is a superuser), and vector spaces work at once."""
    with new_database(postgres_url) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP EXTENSION vector")
        store = PgStore(url)
        try:
            assert store.vec_version is not None and store.vec_version.startswith("pgvector 0.8")
            assert store.vector_missing is None
            space = store.write(lambda conn: vectors.ensure_space(conn, "fp", "m", 4))
            assert store.checks()[1].ok and space.dims == 4
        finally:
            store.close()


def test_a_role_that_may_not_create_the_vector_extension_is_told_the_sql(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A role that is neither a superuser nor the owner cannot create pgvector's extension:
    the index opens (keyword search needs none), and the warning and `doctor` name the exact
    SQL and who can run it, which, run as said, makes vector search available."""
    with new_database(postgres_url, vector=False) as url, plain_role(postgres_url, url) as as_role:
        role, database = urlsplit(as_role).username, urlsplit(url).path.lstrip("/")
        with caplog.at_level(logging.WARNING, logger="qmd.pg"):
            store = PgStore(as_role)
        try:
            assert store.vec_version is None
            why = store.vector_missing
            assert why is not None
            assert f"role {role!r} may not create it" in why and "a superuser can" in why, why
            assert f"`CREATE EXTENSION vector;` in database {database!r}" in why, why
            assert why in caplog.text and "vector search is unavailable" in caplog.text
            assert not store.checks()[1].ok and why in store.checks()[1].what
        finally:
            store.close()
        sql = why.split("`")[-2]
        with psycopg.connect(url, autocommit=True) as conn:  # a superuser runs what the message says
            conn.execute(sql)
        store = PgStore(as_role)
        try:
            assert store.vec_version is not None and store.vector_missing is None
            store.write(lambda conn: vectors.ensure_space(conn, "fp", "m", 4))
        finally:
            store.close()


def test_without_pgvector_keyword_search_answers_and_vectors_are_announced(postgres_url: str, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", NOTES)
    with (
        new_database(postgres_url, vector=False) as url,
        plain_role(postgres_url, url) as as_role,  # a superuser would create the extension on open
        qmd.open(as_role, collections={"notes": {"path": str(notes)}}) as index,
    ):
        index.update()
        assert index.search("fundraising").hits
        status = index.status()
        assert status.sqlite_vec is None and not status.vector.available
        # every surface of the missing extension names the SQL that fixes it
        assert "`CREATE EXTENSION vector;`" in status.vector.message
        answer = index.vsearch("fundraising")
        assert answer.degraded and "`CREATE EXTENSION vector;`" in answer.warnings[0]
        with pytest.raises(Unavailable, match="cannot embed: .*`CREATE EXTENSION vector;`"):
            index.embed()


def test_a_collection_held_by_another_daemon_is_waited_for_then_refused(
    pg_index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QMD_PG_LOCK_WAIT_S", "0.6")
    a, b = PgStore(pg_index), PgStore(pg_index)
    try:
        with a.exclusive("update:notes"):
            t0 = time.monotonic()
            with pytest.raises(Conflict) as e, b.exclusive("update:notes"):
                pass
            assert time.monotonic() - t0 >= 0.6
            assert "update of collection notes is running by qmd pid" in e.value.message
            with b.exclusive("update:other"):  # another collection is free
                pass
        with b.exclusive("update:notes"):  # released with the block
            pass
    finally:
        a.close()
        b.close()


def test_a_lock_is_released_when_its_holder_is_killed(pg_index: str, monkeypatch: pytest.MonkeyPatch) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from qmd.server.store.pg_store import PgStore\n"
            "s = PgStore(sys.argv[1])\n"
            "with s.exclusive('embed'):\n    print('held', flush=True); time.sleep(600)",
            pg_index,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    monkeypatch.setenv("QMD_PG_LOCK_WAIT_S", "20")
    store = PgStore(pg_index)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        got = threading.Event()

        def take() -> None:
            with store.exclusive("embed"):
                got.set()

        t = threading.Thread(target=take)
        t.start()
        time.sleep(0.5)
        assert not got.is_set()  # waiting for the holder
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        t.join(timeout=15)
        assert got.is_set()  # the server ended the dead session's lock
    finally:
        if holder.poll() is None:
            holder.kill()
        store.close()


def test_doctor_checks_the_server_its_extension_and_the_hnsw_indexes(
    postgres_url: str, pg_index: str, tmp_path: Path
) -> None:
    notes = write(tmp_path / "notes", NOTES)
    with qmd.open(pg_index, collections={"notes": {"path": str(notes)}}) as index:
        store = index.engine.store
        store.write(lambda conn: vectors.ensure_space(conn, "fp", "m", 4))
        checks = store.checks()
        assert [c.ok for c in checks] == [True, True, True], checks
        assert "PostgreSQL 18" in checks[0].what and "schema version" in checks[0].what
        assert checks[1].what.startswith("pgvector 0.8") and "1 vector space" in checks[2].what
        space = store.write(lambda conn: vectors.ensure_space(conn, "fp", "m", 4))
        store.write(lambda conn: conn.execute(f"DROP INDEX vectors_s{space.id}_hnsw"))
        assert not store.checks()[2].ok and f"vectors_s{space.id}" in store.checks()[2].what
    with (
        new_database(postgres_url, vector=False) as url,
        plain_role(postgres_url, url) as as_role,  # a superuser would create the extension on open
        qmd.open(as_role) as index,
    ):
        checks = index.engine.store.checks()
        assert not checks[1].ok and "CREATE EXTENSION vector" in checks[1].what


def test_reads_share_a_bounded_pool_and_say_when_it_is_exhausted(
    pg_index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qmd.server.store import pg_store

    monkeypatch.setenv("QMD_PG_POOL_SIZE", "1")
    monkeypatch.setattr(pg_store, "POOL_WAIT_S", 0.5)
    store = PgStore(pg_index)
    try:
        with store.read() as outer, store.read() as inner:  # a read inside a read: the same connection
            assert inner is outer
            failed: list[BaseException] = []

            def other() -> None:
                try:
                    with store.read():
                        pass
                except BaseException as e:  # noqa: BLE001 - the test looks at it
                    failed.append(e)

            t = threading.Thread(target=other)
            t.start()
            t.join(timeout=10)
            assert len(failed) == 1 and isinstance(failed[0], Unavailable)
            assert "every connection to the Postgres index" in str(failed[0]) and "QMD_PG_POOL_SIZE" in str(failed[0])
        with store.read() as conn:  # free again
            assert conn.execute("SELECT 1").fetchone()[0] == 1
    finally:
        store.close()
    monkeypatch.setenv("QMD_PG_POOL_SIZE", "none")
    with pytest.raises(InvalidInput, match="QMD_PG_POOL_SIZE must be a number of connections"):
        PgStore(pg_index)


def test_a_read_past_the_statement_timeout_is_a_clear_error(pg_index: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QMD_PG_STATEMENT_TIMEOUT_MS", "100")
    store = PgStore(pg_index)
    try:
        with pytest.raises(Unavailable, match="ran past its statement timeout .100 ms"), store.read() as conn:
            conn.execute("SELECT pg_sleep(2)")
        with store.read() as conn:  # the pool's connection is fine afterwards
            assert conn.execute("SELECT 1").fetchone()[0] == 1
    finally:
        store.close()


def test_connections_the_server_dropped_are_replaced(pg_index: str, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", NOTES)
    with qmd.open(pg_index, collections={"notes": {"path": str(notes)}}) as index:
        index.update()
        assert index.search("fundraising").hits
        with psycopg.connect(pg_index, autocommit=True) as admin:  # a server restart, as the sessions see it
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name LIKE 'qmd pid %' AND pid <> pg_backend_pid()"
            )
        assert index.search("fundraising").hits  # reads: a fresh connection from the pool
        (notes / "new.md").write_text("# New\n\nfundraising again\n")
        index.update()  # the writer's session too
        assert "notes/new.md" in [h.doc.display_path for h in index.search("fundraising again").hits]


# -- the daemon and the CLI --------------------------------------------------------


def on_postgres(env: Env, url: str) -> Env:
    env.vars["QMD_INDEX_URL"] = url
    return env


def docs_in(url: str) -> tuple[int, int]:
    """(active documents, distinct paths) in the index: a doubled document would show."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*), count(DISTINCT (collection, path)) FROM documents WHERE active = 1")
        found = row.fetchone()
        assert found is not None
        return int(found[0]), int(found[1])


@pytest.mark.slow
def test_the_cli_on_a_postgres_index(pg_index: str, tmp_path: Path) -> None:
    env = on_postgres(Env(tmp_path / "a"), pg_index)
    plans = "---\nqmd:\n  metadata:\n    status: draft\n    n: [3, 3.0, 12]\n---\n# Plans\n\nA roadmap.\n"
    notes = write(tmp_path / "notes", {**NOTES, "plans.md": plans})
    d = Daemon(env)
    try:
        env.ok("collection", "add", str(notes), "--name", "notes")
        hits = env.json("search", "fundraising", "--json")
        assert hits[0]["file"].startswith("qmd://notes/fundraising.md")
        assert "1: # Raising a seed round" in env.ok("get", "notes/fundraising.md")
        status = env.ok("status")
        assert "postgresql://" in status
        doctor = env.ok("doctor")
        assert "✓ index postgresql://" in doctor and "PostgreSQL 18" in doctor and "✓ pgvector 0.8" in doctor
        (notes / "fundraising.md").write_text("# Money\n\nA seed round closed in spring.\n")
        env.ok("update")
        assert env.json("search", "seed round", "--json")[0]["file"].startswith("qmd://notes/fundraising.md")
        exists = '{"field": "x", "operator": "exists", "value": true}'
        assert env.json("search", "seed", "--filter", exists, "--json") == []
        shown = env.ok("collection", "metadata", "notes")
        assert "status  string  1 of " in shown and "draft" in shown and "n  number[]  1 of " in shown
        assert "2 distinct" in shown and "Traceback" not in shown
    finally:
        d.stop()


def many(n: int) -> dict[str, str | bytes]:
    return {f"d{i % 10}/n{i:05}.md": f"# Note {i}\n\nconsensus replicas term{i} lag\n" for i in range(n)}


@pytest.mark.slow
def test_two_daemons_serve_one_index_and_take_turns_updating(pg_index: str, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", many(1200))
    a, b = on_postgres(Env(tmp_path / "a"), pg_index), on_postgres(Env(tmp_path / "b"), pg_index)
    da, db = Daemon(a), Daemon(b)
    try:
        for env in (a, b):
            (env.config / "qmd").mkdir(parents=True, exist_ok=True)
            (env.config / "qmd" / "index.yml").write_text(f"collections:\n  notes:\n    path: {notes}\n")
        runs = [a.qmd_background("update"), b.qmd_background("update")]
        # queries on B while the updates run
        while runs[0].poll() is None or runs[1].poll() is None:
            r = b.qmd("search", "consensus", "-n", "3")
            assert r.returncode == 0, r.stderr
            time.sleep(0.2)
        outs = [p.communicate() for p in runs]
        assert [p.returncode for p in runs] == [0, 0], outs
        assert docs_in(pg_index) == (1200, 1200)
        # one indexed the files, the other, having waited, found them unchanged
        assert sorted("1200 unchanged" in out for out, _ in outs) == [False, True], outs
        assert b.json("search", "term1199", "--json")[0]["file"].startswith("qmd://notes/d9/n01199.md")
    finally:
        da.stop()
        db.stop()


@pytest.mark.slow
def test_a_daemon_killed_mid_update_leaves_the_other_to_finish(pg_index: str, tmp_path: Path) -> None:
    notes = write(tmp_path / "notes", many(3000))
    a, b = on_postgres(Env(tmp_path / "a"), pg_index), on_postgres(Env(tmp_path / "b"), pg_index)
    for env in (a, b):
        (env.config / "qmd").mkdir(parents=True, exist_ok=True)
        (env.config / "qmd" / "index.yml").write_text(f"collections:\n  notes:\n    path: {notes}\n")
    da, db = Daemon(a), Daemon(b)
    try:
        run = a.qmd_background("update")
        deadline = time.monotonic() + 120
        while docs_in(pg_index)[0] < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        da.stop(signal.SIGKILL)
        run.wait(timeout=30)
        midway = docs_in(pg_index)[0]
        assert 0 < midway < 3000, midway
        out = b.ok("update", timeout=300)  # B's lock wait ends with A's session
        assert docs_in(pg_index) == (3000, 3000), out
        assert b.json("search", "term2999", "--json")[0]["file"].startswith("qmd://notes/d9/n02999.md")
    finally:
        if da.proc.poll() is None:
            da.stop()
        db.stop()
