"""The contract between a connection (socket, reader, writer) and its protocol handler.

A :class:`~llmsim.protocol.native.connection.Connection` owns the socket and exactly two
long-lived tasks: a reader that hands every received chunk to
:meth:`ProtocolHandler.receive`, and a writer that, whenever woken, asks
:meth:`ProtocolHandler.outgoing` for *all* pending bytes and sends them with one
``send_all`` (right after an engine step, the engine task asks and sends instead, through
``Connection.flush_now``, while the writer has nothing in flight).  The handlers
(HTTP/1.1 on h11, HTTP/2 on h2) are synchronous: they never await, they only parse,
buffer, spawn request handlers and wake the writer.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from llmsim.api.http import Application
from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings

__all__ = ["HandlerPhase", "ProtocolHandler", "Transport"]


class Transport(Protocol):
    """What a connection offers the protocol handler running on it."""

    app: Application
    settings: ProtocolSettings
    tracker: ConnectionTracker
    scheme: str  # "http" or "https"
    #: Earlier output still waits for the socket: a handler must buffer what it writes
    #: (and so feel the water marks) instead of framing it into the next batch.
    congested: bool

    @property
    def shutting_down(self) -> bool:
        """The server is shutting down: finish what is in flight, accept nothing new."""

    def wake_writer(self) -> None:
        """There are bytes to send: the writer will call ``outgoing`` soon."""

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` as a task of this connection."""

    def set_read_deadline(self, deadline: float) -> None:
        """Call ``read_timed_out`` if nothing is received by ``deadline`` (trio time)."""

    def pause_reading(self) -> None:
        """Stop reading the socket until :meth:`resume_reading`."""

    def resume_reading(self) -> None: ...

    def switch_to(self, handler: ProtocolHandler) -> None:
        """Hand the connection to ``handler`` (HTTP/1.1 -> HTTP/2 after ``Upgrade: h2c``)."""

    def close_abruptly(self, mode: str) -> None:
        """The coming close is an injected fault's: no lingering; "rst": a TCP RST instead
        of a FIN; "close-notify": over TLS, a ``close_notify`` alert first (otherwise a
        TLS connection closes without one)."""


class HandlerPhase(enum.Enum):
    """Where a protocol handler is in its life; it only moves forward."""

    OPEN = "open"  # serving requests
    CLOSING = "closing"  # accepting nothing new: finish what is in flight, then close
    FINISHED = "finished"  # nothing more will be sent: the connection closes after the last flush


class ProtocolHandler(Protocol):
    """The synchronous protocol side of one connection."""

    @property
    def finished(self) -> bool:
        """Nothing more will be sent: the connection may close after the last flush."""

    def receive(self, data: bytes, arrived_at: float | None = None) -> None:
        """Bytes from the peer; ``b""`` is EOF.  ``arrived_at``: when they reached this
        host (trio's clock, see :mod:`.arrival`); None: now.  A request in them is
        received then (``HttpRequest.received_at``)."""

    def read_timed_out(self) -> bool:
        """The read deadline passed; True to keep reading (else the reader stops)."""

    def outgoing(self) -> bytes:
        """Everything that can be sent now (may be empty)."""

    def flushed(self) -> None:
        """The bytes of the last ``outgoing`` call are on the wire."""

    def connection_lost(self) -> None:
        """The socket is gone: abort every stream."""

    def begin_shutdown(self) -> None:
        """Finish what is in flight, accept nothing new, then finish."""
