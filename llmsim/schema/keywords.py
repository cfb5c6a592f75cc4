"""Raw JSON Schema keywords: checking their values, and merging the parts of an allOf.

This is the layer under :mod:`llmsim.schema.jsonschema` that works on schemas as
parsed JSON (dicts, lists, numbers).  :func:`normalize` refuses keywords llmsim cannot
honour and keyword values of the wrong shape; :func:`merge_parts` turns several schemas
that must all hold (``allOf``, ``$ref`` with siblings) into one, with the rules a
validator applies: types intersected, bounds tightened, each property governed by its
declaration or its part's ``additionalProperties``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "COMBINATORS", "KIND_KEYWORDS", "SUPPORTED", "TYPES", "ToolSchemaError",
    "all_of", "at", "json_key", "merge_parts", "normalize", "types_of",
]  # fmt: skip

TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
KIND_KEYWORDS = (
    ("object", ("properties", "required", "additionalProperties")),
    ("array", ("items", "prefixItems", "minItems", "maxItems", "uniqueItems")),
    ("string", ("minLength", "maxLength", "pattern", "format")),
    ("number", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")),
)
COMBINATORS = ("anyOf", "oneOf")
SUPPORTED = frozenset(
    {"type", "enum", "const", "$ref", "allOf", *COMBINATORS, *(k for _, kws in KIND_KEYWORDS for k in kws)}
)
_UNSUPPORTED = {
    "not": "llmsim cannot generate values that must avoid a schema",
    "if": "conditional schemas are not supported",
    "then": "conditional schemas are not supported",
    "else": "conditional schemas are not supported",
    "dependentRequired": "property dependencies are not supported",
    "dependentSchemas": "property dependencies are not supported",
    "dependencies": "property dependencies are not supported",
    "patternProperties": "properties matched by name patterns are not supported; list them in properties",
    "propertyNames": "constraints on property names are not supported",
    "unevaluatedProperties": "use additionalProperties instead",
    "unevaluatedItems": "use items with prefixItems instead",
    "additionalItems": "is draft 2019 syntax; use items with prefixItems (draft 2020-12)",
    "contains": "contains constraints are not supported",
    "minContains": "contains constraints are not supported",
    "maxContains": "contains constraints are not supported",
    "minProperties": "property counts are not supported; use required",
    "maxProperties": "property counts are not supported",
    "$dynamicRef": "only local $ref to #/$defs or #/definitions is supported",
    "$recursiveRef": "only local $ref to #/$defs or #/definitions is supported",
}


class ToolSchemaError(ValueError):
    """A tool's parameters schema that llmsim cannot honour (the API answers 400)."""

    def __init__(self, path: str, keyword: str, problem: str) -> None:
        super().__init__(f"{path}: {keyword!r} {problem}")
        self.path = path
        self.keyword = keyword


# --- paths and JSON values ------------------------------------------------------------

_IDENTIFIER = re.compile(r"[A-Za-z_$][A-Za-z0-9_$-]*\Z")


def at(path: str, *segments: str | int) -> str:
    """``path`` extended by keywords, property names and indexes, as error messages show it."""
    for segment in segments:
        if isinstance(segment, int):
            path += f"[{segment}]"
        elif _IDENTIFIER.match(segment):
            path += f".{segment}"
        else:
            path += f"[{json.dumps(segment, ensure_ascii=False)}]"
    return path


def json_key(value: object) -> object:
    """A hashable identity with JSON equality: ``1 == 1.0``, ``true != 1``, key order ignored."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(json_key(item) for item in value))
    if isinstance(value, dict):
        return ("object", frozenset((name, json_key(item)) for name, item in value.items()))
    raise TypeError(f"not a JSON value: {value!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --- keyword values -------------------------------------------------------------------


def normalize(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """Check every keyword's value; make counts ints and draft-4 boolean exclusive bounds numbers."""
    for keyword, value in schema.items():
        if keyword in _UNSUPPORTED:
            raise ToolSchemaError(at(path, keyword), keyword, f"is not supported: {_UNSUPPORTED[keyword]}")
        problem = _CHECKS[keyword](value) if keyword in _CHECKS else None
        if problem is not None:
            raise ToolSchemaError(at(path, keyword), keyword, problem)
    out = dict(schema)
    for keyword in ("minLength", "maxLength", "minItems", "maxItems"):
        if keyword in out:
            out[keyword] = int(out[keyword])
    for exclusive, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(exclusive), bool) and out.pop(exclusive) and inclusive in out:
            out[exclusive] = out.pop(inclusive)
    return out


