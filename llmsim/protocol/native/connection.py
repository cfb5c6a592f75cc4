"""One accepted connection: sniffing, TLS, and the reader and writer tasks.

Request handlers and the engine never touch the socket: they append to their stream's
buffer and call :meth:`Connection.wake_writer`, which only sets a flag.  Outside an
engine step it unparks the connection's writer task, which sends the batch.  During an
engine step (while the server's :class:`WriteCoalescer` is held) the connection is only
remembered, and when the step is over the engine's task sends each remembered batch
with one non-blocking send (:meth:`Connection.flush_now`): no writer task wakes up for
the common case, and whatever the kernel does not take is left to the writer, which
waits for the socket.  Either way, every write made during one engine step leaves in
one send per connection, in order, and a slow client stalls only its own writer.  The
reader runs for the whole life of the connection, so a client that goes away
mid-response is noticed at once (and a TLS stream is never left half-read by a
cancelled receive).
"""

from __future__ import annotations

import enum
import logging
import math
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from llmsim.api.http import Application, ResponseState
from llmsim.protocol.native.arrival import StampedStream, stamped
from llmsim.protocol.native.base import ProtocolHandler
from llmsim.protocol.native.detect import RECEIVE_SIZE, PrefixedStream, Wire, refuse_cleartext, sniff
from llmsim.protocol.native.http1 import Http1Handler, Http1Response
from llmsim.protocol.native.http2 import Http2Handler
from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings
from llmsim.speedups import installer

__all__ = ["PURE_RELEASE", "PURE_WAKE_WRITER", "Connection", "ConnectionPhase", "WriteCoalescer"]

log = logging.getLogger("llmsim.protocol")

_NETWORK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError)
#: Writer iterations that may run without a checkpoint (direct sends do not yield).
_MAX_UNCHECKED = 16
#: A send that waits for the socket must get this many bytes out per write-stall timeout.
_STALL_PIECE = 64 * 1024


def _direct_socket(transport: trio.abc.Stream) -> socket.socket | None:
    """The stdlib socket under a plain TCP stream (stamped or not), to send on without
    trio's ``send_all`` (see ``Connection._send``); None for TLS, memory streams, or a
    trio that no longer keeps it where it always has."""
    if isinstance(transport, StampedStream):
        transport = transport.stream
    if not isinstance(transport, trio.SocketStream):
        return None
    raw = getattr(transport.socket, "_sock", None)
    return raw if isinstance(raw, socket.socket) and not raw.getblocking() else None


