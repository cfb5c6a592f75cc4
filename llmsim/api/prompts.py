"""What a request asks the model to read, as token ids, and what echo replays.

Chat messages become :class:`~llmsim.model.tokenizer.ChatTurn` s for the chat
template: text blocks are joined with newlines (as vLLM does for string content
formats) and every image, audio or video block stands in as a short placeholder, so it
costs a few prompt tokens.  Tool definitions and earlier tool calls are written into
the prompt as a Hermes-style template does, so they cost tokens too.  Completion
prompts come in four forms, one prompt per element of an array; token-id prompts are
used as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from llmsim.api.errors import ApiError
from llmsim.api.requests import ChatMessage, ChatTool, ContentPart, Prompt
from llmsim.api.turns import tool_call_text, tools_turn
from llmsim.model.tokenizer import ChatTurn, Tokenizer

__all__ = [
    "MEDIA_PLACEHOLDERS",
    "CompletionPrompt",
    "assistant_echo",
    "chat_prompt_ids",
    "chat_turns",
    "check_context_length",
    "completion_prompts",
    "last_user_text",
    "tool_definition",
]

#: The text a non-text content block contributes to the prompt.
MEDIA_PLACEHOLDERS = {
    "image_url": "<image>",
    "input_audio": "<audio>",
    "audio_url": "<audio>",
    "video_url": "<video>",
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
        texts = [text for part, text in zip(content, texts) if part.type == "text"]
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


def chat_prompt_ids(
    tokenizer: Tokenizer, messages: Sequence[ChatMessage], tools: Sequence[ChatTool] | None = None
) -> list[int]:
    """The prompt token ids of a chat request (template applied, generation prompt added)."""
    return tokenizer.encode(tokenizer.apply_chat_template(chat_turns(messages, tools)))


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


@attrs.frozen
class CompletionPrompt:
    """One element of a /v1/completions prompt."""

    token_ids: tuple[int, ...]
    text: str  # the prompt as text: what ``echo: true`` prepends
    echo_text: str  # what ``--mode echo`` replays: the text, or "1,2,3" for token ids


def completion_prompts(prompt: Prompt, tokenizer: Tokenizer) -> list[CompletionPrompt]:
    """Every prompt of a /v1/completions request; 400 on the empty forms."""
    if isinstance(prompt, str):
        return [_text_prompt(prompt, tokenizer)]
    if not prompt:
        raise ApiError(400, "prompt array must contain at least one prompt", param="prompt")
    if isinstance(prompt[0], str):
        return [_text_prompt(text, tokenizer) for text in prompt]  # type: ignore[arg-type]
    if isinstance(prompt[0], int):
        return [_token_prompt(prompt, tokenizer)]  # type: ignore[arg-type]
    return [_token_prompt(ids, tokenizer) for ids in prompt]  # type: ignore[arg-type]


def _text_prompt(text: str, tokenizer: Tokenizer) -> CompletionPrompt:
    if not text:
        raise ApiError(400, "prompt must not contain an empty string", param="prompt")
    return CompletionPrompt(tuple(tokenizer.encode(text)), text, text)


def _token_prompt(token_ids: tuple[int, ...], tokenizer: Tokenizer) -> CompletionPrompt:
    if not token_ids:
        raise ApiError(400, "prompt must not contain an empty token-id array", param="prompt")
    negative = next((t for t in token_ids if t < 0), None)
    if negative is not None:
        message = f"Token id {negative} is out of vocabulary; token ids must be non-negative."
        raise ApiError(400, message, param="prompt")
    too_large = next((t for t in token_ids if t >= tokenizer.vocab_size), None)
    if too_large is not None:
        message = f"Token id {too_large} is out of vocabulary; token ids go from 0 to {tokenizer.vocab_size - 1}."
        raise ApiError(400, message, param="prompt")
    return CompletionPrompt(token_ids, tokenizer.decode(token_ids), ",".join(map(str, token_ids)))


def check_context_length(
    max_model_len: int, prompt_tokens: int, max_tokens: int | None, *, max_tokens_param: str = "max_tokens"
) -> None:
    """400 with vLLM's (>= 0.22) message when prompt + output cannot fit the context.

    Without ``max_tokens`` vLLM gives the output whatever is left, so only a prompt
    that leaves no room for a single output token fails.
    """
    requested = 1 if max_tokens is None else max_tokens
    if prompt_tokens + requested <= max_model_len:
        return
    raise ApiError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{requested} output tokens and your prompt contains {prompt_tokens} input tokens, for a total of "
        f"{prompt_tokens + requested} tokens. Please reduce the length of the input prompt or the number of "
        "requested output tokens.",
        param="input_tokens" if max_tokens is None or prompt_tokens >= max_model_len else max_tokens_param,
    )
