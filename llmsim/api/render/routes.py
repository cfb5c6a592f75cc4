"""POST /v1/chat/completions/render, /v1/completions/render, /v1/responses/render and
/v1/messages/render: a request's prompt as token ids, with what generating it would take,
and no generation (vllm/entrypoints/scale_out/render/api_router.py:29-122, serving.py).

Each answers vLLM's ``GenerateRequest`` (a list of them for completions, one per
prompt): post it to ``/inference/v1/generate`` and it generates what the original
endpoint would have.  The prompt comes from the same code the generating endpoint uses
(``request_prompt_ids``, ``completion_prompts``, ``conversation_turns``...), and the same
checks refuse the same requests (model, context window, sampling fields).  Chat,
messages and responses renders report synthetic multimodal ``features``
(:mod:`llmsim.api.render.features`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmsim.api.chat.request import chat_turns, parse_chat_request, request_prompt_ids
from llmsim.api.completions.request import parse_completion_request
from llmsim.api.context import ApiContext, Call
from llmsim.api.errors import JSON_HEADERS, ApiError
from llmsim.api.generation import RequestIdentity
from llmsim.api.messages.request import conversation_turns, function_tools, parse_messages_request
from llmsim.api.plan import output_cap
from llmsim.api.prompts import (
    check_context_length,
    check_output_tokens,
    check_prompt_length,
    completion_prompts,
    prompt_ids,
    tools_turn,
)
from llmsim.api.render.features import MediaItem, mm_features
from llmsim.api.render.gate import require_scale_out
from llmsim.api.render.render import RenderedRequest, dump, parse_extras
from llmsim.api.render.sampling import RenderedSampling
from llmsim.api.render.sources import (
    chat_media,
    chat_parse_context,
    messages_media,
    messages_parse_context,
    responses_media,
)
from llmsim.api.request_fields import (
    SamplingFields,
    StreamOptions,
    check_n_limit,
    check_sampling_fields,
    check_sampling_params,
)
from llmsim.api.responses import request as responses_request
from llmsim.api.router import Router
from llmsim.model.tokenizer import ChatTurn

__all__ = ["register", "render_chat", "render_completions", "render_messages", "render_responses"]


async def render_chat(call: Call) -> None:
    """vllm/entrypoints/scale_out/render/serving.py:116-219 (``render_chat_request``)."""
    ctx = call.ctx
    require_scale_out(ctx)
    body = call.json()
    request = parse_chat_request(body)
    extras = parse_extras(body)
    ctx.resolve_model(request.model)
    items = chat_media(request.messages)
    token_ids = request_prompt_ids(ctx.tokenizer, request)
    max_tokens = request.requested_max_tokens
    check_context_length(ctx.model.max_model_len, len(token_ids), max_tokens, max_tokens_param=request.max_tokens_param)
    cap = output_cap(ctx, len(token_ids), max_tokens)
    check_n_limit(request.choices_per_prompt)  # SamplingParams (scale_out/render/serving.py:178)
    check_sampling_params(request, cap)  # as chat checks it, after the prompt
    sampling = RenderedSampling(
        fields=request,
        n=request.choices_per_prompt,
        max_tokens=cap,
        min_tokens=request.min_tokens or 0,
        ignore_eos=bool(request.ignore_eos),
        logprobs=(request.top_logprobs or 0) if request.logprobs else None,
        include_stop_str_in_output=bool(request.include_stop_str_in_output),
        stream=request.streaming,
        extra_args=extras.extra_args(),
    )
    rendered = RenderedRequest(
        request_id=RequestIdentity.of(call, "chatcmpl-", request.request_id).response_id,
        token_ids=token_ids,
        sampling=sampling,
        model=request.model,
        extras=extras,
        features=_features(ctx, lambda: chat_turns(request.messages, request.tools), items),
        parse_context=chat_parse_context(request),
        stream_options=request.stream_options,
    )
    call.respond(200, dump(rendered.as_dict()), JSON_HEADERS)


async def render_completions(call: Call) -> None:
    """vllm/entrypoints/scale_out/render/serving.py:265-335 (``render_completion_request``):
    one ``GenerateRequest`` per prompt, ``cmpl-<id>``, or ``cmpl-<id>-<i>`` when there
    are several; token-id prompts are passed on as they are."""
    ctx = call.ctx
    require_scale_out(ctx)
    body = call.json()
    request = parse_completion_request(body)
    extras = parse_extras(body)
    ctx.resolve_model(request.model)
    prompts = completion_prompts(request.prompt, ctx.tokenizer)
    max_tokens = request.requested_max_tokens
    for prompt in prompts:
        check_context_length(ctx.model.max_model_len, len(prompt.token_ids), max_tokens, prompt_is_text=prompt.is_text)
    base = RequestIdentity.of(call, "cmpl-", request.request_id).response_id
    rendered = []
    for index, prompt in enumerate(prompts):
        cap = output_cap(ctx, len(prompt.token_ids), max_tokens)
        check_n_limit(request.choices_per_prompt)  # SamplingParams (scale_out/render/serving.py:310)
        check_sampling_params(request, cap)  # as completions checks it, after the prompt
        sampling = RenderedSampling(
            fields=request,
            n=request.choices_per_prompt,
            max_tokens=1 if request.echo_without_generation else cap,  # completion/protocol.py:393,416
            min_tokens=request.min_tokens or 0,
            ignore_eos=bool(request.ignore_eos),
            logprobs=request.logprobs,
            prompt_logprobs=request.logprobs if request.echo else None,  # completion/protocol.py:389-391
            include_stop_str_in_output=bool(request.include_stop_str_in_output),
            stream=request.streaming,
            extra_args=extras.extra_args(),
        )
        one = RenderedRequest(
            request_id=base if len(prompts) == 1 else f"{base}-{index}",
            token_ids=prompt.token_ids,
            sampling=sampling,
            model=request.model,
            extras=extras,
            stream_options=request.stream_options,
        )
        rendered.append(one.as_dict())
    call.respond(200, dump(rendered), JSON_HEADERS)


async def render_responses(call: Call) -> None:
    """vllm/entrypoints/scale_out/render/serving.py:337-390 (``render_responses_request``):
    stateless, so ``previous_response_id`` is refused; the id is the body's
    ``request_id`` (vLLM's default ``resp_<uuid>``)."""
    ctx = call.ctx
    require_scale_out(ctx)
    body = call.json()
    request = responses_request.parse_responses_request(body)
    extras = parse_extras(body)
    ctx.resolve_model(request.model)
    if request.previous_response_id is not None:
        message = "previous_response_id is not supported by the stateless render endpoint."
        raise ApiError(400, message, param="previous_response_id", error_type="invalid_request_error")
    items = responses_media(request.input)
    turns = _responses_turns(request)
    max_model_len = ctx.model.max_model_len
    check_output_tokens(max_model_len, request.max_output_tokens, "max_output_tokens")
    token_ids = prompt_ids(ctx.tokenizer, turns)
    if request.truncation == "auto":  # truncate_prompt_tokens=-1 (responses/protocol.py:525-532)
        token_ids = token_ids[: max_model_len - 1]
    check_prompt_length(max_model_len, len(token_ids))
    cap = output_cap(ctx, len(token_ids), request.max_output_tokens)
    check_sampling_fields(request, max_tokens=cap)
    sampling = RenderedSampling(
        fields=request,
        max_tokens=cap,
        ignore_eos=bool(request.ignore_eos),
        logprobs=request.top_logprobs if request.wants_logprobs else None,
        stream=request.streaming,
        extra_args=extras.extra_args(keep_empty=True),
    )
    rendered = RenderedRequest(
        request_id=request.request_id or RequestIdentity.of(call, "resp_").response_id,
        token_ids=token_ids,
        sampling=sampling,
        model=request.model,
        extras=extras,
        features=_features(ctx, lambda: turns, items),
    )
    call.respond(200, dump(rendered.as_dict()), JSON_HEADERS)


def _responses_turns(request: responses_request.ResponsesRequest) -> list[ChatTurn]:
    """The conversation /v1/responses builds for a request without history
    (api/responses/routes.py ``create_response``): instructions, tools, input."""
    turns: list[ChatTurn] = []
    if request.instructions:
        turns.append(ChatTurn("system", request.instructions))
    tools = responses_request.function_tools(request.tools)
    if tools:
        turns.append(tools_turn([tool.definition for tool in tools]))
    turns.extend(responses_request.input_conversation(request.input).turns)
    return turns


async def render_messages(call: Call) -> None:
    """vllm/entrypoints/scale_out/render/serving.py:240-263 (``render_messages_request``):
    the chat request vLLM converts the Anthropic one to, rendered; the prompt is the one
    /v1/messages reads.  Errors are in vLLM's (OpenAI) envelope, as this route is not
    on the Anthropic router."""
    ctx = call.ctx
    require_scale_out(ctx)
    body = call.json()
    request = parse_messages_request(body)
    extras = parse_extras(body)
    ctx.resolve_model(request.model)
    items = messages_media(request)
    tools = function_tools(request.tools)
    turns = conversation_turns(request, tools)
    token_ids = prompt_ids(ctx.tokenizer, turns)
    # vLLM serves it as chat with max_completion_tokens = max_tokens (anthropic/serving.py:640-655)
    check_context_length(
        ctx.model.max_model_len, len(token_ids), request.max_tokens, max_tokens_param="max_completion_tokens"
    )
    cap = output_cap(ctx, len(token_ids), request.max_tokens)
    fields = SamplingFields(
        temperature=request.temperature, top_p=request.top_p, top_k=request.top_k, stop=request.stop_sequences
    )
    check_sampling_fields(fields, max_tokens=cap)
    sampling = RenderedSampling(
        fields=fields,
        max_tokens=cap,
        ignore_eos=bool(request.ignore_eos),
        stream=request.streaming,
        extra_args=extras.extra_args(),
    )
    rendered = RenderedRequest(
        request_id=RequestIdentity.of(call, "chatcmpl-").response_id,
        token_ids=token_ids,
        sampling=sampling,
        model=request.model,
        extras=extras,
        features=_features(ctx, lambda: turns, items),
        parse_context=messages_parse_context(request),
        # anthropic/serving.py:704-714: a stream asks for usage on every chunk
        stream_options=StreamOptions(include_usage=True, continuous_usage_stats=True),
    )
    call.respond(200, dump(rendered.as_dict()), JSON_HEADERS)


def _features(
    ctx: ApiContext, turns: Callable[[], Sequence[ChatTurn]], items: list[MediaItem]
) -> dict[str, object] | None:
    """The prompt's ``features`` (None, and no template work, without media)."""
    if not items:
        return None
    return mm_features(ctx.tokenizer, ctx.tokenizer.apply_chat_template(turns()), items)


def register(router: Router) -> None:
    router.add("POST", "/v1/chat/completions/render", render_chat)
    router.add("POST", "/v1/completions/render", render_completions)
    router.add("POST", "/v1/responses/render", render_responses)
    router.add("POST", "/v1/messages/render", render_messages)
