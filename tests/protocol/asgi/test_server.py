"""serve_hypercorn over loopback: HTTP/1.1, HTTP/2 (prior knowledge and ALPN),
disconnects, body limits and graceful shutdown, with a tiny test Application."""

from __future__ import annotations

from typing import Any

import attrs
import h2.config
import h2.connection
import h2.events
import httpx
import orjson
import pytest
import trio
import trio.testing

from llmsim.api.http import HttpRequest, ResponseStream
from llmsim.config import Config
from llmsim.protocol.asgi.server import hypercorn_config, serve_hypercorn
from llmsim.protocol.settings import ConnectionTracker, ServerHandle

BIG = 256 * 1024  # more than an HTTP/2 client's default window and hypercorn's buffer


@attrs.define(eq=False)
class LoopbackApp:
    """``/hello``, ``/echo``, ``/big``, and ``/stream``: one event, then wait for
    ``release`` before the last one."""

    release: trio.Event = attrs.field(factory=trio.Event)
    cancelled: trio.Event = attrs.field(factory=trio.Event)

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        if request.path == "/stream":
            await self._stream(response)
            return
        if request.path == "/big":
            response.start(200, ((b"content-length", str(BIG).encode()),))
            response.end(b"x" * BIG)
            return
        data = request.body if request.path == "/echo" else orjson.dumps({"hello": request.http_version})
        response.start(200, ((b"content-length", str(len(data)).encode()),))
        response.end(data)

    async def _stream(self, response: ResponseStream) -> None:
        response.start(200, ((b"content-type", b"text/event-stream"),))
        response.write(b"data: 1\n\n")
        try:
            await self.release.wait()
        except trio.Cancelled:
            self.cancelled.set()
            raise
        response.end(b"data: [DONE]\n\n")


@attrs.define(eq=False)
class FakeSimulator:
    app: LoopbackApp = attrs.field(factory=LoopbackApp)
    engine_running: bool = False

    async def run_engine(self) -> None:
        self.engine_running = True
        try:
            await trio.sleep_forever()
        finally:
            self.engine_running = False


@attrs.define(eq=False)
class IdleTracker(ConnectionTracker):
    """A ConnectionTracker that tells when its last active stream closed."""

    idle: trio.Event = attrs.field(factory=trio.Event)

    def stream_closed(self) -> None:
        super().stream_closed()
        if self.active_streams == 0:
            self.idle.set()


def config(**overrides: Any) -> Config:
    return Config(port=0, server="hypercorn", shutdown_grace_period=1.0, **overrides)


@attrs.frozen
class Running:
    handle: ServerHandle
    sim: FakeSimulator
    tracker: IdleTracker


async def start_server(nursery: trio.Nursery, **overrides: Any) -> Running:
    sim, tracker = FakeSimulator(), IdleTracker()
    handle = await nursery.start(serve_hypercorn, sim, config(**overrides).server, tracker)
    return Running(handle, sim, tracker)


@pytest.fixture
async def server(nursery: trio.Nursery) -> Running:
    return await start_server(nursery)


def client(url: str, http_version: str, **options: Any) -> httpx.AsyncClient:
    http2 = http_version == "HTTP/2"
    return httpx.AsyncClient(base_url=url, http1=not http2, http2=http2, **options)


def counters(tracker: ConnectionTracker) -> tuple[int, int, int]:
    stats = tracker.statistics()
    return stats.open_connections, stats.active_streams, stats.requests_served


