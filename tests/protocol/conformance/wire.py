"""h2spec's client, rebuilt for trio: hand-built frames over a raw socket, and its verdicts.

``Peer`` mirrors h2spec's ``spec.Conn`` (``spec/connection.go``): the same handshake, the
same writes (with no checks, so that it can send the invalid frames h2 would refuse to
produce), the same HPACK encoder kept across header blocks, and the same reads, one frame
or the end of the connection at a time.  The ``expect_*`` methods are h2spec's
``spec.Verify*`` functions (``spec/verifier.go``): each waits for the event that decides
the case and accepts the same outcomes.  ``GUARD`` only bounds a wait that would
otherwise hang (a server that never answers fails the case); no case passes by timing
out, so the bound is longer than h2spec's 2 s (its ``--timeout``): a pass never waits for
it, and a slow answer on a loaded machine should not count as none.

h2spec's leniency is kept: where it expects a GOAWAY (or RST_STREAM) with some error code
and one arrives with another code, it reads on, and passes if the connection then closes.
``Peer.other_codes`` records those frames, so that the tests can hold each backend to the
codes it is known to send instead (``outcomes.OTHER_CODES``).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Sequence

import attrs
import trio
from hpack import Encoder

GUARD = 5.0  # seconds without a decisive event before a case fails (see above)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DEFAULT_WINDOW = 65535

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
FRAME_NAMES = (
    "DATA",
    "HEADERS",
    "PRIORITY",
    "RST_STREAM",
    "SETTINGS",
    "PUSH_PROMISE",
    "PING",
    "GOAWAY",
    "WINDOW_UPDATE",
    "CONTINUATION",
)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ERROR_NAMES = {
    0x0: "NO_ERROR",
    0x1: "PROTOCOL_ERROR",
    0x2: "INTERNAL_ERROR",
    0x3: "FLOW_CONTROL_ERROR",
    0x4: "SETTINGS_TIMEOUT",
    0x5: "STREAM_CLOSED",
    0x6: "FRAME_SIZE_ERROR",
    0x7: "REFUSED_STREAM",
    0x8: "CANCEL",
    0x9: "COMPRESSION_ERROR",
    0xB: "ENHANCE_YOUR_CALM",
}
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = (
    range(1, 7)
)

Field = tuple[str, str]


class Mismatch(AssertionError):
    """The server did something other than what the case accepts."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"expected {expected}; actual: {actual}")
        self.expected = expected
        self.actual = actual


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, hex(code))


@attrs.frozen
class Frame:
    type: int
    flags: int
    stream_id: int
    payload: bytes

    @property
    def code(self) -> int:
        """The error code of a RST_STREAM or GOAWAY frame."""
        offset = 4 if self.type == GOAWAY else 0
        return int.from_bytes(self.payload[offset : offset + 4], "big")

    def has(self, flag: int) -> bool:
        return bool(self.flags & flag)

    def __str__(self) -> str:
        name = FRAME_NAMES[self.type] if self.type < len(FRAME_NAMES) else f"type {self.type:#x}"
        detail = f" {error_name(self.code)}" if self.type in (GOAWAY, RST_STREAM) else ""
        return f"{name}{detail} (length:{len(self.payload)}, flags:{self.flags:#04x}, stream_id:{self.stream_id})"


CLOSED = "connection closed"
TIMEOUT = f"nothing within {GUARD:g} s"
Event = Frame | str  # a frame, CLOSED or TIMEOUT
Decider = Callable[[Event], "bool | None"]  # True: the case passes, False: it fails, None: read on


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    """Any frame, valid or not: the 9-octet header and the payload as given."""
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def settings_payload(*pairs: tuple[int, int]) -> bytes:
    return b"".join(struct.pack(">HI", key, value) for key, value in pairs)


def priority_payload(depends_on: int, weight: int, *, exclusive: bool = False) -> bytes:
    return ((depends_on | (1 << 31 if exclusive else 0)).to_bytes(4, "big")) + bytes((weight,))


