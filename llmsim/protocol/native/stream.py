"""One owner object per response: the :class:`~llmsim.api.http.ResponseStream` the API writes to.

An :class:`OutboundStream` holds everything about one response: the head the handler
decided, the body bytes not yet handed to the wire, the callbacks, and the cancel
scope of the handler task.  The API side (``start``/``write``/``end``) only appends and
tells its :class:`StreamHost` (the HTTP/1.1 or HTTP/2 connection) that there is
something to send; the connection's single writer task takes the bytes out
(``take_head``/``take``), and reports back (``flushed``, ``finish``, ``abort``).  When
the stream ends, is reset or its connection is lost, the connection drops this one
object and nothing about the stream remains anywhere else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

import attrs
import trio

from llmsim.api.errors import JSON_HEADERS, error_body
from llmsim.api.http import Application, Headers, HttpRequest

__all__ = ["OutboundStream", "StreamHost", "content_length", "run_handler", "split_target"]

log = logging.getLogger("llmsim.protocol")


class StreamHost(Protocol):
    """The connection that owns a stream."""

    def schedule(self, stream: OutboundStream) -> None:
        """``stream`` has a new head, body bytes or its end to send."""

    def fail(self, stream: OutboundStream) -> None:
        """``stream``'s handler failed after its head was decided: abort it on the wire."""


