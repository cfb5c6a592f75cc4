"""Graceful shutdown: of one connection (GOAWAY, close when idle) and of the whole server."""

from __future__ import annotations

import trio
import trio.testing
from h2.errors import ErrorCodes

from llmsim.config import Config
from llmsim.protocol.native.connection import ConnectionPhase
from llmsim.protocol.settings import ServerHandle
from tests.protocol.helpers import (
    H1Client,
    H2Client,
    TestApp,
    open_memory_connection,
    receive_all,
    serve_until_cancelled,
)


async def test_h2_shutdown_sends_goaway_with_the_last_stream_and_finishes_it() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        client = H2Client(mc.client)
        await client.start()
        in_flight = await client.request("/hold")
        await app.holding.wait()
        mc.connection.begin_shutdown()
        await client.wait_until(lambda: bool(client.goaways))
        assert (client.goaways[0].last_stream_id, client.goaways[0].error_code) == (in_flight, ErrorCodes.NO_ERROR)
        too_late = await client.response(await client.request("/echo"))
        assert too_late.reset == ErrorCodes.REFUSED_STREAM
        app.release.set()
        finished = await client.response(in_flight)
        await client.wait_for_eof()
        await mc.client.aclose()
        await mc.done.wait()
    assert finished.ended and finished.body == b"data: first\n\ndata: last\n\n"
    assert [r.path for r in app.requests] == ["/hold"]
    assert mc.tracker.statistics().open_connections == 0


async def test_h2_shutdown_of_an_idle_connection_closes_it_at_once() -> None:
    async with open_memory_connection(TestApp()) as mc:
        client = H2Client(mc.client)
        await client.start()
        await client.response(await client.request("/echo"))
        mc.connection.begin_shutdown()
        await client.wait_for_eof()
    assert [g.last_stream_id for g in client.goaways] == [1]


async def test_h1_shutdown_closes_an_idle_keep_alive_connection() -> None:
    async with open_memory_connection(TestApp()) as mc:
        await H1Client(mc.client).request("GET", "/echo")
        mc.connection.begin_shutdown()
        assert await receive_all(mc.client) == b""


async def test_h1_shutdown_lets_the_response_in_flight_finish_then_closes() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        await mc.client.send_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        await app.holding.wait()
        mc.connection.begin_shutdown()
        app.release.set()
        raw = await receive_all(mc.client)
    assert raw.startswith(b"HTTP/1.1 200 OK") and raw.endswith(b"data: last\n\n\r\n0\r\n\r\n")


async def test_h1_shutdown_before_the_head_announces_connection_close() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        mc.connection.phase = ConnectionPhase.DRAINING  # as if shutdown began while the handler ran
        head, _ = await H1Client(mc.client).request("GET", "/echo")
    assert (b"connection", b"close") in head.headers


async def test_server_shutdown_waits_for_in_flight_streams_then_returns(nursery: trio.Nursery) -> None:
    app = TestApp()
    scope, done = trio.CancelScope(), trio.Event()
    handle: ServerHandle = await nursery.start(serve_until_cancelled, app, Config(port=0), scope, done)
    stream = await trio.open_tcp_stream(handle.host, handle.port)
    client = H2Client(stream)
    await client.start()
    sid = await client.request("/hold")
    await app.holding.wait()
    scope.cancel()
    await client.wait_until(lambda: bool(client.goaways))
    assert client.goaways[0].last_stream_id == sid
    try:
        await trio.open_tcp_stream(handle.host, handle.port)
    except OSError:
        pass  # the listener is closed: new connections are refused
    else:
        raise AssertionError("the server still accepts connections after shutdown began")
    app.release.set()
    assert (await client.response(sid)).body == b"data: first\n\ndata: last\n\n"
    await client.wait_for_eof()
    await stream.aclose()
    await done.wait()
    assert handle.statistics().open_connections == 0
    assert "cancelled /hold" not in app.log


async def test_server_shutdown_cancels_what_is_left_at_the_grace_deadline(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    app = TestApp()
    scope, done = trio.CancelScope(), trio.Event()
    config = Config(port=0, shutdown_grace_period=4.0)
    handle: ServerHandle = await nursery.start(serve_until_cancelled, app, config, scope, done)
    stream = await trio.open_tcp_stream(handle.host, handle.port)
    await stream.send_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
    await app.holding.wait()
    cancelled_at = trio.current_time()
    scope.cancel()
    await done.wait()
    assert trio.current_time() - cancelled_at == 4.0
    assert sorted(app.log) == ["cancelled /hold", "closed /hold", "start /hold"]
    stats = handle.statistics()
    assert (stats.open_connections, stats.active_streams) == (0, 0)
    await stream.aclose()


async def test_a_connection_moves_through_its_phases_and_never_back() -> None:
    app = TestApp()
    async with open_memory_connection(app) as mc:
        connection = mc.connection
        assert connection.phase is ConnectionPhase.NEGOTIATING
        await mc.client.send_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        await app.holding.wait()
        assert connection.phase is ConnectionPhase.OPEN and not connection.shutting_down
        connection.begin_shutdown()
        connection.begin_shutdown()
        assert connection.phase is ConnectionPhase.DRAINING and connection.shutting_down
        app.release.set()
        await receive_all(mc.client)  # the server half-closes once the response is out
        assert connection.phase is ConnectionPhase.CLOSING
        connection.begin_shutdown()
        assert connection.phase is ConnectionPhase.CLOSING
