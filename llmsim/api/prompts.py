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
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from llmsim.api.errors import ApiError, validation_error
from llmsim.api.request_fields import Prompt
from llmsim.model.chat_template import ChatTemplate, ChatTemplateError
from llmsim.model.tokenizer import ChatTurn, Tokenizer

__all__ = [
    "DEFAULT_CHAT_OPTIONS",
    "MEDIA",
    "ChatOptions",
    "CompletionPrompt",
    "chat_options",
    "check_context_length",
    "check_generation_prompt",
    "check_output_tokens",
    "check_prompt_length",
    "completion_prompts",
    "prompt_ids",
    "template_prompt_ids",
    "tool_call_text",
    "tools_turn",
]

#: What a non-text input block of each kind contributes to the prompt.
MEDIA = {"image": "<image>", "audio": "<audio>", "video": "<video>", "file": "<file>"}


@attrs.frozen
class ChatOptions:
    """The chat-template fields of a request (vLLM's ``add_generation_prompt``,
    ``continue_final_message``, ``chat_template_kwargs``; the request's own fields win
    over the kwargs, ``vllm/entrypoints/serve/tokenize/protocol.py:131-148``)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: Mapping[str, Any] = attrs.field(factory=dict)


DEFAULT_CHAT_OPTIONS = ChatOptions()


def check_generation_prompt(body: Mapping[str, Any]) -> None:
    """The chat bodies' ``model_validator(mode="before")``: both flags truthy, as sent, is
    a ``VLLMValidationError`` raised before any field is read (it is no ``ValueError``, so
    it escapes pydantic; ``vllm/entrypoints/openai/chat_completion/protocol.py:1059-1068``,
    ``vllm/entrypoints/serve/tokenize/protocol.py:118-129``)."""
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise validation_error("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")


def chat_options(
    *,
    add_generation_prompt: bool,
    continue_final_message: bool,
    chat_template: str | None,
    chat_template_kwargs: Mapping[str, Any] | None,
) -> ChatOptions:
    """A request's chat-template fields as :class:`ChatOptions`.  A template sent with the
    request is refused as vLLM refuses it without ``--trust-request-chat-template``
    (``validate_chat_template``, ``vllm/renderers/online_renderer.py:692-711``); the
    request's own flags win over ``chat_template_kwargs`` (``merge_kwargs``)."""
    if chat_template is None and not chat_template_kwargs and add_generation_prompt and not continue_final_message:
        return DEFAULT_CHAT_OPTIONS  # the usual request: nothing to build
    kwargs = chat_template_kwargs or {}
    if chat_template is not None or kwargs.get("chat_template") is not None:
        raise ApiError(
            400,
            "Chat template is passed with request, but --trust-request-chat-template is not set. "
            "Refused request with untrusted chat template.",
        )
    variables = {k: v for k, v in kwargs.items() if k not in ("add_generation_prompt", "continue_final_message")}
    return ChatOptions(add_generation_prompt, continue_final_message, variables)


def prompt_ids(
    tokenizer: Tokenizer,
    turns: Sequence[ChatTurn],
    options: ChatOptions = DEFAULT_CHAT_OPTIONS,
    *,
    add_special_tokens: bool = False,
) -> list[int]:
    """Token ids of a conversation: chat template applied, generation prompt added
    (unless ``options`` say otherwise); 400 if the model's template refuses it."""
    _check_options(options)
    try:
        text = tokenizer.apply_chat_template(
            turns,
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
        )
    except ChatTemplateError as exc:
        raise _template_refusal(exc) from None
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def template_prompt_ids(
    tokenizer: Tokenizer,
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    options: ChatOptions = DEFAULT_CHAT_OPTIONS,
    *,
    add_special_tokens: bool = False,
) -> list[int]:
    """Token ids of a conversation in vLLM's message form (``vllm/renderers/chat_utils/
    chat_message.py:610-771``) rendered with the model's own template
    (``safe_apply_chat_template``, ``vllm/renderers/hf.py:868-930``): ``developer``
    messages become ``system`` ones for a template that does not know the role, and a
    template's refusal is a 400 with its reason."""
    _check_options(options)
    if not template.supports_developer_role and any(message["role"] == "developer" for message in messages):
        messages = _developer_as_system(messages)
    try:
        text = template.render(
            messages,
            tools=tools,
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            variables=options.template_kwargs,
        )
    except ChatTemplateError as exc:
        raise _template_refusal(exc) from None
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _check_options(options: ChatOptions) -> None:
    """transformers refuses to continue the final message and open a new one at once
    (``apply_chat_template``); vLLM passes its reason on as a 400 (``vllm/renderers/hf.py:916-926``).
    ``add_generation_prompt`` defaults to true, so ``continue_final_message`` alone is refused."""
    if options.continue_final_message and options.add_generation_prompt:
        raise validation_error(
            "continue_final_message and add_generation_prompt are not compatible. Use continue_final_message "
            "when you want the model to continue the final message, and add_generation_prompt when you want to "
            "add a header that will prompt it to start a new assistant message instead."
        )


def _template_refusal(exc: ChatTemplateError) -> ApiError:
    """vLLM's ``VLLMValidationError`` with the template's reason, no parameter
    (``vllm/renderers/hf.py:916-926``)."""
    return validation_error(str(exc))


def _developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``_convert_developer_to_system`` then ``_consolidate_system_messages``
    (``vllm/renderers/hf.py:604-672``): every system text merged into one first message."""
    converted = [
        {key: value for key, value in message.items() if key != "tools"} | {"role": "system"}
        if message["role"] == "developer"
        else message
        for message in messages
    ]
    systems = [i for i, message in enumerate(converted) if message["role"] == "system"]
    if not systems or systems == [0]:
        return converted
    texts = [_system_text(converted[i].get("content")) for i in systems]
    merged = {"role": "system", "content": "\n\n".join(text for text in texts if text)}
    return [merged, *(message for message in converted if message["role"] != "system")]


def _system_text(content: object) -> str:
    if isinstance(content, list):
        return "\n".join(part["text"] if isinstance(part, dict) else str(part) for part in content if _has_text(part))
    return str(content or "")


def _has_text(part: object) -> bool:
    return isinstance(part, str) or (isinstance(part, dict) and "text" in part)


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


def completion_prompts(
    prompt: Prompt, tokenizer: Tokenizer, *, add_special_tokens: bool = True
) -> list[CompletionPrompt]:
    """Every prompt of a /v1/completions request; 400 on the empty forms.  Text is
    tokenized with the tokenizer's special tokens (a BOS), as vLLM's ``add_special_tokens``
    defaults to (``vllm/entrypoints/openai/completion/protocol.py:118-124``)."""
    if isinstance(prompt, str):
        return [_text_prompt(prompt, tokenizer, add_special_tokens)]
    if not prompt:
        raise ApiError(400, "prompt array must contain at least one prompt", param="prompt")
    if isinstance(prompt[0], str):  # mypy narrows the tuple forms by their first element
        return [_text_prompt(text, tokenizer, add_special_tokens) for text in prompt]
    if isinstance(prompt[0], int):
        return [_token_prompt(prompt, tokenizer)]
    return [_token_prompt(ids, tokenizer) for ids in prompt]


def _text_prompt(text: str, tokenizer: Tokenizer, add_special_tokens: bool) -> CompletionPrompt:
    if not text:
        raise ApiError(400, "prompt must not contain an empty string", param="prompt")
    return CompletionPrompt(tuple(tokenizer.encode(text, add_special_tokens=add_special_tokens)), text, text)


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
