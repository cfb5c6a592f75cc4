"""The engine: running slots, the waiting queue, and when each job's tokens are due.

Sans-I/O and clock-injected: every method takes ``now`` (seconds on the caller's
clock) and nothing here sleeps, spawns or does I/O.  One task drives it::

    engine.set_wakeup(wake_event.set)
    engine.set_step_quantum(0.002)  # optional: coalesce steps onto a 2 ms grid
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
one step are what the server flushes together.

The step quantum.  Every distinct deadline would be a step of its own: with thousands
of jobs at random phases, that is thousands of tiny steps per second, each one waking
the writers of many connections.  :meth:`Engine.set_step_quantum` puts steps on a grid
instead: a token due at ``d`` is handed out at the first grid time at or after ``d``
(never before it), so one step serves every job due within one grid interval, and the
driver wakes at most once per interval.  Deadlines themselves stay exact and chained,
so the rounding never accumulates.  The grid interval divides the inter-token latency
(20 ms with a 2 ms target: exactly 2 ms), so without jitter every token of a job is
late by the same amount and the client sees the configured ITL exactly; TTFT is late by
less than one interval (half of it on average).  Tokens already due (zero latency,
catching up, a resume) are never held back for the grid.  Without a quantum (the
default) every deadline is its own step time, exactly.

The schedule.  Jobs wait in buckets keyed by their step time (a heap of the distinct
step times and a dict from step time to a list of jobs); jobs due at once wait in the
ready list.  A job has at most one live entry: the one in the bucket named by
``job.slot``.  An entry whose job has moved on (cancelled, finished, paused,
rescheduled) is stale and skipped when its bucket comes up.  With a quantum, the
per-token cost is a list append into a bucket that usually exists already.
"""

from __future__ import annotations

import heapq
import math
import random
from bisect import bisect_left
from collections import deque
from collections.abc import Callable

from llmsim.engine.errors import QueueFullError, QueueLimit
from llmsim.engine.grid import GRID_TOLERANCE, step_grid
from llmsim.engine.job import Job, JobState
from llmsim.engine.kv_cache import BlockPool
from llmsim.engine.latency import LatencyModel
from llmsim.engine.lora import LoraSlots, LoraState, lora_state
from llmsim.engine.metrics import EngineMetrics
from llmsim.engine.pause import ABORT, PauseState, end, shift_deadlines
from llmsim.engine.prefill import ChunkedPrefill
from llmsim.engine.statistics import LATE_STEP_THRESHOLD, EngineStatistics
from llmsim.options import EngineOptions, LatencyOptions

__all__ = ["MAX_TOKENS_PER_STEP", "Engine"]

#: Most tokens one job receives in one step when it is catching up.
MAX_TOKENS_PER_STEP = 16
#: ``job.slot`` of a job waiting in the ready list (due at the next step).
_READY = -math.inf
_PREFILL = JobState.PREFILL
_DECODING = JobState.DECODING
_FINISHED = JobState.FINISHED


