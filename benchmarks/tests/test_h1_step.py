"""The HTTP/1.1 step driver streams every token of every request to its client."""

from __future__ import annotations

import math

from benchmarks.h1_step import run_once


def test_every_token_of_every_request_reaches_its_client() -> None:
    result = run_once(streams=10, tokens=5, requests=30)
    assert result["tokens"] == 5 * 30 and result["steps"] > 0
    assert 0 < result["us_per_token"] < math.inf
    # heads, 150 chunks of chat events (over 100 bytes each), 30 ends
    assert result["bytes"] > 150 * 100


def test_long_streams_are_read_while_they_run() -> None:
    # 1,000 chunks are more than a Unix socket pair holds: a client that read only once per
    # pass over the connections left the stream blocked, and the driver waited forever.
    result = run_once(streams=2, tokens=1000, requests=4)
    assert result["tokens"] == 1000 * 4
    assert result["bytes"] > 4000 * 100
