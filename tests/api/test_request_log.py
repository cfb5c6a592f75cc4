"""``--enable-log-requests`` (llmsim/api/request_log.py): vLLM's per-request lines
(vllm/entrypoints/serve/utils/request_logger.py:66-71, vllm/v1/engine/async_llm.py:561,
587, 811, 959), and llmsim's "Finished request" line; never one per token."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from llmsim.api.context import Call
from llmsim.api.generation import stream_to_end
from llmsim.api.http import HttpRequest
from llmsim.api.plan import GenerationPlan, PromptPlan
from llmsim.api.request_log import request_log
from tests.api.fakes import FakeResponse, post, running
from tests.api.test_generation import _Renderer, text

CHAT = "/v1/chat/completions"
HELLO = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "ignore_eos": True}
REQUEST_ID = [(b"x-request-id", b"r1")]


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    messages = []
    for record in caplog.records:
        if record.name == "llmsim.api.request_log":
            assert record.levelno == logging.INFO
            messages.append(record.getMessage())
    return messages


@pytest.fixture(autouse=True)
def _info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "llmsim")


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_request_logs_received_added_and_finished(
    streaming: bool, autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with running(enable_log_requests=True) as sim:
        response = await post(sim, CHAT, {**HELLO, "stream": streaming}, REQUEST_ID)
    assert response.status == 200
    prompt_tokens = sim.engine.statistics().prompt_tokens
    assert lines(caplog) == [
        "Received request r1: params: SamplingParams(n=1, max_tokens=5), lora_request: None.",
        "Added request r1.",
        f"Finished request r1: finish_reason: length, prompt_tokens: {prompt_tokens}, completion_tokens: 5.",
    ]


async def test_n_choices_and_several_prompts_get_vllms_sub_request_ids(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Prompt ``p`` of several is ``<id>_<p>`` (chat_completion/serving.py:345-347),
    choice ``i`` of ``n`` is ``<i>_<id>`` (vllm/v1/engine/parallel_sampling.py:94)."""
    body = {"prompt": ["a", "b"], "n": 2, "max_tokens": 3, "ignore_eos": True}
    async with running(enable_log_requests=True) as sim:
        response = await post(sim, "/v1/completions", body, REQUEST_ID)
    assert response.status == 200
    logged_lines = lines(caplog)
    assert logged_lines[:6] == [
        "Received request r1_0: params: SamplingParams(n=2, max_tokens=3), lora_request: None.",
        "Received request r1_1: params: SamplingParams(n=2, max_tokens=3), lora_request: None.",
        "Added request 0_r1_0.",
        "Added request 1_r1_0.",
        "Added request 0_r1_1.",
        "Added request 1_r1_1.",
    ]
    assert [line.split(":")[0] for line in logged_lines[6:]] == [
        "Finished request 0_r1_0",
        "Finished request 1_r1_0",
        "Finished request 0_r1_1",
        "Finished request 1_r1_1",
    ]


async def test_a_client_that_goes_away_logs_vllms_abort_lines(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    plan = GenerationPlan("req", (PromptPlan((1, 2, 3), 8),), (text("a", "b", "c"), text("d")), 2)
    async with running(enable_log_requests=True, time_to_first_token=0.1, inter_token_latency=0.01) as sim:
        with trio.move_on_after(0.105):  # after the first token: choice 1 finished, choice 0 did not
            await stream_to_end(Call(sim.ctx, HttpRequest("POST", "/x"), FakeResponse()), plan, _Renderer())
    assert lines(caplog)[3:] == [
        "Finished request 1_req: finish_reason: stop, prompt_tokens: 3, completion_tokens: 1.",
        "Aborted request(s) 0_req.",
        "Request req aborted.",
    ]


async def test_nothing_is_logged_without_the_flag(autojump_clock: MockClock, caplog: pytest.LogCaptureFixture) -> None:
    async with running() as sim:
        response = await post(sim, CHAT, {**HELLO, "stream": True})
        assert response.status == 200
        plan = GenerationPlan("req", (PromptPlan((1,), 8),), (text("a"),))
        assert request_log(sim.ctx, plan, []) is None
    assert lines(caplog) == []


async def test_a_request_refused_before_its_jobs_are_in_the_engine_logs_nothing(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    body: dict[str, Any] = {**HELLO, "stream": True}
    limits = {"max_num_seqs": 1, "max_waiting_queue_length": 0, "time_to_first_token": 10.0}
    async with running(enable_log_requests=True, **limits) as sim, trio.open_nursery() as nursery:
        nursery.start_soon(post, sim, CHAT, body, REQUEST_ID)
        await trio.testing.wait_all_tasks_blocked()
        refused = await post(sim, CHAT, body, [(b"x-request-id", b"r2")])
        nursery.cancel_scope.cancel()
    assert refused.status == 429
    assert not any("r2" in line for line in lines(caplog))
    assert lines(caplog)[-2:] == ["Aborted request(s) r1.", "Request r1 aborted."]


async def test_no_line_per_token(autojump_clock: MockClock, caplog: pytest.LogCaptureFixture) -> None:
    async with running(enable_log_requests=True) as sim:
        response = await post(sim, CHAT, {**HELLO, "max_tokens": 200, "stream": True})
    assert response.status == 200
    assert len(lines(caplog)) == 3
