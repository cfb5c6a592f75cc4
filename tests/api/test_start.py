"""``Api.start``: a request answered as far as it can be without waiting, in the caller's
task (the native server calls it from the connection's reader); only what is left to
await comes back.  A stream, on any generating endpoint, leaves nothing: its jobs are in
the engine and its head is written when ``start`` returns, and the engine's sink ends it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import trio
from trio.testing import MockClock

from llmsim.api.http import HttpRequest
from tests.api.fakes import FakeResponse, running

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
HELLO = [{"role": "user", "content": "Hello there"}]
STREAMS = [
    ("/v1/chat/completions", {"messages": HELLO, "max_tokens": 5, "ignore_eos": True, "stream": True}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 5, "ignore_eos": True, "stream": True}),
]
#: Every generating endpoint's stream (``/inference/v1/generate`` has its own tests: it needs scale-out flags).
EVERY_STREAM = [
    *STREAMS,
    ("/v1/messages", {"model": "llmsim/sim-model", "messages": HELLO, "max_tokens": 5, "stream": True}),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 5, "stream": True}),
]


def request(path: str, body: object, method: str = "POST") -> HttpRequest:
    raw = orjson.dumps(body) if body is not None else b""
    return HttpRequest(method, path, headers=((b"content-type", b"application/json"),), body=raw)


@pytest.mark.parametrize(("path", "body"), EVERY_STREAM, ids=["chat", "completions", "messages", "responses"])
async def test_a_stream_is_started_at_once_and_ended_by_the_engine(
    autojump_clock: MockClock, path: str, body: dict[str, Any]
) -> None:
    response = FakeResponse()
    async with running(**LATENCY) as sim:
        assert sim.app.start(request(path, body), response) is None
        # Nothing awaited, yet the jobs are in the engine and the head is out.
        assert (sim.engine.statistics().running, response.status, response.ended) == (1, 200, False)
        await trio.sleep(1)
        statistics = sim.engine.statistics()
    assert response.ended and response.body.endswith(b"\n\n")
    assert (statistics.running, statistics.finished, statistics.cancelled) == (0, 1, 0)


async def test_a_streamed_response_is_stored_as_it_ends(autojump_clock: MockClock) -> None:
    """The Responses API stores a stream once it is complete (from the sink's end), with
    no task waiting for it; one whose client left is not stored."""
    path, body = EVERY_STREAM[3]
    whole, cut = FakeResponse(), FakeResponse()
    async with running(**LATENCY) as sim:
        assert sim.app.start(request(path, {**body, "store": True}), whole) is None
        assert sim.app.start(request(path, {**body, "store": True, "max_output_tokens": 500}), cut) is None
        await trio.sleep(0.12)
        cut.disconnect()
        await trio.sleep(1)
        stored, ids = [FakeResponse(), FakeResponse()], []
        for response, fetched in zip((whole, cut), stored, strict=True):
            created = orjson.loads(response.body.split(b"data: ", 2)[1].split(b"\n", 1)[0])
            ids.append(created["response"]["id"])
            rest = sim.app.start(request(f"/v1/responses/{ids[-1]}", None, method="GET"), fetched)
            if rest is not None:
                await rest
    assert whole.ended and not cut.ended
    assert stored[0].status == 200 and stored[0].json()["id"] == ids[0]
    assert stored[1].status == 404


@pytest.mark.parametrize(("path", "body"), STREAMS, ids=["chat", "completions"])
async def test_a_stream_whose_client_leaves_frees_its_slot_at_the_close(
    autojump_clock: MockClock, path: str, body: dict[str, Any]
) -> None:
    response = FakeResponse()
    async with running(**LATENCY) as sim:
        assert sim.app.start(request(path, {**body, "max_tokens": 500}), response) is None
        await trio.sleep(0.2)
        written = len(response.writes)
        response.disconnect()
        statistics = sim.engine.statistics()  # at once: no task had to wake up for it
        await trio.sleep(1)
    assert (statistics.running, statistics.cancelled) == (0, 1)
    assert len(response.writes) == written > 1


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_complete_answer_submits_its_jobs_at_once_and_leaves_only_the_wait(
    autojump_clock: MockClock, path: str
) -> None:
    body: dict[str, Any] = {"max_tokens": 5, "ignore_eos": True}
    body |= {"messages": HELLO} if path.endswith("chat/completions") else {"prompt": "Hi"}
    response = FakeResponse()
    async with running(**LATENCY) as sim:
        rest = sim.app.start(request(path, body), response)
        assert rest is not None
        # Submitted right after the queue checks, with no wait in between (check_job_count).
        assert (sim.engine.statistics().running, response.status) == (1, None)
        await rest
    assert response.status == 200
    assert response.json()["usage"]["completion_tokens"] == 5


async def test_an_error_is_answered_at_once(autojump_clock: MockClock) -> None:
    response = FakeResponse()
    async with running(**LATENCY) as sim:
        assert sim.app.start(request("/v1/chat/completions", {"messages": "not a list"}), response) is None
        assert sim.app.start(request("/nowhere", {}), other := FakeResponse()) is None
    assert response.status == 400 and "messages" in response.json()["error"]["message"]
    assert other.status == 404


async def test_an_async_route_runs_only_when_its_rest_is_awaited(autojump_clock: MockClock) -> None:
    response = FakeResponse()
    async with running(**LATENCY) as sim:
        rest = sim.app.start(request("/v1/models", None, method="GET"), response)
        assert rest is not None and response.status is None
        await rest
    assert response.status == 200 and response.json()["object"] == "list"


@pytest.mark.parametrize(("path", "body"), STREAMS, ids=["chat", "completions"])
async def test_handle_returns_once_the_stream_ended(autojump_clock: MockClock, path: str, body: dict[str, Any]) -> None:
    response = FakeResponse()
    async with running(**LATENCY) as sim:
        started = trio.current_time()
        await sim.app.handle(request(path, body), response)
        took = trio.current_time() - started
    assert response.ended and took == pytest.approx(0.1 + 4 * 0.01)  # the first token at the TTFT, 4 more


async def test_a_cancelled_handle_stops_its_stream(autojump_clock: MockClock) -> None:
    """Cancelling ``handle`` while the engine streams is the client's leaving: the jobs
    are cancelled, nothing more is written."""
    path, body = STREAMS[0]
    response = FakeResponse()
    async with running(**LATENCY) as sim:
        with trio.move_on_after(0.15):
            await sim.app.handle(request(path, {**body, "max_tokens": 500}), response)
        written = len(response.writes)
        statistics = sim.engine.statistics()
        await trio.sleep(1)
    assert (statistics.running, statistics.cancelled) == (0, 1)
    assert len(response.writes) == written and not response.ended
