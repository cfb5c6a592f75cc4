"""What a request asks the model to read, as token ids: the pieces every family shares.

A conversation is a list of :class:`~llmsim.model.tokenizer.ChatTurn` s for the chat
template (each family builds its own from its request: ``chat/request.py``,
``responses/request.py``, ``messages/request.py``).  Non-text input stands in as a
short placeholder (:data:`MEDIA`), so it costs a few prompt tokens; tool definitions
and earlier tool calls are written into the prompt as a Hermes-style template does, so
they cost tokens too.  Completion prompts come in four forms, one prompt per element
of an array; token-id prompts are used as they are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs

from llmsim.api.errors import ApiError
from llmsim.api.request_fields import Prompt
from llmsim.model.tokenizer import ChatTurn, Tokenizer

__all__ = [
    "MEDIA",
    "CompletionPrompt",
    "check_context_length",
    "completion_prompts",
    "prompt_ids",
    "tool_call_text",
    "tools_turn",
]

#: What a non-text input block of each kind contributes to the prompt.
MEDIA = {"image": "<image>", "audio": "<audio>", "video": "<video>", "file": "<file>"}


def prompt_ids(tokenizer: Tokenizer, turns: Sequence[ChatTurn]) -> list[int]:
    """Token ids of a conversation: chat template applied, generation prompt added."""
    return tokenizer.encode(tokenizer.apply_chat_template(turns))


def tools_turn(definitions: Sequence[dict[str, object]]) -> ChatTurn:
    """The tool definitions as a system turn: real chat templates put them in the
    prompt, so they cost input tokens."""
    listing = "\n".join(json.dumps(definition, ensure_ascii=False) for definition in definitions)
    return ChatTurn("system", f"# Tools\n<tools>\n{listing}\n</tools>")


def tool_call_text(name: str, arguments: str) -> str:
    """An earlier tool call, as a Hermes-style template writes it into the prompt."""
    return f'<tool_call>\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {arguments}}}\n</tool_call>'


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
    if isinstance(prompt[0], str):  # mypy narrows the tuple forms by their first element
        return [_text_prompt(text, tokenizer) for text in prompt]
    if isinstance(prompt[0], int):
        return [_token_prompt(prompt, tokenizer)]
    return [_token_prompt(ids, tokenizer) for ids in prompt]


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
