"""The one module that touches h2's internals: the fast path of the server's HTTP/2.

Everything here leans on h2 4.x as it is inside (its state machines, its stream
objects and window attributes, its private receive methods), which is why
``pyproject.toml`` pins ``h2 < 5`` and names this module.  The rest of the native
server uses h2's public API and calls these functions for the rest.

Why: h2 does per frame and per request work llmsim does not need, and on the paths
taken once per stream per engine step that work was most of the server's CPU time:

* ``send_data`` builds a hyperframe ``DataFrame`` (with its ``Flags`` set and
  ``Padding`` mixin), runs two state machines, logs twice and serializes, for every
  frame (about a third of the server's CPU time at 2,000 paced streams), when the
  bytes are a 9-byte header and the payload (built by :mod:`.frames`).
* ``send_headers`` transitions its state machines, copies and scans the header list,
  builds validation flags, a ``HeadersFrame`` and a ``Flags`` set, and serializes:
  about 8 % of the server's CPU time at one short response per request.
* Receiving, h2 formats ``repr(frame)`` for a trace log on every frame, even though
  its logger discards it; validates every inbound header block through a chain of
  eight generators; and counts the open streams, walking all of them, on each new one.

How it stays exact: h2 remains the owner of every piece of state.  Only what has no
effect in the states we act in is skipped, and the rest is done exactly as h2 would:

* DATA goes out by hand only while the connection is ``SERVER_OPEN`` and the stream
  ``OPEN`` or ``HALF_CLOSED_REMOTE``: there ``SEND_DATA`` is a no-op transition of both
  state machines (h2/connection.py and h2/stream.py transition tables).  In any other
  state :func:`sendable_stream` says None and the caller uses h2's own ``send_data``,
  which raises exactly what it always did.  ``SEND_END_STREAM`` is *not* skipped: it
  closes (or half-closes) the stream and records who closed it, so it goes through
  h2's stream state machine.
* Flow control: a frame of n bytes subtracts n from the stream's and the connection's
  ``outbound_flow_control_window``, the very attributes h2's WINDOW_UPDATE and
  SETTINGS_INITIAL_WINDOW_SIZE handling add to; a frame is never larger than
  ``min(stream window, connection window)`` (checked) nor ``max_outbound_frame_size``
  (h2 updates that when the peer's MAX_FRAME_SIZE setting is acknowledged).  No
  padding, so ``flow_controlled_length`` is the payload length.
* A response head (:func:`send_headers`) still takes the stream's ``SEND_HEADERS``
  (and ``SEND_END_STREAM``) through h2's state machine; the block is encoded by the
  connection's own HPACK encoder as h2 would (its outbound normalization and
  validation are off in llmsim's configuration), and split at the stream's
  ``max_outbound_frame_size`` into HEADERS and CONTINUATION frames as h2 splits it.
* Inbound header blocks: h2's validation is switched off, and
  :func:`_check_header_block` runs right after h2 has otherwise handled the HEADERS
  frame, where h2 would have validated: an ordinary request head is checked in one
  pass (:func:`_plain_request`), and every other block (trailers, cookies, a ``host``
  or ``te`` field, CONNECT, anything unusual or malformed) goes through h2's own
  pipeline, which raises exactly what it always raised, so h2 answers with the same
  GOAWAY.  A block :mod:`.h2_inbound` remembers (the same bytes, so the same fields)
  that passed as an ordinary request head is not checked again.

``tests/protocol/native/test_fastpath_frames.py`` checks the DATA path against h2
itself (the same writes, window updates and settings sent through h2's ``send_data``
and through here leave identical bytes, windows and states), and
``tests/protocol/native/test_http2_header_validation.py`` the header blocks both ways.
"""

from __future__ import annotations

import re

import h2.config
import h2.connection
import h2.events
from h2.connection import ConnectionState
from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError, StreamClosedError, StreamIDTooLowError
from h2.settings import SettingCodes, Settings
from h2.stream import H2Stream, StreamInputs, StreamState
from h2.utilities import (
    CONNECTION_HEADERS,
    HeaderValidationFlags,
    extract_method_header,
    normalize_inbound_headers,
    validate_headers,
)
from hpack.struct import Header
from hyperframe.frame import Frame, HeadersFrame, RstStreamFrame

