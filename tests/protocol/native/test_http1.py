"""HTTP/1.1 connections over in-memory streams, driven by a real h11 client or raw bytes."""

from __future__ import annotations

import json

import h11
import trio
import trio.testing

from tests.protocol.helpers import H1Client, TestApp, open_memory_connection, receive_all, settings


async def test_get_has_a_reason_phrase_and_keeps_the_connection_open() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        await mc.client.send_all(b"GET /echo?a=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        client = H1Client(mc.client)
        head, body = await client.response()
        assert head.status_code == 200 and head.reason == b"OK"
        assert json.loads(body) == {"method": "GET", "body": "", "query": "a=1"}
        assert app.requests[0].headers == ((b"host", b"x"),) and app.requests[0].http_version == "1.1"
        assert not mc.done.is_set()


async def test_an_absolute_form_target_keeps_only_its_path_and_query() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        await mc.client.send_all(b"GET http://example.test/echo?a=1 HTTP/1.1\r\nHost: example.test\r\n\r\n")
        await H1Client(mc.client).response()
    assert (app.requests[0].path, app.requests[0].query) == ("/echo", "a=1")


async def test_post_body_reaches_the_app_and_keep_alive_serves_a_second_request() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        client = H1Client(mc.client)
        _, body = await client.request("POST", "/echo", b"hello")
        assert json.loads(body)["body"] == "hello"
        head, body = await client.request("POST", "/echo", b"again")
        assert head.status_code == 200 and json.loads(body)["body"] == "again"
        stats = mc.tracker.statistics()
        assert (stats.open_connections, stats.active_streams, stats.requests_served) == (1, 0, 2)


async def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        await mc.client.send_all(
            b"GET /stream?n=3 HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
            b"GET /burst?n=2 HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        client = H1Client(mc.client)
        bodies = []
        for _ in range(3):
            # Keep the client's state machine in step with the requests sent above.
            client.conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
            client.conn.send(h11.EndOfMessage())
            _, body = await client.response()
            bodies.append(body)
            client.conn.start_next_cycle()
    assert bodies[0] == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    assert json.loads(bodies[1])["body"] == "hi"
    assert bodies[2] == b"data: 0\n\ndata: 1\n\n"
    # The next request is not read while a response is in flight.
    assert app.log == ["start /stream", "end /stream", "start /echo", "end /echo", "start /burst", "end /burst"]


async def test_reading_pauses_when_too_much_is_pipelined_and_resumes_after_the_response() -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(max_pipelined_bytes=100)) as mc:
        await mc.client.send_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        await app.holding.wait()
        for i in range(8):  # about 400 bytes while /hold is in flight
            await mc.client.send_all(b"GET /echo?n=%d HTTP/1.1\r\nHost: x\r\n\r\n" % i)
        await trio.testing.wait_all_tasks_blocked()
        assert mc.connection._reading_allowed is False  # bounded: the rest waits in the socket
        app.release.set()
        client = H1Client(mc.client)
        queries = []
        for _ in range(9):
            client.conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
            client.conn.send(h11.EndOfMessage())
            _, body = await client.response()
            client.conn.start_next_cycle()
            queries.append(body if not queries else json.loads(body)["query"])
    assert queries == [b"data: first\n\ndata: last\n\n", *(f"n={i}" for i in range(8))]


async def test_streamed_response_is_chunked_and_one_step_of_writes_is_one_chunk() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        await mc.client.send_all(b"GET /burst?n=3 HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = b""
        while not raw.endswith(b"0\r\n\r\n"):
            raw += await mc.client.receive_some(65536)
    head, _, chunked = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    # Three synchronous writes, coalesced by the single writer into one chunk.
    assert chunked == b"1b\r\ndata: 0\n\ndata: 1\n\ndata: 2\n\n\r\n0\r\n\r\n"


async def test_expect_100_continue_is_answered_when_the_body_is_within_the_limit() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        client = H1Client(mc.client)
        headers = [("host", "x"), ("content-length", "5"), ("expect", "100-continue")]
        await client.send(h11.Request(method="POST", target="/echo", headers=headers))
        interim = await client.next_event()
        assert isinstance(interim, h11.InformationalResponse)
        assert (interim.status_code, interim.reason) == (100, b"Continue")
        await client.send(h11.Data(data=b"12345"), h11.EndOfMessage())
        head, body = await client.response()
    assert head.status_code == 200 and json.loads(body)["body"] == "12345"


async def test_body_over_the_limit_is_413_without_100_continue_and_the_connection_closes() -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(max_body_bytes=10)) as mc:
        await mc.client.send_all(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n"
        )
        raw = await receive_all(mc.client)
    assert raw.startswith(b"HTTP/1.1 413 Content Too Large\r\n")
    assert b"connection: close" in raw.lower() and b"100 Continue" not in raw
    error = json.loads(raw.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == 413 and "10 bytes" in error["message"]
    assert app.requests == []


async def test_chunked_body_over_the_limit_is_413() -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(max_body_bytes=10)) as mc:
        await mc.client.send_all(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n8\r\n12345678\r\n"
        )
        raw = await receive_all(mc.client)
    assert raw.startswith(b"HTTP/1.1 413 ")
    assert app.requests == []


async def test_malformed_request_gets_a_400_envelope_and_close() -> None:
    async with open_memory_connection(TestApp()) as mc:
        await mc.client.send_all(b"NOT HTTP AT ALL\r\n\r\n")
        raw = await receive_all(mc.client)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError" and error["param"] is None
    assert error["message"].startswith("malformed HTTP/1.1 request")


async def test_oversized_headers_get_431_whether_they_arrive_whole_or_in_pieces() -> None:
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n"
    for pieces in ([head], [head[:1500], head[1500:]]):
        async with open_memory_connection(TestApp(), settings(max_header_bytes=1024)) as mc:
            for piece in pieces:
                await mc.client.send_all(piece)
            raw = await receive_all(mc.client)
        assert raw.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")


async def test_header_read_timeout_answers_408_and_closes(autojump_clock: trio.testing.MockClock) -> None:
    async with open_memory_connection(TestApp(), settings(header_read_timeout=3.0)) as mc:
        start = trio.current_time()
        await mc.client.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head never ends
        raw = await receive_all(mc.client)
        assert trio.current_time() - start == 3.0
    assert raw.startswith(b"HTTP/1.1 408 Request Timeout\r\n")


async def test_a_silent_new_connection_is_closed_after_the_header_read_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_memory_connection(TestApp(), settings(header_read_timeout=3.0)) as mc:
        assert await receive_all(mc.client) == b""
        assert trio.current_time() == 3.0
        await mc.done.wait()
        assert mc.tracker.statistics().open_connections == 0


async def test_idle_keep_alive_connection_closes_silently_after_the_keep_alive_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_memory_connection(TestApp(), settings(keep_alive_timeout=7.0)) as mc:
        client = H1Client(mc.client)
        await client.request("GET", "/echo")
        answered = trio.current_time()
        assert await receive_all(mc.client) == b""
        assert trio.current_time() - answered == 7.0


async def test_client_eof_mid_stream_cancels_the_handler_and_frees_the_stream() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        await mc.client.send_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        await app.holding.wait()
        assert mc.tracker.statistics().active_streams == 1
        await mc.client.aclose()
        await mc.done.wait()
        stats = mc.tracker.statistics()
    assert app.log == ["start /hold", "closed /hold", "cancelled /hold"]
    assert (stats.open_connections, stats.active_streams, stats.requests_served) == (0, 0, 0)


async def test_handler_exception_before_the_head_is_a_500_envelope() -> None:
    async with open_memory_connection(TestApp()) as mc:
        client = H1Client(mc.client)
        head, body = await client.request("GET", "/fail")
        assert head.status_code == 500 and json.loads(body)["error"]["type"] == "InternalServerError"
        head, _ = await client.request("GET", "/echo")  # the connection survives
        assert head.status_code == 200


async def test_handler_exception_after_the_head_closes_the_connection_mid_body() -> None:
    async with open_memory_connection(TestApp()) as mc:
        await mc.client.send_all(b"GET /fail-late HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = await receive_all(mc.client)
        await mc.client.aclose()
        await mc.done.wait()
        assert mc.tracker.statistics().active_streams == 0
    assert raw.startswith(b"HTTP/1.1 200 OK") and not raw.endswith(b"0\r\n\r\n")


async def test_handler_returning_without_end_is_treated_as_a_failure() -> None:
    async with open_memory_connection(TestApp()) as mc:
        await mc.client.send_all(b"GET /noend HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = await receive_all(mc.client)
    assert raw.startswith(b"HTTP/1.1 200 OK") and not raw.endswith(b"0\r\n\r\n")


async def test_head_request_gets_headers_only() -> None:
    async with open_memory_connection(TestApp()) as mc:
        client = H1Client(mc.client)
        head, body = await client.request("HEAD", "/echo")
        assert head.status_code == 200 and body == b""
        head, _ = await client.request("GET", "/echo")
        assert head.status_code == 200


async def test_connection_close_and_http_1_0_close_after_the_response() -> None:
    for request in (
        b"GET /burst HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /burst HTTP/1.0\r\n\r\n",
    ):
        async with open_memory_connection(TestApp()) as mc:
            await mc.client.send_all(request)
            raw = await receive_all(mc.client)
        assert b"data: 2\n\n" in raw


async def test_write_reports_backpressure_until_the_client_reads() -> None:
    app = TestApp()
    limits = settings(high_water=1000, low_water=100)
    pair = trio.testing.lockstep_stream_pair  # send_all blocks until the client reads
    async with open_memory_connection(app, limits, pair=pair) as mc:
        await mc.client.send_all(b"GET /big?size=5000 HTTP/1.1\r\nHost: x\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked()
        assert app.write_results == [False]
        assert not app.drained.is_set()
        received = 0
        while received < 5000:
            received += len(await mc.client.receive_some(65536))
        await app.drained.wait()
