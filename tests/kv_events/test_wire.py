"""Encodings, batching and the replay buffer (llmsim/kv_events/wire.py), without sockets."""

from __future__ import annotations

import msgpack
import pytest

from llmsim.engine.kv_cache import AllBlocksCleared, BlockRemoved, BlockStored
from llmsim.kv_events.wire import (
    END_OF_REPLAY,
    EventBatcher,
    ReplayBuffer,
    decode_seq,
    encode_batch,
    encode_event,
    encode_seq,
    llmd_topic,
)

STORED = BlockStored(
    block_hashes=(2**64 - 1, 7),
    parent_block_hash=None,
    token_ids=(1, 2, 3, 4),
    block_size=2,
    lora_id=None,
    medium="GPU",
    lora_name=None,
)


def test_array_format_is_llm_ds() -> None:
    """``msgpackBlockStoredEvent`` and friends (kv_cache_sender.go), encoded as_array."""
    assert encode_event(STORED, map_format=False) == [
        "BlockStored", [2**64 - 1, 7], 0, [1, 2, 3, 4], 2, None, "GPU", None, None
    ]  # fmt: skip
    chained = BlockStored((9,), 7, (5, 6), 2, 3, "GPU", "adapter")
    encoded = encode_event(chained, map_format=False)
    assert isinstance(encoded, list) and encoded[2:] == [7, [5, 6], 2, 3, "GPU", "adapter", None]
    assert encode_event(BlockRemoved((7,), "GPU"), map_format=False) == ["BlockRemoved", [7], "GPU"]
    assert encode_event(AllBlocksCleared(), map_format=False) == ["AllBlocksCleared"]


def test_map_format_is_vllm_033s() -> None:
    """msgspec's encoding of vllm/distributed/kv_events.py:55-145 (tag first, fields in
    declaration order, the ones without a default always present)."""
    event = encode_event(STORED, map_format=True)
    assert isinstance(event, dict)
    assert list(event.items()) == [
        ("type", "BlockStored"),
        ("block_hashes", [2**64 - 1, 7]),
        ("parent_block_hash", None),
        ("token_ids", [1, 2, 3, 4]),
        ("block_size", 2),
        ("lora_id", None),
        ("medium", "GPU"),
        ("lora_name", None),
    ]
    assert encode_event(BlockRemoved((7,), "GPU"), map_format=True) == {
        "type": "BlockRemoved",
        "block_hashes": [7],
        "medium": "GPU",
    }
    assert encode_event(AllBlocksCleared(), map_format=True) == {"type": "AllBlocksCleared"}


def test_a_batch_is_ts_events_rank_with_a_float64_ts_and_uint64_hashes() -> None:
    payload = encode_batch(1700000000.5, [encode_event(STORED, map_format=False)], 3)
    assert payload[:2] == b"\x93\xcb"  # fixarray of 3, then a float64
    assert b"\xcf" + (2**64 - 1).to_bytes(8, "big") in payload  # uint64
    assert msgpack.unpackb(payload) == [
        1700000000.5, [["BlockStored", [2**64 - 1, 7], 0, [1, 2, 3, 4], 2, None, "GPU", None, None]], 3
    ]  # fmt: skip


def test_seq_frames_and_topic() -> None:
    assert encode_seq(1) == b"\x00" * 7 + b"\x01"
    assert decode_seq(encode_seq(2**64 - 1)) == 2**64 - 1 and encode_seq(2**64 - 1) == END_OF_REPLAY
    assert decode_seq(encode_seq(5) + b"extra") == 5
    with pytest.raises(ValueError):
        decode_seq(b"\x00" * 7)
    assert llmd_topic("10.0.0.7", 8000, "m") == "kv@10.0.0.7:8000@m"


def test_the_batcher_cuts_full_batches_at_once_and_partial_ones_on_the_timer() -> None:
    """llm-d's KVEventSender.Run: a full batch goes out and restarts the timer; the timer
    sends what is pending."""
    batcher = EventBatcher(3, 1.0, now=0.0)
    assert batcher.add(["a", "b"], 0.1) == []
    assert batcher.add(["c", "d", "e", "f", "g"], 0.2) == [["a", "b", "c"], ["d", "e", "f"]]
    assert batcher.pending == 1
    assert batcher.add([], 1.1) == []  # the timer restarted at 0.2
    assert batcher.add([], 1.2) == [["g"]]
    assert batcher.add(["h"], 2.1) == []
    assert batcher.add([], 2.2) == [["h"]]
    assert batcher.add([], 3.3) == []  # nothing pending: nothing sent


def test_vllms_batcher_sends_each_drain_as_one_batch() -> None:
    batcher = EventBatcher(None, 0.0, now=0.0)
    assert batcher.add([], 0.0) == []
    assert batcher.add(list("abcdefghij"), 0.02) == [list("abcdefghij")]
    assert batcher.pending == 0


def test_the_replay_buffer_keeps_the_last_batches() -> None:
    buffer = ReplayBuffer(3)
    for seq in range(1, 6):
        buffer.store(seq, bytes([seq]))
    assert len(buffer) == 3
    assert buffer.since(0) == [(3, b"\x03"), (4, b"\x04"), (5, b"\x05")]
    assert buffer.since(5) == [(5, b"\x05")]
    assert buffer.since(6) == []
