"""The KV events publisher against a real ZMQ subscriber (llmsim/kv_events/publisher.py).

A router's view of a pod is rebuilt from the published batches (plus a replay of the ones
a late subscriber missed) and must equal the pool's cached blocks exactly, after a random
workload that evicts and a sleep that clears everything.  The engine is driven by the
simulator's own engine task, with jobs submitted directly (no HTTP: the data-parallel
tests go through HTTP).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing
import zmq

from llmsim.app import Simulator
from llmsim.config import Config
from llmsim.engine.job import Job, JobState
from llmsim.kv_events import KvEventsPublisher
from llmsim.kv_events import publisher as publisher_module
from tests.kv_events.zmq_client import (
    STORED_FIELDS,
    Batch,
    BlockIndex,
    Subscriber,
    decode,
    ipc,
    receive,
    replay,
    short_directory,
)

BLOCK = 8


class _DoneSink:
    def __init__(self) -> None:
        self.done = trio.Event()

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        if job.state is JobState.FINISHED:
            self.done.set()
        return True


def _job(prompt: list[int], output: int, lora: str | None = None) -> tuple[Job, trio.Event]:
    sink = _DoneSink()
    job = Job(prompt_token_ids=prompt, output=("w ",) * output, finish_reason="stop", sink=sink, lora=lora)
    return job, sink.done


@pytest.fixture
async def directory() -> AsyncIterator[str]:
    with short_directory() as path:
        yield path


def _publisher(sim: Simulator) -> KvEventsPublisher:
    assert sim.kv_events is not None
    return sim.kv_events


async def _run(sim: Simulator, jobs: list[tuple[Job, trio.Event]]) -> None:
    """Submit ``jobs`` and wait until every one has finished."""
    for job, _ in jobs:
        sim.engine.submit(job, trio.current_time())
    for _, done in jobs:
        await done.wait()


async def _first_live_batch(sim: Simulator, subscriber: Subscriber, rng: random.Random) -> Batch:
    """Submit fresh one-block prompts until a batch reaches the subscriber: ZMQ drops what a
    PUB sends before the subscription has arrived (the "slow joiner")."""
    while True:
        await _run(sim, [_job([rng.randrange(50_000, 60_000) for _ in range(BLOCK + 1)], 1)])
        batch = await subscriber.next_batch(timeout=2.0)
        if batch is not None:
            return batch


def _workload(rng: random.Random, count: int) -> list[tuple[Job, trio.Event]]:
    """Prompts over a few shared prefixes with random tails, some under a LoRA adapter."""
    prefixes = [[rng.randrange(1000) for _ in range(rng.choice((16, 24, 40)))] for _ in range(4)]
    jobs = []
    for _ in range(count):
        tail = [rng.randrange(1000) for _ in range(rng.randrange(0, 30))]
        lora = "adapter" if rng.random() < 0.2 else None
        jobs.append(_job(rng.choice(prefixes) + tail, rng.randrange(1, 6), lora))
    return jobs


async def _catch_up(sim: Simulator, subscriber: Subscriber, index: BlockIndex, last_seen: int) -> int:
    """Take what the pool still holds into the batcher, then apply batches until the last
    published one (a partial batch goes out on llm-d's timer, LLMD_FLUSH_DELAY)."""
    publisher = _publisher(sim)
    publisher.flush()
    while publisher.pending or last_seen < publisher.last_seq:
        batch = await subscriber.next_batch(timeout=5.0)
        assert batch is not None, f"stuck at seq {last_seen} of {publisher.last_seq}"
        assert batch.seq == last_seen + 1
        index.apply(batch)
        last_seen = batch.seq
    return last_seen


@pytest.mark.parametrize("map_format", [False, True])
async def test_a_subscriber_rebuilds_the_pools_blocks_exactly(
    directory: str, map_format: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each run waits three times for a partial batch, which goes out on llm-d's timer: 50 ms
    # here, not 1 s (test_what_the_batches_carry waits for the real one; test_wire.py and
    # test_options.py check the timer and its setting).
    monkeypatch.setattr(publisher_module, "LLMD_FLUSH_DELAY", 0.05)
    subscriber = Subscriber(ipc(directory, "events"))
    config = Config(
        enable_kvcache=True,
        kv_cache_size=24,
        block_size=BLOCK,
        zmq_endpoint=subscriber.endpoint,
        event_batch_size=4,
        use_vllm_map_event_format=map_format,
        kv_events_replay_endpoint=ipc(directory, "replay"),
        max_num_seqs=4,
    )
    sim = Simulator(config)
    assert sim.kv_cache is not None
    rng = random.Random(12)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.run_engine)
            first = await _first_live_batch(sim, subscriber, rng)
            # The batches before it were published before the subscription took: replay them.
            index = BlockIndex()
            replayed = [decode(frames) for frames in (await replay(ipc(directory, "replay"), 1))[:-1]]
            assert [batch.seq for batch in replayed] == list(range(1, len(replayed) + 1))
            (again,) = [batch for batch in replayed if batch.seq == first.seq]
            assert again == first
            for batch in replayed[: first.seq - 1]:
                index.apply(batch)
            index.apply(first)
            last = first.seq
            await _run(sim, _workload(rng, 40))
            last = await _catch_up(sim, subscriber, index, last)
            assert index.blocks == sim.kv_cache.cached_hashes()
            # sleep: AllBlocksCleared, then more work on the empty cache
            sim.engine.clear_kv_cache()
            await _run(sim, _workload(rng, 20))
            last = await _catch_up(sim, subscriber, index, last)
            nursery.cancel_scope.cancel()
    finally:
        subscriber.close()
    assert index.blocks == sim.kv_cache.cached_hashes()
    assert index.blocks, "the second workload left blocks cached"
    assert index.removed > 10 and index.cleared == 1
    assert index.lora_names == {None, "adapter"}


async def test_what_the_batches_carry(directory: str) -> None:
    """Topic, rank, batch sizes, and each BlockStored's tokens and parent chain."""
    subscriber = Subscriber(ipc(directory, "events"))
    config = Config(
        port=8123,
        enable_kvcache=True,
        kv_cache_size=6,
        block_size=BLOCK,
        zmq_endpoint=subscriber.endpoint,
        event_batch_size=3,
        data_parallel_rank=2,
        data_parallel_size=4,
        model="base-model",
    )
    sim = Simulator(config)
    rng = random.Random(3)
    batches: list[Batch] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.run_engine)
            batches.append(await _first_live_batch(sim, subscriber, rng))
            prompts = [[rng.randrange(1000) for _ in range(3 * BLOCK + 2)] for _ in range(4)]
            await _run(sim, [_job(prompt, 1) for prompt in prompts])  # 3 blocks each: evictions
            _publisher(sim).flush()
            while _publisher(sim).pending or batches[-1].seq < _publisher(sim).last_seq:
                batch = await subscriber.next_batch()
                assert batch is not None
                batches.append(batch)
            nursery.cancel_scope.cancel()
    finally:
        subscriber.close()
    assert {b.topic for b in batches} == {"kv@127.0.0.1:8123@base-model"}
    assert {b.rank for b in batches} == {2}
    assert all(1 <= len(b.events) <= 3 for b in batches)
    assert [b.seq for b in batches] == list(range(batches[0].seq, batches[-1].seq + 1))
    stored = [e for b in batches for e in b.events if e[0] == "BlockStored"]
    removed = [e for b in batches for e in b.events if e[0] == "BlockRemoved"]
    assert removed and all(e[2] == "GPU" and len(e[1]) == 1 for e in removed)
    for prompt in prompts:
        (event,) = [e for e in stored if list(e[3]) == prompt[: 3 * BLOCK]]
        assert event[2] == 0  # llm-d's array format: no parent is 0
        assert (event[4], event[5], event[6], event[7]) == (BLOCK, None, "GPU", None)
        assert len(event[1]) == 3


