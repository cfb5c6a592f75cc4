"""When a read's bytes reached this host: the kernel's receive timestamp, on trio's clock.

A request's clock (its TTFT, its ``arrival_time`` in the metrics) starts when its first
bytes arrive.  The time the server *reads* them is later, by however long it took to
get round to the socket: the wake-up of an idle process (a median of ~0.17 ms and a
90th percentile of ~1 ms on the reference VM), or, under load, the engine step or the
batch of other requests being handled when the bytes came in.  Counted from the read,
every such delay adds to the TTFT a client measures.  Linux stamps each received
packet; with ``SO_TIMESTAMPNS`` on, ``recvmsg`` hands the stamp of the last packet it
read back as ancillary data (TCP too: ``tcp_recv_timestamp``), so the clock can start
at the packet's arrival instead.

The stamp is ``CLOCK_REALTIME``, trio's clock ``CLOCK_MONOTONIC``: a stamp becomes
"so long before now" on the first and then that long before ``trio.current_time()``.
A stamp from the future (the wall clock stepped back) counts as now; one from more than
:data:`MAX_BACKDATE` ago (the wall clock stepped forward, or bytes left unread that
long) as that long ago.  Where there is no stamp (not Linux, the option refused, a
packet that came before stamping was enabled) or trio runs on a
:class:`trio.testing.MockClock` (which does not count real time), the read's own time
is the arrival, as before.

Only the listening socket's option is set (:func:`enable_stamps`): accepted sockets
inherit it, so a connection costs no extra system call; each read is one ``recvmsg``
instead of one ``recv``.  (The kernel switches stamping on a moment after the first
socket asks, by deferred work: the very first packets after a start may come unstamped.)
"""

from __future__ import annotations

import errno
import socket
import struct
import sys
import time

import attrs
import trio

from llmsim.protocol.native.detect import RECEIVE_SIZE, WrappedStream

__all__ = ["MAX_BACKDATE", "StampedStream", "enable_stamps", "stamped"]

#: ``SO_TIMESTAMPNS`` (and ``SCM_TIMESTAMPNS``, the same number) of Linux's generic
#: socket ABI; Python's ``socket`` module does not name it.
_SO_TIMESTAMPNS = 35
_STAMPS_POSSIBLE = sys.platform == "linux"
#: The ancillary data of a stamp: one ``struct timespec`` (two C longs in the
#: option's original form, which ``SO_TIMESTAMPNS`` is).
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY_SIZE = socket.CMSG_SPACE(_TIMESPEC.size) if _STAMPS_POSSIBLE else 0
#: The furthest back a stamp may date a read (seconds): see the module docstring.
MAX_BACKDATE = 60.0
_CLOSED_ERRNOS = frozenset({errno.EBADF, errno.ENOTSOCK})  # as trio.SocketStream tells a closed socket


def enable_stamps(listener: trio.socket.SocketType) -> bool:
    """Have the kernel stamp what ``listener``'s connections receive; False where it cannot."""
    if not _STAMPS_POSSIBLE:
        return False
    try:
        listener.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def stamped(stream: trio.abc.HalfCloseableStream) -> trio.abc.HalfCloseableStream:
    """``stream`` reading through :class:`StampedStream` where stamps can be used: a TCP
    stream on Linux, under trio's real clock; else ``stream`` itself."""
    from trio.testing import MockClock  # (loaded once a server accepts: trio does not import it)

    if not _STAMPS_POSSIBLE or not isinstance(stream, trio.SocketStream):
        return stream
    if isinstance(trio.lowlevel.current_clock(), MockClock):
        return stream
    return StampedStream(stream)


@attrs.define(eq=False)
class StampedStream(WrappedStream):
    """A :class:`trio.SocketStream` whose reads note when their bytes arrived
    (:attr:`arrived_at`); everything else is the socket stream's own."""

    stream: trio.SocketStream
    #: When the bytes of the latest read arrived (trio's clock); None before the first
    #: read, or when that read had no stamp.
    arrived_at: float | None = attrs.field(default=None, init=False)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """``SocketStream.receive_some`` through ``recvmsg``, with its errors."""
        size = max_bytes if max_bytes is not None else RECEIVE_SIZE
        if size < 1:
            raise ValueError("max_bytes must be >= 1")
        try:
            data, ancillary, _flags, _address = await self.stream.socket.recvmsg(size, _ANCILLARY_SIZE)
        except OSError as exc:
            if exc.errno in _CLOSED_ERRNOS:
                raise trio.ClosedResourceError("this socket was already closed") from None
            raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
        self.arrived_at = _arrival(ancillary) if ancillary else None
        return data


def _arrival(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    """The trio time of the stamp in ``ancillary`` (see the module docstring), if any."""
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
            ago = time.time() - (seconds + nanoseconds * 1e-9)
            now = trio.current_time()
            if ago <= 0.0:
                return now
            return now - (ago if ago < MAX_BACKDATE else MAX_BACKDATE)
    return None
