"""HTTP/2 under abuse (issue 17): floods, rapid reset, slow and silent clients, huge
frames, and what the server keeps per connection.

Each test sends a few hundred frames (the limits are set low), checks that the limit
triggers with the right frame and error code, and that the other streams or
connections keep being served.  The full-size attacks are in ``benchmarks/attacks_h2.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import h11
import trio
import trio.testing
from h2.errors import ErrorCodes
from hpack import Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from llmsim.protocol.native.h2_fastpath import ServerConnection
from llmsim.protocol.native.http2 import Http2Handler
from tests.protocol.helpers import (
    H1Client,
    H2Client,
    MemoryConnection,
    StreamRecord,
    TestApp,
    open_memory_connection,
    settings,
    split_frames,
)
from tests.protocol.native.faultwire import MODEL, simulator

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize()
REQUEST = [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/echo"), (b":authority", b"t")]


def head(encoder: Encoder, sid: int, fields: list[tuple[bytes, bytes]] = REQUEST, *, end: bool = True) -> bytes:
    frame = HeadersFrame(sid, data=encoder.encode(fields), flags=["END_HEADERS"])
    if end:
        frame.flags.add("END_STREAM")
    return frame.serialize()


def parse(data: bytes) -> list[Frame]:
    """Every whole frame in ``data``."""
    return [frame for frame, _ in split_frames(data)[0]]


async def until_eof(stream: trio.abc.ReceiveStream) -> list[Frame]:
    """Every frame the server sends until it closes."""
    chunks = []
    while data := await stream.receive_some(65536):
        chunks.append(data)
    return parse(b"".join(chunks))


def goaways(frames: list[Frame]) -> list[int]:
    return [frame.error_code for frame in frames if isinstance(frame, GoAwayFrame)]


def count(frames: list[Frame], kind: type[Frame], test: Callable[[Frame], bool] = lambda frame: True) -> int:
    return sum(1 for frame in frames if isinstance(frame, kind) and test(frame))


def handler(mc: MemoryConnection) -> Http2Handler:
    assert isinstance(mc.connection.handler, Http2Handler)
    return mc.connection.handler


async def served_elsewhere(app: TestApp, **limits: float) -> None:
    """A second connection of the same server answers a request as usual."""
    async with open_memory_connection(app, settings(**limits)) as other:
        client = H2Client(other.client)
        await client.start()
        record = await client.response(await client.request("/echo"))
    assert record.headers is not None and record.headers[b":status"] == b"200"


# --- PING and SETTINGS floods -----------------------------------------------------------------


async def test_a_ping_flood_gets_goaway_enhance_your_calm_after_its_burst() -> None:
    """10 a second: a burst of 100 control frames (the client's SETTINGS, then 99 PINGs)
    is answered, the next PING ends the connection, and nothing after it is even parsed
    (no ACK for the other 100)."""
    app = TestApp()
    async with open_memory_connection(app, settings(h2_control_frame_rate=10)) as mc:
        pings = b"".join(PingFrame(0, opaque_data=b"%08d" % i).serialize() for i in range(200))
        await mc.client.send_all(PREFACE + pings)
        frames = await until_eof(mc.client)
        await served_elsewhere(app, h2_control_frame_rate=10)
    assert count(frames, PingFrame, lambda frame: "ACK" in frame.flags) == 99
    assert goaways(frames) == [ErrorCodes.ENHANCE_YOUR_CALM]


async def test_pings_within_the_rate_are_all_answered(autojump_clock: trio.testing.MockClock) -> None:
    async with open_memory_connection(TestApp(), settings(h2_control_frame_rate=10)) as mc:
        client = H2Client(mc.client)
        await client.start()
        for second in range(30):  # 300 PINGs in 30 s: 10 a second, never over the burst
            for i in range(10):
                client.conn.ping(b"%04d%04d" % (second, i))
            await client.flush()
            await trio.sleep(1)
        record = await client.response(await client.request("/echo"))
    assert record.headers is not None and not client.goaways


async def test_a_settings_flood_gets_the_same_goaway() -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(h2_control_frame_rate=10)) as mc:
        flood = b"".join(SettingsFrame(0, settings={0x3: 100}).serialize() for _ in range(200))
        await mc.client.send_all(PREFACE + flood)
        frames = await until_eof(mc.client)
        await served_elsewhere(app, h2_control_frame_rate=10)
    # The client's first SETTINGS (in PREFACE) and 99 of the flood are acknowledged.
    assert count(frames, SettingsFrame, lambda frame: "ACK" in frame.flags) == 100
    assert goaways(frames) == [ErrorCodes.ENHANCE_YOUR_CALM]


async def test_priority_and_empty_data_frames_count_as_control_frames() -> None:
    async with open_memory_connection(TestApp(), settings(h2_control_frame_rate=10)) as mc:
        encoder = Encoder()
        opened = head(encoder, 1, [(b":method", b"POST"), *REQUEST[1:]], end=False)
        flood = b"".join(
            (PriorityFrame(1, depends_on=0).serialize() if i % 2 else DataFrame(1).serialize()) for i in range(150)
        )
        await mc.client.send_all(PREFACE + opened + flood)
        frames = await until_eof(mc.client)
    assert goaways(frames) == [ErrorCodes.ENHANCE_YOUR_CALM]


async def test_acks_a_client_leaves_unread_are_bounded(autojump_clock: trio.testing.MockClock) -> None:
    """The client never reads: the server's writer stops, the acknowledgements it owes
    pile up to the bound, then the connection is refused and, its writer still stuck,
    closed at the write-stall timeout."""
    limits = settings(h2_control_frame_rate=1000, h2_max_queued_control_frames=50, write_stall_timeout=5.0)
    async with open_memory_connection(TestApp(), limits, pair=trio.testing.lockstep_stream_pair) as mc:
        await mc.client.send_all(PREFACE)
        pings = [PingFrame(0, opaque_data=b"%08d" % i).serialize() for i in range(30)]
        for _ in range(3):  # 30 each time: never more than the bound in one read
            await mc.client.send_all(b"".join(pings))
            await trio.testing.wait_all_tasks_blocked()
        assert handler(mc).finished  # 60 owed and unread after the writer stopped
        stopped = trio.current_time()
        await mc.done.wait()
        assert trio.current_time() - stopped <= 5.0 + limits.close_linger


async def test_acks_a_client_reads_are_not_limited_by_the_bound() -> None:
    limits = settings(h2_control_frame_rate=1000, h2_max_queued_control_frames=50)
    async with open_memory_connection(TestApp(), limits) as mc:
        client = H2Client(mc.client)
        await client.start()
        for batch in range(4):
            for i in range(40):
                client.conn.ping(b"%04d%04d" % (batch, i))
            await client.flush()
            await client.pump()
        record = await client.response(await client.request("/echo"))
    assert record.headers is not None and not client.goaways


# --- rapid reset --------------------------------------------------------------------------------


async def test_rapid_reset_gets_goaway_and_no_reset_request_reaches_the_app() -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(h2_reset_rate=10)) as mc:
        encoder = Encoder()
        attack = b"".join(
            head(encoder, sid) + RstStreamFrame(sid, error_code=ErrorCodes.CANCEL).serialize()
            for sid in range(1, 400, 2)
        )
        await mc.client.send_all(PREFACE + attack)
        frames = await until_eof(mc.client)
        await served_elsewhere(app, h2_reset_rate=10)
        stats = mc.tracker.statistics()
    assert goaways(frames) == [ErrorCodes.ENHANCE_YOUR_CALM]
    assert [request.path for request in app.requests] == ["/echo"]  # the other connection's
    assert count(frames, HeadersFrame) == 0 and stats.active_streams == 0


async def test_malformed_requests_count_as_resets() -> None:
    async with open_memory_connection(TestApp(), settings(h2_reset_rate=10)) as mc:
        encoder = Encoder()
        malformed = [*REQUEST, (b"connection", b"close")]
        await mc.client.send_all(PREFACE + b"".join(head(encoder, sid, malformed) for sid in range(1, 400, 2)))
        frames = await until_eof(mc.client)
    assert count(frames, RstStreamFrame, lambda frame: frame.error_code == ErrorCodes.PROTOCOL_ERROR) >= 100
    assert goaways(frames) == [ErrorCodes.ENHANCE_YOUR_CALM]


async def test_resets_within_the_rate_are_fine(autojump_clock: trio.testing.MockClock) -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(h2_reset_rate=10)) as mc:
        client = H2Client(mc.client)
        await client.start()
        for _ in range(30):  # 300 resets in 30 s
            for _ in range(10):
                sid = await client.request("/hold")
                client.conn.reset_stream(sid, ErrorCodes.CANCEL)
            await client.flush()
            await trio.sleep(1)
        record = await client.response(await client.request("/echo"))
    assert record.headers is not None and not client.goaways


async def test_the_engine_never_sees_a_request_reset_in_the_same_read() -> None:
    """HEADERS, DATA and RST_STREAM in one write, 50 times, then one real request: the
    engine was submitted exactly one job."""
    async with simulator(h2_reset_rate=1000) as server:
        stream = await trio.open_tcp_stream(server.handle.host, server.handle.port)
        client = H2Client(stream)
        await client.start()
        body = json.dumps({"model": MODEL, "prompt": "hello there", "max_tokens": 3}).encode()
        fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/v1/completions"), (b":authority", b"t")]
        fields += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        for _ in range(50):
            sid = client.conn.get_next_available_stream_id()
            client.conn.send_headers(sid, fields)
            client.conn.send_data(sid, body, end_stream=True)
            client.conn.reset_stream(sid, ErrorCodes.CANCEL)
        await client.flush()
        record = await client.response(
            await client.request("/v1/completions", method="POST", body=body, headers=fields[4:5])
        )
        stats = server.sim.engine.statistics()
        await stream.aclose()
    assert record.headers is not None and record.headers[b":status"] == b"200"
    assert (stats.submitted, stats.finished) == (1, 1)


# --- slow and silent clients ---------------------------------------------------------------------


async def test_a_trickled_request_body_is_reset_at_the_body_read_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """One byte every 2 s does not move the deadline on; another stream on the same
    connection is served meanwhile."""
    app = TestApp()
    async with open_memory_connection(app, settings(body_read_timeout=5.0, keep_alive_timeout=60.0)) as mc:
        client = H2Client(mc.client)
        await client.start()
        sid = client.conn.get_next_available_stream_id()
        client.conn.send_headers(sid, [(b":method", b"POST"), *REQUEST[1:]])
        await client.flush()
        started = trio.current_time()
        client.records[sid] = record = StreamRecord()
        other = await client.response(await client.request("/echo"))
        while not record.done:
            client.conn.send_data(sid, b"x")
            await client.flush()
            with trio.move_on_after(2):
                await client.wait_until(lambda: record.done)
        assert trio.current_time() - started == 5.0
    assert record.reset == ErrorCodes.CANCEL and record.headers is None
    assert other.headers is not None and [r.path for r in app.requests] == ["/echo"]


async def test_a_response_the_client_never_reads_is_reset_at_the_write_stall_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Window 0 on every stream: their handlers are cancelled (their slots freed) after
    the write-stall timeout; a stream whose window moves on is not touched."""
    app = TestApp()
    async with open_memory_connection(app, settings(write_stall_timeout=5.0, keep_alive_timeout=60.0)) as mc:
        client = H2Client(mc.client, auto_ack=False)
        await client.start(INITIAL_WINDOW_SIZE=0)
        stalled = [await client.request("/big?size=100000") for _ in range(3)]
        fed = await client.request("/big?size=100000")
        started = trio.current_time()
        for _ in range(4):  # the fed stream gets a little window every 3 s
            with trio.move_on_after(3):
                await client.wait_until(lambda: all(client.records[sid].done for sid in stalled))
            client.conn.increment_flow_control_window(10, stream_id=fed)
            client.conn.increment_flow_control_window(10)
            await client.flush()
        for sid in stalled:
            assert client.records[sid].reset == ErrorCodes.CANCEL
        assert app.log.count("cancelled /big") == 3 and client.records[fed].reset is None
        assert 5.0 <= trio.current_time() - started <= 12.0
        assert mc.tracker.statistics().active_streams == 1
        await served_elsewhere(app)


async def test_a_connection_window_that_never_opens_stalls_too(autojump_clock: trio.testing.MockClock) -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(write_stall_timeout=5.0)) as mc:
        client = H2Client(mc.client, auto_ack=False)
        await client.start()
        first = await client.response(await client.request("/big?size=70000"))  # uses up the 65,535 bytes
        assert first.reset == ErrorCodes.CANCEL and len(first.body) == 65535
        assert trio.current_time() == 5.0 and mc.tracker.statistics().active_streams == 0


