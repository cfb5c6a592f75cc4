"""Keeping hypercorn's own failures to the one connection they happen on.

hypercorn 0.18 (trio worker) runs every connection in the server's nursery, so any
exception that escapes a connection ends the whole process.  Two come from its HTTP/2
code when clients abuse it or when the server shuts down:

* Once shutdown has begun (``context.terminated``), a new stream is refused with
  ``reset_stream``; if the client's own RST_STREAM for it came in the same read, h2
  raises ``StreamClosedError``; if its DATA came in the same read, hypercorn's
  ``self.streams[stream_id]`` raises ``KeyError`` (``hypercorn/protocol/h2.py:259``,
  pgjones/hypercorn#329, fixes proposed in PRs #312 and #334, unmerged).  The same
  ``KeyError`` follows DATA for a stream whose response already ended.
* Under floods of reset streams its per-connection sender has been seen to raise
  ``trio.BusyResourceError``.

:class:`GuardedH2Protocol` refuses new streams after shutdown itself (RST_STREAM
REFUSED_STREAM, tolerant of streams the client already closed) and drops DATA for
streams hypercorn no longer tracks (acknowledging it, so the connection's flow-control
window is not lost).  :class:`ContainedTCPServer` is the safety net: whatever else
hypercorn raises on a connection closes that connection only, logged once per kind at
WARNING (then at DEBUG, so that an attack cannot flood the log).  :func:`install` puts
both in place of hypercorn's classes; what cannot be fixed from outside (no GOAWAY on
graceful shutdown) is listed in docs/abuse.md.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, ClassVar

import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hypercorn.protocol
import hypercorn.protocol.h2
import hypercorn.trio.run
import hypercorn.trio.tcp_server
import trio
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.events import StreamClosed

__all__ = ["ContainedTCPServer", "GuardedH2Protocol", "install"]

log = logging.getLogger("llmsim.hypercorn")

_STREAM_EVENTS = (h2.events.DataReceived, h2.events.StreamEnded, h2.events.StreamReset)
#: How long, and how often, a stream closing during shutdown looks for its END_STREAM to be out.
_END_STREAM_WAIT, _END_STREAM_POLL = 1.0, 0.002


class GuardedH2Protocol(hypercorn.protocol.h2.H2Protocol):
    """hypercorn's HTTP/2 protocol, safe against streams that close under it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused: set[int] = set()

    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        # One at a time: shutdown may begin while hypercorn awaits inside the batch,
        # and each event must be judged by the state it arrives in.
        for event in events:
            if self._keep(event):
                await super()._handle_events([event])
        await self._flush()  # what was refused or acknowledged here

    async def stream_send(self, event: StreamEvent) -> None:
        """As hypercorn's, except that during shutdown a closing stream waits (a little)
        for its END_STREAM to be sent: hypercorn sends GOAWAY when the last stream closes,
        and its sender, between the stream's last DATA and its END_STREAM, may not have
        got there yet; h2 then refuses the END_STREAM and the response ends truncated."""
        if isinstance(event, StreamClosed) and self.context.terminated.is_set():
            with trio.move_on_after(_END_STREAM_WAIT):
                while event.stream_id in self.stream_buffers and not self.closed:
                    await trio.sleep(_END_STREAM_POLL)
        await super().stream_send(event)

    def _keep(self, event: h2.events.Event) -> bool:
        """False for an event handled here: a stream opened after shutdown began, and
        what arrives for streams hypercorn no longer has."""
        if isinstance(event, h2.events.RequestReceived) and self.context.terminated.is_set():
            self._refuse(event.stream_id)
            return False
        if isinstance(event, _STREAM_EVENTS) and event.stream_id in self._refused:
            self._acknowledge(event)
            return False
        if isinstance(event, h2.events.DataReceived) and event.stream_id not in self.streams:
            self._acknowledge(event)
            return False
        return True

    def _refuse(self, stream_id: int) -> None:
        if not self._refused:  # the first one: tell the client to open no more
            self.connection.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 0})
        self._refused.add(stream_id)
        with contextlib.suppress(h2.exceptions.StreamClosedError):  # the client reset it first
            self.connection.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)

    def _acknowledge(self, event: h2.events.Event) -> None:
        """Give back the connection window DATA used (h2 skips a closed stream's)."""
        if isinstance(event, h2.events.DataReceived) and event.flow_controlled_length:
            self.connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)


class ContainedTCPServer(hypercorn.trio.tcp_server.TCPServer):
    """hypercorn's per-connection server; an exception ends this connection only."""

    _seen: ClassVar[set[str]] = set()  # exception kinds already logged at WARNING

    async def run(self) -> None:
        try:
            await super().run()
        except* Exception as group:
            self._report(group)
            await trio.aclose_forcefully(self.stream)

    @classmethod
    def _report(cls, group: BaseExceptionGroup[Exception]) -> None:
        for exc in group.exceptions:
            kind = type(exc).__name__
            level = logging.DEBUG if kind in cls._seen else logging.WARNING
            cls._seen.add(kind)
            log.log(
                level,
                "hypercorn raised %s on one connection; that connection was closed, the server runs on "
                "(a hypercorn bug: docs/abuse.md; later ones are logged at debug level)",
                kind,
                exc_info=exc,  # the first of each kind carries the traceback too: it is the one to report
            )


def install() -> None:
    """Make hypercorn build :class:`ContainedTCPServer` and :class:`GuardedH2Protocol`
    (it looks both up by name when a connection arrives).  Idempotent."""
    hypercorn.trio.run.TCPServer = ContainedTCPServer  # type: ignore[attr-defined]
    hypercorn.protocol.H2Protocol = GuardedH2Protocol  # type: ignore[attr-defined]
