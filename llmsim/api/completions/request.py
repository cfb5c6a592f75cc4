"""The request body of POST /v1/completions.

Structured from JSON by :mod:`llmsim.api.structure` (strict types, unknown fields
ignored); the fields completions shares with chat are
:class:`~llmsim.api.request_fields.GenerationParams`, the prompt is one of the four
:data:`~llmsim.api.request_fields.Prompt` forms.  Unlike chat's, ``max_tokens``
defaults to 16, as in vLLM, but only when absent: ``null`` means no cap but the context.
"""

from __future__ import annotations

from typing import Any

import attrs

from llmsim.api.errors import ApiError
from llmsim.api.request_fields import GenerationParams, Prompt, check_generation_params
from llmsim.api.structure import structure

__all__ = ["COMPLETIONS_DEFAULT_MAX_TOKENS", "MAX_COMPLETION_LOGPROBS", "CompletionRequest", "parse_completion_request"]

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound on /v1/completions ``logprobs``


@attrs.frozen(kw_only=True)
class CompletionRequest(GenerationParams):
    prompt: Prompt
    max_tokens: int | None = COMPLETIONS_DEFAULT_MAX_TOKENS
    logprobs: int | None = None


def parse_completion_request(body: dict[str, Any]) -> CompletionRequest:
    request = structure(body, CompletionRequest)
    check_generation_params(request)
    logprobs = request.logprobs
    if logprobs is not None and not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS:
        message = f"`logprobs` must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {logprobs}."
        raise ApiError(400, message, param="logprobs")
    return request