def _expect(valid: bool, expected: str, value: object) -> str | None:
    """None when ``valid``, else the problem: what the keyword needs and what it got."""
    return None if valid else f"must be {expected}, got {json.dumps(value, ensure_ascii=False)[:80]}"


def _check_type(value: object) -> str | None:
    names = value if isinstance(value, list) else [value]
    valid = bool(names) and all(name in TYPES for name in names) and len(set(map(str, names))) == len(names)
    return _expect(valid, f"one of {', '.join(TYPES)} or a list of distinct ones", value)


def _check_schema(value: object) -> str | None:
    if isinstance(value, list):
        return "as a list is draft-07 tuple syntax; use prefixItems (draft 2020-12)"
    return _expect(isinstance(value, (dict, bool)), "a schema (an object or a boolean)", value)


def _check_count(value: object) -> str | None:
    valid = _is_number(value) and value >= 0 and float(value).is_integer()  # type: ignore[operator, arg-type]
    return _expect(valid, "a non-negative integer", value)


def _check_number(value: object) -> str | None:
    return _expect(_is_number(value) and math.isfinite(value), "a number", value)  # type: ignore[arg-type]


def _check_multiple_of(value: object) -> str | None:
    valid = _is_number(value) and math.isfinite(value) and value > 0  # type: ignore[arg-type, operator]
    return _expect(valid, "a number greater than 0", value)


def _list_of(
    kind: type | tuple[type, ...], expected: str, *, non_empty: bool = False
) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        valid = isinstance(value, list) and all(isinstance(item, kind) for item in value)
        return _expect(valid and (bool(value) or not non_empty), expected, value)

    return check


def _check_schema_map(value: object) -> str | None:
    valid = isinstance(value, dict) and all(isinstance(item, (dict, bool)) for item in value.values())
    return _expect(valid, "an object whose values are schemas", value)


def _instance_of(kind: type, expected: str) -> Callable[[object], str | None]:
    return lambda value: _expect(isinstance(value, kind), expected, value)


def _check_exclusive_bound(value: object) -> str | None:
    return None if isinstance(value, bool) else _check_number(value)  # a bool is draft 4's form


_SCHEMA_LIST = _list_of((dict, bool), "a non-empty list of schemas", non_empty=True)
_CHECKS: dict[str, Callable[[object], str | None]] = {
    "type": _check_type,
    "enum": _list_of(object, "a non-empty list", non_empty=True),
    "properties": _check_schema_map,
    "required": _list_of(str, "a list of property names"),
    "additionalProperties": _check_schema,
    "items": _check_schema,
    "prefixItems": _SCHEMA_LIST,
    "anyOf": _SCHEMA_LIST,
    "oneOf": _SCHEMA_LIST,
    "allOf": _SCHEMA_LIST,
    "minItems": _check_count,
    "maxItems": _check_count,
    "minLength": _check_count,
    "maxLength": _check_count,
    "minimum": _check_number,
    "maximum": _check_number,
    "exclusiveMinimum": _check_exclusive_bound,
    "exclusiveMaximum": _check_exclusive_bound,
    "multipleOf": _check_multiple_of,
    "uniqueItems": _instance_of(bool, "true or false"),
    "pattern": _instance_of(str, "a regular expression string"),
    "format": _instance_of(str, "a string"),
    "$ref": _instance_of(str, "a string"),
}


def types_of(schema: Mapping[str, Any]) -> frozenset[str]:
    """The types ``schema`` allows (all of them when it has no ``type``)."""
    value = schema.get("type", list(TYPES))
    return frozenset(value if isinstance(value, list) else [value])


# --- merging ---------------------------------------------------------------------------


