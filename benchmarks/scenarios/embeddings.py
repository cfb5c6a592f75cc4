"""Embeddings: requests per second of POST /v1/embeddings, and which side is the bottleneck.

llmsim answers an embeddings request at once, outside its engine, so a load test of the
endpoint should be limited by its client.  Two clients post the same body (a 31-token
text, 384 dimensions, ``encoding_format: base64`` as the openai SDK sends it), closed
loop, at a few concurrencies over HTTP/1.1 and HTTP/2 (prior knowledge), against the
native server:

* ``openai-sdk``: ``AsyncOpenAI.embeddings.create`` on httpx, in this process: what a
  Python load test or application sees (it decodes every response, base64 included).
* ``loadgen``: the repository's own load generator (raw HTTP/1.1 and h2, no JSON
  decoding), also in this process: about the cheapest client there is in Python.
* ``loadgen /ping``: the same generator against ``POST /ping`` (an empty 200, llmsim's
  cheapest route), for reference: what serving any request costs the server.

Reported per run: requests/s, and the busy share (runnable seconds per wall second of the
main thread, from /proc/<pid>/schedstat: near 1.0 the process never waited) and CPU
milliseconds per request of the server and of the client.  Whichever is busier is the
bottleneck.  The load generator reads SSE; a 200 JSON body read to its Content-Length
counts as a completed request (its reader notes "stream ended without [DONE]").

    python -m benchmarks embeddings [--quick]
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import httpx
import openai
import orjson
import trio

from benchmarks.loadgen.http1 import run_h1_connection
from benchmarks.loadgen.http2 import run_h2_connection
from benchmarks.loadgen.plan import Plan, sleep_until
from benchmarks.loadgen.records import StreamRecord
from benchmarks.loadgen.runner import runnable_seconds
from benchmarks.report import environment, print_table, write_json
from benchmarks.scenarios import Options
from benchmarks.scenarios.measure import CLEANUP_TIMEOUT
from benchmarks.servers import MODEL, SAMPLE_INTERVAL, RunningServer, llmsim, running

__all__ = ["run"]

PATH = "/v1/embeddings"
SERVER = llmsim("llmsim-native", "--server", "native")
TEXT = (
    "Embeddings turn text into vectors: a retrieval pipeline sends every document chunk and "
    "every query through this endpoint, so its cost decides how fast an index is built."
)
BODY = orjson.dumps({"model": MODEL, "input": TEXT, "encoding_format": "base64"})
#: (HTTP/2?, connections, streams per connection); the SDK runs connections x streams tasks.
LOADS = ((False, 1, 1), (False, 16, 1), (False, 64, 1), (True, 1, 1), (True, 1, 16), (True, 4, 16))
CLIENTS = ("openai-sdk", "loadgen", "loadgen /ping")
#: What the load generator's SSE reader notes for a complete JSON (or empty) body.
_JSON_BODY_END = "stream ended without [DONE]"


def run(options: Options) -> dict[str, Any]:
    duration, warmup = (3.0, 1.0) if options.quick else (8.0, 2.0)
    rows: list[dict[str, Any]] = []
    with running(SERVER, options.log_dir) as server:
        for client in CLIENTS:
            for load in LOADS:
                rows.append(_measure(server, client, load, duration, warmup))
                server.wait_idle(CLEANUP_TIMEOUT)
    payload = {
        "scenario": "embeddings",
        "environment": environment(),
        "duration_seconds": duration,
        "warmup_seconds": warmup,
        "request_body": BODY.decode(),
        "results": rows,
    }
    _print(rows)
    write_json(options.results_dir, "embeddings", payload)
    return payload


def _measure(
    server: RunningServer, client: str, load: tuple[bool, int, int], duration: float, warmup: float
) -> dict[str, Any]:
    http2, connections, streams = load
    start = time.perf_counter() + 0.2
    window = (start + warmup, start + duration)
    clock = _ClientClock(window)
    if client.startswith("loadgen"):
        path, body = ("/ping", b"{}") if client.endswith("/ping") else (PATH, BODY)
        ends, errors = trio.run(_loadgen, server.port, path, body, load, start, window[1], clock)
    else:
        ends, errors = trio.run(_sdk, server.url, load, start, window[1], clock)
    time.sleep(2 * SAMPLE_INTERVAL)  # let the server sampler pass the end of the window
    server_cpu, server_runnable, _ = server.usage_between(*window)
    seconds = window[1] - window[0]
    done = sum(1 for end in ends if window[0] <= end <= window[1])
    return {
        "client": client,
        "protocol": "h2" if http2 else "h1",
        "concurrency": connections * streams,
        "connections": connections,
        "requests_per_second": done / seconds,
        "server_busy": server_runnable / seconds,
        "client_busy": clock.runnable / seconds,
        "server_cpu_ms_per_request": server_cpu / done * 1e3 if done else math.nan,
        "client_cpu_ms_per_request": clock.cpu / done * 1e3 if done else math.nan,
        "bottleneck": "client" if clock.runnable > server_runnable else "server",
        "errors": len(errors),
        "error_samples": errors[:3],
    }


class _ClientClock:
    """This process's CPU and runnable seconds over the measured window."""

    def __init__(self, window: tuple[float, float]) -> None:
        self.window = window
        self.cpu = self.runnable = math.nan

    async def watch(self) -> None:
        await sleep_until(self.window[0])
        cpu, runnable = time.process_time(), runnable_seconds(os.getpid())
        await sleep_until(self.window[1])
        self.cpu, self.runnable = time.process_time() - cpu, runnable_seconds(os.getpid()) - runnable


