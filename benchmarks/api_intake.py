"""What the API layer costs per generating request, in process (docs/performance.md,
"API request handling" and "API intake (stop 11)").

No sockets and no protocol: requests go straight to the application as the native
server hands them (:func:`_answer`: ``app.start`` in the calling task where the
application has it, else ``app.handle``) with an :class:`~llmsim.api.http.HttpRequest`
and a response that only counts bytes, zero latency, the GC thresholds of ``llmsim
serve``.  Three measures per scenario:

* ``cpu``: CPU µs per request for the whole request (intake, the engine, every
  token's rendering, GC), ``--concurrency`` handler tasks at a time, best of
  ``--repeat`` runs;
* ``intake``: CPU µs from the application's entry to the response's head (the jobs are
  submitted just before it), one request at a time with a TTFT of an hour so that
  nothing else runs in between; the request is then cancelled, or its client leaves
  (outside the measured span);
* ``memory``: bytes per in-flight stream (tracemalloc), ``--in-flight`` streams held
  open at that TTFT.

``--tree DIR`` measures another copy of llmsim (e.g. an unpacked ``git archive`` of
an older commit) with the same driver.

``--callgrind OUT`` counts instructions instead, deterministic where CPU time is not
on a shared machine: each scenario runs ``--requests`` and 6x as many requests (the
``cpu`` measure), each run inside an ``itertools.dropwhile`` step (a C function nothing
else calls) that callgrind collects and dumps on its own, and the difference over the
extra requests is reported (start-up and warm-up cancel out).  Run it as::

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=dropwhile_next \
        --dump-after=dropwhile_next --callgrind-out-file=OUT \
        python -m benchmarks.api_intake --callgrind OUT [--tree DIR] [scenario ...]

    python -m benchmarks.api_intake [--tree DIR] [--only cpu|intake|memory] [scenario ...]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson

SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat-stream-1": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 1, "stream": True},
    ),
    "chat-stream-100": (
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 100,
            "ignore_eos": True,
            "stream": True,
        },
    ),
    "chat-stream-10000": (
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 10_000,
            "ignore_eos": True,
            "stream": True,
        },
    ),
    "chat-1": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 1},
    ),
    "completions-stream-100": (
        "/v1/completions",
        {"model": "m", "prompt": "Hello there", "max_tokens": 100, "ignore_eos": True, "stream": True},
    ),
    "completions-100": (
        "/v1/completions",
        {"model": "m", "prompt": "Hello there", "max_tokens": 100, "ignore_eos": True},
    ),
}
DEFAULT = ("chat-stream-1", "chat-stream-100", "chat-stream-10000", "completions-stream-100")
SERVER_GC_THRESHOLDS = (50_000, 20, 100)  # llmsim.cli.SERVER_GC_THRESHOLDS


class CountingResponse:
    """A ResponseStream that only counts what it is given (the client reads at once);
    ``on_end`` is called as it ends, :meth:`disconnect` is the client leaving."""

    def __init__(self, on_start: Callable[[], None] | None = None, on_end: Callable[[], None] | None = None) -> None:
        self.bytes = 0
        self.status = 0
        self.started = self.ended = self.closed = False
        self._on_start = on_start
        self._on_end = on_end
        self._close_callbacks: list[Callable[[], None]] = []

    def start(self, status: int, headers: Any) -> None:
        self.status, self.started = status, True
        if self._on_start is not None:
            self._on_start()

    def write(self, data: bytes) -> bool:
        self.bytes += len(data)
        return True

    def end(self, data: bytes = b"", trailers: Any = ()) -> None:
        self.bytes += len(data)
        self.ended = True
        self._close_callbacks = []
        if self._on_end is not None:
            self._on_end()

    def on_drained(self, callback: Callable[[], None]) -> None:
        callback()

    def on_close(self, callback: Callable[[], None]) -> None:
        if not self.ended:
            self._close_callbacks.append(callback)

    def disconnect(self) -> None:
        self.closed = True
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            callback()


async def _answer(app: Any, request: Any, response: CountingResponse, ended: Any) -> None:
    """Answer ``request`` as the native server does: ``app.start`` (llmsim's ``Api`` has
    it since issue 16's eighth pass) and the rest it leaves, else ``app.handle``; then
    wait for ``ended`` (the trio Event ``response``'s ``on_end`` sets)."""
    start = getattr(app, "start", None)
    if start is None:
        await app.handle(request, response)
        return
    rest = start(request, response)
    if rest is not None:
        await rest
    await ended.wait()


def _simulator(trio: Any, **config: Any) -> Any:
    from llmsim.app import Simulator
    from llmsim.config import Config

    settings = {"port": 0, "seed": 7, "model": "m", "max_num_seqs": 1024, "max_waiting_queue_length": 100_000}
    return Simulator(Config(**{**settings, **config}))


def _request(path: str, body: dict[str, Any]) -> Any:
    from llmsim.api.http import HttpRequest

    return HttpRequest("POST", path, headers=((b"content-type", b"application/json"),), body=orjson.dumps(body))


def measure_cpu(scenario: str, requests: int, concurrency: int) -> float:
    """CPU µs per request, ``concurrency`` handler tasks at a time."""
    import trio

    path, body = SCENARIOS[scenario]
    result: list[float] = []

    async def main() -> None:
        sim = _simulator(trio)
        request = _request(path, body)
        left = [requests]

        async def one() -> None:
            ended = trio.Event()
            response = CountingResponse(on_end=ended.set)
            await _answer(sim.app, request, response, ended)
            assert response.status == 200 and response.ended, response.status

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                await one()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.run_engine)
            for _ in range(min(concurrency, requests)):  # warm-up: the first requests pay for imports
                await one()
            gc.collect()
            started = time.process_time()
            async with trio.open_nursery() as workers:
                for _ in range(concurrency):
                    workers.start_soon(worker)
            result.append(time.process_time() - started)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return result[0] / requests * 1e6


def measure_intake(scenario: str, requests: int) -> float:
    """CPU µs from the application's entry to the response head, one request at a time (best median)."""
    import trio

    path, body = SCENARIOS[scenario]
    spans: list[float] = []

    async def main() -> None:
        sim = _simulator(trio, time_to_first_token=3600.0)
        request = _request(path, body)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.run_engine)
            for _ in range(requests):
                with trio.CancelScope() as scope:
                    began = [0.0]

                    def started(scope: trio.CancelScope = scope, began: list[float] = began) -> None:
                        spans.append(time.process_time() - began[0])
                        scope.cancel()

                    response = CountingResponse(started)
                    began[0] = time.process_time()
                    await _answer(sim.app, request, response, trio.Event())
                response.disconnect()  # (after the start path, which the scope does not cancel)
            nursery.cancel_scope.cancel()

    trio.run(main)
    spans.sort()
    return spans[len(spans) // 2] * 1e6


def measure_memory(scenario: str, in_flight: int) -> float:
    """Bytes allocated per in-flight stream (tracemalloc), ``in_flight`` held open."""
    import trio

    path, body = SCENARIOS[scenario]
    result: list[float] = []

    async def main() -> None:
        sim = _simulator(trio, time_to_first_token=3600.0)
        request = _request(path, body)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.run_engine)
            await _hold(trio, sim, request, 10, nursery)  # warm-up: caches, imports
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            await _hold(trio, sim, request, in_flight, nursery)
            gc.collect()
            result.append((tracemalloc.get_traced_memory()[0] - before) / in_flight)
            tracemalloc.stop()
            nursery.cancel_scope.cancel()

    trio.run(main)
    return result[0]


