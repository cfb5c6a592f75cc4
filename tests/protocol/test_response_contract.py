"""Every ResponseStream backend against ``llmsim.testing.check_response_stream``.

Each harness serves one request whose handler hands its response to the checker and
then waits (or raises, when the checker says so).  The client reads only when the
checker says so: the native connections run over a lockstep stream pair (the
server's ``send_all`` waits for the client), the ASGI app's ``send`` is an unbuffered
channel.  ``read`` lets the client read until every task is blocked.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import attrs
import h11
import pytest
import trio
import trio.testing
from h2.errors import ErrorCodes

from llmsim.api.http import HttpRequest, ResponseStream
from llmsim.protocol.asgi.app import AsgiApp
from llmsim.protocol.asgi.stream import AsgiResponseStream
from llmsim.protocol.settings import ProtocolSettings
from llmsim.testing import ReceivedResponse, StreamUnderTest, check_response_stream
from tests.protocol.helpers import H2Client, open_memory_connection

SETTINGS = ProtocolSettings(high_water=4096, low_water=1024)


@attrs.define(eq=False)
class HandingApp:
    """An Application whose handler hands its response over, then waits for
    :attr:`fail` (to raise) or cancellation."""

    responses: trio.MemorySendChannel[ResponseStream]
    fail: trio.Event = attrs.field(factory=trio.Event)

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        self.responses.send_nowait(response)
        await self.fail.wait()
        raise RuntimeError("the contract check fails this handler on purpose")


def handing_app() -> tuple[HandingApp, trio.MemoryReceiveChannel[ResponseStream]]:
    send, receive = trio.open_memory_channel[ResponseStream](1)
    return HandingApp(send), receive


async def read_until_blocked(read_forever: Callable[[], Awaitable[None]]) -> None:
    """Run ``read_forever`` until nothing in the test moves any more."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_forever)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()


# --- native HTTP/1.1 ----------------------------------------------------------------------


@attrs.define(eq=False)
class NativeH1Stream:
    response: ResponseStream
    app: HandingApp
    client: trio.abc.HalfCloseableStream
    high_water: int = SETTINGS.high_water
    low_water: int = SETTINGS.low_water
    conn: h11.Connection = attrs.field(factory=lambda: h11.Connection(h11.CLIENT))
    head: h11.Response | None = None
    body: list[bytes] = attrs.field(factory=list)
    complete: bool = False
    gone: bool = False
    trailers: tuple[tuple[bytes, bytes], ...] = ()

    async def read(self) -> None:
        if not self.gone:
            await read_until_blocked(self._read_forever)

    async def _read_forever(self) -> None:
        while True:
            event = self._next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(bytes(await self.client.receive_some(65536)))
            elif isinstance(event, h11.Response):
                self.head = event
            elif isinstance(event, h11.Data):
                self.body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self.complete = True
                self.trailers = tuple(event.headers)
            else:  # the connection closed, or a body cut short
                await trio.sleep_forever()

    def _next_event(self) -> object:
        try:
            return self.conn.next_event()
        except h11.RemoteProtocolError:  # the connection closed mid-body
            return h11.ConnectionClosed()

    async def disconnect(self) -> None:
        self.gone = True
        await self.client.aclose()
        await trio.testing.wait_all_tasks_blocked()

    async def fail_handler(self) -> None:
        self.app.fail.set()
        await trio.testing.wait_all_tasks_blocked()

    def received(self) -> ReceivedResponse:
        status = None if self.head is None else self.head.status_code
        headers = () if self.head is None else tuple(self.head.headers)
        return ReceivedResponse(status, headers, b"".join(self.body), self.complete, self.trailers)


@asynccontextmanager
async def native_h1_stream() -> AsyncIterator[StreamUnderTest]:
    app, responses = handing_app()
    async with open_memory_connection(app, SETTINGS, pair=trio.testing.lockstep_stream_pair) as mc:
        peer = NativeH1Stream(await _first_response(mc.client, responses), app, mc.client)
        yield peer


async def _first_response(
    client: trio.abc.SendStream, responses: trio.MemoryReceiveChannel[ResponseStream]
) -> ResponseStream:
    await client.send_all(b"GET /contract HTTP/1.1\r\nHost: x\r\n\r\n")
    return await responses.receive()


# --- native HTTP/2 ------------------------------------------------------------------------


