"""Tool-argument generation against JSON Schema Draft 2020-12, checked by ``jsonschema``.

Two hypothesis strategies build nested schemas from the supported keywords:
``friendly_schemas`` only builds schemas llmsim must accept, ``wild_schemas`` combines
keywords at random (contradictions, unsupported keywords, dangling or recursive $ref).
For both: whatever compiles generates values the validator accepts, and nothing but
ToolSchemaError ever escapes.
"""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llmsim.model.tools import ToolCallOptions, ToolSchemaError, arguments_json, compile_schema, generate_arguments

Schema = dict[str, Any]
PATH = "tools[0].function.parameters"
SEEDS = range(8)
DEFAULT_OPTIONS = ToolCallOptions()
# Drawing a nested schema takes long enough to trip Hypothesis's too_slow health check.
SLOW_TO_DRAW = settings(suppress_health_check=[HealthCheck.too_slow])


NAMES = st.sampled_from(["city", "unit", "days", "a", "b", "x y", "ünï"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-20, 20),
    st.sampled_from([0.5, -2.25, 3.0]),
    st.sampled_from(["red", "green", "", "é"]),
)
FRIENDLY_PATTERNS = [
    r"^\d{3}-\d{4}$",
    r"^[A-Z]{2,3}$",
    r"^[a-z0-9_]+$",
    r"^(\+\d{1,3})?\d{10}$",
    r"^#[0-9a-fA-F]{6}$",
    r"abc",
    r"^(?:foo|bar)*baz$",
    r"(?i)^[^a-z]+$",
    r"\w+\s\W",
    r"^https?://.*",
    r"^(\d+\.)*\d+$",
    r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$",
]
FORMATS = ["date", "date-time", "time", "email", "uri", "uuid", "hostname", "ipv4", "ipv6", "color"]


def validate(schema: object, *values: object) -> None:
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for value in values:
        validator.validate(value)


def generate_all(schema: object, options: ToolCallOptions = DEFAULT_OPTIONS, seeds: range = SEEDS) -> list[object]:
    compiled = compile_schema(schema, path=PATH)
    return [compiled.generate(random.Random(seed), options) for seed in seeds]


# --- friendly schemas: all must compile ----------------------------------------------------


