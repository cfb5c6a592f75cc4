"""Request bodies of /v1/chat/completions and /v1/completions, as attrs classes.

Structured from JSON by :mod:`llmsim.api.structure` (strict types, unknown fields
ignored).  Field defaults follow vLLM's pydantic models: a field sent as ``null``
counts as not set, except that ``max_tokens`` of /v1/completions defaults to 16 only
when absent, as in vLLM.  :func:`check_generation_params` holds the rules that are
about values rather than types (the messages are llm-d-inference-sim's);
:func:`check_chat_params` adds chat's tool and logprob rules (vLLM's messages).
"""

from __future__ import annotations

from typing import Any

import attrs

from llmsim.api.errors import ApiError
from llmsim.api.structure import FieldTypeError, converter, json_type_name, structure
from llmsim.model.logprobs import MAX_TOP_LOGPROBS
from llmsim.model.tools import NamedToolChoice, ToolChoice

__all__ = [
    "COMPLETIONS_DEFAULT_MAX_TOKENS",
    "MAX_COMPLETION_LOGPROBS",
    "AssistantToolCall",
    "ChatCompletionRequest",
    "ChatMessage",
    "ChatTool",
    "CompletionRequest",
    "ContentPart",
    "FunctionCall",
    "FunctionDefinition",
    "GenerationParams",
    "InputAudio",
    "MediaUrl",
    "MessageContent",
    "Prompt",
    "StreamOptions",
    "check_chat_params",
    "check_generation_params",
    "parse_chat_request",
    "parse_completion_request",
]

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound on /v1/completions ``logprobs``


@attrs.frozen
class MediaUrl:
    """``{"url": ...}``; a bare URL string is accepted too (as vLLM does)."""

    url: str


@attrs.frozen
class InputAudio:
    data: str
    format: str | None = None


@attrs.frozen
class ContentPart:
    """One block of a message's content; which field is set depends on ``type``."""

    type: str
    text: str | None = None
    image_url: MediaUrl | None = None
    audio_url: MediaUrl | None = None
    video_url: MediaUrl | None = None
    input_audio: InputAudio | None = None


MessageContent = str | tuple[ContentPart, ...] | None


@attrs.frozen
class FunctionCall:
    name: str
    arguments: str


@attrs.frozen
class AssistantToolCall:
    """A call the assistant made earlier in the conversation (it costs prompt tokens)."""

    function: FunctionCall
    id: str | None = None
    type: str = "function"


@attrs.frozen
class ChatMessage:
    role: str
    content: MessageContent = None
    tool_calls: tuple[AssistantToolCall, ...] | None = None
    tool_call_id: str | None = None


@attrs.frozen
class FunctionDefinition:
    name: str
    description: str | None = None
    parameters: Any = None  # a JSON schema; compiled (and so checked) by the handler
    strict: bool | None = None


@attrs.frozen
class ChatTool:
    function: FunctionDefinition
    type: str = "function"  # the only type served (see _structure_tool)


@attrs.frozen
class StreamOptions:
    include_usage: bool | None = None


@attrs.frozen(kw_only=True)
class GenerationParams:
    """The fields chat and completions share."""

    model: str | None = None
    n: int | None = None
    max_tokens: int | None = None
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
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        """The name of the field the output cap came from (for error ``param``)."""
        return "max_tokens"


