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

Generation knobs (:class:`~llmsim.options.ToolCallOptions`) are
llm-d-inference-sim's, with its defaults; explicit schema bounds always win over them.
This module is the compiler; around it, :mod:`llmsim.schema.keywords` checks
keyword values and merges raw schemas, :mod:`llmsim.schema.nodes` holds the
compiled tree and generates from it, :mod:`llmsim.schema.checks` proves the
whole-tree properties above, :mod:`llmsim.schema.limits` bounds the schema's size
and complexity, and :mod:`llmsim.schema.formats` supplies words and format values.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

import attrs
import orjson

from llmsim.options import ToolCallOptions
from llmsim.schema.checks import check_exclusive, check_objects, check_unique, unique_domain
from llmsim.schema.formats import FORMATS, MANY, phrase_variety
from llmsim.schema.keywords import (
    COMBINATORS,
    KIND_KEYWORDS,
    SUPPORTED,
    ToolSchemaError,
    all_of,
    at,
    json_key,
    merge_parts,
    normalize,
    types_of,
)
from llmsim.schema.limits import Budget, check_enum, check_min_items, check_min_length, check_min_size
from llmsim.schema.nodes import (
    ANY,
    Arrays,
    Context,
    Node,
    Numbers,
    Objects,
    Ref,
    Simple,
    Strings,
    Union,
    fit,
    smallest_cost,
)
from llmsim.schema.regex import PatternError, StringPattern, compile_pattern

__all__ = ["CompiledSchema", "ToolSchemaError", "compile_schema"]

_MERGE_DEPTH = 32  # nested allOf/$ref merges (deeper means a $ref cycle)
_MAX_BRANCHES = 64  # branches after distributing several anyOf/oneOf of an allOf