@st.composite
def integer_schemas(draw: st.DrawFn) -> Schema:
    schema: Schema = {"type": "integer"}
    step = draw(st.sampled_from([None, 1, 2, 5]))
    low = draw(st.one_of(st.none(), st.integers(-50, 50)))
    if low is not None:
        schema["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = low
    if draw(st.booleans()):
        schema["maximum"] = (low if low is not None else 0) + (step or 1) + 2 + draw(st.integers(0, 40))
    if step:
        schema["multipleOf"] = step
    return schema


@st.composite
def number_schemas(draw: st.DrawFn) -> Schema:
    schema: Schema = {"type": "number"}
    step = draw(st.sampled_from([None, 0.5, 0.25, 0.01, 0.1, 2]))
    low = draw(st.one_of(st.none(), st.floats(-100, 100, allow_nan=False)))
    if low is not None:
        schema["exclusiveMinimum" if draw(st.booleans()) else "minimum"] = low
    if draw(st.booleans()):
        high = (low if low is not None else 0) + 3 * (step or 1) + draw(st.floats(0.5, 100))
        schema["exclusiveMaximum" if draw(st.booleans()) else "maximum"] = high
    if step:
        schema["multipleOf"] = step
    return schema


@st.composite
def string_schemas(draw: st.DrawFn) -> Schema:
    schema: Schema = {"type": "string"}
    flavour = draw(st.sampled_from(["plain", "lengths", "pattern", "format"]))
    if flavour == "lengths":
        low = draw(st.integers(0, 30))
        schema["minLength"] = low
        if draw(st.booleans()):
            schema["maxLength"] = low + draw(st.integers(0, 10))
    elif flavour == "pattern":
        schema["pattern"] = draw(st.sampled_from(FRIENDLY_PATTERNS))
    elif flavour == "format":
        schema["format"] = draw(st.sampled_from(FORMATS))
    return schema


@st.composite
def enum_schemas(draw: st.DrawFn) -> Schema:
    values = draw(st.lists(SCALARS, min_size=1, max_size=5))
    if draw(st.booleans()):
        return {"const": values[0]}
    schema: Schema = {"enum": values}
    if all(isinstance(v, str) for v in values) and draw(st.booleans()):
        schema["type"] = "string"
    return schema


LEAVES = st.one_of(
    st.sampled_from(
        [
            {"type": "null"},
            {"type": "boolean"},
            {},
            {"type": ["string", "null"]},
            {"type": ["integer", "string"], "minimum": 3, "maxLength": 4},
        ]
    ),
    integer_schemas(),
    number_schemas(),
    string_schemas(),
    enum_schemas(),
)


@st.composite
def object_schemas(draw: st.DrawFn, children: st.SearchStrategy[Schema]) -> Schema:
    properties = draw(st.dictionaries(NAMES, children, max_size=4))
    schema: Schema = {"type": "object", "properties": properties}
    schema["required"] = draw(st.lists(st.sampled_from(sorted(properties)), unique=True)) if properties else []
    extra = draw(st.sampled_from(["absent", "true", "false", "schema"]))
    if extra != "absent":
        schema["additionalProperties"] = draw(children) if extra == "schema" else extra == "true"
    if extra != "false" and draw(st.booleans()):
        schema["required"].append("undeclared")
    return schema


@st.composite
def array_schemas(draw: st.DrawFn, children: st.SearchStrategy[Schema]) -> Schema:
    schema: Schema = {"type": "array"}
    if draw(st.booleans()):
        schema["items"] = draw(children)
    if draw(st.booleans()):
        schema["prefixItems"] = draw(st.lists(children, min_size=1, max_size=3))
    low = draw(st.integers(0, 3))
    schema["minItems"] = low
    if draw(st.booleans()):
        schema["maxItems"] = low + draw(st.integers(0, 4))
    if low <= 1 and draw(st.booleans()):
        schema["uniqueItems"] = True
    return schema


@st.composite
def tagged_union(draw: st.DrawFn, children: st.SearchStrategy[Schema]) -> Schema:
    """oneOf that llmsim must accept: distinct types, or a discriminator property."""
    if draw(st.booleans()):
        kinds = draw(
            st.lists(st.sampled_from(["null", "boolean", "string", "array", "object"]), min_size=2, unique=True)
        )
        return {"oneOf": [{"type": kind} for kind in kinds]}
    tags = draw(st.lists(st.sampled_from(["cat", "dog", "fish"]), min_size=2, unique=True))
    branches = []
    for tag in tags:
        branch = draw(object_schemas(children))
        branch["properties"]["kind"] = {"const": tag}
        branch["required"] = [*branch["required"], "kind"]
        branches.append(branch)
    return {"oneOf": branches}


@st.composite
def split_all_of(draw: st.DrawFn, children: st.SearchStrategy[Schema]) -> Schema:
    """An object schema split into allOf parts (properties / required / annotations)."""
    whole = draw(object_schemas(children))
    required = whole.pop("required")
    return {"allOf": [whole, {"required": required}, {"description": "split"}]}


def friendly_children(children: st.SearchStrategy[Schema]) -> st.SearchStrategy[Schema]:
    return st.one_of(
        object_schemas(children),
        array_schemas(children),
        tagged_union(children),
        split_all_of(children),
        st.lists(children, min_size=1, max_size=3).map(lambda branches: {"anyOf": branches}),
    )


FRIENDLY = st.recursive(LEAVES, friendly_children, max_leaves=8)


@st.composite
def friendly_schemas(draw: st.DrawFn) -> Schema:
    root = draw(object_schemas(FRIENDLY))
    root["$defs"] = {
        "leaf": draw(FRIENDLY),
        "tree": {
            "type": "object",
            "properties": {
                "label": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/tree"}},
            },
            "required": ["label"],
        },
    }
    root["properties"]["ref"] = {"$ref": "#/$defs/leaf"}
    root["properties"]["tree"] = {"$ref": "#/$defs/tree", "description": "a recursive reference"}
    return root


@SLOW_TO_DRAW
@given(friendly_schemas())
def test_friendly_schemas_compile_and_generate_valid_arguments(schema: Schema) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    values = generate_all(schema, seeds=range(4))
    validate(schema, *values)
    assert all(json.loads(arguments_json(value)) == value for value in values)


@SLOW_TO_DRAW
@given(friendly_schemas(), st.integers(0, 100), st.integers(0, 100), st.integers(0, 8), st.integers(0, 8))
def test_options_never_break_validity(schema: Schema, optional: int, nested: int, low: int, extra: int) -> None:
    options = ToolCallOptions(
        min_tool_call_integer_param=-1000,
        max_tool_call_integer_param=1000,
        min_tool_call_number_param=-5.5,
        max_tool_call_number_param=1e6,
        min_tool_call_array_param_length=low,
        max_tool_call_array_param_length=low + extra,
        tool_call_not_required_param_probability=optional,
        object_tool_call_not_required_field_probability=nested,
    )
    validate(schema, *generate_all(schema, options, seeds=range(4)))


# --- wild schemas: either refused with ToolSchemaError or valid ------------------------------

WILD_PATTERNS = [*FRIENDLY_PATTERNS, r"(?=a)b", r"\bword", r"(a)\1", r"a^b", r"[", r"x{300}", r".*"]


@st.composite
def wild_keywords(draw: st.DrawFn, children: st.SearchStrategy[object]) -> Schema:
    optional: dict[str, st.SearchStrategy[Any]] = {
        "type": st.one_of(
            st.sampled_from(["null", "boolean", "integer", "number", "string", "array", "object"]),
            st.lists(
                st.sampled_from(["integer", "number", "string", "null", "object"]), min_size=1, max_size=3, unique=True
            ),
        ),
        "minimum": st.integers(-10, 10),
        "maximum": st.integers(-10, 10),
        "exclusiveMinimum": st.floats(-10, 10, allow_nan=False),
        "exclusiveMaximum": st.integers(-10, 10),
        "multipleOf": st.sampled_from([1, 2, 3, 0.5, 0.1, 0.3, 7]),
        "minLength": st.integers(0, 12),
        "maxLength": st.integers(0, 12),
        "pattern": st.sampled_from(WILD_PATTERNS),
        "format": st.sampled_from(FORMATS),
        "enum": st.lists(SCALARS, min_size=1, max_size=4),
        "const": SCALARS,
        "items": children,
        "prefixItems": st.lists(children, min_size=1, max_size=2),
        "minItems": st.integers(0, 4),
        "maxItems": st.integers(0, 4),
        "uniqueItems": st.booleans(),
        "properties": st.dictionaries(NAMES, children, max_size=3),
        "required": st.lists(NAMES, max_size=3, unique=True),
        "additionalProperties": children,
        "anyOf": st.lists(children, min_size=1, max_size=3),
        "oneOf": st.lists(children, min_size=1, max_size=3),
        "allOf": st.lists(children, min_size=1, max_size=3),
        "$ref": st.sampled_from(["#/$defs/a", "#/$defs/b", "#/definitions/c", "#/$defs/missing", "#"]),
        "not": children,
    }
    keys = draw(st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True))
    return {key: draw(optional[key]) for key in keys}


