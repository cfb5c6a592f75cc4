"""The request body of POST /inference/v1/generate: vLLM's ``GenerateRequest``
(vllm/entrypoints/scale_out/token_in_token_out/protocol.py:221-460), the shape a render
endpoint answers with.

Structured by :mod:`llmsim.api.structure` (strict types, unknown fields ignored), then
checked with vLLM's validators and texts: ``token_ids`` non-empty and non-negative
(:233-238), ``features`` consistent and inside the prompt (:160-208, :420-431),
``content_parts`` and ``features`` exclusive (:254-258), ``sampling_params`` as
``SamplingParams._verify_args`` checks it.  Ids beyond the vocabulary are the
renderer's 400 (vllm/renderers/base.py:453-490).

llm-d-inference-sim also reads ``kv_transfer_params`` from
``sampling_params.extra_args`` when the root has none (pkg/llm-d-inference-sim/
generate.go:33-41, "Real vLLM has a bug where the parameters land in extra_args"), and
so does llmsim.
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from llmsim.api.errors import ApiError, validation_error
from llmsim.api.request_fields import SamplingFields, StreamOptions, check_sampling_fields
from llmsim.api.structure import error_input, request_validation_error, structure

__all__ = ["Features", "GenerateRequest", "GenerateSamplingParams", "Placeholder", "parse_generate_request"]

OUTPUT_MODES = ("tokens", "text")  # "derender" parses tool calls and reasoning: not simulated


@attrs.frozen(kw_only=True, slots=False)  # see SamplingFields
class GenerateSamplingParams(SamplingFields):
    """``SamplingParams`` as a JSON object; defaults as its fields' (vllm/sampling_params.py:285-440)."""

    n: int = 1
    max_tokens: int | None = None  # absent or null: the room the prompt leaves (serving.py:348-361)
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    detokenize: bool = True
    extra_args: dict[str, Any] | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else self.stop or ()


@attrs.frozen
class Placeholder:
    offset: int
    length: int


@attrs.frozen(kw_only=True)
class Features:
    """``MultiModalFeatures``: hashes and placeholder ranges per modality."""

    mm_hashes: dict[str, tuple[str, ...]]
    mm_placeholders: dict[str, tuple[Placeholder, ...]]
    kwargs_data: dict[str, tuple[str | None, ...]] | None = None
    mm_metadata: dict[str, tuple[str | None, ...]] | None = None


@attrs.frozen(kw_only=True)
class GenerateRequest:
    token_ids: tuple[int, ...]
    sampling_params: GenerateSamplingParams
    request_id: str | None = None
    features: Features | None = None
    content_parts: tuple[dict[str, Any], ...] | None = None
    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    output_mode: str = "tokens"
    cache_salt: str | None = None
    priority: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def transfer_params(self) -> dict[str, Any] | None:
        """``kv_transfer_params``, or llm-d's fallback to ``sampling_params.extra_args``."""
        if self.kv_transfer_params is not None:
            return self.kv_transfer_params
        extra = self.sampling_params.extra_args or {}
        found = extra.get("kv_transfer_params")
        return found if isinstance(found, dict) else None


def parse_generate_request(body: dict[str, Any], vocab_size: int) -> GenerateRequest:
    """The request, or the 400 vLLM gives for the first thing wrong with it."""
    if "token_ids" in body and body["token_ids"] == []:
        error = {
            "type": "too_short",
            "loc": "body.token_ids",
            "msg": "List should have at least 1 item after validation, not 0",
            "input": "<list of 0 items>",
            "ctx": {"field_type": "List", "min_length": 1, "actual_length": 0},
        }
        raise request_validation_error([error], "body.token_ids")
    request = structure(body, GenerateRequest)
    if any(token < 0 for token in request.token_ids):
        raise _value_error("token_ids", "token_ids must not contain negative values", body["token_ids"])
    _check_features(request, body)
    if request.output_mode not in OUTPUT_MODES:
        modes = ", ".join(repr(mode) for mode in OUTPUT_MODES)
        raise ApiError(400, f"output_mode must be one of {modes}, got {request.output_mode!r}", param="output_mode")
    params = request.sampling_params
    check_sampling_fields(params, n=params.n, max_tokens=params.max_tokens, min_tokens=params.min_tokens)
    if params.logprobs is not None and params.logprobs < -1:  # vllm/sampling_params.py:712-717
        message = f"logprobs must be non-negative or -1, got {params.logprobs}."
        raise validation_error(message, parameter="logprobs", value=params.logprobs)
    highest = max(request.token_ids)  # vllm/renderers/base.py:453-490: no parameter named
    if highest >= vocab_size:
        raise validation_error(f"Token id {highest} is out of vocabulary")
    return request


def _check_features(request: GenerateRequest, body: dict[str, Any]) -> None:
    """``MultiModalFeatures._validate_parallel_fields`` and the bounds check of
    ``GenerateRequest`` (protocol.py:160-208, 254-258, 420-431), as value errors."""
    features = request.features
    if features is None:
        return
    raw = body.get("features")
    if request.content_parts:
        raise _value_error("", "content_parts and features are mutually exclusive", body)
    modalities = set(features.mm_hashes)
    if set(features.mm_placeholders) != modalities:
        raise _value_error("features", "mm_hashes and mm_placeholders must use the same modalities", raw)
    ranges: list[tuple[int, int]] = []
    for modality in modalities:
        placeholders = features.mm_placeholders[modality]
        if len(features.mm_hashes[modality]) != len(placeholders):
            message = f"{modality} mm_hashes and mm_placeholders must have the same length"
            raise _value_error("features", message, raw)
        for placeholder in placeholders:
            if placeholder.offset < 0 or placeholder.length <= 0:
                raise _value_error("features", "mm_placeholders need offset >= 0 and length > 0", raw)
            ranges.append((placeholder.offset, placeholder.offset + placeholder.length))
    ranges.sort()
    if any(following[0] < current[1] for current, following in itertools.pairwise(ranges)):
        raise _value_error("features", "mm_placeholders must be globally non-overlapping and sorted", raw)
    if any(end > len(request.token_ids) for _, end in ranges):
        raise _value_error("", "mm_placeholders must remain within the token_ids sequence", body)


def _value_error(field: str, message: str, value: object) -> ApiError:
    """pydantic's ``value_error`` of a validator on ``field`` ("" for the whole body)."""
    loc = f"body.{field}" if field else "body"
    error = {
        "type": "value_error",
        "loc": loc,
        "msg": f"Value error, {message}",
        "input": error_input(value),
        "ctx": {"error": ValueError(message)},
    }
    return request_validation_error([error], loc)