@attrs.define(eq=False, repr=False)
class OutboundStream:
    """A response being produced by a handler and sent by a connection's writer."""

    host: StreamHost
    high_water: int
    low_water: int
    stream_id: int = 0  # the HTTP/2 stream id; 0 on HTTP/1.1
    head_only: bool = False  # a HEAD request: the body is never sent
    status: int = attrs.field(default=0, init=False)
    headers: tuple[tuple[bytes, bytes], ...] = attrs.field(default=(), init=False)
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    queued: bool = attrs.field(default=False, init=False)  # the host's bookkeeping: waiting for the writer
    _chunks: list[bytes] = attrs.field(factory=list, init=False)
    _buffered: int = attrs.field(default=0, init=False)
    _started: bool = attrs.field(default=False, init=False)
    _ended: bool = attrs.field(default=False, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _head_sent: bool = attrs.field(default=False, init=False)
    _drained_callbacks: list[Callable[[], None]] = attrs.field(factory=list, init=False)
    _close_callbacks: list[Callable[[], None]] = attrs.field(factory=list, init=False)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "ended" if self._ended else "open"
        return f"<OutboundStream {self.stream_id} {self.status or '-'} {state} {self._buffered}B>"

    # --- ResponseStream: the API side ------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def started(self) -> bool:
        return self._started

    def start(self, status: int, headers: Headers) -> None:
        if self._started:
            raise RuntimeError(f"response already started with status {self.status}; start() is called once")
        self._started = True
        self.status = status
        self.headers = tuple(headers)
        if not self._closed:
            self.host.schedule(self)

    def write(self, data: bytes) -> bool:
        if not self._started:
            raise RuntimeError("write() before start(): decide the status and headers first")
        if self._ended:
            raise RuntimeError("write() after end(): the response is complete")
        if self._closed:
            return True  # the client is gone; the close callbacks tell the producer
        if data and not self.head_only:
            self._chunks.append(data)
            self._buffered += len(data)
            if not self.queued:
                self.host.schedule(self)
        return self._buffered < self.high_water

    def end(self, data: bytes = b"") -> None:
        if self._ended:
            raise RuntimeError("end() called twice")
        if not self._started:
            raise RuntimeError("end() before start(): decide the status and headers first")
        if data:
            self.write(data)
        self._ended = True
        if not self._closed:
            self.host.schedule(self)

    def on_drained(self, callback: Callable[[], None]) -> None:
        if self._buffered < self.low_water or self._closed:
            callback()
        else:
            self._drained_callbacks.append(callback)

    def on_close(self, callback: Callable[[], None]) -> None:
        if self._closed and not self._ended:
            callback()
        elif not self._closed:
            self._close_callbacks.append(callback)

    def respond_error(self, status: int, message: str, headers: Headers = ()) -> None:
        """A complete JSON error response in the OpenAI envelope."""
        body = error_body(status, message)
        self.start(status, (*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *headers))
        self.end(body)

    # --- the connection's writer side -----------------------------------------------
    @property
    def ended(self) -> bool:
        """The handler has called :meth:`end` (bytes may still wait to be sent)."""
        return self._ended

    @property
    def head_pending(self) -> bool:
        return self._started and not self._head_sent

    @property
    def buffered(self) -> int:
        """Body bytes written and not yet taken by the writer."""
        return self._buffered

    @property
    def waits_for_drain(self) -> bool:
        """Someone registered :meth:`on_drained` (so :meth:`flushed` has work to do)."""
        return bool(self._drained_callbacks)

    @property
    def complete(self) -> bool:
        """Everything the handler produced has been taken by the writer."""
        return self._ended and self._head_sent and not self._buffered

    def take_head(self) -> tuple[int, tuple[tuple[bytes, bytes], ...]]:
        self._head_sent = True
        return self.status, self.headers

    def take(self, limit: int) -> bytes:
        """Up to ``limit`` body bytes, oldest first."""
        if self._buffered <= limit:
            data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
            self._chunks.clear()
        else:
            joined = b"".join(self._chunks)
            data, rest = joined[:limit], joined[limit:]
            self._chunks[:] = [rest]
        self._buffered -= len(data)
        return data

    def flushed(self) -> None:
        """The writer has put everything it took on the wire: maybe wake the producer."""
        if self._drained_callbacks and self._buffered < self.low_water:
            callbacks, self._drained_callbacks = self._drained_callbacks, []
            for callback in callbacks:
                callback()

    def finish(self) -> None:
        """The whole response is on the wire."""
        self._closed = True
        self._drained_callbacks.clear()
        self._close_callbacks.clear()

    def abort(self) -> None:
        """The client is gone (EOF, reset, connection lost): drop the buffer, cancel
        the handler and tell whoever registered :meth:`on_close`."""
        if self._closed:
            return
        self._closed = True
        self._chunks.clear()
        self._buffered = 0
        self._drained_callbacks.clear()
        self.cancel_scope.cancel()
        callbacks, self._close_callbacks = self._close_callbacks, []
        if not self._ended:
            for callback in callbacks:
                callback()


async def run_handler(app: Application, request: HttpRequest, stream: OutboundStream) -> None:
    """Run ``app.handle`` for one request; a handler that fails gets a 500 (or, if its
    head is already decided, the stream is aborted on the wire)."""
    with stream.cancel_scope:
        try:
            await app.handle(request, stream)
        except Exception:
            log.exception("handler for %s %s failed", request.method, request.path)
            _fail(stream, "the server failed while answering this request; see the server log")
            return
    if not stream.ended and not stream.closed:
        log.error("handler for %s %s returned without ending its response", request.method, request.path)
        _fail(stream, "the server returned without completing this response; see the server log")


def _fail(stream: OutboundStream, message: str) -> None:
    if stream.closed:
        return
    if not stream.started:
        stream.respond_error(500, message)
    else:
        stream.host.fail(stream)


def split_target(target: bytes) -> tuple[str, str]:
    """A request target as (path, query): ``/v1/models?a=1`` -> ``("/v1/models", "a=1")``.

    An absolute-form target (``http://host/path``, RFC 9112 section 3.2.2) keeps only
    its path.
    """
    if not target.startswith(b"/") and b"://" in target:
        target = b"/" + target.split(b"://", 1)[1].partition(b"/")[2]
    path, _, query = target.partition(b"?")
    return path.decode("latin-1"), query.decode("latin-1")


def content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The ``content-length`` of lower-cased request headers already validated (by h11
    or h2), or None if there is none."""
    for name, value in headers:
        if name == b"content-length":
            return int(value)
    return None
