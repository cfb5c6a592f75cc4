"""``python -m benchmarks soak``: does the server's memory level off under a steady load?

N concurrent HTTP/2 streams (closed loop: each stream that ends is replaced at once, so
that millions of requests, connections' worth of streams and engine jobs come and go)
against llmsim native for a while, sampling the server's RSS every few seconds.  The
RSS curve goes to ``results/soak.png``; the verdict compares the second half of the run
with its middle: the RSS *levels off* if it grew by less than 2 % (or 4 MiB) over the
second half, and the least-squares slope of that half is reported beside it.

``python -m benchmarks soak`` runs the short default (60 s, 500 streams; ``--quick``:
20 s); for the long run the issue asks for, ``python -m benchmarks.soak --duration 1800``
(also ``--streams``, ``--sample-every``, ``--processes``).
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

from benchmarks.loadgen.runner import LoadSpec, run_load
from benchmarks.loadgen.stats import summarize
from benchmarks.report import environment, print_table, write_json
from benchmarks.scenarios import Options
from benchmarks.servers import MODEL, SAMPLE_INTERVAL, RunningServer, llmsim, running

__all__ = ["levels_off", "run", "soak"]

STREAMS_PER_CONNECTION = 100
MAX_TOKENS = 200
SERVER = llmsim(
    "llmsim-native-soak",
    "--server",
    "native",
    "--time-to-first-token",
    "100ms",
    "--inter-token-latency",
    "20ms",
    "--max-num-seqs",
    "4096",
)
#: The second half may grow by this share of the middle RSS, or this many bytes, whichever is more.
LEVEL_SHARE, LEVEL_BYTES = 0.02, 4 * 2**20


def run(options: Options) -> dict[str, Any]:
    return soak(options, duration=20.0 if options.quick else 60.0, streams=500, sample_every=2.0)


def soak(options: Options, *, duration: float, streams: int, sample_every: float) -> dict[str, Any]:
    connections = max(1, streams // STREAMS_PER_CONNECTION)
    spec_streams = min(streams, STREAMS_PER_CONNECTION)
    with running(SERVER, options.log_dir) as server:
        spec = LoadSpec(
            port=server.port,
            http2=True,
            connections=connections,
            streams=spec_streams,
            duration=duration,
            warmup=min(5.0, duration / 4),
            ramp=min(2.0, duration / 10),
            max_tokens=MAX_TOKENS,
            model=MODEL,
            processes=options.processes,
        )
        result = run_load(spec)
        time.sleep(2 * SAMPLE_INTERVAL)  # let the sampler pass the end of the load
        if server.process.poll() is not None:
            raise RuntimeError(f"the server died during the soak (exit status {server.process.returncode})")
        curve = _curve(server, sample_every, result.start_at, result.stop_at)
    flat, growth, slope = levels_off(curve)
    s = summarize(result)
    payload = {
        "scenario": "soak",
        "environment": environment(),
        "duration_seconds": duration,
        "streams": connections * spec_streams,
        "requests_started": s.streams_started,
        "errors": s.errors,
        "error_samples": s.error_samples,
        "tokens_per_second": s.tokens_per_second,
        "rss_curve": [{"t": t, "rss_bytes": rss} for t, rss in curve],
        "second_half_growth_bytes": growth,
        "second_half_slope_mib_per_minute": slope,
        "levels_off": flat,
    }
    first, last = (curve[0][1], curve[-1][1]) if curve else (0, 0)
    print_table(
        f"soak: {connections * spec_streams} HTTP/2 streams for {duration:.0f} s (machine shared)",
        ["requests", "errors", "tokens/s", "RSS start MiB", "RSS end MiB", "2nd half +MiB", "MiB/min", "levels off"],
        [
            [
                s.streams_started,
                s.errors,
                s.tokens_per_second,
                first / 2**20,
                last / 2**20,
                growth / 2**20,
                slope,
                "yes" if flat else "no",
            ]
        ],
    )
    write_json(options.results_dir, "soak", payload)
    from benchmarks import plots  # matplotlib only when a soak runs (its verdict is tested without it)

    plots.soak_rss(curve, flat, options.results_dir / "soak.png")
    return payload


def _curve(server: RunningServer, every: float, start: float, stop: float) -> list[tuple[float, int]]:
    """RSS every ``every`` seconds of the load from the server's 50 ms samples:
    (seconds since the load started, bytes)."""
    curve: list[tuple[float, int]] = []
    for sample in server.samples:
        if start <= sample.at <= stop and (not curve or sample.at - start >= curve[-1][0] + every):
            curve.append((sample.at - start, sample.rss))
    return curve


def levels_off(curve: list[tuple[float, int]]) -> tuple[bool, float, float]:
    """(levels off, growth over the second half in bytes, its slope in MiB per minute)."""
    half = [(t, rss) for t, rss in curve if t >= curve[-1][0] / 2] if curve else []
    if len(half) < 2:
        return False, math.nan, math.nan
    growth = half[-1][1] - half[0][1]
    n = len(half)
    mean_t = sum(t for t, _ in half) / n
    mean_r = sum(r for _, r in half) / n
    var = sum((t - mean_t) ** 2 for t, _ in half)
    slope = sum((t - mean_t) * (r - mean_r) for t, r in half) / var if var else 0.0
    return growth < max(LEVEL_SHARE * half[0][1], LEVEL_BYTES), growth, slope * 60 / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (the issue asks 1800)")
    parser.add_argument("--streams", type=int, default=500, help="concurrent HTTP/2 streams")
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS points")
    parser.add_argument("--processes", type=int, default=2, help="load-generator worker processes")
    args = parser.parse_args()
    soak(
        Options(processes=args.processes), duration=args.duration, streams=args.streams, sample_every=args.sample_every
    )


if __name__ == "__main__":
    main()
