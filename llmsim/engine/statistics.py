"""The engine's counters, as one frozen snapshot."""

from __future__ import annotations

import attrs

__all__ = ["LATE_STEP_THRESHOLD", "EngineStatistics"]

#: A step that starts this much after its earliest step time counts as late.
LATE_STEP_THRESHOLD = 0.001


@attrs.frozen
class EngineStatistics:
    """A snapshot of the engine's counters (see :meth:`Engine.statistics`).

    ``submitted`` counts every :meth:`Engine.submit` call, so it always equals
    ``running + waiting + finished + cancelled + rejected``.  ``prompt_tokens`` counts
    the prompts of jobs whose prefill completed (cached tokens included, as vLLM's
    ``prompt_tokens_total``).  ``steps`` counts steps that had something due;
    ``late_steps`` those that ran more than :data:`LATE_STEP_THRESHOLD` after their
    earliest step time (the earliest due deadline, or with a step quantum the grid
    time it was rounded up to), and ``max_lateness`` is the worst such delay (seconds).
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