from llmsim.protocol.native.frames import FRAME_HEADER, data_frames, header_block_frames
from llmsim.protocol.native.h2_inbound import Block, CachingDecoder, InboundFrames

__all__ = [
    "H2Stream",
    "ServerConnection",
    "connection_window",
    "last_stream_id",
    "send_buffered",
    "send_data",
    "send_data_now",
    "send_headers",
    "send_window",
    "sendable_stream",
    "server_connection",
    "stream_window",
]

# Module globals, compared by identity: enum attribute lookups and Enum.__hash__ are
# Python-level calls, too slow for a path taken once per stream per engine step.
_SERVER_OPEN = ConnectionState.SERVER_OPEN
_OPEN = StreamState.OPEN
_HALF_CLOSED_REMOTE = StreamState.HALF_CLOSED_REMOTE
_SEND_END_STREAM = StreamInputs.SEND_END_STREAM
_SEND_HEADERS = StreamInputs.SEND_HEADERS
_PACK_HEADER = FRAME_HEADER.pack

# --- the connection ---------------------------------------------------------------------

# Inbound header blocks are validated by _check_header_block; outbound ones are ours,
# lower-cased and filtered by h2_headers.response_headers, so h2 need not check them again.
_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
    validate_inbound_headers=False,
    normalize_inbound_headers=False,
)
#: What h2 is told the stream limit is: the handler enforces the advertised one itself.
_UNLIMITED_STREAMS = 2**31 - 1


class ServerConnection(h2.connection.H2Connection):
    """h2's server connection, with the per-request costs above made cheap, a malformed
    request a stream error, and a bounded memory of closed streams.

    ``MAX_CLOSED_STREAMS``: h2 remembers how each closed stream was closed, up to 65,536
    of them per connection (about 115 bytes each: 7.5 MB on a long-lived connection).
    nginx and h2o keep a few hundred.  A late frame on a stream forgotten here is still
    answered as RFC 9113 section 5.1 allows: WINDOW_UPDATE and RST_STREAM are ignored,
    DATA is credited to the connection window and answered with RST_STREAM
    (h2's ``_handle_data_on_closed_stream``), and HEADERS is a connection error.
    """

    MAX_CLOSED_STREAMS = 256
    _next_walk = 64
    #: Requests answered with RST_STREAM PROTOCOL_ERROR so far (the handler charges them
    #: to the client's reset budget).
    stream_errors = 0

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config)
        # A request's frames made directly, a repeated header block decoded once
        # (h2_inbound); h2 sets the decoder's limits as ever.
        self.incoming_buffer = InboundFrames(server=True)
        self.decoder: CachingDecoder = CachingDecoder(self.decoder.max_header_list_size)
        #: Streams whose request head is a remembered, ordinary block (by stream id,
        #: until the handler takes it): the handler makes its request of it once.
        self.plain_requests: dict[int, Block] = {}

    @property
    def open_inbound_streams(self) -> int:
        """h2 counts the open inbound streams on each HEADERS that opens one, walking
        every stream it holds (and forgetting the closed ones as it goes): O(streams)
        per request, about 0.15 ms at 500 streams on one connection.  llmsim lifts h2's
        limit and refuses with REFUSED_STREAM by its own count (see
        :func:`server_connection`), so the number is never compared with anything that
        matters.  Here the walk runs only once the table has doubled since the last one,
        so closed streams are still forgotten (at most about as many linger as are open,
        plus 64), in amortized O(1); in between, the table size is returned, an upper
        bound of the true count."""
        if len(self.streams) < self._next_walk:
            return len(self.streams)
        count = super().open_inbound_streams
        self._next_walk = max(64, 2 * len(self.streams))
        return count

    def _receive_frame(self, frame: Frame) -> list[h2.events.Event]:
        """h2 4.x's own, less ``logger.trace("Received frame: %s", repr(frame))``."""
        events: list[h2.events.Event]
        try:
            frames, events = self._frame_dispatch_table[frame.__class__](frame)
        except StreamClosedError as e:
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = e.error_code
                self._prepare_for_sending([f])
                events = e._events
            else:
                raise
        except StreamIDTooLowError as e:
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = ErrorCodes.STREAM_CLOSED
                self._prepare_for_sending([f])
                events = []
            elif self._stream_is_closed_by_end(e.stream_id):
                raise StreamClosedError(e.stream_id) from e
            else:
                raise
        else:
            self._prepare_for_sending(frames)
        return events

    def _receive_headers_frame(self, frame: HeadersFrame) -> tuple[list[Frame], list[h2.events.Event]]:
        """h2's own, then the header block check h2 would have made inside it.

        A malformed request (RFC 9113 section 8.1.1: a bad pseudo-header, field or
        ``content-length``) that has decoded (so HPACK state is intact) and opened its
        stream is a *stream* error: RST_STREAM PROTOCOL_ERROR, and no event; h2 would
        have closed the connection, ending every other stream too.  Anything else h2
        raises (HPACK, stream ids, the stream limit, trailers) stays a connection error.
        """
        sid = frame.stream_id
        opening = sid not in self.streams and sid > self.highest_inbound_stream_id
        try:
            frames, events = super()._receive_headers_frame(frame)
            block = self.decoder.take_last()  # (this frame's block: h2 has just decoded it)
            if block is not None and block.plain and type(events[0]) is h2.events.RequestReceived:
                self.plain_requests[sid] = block  # checked when it was first seen
            elif _check_header_block(events) and block is not None:
                block.plain = True
                self.plain_requests[sid] = block
        except ProtocolError:
            stream = self.streams.get(sid)
            if not opening or stream is None or stream.state_machine.state not in (_OPEN, _HALF_CLOSED_REMOTE):
                raise
            self.reset_stream(sid, ErrorCodes.PROTOCOL_ERROR)
            self.stream_errors += 1
            return [], []
        return frames, events


