"""LoRA slots: which adapters the running jobs use, for vLLM's ``max_loras`` rule.

vLLM's v1 scheduler (``vllm/v1/core/sched/scheduler.py:1038-1101``) collects the
adapters of every running request, then walks the waiting queue in order: a request
whose adapter is not among them while they already number ``max_loras`` is skipped
(it keeps its place, ``skip_request``), and the requests behind it may still be
admitted.  Requests without an adapter never wait for one.

The engine does not report a job's end here (its per-token path stays as it is):
:class:`LoraSlots` keeps the admitted jobs per adapter and, only when an adapter would
not fit, drops the ones no longer running.  That is exact, since an adapter listed
with finished jobs only makes the check stricter until the pruning that follows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

from llmsim.engine.job import Job, JobState

__all__ = ["LoraSlots", "LoraState", "lora_state"]

_RUNNING = (JobState.PREFILL, JobState.DECODING)
_IN_FLIGHT = (JobState.WAITING, *_RUNNING)


class LoraSlots:
    """The adapters of the running jobs, at most ``max_loras`` of them."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self._jobs: dict[str, list[Job]] = {}  # adapter -> jobs admitted with it (some may be done)
        self._limits: dict[str, int] = {}  # adapter -> list length at which its list is pruned

    def fits(self, adapter: str) -> bool:
        """True if a job with ``adapter`` may be admitted now."""
        jobs = self._jobs
        if adapter in jobs or len(jobs) < self.max_loras:
            return True
        self._prune()
        return adapter in jobs or len(jobs) < self.max_loras

    def add(self, job: Job) -> None:
        """Record an admitted job (nothing to record without an adapter)."""
        adapter = job.lora
        if adapter is None:
            return
        jobs = self._jobs.setdefault(adapter, [])
        jobs.append(job)
        if len(jobs) >= self._limits.get(adapter, 16):  # amortised: the list never outgrows its live jobs much
            jobs[:] = [job for job in jobs if job.state in _RUNNING]
            self._limits[adapter] = 2 * len(jobs) + 16

    def _prune(self) -> None:
        for adapter in list(self._jobs):
            live = [job for job in self._jobs[adapter] if job.state in _RUNNING]
            if live:
                self._jobs[adapter] = live
            else:
                del self._jobs[adapter]
                self._limits.pop(adapter, None)


@attrs.frozen
class LoraState:
    """What the metrics report of LoRA (see :func:`lora_state`)."""

    adapters: tuple[str, ...]  # with a job waiting or running, in the order their first job arrived
    deferred: int  # waiting jobs whose adapter does not fit now


def lora_state(running: Iterable[Job], waiting: Iterable[Job], slots: LoraSlots) -> LoraState:
    """``adapters`` are the keys of vLLM's ``LoRARequestStates.requests``
    (``vllm/v1/metrics/stats.py:672-704``), filled as requests are queued and emptied as
    they finish.  ``deferred`` is vLLM's ``num_skipped_waiting_reqs`` (the requests the
    scheduler skipped and has not admitted since, ``scheduler.py:1053-1060,3288-3292``),
    counted from the adapters now rather than remembered."""
    waiting = [job for job in waiting if job.state is JobState.WAITING]
    deferred = sum(1 for job in waiting if job.lora is not None and not slots.fits(job.lora))
    return LoraState(_adapters_in_flight([*running, *waiting]), deferred)


def _adapters_in_flight(jobs: Iterable[Job]) -> tuple[str, ...]:
    first: dict[str, float] = {}
    for job in jobs:
        adapter = job.lora
        if adapter is not None and job.state in _IN_FLIGHT and job.arrival_time < first.get(adapter, math.inf):
            first[adapter] = job.arrival_time
    return tuple(sorted(first, key=first.__getitem__))
