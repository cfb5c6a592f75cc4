"""The :class:`~llmsim.api.http.ResponseStream` owner object of one ASGI request.

The API writes synchronously; the ASGI task pumps.  Everything written between two
wake-ups of the pump leaves in one ``http.response.body`` message, so a step that
produces several events for a stream costs one ``send()`` rather than one per event.
The buffer is bounded only by the producer honouring ``write() -> False`` and
``on_drained``, exactly as on the native connections.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from llmsim.api.http import Headers
from llmsim.protocol.settings import BUFFER_HIGH_WATER, BUFFER_LOW_WATER

__all__ = ["AsgiResponseStream"]

Callback = Callable[[], None]


@attrs.define(eq=False)
class AsgiResponseStream:
    """One response: status, headers and a byte buffer between the API and ``send()``.

    The API side (``start``/``write``/``end``/``on_*``) never blocks.  The pump side
    (:meth:`wait_pending`, :meth:`take`, :meth:`sent`, :meth:`finish`) runs in the ASGI
    task, and :meth:`client_gone` is called by whoever sees ``http.disconnect``.  The
    handler runs in :attr:`cancel_scope`, which :meth:`client_gone` cancels.
    """

    high_water: int = BUFFER_HIGH_WATER
    low_water: int = BUFFER_LOW_WATER
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    status: int | None = attrs.field(default=None, init=False)
    headers: Headers = attrs.field(default=(), init=False)
    ended: bool = attrs.field(default=False, init=False)
    finished: bool = attrs.field(default=False, init=False)
    gone: bool = attrs.field(default=False, init=False)
    _buffer: bytearray = attrs.field(factory=bytearray, init=False)
    _pending: trio.Event = attrs.field(factory=trio.Event, init=False)
    _drained_callbacks: list[Callback] = attrs.field(factory=list, init=False)
    _close_callbacks: list[Callback] = attrs.field(factory=list, init=False)

    # --- ResponseStream (API side) ------------------------------------------------
    @property
    def closed(self) -> bool:
        """Nothing more will be sent: the client left, or the last send has begun."""
        return self.gone or self.finished

    @property
    def started(self) -> bool:
        return self.status is not None

    def start(self, status: int, headers: Headers) -> None:
        if self.started:
            raise RuntimeError("start() was already called on this response")
        self.status = status
        self.headers = tuple(headers)
        self._pending.set()

    def write(self, data: bytes) -> bool:
        """Buffer ``data``; after the client left it is dropped (the handler is being
        cancelled), and True is returned so that no producer waits for a drain."""
        self._check_writable()
        if self.gone:
            return True
        if data:
            self._buffer += data
            self._pending.set()
        return len(self._buffer) < self.high_water

    def end(self, data: bytes = b"") -> None:
        self._check_writable()
        self.ended = True
        if self.gone:
            return
        self._buffer += data
        self._close_callbacks.clear()
        self._pending.set()

    def on_drained(self, callback: Callback) -> None:
        if self.gone or len(self._buffer) < self.low_water:
            callback()
        else:
            self._drained_callbacks.append(callback)

    def on_close(self, callback: Callback) -> None:
        """Run ``callback`` when the client leaves before the end; at once if it has."""
        if self.ended:
            return
        if self.gone:
            callback()
        else:
            self._close_callbacks.append(callback)

    def _check_writable(self) -> None:
        if not self.started:
            raise RuntimeError("write()/end() before start()")
        if self.ended:
            raise RuntimeError("write()/end() after end()")

    # --- pump side ------------------------------------------------------------------
    async def wait_pending(self) -> None:
        """Wait until there is something to send: the head, body bytes or the end."""
        await self._pending.wait()
        self._pending = trio.Event()

    def take(self) -> bytes:
        """Everything buffered since the last call."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    def sent(self) -> None:
        """A ``send()`` returned: wake producers if the buffer is below low water."""
        if len(self._buffer) >= self.low_water:
            return
        callbacks, self._drained_callbacks = self._drained_callbacks, []
        for callback in callbacks:
            callback()

    def finish(self) -> None:
        """The last bytes are being handed over: from now on the response is complete,
        whatever the client does."""
        self.finished = True
        self._drained_callbacks.clear()
        self._close_callbacks.clear()

    def client_gone(self) -> None:
        """The client left before :meth:`finish`: drop the buffer, cancel the handler
        and run the close callbacks (there are none left if the response had ended)."""
        if self.gone or self.finished:
            return
        self.gone = True
        self._buffer.clear()
        self._drained_callbacks.clear()
        self.cancel_scope.cancel()
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            callback()
