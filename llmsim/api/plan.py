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

On chat and completions a turn the model ends itself ends as in vLLM, with its EOS
token (:func:`with_eos`): one more piece, of empty text, after the last text token.
The engine paces it like any token, so its chunk (empty text, the finish reason) goes
out one inter-token latency after the last text; usage counts it; the text leaves it
out.

Structured output (chat's ``response_format`` and vLLM's ``structured_outputs``,
``text.format`` on /v1/responses) is a :class:`StructuredOutput`: :func:`plan_structured`
plans the text that satisfies it — schema-valid JSON, a string the regex fully matches,
one of the choices — token by token, cut at the cap like any text.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Sequence

import attrs

from llmsim.api.context import ApiContext
from llmsim.api.errors import ApiError
from llmsim.api.tool_support import planning_errors
from llmsim.model.text import FinishReason
from llmsim.model.tools import CompiledSchema, arguments_json
from llmsim.schema.regex import StringPattern

__all__ = [
    "TEXT",
    "TOOL_CALL",
    "Block",
    "GenerationPlan",
    "PromptPlan",
    "StructuredOutput",
    "TurnPlan",
    "check_min_tokens",
    "cut_at_stop",
    "output_cap",
    "plan_answer",
    "plan_fixed_text",
    "plan_structured",
    "plan_text",
    "plan_text_choices",
    "plan_tool_calls",
    "with_eos",
]

TEXT = "text"
TOOL_CALL = "tool_call"

JSON = "json"
JSON_OBJECT = "json_object"
REGEX = "regex"
CHOICE = "choice"
_JSON_OBJECT_OVERHEAD = 8  # tokens of '{"response": ""}' around a json_object's text


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


@attrs.frozen
class StructuredOutput:
    """A constraint on a text turn: ``json`` (a compiled schema), ``json_object`` (any
    JSON object), ``regex`` (the whole text matches it) or ``choice`` (one of the strings)."""

    kind: str = attrs.field(validator=attrs.validators.in_((JSON, JSON_OBJECT, REGEX, CHOICE)))
    schema: CompiledSchema | None = None
    pattern: StringPattern | None = None
    choices: tuple[str, ...] = ()


def output_cap(ctx: ApiContext, prompt_tokens: int, max_tokens: int | None) -> int:
    """The most tokens an answer may have: the request's cap within the context window."""
    room = ctx.model.max_model_len - prompt_tokens
    return room if max_tokens is None else min(max_tokens, room)


def check_min_tokens(min_tokens: int, cap: int) -> None:
    """400 with vLLM's messages (``SamplingParams._verify_args``, sampling_params.py:697-705)
    when ``min_tokens`` is negative or above the output cap (vLLM checks it against
    max_tokens once clamped to the context window, and names that value)."""
    if min_tokens < 0:
        raise ApiError(400, f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if min_tokens > cap:
        raise ApiError(400, f"min_tokens must be less than or equal to max_tokens={cap}, got {min_tokens}.")


def with_eos(ctx: ApiContext, turn: TurnPlan, cap: int) -> TurnPlan:
    """``turn`` ended as vLLM's engine ends a turn the model finished itself: with its
    EOS token, one more piece (empty text, the EOS id) that the engine paces like any
    token and usage counts (vllm/v1/engine/detokenizer.py:107-128 keeps the id, not
    its text).  A turn cut at the cap has none; a finished turn that fills the cap
    exactly has no room left for it, so the engine stops it on ``length``."""
    if turn.truncated:
        return turn
    if len(turn.pieces) >= cap:
        return attrs.evolve(turn, finish_reason=FinishReason.LENGTH)
    eos = ctx.text.eos
    return TurnPlan((*turn.pieces, ""), (*turn.token_ids, eos.token_id), turn.finish_reason, turn.blocks)


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
    min_tokens: int = 0,
) -> TurnPlan:
    """A text turn from the text generator (its length rules, its finish reason)."""
    text = ctx.text.generate(
        rng,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        prompt_tokens=prompt_tokens,
        echo_text=echo_text,
        min_tokens=min_tokens,
    )
    return TurnPlan(text.pieces, text.token_ids, text.finish_reason, _text_blocks(len(text.pieces)))


