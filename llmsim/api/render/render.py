"""The body a render endpoint answers with: vLLM's ``GenerateRequest``, ready to be
posted to ``/inference/v1/generate`` as it is.

``create_json_response`` dumps it with ``model_dump()`` (vllm/entrypoints/serve/utils/
api_utils.py:26-50): every field, nulls included, in declaration order
(vllm/entrypoints/scale_out/token_in_token_out/protocol.py:221-360), through orjson with
``OPT_NON_STR_KEYS`` (``logit_bias`` has integer keys).  llm-d-inference-sim answers
only ``token_ids`` and ``features``; both are here, under the same names.

:class:`RenderExtras` are the vLLM-only request fields a render passes on
(``kv_transfer_params`` and the like), read from the same body with the same strict
types as the rest of the request.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs
import orjson

from llmsim.api.errors import ApiError
from llmsim.api.render.sampling import RenderedSampling
from llmsim.api.request_fields import StreamOptions
from llmsim.api.structure import structure

__all__ = ["RenderExtras", "RenderedRequest", "dump", "parse_extras"]


@attrs.frozen(kw_only=True)
class RenderExtras:
    """Fields of vLLM's chat, completions and responses requests that llmsim's own
    request classes leave out, because only a render hands them on."""

    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    cache_salt: str | None = None
    priority: int | None = None
    return_token_ids: bool | None = None
    use_beam_search: bool | None = None

    def extra_args(self, *, keep_empty: bool = False) -> dict[str, Any] | None:
        """``sampling_params.extra_args`` once the transfer params are hoisted out of it
        (render/serving.py:53-68): ``vllm_xargs`` or None.  ``keep_empty``: /v1/responses
        builds ``{}`` (responses/protocol.py:622-648) and the hoist leaves an empty dict
        alone unless a transfer param was in it."""
        xargs = {k: v for k, v in (self.vllm_xargs or {}).items() if k not in _TRANSFER_KEYS}
        if keep_empty and not (self.vllm_xargs or self.kv_transfer_params or self.ec_transfer_params):
            return {}
        return xargs or None


_TRANSFER_KEYS = ("kv_transfer_params", "ec_transfer_params")


def parse_extras(body: dict[str, Any]) -> RenderExtras:
    """The :class:`RenderExtras` of ``body``: 400 for a wrong type, and for beam search,
    which no render serves (render/serving.py:139-142)."""
    extras = structure(body, RenderExtras)
    if extras.use_beam_search:
        raise ApiError(400, "Beam search is not supported by the render endpoint")
    if extras.cache_salt is not None and not extras.cache_salt:
        # validate_cache_salt (vllm/entrypoints/generate/base/protocol.py)
        raise ApiError(400, "Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    return extras


@attrs.frozen(kw_only=True)
class RenderedRequest:
    """One rendered prompt: a ``GenerateRequest``."""

    request_id: str
    token_ids: Sequence[int]
    sampling: RenderedSampling
    model: str | None
    extras: RenderExtras
    features: dict[str, object] | None = None
    parse_context: dict[str, object] | None = None
    stream_options: StreamOptions | None = None

    def as_dict(self) -> dict[str, object]:
        stream = self.sampling.stream
        options = self.stream_options if stream else None
        return {
            "request_id": self.request_id,
            "token_ids": list(self.token_ids),
            "token_offsets": None,
            "features": self.features,
            "content_parts": None,
            "sampling_params": self.sampling.as_dict(),
            "model": self.model,
            "reasoning_ended": None,  # no reasoning parser (chat_completion/protocol.py:624-641)
            "reasoning_parser_kwargs": None,
            "return_token_ids": self.extras.return_token_ids,
            "output_mode": "tokens",
            "parse_context": self.parse_context,
            "stream": stream,
            "stream_options": None if options is None else _stream_options(options),
            "cache_salt": self.extras.cache_salt,
            "priority": self.extras.priority or 0,
            "kv_transfer_params": self.extras.kv_transfer_params,
            "ec_transfer_params": self.extras.ec_transfer_params,
        }


def _stream_options(options: StreamOptions) -> dict[str, object]:
    """vLLM's ``StreamOptions`` dumped (vllm/entrypoints/generate/base/protocol.py:293-295)."""
    return {
        "include_usage": bool(options.include_usage),
        "continuous_usage_stats": bool(options.continuous_usage_stats),
    }


def dump(value: object) -> bytes:
    """The body as compact JSON; integers beyond 64 bits (which a request may carry in
    ``n`` or ``priority``, as pydantic accepts them) through the stdlib's encoder."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
