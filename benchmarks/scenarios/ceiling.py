"""Ceiling: how many SSE events per second the load generator itself can consume.

The target is the blaster (pre-rendered responses, one HTTP/1.1 chunk or HTTP/2 DATA
frame per event, almost no work per event; h2load measures it as well), so the client
is the bottleneck -- its busy share should be near 1.0.  The throughput loads are
repeated with one worker process and with ``--processes``.  Events per client
CPU-second is the number that carries over to a quieter machine; the absolute rate
depends on how much of the 2 shared cores the client got.
"""

from __future__ import annotations

import sys
from typing import Any

from benchmarks import plots
from benchmarks.external import h2load_command, request_files, run_h2load
from benchmarks.loadgen.runner import LoadSpec
from benchmarks.report import environment, print_table, write_json
from benchmarks.scenarios import Options
from benchmarks.scenarios.measure import measure
from benchmarks.servers import MODEL, ServerSpec, running

__all__ = ["run"]

BLASTER = ServerSpec("blaster", (sys.executable, "-m", "benchmarks.loadgen.blaster", "--port", "{port}"))
MAX_TOKENS = 200
#: (HTTP/2?, connections, streams per connection): the throughput scenario's loads.
LOADS = ((False, 50, 1), (True, 20, 50))


def run(options: Options) -> dict[str, Any]:
    duration, warmup = (3.0, 1.0) if options.quick else (6.0, 1.0)
    body, _ = request_files(options.log_dir, MODEL, MAX_TOKENS)
    rows: list[dict[str, Any]] = []
    with running(BLASTER, options.log_dir) as blaster:
        for http2, connections, streams in LOADS:
            for processes in sorted({1, options.processes}):
                spec = LoadSpec(
                    port=blaster.port,
                    http2=http2,
                    connections=connections,
                    streams=streams,
                    duration=duration,
                    warmup=warmup,
                    max_tokens=MAX_TOKENS,
                    model=MODEL,
                    processes=processes,
                )
                result = measure(blaster, spec)
                s = result.summary
                rows.append(
                    {
                        "load": s.label,
                        "processes": processes,
                        "events_per_second": s.events_per_second,
                        "tokens_per_second": s.tokens_per_second,
                        "client_cpu_share": s.client_cpu_share,
                        "client_busy": s.client_busy,
                        "events_per_client_cpu_second": s.events_per_second / s.client_cpu_share
                        if s.client_cpu_share
                        else 0.0,
                        "blaster_busy": result.server_busy,
                        "errors": s.errors,
                    }
                )
        http2, connections, streams = LOADS[1]
        command = h2load_command(
            blaster.port, connections=connections, streams=streams, duration=duration, warmup=warmup, body=body
        )
        checked = run_h2load(command, timeout=duration + 60)
    h2load_events = checked.requests_per_second * (MAX_TOKENS + 2) if checked else None  # content events
    payload = {
        "scenario": "ceiling",
        "environment": environment(),
        "duration_seconds": duration,
        "results": rows,
        "h2load_events_per_second": h2load_events,
        "h2load_command": checked.command if checked else None,
    }
    print_table(
        "load generator ceiling against the blaster (busy near 1: the client is the limit)",
        ["load", "procs", "events/s", "client CPU", "client busy", "events/CPU-s", "blaster busy", "errors"],
        [
            [
                r["load"],
                r["processes"],
                r["events_per_second"],
                r["client_cpu_share"],
                r["client_busy"],
                r["events_per_client_cpu_second"],
                r["blaster_busy"],
                r["errors"],
            ]
            for r in rows
        ],
    )
    if h2load_events is not None:
        print(f"  h2load against the same blaster (h2 20x50): {h2load_events:,.0f} events/s: not the limit")
    write_json(options.results_dir, "ceiling", payload)
    plots.ceiling(rows, options.results_dir / "ceiling.png")
    return payload
