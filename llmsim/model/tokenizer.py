"""Tokenizers: the built-in simulated one, and local Hugging Face ``tokenizer.json`` files.

:class:`SimTokenizer` (the default) needs no files and no network.  It splits text the
way llm-d-inference-sim's regex tokenizer does: each word or punctuation mark with the
whitespace that follows it is one token (long words are cut every 16 characters).
Token ids are a stable hash of the piece (CRC-32), so the same text has the same ids in
every process, and ids are spread over 2**31 values so that distinct pieces practically
never share one (``decode(encode(text)) == text``).  Ids map back to pieces through a
bounded table of recently seen pieces plus the random-mode corpus, which is always known.

:class:`HFTokenizer` loads a local ``tokenizer.json`` with the ``tokenizers`` library;
it never fetches anything.  When the tokenizer's directory holds the model's chat template
(``chat_template.jinja`` or ``tokenizer_config.json``), it is loaded too
(:mod:`llmsim.model.chat_template`) and renders chat prompts; otherwise, and for the
simulated tokenizer, chat messages are rendered with the built-in ChatML template.
"""

from __future__ import annotations

import itertools
import os
import re
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

from llmsim.model.chat_template import ChatTemplate, load_chat_template
from llmsim.model.corpus import SENTENCES

if TYPE_CHECKING:
    import tokenizers

__all__ = [
    "IM_END",
    "IM_START",
    "SPECIAL_TOKENS",
    "ChatTurn",
    "HFTokenizer",
    "SimTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "render_chat",
]

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
#: Special tokens of the simulated vocabulary, with their ids.
SPECIAL_TOKENS: dict[str, int] = {END_OF_TEXT: 1, IM_START: 2, IM_END: 3}


@attrs.frozen
class ChatTurn:
    """One chat message reduced to what the template needs."""

    role: str
    content: str


def render_chat(
    messages: Sequence[ChatTurn], *, add_generation_prompt: bool = True, continue_final_message: bool = False
) -> str:
    """The ChatML rendering of ``messages``, plus the assistant prompt if asked; with
    ``continue_final_message`` the last message is left open (no end-of-turn after it)."""
    parts = [f"{IM_START}{turn.role}\n{turn.content}{IM_END}\n" for turn in messages]
    if continue_final_message and parts:
        parts[-1] = parts[-1].removesuffix(f"{IM_END}\n")
    elif add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


