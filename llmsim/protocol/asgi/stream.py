"""The :class:`~llmsim.api.http.ResponseStream` owner object of one ASGI request.

The API writes synchronously; the ASGI task pumps.  Everything written between two
wake-ups of the pump leaves in one ``http.response.body`` message, so a step that
produces several events for a stream costs one ``send()`` rather than one per event.
The buffer is bounded only by the producer honouring ``write() -> False`` and
``on_drained``, exactly as on the native connections (the two share
:class:`~llmsim.protocol.response.BufferedResponse`).
"""

from __future__ import annotations

import attrs
import trio

from llmsim.protocol.response import BufferedResponse

__all__ = ["AsgiResponseStream", "PumpSignal"]


@attrs.define(eq=False)
class PumpSignal:
    """The host of an ASGI stream: wakes the pump when there is something to send."""

    _pending: trio.Event = attrs.field(factory=trio.Event, init=False)

    def schedule(self, stream: AsgiResponseStream) -> None:
        self._pending.set()

    async def wait(self) -> None:
        """Until something was scheduled since the last wait."""
        await self._pending.wait()
        self._pending = trio.Event()


@attrs.define(eq=False, repr=False, kw_only=True)
class AsgiResponseStream(BufferedResponse):
    """One response: status, headers and a byte buffer between the API and ``send()``.

    The API side (``start``/``write``/``end``/``on_*``) never blocks.  The pump side
    (:meth:`wait_pending`, :meth:`take_all`, ``flushed``, ``finish``) runs in the ASGI
    task, and ``abort`` is called by whoever sees ``http.disconnect``.  The handler runs
    in ``cancel_scope``, which ``abort`` cancels.  ``finish`` is called as the last
    send *begins*: from then on the response is complete, whatever the client does.
    """

    host: PumpSignal = attrs.field(factory=PumpSignal)
    send_trailers: bool = False  # the response ends with an ``http.response.trailers`` message

    async def wait_pending(self) -> None:
        """Wait until there is something to send: the head, body bytes or the end."""
        await self.host.wait()

    def take_all(self) -> bytes:
        """Everything buffered since the last call."""
        return self.take(self.buffered)
