"""P/D disaggregation and cache-hit thresholds, as llm-d-inference-sim serves them.

Neither is in vLLM 0.33's OpenAI server: ``kv_transfer_params`` there is opaque, handed
to a KV connector (vllm/entrypoints/openai/chat_completion/protocol.py:521-524), and the
cache-hit threshold is an RFC (vllm-project/vllm#24256, PR #24520, not merged).  llmsim
answers as llm-d-inference-sim does, since its users' routers and sidecars expect that.

**P/D.**  ``kv_transfer_params.do_remote_decode`` makes this server the prefill pod: a
streaming request is refused (400 ``Prefill does not support streaming``,
pkg/llm-d-inference-sim/helpers.go:76-79), and a complete one finishes
``remote_decode`` with the placeholder ``kv_transfer_params`` a decoder is sent
(:func:`prefill_transfer_params`; request.go:252-258, pkg/api/response.go:422-451).
``do_remote_prefill`` makes it the decode pod: its first token waits the KV transfer
(``--kv-cache-transfer-latency``, or ``--kv-cache-transfer-time-per-token`` per prompt
token) instead of a prefill, and with ``--enable-kvcache`` the prompt's blocks land in
its pool as it is admitted.  Chat, completions and ``/inference/v1/generate`` read them.

**Thresholds.**  A request whose prefix hit rate (cached prompt tokens over prompt tokens,
in the engine's pool at admission) is below its threshold ends at once, unadmitted, with
``finish_reason: "cache_threshold"``, no tokens, no TTFT and no decode time
(request.go:194-220, 266-291).  The threshold is the request's ``cache_hit_threshold``
(chat and completions, in [0, 1]) or else ``--global-cache-hit-threshold`` when above 0,
both only with ``--enable-kvcache``.  The header ``X-Cache-Threshold-Finish-Reason: true``
forces the outcome, cache or not (pkg/communication/http.go:257-261; chat, completions
and messages, whose request is a chat request there).  Where llmsim differs: a
``do_remote_decode`` request (a prefill) is never held to a threshold (llm-d-inference-sim
issue #300 asks for that; its code checks it), and a ``do_remote_prefill`` one counts its
transferred prompt as hit, as the RFC counts the connector's external tokens.

**Encoder-only (E/PD).**  With ``--mm-encoder-only`` every text answer is ``"!"`` once
per ``max_tokens`` (:func:`llmsim.api.plan.plan_text`), and a complete chat answer with images, audio or video
(or a generate answer whose ``features`` name ``mm_hashes``) carries ``ec_transfer_params``:
one placeholder entry per multimodal item (``buildECTransferParams``,
pkg/llm-d-inference-sim/helpers.go:90-106; chat_completion.go:107-112, generate.go:86-89).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from llmsim.api.context import ApiContext, Call
from llmsim.api.errors import ApiError
from llmsim.api.structure import error_input, request_validation_error
from llmsim.api.turns import TurnPlan
from llmsim.model.text import FinishReason

if TYPE_CHECKING:  # the render family imports the chat and completions routes, which import this
    from llmsim.api.render.features import MediaItem

__all__ = [
    "THRESHOLD_HEADER",
    "KvTransfer",
    "chat_ec_transfer_params",
    "check_cache_hit_threshold",
    "ec_transfer_params",
    "forced_cache_threshold",
    "job_threshold",
    "prefill_transfer_params",
]

THRESHOLD_HEADER = "x-cache-threshold-finish-reason"
#: What Go's ``strconv.ParseBool`` reads as true (anything it cannot parse is ignored).
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_THRESHOLD_MESSAGE = "Parameter `cache_hit_threshold` must be between 0.0 and 1.0 if provided."
#: llm-d-inference-sim's encoder-cache placeholder (helpers.go:96-101); Go writes the
#: ``[]byte`` metadata as base64.
_EC_PLACEHOLDER = {
    "peer_host": "DUMMY",
    "peer_port": 1234,
    "size_bytes": 2359296,
    "nixl_agent_metadata_b64": base64.b64encode(b"NIXL_METADATA_PLACEHOLDER").decode(),
}


@attrs.frozen
class KvTransfer:
    """The two flags of a request's ``kv_transfer_params`` that llmsim acts on (the
    other fields, ``remote_engine_id`` and so on, are read by no one, as in llm-d)."""

    remote_decode: bool = False  # this is the prefill pod
    remote_prefill: bool = False  # this is the decode pod

    @classmethod
    def of(cls, params: Mapping[str, Any] | None) -> KvTransfer:
        if not params:  # the usual request: one shared (frozen) instance
            return _NO_TRANSFER
        return cls(params.get("do_remote_decode") is True, params.get("do_remote_prefill") is True)

    def check_streaming(self, streaming: bool) -> None:
        """llm-d-inference-sim's 400 for a streamed prefill (helpers.go:76-79)."""
        if self.remote_decode and streaming:
            raise ApiError(400, "Prefill does not support streaming")

    def finish(self, turns: list[TurnPlan]) -> list[TurnPlan]:
        """The planned turns, each finishing ``remote_decode`` on a prefill pod."""
        if not self.remote_decode:
            return turns
        return [attrs.evolve(turn, finish_reason=FinishReason.REMOTE_DECODE) for turn in turns]

    def response_params(self) -> dict[str, object] | None:
        """The answer's ``kv_transfer_params``: a prefill pod's placeholder, else None."""
        return prefill_transfer_params() if self.remote_decode else None


