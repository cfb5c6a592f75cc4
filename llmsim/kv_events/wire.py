"""KV events on the wire: the msgpack encodings, the frames, and how events become batches.

No I/O here (the sockets are :mod:`llmsim.kv_events.publisher`).  A published message is
three ZMQ frames, as vLLM's ``ZmqEventPublisher`` and llm-d-inference-sim's publisher
send them::

    [topic, seq as 8 bytes big-endian, msgpack([ts, [event, ...], data_parallel_rank])]

Two event encodings (``vllm/distributed/kv_events.py:31-145``; llm-d-inference-sim
``pkg/kv-cache/kv_cache_sender.go``):

* **array** (llm-d-inference-sim's default, vLLM's ``array_like`` structs of earlier
  releases): ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium, lora_name, extra_keys]``, ``["BlockRemoved", block_hashes, medium]``,
  ``["AllBlocksCleared"]``.  As llm-d-inference-sim writes them: a first block's parent is
  ``0``, and ``extra_keys`` is always nil (its Go structs are encoded ``as_array``, every
  field written).
* **map** (vLLM 0.33's, whose ``KVCacheEvent`` is a ``tag=True`` struct that is not
  ``array_like``): ``{"type": "BlockStored", "block_hashes": ..., "parent_block_hash":
  ..., "token_ids": ..., "block_size": ..., "lora_id": ..., "medium": ..., "lora_name":
  ...}`` with the fields that have no default always present (nil if None) and the later
  optional ones (``extra_keys``, ``group_idx``, ...) left out, as msgspec's
  ``omit_defaults`` leaves them; a first block's parent is nil.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import msgpack

from llmsim.engine.kv_cache import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

__all__ = [
    "END_OF_REPLAY",
    "EventBatcher",
    "ReplayBuffer",
    "decode_seq",
    "encode_batch",
    "encode_event",
    "encode_seq",
    "llmd_topic",
]

#: The seq frame of the message that ends a replay (with an empty topic and payload):
#: ``0xFFFFFFFFFFFFFFFF``, vLLM's ``END_SEQ`` (``(-1).to_bytes(8, "big", signed=True)``).
END_OF_REPLAY = b"\xff" * 8


def encode_seq(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def decode_seq(frame: bytes) -> int:
    """A sequence number from its first 8 bytes (big-endian); ValueError if shorter."""
    if len(frame) < 8:
        raise ValueError(f"a sequence number takes 8 bytes, got {len(frame)}")
    return int.from_bytes(frame[:8], "big")


def llmd_topic(pod_ip: str, port: int, model: str) -> str:
    """``kv@<pod-ip>:<serving-port>@<model>`` (llm-d-inference-sim ``CreateKVEventsTopic``):
    the ``<ip>:<port>`` pair is how a router's scorer addresses the pod."""
    return f"kv@{pod_ip}:{port}@{model}"


def encode_event(event: KvEvent, *, map_format: bool) -> object:
    """``event`` as the msgpack-ready value of the chosen encoding."""
    if isinstance(event, BlockStored):
        return _stored_map(event) if map_format else _stored_array(event)
    if isinstance(event, BlockRemoved):
        if map_format:
            return {"type": "BlockRemoved", "block_hashes": list(event.block_hashes), "medium": event.medium}
        return ["BlockRemoved", list(event.block_hashes), event.medium]
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"} if map_format else ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {event!r}")


def _stored_array(event: BlockStored) -> list[object]:
    parent = 0 if event.parent_block_hash is None else event.parent_block_hash
    return [
        "BlockStored",
        list(event.block_hashes),
        parent,
        list(event.token_ids),
        event.block_size,
        event.lora_id,
        event.medium,
        event.lora_name,
        None,  # extra_keys
    ]


def _stored_map(event: BlockStored) -> dict[str, object]:
    return {
        "type": "BlockStored",
        "block_hashes": list(event.block_hashes),
        "parent_block_hash": event.parent_block_hash,
        "token_ids": list(event.token_ids),
        "block_size": event.block_size,
        "lora_id": event.lora_id,
        "medium": event.medium,
        "lora_name": event.lora_name,
    }


def encode_batch(ts: float, events: Sequence[object], data_parallel_rank: int) -> bytes:
    """vLLM's ``EventBatch`` (``array_like``): ``[ts, events, data_parallel_rank]``, ``ts``
    a float64 of wall-clock seconds."""
    payload: bytes = msgpack.packb([ts, list(events), data_parallel_rank], use_bin_type=True)
    return payload


class EventBatcher:
    """Cuts encoded events into batches as llm-d-inference-sim's ``KVEventSender.Run``
    does: a batch goes out as soon as it holds ``max_size`` events, and whatever is
    pending goes out every ``delay`` seconds (the timer restarts after each batch).
    ``max_size=None`` and ``delay=0`` give vLLM's behaviour instead: everything gathered
    since the last call is one batch (vLLM publishes one batch per engine step)."""

    def __init__(self, max_size: int | None, delay: float, now: float) -> None:
        self.max_size = max_size
        self.delay = delay
        self._pending: list[object] = []
        self._deadline = now + delay

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def deadline(self) -> float:
        """When the timer sends what is pending."""
        return self._deadline

    def add(self, events: Iterable[object], now: float) -> list[list[object]]:
        """Take ``events``; return the batches that are ready at ``now``, oldest first."""
        self._pending.extend(events)
        batches: list[list[object]] = []
        size = self.max_size
        if size is not None:
            while len(self._pending) >= size:
                batches.append(self._pending[:size])
                del self._pending[:size]
                self._deadline = now + self.delay
        if now >= self._deadline:
            if self._pending:
                batches.append(self._pending)
                self._pending = []
            self._deadline = now + self.delay
        return batches


class ReplayBuffer:
    """The last ``capacity`` published batches, ``(seq, payload)``, for the replay socket
    (llm-d-inference-sim's ``replayQueue``, vLLM's ``_buffer``: the oldest is dropped)."""

    def __init__(self, capacity: int) -> None:
        self._entries: deque[tuple[int, bytes]] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._entries)

    def store(self, seq: int, payload: bytes) -> None:
        self._entries.append((seq, payload))

    def since(self, start_seq: int) -> list[tuple[int, bytes]]:
        """The kept batches whose seq is at least ``start_seq``, oldest first."""
        return [entry for entry in self._entries if entry[0] >= start_seq]
