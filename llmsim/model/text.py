"""What a job says: random corpus text, an echo of the prompt or a dataset's answer
(``--dataset-path``, :mod:`llmsim.model.dataset`), and how long it is.

Lengths follow llm-d-inference-sim (``pkg/dataset``):

* ``ignore_eos``: exactly the cap.
* ``max_tokens`` given: a histogram over [1, cap].  Caps up to 6 are uniform; above, six
  buckets with probabilities 0.2 / 0.3 / 0.2 / 0.05 / 0.1 / 0.15, the last being the cap
  itself and the first five splitting [1, cap - 1] — evenly up to cap 101, beyond that
  20 tokens wide each except the fourth, which stretches.
* no ``max_tokens``: Gaussian(mean 40, sd 20) rounded and resampled until it lies in
  [1, limit] (uniform when limit < 20).

The cap is ``max_tokens`` clamped to the room left in the context window
(``max_model_len - prompt_tokens``, the limit), or the limit itself when no
``max_tokens`` was given; ``finish_reason`` is ``"length"`` exactly when the output
reaches the cap.  ``min_tokens`` raises a shorter draw to itself: vLLM's sampler masks
the EOS token until ``min_tokens`` tokens exist, so the model cannot stop sooner (with
``min_tokens == max_tokens`` every output is exactly the cap).  Echo mode replays the
prompt as it is, whatever ``ignore_eos`` and ``min_tokens`` say.  Every random draw
comes from the ``rng`` passed in, so the same rng state gives the same text, byte for
byte.

The drawn length is the text.  A ``"stop"`` output is one the model ends itself, with
its EOS token (:class:`EosToken`), which the API plans as one more token after the text
for the endpoints that send and count it as vLLM does (see ``llmsim.api.stops``); a
``"stop"`` text is therefore always shorter than the cap, leaving room for that token.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Sequence

import attrs

from llmsim.model.corpus import SENTENCES
from llmsim.model.dataset import load_dataset
from llmsim.model.drawn import EAGER_UP_TO, DrawnTokens
from llmsim.model.tokenizer import END_OF_TEXT, IM_END, Tokenizer
from llmsim.options import ModelOptions

__all__ = [
    "EosToken",
    "FinishReason",
    "GeneratedText",
    "TextGenerator",
    "eos_token",
    "histogram_bucket",
    "histogram_length",
    "unbounded_length",
]

_BUCKET_CUMULATIVE = (0.2, 0.5, 0.7, 0.75, 0.85)  # the sixth bucket (15%) is the cap
_SMALL_CAP = len(_BUCKET_CUMULATIVE) + 1
_FIXED_BUCKET_WIDTH = 20
_FLEX_BUCKET = 3
_EVEN_BUCKETS_UP_TO = _FIXED_BUCKET_WIDTH * len(_BUCKET_CUMULATIVE) + 1
_MEAN_LENGTH = 40.0
_LENGTH_STD_DEV = 20.0
_UNIFORM_BELOW = 20
#: End-of-sequence tokens, most likely first: the ChatML end of turn (the template every
#: prompt is rendered with), then the usual EOS of other tokenizer families.
_EOS_CANDIDATES = (IM_END, END_OF_TEXT, "</s>", "<|eot_id|>", "<|end_of_text|>")


class FinishReason:
    """The finish_reason strings of vLLM and llm-d-inference-sim."""

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    REMOTE_DECODE = "remote_decode"
    CACHE_THRESHOLD = "cache_threshold"
    ABORT = "abort"


@attrs.frozen
class EosToken:
    """The token a model ends its turn with.  vLLM's detokenizer leaves it out of the
    text (it adds nothing to the output), while its id counts as a generated token and
    its logprobs name it by ``text``, the string of its id."""

    token_id: int
    text: str


def eos_token(tokenizer: Tokenizer) -> EosToken:
    """The tokenizer's EOS: the first of the usual EOS strings that is one token of its
    own in this vocabulary, else token 0 (a vocabulary with none of them)."""
    for text in _EOS_CANDIDATES:
        ids = tokenizer.encode(text)
        if len(ids) == 1 and tokenizer.token_strings(ids) == [text]:
            return EosToken(ids[0], text)
    return EosToken(0, tokenizer.token_strings([0])[0])


@attrs.frozen
class GeneratedText:
    """A planned output: one piece and one id per token (tuples, or for a long output
    :class:`~llmsim.model.drawn.DrawnTokens` drawn as they are read)."""

    pieces: Sequence[str]
    token_ids: Sequence[int]
    finish_reason: str  # "stop" or "length"

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def histogram_bucket(cap: int, index: int) -> tuple[int, int]:
    """The inclusive token range of histogram bucket ``index`` (0-4) for ``cap`` > 6."""
    if cap <= _EVEN_BUCKETS_UP_TO:
        width = (cap - 1) / len(_BUCKET_CUMULATIVE)
        low, high = 1 + int(width * index), int(width * (index + 1))
    elif index < _FLEX_BUCKET:
        low, high = 1 + _FIXED_BUCKET_WIDTH * index, _FIXED_BUCKET_WIDTH * (index + 1)
    else:
        stretch = cap - _FIXED_BUCKET_WIDTH * len(_BUCKET_CUMULATIVE)  # how much wider the flex bucket is
        low = 1 + _FIXED_BUCKET_WIDTH * index + (stretch if index > _FLEX_BUCKET else 0)
        high = _FIXED_BUCKET_WIDTH * (index + 1) + stretch
    return low, min(high, cap - 1)


def histogram_length(rng: random.Random, cap: int) -> int:
    """A response length in [1, cap] when the request gave ``max_tokens``."""
    if cap <= 1:
        return cap
    if cap <= _SMALL_CAP:
        return rng.randint(1, cap)
    draw = rng.random()
    if draw > _BUCKET_CUMULATIVE[-1]:
        return cap
    low, high = histogram_bucket(cap, bisect.bisect_left(_BUCKET_CUMULATIVE, draw))
    return rng.randint(low, high)


def unbounded_length(rng: random.Random, limit: int) -> int:
    """A response length in [1, limit] when the request gave no ``max_tokens``."""
    if limit < _UNIFORM_BELOW:
        return rng.randint(1, limit)
    while True:
        value = rng.gauss(_MEAN_LENGTH, _LENGTH_STD_DEV)
        if 1.0 <= value <= limit:
            return math.floor(value + 0.5)


def _length(rng: random.Random, cap: int, max_tokens: int | None, ignore_eos: bool, min_tokens: int) -> int:
    """A random text's length in tokens, within ``cap``, by the rules above."""
    if ignore_eos:
        return cap
    if max_tokens is not None:
        return max(histogram_length(rng, cap), min(min_tokens, cap))
    return max(unbounded_length(rng, cap), min(min_tokens, cap))


