"""The lean client (benchmarks/loadgen/lean.py) against a real llmsim on a free port: it
stamps the first token, not the response head, and reports what goes wrong."""

from __future__ import annotations

import functools
import socket

import pytest
import trio

from benchmarks.loadgen.lean import LeanResult, lean_ttfts
from llmsim.testing import open_simulator

MODEL = "llmsim/sim-model"


async def test_every_request_after_the_warmup_gives_a_ttft_at_or_after_the_configured_one() -> None:
    async with open_simulator(model=MODEL, time_to_first_token=0.03, inter_token_latency=0.002) as server:
        run = functools.partial(lean_ttfts, server.port, model=MODEL, streams=2, duration=0.4, max_tokens=3, warmup=0.1)
        result = await trio.to_thread.run_sync(run)
    assert len(result.ttfts) >= 4  # each request takes about 34 ms: several per stream
    # The grid for a 2 ms ITL is 2 ms: a first token leaves at most 1 ms before its deadline.
    assert min(result.ttfts) >= 0.03 - 0.001
    assert 0.03 - 0.001 <= result.p50 < 0.5


async def test_the_response_head_does_not_count_as_the_first_token() -> None:
    """llmsim sends the response head as soon as the request is in (about 1 ms), the
    role chunk and first token at the TTFT: a client stamping its first read would
    measure the head.  With TTFT 60 ms no TTFT may come out below 59 ms."""
    async with open_simulator(model=MODEL, time_to_first_token=0.06, inter_token_latency=0.002) as server:
        run = functools.partial(lean_ttfts, server.port, model=MODEL, streams=1, duration=0.2, max_tokens=2, warmup=0.0)
        result = await trio.to_thread.run_sync(run)
    assert result.ttfts and min(result.ttfts) >= 0.059


def test_a_refused_connection_is_an_error_naming_the_port() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(RuntimeError, match=f"lean client on port {port}"):
            lean_ttfts(port, model=MODEL, streams=1, duration=0.1, max_tokens=1, warmup=0.0)


def test_no_samples_is_a_nan_median() -> None:
    assert LeanResult(()).p50 != LeanResult(()).p50
