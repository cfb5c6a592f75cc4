"""Request fields that more than one endpoint family takes, as attrs classes.

Structured from JSON by :mod:`llmsim.api.structure` (strict types, unknown fields
ignored): the four prompt forms (/v1/completions now; embeddings and tokenize take
them too), media URLs and input audio (chat's content parts, responses' input parts),
and :class:`GenerationParams`, the fields chat and completions share.  Their rules
come in vLLM's order: :func:`check_generation_params` the ones pydantic applies as it
reads the body (before anything else), :func:`check_sampling_params` vLLM's
``SamplingParams`` rules and texts (:func:`check_sampling_fields`, also used by
/v1/responses), which vLLM applies only once the model (404), the admission check (503)
and the prompt (its length against the context window) passed, as it builds the
sampling params from the clamped output cap (``to_sampling_params``,
vllm/entrypoints/openai/chat_completion/serving.py:314-380,
completion/serving.py:107-176).  Field defaults follow vLLM's pydantic models: a field
sent as ``null`` counts as not set.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from llmsim.api.errors import ApiError, validation_error
from llmsim.api.structure import (
    FieldErrors,
    FieldTypeError,
    PydanticError,
    converter,
    json_type_name,
    pydantic_type_error,
    request_validation_error,
)

__all__ = [
    "MAX_N_SEQUENCES",
    "MAX_STOP_STRINGS",
    "GenerationParams",
    "InputAudio",
    "MediaUrl",
    "Prompt",
    "SamplingFields",
    "StreamOptions",
    "check_generation_params",
    "check_n_limit",
    "check_sampling_fields",
    "check_sampling_params",
    "token_id_refusal",
]


@attrs.frozen
class MediaUrl:
    """``{"url": ...}``; a bare URL string is accepted too (as vLLM does)."""

    url: str


@attrs.frozen
class InputAudio:
    data: str
    format: str | None = None


@attrs.frozen
class StreamOptions:
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


@attrs.frozen(kw_only=True, slots=False)
class SamplingFields:
    """vLLM's sampling fields: checked by :func:`check_sampling_fields` as vLLM's
    ``SamplingParams`` does, otherwise unused (the text is made up).

    The request bodies built on it are dict classes, not slotted ones: a frozen
    slotted class sets each of its ~40 fields through ``object.__setattr__``, a dict
    class stores them straight into ``__dict__``, which makes structuring a request
    (once per request) about 40 % cheaper."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias


@attrs.frozen(kw_only=True, slots=False)  # see SamplingFields
class GenerationParams(SamplingFields):
    """The fields chat and completions share."""

    model: str | None = None
    n: int | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    echo: bool | None = None
    # names the request unless X-Request-Id does (vllm/entrypoints/serve/engine/serving.py:133-142)
    request_id: str | None = None
    include_stop_str_in_output: bool | None = None  # vllm/entrypoints/openai/chat_completion/protocol.py:293
    kv_transfer_params: dict[str, Any] | None = None  # P/D (llmsim/api/transfer.py)
    cache_hit_threshold: float | None = None  # llm-d-inference-sim's admission gate (llmsim/api/transfer.py)

    @property
    def choices_per_prompt(self) -> int:
        return 1 if self.n is None else self.n

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a list (one string is a list of one, as ``SamplingParams`` reads it)."""
        return (self.stop,) if isinstance(self.stop, str) else self.stop or ()

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def logprobs_requested(self) -> bool:
        """Whether the choices carry logprobs (each family spells the field its way)."""
        return False

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage on every chunk: ``continuous_usage_stats`` counts only with
        ``include_usage`` (vLLM's ``should_include_usage``, serve/utils/api_utils.py:273-285)."""
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)

    @property
    def echo_without_generation(self) -> bool:
        """Completions' ``echo`` with ``max_tokens: 0``: the prompt alone (chat has no such case)."""
        return False

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        """The name of the field the output cap came from (for error ``param``)."""
        return "max_tokens"


_NO_STREAM_OPTIONS = (None, StreamOptions())  # made once: this runs on every chat and completions request


