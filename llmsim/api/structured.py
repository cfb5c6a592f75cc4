"""Structured output on chat and completions: ``response_format`` and vLLM's
``structured_outputs``, read into a :class:`~llmsim.api.plan.StructuredOutput`.

vLLM 0.33 normalises both into one ``StructuredOutputsParams``
(vllm/entrypoints/generate/base/protocol.py:181-211): a ``response_format`` of type
``json_object`` or ``json_schema`` overrides ``structured_outputs``; ``text`` leaves it.
Of ``structured_outputs`` llmsim honours ``json`` (a schema, object or JSON text),
``regex``, ``choice`` and ``json_object``; ``grammar`` and ``structural_tag`` it cannot
generate from, and says so with a 400 naming the field.  A schema or regex llmsim cannot
generate valid output for is a 400 naming the field too.
"""

from __future__ import annotations

import json
import random
from typing import Any

import attrs

from llmsim.api.errors import ApiError, validation_error
from llmsim.api.plan import CHOICE, JSON, JSON_OBJECT, REGEX, StructuredOutput
from llmsim.api.tool_support import compile_parameters
from llmsim.schema.regex import PatternError, StringPattern, compile_pattern

__all__ = ["JsonSchemaFormat", "ResponseFormat", "StructuredOutputsParams", "structured_output"]

_PROBES = 8  # samples of a regex checked to match in full before it is accepted


@attrs.frozen
class JsonSchemaFormat:
    """``response_format.json_schema`` (vllm/entrypoints/generate/base/protocol.py:137-143)."""

    name: str
    description: str | None = None
    schema: Any = None
    strict: bool | None = None


@attrs.frozen
class ResponseFormat:
    """``response_format`` (vllm/entrypoints/generate/base/protocol.py:170-173)."""

    type: str
    json_schema: JsonSchemaFormat | None = None


@attrs.frozen
class StructuredOutputsParams:
    """vLLM's ``structured_outputs`` (vllm/sampling_params.py:102-113); the whitespace
    options are accepted and have nothing to change here."""

    json: Any = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None


def structured_output(
    response_format: ResponseFormat | None,
    structured_outputs: StructuredOutputsParams | None,
    *,
    named_tool_choice: bool = False,
    count_param: str | None = None,
) -> StructuredOutput | None:
    """The request's constraint on its text (None: free text), or a 400 naming the field.
    ``count_param`` is the ``parameter`` vLLM names when several constraints are given
    (completions names ``structured_outputs``, chat nothing)."""
    if structured_outputs is not None:
        _check_count(structured_outputs, named_tool_choice, count_param)
    if response_format is not None:
        if response_format.type == "json_object":
            return StructuredOutput(JSON_OBJECT)
        if response_format.type == "json_schema":
            # vllm/entrypoints/openai/chat_completion/protocol.py:840-851
            if response_format.json_schema is None:
                raise validation_error(
                    "When response_format type is 'json_schema', the 'json_schema' field must be provided.",
                    parameter="response_format",
                )
            return _json(response_format.json_schema.schema, "response_format.json_schema.schema")
        if response_format.type == "structural_tag":
            raise ApiError(
                400, "llmsim does not simulate structural_tag response formats.", param="response_format.type"
            )
        if response_format.type != "text":
            raise ApiError(
                400,
                f"Invalid response_format type {response_format.type!r}; "
                "use one of: text, json_object, json_schema, structural_tag.",
                param="response_format.type",
            )
    if structured_outputs is None:
        return None
    return _from_params(structured_outputs)


def _check_count(params: StructuredOutputsParams, named_tool_choice: bool, count_param: str | None) -> None:
    """vLLM's ``check_structured_outputs_count``
    (vllm/entrypoints/openai/chat_completion/protocol.py:929-969)."""
    count = sum(value is not None for value in (params.json, params.regex, params.choice))
    if count > 1:
        raise validation_error(
            "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice').",
            parameter=count_param,
        )
    if count > 0 and named_tool_choice:
        raise validation_error("You can only either use constraints for structured outputs or tools, not both.")


def _from_params(params: StructuredOutputsParams) -> StructuredOutput | None:
    if params.json is not None:
        schema = params.json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise ApiError(
                    400, f"Invalid JSON schema in 'structured_outputs.json': {exc}", param="structured_outputs.json"
                ) from None
        return _json(schema, "structured_outputs.json")
    if params.regex is not None:
        return StructuredOutput(REGEX, pattern=_pattern(params.regex, "structured_outputs.regex"))
    if params.choice is not None:
        if not params.choice:
            raise ApiError(
                400, "'structured_outputs.choice' must name at least one string.", param="structured_outputs.choice"
            )
        return StructuredOutput(CHOICE, choices=params.choice)
    if params.json_object:
        return StructuredOutput(JSON_OBJECT)
    for field in ("grammar", "structural_tag"):
        if getattr(params, field) is not None:
            raise ApiError(
                400, f"llmsim does not simulate '{field}' structured outputs.", param=f"structured_outputs.{field}"
            )
    return None


def _json(schema: object, path: str) -> StructuredOutput:
    if schema is None:
        raise ApiError(400, f"Field '{path}' is required.", param=path)
    return StructuredOutput(JSON, schema=compile_parameters(schema, path))


def _pattern(source: str, path: str) -> StringPattern:
    """``source`` compiled for whole-text generation: every sample must match in full."""
    try:
        pattern = compile_pattern(source)
    except PatternError as exc:
        raise ApiError(400, f"Invalid regex in '{path}': {source!r} {exc}.", param=path) from None
    rng = random.Random(0)
    lengths = pattern.lengths(0, None)
    for i in range(_PROBES):
        sample = pattern.generate(rng, lengths[i % len(lengths)])
        if pattern.regex.fullmatch(sample) is None:
            raise ApiError(
                400, f"Invalid regex in '{path}': {source!r} is not a pattern llmsim can match in full.", param=path
            )
    return pattern
