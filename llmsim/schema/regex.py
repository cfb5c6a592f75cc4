"""Strings that match a regular expression: the ``pattern`` keyword of tool schemas.

A pattern is parsed into a small tree (one-character sets, sequences, alternatives,
repeats) and every node knows how many strings of each length it can produce, up to
``MAX_PATTERN_LENGTH``.
Generation first picks a length the string constraints allow, then walks the tree
choosing branches and repeat counts in proportion to those counts, so every choice
can still reach the target length and the result is never a near miss.

Only what can be produced exactly is accepted: lookarounds, backreferences, word
boundaries, atomic groups, possessive quantifiers and anchors in the middle of a
pattern are refused with a message that names the construct.  What a character set
or an escape matches is not re-implemented: candidate characters are tested against
the set itself with :mod:`re`, so ``[^a-z]``, ``\\w`` or flags mean exactly what they
mean to a Python validator.  Matching is ``re.search``, as in JSON Schema.
"""

from __future__ import annotations

import functools
import random
import re
import string
from collections.abc import Iterator

import attrs

from llmsim.schema.regex_tree import (
    MAX_PATTERN_LENGTH,
    Alt,
    Anchor,
    Budget,
    Chars,
    Node,
    PatternError,
    Repeat,
    Seq,
    alt,
    repeat,
    seq,
)

__all__ = ["MAX_PATTERN_LENGTH", "PatternError", "StringPattern", "compile_pattern"]

_REALISTIC_EXTRA = 12  # prefer lengths within this many characters of the shortest allowed
_PROBES = 8  # samples checked against re.search before a pattern is accepted

_PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))
_CONTROLS = "\t\n\r\x0b\x0c"
_DOT_ALPHABET = string.ascii_letters + string.digits
_GROUP_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "a": re.ASCII, "u": re.UNICODE}
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
_BRACES = re.compile(r"\{(\d*)(?:(,)(\d*))?\}")
_INLINE_FLAGS = re.compile(r"\?([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])")
_OCTAL = re.compile(r"[0-7]{0,2}")
_NAMED_CHARACTERS = re.compile(r"\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))|([^\x00-\x7f])")

# --- parser --------------------------------------------------------------------------


