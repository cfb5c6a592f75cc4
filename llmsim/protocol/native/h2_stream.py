"""One HTTP/2 stream of :class:`~.http2.Http2Handler`, and its per-token write.

:meth:`Http2Stream.write` frames a token at once into the connection's next batch; it
has a compiled twin (``native/h2_write.c``), which :mod:`.http2` installs once the
handler class exists (``http2.PURE_WRITE`` is this one, the reference).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs

from llmsim.api.http import HttpRequest, ResponseState
from llmsim.protocol.native.h2_fastpath import H2Stream, send_data_now
from llmsim.protocol.native.stream import OutboundStream

if TYPE_CHECKING:
    from llmsim.protocol.native.http2 import Http2Handler

__all__ = ["Http2Stream"]

_STREAMING = ResponseState.STREAMING


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
    # While the request arrives, when its body must be complete; while the response is
    # stalled on the client's flow-control window, when it is given up (h2_guard.StreamClock).
    deadline: float = attrs.field(default=math.inf, init=False)
    received_at: float = attrs.field(default=0.0, init=False)  # the read that held its HEADERS
    # Bytes framed at once (write) into the handler's batch number ``framed_batch``.
    framed: int = attrs.field(default=0, init=False)
    framed_batch: int = attrs.field(default=-1, init=False)

    def write(self, data: bytes) -> bool:
        """The per-token case goes straight into the connection's next batch as one DATA
        frame (:func:`~.h2_fastpath.send_data_now`): the head is sent, nothing of the
        body waits, the connection's earlier output is on the wire (not ``congested``),
        the frame fits both windows, and with it the stream has framed less than the
        low-water mark into this batch.  So backpressure is as before: a client that does
        not read congests the connection, a producer that writes much between two
        batches goes past the low-water mark, and from there writes buffer on the
        stream up to the high-water mark.  Anything else buffers and queues the stream
        for :meth:`Http2Output.outgoing`, as on every other backend."""
        h2stream = self.h2stream
        size = len(data)
        if h2stream is not None and size and self.state is _STREAMING and not (self.buffered or self.queued):
            host = self.host
            batch = host._batch
            framed = (self.framed if self.framed_batch == batch else 0) + size
            if framed < self.low_water and self.frame_at_once and not host._t.congested and not self.head_only:
                frames = host._frames
                first = not frames
                if send_data_now(frames, host._h2, h2stream, data):
                    self.framed, self.framed_batch = framed, batch
                    if first:
                        host._t.wake_writer()
                    return True
        return super().write(data)
