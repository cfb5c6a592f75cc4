"""The request bodies of POST /tokenize and POST /detokenize, as vLLM 0.33 reads them.

``/tokenize`` takes one of two bodies (``TokenizeRequest``, a pydantic union in
``vllm/entrypoints/serve/tokenize/protocol.py:23-179``): the completion form
(``prompt``) or the chat form (``messages``).  pydantic's "smart" union tries both: when
only one validates, that one; when both do, the one with more of its own fields set (the
completion form on a tie); when neither does, every branch's errors, each ``loc``
cleaned of the union's markers as vLLM cleans it (so ``body.prompt``, then
``body.messages``).  The chat form's ``model_validator(mode="before")`` raises a plain
``VLLMValidationError`` (not a ``ValueError``), which escapes pydantic: a body that sets
both ``continue_final_message`` and ``add_generation_prompt`` truthy is that 400 whatever
else it holds.
"""

from __future__ import annotations

from typing import Any

import attrs
import cattrs

from llmsim.api.chat.request import ChatMessage, ChatTool
from llmsim.api.prompts import check_generation_prompt
from llmsim.api.structure import (
    converter,
    error_input,
    request_validation_error,
    structure,
    validation_errors,
)

__all__ = [
    "DetokenizeRequest",
    "TokenizeChatRequest",
    "TokenizeCompletionRequest",
    "parse_detokenize_request",
    "parse_tokenize_request",
]

#: The largest id ``DetokenizeRequest`` takes (``Field(ge=0, le=2**63 - 1)``, protocol.py:189-201).
_MAX_TOKEN_ID = 2**63 - 1


@attrs.frozen(kw_only=True)
class TokenizeCompletionRequest:
    """``TokenizeCompletionRequest`` (protocol.py:23-46)."""

    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


@attrs.frozen(kw_only=True)
class TokenizeChatRequest:
    """``TokenizeChatRequest`` (protocol.py:49-129); ``media_io_kwargs`` and
    ``mm_processor_kwargs`` are read as unknown keys (nothing here uses them)."""

    messages: tuple[ChatMessage, ...]
    model: str | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: tuple[ChatTool, ...] | None = None


_FORMS: tuple[type[TokenizeCompletionRequest] | type[TokenizeChatRequest], ...] = (
    TokenizeCompletionRequest,
    TokenizeChatRequest,
)


def parse_tokenize_request(body: dict[str, Any]) -> TokenizeCompletionRequest | TokenizeChatRequest:
    """The form ``body`` is, as pydantic's smart union picks it (see the module's text)."""
    check_generation_prompt(body)
    parsed: list[TokenizeCompletionRequest | TokenizeChatRequest] = []
    errors: list[dict[str, object]] = []
    for form in _FORMS:
        try:
            parsed.append(converter.structure(body, form))
        except (cattrs.BaseValidationError, TypeError, ValueError, KeyError) as exc:
            branch = validation_errors(exc, body)
            if branch is None:
                structure(body, form)  # a value of none of a union's types: raises llmsim's own 400 for it
            errors.extend(branch or ())
    if not parsed:
        raise request_validation_error([*errors], str(errors[0]["loc"]))
    return max(parsed, key=lambda request: _fields_set(body, type(request)))


def _fields_set(body: dict[str, Any], form: type) -> int:
    """How many of ``form``'s own fields ``body`` sets: pydantic's tie-break between
    union members that both validate (the first wins a tie, and ``max`` keeps the first)."""
    return sum(1 for field in attrs.fields(form) if field.name in body)


@attrs.frozen
class DetokenizeRequest:
    """``DetokenizeRequest`` (protocol.py:189-201): ids from 0 to 2**63 - 1."""

    tokens: tuple[int, ...]
    model: str | None = None


def parse_detokenize_request(body: dict[str, Any]) -> DetokenizeRequest:
    """The body, or a 400 listing every id outside 0..2**63-1 as pydantic does."""
    request = structure(body, DetokenizeRequest)
    errors = [
        _bound_error(index, token_id)
        for index, token_id in enumerate(request.tokens)
        if not 0 <= token_id <= _MAX_TOKEN_ID
    ]
    if errors:
        raise request_validation_error([*errors], str(errors[0]["loc"]))
    return request


def _bound_error(index: int, token_id: int) -> dict[str, object]:
    """pydantic's ``greater_than_equal`` / ``less_than_equal`` error for one id."""
    if token_id < 0:
        kind, message, ctx = "greater_than_equal", "Input should be greater than or equal to 0", {"ge": 0}
    else:
        kind, message = "less_than_equal", f"Input should be less than or equal to {_MAX_TOKEN_ID}"
        ctx = {"le": _MAX_TOKEN_ID}
    loc = f"body.tokens.{index}"
    return {"type": kind, "loc": loc, "msg": message, "input": error_input(token_id), "ctx": ctx}