def merge_parts(parts: list[tuple[dict[str, Any], str]], path: str) -> dict[str, Any]:
    """One schema equivalent to all ``parts`` at once (no $ref/allOf/anyOf/oneOf inside)."""
    schemas = [p for p, _ in parts]
    out: dict[str, Any] = {}

    def present(keyword: str) -> list[Any]:
        return [s[keyword] for s in schemas if keyword in s]

    if present("type"):
        types = frozenset(TYPES)
        for value in present("type"):
            listed = set(value if isinstance(value, list) else [value])
            types &= listed | ({"integer"} if "number" in listed else set())
        if not types:
            raise ToolSchemaError(
                path,
                "allOf",
                "requires types that no value has at once: " + " and ".join(json.dumps(v) for v in present("type")),
            )
        out["type"] = [t for t in TYPES if t in types and not (t == "integer" and "number" in types)]
    values = [[s["const"]] for s in schemas if "const" in s] + present("enum")
    if values:
        keys = set.intersection(*({json_key(v) for v in vs} for vs in values))
        out["enum"] = [v for v in values[0] if json_key(v) in keys]
        if not out["enum"]:
            raise ToolSchemaError(path, "allOf", "combines enum/const values that have no value in common")
    for keyword in ("minimum", "exclusiveMinimum", "minLength", "minItems"):
        if present(keyword):
            out[keyword] = max(present(keyword))
    for keyword in ("maximum", "exclusiveMaximum", "maxLength", "maxItems"):
        if present(keyword):
            out[keyword] = min(present(keyword))
    _merge_equal(out, present, path)
    if any(present("uniqueItems")):
        out["uniqueItems"] = True
    if present("required"):
        out["required"] = list(dict.fromkeys(name for names in present("required") for name in names))
    _merge_objects(out, schemas)
    _merge_arrays(out, schemas)
    return out


def _merge_equal(out: dict[str, Any], present: Callable[[str], list[Any]], path: str) -> None:
    steps = present("multipleOf")
    if steps and all(float(s).is_integer() for s in steps):
        out["multipleOf"] = math.lcm(*(int(s) for s in steps))
    elif steps:
        if len(set(steps)) > 1:
            raise ToolSchemaError(path, "multipleOf", "values in allOf differ and are not all integers")
        out["multipleOf"] = steps[0]
    if present("pattern"):
        if len(set(present("pattern"))) > 1:
            raise ToolSchemaError(path, "pattern", "values in allOf differ; llmsim generates strings for one pattern")
        out["pattern"] = present("pattern")[0]
    if present("format"):
        out["format"] = present("format")[0]  # an annotation: keeping one loses no validity


def all_of(schemas: list[object]) -> object:
    kept = [s for s in schemas if s is not True and s != {}]
    if any(s is False for s in kept):
        return False
    return True if not kept else kept[0] if len(kept) == 1 else {"allOf": kept}


def _merge_objects(out: dict[str, Any], schemas: list[dict[str, Any]]) -> None:
    """Each part governs a property by its declaration or its additionalProperties."""
    if not any("properties" in s or "additionalProperties" in s for s in schemas):
        return
    names = dict.fromkeys(name for s in schemas for name in s.get("properties", {}))
    out["properties"] = {
        name: all_of(
            [
                s["properties"][name] if name in s.get("properties", {}) else s.get("additionalProperties", True)
                for s in schemas
            ]
        )
        for name in names
    }
    if any("additionalProperties" in s for s in schemas):
        out["additionalProperties"] = all_of([s.get("additionalProperties", True) for s in schemas])


def _merge_arrays(out: dict[str, Any], schemas: list[dict[str, Any]]) -> None:
    """Position i obeys each part's prefixItems[i], or that part's items beyond its prefix."""
    length = max((len(s.get("prefixItems", ())) for s in schemas), default=0)

    def governing(s: dict[str, Any], i: int) -> object:
        prefix = s.get("prefixItems", ())
        return prefix[i] if i < len(prefix) else s.get("items", True)

    if length:
        out["prefixItems"] = [all_of([governing(s, i) for s in schemas]) for i in range(length)]
    if any("items" in s for s in schemas):
        out["items"] = all_of([s.get("items", True) for s in schemas])
