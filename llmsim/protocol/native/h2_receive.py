"""The receiving half of the server's HTTP/2 connection: an ordinary request's HEADERS
and DATA frames taken without h2's generic path where it does nothing for them.

:class:`ReceivingConnection` is h2's ``H2Connection`` with its two frame handlers that
matter per request replaced (``_receive_headers_frame``, ``_receive_data_frame``), and
two more for the frames :class:`.h2_inbound.InboundFrames` yields without making
hyperframe objects of them (:class:`.h2_inbound.RequestHeaders`,
:class:`.h2_inbound.RequestData`, registered in h2's frame dispatch table by
:class:`.h2_fastpath.ServerConnection`, the class every server connection is).  What each
does instead of h2's code, and why that is exact, is in its docstring and in
:mod:`.h2_fastpath`'s; the frames that are not an ordinary request's, and every state
these shortcuts do not cover, go through h2's own code.
"""

from __future__ import annotations

import h2.connection
import h2.events
from h2.connection import AllowedStreamIDs, ConnectionInputs, ConnectionState, _decode_headers
from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError, TooManyStreamsError
from h2.settings import SettingCodes
from h2.stream import H2Stream, StreamState
from hyperframe.frame import DataFrame, Frame, HeadersFrame

from llmsim.protocol.native.h2_inbound import (
    Block,
    CachingDecoder,
    RequestData,
    RequestHeaders,
    open_request,
    request_data,
)
from llmsim.protocol.native.h2_objects import RequestStream
from llmsim.protocol.native.h2_validation import HEADER_EVENTS, check_header_block

__all__ = ["ReceivingConnection"]

# Module globals, compared by identity (see h2_fastpath).
_SERVER_OPEN = ConnectionState.SERVER_OPEN
_OPEN = StreamState.OPEN
_HALF_CLOSED_REMOTE = StreamState.HALF_CLOSED_REMOTE
_RECV_HEADERS = ConnectionInputs.RECV_HEADERS
_MAX_CONCURRENT_STREAMS, _INITIAL_WINDOW_SIZE = SettingCodes.MAX_CONCURRENT_STREAMS, SettingCodes.INITIAL_WINDOW_SIZE


