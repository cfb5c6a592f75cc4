"""A test Application, in-memory connections, and real h11/h2 clients for protocol tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h2.config
import h2.connection
import h2.events
import h11
import trio
import trio.testing
from h2.settings import SettingCodes, Settings
from hyperframe.frame import Frame, GoAwayFrame

from llmsim.api.http import Application, HttpRequest, ResponseStream
from llmsim.config import Config
from llmsim.protocol.native.connection import Connection
from llmsim.protocol.native.server import serve_app
from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings, ServerHandle

SSE = ((b"content-type", b"text/event-stream"),)


def _query(request: HttpRequest) -> dict[str, str]:
    return dict(part.split("=", 1) for part in request.query.split("&") if "=" in part)


@attrs.define(eq=False)
class TestApp:
    """Routes by path; records what happened to each request for the assertions.

    ``/echo`` returns the body; ``/stream?n=N`` streams N events, one per checkpoint;
    ``/burst?n=N`` writes N events synchronously; ``/big?size=N`` writes N bytes;
    ``/hold`` sends one event then waits for ``release`` (or cancellation);
    ``/fail`` raises; ``/fail-late`` raises after its head; ``/noend`` returns without end;
    ``/health`` is an empty 200.
    """

    __test__ = False  # not a pytest class

    requests: list[HttpRequest] = attrs.field(factory=list)
    log: list[str] = attrs.field(factory=list)  # "start /x", "end /x", "cancelled /x", "closed /x"
    release: trio.Event = attrs.field(factory=trio.Event)
    holding: trio.Event = attrs.field(factory=trio.Event)  # set when a /hold handler is waiting
    write_results: list[bool] = attrs.field(factory=list)
    drained: trio.Event = attrs.field(factory=trio.Event)
    gone: trio.Event = attrs.field(factory=trio.Event)  # set when a client went away mid-response

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        self.requests.append(request)
        path = request.path
        self.log.append(f"start {path}")
        response.on_close(lambda: self._closed(path))
        try:
            await self._route(request, response)
        except trio.Cancelled:
            self.log.append(f"cancelled {path}")
            raise
        self.log.append(f"end {path}")

    def _closed(self, path: str) -> None:
        self.log.append(f"closed {path}")
        self.gone.set()

    async def _route(self, request: HttpRequest, response: ResponseStream) -> None:
        query = _query(request)
        path = request.path
        if path == "/echo":
            body = json.dumps(
                {"method": request.method, "body": request.body.decode(), "query": request.query}
            ).encode()
            response.start(200, [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))])
            response.end(body)
        elif path == "/stream":
            response.start(200, SSE)
            for i in range(int(query.get("n", "3"))):
                response.write(b"data: %d\n\n" % i)
                await trio.lowlevel.checkpoint()
            response.end(b"data: [DONE]\n\n")
        elif path == "/burst":
            response.start(200, SSE)
            for i in range(int(query.get("n", "3"))):
                response.write(b"data: %d\n\n" % i)
            response.end()
        elif path == "/big":
            await self._big(response, int(query.get("size", "100000")))
        elif path == "/hold":
            response.start(200, SSE)
            response.write(b"data: first\n\n")
            self.holding.set()
            await self.release.wait()
            response.end(b"data: last\n\n")
        elif path == "/fail":
            raise RuntimeError("the test app fails on purpose")
        elif path == "/fail-late":
            response.start(200, SSE)
            response.write(b"data: first\n\n")
            await trio.lowlevel.checkpoint()
            raise RuntimeError("the test app fails on purpose, after its head")
        elif path == "/noend":
            response.start(200, SSE)
        elif path == "/health":
            response.start(200, [(b"content-length", b"0")])
            response.end()
        else:
            response.start(404, [(b"content-length", b"0")])
            response.end()

    async def _big(self, response: ResponseStream, size: int) -> None:
        response.start(200, [(b"content-type", b"application/octet-stream")])
        self.write_results.append(response.write(b"x" * size))
        response.on_drained(self.drained.set)
        await self.drained.wait()
        response.end()


def settings(**overrides: Any) -> ProtocolSettings:
    return attrs.evolve(ProtocolSettings(), **overrides)


@attrs.define(eq=False)
class MemoryConnection:
    """A server Connection on one end of an in-memory stream pair; the test holds the other."""

    client: trio.abc.HalfCloseableStream
    connection: Connection
    tracker: ConnectionTracker
    done: trio.Event


@asynccontextmanager
async def open_memory_connection(
    app: Application,
    protocol_settings: ProtocolSettings | None = None,
    *,
    pair: Callable[
        [], tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream]
    ] = trio.testing.memory_stream_pair,
) -> AsyncIterator[MemoryConnection]:
    client, server = pair()
    tracker = ConnectionTracker()
    connection = Connection(server, app, protocol_settings or ProtocolSettings(), tracker)
    done = trio.Event()

    async def run() -> None:
        try:
            await connection.run()
        finally:
            done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        yield MemoryConnection(client, connection, tracker, done)
        nursery.cancel_scope.cancel()


async def serve_until_cancelled(
    app: Application,
    config: Config,
    scope: trio.CancelScope,
    done: trio.Event,
    *,
    task_status: trio.TaskStatus[ServerHandle],
) -> None:
    """``serve_app`` until ``scope`` is cancelled (a shutdown, with its grace period);
    ``done`` is set once it returned."""
    with scope:
        await serve_app(app, config.server, task_status=task_status)
    done.set()


def split_frames(data: bytes) -> tuple[list[tuple[Frame, int]], bytes]:
    """The whole HTTP/2 frames at the start of ``data``, parsed, each with its payload
    length, and the bytes of an incomplete frame after them."""
    frames, view = [], memoryview(data)
    while len(view) >= 9:
        frame, length = Frame.parse_frame_header(view[:9])
        if len(view) < 9 + length:
            break
        frame.parse_body(view[9 : 9 + length])
        frames.append((frame, length))
        view = view[9 + length :]
    return frames, bytes(view)


async def receive_all(stream: trio.abc.ReceiveStream) -> bytes:
    """Everything until EOF."""
    chunks = []
    while data := await stream.receive_some(65536):
        chunks.append(data)
    return b"".join(chunks)


# --- HTTP/1.1 -----------------------------------------------------------------------------


@attrs.define(eq=False)
class H1Client:
    stream: trio.abc.HalfCloseableStream
    conn: h11.Connection = attrs.field(factory=lambda: h11.Connection(h11.CLIENT))

    async def send(self, *events: h11.Event) -> None:
        for event in events:
            data = self.conn.send(event)
            if data:
                await self.stream.send_all(data)

    async def next_event(self) -> h11.Event:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(bytes(await self.stream.receive_some(65536)))
                continue
            assert event is not h11.PAUSED
            return event  # type: ignore[return-value]

    async def response(self) -> tuple[h11.Response, bytes]:
        """The next response (skipping 1xx) and its whole body."""
        head = await self.next_event()
        while isinstance(head, h11.InformationalResponse):
            head = await self.next_event()
        assert isinstance(head, h11.Response), head
        body = []
        while not isinstance(event := await self.next_event(), h11.EndOfMessage):
            assert isinstance(event, h11.Data), event
            body.append(event.data)
        return head, b"".join(body)

    async def request(
        self, method: str, target: str, body: bytes = b"", headers: tuple = ()
    ) -> tuple[h11.Response, bytes]:
        all_headers = [("host", "test"), *headers]
        if body:
            all_headers.append(("content-length", str(len(body))))
        await self.send(h11.Request(method=method, target=target, headers=all_headers))
        if body:
            await self.send(h11.Data(data=body))
        await self.send(h11.EndOfMessage())
        response = await self.response()
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return response


# --- HTTP/2 -------------------------------------------------------------------------------


@attrs.define(eq=False)
class StreamRecord:
    """What a test client saw of one stream."""

    headers: dict[bytes, bytes] | None = None
    chunks: list[bytes] = attrs.field(factory=list)  # one per DATA frame
    ended: bool = False
    reset: int | None = None  # the RST_STREAM error code
    trailers: tuple[tuple[bytes, bytes], ...] = ()

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def done(self) -> bool:
        return self.ended or self.reset is not None


@attrs.define(eq=False)
class H2Client:
    """An h2 client over a stream, recording every stream in ``records``.

    GOAWAY frames are taken out before h2 sees them (and kept in ``goaways``): h2
    refuses DATA after a GOAWAY, and the tests need the streams that finish after one.
    With ``auto_ack`` off, received DATA is not acknowledged (no WINDOW_UPDATE).
    """

    stream: trio.abc.HalfCloseableStream
    conn: h2.connection.H2Connection = attrs.field(
        factory=lambda: h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    )
    records: dict[int, StreamRecord] = attrs.field(factory=dict)
    goaways: list[GoAwayFrame] = attrs.field(factory=list)
    auto_ack: bool = True
    eof: bool = False
    _pending: bytes = b""

    async def start(self, **local_settings: int) -> None:
        """The preface, then SETTINGS with ``local_settings`` (``MAX_FRAME_SIZE=...``)."""
        self.conn.initiate_connection()
        if local_settings:
            self.conn.update_settings({getattr(SettingCodes, name): value for name, value in local_settings.items()})
        await self.flush()

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            await self.stream.send_all(data)

    def ignore_stream_limit(self) -> None:
        """Behave like a client that never read the server's MAX_CONCURRENT_STREAMS."""
        self.conn.remote_settings = Settings(
            client=False, initial_values={SettingCodes.MAX_CONCURRENT_STREAMS: 2**31 - 1}
        )

    async def request(self, path: str, *, method: str = "GET", body: bytes = b"", headers: tuple = ()) -> int:
        sid = self.conn.get_next_available_stream_id()
        head = [
            (b":method", method.encode()),
            (b":path", path.encode()),
            (b":scheme", b"http"),
            (b":authority", b"test"),
        ]
        self.conn.send_headers(sid, [*head, *headers], end_stream=not body)
        if body:
            self.conn.send_data(sid, body, end_stream=True)
        await self.flush()
        self.records[sid] = StreamRecord()
        return sid

    async def pump(self) -> None:
        """Receive once and record what it says."""
        data = await self.stream.receive_some(65536)
        if not data:
            self.eof = True
            return
        await self.feed(data)

    async def feed(self, data: bytes | bytearray) -> None:
        """Bytes from the server (``pump`` reads them; the h2c test has some already)."""
        for event in self.conn.receive_data(self._without_goaway(data)):
            self._record(event)
        await self.flush()

    def _record(self, event: h2.events.Event) -> None:
        sid = getattr(event, "stream_id", None)
        if not sid:
            return
        record = self.records.setdefault(sid, StreamRecord())
        if isinstance(event, h2.events.ResponseReceived):
            record.headers = dict(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            record.chunks.append(event.data)
            if self.auto_ack:
                self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
        elif isinstance(event, h2.events.TrailersReceived):
            record.trailers = tuple(event.headers or ())
        elif isinstance(event, h2.events.StreamEnded):
            record.ended = True
        elif isinstance(event, h2.events.StreamReset):
            record.reset = event.error_code

    def _without_goaway(self, data: bytes | bytearray) -> bytes:
        buffer, kept = self._pending + data, []
        while len(buffer) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(buffer[:9]))
            if len(buffer) < 9 + length:
                break
            raw, buffer = buffer[: 9 + length], buffer[9 + length :]
            if isinstance(frame, GoAwayFrame):
                frame.parse_body(memoryview(raw[9:]))
                self.goaways.append(frame)
            else:
                kept.append(raw)
        self._pending = buffer
        return b"".join(kept)

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            assert not self.eof, "the server closed the connection"
            await self.pump()

    async def response(self, sid: int) -> StreamRecord:
        """The record of stream ``sid`` once it has ended or been reset."""
        await self.wait_until(lambda: self.records[sid].done)
        return self.records[sid]

    async def wait_for_eof(self) -> None:
        while not self.eof:
            await self.pump()


