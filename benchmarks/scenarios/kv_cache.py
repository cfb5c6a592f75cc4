"""KV cache: what ``--enable-kvcache`` and its ZMQ events cost, and memory per cached block.

Three parts, each comparing configurations measured in the same run (interleaved rounds,
so that the shared machine's background load hits them alike):

* **engine** (in this process, no HTTP): a :class:`~llmsim.app.Simulator` with zero
  latency runs jobs whose prompts are 4 shared 256-token prefixes plus a fresh 0-255
  token tail, 8 output tokens, 64 at a time, in a pool of 512 blocks of 16 tokens (so
  it evicts all the time).  Configurations: no KV cache; the KV cache with its events
  taken and dropped (``--zmq-endpoint ""``); the KV cache publishing every event batch
  (``--event-batch-size 16``) to a ZMQ SUB socket in a process of its own.
  Reported: jobs/s and prompt tokens/s, and the publisher's time per batch (its
  ``flush``: taking the events, encoding them and the non-blocking send).
* **http**: the throughput scenario's HTTP/2 load (20 connections x 50 streams,
  200-token streaming chat, zero latency) against the native server without and with
  ``--enable-kvcache`` (a pool with room for every stream, events published to a
  subscriber): the admission bookkeeping on the standard load (its prompt is one short
  chat turn, so few blocks and events).
* **memory**: ``tracemalloc`` over a pool filled with N distinct full blocks, all idle
  (its block table, idle lists and hashing memo, which keeps each block's token tuple),
  per block.

    python -m benchmarks kv_cache [--quick]
"""

from __future__ import annotations

import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import Any

import trio

from benchmarks.report import environment, print_table, ratio, write_json
from benchmarks.scenarios import Options
from benchmarks.scenarios.measure import measure
from benchmarks.scenarios.throughput import LOADS, ROOMY, ZERO_LATENCY, chat_load
from benchmarks.servers import llmsim, running
from llmsim.app import Simulator
from llmsim.config import Config
from llmsim.engine.job import Job, JobState
from llmsim.engine.kv_cache import BlockPool

__all__ = ["run"]

BLOCK_SIZE = 16
POOL_BLOCKS = 512
PREFIX_TOKENS, PREFIXES, TAIL_TOKENS, OUTPUT_TOKENS, CONCURRENCY = 256, 4, 256, 8, 64
TOKEN_IDS = 30_000  # the prompts' vocabulary
EVENTS_ENDPOINT = "tcp://127.0.0.1:{port}"
#: Room for every stream of the HTTP load (1,000 x ceil(210 / 16) blocks): the part
#: measures the bookkeeping, not streams waiting for blocks.
HTTP_POOL_BLOCKS = 16_384
ENGINE_CONFIGS = ("no-kv-cache", "kv-cache", "kv-cache+zmq")


#: The subscriber, a process of its own (in this one, its thread would take the GIL from
#: the engine under test): prints its port, counts messages until stdin closes, prints the count.
SUBSCRIBER = """
import sys, zmq
socket = zmq.Context.instance().socket(zmq.SUB)
print(socket.bind_to_random_port("tcp://127.0.0.1"), flush=True)
socket.subscribe(b"")
poller = zmq.Poller()
poller.register(socket, zmq.POLLIN)
poller.register(sys.stdin.fileno(), zmq.POLLIN)
count = 0
while True:
    ready = dict(poller.poll())
    if socket in ready:
        socket.recv_multipart()
        count += 1
    elif ready:
        print(count, flush=True)
        break
"""


class _Subscriber:
    """:data:`SUBSCRIBER` running; ``messages`` is its count once it has stopped."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", SUBSCRIBER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self._process.stdout is not None
        self.endpoint = EVENTS_ENDPOINT.format(port=int(self._process.stdout.readline()))
        self.messages = -1

    def __enter__(self) -> _Subscriber:
        return self

    def __exit__(self, *exc_info: object) -> None:
        output, _ = self._process.communicate(timeout=30)  # closes its stdin
        self.messages = int(output.strip() or -1)


class _Progress:
    """The jobs' sink: counts finished jobs and wakes the submitting task."""

    def __init__(self) -> None:
        self.finished = 0
        self.wake = trio.Event()

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        if job.state is JobState.FINISHED:
            self.finished += 1
            self.wake.set()
        return True


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(TOKEN_IDS) for _ in range(PREFIX_TOKENS)] for _ in range(PREFIXES)]
    return [
        rng.choice(prefixes) + [rng.randrange(TOKEN_IDS) for _ in range(rng.randrange(TAIL_TOKENS))]
        for _ in range(count)
    ]


