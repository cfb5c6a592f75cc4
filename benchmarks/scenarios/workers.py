"""Workers: streamed tokens per second with ``--workers 1`` and ``--workers 2``, same load.

The server streams 200-token chat completions with no simulated latency (as in the
throughput scenario), to HTTP/1.1 with 50 connections, closed loop.  Each server is
measured in turn (1, 2, then 2, 1 on the second round, so that drift in the machine's
load falls on both), and reported with the medians of: tokens/s seen by the client,
the server's CPU (supervisor and workers together, in cores, and per million tokens:
what a worker costs should not change with their number) and the load generator's
``client_busy`` (near 1.0 per process: the client was the bottleneck, and the ratio
says more about the client than about the server).  ``scaling`` is tokens/s with 2
workers over tokens/s with 1, divided by 2 (1.0 = linear).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.loadgen.runner import LoadSpec, run_load
from benchmarks.loadgen.stats import summarize
from benchmarks.report import environment, print_table, ratio, write_json
from benchmarks.scenarios import Options
from benchmarks.servers import MODEL, RunningServer, llmsim, running

__all__ = ["run"]

MAX_TOKENS = 200
CONNECTIONS = 50
ZERO_LATENCY = ("--time-to-first-token", "0", "--inter-token-latency", "0")
ROOMY = ("--max-num-seqs", "10000", "--max-waiting-queue-length", "10000", "--disable-log-stats")
WORKERS = (1, 2)
#: How long to wait for the supervisor's "llmsim serving" line (every worker bound).
_ALL_READY_TIMEOUT = 60.0


_COLUMNS = (
    "workers",
    "tokens_per_second",
    "server_cpu_cores",
    "cpu_seconds_per_million_tokens",
    "client_busy",
    "client_cpu_share",
    "errors",
)


def _server_cpu(server: RunningServer) -> float:
    """CPU seconds of the server process and all its workers so far."""
    process = psutil.Process(server.process.pid)
    total = 0.0
    for member in [process, *process.children(recursive=True)]:
        try:
            times = member.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _wait_all_workers(log: Path) -> None:
    deadline = time.monotonic() + _ALL_READY_TIMEOUT
    while b"llmsim serving " not in log.read_bytes():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every worker is serving after {_ALL_READY_TIMEOUT:.0f} s; see {log}")
        time.sleep(0.1)


def _measure(workers: int, options: Options, duration: float, warmup: float) -> dict[str, Any]:
    spec = llmsim(f"llmsim-workers-{workers}", "--workers", str(workers), *ROOMY, *ZERO_LATENCY)
    with running(spec, options.log_dir) as server:
        _wait_all_workers(options.log_dir / f"{spec.name}.log")
        load = LoadSpec(
            port=server.port,
            connections=CONNECTIONS,
            duration=duration,
            warmup=warmup,
            max_tokens=MAX_TOKENS,
            model=MODEL,
            processes=options.processes,
        )
        cpu_before, started = _server_cpu(server), time.perf_counter()
        summary = summarize(run_load(load))
        cpu = (_server_cpu(server) - cpu_before) / (time.perf_counter() - started)
    return {
        "workers": workers,
        "tokens_per_second": summary.tokens_per_second,
        "server_cpu_cores": cpu,
        "cpu_seconds_per_million_tokens": ratio(cpu, summary.tokens_per_second) * 1e6,
        "client_busy": summary.client_busy,
        "client_cpu_share": summary.client_cpu_share,
        "ttft_p50": summary.ttft.p50,
        "errors": summary.errors,
    }


def run(options: Options) -> dict[str, Any]:
    duration, warmup, rounds = (4.0, 1.0, 1) if options.quick else (8.0, 2.0, 2)
    samples: list[dict[str, Any]] = []
    for round_index in range(rounds):
        order = WORKERS if round_index % 2 == 0 else tuple(reversed(WORKERS))
        samples += [_measure(workers, options, duration, warmup) for workers in order]
    results = []
    for workers in WORKERS:
        mine = [s for s in samples if s["workers"] == workers]
        medians = {key: statistics.median(s[key] for s in mine) for key in mine[0] if key != "workers"}
        results.append({"workers": workers, **medians})
    one, two = results
    scaling = ratio(two["tokens_per_second"], one["tokens_per_second"]) / 2
    payload = {
        "scenario": "workers",
        "environment": environment(),
        "duration_seconds": duration,
        "rounds": rounds,
        "connections": CONNECTIONS,
        "max_tokens": MAX_TOKENS,
        "loadgen_processes": options.processes,
        "results": results,
        "scaling_2_over_1": scaling,
        "samples": samples,
    }
    print_table(
        f"--workers 1 vs 2: h1 {CONNECTIONS} connections, {MAX_TOKENS}-token streams, zero latency",
        ["workers", "tokens/s", "server cores", "CPU s / M tokens", "client busy", "client cores", "errors"],
        [[r[key] for key in _COLUMNS] for r in results],
    )
    print(f"scaling (tokens/s with 2 workers / with 1, / 2): {scaling:.2f}")
    write_json(options.results_dir, "workers", payload)
    return payload