def plan_answer(
    ctx: ApiContext,
    rng: random.Random,
    structured: StructuredOutput | None,
    *,
    prompt_tokens: int,
    max_tokens: int | None,
    cap: int,
    ignore_eos: bool,
    echo_text: str,
    min_tokens: int,
) -> TurnPlan:
    """A choice's answer in text: constrained by ``structured`` when the request asks for
    structured output, else free text (with its length rules and ``min_tokens``)."""
    if structured is not None:
        return plan_structured(
            ctx, rng, structured, prompt_tokens=prompt_tokens, cap=cap, ignore_eos=ignore_eos, echo_text=echo_text
        )
    return plan_text(
        ctx,
        rng,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        echo_text=echo_text,
        min_tokens=min_tokens,
    )


def plan_text_choices(
    ctx: ApiContext,
    request_id: str,
    prompts: Sequence[tuple[int, str]],
    *,
    choices_per_prompt: int,
    max_tokens: int | None,
    ignore_eos: bool,
    min_tokens: int = 0,
    structured: StructuredOutput | None = None,
) -> list[TurnPlan]:
    """Text for every choice of a chat or completions request, in choice-index order:
    ``choices_per_prompt`` answers to each ``(prompt_tokens, echo_text)``, choice ``i``
    from its own RNG, each ended by its EOS token when the model stops it (:func:`with_eos`)."""
    turns = []
    for prompt_index, (prompt_tokens, echo_text) in enumerate(prompts):
        cap = output_cap(ctx, prompt_tokens, max_tokens)
        for k in range(choices_per_prompt):
            if cap < 1:  # no room at all: only completions' echo without generation gets here
                turns.append(TurnPlan((), (), FinishReason.LENGTH, _text_blocks(0)))
                continue
            rng = ctx.rng_for(request_id, prompt_index * choices_per_prompt + k)
            turn = plan_answer(
                ctx,
                rng,
                structured,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                cap=cap,
                ignore_eos=ignore_eos,
                echo_text=echo_text,
                min_tokens=min_tokens,
            )
            turns.append(with_eos(ctx, turn, cap))
    return turns


def plan_fixed_text(ctx: ApiContext, text: str, cap: int) -> TurnPlan:
    """A text turn that says exactly ``text`` (structured output), cut at ``cap`` tokens."""
    pieces, ids = _split(ctx, text)
    finish = FinishReason.STOP
    if len(pieces) > cap:
        pieces, ids, finish = pieces[:cap], ids[:cap], FinishReason.LENGTH
    return TurnPlan(pieces, ids, finish, _text_blocks(len(pieces)))


def plan_structured(
    ctx: ApiContext,
    rng: random.Random,
    structured: StructuredOutput,
    *,
    prompt_tokens: int,
    cap: int,
    ignore_eos: bool,
    echo_text: str,
) -> TurnPlan:
    """A text turn that satisfies ``structured``, drawn from ``rng``, cut at ``cap``
    tokens (finish ``length``); a complete one finishes ``stop`` (its EOS is the
    caller's :func:`with_eos`)."""
    if structured.kind == JSON:
        assert structured.schema is not None
        with planning_errors():  # an accepted schema that admits no value: a 400
            text = arguments_json(structured.schema.generate(rng, ctx.tool_calls))
    elif structured.kind == REGEX:
        assert structured.pattern is not None
        text = structured.pattern.generate(rng, rng.choice(structured.pattern.lengths(0, None)))
    elif structured.kind == CHOICE:
        text = rng.choice(structured.choices)
    else:  # any JSON object: the random text as its one string
        budget = max(1, cap - _JSON_OBJECT_OVERHEAD)
        inner = plan_text(
            ctx, rng, prompt_tokens=prompt_tokens, max_tokens=budget, ignore_eos=ignore_eos, echo_text=echo_text
        )
        text = json.dumps({"response": "".join(inner.pieces)}, ensure_ascii=False)
    return plan_fixed_text(ctx, text, cap)


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
