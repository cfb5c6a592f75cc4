"""HTTP/2 on h2: streams, flow control, refusal beyond the stream limit, GOAWAY.

Each stream is one :class:`Http2Stream` (request head and body while it arrives, then
the response buffer, window state and handler scope), kept in one dict and dropped on
end, reset and connection loss alike.  Writes only queue the stream;
:meth:`Http2Handler.outgoing` (called by the connection's writer task, or by the engine
task right after a step) walks the queue once, sends each stream's bytes as DATA frames
within its flow-control window and the peer's MAX_FRAME_SIZE, and returns the whole
batch for a single ``send_all``.  A stream whose window is exhausted is marked
``blocked`` and leaves the queue until its WINDOW_UPDATE, so it never holds up others.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs
import h2.events
import h2.exceptions
import trio
from h2.errors import ErrorCodes
from h2.settings import SettingCodes

from llmsim.api.http import HttpRequest, ResponseEvent, ResponseState, next_state
from llmsim.protocol.native.base import HandlerPhase, Transport
from llmsim.protocol.native.frames import goaway_frame
from llmsim.protocol.native.h2_fastpath import (
    H2Stream,
    ServerConnection,
    connection_window,
    last_stream_id,
    send_buffered,
    send_data,
    send_headers,
    send_window,
    sendable_stream,
    server_connection,
    stream_window,
)
from llmsim.protocol.native.h2_headers import request_head, response_headers
from llmsim.protocol.native.stream import OutboundStream, content_length, run_handler

__all__ = ["UPGRADE_ERRORS", "Http2Handler", "Http2Stream"]

log = logging.getLogger("llmsim.protocol")

#: What a bad ``HTTP2-Settings`` header raises from h2 (the upgrade is then declined).
UPGRADE_ERRORS = (ValueError, h2.exceptions.ProtocolError)
_STREAMING = ResponseState.STREAMING
_OPEN, _CLOSING, _FINISHED = HandlerPhase.OPEN, HandlerPhase.CLOSING, HandlerPhase.FINISHED


@attrs.define(eq=False, repr=False, kw_only=True)
class Http2Stream(OutboundStream):
    """One HTTP/2 stream: the request while it arrives, then its response."""

    host: Http2Handler
    request: HttpRequest | None = None  # the head, until the body is complete
    body: list[bytes] = attrs.field(factory=list, init=False)
    body_size: int = attrs.field(default=0, init=False)
    blocked: bool = attrs.field(default=False, init=False)  # bytes pending, the stream's window exhausted
    reset_when_done: bool = attrs.field(default=False, init=False)  # answered before the request ended
    h2stream: H2Stream | None = attrs.field(default=None, init=False)  # h2's, once the head is sent


class Http2Handler:
    """The HTTP/2 side of one connection (prior knowledge, ALPN ``h2`` or ``h2c`` upgrade)."""

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
        self._ready: deque[Http2Stream] = deque()
        self._sent: list[Http2Stream] = []  # streams that sent bytes in the last batch
        self._prefix = preamble  # raw bytes ahead of h2's own: the 101, our GOAWAY
        self._body_bytes = 0  # request-body bytes buffered on all streams
        self._receiving = 0  # streams whose request is still arriving (head, handler not started)
        self._body_deadline = math.inf  # the read deadline while some stream is receiving
        self._refresh_body_deadline = False  # a request head or DATA arrived: move it on
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
        stream = self._open_stream(1, request)
        self._start_handler(stream)
        self._update_read_deadline()

    # --- input -------------------------------------------------------------------------
    def receive(self, data: bytes) -> None:
        if self._phase is _FINISHED or not data:
            return  # EOF: connection_lost follows
        try:
            events = self._h2.receive_data(data)
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
            self._update_read_deadline()
        self._t.wake_writer()

    def _on_request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        if self._phase is not _OPEN or len(self._streams) >= self._t.settings.max_concurrent_streams:
            self._h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            return
        assert event.headers is not None
        stream = self._open_stream(sid, request_head(event.headers, self._t.scheme))
        length = content_length(event.headers)
        if length is not None and length > self._t.settings.max_body_bytes:
            self._refuse_body(stream)

    def _on_data(self, event: h2.events.DataReceived) -> None:
        sid = event.stream_id
        assert sid is not None and event.flow_controlled_length is not None and event.data is not None
        self._h2.acknowledge_received_data(event.flow_controlled_length, sid)
        stream = self._streams.get(sid)
        if stream is None or stream.state.started:
            return  # refused, or already answered
        stream.body.append(event.data)
        stream.body_size += len(event.data)
        self._body_bytes += len(event.data)
        self._refresh_body_deadline = True
        limit = self._t.settings.max_body_bytes
        if stream.body_size > limit or self._body_bytes > limit * 4:
            self._refuse_body(stream)

    def _on_stream_ended(self, event: h2.events.StreamEnded) -> None:
        assert event.stream_id is not None
        stream = self._streams.get(event.stream_id)
        if stream is None:
            return
        stream.reset_when_done = False
        if not stream.state.started:
            self._start_handler(stream)

    def _on_stream_reset(self, event: h2.events.StreamReset) -> None:
        assert event.stream_id is not None
        stream = self._streams.get(event.stream_id)
        if stream is not None:
            self._drop(stream)

    def _on_window_updated(self, event: h2.events.WindowUpdated) -> None:
        # Stream 0 (the connection window): the streams it stopped are still queued.
        stream = self._streams.get(event.stream_id or 0)
        if stream is not None and stream.blocked:
            stream.blocked = False
            self.schedule(stream)

    def _on_settings_changed(self, event: h2.events.RemoteSettingsChanged) -> None:
        if SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
            for stream in self._streams.values():
                if stream.blocked:
                    stream.blocked = False
                    self.schedule(stream)

    def _on_connection_terminated(self, event: h2.events.ConnectionTerminated) -> None:
        # h2 cannot send on a connection after the peer's GOAWAY.
        self._abort_streams()
        self._phase = _FINISHED

    def read_timed_out(self) -> bool:
        """Either a request body stalled for the header-read timeout (its streams are
        reset with CANCEL, and reading goes on), or the connection was idle for the
        keep-alive timeout with no stream open (GOAWAY, then close)."""
        if self._phase is _FINISHED:
            return False
        if self._receiving:
            stalled = [stream for stream in self._streams.values() if stream.request is not None]
            for stream in stalled:
                log.debug("HTTP/2 stream %d: request body timed out (header-read-timeout)", stream.stream_id)
                self._h2.reset_stream(stream.stream_id, ErrorCodes.CANCEL)
                self._drop(stream)
            self._update_read_deadline()
            return self._phase is not _FINISHED
        self._h2.close_connection(last_stream_id=last_stream_id(self._h2))
        self._phase = _FINISHED
        return False

    # --- streams -----------------------------------------------------------------------
    def _open_stream(self, stream_id: int, request: HttpRequest) -> Http2Stream:
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
        self._receiving += 1
        self._refresh_body_deadline = True
        self._t.tracker.stream_opened()
        return stream

    def _start_handler(self, stream: Http2Stream) -> None:
        assert stream.request is not None
        request = attrs.evolve(stream.request, body=b"".join(stream.body)) if stream.body else stream.request
        self._release(stream)
        self._t.spawn(run_handler, self._t.app, request, stream)

    def _refuse_body(self, stream: Http2Stream) -> None:
        limit = self._t.settings.max_body_bytes
        self._release(stream)
        stream.reset_when_done = True
        stream.respond_error(413, f"request body exceeds the limit of {limit} bytes (max-request-body-size-mb)")

    def _release(self, stream: Http2Stream) -> None:
        """``stream`` no longer receives its request: forget its head and buffered body."""
        if stream.request is not None:
            stream.request = None
            self._receiving -= 1
        if stream.body:
            self._body_bytes -= stream.body_size
            stream.body = []

    def _drop(self, stream: Http2Stream) -> None:
        """Forget ``stream`` (reset, or failed) and abort its handler."""
        if self._streams.pop(stream.stream_id, None) is not None:
            self._release(stream)
            self._closed()
        stream.abort()

    def _update_read_deadline(self) -> None:
        """While a request is still arriving, reading may pause at most the header-read
        timeout (moved on by each request head and DATA frame); with streams open and
        none receiving, there is no deadline; with none open, the keep-alive one (set by
        :meth:`_closed`) stays."""
        if self._receiving:
            if self._refresh_body_deadline:
                self._body_deadline = trio.current_time() + self._t.settings.header_read_timeout
            self._t.set_read_deadline(self._body_deadline)
        elif self._streams:
            self._t.set_read_deadline(math.inf)
        self._refresh_body_deadline = False

    def _closed(self) -> None:
        """A stream has just left ``self._streams``."""
        self._t.tracker.stream_closed()
        if not self._streams:
            if self._phase is _CLOSING:
                self._phase = _FINISHED
            self._update_idle_deadline()

    def _update_idle_deadline(self) -> None:
        if not self._streams:
            self._t.set_read_deadline(trio.current_time() + self._t.settings.keep_alive_timeout)

    def _abort_streams(self) -> None:
        streams = list(self._streams.values())
        self._streams.clear()
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

    def inject_goaway(self, stream: Http2Stream) -> None:
        """GOAWAY (NO_ERROR) naming ``stream``: later streams already open are reset with
        REFUSED_STREAM (not processed, so safe to retry), new ones are refused, and the
        connection closes once the streams up to ``stream`` are done."""
        if self._phase is not _OPEN:
            return
        self._phase = _CLOSING
        self._prefix += goaway_frame(stream.stream_id)
        for later in [other for other in self._streams.values() if other.stream_id > stream.stream_id]:
            self.inject_reset(later, ErrorCodes.REFUSED_STREAM)
        self._t.wake_writer()

    def inject_close(self, stream: Http2Stream) -> None:
        self._abort_streams()
        self._phase = _FINISHED
        self._t.wake_writer()

    def send_trailers(self, stream: Http2Stream, fields: tuple[tuple[bytes, bytes], ...]) -> None:
        """A HEADERS frame with END_STREAM (through h2: trailers take its state machine)."""
        if stream.stream_id not in self._streams:
            return
        stream.state = next_state(stream.state, ResponseEvent.END)
        self._h2.send_headers(stream.stream_id, list(fields), end_stream=True)
        out: list[bytes] = []
        self._done(stream, out)
        self._prefix += b"".join(out)
        self._t.wake_writer()

    # --- output ------------------------------------------------------------------------
    def outgoing(self) -> bytes:
        """Every ready stream's head and the DATA its windows allow, in one batch.

        Bytes are collected in emission order: h2's own buffer (HEADERS, RST_STREAM,
        SETTINGS ACK, WINDOW_UPDATE...) is drained into ``out`` right after each call
        into h2, and the DATA and HEADERS frames built by hand (:mod:`.h2_fastpath`) are
        appended between, so the batch is exactly what h2 alone would have sent.
        """
        h2conn = self._h2
        out = [self._prefix, h2conn.data_to_send()]
        self._prefix = b""
        ready = self._ready
        sent = self._sent
        for _ in range(len(ready)):
            stream = ready.popleft()
            stream.queued = False
            # The per-token case first: the head is sent, the body open, and everything
            # buffered fits one DATA frame and both windows (h2_fastpath.send_buffered).
            h2stream, size = stream.h2stream, stream.buffered
            if (
                h2stream is not None
                and size
                and stream.state is _STREAMING
                and send_buffered(out, h2conn, h2stream, stream.chunks, size)
            ):
                stream.buffered = 0
                if stream.drained_callbacks:
                    sent.append(stream)
            elif not stream.state.closed:
                self._send(stream, out)
        out.append(h2conn.data_to_send())
        return b"".join(out)

    def _send(self, stream: Http2Stream, out: list[bytes]) -> None:
        try:
            self._send_frames(stream, out)
        except h2.exceptions.StreamClosedError:
            # h2 closed the stream itself (a stream error by the client).
            self._drop(stream)
            out.append(self._h2.data_to_send())

    def _send_frames(self, stream: Http2Stream, out: list[bytes]) -> None:
        h2conn = self._h2
        sid = stream.stream_id
        if stream.head_pending:
            if self._send_head(stream, out):
                self._done(stream, out)
                return
            stream.h2stream = sendable_stream(h2conn, sid)
        if stream.drained_callbacks:
            self._sent.append(stream)  # flushed() may wake its producer (or a fault waiting for the head)
        if not stream.buffered and not stream.state.ended:
            return
        h2stream = sendable_stream(h2conn, sid)
        if h2stream is None:
            self._send_through_h2(stream, out)  # raises what h2 raises for this state
            return
        if stream.buffered:
            window = send_window(h2conn, h2stream)
            if window <= 0:
                self._wait_for_window(stream)
                return
            data = stream.take(window)
            end = stream.state.ended and not stream.buffered
            send_data(out, h2conn, h2stream, data, end)
            if stream.buffered:
                self._wait_for_window(stream)
            elif end:
                self._done(stream, out)
        elif stream_window(h2stream) < 0:
            # Ended, everything sent, but a smaller SETTINGS_INITIAL_WINDOW_SIZE made the
            # window negative: even an empty DATA frame must wait until a WINDOW_UPDATE
            # makes it positive again (RFC 9113 6.9.2; h2 as a client rejects it).
            stream.blocked = True
        else:  # ended, everything sent: an empty DATA frame with END_STREAM
            send_data(out, h2conn, h2stream, b"", True)
            self._done(stream, out)

    def _send_head(self, stream: Http2Stream, out: list[bytes]) -> bool:
        """Send ``stream``'s HEADERS (by hand, or through h2 where h2 would do more than
        send them); return whether they ended the stream."""
        h2conn = self._h2
        status, headers = stream.take_head()
        end = stream.state.ended and not stream.buffered
        fields = response_headers(status, headers)
        h2stream = sendable_stream(h2conn, stream.stream_id)
        if h2stream is None or fields[0][1].startswith(b"1"):  # 1xx: h2's informational path
            h2conn.send_headers(stream.stream_id, fields, end_stream=end)  # raises what h2 raises here
            out.append(h2conn.data_to_send())
        else:
            send_headers(out, h2conn, h2stream, fields, end)
        return end

    def _send_through_h2(self, stream: Http2Stream, out: list[bytes]) -> None:
        """h2's own per-frame path, for the states :func:`sendable_stream` leaves to h2."""
        try:
            self._send_frames_through_h2(stream, out)
        finally:
            out.append(self._h2.data_to_send())

    def _send_frames_through_h2(self, stream: Http2Stream, out: list[bytes]) -> None:
        h2conn = self._h2
        sid = stream.stream_id
        while stream.buffered:
            window = min(h2conn.local_flow_control_window(sid), h2conn.max_outbound_frame_size)
            if window <= 0:
                self._wait_for_window(stream)
                return
            data = stream.take(window)
            end = stream.state.ended and not stream.buffered
            h2conn.send_data(sid, data, end_stream=end)
            if end:
                self._done(stream, out)
                return
        if stream.state.ended:
            h2conn.end_stream(sid)
            self._done(stream, out)

    def _wait_for_window(self, stream: Http2Stream) -> None:
        if connection_window(self._h2) <= 0:
            stream.queued = True  # the connection window: retry on the next batch
            self._ready.append(stream)
        else:
            stream.blocked = True  # its own window: retry on its WINDOW_UPDATE

    def _done(self, stream: Http2Stream, out: list[bytes]) -> None:
        """The last frame of ``stream``'s response is in ``out``."""
        if stream.reset_when_done:
            self._h2.reset_stream(stream.stream_id, ErrorCodes.NO_ERROR)
            out.append(self._h2.data_to_send())
        del self._streams[stream.stream_id]
        self._t.tracker.request_served()
        self._closed()
        stream.finish()

    def flushed(self) -> None:
        sent, self._sent = self._sent, []
        for stream in sent:
            stream.flushed()

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
        self._prefix += goaway_frame(last_stream_id(self._h2))
        if not self._streams:
            self._phase = _FINISHED
        self._t.wake_writer()
