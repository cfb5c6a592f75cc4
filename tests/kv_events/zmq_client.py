"""A router's side of the KV events, for the tests: a SUB socket read from trio, the
replay client, the two event encodings decoded, and the block index a router keeps.

Decoding follows llm-d-router's ``VLLMAdapter`` (``pkg/kvevents/engineadapter/
vllm_adapter.go``): an event is a positional array or a map tagged ``type``, normalised
to the same field list.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import msgpack
import trio
import zmq

#: Field order of map-encoded events (vllm_adapter.go ``blockStoredFieldOrder``).
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name")
REMOVED_FIELDS = ("block_hashes", "medium")


@attrs.frozen
class Batch:
    topic: str
    seq: int
    ts: float
    events: list[tuple[Any, ...]]  # (tag, field, ...) in STORED_FIELDS / REMOVED_FIELDS order
    rank: int | None
    raw_events: list[Any]  # as decoded, before normalising


def normalise(event: Any) -> tuple[Any, ...]:
    if isinstance(event, dict):
        tag = event["type"]
        order = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(tag, ())
        return (tag, *(event.get(name) for name in order))
    return tuple(event)


def decode(frames: list[bytes]) -> Batch:
    topic, seq, payload = frames
    assert len(seq) == 8
    batch = msgpack.unpackb(payload, raw=False)
    assert isinstance(batch, list) and len(batch) in (2, 3), batch
    rank = batch[2] if len(batch) == 3 else None
    return Batch(topic.decode(), int.from_bytes(seq, "big"), batch[0], [normalise(e) for e in batch[1]], rank, batch[1])


@contextmanager
def short_directory() -> Iterator[str]:
    """A directory for ipc:// endpoints (their paths must stay under ~100 bytes)."""
    path = tempfile.mkdtemp(prefix="kv-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def receive(socket: zmq.Socket[bytes], timeout: float) -> list[bytes] | None:
    """The next message, or None after ``timeout`` seconds without one.  ZMQ's descriptor is
    edge-triggered: ``EVENTS`` is read before every wait."""
    descriptor = socket.getsockopt(zmq.FD)
    assert isinstance(descriptor, int)
    with trio.move_on_after(timeout):
        while True:
            events = socket.getsockopt(zmq.EVENTS)
            assert isinstance(events, int)
            if events & zmq.POLLIN:
                return socket.recv_multipart(zmq.NOBLOCK)
            await trio.lowlevel.wait_readable(descriptor)
    return None


class Subscriber:
    """A SUB socket bound at ``endpoint`` (a router listens; the pods connect to it)."""

    def __init__(self, endpoint: str) -> None:
        self.socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        self.socket.bind(endpoint)
        self.socket.subscribe(b"kv@")
        self.endpoint = endpoint

    async def next_batch(self, timeout: float = 5.0) -> Batch | None:
        frames = await receive(self.socket, timeout)
        return None if frames is None else decode(frames)

    def close(self) -> None:
        self.socket.close(linger=0)


async def replay(endpoint: str, start_seq: int, timeout: float = 5.0) -> list[list[bytes]]:
    """Ask the replay socket for the batches from ``start_seq``: every reply up to and
    including the end marker (a DEALER adds the empty delimiter a REQ socket would)."""
    dealer: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
        replies: list[list[bytes]] = []
        while True:
            frames = await receive(dealer, timeout)
            assert frames is not None, f"no end marker after {len(replies)} replies"
            assert frames[0] == b""
            replies.append(frames[1:])
            if frames[1] == b"":
                return replies
    finally:
        dealer.close(linger=0)


class BlockIndex:
    """What a router knows of one pod: the block keys it holds (``pool.go`` applies
    BlockStored, BlockRemoved and AllBlocksCleared in order)."""

    def __init__(self) -> None:
        self.blocks: set[int] = set()
        self.tokens: dict[int, tuple[int, ...]] = {}
        self.parents: dict[int, int | None] = {}
        self.removed = 0  # BlockRemoved events
        self.lora_names: set[str | None] = set()  # of the BlockStored events
        self.cleared = 0  # AllBlocksCleared events

    def apply(self, batch: Batch) -> None:
        for event in batch.events:
            tag = event[0]
            if tag == "BlockStored":
                hashes, parent, tokens, block_size = event[1], event[2], event[3], event[4]
                assert len(tokens) == len(hashes) * block_size
                self.lora_names.add(event[7])
                for index, block in enumerate(hashes):
                    self.blocks.add(block)
                    self.tokens[block] = tuple(tokens[index * block_size : (index + 1) * block_size])
                    self.parents[block] = parent if index == 0 else hashes[index - 1]
            elif tag == "BlockRemoved":
                self.blocks.difference_update(event[1])
                self.removed += 1
            else:
                assert tag == "AllBlocksCleared", event
                self.blocks.clear()
                self.cleared += 1


def ipc(directory: str, name: str) -> str:
    return "ipc://" + os.path.join(directory, name)
