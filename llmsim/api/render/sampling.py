"""The ``sampling_params`` a render endpoint hands on: vLLM's ``SamplingParams`` as its
``/render`` serializes it.

``SamplingParams`` is a ``msgspec.Struct`` with ``omit_defaults=True``, dumped through
``PydanticMsgspecMixin._serialize_msgspec`` (vllm/v1/serial_utils.py:605-625): only the
fields that differ from their declared default are written, in declaration order
(vllm/sampling_params.py:285-440), private ``_`` fields never.  ``__post_init__``
(sampling_params.py:559-620) turns ``stop``, ``stop_token_ids`` and ``bad_words`` from
None into ``[]`` and sets ``skip_reading_prefix_cache`` to False, so those four are
always written; the endpoints' ``to_sampling_params`` set ``output_kind`` (DELTA = 1 on a
stream, FINAL_ONLY = 2 otherwise) and ``skip_clone=True``
(vllm/entrypoints/openai/chat_completion/protocol.py:748-823,
completion/protocol.py:359-436).
"""

from __future__ import annotations

from typing import Any

import attrs

from llmsim.api.request_fields import SamplingFields

__all__ = ["RenderedSampling"]

_SAMPLING_EPS = 1e-5  # below it vLLM samples greedily and resets top_p/top_k/min_p (sampling_params.py:601-606)
_DELTA, _FINAL_ONLY = 1, 2  # RequestOutputKind (sampling_params.py:208-214)


@attrs.frozen(kw_only=True)
class RenderedSampling:
    """What a request asks of the sampler, once its endpoint resolved its own fields."""

    fields: SamplingFields
    n: int = 1
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    stream: bool = False
    extra_args: dict[str, Any] | None = None  # as ``_hoist_transfer_params`` leaves it (render/serving.py:53-68)

    def as_dict(self) -> dict[str, object]:
        """The fields that differ from ``SamplingParams``' defaults, in its field order."""
        fields = self.fields
        temperature = 1.0 if fields.temperature is None else fields.temperature
        greedy = temperature < _SAMPLING_EPS
        stop = [fields.stop] if isinstance(fields.stop, str) else list(fields.stop or ())
        seed = None if fields.seed == -1 else fields.seed
        candidates: list[tuple[str, object, object]] = [
            ("n", self.n, 1),
            ("presence_penalty", fields.presence_penalty or 0.0, 0.0),
            ("frequency_penalty", fields.frequency_penalty or 0.0, 0.0),
            ("repetition_penalty", 1.0 if fields.repetition_penalty is None else fields.repetition_penalty, 1.0),
            ("temperature", temperature, 1.0),
            ("top_p", 1.0 if greedy or fields.top_p is None else fields.top_p, 1.0),
            ("top_k", 0 if greedy or fields.top_k is None else fields.top_k, 0),
            ("min_p", 0.0 if greedy or fields.min_p is None else fields.min_p, 0.0),
            ("seed", seed, None),
            ("stop", stop, None),
            ("stop_token_ids", list(dict.fromkeys(fields.stop_token_ids or ())), None),
            ("ignore_eos", self.ignore_eos, False),
            ("max_tokens", self.max_tokens, 16),
            ("min_tokens", self.min_tokens, 0),
            ("logprobs", self.logprobs, None),
            ("prompt_logprobs", self.prompt_logprobs, None),
            ("include_stop_str_in_output", self.include_stop_str_in_output, False),
            ("output_kind", _DELTA if self.stream else _FINAL_ONLY, 0),
            ("skip_clone", True, False),
            ("output_text_buffer_length", self._buffer_length(stop), 0),
            ("logit_bias", self._logit_bias(), None),
            ("extra_args", self.extra_args, None),
            ("bad_words", [], None),
            ("skip_reading_prefix_cache", self.prompt_logprobs is not None, None),
        ]
        return {name: value for name, value, default in candidates if value != default}

    def _buffer_length(self, stop: list[str]) -> int:
        """Characters held back for stop strings (sampling_params.py:591-593)."""
        if stop and not self.include_stop_str_in_output:
            return max(map(len, stop)) - 1
        return 0

    def _logit_bias(self) -> dict[int, float] | None:
        """Keys as integers, biases clamped to [-100, 100] (``from_optional``, sampling_params.py:491-503)."""
        bias = self.fields.logit_bias
        if bias is None:
            return None
        return {int(token): min(100.0, max(-100.0, value)) for token, value in bias.items()}
