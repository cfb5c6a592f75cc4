"""POST /tokenize and POST /detokenize (vLLM 0.33's ``ServingTokenization``,
``vllm/entrypoints/serve/tokenize/serving.py``).

A chat body is rendered exactly as a chat completion's prompt is
(:func:`~llmsim.api.chat.request.chat_prompt_ids`: the model's own template when the
tokenizer came with one), so ``count`` equals the chat completion's
``usage.prompt_tokens`` for the same messages.  Nothing is queued or timed: like
vLLM, these answer at once.
"""

from __future__ import annotations

from llmsim.api.chat.request import chat_prompt_ids
from llmsim.api.context import ApiContext, Call
from llmsim.api.errors import ApiError
from llmsim.api.prompts import chat_options
from llmsim.api.router import Router
from llmsim.api.tokenize.request import (
    TokenizeChatRequest,
    parse_detokenize_request,
    parse_tokenize_request,
)

__all__ = ["detokenize", "register", "tokenize"]

#: The ids the ``tokenizers`` library takes (u32); a larger id overflows in its decode.
_U32_LIMIT = 2**32


async def tokenize(call: Call) -> None:
    """``{"count", "max_model_len", "tokens", "token_strs"}`` (serving.py:57-135), the
    token strings only when ``return_token_strs`` asks (else null)."""
    ctx = call.ctx
    request = parse_tokenize_request(call.json())
    ctx.resolve_model(request.model or None)  # vLLM takes "" as the default model (serving.py:86-90)
    if isinstance(request, TokenizeChatRequest):
        ids = _chat_ids(ctx, request)
    else:
        ids = ctx.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens)
    strings = ctx.tokenizer.token_strings(ids) if request.return_token_strs else None
    call.respond_json(
        {"count": len(ids), "max_model_len": ctx.model.max_model_len, "tokens": ids, "token_strs": strings}
    )


def _chat_ids(ctx: ApiContext, request: TokenizeChatRequest) -> list[int]:
    options = chat_options(
        add_generation_prompt=request.add_generation_prompt,
        continue_final_message=request.continue_final_message,
        chat_template=request.chat_template,
        chat_template_kwargs=request.chat_template_kwargs,
    )
    return chat_prompt_ids(
        ctx.tokenizer, request.messages, request.tools, options, add_special_tokens=request.add_special_tokens
    )


async def detokenize(call: Call) -> None:
    """``{"prompt": text}`` (serving.py:137-163).  vLLM decodes with no vocabulary check:
    the ``tokenizers`` library skips an id it does not know, and an id past u32 is an
    ``OverflowError``, which vLLM answers as a 400 (``exception_handling/error_response.py:
    81-85``).  The simulated tokenizer has no holes: every id below its vocabulary size
    decodes (unseen ones to a placeholder)."""
    ctx = call.ctx
    request = parse_detokenize_request(call.json())
    ctx.resolve_model(request.model or None)
    if any(token_id >= _U32_LIMIT for token_id in request.tokens):
        raise ApiError(400, "number too large to fit in target type")
    vocab_size = ctx.tokenizer.vocab_size
    known = [token_id for token_id in request.tokens if token_id < vocab_size]
    call.respond_json({"prompt": ctx.tokenizer.decode(known)})


def register(router: Router) -> None:
    router.add("POST", "/tokenize", tokenize)
    router.add("POST", "/detokenize", detokenize)
