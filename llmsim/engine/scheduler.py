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

The step quantum (:meth:`Engine.set_step_quantum`) puts steps on a grid: a token goes
out at the grid time nearest its deadline; :mod:`llmsim.engine.grid` says how and why.

Who holds a slot and who waits for one is :class:`~llmsim.engine.admission.Admission`'s
part; where each job's next entry waits until its step time, the
:class:`~llmsim.engine.timetable.Timetable`'s.  :class:`Engine` builds on both: the
caller's side, the step, and the per-token path.
"""

from __future__ import annotations

import heapq
import math
import random
from bisect import bisect_left
from collections.abc import Callable

from llmsim.engine.admission import CACHE_THRESHOLD, Admission
from llmsim.engine.grid import grid_reach, step_grid
from llmsim.engine.job import ENDED, Job, JobState
from llmsim.engine.kv_cache import BlockPool
from llmsim.engine.latency import LatencyModel
from llmsim.engine.metrics import EngineMetrics
from llmsim.engine.native_run import install_run
from llmsim.engine.pause import ABORT, PauseState, end, shift_deadlines
from llmsim.engine.prefill import ChunkedPrefill
from llmsim.engine.statistics import LATE_STEP_THRESHOLD, EngineStatistics
from llmsim.engine.timetable import READY, Timetable, is_live
from llmsim.options import EngineOptions, LatencyOptions

__all__ = ["CACHE_THRESHOLD", "MAX_TOKENS_PER_STEP", "PURE_RUN", "Engine"]

#: Most tokens one job receives in one step when it is catching up.
MAX_TOKENS_PER_STEP = 16
_PREFILL = JobState.PREFILL
_DECODING = JobState.DECODING
_FINISHED = JobState.FINISHED
_NEW = JobState.NEW
_PAUSED_ALL = PauseState.PAUSED_ALL


class Engine(Admission, Timetable):
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
        Admission.__init__(self, options, metrics, kv_cache)
        Timetable.__init__(self)
        self._latency = LatencyModel.from_options(latency, options.max_num_seqs)
        self._prefill = ChunkedPrefill(options.batched_token_budget, latency.inter_token_latency)
        self._rng = rng if rng is not None else random.Random()
        self._wakeup: Callable[[], None] | None = None
        self._decoding = 0
        self._quantum_target = 0.0
        self._configure()
        # Mid-step, resume() of a job not paused notes its ``emitted``: one noted as it is in
        # its sink call is not paused by _run when the call returns False.
        self._resumed: dict[Job, int] = {}
        self._generated_tokens = 0
        self._prompt_tokens = 0
        self._steps = 0
        self._late_steps = 0
        self._max_lateness = 0.0
        self._last_step = -math.inf  # the time of the last step()

    # --- configuration -----------------------------------------------------------------

    def reconfigure(self, options: EngineOptions, latency: LatencyOptions) -> None:
        """Use these options for every decision from now on.

        Deadlines already scheduled stay; new TTFTs, ITLs, load factors, slot and
        queue limits and prefill budgets follow the new values (and so does the step
        grid, which divides the inter-token latency).  Extra slots fill at the next
        step or submit.
        """
        self._set_options(options)
        self._latency = LatencyModel.from_options(latency, options.max_num_seqs)
        self._prefill.reconfigure(options.batched_token_budget, latency.inter_token_latency)
        self._configure()

    def set_step_quantum(self, target: float) -> None:
        """Coalesce steps onto a grid of about ``target`` seconds (see
        :mod:`llmsim.engine.grid`; :func:`step_grid` picks the interval).  Applies to tokens scheduled
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
        self._set_grid(step_grid(latency.inter_token_latency, self._quantum_target))

    # --- the caller's side -------------------------------------------------------------

    def submit(self, job: Job, now: float) -> None:
        """Admit ``job`` if a slot is free and nobody waits, else queue it (FIFO).

        ``now`` is the job's arrival time, which may lie a little before the engine's
        last step: the server passes the time its request's first bytes arrived, so
        that the TTFT a client measures does not include reading, parsing and planning
        the request.  The job is admitted as of then (queue time 0 when a slot is free)
        and its first token is due a TTFT later; one already due goes out at the next
        step.

        Raises:
            QueueFullError: with ``QueueLimit.WAITING_QUEUE_LENGTH``: the waiting
                queue is full (``max_waiting_queue_length``, llm-d-inference-sim's
                limit); ``job`` is now REJECTED and nothing else changed.
            ValueError: ``job`` was submitted (or cancelled) before.
        """
        if job.state is not _NEW:
            raise ValueError(f"{job!r} was already submitted or cancelled; build a new Job for each submission")
        before = self.next_deadline()
        job.arrival_time = now
        self._submitted += 1
        if self._kv is not None:
            job.kv_prompt = self._kv.prompt(job.prompt_token_ids, lora_name=job.lora, multimodal=job.kv_multimodal)
        if not self._admit_now(job, now):  # else admitted, or ended by its cache-hit threshold
            self._enqueue(job, now)
        if self._wakeup is not None and self._horizon == -math.inf and self._first_head() < before:
            self._wakeup()

    def cancel(self, job: Job, now: float) -> None:
        """Take ``job`` out at once: its queue position or its slot is freed in this call
        (and the next waiting job admitted at ``now``).  Later steps never touch it.

        Idempotent; a no-op for jobs already finished, cancelled or rejected.  A job
        never submitted just becomes CANCELLED (and :meth:`submit` then refuses it).
        """
        previous = job.state
        if previous in ENDED:
            return
        job.state = JobState.CANCELLED
        job.finish_time = now
        job.paused = False
        job.slot = None
        if previous is _NEW:
            return
        self._cancelled += 1
        if previous is JobState.WAITING:
            self._waiting_count -= 1
            self._compact_waiting()
            return
        before = self.next_deadline()
        self._vacate(job, previous)
        self._fill_slots(now)
        self._wake_if_earlier(before)

    def resume(self, job: Job, now: float) -> None:
        """Un-pause ``job`` (its sink returned False): its next token is due at
        ``max(job.deadline, now)`` (while the engine is frozen, at the freeze's start at the
        latest: the wake-up shifts it by the frozen time).  A no-op for jobs not paused."""
        if not job.paused:
            if self._horizon != -math.inf:  # mid-step: perhaps from inside its own sink call
                self._resumed[job] = job.emitted
            return
        if job.state is not JobState.DECODING:
            return
        before = self.next_deadline()
        job.paused = False
        frozen = self._pause_state is PauseState.PAUSED_ALL
        self._schedule(job, max(job.deadline, self._paused_at if frozen else now), now)
        self._wake_if_earlier(before)

    def next_deadline(self) -> float:
        """Absolute time of the next step (the next due deadline, or with a step
        quantum the grid time nearest it); ``math.inf`` when nothing is due
        (or while paused with :attr:`PauseState.PAUSED_ALL`, but for jobs ended at admission)."""
        if self._pause_state is _PAUSED_ALL:
            return self._ended_time  # jobs ended just before the freeze still get their answer
        first = self._ended_time
        if self._ready:
            if is_live(self._ready, READY):
                first = min(first, self._ready_time)
            else:
                self._ready_time = math.inf
        times = self._times
        buckets = self._buckets
        while times:  # inlined: the driver asks once per step
            time = times[0]
            if is_live(buckets[time], time):
                if time < first:
                    first = time
                break
            if self._horizon != -math.inf:  # asked mid-step (by a sink): _run may be filling it
                first = min(first, self._first_live_time())
                break
            heapq.heappop(times)
            del buckets[time]
        period_end = self._prefill.next_period_end
        return period_end if period_end < first else first

    def step(self, now: float) -> None:
        """Do everything due at or before ``now`` (with a step quantum: every token whose
        grid time has come), calling the jobs' sinks (while paused with
        :attr:`PauseState.PAUSED_ALL`, only the answers of jobs ended at admission)."""
        last_step, self._last_step = self._last_step, now
        earliest = self._deliver_ended(now)
        if self._pause_state is _PAUSED_ALL:
            return
        generated_before = self._generated_tokens
        if self._prefill.next_period_end <= now:
            earliest = min(earliest, self._prefill.next_period_end)
            for job, prefilled_at in self._prefill.run_due(now, self._decoding):
                self._schedule(job, max(job.deadline, prefilled_at), now)
        self._horizon = now
        reach = grid_reach(now, self._grid, self._inverse_grid)
        try:
            if self._ready:
                ready, ready_time = self._ready, self._ready_time
                if ready_time < earliest:
                    earliest = ready_time
                self._ready = []
                self._ready_time = math.inf
                self._run(ready, READY, now, ready_time, reach)
            times = self._times
            buckets = self._buckets
            while times and times[0] <= now:
                time = heapq.heappop(times)
                if time < earliest:
                    earliest = time
                self._run(buckets.pop(time), time, now, time, reach)
        finally:
            self._horizon = -math.inf
            self.metrics.step_done(self._generated_tokens - generated_before)
        self._fill_slots(now)
        if earliest != math.inf:
            # A job submitted with an arrival before the last step could not have been
            # served earlier than this step: its lateness counts from the last step.
            self._record_step(now - max(earliest, last_step))

    # --- sleep mode (llmsim/engine/pause.py) -------------------------------------------------

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
            self._clear_timetable()
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
            if job.state is not JobState.WAITING:
                self._vacate(job, job.state)
            end(job, reason, now)
            self._finished += 1
            self.metrics.aborted(job, now)
        for job in jobs:
            job.sink.on_output(job, job.emitted, job.emitted, now)
        return len(jobs)

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

    def _vacate(self, job: Job, state: JobState) -> None:
        """Take ``job``, admitted and in ``state`` (prefill or decoding), off its slot:
        out of the prefill queue, its slot and blocks given back (cancel, abort)."""
        if state is _PREFILL:
            self._prefill.discard(job)
        self._release(job)
        if state is _DECODING:
            self._decoding -= 1

    # --- pacing ----------------------------------------------------------------------------

    def _first_token_due(self, job: Job, now: float) -> None:
        """``job`` was admitted at ``now``: its first token is due after its TTFT (with the
        load factor now), once chunked prefill has worked through its uncached prompt."""
        ttft = self._latency.fixed_ttft
        if ttft is None or job.remote_prefill:
            ttft = self._latency.time_to_first_token(
                self._rng,
                prompt_tokens=job.prompt_tokens,
                cached_tokens=job.cached_tokens,
                remote_prefill=job.remote_prefill,
                factor=self._latency.load_factor(self._running),
            )
        job.deadline = now + ttft
        if job.prefilled_tokens < len(job.prompt_token_ids) and self._prefill.enabled:
            self._prefill.add(job, now)
        else:
            self._schedule(job, job.deadline, now)

    def _run(self, jobs: list[Job], time: float, now: float, due: float, reach: float) -> None:
        """Advance every live job of one bucket (or of the ready list, due since
        ``due``): hand each one every token due by ``reach`` (see :func:`grid_reach`;
        up to the per-step cap), give it its next entry, and call its sink.

        This is the per-token path, hence one loop with the common case inlined (a
        fixed ITL, one token, the next one due after this step: what :meth:`_advance`
        does in general) and the engine's fields in locals.  Two caches spare most
        jobs the lookups: the ITL histogram bucket of the last ITL (a bucket's jobs
        mostly share one ITL), and the deadlines known to round to the last grid time
        given out (:meth:`Timetable._enter`), with its bucket.
        """
        fixed_itl = self._latency.fixed_itl
        itl_histogram = self.metrics.inter_token_latency
        itl_bounds, itl_counts = itl_histogram.bounds, itl_histogram.counts
        # The ITL bucket (low, high] of counts[index], and the ITLs counted in it not yet added.
        low, high, index, in_bucket = math.inf, -math.inf, 0, 0
        itl_sum = 0.0
        generated = 0
        # Deadlines in [first, last] go to ``slot``, whose entries are ``bucket`` (none yet).
        first, last, slot, bucket = math.inf, -math.inf, READY, self._ready
        resumed = self._resumed
        rest = iter(jobs)  # on an exception, what it has not yielded is still due
        try:
            for job in rest:
                if job.slot != time:
                    continue  # stale: the job moved on
                if job.paused:
                    job.slot = None  # consumed: resume gives it a new entry
                    continue
                start = job.emitted
                if start:  # one inter-token latency per output, however many tokens it carries
                    itl = now - job.last_token_time
                    if low < itl <= high:
                        in_bucket += 1
                    else:
                        itl_counts[index] += in_bucket
                        index = bisect_left(itl_bounds, itl)
                        low = itl_bounds[index - 1] if index else -math.inf
                        high = itl_bounds[index] if index < len(itl_bounds) else math.inf
                        in_bucket = 1
                    itl_sum += itl
                elif job.state is _PREFILL:
                    self._start_decoding(job, now)
                job.last_token_time = now
                stop = start + 1
                if fixed_itl is not None and stop < len(job.output) and (deadline := job.deadline + fixed_itl) > reach:
                    job.emitted = stop
                    generated += 1
                    job.deadline = deadline
                    if first <= deadline <= last:
                        job.slot = slot
                        bucket.append(job)
                    else:
                        first, last, slot, bucket = self._enter(job, deadline, now)
                else:
                    stop = self._advance(job, start, now, reach)
                    generated += stop - start
                # False: the client's buffer is full.  A resume() of this job during the
                # call counts (it noted the job's ``emitted``, see resume): not paused then.
                if not job.sink.on_output(job, start, stop, now) and job.state is _DECODING:
                    job.paused = resumed.get(job) != stop
        except BaseException:
            self._put_back(list(rest), time, due)  # a sink raised: the rest is still due
            raise
        finally:
            resumed.clear()
            self._generated_tokens += generated
            itl_counts[index] += in_bucket
            itl_histogram.sum += itl_sum

    def _advance(self, job: Job, start: int, now: float, reach: float) -> int:
        """The per-token path in general (:meth:`_run` inlines its common case): hand
        ``job`` every token due by ``reach``, up to the cap, then finish it or give it its
        next entry; returns its new ``emitted``.  (The C loop does the fixed-ITL case and the
        last token itself, native/engine_advance.c, calling _finish and _enter_ready.)"""
        total = len(job.output)
        deadline = job.deadline
        # How many tokens are due, and the deadline that follows: the next
        # token's when some remain, else the last emitted token's.
        remaining = total - start
        if remaining <= 0:
            count = 0
        elif remaining == 1:
            count = 1
        else:
            count, deadline = self._latency.due_tokens(
                self._rng, self._running, deadline, reach, remaining, MAX_TOKENS_PER_STEP
            )
        stop = start + count
        job.emitted = stop
        if stop == total:
            self._finish(job, now, deadline)
        elif deadline > reach:  # its grid time, which is after ``now`` (but for a float hair)
            job.deadline = deadline
            self._enter(job, deadline, now)
        else:  # due by this step's reach (the per-job cap was hit): the next step
            job.deadline = deadline
            self._enter_ready(job, deadline)
        return stop

    def _finish(self, job: Job, now: float, deadline: float) -> None:
        """``job`` emitted its last token at ``now`` (the last one was due at ``deadline``):
        free its slot and admit whoever waits, as of that deadline (a late step catches
        up), or of ``now`` if the token went out before it (on the grid)."""
        job.state = _FINISHED
        job.finish_time = now
        job.slot = None
        self._finished += 1
        self._decoding -= 1
        self._release(job)
        self.metrics.finished(job, now)
        if self._waiting_count:
            self._fill_slots(deadline if deadline < now else now)

    def _start_decoding(self, job: Job, now: float) -> None:
        job.state = _DECODING
        job.first_token_time = now
        job.prefilled_tokens = prompt_tokens = len(job.prompt_token_ids)
        self._decoding += 1
        self._prompt_tokens += prompt_tokens
        self.metrics.first_token(job, now)

    # --- bookkeeping ---------------------------------------------------------------------

    def _first_head(self) -> float:
        """What :meth:`next_deadline` returns when it ran last and since then entries were
        only added (by :meth:`submit`): every head is live then, so no liveness check."""
        if self._pause_state is _PAUSED_ALL:
            return self._ended_time
        first = min(self._ended_time, self._ready_time, self._prefill.next_period_end)
        return min(first, self._times[0]) if self._times else first

    def _wake_if_earlier(self, before: float) -> None:
        if self._wakeup is not None and self._horizon == -math.inf and self.next_deadline() < before:
            self._wakeup()

    def _record_step(self, lateness: float) -> None:
        self._steps += 1
        if lateness > LATE_STEP_THRESHOLD:
            self._late_steps += 1
        if lateness > self._max_lateness:
            self._max_lateness = lateness


#: The pure ``Engine._run``, the reference: its C twin replaces it where built (native_run.py).
PURE_RUN = install_run(Engine, max_tokens_per_step=MAX_TOKENS_PER_STEP)
