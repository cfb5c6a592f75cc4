"""HTTP/1.1 on h11: keep-alive, pipelining, chunked streaming, 100-continue, ``Upgrade: h2c``.

One request at a time: the next pipelined request is not parsed until the current
response has been written to the end (h11 is PAUSED meanwhile), so responses leave in
request order.  The socket is still read during a response, so that a client that goes
away is seen at once; what it pipelines meanwhile waits in h11's buffer (up to
``max_pipelined_bytes``, then reading pauses).
"""

from __future__ import annotations

import logging
import math

import attrs
import h11
import trio

from llmsim.api.http import HttpRequest, ResponseState, reason_phrase
from llmsim.protocol.native.base import HandlerPhase, Transport
from llmsim.protocol.native.frames import chunk, h11_sends_chunked, last_chunk
from llmsim.protocol.native.http1_fastpath import chunked_head, parse_whole_request
from llmsim.protocol.native.http2 import UPGRADE_ERRORS, Http2Handler
from llmsim.protocol.native.native_h1 import Http1Response, install_write
from llmsim.protocol.native.stream import content_length, split_target, start_handler

__all__ = ["PURE_WRITE", "Http1Handler", "Http1Response"]

log = logging.getLogger("llmsim.protocol")

_CLOSE = (b"connection", b"close")
# Written by hand: h11 is left behind once the connection speaks HTTP/2.
_SWITCHING_TO_H2C = b"HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: h2c\r\n\r\n"
_STREAMING = ResponseState.STREAMING
_OPEN, _CLOSING, _FINISHED = HandlerPhase.OPEN, HandlerPhase.CLOSING, HandlerPhase.FINISHED
_LAST_CHUNK = last_chunk()


