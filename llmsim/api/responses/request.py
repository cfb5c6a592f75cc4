"""The request body of POST /v1/responses: structure, validation, and what it means.

Structured strictly with the shared converter (:mod:`llmsim.api.structure`: wrong
types are a 400 naming the field, unknown fields are ignored), then checked for what
types cannot say: item and content-part kinds, tools and their schemas, every
``tool_choice`` form, ``text.format``.  The result is a :class:`ResponsesInputs`: the
conversation as chat turns (for the prompt), the callable tools and the tool-choice
mode, the output format.
"""

from __future__ import annotations

from typing import Any

import attrs

from llmsim.api.errors import ApiError
from llmsim.api.prompts import MEDIA, tool_call_text
from llmsim.api.request_fields import InputAudio, MediaUrl, SamplingFields
from llmsim.api.structure import FieldTypeError, converter, structure
from llmsim.api.tool_support import FunctionTool, build_tool, compile_parameters
from llmsim.model.tokenizer import ChatTurn
from llmsim.model.tools import CompiledSchema

__all__ = [
    "LOGPROBS_INCLUDE",
    "Conversation",
    "InputItem",
    "InputPart",
    "OutputFormat",
    "ResponsesRequest",
    "TextFormat",
    "ToolChoice",
    "ToolParam",
    "function_tools",
    "input_conversation",
    "output_format",
    "parse_responses_request",
    "tool_choice_of",
]

LOGPROBS_INCLUDE = "message.output_text.logprobs"
MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
_MEDIA_PARTS = {"input_image": "image", "input_audio": "audio", "input_file": "file"}
_IGNORED_ITEMS = ("reasoning", "item_reference")  # replayed output we never produce; no prompt text
_CHOICE_MODES = ("none", "auto", "required")


@attrs.frozen
class InputPart:
    """One content block of a message (or of a function_call_output)."""

    type: str
    text: str | None = None
    refusal: str | None = None
    image_url: MediaUrl | None = None  # a URL string (an {"url"} object is accepted too)
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    data: str | None = None  # input_audio as llm-d-inference-sim documents it
    format: str | None = None
    input_audio: InputAudio | None = None  # input_audio as AIPerf sends it


ItemContent = str | tuple[InputPart, ...] | None


@attrs.frozen
class InputItem:
    """One item of ``input``; which fields matter depends on ``type`` (default message)."""

    type: str | None = None
    role: str | None = None
    content: ItemContent = None
    id: str | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: ItemContent = None
    status: str | None = None


ResponsesInput = str | tuple[InputItem, ...]


@attrs.frozen
class FunctionSpec:
    """The nested chat-completions tool shape, accepted too."""

    name: str | None = None
    description: str | None = None
    parameters: Any = None
    strict: bool | None = None


@attrs.frozen
class ToolParam:
    type: str
    name: str | None = None
    description: str | None = None
    parameters: Any = None
    strict: bool | None = None
    function: FunctionSpec | None = None


@attrs.frozen
class TextFormat:
    type: str
    name: str | None = None
    schema: Any = None
    strict: bool | None = None
    description: str | None = None


@attrs.frozen
class TextConfig:
    format: TextFormat | None = None
    verbosity: str | None = None


@attrs.frozen(kw_only=True, slots=False)  # see SamplingFields
class ResponsesRequest(SamplingFields):
    model: str | None = None
    request_id: str | None = None  # vLLM: the response's id (responses/protocol.py:357-364)
    input: ResponsesInput | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    tools: tuple[ToolParam, ...] | None = None
    tool_choice: Any = None
    text: TextConfig | None = None
    include: tuple[str, ...] | None = None
    top_logprobs: int | None = None
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None  # vllm/entrypoints/openai/responses/protocol.py:306
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    user: str | None = None
    truncation: str | None = None
    service_tier: str | None = None
    metadata: Any = None
    reasoning: Any = None

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def storing(self) -> bool:
        """OpenAI's default: store unless told not to."""
        return self.store is None or self.store

    @property
    def wants_logprobs(self) -> bool:
        return self.include is not None and LOGPROBS_INCLUDE in self.include


def _structure_item_content(value: object, _: type) -> ItemContent:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        return converter.structure(value, tuple[InputPart, ...])
    raise FieldTypeError("a string or an array of content parts", value)


def _structure_input(value: object, _: type) -> ResponsesInput:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return converter.structure(value, tuple[InputItem, ...])
    raise FieldTypeError("a string or an array of input items", value)


