"""Fidelity: do client-measured latencies stay at the configured values under load?

llmsim native is configured with TTFT 100 ms and ITL 20 ms and streams 100-token chat
completions to 200, 500, 1,000, 2,000 and 10,000 concurrent HTTP/2 streams (closed loop, enough
``max-num-seqs`` that nothing queues).  The first streams start spread over one stream
lifetime, so arrivals are steady; only streams that start after the warm-up and finish
before the stop count.  Reported: TTFT and ITL p50/p90/p99 and their error against
the configuration (target at 2,000 streams: medians within 5 %, p99 within 25 %),
errors, the server's peak RSS and whether server or client was saturated.

The same loads also run against the paced blaster, an ideal simulated server that
sends every event on an exact schedule at almost no CPU cost.  What it shows is the
floor of this measurement on this machine: the latency that the load generator (and
the shared cores) add on their own.  llmsim can only be judged above that floor.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from typing import Any

from benchmarks import plots
from benchmarks.loadgen.runner import LoadSpec
from benchmarks.report import environment, percent_error, print_table, write_json
from benchmarks.scenarios import Options
from benchmarks.scenarios.measure import Measurement, measure
from benchmarks.servers import MODEL, ServerSpec, llmsim, running

__all__ = ["run"]

TTFT = 0.100
ITL = 0.020
MAX_TOKENS = 100
STREAM_SECONDS = TTFT + (MAX_TOKENS - 1) * ITL
#: (connections, streams per connection); the server allows 1,000 streams per connection.
LOADS = ((10, 20), (20, 25), (20, 50), (40, 50), (100, 100))
#: SPEC section 9: medians within 5 % of the configured values, p99 within 25 %.
MEDIAN_TOLERANCE = 5.0
P99_TOLERANCE = 25.0
SERVER = llmsim(
    "llmsim-native-fidelity",
    "--server",
    "native",
    "--time-to-first-token",
    f"{TTFT * 1000:g}ms",
    "--inter-token-latency",
    f"{ITL * 1000:g}ms",
    "--max-num-seqs",
    "12000",
    "--max-waiting-queue-length",
    "12000",
    "--max-concurrent-streams",
    "1000",
)
REFERENCE = ServerSpec(
    "paced-blaster",
    (
        sys.executable,
        "-m",
        "benchmarks.loadgen.blaster",
        "--port",
        "{port}",
        "--ttft",
        f"{TTFT:g}",
        "--itl",
        f"{ITL:g}",
    ),
)


def run(options: Options) -> dict[str, Any]:
    duration = 7.0 if options.quick else 15.0
    ramp = round(STREAM_SECONDS, 1)
    warmup = ramp + 1.0
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        servers = [stack.enter_context(running(spec, options.log_dir)) for spec in (SERVER, REFERENCE)]
        for connections, streams in LOADS:
            for server in servers:
                spec = LoadSpec(
                    port=server.port,
                    http2=True,
                    connections=connections,
                    streams=streams,
                    duration=duration,
                    warmup=warmup,
                    ramp=ramp,
                    max_tokens=MAX_TOKENS,
                    model=MODEL,
                    processes=options.processes,
                )
                rows.append({"server": server.spec.name, **_row(measure(server, spec))})
    payload = {
        "scenario": "fidelity",
        "environment": environment(),
        "configured": {"ttft_seconds": TTFT, "itl_seconds": ITL, "max_tokens": MAX_TOKENS},
        "duration_seconds": duration,
        "warmup_seconds": warmup,
        "ramp_seconds": ramp,
        "loadgen_processes": options.processes,
        "results": rows,
    }
    _print(rows)
    write_json(options.results_dir, "fidelity", payload)
    plots.fidelity(rows, TTFT, ITL, options.results_dir / "fidelity.png")
    return payload


def _row(result: Measurement) -> dict[str, Any]:
    s = result.summary
    row: dict[str, Any] = {
        "load": s.label,
        "concurrency": s.concurrency,
        "streams_measured": s.streams_measured,
        "errors": s.errors,
        "error_samples": s.error_samples,
        "tokens_per_second": s.tokens_per_second,
        "ideal_tokens_per_second": s.concurrency * MAX_TOKENS / STREAM_SECONDS,
        "server_rss_peak_bytes": result.server_rss_peak,
        "server_busy": result.server_busy,
        "server_cleanup_seconds": result.server_cleanup_seconds,
        "client_busy": s.client_busy,
    }
    for metric, configured, values in (("ttft", TTFT, s.ttft), ("itl", ITL, s.itl)):
        for quantile in ("p50", "p90", "p99"):
            measured = getattr(values, quantile)
            row[f"{metric}_{quantile}"] = measured
            row[f"{metric}_{quantile}_error_percent"] = percent_error(measured, configured)
    row["targets_met"] = _targets_met(row)
    return row


def _targets_met(row: dict[str, Any]) -> bool:
    """SPEC 9's fidelity targets, with no errors (NaN, no samples, is a miss)."""
    medians = (abs(row[f"{metric}_p50_error_percent"]) <= MEDIAN_TOLERANCE for metric in ("ttft", "itl"))
    tails = (abs(row[f"{metric}_p99_error_percent"]) <= P99_TOLERANCE for metric in ("ttft", "itl"))
    return row["errors"] == 0 and all(medians) and all(tails)


def _print(rows: list[dict[str, Any]]) -> None:
    print_table(
        f"fidelity (TTFT {TTFT * 1000:g} ms, ITL {ITL * 1000:g} ms, {MAX_TOKENS}-token streams over HTTP/2;"
        " paced-blaster = what the client alone adds)",
        [
            "server",
            "streams",
            "measured",
            "TTFT p50",
            "err %",
            "TTFT p99",
            "err %",
            "ITL p50",
            "err %",
            "ITL p99",
            "err %",
            "tok/s",
            "errors",
            "RSS MiB",
            "srv busy",
            "cli busy",
            "targets",
        ],
        [
            [
                r["server"],
                r["concurrency"],
                r["streams_measured"],
                r["ttft_p50"],
                r["ttft_p50_error_percent"],
                r["ttft_p99"],
                r["ttft_p99_error_percent"],
                r["itl_p50"],
                r["itl_p50_error_percent"],
                r["itl_p99"],
                r["itl_p99_error_percent"],
                r["tokens_per_second"],
                r["errors"],
                r["server_rss_peak_bytes"] / 2**20,
                r["server_busy"],
                r["client_busy"],
                "met" if r["targets_met"] else "missed",
            ]
            for r in rows
        ],
    )
    for row in rows:
        for sample in row["error_samples"]:
            print(f"  {row['server']} {row['load']}: {sample}")
