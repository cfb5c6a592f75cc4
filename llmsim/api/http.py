"""The seam between the connection handlers (``llmsim.protocol``) and the API.

``protocol/`` parses bytes into an :class:`HttpRequest`, creates one
:class:`ResponseStream` owner object per request (HTTP/1.1) or stream (HTTP/2), and
runs ``await app.handle(request, response)`` in a task it can cancel.  The API never
touches sockets: it calls :meth:`ResponseStream.start`, :meth:`~ResponseStream.write`
and :meth:`~ResponseStream.end`, all synchronous and non-blocking.  Bytes written are
buffered on the stream and flushed by the connection's single writer task, so every
write made during one engine step leaves in one socket write per connection.

When the client goes away (EOF, RST_STREAM, connection loss) the protocol layer sets
``response.closed``, runs the close callbacks and cancels the handler task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

__all__ = ["REASON_PHRASES", "Application", "Headers", "HttpRequest", "ResponseStream"]

Headers = Sequence[tuple[bytes, bytes]]

REASON_PHRASES: dict[int, bytes] = {
    100: b"Continue",
    101: b"Switching Protocols",
    200: b"OK",
    201: b"Created",
    202: b"Accepted",
    204: b"No Content",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    409: b"Conflict",
    411: b"Length Required",
    413: b"Content Too Large",
    415: b"Unsupported Media Type",
    417: b"Expectation Failed",
    422: b"Unprocessable Entity",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}


def reason_phrase(status: int) -> bytes:
    """A reason phrase for every status (h2load --h1 counts an empty one as a failure)."""
    return REASON_PHRASES.get(status, b"Unknown")


@attrs.frozen
class HttpRequest:
    """A complete request: head and body.  Header names are lower-case bytes."""

    method: str
    path: str
    query: str = ""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""
    http_version: str = "1.1"
    scheme: str = "http"

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), decoded as latin-1."""
        wanted = name.lower().encode("latin-1")
        for key, value in self.headers:
            if key == wanted:
                return value.decode("latin-1")
        return None


class ResponseStream(Protocol):
    """One response, owned by the connection handler.  Every method is non-blocking."""

    @property
    def closed(self) -> bool:
        """True once the client is gone (EOF, reset, connection loss): nothing more is sent."""

    @property
    def ended(self) -> bool:
        """True once :meth:`end` was called (bytes may still wait to be sent)."""

    @property
    def started(self) -> bool:
        """True once :meth:`start` was called (the status line/HEADERS are decided)."""

    def start(self, status: int, headers: Headers) -> None:
        """Decide status and headers.  Content-Length in ``headers`` means a fixed body;
        without it the body is streamed (chunked on HTTP/1.1)."""

    def write(self, data: bytes) -> bool:
        """Append body bytes to the outbound buffer.  Returns False when the buffer is
        above its high-water mark: the producer should pause until ``on_drained``."""

    def end(self, data: bytes = b"") -> None:
        """Append the last body bytes and finish the response."""

    def on_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once (from the writer) when the buffer falls below its
        low-water mark.  Called at once if it already is."""

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once when the client goes away before :meth:`end`."""


class Application(Protocol):
    """What both the native handlers and the ASGI adapter serve."""

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        """Answer ``request`` on ``response``.  Must call ``response.end`` unless cancelled."""
