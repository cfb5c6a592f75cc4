"""What a request's choices say, planned before any of them is submitted.

Every generating endpoint turns its request into one :class:`GenerationPlan`: the
prompts, and per choice a :class:`~llmsim.api.turns.TurnPlan` (:mod:`llmsim.api.turns`)
— a flat sequence of output pieces (one per token, what the engine paces) with their
token ids and finish reason, cut into blocks: one text block, or one block per tool
call whose pieces are the call's arguments JSON.  The renderers of each family read the
blocks; the engine only sees the pieces (:func:`llmsim.api.generation.build_jobs`).

Text comes from the text generator (random corpus or echo) through the choice's own
RNG, so a request is reproducible under ``--seed``; tool-call arguments and
``json_schema`` output come from the schema generator, so they validate against their
schema.  The request's output cap (clamped to the context window) cuts any plan short,
with finish reason ``length``.  How a text turn otherwise ends — its EOS token, a stop
string or stop token — is :mod:`llmsim.api.stops`.

Structured output (chat's ``response_format`` and vLLM's ``structured_outputs``,
``text.format`` on /v1/responses) is a :class:`StructuredOutput`: :func:`plan_structured`
plans the text that satisfies it — schema-valid JSON, a string the regex fully matches,
one of the choices — token by token, cut at the cap like any text.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable, Sequence

import attrs

from llmsim.api.context import ApiContext
from llmsim.api.errors import ApiError
from llmsim.api.request_fields import GenerationParams
from llmsim.api.stops import StopRule, finish_turn, stop_rule
from llmsim.api.tool_support import planning_errors
from llmsim.api.turns import TOOL_CALL, Block, TurnPlan, text_blocks
from llmsim.engine.job import Job
from llmsim.engine.kv_hashing import MultimodalItem
from llmsim.model.drawn import EAGER_UP_TO
from llmsim.model.text import FinishReason
from llmsim.model.tools import CompiledSchema, arguments_json
from llmsim.schema.regex import StringPattern

__all__ = [
    "GenerationPlan",
    "GenerationShape",
    "PromptPlan",
    "StructuredOutput",
    "as_emitted",
    "check_min_tokens",
    "output_cap",
    "plan_answer",
    "plan_fixed_text",
    "plan_structured",
    "plan_text",
    "plan_text_choices",
    "plan_tool_calls",
    "stop_reason_of_job",
]

JSON = "json"
JSON_OBJECT = "json_object"
REGEX = "regex"
CHOICE = "choice"
_JSON_OBJECT_OVERHEAD = 8  # tokens of '{"response": ""}' around a json_object's text
#: Finish reasons of jobs the engine ended before their plan ran out.
_ENDED_EARLY = (FinishReason.ABORT, FinishReason.CACHE_THRESHOLD)


@attrs.frozen
class GenerationShape:
    """The generation fields a chat or completions handler reads, read once per body
    (the route keeps it on its body-cache entry) rather than through a request property
    per request."""

    stop: StopRule | None
    choices: int  # per prompt
    max_tokens: int | None
    ignore_eos: bool
    min_tokens: int
    streaming: bool
    include_usage: bool
    continuous_usage: bool

    @classmethod
    def of(cls, request: GenerationParams, *, max_tokens: int | None) -> GenerationShape:
        return cls(
            stop=stop_rule(request),
            choices=request.choices_per_prompt,
            max_tokens=max_tokens,
            ignore_eos=bool(request.ignore_eos),
            min_tokens=request.min_tokens or 0,
            streaming=request.streaming,
            include_usage=request.include_usage,
            continuous_usage=request.continuous_usage,
        )


@attrs.frozen
class PromptPlan:
    """One prompt of a request, as the jobs answering it need it."""

    token_ids: Sequence[int]
    output_cap: int  # the most tokens an answer may have: the request's cap within the context window
    remote_prefill: bool = False  # P/D decode side (kv_transfer_params.do_remote_prefill): TTFT is the KV transfer
    cache_hit_threshold: float | None = None  # the engine's admission gate (llmsim/api/transfer.py)
    kv_multimodal: tuple[MultimodalItem, ...] = ()  # its media, for its KV block keys (render/features.py)


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


def plan_text(
    ctx: ApiContext,
    rng: random.Random,
    *,
    prompt_tokens: int,
    max_tokens: int | None,
    ignore_eos: bool,
    echo_text: str,
    min_tokens: int = 0,
    prompt_ids: Sequence[int] = (),
    lazy: Callable[[], random.Random] | None = None,
) -> TurnPlan:
    """A text turn from the text generator (its length rules, its finish reason;
    ``prompt_ids`` pick the answer in dataset mode); an encoder pod's ``"!"`` turn with
    ``--mm-encoder-only``.  ``lazy`` makes ``rng`` afresh, and nothing is drawn from
    ``rng`` after this: a long text may be drawn as the engine hands it out
    (``TextGenerator.generate``)."""
    if ctx.engine.options.mm_encoder_only:
        return _encoder_only_turn(ctx, prompt_tokens, max_tokens)
    text = ctx.text.generate(
        rng,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        prompt_tokens=prompt_tokens,
        echo_text=echo_text,
        min_tokens=min_tokens,
        prompt_ids=prompt_ids,
        lazy=lazy,
    )
    return TurnPlan(text.pieces, text.token_ids, text.finish_reason, text_blocks(len(text.pieces)))


def _encoder_only_turn(ctx: ApiContext, prompt_tokens: int, max_tokens: int | None) -> TurnPlan:
    """An encoder pod's answer: ``"!"`` once per ``max_tokens`` (once when unset), within
    the room the prompt leaves, finish ``length`` (llm-d-inference-sim's
    ``MMEncoderOnlyDataset``, pkg/dataset/dataset.go:69-111)."""
    count = max(0, min(1 if max_tokens is None else max_tokens, ctx.model.max_model_len - prompt_tokens))
    token_id = ctx.tokenizer.encode("!")[0]
    return TurnPlan(("!",) * count, (token_id,) * count, FinishReason.LENGTH, text_blocks(count))


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
    prompt_ids: Sequence[int] = (),
    lazy: Callable[[], random.Random] | None = None,
) -> TurnPlan:
    """A choice's answer in text: constrained by ``structured`` when the request asks for
    structured output, else free text (with its length rules and ``min_tokens``;
    ``lazy``: see :func:`plan_text`)."""
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
        prompt_ids=prompt_ids,
        lazy=lazy,
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
    stop: StopRule | None = None,
    prompt_ids: Sequence[Sequence[int]] = (),
) -> list[TurnPlan]:
    """Text for every choice of a chat or completions request, in choice-index order:
    ``choices_per_prompt`` answers to each ``(prompt_tokens, echo_text)``, choice ``i``
    from its own RNG, each cut at a stop string or ended by its EOS token when the model
    stops it (:func:`finish_turn`).  ``prompt_ids``: each prompt's token ids, which pick
    its answers in dataset mode."""
    turns = []
    for prompt_index, (prompt_tokens, echo_text) in enumerate(prompts):
        cap = output_cap(ctx, prompt_tokens, max_tokens)
        for k in range(choices_per_prompt):
            if cap < 1:  # no room at all: only completions' echo without generation gets here
                turns.append(TurnPlan((), (), FinishReason.LENGTH, text_blocks(0)))
                continue
            index = prompt_index * choices_per_prompt + k
            rng = ctx.rng_for(request_id, index)
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
                prompt_ids=prompt_ids[prompt_index] if prompt_ids else (),
                # rng is dropped after this: a long text may be drawn as it is read
                lazy=functools.partial(ctx.rng_for, request_id, index) if cap > EAGER_UP_TO else None,
            )
            turns.append(finish_turn(ctx, turn, cap, stop))
    return turns


def plan_fixed_text(ctx: ApiContext, text: str, cap: int) -> TurnPlan:
    """A text turn that says exactly ``text`` (structured output), cut at ``cap`` tokens."""
    pieces, ids = _split(ctx, text)
    finish = FinishReason.STOP
    if len(pieces) > cap:
        pieces, ids, finish = pieces[:cap], ids[:cap], FinishReason.LENGTH
    return TurnPlan(pieces, ids, finish, text_blocks(len(pieces)))


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
    caller's :func:`~llmsim.api.stops.with_eos`)."""
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


