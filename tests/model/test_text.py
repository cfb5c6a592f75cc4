"""Planned outputs: random corpus text, echo mode, and llm-d-inference-sim's length rules."""

from __future__ import annotations

import collections
import itertools
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import tokenizers
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import models, pre_tokenizers, trainers

from llmsim.model.corpus import SENTENCES
from llmsim.model.text import (
    EosToken,
    GeneratedText,
    TextGenerator,
    eos_token,
    histogram_bucket,
    histogram_length,
    unbounded_length,
)
from llmsim.model.tokenizer import HFTokenizer, SimTokenizer
from llmsim.options import ModelOptions

TOKENIZER = SimTokenizer()
RANDOM = TextGenerator(ModelOptions(max_model_len=1024), TOKENIZER)
ECHO = TextGenerator(ModelOptions(mode="echo", max_model_len=1024), TOKENIZER)


def generate(
    generator: TextGenerator = RANDOM,
    *,
    seed: int = 0,
    max_tokens: int | None = None,
    ignore_eos: bool = False,
    prompt_tokens: int = 24,
    echo_text: str | None = None,
    min_tokens: int = 0,
) -> GeneratedText:
    return generator.generate(
        random.Random(seed),
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        prompt_tokens=prompt_tokens,
        echo_text=echo_text,
        min_tokens=min_tokens,
    )


def is_corpus_text(text: str) -> bool:
    """Whole corpus sentences, the last one possibly cut short."""
    while text:
        sentence = next((s for s in SENTENCES if text.startswith(s) or s.startswith(text)), None)
        if sentence is None:
            return False
        text = text[len(sentence) :]
    return True


# --- random mode ---------------------------------------------------------------------------------


@given(max_tokens=st.integers(1, 2000), seed=st.integers(0, 2**32))
def test_ignore_eos_gives_exactly_the_cap(max_tokens: int, seed: int) -> None:
    out = generate(seed=seed, max_tokens=max_tokens, ignore_eos=True, prompt_tokens=0)
    assert len(out.pieces) == len(out.token_ids) == min(max_tokens, 1024)
    assert out.finish_reason == "length"


def test_ignore_eos_without_max_tokens_fills_the_context_window() -> None:
    out = generate(ignore_eos=True, prompt_tokens=1000)
    assert len(out.pieces) == 24 and out.finish_reason == "length"


@given(max_tokens=st.integers(1, 3000), prompt_tokens=st.integers(0, 1023), seed=st.integers(0, 2**32))
def test_max_tokens_bounds_the_length_and_decides_the_finish_reason(
    max_tokens: int, prompt_tokens: int, seed: int
) -> None:
    out = generate(seed=seed, max_tokens=max_tokens, prompt_tokens=prompt_tokens)
    cap = min(max_tokens, 1024 - prompt_tokens)
    assert 1 <= len(out.pieces) <= cap
    assert out.finish_reason == ("length" if len(out.pieces) == cap else "stop")
    assert TOKENIZER.decode(out.token_ids) == out.text
    assert is_corpus_text(out.text)


@given(prompt_tokens=st.integers(0, 1023), seed=st.integers(0, 2**32))
def test_without_max_tokens_the_length_fits_the_context_window(prompt_tokens: int, seed: int) -> None:
    out = generate(seed=seed, prompt_tokens=prompt_tokens)
    limit = 1024 - prompt_tokens
    assert 1 <= len(out.pieces) <= limit
    assert out.finish_reason == ("length" if len(out.pieces) == limit else "stop")


def test_same_rng_state_same_text_byte_for_byte() -> None:
    assert generate(seed=11, max_tokens=300) == generate(seed=11, max_tokens=300)
    assert (
        generate(seed=11, max_tokens=300, ignore_eos=True).text
        != generate(seed=12, max_tokens=300, ignore_eos=True).text
    )


def test_text_is_drawn_from_varied_sentences() -> None:
    texts = {generate(seed=seed, max_tokens=12, ignore_eos=True).text for seed in range(100)}
    assert len(texts) > 20


# --- length distributions ------------------------------------------------------------------------