def h2_fields(obj: object) -> dict[str, Any]:
    """Every attribute of one of h2's objects by name, slots included: llmsim's
    subclasses of h2's connection, stream and state machines keep a few in slots
    (llmsim/protocol/native/h2_objects.py), where ``vars()`` does not see them."""
    fields = dict(vars(obj))
    for cls in type(obj).__mro__:
        for name in cls.__dict__.get("__slots__", ()):
            if hasattr(obj, name):
                fields[name] = getattr(obj, name)
    return fields


@attrs.define(eq=False)
class RecordingTransport:
    """A protocol handler's transport that only records: its wake-ups and spawns in
    ``calls`` (a wake-up raises once ``fail_wake``), and the arguments of the handler
    tasks it is asked to spawn, which never run, in ``spawned`` (the test drives the
    responses itself)."""

    settings: ProtocolSettings = attrs.field(factory=ProtocolSettings)
    app: Any = None
    tracker: ConnectionTracker = attrs.field(factory=ConnectionTracker)
    scheme: str = "http"
    shutting_down: bool = False
    congested: bool = False
    calls: list[str] = attrs.field(factory=list)
    spawned: list[tuple[Any, ...]] = attrs.field(factory=list)
    spawned_functions: list[Callable[..., Awaitable[Any]]] = attrs.field(factory=list)  # of each in spawned
    fail_wake: bool = False

    def wake_writer(self) -> None:
        self.calls.append("wake")
        if self.fail_wake:
            raise RuntimeError("the writer is gone")

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        self.calls.append("spawn")
        self.spawned.append(args)
        self.spawned_functions.append(fn)

    def set_read_deadline(self, deadline: float) -> None:
        pass