def server_connection(settings_limit: int, max_header_bytes: int, upgrade_settings: bytes | None) -> ServerConnection:
    """A server connection whose first SETTINGS advertise ``settings_limit`` streams.

    h2 treats a HEADERS frame beyond MAX_CONCURRENT_STREAMS as a *connection* error.
    RFC 9113 section 5.1.2 wants a stream error (REFUSED_STREAM), so once the SETTINGS
    frame is serialized h2's own limit is lifted and the handler refuses.

    Raises ``ValueError`` or h2's ``ProtocolError`` if ``upgrade_settings`` (the
    client's ``HTTP2-Settings`` header) cannot be decoded.
    """
    conn = ServerConnection(config=_CONFIG)

    def local_settings(limit: int) -> Settings:
        return Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: limit,
                SettingCodes.MAX_HEADER_LIST_SIZE: max_header_bytes,
            },
        )

    conn.local_settings = local_settings(settings_limit)
    if upgrade_settings is None:
        conn.initiate_connection()
    else:
        conn.initiate_upgrade_connection(upgrade_settings)
    conn.local_settings = local_settings(_UNLIMITED_STREAMS)
    return conn


def last_stream_id(conn: h2.connection.H2Connection) -> int:
    """The highest stream id the client opened: what a GOAWAY names."""
    return conn.highest_inbound_stream_id


# --- flow-control windows -----------------------------------------------------------------


def connection_window(conn: h2.connection.H2Connection) -> int:
    """What the connection's flow-control window lets through now."""
    return conn.outbound_flow_control_window


def stream_window(stream: H2Stream) -> int:
    """What ``stream``'s own window lets through now (negative after a smaller
    SETTINGS_INITIAL_WINDOW_SIZE)."""
    return stream.outbound_flow_control_window


def send_window(conn: h2.connection.H2Connection, stream: H2Stream) -> int:
    """How many DATA bytes may go out on ``stream`` now (both windows)."""
    return min(conn.outbound_flow_control_window, stream.outbound_flow_control_window)


