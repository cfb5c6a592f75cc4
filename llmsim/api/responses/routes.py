"""POST /v1/responses, GET/DELETE /v1/responses/{response_id},
POST /v1/responses/{response_id}/cancel.

A request becomes one turn (one job): a text message, schema-valid JSON text
(``text.format``), or exactly one function call.  The tool-turn rules are
llm-d-inference-sim's (seed 000): with function tools and a ``tool_choice`` other
than ``none`` the turn is a function call — ``auto`` or omitted is forced to call on
the first tool turn — unless a ``function_call_output`` is anywhere in the
conversation (its input or the stored chain of ``previous_response_id``): then tools
stay off and the turn is a message.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Sequence
from typing import Any

from llmsim.api.context import ApiContext, Call, seeded_random
from llmsim.api.errors import JSON_HEADERS, ApiError, validation_error
from llmsim.api.failures import check_injected_failure
from llmsim.api.generation import RequestIdentity, check_job_count, check_output_volume, stream, submit_collected
from llmsim.api.logprobs_format import choice_seed
from llmsim.api.logprobs_limit import checked_logprobs
from llmsim.api.media import media_readers
from llmsim.api.plan import GenerationPlan, PromptPlan, output_cap, plan_fixed_text, plan_text, plan_tool_calls
from llmsim.api.prompts import check_output_tokens, check_prompt_length, prompt_ids, tool_call_text, tools_turn
from llmsim.api.request_fields import check_sampling_fields
from llmsim.api.responses.render import (
    ResponseShell,
    ResponsesStreamRenderer,
    TokenLogprobs,
    TurnIds,
    final_response,
)
from llmsim.api.responses.request import (
    ResponsesRequest,
    function_tools,
    input_conversation,
    output_format,
    parse_responses_request,
    tool_choice_of,
)
from llmsim.api.responses.store import StoredResponse, not_found
from llmsim.api.router import Router
from llmsim.api.sse import json_bytes
from llmsim.api.stops import StopRule, finish_turn
from llmsim.api.tool_support import planning_errors
from llmsim.api.transfer import job_threshold
from llmsim.api.turns import TEXT, TurnPlan
from llmsim.model.tokenizer import ChatTurn
from llmsim.model.tools import (
    NamedToolChoice,
    ToolChoice,
    arguments_json,
    plan_single_tool_call,
)

__all__ = ["cancel_response", "create_response", "delete_response", "register", "retrieve_response"]

_JSON_OBJECT_OVERHEAD = 8  # tokens a json_object turn spends on its wrapper, roughly


def create_response(call: Call) -> Awaitable[None] | None:
    """A response, answered synchronously up to its submitted job (the router's
    ``Handler``): a stream needs nothing more (it is stored as it ends, complete); a
    complete answer returns what waits."""
    ctx = call.ctx
    body = call.json()
    request = parse_responses_request(body)
    check_injected_failure(call)  # X-Return-Error, --failure-injection-rate
    model = ctx.resolve_model(request.model)
    # with the store off, vLLM serves the request unstored (vllm/entrypoints/openai/responses/serving.py:355-363)
    storing = request.storing and ctx.model.enable_responses_store
    check_job_count(ctx, 1)
    store = ctx.response_store
    previous = None
    if request.previous_response_id is not None:
        previous = store.get(request.previous_response_id)
        if previous is None:
            raise not_found(request.previous_response_id)
    tools = function_tools(request.tools)
    choice = tool_choice_of(request.tool_choice, tools)
    text_config = body.get("text")
    fmt = output_format(request.text, text_config.get("format") if isinstance(text_config, dict) else None)
    conversation = input_conversation(request.input)
    history = previous.history if previous is not None else ()
    has_tool_output = conversation.has_tool_output or (previous is not None and previous.has_tool_output)
    calling = bool(tools) and choice.mode != "none" and not has_tool_output

    turns: list[ChatTurn] = []
    if request.instructions:
        turns.append(ChatTurn("system", request.instructions))
    if tools:
        turns.append(tools_turn([tool.definition for tool in tools]))
    turns.extend(history)
    turns.extend(conversation.turns)
    prompt = _checked_prompt(ctx, request, turns)
    media_of = media_readers()
    media = media_of.kv_multimodal(ctx.tokenizer, turns, media_of.responses_media(request.input))
    top_logprobs = _checked_top_logprobs(ctx, request)

    identity = _identity(call, request)
    request_id = identity.request_id
    ids = TurnIds.of(seeded_random(f"{ctx.model.seed}:{request_id}:ids"))
    cap = output_cap(ctx, len(prompt), request.max_output_tokens)
    check_output_volume(ctx, (cap,), 1, top_logprobs)
    if calling:
        engine_choice: ToolChoice = NamedToolChoice(choice.forced.name) if choice.forced is not None else "required"
        with planning_errors():
            call_plan = plan_single_tool_call(
                [tool.spec for tool in tools],
                engine_choice,
                ctx.rng_for(request_id, 1),
                options=ctx.tool_calls,
            )
        assert call_plan is not None  # tools present, choice not "none"
        plan = plan_tool_calls(ctx, [(call_plan.name, ids.call_id, call_plan.arguments)], cap)
    else:
        plan = _plan_message(ctx, request, fmt.type, fmt.schema, prompt, cap, request_id, conversation.last_user_text)
    # the engine ends any turn the model finishes (text, text.format JSON, a function
    # call) with its EOS token, which usage counts (responses/context.py:223), or a text
    # at its stop strings and stop tokens (protocol.py:618-652)
    plan = finish_turn(ctx, plan, cap, _stop_rule(request))
    logprobs = None
    if request.wants_logprobs and plan.blocks[0].kind == TEXT:
        logprobs = TokenLogprobs(top_logprobs, choice_seed(ctx.model.seed, request_id, 0), ctx.text.eos.text)

    shell = ResponseShell(
        response_id=identity.response_id,
        created_at=int(ctx.wall_clock()),
        model=model,
        instructions=request.instructions,
        max_output_tokens=cap,
        previous_response_id=request.previous_response_id,
        tool_choice=choice.echo,
        tools=body.get("tools") or [],
        text=None if request.text is None else {"format": fmt.echo},
        top_logprobs=(request.top_logprobs or 0) if request.wants_logprobs else None,  # protocol.py:635
        parallel_tool_calls=True if request.parallel_tool_calls is None else request.parallel_tool_calls,
        temperature=request.temperature,
        # greedy sampling reports top_p 1 (vllm/sampling_params.py:616-619)
        top_p=1.0 if request.temperature is not None and request.temperature < 1e-5 else request.top_p,
        presence_penalty=request.presence_penalty or 0.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        metadata=request.metadata,
        user=request.user,
        truncation=request.truncation or "disabled",
        service_tier=request.service_tier or "auto",
        max_tool_calls=request.max_tool_calls,
    )
    # only --global-cache-hit-threshold: llm-d's responses request reads no field or header for it
    threshold = job_threshold(ctx, None, forced=False)
    generation = GenerationPlan.single(
        request_id, PromptPlan(prompt, cap, cache_hit_threshold=threshold, kv_multimodal=media), plan
    )
    said = _output_turn(plan, ids.call_id)

    def save(response_body: bytes) -> None:
        if storing:
            stored = StoredResponse(
                response_id=identity.response_id,
                body=response_body,
                history=(*history, *conversation.turns, said),
                has_tool_output=has_tool_output,
            )
            store.put(stored)

    if request.streaming:
        renderer = ResponsesStreamRenderer(shell=shell, plan=plan, ids=ids, logprobs=logprobs)

        def ended() -> None:  # (also when the client left: then there is no final response to store)
            if renderer.final is not None:
                save(json_bytes(renderer.final))

        stream(call, generation, renderer, identity.headers, on_end=ended)
        return None
    pending = submit_collected(call, generation)

    async def respond() -> None:
        [job] = await pending.finished()
        response_body = json_bytes(final_response(shell, plan, ids, job, logprobs, streamed=False))
        call.respond(200, response_body, (*JSON_HEADERS, *identity.headers))
        save(response_body)

    return respond()


def _checked_prompt(ctx: ApiContext, request: ResponsesRequest, turns: list[ChatTurn]) -> list[int]:
    """The prompt's token ids, within vLLM 0.33's context rules for /v1/responses.

    400 when ``max_output_tokens`` alone exceeds the window or the prompt alone does
    (the renderer's checks, :func:`check_output_tokens` and :func:`check_prompt_length`),
    and when the prompt fills it (``_validate_generator_input``,
    ``vllm/entrypoints/openai/responses/serving.py:232-252``, its own text and type);
    otherwise the output cap is clamped to the room left.  ``truncation: "auto"`` keeps
    the first ``max_model_len - 1`` tokens instead (``truncate_prompt_tokens=-1``,
    ``protocol.py:525-532``; ``renderers/params.py:238-256``), leaving room for one.  A
    cap below 1 and the sampling fields are ``SamplingParams``' 400s
    (``vllm/sampling_params.py:635-774``, :func:`check_sampling_fields`).
    """
    max_model_len = ctx.model.max_model_len
    max_output_tokens = request.max_output_tokens
    check_output_tokens(max_model_len, max_output_tokens, "max_output_tokens")
    prompt = prompt_ids(ctx.tokenizer, turns)
    if request.truncation == "auto":
        prompt = prompt[: max_model_len - 1]
    check_prompt_length(max_model_len, len(prompt))
    if len(prompt) >= max_model_len:
        message = (
            f"The engine prompt length {len(prompt)} exceeds the max_model_len {max_model_len}. Please reduce prompt."
        )
        raise ApiError(400, message, param="input", error_type="invalid_request_error")
    # to_sampling_params then SamplingParams._verify_args (protocol.py:576-650)
    check_sampling_fields(request, max_tokens=max_output_tokens)
    return prompt


def _checked_top_logprobs(ctx: ApiContext, request: ResponsesRequest) -> int:
    """How many logprobs per token the turn lists (``top_logprobs`` counts only with
    ``include: ["message.output_text.logprobs"]``, ``protocol.py:635``), or vLLM's 400s:
    ``SamplingParams``' range (``vllm/sampling_params.py:706-711``) and
    ``--max-logprobs`` (:func:`checked_logprobs`).  vLLM checks the cap as the engine
    takes the request, which for a stream is after ``response.created`` and
    ``response.in_progress`` went out, and then drops the connection; llmsim answers a
    streaming request with the 400 instead.
    """
    if not request.wants_logprobs:
        return 0
    requested = request.top_logprobs or 0
    if requested < -1:
        message = f"logprobs must be non-negative or -1, got {requested}."
        raise validation_error(message, parameter="logprobs", value=requested)
    count, refusal = checked_logprobs(ctx, requested)
    if refusal is not None:
        raise refusal
    return count


def _plan_message(
    ctx: ApiContext,
    request: ResponsesRequest,
    format_type: str,
    schema: Any,
    prompt_ids: Sequence[int],
    cap: int,
    request_id: str,
    echo_text: str,
) -> TurnPlan:
    """The text of a message turn: random/echo text (or the dataset's answer to
    ``prompt_ids``), or JSON for ``text.format``."""
    prompt_tokens = len(prompt_ids)
    rng = ctx.rng_for(request_id)
    if format_type == "json_schema":
        with planning_errors():
            value = schema.generate(ctx.rng_for(request_id, 1), ctx.tool_calls)
        return plan_fixed_text(ctx, arguments_json(value), cap)
    ignore_eos = bool(request.ignore_eos)
    if format_type == "json_object":
        budget = max(1, cap - _JSON_OBJECT_OVERHEAD)
        inner = plan_text(
            ctx, rng, prompt_tokens=prompt_tokens, max_tokens=budget, ignore_eos=ignore_eos, echo_text=echo_text
        )
        return plan_fixed_text(ctx, json.dumps({"response": "".join(inner.pieces)}, ensure_ascii=False), cap)
    return plan_text(
        ctx,
        rng,
        prompt_tokens=prompt_tokens,
        max_tokens=request.max_output_tokens,
        ignore_eos=ignore_eos,
        echo_text=echo_text,
        prompt_ids=prompt_ids,
    )


def _stop_rule(request: ResponsesRequest) -> StopRule | None:
    """vLLM's ``stop``, ``stop_token_ids`` and ``include_stop_str_in_output`` on
    /v1/responses, as on chat (no ``min_tokens`` there)."""
    strings = (request.stop,) if isinstance(request.stop, str) else request.stop or ()
    if not strings and not request.stop_token_ids:
        return None
    return StopRule(
        strings,
        frozenset(request.stop_token_ids or ()),
        bool(request.include_stop_str_in_output),
        streaming=request.streaming,
    )


def _output_turn(plan: TurnPlan, call_id: str) -> ChatTurn:
    """What this turn said, as the next turn's prompt history shows it."""
    block = plan.blocks[0]
    if block.kind == TEXT:
        return ChatTurn("assistant", plan.block_text(block))
    return ChatTurn("assistant", tool_call_text(block.name, plan.block_text(block)))


async def retrieve_response(call: Call) -> None:
    entry = call.ctx.response_store.require(call.params["response_id"])
    call.respond(200, entry.body)


async def delete_response(call: Call) -> None:
    response_id = call.params["response_id"]
    if not call.ctx.response_store.delete(response_id):
        raise not_found(response_id)
    call.respond_json({"id": response_id, "object": "response", "deleted": True})


async def cancel_response(call: Call) -> None:
    """Only background responses can be cancelled, and llmsim runs none (vLLM's 400)."""
    call.ctx.response_store.require(call.params["response_id"])
    raise ApiError(400, "Cannot cancel a synchronous response.", param="response_id")


def register(router: Router) -> None:
    router.add("POST", "/v1/responses", create_response)
    router.add("GET", "/v1/responses/{response_id}", retrieve_response)
    router.add("DELETE", "/v1/responses/{response_id}", delete_response)
    router.add("POST", "/v1/responses/{response_id}/cancel", cancel_response)


def _identity(call: Call, request: ResponsesRequest) -> RequestIdentity:
    """vLLM names a response by the body's ``request_id``, as given (default
    ``resp_<16 hex>``; responses/protocol.py:357-364, serving.py:1115), and ignores
    ``X-Request-Id`` there; llmsim still honours the header when the body has none."""
    if request.request_id is not None:
        return RequestIdentity(request.request_id, request.request_id, ())
    return RequestIdentity.of(call, "resp_")