async def _loadgen(
    port: int, path: str, body: bytes, load: tuple[bool, int, int], start: float, stop_at: float, clock: _ClientClock
) -> tuple[list[float], list[str]]:
    http2, connections, streams = load
    plan = Plan("127.0.0.1", port, path, body, stop_at)
    async with trio.open_nursery() as outer:
        outer.start_soon(clock.watch)
        # an HTTP/2 connection reads until cancelled, as the runner's workers cancel it (runner.py:166)
        with trio.move_on_after(stop_at - time.perf_counter()):
            async with trio.open_nursery() as nursery:
                for _ in range(connections):
                    if http2:
                        nursery.start_soon(run_h2_connection, plan, [start] * streams)
                    else:
                        nursery.start_soon(run_h1_connection, plan, start)
    ends = [record.end for record in plan.records if _completed(record)]
    errors = [str(record.error) for record in plan.records if not _completed(record) and record.error]
    return ends, errors


def _completed(record: StreamRecord) -> bool:
    """A 200 read to its end: the SSE reader notes that no ``[DONE]`` came, and the time."""
    return record.status == 200 and record.error == _JSON_BODY_END and not math.isnan(record.end)


async def _sdk(
    url: str, load: tuple[bool, int, int], start: float, stop_at: float, clock: _ClientClock
) -> tuple[list[float], list[str]]:
    http2, connections, streams = load
    ends: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=connections)
    async with httpx.AsyncClient(http1=not http2, http2=http2, limits=limits) as http_client:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, http_client=http_client)

        async def worker() -> None:
            await sleep_until(start)
            while time.perf_counter() < stop_at:
                try:
                    await client.embeddings.create(model=MODEL, input=TEXT)
                except openai.APIError as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                else:
                    ends.append(time.perf_counter())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(clock.watch)
            for _ in range(connections * streams):
                nursery.start_soon(worker)
    return ends, errors


def _print(rows: list[dict[str, Any]]) -> None:
    print_table(
        "embeddings (31-token text, 384 dimensions, base64; closed loop against llmsim-native)",
        [
            "client",
            "proto",
            "conc",
            "req/s",
            "srv busy",
            "cli busy",
            "srv ms/req",
            "cli ms/req",
            "bottleneck",
            "errors",
        ],
        [
            [
                row["client"],
                row["protocol"],
                row["concurrency"],
                row["requests_per_second"],
                row["server_busy"],
                row["client_busy"],
                row["server_cpu_ms_per_request"],
                row["client_cpu_ms_per_request"],
                row["bottleneck"],
                row["errors"],
            ]
            for row in rows
        ],
    )
