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

On every endpoint a turn the model ends itself ends as in vLLM, with its EOS token
(:func:`with_eos`): one more piece, of empty text, after the last text token.  The
engine paces it like any token, so its chunk (empty text, the finish reason) goes out
one inter-token latency after the last text (/v1/responses and /v1/messages send no
event for it: their closing events go out then); usage counts it; the text leaves it
out.

A request's ``stop`` strings and ``stop_token_ids`` (:class:`StopRule`) cut a text turn
where vLLM's detokenizer would stop it (:func:`finish_turn`): at the token that
completes the first stop string, or at a stop token, with finish reason ``stop`` and
the matched string or id as ``stop_reason``; that token counts, no EOS follows.  On a
stream the text is then spread over the tokens as vLLM streams it, each chunk holding
back the characters that could begin a stop string; the turn keeps each token's own
text (:attr:`TurnPlan.token_texts`) for the logprobs, which name whole tokens.

Structured output (chat's ``response_format`` and vLLM's ``structured_outputs``,
``text.format`` on /v1/responses) is a :class:`StructuredOutput`: :func:`plan_structured`
plans the text that satisfies it — schema-valid JSON, a string the regex fully matches,
one of the choices — token by token, cut at the cap like any text.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
from collections.abc import Sequence

import attrs

from llmsim.api.context import ApiContext
from llmsim.api.errors import ApiError
from llmsim.api.request_fields import GenerationParams
from llmsim.api.tool_support import planning_errors
from llmsim.engine.job import Job
from llmsim.model.text import FinishReason
from llmsim.model.tools import CompiledSchema, arguments_json
from llmsim.schema.regex import StringPattern

