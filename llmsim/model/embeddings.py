"""The simulated model's embedding vectors: deterministic, from the prompt's token ids.

The raw vector is llm-d-inference-sim's stub (``BuildStubEmbedding``,
pkg/common/utils.go:229-243): component ``i`` is ``2*(t_i % 1024)/1024 - 1`` for the
first ``len(ids)`` components, then ``2*(t_(i mod len) % 256)/256 - 1``.  Every value is
``m/512`` for an integer ``m`` in [-512, 511], so exact in float32.  Component ``i``
does not depend on the length asked for, so a shorter vector is a prefix of a longer
one: the model is Matryoshka, as vLLM's ``dimensions`` needs
(vllm/pooling_params.py:229-258).

By default the vector is L2-normalised, as vLLM's embedding pooler does when
``use_activation`` is unset or true (vllm/model_executor/layers/pooler/seqwise/
heads.py:85-112: truncate to ``dimensions``, then normalise; ``F.normalize`` keeps a
zero vector zero).  A normalised component is ``m * k / 10**9`` with one integer ``k``
per vector (``10**9`` over the norm of the ``m``, rounded): integer arithmetic and one
division, in C, once per id rather than once per component (a request's cost is what
an embeddings load test measures, see :class:`_Stub`), at most 9 decimals, so short
JSON numbers, and a length within 1e-5 of 1.

The same token ids give the same vector in every process: nothing here is random.
"""

from __future__ import annotations

import base64
import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from itertools import repeat
from math import sqrt
from operator import mul, truediv

import attrs

__all__ = ["EMBED_DTYPES", "embedding", "encode_base64", "pack", "stub_embedding"]

#: ``m`` of ``2*k/1024 - 1 = m/512`` for k in 0..1023, and of ``2*k/256 - 1`` for k in 0..255.
_HEAD = tuple(k - 512 for k in range(1024))
_TAIL = tuple(4 * k - 512 for k in range(256))
_SCALE = 10**9

#: The ``embed_dtype`` values llmsim packs, with their item size in bytes.
EMBED_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}


@attrs.frozen
class _Stub:
    """The stub's components as numerators ``m`` of ``m/512``, in two parts: ``head``, one
    per id (at most ``dimensions``), then ``cycle`` repeated and cut to ``tail`` components
    (component ``i >= len(ids)`` is the tail value of id ``i mod len(ids)``).  A short
    prompt's vector is mostly repeats, so it is scaled once per id, not once per component."""

    head: list[int]
    cycle: list[int]
    tail: int

    @classmethod
    def of(cls, token_ids: Sequence[int], dimensions: int) -> _Stub:
        """Ids are taken as non-negative (the API refuses others); no ids: all zeros."""
        count = len(token_ids)
        if count == 0:
            return cls([], [0], dimensions)
        head = [_HEAD[token_id & 1023] for token_id in token_ids[:dimensions]]
        if count >= dimensions:
            return cls(head, [], 0)
        return cls(head, [_TAIL[token_id & 255] for token_id in token_ids], dimensions - count)

    def square(self) -> int:
        """The sum of the squared numerators."""
        full, rest = divmod(self.tail, len(self.cycle)) if self.cycle else (0, 0)
        head, cycle, part = self.head, self.cycle, self.cycle[:rest]
        squares: int = sum(map(mul, head, head)) + full * sum(map(mul, cycle, cycle)) + sum(map(mul, part, part))
        return squares

    def values(self, scale: Callable[[list[int]], list[float]]) -> list[float]:
        """Every component, ``scale`` applied to the head and to one cycle."""
        if not self.tail:
            return scale(self.head)
        cycle = scale(self.cycle)
        return scale(self.head) + (cycle * (self.tail // len(cycle) + 1))[: self.tail]


def _raw(numerators: list[int]) -> list[float]:
    return list(map(truediv, numerators, repeat(512.0)))


def stub_embedding(token_ids: Sequence[int], dimensions: int) -> list[float]:
    """llm-d-inference-sim's raw vector: ``dimensions`` components from ``token_ids``."""
    return _Stub.of(token_ids, dimensions).values(_raw)


def embedding(token_ids: Sequence[int], dimensions: int, *, normalize: bool = True) -> list[float]:
    """The vector the simulated model returns: the stub, L2-normalised unless
    ``normalize`` is false (vLLM's ``use_activation: false``)."""
    stub = _Stub.of(token_ids, dimensions)
    if not normalize:
        return stub.values(_raw)
    square = stub.square()
    if square == 0:
        return [0.0] * dimensions
    factor = round(_SCALE / sqrt(square))

    def normalized(numerators: list[int]) -> list[float]:
        return list(map(truediv, map(mul, numerators, repeat(factor)), repeat(float(_SCALE))))

    return stub.values(normalized)


def pack(values: Sequence[float], embed_dtype: str = "float32", *, little_endian: bool = True) -> bytes:
    """``values`` as packed binary floats of ``embed_dtype`` (one of :data:`EMBED_DTYPES`),
    in the byte order asked for: what vLLM's ``tensor2binary`` writes
    (vllm/utils/serial_utils.py:74-99).  bfloat16 is float32 rounded to nearest even,
    as torch converts it."""
    if embed_dtype == "float16":
        return struct.pack(f"{'<' if little_endian else '>'}{len(values)}e", *values)
    floats = array("f", values)
    if embed_dtype == "bfloat16":
        words = array("I", floats.tobytes())
        halves = array("H", (((word + 0x7FFF + ((word >> 16) & 1)) >> 16) & 0xFFFF for word in words))
        if little_endian != (sys.byteorder == "little"):
            halves.byteswap()
        return halves.tobytes()
    if embed_dtype != "float32":
        raise ValueError(f"unsupported embed_dtype {embed_dtype!r}")
    if little_endian != (sys.byteorder == "little"):
        floats.byteswap()
    return floats.tobytes()


def encode_base64(values: Sequence[float], embed_dtype: str = "float32", *, little_endian: bool = True) -> str:
    """``encoding_format: base64``: the packed floats in standard base64
    (vllm/entrypoints/pooling/utils.py:86-92)."""
    return base64.b64encode(pack(values, embed_dtype, little_endian=little_endian)).decode("ascii")