async def test_replay_answers_from_the_asked_seq_and_keeps_only_the_last_batches(directory: str) -> None:
    subscriber = Subscriber(ipc(directory, "events"))
    config = Config(
        enable_kvcache=True,
        kv_cache_size=64,
        block_size=BLOCK,
        zmq_endpoint=subscriber.endpoint,
        event_batch_size=1,
        kv_events_replay_endpoint=ipc(directory, "replay"),
        kv_events_replay_queue_size=5,
    )
    sim = Simulator(config)
    rng = random.Random(5)
    live: dict[int, list[bytes]] = {}
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.run_engine)
            await _first_live_batch(sim, subscriber, rng)
            await _run(sim, [_job([rng.randrange(1000) for _ in range(BLOCK)], 1) for _ in range(8)])
            _publisher(sim).flush()
            last = _publisher(sim).last_seq
            while last not in live:
                frames = await subscriber.next_batch()
                assert frames is not None
                live[frames.seq] = [frames.topic.encode(), frames.seq.to_bytes(8, "big")]
            replies = await replay(ipc(directory, "replay"), last - 2)
            everything = await replay(ipc(directory, "replay"), 0)
            nothing = await replay(ipc(directory, "replay"), last + 1)
            nursery.cancel_scope.cancel()
    finally:
        subscriber.close()
    assert _publisher(sim).bound_replay_endpoint == ipc(directory, "replay")
    assert [decode(r).seq for r in replies[:-1]] == [last - 2, last - 1, last]
    assert replies[-1] == [b"", b"\xff" * 8, b""]
    assert [decode(r).seq for r in everything[:-1]] == list(range(last - 4, last + 1))  # the queue holds 5
    assert nothing == [[b"", b"\xff" * 8, b""]]
    assert all(r[0] == live[last][0] for r in replies[:-1])


