"""The engine: running slots, the waiting queue, and when each job's tokens are due.

Sans-I/O and clock-injected: every method takes ``now`` (seconds on the caller's
clock) and nothing here sleeps, spawns or does I/O.  One task drives it::

    engine.set_wakeup(wake_event.set)
    while True:
        deadline = engine.next_deadline()
        ... sleep until ``deadline`` or until the wakeup callback fires ...
        engine.step(current_time())

Timing model.  A job admitted at ``t_a`` gets its first token at ``t_a + TTFT`` (TTFT
from :class:`~llmsim.engine.latency.LatencyModel`, with the load factor at admission;
chunked prefill may delay it, see :mod:`llmsim.engine.prefill`).  Token *i+1* is due
at ``deadline_i + ITL_i``, ITL taken with the load factor when token *i* is emitted.
Deadlines are absolute and chained from the previous *deadline*, never from the time
the step actually ran, so a late step does not push later tokens back: the job catches
up by emitting every due token at once, at most :data:`MAX_TOKENS_PER_STEP` per job
per step (the rest are due again at once, in the next step).

One :meth:`Engine.step` handles every job due at or before ``now``; the sink calls of
one step are what the server flushes together.  Jobs are kept in a heap of
``(deadline, schedule_id, job)``; an entry whose ``schedule_id`` no longer matches the
job's (cancelled, paused, rescheduled) is stale and skipped when it surfaces.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable

import attrs

from llmsim.config import Config
from llmsim.engine.errors import QueueFullError
from llmsim.engine.job import Job, JobState
from llmsim.engine.latency import LatencyModel
from llmsim.engine.prefill import ChunkedPrefill

__all__ = ["Engine", "EngineStatistics", "MAX_TOKENS_PER_STEP", "LATE_STEP_THRESHOLD"]

#: Most tokens one job receives in one step when it is catching up.
MAX_TOKENS_PER_STEP = 16
#: A step that starts this much after its earliest due deadline counts as late.
LATE_STEP_THRESHOLD = 0.001

_HeapEntry = tuple[float, int, Job]


@attrs.frozen
class EngineStatistics:
    """A snapshot of the engine's counters (see :meth:`Engine.statistics`).

    ``submitted`` counts every :meth:`Engine.submit` call, so it always equals
    ``running + waiting + finished + cancelled + rejected``.  ``prompt_tokens`` counts
    the prompts of jobs whose prefill completed (cached tokens included, as vLLM's
    ``prompt_tokens_total``).  ``steps`` counts steps that had something due;
    ``late_steps`` those that ran more than :data:`LATE_STEP_THRESHOLD` after their
    earliest due deadline, and ``max_lateness`` is the worst such delay (seconds).
    """

    running: int
    waiting: int
    submitted: int
    finished: int
    cancelled: int
    rejected: int
    generated_tokens: int
    prompt_tokens: int
    steps: int
    late_steps: int
    max_lateness: float


class Engine:
    """Admits, queues, cancels and paces :class:`~llmsim.engine.job.Job` objects.

    ``rng`` drives latency jitter; by default it is seeded from ``config.seed``.
    """

    def __init__(self, config: Config, *, rng: random.Random | None = None) -> None:
        self._config = config
        self._latency = LatencyModel.from_config(config)
        self._prefill = ChunkedPrefill(config)
        self._rng = rng if rng is not None else random.Random(config.seed)
        self._wakeup: Callable[[], None] | None = None
        # Waiting jobs in FIFO order; cancelled ones stay until they reach the front
        # (or the next compaction), so cancelling is O(1) even with a long queue.
        self._waiting: deque[Job] = deque()
        self._waiting_count = 0
        self._running = 0
        self._decoding = 0
        self._heap: list[_HeapEntry] = []
        # While a step runs, new heap entries wait here so that no job is handled
        # twice in one step; the step pushes them when it ends.
        self._deferred: list[_HeapEntry] | None = None
        self._last_schedule_id = 0
        self._callback_job: Job | None = None
        self._callback_resumed = False
        self._submitted = 0
        self._finished = 0
        self._cancelled = 0
        self._rejected = 0
        self._generated_tokens = 0
        self._prompt_tokens = 0
        self._steps = 0
        self._late_steps = 0
        self._max_lateness = 0.0

    # --- configuration -----------------------------------------------------------------

    @property
    def config(self) -> Config:
        return self._config

    def reconfigure(self, config: Config) -> None:
        """Use ``config`` for every decision from now on.

        Deadlines already scheduled stay; new TTFTs, ITLs, load factors, slot and
        queue limits and prefill budgets follow the new values.  Extra slots fill at
        the next step or submit.
        """
        self._config = config
        self._latency = LatencyModel.from_config(config)
        self._prefill.reconfigure(config)

    def set_wakeup(self, callback: Callable[[], None]) -> None:
        """``callback()`` runs (synchronously) whenever :meth:`submit`, :meth:`resume` or
        :meth:`cancel` makes :meth:`next_deadline` earlier, so the driver can stop
        sleeping.  It must not block or call back into the engine."""
        self._wakeup = callback

    # --- the caller's side -------------------------------------------------------------

    def submit(self, job: Job, now: float) -> None:
        """Admit ``job`` if a slot is free and nobody waits, else queue it (FIFO).

        Raises:
            QueueFullError: the waiting queue is full; ``job`` is now REJECTED and
                nothing else changed.
            ValueError: ``job`` was submitted (or cancelled) before.
        """
        if job.state is not JobState.NEW:
            raise ValueError(f"{job!r} was already submitted or cancelled; build a new Job for each submission")
        before = self.next_deadline()
        job.arrival_time = now
        self._submitted += 1
        if self._waiting_count == 0 and self._running < self._config.max_num_seqs:
            self._admit(job, now)
        elif self._waiting_count >= self._config.max_waiting_queue_length:
            job.state = JobState.REJECTED
            job.finish_time = now
            self._rejected += 1
            raise QueueFullError()
        else:
            job.state = JobState.WAITING
            self._waiting.append(job)
            self._waiting_count += 1
            self._fill_slots(now)
        self._wake_if_earlier(before)

    def cancel(self, job: Job, now: float) -> None:
        """Take ``job`` out at once: its queue position or its slot is freed in this call
        (and the next waiting job admitted at ``now``).  Later steps never touch it.

        Idempotent; a no-op for jobs already finished, cancelled or rejected.  A job
        never submitted just becomes CANCELLED (and :meth:`submit` then refuses it).
        """
        previous = job.state
        if previous in (JobState.FINISHED, JobState.CANCELLED, JobState.REJECTED):
            return
        job.state = JobState.CANCELLED
        job.finish_time = now
        job.paused = False
        job.schedule_id = 0
        if previous is JobState.NEW:
            return
        self._cancelled += 1
        if previous is JobState.WAITING:
            self._waiting_count -= 1
            self._compact_waiting()
            return
        before = self.next_deadline()
        if previous is JobState.PREFILL:
            self._prefill.discard(job)
        self._release(job, decoding=previous is JobState.DECODING)
        self._fill_slots(now)
        self._wake_if_earlier(before)

    def resume(self, job: Job, now: float) -> None:
        """Un-pause ``job`` (its sink returned False): its next token is due at
        ``max(job.deadline, now)``.  A no-op for jobs that are not paused."""
        if job is self._callback_job:
            self._callback_resumed = True
            return
        if not job.paused or job.state is not JobState.DECODING:
            return
        before = self.next_deadline()
        job.paused = False
        self._schedule(job, max(job.deadline, now))
        self._wake_if_earlier(before)

    def next_deadline(self) -> float:
        """Absolute time of the next due event; ``math.inf`` when nothing is due."""
        heap = self._heap
        while heap and heap[0][2].schedule_id != heap[0][1]:
            heapq.heappop(heap)
        first_token = heap[0][0] if heap else math.inf
        return min(first_token, self._prefill.next_period_end)

    def step(self, now: float) -> None:
        """Do everything due at or before ``now``, calling the jobs' sinks."""
        earliest = math.inf
        if self._prefill.next_period_end <= now:
            earliest = self._prefill.next_period_end
            for job, prefilled_at in self._prefill.run_due(now, self._decoding):
                self._schedule(job, max(job.deadline, prefilled_at))
        self._deferred = []
        try:
            heap = self._heap
            while heap and heap[0][0] <= now:
                deadline, schedule_id, job = heapq.heappop(heap)
                if job.schedule_id != schedule_id:
                    continue
                earliest = min(earliest, deadline)
                self._advance(job, now)
        finally:
            deferred, self._deferred = self._deferred, None
            for entry in deferred:
                heapq.heappush(self._heap, entry)
        self._fill_slots(now)
        if earliest != math.inf:
            self._record_step(now - earliest)

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(
            running=self._running,
            waiting=self._waiting_count,
            submitted=self._submitted,
            finished=self._finished,
            cancelled=self._cancelled,
            rejected=self._rejected,
            generated_tokens=self._generated_tokens,
            prompt_tokens=self._prompt_tokens,
            steps=self._steps,
            late_steps=self._late_steps,
            max_lateness=self._max_lateness,
        )

    # --- admission -----------------------------------------------------------------------

    def _fill_slots(self, now: float) -> None:
        """Admit waiting jobs, oldest first, while slots are free."""
        waiting = self._waiting
        while self._waiting_count and self._running < self._config.max_num_seqs:
            job = waiting.popleft()
            if job.state is JobState.WAITING:
                self._waiting_count -= 1
                self._admit(job, max(now, job.arrival_time))

    def _admit(self, job: Job, now: float) -> None:
        self._running += 1
        job.state = JobState.PREFILL
        job.admitted_time = now
        if job.remote_prefill:
            job.prefilled_tokens = job.prompt_tokens
        else:
            job.prefilled_tokens = min(max(job.cached_tokens, 0), job.prompt_tokens)
        ttft = self._latency.time_to_first_token(
            self._rng,
            prompt_tokens=job.prompt_tokens,
            cached_tokens=job.cached_tokens,
            remote_prefill=job.remote_prefill,
            factor=self._latency.load_factor(self._running),
        )
        job.deadline = now + ttft
        if self._prefill.enabled and job.prefilled_tokens < job.prompt_tokens:
            self._prefill.add(job, now)
        else:
            self._schedule(job, job.deadline)

    def _release(self, job: Job, *, decoding: bool) -> None:
        self._running -= 1
        if decoding:
            self._decoding -= 1

    def _compact_waiting(self) -> None:
        """Drop cancelled jobs from the queue once they outnumber the live ones."""
        if len(self._waiting) > 2 * self._waiting_count + 64:
            self._waiting = deque(job for job in self._waiting if job.state is JobState.WAITING)

    # --- pacing ----------------------------------------------------------------------------

    def _schedule(self, job: Job, deadline: float) -> None:
        self._last_schedule_id += 1
        job.schedule_id = self._last_schedule_id
        job.deadline = deadline
        entry = (deadline, job.schedule_id, job)
        if self._deferred is not None:
            self._deferred.append(entry)
        else:
            heapq.heappush(self._heap, entry)

    def _advance(self, job: Job, now: float) -> None:
        """Hand ``job`` every token due by ``now`` (up to the per-step cap)."""
        if job.state is JobState.PREFILL:
            self._start_decoding(job, now)
        start = job.emitted
        count, deadline = self._due_tokens(job, now, len(job.output) - start)
        stop = start + count
        job.emitted = stop
        self._generated_tokens += count
        finished = stop == len(job.output)
        if finished:
            job.state = JobState.FINISHED
            job.finish_time = now
            self._finished += 1
            self._release(job, decoding=True)
            self._fill_slots(deadline)
        else:
            self._schedule(job, deadline)
        self._callback_job = job
        self._callback_resumed = False
        try:
            keep_going = job.sink.on_output(job, start, stop, now)
        finally:
            self._callback_job = None
        if not keep_going and not self._callback_resumed and job.state is JobState.DECODING:
            job.paused = True
            job.schedule_id = 0

    def _due_tokens(self, job: Job, now: float, remaining: int) -> tuple[int, float]:
        """How many of the ``remaining`` tokens are due, and the deadline that follows:
        the next token's when some remain, else the last emitted token's."""
        deadline = job.deadline
        if remaining <= 0:
            return 0, deadline
        factor = self._latency.load_factor(self._running)
        count = 1
        while count < remaining:
            deadline += self._latency.inter_token_latency(self._rng, factor)
            if deadline > now or count == MAX_TOKENS_PER_STEP:
                break
            count += 1
        return count, deadline

    def _start_decoding(self, job: Job, now: float) -> None:
        job.state = JobState.DECODING
        job.first_token_time = now
        job.prefilled_tokens = job.prompt_tokens
        self._decoding += 1
        self._prompt_tokens += job.prompt_tokens

    # --- bookkeeping ---------------------------------------------------------------------

    def _wake_if_earlier(self, before: float) -> None:
        if self._wakeup is not None and self._deferred is None and self.next_deadline() < before:
            self._wakeup()

    def _record_step(self, lateness: float) -> None:
        self._steps += 1
        if lateness > LATE_STEP_THRESHOLD:
            self._late_steps += 1
        self._max_lateness = max(self._max_lateness, lateness)
