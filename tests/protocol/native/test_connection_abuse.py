"""Connections that abuse the server (issue 17, "Holds under abuse"): bodies trickled
byte by byte, more connections than file descriptors, cleartext on the TLS port."""

from __future__ import annotations

import errno
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import attrs
import h11
import pytest
import trio
import trio.testing
from hyperframe.frame import GoAwayFrame

from llmsim.options import LimitOptions, ServerOptions
from llmsim.protocol.native.detect import H2_PREFACE
from llmsim.protocol.native.server import ConnectionStreams, _NativeServer, default_max_connections, serve_app
from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings
from llmsim.protocol.tls import self_signed_context
from llmsim.testing import open_simulator
from tests.protocol.helpers import H1Client, TestApp, open_memory_connection, receive_all, settings, split_frames

# --- slow request bodies -------------------------------------------------------------------


async def test_a_body_trickled_past_the_body_read_timeout_gets_408_and_a_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """One byte every 5 s never trips the 10 s gap timeout; the whole-body limit does."""
    app = TestApp()
    async with open_memory_connection(app, settings(header_read_timeout=10.0, body_read_timeout=20.0)) as mc:
        await mc.client.send_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        head_sent = trio.current_time()

        async def trickle() -> None:
            for _ in range(100):
                await trio.sleep(5.0)
                await mc.client.send_all(b"x")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle)
            raw = await receive_all(mc.client)
            nursery.cancel_scope.cancel()
        assert trio.current_time() - head_sent == 20.0
        await mc.done.wait()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"connection: close" in head
    assert b'"type":"RequestTimeout"' in body and b"body-read-timeout" in body
    assert app.requests == []


async def test_a_slow_body_that_ends_within_the_body_read_timeout_is_served(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(header_read_timeout=10.0, body_read_timeout=20.0)) as mc:
        await mc.client.send_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n")
        for byte in (b"a", b"b", b"c"):
            await trio.sleep(5.0)
            await mc.client.send_all(byte)
        client = H1Client(mc.client)
        client.conn.send(h11.Request(method="POST", target="/echo", headers=[("host", "x"), ("content-length", "3")]))
        client.conn.send(h11.Data(data=b"abc"))
        client.conn.send(h11.EndOfMessage())
        head, body = await client.response()
    assert head.status_code == 200 and b'"body": "abc"' in body


# --- cleartext on the TLS port -----------------------------------------------------------


@pytest.fixture(scope="module")
def tls_context() -> object:
    return self_signed_context()


async def test_cleartext_http1_on_the_tls_port_gets_400_and_a_close(tls_context: object) -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(ssl_context=tls_context)) as mc:
        await mc.client.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = await receive_all(mc.client)
        await mc.done.wait()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"connection: close" in head
    assert b"HTTPS only" in body and b"--allow-cleartext" in body
    assert app.requests == []


async def test_h2c_on_the_tls_port_gets_goaway_protocol_error(tls_context: object) -> None:
    app = TestApp()
    async with open_memory_connection(app, settings(ssl_context=tls_context)) as mc:
        await mc.client.send_all(H2_PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        raw = await receive_all(mc.client)
    frames, rest = split_frames(raw)
    assert rest == b""
    goaway = frames[-1][0]
    assert isinstance(goaway, GoAwayFrame) and goaway.error_code == 1  # PROTOCOL_ERROR
    assert b"HTTPS only" in goaway.additional_data
    assert app.requests == []


async def test_allow_cleartext_serves_http1_on_the_tls_port(tls_context: object) -> None:
    async with open_memory_connection(TestApp(), settings(ssl_context=tls_context, allow_cleartext=True)) as mc:
        head, _ = await H1Client(mc.client).request("GET", "/health")
    assert head.status_code == 200


# --- the connection cap ------------------------------------------------------------------


@attrs.define(eq=False)
class MemoryListener(trio.abc.Listener[trio.abc.HalfCloseableStream]):
    """Accepts the server ends of in-memory stream pairs; raises ``errors`` (errnos) first."""

    errors: list[int] = attrs.field(factory=list)
    accepts: int = 0  # calls of accept, failed ones included
    _send: trio.MemorySendChannel[trio.abc.HalfCloseableStream] = attrs.field(init=False)
    _receive: trio.MemoryReceiveChannel[trio.abc.HalfCloseableStream] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel(100)

    def connect(self) -> trio.abc.HalfCloseableStream:
        client, server = trio.testing.memory_stream_pair()
        self._send.send_nowait(server)
        return client

    async def accept(self) -> trio.abc.HalfCloseableStream:
        self.accepts += 1
        if self.errors:
            await trio.lowlevel.checkpoint()
            raise OSError(self.errors.pop(0), "no room")
        return await self._receive.receive()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def capped_server(cap: int, listener: MemoryListener) -> AsyncIterator[tuple[_NativeServer, TestApp]]:
    app = TestApp()
    server = _NativeServer(app, settings(), ConnectionTracker(), None, cap)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server._accept_loop, listener, nursery)
        yield server, app
        nursery.cancel_scope.cancel()