WILD = st.recursive(st.one_of(st.booleans(), LEAVES), lambda children: wild_keywords(children), max_leaves=10)


@st.composite
def wild_schemas(draw: st.DrawFn) -> object:
    root = draw(st.one_of(wild_keywords(WILD), st.just({}), st.none()))
    if isinstance(root, dict):
        root["$defs"] = {"a": draw(WILD), "b": draw(WILD)}
        root["definitions"] = {"c": draw(WILD)}
    return root


@SLOW_TO_DRAW
@given(wild_schemas())
def test_wild_schemas_are_refused_cleanly_or_generate_valid_arguments(schema: object) -> None:
    try:
        values = generate_all(schema, seeds=range(4))
    except ToolSchemaError as exc:
        assert str(exc).startswith(PATH)
        event(f"refused: {exc.keyword}")
        return
    event("accepted")
    assert all(isinstance(value, dict) for value in values)
    validate({} if schema is None else schema, *values)


# --- specific behaviour ---------------------------------------------------------------------


def test_missing_parameters_mean_no_arguments() -> None:
    assert generate_all(None) == [{}] * len(SEEDS)
    assert arguments_json({}) == "{}"


def test_arguments_json_is_written_like_a_model() -> None:
    assert arguments_json({"city": "Zürich", "days": [1, 2]}) == '{"city": "Zürich", "days": [1, 2]}'


