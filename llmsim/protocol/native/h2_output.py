"""The sending half of :class:`~.http2.Http2Handler`: one batch of frames per step.

Writes only queue a stream (``Http2Handler.schedule``); :meth:`Http2Output.outgoing`
(called by the connection's writer task, or by the engine task right after a step)
walks the queue once, sends each stream's bytes as DATA frames within its flow-control
window and the peer's MAX_FRAME_SIZE, and returns the whole batch for a single
``send_all``.  A stream whose window is exhausted is marked ``blocked`` and leaves the
queue until its WINDOW_UPDATE, so it never holds up others.  :class:`Http2Output` is a
base class of the handler, not an object of its own: the per-step, per-stream path
stays on the one object that owns the stream table, with no call across objects.
"""

from __future__ import annotations

import abc
from collections import deque
from typing import TYPE_CHECKING

import h2.exceptions
import trio
from h2.errors import ErrorCodes

from llmsim.api.http import CLOSED_STATES, ENDED_STATES, ResponseState
from llmsim.protocol.native.base import Transport
from llmsim.protocol.native.h2_fastpath import (
    ServerConnection,
    connection_window,
    send_buffered,
    send_data,
    send_response_head,
    send_window,
    sendable_stream,
    stream_window,
)
from llmsim.protocol.native.h2_guard import FrameGuard, StreamClock
from llmsim.protocol.native.h2_headers import response_headers

if TYPE_CHECKING:
    from llmsim.protocol.native.http2 import Http2Stream

__all__ = ["Http2Output"]

_STREAMING = ResponseState.STREAMING


