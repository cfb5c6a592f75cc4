"""How large a schema llmsim compiles: the bounds on what a client's schema may ask for.

Compiling is linear in the schema's size (~60 us a node), so the complexity bounds keep
any schema a client sends from holding the event loop for long; the size bounds keep
generated values to a size llmsim can produce and send.  A :class:`Budget` counts one
schema document's use of the complexity bounds as :mod:`llmsim.schema.jsonschema`
compiles it; each refusal is a :class:`~llmsim.schema.keywords.ToolSchemaError` that
names the bound.
"""

from __future__ import annotations

from typing import Any

import attrs

from llmsim.schema.keywords import ToolSchemaError, at

__all__ = [
    "MAX_ENUM",
    "MAX_MIN_ITEMS",
    "MAX_MIN_LENGTH",
    "MAX_MIN_SIZE",
    "MAX_NESTING",
    "MAX_NODES",
    "MAX_PROPERTIES",
    "Budget",
    "check_enum",
    "check_min_items",
    "check_min_length",
    "check_min_size",
]

MAX_MIN_LENGTH = 10_000  # largest minLength accepted
MAX_MIN_ITEMS = 1_000  # largest minItems accepted
MAX_MIN_SIZE = 100_000  # largest forced size (values, long strings count more)
MAX_NESTING = 64  # schemas nested deeper than this are refused
# Complexity bounds, so no schema a client sends can hold the event loop for long (compiling
# is linear in the schema's size: ~60 us a node).  5,000 properties is OpenAI's documented
# structured-output limit; an enum is generated from by sampling, so 1,000 values is plenty.
MAX_PROPERTIES = 5_000  # properties (declared or required) over the whole schema
MAX_ENUM = 1_000  # values in one enum
MAX_NODES = 10_000  # schemas compiled, $ref targets once, allOf/anyOf distribution included


@attrs.define
class Budget:
    """What one schema document has used so far of the complexity bounds."""

    nodes: int = 0  # schemas compiled so far (MAX_NODES)
    nesting: int = 0  # schemas being compiled, one inside the other (MAX_NESTING)
    properties: int = 0  # properties compiled so far (MAX_PROPERTIES)

    def enter(self, path: str) -> None:
        """Count the schema at ``path`` as it starts compiling (refused past MAX_NODES or
        MAX_NESTING); :meth:`leave` once it is compiled.  (A plain pair, not a context
        manager: it runs for every node, and a generator-based one costs ~15% of compiling.)"""
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise ToolSchemaError(path, "properties", f"and subschemas number more than {MAX_NODES} (MAX_NODES)")
        if self.nesting >= MAX_NESTING:
            raise ToolSchemaError(
                path,
                "properties",
                f"and items nest deeper than {MAX_NESTING} levels; llmsim refuses deeper schemas",
            )
        self.nesting += 1

    def leave(self) -> None:
        self.nesting -= 1

    def add_properties(self, schema: dict[str, Any], path: str) -> None:
        """Count an object schema's properties, declared or required (refused past MAX_PROPERTIES)."""
        self.properties += len(dict.fromkeys([*schema.get("properties", {}), *schema.get("required", ())]))
        if self.properties > MAX_PROPERTIES:
            raise ToolSchemaError(
                at(path, "properties"),
                "properties",
                f"brings the schema to {self.properties} properties; llmsim accepts at most "
                f"{MAX_PROPERTIES} (MAX_PROPERTIES)",
            )


def check_enum(count: int, path: str) -> None:
    """Refuse an ``enum`` of more than MAX_ENUM values."""
    if count > MAX_ENUM:
        raise ToolSchemaError(
            at(path, "enum"), "enum", f"has {count} values; llmsim accepts at most {MAX_ENUM} (MAX_ENUM)"
        )


def check_min_length(low: int, path: str) -> None:
    """Refuse a ``minLength`` above MAX_MIN_LENGTH."""
    if low > MAX_MIN_LENGTH:
        raise ToolSchemaError(
            at(path, "minLength"),
            "minLength",
            f"is {low}; llmsim generates strings of at most {MAX_MIN_LENGTH} characters",
        )


def check_min_items(low: int, path: str) -> None:
    """Refuse a ``minItems`` above MAX_MIN_ITEMS."""
    if low > MAX_MIN_ITEMS:
        raise ToolSchemaError(
            at(path, "minItems"), "minItems", f"is {low}; llmsim generates at most {MAX_MIN_ITEMS} items"
        )


def check_min_size(size: float, path: str) -> None:
    """Refuse a schema whose smallest value is larger than MAX_MIN_SIZE (see
    :func:`llmsim.schema.nodes.smallest_cost`)."""
    if size > MAX_MIN_SIZE:
        raise ToolSchemaError(
            path,
            "minItems",
            f"and minLength force arguments of about {size:.0f} values or more; "
            f"llmsim generates at most {MAX_MIN_SIZE}",
        )