def test_generation_is_deterministic_per_seed() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "number"}}}
    options = ToolCallOptions()
    first = [generate_arguments(schema, random.Random(s), options=options) for s in range(20)]
    again = [generate_arguments(schema, random.Random(s), options=options) for s in range(20)]
    assert first == again
    assert len({json.dumps(v) for v in first}) > 5


def test_required_always_present_optional_follow_the_probability() -> None:
    schema = {"type": "object", "properties": {"r": {"type": "integer"}, "o": {"type": "integer"}}, "required": ["r"]}
    compiled = compile_schema(schema, path=PATH)
    for percent, expected in ((0, 0), (100, 200)):
        options = ToolCallOptions(tool_call_not_required_param_probability=percent)
        values = [compiled.generate(random.Random(s), options) for s in range(200)]
        assert all("r" in v for v in values)
        assert sum("o" in v for v in values) == expected
    values = [compiled.generate(random.Random(s), ToolCallOptions()) for s in range(400)]
    assert 140 < sum("o" in v for v in values) < 260


def test_nested_objects_use_their_own_probability() -> None:
    schema = {
        "type": "object",
        "required": ["inner"],
        "properties": {"inner": {"type": "object", "properties": {"o": {"type": "string"}}}},
    }
    options = ToolCallOptions(
        tool_call_not_required_param_probability=0, object_tool_call_not_required_field_probability=100
    )
    assert all("o" in v["inner"] for v in generate_all(schema, options))  # type: ignore[index]


def test_option_ranges_apply_when_the_schema_has_no_bounds() -> None:
    schema = {
        "type": "object",
        "required": ["i", "n", "a"],
        "properties": {
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "a": {"type": "array", "items": {"type": "boolean"}},
        },
    }
    options = ToolCallOptions(
        min_tool_call_integer_param=7,
        max_tool_call_integer_param=9,
        min_tool_call_number_param=2.0,
        max_tool_call_number_param=3.0,
        min_tool_call_array_param_length=2,
        max_tool_call_array_param_length=3,
    )
    for value in generate_all(schema, options):
        assert isinstance(value, dict)
        assert 7 <= value["i"] <= 9 and 2.0 <= value["n"] <= 3.0 and 2 <= len(value["a"]) <= 3


@pytest.mark.parametrize(
    ("keywords", "low", "high"),
    [
        ({"minimum": 500}, 500, 600),  # the option window moves up to the schema's range
        ({"maximum": -50}, -150, -50),
        ({"minimum": 40, "maximum": 45}, 40, 45),
        ({"exclusiveMinimum": 99, "exclusiveMaximum": 101}, 100, 100),
        ({"minimum": 1, "multipleOf": 1000}, 1000, 1000),
    ],
)
def test_schema_bounds_win_over_options(keywords: Schema, low: int, high: int) -> None:
    schema = {"type": "object", "required": ["v"], "properties": {"v": {"type": "integer", **keywords}}}
    for value in generate_all(schema):
        assert low <= value["v"] <= high  # type: ignore[index]


def test_array_bounds_win_over_options() -> None:
    schema = {"type": "object", "required": ["a"], "properties": {"a": {"type": "array", "minItems": 8}}}
    assert all(8 <= len(v["a"]) <= 12 for v in generate_all(schema))  # type: ignore[index]


def test_formats_are_realistic() -> None:
    properties = {name: {"type": "string", "format": name} for name in ("date", "date-time", "email", "uri", "uuid")}
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    value = generate_all(schema)[0]
    assert isinstance(value, dict)
    assert len(value["date"]) == 10 and value["date-time"].endswith("Z") and "T" in value["date-time"]
    assert value["email"].endswith("@example.com") and value["uri"].startswith("https://")
    assert value["uuid"][14] == "4"