@attrs.define
class Peer:
    """One client connection to the server under test (h2spec's ``spec.Conn``)."""

    stream: trio.abc.Stream
    authority: str
    path: str
    server_settings: dict[int, int] = attrs.field(factory=dict)
    closed: bool = False
    other_codes: list[str] = attrs.field(factory=list)  # error frames h2spec let pass despite their code
    received: list[str] = attrs.field(factory=list)  # every event, for failure messages and debugging
    _buffer: bytearray = attrs.field(factory=bytearray)
    _encoder: Encoder = attrs.field(factory=Encoder)

    # --- writing -------------------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        """Raw bytes; a server that already closed may refuse them, which the next read shows."""
        with contextlib.suppress(trio.BrokenResourceError):
            await self.stream.send_all(data)

    async def write(self, kind: int, flags: int, stream_id: int, payload: bytes = b"") -> None:
        await self.send(frame(kind, flags, stream_id, payload))

    def encode(self, fields: Sequence[Field]) -> bytes:
        """A header block from the connection's one HPACK encoder (its table carries over)."""
        return self._encoder.encode(list(fields), huffman=True)

    def set_table_size(self, size: int) -> None:
        """The next header block starts with a dynamic table size update to ``size``."""
        self._encoder.header_table_size = size

    def request(self, method: str = "GET") -> list[Field]:
        """h2spec's ``CommonHeaders``: a request for the configured path."""
        return [(":method", method), (":scheme", "http"), (":path", self.path), (":authority", self.authority)]

    async def headers(
        self,
        stream_id: int,
        block: bytes,
        *,
        end_stream: bool = True,
        end_headers: bool = True,
        priority: bytes | None = None,
        pad: int | None = None,
    ) -> None:
        flags = (END_STREAM if end_stream else 0) | (END_HEADERS if end_headers else 0)
        payload = (priority or b"") + block
        if priority is not None:
            flags |= PRIORITY_FLAG
        if pad is not None:
            flags |= PADDED
            payload = bytes((pad,)) + payload + bytes(pad)
        await self.write(HEADERS, flags, stream_id, payload)

    async def continuation(self, stream_id: int, block: bytes, *, end_headers: bool = True) -> None:
        await self.write(CONTINUATION, END_HEADERS if end_headers else 0, stream_id, block)

    async def data(self, stream_id: int, data: bytes, *, end_stream: bool = True, pad: bytes | None = None) -> None:
        flags = END_STREAM if end_stream else 0
        if pad is not None:
            flags |= PADDED
            data = bytes((len(pad),)) + data + pad
        await self.write(DATA, flags, stream_id, data)

    async def settings(self, *pairs: tuple[int, int]) -> None:
        await self.write(SETTINGS, 0, 0, settings_payload(*pairs))

    async def ping(self, opaque: bytes = bytes(8), *, ack: bool = False) -> None:
        await self.write(PING, ACK if ack else 0, 0, opaque)

    async def priority(self, stream_id: int, depends_on: int, weight: int, *, exclusive: bool = False) -> None:
        await self.write(PRIORITY, 0, stream_id, priority_payload(depends_on, weight, exclusive=exclusive))

    async def rst_stream(self, stream_id: int, code: int) -> None:
        await self.write(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))

    async def window_update(self, stream_id: int, increment: int) -> None:
        await self.write(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))

    async def goaway(self, last_stream_id: int, code: int, debug: bytes = b"") -> None:
        await self.write(GOAWAY, 0, 0, last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + debug)

    async def handshake(self) -> None:
        """The preface and an INITIAL_WINDOW_SIZE setting; done once both sides' SETTINGS are acknowledged."""
        await self.send(PREFACE)
        await self.settings((INITIAL_WINDOW_SIZE, DEFAULT_WINDOW))
        acked = received = False
        while not (acked and received):
            event = await self.next_event()
            if not isinstance(event, Frame):
                raise Mismatch("the server's SETTINGS and SETTINGS ACK", event)
            if event.type == SETTINGS and event.has(ACK):
                acked = True
            elif event.type == SETTINGS:
                received = True
                for offset in range(0, len(event.payload) - 5, 6):
                    key, value = struct.unpack_from(">HI", event.payload, offset)
                    self.server_settings[key] = value
                await self.write(SETTINGS, ACK, 0)

    # --- reading -------------------------------------------------------------------------

    async def next_event(self) -> Event:
        """The next frame from the server, or CLOSED, or TIMEOUT after ``GUARD`` seconds."""
        event = await self._next_event()
        self.received.append(str(event))
        return event

    async def _next_event(self) -> Event:
        if self.closed:
            return CLOSED
        with trio.move_on_after(GUARD):
            header = await self._read(9)
            if header is None:
                return CLOSED
            payload = await self._read(int.from_bytes(header[:3], "big"))
            if payload is None:
                return CLOSED
            stream_id = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
            return Frame(header[3], header[4], stream_id, payload)
        self.closed = True  # h2spec stops reading after a timeout, too
        return TIMEOUT

    async def _read(self, size: int) -> bytes | None:
        while len(self._buffer) < size:
            try:
                chunk = await self.stream.receive_some()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""
            if not chunk:
                self.closed = True
                return None
            self._buffer += chunk
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def _await(self, expected: str, decide: Decider) -> None:
        """Read events until ``decide`` returns True (pass) or False (fail), or the connection
        ends or the guard runs out (fail); the failure lists what came before."""
        seen: list[str] = []
        while True:
            event = await self.next_event()
            verdict = decide(event)
            if verdict:
                return
            seen.append(str(event))
            if verdict is False or event in (CLOSED, TIMEOUT):
                raise Mismatch(expected, ", then ".join(seen))

    # --- h2spec's verdicts ---------------------------------------------------------------

    async def expect_connection_error(self, *codes: int) -> None:
        """``VerifyConnectionError``: GOAWAY with one of ``codes``, or the connection closed."""
        await self._await(_goaway(codes), self._error_decider(codes, (GOAWAY,)))

    async def expect_stream_error(self, *codes: int) -> None:
        """``VerifyStreamError``: GOAWAY or RST_STREAM with one of ``codes``, or the connection closed."""
        await self._await(_either(_goaway(codes), _rst(codes)), self._error_decider(codes, (GOAWAY, RST_STREAM)))

    def _error_decider(self, codes: Sequence[int], kinds: tuple[int, ...]) -> Decider:
        """h2spec's error verdict: the connection closed, or one of ``kinds`` with one of
        ``codes``; one with another code is noted, and reading goes on."""

        def decide(event: Event) -> bool | None:
            if event == CLOSED:
                return True
            if isinstance(event, Frame) and event.type in kinds:
                if event.code in codes:
                    return True
                expected = " or ".join(error_name(code) for code in codes)
                self.other_codes.append(f"{FRAME_NAMES[event.type]} {error_name(event.code)} ({expected} expected)")
            return None

        return decide

    async def expect_connection_close(self) -> None:
        """``VerifyConnectionClose``: the connection closed (frames before that are ignored)."""
        await self._await(CLOSED, lambda event: True if event == CLOSED else None)

    async def expect_stream_close(self) -> None:
        """``VerifyStreamClose``: DATA or HEADERS with END_STREAM, or RST_STREAM NO_ERROR."""

        def decide(event: Event) -> bool | None:
            if not isinstance(event, Frame):
                return None
            if event.type in (DATA, HEADERS) and event.has(END_STREAM):
                return True
            return True if event.type == RST_STREAM and event.code == NO_ERROR else None

        await self._await("the stream closed", decide)

    async def expect_frame(self, kind: int, expected: str, check: Callable[[Frame], bool]) -> None:
        """``WaitEventByType``: the first frame of ``kind``, which must pass ``check``."""

        def decide(event: Event) -> bool | None:
            return check(event) if isinstance(event, Frame) and event.type == kind else None

        await self._await(expected, decide)

    async def expect_headers(self, stream_id: int) -> None:
        """``VerifyHeadersFrame``: the first HEADERS frame is on ``stream_id``."""
        await self.expect_frame(HEADERS, f"HEADERS on stream {stream_id}", lambda f: f.stream_id == stream_id)

    async def expect_settings_ack(self) -> None:
        await self.expect_frame(SETTINGS, "SETTINGS with ACK", lambda f: f.has(ACK))

    async def expect_ping_ack(self, opaque: bytes = bytes(8)) -> None:
        await self.expect_frame(PING, f"PING ACK {opaque!r}", lambda f: f.has(ACK) and f.payload == opaque)

    async def expect_ping_ack_or_close(self, opaque: bytes = bytes(8)) -> None:
        """``VerifyPingFrameOrConnectionClose``."""

        def decide(event: Event) -> bool | None:
            if event == CLOSED:
                return True
            if isinstance(event, Frame) and event.type == PING:
                return event.has(ACK) and event.payload == opaque
            return None

        await self._await(_either(CLOSED, f"PING ACK {opaque!r}"), decide)

    async def expect_data_length(self, length: int) -> None:
        """The first DATA frame carries exactly ``length`` octets (the flow-control cases)."""
        await self.expect_frame(DATA, f"DATA of length {length}", lambda f: len(f.payload) == length)


def _either(*outcomes: str) -> str:
    return " or ".join(outcomes)


def _goaway(codes: Sequence[int]) -> str:
    return _either(*(f"GOAWAY {error_name(code)}" for code in codes), CLOSED)


def _rst(codes: Sequence[int]) -> str:
    return _either(*(f"RST_STREAM {error_name(code)}" for code in codes))
