"""What each family's request contributes to a render besides its prompt: its media
items, in prompt order (for ``features``), and the ``parse_context`` of a chat render.

Media are read in the order their stand-ins appear in the prompt, and inline data is
checked (:func:`~llmsim.api.render.features.check_media_data`) with the field it came
from named.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmsim.api.chat.request import ChatCompletionRequest, ChatMessage, ContentPart, tool_definition
from llmsim.api.messages.request import MessagesRequest
from llmsim.api.render.features import MediaItem, check_media_data
from llmsim.api.responses.request import ResponsesInput
from llmsim.model.tools import NamedToolChoice

__all__ = ["chat_media", "chat_parse_context", "messages_media", "messages_parse_context", "responses_media"]

#: vLLM's chat template kwargs for a request that sets none: ``build_chat_params``
#: (vllm/entrypoints/openai/chat_completion/protocol.py:643-682), its None values dropped
#: by ``merge_kwargs`` (vllm/renderers/params.py:38-50).
_TEMPLATE_KWARGS = {"add_generation_prompt": True, "continue_final_message": False}


def chat_media(messages: Sequence[ChatMessage]) -> list[MediaItem]:
    """The image, audio and video blocks of a chat request, in order; 400 for bad base64."""
    items = []
    for i, message in enumerate(messages):
        if not isinstance(message.content, tuple):
            continue
        for j, part in enumerate(message.content):
            item = _chat_item(part, f"messages[{i}].content[{j}]")
            if item is not None:
                check_media_data(item, raw_base64=part.type == "input_audio")
                items.append(item)
    return items


def _chat_item(part: ContentPart, where: str) -> MediaItem | None:
    if part.type == "input_audio" and part.input_audio is not None:
        return MediaItem("audio", part.input_audio.data, f"{where}.input_audio.data")
    modality = {"image_url": "image", "audio_url": "audio", "video_url": "video"}.get(part.type)
    url = getattr(part, part.type, None) if modality is not None else None
    if modality is None or url is None:
        return None
    return MediaItem(modality, url.url, f"{where}.{part.type}.url")


def chat_parse_context(request: ChatCompletionRequest) -> dict[str, object]:
    """vLLM's ``ParseContext`` of a chat render (vllm/entrypoints/scale_out/render/
    serving.py:221-238; protocol.py:52-72), dumped: the tools and tool choice the
    output is parsed with, and how many tool calls the conversation already holds."""
    tools = [tool_definition(tool) for tool in request.tools] if request.tools else None
    history = sum(len(message.tool_calls or ()) for message in request.messages if message.role == "assistant")
    parallel = request.parallel_tool_calls is not False
    return _parse_context(tools, _tool_choice(request.effective_tool_choice), parallel, history)


def messages_parse_context(request: MessagesRequest) -> dict[str, object]:
    """The ``ParseContext`` of the chat request vLLM converts a /v1/messages request to
    (vllm/entrypoints/anthropic/serving.py:625-760): tools as functions, ``tool_choice``
    mapped (any: required, tool: named) and left null when not given."""
    tools = None
    if request.tools:
        tools = [
            {
                "type": "function",
                "function": {"name": tool.name, "description": tool.description, "parameters": tool.input_schema},
            }
            for tool in request.tools
            if tool.type in (None, "custom")
        ]
    choice: object = None
    if request.tool_choice is not None:
        kind = request.tool_choice.type
        choice = (
            {"function": {"name": request.tool_choice.name}, "type": "function"}
            if kind == "tool"
            else {"any": "required"}.get(kind, kind)
        )
    history = sum(
        1
        for message in request.messages
        if message.role == "assistant" and isinstance(message.content, tuple)
        for block in message.content
        if block.type == "tool_use"
    )
    return _parse_context(tools, choice, True, history)


def _parse_context(tools: object, choice: object, parallel: bool, history: int) -> dict[str, object]:
    return {
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
        "include_reasoning": True,
        "chat_template_kwargs": dict(_TEMPLATE_KWARGS),
        "history_tool_call_cnt": history,
    }


def _tool_choice(choice: object) -> object:
    """A tool choice as vLLM dumps it (``ChatCompletionNamedToolChoiceParam``: function, then type)."""
    if isinstance(choice, NamedToolChoice):
        return {"function": {"name": choice.name}, "type": "function"}
    return choice


def messages_media(request: MessagesRequest) -> list[MediaItem]:
    """The image blocks of a /v1/messages request, as the data URLs or URLs vLLM's
    conversion makes of them (``data:<media_type>;base64,<data>``)."""
    items = []
    for i, message in enumerate(request.messages):
        if not isinstance(message.content, tuple):
            continue
        for j, block in enumerate(message.content):
            source = block.source
            if block.type != "image" or not isinstance(source, dict):
                continue
            where = f"messages.{i}.content.{j}.source"
            if source.get("type") == "base64":
                item = MediaItem("image", f"data:{source.get('media_type')};base64,{source.get('data')}", where)
            else:
                item = MediaItem("image", str(source.get("url")), where)
            check_media_data(item)
            items.append(item)
    return items


def responses_media(value: ResponsesInput | None) -> list[MediaItem]:
    """The ``input_image`` and ``input_audio`` parts of a /v1/responses input, in order."""
    if value is None or isinstance(value, str):
        return []
    items = []
    for i, entry in enumerate(value):
        if not isinstance(entry.content, tuple):
            continue
        for j, part in enumerate(entry.content):
            where = f"input[{i}].content[{j}]"
            if part.type == "input_image":
                source = part.image_url.url if part.image_url is not None else str(part.file_id)
                item = MediaItem("image", source, f"{where}.image_url")
                check_media_data(item)
            elif part.type == "input_audio":
                data = part.data if part.data is not None else part.input_audio.data if part.input_audio else ""
                item = MediaItem("audio", data, f"{where}.data")
                check_media_data(item, raw_base64=True)
            else:
                continue
            items.append(item)
    return items