class Http2Output:
    """The output path of an HTTP/2 connection; :class:`~.http2.Http2Handler` sets the
    state below in its ``__init__`` and provides the stream-table hooks."""

    # Slots (here and in the handler): the compiled write (native/h2_write.c) reads
    # ``_batch``, ``_t``, ``_frames`` and ``_h2`` by offset, a load instead of a lookup.
    __slots__ = ("_batch", "_frames", "_guard", "_h2", "_ready", "_sent", "_stalled", "_streams", "_t")

    _h2: ServerConnection
    _t: Transport
    _guard: FrameGuard
    _streams: dict[int, Http2Stream]
    _stalled: StreamClock[Http2Stream]  # responses waiting for a window (write-stall timeout)
    _ready: deque[Http2Stream]  # streams with something to send, in order
    _sent: list[Http2Stream]  # streams that sent bytes in the last batch
    # Bytes framed before the next batch, in the order they were made, ahead of h2's own
    # buffer: the 101 of an upgrade, our GOAWAY, injected frames, and the DATA frames
    # that Http2Stream.write framed at once (the per-token case).  h2's buffer holds only
    # what receiving made (ACKs, WINDOW_UPDATE, RST_STREAM, GOAWAY on an error), which may
    # follow those frames.
    _frames: list[bytes]
    _batch: int  # outgoing() calls so far: the batch the next frames belong to

    @abc.abstractmethod
    def _drop(self, stream: Http2Stream) -> None:
        """Forget ``stream`` (reset, or failed) and abort its handler."""

    @abc.abstractmethod
    def _closed(self) -> None:
        """A stream has just left ``self._streams``."""

    @abc.abstractmethod
    def _update_read_deadline(self) -> None:
        """A stream's write-stall clock started: the connection's read deadline may be earlier."""

    def outgoing(self) -> bytes:
        """Every ready stream's head and the DATA its windows allow, in one batch.

        First the frames already made (``_frames``, in the order they were made: above
        all the per-token DATA frames), then h2's own buffer, then each ready stream:
        h2's buffer (HEADERS, RST_STREAM, SETTINGS ACK, WINDOW_UPDATE...) is drained into
        ``out`` right after each call into h2, and the DATA and HEADERS frames built by
        hand (:mod:`.h2_fastpath`) are appended between.  Per stream, that is exactly
        the order h2 alone would have sent; only control frames made by receiving may
        now follow DATA frames written before them were sent, which no peer can tell.
        """
        h2conn = self._h2
        out = self._frames
        self._frames = []
        self._batch += 1
        if h2conn._data_to_send:  # (h2's buffer: most batches have nothing of h2's own)
            out.append(h2conn.data_to_send())
        self._guard.taken()
        ready = self._ready
        if not ready:  # only frames made already (above all, the per-token ones): the usual batch
            return b"".join(out)  # (h2's buffer is drained above, and nothing added to it since)
        sent = self._sent
        for _ in range(len(ready)):
            stream = ready.popleft()
            stream.queued = False
            # The per-token case first: the head is sent, the body open, and everything
            # buffered fits one DATA frame and both windows (h2_fastpath.send_buffered).
            h2stream = stream.h2stream
            if (
                h2stream is not None
                and stream.buffered
                and stream.state is _STREAMING
                and send_buffered(out, h2conn, h2stream, stream.chunks)
            ):
                stream.buffered = 0
                if stream.drained_callbacks:
                    sent.append(stream)
            elif stream.state not in CLOSED_STATES:
                self._send(stream, out)
        if h2conn._data_to_send:
            out.append(h2conn.data_to_send())
        return b"".join(out)

    def _send(self, stream: Http2Stream, out: list[bytes]) -> None:
        try:
            self._send_frames(stream, out)
        except h2.exceptions.StreamClosedError:
            # h2 closed the stream itself (a stream error by the client).
            self._drop(stream)
            out.append(self._h2.data_to_send())

    def _send_frames(self, stream: Http2Stream, out: list[bytes]) -> None:
        # (``ended`` read off the state directly: this runs once or more per response.)
        h2conn = self._h2
        state = stream.state
        head_pending = stream.head_pending
        if head_pending and self._send_head(stream, out):
            self._done(stream, out)
            return
        if stream.drained_callbacks:
            self._sent.append(stream)  # flushed() may wake its producer (or a fault waiting for the head)
        if not stream.buffered and state not in ENDED_STATES:
            return
        # (Just after its head, _send_head found the stream h2 holds: nothing changed it since.)
        h2stream = stream.h2stream if head_pending else sendable_stream(h2conn, stream.stream_id)
        if h2stream is None:
            self._send_through_h2(stream, out)  # raises what h2 raises for this state
            return
        if stream.buffered:
            window = send_window(h2conn, h2stream)
            if window <= 0:
                self._wait_for_window(stream)
                return
            data = stream.take(window)
            end = state in ENDED_STATES and not stream.buffered
            send_data(out, h2conn, h2stream, data, end and not stream.trailers)
            if stream.buffered:
                self._wait_for_window(stream)
            elif end:
                if stream.trailers:
                    self._end(stream, out)
                else:  # (what _end does then, without its call: the usual end of a response)
                    self._done(stream, out)
        elif stream.trailers:  # ended, everything sent: the trailers end it (not flow-controlled)
            self._end(stream, out)
        elif stream_window(h2stream) < 0:
            # Ended, everything sent, but a smaller SETTINGS_INITIAL_WINDOW_SIZE made the
            # window negative: even an empty DATA frame must wait until a WINDOW_UPDATE
            # makes it positive again (RFC 9113 6.9.2; h2 as a client rejects it).
            stream.blocked = True
        else:  # ended, everything sent: an empty DATA frame with END_STREAM
            send_data(out, h2conn, h2stream, b"", True)
            self._done(stream, out)

    def _send_head(self, stream: Http2Stream, out: list[bytes]) -> bool:
        """Send ``stream``'s HEADERS (by hand, or through h2 where h2 would do more than
        send them); return whether they ended the stream.  If they did not, the
        stream's ``h2stream`` is h2's stream as :func:`sendable_stream` now finds it."""
        h2conn = self._h2
        status, headers = stream.take_head()
        end = stream.state in ENDED_STATES and not stream.buffered and not stream.trailers
        h2stream = sendable_stream(h2conn, stream.stream_id)
        # 1xx: h2's informational path.  (A status from 200 to 999 cannot start with a 1:
        # the usual head is told without formatting its status.)
        if h2stream is None or (not 200 <= status < 1000 and (b"%d" % status).startswith(b"1")):
            fields = response_headers(status, headers)
            h2conn.send_headers(stream.stream_id, fields, end_stream=end)  # raises what h2 raises here
            out.append(h2conn.data_to_send())
            if not end:
                stream.h2stream = sendable_stream(h2conn, stream.stream_id)
        else:
            send_response_head(out, h2conn, h2stream, status, headers, end)
            if not end:
                stream.h2stream = h2stream  # (the head leaves its state as it was: still sendable)
        return end

    def _send_through_h2(self, stream: Http2Stream, out: list[bytes]) -> None:
        """h2's own per-frame path, for the states :func:`sendable_stream` leaves to h2."""
        try:
            self._send_frames_through_h2(stream, out)
        finally:
            out.append(self._h2.data_to_send())

    def _send_frames_through_h2(self, stream: Http2Stream, out: list[bytes]) -> None:
        h2conn = self._h2
        sid = stream.stream_id
        while stream.buffered:
            window = min(h2conn.local_flow_control_window(sid), h2conn.max_outbound_frame_size)
            if window <= 0:
                self._wait_for_window(stream)
                return
            data = stream.take(window)
            end = stream.state.ended and not stream.buffered
            h2conn.send_data(sid, data, end_stream=end and not stream.trailers)
            if end:
                self._end(stream, out)
                return
        if stream.state.ended:
            if not stream.trailers:
                h2conn.end_stream(sid)
            self._end(stream, out)

    def _wait_for_window(self, stream: Http2Stream) -> None:
        """``stream`` has bytes its window does not let out: it waits, and its
        write-stall clock runs until a WINDOW_UPDATE for it (see ``Http2Handler.read_timed_out``)."""
        if connection_window(self._h2) <= 0:
            stream.queued = True  # the connection window: retry on the next batch
            self._ready.append(stream)
        else:
            stream.blocked = True  # its own window: retry on its WINDOW_UPDATE
        if self._stalled.add(stream, trio.current_time()):
            self._update_read_deadline()

    def _end(self, stream: Http2Stream, out: list[bytes]) -> None:
        """Everything of ``stream``'s body is in ``out``, with END_STREAM unless it has
        trailers: those go now, a HEADERS frame with END_STREAM (through h2, whose state
        machine trailers take)."""
        if stream.trailers:
            self._h2.send_headers(stream.stream_id, list(stream.trailers), end_stream=True)
            out.append(self._h2.data_to_send())
        self._done(stream, out)

    def _done(self, stream: Http2Stream, out: list[bytes]) -> None:
        """The last frame of ``stream``'s response is in ``out``."""
        if stream.reset_when_done:
            self._h2.reset_stream(stream.stream_id, ErrorCodes.NO_ERROR)
            out.append(self._h2.data_to_send())
        streams = self._streams
        del streams[stream.stream_id]
        stalled = self._stalled
        if stalled.streams:  # (only a client that does not read stalls a stream)
            stalled.discard(stream)
        tracker = self._t.tracker
        tracker.request_served()
        if streams:  # _closed(), while other streams are open
            tracker.stream_closed()
        else:
            self._closed()
        stream.finish()

    def flushed(self) -> None:
        if not self._sent:  # (the usual case: no new list)
            return
        sent, self._sent = self._sent, []
        for stream in sent:
            stream.flushed()
