"""Input nothing should be able to store: a lone surrogate or a NUL in any string of
any body is a 400 that names the field and changes nothing, so no request can leave
`index.yml` or the index unreadable (issue 13, items 1 and 7); a config change that
would not read back as written is refused before the file is touched; a collection
name cannot end in a newline."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import NOTES, Daemon, Env, write

from qmd.server.config import Collection, Config, ConfigFile, validate_collection_name
from qmd.server.errors import InvalidInput


@pytest.mark.parametrize("name", ["notes\n", "notes\r", "no\ntes", " notes", "a/b", ""])
def test_collection_names_are_matched_whole(name: str) -> None:
    with pytest.raises(InvalidInput):
        validate_collection_name(name)


def test_a_config_that_would_not_read_back_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "index.yml"
    cfg = ConfigFile(path)
    cfg.save(Config(collections={"notes": Collection(name="notes", path=str(tmp_path))}))
    before = path.read_bytes()
    bad = Config(collections={"notes": Collection(name="notes", path=str(tmp_path), update="echo \ud800")})
    with pytest.raises(InvalidInput, match="cannot be saved"):
        cfg.save(bad)
    assert path.read_bytes() == before
    assert cfg.load().collections["notes"].update is None


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, Daemon]]:
    base = tmp_path_factory.mktemp("hostile")
    env = Env(base)
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    env.ok("collection", "add", str(write(base / "notes", NOTES)), "--name", "notes")
    yield env, d
    d.stop()


HOSTILE_BODIES = [
    ("PATCH", "/v1/collections/notes", {"update_command": "echo \ud800"}, "update_command"),
    ("POST", "/v1/collections", {"path": "/tmp", "pattern": "*\ud800.md"}, "pattern"),
    ("POST", "/v1/collections", {"path": "/tmp\x00/x"}, "path"),
    ("POST", "/v1/contexts", {"target": "qmd://notes/", "text": "ctx \udfff"}, "text"),
    ("POST", "/v1/keyword", {"query": "bread", "collections": ["\ud800"]}, "collections"),
    ("POST", "/v1/keyword", {"query": "bre\x00ad"}, "query"),
    ("POST", "/v1/get", {"file": "notes/bread.md", "cwd": "/tmp/\ud800"}, "cwd"),
    ("POST", "/v1/get", {"file": "cooking/\x00bread.md"}, "file"),
    ("POST", "/v1/multi-get", {"pattern": "cooking/*\x00"}, "pattern"),
    ("POST", "/query", {"query": "bread", "filter": {"field": "a\ud800", "operator": "eq", "value": 1}}, "filter"),
    ("POST", "/query", {"query": "bread", "intent": "x\x00"}, "intent"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "path", "body", "field"), HOSTILE_BODIES)
def test_unstorable_text_is_a_400_naming_the_field(
    served: tuple[Env, Daemon], method: str, path: str, body: dict, field: str
) -> None:
    env, d = served
    config_before = (env.config / "qmd" / "index.yml").read_bytes()
    # As JSON escapes (`"\\ud800"`): how a client gets such text past its own UTF-8 encoder.
    r = d.http.request(method, path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    message = r.json()["error"]
    assert field in message and ("lone surrogate" in message or "NUL" in message), message
    assert (env.config / "qmd" / "index.yml").read_bytes() == config_before
    # The daemon and the index are as they were: every route still answers.
    assert d.http.get("/v1/status").status_code == 200
    assert d.http.post("/v1/keyword", json={"query": "bread"}).json()["results"]


@pytest.mark.slow
def test_the_index_and_its_folders_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """Under umask 022 SQLite would make index.sqlite, -wal and -shm 0644 in a 0755
    folder: readable by every local user (issue 13, item 6)."""
    env = Env(tmp_path)
    old = os.umask(0o022)
    try:
        d = Daemon(env)
        try:
            env.ok("collection", "add", str(write(tmp_path / "notes", NOTES)), "--name", "notes")
            files = [env.db, Path(f"{env.db}-wal"), Path(f"{env.db}-shm"), env.config / "qmd" / "index.yml"]
            for f in files:
                assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
            for folder in (env.cache / "qmd", env.config / "qmd"):
                assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
        finally:
            d.stop()
        env.ok("status")  # an autostarted daemon's log
        assert stat.S_IMODE(env.log.stat().st_mode) == 0o600
        env.ok("daemon", "stop")
    finally:
        os.umask(old)


def test_an_existing_index_is_made_private_on_open(tmp_path: Path) -> None:
    from qmd.server.store.sqlite import Store

    db = tmp_path / "i.sqlite"
    Store(db).close()
    db.chmod(0o644)
    Store(db).close()
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


@pytest.mark.slow
def test_an_answer_has_a_byte_cap_and_says_where_it_was_cut(tmp_path: Path) -> None:
    """`{"query":"the","limit":100000,"full":true,"all":true}` returned 164 MB and left
    the daemon at 379 MB RSS (issue 13, item 7): answers stop at QMD_MAX_ANSWER_BYTES."""
    env = Env(tmp_path)
    d = Daemon(env, extra_env={"QMD_MAX_ANSWER_BYTES": "20000"})
    try:
        docs = {f"d{i:02}.md": f"# Doc {i}\n\n" + "common words here. " * 300 for i in range(12)}
        env.ok("collection", "add", str(write(tmp_path / "docs", docs)), "--name", "docs")
        body = {"query": "common", "limit": 100, "all": True, "full": True}
        for route in ("/v1/keyword", "/v1/vector", "/v1/query"):
            answer = d.http.post(route, json=body).json()
            assert 1 <= len(answer["results"]) < 12, route
            assert any("answer cut at" in w and "QMD_MAX_ANSWER_BYTES" in w for w in answer["warnings"]), route
        items = d.http.post("/v1/multi-get", json={"pattern": "docs/*.md", "max_bytes": 10**6}).json()["items"]
        capped = [i for i in items if i.get("skipped") and "answer size cap" in (i.get("reason") or "")]
        assert 0 < len(capped) < 12 and len(items) == 12
        r = env.qmd("search", "common", "--all", "--full")
        assert r.returncode == 0 and "answer cut at" in r.stderr
    finally:
        d.stop()
