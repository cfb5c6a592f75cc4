"""Synthetic logprobs: vLLM's shape, plausible values, and determinism across streaming."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.model.logprobs import MAX_SIMULATED_LOGPROBS, TokenLogprob, synthesize_logprobs, token_bytes

TOKENS = st.lists(st.one_of(st.text(max_size=6), st.sampled_from([" the", ",", ".", "\n", " a", "Hello"])), max_size=20)


@given(TOKENS, st.integers(0, MAX_SIMULATED_LOGPROBS), st.integers(0, 10**6), st.integers(-(2**70), 2**70))
def test_shape_invariants(tokens: list[str], top_n: int, offset: int, seed: int) -> None:
    values = synthesize_logprobs(tokens, top_n=top_n, position_offset=offset, seed=seed)
    assert [v.token for v in values] == tokens
    for value in values:
        assert -9999.0 < value.logprob <= 0.0
        assert list(value.bytes) == list(value.token.encode("utf-8", "replace"))
        assert len(value.top) == top_n
        if top_n:
            assert value.top[0] == (value.token, value.logprob)
            names = [name for name, _ in value.top]
            assert len(set(names)) == top_n  # alternatives differ from the token and from each other
            logprobs = [logprob for _, logprob in value.top]
            assert all(a > b for a, b in pairwise(logprobs))
            assert all(-9999.0 < lp <= 0.0 for lp in logprobs)
            assert sum(math.exp(lp) for lp in logprobs) < 1.0


@given(TOKENS, st.integers(0, MAX_SIMULATED_LOGPROBS), st.integers(0, 10**4), st.integers(0, 2**32))
def test_streamed_and_whole_responses_carry_identical_values(
    tokens: list[str], top_n: int, offset: int, seed: int
) -> None:
    whole = synthesize_logprobs(tokens, top_n=top_n, position_offset=offset, seed=seed)
    streamed = [
        synthesize_logprobs([token], top_n=top_n, position_offset=offset + i, seed=seed)[0]
        for i, token in enumerate(tokens)
    ]
    assert streamed == whole


def test_more_alternatives_only_extend_the_list() -> None:
    tokens = ["Hello", ",", " world", "!"]
    few = synthesize_logprobs(tokens, top_n=2, seed=3)
    many = synthesize_logprobs(tokens, top_n=MAX_SIMULATED_LOGPROBS, seed=3)
    assert [(v.token, v.logprob) for v in few] == [(v.token, v.logprob) for v in many]
    assert all(m.top[:2] == f.top for f, m in zip(few, many, strict=True))


def test_values_depend_on_token_position_and_seed() -> None:
    base = synthesize_logprobs(["the"] * 8, top_n=3, seed=1)
    assert len({v.logprob for v in base}) == 8  # position
    assert synthesize_logprobs(["the"] * 8, top_n=3, seed=1) == base  # nothing else
    assert synthesize_logprobs(["the"] * 8, top_n=3, seed=2) != base  # seed
    assert synthesize_logprobs(["cat"] * 8, top_n=3, seed=1) != base  # token


def test_the_chosen_token_is_usually_likely() -> None:
    values = synthesize_logprobs([f"t{i}" for i in range(2000)], top_n=0)
    probabilities = sorted(math.exp(v.logprob) for v in values)
    assert 0.5 < probabilities[1000] < 0.95  # median: most tokens are confident picks
    assert probabilities[0] < 0.05  # and some are not


def test_alternative_for_a_token_that_is_itself_a_common_token() -> None:
    for position in range(64):
        (value,) = synthesize_logprobs([" the"], top_n=MAX_SIMULATED_LOGPROBS, position_offset=position)
        assert [name for name, _ in value.top].count(" the") == 1


def test_bytes_of_unencodable_text_are_replaced_like_vllm() -> None:
    assert token_bytes("\ud800") == (63,)
    assert token_bytes("é") == (195, 169)


def test_entries_are_frozen_attrs_with_slots() -> None:
    (value,) = synthesize_logprobs(["x"], top_n=1)
    assert isinstance(value, TokenLogprob) and not hasattr(value, "__dict__")
    with pytest.raises(AttributeError):
        value.logprob = 0.0  # type: ignore[misc]


@pytest.mark.parametrize("top_n", [-1, MAX_SIMULATED_LOGPROBS + 1])
def test_top_n_out_of_range_is_refused(top_n: int) -> None:
    with pytest.raises(ValueError, match=f"top_n must be in 0..{MAX_SIMULATED_LOGPROBS}"):
        synthesize_logprobs(["x"], top_n=top_n)
