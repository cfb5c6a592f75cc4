"""One load against one running server: the client's view plus the server's cost."""

from __future__ import annotations

import math
import time

import attrs

from benchmarks.loadgen.runner import LoadSpec, run_load
from benchmarks.loadgen.stats import LoadSummary, summarize
from benchmarks.servers import SAMPLE_INTERVAL, RunningServer

__all__ = ["CLEANUP_TIMEOUT", "Measurement", "measure"]

CLEANUP_TIMEOUT = 30.0


@attrs.frozen
class Measurement:
    """Client summary and server usage over the same measured window.

    ``server_busy`` is the server's main thread runnable seconds per wall second: near
    1.0 the server was the bottleneck (on a shared machine CPU seconds alone cannot
    tell, as a saturated process only gets its share of the cores).  After the load,
    :func:`measure` waits (at most :data:`CLEANUP_TIMEOUT`) until the server is idle.
    """

    summary: LoadSummary
    server_cpu_seconds: float
    server_busy: float
    server_rss_peak: int
    #: How long the server kept working after the load dropped its open streams.
    server_cleanup_seconds: float

    @property
    def cpu_seconds_per_million_tokens(self) -> float:
        tokens = self.summary.tokens_per_second * self.summary.window_seconds
        return self.server_cpu_seconds / tokens * 1e6 if tokens else math.nan


def measure(server: RunningServer, spec: LoadSpec) -> Measurement:
    result = run_load(spec)
    time.sleep(2 * SAMPLE_INTERVAL)  # let the sampler pass the end of the window
    summary = summarize(result)
    begin, end = result.window
    cpu, runnable, rss = server.usage_between(begin, end)
    if server.process.poll() is not None:
        raise RuntimeError(
            f"{server.spec.name} died during the load (exit status {server.process.returncode}); see its log"
        )
    cleanup = server.wait_idle(CLEANUP_TIMEOUT)
    return Measurement(summary, cpu, runnable / (end - begin), rss, cleanup)