# --- sending ------------------------------------------------------------------------------


def sendable_stream(conn: h2.connection.H2Connection, stream_id: int) -> H2Stream | None:
    """h2's stream ``stream_id`` if DATA may go out on it now without h2's checks; None
    if h2 would refuse (closed stream, connection not open): then call h2 itself."""
    if conn.state_machine.state is not _SERVER_OPEN:
        return None
    stream = conn.streams.get(stream_id)
    if stream is None:
        return None
    state = stream.state_machine.state
    return stream if state is _HALF_CLOSED_REMOTE or state is _OPEN else None


def send_buffered(out: list[bytes], conn: h2.connection.H2Connection, stream: H2Stream, chunks: list[bytes]) -> bool:
    """The buffered per-token case: the ``chunks`` buffered on a response, joined, as
    :func:`send_data_now` sends one piece; True (and ``chunks`` emptied) if they went
    into ``out``, else nothing changed (the general path takes over)."""
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if not send_data_now(out, conn, stream, data):
        return False
    chunks.clear()
    return True


def send_data_now(out: list[bytes], conn: h2.connection.H2Connection, stream: H2Stream, data: bytes) -> bool:
    """The per-token write, framed at once: if ``data`` (not empty) fits one DATA frame
    and both windows, and both state machines are where :func:`sendable_stream`
    requires, append its frame (without END_STREAM) to ``out`` and account it as
    :func:`send_data` does; otherwise change nothing and return False (the response
    buffers it for the general path).  One call per token, so everything is inlined.
    """
    size = len(data)
    state = stream.state_machine.state
    if not (
        (state is _HALF_CLOSED_REMOTE or state is _OPEN)
        and size <= conn.max_outbound_frame_size
        and size <= conn.outbound_flow_control_window
        and size <= stream.outbound_flow_control_window
        and conn.state_machine.state is _SERVER_OPEN
    ):
        return False
    conn.outbound_flow_control_window -= size
    stream.outbound_flow_control_window -= size
    out.append(_PACK_HEADER(size >> 8, size & 0xFF, 0, 0, stream.stream_id))
    out.append(data)
    return True


def send_data(
    out: list[bytes],
    conn: h2.connection.H2Connection,
    stream: H2Stream,
    data: bytes,
    end_stream: bool,
) -> None:
    """Send ``data`` (``b""`` only with ``end_stream``) on ``stream``, which
    :func:`sendable_stream` returned, as h2's ``send_data`` would: frames appended to
    ``out``, windows reduced, END_STREAM through h2's stream state machine.

    ``data`` must fit the flow-control window (the caller took at most
    ``min(stream window, connection window)`` bytes); it is split at the peer's
    MAX_FRAME_SIZE.
    """
    size = len(data)
    if size:
        window = min(conn.outbound_flow_control_window, stream.outbound_flow_control_window)
        if size > window:
            raise AssertionError(f"{size} bytes do not fit the flow-control window of {window}")
        conn.outbound_flow_control_window -= size
        stream.outbound_flow_control_window -= size
    data_frames(out, stream.stream_id, data, conn.max_outbound_frame_size, end_stream)
    if end_stream:
        stream.state_machine.process_input(_SEND_END_STREAM)


def send_headers(
    out: list[bytes],
    conn: h2.connection.H2Connection,
    stream: H2Stream,
    headers: list[tuple[bytes, bytes]],
    end_stream: bool,
) -> None:
    """Send the response head ``headers`` (``:status`` first, not 1xx) on ``stream``,
    which :func:`sendable_stream` returned and which has sent no HEADERS yet, as h2's
    ``send_headers`` would: frames appended to ``out``, the stream's state machine and
    ``request_method`` updated.

    (An informational head or trailers take other state transitions: leave them to h2.)
    """
    stream.state_machine.process_input(_SEND_HEADERS)
    max_frame = stream.max_outbound_frame_size
    assert max_frame is not None  # set by the connection as it creates the stream
    header_block_frames(out, stream.stream_id, conn.encoder.encode(headers), max_frame, end_stream)
    if end_stream:
        stream.state_machine.process_input(_SEND_END_STREAM)
    stream.request_method = extract_method_header(headers)