def _engine_config(name: str, endpoint: str) -> Config:
    latency = {"time_to_first_token": 0.0, "inter_token_latency": 0.0, "max_num_seqs": CONCURRENCY}
    if name == "no-kv-cache":
        return Config(**latency)
    return Config(
        **latency,
        enable_kvcache=True,
        kv_cache_size=POOL_BLOCKS,
        block_size=BLOCK_SIZE,
        zmq_endpoint=endpoint if name == "kv-cache+zmq" else "",
        event_batch_size=16,
    )


async def _drive(sim: Simulator, prompts: list[list[int]]) -> float:
    """Run every prompt as a job, :data:`CONCURRENCY` at a time; the wall seconds taken."""
    progress = _Progress()
    started = time.perf_counter()
    submitted = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sim.run_engine)
        while progress.finished < len(prompts):
            while submitted < len(prompts) and submitted - progress.finished < CONCURRENCY:
                job = Job(prompt_token_ids=prompts[submitted], output=("w ",) * OUTPUT_TOKENS,
                          finish_reason="stop", sink=progress)  # fmt: skip
                sim.engine.submit(job, trio.current_time())
                submitted += 1
            await progress.wake.wait()
            progress.wake = trio.Event()
        elapsed = time.perf_counter() - started
        if sim.kv_events is not None:
            sim.kv_events.flush()
        nursery.cancel_scope.cancel()
    return elapsed


async def _engine_round(name: str, prompts: list[list[int]], endpoint: str) -> dict[str, Any]:
    sim = Simulator(_engine_config(name, endpoint))  # inside trio: it reads trio's clock
    flush_seconds = [0.0]
    publisher = sim.kv_events
    if publisher is not None:
        flush = publisher.flush

        def timed_flush() -> int:
            begin = time.perf_counter()
            taken = flush()
            flush_seconds[0] += time.perf_counter() - begin
            return taken

        publisher.flush = timed_flush  # type: ignore[method-assign]
    cpu = time.process_time()
    seconds = await _drive(sim, prompts)
    cpu = time.process_time() - cpu
    batches = publisher.batches_published if publisher is not None else 0
    events = publisher.events_published if publisher is not None else 0
    metrics = sim.engine.metrics
    return {
        "config": name,
        "jobs_per_second": len(prompts) / seconds,
        "prompt_tokens_per_second": sum(len(p) for p in prompts) / seconds,
        "cpu_seconds": cpu,
        "batches": batches,
        "events": events,
        "flush_seconds": flush_seconds[0],
        "microseconds_per_batch": flush_seconds[0] / batches * 1e6 if batches else float("nan"),
        "hit_rate": metrics.prefix_cache_hits / max(metrics.prefix_cache_queries, 1),
    }


def _engine_part(options: Options) -> list[dict[str, Any]]:
    jobs, rounds = (600, 1) if options.quick else (2000, 3)
    prompts = _prompts(jobs, seed=1)
    rows = []
    with _Subscriber() as subscriber:
        for index in range(rounds):
            order = ENGINE_CONFIGS if index % 2 == 0 else tuple(reversed(ENGINE_CONFIGS))
            for name in order:
                rows.append({"round": index, **trio.run(_engine_round, name, prompts, subscriber.endpoint)})
    received = subscriber.messages
    base = {r["round"]: r for r in rows if r["config"] == "no-kv-cache"}
    for row in rows:
        row["throughput_ratio"] = ratio(row["jobs_per_second"], base[row["round"]]["jobs_per_second"])
        row["cpu_ratio"] = ratio(row["cpu_seconds"], base[row["round"]]["cpu_seconds"])
    published = sum(r["batches"] for r in rows)
    print(f"subscriber received {received} of {published} published batches")
    return rows


