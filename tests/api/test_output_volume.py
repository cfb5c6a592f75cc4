"""``--max-output-volume`` (issue 17): a 165-byte request (n=256, max_tokens 500,
top_logprobs 20) once made a 187 MB body.  n x max_tokens x (1 + top_logprobs) above
the cap is a 400 naming it, made before anything is planned or queued."""

from __future__ import annotations

from typing import Any

import pytest
from trio.testing import MockClock

from llmsim.options import ModelOptions
from tests.api.fakes import post, running

HI = [{"role": "user", "content": "hi"}]
MODEL = "llmsim/sim-model"


def bodies(n: int, max_tokens: int, top: int) -> list[tuple[str, dict[str, Any]]]:
    """One body per endpoint asking for n x max_tokens x (1 + top) entries."""
    return [
        (
            "/v1/chat/completions",
            {"messages": HI, "n": n, "max_tokens": max_tokens, "logprobs": True, "top_logprobs": top},
        ),
        ("/v1/completions", {"prompt": "hi", "n": n, "max_tokens": max_tokens, "logprobs": top}),
        (
            "/inference/v1/generate",
            {"token_ids": [11, 12], "sampling_params": {"n": n, "max_tokens": max_tokens, "logprobs": top}},
        ),
    ]


@pytest.mark.parametrize("top", [4, 5])
async def test_the_cap_is_on_n_times_max_tokens_times_one_plus_top_logprobs(
    top: int, autojump_clock: MockClock
) -> None:
    async with running(max_output_volume=100) as sim:
        for path, body in bodies(2, 10, top):
            response = await post(sim, path, body)
            if top == 4:  # 2 x 10 x 5 = 100: at the cap
                assert response.status == 200, (path, response.body)
                continue
            assert response.status == 400, (path, response.body)
            assert response.json()["error"] == {
                "message": "This request asks for up to 120 output entries (n x max_tokens x (1 + top_logprobs)), "
                "more than max-output-volume (100); lower n, max_tokens or top_logprobs.",
                "type": "BadRequestError",
                "param": "max_tokens",
                "code": 400,
            }
        if top == 5:
            assert sim.engine.statistics().submitted == 0


async def test_responses_and_messages_count_their_one_choice(autojump_clock: MockClock) -> None:
    async with running(max_output_volume=10) as sim:
        responses = await post(sim, "/v1/responses", {"input": "hi", "max_output_tokens": 11, "store": False})
        messages = await post(sim, "/v1/messages", {"model": MODEL, "messages": HI, "max_tokens": 11})
        fits = await post(sim, "/v1/messages", {"model": MODEL, "messages": HI, "max_tokens": 10})
    assert responses.status == 400 and "max-output-volume (10)" in responses.json()["error"]["message"]
    assert messages.status == 400 and "max-output-volume (10)" in messages.json()["error"]["message"]
    assert fits.status == 200


async def test_the_reported_amplification_is_refused_by_default(autojump_clock: MockClock) -> None:
    async with running() as sim:
        for path, body in bodies(256, 500, 20):
            response = await post(sim, path, body)
            assert response.status == 400 and "max-output-volume (1000000)" in response.body.decode(), path


async def test_without_max_tokens_the_room_the_prompt_leaves_counts(autojump_clock: MockClock) -> None:
    async with running(max_model_len=100, max_output_volume=1000) as sim:
        response = await post(sim, "/v1/chat/completions", {"messages": HI, "n": 20})
        capped = await post(sim, "/v1/chat/completions", {"messages": HI, "n": 20, "max_tokens": 50})
    assert response.status == 400 and "max-output-volume (1000)" in response.body.decode()
    assert capped.status == 200, capped.body


def test_one_choice_over_the_whole_default_context_with_the_most_logprobs_fits() -> None:
    """Normal traffic never meets the default: n=1, max_tokens the whole 32,768 context,
    top_logprobs at --max-logprobs (20)."""
    options = ModelOptions()
    assert options.max_model_len * (1 + options.max_logprobs) <= options.max_output_volume
