"""The engine task (``Simulator.run_engine``): when it wakes, and the clock a request's
jobs start on."""

from __future__ import annotations

import attrs
import orjson
import pytest
import trio
from trio.testing import MockClock

from llmsim.api.http import HttpRequest
from llmsim.app import STEP_QUANTUM
from llmsim.step_timer import StepTimer
from tests.api.fakes import FakeResponse, running

TTFT, ITL = 0.05, 0.02
BODY = {"prompt": "hi", "max_tokens": 3, "ignore_eos": True}


def completion(received_at: float | None, *, stream: bool) -> HttpRequest:
    return HttpRequest(
        "POST",
        "/v1/completions",
        headers=((b"content-type", b"application/json"),),
        body=orjson.dumps({**BODY, "stream": stream}),
        received_at=received_at,
    )


@pytest.mark.parametrize("stream", [True, False])
async def test_a_request_is_timed_from_its_first_byte(autojump_clock: MockClock, stream: bool) -> None:
    """The protocol layer stamps ``received_at`` as the bytes arrive; reading, parsing and
    planning take time before the handler submits (12.3 ms here).  The answer is due a
    TTFT after the first byte, on the nearest grid time, not a TTFT after the submit."""
    async with running(time_to_first_token=TTFT, inter_token_latency=ITL) as sim:
        received = trio.current_time()
        await trio.sleep(0.0123)
        response = FakeResponse()
        await sim.app.handle(completion(received, stream=stream), response)
    first = min(when for when, data in response.writes if b"text" in data)
    expected = received + (TTFT if stream else TTFT + 2 * ITL)  # a whole answer: at its last token
    assert abs(first - expected) <= STEP_QUANTUM / 2 + 1e-9
    ttft = sim.engine.metrics.snapshot().histograms["time_to_first_token_seconds"]
    assert abs(ttft.sum - TTFT) <= STEP_QUANTUM / 2 + 1e-9  # vLLM's TTFT counts from there too


async def test_without_an_arrival_time_the_clock_starts_at_the_submit(autojump_clock: MockClock) -> None:
    async with running(time_to_first_token=TTFT, inter_token_latency=ITL) as sim:
        response = FakeResponse()
        submitted = trio.current_time()
        await sim.app.handle(completion(None, stream=True), response)
    first = min(when for when, data in response.writes if b"text" in data)
    assert abs(first - (submitted + TTFT)) <= STEP_QUANTUM / 2 + 1e-9


async def test_on_the_real_clock_the_engine_task_sleeps_on_the_step_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps = 0
    sleep_until = StepTimer.sleep_until

    async def counted(self: StepTimer, deadline: float) -> None:
        nonlocal sleeps
        sleeps += 1
        await sleep_until(self, deadline)

    monkeypatch.setattr(StepTimer, "sleep_until", counted)
    async with running(time_to_first_token=0.01, inter_token_latency=0.004) as sim:
        received = trio.current_time()
        response = FakeResponse()
        with trio.fail_after(5):
            await sim.app.handle(completion(received, stream=True), response)
    assert sleeps >= 1  # (one per token, unless a loaded machine made a step late: catch-up)
    times = [when for when, data in response.writes if b"text" in data]
    deadlines = [received + 0.01 + i * 0.004 for i in range(3)]
    # The k-th write carries token k or later (a late step hands out every due token in
    # one write), so it leaves no earlier than half a grid interval before token k's deadline.
    assert 1 <= len(times) <= 3
    assert all(when >= due - STEP_QUANTUM / 2 for when, due in zip(times, deadlines, strict=False))


async def test_a_new_job_cuts_a_timer_sleep_short() -> None:
    """The engine task sleeps on the timer until a far deadline; a request due sooner
    wakes it (the wake-up callback cancels the sleep), on the real clock."""
    async with running(time_to_first_token=10.0, inter_token_latency=0.0) as sim, trio.open_nursery() as nursery:
        nursery.start_soon(sim.app.handle, completion(None, stream=True), FakeResponse())
        await trio.sleep(0.01)  # the engine task now sleeps until the first token, 10 s out
        sim.engine.reconfigure(sim.engine.options, attrs.evolve(sim.config.latency, time_to_first_token=0.0))
        response = FakeResponse()
        with trio.fail_after(2):
            await sim.app.handle(completion(None, stream=True), response)
        assert response.ended
        nursery.cancel_scope.cancel()
