"""``x-llmsim-fault`` on the native server, the first faults (reset, GOAWAY, close, small
frames, delays, stall, trailers): the exact frames (h2 as the client over a real socket),
the exact HTTP/1.1 bytes, and what httpx does with each (helpers: ``faultwire``)."""

from __future__ import annotations

import json

import attrs
import h2.config
import h2.connection
import h2.exceptions
import httpx
import hyperframe.frame
import pytest
import trio
import trio.testing
from h2.errors import ErrorCodes

from llmsim.api.http import HttpRequest, ResponseStream
from llmsim.protocol.native.faulty import FaultyResponse
from llmsim.protocol.native.http1 import Http1Response
from tests.protocol.helpers import H1Client, open_memory_connection
from tests.protocol.native.faultwire import (
    DATA,
    END,
    HEAD,
    RawH2,
    assert_one_event_per_frame,
    chunks,
    closed,
    events,
    http1,
    httpx_stream,
    shape,
    simulator,
)


async def test_without_the_header_the_frames_are_todays() -> None:
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post(None)
        await client.read_until(closed(sid))
    assert shape(client.on(sid))[0] == HEAD and shape(client.on(sid))[-1][1] == {"END_STREAM"}
    assert b"".join(events(client.on(sid))).endswith(b"data: [DONE]\n\n")


async def test_every_event_leaves_in_its_own_data_frame(autojump_clock: trio.testing.MockClock) -> None:
    """4 tokens: one DATA frame per write (the last token's chunk and ``[DONE]`` are one
    ``end()``), then an empty DATA frame with END_STREAM.  (On the autojump clock: on
    the real one, a step a loaded machine starts late writes two tokens at once.)"""
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post("stall=0:0", max_tokens=4)
        await client.read_until(closed(sid))
    frames = client.on(sid)
    assert shape(frames) == [HEAD, *[DATA] * (len(frames) - 2), END]
    # The last token's chunk and [DONE] are one end(); two tokens may share an engine step.
    assert len(events(frames)) >= 2
    assert events(frames)[-1].endswith(b"data: [DONE]\n\n")
    assert all(f.length == len(f.data) for f in frames if f.kind == "Data")
    assert_one_event_per_frame(frames[:-2])


@pytest.mark.parametrize(
    ("fault", "code"),
    [("rst-after=2", ErrorCodes.CANCEL), ("rst-after=2,code=REFUSED_STREAM", ErrorCodes.REFUSED_STREAM)],
)
async def test_rst_after_resets_after_n_events_and_frees_the_slot(fault: str, code: ErrorCodes) -> None:
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post(fault, max_tokens=200)
        await client.read_until(closed(sid))
        stats = server.sim.engine.statistics()
        second = await client.post(None, max_tokens=2)  # the connection lives on
        await client.read_until(closed(second))
    assert shape(client.on(sid)) == [HEAD, DATA, DATA, ("RstStream", frozenset(), code)]
    assert_one_event_per_frame(client.on(sid))
    # The slot was freed by the reset itself, long before 200 tokens (1 s) could finish.
    assert (stats.running, stats.cancelled, stats.finished) == (0, 1, 0)
    assert shape(client.on(second))[-1] == END


async def test_rst_after_zero_resets_right_after_the_head() -> None:
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post("rst-after=0,code=INTERNAL_ERROR")
        await client.read_until(closed(sid))
    assert shape(client.on(sid)) == [HEAD, ("RstStream", frozenset(), ErrorCodes.INTERNAL_ERROR)]


async def test_goaway_after_finishes_the_stream_and_refuses_new_ones() -> None:
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post("goaway-after=1", max_tokens=10)
        await client.read_until(lambda frames: any(f.kind == "GoAway" for f in frames))
        refused = await client.post(None)  # sent after the GOAWAY arrived: a misbehaving client
        await client.read_until(lambda frames: False)  # to EOF: the server closes when done
    goaway = next(f for f in client.frames if f.kind == "GoAway")
    assert (goaway.stream_id, goaway.last_stream_id, goaway.code) == (0, sid, ErrorCodes.NO_ERROR)
    mine = [f for f in client.frames if f.stream_id in (0, sid) and f.kind not in ("Settings", "WindowUpdate")]
    assert shape(mine)[:4] == [HEAD, DATA, ("GoAway", frozenset(), 0), DATA]
    assert shape(mine)[-1] == END and events(mine)[-1].endswith(b"data: [DONE]\n\n")
    assert shape(client.on(refused)) == [("RstStream", frozenset(), ErrorCodes.REFUSED_STREAM)]
    assert client.eof


