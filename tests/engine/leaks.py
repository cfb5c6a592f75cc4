"""The leak check of the engine's C twins (test_native_run, test_native_catchup)."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections.abc import Callable, Sequence


def assert_flat(
    run: Callable[[int], None], watched: Sequence[object], *, warm_ups: tuple[int, int], measured: int
) -> None:
    """``run(n)`` does n units of work.  After ``warm_ups[0]`` units (caches filled),
    the references of every ``watched`` object stay as they were, and the traced memory
    grows by less than 20,000 bytes over ``measured`` more units (counted after
    ``warm_ups[1]`` traced ones, which fill what tracing itself allocates)."""
    run(warm_ups[0])
    gc.collect()
    before = [sys.getrefcount(item) for item in watched]
    tracemalloc.start()
    try:
        run(warm_ups[1])
        gc.collect()
        start, _ = tracemalloc.get_traced_memory()
        run(measured)
        gc.collect()
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [sys.getrefcount(item) for item in watched] == before
    assert end - start < 20_000, (start, end)
