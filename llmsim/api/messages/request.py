"""The request body of POST /v1/messages (and /v1/messages/count_tokens).

Structured strictly (wrong types are a 400 naming the field, unknown fields ignored),
then checked for what types cannot say.  Errors on these routes leave in Anthropic's
envelope (the router's ``ErrorStyle.ANTHROPIC``), so the SDK raises the right class.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from llmsim.api.errors import ApiError
from llmsim.api.prompts import MEDIA, tool_call_text, tools_turn
from llmsim.api.structure import FieldTypeError, converter, structure
from llmsim.api.tool_support import FunctionTool, build_tool
from llmsim.model.tokenizer import ChatTurn
from llmsim.model.tools import NamedToolChoice, ToolChoice

__all__ = [
    "AnthropicToolChoice",
    "ContentBlock",
    "Message",
    "MessagesRequest",
    "ToolChoiceParam",
    "ToolParam",
    "conversation_turns",
    "function_tools",
    "last_user_text",
    "parse_messages_request",
    "tool_choice_of",
]

ROLES = ("user", "assistant")
_SKIPPED_BLOCKS = ("thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result", "search_result")
_CHOICE_TYPES = ("auto", "any", "tool", "none")


@attrs.frozen
class ContentBlock:
    type: str
    text: str | None = None
    source: Any = None  # image / document source: {"type": "base64"|"url", ...}
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: BlockContent = None
    is_error: bool | None = None


BlockContent = str | tuple[ContentBlock, ...] | None


@attrs.frozen
class Message:
    role: str
    content: BlockContent = None


@attrs.frozen
class ToolParam:
    name: str | None = None
    description: str | None = None
    input_schema: Any = None
    type: str | None = None


@attrs.frozen
class ToolChoiceParam:
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


@attrs.frozen(kw_only=True)
class MessagesRequest:
    model: str | None = None
    messages: tuple[Message, ...]
    max_tokens: int | None = None  # required on /v1/messages, absent on count_tokens
    system: BlockContent = None
    tools: tuple[ToolParam, ...] | None = None
    tool_choice: ToolChoiceParam | None = None
    stream: bool | None = None
    stop_sequences: tuple[str, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Any = None
    thinking: Any = None
    service_tier: str | None = None
    ignore_eos: bool | None = None

    @property
    def streaming(self) -> bool:
        return bool(self.stream)


def _structure_block_content(value: object, _: type) -> BlockContent:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        return converter.structure(value, tuple[ContentBlock, ...])
    raise FieldTypeError("a string or an array of content blocks", value)


converter.register_structure_hook_func(lambda t: t == BlockContent, _structure_block_content)


def parse_messages_request(body: dict[str, Any], *, need_max_tokens: bool = True) -> MessagesRequest:
    request = structure(body, MessagesRequest)
    if need_max_tokens:
        if request.max_tokens is None:
            raise ApiError(400, "max_tokens: Field required", param="max_tokens")
        if request.max_tokens < 1:
            raise ApiError(400, "max_tokens: must be greater than or equal to 1", param="max_tokens")
    if not request.messages:
        raise ApiError(400, "messages: at least one message is required", param="messages")
    for index, message in enumerate(request.messages):
        if message.role not in ROLES:
            raise ApiError(
                400, f"messages.{index}.role: Input should be 'user' or 'assistant'", param=f"messages.{index}.role"
            )
        if message.content is None:
            raise ApiError(400, f"messages.{index}.content: Field required", param=f"messages.{index}.content")
    return request


# --- the conversation --------------------------------------------------------------------


def conversation_turns(request: MessagesRequest, tools: list[FunctionTool]) -> list[ChatTurn]:
    """System, tool definitions and messages as the chat template sees them; 400 for a
    malformed block.  tool_result blocks become ``tool`` turns, tool_use blocks the
    assistant's tool-call text."""
    turns: list[ChatTurn] = []
    if request.system is not None:
        system = _blocks_text(request.system, "system", [])
        if system:
            turns.append(ChatTurn("system", system))
    if tools:
        turns.append(tools_turn([tool.definition for tool in tools]))
    for index, message in enumerate(request.messages):
        results: list[ChatTurn] = []
        text = _blocks_text(message.content, f"messages.{index}.content", results)  # type: ignore[arg-type]
        turns.extend(results)
        if text or not results:
            turns.append(ChatTurn(message.role, text))
    return turns


def last_user_text(request: MessagesRequest) -> str:
    """The text blocks of the last user message: what ``--mode echo`` replays."""
    for message in reversed(request.messages):
        if message.role == "user":
            content = message.content
            if isinstance(content, str):
                return content
            return "\n".join(b.text for b in content or () if b.type == "text" and b.text is not None)
    return ""


