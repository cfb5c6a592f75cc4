"""One assistant turn of /v1/responses or /v1/messages, planned before it is submitted.

A turn is a flat sequence of output pieces (one per token, what the engine paces) cut
into blocks: one text block, or one block per tool call whose pieces are the call's
arguments JSON.  Text comes from the text generator (random corpus or echo); tool-call
arguments and ``json_schema`` output come from the engine's schema generator, so they
validate against their schema.  The request's output cap (``max_output_tokens`` /
``max_tokens``, clamped to the context window) cuts any plan short, with finish
reason ``length``.

Also here: the conversation as the chat template sees it, for prompt token counts.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

import attrs

from llmsim.api.context import ApiContext
from llmsim.engine.job import Job, JobSink
from llmsim.model.text import FinishReason
from llmsim.model.tokenizer import ChatTurn

__all__ = [
    "MEDIA",
    "TEXT",
    "TOOL_CALL",
    "Block",
    "TurnPlan",
    "cut_at_stop",
    "make_job",
    "output_cap",
    "plan_fixed_text",
    "plan_text",
    "plan_tool_calls",
    "prompt_ids",
    "tool_call_text",
    "tools_turn",
]

TEXT = "text"
TOOL_CALL = "tool_call"

#: What a non-text input block contributes to the prompt (as chat's placeholders do).
MEDIA = {"image": "<image>", "audio": "<audio>", "video": "<video>", "file": "<file>"}


@attrs.frozen
class Block:
    """Pieces ``start:stop`` of a turn: text, or the arguments of one tool call."""

    kind: str
    start: int
    stop: int
    name: str = ""  # the tool's name (tool calls)
    call_id: str = ""  # the call's id (tool calls)


@attrs.frozen
class TurnPlan:
    pieces: tuple[str, ...]
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop", "length" or "tool_calls"
    blocks: tuple[Block, ...]

    @property
    def truncated(self) -> bool:
        return self.finish_reason == FinishReason.LENGTH

    def block_text(self, block: Block) -> str:
        return "".join(self.pieces[block.start : block.stop])


def output_cap(ctx: ApiContext, prompt_tokens: int, max_tokens: int | None) -> int:
    """The most tokens this turn may have: the request's cap within the context window."""
    room = ctx.config.max_model_len - prompt_tokens
    return room if max_tokens is None else min(max_tokens, room)


def plan_text(
    ctx: ApiContext,
    rng: random.Random,
    *,
    prompt_tokens: int,
    max_tokens: int | None,
    ignore_eos: bool,
    echo_text: str,
) -> TurnPlan:
    """A text turn from the text generator (its length rules, its finish reason)."""
    text = ctx.text.generate(
        rng, max_tokens=max_tokens, ignore_eos=ignore_eos, prompt_tokens=prompt_tokens, echo_text=echo_text
    )
    return TurnPlan(text.pieces, text.token_ids, text.finish_reason, (Block(TEXT, 0, len(text.pieces)),))


def plan_fixed_text(ctx: ApiContext, text: str, cap: int) -> TurnPlan:
    """A text turn that says exactly ``text`` (structured output), cut at ``cap`` tokens."""
    pieces, ids = _split(ctx, text)
    finish = FinishReason.STOP
    if len(pieces) > cap:
        pieces, ids, finish = pieces[:cap], ids[:cap], FinishReason.LENGTH
    return TurnPlan(pieces, ids, finish, (Block(TEXT, 0, len(pieces)),))


def plan_tool_calls(ctx: ApiContext, calls: Sequence[tuple[str, str, str]], cap: int) -> TurnPlan:
    """A turn of tool calls, each ``(name, call_id, arguments_json)``, cut at ``cap``
    tokens (a cut call keeps its partial arguments; later calls are dropped)."""
    pieces: list[str] = []
    ids: list[int] = []
    blocks = []
    for name, call_id, arguments in calls:
        call_pieces, call_ids = _split(ctx, arguments)
        blocks.append(Block(TOOL_CALL, len(pieces), len(pieces) + len(call_pieces), name, call_id))
        pieces.extend(call_pieces)
        ids.extend(call_ids)
    if len(pieces) <= cap:
        return TurnPlan(tuple(pieces), tuple(ids), FinishReason.TOOL_CALLS, tuple(blocks))
    kept = tuple(attrs.evolve(b, stop=min(b.stop, cap)) for b in blocks if b.start < cap)
    return TurnPlan(tuple(pieces[:cap]), tuple(ids[:cap]), FinishReason.LENGTH, kept)


def cut_at_stop(plan: TurnPlan, sequences: Sequence[str]) -> tuple[TurnPlan, str | None]:
    """A text turn cut before the first stop sequence it contains (the sequence itself
    is not output), and that sequence; the plan unchanged and None when none occurs."""
    if not sequences or len(plan.blocks) != 1 or plan.blocks[0].kind != TEXT:
        return plan, None
    text = "".join(plan.pieces)
    found = [(at, -len(seq), seq) for seq in sequences if seq and (at := text.find(seq)) >= 0]
    if not found:
        return plan, None
    cut, _, sequence = min(found)
    pieces: list[str] = []
    length = 0
    for piece in plan.pieces:
        if length >= cut:
            break
        pieces.append(piece[: cut - length])
        length += len(piece)
    kept = len(pieces)
    return TurnPlan(tuple(pieces), plan.token_ids[:kept], FinishReason.STOP, (Block(TEXT, 0, kept),)), sequence


def _split(ctx: ApiContext, text: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``text`` as one piece per token (the pieces concatenate back to ``text``)."""
    pieces = tuple(ctx.tokenizer.tokenize(text))
    ids = tuple(ctx.tokenizer.encode(text))
    if len(ids) != len(pieces):  # a tokenizer whose offsets merge tokens: keep the counts equal
        ids = ids[: len(pieces)] + (0,) * (len(pieces) - len(ids))
    return pieces, ids


def make_job(plan: TurnPlan, prompt: Sequence[int], sink: JobSink, *, request_id: str, cap: int) -> Job:
    return Job(
        prompt_token_ids=prompt,
        output=plan.pieces,
        finish_reason=plan.finish_reason,
        sink=sink,
        output_token_ids=plan.token_ids,
        index=0,
        request_id=request_id,
        max_tokens=cap,
    )


# --- the prompt --------------------------------------------------------------------------


def prompt_ids(ctx: ApiContext, turns: Sequence[ChatTurn]) -> list[int]:
    """Token ids of a conversation: chat template applied, generation prompt added."""
    tokenizer = ctx.tokenizer
    return tokenizer.encode(tokenizer.apply_chat_template(turns))


def tools_turn(definitions: Sequence[dict[str, object]]) -> ChatTurn:
    """The tool definitions as a system turn: real chat templates put them in the
    prompt, so they cost input tokens."""
    listing = "\n".join(json.dumps(definition, ensure_ascii=False) for definition in definitions)
    return ChatTurn("system", f"# Tools\n<tools>\n{listing}\n</tools>")


def tool_call_text(name: str, arguments: str) -> str:
    """An earlier tool call, as a Hermes-style template writes it into the prompt."""
    return f'<tool_call>\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {arguments}}}\n</tool_call>'