async def test_goaway_resets_later_streams_already_open_with_refused_stream() -> None:
    async with simulator() as server:
        client = await server.h2()
        first = await client.post("goaway-after=2", max_tokens=20)
        later = await client.post(None, max_tokens=200)
        await client.read_until(lambda frames: closed(first)(frames) and closed(later)(frames))
    assert shape(client.on(later))[-1] == ("RstStream", frozenset(), ErrorCodes.REFUSED_STREAM)
    assert shape(client.on(first))[-1] == END


async def test_close_after_closes_the_connection_without_goaway() -> None:
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post("close-after=3", max_tokens=200)
        await client.read_until(lambda frames: False)
        stats = server.sim.engine.statistics()
    assert shape(client.on(sid)) == [HEAD, DATA, DATA, DATA]
    assert not [f for f in client.frames if f.kind in ("GoAway", "RstStream")]
    assert (stats.running, stats.cancelled) == (0, 1)


async def test_frame_size_splits_every_event_into_frames_of_n_bytes() -> None:
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post("frame-size=7", max_tokens=2)
        await client.read_until(closed(sid))
    frames = client.on(sid)
    assert shape(frames)[0] == HEAD and shape(frames)[-1] == END
    # Full frames of 7 bytes, only the last piece of each event shorter.
    event = b""
    for frame in frames[1:-1]:
        event += frame.data
        assert frame.length == 7 or (frame.length < 7 and event.endswith(b"\n\n")), (frame, event)
        if event.endswith(b"\n\n"):
            event = b""
    assert b"".join(events(frames)).endswith(b"data: [DONE]\n\n")


async def test_delay_headers_holds_the_head() -> None:
    async with simulator() as server:
        client = await server.h2()
        started = trio.current_time()
        sid = await client.post("delay-headers=300", max_tokens=1)
        await client.read_until(lambda frames: any(f.kind == "Headers" for f in frames))
        waited = trio.current_time() - started
        await client.read_until(closed(sid))
    assert waited >= 0.3
    assert shape(client.on(sid))[0] == HEAD


async def test_stall_stops_sending_after_n_events() -> None:
    """The second event comes 300 ms after the first at the earliest (measured from the
    request's sending: from the first event's arrival, a loaded machine delivering it
    late would shorten the gap; unstalled, the whole answer takes about 55 ms)."""
    async with simulator() as server:
        client = await server.h2()
        sent_at = trio.current_time()
        sid = await client.post("stall=1:300", max_tokens=10)
        await client.read_until(lambda frames: len(events(frames)) == 1)
        first = trio.current_time() - sent_at
        await client.read_until(lambda frames: len(events(frames)) == 2)
        gap = trio.current_time() - sent_at
        await client.read_until(closed(sid))
    assert first < 0.3  # (about 5 ms: the stall comes after it)
    assert gap >= 0.3
    assert shape(client.on(sid))[-1] == END


async def test_trailers_end_the_stream_with_a_headers_frame() -> None:
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post("trailers=grpc-status:0,x-note:fault injected", max_tokens=2)
        await client.read_until(closed(sid))
    frames = client.on(sid)
    assert shape(frames) == [
        HEAD,
        *[DATA] * (len(frames) - 2),
        ("Headers", frozenset({"END_HEADERS", "END_STREAM"}), None),
    ]
    assert frames[-1].fields == ((b"grpc-status", b"0"), (b"x-note", b"fault injected"))


async def test_a_malformed_header_is_a_400_naming_the_fault() -> None:
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post("rst-after=2; bogus=1")
        await client.read_until(closed(sid))
        stats = server.sim.engine.statistics()
    frames = client.on(sid)
    assert dict(frames[0].fields)[b":status"] == b"400"
    error = json.loads(b"".join(f.data for f in frames))["error"]
    assert "bogus=1" in error["message"] and error["type"] == "BadRequestError" and error["code"] == 400
    assert stats.submitted == 0