def test_enum_values_are_filtered_by_the_rest_of_the_schema() -> None:
    schema = {
        "type": "object",
        "required": ["v"],
        "properties": {"v": {"type": "string", "enum": ["a", 1, "bb", None], "minLength": 2}},
    }
    assert {v["v"] for v in generate_all(schema)} == {"bb"}  # type: ignore[index]


def test_unique_items_sample_small_domains_without_repeats() -> None:
    schema = {
        "type": "object",
        "required": ["v"],
        "properties": {"v": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "uniqueItems": True, "minItems": 3}},
    }
    assert all(sorted(v["v"]) == ["x", "y", "z"] for v in generate_all(schema))  # type: ignore[index]


def test_recursion_is_capped_and_still_valid() -> None:
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "required": ["kids"],
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "type": "object",
        "required": ["root"],
        "properties": {"root": {"$ref": "#/$defs/node"}},
    }

    def depth(node: dict[str, Any]) -> int:
        return 1 + max((depth(kid) for kid in node["kids"]), default=0)

    options = ToolCallOptions(min_tool_call_array_param_length=5, max_tool_call_array_param_length=5)
    for value in generate_all(schema, options):
        validate(schema, value)
        assert isinstance(value, dict) and depth(value["root"]) <= 4


def test_discriminated_union_with_refs_is_accepted() -> None:
    schema = {
        "$defs": {
            "Cat": {
                "type": "object",
                "properties": {"pet_type": {"const": "cat"}, "lives": {"type": "integer"}},
                "required": ["pet_type"],
            },
            "Dog": {
                "type": "object",
                "properties": {"pet_type": {"const": "dog"}, "bark": {"type": "string"}},
                "required": ["pet_type"],
            },
        },
        "type": "object",
        "required": ["pet"],
        "properties": {
            "pet": {
                "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                "discriminator": {"propertyName": "pet_type"},
            }
        },
    }
    kinds = set()
    for seed in range(40):
        value = generate_arguments(schema, random.Random(seed), options=ToolCallOptions())
        validate(schema, value)
        kinds.add(value["pet"]["pet_type"])  # type: ignore[index]
    assert kinds == {"cat", "dog"}


def test_pydantic_style_optional_prefers_a_value_over_null() -> None:
    schema = {
        "type": "object",
        "required": ["v"],
        "properties": {"v": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}},
    }
    assert all(isinstance(v["v"], str) for v in generate_all(schema))  # type: ignore[index]


def test_anyof_with_sibling_keywords_is_distributed() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    for value in generate_all(schema):
        validate(schema, value)
        assert isinstance(value, dict) and ("a" in value or "b" in value)


def test_draft4_boolean_exclusive_bounds_are_honoured() -> None:
    schema = {
        "type": "object",
        "required": ["v"],
        "properties": {"v": {"type": "integer", "minimum": 5, "exclusiveMinimum": True, "maximum": 6}},
    }
    assert {v["v"] for v in generate_all(schema)} == {6}  # type: ignore[index]


def test_fractional_multiple_of_passes_a_validators_division_check() -> None:
    schema = {
        "type": "object",
        "required": ["p"],
        "properties": {"p": {"type": "number", "multipleOf": 0.07, "minimum": 0, "maximum": 1}},
    }
    options = ToolCallOptions()
    for seed in range(200):
        validate(schema, generate_arguments(schema, random.Random(seed), options=options))


def test_compiled_schemas_are_cached_per_text_and_path() -> None:
    schema = {
        "type": "object",
        "properties": {"b": {"type": "string"}, "a": {"type": "integer"}},
        "required": ["b", "a"],
    }
    first = compile_schema(schema, path=PATH)
    assert compile_schema(json.loads(json.dumps(schema)), path=PATH) is first
    assert compile_schema(schema, path="tools[1].function.parameters") is not first
    assert list(first.generate(random.Random(0), ToolCallOptions())) == ["b", "a"]  # declared order, like a model
