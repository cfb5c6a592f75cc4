"""Values that validate against a JSON Schema: the arguments of simulated tool calls.

A tool's ``parameters`` schema is compiled once per request into a tree of nodes, and
compiling is validating: whatever compiles, llmsim can generate values for that
validate under JSON Schema Draft 2020-12, and whatever it cannot honour is refused with
a :class:`ToolSchemaError` naming the JSON path and the keyword.  That is why the
compiler does more than read keywords:

- ``allOf``, and ``$ref`` with sibling keywords, are merged into one schema (types
  intersected, bounds tightened, properties combined with the same rules a validator
  applies); ``anyOf``/``oneOf`` next to other keywords are distributed into each branch.
- ``enum``/``const`` values are filtered through the rest of their schema.
- ``oneOf`` is accepted only when a value generated from one branch provably fails
  every other branch (different types, values, numeric or length ranges, or a required
  property whose schemas exclude each other, as in discriminated unions); otherwise a
  generated value could match two branches and be invalid.
- Recursive ``$ref`` needs an object or array between a definition and its reuse,
  and a finite instance; generation switches to the smallest choices after a
  reference has been entered a few times, so it always ends.
- ``uniqueItems``: small explicit value sets are sampled without repeats; other items
  are drawn until distinct, after a few repeats in "wide" mode (option windows
  ignored); arrays whose items cannot supply enough distinct values are refused.
- ``format`` is an annotation in 2020-12: known formats get realistic values when
  their lengths fit minLength/maxLength, and ``pattern`` wins over ``format``.

Generation knobs (:class:`ToolCallOptions`) are llm-d-inference-sim's, with its
defaults; explicit schema bounds always win over them.  Checking keyword values and
merging raw schemas live in :mod:`llmsim.engine.schema_keywords`.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

import attrs
import orjson

from llmsim.engine.regex_gen import PatternError, StringPattern, compile_pattern
from llmsim.engine.schema_keywords import (
    COMBINATORS,
    KIND_KEYWORDS,
    SUPPORTED,
    TYPES,
    ToolSchemaError,
    all_of,
    at,
    json_key,
    merge_parts,
    normalize,
    types_of,
)

__all__ = ["CompiledSchema", "ToolCallOptions", "ToolSchemaError", "compile_schema"]

MAX_MIN_LENGTH = 10_000  # largest minLength accepted
MAX_MIN_ITEMS = 1_000  # largest minItems accepted
MAX_MIN_SIZE = 100_000  # largest forced size (values, long strings count more)
GENERATION_BUDGET = 20_000  # values generated before switching to the smallest choices
MAX_RECURSION = 2  # times one $ref may be entered on a path before choices turn minimal
MAX_NESTING = 64  # schemas nested deeper than this are refused
_MERGE_DEPTH = 32  # nested allOf/$ref merges (deeper means a $ref cycle)
_MAX_BRANCHES = 64  # branches after distributing several anyOf/oneOf of an allOf
_PROOF_DEPTH = 16  # nesting explored when proving oneOf branches exclusive
_TRIES = 16  # random draws before falling back to a precomputed valid value
_WIDE = 1_000_000  # how far "wide" generation (for uniqueItems) stretches the option windows
_DOMAIN_LIMIT = 10_000  # largest value set enumerated for uniqueItems
_MANY = 1 << 40  # variety counts are capped here

WORDS = (
    "testing", "hello", "Boston", "sunny", "temperature", "cloudy", "question", "silence",
    "lifetime", "Paris", "London", "Tokyo", "weather", "report", "summary", "coffee",
    "meeting", "project", "update", "garden", "river", "mountain", "yellow", "green",
    "apple", "orange", "music", "travel", "window", "station", "morning", "evening",
    "budget", "invoice", "customer", "ticket", "search", "example", "document", "server",
    "network", "kitchen", "library", "museum", "forest", "ocean", "bridge", "lantern",
)  # fmt: skip

def _percent(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 0 <= value <= 100:
        raise ValueError(f"{attribute.name.replace('_', '-')} must be a percentage in 0..100, got {value}")


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name.replace('_', '-')} must be >= 0, got {value}")


@attrs.frozen(kw_only=True)
class ToolCallOptions:
    """llm-d-inference-sim's tool-call knobs; field names are its flag names with ``_``."""

    min_tool_call_integer_param: int = 0
    max_tool_call_integer_param: int = 100
    min_tool_call_number_param: float = 0.0
    max_tool_call_number_param: float = 100.0
    min_tool_call_array_param_length: int = attrs.field(default=1, validator=_non_negative)
    max_tool_call_array_param_length: int = attrs.field(default=5, validator=_non_negative)
    tool_call_not_required_param_probability: int = attrs.field(default=50, validator=_percent)
    object_tool_call_not_required_field_probability: int = attrs.field(default=50, validator=_percent)
    tool_call_extra_call_probability: int = attrs.field(default=45, validator=_percent)

    def __attrs_post_init__(self) -> None:
        for kind in ("integer_param", "number_param", "array_param_length"):
            low, high = getattr(self, f"min_tool_call_{kind}"), getattr(self, f"max_tool_call_{kind}")
            if low > high:
                name = kind.replace("_", "-")
                raise ValueError(f"min-tool-call-{name} ({low}) must not exceed max-tool-call-{name} ({high})")


# --- paths and JSON values ------------------------------------------------------------


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
class _Context:
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