async def test_an_http1_client_that_never_reads_is_closed_at_the_write_stall_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The same timeout, in the connection's writer, for HTTP/1.1 (and for an HTTP/2
    client that stops reading its socket)."""
    app = TestApp()
    async with open_memory_connection(
        app, settings(write_stall_timeout=5.0), pair=trio.testing.lockstep_stream_pair
    ) as mc:
        client = H1Client(mc.client)
        await client.send(h11.Request(method="GET", target="/big?size=1000000", headers=[("host", "t")]))
        await app.gone.wait()
        stalled_for = trio.current_time()
        await mc.done.wait()
    assert stalled_for == 5.0 and "cancelled /big" in app.log


async def test_a_silent_reader_frees_its_engine_slot_for_others() -> None:
    """One running slot; a never-reading client takes it; a normal request waits only
    for the write-stall timeout."""
    async with simulator(max_num_seqs=1, write_stall_timeout=0.5) as server:
        host, port = server.handle.host, server.handle.port
        silent = H2Client(await trio.open_tcp_stream(host, port), auto_ack=False)
        await silent.start(INITIAL_WINDOW_SIZE=0)
        body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 500, "stream": True, "ignore_eos": True})
        json_head = ((b"content-type", b"application/json"),)
        held = await silent.request("/v1/completions", method="POST", body=body.encode(), headers=json_head)
        await silent.wait_until(lambda: silent.records[held].headers is not None)
        normal = H2Client(await trio.open_tcp_stream(host, port))
        await normal.start()
        small = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode()
        asked = trio.current_time()
        record = await normal.response(
            await normal.request("/v1/completions", method="POST", body=small, headers=json_head)
        )
        waited = trio.current_time() - asked
        await silent.wait_until(lambda: silent.records[held].done)
        for client in (silent, normal):  # else the server's shutdown lingers 1 s for each to close
            await client.stream.aclose()
    assert record.headers is not None and record.headers[b":status"] == b"200"
    assert silent.records[held].reset == ErrorCodes.CANCEL
    assert 0.3 < waited < 5.0


# --- frames too large, header blocks too slow or too long -----------------------------------------


async def test_a_frame_above_max_frame_size_is_refused_at_its_header() -> None:
    """A 16 MiB DATA frame announced, 10 bytes of it sent: FRAME_SIZE_ERROR at once."""
    app = TestApp()
    async with open_memory_connection(app) as mc:
        encoder = Encoder()
        opened = head(encoder, 1, [(b":method", b"POST"), *REQUEST[1:]], end=False)
        announced = b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + b"x" * 10
        await mc.client.send_all(PREFACE + opened + announced)
        frames = await until_eof(mc.client)
        await served_elsewhere(app)
    assert goaways(frames) == [ErrorCodes.FRAME_SIZE_ERROR]


async def test_a_headers_frame_above_max_frame_size_is_refused() -> None:
    async with open_memory_connection(TestApp()) as mc:
        frame = HeadersFrame(1, data=Encoder().encode([*REQUEST, (b"x", b"y" * 20000)]), flags=["END_HEADERS"])
        serialized = frame.serialize()
        assert len(serialized) > 9 + 16384
        await mc.client.send_all(PREFACE + serialized[:100])  # refused before the rest
        frames = await until_eof(mc.client)
    assert goaways(frames) == [ErrorCodes.FRAME_SIZE_ERROR]


async def test_a_header_block_left_open_is_cut_at_the_header_read_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_memory_connection(TestApp(), settings(header_read_timeout=3.0, keep_alive_timeout=75.0)) as mc:
        block = Encoder().encode(REQUEST)
        await mc.client.send_all(PREFACE + HeadersFrame(1, data=block[:5]).serialize())
        sent = trio.current_time()
        frames = await until_eof(mc.client)
        assert trio.current_time() - sent == 3.0
    assert goaways(frames) == [ErrorCodes.NO_ERROR]


async def test_a_frame_trickled_byte_by_byte_is_cut_at_the_header_read_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_memory_connection(TestApp(), settings(header_read_timeout=3.0, keep_alive_timeout=75.0)) as mc:
        frame = head(Encoder(), 1)
        await mc.client.send_all(PREFACE)
        sent = trio.current_time()
        for byte in frame[:5]:  # one byte every 0.5 s does not move the deadline on
            await mc.client.send_all(bytes([byte]))
            await trio.sleep(0.5)
        frames = await until_eof(mc.client)
        assert trio.current_time() - sent == 3.0
    assert goaways(frames) == [ErrorCodes.NO_ERROR]


async def test_a_continuation_flood_is_refused() -> None:
    async with open_memory_connection(TestApp(), settings(max_header_bytes=1000)) as mc:
        frames_sent = [HeadersFrame(1, data=Encoder().encode(REQUEST)).serialize()]
        frames_sent += [ContinuationFrame(1, data=b"\x00" * 1000).serialize() for _ in range(10)]
        await mc.client.send_all(PREFACE + b"".join(frames_sent))
        frames = await until_eof(mc.client)
    assert goaways(frames) == [ErrorCodes.ENHANCE_YOUR_CALM]


# --- what a long-lived connection keeps ---------------------------------------------------------


async def test_closed_streams_are_remembered_boundedly_and_late_frames_still_answered() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        client = H2Client(mc.client)
        await client.start()
        sids = []
        for _ in range(20):
            batch = [await client.request("/health") for _ in range(40)]
            await client.wait_until(lambda batch=batch: all(client.records[sid].done for sid in batch))
            sids += batch
        h2conn = handler(mc)._h2
        assert isinstance(h2conn, ServerConnection)
        assert len(h2conn._closed_streams) <= ServerConnection.MAX_CLOSED_STREAMS == 256
        assert len(h2conn.streams) <= 2 * 40 + 64
        # Late frames on streams long forgotten: ignored, or (DATA) answered with RST_STREAM.
        late = WindowUpdateFrame(sids[0], window_increment=5).serialize()
        late += RstStreamFrame(sids[1], error_code=ErrorCodes.CANCEL).serialize()
        late += DataFrame(sids[2], data=b"late").serialize()
        await mc.client.send_all(late)
        answers: list[Frame] = []
        while not count(answers, RstStreamFrame, lambda frame: frame.stream_id == sids[2]):
            data = await mc.client.receive_some(65536)
            answers += parse(data)
            await client.feed(data)
        record = await client.response(await client.request("/echo"))
    assert record.headers is not None and not client.goaways
    assert [(f.stream_id, f.error_code) for f in answers if isinstance(f, RstStreamFrame)] == [
        (sids[2], ErrorCodes.STREAM_CLOSED)
    ]


async def test_frames_split_anywhere_across_reads_are_served() -> None:
    """The guard follows frame boundaries across reads: a conversation sent in pieces of
    1, 7, 9 or 10 bytes is served exactly as in one piece."""
    for piece in (1, 7, 9, 10):
        app = TestApp()
        async with open_memory_connection(app, settings(h2_control_frame_rate=1)) as mc:
            encoder = Encoder()
            post = [(b":method", b"POST"), *REQUEST[1:], (b"content-length", b"5000")]
            wire = PREFACE + head(encoder, 1, post, end=False)
            wire += b"".join(DataFrame(1, data=b"x" * 1000).serialize() for _ in range(4))
            wire += DataFrame(1, data=b"x" * 1000, flags=["END_STREAM"]).serialize()
            wire += PingFrame(0, opaque_data=b"12345678").serialize() + head(encoder, 3)
            for offset in range(0, len(wire), piece):
                await mc.client.send_all(wire[offset : offset + piece])
            received = b""
            while not {1, 3} <= ended(parse(received)):
                received += await mc.client.receive_some(65536)
        frames = parse(received)
        body = b"".join(frame.data for frame in frames if isinstance(frame, DataFrame) and frame.stream_id == 1)
        assert json.loads(body)["body"] == "x" * 5000, piece
        assert count(frames, PingFrame) == 1 and not goaways(frames)


def ended(frames: list[Frame]) -> set[int]:
    return {frame.stream_id for frame in frames if "END_STREAM" in frame.flags}


async def test_a_settings_frame_with_too_many_settings_is_refused() -> None:
    async with open_memory_connection(TestApp()) as mc:
        crowded = SettingsFrame(0, settings={i: 1 for i in range(100, 133)})  # 33 (unknown, ignored) settings
        await mc.client.send_all(PREFACE + crowded.serialize())
        frames = await until_eof(mc.client)
    assert goaways(frames) == [ErrorCodes.ENHANCE_YOUR_CALM]


async def test_streams_refused_beyond_the_limit_count_as_resets() -> None:
    """A client that ignores MAX_CONCURRENT_STREAMS: each stream over it is refused
    (REFUSED_STREAM), and each refusal is charged like a reset."""
    app = TestApp()
    async with open_memory_connection(app, settings(max_concurrent_streams=1, h2_reset_rate=10)) as mc:
        encoder = Encoder()
        hold = head(
            encoder, 1, [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/hold"), (b":authority", b"t")]
        )
        await mc.client.send_all(PREFACE + hold + b"".join(head(encoder, sid) for sid in range(3, 400, 2)))
        frames = await until_eof(mc.client)
    refused = count(frames, RstStreamFrame, lambda frame: frame.error_code == ErrorCodes.REFUSED_STREAM)
    assert refused >= 100 and goaways(frames) == [ErrorCodes.ENHANCE_YOUR_CALM]
    assert [request.path for request in app.requests] == []  # /hold was to start after the read: aborted