@attrs.frozen
class CompiledSchema:
    """A validated parameters schema, ready to generate arguments from."""

    root: Node

    def generate(self, rng: random.Random, options: ToolCallOptions) -> object:
        return self.root.generate(Context(rng, options))


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
        self.refs: dict[str, Ref] = {}
        self.pending: dict[str, int] = {}  # $ref being compiled -> structure depth at its start
        self.structure = 0  # object/array nesting of the schema being compiled
        self.budget = Budget()
        self.one_ofs: list[tuple[Union, str]] = []
        self.unique_arrays: list[Arrays] = []

    def compile_root(self) -> CompiledSchema:
        """Compile, then run the checks that need the whole graph (refs resolved)."""
        root = self.compile(self.document, self.path, root=True)
        self._solve_costs()
        for union, path in self.one_ofs:
            check_exclusive(union, path)
        for spec in self.unique_arrays:
            spec.domain = unique_domain(spec)
            check_unique(spec)
        check_objects(root, self.path)
        check_min_size(smallest_cost(root)[1], self.path)
        return CompiledSchema(root)

    # --- dispatch ---------------------------------------------------------------------

    def compile(self, schema: object, path: str, *, root: bool = False) -> Node:
        self.budget.enter(path)
        try:
            return self._compile(schema, path, root=root)
        finally:
            self.budget.leave()

    def _compile(self, schema: object, path: str, *, root: bool) -> Node:
        if schema is True:
            schema = {}
        if schema == {} and not root:
            return ANY
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

    def union(self, branches: list[object], exclusive: bool, path: str) -> Node:
        nodes = [self.compile(b, at(path, i)) for i, b in enumerate(branches) if b is not False]
        if not nodes:
            raise ToolSchemaError(path, "oneOf" if exclusive else "anyOf", "has only false branches: no value is valid")
        if len(nodes) == 1:
            return nodes[0]
        union = Union(tuple(nodes), exclusive)
        if exclusive:
            self.one_ofs.append((union, path))
        return union

    # --- $ref -------------------------------------------------------------------------

    def ref(self, reference: str, path: str) -> Node:
        if reference in self.pending and self.pending[reference] == self.structure:
            raise ToolSchemaError(
                path,
                "$ref",
                f"{reference!r} refers back to itself with no object or array in between, so it has no finite value",
            )
        if reference in self.refs:
            return self.refs[reference]
        target, target_path = self.resolve(reference, path)
        node = self.refs[reference] = Ref(reference, target_path)
        self.pending[reference] = self.structure
        node.target = self.compile(target, target_path)
        del self.pending[reference]
        return node

    def resolve(self, reference: str, path: str) -> tuple[object, str]:
        if not reference.startswith("#") or (len(reference) > 1 and not reference.startswith("#/")):
            raise ToolSchemaError(
                path,
                "$ref",
                f"{reference!r} is not supported: only references inside the "
                "schema (like '#/$defs/Name' or '#/definitions/Name') are",
            )
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
            raise ToolSchemaError(
                path,
                "allOf",
                "combines anyOf with oneOf; llmsim supports only one kind of combinator per merged schema",
            )
        lists = [branches for _, branches, _ in combos]
        if math.prod(len(b) for b in lists) > _MAX_BRANCHES:
            raise ToolSchemaError(path, combos[0][0], f"combined in allOf yields more than {_MAX_BRANCHES} branches")
        kind = kinds.pop()
        return {kind: [all_of([*choice, merged]) for choice in itertools.product(*lists)]}

    def flatten(
        self, parts: Sequence[tuple[object, str]], path: str, depth: int
    ) -> Iterator[tuple[dict[str, Any], str]]:
        """The dict schemas of ``parts`` with every allOf and $ref inlined."""
        if depth > _MERGE_DEPTH:
            raise ToolSchemaError(
                path,
                "$ref",
                f"allOf/$ref nesting is deeper than {_MERGE_DEPTH}: a circular "
                "reference through allOf or $ref siblings?",
            )
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

    def simple(self, schema: dict[str, Any], path: str, *, root: bool = False) -> Simple:
        kinds = types_of(schema)
        if root:
            if "object" not in kinds:
                raise ToolSchemaError(path, "type", "must be 'object': tool arguments are a JSON object")
            kinds = frozenset({"object"})
        generate_kinds = _generate_kinds(schema, kinds)
        node = Simple(
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
        check_enum(len(candidates), path)
        if "const" in schema and "enum" in schema:
            candidates = [v for v in schema["enum"] if json_key(v) == json_key(schema["const"])]
        values = tuple(v for v in candidates if node.matches(v))
        if not values:
            raise ToolSchemaError(
                at(path, keyword),
                keyword,
                "has no value that satisfies the other keywords of its schema (type, bounds, pattern...)",
            )
        return attrs.evolve(node, values=tuple({json_key(v): v for v in values}.values()))

    def numbers(
        self, schema: dict[str, Any], path: str, kinds: frozenset[str], generate_kinds: tuple[str, ...]
    ) -> Numbers:
        low, low_exclusive = _bound(schema, "minimum", "exclusiveMinimum", max)
        high, high_exclusive = _bound(schema, "maximum", "exclusiveMaximum", min)
        step = schema.get("multipleOf")
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if isinstance(step, float) and "number" not in kinds:
            raise ToolSchemaError(
                at(path, "multipleOf"), "multipleOf", f"is {step}: integers need an integer multipleOf"
            )
        spec = Numbers(low, low_exclusive, high, high_exclusive, step, _decimals(step), None, None)
        integer = _integer_witness(spec)
        number = integer if integer is not None else _number_witness(spec)
        for kind, witness in (("integer", integer), ("number", number)):
            if kind in generate_kinds and witness is None:
                raise ToolSchemaError(
                    path, "minimum", f"and maximum/exclusiveMinimum/exclusiveMaximum/multipleOf leave no valid {kind}"
                )
        return attrs.evolve(spec, witness_integer=integer, witness_number=number)

    def strings(self, schema: dict[str, Any], path: str) -> Strings:
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        check_min_length(low, path)
        if high is not None and low > high:
            raise ToolSchemaError(at(path, "minLength"), "minLength", f"({low}) exceeds maxLength ({high})")
        pattern: StringPattern | None = None
        lengths: tuple[int, ...] = ()
        if "pattern" in schema:
            try:
                pattern = compile_pattern(schema["pattern"])
            except PatternError as exc:
                raise ToolSchemaError(at(path, "pattern"), "pattern", str(exc)) from None
            lengths = pattern.lengths(low, high)
            if not lengths:
                raise ToolSchemaError(
                    at(path, "pattern"),
                    "pattern",
                    f"cannot produce a string of "
                    f"{low}..{'' if high is None else high} characters (minLength/maxLength)",
                )
        generator, shortest, longest, variety = FORMATS.get(schema.get("format", ""), (None, 0, 0, 0))
        if generator is None or low > shortest or (high is not None and longest > high):
            generator, variety = None, phrase_variety(high)
        if pattern is not None:
            variety = min(MANY, sum(pattern.root.counts[n] for n in lengths))
        return Strings(low, high, pattern, lengths, generator, variety)

    def arrays(self, schema: dict[str, Any], path: str) -> Arrays:
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
        check_min_items(low, path)
        if high is not None and low > high:
            raise ToolSchemaError(
                at(path, "minItems"),
                "minItems",
                f"({low}) exceeds the most items allowed ({high}, from maxItems, items or prefixItems)",
            )
        spec = Arrays(low, high, bool(schema.get("uniqueItems", False)), prefix, items, path)
        if spec.unique:
            self.unique_arrays.append(spec)
        return spec

    def objects(self, schema: dict[str, Any], path: str) -> Objects:
        self.budget.add_properties(schema, path)
        self.structure += 1
        properties = tuple(
            (name, None if sub is False else self.compile(sub, at(path, "properties", name)))
            for name, sub in schema.get("properties", {}).items()
        )
        extra = schema.get("additionalProperties", True)
        additional = None if extra is False else self.compile(extra, at(path, "additionalProperties"))
        self.structure -= 1
        required = tuple(dict.fromkeys(schema.get("required", ())))
        spec = Objects(properties, required, additional)
        for name in required:
            if spec.governing(name) is None:
                raise ToolSchemaError(
                    at(path, "required"),
                    "required",
                    f"lists {name!r}, which its schema forbids "
                    "(false in properties, or undeclared with additionalProperties false)",
                )
        return spec

    # --- whole-schema checks ----------------------------------------------------------

    def _solve_costs(self) -> None:
        """Smallest-value costs of every $ref, by iterating to a fixpoint (refs may recurse)."""
        for _ in range(2 * len(self.refs) + 2):
            changed = False
            for ref in self.refs.values():
                depth, size = smallest_cost(ref.resolved())
                if (depth + 1, size) < ref.cost:
                    ref.cost, changed = (depth + 1, size), True
            if not changed:
                break
        for ref in self.refs.values():
            if math.isinf(ref.cost[0]):
                raise ToolSchemaError(
                    ref.path,
                    "$ref",
                    f"{ref.key!r} has no finite value: every instance would "
                    "contain itself; make the recursive property optional or allow empty arrays",
                )


# --- keyword checks -----------------------------------------------------------------------


def _generate_kinds(schema: Mapping[str, Any], kinds: frozenset[str]) -> tuple[str, ...]:
    """The types to generate: the listed ones (null only if alone), else the one its keywords imply."""
    if "type" in schema:
        listed = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return tuple(k for k in listed if k != "null" and k in kinds) or ("null",)
    if kinds == {"object"}:
        return ("object",)
    return next(((kind,) for kind, keywords in KIND_KEYWORDS if any(k in schema for k in keywords)), ("string",))


def _bound(
    schema: Mapping[str, Any], inclusive: str, exclusive: str, stricter: Callable[..., Any]
) -> tuple[int | float | None, bool]:
    """The effective bound and whether it is exclusive, from e.g. minimum and exclusiveMinimum."""
    candidates = [(schema[inclusive], False)] if inclusive in schema else []
    if exclusive in schema:
        candidates.append((schema[exclusive], True))
    if not candidates:
        return None, False
    value = stricter(v for v, _ in candidates)
    return value, any(v == value and excl for v, excl in candidates)


def _integer_witness(spec: Numbers) -> int | None:
    """The valid integer nearest to 0, or None when there is none."""
    if isinstance(spec.multiple_of, float):
        return None
    step = spec.multiple_of or 1
    low, high = spec.integer_range()
    k = fit((0, 0), None if low is None else -(-low // step), None if high is None else high // step)[0]
    return k * step if spec.matches(k * step) else None


def _number_witness(spec: Numbers) -> int | float | None:
    """A valid number, or None: points of the interval, or multiples scanned around its start."""
    anchor = fit((0, 0), spec.low, spec.high)[0]
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
        value: int | float = round(k * spec.multiple_of, spec.decimals)
        if spec.matches(value):
            return value
    return None


def _decimals(step: int | float | None) -> int:
    """Decimal places of a fractional multipleOf, to round its multiples like a person would."""
    if not isinstance(step, float):
        return 0
    return max(0, -int(Decimal(repr(step)).as_tuple().exponent))