@attrs.define(eq=False)
class NativeH2Stream:
    response: ResponseStream
    app: HandingApp
    client: H2Client
    sid: int
    high_water: int = SETTINGS.high_water
    low_water: int = SETTINGS.low_water
    gone: bool = False

    async def read(self) -> None:
        if not self.gone:
            await read_until_blocked(self._read_forever)

    async def _read_forever(self) -> None:
        while not self.client.eof:
            await self.client.pump()
        await trio.sleep_forever()

    async def disconnect(self) -> None:
        """RST_STREAM while the stream is open; once it has ended, the connection closes."""
        if self.client.records[self.sid].done:
            await self.client.stream.aclose()
        else:
            self.client.conn.reset_stream(self.sid, ErrorCodes.CANCEL)
            await self.client.flush()
        self.gone = True
        await trio.testing.wait_all_tasks_blocked()

    async def fail_handler(self) -> None:
        self.app.fail.set()
        await trio.testing.wait_all_tasks_blocked()

    def received(self) -> ReceivedResponse:
        record = self.client.records[self.sid]
        headers = tuple(record.headers.items()) if record.headers else ()
        status = int(record.headers[b":status"]) if record.headers else None
        return ReceivedResponse(status, headers, record.body, record.ended, record.trailers)


@asynccontextmanager
async def native_h2_stream() -> AsyncIterator[StreamUnderTest]:
    app, responses = handing_app()
    async with open_memory_connection(app, SETTINGS, pair=trio.testing.lockstep_stream_pair) as mc:
        client = H2Client(mc.client)
        await client.start()
        sid = await client.request("/contract")
        peer = NativeH2Stream(await responses.receive(), app, client, sid)
        await peer.read()  # the server's SETTINGS
        yield peer


# --- ASGI ---------------------------------------------------------------------------------


@attrs.define(eq=False)
class AsgiStream:
    response: AsgiResponseStream
    app: HandingApp
    inbox: trio.MemorySendChannel[dict[str, Any]]
    sent: trio.MemoryReceiveChannel[dict[str, Any]]
    status: int | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: list[bytes] = attrs.field(factory=list)
    complete: bool = False
    trailers_declared: bool = False  # http.response.start said trailers follow the body
    trailers: tuple[tuple[bytes, bytes], ...] = ()

    @property
    def high_water(self) -> int:
        return self.response.high_water

    @property
    def low_water(self) -> int:
        return self.response.low_water

    async def read(self) -> None:
        await read_until_blocked(self._read_forever)

    async def _read_forever(self) -> None:
        async for message in self.sent:
            if message["type"] == "http.response.start":
                self.status, self.headers = message["status"], tuple(message["headers"])
                self.trailers_declared = message.get("trailers", False)
            elif message["type"] == "http.response.trailers":
                self.trailers, self.complete = tuple(message["headers"]), not message["more_trailers"]
            elif self.trailers_declared:
                self.body.append(message["body"])
            else:
                self.body.append(message["body"])
                self.complete = not message["more_body"]

    async def disconnect(self) -> None:
        self.inbox.send_nowait({"type": "http.disconnect"})
        await trio.testing.wait_all_tasks_blocked()

    async def fail_handler(self) -> None:
        self.app.fail.set()
        await trio.testing.wait_all_tasks_blocked()

    def received(self) -> ReceivedResponse:
        return ReceivedResponse(self.status, self.headers, b"".join(self.body), self.complete, self.trailers)


@asynccontextmanager
async def asgi_stream(*, http2_trailers: bool = False) -> AsyncIterator[StreamUnderTest]:
    """Under an HTTP/1.1 scope; or, with ``http2_trailers``, under an HTTP/2 one whose
    server offers ``http.response.trailers`` and whose client sent ``te: trailers``."""
    app, responses = handing_app()
    inbox, receive = trio.open_memory_channel[dict[str, Any]](math.inf)
    send, sent = trio.open_memory_channel[dict[str, Any]](0)  # send() waits for the client
    inbox.send_nowait({"type": "http.request", "body": b"", "more_body": False})
    scope: dict[str, Any] = {"type": "http", "http_version": "1.1", "method": "GET", "scheme": "http", "path": "/"}
    scope["headers"] = []
    if http2_trailers:
        scope.update(http_version="2", headers=[(b"te", b"trailers")], extensions={"http.response.trailers": {}})

    async def serve() -> None:
        try:
            await AsgiApp(app)(scope, receive.receive, send.send)  # type: ignore[arg-type]
        except* RuntimeError:
            pass  # the failing handler: under hypercorn, the server cuts the response

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        response = await responses.receive()
        assert isinstance(response, AsgiResponseStream)
        yield AsgiStream(response, app, inbox, sent)
        nursery.cancel_scope.cancel()


# --- the checks ---------------------------------------------------------------------------


def asgi_h2_stream() -> AbstractAsyncContextManager[StreamUnderTest]:
    return asgi_stream(http2_trailers=True)


@pytest.mark.parametrize("open_stream", [native_h1_stream, native_h2_stream, asgi_stream, asgi_h2_stream])
async def test_every_backend_keeps_the_response_stream_contract(
    open_stream: Callable[[], Any], caplog: pytest.LogCaptureFixture
) -> None:
    await check_response_stream(open_stream, trailers=open_stream is not asgi_stream)
