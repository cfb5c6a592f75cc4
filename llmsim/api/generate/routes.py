"""POST /inference/v1/generate: token ids in, token ids out
(vllm/entrypoints/scale_out/token_in_token_out/api_router.py:46-74, serving.py:185-405).

The prompt is the request's ``token_ids``, never tokenized; the answer is planned and
paced by the same flow as chat and completions (:func:`~llmsim.api.plan.plan_text_choices`,
:func:`~llmsim.api.generation.stream` / :func:`~llmsim.api.generation.submit_collected`), seeded
by the request id, so a chat request rendered by ``/v1/chat/completions/render`` and
generated here under the same ``X-Request-Id`` gets the token ids chat would have sent.

vLLM's render writes the room the prompt leaves as ``max_tokens`` when the request set
none; a ``max_tokens`` of at least that room is read here as no cap at all (it caps
nothing), so that such a request is planned as the original was.

P/D, as llm-d-inference-sim does it (:mod:`llmsim.api.transfer`): ``kv_transfer_params``
(at the root, or in ``sampling_params.extra_args``) with ``do_remote_decode`` makes this
the prefill pod (no streaming, ``finish_reason: "remote_decode"``, placeholder
``kv_transfer_params`` for the decoder), with ``do_remote_prefill`` the decode pod (the
first token waits the KV-cache transfer).  Without them ``kv_transfer_params`` is null, as
vLLM without a KV connector answers.  Of the cache-hit thresholds only
``--global-cache-hit-threshold`` applies here: generate has no request field and llm-d
reads no header for it.
"""

from __future__ import annotations

from collections.abc import Awaitable
from functools import partial

from llmsim.api.context import ApiContext, Call
from llmsim.api.errors import ApiError
from llmsim.api.failures import check_injected_failure
from llmsim.api.generate.logprobs import GenerateLogprobs
from llmsim.api.generate.render import GenerateShape, GenerateStreamRenderer, generate_body
from llmsim.api.generate.request import GenerateRequest, parse_generate_request
from llmsim.api.generation import (
    RequestIdentity,
    check_job_count,
    check_output_volume,
    respond_collected,
    stream,
    submit_collected,
)
from llmsim.api.logprobs_limit import checked_logprobs
from llmsim.api.plan import GenerationPlan, PromptPlan, output_cap, plan_text_choices
from llmsim.api.prompts import check_prompt_length
from llmsim.api.render.gate import require_scale_out
from llmsim.api.router import Router
from llmsim.api.stops import StopRule
from llmsim.api.transfer import KvTransfer, ec_transfer_params, job_threshold
from llmsim.api.turns import TurnPlan
from llmsim.api.usage import UsageStyle
from llmsim.engine.job import Job
from llmsim.engine.kv_hashing import MultimodalItem

__all__ = ["generate", "register"]


def generate(call: Call) -> Awaitable[None] | None:
    """A generate request, answered synchronously up to its submitted jobs (the router's
    ``Handler``): a stream needs nothing more; a complete answer returns what waits."""
    ctx = call.ctx
    require_scale_out(ctx)
    request = parse_generate_request(call.json(), ctx.tokenizer.vocab_size)
    check_injected_failure(call)  # llm-d-inference-sim honours X-Return-Error on generate
    model = ctx.resolve_model(request.model)
    params = request.sampling_params
    check_job_count(ctx, params.n)
    transfer = KvTransfer.of(request.transfer_params)
    _check_serving_rules(request, ctx.engine.options.max_num_seqs)
    transfer.check_streaming(request.streaming)
    prompt = request.token_ids
    check_prompt_length(ctx.model.max_model_len, len(prompt), prompt_is_text=False)
    room = ctx.model.max_model_len - len(prompt)
    cap = output_cap(ctx, len(prompt), params.max_tokens)
    check_output_volume(ctx, (cap,), params.n, params.logprobs or 0)
    identity = RequestIdentity.of(call, "generate-tokens-", request.request_id)
    turns = plan_text_choices(
        ctx,
        identity.request_id,
        ((len(prompt), ctx.tokenizer.decode(prompt)),),  # echo mode replays the prompt
        choices_per_prompt=params.n,
        max_tokens=params.max_tokens if params.max_tokens is not None and params.max_tokens < room else None,
        ignore_eos=params.ignore_eos,
        min_tokens=params.min_tokens,
        stop=_stop_rule(request),
        prompt_ids=(prompt,),  # dataset mode: the rows of this prompt (as chat's, for a rendered chat prompt)
    )
    turns = transfer.finish(turns)
    threshold = job_threshold(ctx, None, forced=False, transfer=transfer)
    prompt_plan = PromptPlan(
        prompt,
        cap,
        remote_prefill=transfer.remote_prefill,
        cache_hit_threshold=threshold,
        kv_multimodal=_kv_multimodal(request),
    )
    plan = GenerationPlan(identity.request_id, (prompt_plan,), turns, params.n)
    logprobs, refusal = _logprobs(ctx, request, identity.request_id)
    shape = _shape(request, identity.response_id, turns, ctx.model.enable_prompt_tokens_details, logprobs)
    if request.streaming:
        options = request.stream_options
        include_usage = options is not None and bool(options.include_usage)
        renderer = GenerateStreamRenderer(
            shape,
            include_usage=include_usage,
            continuous_usage=include_usage and bool(options and options.continuous_usage_stats),
        )
        stream(call, plan, renderer, identity.headers, refusal=refusal)
        return None
    pending = submit_collected(call, plan, refusal=refusal)
    body = partial(
        generate_body,
        shape,
        model=model,
        kv_transfer_params=transfer.response_params(),
        # an encoder pod's, per mm hash of the request's features (generate.go:86-89)
        ec_transfer_params=ec_transfer_params(ctx, _mm_hashes(request)),
    )

    def answer(*, jobs: list[Job]) -> bytes:  # (``created``: when the answer is made)
        return body(created=int(ctx.wall_clock()), jobs=jobs)

    return respond_collected(call, pending, answer, identity.headers)


