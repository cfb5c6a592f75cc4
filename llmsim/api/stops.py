"""How a text turn ends: with its EOS token, at a stop string or stop token.

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
text (:attr:`~llmsim.api.turns.TurnPlan.token_texts`) for the logprobs, which name
whole tokens.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TypeVar

import attrs

from llmsim.api.context import ApiContext
from llmsim.api.request_fields import GenerationParams
from llmsim.api.turns import TurnPlan, text_blocks
from llmsim.model.drawn import DrawnTokens
from llmsim.model.text import FinishReason

__all__ = ["StopRule", "finish_turn", "hold_back", "stop_reasons", "stop_rule", "stop_turn", "with_eos"]

T = TypeVar("T")


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
    # attrs.evolve(turn, pieces=…, token_ids=…, whole_tokens=…), made directly (evolve
    # walks the class's fields first; this runs for most turns).  stop_reason is None here.
    return TurnPlan(
        pieces=_appended(turn.pieces, ""),
        token_ids=_appended(turn.token_ids, eos.token_id),
        finish_reason=turn.finish_reason,
        blocks=turn.blocks,
        whole_tokens=whole,
    )


def _appended(tokens: Sequence[T], token: T) -> Sequence[T]:
    """``tokens`` and then ``token`` (a long drawn text stays undrawn)."""
    if isinstance(tokens, DrawnTokens):
        return tokens.appended(token)
    return (*tokens, token)


@attrs.frozen
class StopRule:
    """What ends a text turn besides its EOS and its cap: vLLM's ``stop`` strings and
    ``stop_token_ids``, looked for from token ``min_tokens`` on, and whether the
    matched string stays in the text (``include_stop_str_in_output``).  ``streaming``:
    the turn goes out as a stream, whose chunks hold back the end of the text (with
    logprobs too: their entries name each whole token, :attr:`~llmsim.api.turns.TurnPlan.token_texts`,
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


def stop_reasons(turns: Sequence[TurnPlan], stop: StopRule | None) -> list[str | int | None] | None:
    """Each turn's stop reason, for the renderers; None when there is no ``stop`` rule,
    since only one ends a turn with a reason: "none did", for every choice, and the
    renderers skip looking them up."""
    return None if stop is None else [turn.stop_reason for turn in turns]


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
    return TurnPlan(pieces, turn.token_ids[:kept], FinishReason.STOP, text_blocks(kept), reason, whole)


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