def _not_serving(fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """``Connection.spawn`` before the connection serves: no handler can ask yet."""
    raise AssertionError("a task spawned before the connection serves")


class ConnectionPhase(enum.Enum):
    """Where a connection is in its life; it only moves forward (down this list)."""

    NEGOTIATING = "negotiating"  # sniffing the first bytes, TLS handshake: no protocol handler yet
    OPEN = "open"  # the handler serves requests
    DRAINING = "draining"  # shutting down: in-flight responses finish, nothing new is accepted
    CLOSING = "closing"  # the writer is done: half-close, a moment for the peer to read and close, close


_NEGOTIATING, _OPEN = ConnectionPhase.NEGOTIATING, ConnectionPhase.OPEN
_DRAINING, _CLOSING = ConnectionPhase.DRAINING, ConnectionPhase.CLOSING
_STREAMING = ResponseState.STREAMING


@attrs.define(eq=False, repr=False)
class WriteCoalescer:
    """Holds the connections' flushes while the engine steps, then sends them inline.

    Waking a writer task costs a trip through trio's run loop (unpark, reschedule, the
    task switch, park again: about 10 µs), and a paced load makes one per connection
    per engine step: 20,000 a second at 40 connections.  While :attr:`held`, a
    connection with something to send is only queued here; :meth:`release` (right
    after the step, in the engine's task) sends every queued connection's batch.  A
    connection's reader holds it too, across each read's handling (``_hand_over``).
    """

    held: bool = False
    _pending: list[Connection] = attrs.field(factory=list, init=False)
    #: ``defer(connection)`` queues it for :meth:`release`: the queue's own ``append``
    #: (no Python call per connection per step; the queue is emptied, never replaced).
    defer: Callable[[Connection], None] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.defer = self._pending.append

    def hold(self) -> None:
        self.held = True

    def release(self) -> None:
        self.held = False  # (so nothing is deferred while the queue is sent)
        pending = self._pending
        for connection in pending:
            connection.flush_now()
        pending.clear()


@attrs.define(eq=False, repr=False)
class Connection:
    """Serves one client stream until it closes, fails or the server shuts down.

    Usage: ``await Connection(stream, app, settings, tracker).run()``; call
    :meth:`begin_shutdown` from elsewhere for a graceful close.
    """

    stream: trio.abc.HalfCloseableStream
    app: Application
    settings: ProtocolSettings
    tracker: ConnectionTracker
    coalescer: WriteCoalescer | None = None
    scheme: str = attrs.field(default="http", init=False)  # "https" once TLS is negotiated
    phase: ConnectionPhase = attrs.field(default=_NEGOTIATING, init=False)
    handler: ProtocolHandler | None = attrs.field(default=None, init=False)
    _transport: trio.abc.Stream | None = attrs.field(default=None, init=False)  # the stream after TLS, if any
    #: The stream's reads with their arrival times (.arrival), where the kernel stamps them.
    _stamps: StampedStream | None = attrs.field(default=None, init=False)
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    #: Transport.spawn: the nursery's own ``start_soon`` once the connection serves (a
    #: request's task is spawned without a call of ours in between).
    spawn: Callable[..., None] = attrs.field(default=_not_serving, init=False)
    _writer_lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)
    _dirty: bool = attrs.field(default=False, init=False)  # the handler has output the writer has not taken
    _direct: socket.socket | None = attrs.field(default=None, init=False)  # see _direct_socket
    _backlog: bytes | memoryview | None = attrs.field(default=None, init=False)  # what flush_now could not send
    _sending: bool = attrs.field(default=False, init=False)  # the writer waits in send_all
    # A backlog is queued or the writer waits in send_all (Transport.congested).
    congested: bool = attrs.field(default=False, init=False)
    _read_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _read_deadline: float = attrs.field(default=math.inf, init=False)
    _reading_allowed: bool = attrs.field(default=True, init=False)
    _resume_reading: trio.Event = attrs.field(factory=trio.Event, init=False)
    _reader_done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _close_mode: str = attrs.field(default="", init=False)  # an injected close (close_abruptly)

    def __repr__(self) -> str:
        return f"<Connection {type(self.handler).__name__} {self.scheme} {self.phase.value}>"

    async def run(self) -> None:
        self.tracker.connection_opened()
        try:
            with self._scope:
                await self._serve()
        except Exception:
            log.exception("connection handler failed; the connection was closed")
        finally:
            if self.handler is not None:
                self.handler.connection_lost()
            self.tracker.connection_closed()
            await self._close_as_injected()
            await trio.aclose_forcefully(self._transport or self.stream)

    async def _close_as_injected(self) -> None:
        """The close an injected fault asked for (:meth:`close_abruptly`), if any."""
        if self._close_mode == "rst" and isinstance(self.stream, trio.SocketStream):
            self.stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif self._close_mode == "close-notify" and isinstance(self._transport, trio.SSLStream):
            with trio.move_on_after(self.settings.close_linger):
                await self._transport.aclose()  # close_notify, then the TCP close (https_compatible=False)

    def begin_shutdown(self) -> None:
        """Finish in-flight responses, accept no new requests, then close."""
        phase = self.phase
        if phase is _NEGOTIATING:
            self.phase = _DRAINING
            self._scope.cancel()  # nothing to finish
        elif phase is _OPEN:
            self.phase = _DRAINING
            assert self.handler is not None
            self.handler.begin_shutdown()
            self.wake_writer()

    # --- Transport: what the protocol handler may ask of us --------------------------
    @property
    def shutting_down(self) -> bool:
        return self.phase is _DRAINING

    def wake_writer(self) -> None:
        if not self._dirty:
            self._dirty = True
            coalescer = self.coalescer
            if coalescer is not None and coalescer.held and self._direct is not None:
                coalescer.defer(self)
            else:
                self._writer_lot.unpark_all()

    def flush_now(self) -> None:
        """Send the handler's output from the calling task (the engine's, after a step).

        Only when nothing is in flight: the writer is not waiting in ``send_all`` and
        no earlier remainder is queued, else the writer sends this too, after what it
        has.  What the kernel does not take becomes the writer's backlog, and so does
        the whole batch when the send fails (the writer's own send then fails the same
        way and closes the connection).  Never raises: the engine's task serves everyone.
        """
        handler, direct = self.handler, self._direct
        if self._sending or self._backlog is not None or self.phase is _CLOSING or handler is None or direct is None:
            self._writer_lot.unpark_all()
            return
        self._dirty = False
        try:
            data = handler.outgoing()
            if data:
                try:
                    sent = direct.send(data)
                except OSError:  # would block, interrupted, or the peer is gone
                    sent = 0
                if sent < len(data):
                    self._keep_rest(data, sent)
                    return
            handler.flushed()
        except Exception:
            self._flush_failed()
            return
        if handler.finished:
            self._writer_lot.unpark_all()  # the writer sees it and ends

    def _keep_rest(self, data: bytes, sent: int) -> None:
        """What the kernel did not take of a flush (``sent`` bytes of ``data``) becomes
        the writer's backlog (flush_now, and the C release: native/flush.c).  Never raises."""
        try:
            self._backlog = memoryview(data)[sent:] if sent else data
            self.congested = True
            self._writer_lot.unpark_all()
        except Exception:
            self._flush_failed()

    def _flush_failed(self) -> None:
        log.exception("flushing a connection failed; the connection is closed")
        self._scope.cancel()

    def set_read_deadline(self, deadline: float) -> None:
        if deadline == self._read_deadline:
            return  # (every new HTTP/2 stream says inf: setting a scope's deadline is not free)
        self._read_deadline = deadline
        if self._read_scope is not None:
            self._read_scope.deadline = deadline

    def pause_reading(self) -> None:
        self._reading_allowed = False

    def resume_reading(self) -> None:
        if not self._reading_allowed:
            self._reading_allowed = True
            self._resume_reading.set()
            self._resume_reading = trio.Event()

    def switch_to(self, handler: ProtocolHandler) -> None:
        self.handler = handler
        self.wake_writer()

    def close_abruptly(self, mode: str) -> None:
        self._close_mode = mode

    # --- the tasks -------------------------------------------------------------------
    async def _serve(self) -> None:
        wire, prefix = Wire.CLOSED, b""
        with trio.move_on_after(self.settings.header_read_timeout):
            wire, prefix = await self._negotiate()
        if wire is Wire.CLOSED:
            return
        assert self._transport is not None  # set by _negotiate
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.spawn = nursery.start_soon
            self._direct = _direct_socket(self._transport)
            if self.phase is _NEGOTIATING:  # (not if shutdown began as the handshake ended)
                self.phase = _OPEN
            self.handler = Http2Handler(self) if wire is Wire.H2 else Http1Handler(self)
            nursery.start_soon(self._read_loop)
            if prefix:
                self.handler.receive(prefix, self._arrived_at())
            await self._write_loop()
            await self._linger()
            nursery.cancel_scope.cancel()

    async def _negotiate(self) -> tuple[Wire, bytes]:
        """Sniff the first bytes; do the TLS handshake and ALPN when they are TLS."""
        context = self.settings.ssl_context
        reader = stamped(self.stream)
        self._stamps = reader if isinstance(reader, StampedStream) else None
        wire, prefix = await sniff(reader, tls_possible=context is not None)
        if wire is not Wire.TLS:
            self._transport = reader
            if context is not None and wire is not Wire.CLOSED and not self.settings.allow_cleartext:
                await refuse_cleartext(self.stream, wire, self.settings.close_linger)  # TLS-only port
                return Wire.CLOSED, b""
            return wire, prefix
        assert context is not None
        # https_compatible=False: aclose() sends close_notify (only an injected close calls it;
        # every other close is forceful, without one); a peer's close without one reads as EOF.
        tls = trio.SSLStream(PrefixedStream(reader, prefix), context, server_side=True, https_compatible=False)
        self._transport = tls
        self.scheme = "https"
        try:
            await tls.do_handshake()
        except _NETWORK_ERRORS as exc:
            log.debug("TLS handshake failed: %s", exc)
            return Wire.CLOSED, b""
        alpn = tls.selected_alpn_protocol()
        if alpn == "h2":
            return Wire.H2, b""
        if alpn == "http/1.1":
            return Wire.HTTP1, b""
        return await sniff(tls, tls_possible=False)

    async def _read_loop(self) -> None:
        """Read until the peer closes, a read deadline ends the connection, or it is
        cancelled.  One cancel scope holds the read deadline across reads, until that
        deadline passes or reading is paused (making, entering and leaving one costs
        ~47,000 instructions, per read that was): ``set_read_deadline`` moves it."""
        assert self._transport is not None and self.handler is not None
        try:
            while True:
                while not self._reading_allowed:
                    await self._resume_reading.wait()
                closed = False
                with trio.CancelScope(deadline=self._read_deadline) as scope:
                    self._read_scope = scope
                    closed = await self._read_until_paused(scope)
                if closed:
                    return
                if scope.cancelled_caught:
                    keep_reading = self.handler.read_timed_out()
                    self.wake_writer()
                    if not keep_reading:
                        return
        finally:
            self._read_scope = None
            self._reader_done.set()

    async def _read_until_paused(self, scope: trio.CancelScope) -> bool:
        """Hand every chunk received to the handler while reading is allowed; True once
        the peer closed."""
        assert self.handler is not None
        while self._reading_allowed:
            # A deadline already past cancels the read at once, as entering a new scope
            # with it would (trio itself would only see it on its next scheduling pass).
            deadline = self._read_deadline
            if deadline != math.inf and deadline <= trio.current_time():
                scope.cancel()
            data = await self._receive()
            if not data:
                self._peer_closed()
                return True
            self._hand_over(data)
        return False

    def _hand_over(self, data: bytes) -> None:
        """Give ``data`` to the handler; what that makes it write (a response's head, a
        SETTINGS or PING ACK, an error) is sent from here, at once, as the engine's task
        sends a step's output: the coalescer held across the call, released after it.
        Without that, every read that answers something woke the writer task, a trip
        through trio's run loop per request (unpark, reschedule, switch, park again)."""
        assert self.handler is not None
        coalescer = self.coalescer
        if coalescer is None or coalescer.held:
            self.handler.receive(data, self._arrived_at())
            return
        coalescer.hold()
        try:
            self.handler.receive(data, self._arrived_at())
        finally:
            coalescer.release()

    def _arrived_at(self) -> float | None:
        """When the latest read's bytes reached this host (over TLS: the latest read of
        the socket under it), where the kernel said; None: when they were read."""
        stamps = self._stamps
        return stamps.arrived_at if stamps is not None else None

    async def _receive(self) -> bytes:
        assert self._transport is not None
        try:
            data = await self._transport.receive_some(RECEIVE_SIZE)
        except _NETWORK_ERRORS:
            return b""
        return data if isinstance(data, bytes) else bytes(data)  # memory streams give bytearray

    def _peer_closed(self) -> None:
        assert self.handler is not None and self._nursery is not None
        if self.phase is _CLOSING:
            return  # the peer read our last bytes and closed, as hoped
        self.handler.receive(b"")
        self.handler.connection_lost()
        self._nursery.cancel_scope.cancel()

    async def _write_loop(self) -> None:
        try:
            await self._write_batches()
        finally:
            self.phase = _CLOSING

    async def _write_batches(self) -> None:
        """Send the backlog flush_now left, else the handler's output, until finished."""
        unchecked = 0  # iterations in a row that did not yield to trio
        while True:
            if not self._dirty and self._backlog is None:
                await self._writer_lot.park()
                unchecked = 0
            elif unchecked >= _MAX_UNCHECKED:
                await trio.lowlevel.checkpoint()
                unchecked = 0
            unchecked += 1
            handler = self.handler
            assert handler is not None
            if self._backlog is not None:  # older than anything the handler has now
                data, self._backlog = self._backlog, None
            else:
                self._dirty = False
                data = handler.outgoing()
            if data and not await self._send(data):
                handler.connection_lost()
                return
            self.congested = self._backlog is not None
            handler.flushed()
            if handler.finished and not self._dirty and self._backlog is None:
                return

    async def _send(self, data: bytes | memoryview) -> bool:
        """Put ``data`` on the wire; False if the connection is gone.

        On a plain TCP connection the bytes are first offered to the (non-blocking)
        socket directly: usually the kernel takes them all, and the writer never goes
        through trio's ``send_all`` (two checkpoints, each a trip through the run loop:
        about 20 us per send, which per connection per engine step was most of the
        writer's cost).  Whatever the kernel does not take goes through ``send_all``,
        which waits for the socket to be writable: backpressure is unchanged, but a peer
        that takes nothing for the write-stall timeout is given up (see :meth:`_send_all`).
        """
        assert self._transport is not None
        direct = self._direct
        if direct is not None:
            try:
                sent = direct.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                return False
            if sent == len(data):
                return True
            data = memoryview(data)[sent:]
        self._sending = self.congested = True
        try:
            return await self._send_all(memoryview(data))
        finally:
            self._sending = False

    async def _send_all(self, data: memoryview) -> bool:
        """``send_all`` in pieces of :data:`_STALL_PIECE` bytes, each within the
        write-stall timeout: a client that reads slowly is served, one that reads nothing
        for that long is gone (False), and with it every response it held (HTTP/1.1 and
        HTTP/2 alike: the handler's ``connection_lost`` aborts them, freeing their slots)."""
        assert self._transport is not None
        timeout = self.settings.write_stall_timeout
        for offset in range(0, len(data), _STALL_PIECE):
            with trio.move_on_after(timeout) as scope:
                try:
                    await self._transport.send_all(data[offset : offset + _STALL_PIECE])
                except _NETWORK_ERRORS:
                    return False
            if scope.cancelled_caught:
                log.debug("the client read nothing for the write-stall-timeout; closing %r", self)
                return False
        return True

    async def _linger(self) -> None:
        """Half-close and give the peer a moment to read the last bytes and close,
        so that unread request bytes do not turn our close into a reset (not after an
        injected close: that one is abrupt)."""
        if self._close_mode:
            return
        with trio.move_on_after(self.settings.close_linger):
            if isinstance(self._transport, trio.abc.HalfCloseableStream):
                try:
                    await self._transport.send_eof()
                except _NETWORK_ERRORS:
                    return
            await self._reader_done.wait()


#: The pure ``Connection.wake_writer``, the reference: its C twin replaces it where built
#: (native/wake.c: the wake-up the write coalescer holds, taken without a Python call).
PURE_WAKE_WRITER = Connection.wake_writer
if (_install := installer("install_wake_writer")) is not None:
    _install(Connection, WriteCoalescer, PURE_WAKE_WRITER)
#: The pure ``WriteCoalescer.release``, the reference: its C twin replaces it where built
#: (native/flush.c: an HTTP/1.1 connection's per-token chunk sent without Python).
PURE_RELEASE = WriteCoalescer.release
if (_install := installer("install_release")) is not None:
    _install(WriteCoalescer, Connection, Http1Handler, Http1Response, socket.socket, _CLOSING, _STREAMING, PURE_RELEASE)
