"""Simulated tool calls: validating tool schemas, choosing calls, generating arguments.

The API layer turns each request tool into a :class:`ToolSpec` (which validates its
``parameters`` schema: a :class:`ToolSchemaError` becomes a 400 naming the tool), then
asks :func:`plan_tool_calls` (chat, messages) or :func:`plan_single_tool_call`
(responses) what the simulated model calls.  The rules are llm-d-inference-sim's:

- ``"none"``: no call; a named function: exactly one call of it;
- ``"required"``: at least one call, ``"auto"``: possibly none; then one more call is
  added while a ``tool-call-extra-call-probability`` draw succeeds, up to as many calls
  as there are tools, each call's tool picked uniformly (repeats allowed);
- the Responses API makes exactly one call (its caller decides when tools are on).

Arguments are generated from the tool's schema and serialised the way a model writes
them (``json.dumps`` defaults: ``", "`` and ``": "`` separators, non-ASCII kept).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Literal

import attrs

from llmsim.options import ToolCallOptions
from llmsim.schema.jsonschema import CompiledSchema, ToolSchemaError, compile_schema

__all__ = [
    "CompiledSchema",
    "NamedToolChoice",
    "PlannedCall",
    "ToolCallOptions",
    "ToolChoice",
    "ToolChoiceError",
    "ToolSchemaError",
    "ToolSpec",
    "arguments_json",
    "compile_schema",
    "generate_arguments",
    "plan_single_tool_call",
    "plan_tool_calls",
    "validate_tool_parameters",
]


@attrs.frozen
class NamedToolChoice:
    """``tool_choice`` forcing one function by name."""

    name: str


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolChoiceError(ValueError):
    """A tool_choice the tools cannot satisfy (the API answers 400)."""


@attrs.frozen
class ToolSpec:
    """A request's function tool with its compiled ``parameters`` schema."""

    name: str
    parameters: CompiledSchema

    @classmethod
    def build(cls, name: str, parameters: object, *, path: str) -> ToolSpec:
        """Validate and compile ``parameters`` (None: the tool takes no arguments).

        Raises ToolSchemaError whose message starts with ``path``.
        """
        return cls(name, compile_schema(parameters, path=path))


@attrs.frozen
class PlannedCall:
    """One tool call the simulated model makes: the function and its JSON arguments."""

    name: str
    arguments: str


def validate_tool_parameters(schema: object, *, path: str) -> None:
    """Raise ToolSchemaError if llmsim cannot generate valid arguments for ``schema``."""
    compile_schema(schema, path=path)


def generate_arguments(schema: object, rng: random.Random, *, options: ToolCallOptions) -> object:
    """Arguments (a Python value) valid against ``schema``; compiles it first."""
    return compile_schema(schema, path="parameters").generate(rng, options)


def arguments_json(value: object) -> str:
    """Serialise arguments the way a model writes them."""
    return json.dumps(value, ensure_ascii=False)


def plan_tool_calls(
    tools: Sequence[ToolSpec], choice: ToolChoice, rng: random.Random, *, options: ToolCallOptions
) -> list[PlannedCall]:
    """The calls of one chat/messages turn (empty: the model answers with text)."""
    if choice == "none":
        return []
    if isinstance(choice, NamedToolChoice):
        return [_call(_named(tools, choice.name), rng, options)]
    minimum = _minimum_calls(tools, choice)
    count = minimum
    while count < len(tools) and rng.random() * 100 < options.tool_call_extra_call_probability:
        count += 1
    return [_call(rng.choice(tools), rng, options) for _ in range(count)]


def plan_single_tool_call(
    tools: Sequence[ToolSpec], choice: ToolChoice, rng: random.Random, *, options: ToolCallOptions
) -> PlannedCall | None:
    """The Responses API rule: exactly one call unless tool_choice is "none" or there are no tools."""
    if choice == "none":
        return None
    if isinstance(choice, NamedToolChoice):
        return _call(_named(tools, choice.name), rng, options)
    _minimum_calls(tools, choice)  # refuses "required" without tools
    return _call(rng.choice(tools), rng, options) if tools else None


def _minimum_calls(tools: Sequence[ToolSpec], choice: str) -> int:
    if choice not in ("auto", "required"):
        raise ToolChoiceError(f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}")
    if choice == "required" and not tools:
        raise ToolChoiceError("tool_choice 'required' needs at least one tool in 'tools'")
    return 1 if choice == "required" else 0


def _named(tools: Sequence[ToolSpec], name: str) -> ToolSpec:
    for tool in tools:
        if tool.name == name:
            return tool
    known = ", ".join(repr(t.name) for t in tools) or "none"
    raise ToolChoiceError(f"tool_choice names function {name!r}, which is not in 'tools' (known: {known})")


def _call(tool: ToolSpec, rng: random.Random, options: ToolCallOptions) -> PlannedCall:
    return PlannedCall(tool.name, arguments_json(tool.parameters.generate(rng, options)))