def sample(draw: Callable[[random.Random], int], n: int = 20_000) -> collections.Counter[int]:
    rng = random.Random(1234)
    return collections.Counter(draw(rng) for _ in range(n))


def test_histogram_buckets_follow_their_probabilities() -> None:
    counts = sample(lambda rng: histogram_length(rng, 200))
    total = sum(counts.values())
    buckets = [histogram_bucket(200, i) for i in range(5)]
    assert buckets == [(1, 20), (21, 40), (41, 60), (61, 180), (181, 199)]
    shares = [sum(counts[n] for n in range(low, high + 1)) / total for low, high in buckets]
    shares.append(counts[200] / total)
    assert shares == pytest.approx([0.2, 0.3, 0.2, 0.05, 0.1, 0.15], abs=0.015)


@given(cap=st.integers(7, 5000))
def test_histogram_buckets_partition_everything_below_the_cap(cap: int) -> None:
    buckets = [histogram_bucket(cap, i) for i in range(5)]
    assert buckets[0][0] == 1 and buckets[-1][1] == cap - 1
    for (_, high), (low, _) in itertools.pairwise(buckets):
        assert low == high + 1
    assert all(low <= high for low, high in buckets)


@pytest.mark.parametrize("cap", [1, 2, 6])
def test_small_caps_are_uniform(cap: int) -> None:
    counts = sample(lambda rng: histogram_length(rng, cap), n=6000)
    assert sorted(counts) == list(range(1, cap + 1))
    assert min(counts.values()) > 6000 / cap * 0.9


def test_unbounded_length_is_a_truncated_gaussian_around_40() -> None:
    counts = sample(lambda rng: unbounded_length(rng, 1000))
    total = sum(counts.values())
    mean = sum(n * c for n, c in counts.items()) / total
    assert min(counts) >= 1 and max(counts) < 1000
    assert 40 <= mean <= 43  # 40 shifted up a little by cutting off everything below 1
    assert counts.most_common(1)[0][0] in range(30, 51)


def test_unbounded_length_is_uniform_below_20() -> None:
    counts = sample(lambda rng: unbounded_length(rng, 10), n=5000)
    assert sorted(counts) == list(range(1, 11))
    assert min(counts.values()) > 400


# --- echo mode -----------------------------------------------------------------------------------


def test_echo_replays_the_text() -> None:
    out = generate(ECHO, echo_text="Say it back, please.", max_tokens=50)
    assert out.text == "Say it back, please."
    assert out.finish_reason == "stop"
    assert list(out.token_ids) == TOKENIZER.encode(out.text)


def test_echo_is_truncated_to_the_cap() -> None:
    out = generate(ECHO, echo_text="one two three four five", max_tokens=3)
    assert out.pieces == ("one ", "two ", "three ")
    assert out.finish_reason == "length"


def test_echo_exactly_at_the_cap_is_length() -> None:
    assert generate(ECHO, echo_text="one two three", max_tokens=3).finish_reason == "length"


def test_echo_ignores_the_rng() -> None:
    assert generate(ECHO, seed=1, echo_text="same") == generate(ECHO, seed=2, echo_text="same")


def test_echo_of_nothing_is_an_empty_stop() -> None:
    out = generate(ECHO, echo_text="")
    assert out.pieces == () and out.finish_reason == "stop"


# --- what the API must have rejected ---------------------------------------------------------------


def test_requests_that_leave_no_room_are_refused() -> None:
    with pytest.raises(ValueError, match="leaves no room"):
        generate(prompt_tokens=1024)
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        generate(max_tokens=0)
    with pytest.raises(ValueError, match="echo_text"):
        generate(ECHO)


# --- with a Hugging Face tokenizer -----------------------------------------------------------------


def test_random_text_with_an_hf_tokenizer(tmp_path: Path) -> None:
    word_level = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    word_level.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    word_level.save(str(tmp_path / "tokenizer.json"))
    tokenizer = HFTokenizer.from_path(str(tmp_path))

    out = generate(TextGenerator(ModelOptions(), tokenizer), max_tokens=50, ignore_eos=True)

    assert len(out.pieces) == len(out.token_ids) == 50
    assert is_corpus_text(out.text)
    assert tokenizer.token_strings(out.token_ids) == [piece.strip() for piece in out.pieces]


