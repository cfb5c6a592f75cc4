"""Hostile schemas (issue 17): handling is linear in the schema's size, and bounded.

16,000 required properties once held the event loop for 29 s (``Objects.governing``
scanned every property per name); now compiling, generating and matching are linear,
and schemas beyond MAX_PROPERTIES / MAX_ENUM / MAX_NODES / MAX_NESTING are refused with
a message naming the limit.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from trio.testing import MockClock

from llmsim.options import ToolCallOptions
from llmsim.schema import jsonschema
from llmsim.schema.jsonschema import ToolSchemaError, compile_schema
from llmsim.schema.limits import MAX_ENUM, MAX_NODES, MAX_PROPERTIES
from tests.api.fakes import post, running


def wide(count: int, *, required: bool = True) -> dict[str, Any]:
    names = [f"p{i}" for i in range(count)]
    return {
        "type": "object",
        "properties": {name: {"type": "string"} for name in names},
        "required": names if required else [],
    }


def test_a_schema_at_the_property_limit_is_compiled_generated_and_matched() -> None:
    compiled = compile_schema(wide(MAX_PROPERTIES), path="parameters")
    value = compiled.generate(random.Random(0), ToolCallOptions())
    assert isinstance(value, dict) and len(value) == MAX_PROPERTIES
    assert compiled.root.matches(value)


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        (wide(MAX_PROPERTIES + 1), f"at most {MAX_PROPERTIES} (MAX_PROPERTIES)"),
        (wide(16_000, required=False), f"at most {MAX_PROPERTIES} (MAX_PROPERTIES)"),
        (  # required names count too: each one is generated
            {"type": "object", "required": [f"r{i}" for i in range(MAX_PROPERTIES + 1)]},
            "(MAX_PROPERTIES)",
        ),
        (  # spread over nested objects
            {"type": "object", "properties": {f"o{i}": wide(1_000) for i in range(6)}},
            "(MAX_PROPERTIES)",
        ),
        (
            {"type": "object", "properties": {"e": {"enum": list(range(MAX_ENUM + 1))}}},
            f"has {MAX_ENUM + 1} values; llmsim accepts at most {MAX_ENUM} (MAX_ENUM)",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "array", "prefixItems": [{"type": "string"}] * MAX_NODES}}},
            f"more than {MAX_NODES} (MAX_NODES)",
        ),
    ],
)
def test_schemas_beyond_a_limit_are_refused_naming_it(schema: dict[str, Any], named: str) -> None:
    jsonschema._compile_text.cache_clear()
    with pytest.raises(ToolSchemaError) as refused:
        compile_schema(schema, path="parameters")
    assert named in str(refused.value)


def test_an_enum_at_the_limit_is_accepted() -> None:
    schema = {"type": "object", "properties": {"e": {"enum": list(range(MAX_ENUM))}}, "required": ["e"]}
    value = compile_schema(schema, path="parameters").generate(random.Random(1), ToolCallOptions())
    assert isinstance(value, dict) and value["e"] in range(MAX_ENUM)


async def test_a_response_format_with_16000_properties_is_a_400_naming_the_limit(autojump_clock: MockClock) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "big", "schema": wide(16_000)}}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "response_format": fmt}
    async with running() as sim:
        response = await post(sim, "/v1/chat/completions", body)
        health = await post(sim, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert response.status == 400, response.body
    error = response.json()["error"]
    assert error["type"] == "BadRequestError"
    assert "16000 properties; llmsim accepts at most 5000 (MAX_PROPERTIES)" in error["message"]
    assert health.status == 200
