"""The tree of a ``pattern`` (:mod:`llmsim.schema.regex`) and its length tables.

Each node knows how many strings of each length it can produce (``counts``, up to
:data:`MAX_PATTERN_LENGTH`) and generates one of a given length, choosing branches and
repeat counts in proportion to those counts; :class:`Budget` bounds the work spent on
the tables, so a hostile pattern fails fast.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

__all__ = [
    "MAX_PATTERN_LENGTH",
    "Alt",
    "Anchor",
    "Budget",
    "Chars",
    "Counts",
    "Node",
    "PatternError",
    "Repeat",
    "Seq",
    "alt",
    "repeat",
    "seq",
    "union",
]

MAX_PATTERN_LENGTH = 128  # longest string a pattern is asked to produce
_COUNT_CAP = 1 << 62  # counts are only used as weights: cap them to keep arithmetic cheap
_WORK_LIMIT = 250_000  # length-table multiplications allowed per pattern

Counts = dict[int, int]  # string length -> number of strings of that length (capped)


class PatternError(ValueError):
    """A pattern llmsim cannot generate strings for; the message says which construct."""


# --- the tree ------------------------------------------------------------------------


@attrs.frozen
class Chars:
    """One character out of ``alphabet``."""

    alphabet: str
    counts: Counts

    def generate(self, rng: random.Random, length: int, out: list[str]) -> None:
        out.append(rng.choice(self.alphabet))


@attrs.frozen
class Seq:
    """Items one after another; ``suffixes[i]`` counts the strings of ``items[i:]``."""

    items: tuple[Node, ...]
    suffixes: tuple[Counts, ...]
    counts: Counts

    def generate(self, rng: random.Random, length: int, out: list[str]) -> None:
        for item, rest in zip(self.items, self.suffixes[1:], strict=True):
            part = _split(rng, item.counts, rest, length)
            item.generate(rng, part, out)
            length -= part


@attrs.frozen
class Alt:
    options: tuple[Node, ...]
    counts: Counts

    def generate(self, rng: random.Random, length: int, out: list[str]) -> None:
        options = [option for option in self.options if length in option.counts]
        chosen = rng.choices(options, [option.counts[length] for option in options])[0]
        chosen.generate(rng, length, out)


@attrs.frozen
class Repeat:
    """``item`` repeated: ``len(exact) - 1`` copies, then optional ones.

    ``exact[j]`` counts j mandatory copies; ``optional[j]`` counts up to j optional
    copies, or any number when ``unbounded`` (then it holds one table).  Optional copies
    are never empty: an empty copy adds no characters, so it adds no new string.
    """

    item: Node
    pieces: Counts  # the item's non-empty lengths
    exact: tuple[Counts, ...]
    optional: tuple[Counts, ...]
    unbounded: bool
    counts: Counts

    def generate(self, rng: random.Random, length: int, out: list[str]) -> None:
        mandatory = _split(rng, self.exact[-1], self.optional[-1], length)
        rest, left = length - mandatory, len(self.optional) - 1
        for copies in range(len(self.exact) - 2, -1, -1):
            part = _split(rng, self.item.counts, self.exact[copies], mandatory)
            self.item.generate(rng, part, out)
            mandatory -= part
        while rest > 0:
            left -= 1
            part = _split(rng, self.pieces, self.optional[0 if self.unbounded else left], rest)
            self.item.generate(rng, part, out)
            rest -= part


@attrs.frozen
class Anchor:
    """``^``/``\\A`` (start) or ``$``/``\\Z`` (end); only allowed at the pattern's edges."""

    start: bool
    counts: Counts = attrs.field(factory=lambda: {0: 1})

    def generate(self, rng: random.Random, length: int, out: list[str]) -> None:
        raise AssertionError("anchors are removed before generation")


Node = Chars | Seq | Alt | Repeat | Anchor


def _split(rng: random.Random, head: Counts, tail: Counts, length: int) -> int:
    """How much of ``length`` the head takes, weighted by the strings each split allows."""
    parts = [n for n in head if n <= length and length - n in tail]
    weights = [head[n] * tail[length - n] for n in parts]
    return rng.choices(parts, weights)[0]


# --- length tables -------------------------------------------------------------------


class Budget:
    """Bounds the work spent on length tables, so a hostile pattern fails fast."""

    def __init__(self) -> None:
        self.left = _WORK_LIMIT

    def spend(self, work: int) -> None:
        self.left -= work
        if self.left < 0:
            raise PatternError("is too complex to generate strings from; simplify its nested repetitions")

    def product(self, a: Counts, b: Counts) -> Counts:
        """Counts of a string from ``a`` followed by one from ``b``."""
        self.spend(len(a) * len(b))
        out: Counts = {}
        for la, ca in a.items():
            for lb, cb in b.items():
                n = la + lb
                if n <= MAX_PATTERN_LENGTH:
                    out[n] = min(_COUNT_CAP, out.get(n, 0) + ca * cb)
        return out

    def star(self, pieces: Counts) -> Counts:
        """Counts of any number of non-empty pieces in a row."""
        self.spend(MAX_PATTERN_LENGTH * len(pieces))
        table = [1] + [0] * MAX_PATTERN_LENGTH
        for n in range(1, MAX_PATTERN_LENGTH + 1):
            table[n] = min(_COUNT_CAP, sum(c * table[n - m] for m, c in pieces.items() if m <= n))
        return {n: c for n, c in enumerate(table) if c}


def union(tables: Sequence[Counts]) -> Counts:
    out: Counts = {}
    for table in tables:
        for n, c in table.items():
            out[n] = min(_COUNT_CAP, out.get(n, 0) + c)
    return out


def seq(items: Sequence[Node], budget: Budget) -> Node:
    if len(items) == 1:
        return items[0]
    suffixes: list[Counts] = [{0: 1}]
    for item in reversed(items):
        suffixes.append(budget.product(item.counts, suffixes[-1]))
    suffixes.reverse()
    return Seq(tuple(items), tuple(suffixes), suffixes[0])


def alt(options: Sequence[Node]) -> Node:
    if len(options) == 1:
        return options[0]
    return Alt(tuple(options), union([o.counts for o in options]))


def repeat(item: Node, low: int, high: int | None, budget: Budget) -> Node:
    pieces = {n: c for n, c in item.counts.items() if n > 0}
    if 0 in item.counts:
        low = 0  # empty copies add nothing: item{low,high} is item-without-empty{0,high}
    exact: list[Counts] = [{0: 1}]
    for _ in range(low):
        exact.append(budget.product(exact[-1], item.counts))
        if not exact[-1]:
            raise PatternError(f"needs strings longer than {MAX_PATTERN_LENGTH} characters")
    if high is None:
        optional: list[Counts] = [budget.star(pieces)]
    else:
        useful = MAX_PATTERN_LENGTH // min(pieces, default=MAX_PATTERN_LENGTH)  # more copies only overflow
        optional = [{0: 1}]
        for _ in range(min(high - low, useful)):
            optional.append(union([{0: 1}, budget.product(pieces, optional[-1])]))
    return Repeat(item, pieces, tuple(exact), tuple(optional), high is None, budget.product(exact[-1], optional[-1]))
