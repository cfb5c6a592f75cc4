"""``vllm:lora_requests_info`` from the engine: which adapters have requests in flight.

vLLM records it at every engine step that reports scheduler stats
(``vllm/v1/metrics/loggers.py:1224-1236``): one series per label set, its value the
time it was last set (``set_to_current_time``).  Both labels hold the same list, the
adapters with a request waiting *or* running (``LoRARequestStates.update_scheduler_stats``,
``vllm/v1/metrics/stats.py:699-704``, fills both dicts with every key), and a label set
seen once stays, with the time it was last current.  While nothing is in flight vLLM
does not step, so the idle set keeps the time the engine went idle.

llmsim has no per-step hook here: it samples the engine at each scrape.  A label set
that came and went between two scrapes is not shown, and the idle set carries the
time of the first scrape that found the engine idle.
"""

from __future__ import annotations

from llmsim.engine.fake_metrics import LoraInfo

__all__ = ["LoraSeries"]


class LoraSeries:
    """The label sets seen so far and when each was last current (unix seconds)."""

    def __init__(self) -> None:
        self._last_set: dict[str, float] = {}
        self._busy = False

    def read(self, adapters: tuple[str, ...], busy: bool, now: float) -> tuple[LoraInfo, ...]:
        """Sample: ``adapters`` have requests in flight; ``busy``: any request is in flight."""
        if busy or self._busy:  # the step that emptied the engine still recorded the empty set
            self._last_set[",".join(adapters)] = now
        self._busy = busy
        return tuple(LoraInfo(running=labels, waiting=labels, timestamp=at) for labels, at in self._last_set.items())
