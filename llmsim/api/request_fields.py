"""Request fields that more than one endpoint family takes, as attrs classes.

Structured from JSON by :mod:`llmsim.api.structure` (strict types, unknown fields
ignored): the four prompt forms (/v1/completions now; embeddings and tokenize take
them too), media URLs and input audio (chat's content parts, responses' input parts),
and :class:`GenerationParams`, the fields chat and completions share, with
:func:`check_generation_params`, their rules about values rather than types (vLLM's
message for ``max_tokens``, llm-d-inference-sim's for the rest).  Field defaults follow vLLM's pydantic models: a
field sent as ``null`` counts as not set.
"""

from __future__ import annotations

import attrs

from llmsim.api.errors import ApiError, validation_error
from llmsim.api.structure import FieldTypeError, converter, json_type_name

__all__ = [
    "GenerationParams",
    "InputAudio",
    "MediaUrl",
    "Prompt",
    "StreamOptions",
    "check_generation_params",
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


@attrs.frozen(kw_only=True)
class GenerationParams:
    """The fields chat and completions share."""

    model: str | None = None
    n: int | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    echo: bool | None = None

    @property
    def choices_per_prompt(self) -> int:
        return 1 if self.n is None else self.n

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

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


def check_generation_params(request: GenerationParams) -> None:
    """Value rules shared by chat and completions; ApiError 400 on the first broken one."""
    if request.n is not None and request.n < 1:
        raise ApiError(400, "n must be at least 1", param="n")
    max_tokens = request.requested_max_tokens
    if max_tokens is not None and max_tokens < 1 and not request.echo_without_generation:
        # SamplingParams._verify_args (vllm/sampling_params.py:691-696): the field is
        # max_tokens whichever request field the cap came from
        message = f"max_tokens must be at least 1, got {max_tokens}."
        raise validation_error(message, parameter="max_tokens", value=max_tokens)
    if request.stream_options is not None and not request.streaming:
        raise ApiError(400, "Stream options can only be defined when stream is True.", param="stream_options")


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


converter.register_structure_hook_func(lambda t: t == (MediaUrl | None), _structure_media_url)
converter.register_structure_hook_func(lambda t: t == Prompt, _structure_prompt)
