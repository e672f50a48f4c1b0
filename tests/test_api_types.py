"""The CLI reads the daemon's answers through types generated from /openapi.json
(`client/api.py`, by `docs/gen_api.py`): the committed module must be what the schema
gives now, and the schema must describe every answer the CLI reads."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))

import gen_api  # noqa: E402


def test_client_types_are_current() -> None:
    assert gen_api.MODULE.read_text() == gen_api.render(), (
        "client/api.py differs from the daemon's /openapi.json: run .venv/bin/python docs/gen_api.py"
    )


def test_every_json_route_describes_its_answer() -> None:
    """A route whose 2xx answer is JSON names its model; only the NDJSON job streams do not."""
    doc = gen_api.schema()
    undescribed = [
        f"{method.upper()} {path}"
        for path, item in doc["paths"].items()
        for method, op in item.items()
        for code, response in op["responses"].items()
        if code.startswith("2")
        for media, content in response.get("content", {}).items()
        if media == "application/json" and "$ref" not in content.get("schema", {})
    ]
    assert not undescribed, f"routes answering JSON without a model: {undescribed}"


def test_types_name_what_the_cli_reads() -> None:
    """Spot checks that the generator reads the snake_case components: the keys the CLI uses."""
    from qmd.client import api

    assert "below_min_score" in api.SearchResponse.__annotations__
    assert "elapsed_ms" in api.CliQueryResponse.__annotations__
    assert set(api.Health.__annotations__) >= {"status", "version", "pid"}