converter.register_structure_hook_func(lambda t: t == ItemContent, _structure_item_content)
converter.register_structure_hook_func(
    lambda t: t == (ResponsesInput | None), lambda v, _: None if v is None else _structure_input(v, _)
)


def parse_responses_request(body: dict[str, Any]) -> ResponsesRequest:
    """The request, type-checked, with the value rules that need no other state."""
    request = structure(body, ResponsesRequest)
    if request.input is None and request.previous_response_id is None:
        raise ApiError(400, "input is required", param="input")
    if request.background:
        raise ApiError(400, "Background responses are not supported by this server.", param="background")
    return request


# --- the conversation ---------------------------------------------------------------------


@attrs.frozen
class Conversation:
    """Input items as the chat template sees them."""

    turns: tuple[ChatTurn, ...]
    has_tool_output: bool  # a function_call_output is among them: tools stay off
    last_user_text: str  # what --mode echo replays


def input_conversation(value: ResponsesInput | None) -> Conversation:
    """The turns of ``input``; 400 naming the item for anything malformed."""
    if value is None:
        return Conversation((), False, "")
    if isinstance(value, str):
        return Conversation((ChatTurn("user", value),), False, value)
    turns: list[ChatTurn] = []
    has_tool_output = False
    last_user = ""
    for index, item in enumerate(value):
        where = f"input[{index}]"
        kind = item.type or "message"
        if kind == "message":
            role = _required(item.role, f"{where}.role")
            if role not in MESSAGE_ROLES:
                raise ApiError(
                    400,
                    f"Invalid role {role!r} for {where}; use one of: {', '.join(MESSAGE_ROLES)}.",
                    param=f"{where}.role",
                )
            if item.content is None:
                raise ApiError(400, f"Field '{where}.content' is required.", param=f"{where}.content")
            text, plain = _content_text(item.content, f"{where}.content")
            turns.append(ChatTurn(role, text))
            if role == "user":
                last_user = plain
        elif kind == "function_call":
            name = _required(item.name, f"{where}.name")
            arguments = _required(item.arguments, f"{where}.arguments")
            _required(item.call_id, f"{where}.call_id")
            turns.append(ChatTurn("assistant", tool_call_text(name, arguments)))
        elif kind == "function_call_output":
            _required(item.call_id, f"{where}.call_id")
            if item.output is None:
                raise ApiError(400, f"Field '{where}.output' is required.", param=f"{where}.output")
            turns.append(ChatTurn("tool", _content_text(item.output, f"{where}.output")[0]))
            has_tool_output = True
        elif kind not in _IGNORED_ITEMS:
            known = "message, function_call, function_call_output"
            raise ApiError(
                400, f"Unsupported input item type {kind!r} in {where}; use one of: {known}.", param=f"{where}.type"
            )
    return Conversation(tuple(turns), has_tool_output, last_user)


def _required(value: str | None, where: str) -> str:
    if value is None:
        raise ApiError(400, f"Field '{where}' is required.", param=where)
    return value


def _content_text(content: str | tuple[InputPart, ...], where: str) -> tuple[str, str]:
    """(text with media placeholders, text alone) of a content field."""
    if isinstance(content, str):
        return content, content
    texts: list[str] = []
    plain: list[str] = []
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        field = _TEXT_PARTS.get(part.type)
        if field is not None:
            text = getattr(part, field)
            if text is None:
                raise ApiError(400, f"Content part {at} of type {part.type!r} has no {field!r}.", param=f"{at}.{field}")
            texts.append(text)
            plain.append(text)
            continue
        media = _MEDIA_PARTS.get(part.type)
        if media is None:
            known = ", ".join([*_TEXT_PARTS, *_MEDIA_PARTS])
            raise ApiError(
                400, f"Unknown content part type {part.type!r} in {at}; use one of: {known}.", param=f"{at}.type"
            )
        _check_media(part, at)
        texts.append(MEDIA[media])
    return "\n".join(texts), "\n".join(plain)


def _check_media(part: InputPart, at: str) -> None:
    if part.type == "input_image" and part.image_url is None and part.file_id is None:
        raise ApiError(
            400, f"Content part {at} of type 'input_image' needs 'image_url' or 'file_id'.", param=f"{at}.image_url"
        )
    if part.type == "input_audio" and part.data is None and part.input_audio is None:
        raise ApiError(
            400, f"Content part {at} of type 'input_audio' needs 'data' (or 'input_audio').", param=f"{at}.data"
        )
    if part.type == "input_file" and part.file_id is None and part.file_data is None and part.file_url is None:
        raise ApiError(
            400,
            f"Content part {at} of type 'input_file' needs 'file_id', 'file_data' or 'file_url'.",
            param=f"{at}.file_id",
        )