class TextGenerator:
    """Plans the output of one choice: random corpus text, or the echo of the prompt."""

    def __init__(self, options: ModelOptions, tokenizer: Tokenizer) -> None:
        self._echo = options.mode == "echo"
        self._max_model_len = options.max_model_len
        self._tokenizer = tokenizer
        self._sentences = tuple(self._split(sentence) for sentence in SENTENCES)
        self._sentence_pieces = tuple(pieces for pieces, _ in self._sentences)
        self._sentence_ids = tuple(ids for _, ids in self._sentences)
        self._sentence_lengths = tuple(len(pieces) for pieces in self._sentence_pieces)
        self.eos = eos_token(tokenizer)
        self._dataset = load_dataset(options)  # --dataset-path: answers chosen as llm-d-inference-sim does

    def _split(self, text: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
        pieces, ids = (tuple(self._tokenizer.tokenize(text)), tuple(self._tokenizer.encode(text)))
        if len(pieces) != len(ids):
            raise ValueError(f"tokenizer gave {len(pieces)} pieces but {len(ids)} ids for {text!r}")
        return pieces, ids

    def generate(
        self,
        rng: random.Random,
        *,
        max_tokens: int | None,
        ignore_eos: bool,
        prompt_tokens: int,
        echo_text: str | None,
        min_tokens: int = 0,
        prompt_ids: Sequence[int] = (),
        lazy: Callable[[], random.Random] | None = None,
    ) -> GeneratedText:
        """Plan one output.  ``echo_text`` is what echo mode replays (ignored in random
        mode); ``max_tokens=None`` means the request set no cap; no output of random
        mode is shorter than ``min_tokens`` (within the cap).  With a dataset, the
        answer is the one it holds for ``prompt_ids`` (:mod:`llmsim.model.dataset`).
        ``lazy`` makes ``rng`` afresh, and the caller draws nothing more from ``rng``:
        then a corpus text beyond ``EAGER_UP_TO`` tokens is drawn as it is read
        (:class:`~llmsim.model.drawn.DrawnTokens`): the same tokens, at a planning cost
        and a memory independent of its length.

        Raises:
            ValueError: ``max_tokens`` < 1, the prompt leaves no room in the context
                window, or echo mode without ``echo_text`` — requests the API must
                reject before generating.
        """
        limit = self._max_model_len - prompt_tokens
        if limit < 1:
            raise ValueError(
                f"a prompt of {prompt_tokens} tokens leaves no room within max_model_len {self._max_model_len}"
            )
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        cap = limit if max_tokens is None else min(max_tokens, limit)
        if self._echo:
            if echo_text is None:
                raise ValueError("echo mode needs the text to echo (echo_text)")
            return self._echo_of(echo_text, cap)
        if self._dataset is not None:
            answer = self._dataset.answer(rng, prompt_ids, cap, ignore_eos)
            if answer is not None:
                return self._answer_of(rng, answer, cap, cap if ignore_eos else min(min_tokens, cap))
        length = _length(rng, cap, max_tokens, ignore_eos, min_tokens)
        finish = FinishReason.LENGTH if length == cap else FinishReason.STOP
        if lazy is not None and length > EAGER_UP_TO and self._dataset is None:
            make = lazy

            def restart() -> random.Random:
                """The choice's RNG where its text starts: made afresh, its length drawn again."""
                fresh = make()
                _length(fresh, cap, max_tokens, ignore_eos, min_tokens)
                return fresh

            drawn = DrawnTokens(self._sentence_pieces, restart, length, rng)  # reads on from rng
            return GeneratedText(drawn, DrawnTokens(self._sentence_ids, restart, length), finish)
        pieces, ids = self._draw(rng, length)
        return GeneratedText(pieces, ids, finish)

    def _echo_of(self, text: str, cap: int) -> GeneratedText:
        pieces, ids = self._tokenizer.tokenize(text), self._tokenizer.encode(text)
        finish = FinishReason.LENGTH if len(ids) >= cap else FinishReason.STOP
        return GeneratedText(tuple(pieces[:cap]), tuple(ids[:cap]), finish)

    def _answer_of(self, rng: random.Random, text: str, cap: int, least: int) -> GeneratedText:
        """A dataset answer in this tokenizer's pieces, cut at ``cap`` and padded with
        corpus text up to ``least`` tokens (``ignore_eos``, ``min_tokens``)."""
        pieces, ids = tuple(self._tokenizer.tokenize(text)), tuple(self._tokenizer.encode(text))
        if len(ids) != len(pieces):  # a tokenizer whose offsets merge tokens: keep one id per piece
            ids = ids[: len(pieces)] + (0,) * (len(pieces) - len(ids))
        pieces, ids = pieces[:cap], ids[:cap]
        if len(pieces) < least:
            more_pieces, more_ids = self._draw(rng, least - len(pieces))
            pieces, ids = pieces + more_pieces, ids + more_ids
        return GeneratedText(pieces, ids, FinishReason.LENGTH if len(pieces) == cap else FinishReason.STOP)

    def _draw(self, rng: random.Random, length: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """``length`` tokens of whole random sentences, the last one cut short.  (Whole
        sentences are appended and the excess cut once: no slice per sentence.)"""
        sentence_pieces, sentence_ids, lengths = self._sentence_pieces, self._sentence_ids, self._sentence_lengths
        count = len(lengths)
        draw = rng.random
        pieces: list[str] = []
        ids: list[int] = []
        total = 0
        while total < length:
            k = int(draw() * count)
            pieces += sentence_pieces[k]
            ids += sentence_ids[k]
            total += lengths[k]
        if total > length:
            del pieces[length:], ids[length:]
        return tuple(pieces), tuple(ids)