def as_emitted(turn: TurnPlan, emitted: int, finish_reason: str) -> TurnPlan:
    """``turn`` as far as its job got: ``turn`` itself, unless the engine ended the job
    early (sleep ``mode=abort``, :mod:`llmsim.engine.pause`); then its first ``emitted``
    pieces, finished with ``finish_reason`` and no stop reason (a non-streaming body
    shows what was generated until the abort), or unadmitted (``cache_threshold``: nothing).
    The first block stays, maybe empty."""
    if finish_reason not in _ENDED_EARLY:
        return turn
    kept = tuple(attrs.evolve(b, stop=min(b.stop, emitted)) for b in turn.blocks if b.start < emitted)
    whole = None if turn.whole_tokens is None else turn.whole_tokens[:emitted]
    return TurnPlan(
        turn.pieces[:emitted],
        turn.token_ids[:emitted],
        finish_reason,
        kept or tuple(attrs.evolve(b, stop=b.start) for b in turn.blocks[:1]),
        whole_tokens=whole,
    )


def stop_reason_of_job(job: Job, stop_reasons: Sequence[str | int | None]) -> str | int | None:
    """The stop string or token id that ended ``job``'s choice: none when an abort ended
    it first (vLLM's abort output carries none, vllm/v1/engine/core.py:2246-2257), or a
    cache-hit threshold before it began."""
    return None if job.finish_reason in _ENDED_EARLY else stop_reasons[job.index]


def _split(ctx: ApiContext, text: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``text`` as one piece per token (the pieces concatenate back to ``text``)."""
    pieces = tuple(ctx.tokenizer.tokenize(text))
    ids = tuple(ctx.tokenizer.encode(text))
    if len(ids) != len(pieces):  # a tokenizer whose offsets merge tokens: keep the counts equal
        ids = ids[: len(pieces)] + (0,) * (len(pieces) - len(ids))
    return pieces, ids
