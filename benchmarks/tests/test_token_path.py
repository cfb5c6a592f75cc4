"""The in-process token-path driver serves every request, isolated for callgrind or not."""

from __future__ import annotations

import pytest

from benchmarks.token_path import run_once


@pytest.mark.parametrize(("protocol", "connections"), [("h2", 2), ("h1", 20)])
def test_isolated_steps_serve_the_same_tokens(protocol: str, connections: int) -> None:
    plain = run_once(protocol, 20, connections, 6, 40)
    isolated = run_once(protocol, 20, connections, 6, 40, isolate=True)
    assert plain["requests"] == isolated["requests"] == 40
    assert plain["tokens"] == isolated["tokens"] == 240
    assert isolated["bytes"] > 240 * 20
