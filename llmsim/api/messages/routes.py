"""POST /v1/messages and POST /v1/messages/count_tokens (Anthropic Messages API).

A request becomes one turn (one job): text, or tool_use blocks chosen with the chat
rules of llm-d-inference-sim (``auto``: zero or more calls, ``any``: at least one,
``tool``: exactly that one, ``none``: text; extra calls with
``tool-call-extra-call-probability``; ``disable_parallel_tool_use``: at most one).
Errors on these routes use Anthropic's envelope.
"""

from __future__ import annotations

from collections.abc import Awaitable

from llmsim.api.context import Call
from llmsim.api.failures import check_injected_failure
from llmsim.api.generation import (
    RequestIdentity,
    check_job_count,
    check_output_volume,
    respond_collected,
    stream,
    submit_collected,
)
from llmsim.api.media import media_readers
from llmsim.api.messages.render import (
    MessageShell,
    MessagesStreamRenderer,
    message_body,
)
from llmsim.api.messages.request import (
    conversation_turns,
    function_tools,
    last_user_text,
    parse_messages_request,
    tool_choice_of,
)
from llmsim.api.plan import GenerationPlan, PromptPlan, output_cap, plan_text, plan_tool_calls
from llmsim.api.prompts import check_context_length, prompt_ids
from llmsim.api.router import ErrorStyle, Router
from llmsim.api.stops import StopRule, finish_turn
from llmsim.api.tool_support import planning_errors
from llmsim.api.transfer import forced_cache_threshold, job_threshold
from llmsim.engine.job import Job
from llmsim.model.tools import plan_tool_calls as plan_tool_calls_of

__all__ = ["count_tokens", "create_message", "register"]


def create_message(call: Call) -> Awaitable[None] | None:
    """A message, answered synchronously up to its submitted job (the router's
    ``Handler``): a stream needs nothing more; a complete answer returns what waits."""
    ctx = call.ctx
    request = parse_messages_request(call.json())
    check_injected_failure(call)  # X-Return-Error, --failure-injection-rate
    model = ctx.resolve_model(request.model)
    check_job_count(ctx, 1)
    tools = function_tools(request.tools)
    choice = tool_choice_of(request.tool_choice, tools)
    media_of = media_readers()
    turns = conversation_turns(request, tools)
    prompt = prompt_ids(ctx.tokenizer, turns)
    media = media_of.kv_multimodal(ctx.tokenizer, turns, media_of.messages_media(request))
    # vLLM serves /v1/messages as a chat request whose max_completion_tokens is max_tokens
    # (vllm/entrypoints/anthropic/serving.py:643-644), so its errors name that field.
    check_context_length(
        ctx.model.max_model_len, len(prompt), request.max_tokens, max_tokens_param="max_completion_tokens"
    )

    identity = RequestIdentity.of(call, "msg_")
    request_id = identity.request_id
    cap = output_cap(ctx, len(prompt), request.max_tokens)
    check_output_volume(ctx, (cap,), 1, 0)
    planned = []
    if tools:
        specs = [tool.spec for tool in tools]
        with planning_errors():
            planned = plan_tool_calls_of(specs, choice.choice, ctx.rng_for(request_id, 1), options=ctx.tool_calls)
        if choice.single:
            planned = planned[:1]
    calls = [(call.name, f"toolu_{request_id}_{i}", call.arguments) for i, call in enumerate(planned)]
    if calls:
        plan = plan_tool_calls(ctx, calls, cap)
    else:
        plan = plan_text(
            ctx,
            ctx.rng_for(request_id),
            prompt_tokens=len(prompt),
            max_tokens=request.max_tokens,
            ignore_eos=bool(request.ignore_eos),
            echo_text=last_user_text(request),
            prompt_ids=prompt,
        )
    # vLLM serves the request as chat with stop=stop_sequences (anthropic/serving.py:643-646),
    # so its engine ends the turn: at a stop string, else with its EOS token, counted
    plan = finish_turn(ctx, plan, cap, _stop_rule(request.stop_sequences, request.streaming))
    stop_sequence = plan.stop_reason if isinstance(plan.stop_reason, str) else None
    shell = MessageShell(identity.response_id, model, stop_sequence)
    # llm-d serves /v1/messages as a chat request: the header and the global threshold
    # apply (pkg/llm-d-inference-sim/messages.go:32-44); the body has no threshold field
    threshold = job_threshold(ctx, None, forced=forced_cache_threshold(call))
    generation = GenerationPlan.single(
        request_id, PromptPlan(prompt, cap, cache_hit_threshold=threshold, kv_multimodal=media), plan
    )
    if request.streaming:
        stream(call, generation, MessagesStreamRenderer(shell=shell, plan=plan), identity.headers)
        return None
    pending = submit_collected(call, generation)

    def body(*, jobs: list[Job]) -> bytes:
        [job] = jobs
        return message_body(shell, plan, job)

    return respond_collected(call, pending, body, identity.headers)


def _stop_rule(stop_sequences: tuple[str, ...] | None, streaming: bool) -> StopRule | None:
    """The stop strings of a /v1/messages request (empty ones ignored, as ever)."""
    strings = tuple(sequence for sequence in stop_sequences or () if sequence)
    return StopRule(strings, streaming=streaming) if strings else None


async def count_tokens(call: Call) -> None:
    """``{"input_tokens": N, "context_management": {"original_input_tokens": N}}``: the
    prompt a /v1/messages request with this body would have, in vLLM's body
    (vllm/entrypoints/anthropic/serving.py:1249-1282; nothing is trimmed, so both agree)."""
    ctx = call.ctx
    request = parse_messages_request(call.json(), need_max_tokens=False)
    ctx.resolve_model(request.model)
    tools = function_tools(request.tools)
    tool_choice_of(request.tool_choice, tools)
    count = len(prompt_ids(ctx.tokenizer, conversation_turns(request, tools)))
    call.respond_json({"input_tokens": count, "context_management": {"original_input_tokens": count}})


def register(router: Router) -> None:
    router.add("POST", "/v1/messages", create_message, error_style=ErrorStyle.ANTHROPIC)
    router.add("POST", "/v1/messages/count_tokens", count_tokens, error_style=ErrorStyle.ANTHROPIC)