class Http1Handler:
    """The HTTP/1.1 side of one connection."""

    # (Slots: the C write, native/h1_write.c, reads _out, _t and _framed by offset.)
    __slots__ = (
        "_arrived_at",
        "_body",
        "_body_deadline",
        "_body_size",
        "_framed",
        "_fresh",
        "_h11",
        "_head_deadline",
        "_held",
        "_idle_deadline",
        "_out",
        "_phase",
        "_pipelined",
        "_raw",
        "_received_at",
        "_request",
        "_response",
        "_t",
        "finished",
    )

    def __init__(self, transport: Transport) -> None:
        self._t = transport
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=transport.settings.max_header_bytes)
        self._phase = _OPEN  # CLOSING: close once the current response is out
        self.finished = False  # _phase is FINISHED (an attribute: read after every flush)
        self._response: Http1Response | None = None
        self._request: h11.Request | None = None  # head of the request whose body is arriving
        # h11 is idle with nothing buffered: a whole ordinary request may skip it (.http1_fastpath).
        self._fresh = True
        self._raw = b""  # the bytes of the bypassed request in flight, for _catch_up
        self._held: list[bytes] | None = None  # bytes received after it, not given to h11 yet
        self._body: list[bytes] = []
        self._body_size = 0
        self._body_deadline = math.inf  # the whole body must be in by then (body_read_timeout)
        self._received_at = 0.0  # when the head of the request whose body is arriving came in
        self._arrived_at: float | None = None  # when the bytes of the current read came in (None: now)
        self._out: list[bytes] = []  # the next batch: 100 Continue, chunks framed as written
        self._framed: bytes | None = None  # the body of the response's chunk in _out (Http1Response.write)
        self._pipelined = 0  # bytes received while the current response is in flight
        self._head_deadline: float | None = trio.current_time() + transport.settings.header_read_timeout
        self._idle_deadline = math.inf
        transport.set_read_deadline(self._head_deadline)

    # --- input -------------------------------------------------------------------------
    def receive(self, data: bytes, arrived_at: float | None = None) -> None:
        if self._phase is _FINISHED:
            return  # closing: discard what the client still sends
        self._arrived_at = arrived_at
        if self._response is not None:
            held = self._held
            if held is not None:
                held.append(data)
            else:
                self._h11.receive_data(data)
            self._pipelined += len(data)
            if self._pipelined > self._t.settings.max_pipelined_bytes:
                self._t.pause_reading()
            return
        if (
            self._fresh
            and self._phase is _OPEN
            and self._request is None
            and not self._h11.trailing_data[0]
            and self._serve_whole(data)
        ):
            return
        self._fresh = False
        self._h11.receive_data(data)
        if data and self._request is None and self._head_deadline is None:
            self._head_deadline = trio.current_time() + self._t.settings.header_read_timeout
        self._process()

    def _process(self) -> None:
        """Parse events until a request is complete or more bytes are needed."""
        while self._response is None and self._phase is not _FINISHED:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._reject(exc.error_status_hint, f"malformed HTTP/1.1 request: {exc}")
                return
            if event is h11.NEED_DATA:
                self._wait_for_more()
                return
            if isinstance(event, h11.Request):
                self._on_head(event)
            elif isinstance(event, h11.Data):
                self._on_body(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._on_request_complete()
            else:  # ConnectionClosed (PAUSED cannot happen without a response in flight)
                self._finish()

    def _serve_whole(self, data: bytes) -> bool:
        """Serve the request ``data`` starts with without h11, if it is whole and
        ordinary (see :mod:`.http1_fastpath`); False to leave ``data`` to h11."""
        settings = self._t.settings
        max_head, max_body = settings.max_header_bytes, settings.max_body_bytes
        arrived_at = self._arrived_at
        received_at = trio.current_time() if arrived_at is None else arrived_at
        parsed = parse_whole_request(data, self._t.scheme, max_head, max_body, received_at)
        if parsed is None:
            return False
        request, end = parsed
        self._raw = data[:end] if end < len(data) else data
        self._held = [data[end:]] if end < len(data) else []
        self._head_deadline = None
        stream = self._open_response()
        stream.bypassed = True
        start_handler(self._t.spawn, self._t.app, request, stream, settings.faults)
        return True

    def _catch_up(self) -> None:
        """Give h11 the bypassed request in flight (and what came after it), for a
        response :func:`.chunked_head` cannot write: h11 is then where it would be had
        it parsed the request itself (it accepts every request the fast path does)."""
        conn = self._h11
        conn.receive_data(self._raw)
        event = conn.next_event()
        while type(event) is not h11.EndOfMessage:
            assert isinstance(event, h11.Request | h11.Data), event
            event = conn.next_event()
        for data in self._held or ():
            conn.receive_data(data)
        self._raw, self._held = b"", None

    def _wait_for_more(self) -> None:
        if self._request is not None:
            return  # reading a body: _on_head/_on_body set the deadline
        deadline = self._head_deadline if self._head_deadline is not None else self._idle_deadline
        self._t.set_read_deadline(deadline)

    def _on_head(self, request: h11.Request) -> None:
        self._request = request
        self._head_deadline = None
        now = trio.current_time()
        arrived_at = self._arrived_at
        self._received_at = now if arrived_at is None else arrived_at
        self._body_deadline = now + self._t.settings.body_read_timeout
        self._refresh_body_deadline()
        # h11 bounds only heads that arrive in pieces; one that came whole is measured here.
        head_limit = self._t.settings.max_header_bytes
        if _head_size(request) > head_limit:
            self._reject(431, f"request line and headers exceed {head_limit} bytes")
            return
        limit = self._t.settings.max_body_bytes
        length = content_length(request.headers)
        if length is not None and length > limit:
            self._reject(
                413, f"request body of {length} bytes exceeds the limit of {limit} bytes (max-request-body-size-mb)"
            )
            return
        if self._h11.they_are_waiting_for_100_continue:
            self._out.append(self._send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")))
            self._t.wake_writer()

    def _on_body(self, data: bytes) -> None:
        self._body.append(data)
        self._body_size += len(data)
        self._refresh_body_deadline()
        limit = self._t.settings.max_body_bytes
        if self._body_size > limit:
            self._reject(413, f"request body exceeds the limit of {limit} bytes (max-request-body-size-mb)")

    def _refresh_body_deadline(self) -> None:
        """Each piece of the body must come within ``header_read_timeout`` of the last,
        and the whole body within ``body_read_timeout`` of the head: a client trickling
        a byte every few seconds does not hold its connection for ever."""
        idle = trio.current_time() + self._t.settings.header_read_timeout
        self._t.set_read_deadline(min(idle, self._body_deadline))

    def _on_request_complete(self) -> None:
        head = self._request
        assert head is not None
        self._request = None
        body = b"".join(self._body)
        self._body = []
        self._body_size = 0
        request = _http_request(head, body, self._t.scheme, self._received_at)
        if _wants_h2c(head, body) and self._t.scheme == "http" and self._upgrade(head, request):
            return
        stream = self._open_response(head_only=request.method == "HEAD")
        start_handler(self._t.spawn, self._t.app, request, stream, self._t.settings.faults)

    def _upgrade(self, head: h11.Request, request: HttpRequest) -> bool:
        """Switch to HTTP/2 with ``request`` as stream 1; False (serve it here) if the
        ``HTTP2-Settings`` header is unusable."""
        settings_header = _header(head, b"http2-settings")
        preamble = b"".join(self._out) + _SWITCHING_TO_H2C
        try:
            handler = Http2Handler(self._t, preamble=preamble, upgrade_settings=settings_header)
        except UPGRADE_ERRORS as exc:
            log.debug("declining Upgrade: h2c, bad HTTP2-Settings header: %s", exc)
            return False
        self._out = []
        self._phase, self.finished = _FINISHED, True
        trailing, _ = self._h11.trailing_data
        self._t.switch_to(handler)
        handler.serve_upgraded(attrs.evolve(request, http_version="2"))
        handler.receive(trailing, self._arrived_at)  # (the same read as the upgrade's)
        return True

    def read_timed_out(self) -> bool:
        if self._request is not None and trio.current_time() >= self._body_deadline:
            limit = self._t.settings.body_read_timeout
            self._reject(408, f"the request body did not arrive within {limit:g} s (body-read-timeout)")
        elif self._request is not None or self._h11.trailing_data[0]:
            self._reject(408, "timed out reading the request (header-read-timeout)")
        else:
            self._finish()  # idle keep-alive connection
        return False

    # --- responses ---------------------------------------------------------------------
    def _open_response(self, *, head_only: bool = False) -> Http1Response:
        settings = self._t.settings
        stream = Http1Response(
            host=self, high_water=settings.high_water, low_water=settings.low_water, head_only=head_only
        )
        self._response = stream
        self._pipelined = 0
        self._t.tracker.stream_opened()
        self._t.set_read_deadline(math.inf)
        return stream

    def _reject(self, status: int, message: str) -> None:
        """Answer with an error made here, then close (the request cannot be trusted)."""
        self._close_after_response()
        self._request = None
        self._body = []
        self._open_response().respond_error(status, message, (_CLOSE,))

    def schedule(self, stream: Http1Response) -> None:
        self._t.wake_writer()

    def fail(self, stream: Http1Response) -> None:
        """HTTP/1.1 cannot abort one response: send what is buffered, then close mid-body."""
        self._render(stream, self._out)
        self.connection_lost()
        self._finish()

    # --- injected faults (.faulty) -------------------------------------------------------
    multiplexed = False

    def inject_reset(self, stream: Http1Response, code: int) -> None:
        """HTTP/1.1 cannot reset one response: close the connection mid-body."""
        if stream is self._response:
            self.fail(stream)

    def inject_goaway(self, stream: Http1Response, code: int | None) -> None:
        """``Connection: close`` in the head not sent yet, and close after this response;
        with an error ``code``, close now."""
        if code is not None:
            self.inject_close(stream)
        self._close_after_response()

    def inject_close(self, stream: Http1Response, mode: str = "fin") -> None:
        if mode != "fin":
            self._t.close_abruptly(mode)
        self.inject_reset(stream, 0)

    def inject_frames(self, stream: Http1Response, kind: str, count: int) -> bool:
        return False  # HTTP/2 frames: nothing on HTTP/1.1

    def write_padded(self, stream: Http1Response, data: bytes, padding: int) -> bool:
        return False

    def inject_head_frames(self, stream: Http1Response, size: int) -> bool:
        return False

    def send_trailers(self, stream: Http1Response, fields: tuple[tuple[bytes, bytes], ...]) -> None:
        """The last chunk, then these fields (a chunked body; dropped otherwise)."""
        stream.end(trailers=fields)

    def take_back(self, stream: Http1Response) -> None:
        """Put the chunk :meth:`Http1Response.write` framed into the batch back into
        ``stream``'s buffer (empty then), to leave in one chunk with what follows."""
        framed = self._framed
        if framed is not None:
            self._framed = None
            self._out.pop()
            stream.chunks.append(framed)
            stream.buffered = len(framed)

    def outgoing(self) -> bytes:
        stream = self._response
        out = self._out
        # Nothing to render while a chunked body streams with nothing buffered.
        if stream is not None and (stream.buffered or stream.state is not _STREAMING or not stream.chunked):
            if stream.chunked and stream.buffered and stream.state is _STREAMING and not out:
                # One step's writes as one chunk: what h11's send(Data(...)) would return.
                return chunk(stream.take(stream.buffered))
            if not stream.state.closed:
                self._render(stream, out)
        if not out:
            return b""
        self._framed = None
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data

    def _render(self, stream: Http1Response, out: list[bytes]) -> None:
        try:
            self._render_events(stream, out)
        except h11.LocalProtocolError as exc:
            log.error("a response is not valid HTTP/1.1 (%s); closing the connection", exc)
            self.connection_lost()

    def _render_events(self, stream: Http1Response, out: list[bytes]) -> None:
        if stream.head_pending:
            head = chunked_head(stream.status, stream.headers) if stream.bypassed and self._keeps_open() else None
            if head is not None:
                stream.take_head()
                out.append(head)
                stream.chunked = True
                self._raw = b""  # (h11 will not need it: no request bytes kept per stream)
            else:  # h11 writes the head
                if stream.bypassed:
                    self._catch_up()
                    stream.bypassed = False
                status, headers = stream.take_head()
                if not self._keeps_open():
                    headers = (*headers, _CLOSE)
                response = h11.Response(status_code=status, headers=list(headers), reason=reason_phrase(status))
                out.append(self._send(response))
                stream.chunked = h11_sends_chunked(self._h11)
        if stream.buffered:
            data = stream.take(stream.buffered)
            if stream.chunked:
                out.append(chunk(data))  # what h11's send(Data(data)) returns, without its event machinery
            else:
                out.append(self._send(h11.Data(data=data)))
        if stream.fully_taken and not stream.end_sent:
            # Trailers need a chunked body: on a body with Content-Length they are dropped (api/http.py).
            trailers = stream.trailers if stream.chunked else ()
            if stream.bypassed:
                out.append(last_chunk(trailers) if trailers else _LAST_CHUNK)
            else:
                end = h11.EndOfMessage(headers=list(trailers)) if trailers else h11.EndOfMessage()
                out.append(self._send(end))
            stream.end_sent = True

    def _keeps_open(self) -> bool:
        """The connection stays open after this response (else it says ``Connection: close``)."""
        return self._phase is _OPEN and not self._t.shutting_down

    def _send(self, event: h11.Event) -> bytes:
        data = self._h11.send(event)
        assert data is not None  # only ConnectionClosed sends nothing
        return data

    def flushed(self) -> None:
        stream = self._response
        if stream is None:
            return
        if stream.drained_callbacks:  # (else BufferedResponse.flushed has nothing to do)
            stream.flushed()
        if stream.end_sent:
            self._response_done(stream)

    def _response_done(self, stream: Http1Response) -> None:
        stream.finish()
        self._response = None
        tracker = self._t.tracker
        tracker.stream_closed()
        tracker.request_served()
        if not self._keeps_open() or not (stream.bypassed or self._h11.our_state is h11.DONE):
            self._finish()  # Connection: close, HTTP/1.0, or an error answered early
            return
        if stream.bypassed:  # h11 is still idle: give it what came meanwhile
            held, self._held, self._raw = self._held or [], None, b""
            for data in held:
                self._h11.receive_data(data)
            pending = any(held)
        else:
            self._h11.start_next_cycle()
            pending = bool(self._h11.trailing_data[0])
        settings = self._t.settings
        now = trio.current_time()
        self._idle_deadline = now + settings.keep_alive_timeout
        if pending:
            # h11 holds the start of what comes next: only h11 may read on from here
            # (the fast path would take the next bytes for a new request).
            self._fresh = False
            self._head_deadline = now + settings.header_read_timeout
            self._t.resume_reading()
            self._arrived_at = None  # a pipelined request is received as it is taken up, now
            self._process()
        else:  # what _process would do: NEED_DATA, wait for the next request
            self._head_deadline = None
            self._fresh = True
            self._t.resume_reading()
            self._t.set_read_deadline(self._idle_deadline)

    # --- lifecycle ---------------------------------------------------------------------
    def connection_lost(self) -> None:
        stream, self._response = self._response, None
        if stream is not None:
            self._t.tracker.stream_closed()
            stream.abort()
        self._phase, self.finished = _FINISHED, True

    def begin_shutdown(self) -> None:
        self._close_after_response()
        if self._response is None:
            self._finish()

    def _close_after_response(self) -> None:
        if self._phase is _OPEN:
            self._phase = _CLOSING

    def _finish(self) -> None:
        self._phase, self.finished = _FINISHED, True
        self._t.resume_reading()  # so that the close can drain what the client still sends
        self._t.wake_writer()


#: The pure-Python Http1Response.write: the reference, kept when the C twin is installed over it (.native_h1).
PURE_WRITE = install_write(Http1Handler)


def _http_request(head: h11.Request, body: bytes, scheme: str, received_at: float) -> HttpRequest:
    path, query = split_target(head.target)
    return HttpRequest(
        method=head.method.decode("ascii"),
        path=path,
        query=query,
        headers=tuple((name, value) for name, value in head.headers),
        body=body,
        http_version=head.http_version.decode("ascii"),
        scheme=scheme,
        received_at=received_at,
    )


def _head_size(head: h11.Request) -> int:
    return len(head.target) + sum(len(name) + len(value) + 4 for name, value in head.headers)


def _header(head: h11.Request, name: bytes) -> bytes | None:
    for key, value in head.headers:
        if key == name:
            return value
    return None


def _wants_h2c(head: h11.Request, body: bytes) -> bool:
    """``Upgrade: h2c`` with one HTTP2-Settings header and no body (RFC 7540 section 3.2;
    a body would have to be read in HTTP/1.1 first, so such requests are served here)."""
    upgrade = _header(head, b"upgrade")
    if upgrade is None or b"h2c" not in [token.strip().lower() for token in upgrade.split(b",")]:
        return False
    settings = [value for key, value in head.headers if key == b"http2-settings"]
    return len(settings) == 1 and not body and _header(head, b"transfer-encoding") is None