class _Parser:
    """Recursive descent over the subset of Python's regex syntax llmsim can generate."""

    def __init__(self, source: str, flags: int) -> None:
        self.src = source
        self.pos = 0
        self.flags = flags
        self.budget = Budget()

    def fail(self, what: str) -> PatternError:
        return PatternError(
            f"uses {what} at offset {self.pos}, which llmsim cannot generate strings for; simplify the pattern"
        )

    def peek(self, text: str) -> bool:
        return self.src.startswith(text, self.pos)

    def parse(self) -> Node:
        node = self.alternation()
        if self.pos != len(self.src):  # an unbalanced ')' (re.compile already refused it)
            raise self.fail("an unbalanced ')'")
        return node

    def alternation(self) -> Node:
        options = [self.sequence()]
        while self.peek("|"):
            self.pos += 1
            options.append(self.sequence())
        return alt(options)

    def sequence(self) -> Node:
        items: list[Node] = []
        while self.pos < len(self.src) and not self.peek("|") and not self.peek(")"):
            atom = self.atom()
            if atom is not None:
                items.append(self.quantified(atom))
        return seq(items, self.budget)

    def quantified(self, atom: Node) -> Node:
        bounds = self.quantifier()
        if bounds is None:
            return atom
        if self.peek("+"):
            raise self.fail("a possessive quantifier")
        if self.peek("?"):
            self.pos += 1  # lazy: the same strings match
        if isinstance(atom, Anchor):
            raise self.fail("a repeated anchor")
        return repeat(atom, bounds[0], bounds[1], self.budget)

    def quantifier(self) -> tuple[int, int | None] | None:
        char = self.src[self.pos] if self.pos < len(self.src) else ""
        simple = {"*": (0, None), "+": (1, None), "?": (0, 1)}
        if char in simple:
            self.pos += 1
            return simple[char]
        match = _BRACES.match(self.src, self.pos)
        if char != "{" or match is None or match.group(0) == "{}":
            return None  # a literal "{", as in Python
        self.pos = match.end()
        low = int(match.group(1) or 0)
        if match.group(2) is None:
            return low, low
        return low, int(match.group(3)) if match.group(3) else None

    def atom(self) -> Node | None:
        char = self.src[self.pos]
        if char == "(":
            return self.group()
        if char == "[":
            return self.char_set()
        if char == "\\":
            return self.escape()
        self.pos += 1
        if char == ".":
            return _chars(_DOT_ALPHABET)
        if char in "^$":
            return Anchor(start=char == "^")
        return _chars(char)

    def group(self) -> Node | None:
        self.pos += 1
        saved = self.flags
        if self.peek("?") and not self.extension():
            return None
        node = self.alternation()
        if not self.peek(")"):
            raise self.fail("an unterminated group")
        self.pos += 1
        self.flags = saved
        return node

    def extension(self) -> bool:
        """Consume what follows ``(?``; False when no pattern follows (``(?i)``, ``(?#...)``)."""
        flags = _INLINE_FLAGS.match(self.src, self.pos)
        if flags is not None and (flags.group(1) or flags.group(2)):
            self.set_flags(flags.group(1), flags.group(2) or "")
            self.pos = flags.end()
            return flags.group(3) == ":"
        if self.peek("?:"):
            self.pos += 2
            return True
        if self.peek("?P<"):
            self.pos = self.src.index(">", self.pos) + 1
            return True
        if self.peek("?#"):
            self.pos = self.src.index(")", self.pos) + 1
            return False
        kinds = {
            "?=": "a lookahead",
            "?!": "a lookahead",
            "?<=": "a lookbehind",
            "?<!": "a lookbehind",
            "?P=": "a backreference",
            "?(": "a conditional group",
            "?>": "an atomic group",
        }
        raise self.fail(next((name for prefix, name in kinds.items() if self.peek(prefix)), "an extension group"))

    def set_flags(self, on: str, off: str) -> None:
        for letter in on + off:
            if letter not in _GROUP_FLAGS:
                raise self.fail(f"the inline flag {letter!r}")
        for letter in on:
            self.flags |= _GROUP_FLAGS[letter]
        for letter in off:
            self.flags &= ~_GROUP_FLAGS[letter]

    def char_set(self) -> Node:
        start = self.pos
        self.pos += 1
        if self.peek("^"):
            self.pos += 1
        if self.peek("]"):
            self.pos += 1
        while not self.peek("]"):
            self.pos += 2 if self.peek("\\") else 1
        self.pos += 1
        return _chars(_alphabet(self.src[start : self.pos], self.flags))

    def escape(self) -> Node:
        self.pos += 1
        char = self.src[self.pos]
        self.pos += 1
        if char in "dDwWsS":
            return _chars(_alphabet("\\" + char, self.flags))
        if char in "AZ":
            return Anchor(start=char == "A")
        if char in "bB":
            raise self.fail("a word boundary")
        if char in _SIMPLE_ESCAPES:
            return _chars(_SIMPLE_ESCAPES[char])
        widths = {"x": 2, "u": 4, "U": 8}
        if char in widths:
            digits = self.src[self.pos : self.pos + widths[char]]
            self.pos += widths[char]
            return _chars(chr(int(digits, 16)))
        if char.isdigit():
            return self.octal_or_backreference(char)
        if char.isalnum():
            raise self.fail(f"the escape \\{char}")
        return _chars(char)

    def octal_or_backreference(self, first: str) -> Node:
        digits = first + _OCTAL.match(self.src, self.pos).group(0)  # type: ignore[union-attr]
        if first != "0" and len(digits) < 3:
            raise self.fail("a backreference")
        self.pos += len(digits) - 1
        return _chars(chr(int(digits, 8)))


def _chars(alphabet: str) -> Chars:
    if not alphabet:
        raise PatternError("has a character set that matches no character llmsim can produce")
    return Chars(alphabet, {1: len(alphabet)})