async def test_at_the_cap_a_new_connection_displaces_the_oldest_one_with_nothing_in_flight() -> None:
    listener = MemoryListener()
    async with capped_server(2, listener) as (server, app):
        busy = H1Client(listener.connect())
        await busy.send(h11.Request(method="GET", target="/hold", headers=[("host", "x")]), h11.EndOfMessage())
        await app.holding.wait()
        silent = listener.connect()  # connected, says nothing (a slowloris)
        await trio.testing.wait_all_tasks_blocked()
        probe = H1Client(listener.connect())  # over the cap: displaces `silent`, not `busy`
        assert await receive_all(silent) == b""
        head, _ = await probe.request("GET", "/health")
        assert head.status_code == 200
        assert server.tracker.statistics().open_connections == 2
        app.release.set()
        head, body = await busy.response()
        assert head.status_code == 200 and body.endswith(b"data: last\n\n")


async def test_a_keep_alive_client_between_requests_goes_after_a_silent_one() -> None:
    """The least recently active idle connection is displaced, not the oldest one."""
    listener = MemoryListener()
    async with capped_server(2, listener):
        keep_alive = H1Client(listener.connect())
        await trio.testing.wait_all_tasks_blocked()
        silent = listener.connect()
        await trio.testing.wait_all_tasks_blocked()
        await keep_alive.request("GET", "/health")  # older, but active more recently
        newcomer = H1Client(listener.connect())
        assert await receive_all(silent) == b""
        assert (await newcomer.request("GET", "/health"))[0].status_code == 200
        assert (await keep_alive.request("GET", "/health"))[0].status_code == 200


async def test_at_the_cap_with_every_connection_busy_new_ones_wait_until_a_response_ends() -> None:
    listener = MemoryListener()
    async with capped_server(1, listener) as (_, app):
        busy = H1Client(listener.connect())
        await busy.send(h11.Request(method="GET", target="/hold", headers=[("host", "x")]), h11.EndOfMessage())
        await app.holding.wait()
        waiting = H1Client(listener.connect())
        await waiting.send(h11.Request(method="GET", target="/health", headers=[("host", "x")]), h11.EndOfMessage())
        await trio.testing.wait_all_tasks_blocked()
        assert [r.path for r in app.requests] == ["/hold"]  # `waiting` is held, unserved
        assert listener.accepts == 2  # and nothing more is accepted meanwhile
        app.release.set()
        await busy.response()
        head, _ = await waiting.response()  # `busy` went idle, so it was displaced for `waiting`
        assert head.status_code == 200 and listener.accepts == 3
        assert await receive_all(busy.stream) == b""


async def test_a_connection_held_at_the_cap_is_closed_when_the_server_stops() -> None:
    listener = MemoryListener()
    async with capped_server(1, listener) as (_, app):
        busy = H1Client(listener.connect())
        await busy.send(h11.Request(method="GET", target="/hold", headers=[("host", "x")]), h11.EndOfMessage())
        await app.holding.wait()
        held = listener.connect()
        await trio.testing.wait_all_tasks_blocked()
    with trio.fail_after(5):
        assert await receive_all(held) == b""


