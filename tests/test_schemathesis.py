"""The OpenAPI, fuzzed: schemathesis generates bodies, paths and queries for every route
the schema describes and sends them to a real qmdd; not one may answer 5xx (issue 13:
241 of its 500s came from NUL bytes in paths), and every answer must be what the schema
says, its status code and its body (FastAPI alone described the CLI's snake_case answers in
camelCase and every error as a 422 validation body: `server/http/openapi.py`). Bounded in CI by `QMD_FUZZ_EXAMPLES`
examples per operation (default 40); routes that would walk or download the machine
(`update`, `embed`, `pull`, adding a collection, which as root could index `/`) are
left out: they have their own tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import schemathesis  # the test extra pins it
from conftest import NOTES, Daemon, Env, write
from hypothesis import HealthCheck, given, settings  # schemathesis brings hypothesis
from schemathesis.checks import not_a_server_error, response_schema_conformance, status_code_conformance

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("QMD_FUZZ_EXAMPLES", "40"))
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("fuzz")
    env = Env(base)
    d = Daemon(env)
    env.vars["QMD_NO_AUTOSTART"] = "1"
    env.ok("collection", "add", str(write(base / "notes", NOTES)), "--name", "notes")
    yield d
    d.stop()


def test_no_route_answers_a_server_error_or_off_its_schema(fuzzed: Daemon) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzzed.env.url}/openapi.json")
    schema = schema.exclude(path_regex=r"^/v1/(update|embed|pull)$").exclude(path="/v1/collections", method="POST")
    failures: list[str] = []
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def run(case) -> None:  # noqa: ANN001 - a schemathesis Case
            nonlocal calls
            calls += 1
            try:
                case.call_and_validate(base_url=fuzzed.env.url, checks=CHECKS)
            except Exception as e:  # noqa: BLE001 - collected, reported together below
                failures.append(f"{case.method.upper()} {case.path}: {str(e)[:300]}")

        run()
    print(f"schemathesis: {calls} requests, {len(failures)} server errors")
    assert calls > 100
    assert not failures, "\n".join(dict.fromkeys(failures))
