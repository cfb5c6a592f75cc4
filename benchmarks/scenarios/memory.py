"""Memory per in-flight stream: server RSS with K open streams, minus RSS at rest, over K.

llmsim native gets a long inter-token latency (1 s) and 100-token requests, so that K
streams stay open (100 s each, far longer than the hold) and nearly idle: what is
measured is the memory that holding a stream costs (connection state, HTTP/2 stream,
engine job, KV blocks, buffers), not the churn of producing tokens.  Requests for more
tokens cost more where the server renders its output ahead.  Each K gets a fresh server; RSS at rest is taken after the
readiness probe, RSS loaded is the peak over the last seconds of the hold, once every
stream has had its first token.  K = 1,000 and 10,000 over HTTP/2, 100 streams per
connection.  "open" counts the streams still open at the end (the divisor), "streaming"
those of them that had received a token: they should be equal.
"""

from __future__ import annotations

import math
import time
from typing import Any

from benchmarks import plots
from benchmarks.loadgen.runner import LoadSpec
from benchmarks.report import environment, print_table, write_json
from benchmarks.scenarios import Options
from benchmarks.scenarios.measure import measure
from benchmarks.servers import MODEL, llmsim, running

__all__ = ["run"]

TTFT, ITL = "100ms", "1s"
MAX_TOKENS = 100
STREAMS_PER_CONNECTION = 100
LEVELS = (1_000, 10_000)
SERVER = llmsim(
    "llmsim-native-memory",
    "--server",
    "native",
    "--time-to-first-token",
    TTFT,
    "--inter-token-latency",
    ITL,
    "--max-num-seqs",
    "12000",
    "--max-waiting-queue-length",
    "12000",
    "--max-concurrent-streams",
    "1000",
)
REST_SETTLE = 1.0
#: RSS is the peak over the last seconds of the hold.
WINDOW = 2.0


def run(options: Options) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for streams in LEVELS:
        # Opening 10,000 streams took llmsim 10 to 20 s on the busy 2-core machine: the
        # hold grows with K so that every stream is streaming before RSS is read.
        ramp, hold = 2.0, 5.0 + 2.5 * streams / 1000
        with running(SERVER, options.log_dir) as server:
            time.sleep(REST_SETTLE)
            rest = server.sample().rss
            spec = LoadSpec(
                port=server.port,
                http2=True,
                connections=streams // STREAMS_PER_CONNECTION,
                streams=STREAMS_PER_CONNECTION,
                duration=ramp + hold,
                warmup=ramp + hold - WINDOW,
                ramp=ramp,
                max_tokens=MAX_TOKENS,
                model=MODEL,
                processes=1,
            )
            result = measure(server, spec)
        s = result.summary
        in_flight = s.unfinished
        rows.append(
            {
                "streams": streams,
                "in_flight": in_flight,
                "streaming": s.streaming_at_stop,
                "errors": s.errors,
                "error_samples": s.error_samples,
                "rss_rest_bytes": rest,
                "rss_loaded_bytes": result.server_rss_peak,
                "bytes_per_stream": (result.server_rss_peak - rest) / in_flight if in_flight else math.nan,
            }
        )
    payload = {
        "scenario": "memory",
        "environment": environment(),
        "ttft": TTFT,
        "itl": ITL,
        "max_tokens": MAX_TOKENS,
        "results": rows,
    }
    print_table(
        "memory per in-flight stream (llmsim native, HTTP/2, ITL 1 s; target <= 20 KB)",
        ["streams", "open", "streaming", "errors", "RSS rest MiB", "RSS loaded MiB", "KiB/stream"],
        [
            [
                r["streams"],
                r["in_flight"],
                r["streaming"],
                r["errors"],
                r["rss_rest_bytes"] / 2**20,
                r["rss_loaded_bytes"] / 2**20,
                r["bytes_per_stream"] / 1024,
            ]
            for r in rows
        ],
    )
    for row in rows:
        for sample in row["error_samples"]:
            print(f"  {row['streams']}: {sample}")
        if row["streaming"] < row["in_flight"]:
            print(f"  {row['streams']}: only {row['streaming']:,} streams had begun: the figure is a lower bound")
    write_json(options.results_dir, "memory", payload)
    plots.memory(rows, options.results_dir / "memory.png")
    return payload