def check_generation_params(request: GenerationParams) -> None:
    """The value rules pydantic applies to chat and completions bodies as it reads them
    (model validators, field bounds); ApiError 400 on the first broken one."""
    if request.stream_options not in _NO_STREAM_OPTIONS and not request.streaming:
        # vllm/entrypoints/openai/chat_completion/protocol.py:858-868 (a model validator, so first);
        # vLLM tests the dict's truth, so an empty `stream_options: {}` passes
        message = "Stream options can only be defined when `stream=True`."
        raise validation_error(message, parameter="stream_options")
    _check_seed_range(request.seed)


def check_sampling_params(request: GenerationParams, max_tokens: int) -> None:
    """``SamplingParams``' rules for a chat or completions request whose model, admission
    and prompt passed, ``max_tokens`` the output cap clamped to the room the prompt
    leaves (vLLM's ``get_max_tokens``, vllm/entrypoints/serve/utils/api_utils.py:234-270;
    completions' ``echo`` with ``max_tokens: 0`` asks for one token,
    completion/protocol.py:393)."""
    check_sampling_fields(
        request, n=request.choices_per_prompt, max_tokens=max_tokens, min_tokens=request.min_tokens or 0
    )


#: The bounds of ``seed`` (``Field(None, ge=_INT64_MIN, le=_INT64_MAX)``,
#: vllm/entrypoints/openai/chat_completion/protocol.py:253, completion/protocol.py).
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _check_seed_range(seed: int | None) -> None:
    """A seed outside int64 is pydantic's field error (after the model validators above)."""
    if seed is None or _INT64_MIN <= seed <= _INT64_MAX:
        return
    kind, word, bound = (
        ("less_than_equal", "less", _INT64_MAX) if seed > _INT64_MAX else ("greater_than_equal", "greater", _INT64_MIN)
    )
    key = "le" if seed > _INT64_MAX else "ge"
    error = {
        "type": kind,
        "loc": "body.seed",
        "msg": f"Input should be {word} than or equal to {bound}",
        "input": seed,
        "ctx": {key: bound},
    }
    raise request_validation_error([error], "body.seed")


#: The most choices a request may ask for: vLLM's ``VLLM_MAX_N_SEQUENCES`` default (vllm/envs.py).
MAX_N_SEQUENCES = 16384


def check_n_limit(n: int) -> None:
    """``n`` above vLLM's limit, with its text and no parameter (``_verify_num_sequences``,
    vllm/sampling_params.py:56-63).  vLLM checks it as it builds the sampling params,
    after the model check and the admission check (completion/serving.py:107-111,
    chat_completion/serving.py:283), so the endpoints call it after their 503."""
    if n > MAX_N_SEQUENCES:
        raise validation_error(
            f"n must be at most {MAX_N_SEQUENCES}, got {n}. "
            "To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable."
        )


#: Below this temperature vLLM samples greedily (vllm/sampling_params.py:32).  An unset
#: field takes vLLM's default (vllm/entrypoints/openai/chat_completion/protocol.py:705-713).
_SAMPLING_EPS = 1e-5