def _blocks_text(content: str | tuple[ContentBlock, ...], where: str, results: list[ChatTurn]) -> str:
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for index, block in enumerate(content):
        at = f"{where}.{index}"
        kind = block.type
        if kind == "text":
            if block.text is None:
                raise ApiError(400, f"{at}.text: Field required", param=f"{at}.text")
            texts.append(block.text)
        elif kind in ("image", "document"):
            _check_source(block.source, at)
            texts.append(MEDIA["image" if kind == "image" else "file"])
        elif kind == "tool_use":
            for field in ("id", "name"):
                if getattr(block, field) is None:
                    raise ApiError(400, f"{at}.{field}: Field required", param=f"{at}.{field}")
            if not isinstance(block.input, dict):
                raise ApiError(400, f"{at}.input: Input should be a valid dictionary", param=f"{at}.input")
            texts.append(tool_call_text(block.name or "", json.dumps(block.input, ensure_ascii=False)))
        elif kind == "tool_result":
            if block.tool_use_id is None:
                raise ApiError(400, f"{at}.tool_use_id: Field required", param=f"{at}.tool_use_id")
            inner = block.content if block.content is not None else ""
            results.append(ChatTurn("tool", _blocks_text(inner, f"{at}.content", [])))
        elif kind not in _SKIPPED_BLOCKS:
            known = "text, image, document, tool_use, tool_result"
            raise ApiError(
                400, f"{at}.type: Unknown content block type {kind!r}; use one of: {known}", param=f"{at}.type"
            )
    return "\n".join(texts)


def _check_source(source: object, at: str) -> None:
    if not isinstance(source, dict):
        raise ApiError(400, f"{at}.source: Field required (an object)", param=f"{at}.source")
    kind = source.get("type")
    fields = {"base64": "data", "url": "url", "text": "data", "file": "file_id", "content": "content"}
    needed = fields.get(kind) if isinstance(kind, str) else None  # a list or object as the type is a 400
    if needed is None:
        raise ApiError(400, f"{at}.source.type: Input should be 'base64' or 'url'", param=f"{at}.source.type")
    if source.get(needed) is None:
        raise ApiError(400, f"{at}.source.{needed}: Field required", param=f"{at}.source.{needed}")


# --- tools -------------------------------------------------------------------------------------


def function_tools(tools: tuple[ToolParam, ...] | None) -> list[FunctionTool]:
    """Client tools (``input_schema``), schemas compiled; server tools (typed
    ``web_search_…``, ``bash_…``...) are accepted but never called."""
    result = []
    for index, tool in enumerate(tools or ()):
        if tool.type not in (None, "custom"):
            continue
        where = f"tools.{index}"
        if not tool.name:
            raise ApiError(400, f"{where}.name: Field required", param=f"{where}.name")
        if tool.input_schema is None:
            raise ApiError(400, f"{where}.input_schema: Field required", param=f"{where}.input_schema")
        definition = {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
        result.append(build_tool(tool.name, tool.input_schema, path=f"{where}.input_schema", definition=definition))
    return result


@attrs.frozen
class AnthropicToolChoice:
    choice: ToolChoice  # the engine's: "none", "auto", "required" or a named function
    single: bool = False  # disable_parallel_tool_use: at most one call


def tool_choice_of(choice: ToolChoiceParam | None, tools: list[FunctionTool]) -> AnthropicToolChoice:
    """``auto`` (the default), ``any`` (at least one call), ``tool`` (exactly that one,
    which must be among the tools), ``none``."""
    if choice is None:
        return AnthropicToolChoice("auto")
    single = bool(choice.disable_parallel_tool_use)
    if choice.type not in _CHOICE_TYPES:
        raise ApiError(
            400,
            f"tool_choice.type: Input should be one of {', '.join(map(repr, _CHOICE_TYPES))}",
            param="tool_choice.type",
        )
    if choice.type == "none":
        return AnthropicToolChoice("none")
    if choice.type == "auto":
        return AnthropicToolChoice("auto", single)
    if choice.type == "any":
        return AnthropicToolChoice("required", single)
    if choice.name is None:
        raise ApiError(400, "tool_choice.name: Field required", param="tool_choice.name")
    if not any(t.name == choice.name for t in tools):
        raise ApiError(400, f"tool_choice.name: Tool '{choice.name}' not found in tools", param="tool_choice.name")
    return AnthropicToolChoice(NamedToolChoice(choice.name), True)
