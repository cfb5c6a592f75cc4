"""Every way a tool schema is refused: a ToolSchemaError naming the JSON path and keyword."""

from __future__ import annotations

import random
from typing import Any

import pytest

from llmsim.model.tools import ToolCallOptions, ToolSchemaError, compile_schema, validate_tool_parameters
from llmsim.schema.limits import MAX_MIN_ITEMS, MAX_MIN_LENGTH

P = "tools[2].function.parameters"


def prop(schema: object, name: str = "a") -> dict[str, Any]:
    """A parameters object whose required property ``name`` has ``schema``."""
    return {"type": "object", "properties": {name: schema}, "required": [name]}


def refused(schema: object) -> ToolSchemaError:
    with pytest.raises(ToolSchemaError) as info:
        validate_tool_parameters(schema, path=P)
    return info.value


def assert_refused(schema: object, path: str, keyword: str, *words: str) -> None:
    error = refused(schema)
    message = str(error)
    assert (error.path, error.keyword) == (path, keyword), message
    assert message.startswith(f"{path}: {keyword!r} ")
    for word in words:
        assert word in message


UNSUPPORTED = [
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "patternProperties",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
    "contains",
    "minContains",
    "maxContains",
    "minProperties",
    "maxProperties",
    "$dynamicRef",
    "$recursiveRef",
]


@pytest.mark.parametrize("keyword", UNSUPPORTED)
def test_unsupported_keywords(keyword: str) -> None:
    assert_refused(prop({keyword: {}}), f"{P}.properties.a.{keyword}", keyword, "not supported")


@pytest.mark.parametrize(
    ("keyword", "value", "expected"),
    [
        ("type", "strnig", "one of null, boolean"),
        ("type", ["string", "string"], "distinct"),
        ("type", [], "one of"),
        ("enum", [], "a non-empty list"),
        ("enum", "red", "a non-empty list"),
        ("properties", [], "an object whose values are schemas"),
        ("properties", {"x": 3}, "an object whose values are schemas"),
        ("required", "a", "a list of property names"),
        ("required", [1], "a list of property names"),
        ("additionalProperties", 3, "a schema"),
        ("items", [{"type": "string"}], "prefixItems"),
        ("items", "string", "a schema"),
        ("prefixItems", [], "a non-empty list of schemas"),
        ("anyOf", [3], "a non-empty list of schemas"),
        ("oneOf", {}, "a non-empty list of schemas"),
        ("allOf", [], "a non-empty list of schemas"),
        ("minItems", -1, "a non-negative integer"),
        ("maxItems", True, "a non-negative integer"),
        ("minLength", 1.5, "a non-negative integer"),
        ("maxLength", "3", "a non-negative integer"),
        ("minimum", "3", "a number"),
        ("maximum", False, "a number"),
        ("exclusiveMinimum", "x", "a number"),
        ("exclusiveMaximum", None, "a number"),
        ("multipleOf", 0, "greater than 0"),
        ("multipleOf", -2, "greater than 0"),
        ("uniqueItems", "yes", "true or false"),
        ("pattern", 3, "a regular expression string"),
        ("format", 3, "a string"),
        ("$ref", 3, "a string"),
    ],
)
def test_malformed_keyword_values(keyword: str, value: object, expected: str) -> None:
    assert_refused(prop({keyword: value}), f"{P}.properties.a.{keyword}", keyword, expected)


def test_property_names_that_are_not_identifiers_are_quoted_in_paths() -> None:
    assert_refused(prop({"not": {}}, "x y"), f'{P}.properties["x y"].not', "not")


