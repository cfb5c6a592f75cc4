"""HTTP/2 on h2: streams, flow control, refusal beyond the stream limit, GOAWAY.

Each stream is one :class:`.h2_stream.Http2Stream` (request head and body while it
arrives, then the response buffer, window state and handler scope), kept in one dict and
dropped on end, reset and connection loss alike.  Writes only queue the stream; the sending half
(:meth:`Http2Handler.outgoing`, one batch of frames per step) is the base class
:class:`.h2_output.Http2Output`.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any

import h2.events
import h2.exceptions
import trio
from h2.connection import ConnectionState
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from h2.stream import StreamState

from llmsim.api.http import NOT_STARTED_STATES, HttpRequest, ResponseEvent, ResponseState, next_state
from llmsim.protocol.native import h2_faults
from llmsim.protocol.native.base import HandlerPhase, Transport
from llmsim.protocol.native.frames import goaway_frame
from llmsim.protocol.native.h2_fastpath import ServerConnection, last_stream_id, sendable_stream, server_connection
from llmsim.protocol.native.h2_guard import FrameGuard, StreamClock
from llmsim.protocol.native.h2_headers import request_head, response_headers, with_body
from llmsim.protocol.native.h2_output import Http2Output
from llmsim.protocol.native.h2_stream import Http2Stream
from llmsim.protocol.native.stream import content_length, start_handler
from llmsim.speedups import installer

__all__ = ["PURE_WRITE", "UPGRADE_ERRORS", "Http2Handler", "Http2Stream"]

log = logging.getLogger("llmsim.protocol")

#: What a bad ``HTTP2-Settings`` header raises from h2 (the upgrade is then declined).
UPGRADE_ERRORS = (ValueError, h2.exceptions.ProtocolError)
_OPEN, _CLOSING, _FINISHED = HandlerPhase.OPEN, HandlerPhase.CLOSING, HandlerPhase.FINISHED
_STREAMING = ResponseState.STREAMING


class Http2Handler(Http2Output):
    """The HTTP/2 side of one connection (prior knowledge, ALPN ``h2`` or ``h2c`` upgrade)."""

    # (Slots, as Http2Output's: see there.)
    __slots__ = (
        "_body_bytes",
        "_dispatch",
        "_idle_deadline",
        "_phase",
        "_read_at",
        "_receiving",
        "_refused",
        "_starting",
        "_stream_errors",
    )

    def __init__(self, transport: Transport, *, preamble: bytes = b"", upgrade_settings: bytes | None = None) -> None:
        """``preamble``: bytes to send before the server preface (the ``101`` response).

        Raises one of :data:`UPGRADE_ERRORS` if ``upgrade_settings`` (the client's
        ``HTTP2-Settings`` header) cannot be decoded; nothing has happened then.
        """
        settings = transport.settings
        self._h2: ServerConnection = server_connection(
            settings.max_concurrent_streams, settings.max_header_bytes, upgrade_settings
        )
        self._t = transport
        self._phase = _OPEN  # CLOSING: GOAWAY sent, the streams it names still run
        self._streams: dict[int, Http2Stream] = {}
        self._ready = deque()
        self._sent = []  # streams that sent bytes in the last batch
        self._frames = [preamble] if preamble else []  # see Http2Output._frames
        self._batch = 0
        self._body_bytes = 0  # request-body bytes buffered on all streams
        now = trio.current_time()
        self._guard = FrameGuard.for_settings(settings, self._h2.local_settings.max_frame_size, now)
        # Streams whose request is still arriving (head, handler not started), and streams
        # whose response waits for a window: each must get on within its timeout.
        self._receiving: StreamClock[Http2Stream] = StreamClock(settings.body_read_timeout)
        self._stalled = StreamClock(settings.write_stall_timeout)
        self._idle_deadline = math.inf  # with no stream open: the keep-alive timeout
        self._starting: list[tuple[Http2Stream, HttpRequest]] = []  # complete requests of this read
        self._read_at = now  # when the bytes of the last read arrived
        self._stream_errors = 0  # the malformed requests h2 had reset when last looked at
        self._refused = 0  # streams refused beyond the stream limit in this read
        self._dispatch: dict[type[h2.events.Event], Callable[[Any], None]] = {
            h2.events.RequestReceived: self._on_request,
            h2.events.DataReceived: self._on_data,
            h2.events.StreamEnded: self._on_stream_ended,
            h2.events.StreamReset: self._on_stream_reset,
            h2.events.WindowUpdated: self._on_window_updated,
            h2.events.RemoteSettingsChanged: self._on_settings_changed,
            h2.events.ConnectionTerminated: self._on_connection_terminated,
        }
        self._update_idle_deadline()
        transport.wake_writer()

    @property
    def finished(self) -> bool:
        return self._phase is _FINISHED

    def serve_upgraded(self, request: HttpRequest) -> None:
        """Answer the HTTP/1.1 request that asked for ``Upgrade: h2c`` as stream 1."""
        now = trio.current_time()
        stream = self._open_stream(1, request, now if request.received_at is None else request.received_at)
        self._start_handler(stream)
        self._start_handlers()
        self._update_read_deadline()

    # --- input -------------------------------------------------------------------------
    def receive(self, data: bytes, arrived_at: float | None = None) -> None:
        """The frame guard first (h2_guard): h2 sees only the frames it lets through.
        Requests that end in ``data`` start only once all of it is read, so that a
        request reset in the same read never reaches the application."""
        if self._phase is _FINISHED or not data:
            return  # EOF: connection_lost follows
        guard = self._guard
        now = trio.current_time()
        self._read_at = now if arrived_at is None else arrived_at  # (when this read's requests arrived)
        accepted, refusal = guard.scan(data, now)
        try:
            events = self._h2.receive_data(data if refusal is None else data[:accepted])
        except h2.exceptions.ProtocolError as exc:
            log.debug("HTTP/2 protocol error from client, closing: %s", exc)
            self._abort_streams()  # h2 has queued a GOAWAY
            self._phase = _FINISHED
        else:
            dispatch = self._dispatch
            for event in events:
                handler = dispatch.get(type(event))
                if handler is not None:
                    handler(event)
            # Malformed requests h2 reset, and streams refused beyond the limit, count as resets.
            errors = self._h2.stream_errors
            if errors != self._stream_errors or self._refused:
                charged = errors - self._stream_errors + self._refused
                if not guard.charge_resets(charged, trio.current_time()):
                    refusal = ErrorCodes.ENHANCE_YOUR_CALM
                self._stream_errors, self._refused = errors, 0
            if refusal is None:
                self._start_handlers()
                self._update_read_deadline()
            else:
                self._fail(refusal)
        self._t.wake_writer()

    def _fail(self, code: ErrorCodes) -> None:
        """A connection error of ours: GOAWAY ``code``, abort every stream, close."""
        if self._phase is _FINISHED:
            return  # the client's GOAWAY came first
        log.info("HTTP/2 connection closed with GOAWAY %s (a limit of docs/configuration.md)", code.name)
        self._h2.close_connection(error_code=code, last_stream_id=last_stream_id(self._h2))
        self._abort_streams()
        self._phase = _FINISHED

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        block = self._h2.plain_requests.pop(sid, None)
        if self._phase is not _OPEN or len(self._streams) >= self._t.settings.max_concurrent_streams:
            self._h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            self._refused += self._phase is _OPEN  # (a client that ignores the advertised limit)
            return
        # A block seen before (h2_inbound.Block) gives the same head: it is made once.
        known: tuple[HttpRequest, int | None] | None = None if block is None else block.head
        if known is None:
            assert event.headers is not None
            known = request_head(event.headers, self._t.scheme), content_length(event.headers)
            if block is not None:
                block.head = known
        request, length = known
        stream = self._open_stream(sid, request, self._read_at)
        if length is not None and length > self._t.settings.max_body_bytes:
            self._refuse_body(stream)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        sid, data, length = event.stream_id, event.data, event.flow_controlled_length
        assert sid is not None and length is not None and data is not None
        self._h2.acknowledge_received_data(length, sid)
        stream = self._streams.get(sid)
        if stream is None or stream.state not in NOT_STARTED_STATES:
            return  # refused, or already answered
        stream.body.append(data)
        size = len(data)
        stream.body_size += size
        self._body_bytes += size
        limit = self._t.settings.max_body_bytes
        if stream.body_size > limit or self._body_bytes > limit * 4:
            self._refuse_body(stream)

    def _on_stream_ended(self, event: h2.events.StreamEnded) -> None:
        assert event.stream_id is not None
        stream = self._streams.get(event.stream_id)
        if stream is None:
            return
        stream.reset_when_done = False
        if stream.state in NOT_STARTED_STATES:
            self._start_handler(stream)

    def _on_stream_reset(self, event: h2.events.StreamReset) -> None:
        assert event.stream_id is not None
        stream = self._streams.get(event.stream_id)
        if stream is not None:
            self._drop(stream)

    def _on_window_updated(self, event: h2.events.WindowUpdated) -> None:
        # Stream 0 (the connection window): the streams it stopped are still queued, and
        # their write-stall clocks start again; a stream's own window restarts its own.
        if not event.stream_id:
            for waiting in [stream for stream in self._stalled.streams.values() if not stream.blocked]:
                self._stalled.discard(waiting)
            return
        stream = self._streams.get(event.stream_id)
        if stream is not None and stream.blocked:
            self._unblock(stream)

    def _on_settings_changed(self, event: h2.events.RemoteSettingsChanged) -> None:
        if SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
            for stream in self._streams.values():
                if stream.blocked:
                    self._unblock(stream)

    def _unblock(self, stream: Http2Stream) -> None:
        stream.blocked = False
        self._stalled.discard(stream)
        self.schedule(stream)

    def _on_connection_terminated(self, event: h2.events.ConnectionTerminated) -> None:
        # h2 cannot send on a connection after the peer's GOAWAY.
        self._abort_streams()
        self._phase = _FINISHED

    def read_timed_out(self) -> bool:
        """A deadline of :meth:`_update_read_deadline` passed.  A header block (or a
        frame other than DATA) incomplete for the header-read timeout closes the
        connection (GOAWAY); so does the keep-alive timeout with no stream open.  A
        request body not complete within the body-read timeout, and a response stalled
        on the client's window for the write-stall timeout, reset their stream (CANCEL,
        which cancels its handler and frees its engine slot); reading goes on."""
        if self._phase is _FINISHED:
            return False
        now = trio.current_time()
        if self._guard.busy_since + self._t.settings.header_read_timeout <= now:
            log.debug("HTTP/2 header block incomplete after the header-read-timeout, closing")
            self._fail(ErrorCodes.NO_ERROR)
            return False
        for stream in self._receiving.expired(now):
            log.debug("HTTP/2 stream %d: request body timed out (body-read-timeout)", stream.stream_id)
            self._receiving.discard(stream)
            self.inject_reset(stream, ErrorCodes.CANCEL)
        for stream in self._stalled.expired(now):
            log.debug("HTTP/2 stream %d: the client read nothing (write-stall-timeout)", stream.stream_id)
            self._stalled.discard(stream)
            self.inject_reset(stream, ErrorCodes.CANCEL)
        if not self._streams and self._idle_deadline <= now:
            self._h2.close_connection(last_stream_id=last_stream_id(self._h2))
            self._phase = _FINISHED
            return False
        self._update_read_deadline()
        return self._phase is not _FINISHED

    # --- streams -----------------------------------------------------------------------
    def _open_stream(self, stream_id: int, request: HttpRequest, received_at: float) -> Http2Stream:
        settings = self._t.settings
        stream = Http2Stream(
            host=self,
            high_water=settings.high_water,
            low_water=settings.low_water,
            stream_id=stream_id,
            head_only=request.method == "HEAD",
            request=request,
        )
        self._streams[stream_id] = stream
        stream.received_at = received_at
        self._receiving.add(stream, received_at)
        self._t.tracker.stream_opened()
        return stream

    def _start_handler(self, stream: Http2Stream) -> None:
        head, body = stream.request, stream.body
        assert head is not None
        # Always a request of its own: the head may be a remembered block's, shared.
        request = with_body(head, b"".join(body) if body else head.body, stream.received_at)
        self._release(stream)
        self._starting.append((stream, request))

    def _start_handlers(self) -> None:
        """Run the handlers of the requests completed by this read, unless reset since."""
        starting, self._starting = self._starting, []
        transport = self._t
        spawn, app, faults = transport.spawn, transport.app, transport.settings.faults
        for stream, request in starting:
            start_handler(spawn, app, request, stream, faults)

    def _refuse_body(self, stream: Http2Stream) -> None:
        limit = self._t.settings.max_body_bytes
        self._release(stream)
        stream.reset_when_done = True
        stream.respond_error(413, f"request body exceeds the limit of {limit} bytes (max-request-body-size-mb)")

    def _release(self, stream: Http2Stream) -> None:
        """``stream`` no longer receives its request: forget its head and buffered body."""
        if stream.request is not None:
            stream.request = None
            self._receiving.discard(stream)
        if stream.body:
            self._body_bytes -= stream.body_size
            stream.body = []

    def _drop(self, stream: Http2Stream) -> None:
        """Forget ``stream`` (reset, or failed) and abort its handler."""
        if self._streams.pop(stream.stream_id, None) is not None:
            self._release(stream)
            self._stalled.discard(stream)
            self._closed()
        stream.abort()

    def _update_read_deadline(self) -> None:
        """The earliest of: the header-read timeout of an incomplete header block, the
        body-read timeout of the oldest request still arriving, the write-stall timeout
        of the oldest stalled response, and with no stream open the keep-alive one (see
        :meth:`read_timed_out`)."""
        deadline = min(
            self._guard.busy_since + self._t.settings.header_read_timeout,
            self._receiving.next_deadline(),
            self._stalled.next_deadline(),
        )
        self._t.set_read_deadline(deadline if self._streams else min(deadline, self._idle_deadline))

    def _closed(self) -> None:
        """A stream has just left ``self._streams``."""
        self._t.tracker.stream_closed()
        if not self._streams:
            if self._phase is _CLOSING:
                self._phase = _FINISHED
            self._update_idle_deadline()

    def _update_idle_deadline(self) -> None:
        if not self._streams:
            self._idle_deadline = trio.current_time() + self._t.settings.keep_alive_timeout
            self._update_read_deadline()

    def _abort_streams(self) -> None:
        streams = list(self._streams.values())
        self._streams.clear()
        self._stalled.clear()
        self._starting.clear()
        for stream in streams:
            self._release(stream)
            self._t.tracker.stream_closed()
            stream.abort()

    # --- StreamHost --------------------------------------------------------------------
    def schedule(self, stream: Http2Stream) -> None:
        if not stream.queued and not stream.blocked:
            stream.queued = True
            self._ready.append(stream)
            self._t.wake_writer()

    def fail(self, stream: Http2Stream) -> None:
        self.inject_reset(stream, ErrorCodes.INTERNAL_ERROR)

    # --- injected faults (.faulty) -------------------------------------------------------
    multiplexed = True

    def inject_reset(self, stream: Http2Stream, code: int) -> None:
        """RST_STREAM ``code``, then forget the stream as a client's reset does."""
        if stream.stream_id in self._streams:
            self._h2.reset_stream(stream.stream_id, code)
            self._drop(stream)
            self._t.wake_writer()

    def inject_goaway(self, stream: Http2Stream, code: int | None) -> None:
        """GOAWAY (NO_ERROR) naming ``stream``: later streams already open are reset with
        REFUSED_STREAM (not processed, so safe to retry), new ones are refused, and the
        connection closes once the streams up to ``stream`` are done.  With an error
        ``code``: GOAWAY(``code``, the last stream the client opened), then close."""
        if code is not None and self._phase is not _FINISHED:
            self._frames.append(goaway_frame(last_stream_id(self._h2), code))
            self.inject_close(stream)
        if self._phase is not _OPEN:
            return
        self._phase = _CLOSING
        self._frames.append(goaway_frame(stream.stream_id))
        for later in [other for other in self._streams.values() if other.stream_id > stream.stream_id]:
            self.inject_reset(later, ErrorCodes.REFUSED_STREAM)
        self._t.wake_writer()

    def inject_close(self, stream: Http2Stream, mode: str = "fin") -> None:
        if mode != "fin":
            self._t.close_abruptly(mode)
        self._abort_streams()
        self._phase = _FINISHED
        self._t.wake_writer()

    def inject_frames(self, stream: Http2Stream, kind: str, count: int) -> bool:
        if stream.stream_id not in self._streams:
            return False
        limit = self._t.settings.max_concurrent_streams
        self._frames.append(h2_faults.control_frames(self._h2, stream.stream_id, kind, count, limit))
        self._t.wake_writer()
        return True

    def write_padded(self, stream: Http2Stream, data: bytes, padding: int) -> bool:
        if stream.stream_id not in self._streams or stream.head_pending or stream.buffered:
            return False
        frames = h2_faults.padded_data(self._h2, stream.stream_id, data, padding)
        if frames is None:
            return False
        self._frames.append(frames)
        self._t.wake_writer()
        return True

    def inject_head_frames(self, stream: Http2Stream, size: int) -> bool:
        if stream.stream_id not in self._streams or not stream.head_pending:
            return False
        status, headers = stream.take_head()
        fields = response_headers(status, headers)
        self._frames.append(h2_faults.head_frames(self._h2, stream.stream_id, fields, size))
        stream.h2stream = sendable_stream(self._h2, stream.stream_id)
        self._t.wake_writer()
        return True

    def send_trailers(self, stream: Http2Stream, fields: tuple[tuple[bytes, bytes], ...]) -> None:
        """A HEADERS frame with END_STREAM (through h2: trailers take its state machine)."""
        if stream.stream_id not in self._streams:
            return
        stream.state = next_state(stream.state, ResponseEvent.END)
        self._h2.send_headers(stream.stream_id, list(fields), end_stream=True)
        out: list[bytes] = []
        self._done(stream, out)
        self._frames.extend(out)
        self._t.wake_writer()

    # --- lifecycle ---------------------------------------------------------------------
    def connection_lost(self) -> None:
        self._abort_streams()
        self._phase = _FINISHED

    def begin_shutdown(self) -> None:
        """GOAWAY now (naming the last stream we will answer), finish those, then close.

        The GOAWAY frame is built by hand: h2 stops sending DATA once it has sent a
        GOAWAY itself (python-hyper/h2#1181), and the streams still in flight need it.
        """
        if self._phase is not _OPEN:
            return
        self._phase = _CLOSING
        self._frames.append(goaway_frame(last_stream_id(self._h2)))
        if not self._streams:
            self._phase = _FINISHED
        self._t.wake_writer()


#: The pure-Python write, the reference: with llmsim.speedups.NATIVE, ``Http2Stream.write``
#: is its C twin (native/h2_write.c), which takes the per-token case and hands this the rest.
PURE_WRITE = Http2Stream.write
if (_install := installer("install_http2_write")) is not None:
    _STATES = StreamState.OPEN, StreamState.HALF_CLOSED_REMOTE, ConnectionState.SERVER_OPEN
    _install(Http2Stream, Http2Handler, PURE_WRITE, _STREAMING, *_STATES)