def _fit(window: tuple[Any, Any], low: Any, high: Any) -> tuple[Any, Any]:
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
class _Numbers:
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

    def integer(self, ctx: _Context) -> int:
        step = int(self.multiple_of or 1)
        low, high = self.integer_range()
        a, b = ctx.window(ctx.options.min_tool_call_integer_param, ctx.options.max_tool_call_integer_param)
        window = (-(-a // step), b // step)
        k_low = None if low is None else -(-low // step)
        k_high = None if high is None else high // step
        lo, hi = _fit((window[0], max(window)), k_low, k_high)
        return ctx.rng.randint(lo, hi) * step

    def number(self, ctx: _Context) -> int | float:
        if self.multiple_of is not None and isinstance(self.multiple_of, int):
            return self.integer(ctx)
        options = ctx.options
        window = ctx.window(options.min_tool_call_number_param, options.max_tool_call_number_param)
        lo, hi = _fit(window, self.low, self.high)
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
class _Strings:
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

    def generate(self, ctx: _Context) -> str:
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


@attrs.frozen(eq=False)
class _Arrays:
    """items/prefixItems/minItems/maxItems/uniqueItems."""

    min_items: int
    max_items: int | None  # already lowered by items/prefixItems that forbid more
    unique: bool
    prefix: tuple[_Node, ...]
    items: _Node | None  # None: no items beyond prefix
    path: str

    def element(self, index: int) -> _Node | None:
        return self.prefix[index] if index < len(self.prefix) else self.items

    def matches(self, value: list[Any]) -> bool:
        if len(value) < self.min_items or (self.max_items is not None and len(value) > self.max_items):
            return False
        for index, item in enumerate(value):
            node = self.element(index)
            if node is None or not node.matches(item):
                return False
        return not self.unique or len({json_key(item) for item in value}) == len(value)

    def generate(self, ctx: _Context) -> list[Any]:
        if ctx.minimal:
            count = self.min_items
        else:
            options = ctx.options
            longest = options.max_tool_call_array_param_length
            window = (0, longest + 5) if ctx.wide else (options.min_tool_call_array_param_length, longest)
            count = ctx.rng.randint(*_fit(window, self.min_items, self.max_items))
        if not self.unique:
            return [self._node(i).generate(ctx) for i in range(count)]
        domain = _domain(self.items) if not self.prefix else None
        if domain is not None:
            return ctx.rng.sample(domain, min(count, len(domain)))
        return self._distinct(ctx, count)

    def _node(self, index: int) -> _Node:
        node = self.element(index)
        assert node is not None, "count never exceeds max_items"
        return node

    def _distinct(self, ctx: _Context, count: int) -> list[Any]:
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
            raise ToolSchemaError(self.path, "uniqueItems", f"could not be met: only {len(out)} distinct items of the "
                                  f"{self.min_items} required were generated; relax minItems or widen the items schema")
        return out


@attrs.frozen(eq=False)
class _Objects:
    """properties/required/additionalProperties; only declared and required properties are generated."""

    properties: tuple[tuple[str, _Node | None], ...]  # None: the property must be absent
    required: tuple[str, ...]
    additional: _Node | None  # None: additionalProperties false

    def governing(self, name: str) -> _Node | None:
        """The schema a property named ``name`` must match (None: it must be absent)."""
        for declared, node in self.properties:
            if declared == name:
                return node
        return self.additional

    def matches(self, value: dict[str, Any]) -> bool:
        if any(name not in value for name in self.required):
            return False
        for name, item in value.items():
            node = self.governing(name)
            if node is None or not node.matches(item):
                return False
        return True

    def generate(self, ctx: _Context) -> dict[str, Any]:
        options = ctx.options
        percent = (50 if ctx.wide else options.tool_call_not_required_param_probability if ctx.object_depth == 0
                   else options.object_tool_call_not_required_field_probability)
        ctx.object_depth += 1
        out: dict[str, Any] = {}
        for name, node in self.properties:
            if node is not None and (name in self.required or (not ctx.minimal and ctx.chance(percent))):
                out[name] = node.generate(ctx)
        for name in self.required:
            if name not in out:
                node = self.governing(name)
                assert node is not None, "compile refuses required properties that must be absent"
                out[name] = node.generate(ctx)
        ctx.object_depth -= 1
        return out


@attrs.frozen(eq=False)
class _Simple:
    """One schema object without combinators: every keyword applies at once."""

    kinds: frozenset[str]  # allowed JSON types; "integer" without "number" means integral only
    generate_kinds: tuple[str, ...]  # the types generated, in preference order
    numbers: _Numbers | None
    strings: _Strings | None
    arrays: _Arrays | None
    objects: _Objects | None
    values: tuple[Any, ...] | None = None  # enum/const, already filtered by the rest

    def allows(self, kind: str) -> bool:
        return kind in self.kinds or (kind == "integer" and "number" in self.kinds)

    def matches(self, value: object) -> bool:
        kind = _kind_of(value)
        if not self.allows(kind):
            return False
        if self.values is not None and json_key(value) not in {json_key(v) for v in self.values}:
            return False
        if kind in ("integer", "number"):
            return self.numbers is None or self.numbers.matches(value)  # type: ignore[arg-type]
        spec = {"string": self.strings, "array": self.arrays, "object": self.objects}.get(kind)
        return spec is None or spec.matches(value)  # type: ignore[attr-defined]

    def generate(self, ctx: _Context) -> object:
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

    def _generate(self, kind: str, ctx: _Context) -> object:
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
class _Union:
    """anyOf (``exclusive`` False) or oneOf; compile proved oneOf branches exclusive."""

    branches: tuple[_Node, ...]
    exclusive: bool

    def matches(self, value: object) -> bool:
        hits = sum(1 for branch in self.branches if branch.matches(value))
        return hits == 1 if self.exclusive else hits >= 1

    def generate(self, ctx: _Context) -> object:
        if ctx.minimal:
            return min(self.branches, key=_cost).generate(ctx)
        return ctx.rng.choice(self.preferred()).generate(ctx)

    def preferred(self) -> list[_Node]:
        """The branches chosen from: a null-only branch only when there is nothing else."""
        return [b for b in self.branches if not _only_null(b)] or list(self.branches)


@attrs.define(eq=False)
class _Ref:
    """A ``$ref``; its target is filled in after it is compiled (it may refer to itself)."""

    key: str
    path: str
    target: _Node | None = None
    cost: tuple[float, float] = (math.inf, math.inf)

    def resolved(self) -> _Node:
        if self.target is None:
            raise ToolSchemaError(self.path, "$ref", "is used by an enum/const check inside its own definition; "
                                  "remove the enum/const or the recursion")
        return self.target

    def matches(self, value: object) -> bool:
        return self.resolved().matches(value)

    def generate(self, ctx: _Context) -> object:
        entered = ctx.entered.get(self.key, 0)
        minimal = ctx.minimal
        ctx.entered[self.key] = entered + 1
        ctx.minimal = minimal or entered >= MAX_RECURSION
        try:
            return self.resolved().generate(ctx)
        finally:
            ctx.entered[self.key] = entered
            ctx.minimal = minimal or (ctx.budget <= 0 and not ctx.wide)


_Node = _Simple | _Union | _Ref

# The schema ``{}`` (or ``true``): any value is valid; a word is generated.
_ANY = _Simple(frozenset(TYPES), ("string",), None, _Strings(0, None, None, (), None, len(WORDS)), None, None)


def _only_null(node: _Node) -> bool:
    if isinstance(node, _Simple):
        return node.values == (None,) or (node.values is None and node.generate_kinds == ("null",))
    return False


def _deref(node: _Node) -> _Node:
    """Follow references (a chain, or one still being compiled, stays a _Ref)."""
    for _ in range(_PROOF_DEPTH):
        if not isinstance(node, _Ref) or node.target is None:
            return node
        node = node.target
    return node


# --- minimal cost: (nested $ref entries, size) of the smallest value ------------------


def _cost(node: _Node) -> tuple[float, float]:
    if isinstance(node, _Ref):
        return node.cost
    if isinstance(node, _Union):
        return min(_cost(branch) for branch in node.branches)
    if node.values is not None:
        return 0, 1
    return min(_kind_cost(node, kind) for kind in node.generate_kinds)


def _kind_cost(node: _Simple, kind: str) -> tuple[float, float]:
    parts: list[tuple[tuple[float, float], int]] = []  # (cost, how many)
    if kind == "object" and node.objects is not None:
        children = [node.objects.governing(name) for name in node.objects.required]
        parts = [(_cost(child), 1) for child in children if child is not None]
    elif kind == "array" and node.arrays is not None:
        arrays = node.arrays
        parts = [(_cost(arrays.prefix[i]), 1) for i in range(min(arrays.min_items, len(arrays.prefix)))]
        if arrays.min_items > len(arrays.prefix) and arrays.items is not None:
            parts.append((_cost(arrays.items), arrays.min_items - len(arrays.prefix)))
    elif kind == "string" and node.strings is not None:
        return 0, 1 + node.strings.min_length // 64
    depth = max((cost[0] for cost, _ in parts), default=0)
    return depth, 1 + sum(cost[1] * count for cost, count in parts)


# --- explicit value sets (for uniqueItems) ----------------------------------------------


def _domain(node: _Node | None, depth: int = 0) -> Sequence[Any] | None:
    """Every value ``node`` generates, when that is an explicit set of manageable size."""
    if node is None or depth > _PROOF_DEPTH:
        return None
    node = _deref(node)
    if isinstance(node, _Ref):
        return None
    if isinstance(node, _Simple) and node.values is not None:
        return node.values
    parts = ([_domain(b, depth + 1) for b in node.preferred()] if isinstance(node, _Union)
             else [_kind_domain(node, kind) for kind in node.generate_kinds])
    if any(part is None for part in parts):
        return None
    if len(parts) == 1:
        return parts[0]
    if sum(len(part) for part in parts) > _DOMAIN_LIMIT:  # type: ignore[arg-type]
        return None
    return tuple({json_key(v): v for part in parts for v in part}.values())  # type: ignore[union-attr]


def _kind_domain(node: _Simple, kind: str) -> Sequence[Any] | None:
    if kind in ("null", "boolean"):
        return (None,) if kind == "null" else (False, True)
    if kind == "integer" and node.numbers is not None and not isinstance(node.numbers.multiple_of, float):
        step = node.numbers.multiple_of or 1
        low, high = node.numbers.integer_range()
        if low is not None and high is not None and (high - low) // step < _DOMAIN_LIMIT:
            first = low + (-low) % step
            return range(first, high + 1, step)
    numbers = node.numbers
    if kind == "number" and numbers is not None and numbers.low is not None and numbers.high is not None:
        return _number_domain(numbers)
    if kind == "string" and node.strings is not None and node.strings.max_length == 0:
        return ("",)
    if kind == "array" and node.arrays is not None and node.arrays.max_items == 0:
        return ([],)
    if kind == "object" and node.objects is not None:
        return _object_domain(node.objects)
    return None


def _number_domain(numbers: _Numbers) -> Sequence[Any] | None:
    """The valid multiples of a fractional multipleOf in a bounded range (or its one point)."""
    assert numbers.low is not None and numbers.high is not None
    if numbers.low == numbers.high:
        return (numbers.witness_number,)
    step = numbers.multiple_of
    if not isinstance(step, float) or (numbers.high - numbers.low) / step > _DOMAIN_LIMIT:
        return None
    candidates = (round(k * step, numbers.decimals) for k in range(math.ceil(numbers.low / step),
                                                                    math.floor(numbers.high / step) + 1))
    return tuple(v for v in candidates if numbers.matches(v))


_ABSENT = object()


def _object_domain(objects: _Objects) -> Sequence[Any] | None:
    """Every object generated, when each property has a small explicit set of values."""
    names = [name for name, node in objects.properties if node is not None]
    names += [name for name in objects.required if name not in names]
    choices = []
    for name in names:
        values = _domain(objects.governing(name))
        if values is None:
            return None
        choices.append(list(values) if name in objects.required else [*values, _ABSENT])
    if math.prod(len(c) for c in choices) > _DOMAIN_LIMIT:
        return None
    return tuple({n: v for n, v in zip(names, combo) if v is not _ABSENT} for combo in itertools.product(*choices))


def _capacity(node: _Node | None, depth: int = 0) -> int:
    """At least how many distinct values ``node`` generates in wide mode (capped at _MANY)."""
    domain = _domain(node, depth)
    if domain is not None:
        return len(domain)
    if node is None or depth > _PROOF_DEPTH:
        return 1
    node = _deref(node)
    if isinstance(node, _Ref):
        return 1
    if isinstance(node, _Union):
        return max(_capacity(branch, depth + 1) for branch in node.preferred())
    return max(_kind_capacity(node, kind, depth) for kind in node.generate_kinds)


def _kind_capacity(node: _Simple, kind: str, depth: int) -> int:
    if kind == "string" and node.strings is not None:
        return node.strings.variety
    if kind == "array" and node.arrays is not None:
        first = node.arrays.element(0)
        return 1 if first is None or node.arrays.max_items == 0 else min(_MANY, 1 + _capacity(first, depth + 1))
    if kind == "object" and node.objects is not None:
        return _object_variety(node.objects, depth)
    return _MANY  # numbers over a range too wide to enumerate (see _kind_domain)


def _object_variety(objects: _Objects, depth: int) -> int:
    """Distinct objects generated in wide mode: optional properties come and go."""
    total = 1
    for name, node in objects.properties:
        if node is not None:
            total *= _capacity(node, depth + 1) + (name not in objects.required)
    for name in objects.required:
        node = objects.governing(name)
        if node is not None and all(name != declared for declared, _ in objects.properties):
            total *= _capacity(node, depth + 1)
    return min(total, _MANY)


# --- oneOf exclusivity proofs ---------------------------------------------------------


def _excludes(a: _Node, b: _Node, depth: int = 0) -> bool:
    """True when no value generated from ``a`` matches ``b`` (False: not provable)."""
    if depth > _PROOF_DEPTH:
        return False
    a, b = _deref(a), _deref(b)
    if isinstance(a, _Union):
        return all(_excludes(branch, b, depth + 1) for branch in a.branches)
    if isinstance(b, _Union):
        return all(_excludes(a, branch, depth + 1) for branch in b.branches)
    if a.values is not None:
        return not any(b.matches(value) for value in a.values)
    return all(_kind_excludes(a, b, kind, depth) for kind in a.generate_kinds)


def _kind_excludes(a: _Simple, b: _Simple, kind: str, depth: int) -> bool:
    if not (b.allows(kind) or (kind == "number" and b.allows("integer"))):
        return True
    if b.values is not None:
        return not any(a.matches(value) for value in b.values)
    if kind in ("integer", "number"):
        return a.numbers is not None and b.numbers is not None and _disjoint(
            _interval(a.numbers.low, a.numbers.low_exclusive, a.numbers.high, a.numbers.high_exclusive),
            _interval(b.numbers.low, b.numbers.low_exclusive, b.numbers.high, b.numbers.high_exclusive))
    if kind == "string" and a.strings is not None and b.strings is not None:
        return _disjoint(_interval(a.strings.min_length, False, a.strings.max_length, False),
                         _interval(b.strings.min_length, False, b.strings.max_length, False))
    if kind == "array" and a.arrays is not None and b.arrays is not None:
        return _disjoint(_interval(a.arrays.min_items, False, a.arrays.max_items, False),
                         _interval(b.arrays.min_items, False, b.arrays.max_items, False))
    if kind == "object" and a.objects is not None and b.objects is not None:
        for name in a.objects.required:
            mine, theirs = a.objects.governing(name), b.objects.governing(name)
            if mine is not None and (theirs is None or _excludes(mine, theirs, depth + 1)):
                return True
    return False


_Interval = tuple[float, bool, float, bool]


def _interval(low: float | None, low_open: bool, high: float | None, high_open: bool) -> _Interval:
    return (-math.inf if low is None else low, low_open, math.inf if high is None else high, high_open)


def _disjoint(a: _Interval, b: _Interval) -> bool:
    return _before(a, b) or _before(b, a)


def _before(a: _Interval, b: _Interval) -> bool:
    """Every point of ``a`` lies below every point of ``b``."""
    return a[2] < b[0] or (a[2] == b[0] and (a[3] or b[1]))


# --- formats ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _phrase_variety(max_length: int | None) -> int:
    """Distinct two-word phrases (wide mode) once cut to ``max_length``: a lower bound."""
    return len({f"{a} {b}"[:max_length] for a in WORDS for b in WORDS})


def _word(rng: random.Random) -> str:
    return rng.choice(WORDS).lower()


def _date(rng: random.Random) -> str:
    return f"{rng.randint(2020, 2026):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _time(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"


_SHORT, _LONG = min(len(w) for w in WORDS), max(len(w) for w in WORDS)
_Format = tuple[Callable[[random.Random], str], int, int, int]  # generator, shortest, longest, variety
_EMAIL: _Format = (lambda rng: f"{_word(rng)}@example.com", _SHORT + 12, _LONG + 12, len(WORDS))
_HOSTNAME: _Format = (lambda rng: f"{_word(rng)}.example.com", _SHORT + 12, _LONG + 12, len(WORDS))
_URI: _Format = (lambda rng: f"https://example.com/{_word(rng)}", _SHORT + 20, _LONG + 20, len(WORDS))
_FORMATS: dict[str, _Format] = {
    "date": (_date, 10, 10, 7 * 12 * 28),
    "date-time": (lambda rng: f"{_date(rng)}T{_time(rng)}", 20, 20, _MANY),
    "time": (_time, 9, 9, 24 * 60 * 60),
    "email": _EMAIL,
    "idn-email": _EMAIL,
    "hostname": _HOSTNAME,
    "idn-hostname": _HOSTNAME,
    "uri": _URI,
    "uri-reference": _URI,
    "iri": _URI,
    "iri-reference": _URI,
    "url": _URI,
    "uuid": (lambda rng: str(uuid.UUID(int=rng.getrandbits(128), version=4)), 36, 36, _MANY),
    "ipv4": (lambda rng: f"192.0.2.{rng.randint(1, 254)}", 9, 11, 254),
    "ipv6": (lambda rng: f"2001:db8::{rng.randint(1, 0xFFFF):x}", 11, 14, 0xFFFF),
}


# --- the compiler -----------------------------------------------------------------------


@attrs.frozen
class CompiledSchema:
    """A validated parameters schema, ready to generate arguments from."""

    root: _Node

    def generate(self, rng: random.Random, options: ToolCallOptions) -> object:
        return self.root.generate(_Context(rng, options))


_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def compile_schema(schema: object, *, path: str) -> CompiledSchema:
    """Compile a tool's ``parameters`` (None: no parameters, arguments ``{}``).

    Raises ToolSchemaError naming ``path`` plus the JSON path inside the schema.
    Clients send the same tools with every request, so compiled schemas are cached by
    their JSON text (key order kept: it orders the generated arguments).
    """
    try:
        text = orjson.dumps(schema)
    except orjson.JSONEncodeError as exc:
        raise ToolSchemaError(path, "type", f"is not a JSON document llmsim can read: {exc}") from None
    return _compile_text(text, path)


@functools.lru_cache(maxsize=512)
def _compile_text(text: bytes, path: str) -> CompiledSchema:
    schema = orjson.loads(text)
    return _Compiler(_EMPTY_OBJECT if schema is None else schema, path).compile_root()


class _Compiler:
    """One schema document compiled to nodes; $ref targets are compiled once and shared."""

    def __init__(self, document: object, path: str) -> None:
        self.document = document
        self.path = path
        self.refs: dict[str, _Ref] = {}
        self.pending: dict[str, int] = {}  # $ref being compiled -> structure depth at its start
        self.structure = 0  # object/array nesting of the schema being compiled
        self.nesting = 0  # schemas being compiled, one inside the other
        self.one_ofs: list[tuple[_Union, str]] = []
        self.unique_arrays: list[_Arrays] = []

    def compile_root(self) -> CompiledSchema:
        """Compile, then run the checks that need the whole graph (refs resolved)."""
        root = self.compile(self.document, self.path, root=True)
        self._solve_costs()
        for union, path in self.one_ofs:
            _check_exclusive(union, path)
        for spec in self.unique_arrays:
            _check_unique(spec)
        _check_objects(root, self.path)
        size = _cost(root)[1]
        if size > MAX_MIN_SIZE:
            raise ToolSchemaError(self.path, "minItems", f"and minLength force arguments of about {size:.0f} values "
                                  f"or more; llmsim generates at most {MAX_MIN_SIZE}")
        return CompiledSchema(root)

    # --- dispatch ---------------------------------------------------------------------

    def compile(self, schema: object, path: str, *, root: bool = False) -> _Node:
        self.nesting += 1
        try:
            if self.nesting > MAX_NESTING:
                raise ToolSchemaError(path, "properties", f"and items nest deeper than {MAX_NESTING} levels; "
                                      "llmsim refuses deeper schemas")
            return self._compile(schema, path, root=root)
        finally:
            self.nesting -= 1

    def _compile(self, schema: object, path: str, *, root: bool) -> _Node:
        if schema is True:
            schema = {}
        if schema == {} and not root:
            return _ANY
        if schema is False:
            raise ToolSchemaError(path, "false", "schema accepts no value, so no arguments can be generated")
        if not isinstance(schema, dict):
            raise ToolSchemaError(path, "type", f"a schema must be a JSON object or boolean, got {schema!r}")
        schema = normalize(schema, path)
        constraints = SUPPORTED.intersection(schema)
        if "$ref" in schema and constraints == {"$ref"}:
            return self.ref(schema["$ref"], path)
        combinators = [k for k in COMBINATORS if k in schema]
        siblings = constraints - set(combinators)
        if "$ref" in schema or "allOf" in schema or (combinators and siblings) or len(combinators) > 1:
            return self.compile(self.merge([(schema, path)], path), path, root=root)
        if combinators:
            return self.union(schema[combinators[0]], combinators[0] == "oneOf", at(path, combinators[0]))
        return self.simple(schema, path, root=root)

    def union(self, branches: list[object], exclusive: bool, path: str) -> _Node:
        nodes = [self.compile(b, at(path, i)) for i, b in enumerate(branches) if b is not False]
        if not nodes:
            raise ToolSchemaError(path, "oneOf" if exclusive else "anyOf", "has only false branches: no value is valid")
        if len(nodes) == 1:
            return nodes[0]
        union = _Union(tuple(nodes), exclusive)
        if exclusive:
            self.one_ofs.append((union, path))
        return union

    # --- $ref -------------------------------------------------------------------------

    def ref(self, reference: str, path: str) -> _Node:
        if reference in self.pending and self.pending[reference] == self.structure:
            raise ToolSchemaError(path, "$ref", f"{reference!r} refers back to itself with no object or array in "
                                  "between, so it has no finite value")
        if reference in self.refs:
            return self.refs[reference]
        target, target_path = self.resolve(reference, path)
        node = self.refs[reference] = _Ref(reference, target_path)
        self.pending[reference] = self.structure
        node.target = self.compile(target, target_path)
        del self.pending[reference]
        return node

    def resolve(self, reference: str, path: str) -> tuple[object, str]:
        if not reference.startswith("#") or (len(reference) > 1 and not reference.startswith("#/")):
            raise ToolSchemaError(path, "$ref", f"{reference!r} is not supported: only references inside the "
                                  "schema (like '#/$defs/Name' or '#/definitions/Name') are")
        target, target_path = self.document, self.path
        for raw in reference[2:].split("/") if len(reference) > 1 else ():
            segment = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and segment in target:
                target, target_path = target[segment], at(target_path, segment)
            elif isinstance(target, list) and segment.isdigit() and int(segment) < len(target):
                target, target_path = target[int(segment)], at(target_path, int(segment))
            else:
                raise ToolSchemaError(path, "$ref", f"{reference!r} points to nothing in the schema")
        return target, target_path

    # --- allOf and siblings: merge into one schema --------------------------------------

    def merge(self, parts: list[tuple[object, str]], path: str) -> dict[str, Any]:
        flat = list(self.flatten(parts, path, 0))
        combos = [(k, part[k], where) for part, where in flat for k in COMBINATORS if k in part]
        merged = merge_parts([({k: v for k, v in p.items() if k not in COMBINATORS}, where) for p, where in flat], path)
        if not combos:
            return merged
        kinds = {kind for kind, _, _ in combos}
        if len(kinds) > 1:
            raise ToolSchemaError(path, "allOf", "combines anyOf with oneOf; llmsim supports only one kind of "
                                  "combinator per merged schema")
        lists = [branches for _, branches, _ in combos]
        if math.prod(len(b) for b in lists) > _MAX_BRANCHES:
            raise ToolSchemaError(path, combos[0][0], f"combined in allOf yields more than {_MAX_BRANCHES} branches")
        kind = kinds.pop()
        return {kind: [all_of([*choice, merged]) for choice in itertools.product(*lists)]}

    def flatten(self, parts: Sequence[tuple[object, str]], path: str, depth: int
                ) -> Iterator[tuple[dict[str, Any], str]]:
        """The dict schemas of ``parts`` with every allOf and $ref inlined."""
        if depth > _MERGE_DEPTH:
            raise ToolSchemaError(path, "$ref", f"allOf/$ref nesting is deeper than {_MERGE_DEPTH}: a circular "
                                  "reference through allOf or $ref siblings?")
        for part, where in parts:
            if part is True:
                continue
            if part is False:
                raise ToolSchemaError(where, "allOf", "includes a false schema: no value is valid")
            if not isinstance(part, dict):
                raise ToolSchemaError(where, "type", f"a schema must be a JSON object or boolean, got {part!r}")
            part = normalize(part, where)
            inner: list[tuple[object, str]] = []
            if "$ref" in part:
                inner.append(self.resolve(part["$ref"], where))
            inner += [(sub, at(where, "allOf", i)) for i, sub in enumerate(part.get("allOf", ()))]
            rest = {k: v for k, v in part.items() if k not in ("$ref", "allOf")}
            if inner:
                yield from self.flatten([(rest, where), *inner], path, depth + 1)
            else:
                yield rest, where

    # --- one schema object ----------------------------------------------------------------

    def simple(self, schema: dict[str, Any], path: str, *, root: bool = False) -> _Simple:
        kinds = types_of(schema)
        if root:
            if "object" not in kinds:
                raise ToolSchemaError(path, "type", "must be 'object': tool arguments are a JSON object")
            kinds = frozenset({"object"})
        generate_kinds = _generate_kinds(schema, kinds)
        node = _Simple(
            kinds=kinds,
            generate_kinds=generate_kinds,
            numbers=self.numbers(schema, path, kinds, generate_kinds) if kinds & {"integer", "number"} else None,
            strings=self.strings(schema, path) if "string" in kinds else None,
            arrays=self.arrays(schema, path) if "array" in kinds else None,
            objects=self.objects(schema, path) if "object" in kinds else None,
        )
        if "enum" not in schema and "const" not in schema:
            return node
        keyword = "const" if "const" in schema else "enum"
        candidates = [schema["const"]] if "const" in schema else schema["enum"]
        if "const" in schema and "enum" in schema:
            candidates = [v for v in schema["enum"] if json_key(v) == json_key(schema["const"])]
        values = tuple(v for v in candidates if node.matches(v))
        if not values:
            raise ToolSchemaError(at(path, keyword), keyword, "has no value that satisfies the other keywords "
                                  "of its schema (type, bounds, pattern...)")
        return attrs.evolve(node, values=tuple({json_key(v): v for v in values}.values()))

    def numbers(self, schema: dict[str, Any], path: str, kinds: frozenset[str], generate_kinds: tuple[str, ...]
                ) -> _Numbers:
        low, low_exclusive = _bound(schema, "minimum", "exclusiveMinimum", max)
        high, high_exclusive = _bound(schema, "maximum", "exclusiveMaximum", min)
        step = schema.get("multipleOf")
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if isinstance(step, float) and "number" not in kinds:
            raise ToolSchemaError(at(path, "multipleOf"), "multipleOf", f"is {step}: integers need an integer "
                                  "multipleOf")
        spec = _Numbers(low, low_exclusive, high, high_exclusive, step, _decimals(step), None, None)
        integer = _integer_witness(spec)
        number = integer if integer is not None else _number_witness(spec)
        for kind, witness in (("integer", integer), ("number", number)):
            if kind in generate_kinds and witness is None:
                raise ToolSchemaError(path, "minimum", f"and maximum/exclusiveMinimum/exclusiveMaximum/multipleOf "
                                      f"leave no valid {kind}")
        return attrs.evolve(spec, witness_integer=integer, witness_number=number)

    def strings(self, schema: dict[str, Any], path: str) -> _Strings:
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if low > MAX_MIN_LENGTH:
            raise ToolSchemaError(at(path, "minLength"), "minLength", f"is {low}; llmsim generates strings of at "
                                  f"most {MAX_MIN_LENGTH} characters")
        if high is not None and low > high:
            raise ToolSchemaError(at(path, "minLength"), "minLength", f"({low}) exceeds maxLength ({high})")
        pattern, lengths = None, ()
        if "pattern" in schema:
            try:
                pattern = compile_pattern(schema["pattern"])
            except PatternError as exc:
                raise ToolSchemaError(at(path, "pattern"), "pattern", str(exc)) from None
            lengths = pattern.lengths(low, high)
            if not lengths:
                raise ToolSchemaError(at(path, "pattern"), "pattern", f"cannot produce a string of "
                                      f"{low}..{'' if high is None else high} characters (minLength/maxLength)")
        generator, shortest, longest, variety = _FORMATS.get(schema.get("format", ""), (None, 0, 0, 0))
        if generator is None or low > shortest or (high is not None and longest > high):
            generator, variety = None, _phrase_variety(high)
        if pattern is not None:
            variety = min(_MANY, sum(pattern.root.counts[n] for n in lengths))
        return _Strings(low, high, pattern, lengths, generator, variety)

    def arrays(self, schema: dict[str, Any], path: str) -> _Arrays:
        self.structure += 1
        prefix_schemas = schema.get("prefixItems", [])
        cut = next((i for i, s in enumerate(prefix_schemas) if s is False), len(prefix_schemas))
        prefix = tuple(self.compile(s, at(path, "prefixItems", i)) for i, s in enumerate(prefix_schemas[:cut]))
        items_schema = schema.get("items", True)
        closed = items_schema is False or cut < len(prefix_schemas)
        items = None if closed else self.compile(items_schema, at(path, "items"))
        self.structure -= 1
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        if items is None:
            high = len(prefix) if high is None else min(high, len(prefix))
        if low > MAX_MIN_ITEMS:
            raise ToolSchemaError(at(path, "minItems"), "minItems", f"is {low}; llmsim generates at most "
                                  f"{MAX_MIN_ITEMS} items")
        if high is not None and low > high:
            raise ToolSchemaError(at(path, "minItems"), "minItems", f"({low}) exceeds the most items allowed "
                                  f"({high}, from maxItems, items or prefixItems)")
        spec = _Arrays(low, high, bool(schema.get("uniqueItems", False)), prefix, items, path)
        if spec.unique:
            self.unique_arrays.append(spec)
        return spec

    def objects(self, schema: dict[str, Any], path: str) -> _Objects:
        self.structure += 1
        properties = tuple(
            (name, None if sub is False else self.compile(sub, at(path, "properties", name)))
            for name, sub in schema.get("properties", {}).items()
        )
        extra = schema.get("additionalProperties", True)
        additional = None if extra is False else self.compile(extra, at(path, "additionalProperties"))
        self.structure -= 1
        required = tuple(dict.fromkeys(schema.get("required", ())))
        spec = _Objects(properties, required, additional)
        for name in required:
            if spec.governing(name) is None:
                raise ToolSchemaError(at(path, "required"), "required", f"lists {name!r}, which its schema forbids "
                                      "(false in properties, or undeclared with additionalProperties false)")
        return spec

    # --- whole-schema checks ----------------------------------------------------------

    def _solve_costs(self) -> None:
        """Smallest-value costs of every $ref, by iterating to a fixpoint (refs may recurse)."""
        for _ in range(2 * len(self.refs) + 2):
            changed = False
            for ref in self.refs.values():
                depth, size = _cost(ref.resolved())
                if (depth + 1, size) < ref.cost:
                    ref.cost, changed = (depth + 1, size), True
            if not changed:
                break
        for ref in self.refs.values():
            if math.isinf(ref.cost[0]):
                raise ToolSchemaError(ref.path, "$ref", f"{ref.key!r} has no finite value: every instance would "
                                      "contain itself; make the recursive property optional or allow empty arrays")


def _check_objects(node: _Node, path: str) -> None:
    """The parameters schema must generate JSON objects, whichever branch is chosen."""
    node = _deref(node)
    if isinstance(node, _Union):
        for i, branch in enumerate(node.branches):
            _check_objects(branch, at(path, "oneOf" if node.exclusive else "anyOf", i))
    elif isinstance(node, _Simple) and node.values is not None:
        if not all(isinstance(v, dict) for v in node.values):
            raise ToolSchemaError(path, "enum", "must list only objects: tool arguments are a JSON object")
    elif isinstance(node, _Simple) and node.generate_kinds != ("object",):
        raise ToolSchemaError(path, "type", "must be 'object': tool arguments are a JSON object")


def _check_unique(spec: _Arrays) -> None:
    """uniqueItems must be reachable: enough distinct values for every position up to minItems."""
    domain = _domain(spec.items) if not spec.prefix else None
    if domain is not None:
        if len(domain) < spec.min_items:
            raise ToolSchemaError(at(spec.path, "uniqueItems"), "uniqueItems", f"needs {spec.min_items} distinct "
                                  f"items but llmsim can generate only {len(domain)} different values for them")
        return
    needs = [(spec.prefix[i], i + 1) for i in range(min(spec.min_items, len(spec.prefix)))]
    if spec.min_items > len(spec.prefix) and spec.items is not None:
        needs.append((spec.items, spec.min_items))
    for node, count in needs:
        exact = _domain(node)
        available = len(exact) if exact is not None else _capacity(node)
        if count > 1 and available < (count if exact is not None else 2 * count):  # random draws need head-room
            raise ToolSchemaError(at(spec.path, "uniqueItems"), "uniqueItems", f"needs {spec.min_items} distinct "
                                  f"items but llmsim can generate only about {available} different values for them; "
                                  "lower minItems or widen the items schema")


def _check_exclusive(union: _Union, path: str) -> None:
    for (i, a), (j, b) in itertools.permutations(enumerate(union.branches), 2):
        if not _excludes(a, b):
            raise ToolSchemaError(path, "oneOf", f"branches {i} and {j} may both match one value, and llmsim can "
                                  "only keep oneOf valid when branches differ by type, enum/const, numeric or "
                                  "length ranges, or a required property (a discriminator); use anyOf instead")


# --- keyword checks -----------------------------------------------------------------------


def _generate_kinds(schema: Mapping[str, Any], kinds: frozenset[str]) -> tuple[str, ...]:
    """The types to generate: the listed ones (null only if alone), else the one its keywords imply."""
    if "type" in schema:
        listed = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return tuple(k for k in listed if k != "null" and k in kinds) or ("null",)
    if kinds == {"object"}:
        return ("object",)
    return next(((kind,) for kind, keywords in KIND_KEYWORDS if any(k in schema for k in keywords)), ("string",))


def _bound(schema: Mapping[str, Any], inclusive: str, exclusive: str, stricter: Callable[..., Any]
           ) -> tuple[int | float | None, bool]:
    """The effective bound and whether it is exclusive, from e.g. minimum and exclusiveMinimum."""
    candidates = [(schema[inclusive], False)] if inclusive in schema else []
    if exclusive in schema:
        candidates.append((schema[exclusive], True))
    if not candidates:
        return None, False
    value = stricter(v for v, _ in candidates)
    return value, any(v == value and excl for v, excl in candidates)


def _integer_witness(spec: _Numbers) -> int | None:
    """The valid integer nearest to 0, or None when there is none."""
    if isinstance(spec.multiple_of, float):
        return None
    step = spec.multiple_of or 1
    low, high = spec.integer_range()
    k = _fit((0, 0), None if low is None else -(-low // step), None if high is None else high // step)[0]
    return k * step if spec.matches(k * step) else None


def _number_witness(spec: _Numbers) -> int | float | None:
    """A valid number, or None: points of the interval, or multiples scanned around its start."""
    anchor = _fit((0, 0), spec.low, spec.high)[0]
    if spec.multiple_of is not None and not math.isfinite(anchor / spec.multiple_of):
        return None
    if spec.multiple_of is None:
        candidates = [anchor]
        if spec.low is not None and spec.high is not None:
            candidates.append((spec.low + spec.high) / 2)
        candidates += [anchor + 1, anchor - 1]
        return next((v for v in candidates if spec.matches(v)), None)
    start = math.ceil(anchor / spec.multiple_of)
    for k in itertools.chain.from_iterable((start + i, start - i - 1) for i in range(500)):
        value = round(k * spec.multiple_of, spec.decimals)
        if spec.matches(value):
            return value
    return None


def _decimals(step: int | float | None) -> int:
    """Decimal places of a fractional multipleOf, to round its multiples like a person would."""
    if not isinstance(step, float):
        return 0
    return max(0, -int(Decimal(repr(step)).as_tuple().exponent))
