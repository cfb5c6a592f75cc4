"""Embedded start-up: from ``nursery.start(llmsim.serve, Config(port=0))`` to ready.

Timed in this process, 20 times in a row in one ``trio.run``; each server is shut down
before the next starts.  Importing llmsim (``llmsim.serve`` and everything it needs) is
timed on its own; the first run is still reported separately (first-use costs such as
the tokenizer's caches), and the median is over all runs.  The first
server is asked ``GET /health`` (untimed) to make sure "started" meant "serving".
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import trio

from benchmarks.report import environment, print_table, write_json
from benchmarks.scenarios import Options

__all__ = ["run"]

RUNS = 20
TARGET_SECONDS = 0.100


def run(options: Options) -> dict[str, Any]:
    started = time.perf_counter()
    import llmsim

    llmsim.serve, llmsim.Config  # noqa: B018 - ``import llmsim`` is lazy: load what serve() needs
    import_seconds = time.perf_counter() - started
    seconds, health = trio.run(_start_many, llmsim, RUNS)
    payload = {
        "scenario": "startup",
        "environment": environment(),
        "runs": RUNS,
        "import_llmsim_seconds": import_seconds,
        "first_seconds": seconds[0],
        "median_seconds": statistics.median(seconds),
        "min_seconds": min(seconds),
        "max_seconds": max(seconds),
        "target_seconds": TARGET_SECONDS,
        "first_server_health": health,
        "all_seconds": seconds,
    }
    print_table(
        f"embedded start-up: nursery.start(llmsim.serve, Config(port=0)) to ready, {RUNS} runs (target < 100 ms)",
        ["median ms", "min ms", "max ms", "first ms", "import llmsim ms", "GET /health"],
        [
            [
                statistics.median(seconds) * 1000,
                min(seconds) * 1000,
                max(seconds) * 1000,
                seconds[0] * 1000,
                import_seconds * 1000,
                health,
            ]
        ],
    )
    write_json(options.results_dir, "startup", payload)
    return payload


async def _start_many(llmsim: Any, runs: int) -> tuple[list[float], str]:
    seconds: list[float] = []
    health = ""
    for index in range(runs):
        async with trio.open_nursery() as nursery:
            begin = time.perf_counter()
            handle = await nursery.start(llmsim.serve, llmsim.Config(port=0))
            seconds.append(time.perf_counter() - begin)
            if index == 0:
                health = await _status_line(handle.port, "/health")
            nursery.cancel_scope.cancel()
    return seconds, health


async def _status_line(port: int, path: str) -> str:
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while b"\r\n" not in data:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                data += chunk
    return data.split(b"\r\n", 1)[0].decode(errors="replace")
