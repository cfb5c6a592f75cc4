"""What the native and the ASGI response streams share: one owner object per response.

:class:`BufferedResponse` is the :class:`~llmsim.api.http.ResponseStream` the API
writes to (its state, head, body buffer, water marks and callbacks, and the cancel
scope of the handler task) together with the calls the sending side makes on it:
:meth:`~BufferedResponse.take`, :meth:`~BufferedResponse.flushed`,
:meth:`~BufferedResponse.finish` and :meth:`~BufferedResponse.abort`.  Its
:class:`StreamHost` -- the HTTP/1.1 or HTTP/2 connection, or the ASGI pump -- is told
whenever there is something new to send; each backend adds only how the bytes leave.

The state is the seam's :class:`~llmsim.api.http.ResponseState`; every change goes
through its table (:func:`~llmsim.api.http.next_state`), except a write while
STREAMING, the per-token case, which is one identity check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, Self, TypeVar

import attrs
import trio

from llmsim.api.http import (
    JSON_HEADERS,
    Headers,
    ResponseEvent,
    ResponseState,
    ResponseStateFlags,
    error_body,
    next_state,
)
from llmsim.protocol.settings import BUFFER_HIGH_WATER, BUFFER_LOW_WATER

__all__ = ["BufferedResponse", "StreamHost"]

_StreamT = TypeVar("_StreamT", bound="BufferedResponse", contravariant=True)
# The type of ``self`` in the methods that hand ``self`` to the host (whose type names
# the concrete stream class it schedules).
_Self = TypeVar("_Self", bound="BufferedResponse")

# Module globals, compared by identity: enum attribute lookups are not free on the
# per-write path.
_STREAMING = ResponseState.STREAMING
_ENDED = ResponseState.ENDED
_START, _WRITE, _END = ResponseEvent.START, ResponseEvent.WRITE, ResponseEvent.END
_COMPLETE, _CLOSE = ResponseEvent.COMPLETE, ResponseEvent.CLOSE
_ABORTED_STATES = frozenset(state for state in ResponseState if state.closed and state is not ResponseState.DONE)


class StreamHost(Protocol[_StreamT]):
    """Whoever sends a stream's bytes (a connection, or the ASGI pump)."""

    def schedule(self, stream: _StreamT) -> None:
        """``stream`` has a new head, body bytes or its end to send."""


