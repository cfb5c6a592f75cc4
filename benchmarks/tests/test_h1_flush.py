"""The HTTP/1.1 flush driver runs both release twins on real sockets, every chunk arriving."""

from __future__ import annotations

import math

import pytest

from benchmarks.h1_flush import TWINS, run
from llmsim.speedups import NATIVE


def test_each_twin_sends_every_connections_chunk_every_step() -> None:
    # (run's steps assert that each peer received exactly one framed chunk per step)
    best = run(connections=20, steps=3, rounds=2, twins=list(TWINS))
    assert set(best) == set(TWINS) and all(0 < cost < math.inf for cost in best.values())


def test_the_callgrind_mode_runs_the_release_inside_dropwhile() -> None:
    best = run(connections=5, steps=2, rounds=1, twins=["pure"], callgrind=True)
    assert 0 < best["pure"] < math.inf


@pytest.mark.skipif(NATIVE is None, reason="llmsim._speedups is not built")
def test_the_native_twin_is_the_compiled_release() -> None:
    assert TWINS["native"] is not TWINS["pure"]
    assert type(TWINS["native"]).__name__ == "method_descriptor"
