"""HTTP/2 connections over in-memory streams, driven by a real h2 client."""

from __future__ import annotations

import json

import trio
import trio.testing
from h2.errors import ErrorCodes

from llmsim.api.http import ResponseStream
from tests.protocol.helpers import H1Client, H2Client, StreamRecord, TestApp, open_memory_connection, settings


async def test_prior_knowledge_get_and_post() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        client = H2Client(mc.client)
        await client.start()
        get = await client.request("/echo?x=1")
        post = await client.request("/echo", method="POST", body=b"payload")
        got, posted = await client.response(get), await client.response(post)
    assert got.headers is not None and got.headers[b":status"] == b"200"
    assert json.loads(got.body) == {"method": "GET", "body": "", "query": "x=1"}
    assert json.loads(posted.body)["body"] == "payload"
    request = app.requests[0]
    assert request.http_version == "2" and request.header("host") == "test" and request.scheme == "http"


async def test_server_settings_advertise_the_stream_limit() -> None:
    async with open_memory_connection(TestApp(), settings(max_concurrent_streams=7)) as mc:
        client = H2Client(mc.client)
        await client.start()
        await client.wait_until(lambda: client.conn.remote_settings.max_concurrent_streams == 7)


async def test_streamed_response_has_no_connection_specific_headers() -> None:
    async with open_memory_connection(TestApp()) as mc:
        client = H2Client(mc.client)
        await client.start()
        record = await client.response(await client.request("/stream?n=4"))
    assert record.headers == {b":status": b"200", b"content-type": b"text/event-stream"}
    assert record.body == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: [DONE]\n\n"


async def test_many_concurrent_streams_interleave_on_one_connection() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        client = H2Client(mc.client)
        await client.start()
        sids = [await client.request(f"/stream?n={i % 5 + 1}") for i in range(60)]
        await client.wait_until(lambda: all(client.records[sid].done for sid in sids))
        stats = mc.tracker.statistics()
    for i, sid in enumerate(sids):
        expected = b"".join(b"data: %d\n\n" % k for k in range(i % 5 + 1)) + b"data: [DONE]\n\n"
        assert client.records[sid].body == expected
    assert (stats.active_streams, stats.requests_served) == (0, 60)
    assert app.log.count("end /stream") == 60


async def test_h2c_upgrade_answers_the_request_on_stream_1() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        client = H2Client(mc.client)
        settings_header = client.conn.initiate_upgrade_connection()
        assert settings_header is not None
        preface = client.conn.data_to_send()  # sent once the server has said 101
        await mc.client.send_all(
            b"GET /stream?n=2 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: " + settings_header + b"\r\n\r\n"
        )
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += await mc.client.receive_some(65536)
        head, _, rest = raw.partition(b"\r\n\r\n")
        await mc.client.send_all(preface)
        client.records[1] = StreamRecord()
        await client.feed(rest)
        upgraded = await client.response(1)
        second = await client.response(await client.request("/echo"))
    assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n") and b"upgrade: h2c" in head.lower()
    assert upgraded.headers is not None and upgraded.headers[b":status"] == b"200"
    assert upgraded.body == b"data: 0\n\ndata: 1\n\ndata: [DONE]\n\n"
    assert second.headers is not None and second.headers[b":status"] == b"200"
    assert app.requests[0].http_version == "2" and app.requests[0].path == "/stream"


async def test_upgrade_with_a_bad_settings_header_or_a_body_is_served_in_http_1_1() -> None:
    upgrade = (("upgrade", "h2c"), ("connection", "Upgrade, HTTP2-Settings"))
    cases = [
        ("GET", b"", (*upgrade, ("http2-settings", "!!not-base64!!"))),
        ("POST", b"hi", (*upgrade, ("http2-settings", "AAMAAABkAAQAAP__"))),
    ]
    for method, body, headers in cases:
        app = TestApp()
        async with open_memory_connection(app) as mc:
            head, _ = await H1Client(mc.client).request(method, "/echo", body, headers)
        assert head.status_code == 200 and head.http_version == b"1.1"
        assert app.requests[0].http_version == "1.1"


