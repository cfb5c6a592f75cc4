"""Test doubles for the API layer: a ResponseStream that records, and a simulator to
drive handlers with no server (shared by the test_api_* modules)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import trio

from llmsim.api.generation import StreamingSink, StreamRenderer, build_jobs
from llmsim.api.http import Headers, HttpRequest, ResponseEvent, ResponseState, ResponseStateFlags, next_state
from llmsim.api.plan import GenerationPlan, PromptPlan
from llmsim.api.turns import TurnPlan
from llmsim.app import Simulator, build_engine
from llmsim.config import Config
from llmsim.engine.job import Job, JobSink
from llmsim.protocol.settings import BUFFER_HIGH_WATER, BUFFER_LOW_WATER

__all__ = [
    "CREATED",
    "UNSATISFIABLE_SCHEMA",
    "EngineRun",
    "FakeResponse",
    "make_job",
    "make_simulator",
    "post",
    "running",
    "sse_payloads",
    "turn_job",
]

CREATED = 1_700_000_000  # the wall clock of every simulator built here

#: Accepted at compile time, but ``uniqueItems`` cannot be met: no value satisfies it.
UNSATISFIABLE_SCHEMA = {
    "type": "object",
    "properties": {
        "a": {
            "type": "array",
            "items": {"type": "string", "pattern": "^(a|a|a|a)$"},
            "minItems": 2,
            "uniqueItems": True,
        }
    },
    "required": ["a"],
}


class FakeResponse(ResponseStateFlags):
    """A :class:`~llmsim.api.http.ResponseStream` that records what a handler does to
    its response (it passes ``llmsim.testing.check_response_stream``).

    The client reads every write at once, unless it stopped ``reading``: then written
    bytes wait, ``unread``, until :meth:`deliver` (or :meth:`drain`), and ``write``
    returns False once they reach ``high_water``.  ``full = True`` is a client that
    stopped reading with the buffer at its high-water mark.  Writes are stamped with
    ``clock()``.
    """

    def __init__(
        self,
        clock: Callable[[], float] = trio.current_time,
        *,
        reading: bool = True,
        high_water: int = BUFFER_HIGH_WATER,
        low_water: int = BUFFER_LOW_WATER,
    ) -> None:
        self._clock = clock
        self.state = ResponseState.IDLE
        self.status: int | None = None
        self.headers: dict[bytes, bytes] = {}
        self.trailers: dict[bytes, bytes] = {}  # given to end()
        self.writes: list[tuple[float, bytes]] = []  # (clock(), bytes), end() included
        self.reading = reading
        self.high_water = high_water
        self.low_water = low_water
        self.unread = 0  # bytes written that the client has not read
        self._drained: list[Callable[[], None]] = []
        self._closed: list[Callable[[], None]] = []

    @property
    def full(self) -> bool:
        return self.unread >= self.high_water

    @full.setter
    def full(self, full: bool) -> None:
        self.reading = not full
        self.unread = max(self.unread, self.high_water) if full else 0

    @property
    def body(self) -> bytes:
        return b"".join(data for _, data in self.writes)

    def json(self) -> Any:
        return orjson.loads(self.body)

    def start(self, status: int, headers: Headers) -> None:
        self.state = next_state(self.state, ResponseEvent.START)
        self.status = status
        self.headers = dict(headers)

    def write(self, data: bytes) -> bool:
        self.state = next_state(self.state, ResponseEvent.WRITE)
        if self.state is ResponseState.STREAMING:
            self._append(data)
        return self.unread < self.high_water

    def end(self, data: bytes = b"", trailers: Headers = ()) -> None:
        self.state = next_state(self.state, ResponseEvent.END)
        if self.state is ResponseState.ENDED:
            self.trailers = dict(trailers)
            self._append(data)
            self._complete_if_read()

    def on_drained(self, callback: Callable[[], None]) -> None:
        if self.unread < self.low_water or self.state.closed:
            callback()
        else:
            self._drained.append(callback)

    def on_close(self, callback: Callable[[], None]) -> None:
        if self.state.closed and not self.state.ended:
            callback()
        elif not self.state.closed:
            self._closed.append(callback)

    def deliver(self) -> None:
        """The client reads everything written so far (and reads on as it did)."""
        self.unread = 0
        callbacks, self._drained = self._drained, []
        for callback in callbacks:
            callback()
        self._complete_if_read()

    def drain(self) -> None:
        """The client reads everything written so far, and every write from now on."""
        self.reading = True
        self.deliver()

    def disconnect(self) -> None:
        """The client goes away."""
        if self.state.closed:
            return
        ended = self.state.ended
        self.state = next_state(self.state, ResponseEvent.CLOSE)
        self.unread = 0
        self._drained.clear()
        callbacks, self._closed = self._closed, []
        if not ended:
            for callback in callbacks:
                callback()

    def _append(self, data: bytes) -> None:
        self.writes.append((self._clock(), data))
        if not self.reading:
            self.unread += len(data)

    def _complete_if_read(self) -> None:
        if self.state is ResponseState.ENDED and not self.unread:
            self.state = next_state(self.state, ResponseEvent.COMPLETE)
            self._closed.clear()


def make_simulator(**config: Any) -> Simulator:
    """A simulator with a fixed wall clock (``created`` == :data:`CREATED`).  Must be
    built inside trio (its engine clock is trio's)."""
    sim = Simulator(Config(**{"port": 0, "seed": 7, **config}))
    sim.ctx.wall_clock = lambda: float(CREATED)
    return sim


async def post(
    sim: Simulator, path: str, body: object, headers: Headers = (), response: FakeResponse | None = None
) -> FakeResponse:
    """Answer one request with ``sim`` (whose engine task must be running)."""
    response = response or FakeResponse()
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    request = HttpRequest("POST", path, headers=((b"content-type", b"application/json"), *headers), body=raw)
    await sim.app.handle(request, response)
    return response


def sse_payloads(body: bytes) -> list[Any]:
    """The decoded ``data:`` payloads of an event stream (``[DONE]`` as a string)."""
    assert body.endswith(b"\n\n"), body[-40:]
    events = body[:-2].split(b"\n\n")
    payloads = []
    for event in events:
        assert event.startswith(b"data: "), event
        data = event[len(b"data: ") :]
        payloads.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return payloads


class EngineRun:
    """A real Engine driven by hand with explicit times (no trio, no server): stream
    sinks write into :attr:`response`, stamped with the engine time of the step."""

    def __init__(self, **config: Any) -> None:
        self.now = 0.0
        self.engine = build_engine(Config(**{"port": 0, "seed": 1, **config}))
        self.response = FakeResponse(clock=lambda: self.now)
        self.response.start(200, ())

    def streaming_sink(self, renderer: StreamRenderer, job_count: int) -> StreamingSink:
        return StreamingSink(self.response, renderer, job_count, lambda job: self.engine.resume(job, self.now))

    def submit(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.engine.submit(job, self.now)

    def step_to(self, now: float) -> None:
        self.now = now
        self.engine.step(now)

    def run(self) -> None:
        """Step at every deadline until nothing is left to do."""
        while (deadline := self.engine.next_deadline()) != math.inf:
            self.step_to(deadline)

    def writes_at(self) -> dict[float, bytes]:
        """The bytes written in each step, by rounded step time."""
        steps: dict[float, bytes] = {}
        for when, data in self.response.writes:
            key = round(when, 6)
            steps[key] = steps.get(key, b"") + data
        return steps


def make_job(
    sink: JobSink, pieces: tuple[str, ...], finish_reason: str = "stop", *, index: int = 0, prompt_tokens: int = 3
) -> Job:
    return Job(
        prompt_token_ids=tuple(range(1, prompt_tokens + 1)),
        output=pieces,
        finish_reason=finish_reason,
        sink=sink,
        index=index,
        request_id="1",
    )


def turn_job(sink: JobSink, turn: TurnPlan, *, cap: int = 64) -> Job:
    """The one job of a request that says ``turn`` in answer to a 3-token prompt, built
    as the endpoints build theirs."""
    [job] = build_jobs(GenerationPlan.single("1", PromptPlan((1, 2, 3), cap), turn), sink)
    return job


@asynccontextmanager
async def running(**config: Any) -> AsyncIterator[Simulator]:
    """A simulator (see :func:`make_simulator`) with its engine task running."""
    sim = make_simulator(**config)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sim.run_engine)
        yield sim
        nursery.cancel_scope.cancel()
