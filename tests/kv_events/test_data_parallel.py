"""``--data-parallel-size`` through HTTP (llmsim/server.py ``serve_ranks``): ranks on
consecutive ports, each with its own engine, metrics and KV events; and the router's
check that the keys a pod publishes are the ones it computes from the same token ids.

The keys are recomputed with ``tests.engine.test_kv_cache.reference_keys``, written from
llm-d-router v0.10.0 ``pkg/kvcache/kvblock/token_processor.go`` and RFC 8949 (not from
llmsim's hashing); vLLM's own keys (SHA-256 over CBOR) are a different scheme, so there
is nothing of vLLM's to compare with.
"""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from llmsim.config import Config
from llmsim.server import DataParallelHandle, serve
from tests.engine.test_kv_cache import reference_keys
from tests.kv_events.zmq_client import Batch, Subscriber, ipc, short_directory

BLOCK = 8
MODEL = "dp-model"


@pytest.fixture
async def directory() -> AsyncIterator[str]:
    with short_directory() as path:
        yield path


def _config(subscriber: Subscriber, *, hash_seed: str, data_parallel_size: int = 1) -> Config:
    """A KV-cache server on port 0 that publishes every event at once to ``subscriber``."""
    return Config(
        port=0,
        model=MODEL,
        enable_kvcache=True,
        block_size=BLOCK,
        zmq_endpoint=subscriber.endpoint,
        event_batch_size=1,
        data_parallel_size=data_parallel_size,
        hash_seed=hash_seed,
    )


def _prompt(word: str) -> str:
    return " ".join(f"{word}{i}" for i in range(40))


async def _prompt_tokens(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    match = re.search(r"^vllm:prompt_tokens_total\{[^}]*\} ([0-9.e+]+)$", text, re.MULTILINE)
    assert match is not None
    return float(match[1])


async def _events_of(
    subscriber: Subscriber, clients: list[httpx.AsyncClient], want: set[int]
) -> dict[int, list[Batch]]:
    """Send each rank fresh prompts until the subscriber has a batch from every rank in
    ``want`` (ZMQ drops what is published before the subscription arrives)."""
    seen: dict[int, list[Batch]] = {}
    attempt = 0
    while not want <= set(seen):
        attempt += 1
        for rank in want - set(seen):
            response = await clients[rank].post(
                "/v1/completions", json={"model": MODEL, "prompt": _prompt(f"r{rank}a{attempt}w"), "max_tokens": 2}
            )
            assert response.status_code == 200
        while (batch := await subscriber.next_batch(timeout=0.5)) is not None:
            assert batch.rank is not None
            seen.setdefault(batch.rank, []).append(batch)
    return seen


async def test_two_ranks_serve_on_consecutive_ports_with_their_own_metrics_and_events(directory: str) -> None:
    subscriber = Subscriber(ipc(directory, "events"))  # ipc has no port: both ranks connect here
    config = _config(subscriber, hash_seed="42", data_parallel_size=2)
    try:
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(serve, config)
            assert isinstance(handle, DataParallelHandle)
            first, second = handle.ranks
            assert (handle.port, second.port) == (first.port, first.port + 1)
            async with httpx.AsyncClient(base_url=first.url) as a, httpx.AsyncClient(base_url=second.url) as b:
                seen = await _events_of(subscriber, [a, b], {0, 1})
                before = (await _prompt_tokens(a), await _prompt_tokens(b))
                extra = await b.post("/v1/completions", json={"model": MODEL, "prompt": "more", "max_tokens": 1})
                assert extra.status_code == 200
                after = (await _prompt_tokens(a), await _prompt_tokens(b))
            nursery.cancel_scope.cancel()
    finally:
        subscriber.close()
    assert min(before) > 0 and after[0] == before[0] and after[1] > before[1]  # each rank its own metrics
    assert {b.topic for b in seen[0]} == {f"kv@127.0.0.1:{first.port}@{MODEL}"}
    assert {b.topic for b in seen[1]} == {f"kv@127.0.0.1:{first.port + 1}@{MODEL}"}
    assert {e[0] for batches in seen.values() for batch in batches for e in batch.events} == {"BlockStored"}


async def test_published_keys_are_the_routers_keys(directory: str) -> None:
    """Every BlockStored's keys, chained from its parent, are what a router computes from
    the event's token ids (the pod's whole prompt, read back through /tokenize)."""
    subscriber = Subscriber(ipc(directory, "events"))
    config = _config(subscriber, hash_seed="7")
    try:
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(serve, config)
            async with httpx.AsyncClient(base_url=handle.url) as client:
                seen = await _events_of(subscriber, [client], {0})
                prompts = [_prompt(f"x{attempt}w") for attempt in range(3)]
                for prompt in prompts:
                    response = await client.post(
                        "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1}
                    )
                    assert response.status_code == 200
                token_ids = [
                    (await client.post("/tokenize", json={"model": MODEL, "prompt": p})).json()["tokens"]
                    for p in prompts
                ]
                batches = seen[0]
                wanted = [ids[: len(ids) // BLOCK * BLOCK] for ids in token_ids]
                while not all(tokens in _stored_tokens(batches) for tokens in wanted):
                    batch = await subscriber.next_batch(timeout=5.0)
                    assert batch is not None
                    batches.append(batch)
            nursery.cancel_scope.cancel()
    finally:
        subscriber.close()
    stored = [e for b in batches for e in b.events if e[0] == "BlockStored"]
    for ids in token_ids:
        full = len(ids) // BLOCK * BLOCK
        (event,) = [e for e in stored if list(e[3]) == ids[:full]]
        assert event[2] == 0  # a whole new prompt: no parent
        assert list(event[1]) == reference_keys("7", MODEL, ids, BLOCK)


def _stored_tokens(batches: list[Batch]) -> list[list[int]]:
    return [list(e[3]) for b in batches for e in b.events if e[0] == "BlockStored"]


async def test_a_rank_whose_port_is_taken_fails_the_start_with_an_os_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with trio.open_nursery() as nursery:
            with pytest.raises(OSError, match="in use"):  # as serve() raises it, not in a group
                await nursery.start(serve, Config(port=port - 1, data_parallel_size=2))
