"""The request body of POST /v1/chat/completions: structure, validation, and the
conversation it asks the model to read.

Structured from JSON by :mod:`llmsim.api.structure` (strict types, unknown fields
ignored); the fields chat shares with completions are
:class:`~llmsim.api.request_fields.GenerationParams`.  :func:`check_chat_params` adds
chat's tool and logprob rules (vLLM's messages).

Messages become :class:`~llmsim.model.tokenizer.ChatTurn` s for the chat template:
text blocks are joined with newlines (as vLLM does for string content formats) and
every image, audio or video block stands in as a short placeholder, so it costs a few
prompt tokens.  Tool definitions and earlier tool calls are written into the prompt as
a Hermes-style template does, so they cost tokens too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs

from llmsim.api.errors import ApiError, validation_error
from llmsim.api.prompts import (
    DEFAULT_CHAT_OPTIONS,
    MEDIA,
    ChatOptions,
    chat_options,
    check_generation_prompt,
    prompt_ids,
    template_prompt_ids,
    tool_call_text,
    tools_turn,
)
from llmsim.api.request_fields import GenerationParams, InputAudio, MediaUrl, check_generation_params
from llmsim.api.structure import FieldTypeError, converter, read_bodies_fast, structure
from llmsim.api.structured import ResponseFormat, StructuredOutputsParams
from llmsim.model.tokenizer import ChatTurn, Tokenizer, render_chat
from llmsim.model.tools import NamedToolChoice, ToolChoice

__all__ = [
    "MEDIA_PLACEHOLDERS",
    "AssistantToolCall",
    "ChatCompletionRequest",
    "ChatMessage",
    "ChatTool",
    "ContentPart",
    "FunctionCall",
    "FunctionDefinition",
    "MessageContent",
    "assistant_echo",
    "chat_prompt_ids",
    "chat_turns",
    "check_chat_params",
    "last_user_text",
    "parse_chat_request",
    "request_prompt_ids",
    "template_messages",
    "template_tool",
    "tool_definition",
]


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


@read_bodies_fast
@attrs.frozen(kw_only=True, slots=False)  # see SamplingFields
class ChatCompletionRequest(GenerationParams):
    messages: tuple[ChatMessage, ...]
    max_completion_tokens: int | None = None
    tools: tuple[ChatTool, ...] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None  # vllm/entrypoints/openai/chat_completion/protocol.py:252
    structured_outputs: StructuredOutputsParams | None = None  # ibid. :397
    # the chat template's fields (ibid. :332-385)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def chat_options(self) -> ChatOptions:
        """How the prompt is rendered; 400 for a template sent with the request."""
        return chat_options(
            add_generation_prompt=self.add_generation_prompt,
            continue_final_message=self.continue_final_message,
            chat_template=self.chat_template,
            chat_template_kwargs=self.chat_template_kwargs,
        )

    @property
    def effective_tool_choice(self) -> ToolChoice:
        """vLLM's default: ``auto`` when tools are given, else ``none``."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    @property
    def logprobs_requested(self) -> bool:
        return bool(self.logprobs)

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` wins over the deprecated ``max_tokens``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"


def _structure_content(value: object, _: type) -> MessageContent:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        return converter.structure(value, tuple[ContentPart, ...])
    raise FieldTypeError("a string or an array of content parts", value)


_TOOL_CHOICE_MODES: dict[str, ToolChoice] = {"none": "none", "auto": "auto", "required": "required"}
_NAMED_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def _structure_tool_choice(value: object, _: type) -> ToolChoice | None:
    """``none``/``auto``/``required``, a named function (vLLM's messages when it is
    malformed), or OpenAI's ``allowed_tools`` and ``custom`` forms, which are accepted
    but not enforced: they act as their ``mode`` and as ``auto``."""
    if value is None:
        return None
    if isinstance(value, str):
        mode = _TOOL_CHOICE_MODES.get(value)
        if mode is not None:
            return mode
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
    tool: ChatTool = _structure_tool_fields(value, type_)
    return tool


converter.register_structure_hook_func(lambda t: t == MessageContent, _structure_content)
converter.register_structure_hook_func(lambda t: t == (ToolChoice | None), _structure_tool_choice)
converter.register_structure_hook(ChatTool, _structure_tool)


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
    # vllm/entrypoints/openai/chat_completion/protocol.py:913-926; the cap
    # (--max-logprobs) is checked as the engine takes the request (api/logprobs_limit.py)
    top = request.top_logprobs
    if top is not None and top < -1:
        raise validation_error("`top_logprobs` must be a positive value or -1.", parameter="top_logprobs", value=top)
    if top and not request.logprobs:
        raise validation_error("when using `top_logprobs`, `logprobs` must be set to true.", parameter="top_logprobs")


def parse_chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    check_generation_prompt(body)
    request = structure(body, ChatCompletionRequest)
    check_generation_params(request)
    check_chat_params(request)
    return request


# --- the conversation --------------------------------------------------------------------

#: The text a non-text content block contributes to the prompt.
MEDIA_PLACEHOLDERS = {
    "image_url": MEDIA["image"],
    "input_audio": MEDIA["audio"],
    "audio_url": MEDIA["audio"],
    "video_url": MEDIA["video"],
}


def _part_text(part: ContentPart, where: str) -> str:
    if part.type == "text":
        if part.text is None:
            raise ApiError(400, f"Content part {where} of type 'text' has no 'text'.", param=f"{where}.text")
        return part.text
    placeholder = MEDIA_PLACEHOLDERS.get(part.type)
    if placeholder is None:
        known = ", ".join(["text", *MEDIA_PLACEHOLDERS])
        message = f"Unknown content part type {part.type!r} in {where}; use one of: {known}."
        raise ApiError(400, message, param=f"{where}.type")
    if getattr(part, part.type) is None:
        message = f"Content part {where} of type {part.type!r} has no {part.type!r} object."
        raise ApiError(400, message, param=f"{where}.{part.type}")
    return placeholder


def _message_text(message: ChatMessage, index: int, *, with_media: bool) -> str:
    """The text of ``messages[index]``.  (Its location is spelled out only for a
    content-part list, the one form that can be malformed here.)"""
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    where = f"messages[{index}]"
    texts = [_part_text(part, f"{where}.content[{i}]") for i, part in enumerate(content)]
    if not with_media:
        texts = [text for part, text in zip(content, texts, strict=True) if part.type == "text"]
    return "\n".join(texts)


def _turn_text(message: ChatMessage, index: int) -> str:
    text = _message_text(message, index, with_media=True)
    if not message.tool_calls:
        return text
    calls = [tool_call_text(call.function.name, call.function.arguments) for call in message.tool_calls]
    return "\n".join([text, *calls] if text else calls)


def chat_turns(messages: Sequence[ChatMessage], tools: Sequence[ChatTool] | None = None) -> list[ChatTurn]:
    """The conversation as the chat template sees it, the tool definitions first; 400 on
    a malformed content part."""
    turns = [ChatTurn(message.role, _turn_text(message, i)) for i, message in enumerate(messages)]
    if tools:
        turns.insert(0, tools_turn([tool_definition(tool) for tool in tools]))
    return turns


def tool_definition(tool: ChatTool) -> dict[str, object]:
    """A tool as the prompt shows it (unset fields left out)."""
    function = attrs.asdict(tool.function, filter=lambda _, value: value is not None)
    return {"type": tool.type, "function": function}


def request_prompt_ids(tokenizer: Tokenizer, request: ChatCompletionRequest) -> list[int]:
    """The prompt token ids of ``request``, with its template options (chat completions and
    its render endpoint tokenize a request the same way)."""
    return chat_prompt_ids(
        tokenizer,
        request.messages,
        request.tools,
        request.chat_options(),
        add_special_tokens=request.add_special_tokens,
    )


def chat_prompt_ids(
    tokenizer: Tokenizer,
    messages: Sequence[ChatMessage],
    tools: Sequence[ChatTool] | None = None,
    options: ChatOptions = DEFAULT_CHAT_OPTIONS,
    *,
    add_special_tokens: bool = False,
) -> list[int]:
    """The prompt token ids of a chat request: the model's own chat template when the
    tokenizer came with one, else the built-in rendering of :func:`chat_turns`."""
    template = tokenizer.chat_template
    if template is None:
        text = _plain_prompt(messages) if tools is None and options is DEFAULT_CHAT_OPTIONS else None
        if text is not None:
            return tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return prompt_ids(tokenizer, chat_turns(messages, tools), options, add_special_tokens=add_special_tokens)
    conversation = template_messages(messages, template.content_format)
    tool_dicts = None if tools is None else [template_tool(tool) for tool in tools]
    return template_prompt_ids(
        tokenizer, template, conversation, tool_dicts, options, add_special_tokens=add_special_tokens
    )


#: Recent plain conversations (text only, see :func:`_plain_prompt`) and their prompt
#: text, this many at most (the oldest forgotten first): a load test sends the same few.
_PLAIN_PROMPTS: dict[tuple[str | None, ...], str] = {}
_PLAIN_PROMPTS_KEPT = 512
#: What a remembered conversation may hold: its messages, and their characters (role,
#: content and tool_call_id alike), so that an entry stays a few KB whatever the body.
_PLAIN_PROMPT_MESSAGES = 32
_PLAIN_PROMPT_CHARS = 4096


def _plain_prompt(messages: Sequence[ChatMessage]) -> str | None:
    """The prompt text of a conversation of a few short plain-text messages (no content
    parts, no tool calls) with no tools and the default template options, remembered:
    without a model template every tokenizer renders it as ChatML (:func:`render_chat`),
    a function of the messages alone.  None for any other conversation."""
    if len(messages) > _PLAIN_PROMPT_MESSAGES:
        return None
    size = 0
    strings: list[str | None] = []
    for message in messages:
        content = message.content
        if message.tool_calls or isinstance(content, tuple):
            return None
        size += len(message.role) + len(content or "") + len(message.tool_call_id or "")
        strings += (message.role, content)
    if size > _PLAIN_PROMPT_CHARS:
        return None
    # Keyed by what the rendering reads, each role and content: strings hash and compare
    # in C, a ChatMessage through its attrs-made __hash__ and __eq__.
    key = tuple(strings)
    text = _PLAIN_PROMPTS.get(key)
    if text is None:
        text = render_chat(chat_turns(messages))
        if len(_PLAIN_PROMPTS) >= _PLAIN_PROMPTS_KEPT:
            del _PLAIN_PROMPTS[next(iter(_PLAIN_PROMPTS))]
        _PLAIN_PROMPTS[key] = text
    return text


def template_messages(messages: Sequence[ChatMessage], content_format: str) -> list[dict[str, Any]]:
    """The messages as vLLM hands them to a chat template (``parse_chat_message_content``
    and ``_postprocess_messages``, ``vllm/renderers/chat_utils/chat_message.py:610-771``):
    content a string (``"string"`` format: text parts joined with newlines) or a list of
    parts (``"openai"``), an assistant's tool calls with their arguments as objects, a
    tool message's ``tool_call_id``."""
    conversation = []
    for index, message in enumerate(messages):
        entry: dict[str, Any] = {"role": message.role, "content": _template_content(message, index, content_format)}
        if message.role == "assistant" and message.tool_calls:
            entry["tool_calls"] = [_template_tool_call(call) for call in message.tool_calls]
        if message.role == "tool" and message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        conversation.append(entry)
    return conversation


def _template_content(message: ChatMessage, index: int, content_format: str) -> str | list[dict[str, str]]:
    content = message.content
    if content_format == "string" or (message.role == "tool" and not isinstance(content, tuple)):
        return _message_text(message, index, with_media=True)
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts = []
    for i, part in enumerate(content):
        text = _part_text(part, f"messages[{index}].content[{i}]")  # checks the part
        parts.append({"type": "text", "text": text} if part.type == "text" else {"type": _MEDIA_KIND[part.type]})
    if message.role == "tool" and all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


#: A non-text content part's kind as vLLM's ``openai`` content format names it.
_MEDIA_KIND = {"image_url": "image", "input_audio": "audio", "audio_url": "audio", "video_url": "video"}


def _template_tool_call(call: AssistantToolCall) -> dict[str, Any]:
    """An earlier tool call, its arguments parsed to an object (``{}`` when they are not
    a JSON object), as vLLM does for templates."""
    try:
        arguments = json.loads(call.function.arguments) if call.function.arguments else {}
    except json.JSONDecodeError:
        arguments = {}
    entry: dict[str, Any] = {"id": call.id} if call.id is not None else {}
    entry["type"] = call.type
    entry["function"] = {"name": call.function.name, "arguments": arguments if isinstance(arguments, dict) else {}}
    return entry


def template_tool(tool: ChatTool) -> dict[str, Any]:
    """A tool as vLLM dumps it for the template: ``description`` and ``parameters`` even
    when null, ``strict`` only when set (``vllm/entrypoints/generate/base/protocol.py:298-313``)."""
    function = tool.function
    fields: dict[str, Any] = {"name": function.name, "description": function.description}
    fields["parameters"] = function.parameters
    if function.strict is not None:
        fields["strict"] = function.strict
    return {"type": tool.type, "function": fields}


def last_user_text(messages: Sequence[ChatMessage]) -> str:
    """The text of the last user message: what ``--mode echo`` replays ("" if none)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return _message_text(messages[i], i, with_media=False)
    return ""


def assistant_echo(messages: Sequence[ChatMessage]) -> str | None:
    """With ``echo: true``, vLLM prepends the last message to the answer when that
    message is the assistant's own (a continuation); otherwise nothing."""
    if not messages or messages[-1].role != "assistant":
        return None
    return _message_text(messages[-1], len(messages) - 1, with_media=False) or None