@attrs.define(eq=False)
class H2Client:
    """A bare h2 client connection (prior knowledge), for what httpx cannot do."""

    stream: trio.SocketStream
    conn: h2.connection.H2Connection

    @classmethod
    async def connect(cls, port: int) -> H2Client:
        client = cls(
            await trio.open_tcp_stream("127.0.0.1", port),
            h2.connection.H2Connection(h2.config.H2Configuration(client_side=True)),
        )
        client.conn.initiate_connection()
        await client.flush()
        return client

    async def flush(self) -> None:
        await self.stream.send_all(self.conn.data_to_send())

    async def get(self, stream_id: int, path: str) -> None:
        headers = [(":method", "GET"), (":path", path), (":scheme", "http"), (":authority", "sim")]
        self.conn.send_headers(stream_id, headers, end_stream=True)
        await self.flush()

    async def events(self) -> list[h2.events.Event]:
        events = self.conn.receive_data(await self.stream.receive_some())
        await self.flush()
        return events

    async def wait_for_data(self) -> None:
        while not any(isinstance(e, h2.events.DataReceived) for e in await self.events()):
            pass


async def receive_until(stream: trio.SocketStream, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = await stream.receive_some()
        assert chunk, f"the connection closed before {marker!r}"
        data += chunk
    return data


async def open_stream(port: int, http_version: str) -> trio.SocketStream:
    """A connection on which ``/stream`` has sent its first event."""
    if http_version == "HTTP/2":
        client = await H2Client.connect(port)
        await client.get(1, "/stream")
        await client.wait_for_data()
        return client.stream
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"GET /stream HTTP/1.1\r\nhost: sim\r\n\r\n")
    await receive_until(stream, b"data: 1\n\n")
    return stream


def test_hypercorn_config_follows_ours() -> None:
    hc = hypercorn_config(
        Config(host="::1", port=0, max_concurrent_streams=7, shutdown_grace_period=2.5, keep_alive_timeout=9.0).server
    )
    assert hc.bind == ["[::1]:0"]
    assert (hc.h2_max_concurrent_streams, hc.graceful_timeout, hc.keep_alive_timeout) == (7, 2.5, 9.0)
    assert hc.alpn_protocols == ["h2", "http/1.1"]
    assert not hc.include_server_header
    assert not hc.ssl_enabled


async def test_the_handle_reports_the_bound_port_and_the_engine_runs(server: Running) -> None:
    assert server.handle.port > 0
    assert server.handle.host == "127.0.0.1"
    assert server.handle.url == f"http://127.0.0.1:{server.handle.port}"
    assert server.sim.engine_running


@pytest.mark.parametrize("http_version", ["HTTP/1.1", "HTTP/2"])
async def test_get_and_post(server: Running, http_version: str) -> None:
    async with client(server.handle.url, http_version) as http:
        hello = await http.get("/hello?x=1")
        echo = await http.post("/echo", content=b'{"prompt": "hi"}')
    assert hello.http_version == echo.http_version == http_version
    assert hello.json() == {"hello": http_version.removeprefix("HTTP/")}
    assert "server" not in hello.headers
    assert echo.content == b'{"prompt": "hi"}'
    await trio.testing.wait_all_tasks_blocked()
    assert counters(server.tracker) == (0, 0, 2)


@pytest.mark.parametrize("http_version", ["HTTP/1.1", "HTTP/2"])
async def test_tls_negotiates_the_protocol_with_alpn(nursery: trio.Nursery, http_version: str) -> None:
    running = await start_server(nursery, self_signed_certs=True)
    assert running.handle.url.startswith("https://")
    async with client(running.handle.url, http_version, verify=False) as http:
        response = await http.get("/hello")
    assert response.http_version == http_version


@pytest.mark.parametrize("http_version", ["HTTP/1.1", "HTTP/2"])
async def test_statistics_return_to_zero_after_a_disconnect_mid_stream(server: Running, http_version: str) -> None:
    stream = await open_stream(server.handle.port, http_version)
    assert counters(server.tracker) == (1, 1, 0)
    await stream.aclose()
    with trio.fail_after(5):
        await server.sim.app.cancelled.wait()
        await server.tracker.idle.wait()
    assert counters(server.tracker) == (0, 0, 0)