@attrs.define(eq=False, repr=False, kw_only=True)
class BufferedResponse(ResponseStateFlags):
    """A response being produced by a handler and sent by its host.

    The API side (``start``/``write``/``end``/``on_*``) only appends and calls
    ``host.schedule``; the host takes the bytes out (:meth:`take`) and reports back:
    :meth:`flushed` once what it took is on the wire, :meth:`finish` once the last
    byte is, :meth:`abort` when the client is gone.
    """

    host: StreamHost[Self]
    high_water: int = BUFFER_HIGH_WATER
    low_water: int = BUFFER_LOW_WATER
    head_only: bool = False  # a HEAD request: the body is never sent
    state: ResponseState = attrs.field(default=ResponseState.IDLE, init=False)
    status: int = attrs.field(default=0, init=False)
    headers: tuple[tuple[bytes, bytes], ...] = attrs.field(default=(), init=False)
    trailers: tuple[tuple[bytes, bytes], ...] = attrs.field(default=(), init=False)  # given to end()
    _cancel_scope: trio.CancelScope | None = attrs.field(default=None, init=False)  # see cancel_scope
    queued: bool = attrs.field(default=False, init=False)  # the host's bookkeeping: waiting to be sent
    # The host may frame a write at once, into its next batch, instead of buffering it
    # (HTTP/2's per-token case); False where each piece must leave in a batch of its own.
    frame_at_once: bool = attrs.field(default=True, init=False)
    # Read directly by the host on its per-token path (a property there costs a call):
    # the body written and not yet taken, oldest first, and its size; and the
    # on_drained callbacks waiting (if any, the host's flushed() call has work to do).
    chunks: list[bytes] = attrs.field(factory=list, init=False)
    buffered: int = attrs.field(default=0, init=False)
    drained_callbacks: list[Callable[[], None]] = attrs.field(factory=list, init=False)
    _close_callbacks: list[Callable[[], None]] = attrs.field(factory=list, init=False)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.state.value} {self.status or '-'} {self.buffered}B>"

    @property
    def cancel_scope(self) -> trio.CancelScope:
        """The scope the handler runs in, cancelled when the client goes away (:meth:`abort`).

        Made when first asked for: a handler of an application that ends on its own
        once the response closes (``Application`` in :mod:`llmsim.api.http`) runs in
        none, and making one for every request cost as much as its request head.  Made
        after the client went away, it comes cancelled."""
        scope = self._cancel_scope
        if scope is None:
            scope = self._cancel_scope = trio.CancelScope()
            if self.state in _ABORTED_STATES:
                scope.cancel()
        return scope

    # --- ResponseStream: the API side (closed/started/ended: ResponseStateFlags) ----
    def start(self: _Self, status: int, headers: Headers) -> None:
        self.state = next_state(self.state, _START)
        self.status = status
        self.headers = tuple(headers)
        if self.state is _STREAMING:
            self.host.schedule(self)

    def write(self: _Self, data: bytes) -> bool:
        if self.state is not _STREAMING:
            self.state = next_state(self.state, _WRITE)  # raises, unless the client is gone
            return True  # dropped; the close callbacks tell the producer
        if data and not self.head_only:
            self.chunks.append(data)
            self.buffered += len(data)
            if not self.queued:
                self.host.schedule(self)
        return self.buffered < self.high_water

    def end(self: _Self, data: bytes = b"", trailers: Headers = ()) -> None:
        self.state = next_state(self.state, _END)
        if self.state is not _ENDED:
            return  # the client is gone: nothing is sent
        self.trailers = tuple(trailers)
        if data and not self.head_only:
            self.chunks.append(data)
            self.buffered += len(data)
        self.host.schedule(self)

    def on_drained(self, callback: Callable[[], None]) -> None:
        if self.buffered < self.low_water or self.state.closed:
            callback()
        else:
            self.drained_callbacks.append(callback)

    def on_close(self, callback: Callable[[], None]) -> None:
        state = self.state
        if state.ended:
            return  # never called for a response that ended
        if state.closed:
            callback()
        else:
            self._close_callbacks.append(callback)

    def respond_error(self, status: int, message: str, headers: Headers = ()) -> None:
        """A complete JSON error response in the seam's envelope."""
        body = error_body(status, message)
        self.start(status, (*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *headers))
        self.end(body)

    # --- the host's side ------------------------------------------------------------
    def take(self, limit: int) -> bytes:
        """Up to ``limit`` body bytes, oldest first."""
        chunks = self.chunks
        if self.buffered <= limit:
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
        else:
            joined = b"".join(chunks)
            data, rest = joined[:limit], joined[limit:]
            chunks[:] = [rest]
        self.buffered -= len(data)
        return data

    def flushed(self) -> None:
        """What the host took is on the wire: wake the producers if the buffer is below
        its low-water mark."""
        if self.drained_callbacks and self.buffered < self.low_water:
            callbacks, self.drained_callbacks = self.drained_callbacks, []
            for callback in callbacks:
                callback()

    def finish(self) -> None:
        """The last byte has been taken: the response is complete (DONE), whatever the
        client does from now on."""
        self.state = next_state(self.state, _COMPLETE)
        self.drained_callbacks.clear()
        self._close_callbacks.clear()

    def abort(self) -> None:
        """The client is gone (EOF, reset, connection lost) or the response is given up:
        drop the buffer, cancel the handler, and run the close callbacks unless the
        response had ended.  Nothing happens once the response is closed."""
        state = self.state
        if state.closed:
            return
        self.state = next_state(state, _CLOSE)
        self.chunks.clear()
        self.buffered = 0
        self.drained_callbacks.clear()
        if self._cancel_scope is not None:  # (else one made later comes cancelled)
            self._cancel_scope.cancel()
        callbacks, self._close_callbacks = self._close_callbacks, []
        if not state.ended:
            for callback in callbacks:
                callback()
