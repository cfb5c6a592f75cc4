"""The KV block pool: which prompt blocks are cached, who holds them, what is evicted.

Sans-I/O and clock-free, like the rest of the engine.  The scheduler hashes a prompt
once (:meth:`BlockPool.prompt`), asks how much of it is cached (:meth:`BlockPool.lookup`),
admits it only if :meth:`BlockPool.allocate` succeeds, and calls :meth:`BlockPool.free`
when the job ends.  The pool records vLLM's KV events, which the caller drains with
:meth:`BlockPool.take_events` (to publish them over ZMQ).

The model follows vLLM's ``BlockPool`` (``vllm/v1/core/block_pool.py``) where it matters
to a router or a dashboard, and llm-d-inference-sim (``pkg/kv-cache/block_cache.go``)
where vLLM has no equivalent:

* a request holds ``ceil((prompt + extra_tokens) / block_size)`` blocks; only its full
  prompt blocks are hashed (:mod:`llmsim.engine.kv_hashing`) and cached;
* a block held by any request is in use (ref-counted); when its last holder frees it,
  it stays cached but idle; idle blocks are evicted least recently freed first, and a
  request frees its blocks tail first, so a prefix outlives its extensions
  (``single_type_kv_cache_manager.py:599``, ``block_pool.py:816-849``);
* eviction prefers idle blocks of adapters that are not loaded (llm-d's
  ``pickBlockToEvict``); the base model's blocks count as loaded;
* a prefix hit is the longest run of cached leading blocks, at most
  ``prompt - 1`` tokens, since the last token must be computed for its logits
  (``kv_cache_manager.py:294-303``);
* prefix-cache queries and hits (in tokens) are counted when a request is admitted,
  not when it is looked up (``sched/scheduler.py:1508-1512``);
* ``usage`` is the fraction of blocks in use (``block_pool.py:921-932``: idle cached
  blocks count as free).

Full blocks past the hit that are already cached (the capped last block, or blocks
after an evicted one) are shared rather than duplicated as vLLM does.  Generated
tokens are not hashed (llm-d-inference-sim does not hash them either).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence

import attrs

from llmsim.engine.kv_hashing import BlockHasher, ExtraKey, MultimodalItem, block_extra_keys

__all__ = [
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "KvEvent",
    "PromptBlocks",
]

MEDIUM_GPU = "GPU"


# The events, with vLLM's fields in vLLM's order (vllm/distributed/kv_events.py:55-145).
# vLLM's later optional fields (extra_keys, group_idx, ...) are omitted, as
# llm-d-inference-sim omits them (kv_cache_sender.go).
@attrs.frozen
class BlockStored:
    """Blocks newly cached, one chain segment: ``block_hashes[0]``'s parent is
    ``parent_block_hash`` (None for a prompt's first block), and ``token_ids`` are the
    blocks' tokens concatenated."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


@attrs.frozen
class BlockRemoved:
    """Cached blocks evicted (one event per block, as vLLM emits them)."""

    block_hashes: tuple[int, ...]
    medium: str | None


@attrs.frozen
class AllBlocksCleared:
    """Every cached block forgotten (sleep)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@attrs.frozen
class PromptBlocks:
    """A prompt as the pool sees it: its token ids, the keys of its full blocks, and
    the adapter it runs under.  Built once per request by :meth:`BlockPool.prompt`."""

    token_ids: tuple[int, ...]
    hashes: tuple[int, ...]
    namespace: str
    lora_name: str | None
    lora_id: int | None


@attrs.define(eq=False)
class _Block:
    """One cached block.  ``cached`` is False once :meth:`BlockPool.clear` forgot it
    while a request still held it: it is then freed, not kept, when released."""

    hash: int
    namespace: str
    ref_count: int = 1
    idle_since: int = 0
    cached: bool = True


@attrs.define(eq=False)
class _Holding:
    """What one admitted request holds: its full prompt blocks (in prompt order) and
    how many anonymous blocks (partial tail, room for generated tokens)."""

    blocks: list[_Block]
    anonymous: int
    cached_tokens: int


class BlockPool:
    """``num_blocks`` KV blocks of ``block_size`` tokens, keyed as llm-d-inference-sim
    keys them under ``hash_seed``, for the model served as ``model`` (the first served
    model name; LoRA requests are keyed by the adapter's name)."""

    def __init__(self, num_blocks: int, block_size: int, hash_seed: str, model: str) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks} x {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hash_seed = hash_seed
        self.model = model
        self.prefix_cache_queries = 0  # prompt tokens of admitted requests
        self.prefix_cache_hits = 0  # of which were cached
        # Remember about as many blocks as the pool holds, twice over.
        self._hasher = BlockHasher(hash_seed, block_size, memo_size=2 * num_blocks)
        self._cached: dict[int, _Block] = {}
        # Idle blocks per namespace, least recently freed first.
        self._idle: dict[str, OrderedDict[int, _Block]] = {}
        self._num_idle = 0
        self._num_empty = num_blocks  # neither held nor cached
        self._tick = 0
        self._holdings: dict[Hashable, _Holding] = {}
        self._unloaded: set[str] = set()
        self._events: list[KvEvent] = []

    # -- hashing -------------------------------------------------------------------------

    def prompt(
        self,
        token_ids: Sequence[int],
        lora_name: str | None = None,
        lora_id: int | None = None,
        multimodal: Sequence[MultimodalItem] = (),
    ) -> PromptBlocks:
        """Hash ``token_ids`` once, for :meth:`lookup` and :meth:`allocate`."""
        namespace = self.model if lora_name is None else lora_name
        extra: tuple[ExtraKey, ...] = block_extra_keys(multimodal, self.block_size, len(token_ids))
        tokens = tuple(token_ids)
        hashes = tuple(self._hasher.chain(self._hasher.root(namespace), tokens, extra))
        return PromptBlocks(tokens, hashes, namespace, lora_name, lora_id)

    # -- queries -------------------------------------------------------------------------

    @property
    def usage(self) -> float:
        """The fraction of blocks held by requests (vLLM's ``kv_cache_usage_perc``)."""
        return self.num_used / self.num_blocks

    @property
    def num_used(self) -> int:
        return self.num_blocks - self._num_empty - self._num_idle

    @property
    def num_idle(self) -> int:
        """Cached blocks no request holds: kept for hits, evicted when room is needed."""
        return self._num_idle

    @property
    def num_empty(self) -> int:
        return self._num_empty

    def lookup(self, prompt: PromptBlocks) -> int:
        """How many leading tokens of ``prompt`` are cached: whole blocks, never all of
        the prompt.  Counts nothing (see :meth:`allocate`)."""
        return self._prefix_hit(prompt, [self._cached.get(block_hash) for block_hash in prompt.hashes])

    def fits_at_all(self, prompt: PromptBlocks, extra_tokens: int = 0) -> bool:
        """Whether the empty pool could hold ``prompt`` and ``extra_tokens`` more."""
        return math.ceil((len(prompt.token_ids) + extra_tokens) / self.block_size) <= self.num_blocks

    def cached_tokens(self, request: Hashable) -> int:
        """The prefix hit, in tokens, that ``request`` was admitted with."""
        return self._holdings[request].cached_tokens

    def holds(self, request: Hashable) -> bool:
        return request in self._holdings

    def cached_hashes(self) -> frozenset[int]:
        """The keys of every cached block, held or idle (what a router should know)."""
        return frozenset(self._cached)

    def ref_count(self, block_hash: int) -> int:
        """How many requests hold the cached block ``block_hash`` (0 if idle or absent)."""
        block = self._cached.get(block_hash)
        return 0 if block is None else block.ref_count

    def take_events(self) -> list[KvEvent]:
        """The events since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    # -- changes -------------------------------------------------------------------------

    def set_loaded(self, lora_name: str, loaded: bool) -> None:
        """Mark an adapter loaded or unloaded: idle blocks of unloaded adapters are
        evicted first."""
        if loaded:
            self._unloaded.discard(lora_name)
        else:
            self._unloaded.add(lora_name)

    def allocate(self, request: Hashable, prompt: PromptBlocks, extra_tokens: int = 0) -> bool:
        """Give ``request`` the blocks for its prompt and ``extra_tokens`` more, reusing
        cached ones and evicting idle ones as needed.  False, changing nothing, when the
        pool cannot hold them (the scheduler keeps the request waiting)."""
        if request in self._holdings:
            raise ValueError(f"{request!r} already holds blocks")
        total = math.ceil((len(prompt.token_ids) + extra_tokens) / self.block_size)
        found = [self._cached.get(block_hash) for block_hash in prompt.hashes]
        needed = total - sum(block is not None for block in found)
        reused_idle = sum(block is not None and block.ref_count == 0 for block in found)
        if needed > self._num_empty + self._num_idle - reused_idle:
            return False
        for block in found:
            if block is not None:
                self._hold(block)
        self._take_room(needed)
        blocks = self._store_new(prompt, found)
        cached_tokens = self._prefix_hit(prompt, found)
        self._holdings[request] = _Holding(blocks, total - len(blocks), cached_tokens)
        self.prefix_cache_queries += len(prompt.token_ids)
        self.prefix_cache_hits += cached_tokens
        return True

    def free(self, request: Hashable) -> None:
        """Release what ``request`` holds (nothing if it holds nothing): its cached blocks
        become idle when no one else holds them, tail first."""
        holding = self._holdings.pop(request, None)
        if holding is None:
            return
        self._num_empty += holding.anonymous
        for block in reversed(holding.blocks):
            block.ref_count -= 1
            if block.ref_count:
                continue
            if block.cached:
                self._tick += 1
                block.idle_since = self._tick
                self._idle.setdefault(block.namespace, OrderedDict())[block.hash] = block
                self._num_idle += 1
            else:
                self._num_empty += 1

    def clear(self) -> None:
        """Forget every cached block (sleep).  Blocks that requests hold stay theirs until
        freed, but no longer hit."""
        for block in self._cached.values():
            block.cached = False
        self._cached.clear()
        self._idle.clear()
        self._num_empty += self._num_idle
        self._num_idle = 0
        self._events.append(AllBlocksCleared())

    # -- internals -----------------------------------------------------------------------

    def _prefix_hit(self, prompt: PromptBlocks, found: Sequence[_Block | None]) -> int:
        """The leading run of cached blocks, in tokens, short of the prompt's last token
        (vLLM recomputes it for its logits)."""
        limit = max(len(prompt.token_ids) - 1, 0) // self.block_size
        hits = 0
        while hits < limit and found[hits] is not None:
            hits += 1
        return hits * self.block_size

    def _hold(self, block: _Block) -> None:
        if block.ref_count == 0:
            del self._idle[block.namespace][block.hash]
            self._num_idle -= 1
        block.ref_count += 1

    def _take_room(self, count: int) -> None:
        """Make ``count`` blocks available for new content: empty ones first, then by
        evicting idle ones."""
        from_empty = min(count, self._num_empty)
        self._num_empty -= from_empty
        for _ in range(count - from_empty):
            self._evict_one()

    def _evict_one(self) -> None:
        victim = self._pick_victim()
        del self._idle[victim.namespace][victim.hash]
        del self._cached[victim.hash]
        victim.cached = False
        self._num_idle -= 1
        self._events.append(BlockRemoved((victim.hash,), MEDIUM_GPU))

    def _pick_victim(self) -> _Block:
        """The least recently freed idle block, among unloaded adapters' if any."""
        heads = [(next(iter(idle.values())), namespace) for namespace, idle in self._idle.items() if idle]
        unloaded = [head for head in heads if head[1] in self._unloaded]
        return min(unloaded or heads, key=lambda head: head[0].idle_since)[0]

    def _store_new(self, prompt: PromptBlocks, found: Sequence[_Block | None]) -> list[_Block]:
        """Cache the prompt's blocks that were not cached, one ``BlockStored`` per run of
        consecutive new blocks; return all its full blocks in order."""
        blocks = list(found)
        size = self.block_size
        for start, stop in _runs_of_none(found):
            for index in range(start, stop):
                block = _Block(prompt.hashes[index], prompt.namespace)
                self._cached[block.hash] = blocks[index] = block
            self._events.append(
                BlockStored(
                    block_hashes=prompt.hashes[start:stop],
                    parent_block_hash=prompt.hashes[start - 1] if start else None,
                    token_ids=prompt.token_ids[start * size : stop * size],
                    block_size=size,
                    lora_id=prompt.lora_id,
                    medium=MEDIUM_GPU,
                    lora_name=prompt.lora_name,
                )
            )
        return [block for block in blocks if block is not None]


def _runs_of_none(items: Sequence[object]) -> Iterator[tuple[int, int]]:
    """The ``[start, stop)`` ranges of consecutive ``None`` items."""
    start: int | None = None
    for index, item in enumerate(items):
        if item is None and start is None:
            start = index
        elif item is not None and start is not None:
            yield start, index
            start = None
    if start is not None:
        yield start, len(items)