async def test_a_stream_without_window_stalls_alone_and_resumes_on_window_update() -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(high_water=2**20)) as mc:
        client = H2Client(mc.client, auto_ack=False)
        await client.start()
        client.conn.increment_flow_control_window(2**20)  # the connection window is not the limit
        await client.flush()
        big = await client.request("/big?size=100000")
        await client.wait_until(lambda: len(client.records[big].body) == 65535)
        small = await client.response(await client.request("/stream?n=2"))
        assert small.body == b"data: 0\n\ndata: 1\n\ndata: [DONE]\n\n"
        await trio.testing.wait_all_tasks_blocked()
        assert len(client.records[big].body) == 65535 and not client.records[big].done
        client.conn.increment_flow_control_window(100000 - 65535, stream_id=big)
        await client.flush()
        record = await client.response(big)
    assert record.ended and record.body == b"x" * 100000
    assert max(len(chunk) for chunk in record.chunks) <= 16384


async def test_initial_window_size_changes_apply_to_open_streams_even_below_zero() -> None:
    async with open_memory_connection(TestApp()) as mc:
        client = H2Client(mc.client, auto_ack=False)
        await client.start(INITIAL_WINDOW_SIZE=100)
        client.conn.increment_flow_control_window(2**20)
        await client.flush()
        sid = await client.request("/big?size=1000")
        record = client.records[sid]
        await client.wait_until(lambda: len(record.body) == 100)
        client.conn.update_settings({0x4: 600})  # INITIAL_WINDOW_SIZE: +500 on the open stream
        await client.flush()
        await client.wait_until(lambda: len(record.body) == 600)
        client.conn.update_settings({0x4: 50})  # the stream's window is now 50 - 600 = -550
        await client.flush()
        client.conn.increment_flow_control_window(560, stream_id=sid)  # -550 + 560 = 10
        await client.flush()
        await client.wait_until(lambda: len(record.body) >= 610)
        await trio.testing.wait_all_tasks_blocked()
        assert len(record.body) == 610 and not record.done
        client.conn.increment_flow_control_window(390, stream_id=sid)
        await client.flush()
        await client.response(sid)
    assert record.body == b"x" * 1000


async def test_data_frames_respect_the_peer_max_frame_size() -> None:
    async with open_memory_connection(TestApp()) as mc:
        client = H2Client(mc.client)
        await client.start(MAX_FRAME_SIZE=32768, INITIAL_WINDOW_SIZE=2**20)
        client.conn.increment_flow_control_window(2**20)
        await client.flush()
        record = await client.response(await client.request("/big?size=100000"))
    sizes = [len(chunk) for chunk in record.chunks]
    assert record.body == b"x" * 100000 and max(sizes) == 32768


async def test_write_returns_false_above_high_water_and_on_drained_fires_after_window_update() -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(high_water=70000, low_water=1000)) as mc:
        client = H2Client(mc.client, auto_ack=False)
        await client.start()
        client.conn.increment_flow_control_window(2**20)
        await client.flush()
        sid = await client.request("/big?size=80000")
        await client.wait_until(lambda: len(client.records[sid].body) == 65535)
        await trio.testing.wait_all_tasks_blocked()
        assert app.write_results == [False] and not app.drained.is_set()
        client.conn.increment_flow_control_window(80000, stream_id=sid)
        await client.flush()
        await client.response(sid)
        assert app.drained.is_set()


async def test_streams_beyond_the_limit_are_refused_without_breaking_the_connection() -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(max_concurrent_streams=2)) as mc:
        client = H2Client(mc.client)
        await client.start()
        await client.wait_until(lambda: client.conn.remote_settings.max_concurrent_streams == 2)
        client.ignore_stream_limit()
        held = [await client.request("/hold"), await client.request("/hold")]
        refused = await client.response(await client.request("/echo"))
        assert refused.reset == ErrorCodes.REFUSED_STREAM
        app.release.set()
        for sid in held:
            assert (await client.response(sid)).ended
        after = await client.response(await client.request("/echo"))
    assert after.headers is not None and after.headers[b":status"] == b"200"
    assert [r.path for r in app.requests] == ["/hold", "/hold", "/echo"]


