"""Pausing the engine, as vLLM's sleep mode pauses its scheduler.

vLLM 0.33's ``EngineCore.pause_scheduler(mode)`` (``vllm/v1/engine/core.py:2181-2223``)
handles the requests in flight in one of three ways, and puts the scheduler in one of
two pause states (``vllm/v1/core/sched/interface.py:31-35``):

* ``abort``: every request, running or waiting, ends at once with
  ``FinishReason.ABORT`` (``scheduler.finish_requests(None, FINISHED_ABORTED)``; the
  client gets an output with no new tokens, ``core.py:2246-2279``); then PAUSED_NEW.
  :meth:`Engine.abort_all <llmsim.engine.scheduler.Engine.abort_all>` does it: each
  job's sink gets one last call, FINISHED, with no new tokens, and the job counts as a
  finished request with reason ``abort`` (``vllm/v1/engine/output_processor.py:868-887``).
* ``wait``: PAUSED_NEW.  Running jobs go on to their end; waiting ones are not admitted
  ("queued ones stay queued", ``vllm/v1/core/sched/scheduler.py:1049-1066,3147-3155``).
* ``keep``: PAUSED_ALL.  Nothing is scheduled (``scheduler.py:723-725``): no step hands
  out a token, no waiting job is admitted, no prefill period is spent.

Unpausing (``wake_up`` once fully awake) admits waiting jobs again.  Leaving PAUSED_ALL
shifts every deadline (and the chunked-prefill period) by the time spent paused: the
schedule resumes where it stopped, so a token due 5 ms after the pause is due 5 ms after
the resume.  vLLM's paused scheduler runs no forward pass, and its first step after
the resume takes one more step's time; nothing is due "at once" on wake.  (At sleep
level 1 or 2 vLLM also preempts the kept requests, which then recompute their KV cache
after the wake-up, ``scheduler.py:3184-3210``: that recompute is not modelled.)
"""

from __future__ import annotations

import enum

from llmsim.engine.job import Job, JobState

__all__ = ["ABORT", "PauseState", "end", "shift_deadlines"]

#: The finish reason of a job the engine ended (vLLM's ``FinishReason.ABORT``).
ABORT = "abort"


class PauseState(enum.Enum):
    """vLLM's scheduler ``PauseState`` (``vllm/v1/core/sched/interface.py:31-35``)."""

    UNPAUSED = 0
    PAUSED_NEW = 1  # running jobs go on; waiting ones are not admitted
    PAUSED_ALL = 2  # nothing is scheduled; deadlines shift by the paused time


def end(job: Job, reason: str, now: float) -> None:
    """Mark ``job`` FINISHED at ``now`` with ``reason``, out of the schedule."""
    job.state = JobState.FINISHED
    job.finish_reason = reason
    job.finish_time = now
    job.paused = False
    job.slot = None


def shift_deadlines(jobs: list[Job], delta: float) -> list[Job]:
    """Move the deadline of every job in ``jobs`` ``delta`` seconds later; return those
    with an entry in the schedule (``job.slot`` set), which must be scheduled anew."""
    scheduled = []
    for job in jobs:
        job.deadline += delta
        if job.slot is not None:
            job.slot = None
            scheduled.append(job)
    return scheduled
