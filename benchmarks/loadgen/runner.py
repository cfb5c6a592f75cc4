"""Run a load from one or several worker processes and merge their records.

One Python process parses a bounded number of SSE events per second (see
docs/benchmarks.md for the measured ceiling), so the connections of a load can be split
over ``processes`` workers.  Workers are started first, report ready, and only then get a
common start time, so interpreter start-up never eats into the measured window.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from multiprocessing.connection import Connection
from typing import Any

import attrs
import trio

from benchmarks.loadgen.http1 import run_h1_connection
from benchmarks.loadgen.http2 import run_h2_connection
from benchmarks.loadgen.plan import Plan
from benchmarks.loadgen.records import StreamRecord, chat_body

__all__ = ["LoadResult", "LoadSpec", "run_load", "runnable_seconds"]

#: How long a worker may take to start, and to hand its records back after the stop time.
WORKER_TIMEOUT = 60.0
#: Gap between "all workers ready" and the common start time.
START_DELAY = 0.1


@attrs.frozen
class LoadSpec:
    """A closed-loop load: ``connections`` x ``streams`` streams, each replaced when it ends.

    ``streams`` is the number of concurrent streams per HTTP/2 connection (HTTP/1.1
    connections carry one at a time).  The first streams start spread evenly over
    ``ramp`` seconds; ``warmup`` seconds at the start are left out of every statistic.
    """

    port: int
    http2: bool = False
    connections: int = 1
    streams: int = 1
    duration: float = 10.0
    warmup: float = 1.0
    ramp: float = 0.0
    max_tokens: int = 200
    model: str = "bench-model"
    processes: int = 1
    host: str = "127.0.0.1"
    path: str = "/v1/chat/completions"

    def __attrs_post_init__(self) -> None:
        if self.host != "127.0.0.1":
            raise ValueError("benchmarks only ever target 127.0.0.1")
        if not self.http2 and self.streams != 1:
            raise ValueError("HTTP/1.1 connections carry one stream at a time")
        if not 0 <= self.warmup < self.duration:
            raise ValueError("warmup must be shorter than duration")

    @property
    def concurrency(self) -> int:
        return self.connections * self.streams

    def describe(self) -> str:
        if self.http2:
            return f"h2 {self.connections}x{self.streams}"
        return f"h1 {self.connections}"


@attrs.frozen
class LoadResult:
    """Every stream's record, the common time frame and the client's own CPU use
    (CPU seconds and runnable seconds, summed over the worker processes)."""

    spec: LoadSpec
    start_at: float
    stop_at: float
    records: list[StreamRecord]
    client_cpu_seconds: float
    client_runnable_seconds: float

    @property
    def window(self) -> tuple[float, float]:
        """The measured interval: after warm-up, until the stop time."""
        return self.start_at + self.spec.warmup, self.stop_at


def run_load(spec: LoadSpec) -> LoadResult:
    """Run ``spec`` to completion (bounded by its duration plus timeouts)."""
    context = multiprocessing.get_context("spawn")
    workers: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    try:
        for index in range(spec.processes):
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_worker, args=(spec, index, child_end), daemon=True)
            process.start()
            child_end.close()
            workers.append((process, parent_end))
        for _, pipe in workers:
            _expect(pipe, WORKER_TIMEOUT, "ready")
        start_at = time.perf_counter() + START_DELAY
        stop_at = start_at + spec.duration
        for _, pipe in workers:
            pipe.send((start_at, stop_at))
        records: list[StreamRecord] = []
        cpu = runnable = 0.0
        for _, pipe in workers:
            worker_records, (worker_cpu, worker_runnable) = _expect(pipe, spec.duration + WORKER_TIMEOUT, "records")
            records.extend(worker_records)
            cpu += worker_cpu
            runnable += worker_runnable
        return LoadResult(spec, start_at, stop_at, records, cpu, runnable)
    finally:
        for worker, pipe in workers:
            pipe.close()
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
                worker.join()


def _expect(pipe: Connection, timeout: float, what: str) -> Any:
    """The worker's next message, or an error that says which step it failed at."""
    if not pipe.poll(timeout):
        raise TimeoutError(f"load generator worker sent no {what} within {timeout:.0f} s")
    try:
        return pipe.recv()
    except EOFError:
        raise RuntimeError(f"load generator worker died before it sent its {what} (see its traceback above)") from None


def _worker(spec: LoadSpec, index: int, pipe: Connection) -> None:
    """Worker process body: report ready, wait for the start time, run, send records back."""
    pipe.send("ready")
    start_at, stop_at = pipe.recv()
    plan = Plan(spec.host, spec.port, spec.path, chat_body(spec.model, spec.max_tokens), stop_at)
    cpu_before, runnable_before = time.process_time(), runnable_seconds()
    trio.run(_drive, spec, index, plan, start_at)
    usage = (time.process_time() - cpu_before, runnable_seconds() - runnable_before)
    pipe.send((plan.records, usage))
    pipe.close()


def runnable_seconds(pid: int | str = "self") -> float:
    """Seconds this process's main thread ran or waited for a CPU (Linux schedstat).

    On a shared machine CPU time alone cannot tell a saturated process from an idle one
    (a saturated process gets only its share of the cores); time spent runnable can:
    runnable seconds per wall second near 1.0 means the process never waited for input.
    NaN where /proc/<pid>/schedstat does not exist.
    """
    try:
        with open(f"/proc/{pid}/schedstat") as file:
            on_cpu, waiting, _ = file.read().split()
    except (OSError, ValueError):
        return math.nan
    return (int(on_cpu) + int(waiting)) / 1e9


async def _drive(spec: LoadSpec, index: int, plan: Plan, start_at: float) -> None:
    """This worker's share of the connections (every ``processes``-th one), until stop."""
    total = spec.concurrency
    with trio.move_on_after(plan.stop_at - time.perf_counter()):
        async with trio.open_nursery() as nursery:
            for connection in range(index, spec.connections, spec.processes):
                first = connection * spec.streams
                starts = [start_at + spec.ramp * (first + s) / total for s in range(spec.streams)]
                if spec.http2:
                    nursery.start_soon(run_h2_connection, plan, starts)
                else:
                    nursery.start_soon(run_h1_connection, plan, starts[0])
