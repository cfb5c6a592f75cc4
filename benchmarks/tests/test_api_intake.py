"""The API intake driver answers as the native server does (``app.start``, no task for a
stream) and each of its measures runs to its end."""

from __future__ import annotations

from typing import Any

import trio

from benchmarks.api_intake import (
    SCENARIOS,
    CountingResponse,
    _answer,
    _request,
    _simulator,
    measure_cpu,
    measure_intake,
    measure_memory,
)


def test_each_measure_runs() -> None:
    assert measure_cpu("chat-stream-100", 20, 4) > 0
    assert measure_intake("chat-stream-1", 5) > 0
    assert measure_memory("chat-stream-1", 20) > 0


def test_a_stream_goes_through_start_and_is_awaited_to_its_end() -> None:
    left: list[Any] = []

    async def main() -> CountingResponse:
        sim = _simulator(trio)
        start = sim.app.start

        def counted(request: Any, response: Any) -> Any:
            left.append(start(request, response))
            return left[-1]

        sim.app.start = counted
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.run_engine)
            ended = trio.Event()
            response = CountingResponse(on_end=ended.set)
            await _answer(sim.app, _request(*SCENARIOS["chat-stream-100"]), response, ended)
            nursery.cancel_scope.cancel()
        return response

    response = trio.run(main)
    assert left == [None]  # answered in start, nothing left to await
    assert response.status == 200 and response.ended and response.bytes > 0