@pytest.mark.parametrize(
    ("schema", "path", "keyword", "words"),
    [
        # the parameters themselves
        (False, P, "false", ("accepts no value",)),
        (3, P, "type", ("JSON object or boolean",)),
        ({"type": "string"}, P, "type", ("must be 'object'",)),
        ({"anyOf": [{"type": "object"}, {"type": "string"}]}, f"{P}.anyOf[1]", "type", ("must be 'object'",)),
        ({"anyOf": [{"type": "object"}, {"enum": [3]}]}, f"{P}.anyOf[1]", "enum", ("only objects",)),
        # combinators
        (prop({"anyOf": [False, False]}), f"{P}.properties.a.anyOf", "anyOf", ("only false branches",)),
        (
            prop({"oneOf": [{"type": "integer"}, {"type": "number"}]}),
            f"{P}.properties.a.oneOf",
            "oneOf",
            ("branches 0 and 1", "use anyOf"),
        ),
        (
            prop(
                {
                    "oneOf": [
                        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                        {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]},
                    ]
                }
            ),
            f"{P}.properties.a.oneOf",
            "oneOf",
            ("discriminator",),
        ),
        (
            prop({"allOf": [{"anyOf": [{"type": "string"}]}, {"oneOf": [{"minLength": 1}]}]}),
            f"{P}.properties.a",
            "allOf",
            ("anyOf with oneOf",),
        ),
        (
            prop(
                {
                    "allOf": [
                        {"anyOf": [{"minimum": i} for i in range(9)]},
                        {"anyOf": [{"maximum": i} for i in range(9)]},
                    ]
                }
            ),
            f"{P}.properties.a",
            "anyOf",
            ("more than 64 branches",),
        ),
        (prop({"allOf": [False]}), f"{P}.properties.a.allOf[0]", "allOf", ("false schema",)),
        (
            prop({"allOf": [{"type": "string"}, {"type": "integer"}]}),
            f"{P}.properties.a",
            "allOf",
            ("no value has at once",),
        ),
        (prop({"allOf": [{"enum": [1, 2]}, {"const": 3}]}), f"{P}.properties.a", "allOf", ("no value in common",)),
        (prop({"allOf": [{"multipleOf": 0.5}, {"multipleOf": 0.3}]}), f"{P}.properties.a", "multipleOf", ("differ",)),
        (prop({"allOf": [{"pattern": "a"}, {"pattern": "b"}]}), f"{P}.properties.a", "pattern", ("one pattern",)),
        # $ref
        (prop({"$ref": "https://example.com/s.json"}), f"{P}.properties.a", "$ref", ("only references inside",)),
        (prop({"$ref": "#/$defs/missing"}), f"{P}.properties.a", "$ref", ("points to nothing",)),
        (
            {
                **prop({"$ref": "#/$defs/loop"}),
                "$defs": {"loop": {"anyOf": [{"$ref": "#/$defs/loop"}, {"type": "null"}]}},
            },
            f"{P}.$defs.loop.anyOf[0]",
            "$ref",
            ("no object or array in between",),
        ),
        (
            {**prop({"$ref": "#/$defs/loop"}), "$defs": {"loop": {"$ref": "#/$defs/loop", "minimum": 1}}},
            f"{P}.$defs.loop",
            "$ref",
            ("deeper than 32",),
        ),
        (
            {**prop({"$ref": "#/$defs/n", "minimum": 1}), "$defs": {"n": 3}},
            f"{P}.$defs.n",
            "type",
            ("JSON object or boolean",),
        ),
        (
            {
                **prop({"$ref": "#/$defs/n"}),
                "$defs": {"n": {"type": "object", "required": ["c"], "properties": {"c": {"$ref": "#/$defs/n"}}}},
            },
            f"{P}.$defs.n",
            "$ref",
            ("no finite value",),
        ),
        (
            {
                **prop({"$ref": "#/$defs/n"}),
                "$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "enum": [{"c": {}}]}},
            },
            f"{P}.$defs.n",
            "$ref",
            ("enum/const check",),
        ),
        # values and types
        (prop({"type": "string", "enum": [1, 2]}), f"{P}.properties.a.enum", "enum", ("no value that satisfies",)),
        (prop({"const": 5, "maximum": 4}), f"{P}.properties.a.const", "const", ("no value that satisfies",)),
        (
            prop({"type": "integer", "multipleOf": 0.5}),
            f"{P}.properties.a.multipleOf",
            "multipleOf",
            ("integer multipleOf",),
        ),
        (prop({"type": "integer", "minimum": 5, "maximum": 1}), f"{P}.properties.a", "minimum", ("no valid integer",)),
        (
            prop({"type": "integer", "minimum": 1, "maximum": 9, "multipleOf": 10}),
            f"{P}.properties.a",
            "minimum",
            ("no valid integer",),
        ),
        (
            prop({"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1}),
            f"{P}.properties.a",
            "minimum",
            ("no valid number",),
        ),
        # strings
        (
            prop({"type": "string", "minLength": MAX_MIN_LENGTH + 1}),
            f"{P}.properties.a.minLength",
            "minLength",
            (str(MAX_MIN_LENGTH),),
        ),
        (
            prop({"type": "string", "minLength": 5, "maxLength": 4}),
            f"{P}.properties.a.minLength",
            "minLength",
            ("exceeds maxLength",),
        ),
        (
            prop({"type": "string", "pattern": r"^\d{3}$", "maxLength": 2}),
            f"{P}.properties.a.pattern",
            "pattern",
            ("cannot produce",),
        ),
        (prop({"type": "string", "pattern": "(?=x)x"}), f"{P}.properties.a.pattern", "pattern", ("lookahead",)),
        # arrays
        (
            prop({"type": "array", "minItems": MAX_MIN_ITEMS + 1}),
            f"{P}.properties.a.minItems",
            "minItems",
            (str(MAX_MIN_ITEMS),),
        ),
        (prop({"type": "array", "minItems": 3, "maxItems": 2}), f"{P}.properties.a.minItems", "minItems", ("exceeds",)),
        (
            prop({"type": "array", "prefixItems": [{}], "items": False, "minItems": 2}),
            f"{P}.properties.a.minItems",
            "minItems",
            ("prefixItems",),
        ),
        (
            prop({"type": "array", "prefixItems": [{}, False], "minItems": 2}),
            f"{P}.properties.a.minItems",
            "minItems",
            ("exceeds",),
        ),
        (
            prop({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 3}),
            f"{P}.properties.a.uniqueItems",
            "uniqueItems",
            ("only 2 different values",),
        ),
        (
            prop({"type": "array", "items": {"type": "object"}, "uniqueItems": True, "minItems": 2}),
            f"{P}.properties.a.uniqueItems",
            "uniqueItems",
            ("only 1 different values",),
        ),
        (
            prop(
                {"type": "array", "items": {"type": "string", "pattern": "^[ab]$"}, "uniqueItems": True, "minItems": 2}
            ),
            f"{P}.properties.a.uniqueItems",
            "uniqueItems",
            ("about 2 different values",),
        ),
        (
            prop({"type": "array", "minItems": 1000, "items": {"type": "array", "minItems": 1000}}),
            P,
            "minItems",
            ("at most 100000",),
        ),
        # objects
        (
            {"type": "object", "required": ["x"], "additionalProperties": False},
            f"{P}.required",
            "required",
            ("'x'", "forbids"),
        ),
        ({"type": "object", "properties": {"x": False}, "required": ["x"]}, f"{P}.required", "required", ("'x'",)),
    ],
)
def test_refusals(schema: object, path: str, keyword: str, words: tuple[str, ...]) -> None:
    assert_refused(schema, path, keyword, *words)


def test_unique_items_short_of_values_at_generation_time_is_a_schema_error() -> None:
    """An ambiguous pattern makes llmsim overestimate its variety; generation then says so."""
    items = {"type": "string", "pattern": "^(a|a|a|a)$"}
    schema = prop({"type": "array", "items": items, "uniqueItems": True, "minItems": 2})
    compiled = compile_schema(schema, path=P)
    with pytest.raises(ToolSchemaError) as info:
        compiled.generate(random.Random(0), ToolCallOptions())
    assert (info.value.path, info.value.keyword) == (f"{P}.properties.a", "uniqueItems")


def test_everything_refused_is_refused_before_generation() -> None:
    """validate_tool_parameters and compile_schema refuse the same schemas, with the same error."""
    schema = prop({"type": "string", "pattern": r"\bword"})
    with pytest.raises(ToolSchemaError) as first:
        compile_schema(schema, path=P)
    assert str(first.value) == str(refused(schema))


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = prop(schema)
    return schema


def test_schemas_nested_too_deeply_are_refused() -> None:
    compile_schema(nested(60), path=P)
    error = refused(nested(100))
    assert error.keyword == "properties" and "deeper than 64 levels" in str(error)


def test_values_nested_too_deeply_are_refused() -> None:
    value: object = 1
    for _ in range(2000):
        value = [value]
    error = refused(prop({"enum": [value]}))
    assert (error.path, error.keyword) == (P, "type") and "recursion limit" in str(error).lower()
