"""``--enable-kvcache`` seen by clients: ``usage.prompt_tokens_details.cached_tokens``,
the prefix-cache and KV-usage metrics, ``cache_config_info`` and sleep clearing the cache
(``vllm/v1/engine/core.py:1007-1008``)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from trio.testing import MockClock

from llmsim.api.http import HttpRequest
from llmsim.app import Simulator
from tests.api.fakes import FakeResponse, post, running
from tests.api.metrics.test_metrics_endpoint import scrape, value

CHAT = {
    "messages": [{"role": "user", "content": "Tell me a long story about the sea, the ships and the sailors " * 4}],
    "max_tokens": 3,
}
KV = {"enable_kvcache": True, "enable_prompt_tokens_details": True, "seed": 1}


async def _cached_tokens(sim: Simulator) -> tuple[int, int]:
    response = await post(sim, "/v1/chat/completions", CHAT)
    assert response.status == 200, response.body
    usage: dict[str, Any] = orjson.loads(response.body)["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


async def _sleep_and_wake(sim: Simulator, level: int) -> None:
    for path, query in (("/sleep", f"level={level}"), ("/wake_up", "")):
        response = FakeResponse()
        await sim.app.handle(HttpRequest("POST", path, query=query), response)
        assert response.status == 200, response.body


async def test_a_repeated_prompt_reports_cached_tokens_and_counts_hits(autojump_clock: MockClock) -> None:
    async with running(**KV, block_size=8, kv_cache_size=500) as sim:
        prompt, first = await _cached_tokens(sim)
        again, second = await _cached_tokens(sim)
        families = await scrape(sim)
    assert (again, first) == (prompt, 0)
    assert 0 < second < prompt
    assert second % 8 == 0
    assert value(families, "prefix_cache_hits", "_total") == second
    assert value(families, "prefix_cache_queries", "_total") == 2 * prompt
    assert value(families, "kv_cache_usage_perc") == 0.0
    (info,) = families["vllm:cache_config_info"].samples
    assert (info.labels["block_size"], info.labels["num_gpu_blocks"]) == ("8", "500")


async def test_a_cached_prefix_shortens_ttft_under_the_per_token_calculator(autojump_clock: MockClock) -> None:
    latency = {"latency_calculator": "per-token", "prefill_time_per_token": 0.001, "inter_token_latency": 0.001}
    async with running(**KV, **latency) as sim:
        prompt, _ = await _cached_tokens(sim)
        first = value(await scrape(sim), "time_to_first_token_seconds", "_sum")
        _, cached = await _cached_tokens(sim)
        second = value(await scrape(sim), "time_to_first_token_seconds", "_sum") - first
    assert first == pytest.approx(prompt * 0.001, abs=0.0015)
    assert second == pytest.approx((prompt - cached) * 0.001, abs=0.0015)


async def test_without_the_cache_nothing_is_cached(autojump_clock: MockClock) -> None:
    async with running(enable_prompt_tokens_details=True) as sim:
        await _cached_tokens(sim)
        _, cached = await _cached_tokens(sim)
        families = await scrape(sim)
    assert cached == 0
    assert value(families, "prefix_cache_hits", "_total") == 0


async def test_sleep_clears_the_cache(autojump_clock: MockClock) -> None:
    async with running(**KV, enable_sleep_mode=True) as sim:
        await _cached_tokens(sim)
        await _sleep_and_wake(sim, level=1)
        _, cached = await _cached_tokens(sim)
    assert cached == 0


async def test_sleep_level_0_keeps_the_cache(autojump_clock: MockClock) -> None:
    async with running(**KV, enable_sleep_mode=True) as sim:
        await _cached_tokens(sim)
        await _sleep_and_wake(sim, level=0)
        _, cached = await _cached_tokens(sim)
    assert cached > 0
