"""The request body of POST /v1/embeddings: vLLM 0.33's ``EmbeddingCompletionRequest``
(vllm/entrypoints/pooling/embed/protocol.py:35-46, with the mixins of
vllm/entrypoints/pooling/base/protocol.py:35-145, 212-225, 320-356).

Structured by :mod:`llmsim.api.structure` (pydantic's lax scalars, unknown fields
ignored).  ``input`` takes vLLM's four forms, in the order of its union
(``list[int] | list[list[int]] | str | list[str]``, base/protocol.py:214); a value that
fits none gets pydantic's error for each branch.  vLLM's request is a union of five
shapes (the others take chat ``messages``), and its errors list every shape's; llmsim
serves the ``input`` shape only and reports that one's errors.
"""

from __future__ import annotations

from typing import Any, cast

import attrs

from llmsim.api.errors import ApiError, validation_error
from llmsim.api.structure import converter, error_input, request_validation_error, structure

__all__ = ["EmbeddingInput", "EmbeddingRequest", "embedding_inputs", "parse_embedding_request", "unsupported_dtype"]

#: One prompt: text to tokenize, or token ids used as they are.
EmbeddingInput = str | tuple[int, ...]

_ENCODING_FORMATS = ("float", "base64", "bytes", "bytes_only")  # vllm/utils/serial_utils.py:32
_EMBED_DTYPES = ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")  # ibid. :29
_ENDIANNESS = ("native", "big", "little")  # ibid. :31
_TRUNCATION_SIDES = ("left", "right")  # base/protocol.py:54


@attrs.frozen(kw_only=True)
class EmbeddingRequest:
    # the prompts (:func:`embedding_inputs`) once parsed: the raw value is read by hand,
    # as pydantic's errors for a union need it
    input: Any
    model: str | None = None  # not checked against the served names (base/serving.py:219-239)
    user: str | None = None
    dimensions: int | None = None
    encoding_format: str = "float"
    embed_dtype: str = "float32"
    endianness: str = "native"
    use_activation: bool | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: str | None = None
    add_special_tokens: bool = True  # a BOS, where the tokenizer adds one (the simulated one has none)
    request_id: str | None = None
    priority: int = 0

    @property
    def prompts(self) -> tuple[EmbeddingInput, ...]:
        return cast(tuple[EmbeddingInput, ...], self.input)

    @property
    def normalize(self) -> bool:
        """``use_activation`` unset means the pooler's default: normalise (pooling_params.py:229-231)."""
        return self.use_activation is not False

    @property
    def little_endian(self) -> bool:
        """``native`` is the byte order of the simulated host: little-endian, as every GPU server's."""
        return self.endianness != "big"


#: ``task`` values vLLM refuses by name (vllm/tasks.py:20-30).
_REMOVED_TASKS = {
    "score": "`score` task was removed; use `classify` instead.",
    "encode": "`encode` task was removed; use `token_embed` or `token_classify` instead.",
}


class VLLMValidationError(ValueError):
    """Stands for vLLM's exception in an error's ``ctx``, where its repr is printed."""


def parse_embedding_request(body: dict[str, Any]) -> EmbeddingRequest:
    """The request, or the 400 vLLM gives for it: first the check of removed parameters
    that runs before the union is validated (``reject_removed_pooling_parameters``,
    base/protocol.py:23-32), then pydantic's errors."""
    if "normalize" in body:
        raise _removed(body, "Parameter `normalize` was removed; use `use_activation` instead.", "normalize")
    task = body.get("task")
    if isinstance(task, str) and task in _REMOVED_TASKS:
        raise _removed(body, _REMOVED_TASKS[task], "task")
    if "input" in body:
        body = {**body, "input": embedding_inputs(body["input"])}
    request = structure(body, EmbeddingRequest)
    _check_literal("encoding_format", request.encoding_format, _ENCODING_FORMATS)
    _check_literal("embed_dtype", request.embed_dtype, _EMBED_DTYPES)
    _check_literal("endianness", request.endianness, _ENDIANNESS)
    if request.truncation_side is not None:
        _check_literal("truncation_side", request.truncation_side, _TRUNCATION_SIDES)
    _check_range("truncate_prompt_tokens", request.truncate_prompt_tokens, -1)  # base/protocol.py:42
    _check_range("priority", request.priority, -(2**63), 2**63 - 1)  # base/protocol.py:70-79
    return request