def _http_part(options: Options) -> list[dict[str, Any]]:
    duration, warmup, rounds = (3.0, 1.0, 1) if options.quick else (8.0, 2.0, 2)
    rows: list[dict[str, Any]] = []
    with _Subscriber() as subscriber:
        specs = (
            llmsim("llmsim-native", "--server", "native", *ROOMY, *ZERO_LATENCY),
            llmsim(
                "llmsim-native-kv+zmq", "--server", "native", *ROOMY, *ZERO_LATENCY,
                "--enable-kvcache", "--kv-cache-size", str(HTTP_POOL_BLOCKS), "--zmq-endpoint", subscriber.endpoint,
            ),
        )  # fmt: skip
        with running(specs[0], options.log_dir) as plain, running(specs[1], options.log_dir) as cached:
            for index in range(rounds):
                for server in (plain, cached) if index % 2 == 0 else (cached, plain):
                    result = measure(server, chat_load(server, LOADS[2], duration, warmup, options.processes))
                    rows.append(
                        {
                            "round": index,
                            "server": server.spec.name,
                            "tokens_per_second": result.summary.tokens_per_second,
                            "cpu_seconds_per_million_tokens": result.cpu_seconds_per_million_tokens,
                            "errors": result.summary.errors,
                        }
                    )
    base = {r["round"]: r for r in rows if r["server"] == "llmsim-native"}
    for row in rows:
        row["throughput_ratio"] = ratio(row["tokens_per_second"], base[row["round"]]["tokens_per_second"])
    return rows


def _memory_part(options: Options) -> list[dict[str, Any]]:
    rows = []
    # The hashing caches every token id's encoding (kv_hashing._UINT_CACHE, process-wide):
    # fill it first, so that only the pool is measured.
    BlockPool(1, BLOCK_SIZE, "", "bench-model").prompt(range(TOKEN_IDS))
    for blocks in (1_000, 10_000) if options.quick else (1_000, 10_000, 50_000):
        rng = random.Random(blocks)
        prompts = [[rng.randrange(TOKEN_IDS) for _ in range(BLOCK_SIZE * 8)] for _ in range(blocks // 8)]
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        pool = BlockPool(blocks, BLOCK_SIZE, "", "bench-model")
        for index, prompt in enumerate(prompts):
            assert pool.allocate(index, pool.prompt(prompt))
            pool.free(index)
        pool.take_events()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert len(pool.cached_hashes()) == blocks
        rows.append({"blocks": blocks, "bytes": held, "bytes_per_block": held / blocks})
        del pool
    return rows


def run(options: Options) -> dict[str, Any]:
    memory = _memory_part(options)
    engine = _engine_part(options)
    http = _http_part(options)
    summary = {
        config: {
            "throughput_ratio": statistics.median(r["throughput_ratio"] for r in engine if r["config"] == config),
            "cpu_ratio": statistics.median(r["cpu_ratio"] for r in engine if r["config"] == config),
            "microseconds_per_batch": statistics.median(
                r["microseconds_per_batch"] for r in engine if r["config"] == config
            ),
        }
        for config in ENGINE_CONFIGS
    }
    payload = {
        "scenario": "kv_cache",
        "environment": environment(),
        "engine_workload": {
            "prefix_tokens": PREFIX_TOKENS,
            "prefixes": PREFIXES,
            "tail_tokens_below": TAIL_TOKENS,
            "output_tokens": OUTPUT_TOKENS,
            "concurrency": CONCURRENCY,
            "pool_blocks": POOL_BLOCKS,
            "block_size": BLOCK_SIZE,
        },
        "engine": engine,
        "engine_summary": summary,
        "http": http,
        "memory": memory,
    }
    _print(engine, http, memory)
    write_json(options.results_dir, "kv_cache", payload)
    return payload


def _print(engine: list[dict[str, Any]], http: list[dict[str, Any]], memory: list[dict[str, Any]]) -> None:
    print_table(
        "engine alone, zero latency (ratios against no-kv-cache in the same round; CPU: this process's, ZMQ's"
        " I/O thread included)",
        ("round", "config", "jobs/s", "x no-kv", "CPU s", "x no-kv", "hit rate", "batches", "events", "us/batch"),
        [
            (r["round"], r["config"], r["jobs_per_second"], r["throughput_ratio"], r["cpu_seconds"], r["cpu_ratio"],
             r["hit_rate"], r["batches"], r["events"], r["microseconds_per_batch"])
            for r in engine
        ],
    )  # fmt: skip
    print_table(
        "HTTP/2 20x50, 200-token streaming chat, zero latency",
        ("round", "server", "tokens/s", "x plain", "CPU s/Mtok", "errors"),
        [
            (r["round"], r["server"], r["tokens_per_second"], r["throughput_ratio"],
             r["cpu_seconds_per_million_tokens"], r["errors"])
            for r in http
        ],
    )  # fmt: skip
    print_table(
        f"memory of a pool of full {BLOCK_SIZE}-token blocks (tracemalloc)",
        ("blocks", "bytes", "bytes/block"),
        [(r["blocks"], r["bytes"], r["bytes_per_block"]) for r in memory],
    )
