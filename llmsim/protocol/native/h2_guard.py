"""What the HTTP/2 handler checks before h2 parses a byte: frame sizes, floods, resets,
and how long a header block may take.

:class:`FrameGuard` reads only the 9-byte frame headers of what the client sends (RFC
9113 section 4.1), in the order it arrives, and says how much of it h2 may see: up to
the first frame it refuses, if any, and why (the GOAWAY error code).  So a refused
frame costs nothing beyond its header: a 16 MiB frame is refused as its length is read
(h2 itself only checks the length once the whole frame is buffered), and a flood stops
at the first frame over its budget instead of after h2 has answered a whole read's worth.

The budgets are token buckets per connection (a rate a second, bursts of
:data:`BURST_SECONDS` seconds' worth), as nghttp2's and h2o's mitigations of the 2019
flood CVEs and of rapid reset (CVE-2023-44487) are:

* control frames that cost the server work and carry nothing of a request: PING and
  SETTINGS (each answered with an ACK; a SETTINGS frame carries at most
  :data:`MAX_SETTINGS`), PRIORITY, and DATA frames that are empty and do not end their
  stream;
* resets: the client's RST_STREAM frames, plus the streams the handler resets for a
  malformed request or refuses beyond the stream limit (:meth:`FrameGuard.charge_resets`;
  CVE-2025-8671 provokes those);
* acknowledgements the server owes and the client has not read: PING and SETTINGS
  frames received since the handler's output was last taken (:meth:`FrameGuard.taken`).
  A client that never reads stops the writer, so this grows by one per frame until it
  passes its bound.

A header block (HEADERS and its CONTINUATIONs) may not grow beyond
:data:`HEADER_BLOCK_FACTOR` times the advertised header list size (the CONTINUATION
flood, CVE-2024-27316), and while a header block or any frame other than DATA is
incomplete, :attr:`FrameGuard.busy_since` says since when: the handler applies the
header-read timeout to it (DATA has the body-read timeout, per stream).

:class:`StreamClock` keeps the streams that run against a deadline: request bodies still
arriving (the body-read timeout) and responses stalled on a client that does not read
(the write-stall timeout).
"""

from __future__ import annotations

import itertools
import math
import struct
from typing import Generic, Protocol, TypeVar

import attrs
from h2.errors import ErrorCodes

from llmsim.protocol.settings import ProtocolSettings

__all__ = [
    "BURST_SECONDS",
    "HEADER_BLOCK_FACTOR",
    "MAX_SETTINGS",
    "PREFACE_SIZE",
    "FrameGuard",
    "StreamClock",
    "Timed",
    "TokenBucket",
]

#: A bucket holds this many seconds' worth of its rate.
BURST_SECONDS = 10
#: An encoded header block may be this many times the header list size it may decode to
#: (Huffman coding can make a rare byte 30 bits long).
HEADER_BLOCK_FACTOR = 4
#: Settings one SETTINGS frame may carry (6 bytes each), as nghttp2's ``max_settings``:
#: more is ENHANCE_YOUR_CALM (h2 would apply every one: 2,730 in a 16 KiB frame).
MAX_SETTINGS = 32
#: The client's connection preface, ``PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`` (h2 checks it).
PREFACE_SIZE = 24

_HEADER = struct.Struct(">HBBBL")  # the 24-bit length as 16 + 8 bits, type, flags, stream id
_HEADER_SIZE = _HEADER.size
_DATA, _HEADERS, _PRIORITY, _RST_STREAM, _SETTINGS, _PING, _CONTINUATION = 0x0, 0x1, 0x2, 0x3, 0x4, 0x6, 0x9
_ACK = _END_STREAM = 0x1
_END_HEADERS = 0x4


