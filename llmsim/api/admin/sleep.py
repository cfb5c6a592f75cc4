"""vLLM's sleep state.

vLLM 0.33 keeps two things (``vllm/v1/engine/core.py:993-1080``): whether the scheduler is
paused, and which memory pools of the executor sleep (``sleeping_tags``, a subset of
``{"weights", "kv_cache"}``, ``vllm/v1/executor/abstract.py:35-36,397-435``).

* ``sleep(level)`` pauses the scheduler (every level), and from level 1 on puts both pools
  to sleep (once: a second sleep finds ``weights`` asleep and leaves the tags alone).
* ``wake_up(tags)`` wakes the named pools (all of them when no tags are given; a tag that
  is not asleep makes it a no-op; ``scheduling`` names no pool), and resumes the scheduler
  only once no pool sleeps.  It says whether the engine is fully awake.
* ``is_sleeping`` is "paused, or some pool asleep".

While the scheduler is paused, a new request is queued and not scheduled: sleep is not a
user pause, so ``reject_new_requests`` stays False (``core.py:2225-2233``) and the request
waits until the engine is fully awake.  So in llmsim: its jobs are submitted to the
paused engine, which queues them without admitting any (they count as waiting, their
queue time runs, a stream's head goes out at once).  The requests already in flight are
the engine's too: the routes pause it as ``mode`` asks
(:mod:`llmsim.engine.pause`) and un-pause it once :meth:`SleepState.wake_up` finds it
fully awake.  Discarding the KV cache on a sleep of level 1 or 2
(``clear_prefix_cache = level >= 1``, ``core.py:1007``) is left for the KV-cache model.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

__all__ = ["SLEEP_TAGS", "SleepState"]

#: The executor's memory pools that sleep and wake (``vllm/v1/executor/abstract.py:35-36``).
SLEEP_TAGS = frozenset(("weights", "kv_cache"))
#: Names the scheduler, not a pool: ``wake_up`` drops it from the tags (``core.py:1041-1043``).
_SCHEDULING = "scheduling"


@attrs.define(eq=False)
class SleepState:
    """The simulated engine's sleep state: one per simulator, ``ctx.sleep``.

    ``level`` is the level of the last ``POST /sleep`` while the engine sleeps, and 0
    once it is fully awake again: with :attr:`is_sleeping` it gives vLLM's
    ``engine_sleep_state`` gauge (:meth:`sleep_state_gauge`).
    """

    level: int = 0
    paused: bool = False  # the scheduler: new requests wait while True
    sleeping_tags: frozenset[str] = frozenset()

    @property
    def is_sleeping(self) -> bool:
        """vLLM's ``EngineCore.is_sleeping`` (``core.py:1078-1080``)."""
        return self.paused or bool(self.sleeping_tags)

    def sleep(self, level: int) -> None:
        """``EngineCore.sleep`` (``core.py:993-1029``): pause; from level 1, every pool sleeps."""
        self.paused = True
        if level >= 1 and "weights" not in self.sleeping_tags:  # executor: "already sleeping"
            self.sleeping_tags = SLEEP_TAGS
        self.level = level  # AsyncLLM.sleep records the level asked for (async_llm.py:1198-1204)

    def wake_up(self, tags: Sequence[str] | None) -> bool:
        """``EngineCore.wake_up`` (``core.py:1031-1056``) and the executor's
        (``abstract.py:412-435``); True when the engine is fully awake."""
        pools = None if tags is None else [tag for tag in tags if tag != _SCHEDULING]
        if pools is None or pools:
            self._wake_pools(pools)
        if self.sleeping_tags:
            return False
        self.paused = False
        self.level = 0
        return True

    def _wake_pools(self, pools: Sequence[str] | None) -> None:
        if not self.sleeping_tags:
            return  # "Executor is not sleeping."
        if pools and any(pool not in self.sleeping_tags for pool in pools):
            return  # "Tag %s is not in sleeping tags %s": nothing wakes
        self.sleeping_tags = self.sleeping_tags.difference(pools) if pools else frozenset()

    def sleep_state_gauge(self) -> dict[str, int]:
        """vLLM's ``engine_sleep_state`` values by its ``sleep_state`` label
        (``vllm/v1/metrics/loggers.py:593-615,1335-1352``): ``awake`` 0 while asleep at
        any level, ``weights_offloaded`` 1 at level 1, ``discard_all`` 1 at level 2."""
        asleep = self.is_sleeping
        return {
            "awake": int(not asleep),
            "weights_offloaded": int(asleep and self.level == 1),
            "discard_all": int(asleep and self.level == 2),
        }
