"""POST /v1/completions (with llm-d-inference-sim's P/D and cache-hit thresholds,
:mod:`llmsim.api.transfer`)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from functools import partial
from typing import Any

import attrs

from llmsim.api.completions.render import CompletionStreamRenderer, completion_body
from llmsim.api.completions.request import CompletionRequest, check_suffix, parse_completion_request
from llmsim.api.context import ApiContext, Call
from llmsim.api.errors import ApiError
from llmsim.api.failures import check_injected_failure
from llmsim.api.generation import (
    RequestIdentity,
    check_job_count,
    check_output_volume,
    respond_collected,
    stream,
    submit_collected,
)
from llmsim.api.logprobs_format import CompletionLogprobs, EchoedPrompt, choice_seed
from llmsim.api.logprobs_limit import checked_logprobs
from llmsim.api.plan import GenerationPlan, GenerationShape, PromptPlan, StructuredOutput, output_cap, plan_text_choices
from llmsim.api.prompts import CompletionPrompt, check_context_length, completion_prompts
from llmsim.api.request_fields import check_sampling_params, token_id_refusal
from llmsim.api.router import Router
from llmsim.api.stops import stop_reasons
from llmsim.api.structured import structured_output
from llmsim.api.transfer import (
    KvTransfer,
    check_cache_hit_threshold,
    forced_cache_threshold,
    job_threshold,
)
from llmsim.api.turns import TurnPlan
from llmsim.api.usage import ChunkUsage, usage_style

__all__ = ["completions", "register"]


@attrs.define(eq=False)
class _CompletionBody:
    """A completions body as parsed (:meth:`~llmsim.api.context.Call.parsed` remembers it
    per distinct body), and what the handler derives from it, kept here the first time a
    request of that body gets that far (functions of the body and the server's tokenizer
    and model options; errors keep their order)."""

    request: CompletionRequest
    shape: _CompletionShape | None = None  # its structured output, compiled
    prompts: tuple[CompletionPrompt, ...] | None = None
    caps: tuple[int, ...] | None = None  # each prompt's output cap, once the body passed its checks
    prompt_plans: tuple[PromptPlan, ...] | None = None  # the prompts' plans (for one gate)


def _completion_body(fields: dict[str, Any]) -> _CompletionBody:
    request = parse_completion_request(fields)
    check_cache_hit_threshold(fields, request.cache_hit_threshold)  # a body check, the first after parsing
    return _CompletionBody(request)


@attrs.frozen
class _CompletionShape:
    """What a completions handler reads of its body beyond the prompts, derived once per
    body (the body is frozen and these are functions of it alone): its structured output
    (whose 400s come in their place) and the request fields the handler reads, read once
    rather than through a property per request."""

    structured: StructuredOutput | None
    prompt_only: bool  # echo without generation
    generation: GenerationShape

    @classmethod
    def of(cls, request: CompletionRequest) -> _CompletionShape:
        structured = structured_output(
            request.response_format, request.structured_outputs, count_param="structured_outputs"
        )
        prompt_only = request.echo_without_generation
        # vLLM generates one token, unseen, for an echo without generation (completion/protocol.py:393,416)
        max_tokens = 1 if prompt_only else request.requested_max_tokens
        return cls(
            structured=structured,
            prompt_only=prompt_only,
            generation=GenerationShape.of(request, max_tokens=max_tokens),
        )


def completions(call: Call) -> Awaitable[None] | None:
    """A completion, answered synchronously up to its submitted jobs (the router's
    ``Handler``): a stream needs nothing more; a complete response returns what waits."""
    ctx = call.ctx
    parsed = call.parsed(_completion_body)
    request = parsed.request
    check_injected_failure(call)  # X-Return-Error, --failure-injection-rate
    model = ctx.resolve_model(request.model)
    transfer = KvTransfer.of(request.kv_transfer_params)
    transfer.check_streaming(request.streaming)
    shape = parsed.shape
    if shape is None:  # the body's structured output (its 400s): once per body
        shape = parsed.shape = _CompletionShape.of(request)
    prompts = parsed.prompts
    if prompts is None:  # a function of the body and the server's tokenizer
        prompts = parsed.prompts = tuple(completion_prompts(request.prompt, ctx.tokenizer))
    n = shape.generation.choices
    check_job_count(ctx, len(prompts) * n, n=n)
    max_tokens = shape.generation.max_tokens
    caps = parsed.caps
    if caps is None:  # the body against the server's (fixed) model options: once per body
        caps = parsed.caps = _checked_caps(ctx, request, prompts, max_tokens)
    identity = RequestIdentity.of(call, "cmpl-", request.request_id)
    turns = plan_text_choices(
        ctx,
        identity.request_id,
        [(len(prompt.token_ids), prompt.echo_text) for prompt in prompts],
        choices_per_prompt=n,
        max_tokens=max_tokens,
        ignore_eos=shape.generation.ignore_eos,
        min_tokens=shape.generation.min_tokens,
        structured=shape.structured,
        stop=shape.generation.stop,
        prompt_ids=[prompt.token_ids for prompt in prompts],
    )
    turns = transfer.finish(turns)
    reasons = stop_reasons(turns, shape.generation.stop)
    threshold = job_threshold(ctx, request.cache_hit_threshold, forced=forced_cache_threshold(call), transfer=transfer)
    prompt_plans = parsed.prompt_plans
    if prompt_plans is None or prompt_plans[0].cache_hit_threshold != threshold:  # (never without a prompt)
        # the same for the body's later requests under the same gate: kept
        prompt_plans = parsed.prompt_plans = tuple(
            PromptPlan(prompt.token_ids, cap, remote_prefill=transfer.remote_prefill, cache_hit_threshold=threshold)
            for prompt, cap in zip(prompts, caps, strict=True)
        )
    plan = GenerationPlan(identity.request_id, prompt_plans, turns, n)
    created = int(ctx.wall_clock())
    echo_prompts = [prompt.text for prompt in prompts] if request.echo else None
    logprobs, refusal = _logprobs(ctx, request, prompts, identity.request_id, turns)
    refusal = refusal or token_id_refusal(request, ctx.tokenizer.vocab_size)
    usage = usage_style(ctx.model.enable_prompt_tokens_details, False)  # the server's, so made once
    if shape.generation.streaming:
        chunk_usages = (
            [ChunkUsage(len(prompt.token_ids), with_details=False) for prompt in prompts]
            if shape.generation.continuous_usage
            else None
        )
        renderer = CompletionStreamRenderer(
            response_id=identity.response_id,
            created=created,
            model=model,
            choices=len(turns),
            choices_per_prompt=n,
            include_usage=shape.generation.include_usage,
            echo_prompts=echo_prompts,
            prompt_only=shape.prompt_only,
            logprobs=logprobs,
            chunk_usages=chunk_usages,
            fingerprint=ctx.system_fingerprint,
            usage_style=usage,
            stop_reasons=reasons,
        )
        stream(call, plan, renderer, identity.headers, refusal=refusal)
        return None
    pending = submit_collected(call, plan, refusal=refusal)
    body = partial(
        completion_body,
        response_id=identity.response_id,
        created=created,
        model=model,
        choices_per_prompt=n,
        echo_prompts=echo_prompts,
        prompt_only=shape.prompt_only,
        logprobs=logprobs,
        fingerprint=ctx.system_fingerprint,
        usage_style=usage,
        stop_reasons=reasons,
        kv_transfer_params=transfer.response_params(),
    )
    return respond_collected(call, pending, body, identity.headers)


def _checked_caps(
    ctx: ApiContext, request: CompletionRequest, prompts: Sequence[CompletionPrompt], max_tokens: int | None
) -> tuple[int, ...]:
    """Each prompt's output cap for ``max_tokens`` (the route's: 1 for an echo without
    generation), once the request passed the checks of its suffix, its prompts' lengths
    (against the ``max_tokens`` it asked for) and its sampling params against the caps, and
    its output volume."""
    check_suffix(request)
    for prompt in prompts:
        check_context_length(
            ctx.model.max_model_len, len(prompt.token_ids), request.requested_max_tokens, prompt_is_text=prompt.is_text
        )
    caps = tuple(output_cap(ctx, len(prompt.token_ids), max_tokens) for prompt in prompts)
    for cap in caps:  # SamplingParams per prompt, once every prompt passed (completion/serving.py:157-176)
        check_sampling_params(request, cap)
    check_output_volume(ctx, caps, request.choices_per_prompt, request.logprobs or 0)
    return caps


def _logprobs(
    ctx: ApiContext,
    request: CompletionRequest,
    prompts: Sequence[CompletionPrompt],
    request_id: str,
    turns: Sequence[TurnPlan],
) -> tuple[CompletionLogprobs | None, ApiError | None]:
    """The request's logprobs, if it asked, and the error refusing them if it asked
    for too many; with ``echo`` the prompts' tokens are listed too, each decoded on
    its own as vLLM does; each choice's entries name its tokens' own texts."""
    if request.logprobs is None:
        return None, None
    texts = [turn.token_texts for turn in turns]
    count, refusal = checked_logprobs(ctx, request.logprobs)
    seed = ctx.model.seed
    echoed = None
    if request.echo:
        decode = ctx.tokenizer.decode
        echoed = [
            EchoedPrompt(tuple(decode((token,)) for token in prompt.token_ids), choice_seed(seed, request_id, -1 - i))
            for i, prompt in enumerate(prompts)
        ]
    seeds = [choice_seed(seed, request_id, index) for index in range(len(texts))]
    logprobs = CompletionLogprobs(
        count, seeds, choices_per_prompt=request.choices_per_prompt, prompts=echoed, eos=ctx.text.eos, texts=texts
    )
    return logprobs, refusal


def register(router: Router) -> None:
    router.add("POST", "/v1/completions", completions)
