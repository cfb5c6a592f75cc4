"""From stream records to the numbers a benchmark reports.

Only the measured window (after warm-up, before the stop time) counts:

* latencies (TTFT, ITL) come from streams that started inside the window and finished
  cleanly before its end, so neither the start-up burst nor cut-off streams skew them;
* rates count the content events that *arrived* inside the window, from every stream,
  so that long streams still running at the stop time are counted for the part they
  delivered.  Events are converted to tokens with the tokens-per-event ratio of the
  finished streams (a chat stream has a role chunk and a finish chunk besides its
  token chunks);
* errors count every stream that failed at any time.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import attrs

from benchmarks.loadgen.records import StreamRecord
from benchmarks.loadgen.runner import LoadResult

__all__ = ["LoadSummary", "Percentiles", "percentiles", "summarize"]

QUANTILES = (0.5, 0.9, 0.99)


@attrs.frozen
class Percentiles:
    """p50/p90/p99 (nearest rank) and the mean, in seconds; NaN when there were no samples."""

    p50: float
    p90: float
    p99: float
    mean: float
    count: int


def percentiles(samples: Sequence[float]) -> Percentiles:
    if not samples:
        return Percentiles(math.nan, math.nan, math.nan, math.nan, 0)
    ordered = sorted(samples)
    n = len(ordered)
    p50, p90, p99 = (ordered[min(n - 1, max(0, math.ceil(q * n) - 1))] for q in QUANTILES)
    return Percentiles(p50, p90, p99, math.fsum(ordered) / n, n)


@attrs.frozen
class LoadSummary:
    """What one load achieved, as the client measured it."""

    label: str
    concurrency: int
    window_seconds: float
    streams_started: int
    streams_measured: int
    #: Streams still open at the stop time, and how many of those had begun streaming.
    unfinished: int
    streaming_at_stop: int
    errors: int
    error_samples: tuple[str, ...]
    statuses: dict[int, int]
    tokens_per_second: float
    events_per_second: float
    ttft: Percentiles
    itl: Percentiles
    client_cpu_seconds: float
    #: Client CPU seconds per wall second of the run, all workers together (1.0 = one core).
    client_cpu_share: float
    #: Client runnable (on CPU or waiting for one) seconds per wall second and worker
    #: process: near 1.0 the load generator itself was the bottleneck.
    client_busy: float


def summarize(result: LoadResult) -> LoadSummary:
    begin, end = result.window
    records = result.records
    measured: list[StreamRecord] = []
    errors: Counter[str] = Counter()
    events_in_window = 0
    tokens = events = 0
    for record in records:
        if record.error is not None:
            errors[record.error[:160]] += 1
            continue
        events_in_window += _events_between(record, begin, end)
        if record.done and not math.isnan(record.end):
            tokens += record.completion_tokens
            events += record.events
            if record.start >= begin and record.end <= end:
                measured.append(record)
    open_streams = [r for r in records if r.error is None and math.isnan(r.end)]
    window = end - begin
    tokens_per_event = tokens / events if events else 1.0
    return LoadSummary(
        label=result.spec.describe(),
        concurrency=result.spec.concurrency,
        window_seconds=window,
        streams_started=len(records),
        streams_measured=len(measured),
        unfinished=len(open_streams),
        streaming_at_stop=sum(1 for r in open_streams if r.events),
        errors=sum(errors.values()),
        error_samples=tuple(f"{count}x {text}" for text, count in errors.most_common(5)),
        statuses=dict(Counter(r.status for r in records)),
        tokens_per_second=events_in_window * tokens_per_event / window,
        events_per_second=events_in_window / window,
        ttft=percentiles([r.ttft for r in measured]),
        itl=percentiles([gap for r in measured for gap in r.gaps]),
        client_cpu_seconds=result.client_cpu_seconds,
        client_cpu_share=result.client_cpu_seconds / result.spec.duration,
        client_busy=result.client_runnable_seconds / (result.spec.duration * result.spec.processes),
    )


def _events_between(record: StreamRecord, begin: float, end: float) -> int:
    """How many of the record's content events arrived in [begin, end)."""
    if record.events == 0 or record.last < begin or record.first >= end:
        return 0
    if record.first >= begin and record.last < end:
        return record.events
    count = 0
    at = record.first
    if begin <= at < end:
        count += 1
    for gap in record.gaps:
        at += gap
        if begin <= at < end:
            count += 1
    return count
