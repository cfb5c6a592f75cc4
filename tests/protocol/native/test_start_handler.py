"""``start_handler``: an application that answers in two parts (``StartingApplication``
in llmsim.api.http) has its ``start`` called in the task that read the request, and
only what that leaves runs in a task of its own."""

from __future__ import annotations

import logging
from collections.abc import Awaitable

import attrs
import h2.config
import h2.connection
import h2.events
import pytest

from llmsim.api.http import HttpRequest, InjectedFaults, ResponseStream
from llmsim.faults import FAULT_HEADER
from llmsim.protocol.native.faulty import FaultInjection, run_with_faults
from llmsim.protocol.native.http2 import Http2Handler, Http2Stream
from tests.protocol.helpers import RecordingTransport, TestApp, settings

SSE = [(b"content-type", b"text/event-stream")]


@attrs.define(eq=False)
class StartingApp(TestApp):
    """``/open`` is started and left open (the test ends it, as an engine's sink would);
    ``/later`` leaves its whole handler (TestApp's ``/echo``) to await; ``/raise`` raises."""

    __test__ = False
    started: list[str] = attrs.field(factory=list)
    left_open: list[ResponseStream] = attrs.field(factory=list)

    def start(self, request: HttpRequest, response: ResponseStream) -> Awaitable[None] | None:
        self.started.append(request.path)
        if request.path == "/raise":
            raise RuntimeError("the test app fails on purpose, in start")
        if request.path == "/later":
            return self.handle(HttpRequest(request.method, "/echo", body=request.body), response)
        response.start(200, SSE)
        response.write(b"data: first\n\n")
        self.left_open.append(response)
        return None


def h2_client() -> h2.connection.H2Connection:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    return client


def head(path: str, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    return [(b":method", b"GET"), (b":path", path.encode()), (b":scheme", b"http"), (b":authority", b"x"), *extra]


@attrs.define
class Served:
    """One request read by an HTTP/2 handler on a recording transport."""

    handler: Http2Handler
    wire: RecordingTransport
    client: h2.connection.H2Connection

    @classmethod
    def request(cls, wire: RecordingTransport, path: str, *extra: tuple[bytes, bytes], reset: bool = False) -> Served:
        client = h2_client()
        client.send_headers(1, head(path, *extra), end_stream=True)
        if reset:
            client.reset_stream(1)
        handler = Http2Handler(wire)
        handler.receive(client.data_to_send())
        return cls(handler, wire, client)

    def statuses(self) -> list[bytes]:
        events = client_events(self.client, self.handler.outgoing())
        return [dict(e.headers)[b":status"] for e in events if isinstance(e, h2.events.ResponseReceived)]


def client_events(client: h2.connection.H2Connection, data: bytes) -> list[h2.events.Event]:
    return [event for event in client.receive_data(data) if not isinstance(event, h2.events.SettingsAcknowledged)]


async def test_start_runs_as_the_request_is_read_and_no_task_is_spawned() -> None:
    app = StartingApp()
    served = Served.request(RecordingTransport(app=app), "/open")
    assert app.started == ["/open"] and served.wire.spawned == []
    [response] = app.left_open
    response.end(b"data: last\n\n")  # ended later, from elsewhere
    events = client_events(served.client, served.handler.outgoing())
    body = b"".join(event.data for event in events if isinstance(event, h2.events.DataReceived))
    assert body == b"data: first\n\ndata: last\n\n"
    assert any(isinstance(event, h2.events.StreamEnded) for event in events)
    assert [dict(e.headers)[b":status"] for e in events if isinstance(e, h2.events.ResponseReceived)] == [b"200"]


async def test_what_start_leaves_runs_in_a_task() -> None:
    app = StartingApp()
    served = Served.request(RecordingTransport(app=app), "/later")
    [arguments] = served.wire.spawned
    assert app.started == ["/later"] and app.log == []  # the rest has not run yet
    await served.wire.spawned_functions[0](*arguments)
    assert app.log == ["start /echo", "end /echo"]
    assert served.statuses() == [b"200"]


async def test_a_start_that_raises_is_a_500(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        served = Served.request(RecordingTransport(app=StartingApp()), "/raise")
    assert served.wire.spawned == [] and served.statuses() == [b"500"]
    assert "handler for GET /raise failed" in caplog.text


async def test_a_request_with_faults_runs_whole_in_a_task_without_start() -> None:
    app = StartingApp()
    wire = Served.request(RecordingTransport(app=app), "/open", (FAULT_HEADER, b"stall-after=1")).wire
    [arguments] = wire.spawned
    assert app.started == [] and wire.spawned_functions == [run_with_faults]
    assert arguments[0] is app and arguments[3] == b"stall-after=1"


@pytest.mark.parametrize("starting", [True, False], ids=["start", "handle"])
async def test_fault_rate_is_rolled_once_per_request(starting: bool) -> None:
    """``--fault-rate`` rolls once for each request (a second roll would lower the rate
    and shift the seeded sequence): the first roll picks it, a second would not."""
    draws, rolls = iter([0.1, 0.9]), []

    def roll() -> float:
        rolls.append(1)
        return next(draws)

    def control() -> tuple[str | None, float]:
        return "stall-after=1", 0.5

    faults = FaultInjection(InjectedFaults(), control, seed=0)
    faults._rng.random = roll  # type: ignore[method-assign]
    app: TestApp = StartingApp() if starting else TestApp()
    wire = Served.request(RecordingTransport(app=app, settings=settings(faults=faults)), "/v1/models").wire
    assert len(rolls) == 1 and wire.spawned_functions == [run_with_faults]


async def test_a_request_reset_in_the_read_that_completed_it_never_starts() -> None:
    app = StartingApp()
    served = Served.request(RecordingTransport(app=app), "/open", reset=True)
    assert app.started == [] and served.wire.spawned == []
    assert not isinstance(served.handler._streams.get(1), Http2Stream)
