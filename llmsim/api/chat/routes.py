"""POST /v1/chat/completions."""

from __future__ import annotations

from llmsim.api.chat.render import ChatStreamRenderer, chat_completion_body
from llmsim.api.chat.tools import call_blocks, plan_choices, tool_specs
from llmsim.api.context import ApiContext, Call
from llmsim.api.errors import JSON_HEADERS
from llmsim.api.generation import (
    GenerationPlan,
    PromptPlan,
    RequestIdentity,
    check_job_count,
    generate_all,
    generate_stream,
)
from llmsim.api.logprobs_format import ChatLogprobs, choice_seed
from llmsim.api.prompts import assistant_echo, chat_prompt_ids, check_context_length, last_user_text
from llmsim.api.requests import ChatCompletionRequest, parse_chat_request
from llmsim.api.router import Router
from llmsim.api.turns import TurnPlan
from llmsim.model.tools import ToolSpec

__all__ = ["chat_completions", "register"]


async def chat_completions(call: Call) -> None:
    ctx = call.ctx
    request = parse_chat_request(call.json())
    check_job_count(ctx, request.choices_per_prompt)
    tools = tool_specs(request.tools)
    model = ctx.resolve_model(request.model)
    prompt_ids = chat_prompt_ids(ctx.tokenizer, request.messages, request.tools)
    max_tokens = request.requested_max_tokens
    check_context_length(
        ctx.config.max_model_len, len(prompt_ids), max_tokens, max_tokens_param=request.max_tokens_param
    )
    identity = RequestIdentity.of(call, "chatcmpl-")
    echo_text = last_user_text(request.messages)
    outputs = _tool_turns(ctx, request, tools, identity.request_id, len(prompt_ids), max_tokens, echo_text)
    plan = GenerationPlan(
        request_id=identity.request_id,
        prompts=(PromptPlan(prompt_ids, echo_text),),
        choices_per_prompt=request.choices_per_prompt,
        max_tokens=max_tokens,
        ignore_eos=bool(request.ignore_eos),
        outputs=outputs,
    )
    tool_calls = None if outputs is None else [call_blocks(output) for output in outputs]
    logprobs = None
    if request.logprobs:
        seeds = [choice_seed(ctx.config.seed, identity.request_id, i) for i in range(plan.job_count)]
        logprobs = ChatLogprobs(request.top_logprobs or 0, seeds)
    created = int(ctx.wall_clock())
    echo = assistant_echo(request.messages) if request.echo else None
    if request.streaming:
        renderer = ChatStreamRenderer(
            response_id=identity.response_id,
            created=created,
            model=model,
            choices=plan.job_count,
            include_usage=request.include_usage,
            echo=echo,
            tool_calls=tool_calls,
            logprobs=logprobs,
        )
        await generate_stream(call, plan, renderer, identity.headers)
        return
    jobs = await generate_all(call, plan)
    body = chat_completion_body(
        response_id=identity.response_id,
        created=created,
        model=model,
        jobs=jobs,
        echo=echo,
        tool_calls=tool_calls,
        logprobs=logprobs,
    )
    call.respond(200, body, (*JSON_HEADERS, *identity.headers))


def _tool_turns(
    ctx: ApiContext,
    request: ChatCompletionRequest,
    tools: list[ToolSpec],
    request_id: str,
    prompt_tokens: int,
    max_tokens: int | None,
    echo_text: str,
) -> list[TurnPlan] | None:
    """Each choice's tool calls or text, when tools may be called; else None (the
    generation flow plans text as for any request)."""
    choice = request.effective_tool_choice
    if not tools or choice == "none":
        return None
    return plan_choices(
        ctx,
        tools,
        choice,
        request_id=request_id,
        choices=request.choices_per_prompt,
        parallel_tool_calls=request.parallel_tool_calls is not False,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        ignore_eos=bool(request.ignore_eos),
        echo_text=echo_text,
    )


def register(router: Router) -> None:
    router.add("POST", "/v1/chat/completions", chat_completions)