async def test_vllm_kv_events_config_publishes_as_vllm(directory: str) -> None:
    """``--kv-events-config`` alone turns the cache on; the PUB binds an ipc endpoint
    (vLLM's rule: the subscriber connects), seqs start at 0, events are maps, the topic is
    the config's, and every drain is one batch (vLLM publishes one per engine step)."""
    endpoint = ipc(directory, "vllm")
    kv_events_config = f'{{"enable_kv_cache_events": true, "endpoint": "{endpoint}", "topic": "kv@pod@m"}}'
    sim = Simulator(Config(kv_events_config=kv_events_config, block_size=BLOCK))
    assert sim.kv_cache is not None
    sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sub.subscribe(b"")
    sub.connect(endpoint)  # ZMQ retries until the simulator has bound it
    rng = random.Random(9)
    rounds = 0
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.run_engine)
            frames = None
            while frames is None:
                rounds += 1
                await _run(sim, [_job([rng.randrange(1000) for _ in range(2 * BLOCK)], 1) for _ in range(3)])
                frames = await receive(sub, 0.5)
            nursery.cancel_scope.cancel()
    finally:
        sub.close(linger=0)
    batch = decode(frames)
    assert _publisher(sim).bound_endpoint == endpoint
    assert (batch.topic, batch.seq, _publisher(sim).last_seq) == ("kv@pod@m", rounds - 1, rounds - 1)
    assert len(batch.events) == 3  # one drain, one batch
    event = batch.raw_events[0]
    assert list(event) == ["type", *STORED_FIELDS]
    assert (event["type"], event["parent_block_hash"], event["lora_id"], event["lora_name"]) == (
        "BlockStored",
        None,
        None,
        None,
    )


async def test_without_an_endpoint_the_events_are_still_taken(directory: str) -> None:
    sim = Simulator(Config(enable_kvcache=True, block_size=BLOCK, zmq_endpoint=""))
    assert sim.kv_cache is not None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sim.run_engine)
        await _run(sim, [_job(list(range(3 * BLOCK)), 1)])
        _publisher(sim).flush()
        nursery.cancel_scope.cancel()
    assert sim.kv_cache.take_events() == []
    assert _publisher(sim).batches_published == 0


async def test_an_idle_publisher_backs_off_and_wakes_up_for_events(autojump_clock: trio.testing.MockClock) -> None:
    """50 takes a second while there are events, down to about 3 while there are none."""
    sim = Simulator(Config(enable_kvcache=True, block_size=BLOCK, zmq_endpoint=""))
    pool, publisher = sim.kv_cache, _publisher(sim)
    assert pool is not None
    times: list[float] = []
    flush = publisher.flush

    def counted() -> int:
        times.append(trio.current_time())
        return flush()

    publisher.flush = counted  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(publisher.run)
        await trio.sleep(10.0)
        idle = len(times)
        for request in range(5):  # events for a second, every 0.1 s
            pool.allocate(request, pool.prompt(list(range(request * 100, request * 100 + BLOCK))))
            await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    assert 25 <= idle <= 40
    busy = [b - a for a, b in zip(times[idle:], times[idle + 1 :], strict=False)]
    assert max(busy) <= 0.35 and min(busy) == pytest.approx(0.02)


async def test_a_replay_endpoint_in_use_is_an_os_error_naming_it() -> None:
    first = Simulator(Config(enable_kvcache=True, zmq_endpoint="", kv_events_replay_endpoint="tcp://127.0.0.1:0"))
    async with trio.open_nursery() as nursery:
        await nursery.start(_publisher(first).run)
        taken = _publisher(first).bound_replay_endpoint
        assert taken is not None and not taken.endswith(":0")
        second = Simulator(Config(enable_kvcache=True, zmq_endpoint="", kv_events_replay_endpoint=taken))
        with pytest.raises(OSError, match=f"cannot bind the KV events replay socket at {taken}"):
            await nursery.start(_publisher(second).run)
        nursery.cancel_scope.cancel()