class Engine:
    """Admits, queues, cancels and paces :class:`~llmsim.engine.job.Job` objects.

    ``rng`` drives latency jitter (``llmsim.app.build_engine`` seeds it from ``--seed``);
    ``metrics`` records vLLM's request statistics from the engine's events (a fresh one,
    bucketed for the default context window, if not given).  With ``kv_cache``, a job is
    admitted only once the pool holds its blocks, and its prefix hit is not prefilled.
    """

    def __init__(
        self,
        options: EngineOptions,
        latency: LatencyOptions,
        *,
        rng: random.Random | None = None,
        metrics: EngineMetrics | None = None,
        kv_cache: BlockPool | None = None,
    ) -> None:
        self._options = options
        self._kv = kv_cache
        self.metrics = metrics if metrics is not None else EngineMetrics()
        self._latency = LatencyModel.from_options(latency, options.max_num_seqs)
        self._prefill = ChunkedPrefill(options.batched_token_budget, latency.inter_token_latency)
        self._rng = rng if rng is not None else random.Random()
        self._wakeup: Callable[[], None] | None = None
        # Waiting jobs in FIFO order; cancelled ones stay until they reach the front
        # (or the next compaction), so cancelling is O(1) even with a long queue.
        self._waiting: deque[Job] = deque()
        self._waiting_count = 0
        self._loras = LoraSlots(options.max_loras)  # vLLM's max_loras rule (llmsim/engine/lora.py)
        # (submitted, finished + cancelled) when no waiting job could be admitted (every one's
        # adapter skipped, or the head's KV blocks do not fit): nothing changes until one of them does.
        self._blocked: tuple[int, int] | None = None
        self._running = 0
        self._decoding = 0
        # The schedule (see the module docstring).
        self._ready: list[Job] = []
        self._ready_time = math.inf  # earliest deadline in the ready list
        self._buckets: dict[float, list[Job]] = {}
        self._times: list[float] = []  # heap of the keys of _buckets
        # While a step runs: its ``now``.  Whatever becomes due by then waits in the
        # ready list for the next step, so that no job is handled twice in one step.
        self._horizon = -math.inf
        self._quantum_target = 0.0
        self._grid = 0.0
        self._inverse_grid = 0.0
        self._fixed_itl: float | None = None
        self._configure()
        # Sleep mode (see llmsim/engine/pause.py).
        self._pause_state = PauseState.UNPAUSED
        self._paused_at = 0.0  # when PAUSED_ALL began
        # The jobs holding a slot, in admission order: a paused job, or one in chunked
        # prefill, has no entry in the schedule, and abort_all must find it.
        self._admitted: dict[Job, None] = {}
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
    def options(self) -> EngineOptions:
        """Slots, queue length and step budget, as last configured."""
        return self._options

    @property
    def step_quantum(self) -> float:
        """The grid interval steps are put on (seconds); 0 when every deadline is its own step."""
        return self._grid

    def reconfigure(self, options: EngineOptions, latency: LatencyOptions) -> None:
        """Use these options for every decision from now on.

        Deadlines already scheduled stay; new TTFTs, ITLs, load factors, slot and
        queue limits and prefill budgets follow the new values (and so does the step
        grid, which divides the inter-token latency).  Extra slots fill at the next
        step or submit.
        """
        self._options = options
        self._loras.max_loras, self._blocked = options.max_loras, None
        self._latency = LatencyModel.from_options(latency, options.max_num_seqs)
        self._prefill.reconfigure(options.batched_token_budget, latency.inter_token_latency)
        self._configure()

    def set_step_quantum(self, target: float) -> None:
        """Coalesce steps onto a grid of about ``target`` seconds (see the module
        docstring; :func:`step_grid` picks the interval).  Applies to tokens scheduled
        from now on; ``0`` restores exact steps at every deadline."""
        self._quantum_target = target
        self._configure()

    def set_wakeup(self, callback: Callable[[], None]) -> None:
        """``callback()`` runs (synchronously) whenever :meth:`submit`, :meth:`resume`,
        :meth:`cancel` or :meth:`set_pause_state` makes :meth:`next_deadline` earlier, so the driver can stop
        sleeping.  It must not block or call back into the engine."""
        self._wakeup = callback

    def _configure(self) -> None:
        latency = self._latency.options
        self._grid = step_grid(latency.inter_token_latency, self._quantum_target)
        self._inverse_grid = 1.0 / self._grid if self._grid else 0.0
        # The per-token path skips the latency model when every ITL is the same.
        constant_factor = latency.time_factor_under_load == 1.0 or self._options.max_num_seqs <= 1
        if constant_factor and (latency.inter_token_latency_std_dev <= 0.0 or latency.inter_token_latency <= 0.0):
            self._fixed_itl = latency.inter_token_latency
        else:
            self._fixed_itl = None

    # --- the caller's side -------------------------------------------------------------

    def check_admission(self, count: int) -> None:
        """Refuse a request of ``count`` jobs up front if it would take the jobs in
        flight (running plus waiting) beyond ``max_num_queued_reqs`` (vLLM's
        ``AsyncLLM.check_admission``, ``vllm/v1/engine/async_llm.py:325-369``: a request
        with ``n`` choices counts ``n``).  Without that cap it accepts everything.
        The caller checks before it submits, so that the refusal comes before any job
        is queued (and before a stream's first byte); :meth:`submit` does not check it.

        Raises:
            QueueFullError: with ``QueueLimit.QUEUED_REQUESTS``; nothing changed.
        """
        cap = self._options.max_num_queued_reqs
        if cap is not None and self._running + self._waiting_count + count > cap:
            self.metrics.admission_rejected("max_num_queued_reqs")
            raise QueueFullError(QueueLimit.QUEUED_REQUESTS)

    def submit(self, job: Job, now: float) -> None:
        """Admit ``job`` if a slot is free and nobody waits, else queue it (FIFO).

        Raises:
            QueueFullError: with ``QueueLimit.WAITING_QUEUE_LENGTH``: the waiting
                queue is full (``max_waiting_queue_length``, llm-d-inference-sim's
                limit); ``job`` is now REJECTED and nothing else changed.
            ValueError: ``job`` was submitted (or cancelled) before.
        """
        if job.state is not JobState.NEW:
            raise ValueError(f"{job!r} was already submitted or cancelled; build a new Job for each submission")
        before = self.next_deadline()
        job.arrival_time = now
        self._submitted += 1
        if self._kv is not None:
            job.kv_prompt = self._kv.prompt(job.prompt_token_ids, lora_name=job.lora)
        free = self._waiting_count == 0 and self._running < self._options.max_num_seqs
        free = free and (job.lora is None or self._loras.fits(job.lora))
        if free and self._pause_state is PauseState.UNPAUSED and self._allocate(job):
            self._admit(job, now)
        elif self._waiting_count >= self._options.max_waiting_queue_length:
            job.state = JobState.REJECTED
            job.finish_time = now
            self._rejected += 1
            raise QueueFullError(QueueLimit.WAITING_QUEUE_LENGTH)
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
        job.slot = None
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
        ``max(job.deadline, now)`` (while the engine is frozen, at the freeze's start at the
        latest: the wake-up shifts it by the frozen time).  A no-op for jobs not paused."""
        if job is self._callback_job:
            self._callback_resumed = True
            return
        if not job.paused or job.state is not JobState.DECODING:
            return
        before = self.next_deadline()
        job.paused = False
        frozen = self._pause_state is PauseState.PAUSED_ALL
        self._schedule(job, max(job.deadline, self._paused_at if frozen else now), now)
        self._wake_if_earlier(before)

    def next_deadline(self) -> float:
        """Absolute time of the next step (the next due deadline, or with a step
        quantum the grid time it rounds up to); ``math.inf`` when nothing is due
        (or while paused with :attr:`PauseState.PAUSED_ALL`)."""
        if self._pause_state is PauseState.PAUSED_ALL:
            return math.inf
        first = math.inf
        if self._ready:
            if _live(self._ready, _READY):
                first = self._ready_time
            else:
                self._ready_time = math.inf
        times = self._times
        buckets = self._buckets
        while times:
            time = times[0]
            if _live(buckets[time], time):
                if time < first:
                    first = time
                break
            heapq.heappop(times)
            del buckets[time]
        period_end = self._prefill.next_period_end
        return period_end if period_end < first else first

    def step(self, now: float) -> None:
        """Do everything due at or before ``now``, calling the jobs' sinks (nothing
        while paused with :attr:`PauseState.PAUSED_ALL`)."""
        if self._pause_state is PauseState.PAUSED_ALL:
            return
        generated_before = self._generated_tokens
        earliest = math.inf
        if self._prefill.next_period_end <= now:
            earliest = self._prefill.next_period_end
            for job, prefilled_at in self._prefill.run_due(now, self._decoding):
                self._schedule(job, max(job.deadline, prefilled_at), now)
        self._horizon = now
        try:
            if self._ready:
                ready, ready_time = self._ready, self._ready_time
                if ready_time < earliest:
                    earliest = ready_time
                self._ready = []
                self._ready_time = math.inf
                self._run(ready, _READY, now, ready_time)
            times = self._times
            buckets = self._buckets
            while times and times[0] <= now:
                time = heapq.heappop(times)
                if time < earliest:
                    earliest = time
                self._run(buckets.pop(time), time, now, time)
        finally:
            self._horizon = -math.inf
            self.metrics.step_done(self._generated_tokens - generated_before)
        self._fill_slots(now)
        if earliest != math.inf:
            self._record_step(now - earliest)

    # --- sleep mode (llmsim/engine/pause.py) -------------------------------------------------

    @property
    def pause_state(self) -> PauseState:
        return self._pause_state

    def set_pause_state(self, state: PauseState, now: float) -> None:
        """vLLM's ``Scheduler.set_pause_state``: while paused, waiting jobs are not
        admitted; PAUSED_ALL also stops every step, and leaving it shifts the
        deadlines by the time it lasted (see :mod:`llmsim.engine.pause`)."""
        previous, self._pause_state = self._pause_state, state
        if state is PauseState.PAUSED_ALL and previous is not state:
            self._paused_at = now
        elif previous is PauseState.PAUSED_ALL and state is not previous:
            self._prefill.next_period_end += now - self._paused_at
            scheduled = shift_deadlines(list(self._admitted), now - self._paused_at)
            self._ready, self._ready_time, self._buckets, self._times = [], math.inf, {}, []
            for job in scheduled:
                self._schedule(job, job.deadline, now)
        if state is PauseState.UNPAUSED:
            self._fill_slots(now)
        self._wake_if_earlier(math.inf)

    def abort_all(self, now: float, reason: str = ABORT) -> int:
        """End every unfinished job (running or waiting) at once with ``reason``, as
        vLLM's ``pause_scheduler(mode="abort")`` does (``vllm/v1/engine/core.py:2209-2213``).
        Each one counts as finished and gets its last sink call, FINISHED, with no new
        tokens.  Returns how many jobs ended."""
        jobs = [*self._admitted, *(job for job in self._waiting if job.state is JobState.WAITING)]
        self._waiting.clear()
        self._waiting_count = 0
        for job in jobs:
            if job.state is _PREFILL:
                self._prefill.discard(job)
            if job.state is not JobState.WAITING:
                self._release(job, decoding=job.state is _DECODING)
            end(job, reason, now)
            self._finished += 1
            self.metrics.aborted(job, now)
        for job in jobs:
            job.sink.on_output(job, job.emitted, job.emitted, now)
        return len(jobs)

    def clear_kv_cache(self) -> None:
        """Forget every cached block (sleep at level >= 1: ``vllm/v1/engine/core.py:1007``);
        running jobs keep the blocks they hold."""
        if self._kv is not None:
            self._kv.clear()

    @property
    def kv_cache_usage(self) -> float:
        """The fraction of KV blocks held by jobs (0 without a KV cache)."""
        return 0.0 if self._kv is None else self._kv.usage

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

    def lora_state(self) -> LoraState:
        """The adapters of the waiting and running jobs, and the jobs waiting for one."""
        return lora_state(self._admitted, self._waiting, self._loras)

    # --- admission -----------------------------------------------------------------------

    def _fill_slots(self, now: float) -> None:
        """Admit waiting jobs, oldest first, while slots are free; one whose LoRA adapter does not
        fit keeps its place (vllm/v1/core/sched/scheduler.py:1091-1101), the rest may pass it; one
        whose KV blocks do not fit stops admission until blocks are freed."""
        if self._pause_state is not PauseState.UNPAUSED or not self._waiting_count:
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
                if not self._allocate(job):  # FCFS: nothing passes it (sched/scheduler.py:1454-1461)
                    waiting.appendleft(job)
                    kv_blocked = True
                    break
                self._waiting_count -= 1
                self._admit(job, max(now, job.arrival_time))
        if skipped:
            waiting.extendleft(reversed(skipped))
        all_skipped = skipped and self._waiting_count == len(skipped)
        blocked = all_skipped or kv_blocked
        self._blocked = (self._submitted, self._finished + self._cancelled) if blocked else None

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
        job.state = JobState.PREFILL
        job.admitted_time = now
        self._loras.add(job)
        self.metrics.admitted(job)
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
            self._schedule(job, job.deadline, now)

    def _release(self, job: Job, *, decoding: bool) -> None:
        del self._admitted[job]
        if self._kv is not None:
            self._kv.free(job)
        self._running -= 1
        if decoding:
            self._decoding -= 1

    def _compact_waiting(self) -> None:
        """Drop cancelled jobs from the queue once they outnumber the live ones."""
        if len(self._waiting) > 2 * self._waiting_count + 64:
            self._waiting = deque(job for job in self._waiting if job.state is JobState.WAITING)

    # --- pacing ----------------------------------------------------------------------------

    def _schedule(self, job: Job, deadline: float, now: float) -> None:
        """Make ``deadline`` the job's next due time and give it its one live entry.
        (The per-token path in :meth:`_run` does the same, inlined.)"""
        job.deadline = deadline
        horizon = self._horizon if self._horizon > now else now
        if deadline <= horizon:
            time = _READY
        elif self._grid:
            time = math.ceil(deadline * self._inverse_grid - GRID_TOLERANCE) * self._grid
            if time <= horizon:
                time = _READY
        else:
            time = deadline
        if job.slot == time:
            if time == _READY and deadline < self._ready_time:
                self._ready_time = deadline
            return  # its entry is there already (a resume before the step came)
        job.slot = time
        if time == _READY:
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

    def _run(self, jobs: list[Job], time: float, now: float, due: float) -> None:
        """Advance every live job of one bucket (or of the ready list, due since
        ``due``): hand each one every token due by ``now`` (up to the per-step cap),
        give it its next entry, and call its sink.

        This is the per-token path, hence one loop with everything inlined (what
        :meth:`_schedule` does, among others) and the engine's fields in locals.
        """
        grid = self._grid
        inverse_grid = self._inverse_grid
        fixed_itl = self._fixed_itl
        buckets = self._buckets
        metrics = self.metrics
        itl_histogram = metrics.inter_token_latency
        itl_bounds, itl_counts = itl_histogram.bounds, itl_histogram.counts
        itl_sum = 0.0
        done = 0
        generated = 0
        try:
            for job in jobs:
                done += 1
                if job.slot != time:
                    continue  # stale: the job moved on
                if job.paused:
                    job.slot = None  # consumed: resume gives it a new entry
                    continue
                if job.state is _PREFILL:
                    self._start_decoding(job, now)
                start = job.emitted
                if start:  # one inter-token latency per output, however many tokens it carries
                    itl = now - job.last_token_time
                    itl_counts[bisect_left(itl_bounds, itl)] += 1
                    itl_sum += itl
                job.last_token_time = now
                total = len(job.output)
                deadline = job.deadline
                # How many tokens are due, and the deadline that follows: the next
                # token's when some remain, else the last emitted token's.
                remaining = total - start
                if remaining <= 0:
                    count = 0
                elif remaining == 1:
                    count = 1
                elif fixed_itl is not None:
                    count = 1
                    while True:
                        deadline += fixed_itl
                        if deadline > now or count == MAX_TOKENS_PER_STEP:
                            break
                        count += 1
                        if count == remaining:
                            break
                else:
                    count, deadline = self._due_tokens(deadline, now, remaining)
                stop = start + count
                job.emitted = stop
                generated += count
                if stop == total:
                    job.state = _FINISHED
                    job.finish_time = now
                    job.slot = None
                    self._finished += 1
                    self._running -= 1
                    self._decoding -= 1
                    del self._admitted[job]
                    if self._kv is not None:
                        self._kv.free(job)
                    metrics.finished(job, now)
                    if self._waiting_count:
                        self._fill_slots(deadline)
                else:
                    # The next entry.  ``now`` is this step's: whatever is due by then
                    # waits in the ready list for the next step.
                    job.deadline = deadline
                    if deadline > now:
                        if grid:
                            slot = math.ceil(deadline * inverse_grid - GRID_TOLERANCE) * grid
                            if slot <= now:  # a hair below this step's grid time
                                slot = _READY
                        else:
                            slot = deadline
                    else:
                        slot = _READY
                    job.slot = slot
                    if slot == _READY:
                        self._ready.append(job)
                        if deadline < self._ready_time:
                            self._ready_time = deadline
                    else:
                        bucket = buckets.get(slot)
                        if bucket is None:
                            buckets[slot] = [job]
                            heapq.heappush(self._times, slot)
                        else:
                            bucket.append(job)
                self._callback_job = job
                self._callback_resumed = False
                try:
                    keep_going = job.sink.on_output(job, start, stop, now)
                finally:
                    self._callback_job = None
                if not keep_going and not self._callback_resumed and job.state is _DECODING:
                    job.paused = True
        except BaseException:
            # A sink raised: the rest of this bucket is still due.
            rest = jobs[done:]
            if rest:
                if time == _READY:
                    self._ready[:0] = rest
                    self._ready_time = min(self._ready_time, due)
                else:
                    buckets[time] = rest
                    heapq.heappush(self._times, time)
            raise
        finally:
            self._generated_tokens += generated
            itl_histogram.sum += itl_sum

    def _due_tokens(self, deadline: float, now: float, remaining: int) -> tuple[int, float]:
        """The catch-up loop of :meth:`_run` with jittered or load-scaled ITLs."""
        latency = self._latency
        factor = latency.load_factor(self._running)
        rng = self._rng
        count = 1
        while True:
            deadline += latency.inter_token_latency(rng, factor)
            if deadline > now or count == MAX_TOKENS_PER_STEP:
                break
            count += 1
            if count == remaining:
                break
        return count, deadline

    def _start_decoding(self, job: Job, now: float) -> None:
        job.state = JobState.DECODING
        job.first_token_time = now
        job.prefilled_tokens = job.prompt_tokens
        self._decoding += 1
        self._prompt_tokens += job.prompt_tokens
        self.metrics.first_token(job, now)

    # --- bookkeeping ---------------------------------------------------------------------

    def _wake_if_earlier(self, before: float) -> None:
        if self._wakeup is not None and self._horizon == -math.inf and self.next_deadline() < before:
            self._wakeup()

    def _record_step(self, lateness: float) -> None:
        self._steps += 1
        if lateness > LATE_STEP_THRESHOLD:
            self._late_steps += 1
        if lateness > self._max_lateness:
            self._max_lateness = lateness


def _live(jobs: list[Job], time: float) -> bool:
    """True if ``jobs`` (the bucket for ``time``) holds a live entry; drops the stale
    entries in front of the first live one (a paused job's entry is consumed as a step
    would: :meth:`Engine.resume` gives it a new one)."""
    for index, job in enumerate(jobs):
        if job.slot == time:
            if not job.paused:
                if index:
                    del jobs[:index]
                return True
            job.slot = None
    jobs.clear()
    return False
