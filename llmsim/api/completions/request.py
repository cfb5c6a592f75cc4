"""The request body of POST /v1/completions.

Structured from JSON by :mod:`llmsim.api.structure` (strict types, unknown fields
ignored); the fields completions shares with chat are
:class:`~llmsim.api.request_fields.GenerationParams`, the prompt is one of the four
:data:`~llmsim.api.request_fields.Prompt` forms.  Unlike chat's, ``max_tokens``
defaults to 16, as in vLLM, whether absent or ``null``.
"""

from __future__ import annotations

from typing import Any

import attrs

from llmsim.api.errors import ApiError, validation_error
from llmsim.api.request_fields import GenerationParams, Prompt, check_generation_params
from llmsim.api.structure import read_bodies_fast, structure
from llmsim.api.structured import ResponseFormat, StructuredOutputsParams

__all__ = ["COMPLETIONS_DEFAULT_MAX_TOKENS", "CompletionRequest", "check_suffix", "parse_completion_request"]

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default


@read_bodies_fast
@attrs.frozen(kw_only=True, slots=False)  # see SamplingFields
class CompletionRequest(GenerationParams):
    prompt: Prompt
    max_tokens: int | None = COMPLETIONS_DEFAULT_MAX_TOKENS
    logprobs: int | None = None
    response_format: ResponseFormat | None = None  # vllm/entrypoints/openai/completion/protocol.py:125
    structured_outputs: StructuredOutputsParams | None = None  # ibid. :133
    suffix: str | None = None  # refused: the simulated model has no FIM rendering

    @property
    def logprobs_requested(self) -> bool:
        return self.logprobs is not None

    @property
    def echo_without_generation(self) -> bool:
        """``echo`` with ``max_tokens: 0``: vLLM generates one token (its internal
        max_tokens is 1) and answers with the prompt alone
        (vllm/entrypoints/openai/completion/protocol.py:393,416; serving.py:363-366,594-597)."""
        return bool(self.echo) and self.max_tokens == 0


def parse_completion_request(body: dict[str, Any]) -> CompletionRequest:
    if "max_tokens" in body and body["max_tokens"] is None:
        # vLLM 0.33 turns an explicit null into the default (completion/protocol.py:451-456)
        body = {**body, "max_tokens": COMPLETIONS_DEFAULT_MAX_TOKENS}
    request = structure(body, CompletionRequest)
    check_generation_params(request)
    # vllm/entrypoints/openai/completion/protocol.py:586-595; the cap (--max-logprobs)
    # is checked as the engine takes the request (api/logprobs_limit.py)
    logprobs = request.logprobs
    if logprobs is not None and logprobs < -1:
        raise validation_error("`logprobs` must be a positive value or -1.", parameter="logprobs", value=logprobs)
    return request


def check_suffix(request: CompletionRequest) -> None:
    """vLLM's 400 for ``suffix`` on a model without fill-in-the-middle rendering
    (vllm/renderers/online_renderer.py:614-664; ``create_error_response``, so no
    `` (parameter=…)`` text).  The renderer checks it first, after the model (404) and
    the admission (503) checks (completion/serving.py:107-111)."""
    if request.suffix is None:
        return
    if request.echo:
        raise ApiError(400, "Echo is unsupported with suffix.", param="suffix")
    if isinstance(request.prompt, str) or (request.prompt and isinstance(request.prompt[0], str)):
        raise ApiError(400, "suffix is only supported for models with FIM completion rendering", param="suffix")
    raise ApiError(400, "suffix requires text prompt input for FIM completion rendering", param="suffix")
