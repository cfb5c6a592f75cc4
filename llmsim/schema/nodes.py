"""The compiled form of a tool schema: a tree of nodes that match and generate values.

:mod:`llmsim.schema.jsonschema` builds the tree and proves, before anything is
generated, that every choice a node makes yields a valid value.  So generation walks
the tree once: a node picks a type, a length or a branch, and its children do the same
(only numbers and uniqueItems redraw, a bounded number of times).  Two modes keep it
finite and able to meet ``uniqueItems``:

- minimal: the smallest choices (no optional properties, shortest arrays, the cheapest
  branch), entered once the generation budget is spent or a ``$ref`` has been entered
  ``MAX_RECURSION`` times on the current path;
- wide: the option windows stretched, when uniqueItems keeps drawing repeats.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from llmsim.options import ToolCallOptions
from llmsim.schema.formats import WORDS
from llmsim.schema.keywords import TYPES, ToolSchemaError, json_key
from llmsim.schema.regex import StringPattern

__all__ = [
    "ANY", "Arrays", "Context", "Node", "Numbers", "Objects", "Ref", "Simple", "Strings", "Union",
    "fit", "smallest_cost",
]  # fmt: skip

GENERATION_BUDGET = 20_000  # values generated before switching to the smallest choices
MAX_RECURSION = 2  # times one $ref may be entered on a path before choices turn minimal
_TRIES = 16  # random draws before falling back to a precomputed valid value
_WIDE = 1_000_000  # how far "wide" generation (for uniqueItems) stretches the option windows


# --- JSON values ----------------------------------------------------------------------


def _kind_of(value: object) -> str:
    """The JSON Schema type of a value; ``1.0`` is an integer, as validators count it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "unknown")


# --- generation context ---------------------------------------------------------------


@attrs.define
class Context:
    """State of one generation: the random source, the knobs, and the modes below."""

    rng: random.Random
    options: ToolCallOptions
    budget: int = GENERATION_BUDGET
    minimal: bool = False  # smallest choices: no optional properties, shortest arrays
    object_depth: int = 0  # 0 while generating the parameters object itself
    wide: bool = False  # ignore the option windows (uniqueItems is short of distinct values)
    entered: dict[str, int] = attrs.field(factory=dict)  # $ref -> times entered on this path

    def chance(self, percent: int) -> bool:
        return self.rng.random() * 100 < percent

    def window(self, low: Any, high: Any) -> tuple[Any, Any]:
        """An option window, stretched in wide mode."""
        return (low - _WIDE, high + _WIDE) if self.wide else (low, high)


def fit(window: tuple[Any, Any], low: Any, high: Any) -> tuple[Any, Any]:
    """The option window moved into the schema's ``[low, high]`` (None: unbounded)."""
    a, b = window
    lo = a if low is None else max(a, low)
    hi = b if high is None else min(b, high)
    if lo <= hi:
        return lo, hi
    width = b - a
    if low is not None and b < low:  # the window lies below the schema's range: slide it up
        return low, (low + width if high is None else min(high, low + width))
    return (high - width if low is None else max(low, high - width)), high