# --- inbound header blocks ----------------------------------------------------------------

_HEADER_EVENTS = (
    h2.events.RequestReceived,
    h2.events.TrailersReceived,
    h2.events.ResponseReceived,
    h2.events.InformationalResponseReceived,
)
_REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
#: Fields h2 rejects, rewrites or checks against others: their blocks take h2's path.
_SPECIAL_NAMES = CONNECTION_HEADERS | {b"te", b"cookie", b"host"}
#: A regular field name h2 accepts: no colon, no upper case, nothing outside 0x21-0x7e.
_PLAIN_NAME = re.compile(rb"[\x21-\x39\x3b-\x40\x5b-\x7e]+")
_MAX_KNOWN_NAMES = 512
#: Values are checked joined by 0x01 with 0x01 around: whitespace next to a 0x01 is at a
#: value's edge, and NUL, CR and LF become 0x02.  (A value holding 0x01 or 0x02 may
#: look bad and take h2's path; a bad one never looks good.)
_VALUE_MARKS = bytes.maketrans(b"\t\x00\r\n", b" \x02\x02\x02")
#: Regular field names already found plain (bounded; only ever a speed-up).
_known_names: set[bytes] = set()


def _check_header_block(events: list[h2.events.Event]) -> bool:
    """Validate and normalize the header block h2 has just attached to its event, as
    h2's ``H2Stream._process_received_headers`` would have (raising h2's
    ``ProtocolError`` for a malformed block, which h2 answers with GOAWAY).  True if
    it is an ordinary request head (:func:`_plain_request`), left as it is.

    The first event is the stream's headers event: h2 lists the connection's events
    first, and there are none for HEADERS on an open connection.  (PUSH_PROMISE, the
    other header block h2 validates, a server refuses before decoding it.)
    """
    event = events[0]
    assert isinstance(event, _HEADER_EVENTS)
    headers = event.headers
    assert headers is not None  # h2 has just set it
    if type(event) is h2.events.RequestReceived and _plain_request(headers):
        return True  # h2 would have accepted it unchanged
    flags = HeaderValidationFlags(
        is_client=False,
        is_trailer=isinstance(event, h2.events.TrailersReceived),
        is_response_header=not isinstance(event, (h2.events.RequestReceived, h2.events.TrailersReceived)),
        is_push_promise=False,
    )
    event.headers = list(validate_headers(normalize_inbound_headers(headers, flags), flags))
    return False


def _plain_request(headers: list[Header]) -> bool:
    """Whether ``headers`` is a request head h2 accepts and leaves as it is: first the
    four request pseudo-headers, each once (:path not empty, :method not CONNECT), then
    regular fields with plain names (no cookie, host, te or connection-specific field),
    and no value with NUL, CR, LF or whitespace at either end.  False says nothing: h2
    decides then."""
    pseudo = dict(headers[:4])
    if pseudo.keys() != _REQUEST_PSEUDO or not pseudo[b":path"] or pseudo[b":method"] == b"CONNECT":
        return False
    return _plain_names([header[0] for header in headers[4:]]) and _plain_values([header[1] for header in headers])


def _plain_names(names: list[bytes]) -> bool:
    """Whether every regular field name is plain: one set lookup for the names a client
    sends on every request, the regex only for new ones."""
    if _known_names.issuperset(names):
        return True
    for name in names:
        if name in _SPECIAL_NAMES or _PLAIN_NAME.fullmatch(name) is None:
            return False
    if len(_known_names) < _MAX_KNOWN_NAMES:
        _known_names.update(names)
    return True


def _plain_values(values: list[bytes]) -> bool:
    """Whether no value holds NUL, CR or LF or starts or ends with whitespace, in a few
    C-level passes over all of them (see ``_VALUE_MARKS``)."""
    marked = b"\x01".join([b"", *values, b""]).translate(_VALUE_MARKS)
    return b"\x02" not in marked and b"\x01 " not in marked and b" \x01" not in marked
