"""The timetable: which jobs are due at which step time.

Jobs wait in buckets keyed by their step time (a heap of the distinct step times and a
dict from step time to a list of jobs); jobs due at once wait in the ready list.  A job
has at most one live entry: the one in the bucket named by ``job.slot`` (:data:`READY`
for the ready list).  An entry whose job has moved on (cancelled, finished, paused,
rescheduled) is stale and skipped when its bucket comes up.  With a step quantum (see
:mod:`llmsim.engine.scheduler`), step times lie on the grid and the per-token cost is a
list append into a bucket that usually exists already.

:class:`Timetable` is a base of :class:`~llmsim.engine.scheduler.Engine`, whose
per-token path (``Engine._run``) inlines :meth:`Timetable._schedule` on these fields.
"""

from __future__ import annotations

import heapq
import math

from llmsim.engine.grid import GRID_SHIFT, grid_span
from llmsim.engine.job import Job

__all__ = ["READY", "Timetable", "is_live"]

#: ``job.slot`` of a job waiting in the ready list (due at the next step).
READY = -math.inf


class Timetable:
    """The ready list and the buckets; see the module docstring."""

    def __init__(self) -> None:
        self._ready: list[Job] = []
        self._ready_time = math.inf  # earliest deadline in the ready list
        self._buckets: dict[float, list[Job]] = {}
        self._times: list[float] = []  # heap of the keys of _buckets
        # While a step runs: its ``now``.  Whatever becomes due by then waits in the
        # ready list for the next step, so that no job is handled twice in one step.
        self._horizon = -math.inf
        self._grid = 0.0
        self._inverse_grid = 0.0

    @property
    def step_quantum(self) -> float:
        """The grid interval steps are put on (seconds); 0 when every deadline is its own step."""
        return self._grid

    def _set_grid(self, interval: float) -> None:
        self._grid = interval
        self._inverse_grid = 1.0 / interval if interval else 0.0

    def _schedule(self, job: Job, deadline: float, now: float) -> None:
        """Make ``deadline`` the job's next due time and give it its one live entry.
        (The per-token path in ``Engine._run`` does the same, inlined.)"""
        job.deadline = deadline
        horizon = self._horizon if self._horizon > now else now
        if deadline <= horizon:
            time = READY
        elif self._grid:
            time = math.ceil(deadline * self._inverse_grid - GRID_SHIFT) * self._grid
            if time <= horizon:
                time = READY
        else:
            time = deadline
        if job.slot == time:
            if time == READY and deadline < self._ready_time:
                self._ready_time = deadline
            return  # its entry is there already (a resume before the step came)
        job.slot = time
        if time == READY:
            self._ready.append(job)
            if deadline < self._ready_time:
                self._ready_time = deadline
            return
        bucket = self._buckets.get(time)
        if bucket is None:
            self._buckets[time] = [job]
            heapq.heappush(self._times, time)
        else:
            bucket.append(job)

    def _enter(self, job: Job, deadline: float, now: float) -> tuple[float, float, float, list[Job]]:
        """The per-token path's entry for ``deadline``, which is past the step's reach: the
        bucket of its grid time (or of ``deadline`` itself without a grid), or the ready
        list when that time is not after ``now`` (a float hair).  Returns the deadlines
        ``(first, last)`` known to get the same time, the time and its bucket, for
        ``Engine._run``'s cache (an empty span for the ready list).  The C loop has a twin of
        all but the ready-list case (native/engine_advance.c)."""
        grid = self._grid
        if grid:
            index = math.ceil(deadline * self._inverse_grid - GRID_SHIFT)
            time = index * grid
            if time <= now:
                self._enter_ready(job, deadline)
                return math.inf, -math.inf, READY, self._ready
            first, last = grid_span(index, grid, self._inverse_grid)
            first, last = min(first, deadline), max(last, deadline)
        else:
            time = first = last = deadline
        job.slot = time
        bucket = self._buckets.get(time)
        if bucket is None:
            bucket = self._buckets[time] = [job]
            heapq.heappush(self._times, time)
        else:
            bucket.append(job)
        return first, last, time, bucket

    def _enter_ready(self, job: Job, deadline: float) -> None:
        """Put ``job``, due at ``deadline``, in the ready list (the next step's)."""
        job.slot = READY
        self._ready.append(job)
        if deadline < self._ready_time:
            self._ready_time = deadline

    def _put_back(self, rest: list[Job], time: float, due: float) -> None:
        """Return the entries of a bucket (or of the ready list, due since ``due``) that a
        step did not reach, in their order."""
        if not rest:
            return
        if time == READY:
            self._ready[:0] = rest
            self._ready_time = min(self._ready_time, due)
        else:
            self._buckets[time] = rest
            heapq.heappush(self._times, time)

    def _first_live_time(self) -> float:
        """The earliest step time with a live entry, dropping no bucket: asked mid-step,
        where ``Engine._run`` may hold a bucket it still fills (``math.inf``: none)."""
        for time in sorted(self._times):
            if is_live(self._buckets[time], time):
                return time
        return math.inf

    def _clear_timetable(self) -> None:
        """Drop every entry (the caller schedules the jobs again)."""
        self._ready, self._ready_time, self._buckets, self._times = [], math.inf, {}, []


def is_live(jobs: list[Job], time: float) -> bool:
    """True if ``jobs`` (the bucket for ``time``) holds a live entry; drops the stale
    entries in front of the first live one (a paused job's entry is consumed as a step
    would: ``Engine.resume`` gives it a new one)."""
    for index, job in enumerate(jobs):
        if job.slot == time:
            if not job.paused:
                if index:
                    del jobs[:index]
                return True
            job.slot = None
    jobs.clear()
    return False