# --- nodes ------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class Numbers:
    """minimum/maximum/exclusive*/multipleOf; ``witness_*`` is a valid fallback value."""

    low: int | float | None
    low_exclusive: bool
    high: int | float | None
    high_exclusive: bool
    multiple_of: int | float | None
    decimals: int  # digits kept when generating multiples of a fractional multipleOf
    witness_integer: int | None
    witness_number: int | float | None

    def matches(self, value: int | float) -> bool:
        if self.low is not None and (value <= self.low if self.low_exclusive else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.high_exclusive else value > self.high):
            return False
        return self.multiple_of is None or _is_multiple(value, self.multiple_of)

    def integer_range(self) -> tuple[int | None, int | None]:
        low = None if self.low is None else math.floor(self.low) + 1 if self.low_exclusive else math.ceil(self.low)
        high = None if self.high is None else math.ceil(self.high) - 1 if self.high_exclusive else math.floor(self.high)
        return low, high

    def integer(self, ctx: Context) -> int:
        step = int(self.multiple_of or 1)
        low, high = self.integer_range()
        a, b = ctx.window(ctx.options.min_tool_call_integer_param, ctx.options.max_tool_call_integer_param)
        window = (-(-a // step), b // step)
        k_low = None if low is None else -(-low // step)
        k_high = None if high is None else high // step
        lo, hi = fit((window[0], max(window)), k_low, k_high)
        return ctx.rng.randint(lo, hi) * step

    def number(self, ctx: Context) -> int | float:
        if self.multiple_of is not None and isinstance(self.multiple_of, int):
            return self.integer(ctx)
        options = ctx.options
        window = ctx.window(options.min_tool_call_number_param, options.max_tool_call_number_param)
        lo, hi = fit(window, self.low, self.high)
        for _ in range(_TRIES):
            value = self._candidate(ctx.rng, lo, hi)
            if self.matches(value):
                return value
        assert self.witness_number is not None
        return self.witness_number

    def _candidate(self, rng: random.Random, lo: float, hi: float) -> float:
        """A number in ``[lo, hi]`` rounded like a person would write it (checked by the caller)."""
        if self.multiple_of is None:
            return round(rng.uniform(lo, hi), 2)
        step = self.multiple_of
        if not math.isfinite(hi / step) or not math.isfinite(lo / step):
            return math.nan  # the caller falls back to the witness
        first = math.ceil(lo / step)
        return round(rng.randint(first, max(first, math.floor(hi / step))) * step, self.decimals)


def _is_multiple(value: int | float, step: int | float) -> bool:
    """``multipleOf`` exactly as python-jsonschema checks it."""
    if isinstance(step, float):
        try:
            quotient = value / step
            return int(quotient) == quotient
        except (OverflowError, ValueError):
            return False
    return value % step == 0


@attrs.frozen(eq=False)
class Strings:
    """minLength/maxLength/pattern/format: pattern strings, format values, or words."""

    min_length: int
    max_length: int | None
    pattern: StringPattern | None
    pattern_lengths: tuple[int, ...]
    format: Callable[[random.Random], str] | None  # only when its lengths fit the bounds
    variety: int  # at least this many distinct strings are generated

    def matches(self, value: str) -> bool:
        if len(value) < self.min_length or (self.max_length is not None and len(value) > self.max_length):
            return False
        return self.pattern is None or self.pattern.regex.search(value) is not None

    def generate(self, ctx: Context) -> str:
        rng = ctx.rng
        if self.pattern is not None:
            return self.pattern.generate(rng, rng.choice(self.pattern_lengths))
        if self.format is not None:
            return self.format(rng)
        text = rng.choice(WORDS) + (" " + rng.choice(WORDS) if ctx.wide else "")
        while len(text) < self.min_length:
            text += " " + rng.choice(WORDS)
        text = text[: self.max_length]
        stripped = text.rstrip()
        return stripped if len(stripped) >= self.min_length else text


@attrs.define(eq=False)
class Arrays:
    """items/prefixItems/minItems/maxItems/uniqueItems.

    ``domain`` is filled in once the whole schema is compiled (its items may be a
    ``$ref`` still being compiled here): the explicit value set a uniqueItems array
    samples from, or None to draw items until they are distinct.
    """

    min_items: int
    max_items: int | None  # already lowered by items/prefixItems that forbid more
    unique: bool
    prefix: tuple[Node, ...]
    items: Node | None  # None: no items beyond prefix
    path: str
    domain: Sequence[Any] | None = None

    def element(self, index: int) -> Node | None:
        return self.prefix[index] if index < len(self.prefix) else self.items

    def matches(self, value: list[Any]) -> bool:
        if len(value) < self.min_items or (self.max_items is not None and len(value) > self.max_items):
            return False
        for index, item in enumerate(value):
            node = self.element(index)
            if node is None or not node.matches(item):
                return False
        return not self.unique or len({json_key(item) for item in value}) == len(value)

    def generate(self, ctx: Context) -> list[Any]:
        if ctx.minimal:
            count = self.min_items
        else:
            options = ctx.options
            longest = options.max_tool_call_array_param_length
            window = (0, longest + 5) if ctx.wide else (options.min_tool_call_array_param_length, longest)
            count = ctx.rng.randint(*fit(window, self.min_items, self.max_items))
        if not self.unique:
            return [self._node(i).generate(ctx) for i in range(count)]
        if self.domain is not None:
            return ctx.rng.sample(self.domain, min(count, len(self.domain)))
        return self._distinct(ctx, count)

    def _node(self, index: int) -> Node:
        node = self.element(index)
        assert node is not None, "count never exceeds max_items"
        return node

    def _distinct(self, ctx: Context, count: int) -> list[Any]:
        """Draw until ``count`` distinct items; after a few repeats, draw in wide mode.

        Wide draws are never minimal (the smallest choices repeat themselves); recursion
        still ends, because entering a $ref past its cap turns minimal mode back on.
        """
        out: list[Any] = []
        seen: set[object] = set()
        wide, minimal, attempts = ctx.wide, ctx.minimal, _TRIES * (count + 1)
        for attempt in range(attempts):
            if len(out) == count:
                break
            ctx.wide = wide or attempt >= count + _TRIES
            ctx.minimal = minimal and not ctx.wide
            item = self._node(len(out)).generate(ctx)
            if json_key(item) not in seen:
                seen.add(json_key(item))
                out.append(item)
        ctx.wide, ctx.minimal = wide, minimal
        if len(out) < self.min_items:
            raise ToolSchemaError(
                self.path,
                "uniqueItems",
                f"could not be met: only {len(out)} distinct items of the "
                f"{self.min_items} required were generated; relax minItems or widen the items schema",
            )
        return out


@attrs.frozen(eq=False)
class Objects:
    """properties/required/additionalProperties; only declared and required properties are generated."""

    properties: tuple[tuple[str, Node | None], ...]  # None: the property must be absent
    required: tuple[str, ...]
    additional: Node | None  # None: additionalProperties false
    # Lookups by name, so matching and generating stay linear in the number of properties.
    declared: dict[str, Node | None] = attrs.field(init=False, repr=False)
    required_names: frozenset[str] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "declared", dict(self.properties))
        object.__setattr__(self, "required_names", frozenset(self.required))

    def governing(self, name: str) -> Node | None:
        """The schema a property named ``name`` must match (None: it must be absent)."""
        return self.declared.get(name, self.additional)

    def matches(self, value: dict[str, Any]) -> bool:
        if any(name not in value for name in self.required):
            return False
        for name, item in value.items():
            node = self.governing(name)
            if node is None or not node.matches(item):
                return False
        return True

    def generate(self, ctx: Context) -> dict[str, Any]:
        options = ctx.options
        percent = (
            50
            if ctx.wide
            else options.tool_call_not_required_param_probability
            if ctx.object_depth == 0
            else options.object_tool_call_not_required_field_probability
        )
        ctx.object_depth += 1
        out: dict[str, Any] = {}
        for name, node in self.properties:
            if node is not None and (name in self.required_names or (not ctx.minimal and ctx.chance(percent))):
                out[name] = node.generate(ctx)
        for name in self.required:
            if name not in out:
                node = self.governing(name)
                assert node is not None, "compile refuses required properties that must be absent"
                out[name] = node.generate(ctx)
        ctx.object_depth -= 1
        return out


@attrs.frozen(eq=False)
class Simple:
    """One schema object without combinators: every keyword applies at once."""

    kinds: frozenset[str]  # allowed JSON types; "integer" without "number" means integral only
    generate_kinds: tuple[str, ...]  # the types generated, in preference order
    numbers: Numbers | None
    strings: Strings | None
    arrays: Arrays | None
    objects: Objects | None
    values: tuple[Any, ...] | None = None  # enum/const, already filtered by the rest

    def allows(self, kind: str) -> bool:
        return kind in self.kinds or (kind == "integer" and "number" in self.kinds)

    def matches(self, value: object) -> bool:
        kind = _kind_of(value)
        if not self.allows(kind):
            return False
        if self.values is not None and json_key(value) not in {json_key(v) for v in self.values}:
            return False
        if isinstance(value, str):
            return self.strings is None or self.strings.matches(value)
        if isinstance(value, list):
            return self.arrays is None or self.arrays.matches(value)
        if isinstance(value, dict):
            return self.objects is None or self.objects.matches(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return self.numbers is None or self.numbers.matches(value)
        return True  # null or boolean: the type is the whole check

    def generate(self, ctx: Context) -> object:
        ctx.budget -= 1
        if ctx.budget <= 0 and not ctx.wide:
            ctx.minimal = True
        if self.values is not None:
            return ctx.rng.choice(self.values)
        if ctx.minimal:
            kind = min(self.generate_kinds, key=lambda k: _kind_cost(self, k))
        else:
            kind = ctx.rng.choice(self.generate_kinds)
        return self._generate(kind, ctx)

    def _generate(self, kind: str, ctx: Context) -> object:
        if kind == "null":
            return None
        if kind == "boolean":
            return ctx.rng.random() < 0.5
        if kind == "integer":
            assert self.numbers is not None
            return self.numbers.integer(ctx)
        if kind == "number":
            assert self.numbers is not None
            return self.numbers.number(ctx)
        spec = {"string": self.strings, "array": self.arrays, "object": self.objects}[kind]
        assert spec is not None
        return spec.generate(ctx)


@attrs.frozen(eq=False)
class Union:
    """anyOf (``exclusive`` False) or oneOf; compile proved oneOf branches exclusive."""

    branches: tuple[Node, ...]
    exclusive: bool

    def matches(self, value: object) -> bool:
        hits = sum(1 for branch in self.branches if branch.matches(value))
        return hits == 1 if self.exclusive else hits >= 1

    def generate(self, ctx: Context) -> object:
        if ctx.minimal:
            return min(self.branches, key=smallest_cost).generate(ctx)
        return ctx.rng.choice(self.preferred()).generate(ctx)

    def preferred(self) -> list[Node]:
        """The branches chosen from: a null-only branch only when there is nothing else."""
        return [b for b in self.branches if not _only_null(b)] or list(self.branches)


@attrs.define(eq=False)
class Ref:
    """A ``$ref``; its target is filled in after it is compiled (it may refer to itself)."""

    key: str
    path: str
    target: Node | None = None
    cost: tuple[float, float] = (math.inf, math.inf)

    def resolved(self) -> Node:
        if self.target is None:
            raise ToolSchemaError(
                self.path,
                "$ref",
                "is used by an enum/const check inside its own definition; remove the enum/const or the recursion",
            )
        return self.target

    def matches(self, value: object) -> bool:
        return self.resolved().matches(value)

    def generate(self, ctx: Context) -> object:
        entered = ctx.entered.get(self.key, 0)
        minimal = ctx.minimal
        ctx.entered[self.key] = entered + 1
        ctx.minimal = minimal or entered >= MAX_RECURSION
        try:
            return self.resolved().generate(ctx)
        finally:
            ctx.entered[self.key] = entered
            ctx.minimal = minimal or (ctx.budget <= 0 and not ctx.wide)


Node = Simple | Union | Ref

# The schema ``{}`` (or ``true``): any value is valid; a word is generated.
ANY = Simple(frozenset(TYPES), ("string",), None, Strings(0, None, None, (), None, len(WORDS)), None, None)


def _only_null(node: Node) -> bool:
    if isinstance(node, Simple):
        return node.values == (None,) or (node.values is None and node.generate_kinds == ("null",))
    return False


# --- minimal cost: (nested $ref entries, size) of the smallest value ------------------


def smallest_cost(node: Node) -> tuple[float, float]:
    """What minimal mode minimizes, and what the compiler bounds (MAX_MIN_SIZE, finite $refs)."""
    if isinstance(node, Ref):
        return node.cost
    if isinstance(node, Union):
        return min(smallest_cost(branch) for branch in node.branches)
    if node.values is not None:
        return 0, 1
    return min(_kind_cost(node, kind) for kind in node.generate_kinds)


def _kind_cost(node: Simple, kind: str) -> tuple[float, float]:
    parts: list[tuple[tuple[float, float], int]] = []  # (cost, how many)
    if kind == "object" and node.objects is not None:
        children = [node.objects.governing(name) for name in node.objects.required]
        parts = [(smallest_cost(child), 1) for child in children if child is not None]
    elif kind == "array" and node.arrays is not None:
        arrays = node.arrays
        parts = [(smallest_cost(arrays.prefix[i]), 1) for i in range(min(arrays.min_items, len(arrays.prefix)))]
        if arrays.min_items > len(arrays.prefix) and arrays.items is not None:
            parts.append((smallest_cost(arrays.items), arrays.min_items - len(arrays.prefix)))
    elif kind == "string" and node.strings is not None:
        return 0, 1 + node.strings.min_length // 64
    depth = max((cost[0] for cost, _ in parts), default=0)
    return depth, 1 + sum(cost[1] * count for cost, count in parts)
