"""``usage.prompt_tokens_details.created_cache_tokens`` counts the prompt's full blocks of
``--block-size`` tokens less what was cached (vLLM's ``num_cache_creation_tokens``,
vllm/v1/metrics/stats.py:342-346; chat only, chat_completion/serving.py:110-114)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from trio.testing import MockClock

from tests.api.fakes import post, running

CHAT = {"messages": [{"role": "user", "content": "Count the waves that reach the harbour wall " * 5}], "max_tokens": 2}


async def _details(**config: Any) -> tuple[int, dict[str, Any]]:
    async with running(enable_prompt_tokens_details=True, **config) as sim:
        response = await post(sim, "/v1/chat/completions", CHAT)
    assert response.status == 200, response.body
    usage = orjson.loads(response.body)["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]


@pytest.mark.parametrize("block_size", [8, 16, 32, 64])
async def test_cache_writes_are_counted_in_the_configured_blocks(autojump_clock: MockClock, block_size: int) -> None:
    prompt, details = await _details(block_size=block_size)
    assert prompt % block_size  # the prompt has a partial block, which is not written
    assert details["created_cache_tokens"] == prompt - prompt % block_size
    assert details["cached_tokens"] == 0


async def test_a_cached_prefix_is_not_written_again(autojump_clock: MockClock) -> None:
    async with running(enable_prompt_tokens_details=True, enable_kvcache=True, block_size=32) as sim:
        first = orjson.loads((await post(sim, "/v1/chat/completions", CHAT)).body)["usage"]
        second = orjson.loads((await post(sim, "/v1/chat/completions", CHAT)).body)["usage"]
    prompt = first["prompt_tokens"]
    assert first["prompt_tokens_details"]["created_cache_tokens"] == prompt - prompt % 32
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert second["prompt_tokens_details"]["created_cache_tokens"] == prompt - prompt % 32 - cached