# --- tools, tool_choice, text.format ----------------------------------------------------------


def function_tools(tools: tuple[ToolParam, ...] | None) -> list[FunctionTool]:
    """The function tools (flat Responses shape, or chat's nested one), schemas compiled.
    Hosted tool types (web_search, file_search, mcp, custom...) are accepted on the
    wire but never called."""
    result = []
    for index, tool in enumerate(tools or ()):
        if tool.type != "function":
            continue
        where = f"tools[{index}]"
        spec = tool.function
        name = tool.name if tool.name is not None else (spec.name if spec is not None else None)
        if not name:
            raise ApiError(400, f"Field '{where}.name' is required.", param=f"{where}.name")
        if spec is not None and tool.name is None:
            description, parameters, path = spec.description, spec.parameters, f"{where}.function.parameters"
        else:
            description, parameters, path = tool.description, tool.parameters, f"{where}.parameters"
        definition = {"type": "function", "name": name, "description": description, "parameters": parameters}
        result.append(build_tool(name, parameters, path=path, definition=definition))
    return result


@attrs.frozen
class ToolChoice:
    mode: str  # "none", "auto" or "required"
    forced: FunctionTool | None = None
    echo: object = "auto"  # as the response object reports it


def tool_choice_of(value: object, tools: list[FunctionTool]) -> ToolChoice:
    """Every ``tool_choice`` form: none / auto / required, ``{"type": "function",
    "name"}`` (the tool must exist), ``allowed_tools`` and ``custom`` (accepted, not
    enforced: they behave as auto / their mode)."""
    if value is None:
        return ToolChoice("auto")
    if isinstance(value, str):
        if value not in _CHOICE_MODES:
            raise ApiError(
                400,
                f"Invalid tool_choice {value!r}; use one of: {', '.join(_CHOICE_MODES)}, or an object.",
                param="tool_choice",
            )
        return ToolChoice(value, echo=value)
    if not isinstance(value, dict):
        raise ApiError(400, "Invalid type for 'tool_choice': expected a string or an object.", param="tool_choice")
    kind = value.get("type")
    if kind == "function":
        name = value.get("name")
        if name is None and isinstance(value.get("function"), dict):
            name = value["function"].get("name")  # the chat shape
        if not isinstance(name, str):
            raise ApiError(400, "tool_choice of type 'function' needs a 'name'.", param="tool_choice.name")
        tool = next((t for t in tools if t.name == name), None)
        if tool is None:
            raise ApiError(400, f"Tool choice '{name}' not found in 'tools' parameter.", param="tool_choice")
        return ToolChoice("required", tool, value)
    if kind == "allowed_tools":
        mode = value.get("mode", "auto")
        return ToolChoice(mode if mode in ("auto", "required") else "auto", echo=value)
    if kind == "custom":
        return ToolChoice("auto", echo=value)
    raise ApiError(
        400,
        f"Unsupported tool_choice type {kind!r}; use 'function', 'allowed_tools' or 'custom'.",
        param="tool_choice.type",
    )


@attrs.frozen
class OutputFormat:
    type: str  # "text", "json_object" or "json_schema"
    schema: CompiledSchema | None = None
    echo: dict[str, object] = attrs.field(factory=lambda: {"type": "text"})


def output_format(text: TextConfig | None, raw: object) -> OutputFormat:
    """``text.format``; a json_schema's schema is compiled (400 if llmsim cannot honour it)."""
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return OutputFormat("text")
    echo = raw if isinstance(raw, dict) else {"type": fmt.type}
    if fmt.type == "json_object":
        return OutputFormat("json_object", echo=echo)
    if fmt.type == "json_schema":
        if fmt.schema is None:
            raise ApiError(
                400, "Field 'text.format.schema' is required for type 'json_schema'.", param="text.format.schema"
            )
        return OutputFormat("json_schema", compile_parameters(fmt.schema, "text.format.schema"), echo)
    raise ApiError(
        400,
        f"Invalid text.format type {fmt.type!r}; use one of: text, json_object, json_schema.",
        param="text.format.type",
    )
