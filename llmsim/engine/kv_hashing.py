"""Prefix-cache block keys, computed as llm-d-inference-sim computes them.

llm-d-inference-sim hashes a prompt with llm-d-router's ``kvblock.ChunkedTokenDatabase``
(v0.10.0, ``pkg/kvcache/kvblock/token_processor.go``; called from llm-d-inference-sim
``pkg/kv-cache/kv_cache.go`` ``OnRequestStart``), and its users' routers hash the same
token ids with the same code to find the pod that holds a prefix.  llmsim follows that
scheme, not vLLM's own (``sha256_cbor`` of ``(parent, tokens, extra_keys)``, 32-byte
hashes, ``vllm/v1/core/kv_cache_utils.py:707-735``), so the keys it publishes are the
ones those routers compute:

* ``init = FNV-1a-64(seed)`` where the seed is ``--hash-seed`` (else ``PYTHONHASHSEED``,
  else ``""``) — ``NewChunkedTokenDatabase``;
* the chain's root is ``hash(init, nil, model)``: the request's model name (the LoRA
  adapter's name for a LoRA request, otherwise the first served model name) namespaces
  every key — ``getInitHash``, and llm-d-inference-sim ``context.go:248-253``;
* each *full* block of ``block_size`` tokens is ``hash(parent, tokens, extra)``, where
  ``extra`` is nil for text and, for a block overlapped by multimodal items, the list of
  their identifiers (``[{"Hash": id}, ...]``) — ``prefixHashes``, ``extra_keys.go``;
* ``hash(p, t, e) = FNV-1a-64(canonical CBOR of [p, t, e])``: unsigned integers in
  their shortest form, a nil slice or interface as CBOR null.

Token ids are ``uint32`` in llm-d; ids above that would be encoded wider here.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

__all__ = ["BlockHasher", "MultimodalItem", "block_extra_keys", "chain_root", "fnv1a_64", "seed_hash"]

FNV64_OFFSET = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1
_NULL = b"\xf6"
_MAJOR_UINT, _MAJOR_TEXT, _MAJOR_ARRAY = 0, 3, 4
_HASH_KEY = b"\xa1" + b"\x64Hash"  # a one-entry map whose key is the text "Hash" (MMHash.Hash)

#: One block's extra key: None for text, else the identifiers of the multimodal items
#: that overlap it, in placeholder order.
ExtraKey = tuple[str, ...] | None


@attrs.frozen
class MultimodalItem:
    """One multimodal input's placeholder in the prompt: its identifier (the mm hash)
    and the token range ``[offset, offset + length)`` it occupies."""

    identifier: str
    offset: int
    length: int


def fnv1a_64(data: bytes, start: int = FNV64_OFFSET) -> int:
    """FNV-1a, 64 bits (Go's ``hash/fnv.New64a``)."""
    h, prime, mask = start, FNV64_PRIME, _MASK64  # locals: this loop is the hot path
    for byte in data:
        h = (h ^ byte) * prime & mask
    return h


def _head(major: int, value: int) -> bytes:
    """A CBOR item head in its shortest (canonical) form."""
    if value < 24:
        return bytes((major << 5 | value,))
    for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if value < 1 << (8 * size):
            return bytes((major << 5 | info,)) + value.to_bytes(size, "big")
    raise ValueError(f"{value} does not fit in 64 bits")


# Token ids repeat across blocks and prompts: their encodings are cached, up to a bound.
_UINT_CACHE: dict[int, bytes] = {}
_UINT_CACHE_LIMIT = 1 << 16  # about 6 MB


def _uint(value: int) -> bytes:
    encoded = _UINT_CACHE.get(value)
    if encoded is None:
        encoded = _head(_MAJOR_UINT, value)
        if len(_UINT_CACHE) < _UINT_CACHE_LIMIT:
            _UINT_CACHE[value] = encoded
    return encoded


def _text(value: str) -> bytes:
    raw = value.encode()
    return _head(_MAJOR_TEXT, len(raw)) + raw


def _extra(extra: str | ExtraKey) -> bytes:
    if extra is None:
        return _NULL
    if isinstance(extra, str):
        return _text(extra)
    return _head(_MAJOR_ARRAY, len(extra)) + b"".join(_HASH_KEY + _text(item) for item in extra)


def _block_hash(parent: int, tokens: Sequence[int] | None, extra: str | ExtraKey) -> int:
    if tokens is None:
        encoded_tokens = _NULL
    else:
        cached = _UINT_CACHE.get
        encoded_tokens = _head(_MAJOR_ARRAY, len(tokens)) + b"".join([cached(t) or _uint(t) for t in tokens])
    return fnv1a_64(b"\x83" + _uint(parent) + encoded_tokens + _extra(extra))


def seed_hash(seed: str) -> int:
    """``initHash``: FNV-1a-64 of the seed's bytes."""
    return fnv1a_64(seed.encode())


def chain_root(seed: str, model: str) -> int:
    """The parent of a prompt's first block, for requests to ``model``."""
    return _block_hash(seed_hash(seed), None, model)


class BlockHasher:
    """Block keys under one seed and block size, with a bounded memo of recent blocks:
    FNV over CBOR is pure Python (a few ms for a fresh 2k-token prompt), while a shared
    prefix, the case prefix caching is about, costs a dictionary lookup per block."""

    def __init__(self, seed: str, block_size: int, memo_size: int) -> None:
        self.seed = seed
        self.block_size = block_size
        self._roots: dict[str, int] = {}
        self._memo: dict[tuple[int, tuple[int, ...], ExtraKey], int] = {}
        self._memo_size = memo_size

    def root(self, model: str) -> int:
        root = self._roots.get(model)
        if root is None:
            root = self._roots[model] = chain_root(self.seed, model)
        return root

    def chain(self, root: int, token_ids: Sequence[int], extra_keys: Sequence[ExtraKey] = ()) -> list[int]:
        """The keys of the full blocks of ``token_ids``, chained from ``root``."""
        size = self.block_size
        count = len(token_ids) // size
        if extra_keys and len(extra_keys) != count:
            raise ValueError(f"{len(extra_keys)} extra keys for {count} full blocks")
        tokens = tuple(token_ids)
        hashes: list[int] = []
        parent = root
        for index in range(count):
            key = (parent, tokens[index * size : (index + 1) * size], extra_keys[index] if extra_keys else None)
            block_hash = self._memo.get(key)
            if block_hash is None:
                block_hash = _block_hash(*key)
                self._remember(key, block_hash)
            hashes.append(block_hash)
            parent = block_hash
        return hashes

    def _remember(self, key: tuple[int, tuple[int, ...], ExtraKey], block_hash: int) -> None:
        if not self._memo_size:
            return
        if len(self._memo) >= self._memo_size:
            del self._memo[next(iter(self._memo))]  # the oldest entry
        self._memo[key] = block_hash


def block_extra_keys(items: Sequence[MultimodalItem], block_size: int, num_tokens: int) -> tuple[ExtraKey, ...]:
    """Per full block, the identifiers of the multimodal items overlapping it
    (``ComputeBlockExtraFeatures``, llm-d-router v0.10.0 ``extra_keys.go``, which follows
    vLLM's ``_gen_mm_extra_hash_keys``).  Empty when there are no items."""
    if not items:
        return ()
    ordered = sorted(items, key=lambda item: item.offset)
    keys: list[ExtraKey] = []
    for index in range(num_tokens // block_size):
        start, end = index * block_size, (index + 1) * block_size
        overlapping = tuple(
            item.identifier for item in ordered if item.offset < end and item.offset + item.length > start
        )
        keys.append(overlapping or None)
    return tuple(keys)