async def test_http2_reset_cancels_only_that_stream(server: Running) -> None:
    client = await H2Client.connect(server.handle.port)
    await client.get(1, "/stream")
    await client.wait_for_data()
    client.conn.reset_stream(1)
    await client.flush()
    with trio.fail_after(5):
        await server.sim.app.cancelled.wait()
        await server.tracker.idle.wait()
    assert counters(server.tracker) == (0, 0, 0)

    await client.get(3, "/hello")
    body = b""
    while True:
        events = await client.events()
        body += b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived) and e.stream_id == 3)
        if any(isinstance(e, h2.events.StreamEnded) and e.stream_id == 3 for e in events):
            break
    assert orjson.loads(body) == {"hello": "2"}
    await client.stream.aclose()


async def test_http2_connection_lost_during_the_final_send_leaves_nothing_behind(
    server: Running, autojump_clock: trio.testing.MockClock
) -> None:
    """hypercorn's last ``more_body=False`` send waits for a drain that never comes once
    the TCP connection is gone; the adapter gives up on it after its timeout."""
    client = await H2Client.connect(server.handle.port)
    await client.get(1, "/big")
    received = 0
    while received < 16 * 1024:  # the response is underway; never acknowledged, so it stalls
        received += sum(len(e.data) for e in await client.events() if isinstance(e, h2.events.DataReceived))
    await client.stream.aclose()
    with trio.fail_after(10):
        await server.tracker.idle.wait()
    assert counters(server.tracker) == (0, 0, 0)


@pytest.mark.parametrize("http_version", ["HTTP/1.1", "HTTP/2"])
async def test_a_body_over_the_limit_is_answered_413(nursery: trio.Nursery, http_version: str) -> None:
    running = await start_server(nursery, max_request_body_size_mb=0.001)
    async with client(running.handle.url, http_version) as http:
        response = await http.post("/echo", content=b"x" * 5000)
        again = await http.post("/echo", content=b"small")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == 413
    assert again.content == b"small"


async def run_cancellable(
    nursery: trio.Nursery, sim: FakeSimulator, tracker: ConnectionTracker
) -> tuple[ServerHandle, trio.CancelScope, trio.Event]:
    """serve_hypercorn in a scope of its own, so that a test can cancel just the server."""
    scope, done = trio.CancelScope(), trio.Event()

    async def run(task_status: trio.TaskStatus[ServerHandle]) -> None:
        with scope:
            await serve_hypercorn(sim, config().server, tracker, task_status=task_status)
        done.set()

    handle: ServerHandle = await nursery.start(run)
    return handle, scope, done


async def test_cancellation_is_a_graceful_shutdown(nursery: trio.Nursery) -> None:
    """In-flight streams finish; the engine runs until hypercorn has returned."""
    sim, tracker = FakeSimulator(), IdleTracker()
    handle, server_scope, server_done = await run_cancellable(nursery, sim, tracker)
    stream = await open_stream(handle.port, "HTTP/1.1")
    server_scope.cancel()
    await trio.testing.wait_all_tasks_blocked()
    assert not server_done.is_set()
    assert sim.engine_running
    sim.app.release.set()
    assert b"data: [DONE]\n\n" in await receive_until(stream, b"\r\n0\r\n\r\n")
    await stream.aclose()
    with trio.fail_after(5):
        await server_done.wait()
    assert not sim.engine_running
    assert counters(tracker) == (0, 0, 1)
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", handle.port)


async def test_streams_still_running_after_the_grace_period_are_cancelled(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    sim, tracker = FakeSimulator(), IdleTracker()
    handle, server_scope, server_done = await run_cancellable(nursery, sim, tracker)
    stream = await open_stream(handle.port, "HTTP/2")
    stopped_at = trio.current_time()
    server_scope.cancel()
    await sim.app.cancelled.wait()
    assert trio.current_time() - stopped_at == pytest.approx(1.0)
    await server_done.wait()
    assert counters(tracker) == (0, 0, 0)
    await stream.aclose()
