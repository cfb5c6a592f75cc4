"""POST /v1/chat/completions (with llm-d-inference-sim's P/D and cache-hit thresholds,
:mod:`llmsim.api.transfer`)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

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
from llmsim.api.failures import check_injected_failure
from llmsim.api.generation import (
    RequestIdentity,
    check_job_count,
    check_output_volume,
    respond_collected,
    stream,
    submit_collected,
)
from llmsim.api.logprobs_format import ChatLogprobs, choice_seed
from llmsim.api.logprobs_limit import checked_logprobs
from llmsim.api.media import media_readers
from llmsim.api.plan import GenerationPlan, GenerationShape, PromptPlan, StructuredOutput, output_cap, plan_text_choices
from llmsim.api.prompts import check_context_length
from llmsim.api.request_fields import check_sampling_params, token_id_refusal
from llmsim.api.router import Router
from llmsim.api.stops import stop_reasons
from llmsim.api.structured import structured_output
from llmsim.api.transfer import (
    KvTransfer,
    chat_ec_transfer_params,
    check_cache_hit_threshold,
    forced_cache_threshold,
    job_threshold,
)
from llmsim.api.turns import TurnPlan
from llmsim.api.usage import ChunkUsage, UsageStyle, usage_style
from llmsim.engine.kv_hashing import MultimodalItem
from llmsim.model.tools import NamedToolChoice, ToolChoice, ToolSpec

if TYPE_CHECKING:  # the render family imports this package (llmsim/api/media.py)
    from llmsim.api.render.features import MediaItem

__all__ = ["chat_completions", "register"]


@attrs.define(eq=False)
class _ChatBody:
    """A chat body as parsed (:meth:`~llmsim.api.context.Call.parsed` remembers it per
    distinct body), and what the handler derives from it alone, kept here the first time
    a request of that body gets that far (later ones skip it; errors keep their order)."""

    request: ChatCompletionRequest
    shape: _ChatShape | None = None  # its tools and structured output, compiled
    prompt_ids: tuple[int, ...] | None = None  # kept without a model template (see the route)
    media_items: tuple[MediaItem, ...] | None = None  # its image, audio and video blocks, checked
    cap: int | None = None  # the output cap, once the body passed the checks that give it (likewise)
    echo_text: str | None = None
    prompt: PromptPlan | None = None  # its prompt's plan without media (likewise; for one gate)


def _chat_body(fields: dict[str, Any]) -> _ChatBody:
    request = parse_chat_request(fields)
    check_cache_hit_threshold(fields, request.cache_hit_threshold)  # a body check, the first after parsing
    return _ChatBody(request)


@attrs.frozen
class _ChatShape:
    """What a chat handler reads of its body beyond the prompt, derived once per body
    (the body is frozen and these are functions of it alone): its compiled tools and
    structured output (whose 400s come in their place, before the model is resolved),
    and the request fields the handler reads, read once rather than through a property
    per request.  Also what follows from the server's fixed options for every request
    (the body cache is the server's own): whether its prompt rendering is the built-in
    one, and chat's usage style."""

    tools: tuple[ToolSpec, ...]
    tool_choice: ToolChoice
    calling: bool  # a tool may be called (tools given, tool_choice not "none")
    parallel_tool_calls: bool
    structured: StructuredOutput | None
    transfer: KvTransfer
    generation: GenerationShape
    checks_token_ids: bool  # logit_bias or stop_token_ids to check against the vocabulary
    # No model template, which may read the clock (strftime_now): the built-in rendering
    # is a function of the body alone, so what the route derives from it is kept.
    builtin_template: bool
    # prompt details, created cache tokens (chat), block size: the server's
    usage_style: UsageStyle

    @classmethod
    def of(cls, ctx: ApiContext, request: ChatCompletionRequest) -> _ChatShape:
        tools = tuple(tool_specs(request.tools))
        structured = structured_output(
            request.response_format,
            request.structured_outputs,
            named_tool_choice=isinstance(request.tool_choice, NamedToolChoice),
        )
        tool_choice = request.effective_tool_choice
        return cls(
            tools=tools,
            tool_choice=tool_choice,
            calling=bool(tools) and tool_choice != "none",
            parallel_tool_calls=request.parallel_tool_calls is not False,
            structured=structured,
            transfer=KvTransfer.of(request.kv_transfer_params),
            generation=GenerationShape.of(request, max_tokens=request.requested_max_tokens),
            checks_token_ids=bool(request.logit_bias or request.stop_token_ids),
            builtin_template=ctx.tokenizer.chat_template is None,
            usage_style=usage_style(ctx.model.enable_prompt_tokens_details, True, ctx.engine.options.block_size),
        )


def chat_completions(call: Call) -> Awaitable[None] | None:
    """A chat completion, answered synchronously up to its submitted jobs (the router's
    ``Handler``): a stream needs nothing more; a complete response returns what waits."""
    ctx = call.ctx
    parsed = call.parsed(_chat_body)
    request = parsed.request
    check_injected_failure(call)  # X-Return-Error, --failure-injection-rate
    shape = parsed.shape
    if shape is None:  # the body's tools and structured output (their 400s): once per body
        shape = parsed.shape = _ChatShape.of(ctx, request)
    model = ctx.resolve_model(request.model)
    transfer = shape.transfer
    transfer.check_streaming(shape.generation.streaming)
    check_job_count(ctx, shape.generation.choices)
    keep = shape.builtin_template  # kept for the body's later requests only then
    prompt_ids = parsed.prompt_ids
    if prompt_ids is None:
        prompt_ids = tuple(request_prompt_ids(ctx.tokenizer, request))
        if keep:
            parsed.prompt_ids = prompt_ids
    media_items = parsed.media_items
    if media_items is None:  # read once per body, with the render's checks (bad base64 is a 400, as vLLM's load)
        media_items = parsed.media_items = tuple(media_readers().chat_media(request.messages))
    media: tuple[MultimodalItem, ...] = ()  # turns built only for media (request_prompt_ids made their 400s)
    if media_items:  # per request: the prompt's rendering may read the clock (a model template)
        conversation = chat_turns(request.messages, request.tools)
        media = media_readers().kv_multimodal(ctx.tokenizer, conversation, media_items)
    max_tokens = shape.generation.max_tokens
    cap = parsed.cap
    if cap is None:  # the body against the server's (fixed) model options: once per body
        check_context_length(
            ctx.model.max_model_len, len(prompt_ids), max_tokens, max_tokens_param=request.max_tokens_param
        )
        cap = output_cap(ctx, len(prompt_ids), max_tokens)
        check_sampling_params(request, cap)  # SamplingParams, after the prompt (chat_completion/serving.py:350-380)
        top_logprobs = (request.top_logprobs or 0) if request.logprobs else 0
        check_output_volume(ctx, (cap,), shape.generation.choices, top_logprobs)
        if keep:  # the cap depends on the prompt's length
            parsed.cap = cap
    identity = RequestIdentity.of(call, "chatcmpl-", request.request_id)
    echo_text = parsed.echo_text
    if echo_text is None:
        echo_text = parsed.echo_text = last_user_text(request.messages)
    turns = _plan_turns(ctx, shape, identity.request_id, prompt_ids, echo_text)
    turns = transfer.finish(turns)
    threshold = job_threshold(ctx, request.cache_hit_threshold, forced=forced_cache_threshold(call), transfer=transfer)
    prompt = parsed.prompt
    if prompt is None or media or prompt.cache_hit_threshold != threshold:
        prompt = PromptPlan(
            prompt_ids,
            cap,
            remote_prefill=transfer.remote_prefill,
            cache_hit_threshold=threshold,
            kv_multimodal=media,
        )
        if keep and not media:  # the same for the body's later requests under the same gate
            parsed.prompt = prompt
    plan = GenerationPlan(identity.request_id, (prompt,), turns, shape.generation.choices)
    tool_calls = [turn.tool_calls for turn in turns] if shape.calling else None
    reasons = stop_reasons(turns, shape.generation.stop)
    logprobs = refusal = None
    if request.logprobs:
        top_logprobs, refusal = checked_logprobs(ctx, request.top_logprobs or 0)
        seeds = [choice_seed(ctx.model.seed, identity.request_id, i) for i in range(len(turns))]
        logprobs = ChatLogprobs(top_logprobs, seeds, ctx.text.eos, [turn.token_texts for turn in turns])
    if refusal is None and shape.checks_token_ids:
        refusal = token_id_refusal(request, ctx.tokenizer.vocab_size)
    created = int(ctx.wall_clock())
    echo = assistant_echo(request.messages) if request.echo else None
    usage = shape.usage_style
    if shape.generation.streaming:
        renderer = ChatStreamRenderer(
            response_id=identity.response_id,
            created=created,
            model=model,
            choices=len(turns),
            include_usage=shape.generation.include_usage,
            echo=echo,
            tool_calls=tool_calls,
            required_tool_choice=shape.calling and shape.tool_choice == "required",
            logprobs=logprobs,
            chunk_usage=ChunkUsage(len(prompt_ids), with_details=True) if shape.generation.continuous_usage else None,
            fingerprint=ctx.system_fingerprint,
            usage_style=usage,
            stop_reasons=reasons,
        )
        # Not held while the stream runs (memory per stream): the request, a dict class
        # of more fields than CPython shares keys for, takes ~1.6 KB.
        del request, parsed
        stream(call, plan, renderer, identity.headers, refusal=refusal)
        return None
    ec_params = chat_ec_transfer_params(ctx, media_items)
    pending = submit_collected(call, plan, refusal=refusal)
    body = partial(
        chat_completion_body,
        response_id=identity.response_id,
        created=created,
        model=model,
        echo=echo,
        tool_calls=tool_calls,
        logprobs=logprobs,
        fingerprint=ctx.system_fingerprint,
        usage_style=usage,
        forced_tool_calls=shape.calling and shape.tool_choice != "auto",
        stop_reasons=reasons,
        kv_transfer_params=transfer.response_params(),
        ec_transfer_params=ec_params,
    )
    return respond_collected(call, pending, body, identity.headers)


def _plan_turns(
    ctx: ApiContext, shape: _ChatShape, request_id: str, prompt_ids: Sequence[int], echo_text: str
) -> list[TurnPlan]:
    """What each choice says: tool calls or text when a tool may be called, else text;
    text under ``shape.structured`` satisfies it."""
    if not shape.calling:
        return plan_text_choices(
            ctx,
            request_id,
            ((len(prompt_ids), echo_text),),
            choices_per_prompt=shape.generation.choices,
            max_tokens=shape.generation.max_tokens,
            ignore_eos=shape.generation.ignore_eos,
            min_tokens=shape.generation.min_tokens,
            structured=shape.structured,
            stop=shape.generation.stop,
            prompt_ids=(prompt_ids,),
        )
    return plan_choices(
        ctx,
        shape.tools,
        shape.tool_choice,
        request_id=request_id,
        choices=shape.generation.choices,
        parallel_tool_calls=shape.parallel_tool_calls,
        prompt_ids=prompt_ids,
        max_tokens=shape.generation.max_tokens,
        ignore_eos=shape.generation.ignore_eos,
        echo_text=echo_text,
        min_tokens=shape.generation.min_tokens,
        structured=shape.structured,
        stop=shape.generation.stop,
    )


def register(router: Router) -> None:
    router.add("POST", "/v1/chat/completions", chat_completions)
