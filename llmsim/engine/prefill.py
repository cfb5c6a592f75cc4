"""Chunked prefill: a prompt-token budget per inter-token period.

The model, kept deliberately simple:

* Time is cut into periods of ``inter_token_latency`` seconds (unscaled, no jitter),
  aligned to multiples of it on the engine clock: period *k* is ``[k·P, (k+1)·P)``.
* Each period has ``max_num_batched_tokens`` tokens.  Every decoding job (paused ones
  too: they keep their slot) uses one of them; the rest prefill waiting prompts in
  admission (FIFO) order, all of it spent at the end of the period.  A prompt larger
  than what is left takes several periods.
* A job's prefill is complete at the end of the period that took its last prompt
  chunk.  Its first token is due at ``max(admitted + TTFT, that period end)``: chunking
  can only delay a first token, never bring it before its TTFT.
* Cached prompt tokens (and, on the decode side of P/D, the whole transferred prompt)
  are never prefilled; a job with nothing to prefill never enters this queue.
* With ``inter_token_latency == 0`` there are no periods and nothing is queued here:
  prefill is bounded only by TTFT.

Nothing runs while the queue is empty, so an idle engine has no period ticks.
"""

from __future__ import annotations

import math
from collections import deque

from llmsim.engine.job import Job

__all__ = ["ChunkedPrefill"]


class ChunkedPrefill:
    """The jobs whose prompts still need prefill, and when the next period ends."""

    def __init__(self, budget: int, period: float) -> None:
        """``budget`` prompt tokens per period of ``period`` seconds (the unscaled
        inter-token latency; 0: no chunking)."""
        self._budget = budget
        self._period = period
        #: True when prompts are chunked (the inter-token latency defines periods).
        self.enabled = period > 0.0
        self._pending: deque[Job] = deque()
        #: End of the period whose budget is spent next; ``math.inf`` when nothing waits.
        self.next_period_end = math.inf

    def __len__(self) -> int:
        return len(self._pending)

    def reconfigure(self, budget: int, period: float) -> None:
        """New budget and period length, used from the next period on.  A period that
        ends with chunking switched off prefills everything still queued."""
        self._budget = budget
        self._period = period
        self.enabled = period > 0.0

    def add(self, job: Job, now: float) -> None:
        """Queue an admitted job whose prompt still has tokens to prefill."""
        self._pending.append(job)
        if self.next_period_end == math.inf:
            self.next_period_end = self._period_end_after(now)

    def discard(self, job: Job) -> None:
        """Forget a cancelled job (a no-op if it is not queued)."""
        try:
            self._pending.remove(job)
        except ValueError:
            return
        if not self._pending:
            self.next_period_end = math.inf

    def run_due(self, now: float, decoding: int) -> list[tuple[Job, float]]:
        """Spend the budget of every period that ended at or before ``now``.

        ``decoding`` jobs take one token each of every period.  Returns the jobs whose
        prefill completed, each with the end of the period that completed it.
        """
        completed: list[tuple[Job, float]] = []
        while self._pending and self.next_period_end <= now:
            end = self.next_period_end
            budget = max(self._budget - decoding, 0) if self.enabled else math.inf
            self._spend(budget, end, completed)
            if not self._pending:
                self.next_period_end = math.inf
            elif budget == 0:
                # Decoding jobs fill every period: nothing moves until one finishes.
                self.next_period_end = self._period_end_after(now)
            else:
                self.next_period_end = end + self._period
        return completed

    def _spend(self, budget: float, end: float, completed: list[tuple[Job, float]]) -> None:
        pending = self._pending
        while pending and budget > 0:
            job = pending[0]
            need = len(job.prompt_token_ids) - job.prefilled_tokens
            if need > budget:
                job.prefilled_tokens += int(budget)
                return
            job.prefilled_tokens += need
            budget -= need
            pending.popleft()
            completed.append((job, end))

    def _period_end_after(self, t: float) -> float:
        """The end of the period containing ``t``, strictly after ``t``."""
        period = self._period
        end = (math.floor(t / period) + 1) * period
        while end <= t:  # float division can land one period short
            end += period
        return end