@attrs.frozen(kw_only=True)
class ChatCompletionRequest(GenerationParams):
    messages: tuple[ChatMessage, ...]
    max_completion_tokens: int | None = None
    tools: tuple[ChatTool, ...] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    @property
    def effective_tool_choice(self) -> ToolChoice:
        """vLLM's default: ``auto`` when tools are given, else ``none``."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` wins over the deprecated ``max_tokens``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"


Prompt = str | tuple[str, ...] | tuple[int, ...] | tuple[tuple[int, ...], ...]


@attrs.frozen(kw_only=True)
class CompletionRequest(GenerationParams):
    prompt: Prompt
    max_tokens: int | None = COMPLETIONS_DEFAULT_MAX_TOKENS
    logprobs: int | None = None


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


def _structure_content(value: object, _: type) -> MessageContent:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        return converter.structure(value, tuple[ContentPart, ...])
    raise FieldTypeError("a string or an array of content parts", value)


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


_TOOL_CHOICE_MODES = ("none", "auto", "required")
_NAMED_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def _structure_tool_choice(value: object, _: type) -> ToolChoice | None:
    """``none``/``auto``/``required``, a named function (vLLM's messages when it is
    malformed), or OpenAI's ``allowed_tools`` and ``custom`` forms, which are accepted
    but not enforced: they act as their ``mode`` and as ``auto``."""
    if value is None:
        return None
    if isinstance(value, str):
        if value in _TOOL_CHOICE_MODES:
            return value  # type: ignore[return-value]
        raise ValueError(
            f'Invalid value for `tool_choice`: {value}! Only named tools, "none", "auto" or "required" are supported.'
        )
    if not isinstance(value, dict):
        raise FieldTypeError("a string or an object", value)
    kind = value.get("type", "function")
    if kind == "allowed_tools":
        allowed = value.get("allowed_tools")
        mode = allowed.get("mode") if isinstance(allowed, dict) else None
        return "required" if mode == "required" else "auto"
    if kind == "custom":
        return "auto"
    function = value.get("function")
    if not isinstance(function, dict):
        message = f"Invalid value for `function`: `{function}` in `tool_choice`! {_NAMED_USAGE}"
        raise ValueError(message)
    if "name" not in function:
        raise ValueError(f"Expected field `name` in `function` in `tool_choice`! {_NAMED_USAGE}")
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise ValueError(f"Invalid `name` in `function`: `{name}` in `tool_choice`! {_NAMED_USAGE}")
    return NamedToolChoice(name)


_structure_tool_fields = converter.get_structure_hook(ChatTool)


def _structure_tool(value: object, type_: type) -> ChatTool:
    """A function tool; vLLM serves no other type (``custom`` tools are a 400)."""
    if isinstance(value, dict) and value.get("type", "function") != "function":
        raise ValueError(f"only function tools are supported, got type {value['type']!r}")
    return _structure_tool_fields(value, type_)  # type: ignore[no-any-return]


converter.register_structure_hook_func(lambda t: t == (MediaUrl | None), _structure_media_url)
converter.register_structure_hook_func(lambda t: t == MessageContent, _structure_content)
converter.register_structure_hook_func(lambda t: t == Prompt, _structure_prompt)
converter.register_structure_hook_func(lambda t: t == (ToolChoice | None), _structure_tool_choice)
converter.register_structure_hook(ChatTool, _structure_tool)


def check_generation_params(request: GenerationParams) -> None:
    """Value rules shared by chat and completions; ApiError 400 on the first broken one."""
    if request.n is not None and request.n < 1:
        raise ApiError(400, "n must be at least 1", param="n")
    max_tokens = request.requested_max_tokens
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, "Max completion tokens and max tokens should be positive", param=request.max_tokens_param)
    if request.stream_options is not None and not request.streaming:
        raise ApiError(400, "Stream options can only be defined when stream is True.", param="stream_options")


def check_chat_params(request: ChatCompletionRequest) -> None:
    """Chat's tool and logprob rules, with vLLM's messages.  A tool's schema is checked
    when the handler compiles it."""
    tools, choice = request.tools, request.tool_choice
    if tools is not None and not tools:
        message = "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely."
        raise ApiError(400, message, param="tools")
    if choice is not None and choice != "none" and tools is None:
        raise ApiError(400, "When using `tool_choice`, `tools` must be set.", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and all(tool.function.name != choice.name for tool in tools or ()):
        message = "The tool specified in `tool_choice` does not match any of the specified `tools`"
        raise ApiError(400, message, param="tool_choice")
    top = request.top_logprobs
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        message = f"`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {top}."
        raise ApiError(400, message, param="top_logprobs")
    if top and not request.logprobs:
        raise ApiError(400, "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")


def parse_chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    request = structure(body, ChatCompletionRequest)
    check_generation_params(request)
    check_chat_params(request)
    return request


def parse_completion_request(body: dict[str, Any]) -> CompletionRequest:
    request = structure(body, CompletionRequest)
    check_generation_params(request)
    logprobs = request.logprobs
    if logprobs is not None and not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS:
        message = f"`logprobs` must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {logprobs}."
        raise ApiError(400, message, param="logprobs")
    return request
