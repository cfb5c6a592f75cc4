"""Function tools of /v1/responses and /v1/messages on the model's tool planner
(:mod:`llmsim.model.tools`): schema checks as 400s.

A tool's parameters schema is compiled once per request; compiling is validating, so
a schema llmsim cannot honour is a 400 naming the field, and every generated argument
object validates against its schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import attrs

from llmsim.api.errors import ApiError
from llmsim.model.tools import (
    CompiledSchema,
    ToolChoiceError,
    ToolSchemaError,
    ToolSpec,
    compile_schema,
)

__all__ = ["FunctionTool", "build_tool", "choice_error", "compile_parameters", "planning_errors"]


@attrs.frozen
class FunctionTool:
    """A callable tool: its definition as the prompt shows it, and its compiled spec."""

    definition: dict[str, object]
    spec: ToolSpec

    @property
    def name(self) -> str:
        return self.spec.name


def build_tool(name: str, parameters: object, *, path: str, definition: dict[str, object]) -> FunctionTool:
    """``parameters`` (an object, or None: no arguments) compiled; 400 when llmsim
    cannot generate valid arguments for it."""
    _check_object(parameters, path)
    try:
        return FunctionTool(definition, ToolSpec.build(name, parameters, path=path))
    except ToolSchemaError as exc:
        raise ApiError(400, f"Tool validation failed for {name!r}: {exc}", param=path) from None


def compile_parameters(schema: object, path: str) -> CompiledSchema:
    """A schema for generated values (``text.format.schema``); 400 as above."""
    _check_object(schema, path)
    try:
        return compile_schema(schema, path=path)
    except ToolSchemaError as exc:
        raise ApiError(400, f"Schema validation failed: {exc}", param=path) from None


def _check_object(schema: object, path: str) -> None:
    if schema is not None and not isinstance(schema, dict):
        raise ApiError(400, f"Invalid type for '{path}': expected an object.", param=path)


def choice_error(exc: ToolChoiceError, param: str = "tool_choice") -> ApiError:
    return ApiError(400, str(exc), param=param)


@contextmanager
def planning_errors() -> Iterator[None]:
    """Planning tool calls or schema output: a tool_choice that names no tool, or (rarely)
    an accepted schema that turns out to admit no value, is the client's 400, never a 500."""
    try:
        yield
    except ToolChoiceError as exc:
        raise choice_error(exc) from None
    except ToolSchemaError as exc:
        raise ApiError(400, f"Cannot generate a value for this schema: {exc}", param=exc.path) from None