async def test_http1_rst_after_closes_mid_body() -> None:
    async with simulator() as server:
        raw = await http1(server.handle.port, "rst-after=2", max_tokens=200)
        stats = server.sim.engine.statistics()
    head, payloads, rest = chunks(raw)
    assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in head.lower()
    assert len(payloads) == 2 and rest == b""  # no terminating chunk: the connection just closed
    assert (stats.running, stats.cancelled) == (0, 1)


async def test_http1_close_after_closes_mid_body() -> None:
    async with simulator() as server:
        raw = await http1(server.handle.port, "close-after=1", max_tokens=200)
    _, payloads, rest = chunks(raw)
    assert len(payloads) == 1 and rest == b""


async def test_http1_goaway_after_says_connection_close_and_closes_after_the_response() -> None:
    async with simulator() as server:
        raw = await http1(server.handle.port, "goaway-after=1", max_tokens=2)
    head, payloads, rest = chunks(raw)
    assert b"\r\nconnection: close" in head.lower()
    assert payloads[-1].endswith(b"data: [DONE]\n\n") and rest == b"0\r\n\r\n"


async def test_http1_frame_size_sends_chunks_of_n_bytes() -> None:
    async with simulator() as server:
        raw = await http1(server.handle.port, "frame-size=16", max_tokens=2)
    _, payloads, rest = chunks(raw)
    assert rest == b"0\r\n\r\n"
    assert all(len(p) <= 16 for p in payloads) and max(len(p) for p in payloads) == 16
    assert b"".join(payloads).endswith(b"data: [DONE]\n\n")


async def test_http1_trailers_follow_the_last_chunk() -> None:
    async with simulator() as server:
        raw = await http1(server.handle.port, "trailers=x-a:1,x-b:two", max_tokens=1)
    _, payloads, rest = chunks(raw)
    assert payloads[-1].endswith(b"data: [DONE]\n\n")
    assert rest == b"0\r\nx-a: 1\r\nx-b: two\r\n\r\n"


async def test_http1_malformed_header_is_a_400() -> None:
    async with simulator() as server:
        raw = await http1(server.handle.port, "stall=3")
    assert raw.startswith(b"HTTP/1.1 400 ")
    assert b"stall=3" in raw and b"expected stall=AFTER_EVENTS:MS" in raw


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
async def test_httpx_raises_remote_protocol_error_on_a_reset(http2: bool) -> None:
    async with simulator() as server:
        lines, error = await httpx_stream(server.handle.port, "rst-after=2", http2=http2)
    assert 2 <= len(lines) < 51  # (a write may carry two tokens if the engine fell behind)
    assert isinstance(error, httpx.RemoteProtocolError)


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
async def test_httpx_raises_remote_protocol_error_on_a_close(http2: bool) -> None:
    async with simulator() as server:
        lines, error = await httpx_stream(server.handle.port, "close-after=1", http2=http2)
    assert 1 <= len(lines) < 51
    assert isinstance(error, httpx.RemoteProtocolError)


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
async def test_httpx_reads_small_frames_and_trailers_in_full(http2: bool) -> None:
    async with simulator() as server:
        lines, error = await httpx_stream(server.handle.port, "frame-size=5; trailers=x-a:1", http2=http2)
    assert error is None and lines[-1] == "data: [DONE]" and len(lines) == 51


async def test_httpx_http1_reads_the_response_before_connection_close() -> None:
    async with simulator() as server:
        lines, error = await httpx_stream(server.handle.port, "goaway-after=1", http2=False)
    assert error is None and lines[-1] == "data: [DONE]" and len(lines) == 51


