"""The simulated tokenizer, local HF tokenizer.json files, and the chat template."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import tokenizers
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import decoders, models, pre_tokenizers, trainers

from llmsim.model.corpus import SENTENCES
from llmsim.model.tokenizer import (
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    ChatTurn,
    HFTokenizer,
    SimTokenizer,
    load_tokenizer,
    render_chat,
)

# --- SimTokenizer ------------------------------------------------------------------------------


@given(st.text())
def test_sim_pieces_concatenate_back_to_the_text(text: str) -> None:
    assert "".join(SimTokenizer().tokenize(text)) == text


@given(st.text())
def test_sim_decode_inverts_encode(text: str) -> None:
    tokenizer = SimTokenizer()
    ids = tokenizer.encode(text)
    assert len(ids) == len(tokenizer.tokenize(text))
    assert tokenizer.decode(ids) == text


def test_sim_splits_words_and_punctuation_with_their_trailing_whitespace() -> None:
    pieces = SimTokenizer().tokenize("  Hello, world!\n\nIt's 42.")
    assert pieces == ["  ", "Hello", ", ", "world", "!\n\n", "It", "'", "s ", "42", "."]


def test_sim_cuts_long_words_every_16_characters() -> None:
    assert SimTokenizer().tokenize("a" * 40 + " b") == ["a" * 16, "a" * 16, "a" * 8 + " ", "b"]


def test_sim_ids_are_stable_across_instances() -> None:
    text = "The same text, the same ids."
    assert SimTokenizer().encode(text) == SimTokenizer().encode(text)
    # Pinned so that a change of the id scheme (which would change every render and
    # KV-cache hash a user has recorded) is a deliberate decision.
    assert SimTokenizer().encode("Hello world") == [1781399232, 980881987]


def test_sim_special_tokens_are_single_tokens() -> None:
    tokenizer = SimTokenizer()
    assert tokenizer.tokenize(f"{IM_START}user\nhi{IM_END}") == [IM_START, "user\n", "hi", IM_END]
    assert tokenizer.encode(IM_START + IM_END) == [SPECIAL_TOKENS[IM_START], SPECIAL_TOKENS[IM_END]]


def test_sim_unknown_ids_decode_to_a_stable_placeholder() -> None:
    tokenizer = SimTokenizer()
    assert tokenizer.decode([999_999]) == "<|unk_999999|>" == SimTokenizer().decode([999_999])


def test_sim_rejects_ids_outside_the_vocabulary() -> None:
    tokenizer = SimTokenizer()
    with pytest.raises(ValueError, match="token id -1 is outside the vocabulary"):
        tokenizer.decode([-1])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.token_strings([tokenizer.vocab_size])


def test_sim_forgets_old_pieces_but_never_the_corpus() -> None:
    tokenizer = SimTokenizer(capacity=100)
    forgotten = tokenizer.encode("zyzzyva")
    corpus_ids = tokenizer.encode(SENTENCES[0])
    tokenizer.encode(" ".join(f"word{i}" for i in range(500)))
    assert tokenizer.decode(corpus_ids) == SENTENCES[0]
    assert tokenizer.decode(forgotten) == f"<|unk_{forgotten[0]}|>"
    assert len(tokenizer._ids) <= 100 + len(tokenizer._ids._pinned)


def test_sim_token_strings_are_the_pieces() -> None:
    tokenizer = SimTokenizer()
    assert tokenizer.token_strings(tokenizer.encode("Hi there!")) == ["Hi ", "there", "!"]


# --- chat template -----------------------------------------------------------------------------


def test_chat_template_is_chatml() -> None:
    turns = [ChatTurn("system", "Be brief."), ChatTurn("user", "Hi")]
    assert render_chat(turns) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_chat(turns, add_generation_prompt=False).endswith("Hi<|im_end|>\n")
    assert SimTokenizer().apply_chat_template(turns) == render_chat(turns)


def test_chat_prompt_token_count() -> None:
    tokenizer = SimTokenizer()
    prompt = tokenizer.apply_chat_template([ChatTurn("user", "Hello there")])
    # <|im_start|> "user\n" "Hello " "there" <|im_end|> "\n" <|im_start|> "assistant\n"
    assert len(tokenizer.encode(prompt)) == 8


# --- HFTokenizer ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE tokenizer trained in-process and saved as tokenizer.json."""
    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(SENTENCES, trainer)
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    bpe.save(str(path))
    return path


