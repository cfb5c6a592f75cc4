"""The embeddings scenario's clients count completed JSON answers, and stop on time.

Part of ``make test``; on its own: ``python -m pytest benchmarks/tests``.
"""

from __future__ import annotations

import time

import pytest

from benchmarks.scenarios.embeddings import BODY, PATH, _ClientClock, _loadgen, _sdk
from benchmarks.servers import MODEL
from llmsim.testing import open_simulator


@pytest.mark.parametrize("load", [(False, 2, 1), (True, 1, 4)])
async def test_both_clients_count_answers_and_end_at_the_stop_time(load: tuple[bool, int, int]) -> None:
    """Over HTTP/2 the load generator reads until cancelled: without the cancel at the
    stop time the run would last until the server closed the idle connection."""
    async with open_simulator(served_model_name=(MODEL,)) as handle:
        start = time.perf_counter() + 0.05
        stop = start + 0.5
        clock = _ClientClock((start, stop))
        ends, errors = await _loadgen(handle.port, PATH, BODY, load, start, stop, clock)
        assert time.perf_counter() < stop + 1.0
        assert ends and not errors
        assert all(start <= end <= stop + 0.2 for end in ends)  # the window then keeps those up to stop
        assert clock.cpu > 0
        ends, errors = await _sdk(handle.url, load, start + 1.0, stop + 1.0, _ClientClock((start + 1.0, stop + 1.0)))
        assert ends and not errors
