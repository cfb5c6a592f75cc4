"""A planned choice: what one choice says, as the renderers and the engine read it.

A :class:`TurnPlan` is a flat sequence of output pieces (one per token, what the engine
paces) with their token ids and finish reason, cut into :class:`Block` s: one text
block, or one block per tool call whose pieces are the call's arguments JSON.  The
planning (:mod:`llmsim.api.plan`) builds them; :mod:`llmsim.api.stops` ends them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import attrs

from llmsim.model.text import FinishReason

__all__ = ["TEXT", "TOOL_CALL", "Block", "TurnPlan", "text_blocks"]

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
    """What one choice says: one piece and one token id per token, cut into blocks.
    (Tuples, or for a long text :class:`~llmsim.model.drawn.DrawnTokens`, drawn as the
    engine hands them out.)"""

    pieces: Sequence[str]
    token_ids: Sequence[int] = attrs.field()
    finish_reason: str  # "stop", "length" or "tool_calls"
    blocks: tuple[Block, ...]
    stop_reason: str | int | None = None  # the stop string or stop token id that ended the turn
    #: each token's own text where the pieces (what a stream sends per token) differ from
    #: it: text held back or cut at a stop (:func:`~llmsim.api.stops.hold_back`, :func:`~llmsim.api.stops.stop_turn`)
    whole_tokens: Sequence[str] | None = None

    @token_ids.validator
    def _one_id_per_piece(self, _: attrs.Attribute[Sequence[int]], token_ids: Sequence[int]) -> None:
        if len(token_ids) != len(self.pieces):
            raise ValueError(f"{len(self.pieces)} pieces but {len(token_ids)} token ids")

    @property
    def truncated(self) -> bool:
        return self.finish_reason == FinishReason.LENGTH

    @property
    def token_texts(self) -> Sequence[str]:
        """Each token's own text, as logprobs name it (vLLM decodes the token id, not the
        streamed text: vllm/entrypoints/generate/base/serving.py:302-319)."""
        return self.pieces if self.whole_tokens is None else self.whole_tokens

    @property
    def ends_with_eos(self) -> bool:
        """Whether the turn's last piece is its EOS token (:func:`~llmsim.api.stops.with_eos`), which lies
        after its blocks."""
        return bool(self.blocks) and len(self.pieces) > self.blocks[-1].stop

    @property
    def tool_calls(self) -> tuple[Block, ...]:
        """The tool-call blocks (none: the turn answers with text)."""
        return tuple(block for block in self.blocks if block.kind == TOOL_CALL)

    def block_text(self, block: Block) -> str:
        return "".join(self.pieces[block.start : block.stop])


@functools.lru_cache(maxsize=1024)
def text_blocks(length: int) -> tuple[Block, ...]:
    """The blocks of a text turn of ``length`` pieces (frozen, so shared by every turn that long)."""
    return (Block(TEXT, 0, length),)
