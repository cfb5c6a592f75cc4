"""POST /v1/chat/completions (with llm-d-inference-sim's P/D and cache-hit thresholds,
:mod:`llmsim.api.transfer`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from llmsim.api.chat.render import ChatStreamRenderer, chat_completion_body
from llmsim.api.chat.request import (
    ChatCompletionRequest,
    assistant_echo,
    chat_turns,
    last_user_text,
    parse_chat_request,
    request_prompt_ids,
)
from llmsim.api.chat.tools import plan_choices, tool_specs
from llmsim.api.context import ApiContext, Call
from llmsim.api.errors import JSON_HEADERS
from llmsim.api.failures import check_injected_failure
from llmsim.api.generation import RequestIdentity, check_job_count, check_output_volume, collect, stream
from llmsim.api.logprobs_format import ChatLogprobs, choice_seed
from llmsim.api.logprobs_limit import checked_logprobs
from llmsim.api.media import media_readers
from llmsim.api.plan import GenerationPlan, PromptPlan, StructuredOutput, output_cap, plan_text_choices
from llmsim.api.prompts import check_context_length
from llmsim.api.request_fields import check_sampling_params, token_id_refusal
from llmsim.api.router import Router
from llmsim.api.stops import stop_rule
from llmsim.api.structured import structured_output
from llmsim.api.transfer import (
    KvTransfer,
    chat_ec_transfer_params,
    check_cache_hit_threshold,
    forced_cache_threshold,
    job_threshold,
)
from llmsim.api.turns import TurnPlan
from llmsim.api.usage import ChunkUsage, usage_style
from llmsim.engine.kv_hashing import MultimodalItem
from llmsim.model.tools import NamedToolChoice, ToolSpec

__all__ = ["chat_completions", "register"]


@attrs.define(eq=False)
class _ChatBody:
    """A chat body as parsed (:meth:`~llmsim.api.context.Call.parsed` remembers it per
    distinct body), and what the handler derives from it alone, kept here the first time
    a request of that body gets that far (later ones skip it; errors keep their order)."""

    fields: dict[str, Any]
    request: ChatCompletionRequest
    prompt_ids: tuple[int, ...] | None = None  # kept without a model template (see the route)
    cap: int | None = None  # the output cap, once the body passed the checks that give it (likewise)
    echo_text: str | None = None


def _chat_body(fields: dict[str, Any]) -> _ChatBody:
    return _ChatBody(fields, parse_chat_request(fields))


async def chat_completions(call: Call) -> None:
    ctx = call.ctx
    parsed = call.parsed(_chat_body)
    fields, request = parsed.fields, parsed.request
    check_cache_hit_threshold(fields, request.cache_hit_threshold)
    check_injected_failure(call)  # X-Return-Error, --failure-injection-rate
    tools = tool_specs(request.tools)
    structured = structured_output(
        request.response_format,
        request.structured_outputs,
        named_tool_choice=isinstance(request.tool_choice, NamedToolChoice),
    )
    model = ctx.resolve_model(request.model)
    transfer = KvTransfer.of(request.kv_transfer_params)
    transfer.check_streaming(request.streaming)
    check_job_count(ctx, request.choices_per_prompt)
    # Kept for the body's later requests only without a model template, which may read the
    # clock (strftime_now): the built-in rendering is a function of the body alone.
    keep = ctx.tokenizer.chat_template is None
    prompt_ids = parsed.prompt_ids
    if prompt_ids is None:
        prompt_ids = tuple(request_prompt_ids(ctx.tokenizer, request))
        if keep:
            parsed.prompt_ids = prompt_ids
    media_of = media_readers()
    # read once, with the render's checks (bad base64 is a 400, as when vLLM loads it)
    media_items = media_of.chat_media(request.messages)
    media: tuple[MultimodalItem, ...] = ()  # turns built only for media (request_prompt_ids made their 400s)
    if media_items:
        media = media_of.kv_multimodal(ctx.tokenizer, chat_turns(request.messages, request.tools), media_items)
    max_tokens = request.requested_max_tokens
    cap = parsed.cap
    if cap is None:  # the body against the server's (fixed) model options: once per body
        check_context_length(
            ctx.model.max_model_len, len(prompt_ids), max_tokens, max_tokens_param=request.max_tokens_param
        )
        cap = output_cap(ctx, len(prompt_ids), max_tokens)
        check_sampling_params(request, cap)  # SamplingParams, after the prompt (chat_completion/serving.py:350-380)
        top_logprobs = (request.top_logprobs or 0) if request.logprobs else 0
        check_output_volume(ctx, (cap,), request.choices_per_prompt, top_logprobs)
        if keep:  # the cap depends on the prompt's length
            parsed.cap = cap
    identity = RequestIdentity.of(call, "chatcmpl-", request.request_id)
    echo_text = parsed.echo_text
    if echo_text is None:
        echo_text = parsed.echo_text = last_user_text(request.messages)
    calling = bool(tools) and request.effective_tool_choice != "none"
    turns = _plan_turns(ctx, request, tools if calling else [], identity.request_id, prompt_ids, echo_text, structured)
    turns = transfer.finish(turns)
    threshold = job_threshold(ctx, request.cache_hit_threshold, forced=forced_cache_threshold(call), transfer=transfer)
    plan = GenerationPlan(
        identity.request_id,
        (
            PromptPlan(
                prompt_ids,
                cap,
                remote_prefill=transfer.remote_prefill,
                cache_hit_threshold=threshold,
                kv_multimodal=media,
            ),
        ),
        turns,
        request.choices_per_prompt,
    )
    tool_calls = [turn.tool_calls for turn in turns] if calling else None
    stop_reasons = [turn.stop_reason for turn in turns]
    logprobs = refusal = None
    if request.logprobs:
        top_logprobs, refusal = checked_logprobs(ctx, request.top_logprobs or 0)
        seeds = [choice_seed(ctx.model.seed, identity.request_id, i) for i in range(len(turns))]
        logprobs = ChatLogprobs(top_logprobs, seeds, ctx.text.eos, [turn.token_texts for turn in turns])
    refusal = refusal or token_id_refusal(request, ctx.tokenizer.vocab_size)
    created = int(ctx.wall_clock())
    echo = assistant_echo(request.messages) if request.echo else None
    # prompt details, created cache tokens (chat), block size: the server's, so made once
    usage = usage_style(ctx.model.enable_prompt_tokens_details, True, ctx.engine.options.block_size)
    if request.streaming:
        renderer = ChatStreamRenderer(
            response_id=identity.response_id,
            created=created,
            model=model,
            choices=len(turns),
            include_usage=request.include_usage,
            echo=echo,
            tool_calls=tool_calls,
            required_tool_choice=calling and request.effective_tool_choice == "required",
            logprobs=logprobs,
            chunk_usage=ChunkUsage(len(prompt_ids), with_details=True) if request.continuous_usage else None,
            fingerprint=ctx.system_fingerprint,
            usage_style=usage,
            stop_reasons=stop_reasons,
        )
        # Not held while the stream runs (memory per stream): the request, a dict class
        # of more fields than CPython shares keys for, takes ~1.6 KB.
        del fields, request, parsed
        await stream(call, plan, renderer, identity.headers, refusal=refusal)
        return
    ec_params = chat_ec_transfer_params(ctx, media_items)
    jobs = await collect(call, plan, refusal=refusal)
    body = chat_completion_body(
        response_id=identity.response_id,
        created=created,
        model=model,
        jobs=jobs,
        echo=echo,
        tool_calls=tool_calls,
        logprobs=logprobs,
        fingerprint=ctx.system_fingerprint,
        usage_style=usage,
        forced_tool_calls=calling and request.effective_tool_choice != "auto",
        stop_reasons=stop_reasons,
        kv_transfer_params=transfer.response_params(),
        ec_transfer_params=ec_params,
    )
    call.respond(200, body, (*JSON_HEADERS, *identity.headers))


def _plan_turns(
    ctx: ApiContext,
    request: ChatCompletionRequest,
    tools: list[ToolSpec],
    request_id: str,
    prompt_ids: Sequence[int],
    echo_text: str,
    structured: StructuredOutput | None,
) -> list[TurnPlan]:
    """What each choice says: tool calls or text when ``tools`` may be called, else
    text; text under ``structured`` satisfies it."""
    max_tokens = request.requested_max_tokens
    ignore_eos = bool(request.ignore_eos)
    min_tokens = request.min_tokens or 0
    if not tools:
        return plan_text_choices(
            ctx,
            request_id,
            ((len(prompt_ids), echo_text),),
            choices_per_prompt=request.choices_per_prompt,
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            min_tokens=min_tokens,
            structured=structured,
            stop=stop_rule(request),
            prompt_ids=(prompt_ids,),
        )
    return plan_choices(
        ctx,
        tools,
        request.effective_tool_choice,
        request_id=request_id,
        choices=request.choices_per_prompt,
        parallel_tool_calls=request.parallel_tool_calls is not False,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        echo_text=echo_text,
        min_tokens=min_tokens,
        structured=structured,
        stop=stop_rule(request),
    )


def register(router: Router) -> None:
    router.add("POST", "/v1/chat/completions", chat_completions)