async def test_emfile_backs_off_frees_an_idle_connection_and_logs_one_line_per_burst(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "llmsim.server")
    listener = MemoryListener()
    async with capped_server(100, listener):
        idle = H1Client(listener.connect())
        await idle.request("GET", "/health")  # now idle between requests
        await trio.testing.wait_all_tasks_blocked()
        listener.errors = [errno.EMFILE] * 50
        listener.connect()  # taken by the accept call already waiting; the next 50 fail
        started = trio.current_time()
        late = H1Client(listener.connect())
        head, _ = await late.request("GET", "/health")
        assert head.status_code == 200 and not listener.errors
        assert 5.0 < trio.current_time() - started < 30.0  # backed off (0, then 0.01 s doubling up to 0.5 s)
        assert await receive_all(idle.stream) == b""  # closed to make room
        listener.errors = [errno.EMFILE]  # 1 s later: the same burst
        await trio.sleep(1.0)
        await H1Client(listener.connect()).request("GET", "/health")
        assert not any("accepting again" in r.getMessage() for r in caplog.records)
        await trio.sleep(5.0)  # quiet for BURST_QUIET: the next accept ends the burst
        await H1Client(listener.connect()).request("GET", "/health")
    warnings = [r for r in caplog.records if r.name == "llmsim.server" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "EMFILE" in warnings[0].getMessage() and not warnings[0].exc_info
    ended = [r.getMessage() for r in caplog.records if "accepting again" in r.getMessage()]
    assert ended == ["accepting again: 51 accepts had failed over 23.1 s"]  # 22.1 s of back-off, then 1 s


def test_the_default_cap_leaves_a_tenth_of_the_fd_limit_for_everything_else() -> None:
    assert default_max_connections(1024) == 922
    assert default_max_connections(256) == 192  # at least 64 kept
    assert default_max_connections(65536) == 58983


def test_a_connections_stream_count_reaches_the_server_and_reports_going_idle() -> None:
    server, idle = ConnectionTracker(), []
    streams = ConnectionStreams(server=server, on_idle=lambda: idle.append(True))
    streams.stream_opened()
    streams.stream_opened()
    streams.stream_closed()
    assert (streams.own_streams, server.active_streams, idle) == (1, 1, [])
    streams.stream_closed()
    assert (streams.own_streams, server.active_streams, idle) == (0, 0, [True])


async def test_the_health_endpoint_answers_over_loopback_past_the_cap(nursery: trio.Nursery) -> None:
    """Real sockets: with the cap at 2 and 4 silent clients connected, /health still
    answers, and the three oldest silent clients were closed to make room."""
    serve = partial(serve_app, TestApp(), ServerOptions(port=0), limits=LimitOptions(max_connections=2))
    handle = await nursery.start(serve)
    silent = [await trio.open_tcp_stream(handle.host, handle.port) for _ in range(4)]
    client = H1Client(await trio.open_tcp_stream(handle.host, handle.port))
    with trio.fail_after(10):
        head, _ = await client.request("GET", "/health")
        assert head.status_code == 200
        for stream in silent[:3]:
            assert await receive_all(stream) == b""
    for stream in silent:
        await stream.aclose()


def test_the_limits_reach_the_protocol_settings() -> None:
    limits = LimitOptions(body_read_timeout=7.0, allow_cleartext=True)
    protocol = ProtocolSettings.from_options(ServerOptions(), None, limits)
    assert (protocol.body_read_timeout, protocol.allow_cleartext) == (7.0, True)


async def test_the_simulator_applies_max_connections_from_its_config() -> None:
    """``serve()`` passes ``Config.limits`` on: with a cap of 1, a silent client is
    displaced by the next one, whose request is answered."""
    async with open_simulator(max_connections=1) as handle:
        silent = await trio.open_tcp_stream(handle.host, handle.port)
        client = H1Client(await trio.open_tcp_stream(handle.host, handle.port))
        with trio.fail_after(10):
            head, _ = await client.request("GET", "/health")
            assert head.status_code == 200
            assert await receive_all(silent) == b""
        await silent.aclose()
        await client.stream.aclose()  # else the server's shutdown lingers 1 s for it to close