@attrs.define
class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` saved up; starts full."""

    rate: float
    capacity: float
    tokens: float
    stamp: float

    @classmethod
    def per_second(cls, rate: float, now: float) -> TokenBucket:
        capacity = rate * BURST_SECONDS
        return cls(rate, capacity, capacity, now)

    def take(self, now: float) -> bool:
        """Spend one token; False if there was none."""
        tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if tokens < 1:
            self.tokens = tokens
            return False
        self.tokens = tokens - 1
        return True


@attrs.define(eq=False)
class FrameGuard:
    """Frame-header bookkeeping for one HTTP/2 connection (see the module docstring)."""

    max_frame_size: int  # the SETTINGS_MAX_FRAME_SIZE we advertise (h2's default, 16 KiB)
    max_block_size: int  # the largest header block accepted
    max_unacked: int  # acknowledgements owed to a client that does not read, at most
    control: TokenBucket
    resets: TokenBucket
    busy_since: float = math.inf  # a header block or a frame other than DATA is incomplete since then
    unacked: int = 0  # PING and SETTINGS frames received since the output was last taken
    _skip: int = PREFACE_SIZE  # bytes of the current frame's payload (or of the preface) still to come
    _kind: int = -1  # the current frame's type (-1: the preface)
    _partial: bytes = b""  # the start of a frame header split across reads
    _block: int = -1  # bytes of the open header block so far (-1: none open)

    @classmethod
    def for_settings(cls, settings: ProtocolSettings, max_frame_size: int, now: float) -> FrameGuard:
        return cls(
            max_frame_size=max_frame_size,
            max_block_size=settings.max_header_bytes * HEADER_BLOCK_FACTOR,
            max_unacked=settings.h2_max_queued_control_frames,
            control=TokenBucket.per_second(settings.h2_control_frame_rate, now),
            resets=TokenBucket.per_second(settings.h2_reset_rate, now),
        )

    def scan(self, data: bytes, now: float) -> tuple[int, ErrorCodes | None]:
        """How many bytes of ``data`` h2 may see: all of it and None, or the bytes before
        the first refused frame and the GOAWAY error code for it."""
        size = len(data)
        offset = min(self._skip, size)
        self._skip -= offset
        if self._partial:  # a frame header split across reads: complete it first
            need = _HEADER.size - len(self._partial)
            head = self._partial + data[:need]
            if len(head) < _HEADER.size:
                self._partial = head
                return self._settle(size, now)
            self._partial = b""
            error = self._frame(head, 0, now)
            if error is not None:
                return 0, error
            offset = min(need + self._skip, size)
            self._skip -= offset - need
        unpack, max_frame, max_block = _HEADER.unpack_from, self.max_frame_size, self.max_block_size
        # Frame by frame: ``end`` is where the frame after the one at ``offset`` starts.
        # The current frame's type and unread payload (``_kind``, ``_skip``) are kept
        # once the loop is done, or before a frame goes to _frame: not for every frame.
        end, kind = offset, -1
        while end + _HEADER_SIZE <= size:
            offset, last = end, kind
            high, low, kind, flags, _ = unpack(data, offset)
            length = high << 8 | low
            end = offset + _HEADER_SIZE + length
            # The two frames of an ordinary request, as _frame accounts them, without its
            # call: DATA that is not empty or ends its stream (nothing to count), and a
            # header block whole in one HEADERS frame within the limit (none open: it
            # opens and closes at once).  Everything else goes through _frame.
            if length > max_frame or not (
                (kind == _DATA and (length or flags & _END_STREAM))
                or (kind == _HEADERS and flags & _END_HEADERS and length <= max_block and self._block < 0)
            ):
                if last >= 0:  # (the frame before it, complete)
                    self._kind, self._skip = last, 0
                error = self._frame(data, offset, now)
                if error is not None:
                    return offset, error
        if kind >= 0:  # (a frame header was read)
            self._kind = kind
            self._skip = max(end - size, 0)
            offset = min(end, size)
        if offset < size:
            self._partial = data[offset:]
        return self._settle(size, now)

    def _frame(self, data: bytes, offset: int, now: float) -> ErrorCodes | None:
        """Account the frame whose header is at ``offset``; the error code refusing it, if any."""
        high, low, kind, flags, _ = _HEADER.unpack_from(data, offset)
        length = high << 8 | low
        if length > self.max_frame_size:
            return ErrorCodes.FRAME_SIZE_ERROR
        self._kind, self._skip = kind, length
        if kind == _DATA:
            if length == 0 and not flags & _END_STREAM and not self.control.take(now):
                return ErrorCodes.ENHANCE_YOUR_CALM
        elif kind in (_PING, _SETTINGS):
            if not flags & _ACK:
                self.unacked += 1
                if self.unacked > self.max_unacked or length > 6 * MAX_SETTINGS or not self.control.take(now):
                    return ErrorCodes.ENHANCE_YOUR_CALM
        elif (kind == _PRIORITY and not self.control.take(now)) or (kind == _RST_STREAM and not self.resets.take(now)):
            return ErrorCodes.ENHANCE_YOUR_CALM
        if kind in (_HEADERS, _CONTINUATION):
            self._block = max(self._block, 0) + length
            if self._block > self.max_block_size:
                return ErrorCodes.ENHANCE_YOUR_CALM
            if flags & _END_HEADERS:
                self._block = -1
        return None

    def _settle(self, size: int, now: float) -> tuple[int, None]:
        """Update :attr:`busy_since` at the end of a read that h2 sees whole."""
        busy = self._block >= 0 or bool(self._partial) or (self._skip > 0 and self._kind != _DATA)
        if not busy:
            self.busy_since = math.inf
        elif self.busy_since == math.inf:
            self.busy_since = now
        return size, None

    def charge_resets(self, count: int, now: float) -> bool:
        """``count`` streams reset by the server for a malformed request; False once over budget."""
        return all([self.resets.take(now) for _ in range(count)])

    def taken(self) -> None:
        """The handler's output (every acknowledgement owed so far) was taken for sending."""
        self.unacked = 0


class Timed(Protocol):
    """A stream a :class:`StreamClock` can hold."""

    stream_id: int
    deadline: float


_T = TypeVar("_T", bound=Timed)


@attrs.define(eq=False)
class StreamClock(Generic[_T]):
    """Streams that must get somewhere within ``timeout`` of joining (a request body to
    its end, a stalled response to its next window).  Every stream's deadline is its
    joining time plus the same timeout, so the dict's order is deadline order: the
    earliest is the first, in O(1)."""

    timeout: float
    streams: dict[int, _T] = attrs.field(factory=dict)

    def add(self, stream: _T, now: float) -> bool:
        """Start ``stream``'s clock unless it runs already; whether it was started."""
        if stream.stream_id in self.streams:
            return False
        stream.deadline = now + self.timeout
        self.streams[stream.stream_id] = stream
        return True

    def discard(self, stream: _T) -> bool:
        """Stop ``stream``'s clock; whether it was running."""
        return self.streams.pop(stream.stream_id, None) is not None

    def next_deadline(self) -> float:
        for stream in self.streams.values():
            return stream.deadline
        return math.inf

    def expired(self, now: float) -> list[_T]:
        """The streams whose deadline has passed (their clocks keep running)."""
        return list(itertools.takewhile(lambda stream: stream.deadline <= now, self.streams.values()))

    def clear(self) -> None:
        self.streams.clear()