async def _hold(trio: Any, sim: Any, request: Any, count: int, nursery: Any) -> None:
    """Start ``count`` requests and return once each has its head (they stay open)."""
    started = trio.Semaphore(0)
    start = getattr(sim.app, "start", None)
    for _ in range(count):
        response = CountingResponse(started.release)
        if start is None:
            nursery.start_soon(sim.app.handle, request, response)
        elif (rest := start(request, response)) is not None:  # (a stream leaves nothing: no task, as natively)
            nursery.start_soon(_awaited, rest)
    for _ in range(count):
        await started.acquire()


async def _awaited(rest: Any) -> None:
    await rest


def callgrind_counts(scenario: str, requests: int, concurrency: int, out: str, dumps: list[int]) -> float:
    """Instructions per request of the ``cpu`` measure under callgrind (see the module's
    docstring): the dumps of a run of ``requests`` and of one of 6x as many."""
    measure_cpu(scenario, requests, concurrency)  # unmarked: the first run also pays for imports
    totals = []
    for count in (requests, 6 * requests):
        next(itertools.dropwhile(lambda _, count=count: measure_cpu(scenario, count, concurrency) < 0, [0]), None)
        dumps[0] += 1
        with open(f"{out}.{dumps[0]}") as dump:
            totals.append(next(int(line.split()[1]) for line in dump if line.startswith("totals:")))
    return (totals[1] - totals[0]) / (5 * requests)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", help=f"of {', '.join(SCENARIOS)} (default: {', '.join(DEFAULT)})")
    parser.add_argument("--tree", help="the llmsim tree to measure (default: this one)")
    parser.add_argument("--only", choices=("cpu", "intake", "memory"))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument("--callgrind", metavar="OUT", help="count instructions (run under callgrind, see above)")
    args = parser.parse_args(argv)
    if args.tree:
        sys.path.insert(0, args.tree)
    gc.set_threshold(*SERVER_GC_THRESHOLDS)
    if args.callgrind:
        dumps = [0]
        for scenario in args.scenarios or DEFAULT:
            requests = args.requests if "10000" not in scenario else max(1, args.requests // 50)
            count = callgrind_counts(scenario, requests, args.concurrency, args.callgrind, dumps)
            print(f"{scenario}  {count / 1000:8.1f} k instructions/request", flush=True)
        return
    for scenario in args.scenarios or DEFAULT:
        row = [scenario]
        if args.only in (None, "cpu"):
            requests = args.requests if "10000" not in scenario else max(1, args.requests // 50)
            best = min(measure_cpu(scenario, requests, args.concurrency) for _ in range(args.repeat))
            row.append(f"cpu {best:8.1f} us/request")
        if args.only in (None, "intake"):
            intake = min(measure_intake(scenario, min(args.requests, 500)) for _ in range(args.repeat))
            row.append(f"intake {intake:6.1f} us")
        if args.only in (None, "memory"):
            row.append(f"memory {measure_memory(scenario, args.in_flight) / 1024:6.1f} KiB/stream")
        print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