@functools.lru_cache(maxsize=1024)
def _alphabet(atom: str, flags: int) -> str:
    """The characters ``atom`` (a set or class escape) matches: printable ASCII if any,
    else other printable characters, else whatever matches."""
    candidates = _PRINTABLE + _CONTROLS + "".join(_extra_candidates(atom))
    matcher = re.compile(atom, flags)
    found = "".join(dict.fromkeys(c for c in candidates if matcher.fullmatch(c)))
    ascii_printable = "".join(c for c in found if c in _PRINTABLE)
    return ascii_printable or "".join(c for c in found if c.isprintable()) or found


def _extra_candidates(atom: str) -> Iterator[str]:
    """Non-ASCII characters a set names (and a few after each, to cover ranges)."""
    for match in _NAMED_CHARACTERS.finditer(atom):
        hex_digits = match.group(1) or match.group(2) or match.group(3)
        first = int(hex_digits, 16) if hex_digits else ord(match.group(4))
        for code in range(first, min(first + 32, 0x110000)):
            if not 0xD800 <= code <= 0xDFFF:
                yield chr(code)


# --- anchors -------------------------------------------------------------------------


def _strip_anchors(node: Node, budget: Budget) -> Node:
    """Drop anchors at the edges of each top-level alternative; refuse any others."""
    if isinstance(node, Alt):
        return alt([_strip_edges(option, budget) for option in node.options])
    return _strip_edges(node, budget)


def _strip_edges(node: Node, budget: Budget) -> Node:
    items = list(node.items) if isinstance(node, Seq) else [node]
    while items and isinstance(items[0], Anchor) and items[0].start:
        items.pop(0)
    while items and isinstance(items[-1], Anchor) and not items[-1].start:
        items.pop()
    for item in items:
        _refuse_anchors(item)
    return seq(items, budget)


def _refuse_anchors(node: Node) -> None:
    if isinstance(node, Anchor):
        raise PatternError(
            "uses an anchor (^, $, \\A or \\Z) away from the start or end of the pattern, "
            "which llmsim cannot generate strings for"
        )
    children: tuple[Node, ...] = ()
    if isinstance(node, Seq):
        children = node.items
    elif isinstance(node, Alt):
        children = node.options
    elif isinstance(node, Repeat):
        children = (node.item,)
    for child in children:
        _refuse_anchors(child)


# --- public --------------------------------------------------------------------------


@attrs.frozen
class StringPattern:
    """A compiled ``pattern``: ``regex`` to match, ``root`` to generate from."""

    source: str
    regex: re.Pattern[str]
    root: Node

    def lengths(self, low: int, high: int | None) -> tuple[int, ...]:
        """Lengths in ``[low, high]`` to generate, the short end of what is possible."""
        possible = sorted(n for n in self.root.counts if n >= low and (high is None or n <= high))
        return tuple(n for n in possible if n <= possible[0] + _REALISTIC_EXTRA) if possible else ()

    def generate(self, rng: random.Random, length: int) -> str:
        """A string of exactly ``length`` characters (one of :meth:`lengths`) matching the pattern."""
        out: list[str] = []
        self.root.generate(rng, length, out)
        return "".join(out)


@functools.lru_cache(maxsize=256)
def compile_pattern(source: str) -> StringPattern:
    """Compile ``source``, or raise PatternError saying what cannot be generated."""
    try:
        regex = re.compile(source)
    except re.error as exc:
        raise PatternError(f"is not a valid regular expression: {exc}") from None
    parser = _Parser(source, regex.flags & ~re.UNICODE)
    root = _strip_anchors(parser.parse(), parser.budget)
    if not root.counts:
        raise PatternError(f"needs strings longer than {MAX_PATTERN_LENGTH} characters")
    compiled = StringPattern(source, regex, root)
    _probe(compiled)
    return compiled


def _probe(pattern: StringPattern) -> None:
    """Refuse the pattern if any sample fails ``re.search``: a misread is never shipped."""
    rng = random.Random(0)
    lengths = pattern.lengths(0, None)
    for i in range(_PROBES):
        sample = pattern.generate(rng, lengths[i % len(lengths)])
        if pattern.regex.search(sample) is None:
            raise PatternError(f"uses a construct llmsim misreads (it produced {sample!r}); simplify the pattern")
