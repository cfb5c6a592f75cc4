"""Corpus text drawn only as it is read.

:class:`DrawnTokens` is the corpus text of a long output (``TextGenerator.generate``
with ``lazy``): the same whole sentences, in the same order, as drawing them all up
front from the choice's RNG, but made a block at a time as the output is read, the
blocks read before dropped.  A stream's renderer reads its output in order, so at most
a block exists at any time: planning cost and memory do not grow with the output's
length.  Reading back before the current block draws the text again from its start,
from an RNG the caller makes afresh (``restart``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar, overload

__all__ = ["EAGER_UP_TO", "LAZY_BLOCK", "DrawnTokens"]

T = TypeVar("T")

#: Tokens made at a time (at least: a block ends at a sentence's end).
LAZY_BLOCK = 128
#: Outputs up to this long are drawn up front: a token read from a tuple costs nothing,
#: one read through :class:`DrawnTokens` about 0.2 µs more.
EAGER_UP_TO = 512


class DrawnTokens(Sequence[T]):
    """``length`` tokens of whole sentences from ``table`` (one tuple of tokens per
    sentence: pieces or ids), each sentence ``table[int(rng.random() * len(table))]``,
    the last one cut short; then ``tail`` (an EOS token).  Exactly what
    ``TextGenerator`` draws up front from the same RNG.

    ``rng`` is where the text's first sentence is drawn from (None: ask ``restart``);
    ``restart()`` makes an RNG in that same state, for reading the text again.
    """

    __slots__ = ("_block", "_block_start", "_cursor", "_length", "_restart", "_rng", "_table", "_tail")

    def __init__(
        self,
        table: Sequence[tuple[T, ...]],
        restart: Callable[[], random.Random],
        length: int,
        rng: random.Random | None = None,
        tail: tuple[T, ...] = (),
    ) -> None:
        self._table = table
        self._restart = restart
        self._length = length
        self._tail = tail
        self._rng = rng
        self._cursor = 0  # where the next sentence drawn starts
        self._block: list[T] = []
        self._block_start = 0

    def appended(self, item: T) -> DrawnTokens[T]:
        """The same tokens and then ``item`` (sharing this one's RNG: read one of them only)."""
        return DrawnTokens(self._table, self._restart, self._length, self._rng, (*self._tail, item))

    def _load(self, index: int) -> None:
        """Make the block that holds drawn token ``index`` (< the drawn length, not in
        the current block)."""
        rng = self._rng
        if rng is None or index < self._cursor:  # drawn already: draw again from the start
            rng = self._rng = self._restart()
            self._cursor = 0
        table, count = self._table, len(self._table)
        while True:  # skip whole sentences before ``index`` without keeping them
            start = self._cursor
            sentence = table[int(rng.random() * count)]
            self._cursor = start + len(sentence)
            if self._cursor > index:
                break
        block = list(sentence)
        while self._cursor - start < LAZY_BLOCK and self._cursor < self._length:
            sentence = table[int(rng.random() * count)]
            block.extend(sentence)
            self._cursor += len(sentence)
        del block[self._length - start :]
        self._block, self._block_start = block, start

    def __len__(self) -> int:
        return self._length + len(self._tail)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if index.__class__ is int:  # the per-token path: a token of the current block
            offset = index - self._block_start
            if 0 <= offset < len(self._block):
                return self._block[offset]
        size = self._length + len(self._tail)
        if isinstance(index, slice):
            start, stop, step = index.indices(size)
            if step != 1:
                return tuple(self)[index]
            offset = start - self._block_start
            if offset >= 0 and stop - self._block_start <= len(self._block):  # within the current block
                return tuple(self._block[offset : stop - self._block_start])
            return self._range(start, stop)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("DrawnTokens index out of range")
        if index >= self._length:
            return self._tail[index - self._length]
        if not 0 <= index - self._block_start < len(self._block):
            self._load(index)
        return self._block[index - self._block_start]

    def _range(self, start: int, stop: int) -> tuple[T, ...]:
        out: list[T] = []
        position = start
        drawn = min(stop, self._length)
        while position < drawn:
            offset = position - self._block_start
            if not 0 <= offset < len(self._block):
                self._load(position)
                offset = position - self._block_start
            taken = self._block[offset : offset + drawn - position]
            out.extend(taken)
            position += len(taken)
        if stop > self._length:
            out.extend(self._tail[max(0, start - self._length) : stop - self._length])
        return tuple(out)

    def __iter__(self) -> Iterator[T]:
        rng, left, table = self._restart(), self._length, self._table
        while left > 0:
            sentence = table[int(rng.random() * len(table))]
            yield from sentence[:left]
            left -= len(sentence)
        yield from self._tail

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DrawnTokens):
            other = tuple(other)
        return tuple(self) == other

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"<DrawnTokens {len(self)} tokens>"
