"""Corpus text drawn as it is read (llmsim/model/drawn.py): the same tokens as drawn up front."""

from __future__ import annotations

import functools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.model import drawn
from llmsim.model.drawn import EAGER_UP_TO, DrawnTokens
from llmsim.model.text import GeneratedText, TextGenerator
from llmsim.model.tokenizer import SimTokenizer
from llmsim.options import ModelOptions

GENERATOR = TextGenerator(ModelOptions(max_model_len=100_000), SimTokenizer())


def generate(key: str, *, lazy: bool, **fields: object) -> GeneratedText:
    settings: dict[str, object] = {"ignore_eos": True, "prompt_tokens": 1, "echo_text": None, **fields}
    make = functools.partial(random.Random, key)
    return GENERATOR.generate(make(), lazy=make if lazy else None, **settings)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    key=st.text(max_size=8),
    length=st.integers(EAGER_UP_TO + 1, 3000),
    ignore_eos=st.booleans(),
    reads=st.lists(st.tuples(st.integers(-3100, 3100), st.integers(0, 300)), max_size=30),
    eos=st.booleans(),
)
def test_drawn_text_is_the_text_drawn_up_front(
    key: str, length: int, ignore_eos: bool, reads: list[tuple[int, int]], eos: bool
) -> None:
    """Read in any order, as tokens or slices, a lazy output holds exactly the pieces and
    ids the generator draws up front from the same RNG (and an EOS appended after)."""
    fields = {"max_tokens": length, "ignore_eos": ignore_eos, "min_tokens": EAGER_UP_TO + 1}
    eager, lazy = generate(key, lazy=False, **fields), generate(key, lazy=True, **fields)
    assert isinstance(lazy.pieces, DrawnTokens) and isinstance(lazy.token_ids, DrawnTokens)
    pieces, ids = lazy.pieces, lazy.token_ids
    expected_pieces, expected_ids = tuple(eager.pieces), tuple(eager.token_ids)
    if eos:
        pieces, ids = pieces.appended(""), ids.appended(0)
        expected_pieces, expected_ids = (*expected_pieces, ""), (*expected_ids, 0)
    assert len(pieces) == len(expected_pieces) and lazy.finish_reason == eager.finish_reason
    for start, width in reads:
        if -len(expected_pieces) <= start < len(expected_pieces):
            assert pieces[start] == expected_pieces[start] and ids[start] == expected_ids[start]
        else:
            with pytest.raises(IndexError):
                pieces[start]
        assert pieces[start : start + width] == expected_pieces[start : start + width]
    assert [pieces[i] for i in range(len(pieces))] == list(expected_pieces)  # in order, as a stream reads
    assert pieces == expected_pieces and tuple(ids) == expected_ids
    assert pieces[::7] == expected_pieces[::7]


def test_a_stream_keeps_one_block_of_its_text() -> None:
    """Read in order, a 10,000-token output holds about one block at a time, and reads
    the text from the RNG it was planned with (no second one)."""
    made: list[random.Random] = []

    def make() -> random.Random:
        made.append(random.Random("long"))
        return made[-1]

    text = GENERATOR.generate(make(), max_tokens=10_000, ignore_eos=True, prompt_tokens=1, echo_text=None, lazy=make)
    assert isinstance(text.pieces, DrawnTokens)
    largest = 0
    for position in range(0, 10_000, 3):
        text.pieces[position : position + 3]
        largest = max(largest, len(text.pieces._block))
    assert largest < drawn.LAZY_BLOCK + 40  # a block ends at the end of a sentence
    assert len(made) == 1


def test_short_or_unmarked_outputs_are_drawn_up_front() -> None:
    short = generate("s", lazy=True, max_tokens=EAGER_UP_TO)
    unmarked = generate("u", lazy=False, max_tokens=5000)
    assert isinstance(short.pieces, tuple) and isinstance(unmarked.pieces, tuple)