def test_hf_loads_from_a_file_or_its_directory(tokenizer_json: Path) -> None:
    from_file = load_tokenizer(str(tokenizer_json))
    from_dir = load_tokenizer(str(tokenizer_json.parent))
    assert isinstance(from_file, HFTokenizer) and isinstance(from_dir, HFTokenizer)
    assert from_file.encode("Hello there") == from_dir.encode("Hello there")
    assert from_file.vocab_size == 400


@given(text=st.text())
def test_hf_round_trips(tokenizer_json: Path, text: str) -> None:
    tokenizer = HFTokenizer.from_path(str(tokenizer_json))
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    pieces = tokenizer.tokenize(text)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == text


def test_hf_pieces_cover_the_text_when_offsets_skip_or_go_back() -> None:
    @attrs.frozen
    class Encoding:
        offsets: list[tuple[int, int]]

    class Offsets:
        """Whitespace skipped between tokens, and a token that starts before the previous one."""

        def encode(self, text: str, add_special_tokens: bool) -> Encoding:
            return Encoding([(0, 5), (6, 11), (3, 5), (12, 13)])

    pieces = HFTokenizer(Offsets()).tokenize("hello world !")  # type: ignore[arg-type]
    assert pieces == ["hello ", "", "world ", "!"]


def test_hf_token_strings_are_vocabulary_entries(tokenizer_json: Path) -> None:
    tokenizer = HFTokenizer.from_path(str(tokenizer_json))
    ids = tokenizer.encode(f"{IM_START}user\nThe bridge is the answer{IM_END}")
    strings = tokenizer.token_strings(ids)
    assert strings[0] == IM_START and strings[-1] == IM_END
    assert "Ġthe" in strings  # byte-level BPE marks the space before a word with Ġ
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([400])


def test_hf_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tokenizer '.*nowhere'.*tokenizer\.json"):
        load_tokenizer(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="no such file"):
        load_tokenizer(str(tmp_path))  # a directory without tokenizer.json


def test_hf_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="could not be loaded"):
        load_tokenizer(str(bad))


def test_no_path_means_the_simulated_tokenizer() -> None:
    assert isinstance(load_tokenizer(None), SimTokenizer)


def test_sim_remembered_text_is_learned_again_after_a_start_over() -> None:
    """Encoding remembers short texts' ids, but only until the pieces start over: the
    same text encoded after that learns its pieces again, so its ids still decode."""
    tokenizer = SimTokenizer(capacity=100)
    ids = tokenizer.encode("zyzzyva")
    assert tokenizer.encode("zyzzyva") == ids  # remembered
    tokenizer.encode(" ".join(f"word{i}" for i in range(500)))  # the pieces start over
    assert tokenizer.encode("zyzzyva") == ids
    assert tokenizer.decode(ids) == "zyzzyva"


def test_sim_text_whose_pieces_started_over_midway_is_not_remembered() -> None:
    tokenizer = SimTokenizer(capacity=100)
    text = " ".join(f"word{i}" for i in range(150))  # its first pieces are forgotten by its last
    ids = tokenizer.encode(text)
    assert text not in tokenizer._ids.texts
    assert tokenizer.encode(text) == ids


def test_sim_remembered_ids_are_a_fresh_list() -> None:
    tokenizer = SimTokenizer()
    first = tokenizer.encode("Hello there")
    first.append(0)
    assert tokenizer.encode("Hello there") == first[:-1]