_NO_TRANSFER = KvTransfer()


def prefill_transfer_params() -> dict[str, object]:
    """llm-d-inference-sim's placeholder ``kv_transfer_params`` of a prefill pod's answer
    (``BuildPrefillKVTransferParams``, pkg/api/response.go:436-451; Go's field order):
    what the sidecar forwards to the decode pod, which only reads ``do_remote_prefill``."""
    return {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "remote_engine_id": "DUMMY_ID",
        "remote_block_ids": ["DUMMY_ID"],
        "remote_host": "DUMMY",
        "remote_port": 1234,
        "tp_size": 1,
    }


def forced_cache_threshold(call: Call) -> bool:
    """``X-Cache-Threshold-Finish-Reason`` read as Go's ``strconv.ParseBool`` reads it."""
    return call.request.header(THRESHOLD_HEADER) in _GO_TRUE


def check_cache_hit_threshold(body: Mapping[str, Any], threshold: float | None) -> None:
    """The request field's range, refused as the vLLM PR's model validator refuses it
    (``validate_cache_hit_threshold``, a ``ValueError`` in a ``mode="before"`` validator:
    pydantic's ``value_error`` on the body, a 400)."""
    if threshold is None or 0.0 <= threshold <= 1.0:
        return
    error = {
        "type": "value_error",
        "loc": "body",
        "msg": f"Value error, {_THRESHOLD_MESSAGE}",
        "input": error_input(dict(body)),
        "ctx": {"error": ValueError(_THRESHOLD_MESSAGE)},
    }
    raise request_validation_error([error], "body")


def job_threshold(
    ctx: ApiContext, requested: float | None, *, forced: bool, transfer: KvTransfer = KvTransfer()
) -> float | None:
    """The engine's admission gate for a request's jobs: infinite when the header forces
    ``cache_threshold``; else, with ``--enable-kvcache``, the request's threshold or the
    global one when above 0 (request.go:272-289); None: no gate."""
    if forced:
        return math.inf
    options = ctx.engine.options
    if not options.enable_kvcache or transfer.remote_decode:
        return None
    if requested is not None:
        return requested
    return options.global_cache_hit_threshold if options.global_cache_hit_threshold > 0 else None


def ec_transfer_params(ctx: ApiContext, hashes: Iterable[str]) -> dict[str, object] | None:
    """An encoder pod's ``ec_transfer_params``, one placeholder per item hash; None when
    not ``--mm-encoder-only`` or without items (Go's nil map)."""
    if not ctx.engine.options.mm_encoder_only:
        return None
    params: dict[str, object] = {digest: dict(_EC_PLACEHOLDER) for digest in hashes}
    return params or None


def chat_ec_transfer_params(ctx: ApiContext, media: Sequence[MediaItem]) -> dict[str, object] | None:
    """A chat request's ``ec_transfer_params``: its media blocks' (chat_completion.go:107-112),
    ``media`` as :func:`llmsim.api.render.sources.chat_media` read (and checked) them."""
    if not ctx.engine.options.mm_encoder_only:
        return None
    from llmsim.api.render.features import media_hashes  # here: an import cycle at the top (see above)

    return ec_transfer_params(ctx, media_hashes(media))
