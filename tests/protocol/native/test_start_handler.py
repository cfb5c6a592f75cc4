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


def served(app: StartingApp) -> tuple[Http2Handler, RecordingTransport]:
    wire = RecordingTransport(app=app)
    return Http2Handler(wire), wire


def client_events(client: h2.connection.H2Connection, data: bytes) -> list[h2.events.Event]:
    return [event for event in client.receive_data(data) if not isinstance(event, h2.events.SettingsAcknowledged)]


async def test_start_runs_as_the_request_is_read_and_no_task_is_spawned() -> None:
    app = StartingApp()
    handler, wire = served(app)
    client = h2_client()
    client.send_headers(1, head("/open"), end_stream=True)
    handler.receive(client.data_to_send())
    assert app.started == ["/open"] and wire.spawned == []
    [response] = app.left_open
    response.end(b"data: last\n\n")  # ended later, from elsewhere
    events = client_events(client, handler.outgoing())
    handler.flushed()
    body = b"".join(event.data for event in events if isinstance(event, h2.events.DataReceived))
    assert body == b"data: first\n\ndata: last\n\n"
    assert any(isinstance(event, h2.events.StreamEnded) for event in events)
    assert [dict(e.headers)[b":status"] for e in events if isinstance(e, h2.events.ResponseReceived)] == [b"200"]


async def test_what_start_leaves_runs_in_a_task() -> None:
    app = StartingApp()
    handler, wire = served(app)
    client = h2_client()
    client.send_headers(1, head("/later"), end_stream=True)
    handler.receive(client.data_to_send())
    [arguments] = wire.spawned
    assert app.started == ["/later"] and app.log == []  # the rest has not run yet
    await wire.spawned_functions[0](*arguments)
    assert app.log == ["start /echo", "end /echo"]
    events = client_events(client, handler.outgoing())
    assert [dict(e.headers)[b":status"] for e in events if isinstance(e, h2.events.ResponseReceived)] == [b"200"]


async def test_a_start_that_raises_is_a_500(caplog: pytest.LogCaptureFixture) -> None:
    app = StartingApp()
    handler, wire = served(app)
    client = h2_client()
    client.send_headers(1, head("/raise"), end_stream=True)
    with caplog.at_level(logging.ERROR):
        handler.receive(client.data_to_send())
    events = client_events(client, handler.outgoing())
    assert wire.spawned == []
    assert [dict(e.headers)[b":status"] for e in events if isinstance(e, h2.events.ResponseReceived)] == [b"500"]
    assert "handler for GET /raise failed" in caplog.text


async def test_a_request_with_faults_runs_whole_in_a_task_without_start() -> None:
    app = StartingApp()
    handler, wire = served(app)
    client = h2_client()
    client.send_headers(1, head("/open", (FAULT_HEADER, b"stall-after=1")), end_stream=True)
    handler.receive(client.data_to_send())
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
    wire = RecordingTransport(app=app, settings=settings(faults=faults))
    handler = Http2Handler(wire)
    client = h2_client()
    client.send_headers(1, head("/v1/models"), end_stream=True)
    handler.receive(client.data_to_send())
    assert len(rolls) == 1 and wire.spawned_functions == [run_with_faults]


async def test_a_request_reset_in_the_read_that_completed_it_never_starts() -> None:
    app = StartingApp()
    handler, wire = served(app)
    client = h2_client()
    client.send_headers(1, head("/open"), end_stream=True)
    client.reset_stream(1)
    handler.receive(client.data_to_send())
    assert app.started == [] and wire.spawned == []
    assert not isinstance(handler._streams.get(1), Http2Stream)