class ReceivingConnection(h2.connection.H2Connection):
    """h2's connection, receiving an ordinary request's frames directly (see the module
    docstring).  :class:`.h2_fastpath.ServerConnection` sets the attributes below."""

    decoder: CachingDecoder
    #: Streams whose request head is a remembered, ordinary block (by stream id, until
    #: the handler takes it): the handler makes its request of it once.
    plain_requests: dict[int, Block]
    #: Requests answered with RST_STREAM PROTOCOL_ERROR so far (the handler charges them
    #: to the client's reset budget).
    stream_errors = 0

    def _receive_data_frame(self, frame: DataFrame) -> tuple[list[Frame], list[h2.events.Event]]:
        """h2's own; on an OPEN stream, :func:`.h2_inbound.request_data`."""
        stream = self._data_stream(frame.stream_id)
        if stream is None:
            return super()._receive_data_frame(frame)
        flags = frame.flags._flags  # (hyperframe's ``flow_controlled_length``, on the flag set itself)
        data = frame.data
        length = len(data) + frame.pad_length + 1 if "PADDED" in flags else len(data)
        return [], request_data(self, stream, data, length, "END_STREAM" in flags)

    def _receive_request_data(self, frame: RequestData) -> tuple[list[Frame], list[h2.events.Event]]:
        """A DATA frame :class:`.h2_inbound.InboundFrames` made no hyperframe object of
        (no padding): on an OPEN stream :func:`.h2_inbound.request_data` takes its
        fields as they are; anywhere else the hyperframe frame goes to h2's own."""
        stream = self._data_stream(frame.stream_id)
        if stream is None:
            return super()._receive_data_frame(frame.parsed())
        data = frame.data
        return [], request_data(self, stream, data, len(data), frame.end_stream)

    def _data_stream(self, stream_id: int) -> H2Stream | None:
        """The stream DATA on ``stream_id`` goes to by :func:`.h2_inbound.request_data`:
        OPEN with its head received, on a connection in SERVER_OPEN; else None."""
        stream = self.streams.get(stream_id)
        if stream is None or self.state_machine.state is not _SERVER_OPEN:
            return None
        machine = stream.state_machine
        return stream if machine.state is _OPEN and machine.headers_received else None

    def _receive_headers_frame(self, frame: HeadersFrame) -> tuple[list[Frame], list[h2.events.Event]]:
        """h2's own, then the header block check h2 would have made inside it (see
        :meth:`_receive_headers`)."""
        return self._receive_headers(frame.stream_id, frame.data, "END_STREAM" in frame.flags._flags, frame)

    def _receive_request_headers(self, frame: RequestHeaders) -> tuple[list[Frame], list[h2.events.Event]]:
        """A HEADERS frame :class:`.h2_inbound.InboundFrames` made no hyperframe object
        of (END_HEADERS, no padding or priority): :meth:`_receive_headers` takes its
        fields as they are (h2's path needs the frame itself only for a PRIORITY flag)."""
        return self._receive_headers(frame.stream_id, frame.data, frame.end_stream, frame)

    def _receive_headers(
        self, sid: int, block_bytes: bytes, end_stream: bool, frame: HeadersFrame | RequestHeaders
    ) -> tuple[list[Frame], list[h2.events.Event]]:
        """h2's ``_receive_headers_frame`` (:meth:`_receive_header_block`), then the header
        block check h2 would have made inside it.

        A malformed request (RFC 9113 section 8.1.1: a bad pseudo-header, field or
        ``content-length``) that has decoded (so HPACK state is intact) and opened its
        stream is a *stream* error: RST_STREAM PROTOCOL_ERROR, and no event; h2 would
        have closed the connection, ending every other stream too.  Anything else h2
        raises (HPACK, stream ids, the stream limit, trailers) stays a connection error.
        """
        opening = sid not in self.streams and sid > self.highest_inbound_stream_id
        try:
            frames, events, block = self._receive_header_block(sid, block_bytes, end_stream, frame, opening)
            if block is not None and block.plain and type(events[0]) is h2.events.RequestReceived:
                self.plain_requests[sid] = block  # checked when it was first seen
            elif check_header_block(events) and block is not None:
                block.plain = True
                block.content_length = self.streams[sid]._expected_content_length
                self.plain_requests[sid] = block
        except ProtocolError:
            stream = self.streams.get(sid)
            if not opening or stream is None or stream.state_machine.state not in (_OPEN, _HALF_CLOSED_REMOTE):
                raise
            self.reset_stream(sid, ErrorCodes.PROTOCOL_ERROR)
            self.stream_errors += 1
            return [], []
        return frames, events

    def _receive_header_block(
        self, sid: int, block_bytes: bytes, end_stream: bool, frame: HeadersFrame | RequestHeaders, opening: bool
    ) -> tuple[list[Frame], list[h2.events.Event], Block | None]:
        """h2 4.x's ``_receive_headers_frame`` (its events, and the block the decoder
        remembers for this frame's, if any), where a stream opened by a remembered
        ordinary request head is made by :func:`.h2_inbound.open_request`."""
        if sid not in self.streams:
            # (Settings.max_concurrent_streams: the current value, read as
            # Settings.__getitem__ reads it, without its two Python calls.)
            max_open_streams = self.local_settings._settings[_MAX_CONCURRENT_STREAMS][0]
            value = self.open_inbound_streams
            if (value + 1) > max_open_streams:
                raise TooManyStreamsError(f"Max inbound streams is {max_open_streams}, {value} open")
        block = self.decoder.remembered(block_bytes)
        if block is None:
            headers = _decode_headers(self.decoder, block_bytes)
            block = self.decoder.take_last()  # (this frame's block, if remembered now)
        else:  # (what decoding it returns, without the two calls; it would change nothing)
            headers = list(block.fields)
        # (RECV_HEADERS leaves SERVER_OPEN as it is, with no event.)
        events = [] if self.state_machine.state is _SERVER_OPEN else self.state_machine.process_input(_RECV_HEADERS)
        priority = isinstance(frame, HeadersFrame) and "PRIORITY" in frame.flags._flags
        if block is not None and block.plain and opening and sid & 1 and not priority:
            assert isinstance(headers, list)
            events.extend(open_request(self, self._new_request_stream(sid), block, headers, end_stream))
            return [], events, block
        stream = self._get_or_create_stream(sid, AllowedStreamIDs(not self.config.client_side))
        frames, stream_events = stream.receive_headers(headers, end_stream, self.config.header_encoding)
        if priority:
            assert isinstance(frame, HeadersFrame)  # (for mypy: priority says so)
            p_frames, p_events = self._receive_priority_frame(frame)
            assert isinstance(stream_events[0], HEADER_EVENTS)
            assert isinstance(p_events[0], h2.events.PriorityUpdated)
            stream_events[0].priority_updated = p_events[0]
            stream_events.extend(p_events)
            assert not p_frames
        return frames, events + stream_events, block

    def _new_request_stream(self, stream_id: int) -> RequestStream:
        """A new stream as h2's ``_begin_new_stream`` makes it (less its debug logs and
        the stream id checks :meth:`_receive_header_block` has made)."""
        stream = RequestStream(
            stream_id,
            config=self.config,
            # (Settings.initial_window_size: the current value, read as in _receive_header_block.)
            inbound_window_size=self.local_settings._settings[_INITIAL_WINDOW_SIZE][0],
            outbound_window_size=self.remote_settings._settings[_INITIAL_WINDOW_SIZE][0],
        )
        stream.max_outbound_frame_size = self.max_outbound_frame_size
        return stream
