"""Synthetic, deterministic logprobs shaped like vLLM's.

Each value is a pure function of (token, absolute position, seed), so a streamed
response and the same response non-streamed carry identical numbers, and a client can
diff two runs.  The numbers are plausible rather than constant: the chosen token is the
most likely one (its probability skewed towards 1, as with real sampling), the
alternatives are common English tokens, distinct from it and from each other, in
strictly decreasing order, and the probabilities of all listed tokens sum to below 1.
A token's values do not depend on ``top_n``: asking for more alternatives only extends
the list.  The alternatives come from a fixed pool (common English tokens first, then
the words of the built-in corpus), so at most :data:`MAX_SIMULATED_LOGPROBS` tokens are
listed per position; how many a request may ask for is the API's business
(``--max-logprobs``).

Cost matters because this runs per generated token when a request asks for logprobs.
Whole entries are not memoised: the API gives every choice its own seed, so a cache
keyed by seed would never hit.  What repeats is the token, so its hash and bytes are
cached; the rest is integer mixing and a few float operations per listed token.
"""

from __future__ import annotations

import functools
import math
import re
import zlib
from collections.abc import Sequence

import attrs

from llmsim.model.corpus import SENTENCES

__all__ = ["MAX_SIMULATED_LOGPROBS", "TokenLogprob", "synthesize_logprobs", "token_bytes"]

_ALTERNATIVES = (
    " the", ",", " a", ".", " and", " to", " of", " in", " is", " it", " that", " for", " you",
    " I", " on", " with", " as", " was", " this", " be", " are", " at", " not", " or", " have",
    "\n", " can", " but", " my", " we", " so", " there",
)  # fmt: skip
#: Further alternatives, once the common ones are used up: the corpus's words, each
#: with its leading space as a BPE vocabulary writes it, in a fixed order.
_MORE_ALTERNATIVES = tuple(
    sorted({word for sentence in SENTENCES for word in re.findall(r" ?\w+|[^\w\s]", sentence)} - set(_ALTERNATIVES))
)
#: Most tokens listed per position (the chosen one included): one alternative fewer
#: than the pool holds is all a token that is itself in the pool can get.
MAX_SIMULATED_LOGPROBS = len(_ALTERNATIVES) + len(_MORE_ALTERNATIVES)
_MASK = (1 << 64) - 1
_DECAY = math.log(0.9)  # each alternative at most 90% as likely as the one before
#: Alternatives after the first 19 (vLLM's default cap of 20, the chosen token
#: included) take half of what the geometric split would give them: the listed
#: probabilities then stay clearly below 1 in floating point however many are listed.
_FULL_SHARE = 19
_HALVED = math.log(2.0)


@attrs.frozen(slots=True)
class TokenLogprob:
    """One position: the chosen token, its logprob and UTF-8 bytes, and the top list.

    ``top`` has exactly ``top_n`` (token, logprob) pairs, the chosen token first, by
    descending logprob.
    """

    token: str
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[tuple[str, float], ...]


def token_bytes(token: str) -> tuple[int, ...]:
    """UTF-8 byte values of ``token`` (unencodable characters replaced, as vLLM does)."""
    return _token(token)[1]


@functools.lru_cache(maxsize=65536)
def _token(token: str) -> tuple[int, tuple[int, ...]]:
    """The token's hash (shifted to leave room for the position) and its UTF-8 bytes."""
    data = token.encode("utf-8", "replace")
    return zlib.crc32(data) << 32, tuple(data)


def _mix(x: int) -> int:
    """splitmix64's finaliser: every input bit flips about half the output bits."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def synthesize_logprobs(
    tokens: Sequence[str], *, top_n: int, position_offset: int = 0, seed: int = 0
) -> list[TokenLogprob]:
    """Logprobs for ``tokens`` at absolute positions ``position_offset``, ``+1``, ...

    ``top_n`` (0..MAX_SIMULATED_LOGPROBS) is the length of each ``top`` list, chosen
    token included.
    """
    if not 0 <= top_n <= MAX_SIMULATED_LOGPROBS:
        raise ValueError(f"top_n must be in 0..{MAX_SIMULATED_LOGPROBS}, got {top_n}")
    salt = _mix(seed & _MASK)
    return [_one(token, position_offset + i, salt, top_n) for i, token in enumerate(tokens)]


def _one(token: str, position: int, salt: int, top_n: int) -> TokenLogprob:
    key, data = _token(token)
    h = _mix((key ^ position * 0x9E3779B97F4A7C15 ^ salt) & _MASK)
    u = (h >> 11) * (1.0 / (1 << 53))
    chosen = -4.0 * u * u * u - 1e-4  # in (-4.0001, -0.0001], mostly close to 0
    top = ((token, chosen), *_alternatives(token, chosen, h, top_n - 1)) if top_n > 1 else ((token, chosen),)[:top_n]
    return TokenLogprob(token, chosen, data, top)


def _alternatives(token: str, chosen: float, h: int, count: int) -> tuple[tuple[str, float], ...]:
    """``count`` other tokens sharing the probability mass the chosen token left."""
    share = 0.3 + 0.4 * ((h & 0xFFFF) / 0xFFFF)  # fraction of the rest each alternative takes
    rest = math.log1p(-math.exp(chosen)) + math.log(share)
    step = math.log1p(-share)
    names = _ROTATIONS[(h >> 16) % len(_ALTERNATIVES)]
    if count >= len(names):
        names += _MORE_ALTERNATIVES
    if token in names[:count]:
        names = tuple(name for name in names if name != token)
    first = tuple((names[j], min(rest + j * step, chosen + (j + 1) * _DECAY)) for j in range(min(count, _FULL_SHARE)))
    if count <= _FULL_SHARE:
        return first
    rest -= _HALVED
    return first + tuple((names[j], min(rest + j * step, chosen + (j + 1) * _DECAY)) for j in range(_FULL_SHARE, count))


_ROTATIONS = tuple(_ALTERNATIVES[i:] + _ALTERNATIVES[:i] for i in range(len(_ALTERNATIVES)))
