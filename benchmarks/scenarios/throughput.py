"""Throughput: streamed tokens per second at zero simulated latency, against the baseline.

Each server streams 200-token chat completions (``ignore_eos``) with no simulated
latency, so that only the serving cost is measured, at HTTP/1.1 with 50 and 200
connections and HTTP/2 with 20 connections x 50 streams, closed loop, for a fixed
time.  Reported per server and load: tokens/s seen by the client, server CPU seconds
per million tokens (from /proc/<pid>/stat, robust to a noisy shared machine), and both
as ratios against the bare hypercorn + ASGI baseline run in the same session.  h2load
repeats the HTTP/2 load once per server as an independent cross-check.
"""

from __future__ import annotations

import math
import statistics
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from benchmarks import plots
from benchmarks.external import h2load_command, request_files, run_h2load, shell, wrk_command
from benchmarks.loadgen.runner import LoadSpec
from benchmarks.report import environment, print_table, ratio, write_json
from benchmarks.scenarios import Options
from benchmarks.scenarios.measure import CLEANUP_TIMEOUT, Measurement, measure
from benchmarks.servers import BASELINE, MODEL, RunningServer, llmsim, running

__all__ = ["chat_load", "run"]

MAX_TOKENS = 200
ZERO_LATENCY = ("--time-to-first-token", "0", "--inter-token-latency", "0")
ROOMY = ("--max-num-seqs", "10000", "--max-waiting-queue-length", "10000")
SERVERS = (
    llmsim("llmsim-native", "--server", "native", *ROOMY, *ZERO_LATENCY),
    llmsim("llmsim-hypercorn", "--server", "hypercorn", *ROOMY, *ZERO_LATENCY),
    BASELINE,
)
#: (HTTP/2?, connections, streams per connection)
LOADS = ((False, 50, 1), (False, 200, 1), (True, 20, 50))
H2LOAD_LOAD = LOADS[2]
MEDIAN_KEYS = (
    "tokens_per_second",
    "server_cpu_seconds",
    "cpu_seconds_per_million_tokens",
    "server_busy",
    "server_cleanup_seconds",
    "client_busy",
    "ttft_p50",
    "ttft_p99",
    "streams_measured",
    "throughput_ratio",
    "cpu_efficiency_ratio",
)


def chat_load(
    server: RunningServer, load: tuple[bool, int, int], duration: float, warmup: float, processes: int
) -> LoadSpec:
    """One of :data:`LOADS` against ``server``: streamed :data:`MAX_TOKENS`-token chat completions."""
    http2, connections, streams = load
    return LoadSpec(
        port=server.port,
        http2=http2,
        connections=connections,
        streams=streams,
        duration=duration,
        warmup=warmup,
        max_tokens=MAX_TOKENS,
        model=MODEL,
        processes=processes,
    )


def run(options: Options) -> dict[str, Any]:
    duration, warmup, rounds = (3.0, 1.0, 1) if options.quick else (10.0, 2.0, 3)
    body, script = request_files(options.log_dir, MODEL, MAX_TOKENS)
    samples: list[dict[str, Any]] = []
    cross_checks: list[dict[str, Any]] = []
    commands: dict[str, str] = {}
    with ExitStack() as stack:
        # All servers stay up (idle ones cost nothing) so that their loads can be
        # interleaved: drifts in the machine's background load then hit them alike.
        servers = [stack.enter_context(running(spec, options.log_dir)) for spec in SERVERS]
        for round_index in range(rounds):
            for load in LOADS:
                for server in servers:
                    spec = chat_load(server, load, duration, warmup, options.processes)
                    samples.append({"round": round_index, "server": server.spec.name, **_row(measure(server, spec))})
                    commands.setdefault(spec.describe(), _equivalent(spec, duration, warmup, body, script))
        _, connections, streams = H2LOAD_LOAD
        for server in servers:
            command = h2load_command(
                server.port, connections=connections, streams=streams, duration=duration, warmup=warmup, body=body
            )
            checked = run_h2load(command, timeout=duration + 60)
            server.wait_idle(CLEANUP_TIMEOUT)
            if checked is not None:
                cross_checks.append(
                    {
                        "server": server.spec.name,
                        "tokens_per_second": checked.tokens_per_second(MAX_TOKENS),
                        **attrs.asdict(checked),
                    }
                )
    _add_ratios(samples, ("round", "load"))
    _add_ratios(cross_checks, ())
    rows = _medians(samples)
    payload = {
        "scenario": "throughput",
        "environment": environment(),
        "duration_seconds": duration,
        "warmup_seconds": warmup,
        "rounds": rounds,
        "max_tokens": MAX_TOKENS,
        "loadgen_processes": options.processes,
        "results": rows,
        "h2load_cross_check": cross_checks,
        "equivalent_commands": commands,
        "samples": samples,
    }
    _print(rows, cross_checks, commands)
    write_json(options.results_dir, "throughput", payload)
    plots.throughput(rows, options.results_dir / "throughput.png")
    return payload