def embedding_inputs(value: object) -> tuple[EmbeddingInput, ...]:
    """``input`` as prompts: a string or token-id list is one prompt, a list of either
    is one each (vLLM's ``prompt_to_seq``, vllm/renderers/inputs/preprocess.py:46-54).
    An empty list is no prompt at all: the endpoint refuses that."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        if all(isinstance(item, str) for item in value):  # pydantic's smart union: an exact match wins
            return tuple(value)
        ids = _token_ids(value)
        if ids is not None:
            return (ids,)
        nested = [_token_ids(item) if isinstance(item, list) else None for item in value]
        if all(item is not None for item in nested):
            return tuple(item for item in nested if item is not None)
    raise request_validation_error(_input_errors(value), "body.input")


_int = converter.get_structure_hook(int)


def _token_ids(value: list[object]) -> tuple[int, ...] | None:
    """A list of token ids as pydantic's lax ``list[int]`` reads it, or None."""
    try:
        return tuple(_int(item, int) for item in value)
    except TypeError:
        return None


def _input_errors(value: object) -> list[object]:
    """pydantic's errors for ``value`` against each branch of ``input``'s union, in its
    order, with vLLM's cleaned ``loc`` (exception_handling/handlers/validation.py:109-146)."""

    def error(kind: str, msg: str, bad: object, *path: int) -> dict[str, object]:
        loc = ".".join(["body", "input", *map(str, path)])
        return {"type": kind, "loc": loc, "msg": msg, "input": error_input(bad)}

    not_list = ("list_type", "Input should be a valid list")
    not_str = ("string_type", "Input should be a valid string")
    if not isinstance(value, list):
        return [error(*not_list, value), error(*not_list, value), error(*not_str, value), error(*not_list, value)]
    errors: list[object] = []
    for index, item in enumerate(value):  # list[int]
        if _token_ids([item]) is None:
            kind, msg = _int_error(item)
            errors.append(error(kind, msg, item, index))
    for index, item in enumerate(value):  # list[list[int]]
        if not isinstance(item, list):
            errors.append(error(*not_list, item, index))
        else:
            errors.extend(
                error(*_int_error(token), token, index, position)
                for position, token in enumerate(item)
                if _token_ids([token]) is None
            )
    errors.append(error(*not_str, value))  # str
    errors.extend(error(*not_str, item, index) for index, item in enumerate(value) if not isinstance(item, str))
    return errors


def _removed(body: dict[str, Any], message: str, parameter: str) -> ApiError:
    """A ``VLLMValidationError`` raised in a validator: pydantic's ``value_error`` on the
    body, whose ``param`` vLLM takes from the exception (handlers/validation.py:158-165)."""
    text = validation_error(message, parameter=parameter).message
    error = {
        "type": "value_error",
        "loc": "body",
        "msg": f"Value error, {text}",
        "input": error_input(body),
        "ctx": {"error": VLLMValidationError(message)},
    }
    return request_validation_error([error], parameter)


def _int_error(value: object) -> tuple[str, str]:
    if isinstance(value, str):
        return "int_parsing", "Input should be a valid integer, unable to parse string as an integer"
    if isinstance(value, float):
        return "int_from_float", "Input should be a valid integer, got a number with a fractional part"
    return "int_type", "Input should be a valid integer"


def _check_literal(name: str, value: str, choices: tuple[str, ...]) -> None:
    """pydantic's ``literal_error`` for a ``Literal[...]`` field."""
    if value in choices:
        return
    quoted = [f"'{choice}'" for choice in choices]
    expected = f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    error = {
        "type": "literal_error",
        "loc": f"body.{name}",
        "msg": f"Input should be {expected}",
        "input": error_input(value),
        "ctx": {"expected": expected},
    }
    raise request_validation_error([error], f"body.{name}")


def _check_range(name: str, value: int | None, low: int, high: int | None = None) -> None:
    """pydantic's ``greater_than_equal`` / ``less_than_equal`` for ``Field(ge=low, le=high)``."""
    if value is None or (value >= low and (high is None or value <= high)):
        return
    kind, word, key, bound = (
        ("greater_than_equal", "greater", "ge", low) if value < low else ("less_than_equal", "less", "le", high)
    )
    error = {
        "type": kind,
        "loc": f"body.{name}",
        "msg": f"Input should be {word} than or equal to {bound}",
        "input": error_input(value),
        "ctx": {key: bound},
    }
    raise request_validation_error([error], f"body.{name}")


def unsupported_dtype(embed_dtype: str) -> ApiError:
    """llmsim packs float32, float16 and bfloat16; vLLM's fp8 formats are not simulated."""
    return ApiError(400, f"embed_dtype {embed_dtype!r} is not simulated by llmsim", param="embed_dtype")
