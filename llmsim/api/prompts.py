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

from llmsim.api.errors import ApiError, validation_error
from llmsim.api.request_fields import Prompt
from llmsim.model.tokenizer import ChatTurn, Tokenizer

__all__ = [
    "MEDIA",
    "CompletionPrompt",
    "check_context_length",
    "check_output_tokens",
    "check_prompt_length",
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
    is_text: bool = True  # given as text (tokenized here), not as token ids


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
    # vLLM's renderer checks the smallest id, then the largest, and names no parameter
    # (vllm/renderers/base.py:453-490, called from vllm/v1/engine/input_processor.py:647)
    lowest, highest = min(token_ids), max(token_ids)
    if lowest < 0:
        raise validation_error(f"Token id {lowest} is out of vocabulary")
    if highest >= tokenizer.vocab_size:
        raise validation_error(f"Token id {highest} is out of vocabulary")
    return CompletionPrompt(token_ids, tokenizer.decode(token_ids), ",".join(map(str, token_ids)), is_text=False)


def check_context_length(
    max_model_len: int,
    prompt_tokens: int,
    max_tokens: int | None,
    *,
    max_tokens_param: str = "max_tokens",
    prompt_is_text: bool = True,
) -> None:
    """vLLM 0.33's context-window rules for chat, completions and messages: 400 only
    when the output cap alone (:func:`check_output_tokens`) or the prompt alone
    (:func:`check_prompt_length`) exceeds ``max_model_len``, or when the prompt fills it
    exactly.  Otherwise the request is served and its cap is clamped to the room the
    prompt leaves (``get_max_tokens``, ``vllm/entrypoints/serve/utils/api_utils.py:234-270``;
    :func:`llmsim.api.plan.output_cap`), ending with ``length`` when it is reached.

    A prompt that fills the window leaves a cap of 0, which ``SamplingParams`` refuses
    with ``max_tokens`` as the param whatever field the cap came from
    (``vllm/sampling_params.py:691-696``); ``max_tokens=0`` asks for no output at all
    (completions' ``echo`` without generation), so nothing is refused then.
    """
    check_output_tokens(max_model_len, max_tokens, max_tokens_param)
    check_prompt_length(max_model_len, prompt_tokens, prompt_is_text=prompt_is_text)
    if prompt_tokens == max_model_len and max_tokens != 0:
        raise validation_error("max_tokens must be at least 1, got 0.", parameter="max_tokens", value=0)


def check_output_tokens(max_model_len: int, max_tokens: int | None, param: str) -> None:
    """400 when the requested output cap alone exceeds the context window
    (``TokenizeParams.__post_init__``, ``vllm/renderers/params.py:270-283``; ``param`` is
    the field it came from: ``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``)."""
    if max_tokens is not None and max_tokens > max_model_len:
        raise validation_error(
            f"{param}={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            parameter=param,
            value=max_tokens,
        )


def check_prompt_length(max_model_len: int, prompt_tokens: int, *, prompt_is_text: bool = True) -> None:
    """400 when the prompt alone exceeds the context window (``_token_len_check``,
    ``vllm/renderers/params.py:531-551``).  vLLM tokenizes text with truncation at
    ``max_model_len + 1`` tokens, so a long text prompt reports "at least" that many;
    a token-id prompt reports its length."""
    if prompt_tokens <= max_model_len:
        return
    count = min(prompt_tokens, max_model_len + 1) if prompt_is_text else prompt_tokens
    qualifier = "at least " if count == max_model_len + 1 else ""
    raise validation_error(
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
        f"{qualifier}{count} input tokens, which exceeds this limit even without any output tokens. "
        "Please reduce the length of the input prompt.",
        parameter="input_tokens",
        value=count,
    )
