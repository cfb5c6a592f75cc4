"""The response of an HTTP/1.1 connection (:class:`Http1Response`), and the compiled twin of its write.

:meth:`Http1Response.write` is what every paced token of an HTTP/1.1 response goes
through.  ``native/h1_write.c`` is its C twin, installed over it by :func:`install_write`
when ``llmsim._speedups`` is built and ``LLMSIM_PURE`` is not set
(:mod:`llmsim.speedups`): it takes the per-token case -- one chunk framed into the
handler's empty batch -- reading the response's and the handler's fields by slot offset
(hence ``Http1Handler.__slots__``) and making the chunk in one allocation, and hands
every other case (the take-back of a chunk already framed, buffering, anything of an
unexpected type) to the pure write, ``http1.PURE_WRITE``, which checks again and does
what it always did.  tests/protocol/native/test_native_h1_write.py runs the two side by
side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from llmsim.api.http import Headers, ResponseState
from llmsim.protocol.native.frames import chunk
from llmsim.protocol.native.http1_fastpath import SIZE_LINES
from llmsim.protocol.native.stream import OutboundStream
from llmsim.speedups import installer

if TYPE_CHECKING:
    from llmsim.protocol.native.http1 import Http1Handler

__all__ = ["Http1Response", "install_write"]

_STREAMING = ResponseState.STREAMING
_TABLED, _CRLF, _join = len(SIZE_LINES), b"\r\n", b"".join


@attrs.define(eq=False, repr=False, kw_only=True)
class Http1Response(OutboundStream):
    """The response in flight on an HTTP/1.1 connection, and how it is being framed."""

    host: Http1Handler
    chunked: bool = attrs.field(default=False, init=False)  # h11 chose chunked framing: chunks are made here
    end_sent: bool = attrs.field(default=False, init=False)  # EndOfMessage is in the last batch
    # h11 has not seen the request (.http1_fastpath): the head and the end are written
    # here too, or h11 is brought up to date first (Http1Handler._catch_up).
    bypassed: bool = attrs.field(default=False, init=False)

    def write(self, data: bytes) -> bool:
        """The per-token case goes straight into the connection's next batch as one
        chunk: the head is out, nothing of the body waits, the batch is empty, the
        connection's earlier output is on the wire (not ``congested``) and the piece is
        below the low-water mark (so backpressure is as before: a client that does not
        read congests the connection, and later writes buffer up to the high-water
        mark).  A second write before the batch leaves takes that chunk back into the
        buffer first, so one step's writes still leave as one chunk.  The chunk is
        :func:`.frames.chunk`'s, with its size line from a table (not formatted).

        This is ``PURE_WRITE``, the reference: the C twin installed over it (see the
        module's docstring) takes the per-token case and hands it every other."""
        if self.chunked and self.state is _STREAMING and not self.buffered and self.frame_at_once:
            host = self.host
            if not host._out:
                size = len(data)
                if 0 < size < self.low_water and not host._t.congested:
                    host._out.append(_join((SIZE_LINES[size], data, _CRLF)) if size < _TABLED else chunk(data))
                    host._framed = data
                    host._t.wake_writer()
                    return True
            else:
                host.take_back(self)
        return super().write(data)

    def end(self, data: bytes = b"", trailers: Headers = ()) -> None:
        if data and self.state is _STREAMING:
            self.host.take_back(self)  # (the same chunk as a write before it, as before)
        super().end(data, trailers)


def install_write(handler: type[Http1Handler]) -> Callable[[Http1Response, bytes], bool]:
    """Install the C ``Http1Response.write`` (if built and allowed) for responses whose
    host is a ``handler``; the pure write, returned, stays the reference."""
    pure = Http1Response.write
    if (install := installer("install_http1_write")) is not None:
        install(Http1Response, handler, _STREAMING, pure)
    return pure