async def test_httpx_http2_fails_the_stream_a_graceful_goaway_names() -> None:
    """httpcore treats any GOAWAY as the end of every stream, even the one its
    last-stream-id says will complete (RFC 9113 6.8): a client bug this fault exposes.
    When the next DATA frame arrives in the same read as the GOAWAY, h2 (inside httpcore)
    even raises its own ``ProtocolError`` ("RECV_DATA in state CLOSED"), which escapes
    httpx's exception classes: a second bug, seen on a loaded machine. h2 raises from
    ``receive_data`` and so drops every event of that read: when the HEADERS and the
    first token's DATA frame came in the same read, httpx yields no line at all
    (``test_h2_drops_the_whole_read_at_data_after_goaway`` shows it without timing)."""
    async with simulator() as server:
        lines, error = await httpx_stream(server.handle.port, "goaway-after=1", http2=True)
    if isinstance(error, h2.exceptions.ProtocolError):
        assert len(lines) < 51
        assert "Invalid input ConnectionInputs.RECV_DATA in state ConnectionState.CLOSED" in str(error)
    else:
        assert 1 <= len(lines) < 51
        assert isinstance(error, httpx.RemoteProtocolError) and "ConnectionTerminated error_code:0" in str(error)


def test_h2_drops_the_whole_read_at_data_after_goaway() -> None:
    """The client side of the flake above, without a server: one read holding a stream's
    HEADERS and DATA, a graceful GOAWAY naming that stream, then its next DATA frame makes
    h2 raise, and the HEADERS and first DATA it had parsed are lost with the exception."""
    config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    server_config = h2.config.H2Configuration(client_side=False)
    client, server = h2.connection.H2Connection(config), h2.connection.H2Connection(server_config)
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    client.send_headers(
        1, [(":method", "GET"), (":path", "/"), (":scheme", "http"), (":authority", "x")], end_stream=True
    )
    server.receive_data(client.data_to_send())
    server.send_headers(1, [(":status", "200")])
    server.send_data(1, b"data: 1\n\n")
    goaway = hyperframe.frame.GoAwayFrame(0)
    goaway.last_stream_id = 1
    after = hyperframe.frame.DataFrame(1)
    after.data = b"data: 2\n\n"
    with pytest.raises(h2.exceptions.ProtocolError, match=r"RECV_DATA in state ConnectionState\.CLOSED"):
        client.receive_data(server.data_to_send() + goaway.serialize() + after.serialize())


# --- the normal path -------------------------------------------------------------------------


@attrs.define(eq=False)
class SeeingApp:
    """Records the response object each request's handler is given."""

    seen: list[object] = attrs.field(factory=list)

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        self.seen.append(response)
        response.start(200, [(b"content-length", b"2")])
        response.end(b"ok")


async def test_only_a_request_with_the_header_gets_the_fault_wrapper() -> None:
    app = SeeingApp()
    async with open_memory_connection(app) as mc:
        client = H1Client(mc.client)
        plain = await client.request("GET", "/")
        faulted = await client.request("GET", "/", headers=(("x-llmsim-fault", "frame-size=1"),))
    assert plain[1] == faulted[1] == b"ok"
    assert type(app.seen[0]) is Http1Response and type(app.seen[1]) is FaultyResponse


async def reset_and_sync(client: RawH2, sid: int) -> None:
    """RST_STREAM ``sid``, then a PING: once its ACK is back, the server has handled the reset."""
    client.conn.reset_stream(sid)
    client.conn.ping(b"12345678")
    await client.stream.send_all(client.conn.data_to_send())
    await client.read_until(lambda frames: any(f.kind == "Ping" and "ACK" in f.flags for f in frames))


async def test_a_client_reset_during_a_stall_cancels_the_request() -> None:
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post("stall=1:5000", max_tokens=200)
        await client.read_until(lambda frames: len(events(frames)) == 1)
        await reset_and_sync(client, sid)
        stats = server.sim.engine.statistics()
    assert (stats.running, stats.cancelled, stats.finished) == (0, 1, 0)
    assert shape(client.on(sid)) == [HEAD, DATA]


async def test_a_client_reset_during_a_held_head_cancels_the_handler() -> None:
    async with simulator() as server:
        client = await server.h2()
        sid = await client.post("delay-headers=5000", max_tokens=200)
        await reset_and_sync(client, sid)
        # (The handler may not have reached the engine yet: look once another request is done.)
        second = await client.post(None, max_tokens=2)
        await client.read_until(closed(second))
        stats = server.sim.engine.statistics()
    assert (stats.running, stats.finished) == (0, 1)  # 200 tokens would still be running
    assert client.on(sid) == []
