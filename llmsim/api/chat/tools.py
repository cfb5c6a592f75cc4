"""Tool calling on /v1/chat/completions: the request's tools compiled, and what each
choice says — tool calls or text — planned before its job is built.

Each choice draws from its own RNG (the one its text would come from), so a request
is reproducible under ``--seed``: first the tool planner (:mod:`llmsim.model.tools`) decides the
calls (llm-d-inference-sim's rules for ``tool_choice``), then each call gets an id; a choice without calls
answers with text.  A choice's output pieces are its calls' arguments, token by token,
cut at the request's output cap like any text, and ended by the EOS token when they fit.

The finish reason is vLLM's ``resolve_finish_reason``
(vllm/entrypoints/serve/utils/tool_calls_utils.py:41-59): ``tool_calls`` for calls the
model ended itself, except under a named ``tool_choice``, which OpenAI reports as
``stop``; calls cut at the cap stay ``length``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

from llmsim.api.chat.request import ChatTool
from llmsim.api.context import ApiContext
from llmsim.api.errors import ApiError
from llmsim.api.plan import StructuredOutput, output_cap, plan_answer, plan_tool_calls
from llmsim.api.stops import StopRule, finish_turn
from llmsim.api.tool_support import planning_errors
from llmsim.api.turns import TurnPlan
from llmsim.model.text import FinishReason
from llmsim.model.tools import NamedToolChoice, ToolChoice, ToolSchemaError, ToolSpec
from llmsim.model.tools import plan_tool_calls as choose_calls

__all__ = ["plan_choices", "tool_call_id", "tool_specs"]


def tool_specs(tools: Sequence[ChatTool] | None) -> list[ToolSpec]:
    """The request's tools with compiled schemas; 400 naming the tool whose
    ``parameters`` llmsim cannot generate valid arguments for."""
    specs = []
    for i, tool in enumerate(tools or ()):
        path = f"tools[{i}].function.parameters"
        try:
            specs.append(ToolSpec.build(tool.function.name, tool.function.parameters, path=path))
        except ToolSchemaError as exc:
            raise ApiError(400, f"Tool validation failed for {tool.function.name!r}: {exc}", param=path) from None
    return specs


def tool_call_id(rng: random.Random) -> str:
    """``chatcmpl-tool-`` and 16 hex digits, as vLLM's ``make_tool_call_id``
    (vllm/renderers/chat_utils/tool_call.py:27-32: ``random_uuid()``, the low 64 bits
    of a uuid4 as 16 hex digits, vllm/utils/__init__.py:11-12)."""
    return f"chatcmpl-tool-{rng.getrandbits(64):016x}"


def plan_choices(
    ctx: ApiContext,
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    *,
    request_id: str,
    choices: int,
    parallel_tool_calls: bool,
    prompt_ids: Sequence[int],
    max_tokens: int | None,
    ignore_eos: bool,
    echo_text: str,
    min_tokens: int = 0,
    structured: StructuredOutput | None = None,
    stop: StopRule | None = None,
) -> list[TurnPlan]:
    """What each choice says: its tool calls (at most one without
    ``parallel_tool_calls``), or text when the planner chose none (satisfying
    ``structured`` when given, cut at a ``stop`` string or token)."""
    options = ctx.tool_calls
    cap = output_cap(ctx, len(prompt_ids), max_tokens)
    named = isinstance(choice, NamedToolChoice)
    plans = []
    for index in range(choices):
        rng = ctx.rng_for(request_id, index)
        with planning_errors():
            calls = choose_calls(tools, choice, rng, options=options)[: None if parallel_tool_calls else 1]
        if calls:
            turn = plan_tool_calls(ctx, [(call.name, tool_call_id(rng), call.arguments) for call in calls], cap)
            if named and turn.finish_reason == FinishReason.TOOL_CALLS:
                turn = attrs.evolve(turn, finish_reason=FinishReason.STOP)
        else:
            turn = plan_answer(
                ctx,
                rng,
                structured,
                prompt_tokens=len(prompt_ids),
                max_tokens=max_tokens,
                cap=cap,
                ignore_eos=ignore_eos,
                echo_text=echo_text,
                min_tokens=min_tokens,
                prompt_ids=prompt_ids,
            )
        plans.append(finish_turn(ctx, turn, cap, stop))
    return plans