async def test_rst_stream_cancels_only_that_handler_and_frees_it() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        client = H2Client(mc.client)
        await client.start()
        doomed = await client.request("/hold")
        await app.holding.wait()
        other = await client.request("/stream?n=2")
        client.conn.reset_stream(doomed, ErrorCodes.CANCEL)
        await client.flush()
        assert (await client.response(other)).ended
        await trio.testing.wait_all_tasks_blocked()
        stats = mc.tracker.statistics()
    assert "cancelled /hold" in app.log and "closed /hold" in app.log
    assert (stats.open_connections, stats.active_streams, stats.requests_served) == (1, 0, 1)


async def test_connection_drop_mid_response_cancels_every_handler() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        client = H2Client(mc.client)
        await client.start()
        for _ in range(3):
            await client.request("/hold")
        await client.wait_until(lambda: all(r.chunks for r in client.records.values()))
        assert mc.tracker.statistics().active_streams == 3
        await mc.client.aclose()
        await mc.done.wait()
        stats = mc.tracker.statistics()
    assert app.log.count("cancelled /hold") == 3 and app.log.count("closed /hold") == 3
    assert (stats.open_connections, stats.active_streams) == (0, 0)


async def test_body_over_the_limit_is_413_and_the_upload_is_stopped() -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(max_body_bytes=10)) as mc:
        client = H2Client(mc.client)
        await client.start()
        sid = client.conn.get_next_available_stream_id()
        client.conn.send_headers(
            sid, [(b":method", b"POST"), (b":path", b"/echo"), (b":scheme", b"http"), (b":authority", b"t")]
        )
        client.conn.send_data(sid, b"x" * 11)
        await client.flush()
        client.records[sid] = record = StreamRecord()
        await client.wait_until(lambda: record.done)
        later = await client.response(await client.request("/echo"))
    assert record.headers is not None and record.headers[b":status"] == b"413"
    assert json.loads(record.body)["error"]["code"] == 413
    assert record.ended and record.reset == ErrorCodes.NO_ERROR  # the whole 413, then "stop sending"
    assert later.headers is not None and later.headers[b":status"] == b"200"
    assert [r.path for r in app.requests] == ["/echo"]


async def test_handler_failure_after_the_head_resets_the_stream() -> None:
    async with open_memory_connection(TestApp()) as mc:
        client = H2Client(mc.client)
        await client.start()
        failed = await client.response(await client.request("/fail-late"))
        early = await client.response(await client.request("/fail"))
    assert failed.reset == ErrorCodes.INTERNAL_ERROR
    assert early.headers is not None and early.headers[b":status"] == b"500"


