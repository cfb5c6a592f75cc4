"""What a request's choices say, planned before any of them is submitted.

Every generating endpoint turns its request into one :class:`GenerationPlan`: the
prompts, and per choice a :class:`TurnPlan` — a flat sequence of output pieces (one per
token, what the engine paces) with their token ids and finish reason, cut into
:class:`Block` s: one text block, or one block per tool call whose pieces are the
call's arguments JSON.  The renderers of each family read the blocks; the engine only
sees the pieces (:func:`llmsim.api.generation.build_jobs`).

Text comes from the text generator (random corpus or echo) through the choice's own
RNG, so a request is reproducible under ``--seed``; tool-call arguments and
``json_schema`` output come from the schema generator, so they validate against their
schema.  The request's output cap (clamped to the context window) cuts any plan short,
with finish reason ``length``.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence

import attrs

from llmsim.api.context import ApiContext
from llmsim.model.text import FinishReason

__all__ = [
    "TEXT",
    "TOOL_CALL",
    "Block",
    "GenerationPlan",
    "PromptPlan",
    "TurnPlan",
    "cut_at_stop",
    "output_cap",
    "plan_fixed_text",
    "plan_text",
    "plan_text_choices",
    "plan_tool_calls",
]

TEXT = "text"
TOOL_CALL = "tool_call"


@attrs.frozen
class Block:
    """Pieces ``start:stop`` of a turn: text, or the arguments of one tool call."""

    kind: str = attrs.field(validator=attrs.validators.in_((TEXT, TOOL_CALL)))
    start: int
    stop: int
    name: str = ""  # the tool's name (tool calls)
    call_id: str = ""  # the call's id (tool calls)


@attrs.frozen
class TurnPlan:
    """What one choice says: one piece and one token id per token, cut into blocks."""

    pieces: tuple[str, ...]
    token_ids: tuple[int, ...] = attrs.field()
    finish_reason: str  # "stop", "length" or "tool_calls"
    blocks: tuple[Block, ...]

    @token_ids.validator
    def _one_id_per_piece(self, _: attrs.Attribute[tuple[int, ...]], token_ids: tuple[int, ...]) -> None:
        if len(token_ids) != len(self.pieces):
            raise ValueError(f"{len(self.pieces)} pieces but {len(token_ids)} token ids")

    @property
    def truncated(self) -> bool:
        return self.finish_reason == FinishReason.LENGTH

    @property
    def tool_calls(self) -> tuple[Block, ...]:
        """The tool-call blocks (none: the turn answers with text)."""
        return tuple(block for block in self.blocks if block.kind == TOOL_CALL)

    def block_text(self, block: Block) -> str:
        return "".join(self.pieces[block.start : block.stop])


@attrs.frozen
class PromptPlan:
    """One prompt of a request, as the jobs answering it need it."""

    token_ids: Sequence[int]
    output_cap: int  # the most tokens an answer may have: the request's cap within the context window


@attrs.frozen
class GenerationPlan:
    """A request's choices, each planned: choice ``i`` says ``choices[i]`` in answer to
    ``prompts[i // choices_per_prompt]``."""

    request_id: str
    prompts: Sequence[PromptPlan]
    choices: Sequence[TurnPlan] = attrs.field()
    choices_per_prompt: int = 1

    @choices.validator
    def _every_prompt_answered(self, _: attrs.Attribute[Sequence[TurnPlan]], choices: Sequence[TurnPlan]) -> None:
        if len(choices) != len(self.prompts) * self.choices_per_prompt:
            raise ValueError(
                f"{len(choices)} choices for {len(self.prompts)} prompts of {self.choices_per_prompt} choices each"
            )

    @classmethod
    def single(cls, request_id: str, prompt: PromptPlan, turn: TurnPlan) -> GenerationPlan:
        """A request with one prompt and one choice (/v1/responses, /v1/messages)."""
        return cls(request_id, (prompt,), (turn,))


def output_cap(ctx: ApiContext, prompt_tokens: int, max_tokens: int | None) -> int:
    """The most tokens an answer may have: the request's cap within the context window."""
    room = ctx.model.max_model_len - prompt_tokens
    return room if max_tokens is None else min(max_tokens, room)


@functools.lru_cache(maxsize=1024)
def _text_blocks(length: int) -> tuple[Block, ...]:
    """The blocks of a text turn of ``length`` pieces (frozen, so shared by every turn that long)."""
    return (Block(TEXT, 0, length),)


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
    return TurnPlan(text.pieces, text.token_ids, text.finish_reason, _text_blocks(len(text.pieces)))


def plan_text_choices(
    ctx: ApiContext,
    request_id: str,
    prompts: Sequence[tuple[int, str]],
    *,
    choices_per_prompt: int,
    max_tokens: int | None,
    ignore_eos: bool,
) -> list[TurnPlan]:
    """Text for every choice of a request, in choice-index order: ``choices_per_prompt``
    answers to each ``(prompt_tokens, echo_text)``, choice ``i`` from its own RNG."""
    turns = []
    index = 0
    for prompt_tokens, echo_text in prompts:
        for _ in range(choices_per_prompt):
            rng = ctx.rng_for(request_id, index)
            turns.append(
                plan_text(
                    ctx,
                    rng,
                    prompt_tokens=prompt_tokens,
                    max_tokens=max_tokens,
                    ignore_eos=ignore_eos,
                    echo_text=echo_text,
                )
            )
            index += 1
    return turns


def plan_fixed_text(ctx: ApiContext, text: str, cap: int) -> TurnPlan:
    """A text turn that says exactly ``text`` (structured output), cut at ``cap`` tokens."""
    pieces, ids = _split(ctx, text)
    finish = FinishReason.STOP
    if len(pieces) > cap:
        pieces, ids, finish = pieces[:cap], ids[:cap], FinishReason.LENGTH
    return TurnPlan(pieces, ids, finish, _text_blocks(len(pieces)))


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
    return TurnPlan(tuple(pieces), plan.token_ids[:kept], FinishReason.STOP, _text_blocks(kept)), sequence


def _split(ctx: ApiContext, text: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``text`` as one piece per token (the pieces concatenate back to ``text``)."""
    pieces = tuple(ctx.tokenizer.tokenize(text))
    ids = tuple(ctx.tokenizer.encode(text))
    if len(ids) != len(pieces):  # a tokenizer whose offsets merge tokens: keep the counts equal
        ids = ids[: len(pieces)] + (0,) * (len(pieces) - len(ids))
    return pieces, ids
