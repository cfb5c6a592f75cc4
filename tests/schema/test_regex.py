"""Strings for the ``pattern`` keyword: exact lengths, Python ``re.search`` semantics, clear refusals."""

from __future__ import annotations

import random
import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.schema.regex import MAX_PATTERN_LENGTH, PatternError, compile_pattern

SUPPORTED = [
    r"^\d{3}-\d{4}$",
    r"^[A-Z]{2,3}$",
    r"^[a-z0-9_]+$",
    r"^(\+\d{1,3})?\d{10}$",
    r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$",
    r"^https?://.*",
    r"^#[0-9a-fA-F]{6}$",
    r"abc",
    r"(?i)^[^a-z]+$",
    r"^(?:foo|bar)*baz$",
    r"a{,3}b{2,}",
    r"[]a]x{",
    r"\w+\s\W",
    r"^[à-ÿ]{3}$",
    r"(?P<pair>ab)+",
    r"^$",
    r"",
    r"a|b$|^c",
    r"(?i:ab)[^\u00e9]",
    r"\x41\101\0\t",
    r"(?#comment)z",
    r"\A\d+\Z",
    r"x*?y+?",
    r"[\d\-.]{2,4}",
    r"^(a|bc|def){2}$",
    r"^\.$",
    r"^(\d+\.)*\d+$",
    r".*.*.*.*",
    r"((a|b)*)*c{10}(d*)*",
    r"^(a?){5}b{2,4}(cd|e){1,3}$",
    r"x{128}",
]


@pytest.mark.parametrize("source", SUPPORTED)
def test_generated_strings_match_and_have_the_asked_length(source: str) -> None:
    pattern = compile_pattern(source)
    rng = random.Random(7)
    for length in pattern.lengths(0, None):
        for _ in range(10):
            text = pattern.generate(rng, length)
            assert len(text) == length
            assert re.search(source, text), (source, text)


@given(st.sampled_from(SUPPORTED), st.integers(0, 40), st.integers(0, 40), st.integers(0, 2**32))
def test_lengths_respect_min_and_max_length(source: str, low: int, extra: int, seed: int) -> None:
    pattern, rng = compile_pattern(source), random.Random(seed)
    lengths = pattern.lengths(low, low + extra)
    assert all(low <= n <= low + extra for n in lengths)
    for n in lengths:
        assert re.search(source, pattern.generate(rng, n))


def test_lengths_reach_a_large_min_length_when_the_pattern_allows_it() -> None:
    assert compile_pattern(r"^[a-z]+$").lengths(50, None)[0] == 50
    assert compile_pattern(r"^[a-z]+$").lengths(0, None)[-1] <= 13  # short, realistic strings by default


def test_sets_mean_what_python_means() -> None:
    rng = random.Random(0)
    insensitive = compile_pattern(r"(?i)^[^a-z]$")
    assert not any(insensitive.generate(rng, 1).isalpha() for _ in range(300))
    accented = compile_pattern(r"^[à-ÿ]$")
    assert all("à" <= accented.generate(rng, 1) <= "ÿ" for _ in range(100))
    non_word = compile_pattern(r"^\W$")
    assert all(re.fullmatch(r"\W", non_word.generate(rng, 1)) for _ in range(100))


@pytest.mark.parametrize(
    ("source", "words"),
    [
        (r"(?=a)b", "a lookahead"),
        (r"(?!a)b", "a lookahead"),
        (r"(?<=a)b", "a lookbehind"),
        (r"(?<!a)b", "a lookbehind"),
        (r"(a)\1", "a backreference"),
        (r"(?P<x>a)(?P=x)", "a backreference"),
        (r"(a)?(?(1)b|c)", "a conditional group"),
        (r"(?>a)", "an atomic group"),
        (r"a*+", "a possessive quantifier"),
        (r"\bfoo", "a word boundary"),
        (r"foo\B", "a word boundary"),
        (r"(?x) a b", "the inline flag 'x'"),
        (r"a^b", "an anchor"),
        (r"x(^a)", "an anchor"),
        (r"[^\s\S]", "matches no character"),
        (r"\N{EM DASH}", r"the escape \N"),
        (r"[", "not a valid regular expression"),
        (r"a{300}", f"longer than {MAX_PATTERN_LENGTH}"),
    ],
)
def test_refusals_name_the_construct(source: str, words: str) -> None:
    with pytest.raises(PatternError, match=re.escape(words)):
        compile_pattern(source)


def test_hostile_nesting_is_refused_quickly() -> None:
    start = time.perf_counter()
    with pytest.raises(PatternError, match="too complex"):
        compile_pattern(r"(a{0,100}b{0,100}){0,100}")
    assert time.perf_counter() - start < 2.0
