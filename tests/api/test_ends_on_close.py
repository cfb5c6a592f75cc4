"""``Api.ends_on_close``: every handler returns by itself once its response closed (the
client went away), so that the native server runs it in no cancel scope of its own.
Here no one cancels anything: each test would hang if a handler kept waiting."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing
from trio.testing import MockClock

from llmsim.api.admin.routes import DRAIN_POLL_INTERVAL
from llmsim.api.http import HttpRequest
from llmsim.api.router import Api
from tests.api.fakes import FakeResponse, post, running

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
CHAT = "/v1/chat/completions"
LONG = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500, "ignore_eos": True}


def test_the_api_says_it_ends_on_close() -> None:
    assert Api.ends_on_close is True


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "collect"])
async def test_a_generating_handler_returns_once_the_client_is_gone_and_frees_its_slot(
    streaming: bool, autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    response = FakeResponse()
    async with running(**LATENCY, model="m") as sim:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, sim, CHAT, {**LONG, "stream": streaming}, (), response)
            await trio.sleep(0.5)  # mid-answer: ~40 of 500 tokens out
            assert sim.engine.statistics().running == 1
            written = len(response.writes)
            response.disconnect()
        # (the nursery is done: the handler returned without being cancelled)
        statistics = sim.engine.statistics()
    assert statistics.running == 0 and statistics.cancelled == 1 and statistics.finished == 0
    assert len(response.writes) == written  # nothing more after the client left
    assert (response.status == 200) is streaming  # a complete answer never started
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def test_a_client_gone_before_the_jobs_leaves_at_once(autojump_clock: MockClock) -> None:
    """Closed while the request was being planned: the wait ends as it begins."""
    response = FakeResponse()
    response.disconnect()
    async with running(**LATENCY, model="m") as sim:
        start = trio.current_time()
        await post(sim, CHAT, {**LONG, "stream": False}, (), response)
        assert trio.current_time() == start and sim.engine.statistics().running == 0
    assert response.writes == []


async def test_a_handler_waiting_for_something_else_is_cancelled_at_the_close(autojump_clock: MockClock) -> None:
    """``/sleep?mode=wait`` polls until the engine drains (cancel_on_close): its client
    gone, it stops at once, unanswered; the engine stays paused, as the request asked."""
    response = FakeResponse()
    returned = trio.Event()

    async def sleep_and_wait() -> None:
        await sim.app.handle(HttpRequest("POST", "/sleep", query="mode=wait"), response)
        returned.set()

    async with running(**LATENCY, model="m", enable_sleep_mode=True) as sim, trio.open_nursery() as nursery:
        nursery.start_soon(post, sim, CHAT, {**LONG, "stream": True})
        await trio.sleep(0.2)
        nursery.start_soon(sleep_and_wait)
        await trio.sleep(3 * DRAIN_POLL_INTERVAL)
        gone = trio.current_time()
        response.disconnect()
        await returned.wait()
        assert trio.current_time() == gone  # not after the 500 tokens' end (~5 s)
        assert response.status is None and sim.engine.statistics().running == 1
        nursery.cancel_scope.cancel()
