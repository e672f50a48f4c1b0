"""The OpenAPI document as the wire really is.

FastAPI describes every response by its fields' aliases, whatever the route serializes:
the CLI's `/v1` routes answer in snake_case (`response_model_by_alias=False`) but would be
described in the public routes' camelCase, and every route would list FastAPI's 422
validation body although the app answers each bad request as `{"error": …}` (400, 404,
409…). A client generated from such a schema, or one that reads its types from it
(`client/api.py`), would be wrong on every `/v1` answer. So the snake_case routes get their
own components (`…_cli`), built by pydantic with `by_alias=False`, and every operation
lists the one error shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import TypeAdapter

SNAKE = "_cli"
"""The suffix of a component as the snake_case routes send it."""

COMPONENTS = "#/components/schemas/"

ERROR: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "properties": {"error": {"type": "string", "title": "Error", "description": "What is wrong and what to do."}},
    "required": ["error"],
    "additionalProperties": True,
    "description": "Every refused request: the message, and for some errors the fields that say more.",
}


def install(app: FastAPI, router: APIRouter) -> None:
    """Serve `describe(app, router)` as the app's `/openapi.json`, built once; `router` holds
    the app's routes (included without a prefix)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = describe(app, router)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def describe(app: FastAPI, router: APIRouter) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for route in router.routes:
        if isinstance(route, APIRoute) and route.include_in_schema:
            for method in route.methods or ():
                _describe_operation(doc["paths"][route.path_format][method.lower()], route, schemas)
    schemas["Error"] = ERROR
    used = referenced(doc["paths"], schemas)
    doc["components"]["schemas"] = {name: schemas[name] for name in sorted(used)}
    return doc


def _describe_operation(op: dict[str, Any], route: APIRoute, schemas: dict[str, Any]) -> None:
    responses = op["responses"]
    responses.pop("422", None)
    responses["4XX"] = {"description": "Refused", "content": {"application/json": {"schema": _ref("Error")}}}
    if route.response_model is not None and not route.response_model_by_alias:
        answer = responses[str(route.status_code or 200)]["content"]["application/json"]
        answer["schema"] = _snake_case(route.response_model, schemas)


def _snake_case(model: Any, schemas: dict[str, Any]) -> dict[str, Any]:
    """A `$ref` to `model` as a snake_case route serializes it, its nested models added
    beside it under their own `…_cli` names."""
    schema = TypeAdapter(model).json_schema(
        by_alias=False, mode="serialization", ref_template=COMPONENTS + "{model}" + SNAKE
    )
    for name, nested in schema.pop("$defs", {}).items():
        schemas[name + SNAKE] = nested
    schemas[model.__name__ + SNAKE] = schema
    return _ref(model.__name__ + SNAKE)


def referenced(node: Any, schemas: dict[str, Any], seen: set[str] | None = None) -> set[str]:
    """The components `node` refers to, directly or through others: FastAPI's camelCase
    twins of the snake_case answers and its validation error are no longer among them."""
    seen = set() if seen is None else seen
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(COMPONENTS) and ref[len(COMPONENTS) :] not in seen:
            seen.add(ref[len(COMPONENTS) :])
            referenced(schemas[ref[len(COMPONENTS) :]], schemas, seen)
        for value in node.values():
            referenced(value, schemas, seen)
    elif isinstance(node, list):
        for value in node:
            referenced(value, schemas, seen)
    return seen


def _ref(name: str) -> dict[str, str]:
    return {"$ref": COMPONENTS + name}
