"""The KV block pool (llmsim/engine/kv_cache.py) and its block keys (kv_hashing.py).

Keys are checked against a reference written here from llm-d-router v0.10.0
``pkg/kvcache/kvblock/token_processor.go`` (the hashing llm-d-inference-sim uses) and
RFC 8949 §4.2.1 (canonical CBOR).  The pool's bookkeeping is checked against a model
of it under random workloads, replaying its events the way a router would.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Hashable

import attrs
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from llmsim.engine.kv_cache import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    BlockStored,
    KvEvent,
    PromptBlocks,
)
from llmsim.engine.kv_hashing import MultimodalItem, block_extra_keys, fnv1a_64

# --- the reference hashing ---------------------------------------------------------------


def _cbor_head(major: int, value: int) -> bytes:
    """RFC 8949 §3 item head, §4.2.1 shortest form."""
    if value < 24:
        return bytes([major << 5 | value])
    size = next(size for size in (1, 2, 4, 8) if value < 256**size)
    return bytes([major << 5 | {1: 24, 2: 25, 4: 26, 8: 27}[size]]) + value.to_bytes(size, "big")


def _cbor(value: object) -> bytes:
    """Canonical CBOR of None, unsigned ints, text, lists and text-keyed dicts (the Go
    encoder's ``cbor.CanonicalEncOptions``: nil as null, map keys sorted length-first)."""
    if value is None:
        return b"\xf6"
    if isinstance(value, int):
        return _cbor_head(0, value)
    if isinstance(value, str):
        return _cbor_head(3, len(value.encode())) + value.encode()
    if isinstance(value, list):
        return _cbor_head(4, len(value)) + b"".join(_cbor(item) for item in value)
    assert isinstance(value, dict)
    pairs = sorted((_cbor(key), _cbor(item)) for key, item in value.items())
    pairs.sort(key=lambda pair: len(pair[0]))
    return _cbor_head(5, len(pairs)) + b"".join(key + item for key, item in pairs)


def _fnv1a_64(data: bytes) -> int:
    """Go's ``hash/fnv.New64a``: offset basis 14695981039346656037, prime 1099511628211."""
    h = 14695981039346656037
    for byte in data:
        h = ((h ^ byte) * 1099511628211) % 2**64
    return h


def reference_keys(
    seed: str, model: str, tokens: list[int], block_size: int, extras: list[list[str] | None] | None = None
) -> list[int]:
    """token_processor.go: ``initHash = fnv64a(seed)`` (NewChunkedTokenDatabase);
    root ``hash(initHash, nil, model)`` (getInitHash); per full chunk
    ``hash(parent, chunk, extra)`` with extra nil or ``[]MMHash{{Hash}}`` (prefixHashes);
    ``hash = fnv64a(cbor([parent, tokens, extra]))``."""
    parent = _fnv1a_64(_cbor([_fnv1a_64(seed.encode()), None, model]))
    keys = []
    for index in range(len(tokens) // block_size):
        identifiers = None if extras is None else extras[index]
        extra = None if identifiers is None else [{"Hash": h} for h in identifiers]
        parent = _fnv1a_64(_cbor([parent, tokens[index * block_size : (index + 1) * block_size], extra]))
        keys.append(parent)
    return keys


def test_reference_cbor_and_fnv_match_published_vectors() -> None:
    """RFC 8949 Appendix A examples and the FNV-1a 64 test vectors (draft-eastlake-fnv)."""
    assert _cbor(24) == bytes.fromhex("1818")
    assert _cbor(1000000) == bytes.fromhex("1a000f4240")
    assert _cbor(18446744073709551615) == bytes.fromhex("1bffffffffffffffff")
    assert _cbor([1, [2, 3], [4, 5]]) == bytes.fromhex("8301820203820405")
    assert _cbor({"a": 1, "b": [2, 3]}) == bytes.fromhex("a26161016162820203")
    assert _cbor("IETF") == bytes.fromhex("6449455446")
    for data, expected in ((b"", 0xCBF29CE484222325), (b"a", 0xAF63DC4C8601EC8C), (b"foobar", 0x85944171F73967E8)):
        assert _fnv1a_64(data) == expected
        assert fnv1a_64(data) == expected


@pytest.mark.parametrize("seed", ["", "42", "héllo"])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_keys_equal_the_reference(seed: str, block_size: int) -> None:
    tokens = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 7] * 5 + [3]
    pool = BlockPool(64, block_size, seed, "Qwen/Qwen2.5-1.5B-Instruct")
    prompt = pool.prompt(tokens)
    assert list(prompt.hashes) == reference_keys(seed, "Qwen/Qwen2.5-1.5B-Instruct", tokens, block_size)
    assert len(prompt.hashes) == len(tokens) // block_size  # the partial tail has no key
    lora = pool.prompt(tokens, lora_name="sql-lora", lora_id=1)
    assert list(lora.hashes) == reference_keys(seed, "sql-lora", tokens, block_size)
    assert not set(lora.hashes) & set(prompt.hashes)


def test_keys_depend_on_seed_and_model() -> None:
    tokens = list(range(32))
    keys = {BlockPool(8, 16, seed, model).prompt(tokens).hashes[0] for seed in ("", "1") for model in ("a", "b")}
    assert len(keys) == 4


def test_multimodal_extra_keys_equal_the_reference() -> None:
    """extra_keys.go ComputeBlockExtraFeatures: each block lists the items overlapping it."""
    items = [MultimodalItem("img-b", 10, 4), MultimodalItem("img-a", 2, 3)]
    assert block_extra_keys(items, 4, 17) == (("img-a",), ("img-a",), ("img-b",), ("img-b",))
    tokens = list(range(17))
    pool = BlockPool(8, 4, "s", "m")
    expected = reference_keys("s", "m", tokens, 4, [["img-a"], ["img-a"], ["img-b"], ["img-b"]])
    assert list(pool.prompt(tokens, multimodal=items).hashes) == expected
    assert pool.prompt(tokens, multimodal=items).hashes != pool.prompt(tokens).hashes


# --- the pool, case by case --------------------------------------------------------------


def _state(pool: BlockPool) -> tuple[object, ...]:
    return (
        pool.usage,
        pool.num_used,
        pool.num_idle,
        pool.num_empty,
        pool.cached_hashes(),
        pool.prefix_cache_queries,
        pool.prefix_cache_hits,
    )


def test_hit_is_whole_blocks_and_never_the_whole_prompt() -> None:
    """kv_cache_manager.py:294-303: at most prompt - 1 tokens hit."""
    pool = BlockPool(16, 4, "", "m")
    first = pool.prompt(list(range(12)))
    assert pool.allocate("a", first)
    assert pool.cached_tokens("a") == 0
    pool.free("a")
    assert pool.lookup(first) == 8  # all 3 blocks cached, the last one is recomputed
    assert pool.lookup(pool.prompt(list(range(13)))) == 12
    assert pool.lookup(pool.prompt(list(range(11)))) == 8
    assert pool.lookup(pool.prompt([0, 1, 2, 3, 9, 9, 9, 9, 8, 9, 10, 11, 12])) == 4
    assert pool.lookup(pool.prompt([])) == 0
    assert pool.allocate("b", first)
    assert (pool.cached_tokens("b"), pool.prefix_cache_queries, pool.prefix_cache_hits) == (8, 24, 8)
    assert pool.num_used == 3 and not pool.take_events()[1:]  # the capped block is shared, not stored again


def test_refused_allocation_changes_nothing() -> None:
    pool = BlockPool(4, 4, "", "m")
    assert pool.allocate("a", pool.prompt(list(range(8))))
    pool.free("a")
    assert pool.allocate("b", pool.prompt([9] * 3))
    pool.take_events()
    before = _state(pool)
    assert not pool.allocate("c", pool.prompt(list(range(8)) + [5] * 5))  # 4 blocks, 2 cached idle, 1 empty
    assert _state(pool) == before and not pool.take_events() and not pool.holds("c")
    assert pool.allocate("c", pool.prompt(list(range(8)) + [5] * 4))  # 3 blocks fit
    assert pool.usage == 1.0
    assert not pool.allocate("d", pool.prompt([]), extra_tokens=1)
    assert pool.allocate("d", pool.prompt([]))


def test_extra_tokens_reserve_anonymous_blocks() -> None:
    pool = BlockPool(8, 4, "", "m")
    assert pool.allocate("a", pool.prompt(list(range(6))), extra_tokens=7)  # 13 tokens: 4 blocks
    assert (pool.num_used, len(pool.cached_hashes())) == (4, 1)
    pool.free("a")
    assert (pool.num_used, pool.num_idle, pool.num_empty) == (0, 1, 7)


def test_events_describe_each_new_run_of_blocks() -> None:
    pool = BlockPool(16, 2, "", "base")
    a = pool.prompt([1, 2, 3, 4, 5], lora_name="sql", lora_id=3)
    assert pool.allocate("a", a)
    assert pool.take_events() == [BlockStored(a.hashes, None, (1, 2, 3, 4), 2, 3, MEDIUM_GPU, "sql")]
    b = pool.prompt([1, 2, 3, 4, 6, 7, 8, 9], lora_name="sql", lora_id=3)
    assert pool.allocate("b", b)
    assert b.hashes[:2] == a.hashes
    assert pool.take_events() == [BlockStored(b.hashes[2:], a.hashes[1], (6, 7, 8, 9), 2, 3, MEDIUM_GPU, "sql")]
    assert [pool.ref_count(h) for h in b.hashes] == [2, 2, 1, 1]


def test_eviction_is_lru_tail_first_and_prefers_unloaded_adapters() -> None:
    """A request frees its blocks tail first (single_type_kv_cache_manager.py:599), so its
    prefix is evicted last; idle blocks of unloaded adapters go before any others."""
    pool = BlockPool(6, 1, "", "base")
    base = pool.prompt([1, 2, 3])
    lora = pool.prompt([1, 2], lora_name="x")
    assert pool.allocate("base", base) and pool.allocate("lora", lora)
    pool.free("lora")
    pool.free("base")
    pool.take_events()
    assert pool.allocate("c", pool.prompt([7, 8]))
    assert pool.take_events()[:1] == [BlockRemoved((lora.hashes[1],), MEDIUM_GPU)]  # one empty block, one eviction
    pool.set_loaded("x", False)
    assert pool.allocate("d", pool.prompt([9, 9]))
    assert pool.take_events()[:2] == [
        BlockRemoved((lora.hashes[0],), MEDIUM_GPU),
        BlockRemoved((base.hashes[2],), MEDIUM_GPU),
    ]


def test_clear_forgets_cached_blocks_but_not_held_ones() -> None:
    pool = BlockPool(8, 2, "", "m")
    prompt = pool.prompt([1, 2, 3, 4, 5])
    assert pool.allocate("a", prompt) and pool.allocate("b", pool.prompt([7, 7, 7]))
    pool.free("b")
    pool.take_events()
    pool.clear()
    assert pool.take_events() == [AllBlocksCleared()]
    assert (pool.cached_hashes(), pool.num_used, pool.num_idle) == (frozenset(), 3, 0)
    assert pool.lookup(prompt) == 0
    assert pool.allocate("c", prompt)  # stored again while "a" still holds the forgotten copies
    assert len(pool.take_events()) == 1 and pool.num_used == 6
    pool.free("a")
    assert (pool.num_used, pool.num_idle, pool.num_empty) == (3, 0, 5)
    pool.free("c")
    assert (pool.num_used, pool.num_idle, pool.num_empty) == (0, 2, 6)


def test_double_allocation_is_a_bug_and_unknown_free_is_ignored() -> None:
    pool = BlockPool(8, 2, "", "m")
    assert pool.allocate("a", pool.prompt([1, 2]))
    with pytest.raises(ValueError, match="already holds"):
        pool.allocate("a", pool.prompt([1, 2]))
    pool.free("nobody")
    assert pool.num_used == 1


# --- random workloads against a model ----------------------------------------------------

BLOCK = 2
NUM_BLOCKS = 10
LORAS = {None: None, "x": 1, "y": 2}


@attrs.define
class Held:
    order: tuple[int, ...]  # its prompt's keys
    blocks: set[tuple[int, int]]  # (epoch, hash): the copies it holds
    anonymous: int


class PoolMachine(RuleBasedStateMachine):
    """Drives a pool with allocations, frees, clears and adapter loads, and checks it
    against a model built only from the workload and the pool's events."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(NUM_BLOCKS, BLOCK, "seed", "base")
        self.replayed: set[int] = set()  # what a router learns from the events
        self.epoch = 0  # bumped by clear: forgotten copies stay held
        self.held: dict[Hashable, Held] = {}
        self.idle: OrderedDict[int, str] = OrderedDict()  # hash -> namespace, least recently freed first
        self.namespace: dict[int, str] = {}
        self.unloaded: set[str] = set()
        self.next_request = 0
        self.seen: Counter[str] = Counter()  # what the workload exercised

    def _model_used(self) -> int:
        copies = set().union(*(held.blocks for held in self.held.values())) if self.held else set()
        return len(copies) + sum(held.anonymous for held in self.held.values())

    def _expected_victims(self, count: int) -> list[int]:
        victims = []
        for _ in range(count):
            unloaded = [h for h, namespace in self.idle.items() if namespace in self.unloaded]
            victim = unloaded[0] if unloaded else next(iter(self.idle))
            del self.idle[victim]
            victims.append(victim)
        return victims

    def _replay(self, events: list[KvEvent]) -> list[int]:
        removed = []
        for event in events:
            if isinstance(event, BlockStored):
                assert not self.replayed & set(event.block_hashes)
                assert event.parent_block_hash is None or event.parent_block_hash in self.replayed
                assert len(event.token_ids) == BLOCK * len(event.block_hashes) and event.block_size == BLOCK
                self.replayed |= set(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                (block_hash,) = event.block_hashes
                assert block_hash in self.replayed
                self.replayed.discard(block_hash)
                removed.append(block_hash)
            else:
                self.replayed.clear()
        return removed

    @rule(
        tokens=st.lists(st.integers(0, 2), max_size=12),
        lora=st.sampled_from(sorted(LORAS, key=str)),
        extra=st.integers(0, 3),
    )
    def allocate(self, tokens: list[int], lora: str | None, extra: int) -> None:
        request = self.next_request
        self.next_request += 1
        prompt: PromptBlocks = self.pool.prompt(tokens, lora_name=lora, lora_id=LORAS[lora])
        limit = max(len(tokens) - 1, 0) // BLOCK
        expected_hit = next((i for i, h in enumerate(prompt.hashes[:limit]) if h not in self.replayed), limit)
        assert self.pool.lookup(prompt) == expected_hit * BLOCK
        total = -(-(len(tokens) + extra) // BLOCK)
        found = [h for h in prompt.hashes if h in self.replayed]
        reused_idle = [h for h in found if h in self.idle]
        needed = total - len(found)
        fits = needed <= NUM_BLOCKS - self._model_used() - len(reused_idle)
        queries, hits = self.pool.prefix_cache_queries, self.pool.prefix_cache_hits
        assert self.pool.allocate(request, prompt, extra_tokens=extra) == fits
        self.seen["allocate fits" if fits else "allocate refused"] += 1
        if not fits:
            assert not self.pool.take_events()
            return
        assert self.pool.cached_tokens(request) == expected_hit * BLOCK
        assert (self.pool.prefix_cache_queries - queries, self.pool.prefix_cache_hits - hits) == (
            len(tokens),
            expected_hit * BLOCK,
        )
        evictions = max(0, needed - (NUM_BLOCKS - self._model_used() - len(self.idle)))
        for h in reused_idle:
            del self.idle[h]
        if evictions:
            unloaded_idle = set(self.idle.values()) & self.unloaded
            self.seen["eviction with unloaded idle" if unloaded_idle else "eviction"] += 1
        expected_victims = self._expected_victims(evictions)
        assert self._replay(self.pool.take_events()) == expected_victims
        for h in prompt.hashes:
            self.namespace[h] = prompt.namespace
        self.held[request] = Held(prompt.hashes, {(self.epoch, h) for h in prompt.hashes}, total - len(prompt.hashes))

    @precondition(lambda self: self.held)
    @rule(pick=st.integers(0, 99))
    def free(self, pick: int) -> None:
        request = sorted(self.held, key=str)[pick % len(self.held)]
        holding = self.held.pop(request)
        still_held = set().union(*(held.blocks for held in self.held.values())) if self.held else set()
        self.pool.free(request)
        for h in reversed(holding.order):  # tail first
            if (self.epoch, h) in holding.blocks and (self.epoch, h) not in still_held:
                self.idle[h] = self.namespace[h]
        assert not self.pool.take_events()

    @rule()
    def clear(self) -> None:
        self.pool.clear()
        assert self.pool.take_events() == [AllBlocksCleared()]
        self.replayed.clear()
        self.idle.clear()
        self.epoch += 1

    @rule(lora=st.sampled_from(["x", "y"]), loaded=st.booleans())
    def set_loaded(self, lora: str, loaded: bool) -> None:
        self.pool.set_loaded(lora, loaded)
        (self.unloaded.discard if loaded else self.unloaded.add)(lora)

    @invariant()
    def books_balance(self) -> None:
        pool = self.pool
        assert pool.num_used + pool.num_idle + pool.num_empty == NUM_BLOCKS
        assert min(pool.num_used, pool.num_idle, pool.num_empty) >= 0
        assert pool.num_used == self._model_used()
        assert pool.usage == pool.num_used / NUM_BLOCKS
        assert pool.num_idle == len(self.idle)
        assert pool.prefix_cache_hits <= pool.prefix_cache_queries

    @invariant()
    def events_reproduce_the_cache(self) -> None:
        assert self.pool.cached_hashes() == frozenset(self.replayed)

    @invariant()
    def ref_counts_count_holders(self) -> None:
        for h in self.replayed:
            holders = sum((self.epoch, h) in held.blocks for held in self.held.values())
            assert self.pool.ref_count(h) == holders >= 0
            assert (holders == 0) == (h in self.idle)


TestPoolMachine = PoolMachine.TestCase


def test_long_random_workloads() -> None:
    """The same checks over long runs (Hypothesis's stateful runs are short), which keep
    the pool full enough to refuse, to evict, and to evict unloaded adapters' blocks."""
    seen: Counter[str] = Counter()
    for seed in range(20):
        rng = random.Random(seed)
        machine = PoolMachine()
        for _ in range(400):
            op = rng.choices(["allocate", "free", "clear", "set_loaded"], weights=[10, 7, 0.3, 1])[0]
            if op == "allocate":
                tokens = [rng.randrange(3) for _ in range(rng.randrange(13))]
                machine.allocate(tokens, rng.choice(list(LORAS)), rng.randrange(4))
            elif op == "free" and machine.held:
                machine.free(rng.randrange(100))
            elif op == "clear":
                machine.clear()
            elif op == "set_loaded":
                machine.set_loaded(rng.choice(["x", "y"]), rng.random() < 0.5)
            machine.books_balance()
            machine.events_reproduce_the_cache()
            machine.ref_counts_count_holders()
        seen += machine.seen
    kinds = ("allocate fits", "allocate refused", "eviction", "eviction with unloaded idle")
    assert min(seen[kind] for kind in kinds) > 50, seen
