"""HTTP/2 (h2c, prior knowledge) connections carrying many concurrent streams.

The frame layer is hand-rolled; header blocks go through ``hpack`` (h2's own HPACK
codec).  The h2 library itself was measured first and rejected for the receive path: it
spent 20 to 30 µs of CPU per DATA frame (state machines, a frame object and an eager
``repr()`` for its debug log), at most about 40,000 frames/s per process -- well below
what the servers under test send.  Here a DATA frame costs one ``struct`` unpack and a
list append (numbers in docs/benchmarks.md).

Flow control is made invisible to the server: every stream's window and the connection
window are 2**31-1, and the connection window is topped up in one WINDOW_UPDATE per
gigabyte received.  Stream windows are never topped up, which bounds one stream to
2 GiB: far beyond any benchmark stream.  Request bodies honour the server's windows.

All work happens in one reader task per connection: it parses frames, times events and
replaces every finished stream at once.  Small starter tasks only exist to spread the
first streams over the ramp-up period.
"""

from __future__ import annotations

import contextlib
import struct
import time

import hpack
import trio

from benchmarks.loadgen.plan import RECONNECT_PAUSE, Plan, sleep_until
from benchmarks.loadgen.records import StreamRecord
from benchmarks.loadgen.sse import ErrorBody, SseReader, body_reader

__all__ = ["run_h2_connection"]

RECEIVE_SIZE = 1 << 18
MAX_WINDOW = 2**31 - 1
#: Received bytes after which the connection window is replenished in one WINDOW_UPDATE.
WINDOW_TOP_UP = 2**30
DEFAULT_WINDOW = 65535
DEFAULT_FRAME_SIZE = 16384

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE = 0x1, 0x2, 0x3, 0x4
ERROR_NAMES = [
    "NO_ERROR",
    "PROTOCOL_ERROR",
    "INTERNAL_ERROR",
    "FLOW_CONTROL_ERROR",
    "SETTINGS_TIMEOUT",
    "STREAM_CLOSED",
    "FRAME_SIZE_ERROR",
    "REFUSED_STREAM",
    "CANCEL",
    "COMPRESSION_ERROR",
    "CONNECT_ERROR",
    "ENHANCE_YOUR_CALM",
    "INADEQUATE_SECURITY",
    "HTTP_1_1_REQUIRED",
]

_HEAD = struct.Struct(">HBBBI")  # 24-bit length as 16 + 8 bits, type, flags, stream id
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")


class ConnectionLostError(Exception):
    """The server closed the connection or broke the protocol."""


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return _HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


async def run_h2_connection(plan: Plan, first_starts: list[float]) -> None:
    """Keep ``len(first_starts)`` streams busy on one connection (reconnecting if it dies)."""
    while plan.may_start():
        try:
            sock = await trio.open_tcp_stream(plan.host, plan.port)
        except OSError as exc:
            plan.failed_attempt(f"connect: {exc}")
            await trio.sleep(RECONNECT_PAUSE)
            continue
        async with sock:
            await _Client(plan, sock).run(first_starts)
        first_starts = [0.0] * len(first_starts)


