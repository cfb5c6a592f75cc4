"""The per-request path of the HTTP/2 handler where it inlines a step: the body-read
clock stops as a request's handler starts (``Http2Handler._start_handler``), the head
leaves h2's stream on the response for the per-token write (``Http2Output._send_head``),
the informational path is chosen by the status as before, and ``Connection.spawn``
is the nursery's ``start_soon`` while the connection serves."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import pytest
import trio
import trio.testing

from llmsim.protocol.native import h2_output
from llmsim.protocol.native.connection import Connection
from llmsim.protocol.native.http2 import Http2Handler, Http2Stream
from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings
from tests.protocol.helpers import H2Client, RecordingTransport, TestApp, open_memory_connection, settings

SSE = [(b"content-type", b"text/event-stream")]


async def test_a_request_whose_body_is_complete_is_not_reset_at_the_body_read_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The body-read clock runs until the request ends: a handler that then holds the
    stream for longer than the timeout is answered in full, not reset (CANCEL)."""
    app = TestApp()
    async with open_memory_connection(app, settings(body_read_timeout=5.0, keep_alive_timeout=60.0)) as mc:
        client = H2Client(mc.client)
        await client.start()
        sid = await client.request("/hold", method="POST", body=b"a body")
        await app.holding.wait()
        await trio.sleep(20.0)
        app.release.set()
        record = await client.response(sid)
    assert record.reset is None and record.headers is not None and record.headers[b":status"] == b"200"
    assert record.body == b"data: first\n\ndata: last\n\n"
    assert app.log == ["start /hold", "end /hold"]


def opened_stream(handler: Http2Handler, wire: RecordingTransport) -> Http2Stream:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    head = [(b":method", b"GET"), (b":path", b"/x"), (b":scheme", b"http"), (b":authority", b"x")]
    client.send_headers(1, head, end_stream=True)
    handler.receive(client.data_to_send())
    [arguments] = wire.spawned  # run_handler(app, request, stream, faults)
    stream: Http2Stream = arguments[2]
    return stream


@pytest.mark.parametrize("body", [b"", b"data: first\n\n"])
async def test_the_head_leaves_h2s_stream_for_the_per_token_write(body: bytes) -> None:
    """Once the head is sent, the next write is framed at once into the next batch
    (``Http2Stream.write``), as it was when the head's batch looked the stream up again."""
    wire = RecordingTransport()
    handler = Http2Handler(wire)
    stream = opened_stream(handler, wire)
    stream.start(200, SSE)
    if body:
        stream.write(body)
    handler.outgoing()
    handler.flushed()
    assert stream.h2stream is handler._h2.streams[1]
    assert stream.write(b"data: token\n\n")
    # (The compiled write appends the frame as one item, the pure one as header and payload.)
    assert not stream.buffered and not stream.queued and b"".join(handler._frames).endswith(b"data: token\n\n")


@pytest.mark.parametrize("status", [103, 200, 204, 404, 999, 1000, 1999])
async def test_the_informational_path_is_taken_for_a_status_that_starts_with_a_1(
    status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h2's own path for a head whose decimal status starts with 1 (as h2 tells an
    informational response), the hand-made HEADERS for any other."""
    by_hand: list[int] = []
    send = h2_output.send_response_head

    def record(*args: Any) -> None:
        by_hand.append(args[3])
        send(*args)

    monkeypatch.setattr(h2_output, "send_response_head", record)
    wire = RecordingTransport()
    handler = Http2Handler(wire)
    stream = opened_stream(handler, wire)
    stream.start(status, SSE)
    sent = handler._h2.send_headers
    through_h2: list[int] = []
    handler._h2.send_headers = lambda sid, fields, end_stream=False: through_h2.append(status)  # type: ignore[method-assign]
    try:
        handler.outgoing()
    finally:
        handler._h2.send_headers = sent  # type: ignore[method-assign]
    informational = str(status).startswith("1")
    assert (through_h2, by_hand) == (([status], []) if informational else ([], [status]))


async def test_spawn_is_the_nurserys_start_soon_while_the_connection_serves() -> None:
    """Before the connection serves there is no nursery: a spawn fails loudly."""
    app = TestApp()
    async with open_memory_connection(app, settings()) as mc:
        client = H2Client(mc.client)
        await client.start()
        record = await client.response(await client.request("/health"))
        assert record.headers is not None and record.headers[b":status"] == b"200"
        assert mc.connection._nursery is not None
        assert mc.connection.spawn == mc.connection._nursery.start_soon
    left, _ = trio.testing.memory_stream_pair()
    idle = Connection(left, app, ProtocolSettings(), ConnectionTracker())
    with pytest.raises(AssertionError):
        idle.spawn(trio.sleep, 0)
