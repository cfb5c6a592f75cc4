"""POST /v1/chat/completions."""

from __future__ import annotations

from llmsim.api.chat_format import ChatStreamRenderer, chat_completion_body
from llmsim.api.context import Call
from llmsim.api.errors import JSON_HEADERS
from llmsim.api.generation import GenerationPlan, PromptPlan, RequestIdentity, generate_all, generate_stream
from llmsim.api.prompts import assistant_echo, chat_prompt_ids, check_context_length, last_user_text
from llmsim.api.requests import parse_chat_request
from llmsim.api.router import Router

__all__ = ["chat_completions", "register"]


async def chat_completions(call: Call) -> None:
    ctx = call.ctx
    request = parse_chat_request(call.json())
    model = ctx.resolve_model(request.model)
    prompt_ids = chat_prompt_ids(ctx.tokenizer, request.messages)
    max_tokens = request.requested_max_tokens
    check_context_length(
        ctx.config.max_model_len, len(prompt_ids), max_tokens, max_tokens_param=request.max_tokens_param
    )
    identity = RequestIdentity.of(call, "chatcmpl-")
    plan = GenerationPlan(
        request_id=identity.request_id,
        prompts=(PromptPlan(prompt_ids, last_user_text(request.messages)),),
        choices_per_prompt=request.choices_per_prompt,
        max_tokens=max_tokens,
        ignore_eos=bool(request.ignore_eos),
    )
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
        )
        await generate_stream(call, plan, renderer, identity.headers)
        return
    jobs = await generate_all(call, plan)
    body = chat_completion_body(response_id=identity.response_id, created=created, model=model, jobs=jobs, echo=echo)
    call.respond(200, body, (*JSON_HEADERS, *identity.headers))


def register(router: Router) -> None:
    router.add("POST", "/v1/chat/completions", chat_completions)