class Tokenizer(Protocol):
    """What the API and the text generator need from a tokenizer."""

    @property
    def vocab_size(self) -> int:
        """Valid ids are ``0 <= id < vocab_size``."""

    @property
    def chat_template(self) -> ChatTemplate | None:
        """The model's own chat template, if one was loaded with the tokenizer."""

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; special tokens (such as a BOS) are added only when asked
        and only as the tokenizer's own post-processor adds them."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``.  Raises ValueError for ids outside the vocabulary."""

    def tokenize(self, text: str) -> list[str]:
        """One piece of text per token of ``encode(text)``; the pieces concatenate back to
        ``text`` (as far as the tokenizer's offsets allow)."""

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary string of each id (as vLLM's ``/tokenize`` ``token_strs``).
        Raises ValueError for ids outside the vocabulary."""

    def apply_chat_template(
        self, messages: Sequence[ChatTurn], *, add_generation_prompt: bool = True, continue_final_message: bool = False
    ) -> str:
        """The prompt text a chat request is tokenized from.  Raises ChatTemplateError
        when the model's own template refuses the conversation."""


def _placeholder(token_id: int) -> str:
    """What an id nobody has seen decodes to: stable, and visibly not text."""
    return f"<|unk_{token_id}|>"


def _check_ids(ids: Sequence[int], vocab_size: int) -> None:
    for token_id in ids:
        if not 0 <= token_id < vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary: ids go from 0 to {vocab_size - 1}")


# --- the simulated tokenizer ---------------------------------------------------------------

_MAX_WORD = 16
_PIECE_RE = re.compile(
    "|".join(re.escape(token) for token in SPECIAL_TOKENS) + rf"|\w{{1,{_MAX_WORD}}}\s*|[^\w\s]\s*|\s+"
)
_HASHED_BASE = 256  # ids below are reserved for special tokens
_SIM_VOCAB_SIZE = 2**31
#: Texts up to this long have their ids remembered, this many at most (oldest forgotten
#: first): a load test sends the same few prompts over and over.
_REMEMBERED_TEXT_CHARS = 2048
_REMEMBERED_TEXTS = 512


def _piece_id(piece: str) -> int:
    special = SPECIAL_TOKENS.get(piece)
    if special is not None:
        return special
    return _HASHED_BASE + zlib.crc32(piece.encode("utf-8")) % (_SIM_VOCAB_SIZE - _HASHED_BASE)


class _PieceIds(dict[str, int]):
    """piece -> id, computing (and remembering both ways) ids of unseen pieces.

    Bounded: past ``capacity`` learned pieces both maps start over from the pinned
    ones (special tokens and the corpus), which stay decodable forever.

    ``texts`` remembers the ids of short texts encoded since the last start-over (so
    every piece of a remembered text is still known, as encoding it again would leave
    it): see :meth:`SimTokenizer.encode`.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.pieces: dict[int, str] = {}
        self.texts: dict[str, tuple[int, ...]] = {}
        self.start_overs = 0
        self._pinned: dict[str, int] = {}
        for piece in SPECIAL_TOKENS:
            self._pin(piece)
        for sentence in SENTENCES:
            for piece in _PIECE_RE.findall(sentence):
                self._pin(piece)

    def _pin(self, piece: str) -> None:
        token_id = _piece_id(piece)
        self._pinned[piece] = token_id
        self[piece] = token_id
        self.pieces[token_id] = piece

    def __missing__(self, piece: str) -> int:
        if len(self) >= self.capacity + len(self._pinned):
            self.clear()
            self.update(self._pinned)
            self.pieces = {token_id: pinned for pinned, token_id in self._pinned.items()}
            self.texts = {}
            self.start_overs += 1
        token_id = _piece_id(piece)
        self[piece] = token_id
        self.pieces[token_id] = piece
        return token_id


class SimTokenizer:
    """The built-in tokenizer: regex pieces, hashed ids, no files."""

    def __init__(self, *, capacity: int = 65536) -> None:
        self._ids = _PieceIds(capacity)

    @property
    def vocab_size(self) -> int:
        return _SIM_VOCAB_SIZE

    @property
    def chat_template(self) -> ChatTemplate | None:
        return None

    def tokenize(self, text: str) -> list[str]:
        return _PIECE_RE.findall(text)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:  # no BOS: nothing to add
        """The ids of ``text`` (a short text's remembered, see :class:`_PieceIds`)."""
        ids = self._ids
        known = ids.texts.get(text)
        if known is not None:
            return list(known)
        start_overs = ids.start_overs
        encoded = [ids[piece] for piece in _PIECE_RE.findall(text)]
        # not when the pieces started over midway: some of this text's may be forgotten
        if len(text) <= _REMEMBERED_TEXT_CHARS and ids.start_overs == start_overs:
            texts = ids.texts
            if len(texts) >= _REMEMBERED_TEXTS:
                del texts[next(iter(texts))]
            texts[text] = tuple(encoded)
        return encoded

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.token_strings(ids))

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        _check_ids(ids, _SIM_VOCAB_SIZE)
        pieces = self._ids.pieces
        return [pieces.get(token_id) or _placeholder(token_id) for token_id in ids]

    def apply_chat_template(
        self, messages: Sequence[ChatTurn], *, add_generation_prompt: bool = True, continue_final_message: bool = False
    ) -> str:
        return render_chat(
            messages, add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message
        )


# --- Hugging Face tokenizer.json -------------------------------------------------------------


class HFTokenizer:
    """A local Hugging Face ``tokenizer.json`` (never downloaded)."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, chat_template: ChatTemplate | None = None) -> None:
        self._tokenizer = tokenizer
        self._chat_template = chat_template

    @classmethod
    def from_path(cls, path: str) -> HFTokenizer:
        """Load ``path``: a ``tokenizer.json`` file or a directory holding one, with the
        chat template beside it, if any.

        Raises:
            ValueError: nothing loadable there, or a broken chat template (the message
                names the file).
        """
        # Imported here: the library takes a while to import and most runs never need it.
        import tokenizers

        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise ValueError(
                f"tokenizer {path!r}: no such file; pass a tokenizer.json file or a directory that holds one"
            )
        try:
            tokenizer = tokenizers.Tokenizer.from_file(file)
        except Exception as exc:  # the library raises plain Exception on bad files
            raise ValueError(f"tokenizer {file!r} could not be loaded: {exc}") from exc
        return cls(tokenizer, load_chat_template(os.path.dirname(os.path.abspath(file))))

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self._chat_template

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int]) -> str:
        _check_ids(ids, self.vocab_size)
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def tokenize(self, text: str) -> list[str]:
        """Cut ``text`` at each token's start offset, so that whatever the tokenizer's
        offsets skip (such as whitespace it normalises away) stays with the previous
        piece and the pieces always concatenate back to ``text``."""
        offsets = self._tokenizer.encode(text, add_special_tokens=False).offsets
        if not offsets:
            return []
        cuts = [0]
        for start, _ in offsets[1:]:
            cuts.append(max(start, cuts[-1]))
        cuts.append(len(text))
        return [text[begin:end] for begin, end in itertools.pairwise(cuts)]

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        _check_ids(ids, self.vocab_size)
        to_token = self._tokenizer.id_to_token
        return [to_token(token_id) or _placeholder(token_id) for token_id in ids]

    def apply_chat_template(
        self, messages: Sequence[ChatTurn], *, add_generation_prompt: bool = True, continue_final_message: bool = False
    ) -> str:
        """With the model's template, each turn is one ``{"role", "content"}`` message."""
        if self._chat_template is None:
            return render_chat(
                messages, add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message
            )
        turns = [{"role": turn.role, "content": turn.content} for turn in messages]
        return self._chat_template.render(
            turns, add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message
        )


def load_tokenizer(path: str | None) -> Tokenizer:
    """``None``: the built-in :class:`SimTokenizer`; else the local HF tokenizer at ``path``."""
    if path is None:
        return SimTokenizer()
    return HFTokenizer.from_path(path)
