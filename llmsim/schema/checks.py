"""Checks that need the whole compiled tree, and the analyses they rest on.

They run once every ``$ref`` is resolved (references may recurse), and each turns a
promise of :mod:`llmsim.schema.jsonschema` into a proof or a refusal:

- tool arguments are a JSON object, whichever branch generation picks;
- ``uniqueItems`` can be met: the items have an explicit value set large enough, or
  enough variety (with head-room) for random draws to become distinct;
- ``oneOf`` branches exclude each other, so a value generated from one branch fails
  all the others.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from llmsim.schema.formats import MANY
from llmsim.schema.keywords import ToolSchemaError, at, json_key
from llmsim.schema.nodes import Arrays, Node, Numbers, Objects, Ref, Simple, Union

__all__ = ["check_exclusive", "check_objects", "check_unique", "unique_domain"]

_PROOF_DEPTH = 16  # nesting explored when proving oneOf branches exclusive
_DOMAIN_LIMIT = 10_000  # largest value set enumerated for uniqueItems


def check_objects(node: Node, path: str) -> None:
    """The parameters schema must generate JSON objects, whichever branch is chosen."""
    node = _deref(node)
    if isinstance(node, Union):
        for i, branch in enumerate(node.branches):
            check_objects(branch, at(path, "oneOf" if node.exclusive else "anyOf", i))
    elif isinstance(node, Simple) and node.values is not None:
        if not all(isinstance(v, dict) for v in node.values):
            raise ToolSchemaError(path, "enum", "must list only objects: tool arguments are a JSON object")
    elif isinstance(node, Simple) and node.generate_kinds != ("object",):
        raise ToolSchemaError(path, "type", "must be 'object': tool arguments are a JSON object")


def unique_domain(spec: Arrays) -> Sequence[Any] | None:
    """The explicit value set a uniqueItems array samples from (None: draw until distinct)."""
    return _domain(spec.items) if not spec.prefix else None


def check_unique(spec: Arrays) -> None:
    """uniqueItems must be reachable: enough distinct values for every position up to minItems.

    The compiler has filled in ``spec.domain`` (see :func:`unique_domain`).
    """
    domain = spec.domain
    if domain is not None:
        if len(domain) < spec.min_items:
            raise ToolSchemaError(
                at(spec.path, "uniqueItems"),
                "uniqueItems",
                f"needs {spec.min_items} distinct "
                f"items but llmsim can generate only {len(domain)} different values for them",
            )
        return
    needs = [(spec.prefix[i], i + 1) for i in range(min(spec.min_items, len(spec.prefix)))]
    if spec.min_items > len(spec.prefix) and spec.items is not None:
        needs.append((spec.items, spec.min_items))
    for node, count in needs:
        exact = _domain(node)
        available = len(exact) if exact is not None else _capacity(node)
        if count > 1 and available < (count if exact is not None else 2 * count):  # random draws need head-room
            raise ToolSchemaError(
                at(spec.path, "uniqueItems"),
                "uniqueItems",
                f"needs {spec.min_items} distinct "
                f"items but llmsim can generate only about {available} different values for them; "
                "lower minItems or widen the items schema",
            )


def check_exclusive(union: Union, path: str) -> None:
    for (i, a), (j, b) in itertools.permutations(enumerate(union.branches), 2):
        if not _excludes(a, b):
            raise ToolSchemaError(
                path,
                "oneOf",
                f"branches {i} and {j} may both match one value, and llmsim can "
                "only keep oneOf valid when branches differ by type, enum/const, numeric or "
                "length ranges, or a required property (a discriminator); use anyOf instead",
            )


def _deref(node: Node) -> Node:
    """Follow references (a chain, or one still being compiled, stays a Ref)."""
    for _ in range(_PROOF_DEPTH):
        if not isinstance(node, Ref) or node.target is None:
            return node
        node = node.target
    return node


# --- explicit value sets (for uniqueItems) ----------------------------------------------


def _domain(node: Node | None, depth: int = 0) -> Sequence[Any] | None:
    """Every value ``node`` generates, when that is an explicit set of manageable size."""
    if node is None or depth > _PROOF_DEPTH:
        return None
    node = _deref(node)
    if isinstance(node, Ref):
        return None
    if isinstance(node, Simple) and node.values is not None:
        return node.values
    parts = (
        [_domain(b, depth + 1) for b in node.preferred()]
        if isinstance(node, Union)
        else [_kind_domain(node, kind) for kind in node.generate_kinds]
    )
    known = [part for part in parts if part is not None]
    if len(known) < len(parts):
        return None
    if len(known) == 1:
        return known[0]
    if sum(len(part) for part in known) > _DOMAIN_LIMIT:
        return None
    return tuple({json_key(v): v for part in known for v in part}.values())


def _kind_domain(node: Simple, kind: str) -> Sequence[Any] | None:
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


def _number_domain(numbers: Numbers) -> Sequence[Any] | None:
    """The valid multiples of a fractional multipleOf in a bounded range (or its one point)."""
    assert numbers.low is not None and numbers.high is not None
    if numbers.low == numbers.high:
        return (numbers.witness_number,)
    step = numbers.multiple_of
    if not isinstance(step, float) or (numbers.high - numbers.low) / step > _DOMAIN_LIMIT:
        return None
    candidates = (
        round(k * step, numbers.decimals)
        for k in range(math.ceil(numbers.low / step), math.floor(numbers.high / step) + 1)
    )
    return tuple(v for v in candidates if numbers.matches(v))


_ABSENT = object()


def _object_domain(objects: Objects) -> Sequence[Any] | None:
    """Every object generated, when each property has a small explicit set of values."""
    names = [name for name, node in objects.properties if node is not None]
    names += [name for name in objects.required if name not in objects.declared]
    choices = []
    for name in names:
        values = _domain(objects.governing(name))
        if values is None:
            return None
        choices.append(list(values) if name in objects.required_names else [*values, _ABSENT])
    if math.prod(len(c) for c in choices) > _DOMAIN_LIMIT:
        return None
    return tuple(
        {n: v for n, v in zip(names, combo, strict=True) if v is not _ABSENT} for combo in itertools.product(*choices)
    )


def _capacity(node: Node | None, depth: int = 0) -> int:
    """At least how many distinct values ``node`` generates in wide mode (capped at MANY)."""
    domain = _domain(node, depth)
    if domain is not None:
        return len(domain)
    if node is None or depth > _PROOF_DEPTH:
        return 1
    node = _deref(node)
    if isinstance(node, Ref):
        return 1
    if isinstance(node, Union):
        return max(_capacity(branch, depth + 1) for branch in node.preferred())
    return max(_kind_capacity(node, kind, depth) for kind in node.generate_kinds)


def _kind_capacity(node: Simple, kind: str, depth: int) -> int:
    if kind == "string" and node.strings is not None:
        return node.strings.variety
    if kind == "array" and node.arrays is not None:
        first = node.arrays.element(0)
        return 1 if first is None or node.arrays.max_items == 0 else min(MANY, 1 + _capacity(first, depth + 1))
    if kind == "object" and node.objects is not None:
        return _object_variety(node.objects, depth)
    return MANY  # numbers over a range too wide to enumerate (see _kind_domain)


def _object_variety(objects: Objects, depth: int) -> int:
    """Distinct objects generated in wide mode: optional properties come and go."""
    total = 1
    for name, node in objects.properties:
        if node is not None:
            total *= _capacity(node, depth + 1) + (name not in objects.required_names)
    for name in objects.required:
        node = objects.governing(name)
        if node is not None and name not in objects.declared:
            total *= _capacity(node, depth + 1)
    return min(total, MANY)


# --- oneOf exclusivity proofs ---------------------------------------------------------


def _excludes(a: Node, b: Node, depth: int = 0) -> bool:
    """True when no value generated from ``a`` matches ``b`` (False: not provable)."""
    if depth > _PROOF_DEPTH:
        return False
    a, b = _deref(a), _deref(b)
    if isinstance(a, Union):
        return all(_excludes(branch, b, depth + 1) for branch in a.branches)
    if isinstance(b, Union):
        return all(_excludes(a, branch, depth + 1) for branch in b.branches)
    if isinstance(a, Ref) or isinstance(b, Ref):
        return False  # unresolved (still being compiled, or too long a chain): nothing is provable
    if a.values is not None:
        return not any(b.matches(value) for value in a.values)
    return all(_kind_excludes(a, b, kind, depth) for kind in a.generate_kinds)


def _kind_excludes(a: Simple, b: Simple, kind: str, depth: int) -> bool:
    if not (b.allows(kind) or (kind == "number" and b.allows("integer"))):
        return True
    if b.values is not None:
        return not any(a.matches(value) for value in b.values)
    if kind in ("integer", "number"):
        return (
            a.numbers is not None
            and b.numbers is not None
            and _disjoint(
                _interval(a.numbers.low, a.numbers.low_exclusive, a.numbers.high, a.numbers.high_exclusive),
                _interval(b.numbers.low, b.numbers.low_exclusive, b.numbers.high, b.numbers.high_exclusive),
            )
        )
    if kind == "string" and a.strings is not None and b.strings is not None:
        return _disjoint(
            _interval(a.strings.min_length, False, a.strings.max_length, False),
            _interval(b.strings.min_length, False, b.strings.max_length, False),
        )
    if kind == "array" and a.arrays is not None and b.arrays is not None:
        return _disjoint(
            _interval(a.arrays.min_items, False, a.arrays.max_items, False),
            _interval(b.arrays.min_items, False, b.arrays.max_items, False),
        )
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
