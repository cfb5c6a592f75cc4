"""The admission half of the engine: who holds a slot, and who waits for one.

:class:`Admission` is the base of :class:`~llmsim.engine.scheduler.Engine`: the FIFO
waiting queue, the running slots (``max_num_seqs``), the ``max_loras`` adapter slots
(:mod:`llmsim.engine.lora`), the KV blocks a job must hold before it runs
(:mod:`llmsim.engine.kv_cache`), the cache-hit gate that ends a job unadmitted, and the
pause states that hold the queue (:mod:`llmsim.engine.pause`).  When a job has its slot,
:meth:`Admission._first_token_due` (the engine's timing half) decides when its first
token is due.

A base class rather than a component: the per-token path in ``Engine._run`` reads and
updates these counters and the admitted set directly on ``self``, with no extra lookup.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque

from llmsim.engine.errors import QueueFullError, QueueLimit
from llmsim.engine.job import Job, JobState
from llmsim.engine.kv_cache import BlockPool
from llmsim.engine.lora import LoraSlots, LoraState, lora_state
from llmsim.engine.metrics import EngineMetrics
from llmsim.engine.pause import PauseState, end
from llmsim.options import EngineOptions

__all__ = ["CACHE_THRESHOLD", "Admission"]

#: The finish reason of a job whose prefix hit rate was below its ``cache_hit_threshold``.
CACHE_THRESHOLD = "cache_threshold"
_PREFILL = JobState.PREFILL
_UNPAUSED = PauseState.UNPAUSED


class Admission(ABC):
    """The waiting queue and the slots; see the module docstring."""

    def __init__(self, options: EngineOptions, metrics: EngineMetrics | None, kv_cache: BlockPool | None) -> None:
        self._options = options
        self._kv = kv_cache
        self.metrics = metrics if metrics is not None else EngineMetrics()
        # Waiting jobs in FIFO order; cancelled ones stay until they reach the front
        # (or the next compaction), so cancelling is O(1) even with a long queue.
        self._waiting: deque[Job] = deque()
        self._waiting_count = 0
        self._loras = LoraSlots(options.max_loras)  # vLLM's max_loras rule (llmsim/engine/lora.py)
        # (submitted, finished + cancelled) when no waiting job could be admitted (every one's
        # adapter skipped, or the head's KV blocks do not fit): nothing changes until one of them does.
        self._blocked: tuple[int, int] | None = None
        self._running = 0
        # Sleep mode (see llmsim/engine/pause.py).
        self._pause_state = PauseState.UNPAUSED
        self._paused_at = 0.0  # when PAUSED_ALL began
        # The jobs holding a slot, in admission order: a paused job, or one in chunked
        # prefill, has no entry in the schedule, and abort_all must find it.
        self._admitted: dict[Job, None] = {}
        # Jobs ended at admission (below their cache-hit threshold), owed their one sink
        # call at the next step: never from inside submit, before the caller is ready.
        self._ended: list[Job] = []
        self._ended_time = math.inf
        self._submitted = 0
        self._finished = 0
        self._cancelled = 0
        self._rejected = 0

    @property
    def options(self) -> EngineOptions:
        """Slots, queue length and step budget, as last configured."""
        return self._options

    @property
    def pause_state(self) -> PauseState:
        return self._pause_state

    def check_admission(self, count: int) -> None:
        """Refuse a request of ``count`` jobs up front if it would take the jobs in
        flight (running plus waiting) beyond ``max_num_queued_reqs`` (vLLM's
        ``AsyncLLM.check_admission``, ``vllm/v1/engine/async_llm.py:325-369``: a request
        with ``n`` choices counts ``n``).  Without that cap it accepts everything.
        The caller checks before it submits, so that the refusal comes before any job
        is queued (and before a stream's first byte); ``submit`` does not check it.

        Raises:
            QueueFullError: with ``QueueLimit.QUEUED_REQUESTS``; nothing changed.
        """
        cap = self._options.max_num_queued_reqs
        if cap is not None and self._running + self._waiting_count + count > cap:
            self.metrics.admission_rejected("max_num_queued_reqs")
            raise QueueFullError(QueueLimit.QUEUED_REQUESTS)

    def clear_kv_cache(self) -> None:
        """Forget every cached block (sleep at level >= 1: ``vllm/v1/engine/core.py:1007``);
        running jobs keep the blocks they hold."""
        if self._kv is not None:
            self._kv.clear()

    def set_lora_loaded(self, lora: str, loaded: bool) -> None:
        """An adapter was loaded or unloaded: the idle KV blocks of unloaded adapters are
        evicted first (llm-d-inference-sim's ``pickBlockToEvict``)."""
        if self._kv is not None:
            self._kv.set_loaded(lora, loaded)

    @property
    def kv_cache_usage(self) -> float:
        """The fraction of KV blocks held by jobs (0 without a KV cache)."""
        return 0.0 if self._kv is None else self._kv.usage

    def lora_state(self) -> LoraState:
        """The adapters of the waiting and running jobs, and the jobs waiting for one."""
        return lora_state(self._admitted, self._waiting, self._loras)

    def _set_options(self, options: EngineOptions) -> None:
        """New slot, queue and adapter limits; a blocked queue is retried at the next chance."""
        self._options = options
        self._loras.max_loras, self._blocked = options.max_loras, None

    @abstractmethod
    def _first_token_due(self, job: Job, now: float) -> None:
        """Give ``job``, admitted at ``now``, its first deadline (the timing half)."""

    def _admit_now(self, job: Job, now: float) -> bool:
        """``submit``'s fast path: start ``job`` at once if a slot is free, nobody waits
        and nothing is paused; False when it must queue instead."""
        free = self._waiting_count == 0 and self._running < self._options.max_num_seqs
        free = free and (job.lora is None or self._loras.fits(job.lora))
        return free and self._pause_state is _UNPAUSED and self._start(job, now)

    def _enqueue(self, job: Job, now: float) -> None:
        """Queue ``job`` (FIFO), or reject it when the waiting queue is full."""
        if self._waiting_count >= self._options.max_waiting_queue_length:
            job.state = JobState.REJECTED
            job.finish_time = now
            self._rejected += 1
            raise QueueFullError(QueueLimit.WAITING_QUEUE_LENGTH)
        job.state = JobState.WAITING
        self._waiting.append(job)
        self._waiting_count += 1
        self._fill_slots(now)

    def _fill_slots(self, now: float) -> None:
        """Admit waiting jobs, oldest first, while slots are free; one whose LoRA adapter does not
        fit keeps its place (vllm/v1/core/sched/scheduler.py:1091-1101), the rest may pass it; one
        whose KV blocks do not fit stops admission until blocks are freed."""
        if self._pause_state is not _UNPAUSED or not self._waiting_count:
            return  # paused: waiting jobs stay queued
        if self._blocked is not None and self._blocked == (self._submitted, self._finished + self._cancelled):
            return  # nothing could be admitted, and no job has come or gone since
        waiting = self._waiting
        skipped: list[Job] = []
        kv_blocked = False
        while self._waiting_count > len(skipped) and self._running < self._options.max_num_seqs:
            job = waiting.popleft()
            if job.state is JobState.WAITING and job.lora is not None and not self._loras.fits(job.lora):
                skipped.append(job)
            elif job.state is JobState.WAITING:
                if not self._start(job, max(now, job.arrival_time)):  # FCFS: nothing passes it
                    waiting.appendleft(job)  # (sched/scheduler.py:1454-1461)
                    kv_blocked = True
                    break
                self._waiting_count -= 1
        if skipped:
            waiting.extendleft(reversed(skipped))
        all_skipped = skipped and self._waiting_count == len(skipped)
        blocked = all_skipped or kv_blocked
        self._blocked = (self._submitted, self._finished + self._cancelled) if blocked else None

    def _start(self, job: Job, now: float) -> bool:
        """Admit ``job`` at ``now``, or end it there unadmitted when its prefix hit rate is
        below its cache-hit threshold; False, changing nothing, when its KV blocks do not
        fit yet."""
        if job.cache_hit_threshold is not None and self._hit_rate(job) < job.cache_hit_threshold:
            end(job, CACHE_THRESHOLD, now)
            self._finished += 1
            self._ended.append(job)
            self._ended_time = min(self._ended_time, now)
            return True
        if self._kv is not None and not self._allocate(job):
            return False
        self._admit(job, now)
        return True

    def _hit_rate(self, job: Job) -> float:
        """The fraction of ``job``'s prompt the pool holds now (its cached prefix, whole
        blocks), as llm-d-inference-sim rates it (request.go:194-199): 0 without a pool.
        A decode-side job counts its whole prompt, which the prefill pod sends (vLLM's
        threshold counts the connector's external tokens, RFC vllm-project/vllm#24256)."""
        if job.remote_prefill:
            return 1.0
        kv, prompt = self._kv, job.kv_prompt
        if kv is None or prompt is None or not prompt.token_ids:
            return 0.0
        return kv.lookup(prompt) / len(prompt.token_ids)

    def _deliver_ended(self, now: float) -> float:
        """Give each job ended at admission its one sink call (FINISHED, no tokens);
        return when the earliest of them ended (``math.inf``: none)."""
        if not self._ended:
            return math.inf
        ended, earliest = self._ended, self._ended_time
        self._ended, self._ended_time = [], math.inf
        for job in ended:
            job.sink.on_output(job, 0, 0, now)
        return earliest

    def _allocate(self, job: Job) -> bool:
        """Reserve ``job``'s KV blocks (prompt and planned output) and take its prefix hit
        as ``job.cached_tokens``; False, changing nothing, when the pool cannot hold them
        yet.  A job larger than the whole pool runs without blocks rather than wait forever."""
        kv, prompt = self._kv, job.kv_prompt
        if kv is None or prompt is None or not kv.fits_at_all(prompt, len(job.output)):
            return True
        if not kv.allocate(job, prompt, extra_tokens=len(job.output)):
            return False
        job.cached_tokens = kv.cached_tokens(job)
        return True

    def _admit(self, job: Job, now: float) -> None:
        self._running += 1
        self._admitted[job] = None
        job.state = _PREFILL
        job.admitted_time = now
        if job.lora is not None:
            self._loras.add(job)
        self.metrics.admitted(job)
        prompt_tokens = len(job.prompt_token_ids)
        cached = job.cached_tokens
        if job.remote_prefill or cached >= prompt_tokens:
            job.prefilled_tokens = prompt_tokens
        else:  # (the cached tokens, at least 0)
            job.prefilled_tokens = cached if cached > 0 else 0
        self._first_token_due(job, now)

    def _release(self, job: Job) -> None:
        """Give back ``job``'s slot and KV blocks (it finished, was cancelled or aborted)."""
        del self._admitted[job]
        if self._kv is not None:
            self._kv.free(job)
        self._running -= 1

    def _compact_waiting(self) -> None:
        """Drop cancelled jobs from the queue once they outnumber the live ones."""
        if len(self._waiting) > 2 * self._waiting_count + 64:
            self._waiting = deque(job for job in self._waiting if job.state is JobState.WAITING)