def _row(result: Measurement) -> dict[str, Any]:
    s = result.summary
    return {
        "load": s.label,
        "concurrency": s.concurrency,
        "tokens_per_second": s.tokens_per_second,
        "server_cpu_seconds": result.server_cpu_seconds,
        "cpu_seconds_per_million_tokens": result.cpu_seconds_per_million_tokens,
        "server_busy": result.server_busy,
        "server_cleanup_seconds": result.server_cleanup_seconds,
        "client_busy": s.client_busy,
        "ttft_p50": s.ttft.p50,
        "ttft_p99": s.ttft.p99,
        "streams_measured": s.streams_measured,
        "errors": s.errors,
        "error_samples": s.error_samples,
    }


def _medians(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per server and load: the median of each number (ratios included) over the rounds."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for sample in samples:
        groups.setdefault((sample["server"], sample["load"]), []).append(sample)
    rows = []
    for (server, load), group in groups.items():
        row: dict[str, Any] = {"server": server, "load": load, "concurrency": group[0]["concurrency"]}
        for key in MEDIAN_KEYS:
            row[key] = statistics.median(g[key] for g in group)
        row["errors"] = sum(g["errors"] for g in group)
        row["error_samples"] = [e for g in group for e in g["error_samples"]][:5]
        rows.append(row)
    return rows


def _equivalent(spec: LoadSpec, duration: float, warmup: float, body: Path, script: Path) -> str:
    """The same load for h2load (HTTP/2) or wrk (HTTP/1.1); the port is this run's."""
    if spec.http2:
        command = h2load_command(
            spec.port, connections=spec.connections, streams=spec.streams, duration=duration, warmup=warmup, body=body
        )
    else:
        command = wrk_command(spec.port, connections=spec.connections, duration=duration, script=script)
    return shell(command)


def _add_ratios(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    """tokens/s over the baseline's, and the baseline's CPU per token over this server's.

    Each row is compared with the baseline row that has the same ``keys`` (round and
    load): measurements taken seconds apart share the machine's background load, so
    their ratio is steadier than a ratio of medians.
    """
    base = {tuple(row[k] for k in keys): row for row in rows if row["server"] == BASELINE.name}
    for row in rows:
        reference = base.get(tuple(row[k] for k in keys))
        if reference is None:
            continue
        row["throughput_ratio"] = ratio(row["tokens_per_second"], reference["tokens_per_second"])
        if "cpu_seconds_per_million_tokens" in row:
            row["cpu_efficiency_ratio"] = ratio(
                reference["cpu_seconds_per_million_tokens"], row["cpu_seconds_per_million_tokens"]
            )


def _print(rows: list[dict[str, Any]], cross_checks: list[dict[str, Any]], commands: dict[str, str]) -> None:
    print_table(
        "throughput (zero latency, 200-token streaming chat; medians over rounds of the values and of the"
        " per-round ratios vs asgi-baseline)",
        ["server", "load", "tokens/s", "x base", "CPU s/Mtok", "x base", "srv busy", "cli busy", "cleanup s", "errors"],
        [
            [
                r["server"],
                r["load"],
                r["tokens_per_second"],
                r.get("throughput_ratio", math.nan),
                r["cpu_seconds_per_million_tokens"],
                r.get("cpu_efficiency_ratio", math.nan),
                r["server_busy"],
                r["client_busy"],
                r["server_cleanup_seconds"],
                r["errors"],
            ]
            for r in rows
        ],
    )
    for row in rows:
        for sample in row["error_samples"]:
            print(f"  {row['server']} {row['load']}: {sample}")
    if cross_checks:
        print_table(
            "h2load cross-check (HTTP/2 20x50; counts completed requests only, 0 if none finished in the window)",
            ["server", "tokens/s", "x base", "succeeded", "failed"],
            [
                [c["server"], c["tokens_per_second"], c.get("throughput_ratio", math.nan), c["succeeded"], c["failed"]]
                for c in cross_checks
            ],
        )
    print("\nequivalent commands (ports differ per run):")
    for label, command in commands.items():
        print(f"  {label}: {command}")