def check_sampling_fields(
    request: SamplingFields, *, n: int = 1, max_tokens: int | None = None, min_tokens: int = 0
) -> None:
    """``SamplingParams._verify_args`` (vllm/sampling_params.py:635-735, 770-774), in its
    order and with its texts; the `` (parameter=…, value=…)`` suffix only where vLLM
    names the parameter.  ``n`` and ``max_tokens`` come from whichever request field
    the endpoint takes them from; ``max_tokens`` is named so whatever that field is, and
    ``min_tokens`` is checked against it (vLLM names the clamped cap there)."""
    _check_logit_bias_keys(request.logit_bias)
    if n < 1:  # _verify_num_sequences, sampling_params.py:49-55 (no parameter)
        raise validation_error(f"n must be at least 1, got {n}.")
    presence = 0.0 if request.presence_penalty is None else request.presence_penalty
    if not -2.0 <= presence <= 2.0:
        raise validation_error(f"presence_penalty must be in [-2, 2], got {presence}.")
    frequency = 0.0 if request.frequency_penalty is None else request.frequency_penalty
    if not -2.0 <= frequency <= 2.0:
        raise validation_error(f"frequency_penalty must be in [-2, 2], got {frequency}.")
    repetition = 1.0 if request.repetition_penalty is None else request.repetition_penalty
    if not math.isfinite(repetition):
        raise validation_error(f"repetition_penalty must be a finite number, got {repetition}.")
    if repetition <= 0.0:
        raise validation_error(f"repetition_penalty must be greater than zero, got {repetition}.")
    temperature = 1.0 if request.temperature is None else request.temperature
    if not math.isfinite(temperature):
        message = f"temperature must be a finite number, got {temperature}."
        raise validation_error(message, parameter="temperature", value=temperature)
    if temperature < 0.0:
        message = f"temperature must be non-negative, got {temperature}."
        raise validation_error(message, parameter="temperature", value=temperature)
    if temperature > 2.0:
        message = f"temperature must be in [0, 2], got {temperature}."
        raise validation_error(message, parameter="temperature", value=temperature)
    top_p = 1.0 if request.top_p is None else request.top_p
    if not 0.0 < top_p <= 1.0:
        raise validation_error(f"top_p must be in (0, 1], got {top_p}.", parameter="top_p", value=top_p)
    top_k = 0 if request.top_k is None else request.top_k
    if top_k < -1:  # -1 is quietly accepted as "disabled", like 0
        raise validation_error(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
    min_p = 0.0 if request.min_p is None else request.min_p
    if not 0.0 <= min_p <= 1.0:
        raise validation_error(f"min_p must be in [0, 1], got {min_p}.")
    if max_tokens is not None and max_tokens < 1:  # sampling_params.py:691-696
        message = f"max_tokens must be at least 1, got {max_tokens}."
        raise validation_error(message, parameter="max_tokens", value=max_tokens)
    if min_tokens < 0:  # sampling_params.py:697-705
        raise validation_error(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if max_tokens is not None and min_tokens > max_tokens:
        raise validation_error(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
    stops = (request.stop,) if isinstance(request.stop, str) else request.stop or ()
    if any(not stop for stop in stops):  # sampling_params.py:737-739
        raise validation_error("stop cannot contain an empty string.")
    if temperature < _SAMPLING_EPS and n > 1:  # _verify_greedy_sampling, sampling_params.py:770-774
        raise validation_error(f"n must be 1 when using greedy sampling, got {n}.")


def _check_logit_bias_keys(logit_bias: dict[str, float] | None) -> None:
    """Every ``logit_bias`` key must read as an integer, as Python's ``int`` reads it
    (``SamplingParams.from_optional``, vllm/sampling_params.py:491-516, which runs
    before ``_verify_args``).  The biases themselves are clamped to [-100, 100] there,
    never refused."""
    if not logit_bias:
        return
    invalid = []
    for key in logit_bias:
        try:
            int(key)
        except ValueError:
            invalid.append(key)
    if invalid:
        message = f"logit_bias contains key(s) that cannot be converted to integer token IDs: {invalid!r}"
        raise validation_error(message, parameter="logit_bias", value=invalid)


def token_id_refusal(request: SamplingFields, vocab_size: int) -> ApiError | None:
    """The 400 for token ids outside the vocabulary in ``logit_bias`` or
    ``stop_token_ids``, in that order (``SamplingParams.verify``, vllm/sampling_params.py:
    912-914, 1040-1093).  vLLM checks them as the engine takes the request, after the
    ``--max-logprobs`` check and after a stream began: the endpoints refuse with it as
    they refuse too many logprobs (:func:`llmsim.api.generation.stream`'s ``refusal``)."""
    if not request.logit_bias and not request.stop_token_ids:  # the usual request: nothing to check
        return None
    checked = (
        # dict keys: one entry per id, in the order first given (int("01") is int("1"))
        ("logit_bias", list(dict.fromkeys(int(key) for key in request.logit_bias or ()))),
        ("stop_token_ids", list(dict.fromkeys(request.stop_token_ids or ()))),  # deduplicated (:583-586)
    )
    for name, ids in checked:
        invalid = [token_id for token_id in ids if token_id < 0 or token_id >= vocab_size]
        if invalid:
            message = f"token_id(s) {invalid} in {name} contain out-of-vocab token ids. Vocabulary size: {vocab_size}"
            return validation_error(message, parameter=name, value=invalid)
    return None


def _structure_logit_bias(value: object, _: type) -> dict[str, float] | None:
    """``logit_bias``: an object of numbers (pydantic's ``dict[str, float]``), with
    pydantic's error for each value that is not one, at ``body.logit_bias.<key>``."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise FieldErrors(PydanticError("dict_type", "Input should be a valid dictionary", value))
    biases: dict[str, float] = {}
    errors = []
    for key, bias in value.items():
        try:
            biases[key] = _float(bias, float)
        except FieldTypeError as exc:
            kind, msg = pydantic_type_error(exc.expected, bias) or ("float_type", "Input should be a valid number")
            errors.append(PydanticError(kind, msg, bias, (key,)))
    if errors:
        raise FieldErrors(*errors)
    return biases


#: A prompt in one of its four forms: a string, strings, token ids, arrays of token ids.
Prompt = str | tuple[str, ...] | tuple[int, ...] | tuple[tuple[int, ...], ...]

_PROMPT_FORMS_MESSAGE = (
    "prompt must be a string, an array of strings, an array of token ids, or an array of arrays of token ids"
)


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _structure_prompt(value: object, _: type) -> Prompt:
    """The four prompt forms.  An empty array is kept: the endpoint reports it with
    llm-d-inference-sim's message."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        message = f"{_PROMPT_FORMS_MESSAGE}, got {json_type_name(value)}"
        raise ValueError(message)
    if all(isinstance(item, str) for item in value):
        return tuple(value)
    if all(_is_token_id(item) for item in value):
        return tuple(value)
    if all(isinstance(item, list) and all(_is_token_id(t) for t in item) for item in value):
        return tuple(tuple(item) for item in value)
    raise ValueError(f"{_PROMPT_FORMS_MESSAGE}; one array must not mix these kinds")


def _structure_media_url(value: object, _: type) -> MediaUrl | None:
    if value is None or isinstance(value, str):
        return None if value is None else MediaUrl(value)
    if isinstance(value, dict):
        return MediaUrl(_structure_url(value.get("url")))
    raise FieldTypeError("an object with a 'url' or a URL string", value)


def _structure_url(value: object) -> str:
    if isinstance(value, str):
        return value
    raise FieldTypeError("a 'url' string", value)


#: The most stop strings a list may hold: ``VLLM_MAX_STOP_STRINGS``'s default (vllm/envs.py:114).
MAX_STOP_STRINGS = 4
_NOT_A_STRING = "Input should be a valid string"


def _structure_stop(value: object, _: type) -> str | tuple[str, ...] | None:
    """``stop``: a string, or an array of at most :data:`MAX_STOP_STRINGS` strings
    (vLLM's ``StopParam``, vllm/entrypoints/generate/base/protocol.py:26-28).  Anything
    else gets pydantic's errors for that union: the string branch's, then the list
    branch's — too long (its length is checked before its items), its items that are
    not strings, or not a list at all."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) <= MAX_STOP_STRINGS and all(isinstance(item, str) for item in value):
        return tuple(value)
    errors = [PydanticError("string_type", _NOT_A_STRING, value)]
    if not isinstance(value, list):
        errors.append(PydanticError("list_type", "Input should be a valid list", value))
    elif len(value) > MAX_STOP_STRINGS:
        message = f"List should have at most {MAX_STOP_STRINGS} items after validation, not {len(value)}"
        ctx: dict[str, object] = {"field_type": "List", "max_length": MAX_STOP_STRINGS, "actual_length": len(value)}
        errors.append(PydanticError("too_long", message, value, ctx=ctx))
    else:
        errors.extend(
            PydanticError("string_type", _NOT_A_STRING, item, (i,))
            for i, item in enumerate(value)
            if not isinstance(item, str)
        )
    raise FieldErrors(*errors)


_float = converter.get_structure_hook(float)
converter.register_structure_hook_func(lambda t: t == (str | tuple[str, ...] | None), _structure_stop)
converter.register_structure_hook_func(lambda t: t == (dict[str, float] | None), _structure_logit_bias)
converter.register_structure_hook_func(lambda t: t == (MediaUrl | None), _structure_media_url)
converter.register_structure_hook_func(lambda t: t == Prompt, _structure_prompt)