async def test_a_client_protocol_error_gets_goaway_and_close() -> None:
    async with open_memory_connection(TestApp()) as mc:
        client = H2Client(mc.client)
        await client.start()
        await mc.client.send_all(b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00")  # WINDOW_UPDATE of 0
        await client.wait_for_eof()
    assert client.goaways and client.goaways[0].error_code == ErrorCodes.PROTOCOL_ERROR


async def test_idle_connection_gets_goaway_after_the_keep_alive_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async with open_memory_connection(TestApp(), settings(keep_alive_timeout=9.0)) as mc:
        client = H2Client(mc.client)
        await client.start()
        await client.response(await client.request("/echo"))
        answered = trio.current_time()
        await client.wait_for_eof()
        assert trio.current_time() - answered == 9.0
    assert [g.error_code for g in client.goaways] == [ErrorCodes.NO_ERROR]


async def test_request_bodies_beyond_the_connection_cap_are_413() -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(max_body_bytes=1000)) as mc:
        client = H2Client(mc.client)
        await client.start()
        head = [(b":method", b"POST"), (b":path", b"/echo"), (b":scheme", b"http"), (b":authority", b"t")]
        sids = []
        for _ in range(6):  # 900 bytes each, never ended: 4 fit the cap of 4000, the 5th and 6th do not
            sid = client.conn.get_next_available_stream_id()
            client.conn.send_headers(sid, head)
            client.conn.send_data(sid, b"x" * 900)
            await client.flush()
            client.records[sid] = StreamRecord()
            sids.append(sid)
        kept, refused = sids[:4], sids[4:]
        await client.wait_until(lambda: all(client.records[sid].done for sid in refused))
        for sid in refused:
            record = client.records[sid]
            assert record.headers is not None and record.headers[b":status"] == b"413"
            assert record.ended and record.reset == ErrorCodes.NO_ERROR
        await trio.testing.wait_all_tasks_blocked()
        assert not any(client.records[sid].done for sid in kept)
        for sid in kept:
            client.conn.end_stream(sid)
        await client.flush()
        for sid in kept:
            record = await client.response(sid)
            assert record.headers is not None and record.headers[b":status"] == b"200"
            assert json.loads(record.body)["body"] == "x" * 900
        later = await client.response(await client.request("/echo", method="POST", body=b"y" * 900))
        stats = mc.tracker.statistics()
    assert later.headers is not None and later.headers[b":status"] == b"200"
    assert (stats.open_connections, stats.active_streams) == (1, 0)
    assert len(app.requests) == 5


async def test_a_stalled_request_body_is_reset_after_the_body_read_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(body_read_timeout=5.0, keep_alive_timeout=60.0)) as mc:
        client = H2Client(mc.client)
        await client.start()
        sid = client.conn.get_next_available_stream_id()
        client.conn.send_headers(
            sid, [(b":method", b"POST"), (b":path", b"/echo"), (b":scheme", b"http"), (b":authority", b"t")]
        )
        client.conn.send_data(sid, b"partial")
        await client.flush()
        client.records[sid] = record = StreamRecord()
        await trio.testing.wait_all_tasks_blocked()
        assert mc.tracker.statistics().active_streams == 1
        sent = trio.current_time()
        await client.wait_until(lambda: record.done)
        assert trio.current_time() - sent == 5.0
        assert record.reset == ErrorCodes.CANCEL and record.headers is None
        await trio.testing.wait_all_tasks_blocked()
        assert mc.tracker.statistics().active_streams == 0
        later = await client.response(await client.request("/echo", method="POST", body=b"ok"))
    assert later.headers is not None and later.headers[b":status"] == b"200"
    assert json.loads(later.body)["body"] == "ok"
    assert not client.goaways and [r.path for r in app.requests] == ["/echo"]


async def test_writes_between_two_batches_feel_the_water_marks() -> None:
    """A producer that writes much without yielding, to a client whose windows are wide
    open: only up to the low-water mark is framed at once into the coming batch
    (Http2Stream.write), the rest buffers on the stream, and write() says False at the
    high-water mark, as the ResponseStream contract promises."""
    go = trio.Event()
    accepted: list[bool] = []
    low, high = settings().low_water, settings().high_water

    class Burst:
        async def handle(self, request: object, response: ResponseStream) -> None:
            response.start(200, [(b"content-type", b"text/event-stream")])
            await go.wait()  # the head is on the wire: writes may be framed at once
            accepted.extend(response.write(b"x" * 1000) for _ in range(300))
            response.end()

    async with open_memory_connection(Burst()) as mc:
        client = H2Client(mc.client)
        await client.start(INITIAL_WINDOW_SIZE=2**31 - 1)
        client.conn.increment_flow_control_window(2**31 - 1 - 65_535)
        sid = await client.request("/burst")
        await trio.testing.wait_all_tasks_blocked()
        go.set()
        record = await client.response(sid)
    assert record.body == b"x" * 300_000
    refused = accepted.index(False)
    assert refused * 1000 <= low + high, refused  # unsent bytes stayed within the water marks