__all__ = [
    "TEXT",
    "TOOL_CALL",
    "Block",
    "GenerationPlan",
    "PromptPlan",
    "StopRule",
    "StructuredOutput",
    "TurnPlan",
    "as_emitted",
    "check_min_tokens",
    "finish_turn",
    "hold_back",
    "output_cap",
    "plan_answer",
    "plan_fixed_text",
    "plan_structured",
    "plan_text",
    "plan_text_choices",
    "plan_tool_calls",
    "stop_reason_of_job",
    "stop_rule",
    "stop_turn",
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
    stop_reason: str | int | None = None  # the stop string or stop token id that ended the turn
    #: each token's own text where the pieces (what a stream sends per token) differ from
    #: it: text held back or cut at a stop (:func:`hold_back`, :func:`stop_turn`)
    whole_tokens: tuple[str, ...] | None = None

    @token_ids.validator
    def _one_id_per_piece(self, _: attrs.Attribute[tuple[int, ...]], token_ids: tuple[int, ...]) -> None:
        if len(token_ids) != len(self.pieces):
            raise ValueError(f"{len(self.pieces)} pieces but {len(token_ids)} token ids")

    @property
    def truncated(self) -> bool:
        return self.finish_reason == FinishReason.LENGTH

    @property
    def token_texts(self) -> tuple[str, ...]:
        """Each token's own text, as logprobs name it (vLLM decodes the token id, not the
        streamed text: vllm/entrypoints/generate/base/serving.py:302-319)."""
        return self.pieces if self.whole_tokens is None else self.whole_tokens

    @property
    def ends_with_eos(self) -> bool:
        """Whether the turn's last piece is its EOS token (:func:`with_eos`), which lies
        after its blocks."""
        return bool(self.blocks) and len(self.pieces) > self.blocks[-1].stop

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
    remote_prefill: bool = False  # P/D decode side (kv_transfer_params.do_remote_prefill): TTFT is the KV transfer


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
    exactly has no room left for it, so the engine stops it on ``length``.  A turn a
    stop string or stop token ended has none either."""
    if turn.truncated or turn.stop_reason is not None:
        return turn
    if len(turn.pieces) >= cap:
        return attrs.evolve(turn, finish_reason=FinishReason.LENGTH)
    eos = ctx.text.eos
    whole = None if turn.whole_tokens is None else (*turn.whole_tokens, "")
    return attrs.evolve(turn, pieces=(*turn.pieces, ""), token_ids=(*turn.token_ids, eos.token_id), whole_tokens=whole)


@attrs.frozen
class StopRule:
    """What ends a text turn besides its EOS and its cap: vLLM's ``stop`` strings and
    ``stop_token_ids``, looked for from token ``min_tokens`` on, and whether the
    matched string stays in the text (``include_stop_str_in_output``).  ``streaming``:
    the turn goes out as a stream, whose chunks hold back the end of the text (with
    logprobs too: their entries name each whole token, :attr:`TurnPlan.token_texts`,
    while the text lags, as vLLM's do)."""

    strings: tuple[str, ...] = ()
    token_ids: frozenset[int] = frozenset()
    include_in_output: bool = False
    min_tokens: int = 0
    streaming: bool = False

    @property
    def held_back(self) -> int:
        """How many characters a stream holds back while a stop string could still be
        forming (vllm/v1/engine/detokenizer.py:85-90)."""
        if not self.streaming or not self.strings or self.include_in_output:
            return 0
        return max(map(len, self.strings)) - 1


def stop_rule(request: GenerationParams) -> StopRule | None:
    """The stop conditions a chat or completions request sets (None: only EOS and the cap)."""
    if not request.stop_strings and not request.stop_token_ids:
        return None
    return StopRule(
        request.stop_strings,
        frozenset(request.stop_token_ids or ()),
        bool(request.include_stop_str_in_output),
        request.min_tokens or 0,
        request.streaming,
    )


def finish_turn(ctx: ApiContext, turn: TurnPlan, cap: int, stop: StopRule | None = None) -> TurnPlan:
    """A chat or completions turn as the engine ends it: cut at its first stop string or
    stop token (:func:`stop_turn`), else ended by its EOS (:func:`with_eos`); on a
    stream its text spread over its tokens as vLLM streams it (:func:`hold_back`)."""
    if stop is None:
        return with_eos(ctx, turn, cap)
    stopped = stop_turn(turn, stop)
    if stopped.stop_reason is not None:
        return stopped
    return hold_back(with_eos(ctx, turn, cap), stop.held_back)


def stop_turn(turn: TurnPlan, stop: StopRule) -> TurnPlan:
    """A text turn cut where vLLM's detokenizer stops it, one token at a time
    (vllm/v1/engine/detokenizer.py:96-155): at a token of ``stop.token_ids`` (its text
    left out unless ``include_in_output``; ``stop_reason`` the id, vllm/v1/core/sched/
    utils.py:109-112), or at the token completing a stop string (the text cut before
    it, or after it with ``include_in_output``; ``stop_reason`` the string,
    vllm/v1/engine/output_processor.py:823-830).  Either token counts; tokens before
    ``stop.min_tokens`` never stop the turn (detokenizer.py:134-136).  A cut turn's
    pieces are what a stream sends of it (:func:`hold_back`).  A turn of tool calls is
    left as it is."""
    if turn.tool_calls or not (stop.strings or stop.token_ids):
        return turn
    text = ""
    ends: list[int] = []  # the text's length after each token
    for k, (piece, token_id) in enumerate(zip(turn.pieces, turn.token_ids, strict=True)):
        checked = k >= stop.min_tokens
        stop_token = checked and token_id in stop.token_ids
        new = piece if not stop_token or stop.include_in_output else ""
        text += new
        ends.append(len(text))
        matched = _stop_string(text, len(new), stop) if checked and new else None
        if matched is not None:
            string, cut = matched
            return _stopped(turn, text[:cut], ends, string, stop.held_back)
        if stop_token:
            return _stopped(turn, text, ends, token_id, stop.held_back)
    return turn


def _stop_string(text: str, new_chars: int, stop: StopRule) -> tuple[str, int] | None:
    """vLLM's ``check_stop_strings`` (vllm/v1/engine/detokenizer.py:321-373): the stop
    string that completes earliest within the ``new_chars`` last characters (ties: the
    first listed), and the length the text is cut to."""
    best: tuple[int, int, str] | None = None  # (end, start, string)
    for string in stop.strings:
        start = text.find(string, max(0, len(text) - new_chars - len(string) + 1))
        if start >= 0 and (best is None or start + len(string) < best[0]):
            best = (start + len(string), start, string)
    if best is None:
        return None
    end, start, string = best
    return string, end if stop.include_in_output else start


def _stopped(turn: TurnPlan, text: str, ends: list[int], reason: str | int, held_back: int) -> TurnPlan:
    """``turn`` ended after ``len(ends)`` tokens saying ``text`` (the text cut where it
    stopped, ``ends`` the uncut text's length after each token)."""
    kept = len(ends)
    pieces = _spread(text, ends, held_back)
    whole = turn.token_texts[:kept]
    return TurnPlan(pieces, turn.token_ids[:kept], FinishReason.STOP, _text_blocks(kept), reason, whole)


def hold_back(turn: TurnPlan, held_back: int) -> TurnPlan:
    """A text turn's pieces as a stream sends them when it holds back ``held_back``
    characters (see :func:`_spread`).  The text and the token count are unchanged."""
    if not held_back or turn.tool_calls or not turn.pieces:
        return turn
    ends = list(itertools.accumulate(map(len, turn.pieces)))
    return attrs.evolve(turn, pieces=_spread("".join(turn.pieces), ends, held_back), whole_tokens=turn.token_texts)


def _spread(text: str, ends: list[int], held_back: int) -> tuple[str, ...]:
    """What each token's step streams of ``text``: the text so far (``ends[i]`` long
    before the turn was cut) but its last ``held_back`` characters, never beyond the
    final text; the last step the rest, the hold lifted once the request finished
    (vllm/v1/engine/detokenizer.py:157-176)."""
    pieces = []
    sent = 0
    for end in ends[:-1]:
        upto = min(len(text), max(sent, end - held_back))
        pieces.append(text[sent:upto])
        sent = upto
    pieces.append(text[sent:])
    return tuple(pieces)


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
    prompt_ids: Sequence[int] = (),
) -> TurnPlan:
    """A text turn from the text generator (its length rules, its finish reason;
    ``prompt_ids`` pick the answer in dataset mode)."""
    text = ctx.text.generate(
        rng,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        prompt_tokens=prompt_tokens,
        echo_text=echo_text,
        min_tokens=min_tokens,
        prompt_ids=prompt_ids,
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
    prompt_ids: Sequence[int] = (),
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
        prompt_ids=prompt_ids,
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
                prompt_ids=prompt_ids[prompt_index] if prompt_ids else (),
            )
            turns.append(finish_turn(ctx, turn, cap, stop))
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


def as_emitted(turn: TurnPlan, emitted: int, finish_reason: str) -> TurnPlan:
    """``turn`` as far as its job got: ``turn`` itself, unless the engine ended the job
    early (sleep ``mode=abort``, :mod:`llmsim.engine.pause`); then its first ``emitted``
    pieces, finished with ``finish_reason`` and no stop reason (a non-streaming body
    shows what was generated until the abort).  The first block stays, maybe empty."""
    if finish_reason != FinishReason.ABORT:
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
    it first (vLLM's abort output carries none, vllm/v1/engine/core.py:2246-2257)."""
    return None if job.finish_reason == FinishReason.ABORT else stop_reasons[job.index]


def _split(ctx: ApiContext, text: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``text`` as one piece per token (the pieces concatenate back to ``text``)."""
    pieces = tuple(ctx.tokenizer.tokenize(text))
    ids = tuple(ctx.tokenizer.encode(text))
    if len(ids) != len(pieces):  # a tokenizer whose offsets merge tokens: keep the counts equal
        ids = ids[: len(pieces)] + (0,) * (len(pieces) - len(ids))
    return pieces, ids
