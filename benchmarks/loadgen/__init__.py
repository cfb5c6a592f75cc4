"""A closed-loop streaming load generator on trio.

HTTP/1.1 connections run one request at a time (keep-alive, a hand-rolled response
parser); HTTP/2 connections keep many streams open at once (h2, with windows so large
that flow control never throttles the server).  Every stream's SSE events are timed as
they arrive; :mod:`.stats` turns the records into percentiles and rates.
"""

from benchmarks.loadgen.records import StreamRecord
from benchmarks.loadgen.runner import LoadResult, LoadSpec, run_load
from benchmarks.loadgen.stats import LoadSummary, summarize

__all__ = ["LoadResult", "LoadSpec", "LoadSummary", "StreamRecord", "run_load", "summarize"]