# --- min_tokens and the EOS token ------------------------------------------------------------------


@given(max_tokens=st.integers(1, 300), min_tokens=st.integers(0, 300), seed=st.integers(0, 2**32))
def test_min_tokens_is_a_floor_within_the_cap(max_tokens: int, min_tokens: int, seed: int) -> None:
    """vLLM masks EOS before ``min_tokens`` (vllm/sampling_params.py:339, 786-791), so no
    output stops sooner; ``min_tokens == max_tokens`` is exactly the cap."""
    out = generate(seed=seed, max_tokens=max_tokens, min_tokens=min_tokens)
    cap = min(max_tokens, 1000)
    assert min(min_tokens, cap) <= len(out.pieces) <= cap
    assert out.finish_reason == ("length" if len(out.pieces) == cap else "stop")


def test_min_tokens_equal_to_max_tokens_is_exactly_the_cap() -> None:
    lengths = {len(generate(seed=seed, max_tokens=40, min_tokens=40).pieces) for seed in range(50)}
    assert lengths == {40}


def test_min_tokens_without_max_tokens_lifts_the_gaussian_draw() -> None:
    assert all(len(generate(seed=seed, min_tokens=90).pieces) >= 90 for seed in range(50))


def test_min_tokens_zero_draws_what_it_drew_before() -> None:
    assert generate(seed=5, max_tokens=300, min_tokens=0) == generate(seed=5, max_tokens=300)


def test_echo_mode_replays_the_prompt_whatever_min_tokens_says() -> None:
    assert generate(ECHO, echo_text="one two", max_tokens=50, min_tokens=10).text == "one two"


def test_the_eos_token_is_the_chatml_end_of_turn() -> None:
    """The sim vocabulary's ``<|im_end|>``: one token, its own string (what vLLM's
    logprobs name it by)."""
    assert RANDOM.eos == EosToken(TOKENIZER.encode("<|im_end|>")[0], "<|im_end|>")
    assert eos_token(TOKENIZER) == RANDOM.eos


def test_an_hf_vocabulary_without_chatml_falls_back_to_another_eos(tmp_path: Path) -> None:
    trained = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
    trained.pre_tokenizer = pre_tokenizers.Whitespace()
    trained.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"]))
    trained.add_special_tokens(["</s>"])
    trained.save(str(tmp_path / "tokenizer.json"))
    tokenizer = HFTokenizer.from_path(str(tmp_path))
    assert eos_token(tokenizer) == EosToken(tokenizer.encode("</s>")[0], "</s>")


def test_a_vocabulary_without_any_known_eos_uses_token_0(tmp_path: Path) -> None:
    trained = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
    trained.pre_tokenizer = pre_tokenizers.Whitespace()
    trained.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    trained.save(str(tmp_path / "tokenizer.json"))
    assert eos_token(HFTokenizer.from_path(str(tmp_path))) == EosToken(0, "[UNK]")


def _draw_sentence_by_sentence(generator: TextGenerator, rng: random.Random, length: int) -> tuple[object, object]:
    """The corpus text as it was drawn before whole sentences were appended and cut once:
    a sentence at a time, each cut to what is still needed (the seeded golden replay pins it)."""
    pieces: list[str] = []
    ids: list[int] = []
    sentences = list(zip(generator._sentence_pieces, generator._sentence_ids, strict=True))
    while len(pieces) < length:
        sentence_pieces, sentence_ids = sentences[int(rng.random() * len(sentences))]
        pieces.extend(sentence_pieces[: length - len(pieces)])
        ids.extend(sentence_ids[: length - len(ids)])
    return tuple(pieces), tuple(ids)


@pytest.mark.parametrize("length", [1, 2, 11, 12, 13, 100, 511])
def test_draw_is_the_sentence_by_sentence_text_and_leaves_the_rng_alike(length: int) -> None:
    for seed in range(20):
        rng, reference_rng = random.Random(seed), random.Random(seed)
        assert RANDOM._draw(rng, length) == _draw_sentence_by_sentence(RANDOM, reference_rng, length)
        assert rng.getstate() == reference_rng.getstate()