class _Client:
    """One HTTP/2 connection: frame buffer, HPACK state, open streams, windows, outbox."""

    def __init__(self, plan: Plan, sock: trio.SocketStream) -> None:
        self.plan = plan
        self.sock = sock
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", f"{plan.host}:{plan.port}".encode()),
            (b":path", plan.path.encode()),
            (b"content-type", b"application/json"),
            (b"accept", b"text/event-stream"),
            (b"content-length", str(len(plan.body)).encode()),
        ]
        self.buffer = b""
        self.outbox: list[bytes] = []
        self.send_lock = trio.Lock()
        self.next_stream_id = 1
        self.waiting: dict[int, StreamRecord] = {}  # request sent, no response headers yet
        self.bodies: dict[int, SseReader | ErrorBody] = {}
        self.header_block: tuple[int, int, list[bytes]] | None = None  # awaiting CONTINUATION
        self.slots = 0  # streams this connection should keep open (grows during the ramp)
        self.max_streams = 2**31
        self.send_window = DEFAULT_WINDOW
        self.stream_window = DEFAULT_WINDOW
        self.unacknowledged = 0
        self.remote_settings_seen = False
        self.settings_acked = False
        self.goaway = False

    async def run(self, first_starts: list[float]) -> None:
        settings = _SETTING.pack(INITIAL_WINDOW_SIZE, MAX_WINDOW) + _SETTING.pack(ENABLE_PUSH, 0)
        self.outbox += [
            PREFACE,
            frame(SETTINGS, 0, 0, settings),
            frame(WINDOW_UPDATE, 0, 0, _U32.pack(MAX_WINDOW - DEFAULT_WINDOW)),
        ]
        try:
            await self._flush()
            while not (self.remote_settings_seen and self.settings_acked):
                self._receive(await self._read(), time.perf_counter())
                await self._flush()
            if len(self.plan.body) > self.stream_window:
                raise ConnectionLostError(f"initial stream window {self.stream_window} < request body")
            async with trio.open_nursery() as nursery:
                for at in first_starts:
                    nursery.start_soon(self._add_slot_at, at)
                await self._read_loop()
                nursery.cancel_scope.cancel()
        except (ConnectionLostError, trio.BrokenResourceError, OSError, hpack.HPACKError) as exc:
            self._fail_all(f"{type(exc).__name__}: {exc}")

    async def _add_slot_at(self, at: float) -> None:
        await sleep_until(at)
        self.slots += 1
        self._top_up()
        with contextlib.suppress(trio.BrokenResourceError, OSError):
            await self._flush()  # if broken, the reader task sees it and fails the streams

    async def _read_loop(self) -> None:
        """Process frames until the connection ends (the plan's deadline cancels it)."""
        while not (self.goaway and not self.waiting and not self.bodies):
            data = await self._read()
            self._receive(data, time.perf_counter())
            if self.unacknowledged >= WINDOW_TOP_UP:
                self.outbox.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.unacknowledged)))
                self.unacknowledged = 0
            self._top_up()
            await self._flush()

    def _top_up(self) -> None:
        """Open streams until this connection carries its share, if the server allows."""
        body = self.plan.body
        need = len(body)
        limit = min(self.slots, self.max_streams)
        while (
            len(self.waiting) + len(self.bodies) < limit
            and need <= self.send_window
            and not self.goaway
            and self.plan.may_start()
        ):
            stream_id = self.next_stream_id
            self.next_stream_id += 2
            self.waiting[stream_id] = self.plan.new_record()
            self.outbox.append(frame(HEADERS, END_HEADERS, stream_id, self.encoder.encode(self.headers)))
            for start in range(0, need, DEFAULT_FRAME_SIZE):
                last = start + DEFAULT_FRAME_SIZE >= need
                self.outbox.append(
                    frame(DATA, END_STREAM if last else 0, stream_id, body[start : start + DEFAULT_FRAME_SIZE])
                )
            self.send_window -= need

    def _receive(self, data: bytes, now: float) -> None:
        """Parse every complete frame; a read's DATA for one stream reaches its reader joined."""
        buffer = self.buffer + data if self.buffer else data
        size = len(buffer)
        position = 0
        pending: dict[int, list[bytes]] = {}
        bodies = self.bodies
        unpack = _HEAD.unpack_from
        received = 0
        while size - position >= 9:
            high, low, kind, flags, stream_id = unpack(buffer, position)
            end = position + 9 + (high << 8 | low)
            if end > size:
                break
            stream_id &= 0x7FFFFFFF
            if kind == DATA:
                received += end - position - 9
                if stream_id in bodies:
                    payload = buffer[position + 9 : end]
                    if flags & PADDED:
                        payload = payload[1 : len(payload) - payload[0]]
                    pieces = pending.get(stream_id)
                    if pieces is None:
                        pending[stream_id] = [payload]
                    else:
                        pieces.append(payload)
                    if flags & END_STREAM:
                        self._end(stream_id, pending, now)
            else:
                self._control(kind, flags, stream_id, buffer[position + 9 : end], pending, now)
            position = end
        self.buffer = buffer[position:]
        self.unacknowledged += received
        for stream_id, pieces in pending.items():
            body = bodies.get(stream_id)
            if body is not None:
                body.feed(b"".join(pieces), now)

    def _control(
        self, kind: int, flags: int, stream_id: int, payload: bytes, pending: dict[int, list[bytes]], now: float
    ) -> None:
        """Every frame but DATA."""
        if self.header_block is not None and kind != CONTINUATION:
            raise ConnectionLostError("header block interrupted before END_HEADERS")
        if kind == HEADERS:
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self.header_block = (stream_id, flags, [payload])
            if flags & END_HEADERS:
                self._headers(pending, now)
        elif kind == CONTINUATION:
            if self.header_block is None or self.header_block[0] != stream_id:
                raise ConnectionLostError("unexpected CONTINUATION")
            self.header_block[2].append(payload)
            if flags & END_HEADERS:
                self._headers(pending, now)
        elif kind == SETTINGS:
            self._settings(flags, payload)
        elif kind == WINDOW_UPDATE:
            if stream_id == 0:
                self.send_window += _U32.unpack(payload)[0] & 0x7FFFFFFF
        elif kind == PING:
            if not flags & ACK:
                self.outbox.append(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self._fail(stream_id, f"RST_STREAM {_error_name(_U32.unpack(payload)[0])}", now)
        elif kind == GOAWAY:
            last, code = struct.unpack_from(">II", payload)
            self._goaway(last & 0x7FFFFFFF, _error_name(code), now)
        elif kind == PUSH_PROMISE:
            raise ConnectionLostError("PUSH_PROMISE although ENABLE_PUSH is 0")

    def _headers(self, pending: dict[int, list[bytes]], now: float) -> None:
        assert self.header_block is not None
        stream_id, flags, pieces = self.header_block
        self.header_block = None
        headers = self.decoder.decode(b"".join(pieces), raw=True)  # always: keeps HPACK state in sync
        record = self.waiting.get(stream_id)
        if record is not None:
            status = next((int(value) for name, value in headers if name == b":status"), 0)
            if 100 <= status < 200:
                return  # informational: the real response follows
            del self.waiting[stream_id]
            record.status = status
            self.bodies[stream_id] = body_reader(record)
        if flags & END_STREAM:
            self._end(stream_id, pending, now)

    def _settings(self, flags: int, payload: bytes) -> None:
        if flags & ACK:
            self.settings_acked = True
            return
        for offset in range(0, len(payload) - 5, 6):
            code, value = _SETTING.unpack_from(payload, offset)
            if code == MAX_CONCURRENT_STREAMS:
                self.max_streams = value
            elif code == INITIAL_WINDOW_SIZE:
                self.stream_window = value
            elif code == HEADER_TABLE_SIZE:
                self.encoder.header_table_size = min(value, 4096)
        self.remote_settings_seen = True
        self.outbox.append(frame(SETTINGS, ACK, 0))

    def _end(self, stream_id: int, pending: dict[int, list[bytes]], now: float) -> None:
        body = self.bodies.pop(stream_id, None)
        if body is None:
            self._fail(stream_id, "stream ended without response headers", now)
            return
        pieces = pending.pop(stream_id, None)
        if pieces:
            body.feed(b"".join(pieces), now)
        body.finish(now)

    def _goaway(self, last_stream_id: int, error: str, now: float) -> None:
        """Streams above the last one the server processed will never be answered."""
        self.goaway = True
        for stream_id in [*self.waiting, *self.bodies]:
            if stream_id > last_stream_id:
                self._fail(stream_id, f"GOAWAY {error}", now)

    def _fail(self, stream_id: int, error: str, now: float) -> None:
        record = self.waiting.pop(stream_id, None)
        if record is None:
            body = self.bodies.pop(stream_id, None)
            if body is None:
                return
            record = body.record
        record.fail(error, now)

    def _fail_all(self, error: str) -> None:
        now = time.perf_counter()
        for stream_id in [*self.waiting, *self.bodies]:
            self._fail(stream_id, error, now)

    async def _read(self) -> bytes:
        data = await self.sock.receive_some(RECEIVE_SIZE)
        if not data:
            raise ConnectionLostError("server closed the connection")
        return data

    async def _flush(self) -> None:
        if not self.outbox:
            return  # most reads queue nothing: skip the lock
        # Taken under the lock so that frames leave in the order they were queued.
        async with self.send_lock:
            if self.outbox:
                data = b"".join(self.outbox)
                self.outbox.clear()
                await self.sock.send_all(data)


def _error_name(code: int) -> str:
    return ERROR_NAMES[code] if code < len(ERROR_NAMES) else str(code)
