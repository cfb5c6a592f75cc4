"""The C twin of ``Engine._run`` (``native/engine_run.c``): installed when it is built.

``Engine._run`` is the per-token loop of :mod:`llmsim.engine.scheduler`: every paced
token goes through it.  ``llmsim._speedups`` holds a hand-written C twin that reads
the :class:`~llmsim.engine.job.Job` fields by slot offset and calls back into Python
for everything the loop delegates (``_start_decoding``, ``_enter``, ``_advance``,
``_put_back``, the sink); calls it does not take (unusual argument types) go to the
pure function.  :func:`install_run` installs it on the engine class and returns the
pure function, which scheduler.py keeps as ``PURE_RUN`` (the reference; the tests
run both, tests/engine/test_native_run.py).  ``LLMSIM_PURE=1`` keeps the pure one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from llmsim.engine.job import Job, JobState
from llmsim.engine.timetable import READY
from llmsim.speedups import installer

if TYPE_CHECKING:
    from llmsim.engine.scheduler import Engine

__all__ = ["RunFunction", "install_run"]

#: ``Engine._run(self, jobs, time, now, due, reach)``.
RunFunction = Callable[["Engine", list[Job], float, float, float, float], None]


def install_run(engine_class: type[Engine]) -> RunFunction:
    """Make ``engine_class._run`` the C twin if ``llmsim._speedups`` is there; returns
    the pure ``_run`` either way."""
    pure: RunFunction = engine_class._run
    install = installer("install_engine_run")
    if install is not None:
        install(engine_class, Job, pure, JobState.PREFILL, JobState.DECODING, READY)
    return pure
