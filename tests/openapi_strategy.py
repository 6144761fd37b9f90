"""Hypothesis strategies from an OpenAPI document's JSON schemas (the subset FastAPI emits
for pydantic models: $ref, anyOf, object, array, string, integer, number, boolean, null,
and their bounds). Strings and lists are kept short so requests stay cheap. `alphabet`
widens the strings' characters (e.g. with lone surrogates, which JSON can carry)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

MAX_TEXT, MAX_ITEMS = 40, 8


def body_strategy(
    openapi: dict[str, Any], path: str, alphabet: st.SearchStrategy[str] | None = None
) -> st.SearchStrategy[Any]:
    """Bodies valid under the request schema of `POST path`."""
    schema = openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    return from_schema(schema["schema"], openapi["components"]["schemas"], alphabet)


def from_schema(
    schema: dict[str, Any], defs: dict[str, Any], alphabet: st.SearchStrategy[str] | None = None
) -> st.SearchStrategy[Any]:
    if "$ref" in schema:
        return from_schema(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, alphabet)
    if "anyOf" in schema:
        shared = {k: v for k, v in schema.items() if k not in ("anyOf", "title", "default")}
        return st.one_of(*(from_schema({**shared, **s}, defs, alphabet) for s in schema["anyOf"]))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        lo, hi = schema.get("minimum"), schema.get("maximum")
        return st.integers(
            None if lo is None else math.ceil(lo), None if hi is None else math.floor(hi)
        )
    if kind == "number":
        return st.floats(
            schema.get("minimum", schema.get("exclusiveMinimum")),
            schema.get("maximum", schema.get("exclusiveMaximum")),
            exclude_min="exclusiveMinimum" in schema,
            exclude_max="exclusiveMaximum" in schema,
            allow_nan=False,
            allow_infinity=False,
        )
    if kind == "string":
        lo = schema.get("minLength", 0)
        hi = max(lo, min(schema.get("maxLength", MAX_TEXT), MAX_TEXT))
        if alphabet is None:
            return st.text(min_size=lo, max_size=hi)
        return st.text(alphabet, min_size=lo, max_size=hi)
    if kind == "array":
        lo = schema.get("minItems", schema.get("minLength", 0))
        hi = max(lo, min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS))
        items = from_schema(schema.get("items", {}), defs, alphabet)
        return st.lists(items, min_size=lo, max_size=hi)
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {k: from_schema(v, defs, alphabet) for k, v in props.items() if k in required},
            optional={
                k: from_schema(v, defs, alphabet) for k, v in props.items() if k not in required
            },
        )
    raise AssertionError(f"schema not covered: {schema}")
