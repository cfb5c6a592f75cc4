"""Request intake in process: CPU from the application's entry to the job submitted, and
memory per in-flight stream (part of the ``paced_cost`` scenario).

A :class:`~llmsim.app.Simulator` answers streaming chat requests handed straight to its
application, as the native server hands them (``app.start``, called in the reader's task,
where the application has it; else ``app.handle`` in a task of its own), with a response
stream that drops what it is given, so no protocol layer is involved (HTTP parsing, HPACK
and the connection's buffers are *not* in these figures).  The engine task does not run:
every request stays submitted and unfinished, as a stream waiting for its first token does.

* **CPU**: ``time.process_time()`` (this process, garbage collection included) from the
  application's entry to the return of the request's first ``Engine.submit``, one request
  at a time, each left in flight; the first :data:`WARMUP` requests are not counted.
* **Memory**: ``tracemalloc``'s traced bytes with N requests in flight minus before them
  (after a full collection), per request: the request, its plan and planned output, its
  job, the handler's task if it has one, and the dropping response stream.

This module imports only llmsim and the standard library, so that the scenario can run it
by path against another llmsim checkout (``PYTHONPATH=DIR``, ``PYTHONSAFEPATH=1``)::

    python -P benchmarks/scenarios/paced_intake.py --max-tokens 100 10000 --requests 2000
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import trio

from llmsim.api.http import Headers, HttpRequest, ResponseEvent, ResponseState, ResponseStateFlags, next_state
from llmsim.app import Simulator
from llmsim.config import Config

__all__ = ["WARMUP", "DropResponse", "measure", "request"]

WARMUP = 200
PATH = "/v1/chat/completions"


class DropResponse(ResponseStateFlags):
    """A ``ResponseStream`` whose client reads everything at once and keeps nothing."""

    def __init__(self) -> None:
        self.state = ResponseState.IDLE

    def start(self, status: int, headers: Headers) -> None:
        self.state = next_state(self.state, ResponseEvent.START)

    def write(self, data: bytes) -> bool:
        self.state = next_state(self.state, ResponseEvent.WRITE)
        return True

    def end(self, data: bytes = b"", trailers: Headers = ()) -> None:
        self.state = next_state(self.state, ResponseEvent.END)
        if self.state is ResponseState.ENDED:
            self.state = next_state(self.state, ResponseEvent.COMPLETE)

    def on_drained(self, callback: Callable[[], None]) -> None:
        callback()

    def on_close(self, callback: Callable[[], None]) -> None:
        """The client never goes away."""


def request(max_tokens: int) -> HttpRequest:
    """The scenario's streaming chat request (the load generator's ``chat_body``)."""
    body = {
        "model": "bench-model",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    headers = ((b"content-type", b"application/json"),)
    return HttpRequest("POST", PATH, headers=headers, body=json.dumps(body).encode())


def _simulator(requests: int) -> Simulator:
    config = Config(
        port=0,
        model="bench-model",
        time_to_first_token=0.1,
        inter_token_latency=0.02,
        max_num_seqs=requests,
        max_waiting_queue_length=requests,
    )
    return Simulator(config)


async def _intake(max_tokens: int, requests: int, warmup: int, traced: bool) -> dict[str, float]:
    """Submit ``warmup + requests`` requests one by one and keep them in flight."""
    sim = _simulator(requests + warmup)
    original = sim.engine.submit
    submitted: list[float] = []
    arrived = trio.Event()

    def submit(job: Any, now: float) -> None:
        original(job, now)
        submitted.append(time.process_time())
        arrived.set()

    sim.engine.submit = submit  # type: ignore[method-assign]
    app = sim.app
    costs: list[float] = []
    memory_before = 0

    async def one(raw: HttpRequest) -> None:
        costs.append(-time.process_time())
        await app.handle(raw, DropResponse())
        arrived.set()  # answered without streaming: an error response

    start = getattr(app, "start", None)  # (an llmsim older than Api.start has none)
    async with trio.open_nursery() as nursery:
        for index in range(warmup + requests):
            if index == warmup and traced:
                gc.collect()
                memory_before = tracemalloc.get_traced_memory()[0]
            arrived = trio.Event()
            mark = len(submitted)
            if start is not None:
                costs.append(-time.process_time())
                if start(request(max_tokens), DropResponse()) is not None:
                    raise RuntimeError("a streaming chat left something to await")
            else:
                nursery.start_soon(one, request(max_tokens))
                await arrived.wait()
            if len(submitted) == mark:
                raise RuntimeError(f"the simulator refused the request (max_tokens {max_tokens})")
            costs[-1] += submitted[mark]
        gc.collect()
        memory = tracemalloc.get_traced_memory()[0] - memory_before if traced else 0
        nursery.cancel_scope.cancel()
    measured = costs[warmup:]
    return {
        "cpu_us_mean": statistics.fmean(measured) * 1e6,
        "cpu_us_median": statistics.median(measured) * 1e6,
        "bytes_per_stream": memory / requests,
    }


def measure(max_tokens: int, requests: int, warmup: int = WARMUP) -> dict[str, float]:
    """Intake CPU (an untraced run) and memory per in-flight stream (a traced one)."""
    cpu = trio.run(_intake, max_tokens, requests, warmup, False)
    tracemalloc.start()
    try:
        memory = trio.run(_intake, max_tokens, requests, warmup, True)
    finally:
        tracemalloc.stop()
    return {"max_tokens": max_tokens, "requests": requests, **cpu, "bytes_per_stream": memory["bytes_per_stream"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    json.dump([measure(tokens, args.requests) for tokens in args.max_tokens], sys.stdout)


if __name__ == "__main__":
    main()
