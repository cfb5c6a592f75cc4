"""The C twin of ``Engine._run`` (``native/engine_run.c``): installed when it is built.

``Engine._run`` is the per-token loop of :mod:`llmsim.engine.scheduler`: every paced
token goes through it.  ``llmsim._speedups`` holds a hand-written C twin that reads
the :class:`~llmsim.engine.job.Job` fields by slot offset and calls back into Python
for everything the loop delegates (``_start_decoding``, ``_put_back``, the sink, and
of ``_advance`` the job's end and the ready list); calls it does not take (unusual
argument types) go to the pure function.  ``native/engine_advance.c`` holds the twins
of ``Engine._advance`` with a fixed ITL (the catch-ups of several tokens a late step
hands out) and of ``Timetable._enter``; the Python methods stay the reference, and
the C code calls them for every case it does not take.  :func:`install_run` installs
the twins on the engine class and returns the pure function, which scheduler.py keeps
as ``PURE_RUN`` (the reference; the tests run both, tests/engine/test_native_run.py
and test_native_catchup.py).  ``LLMSIM_PURE=1`` keeps the pure one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

from llmsim.engine.grid import GRID_SHIFT, GRID_TOLERANCE
from llmsim.engine.job import Job, JobState
from llmsim.engine.latency import LatencyModel
from llmsim.engine.timetable import READY, Timetable
from llmsim.speedups import installer

if TYPE_CHECKING:
    from llmsim.engine.scheduler import Engine

__all__ = ["RunFunction", "install_run"]

#: ``Engine._run(self, jobs, time, now, due, reach)``.
RunFunction = Callable[["Engine", list[Job], float, float, float, float], None]


def install_run(engine_class: type[Engine], *, max_tokens_per_step: int) -> RunFunction:
    """Make ``engine_class._run`` the C twin if ``llmsim._speedups`` is there; returns
    the pure ``_run`` either way.  ``max_tokens_per_step`` is the catch-up cap the pure
    ``_advance`` applies (scheduler.py's ``MAX_TOKENS_PER_STEP``)."""
    pure: RunFunction = engine_class._run
    install = installer("install_engine_run")
    if install is not None:
        install(engine_class, Job, pure, JobState.PREFILL, JobState.DECODING, READY)
    install_advance = installer("install_engine_advance")
    if install_advance is not None:
        install_advance(
            Job,
            LatencyModel,
            engine_class._advance,
            Timetable._enter,
            max_tokens_per_step,
            GRID_SHIFT,
            GRID_TOLERANCE,
            heapq.heappush,
        )
    return pure