def _check_serving_rules(request: GenerateRequest, max_num_seqs: int) -> None:
    """The 400s ``serve_tokens`` gives before generating (serving.py:210-240)."""
    params = request.sampling_params
    if params.n > max_num_seqs:
        raise ApiError(
            400, f"sampling_params.n must be at most the server's max_num_seqs ({max_num_seqs}), got {params.n}."
        )
    if request.output_mode == "text" and not params.detokenize:
        raise ApiError(400, "output_mode='text' requires sampling_params.detokenize to be true")


def _mm_hashes(request: GenerateRequest) -> list[str]:
    features = request.features
    return [] if features is None else [digest for hashes in features.mm_hashes.values() for digest in hashes]


def _kv_multimodal(request: GenerateRequest) -> tuple[MultimodalItem, ...]:
    """The request's ``features`` as its KV block keys take them: each mm hash over its
    placeholder (llm-d-inference-sim pkg/kv-cache/kv_cache.go:111-121)."""
    features = request.features
    if features is None:
        return ()
    return tuple(
        MultimodalItem(digest, placeholder.offset, placeholder.length)
        for modality, hashes in features.mm_hashes.items()
        for digest, placeholder in zip(hashes, features.mm_placeholders[modality], strict=True)  # checked
    )


def _stop_rule(request: GenerateRequest) -> StopRule | None:
    """``stop`` strings and ``stop_token_ids`` as vLLM's detokenizer applies them."""
    params = request.sampling_params
    if not params.stop_strings and not params.stop_token_ids:
        return None
    return StopRule(
        params.stop_strings,
        frozenset(params.stop_token_ids or ()),
        params.include_stop_str_in_output,
        params.min_tokens,
        request.streaming and params.logprobs is None,  # logprobs name whole tokens: no text held back
    )


def _logprobs(
    ctx: ApiContext, request: GenerateRequest, request_id: str
) -> tuple[GenerateLogprobs | None, ApiError | None]:
    """The choices' logprobs, if asked for, and the error refusing too many: vLLM checks
    ``--max-logprobs`` as the engine takes the request (``SamplingParams.verify``), so a
    stream gets it in-band (api/logprobs_limit.py)."""
    requested = request.sampling_params.logprobs
    if requested is None:
        return None, None
    count, refusal = checked_logprobs(ctx, requested)
    text_mode = request.output_mode == "text"
    return GenerateLogprobs(
        ctx.tokenizer, count, seed=ctx.model.seed, request_id=request_id, text_mode=text_mode
    ), refusal


def _shape(
    request: GenerateRequest,
    request_id: str,
    turns: list[TurnPlan],
    prompt_details: bool,
    logprobs: GenerateLogprobs | None,
) -> GenerateShape:
    """What the response says besides the tokens; with ``return_token_ids`` the prompt
    and its multimodal ranges (serving.py:328-333, 590-593)."""
    features = request.features if request.return_token_ids else None
    placeholders: dict[str, object] | None = None
    if features is not None:
        placeholders = {
            modality: [{"offset": p.offset, "length": p.length} for p in ranges]
            for modality, ranges in features.mm_placeholders.items()
        }
    return GenerateShape(
        request_id=request_id,
        text_mode=request.output_mode == "text",
        stop_reasons=[turn.stop_reason for turn in turns],
        usage_style=UsageStyle(prompt_details=prompt_details, created_cache_tokens=False),
        prompt_token_ids=request.token_ids if request.return_token_ids else None,
        mm_placeholders=placeholders,
        logprobs=logprobs,
    )


def register(router: Router) -> None:
    router.add("POST", "/inference/v1/generate", generate)
