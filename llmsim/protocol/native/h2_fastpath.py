"""The one module that touches h2's internals: the fast path of the server's HTTP/2
(with its receiving half, :mod:`.h2_receive`, and the objects of :mod:`.h2_inbound`
and :mod:`.h2_objects`).

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
* A response head (:func:`send_response_head`) takes the stream's ``SEND_HEADERS`` as
  h2's transition does (in OPEN and HALF_CLOSED_REMOTE it only marks a server's first
  headers sent; anything else goes through h2's state machine), and ``SEND_END_STREAM``
  likewise (from HALF_CLOSED_REMOTE it closes the stream, sent by us); the block is encoded by the
  connection's own HPACK encoder as h2 would (its outbound normalization and
  validation are off in llmsim's configuration; a head already encoded in the same
  table state is not encoded again, :mod:`.h2_hpack`), and split at the stream's
  ``max_outbound_frame_size`` into HEADERS and CONTINUATION frames as h2 splits it.
* Inbound header blocks: h2's validation is switched off, and
  :func:`.h2_validation.check_header_block` runs right after h2 has otherwise handled
  the HEADERS frame, where h2 would have validated: an ordinary request head is checked
  in one pass, and every other block (trailers, cookies, a ``host``
  or ``te`` field, CONNECT, anything unusual or malformed) goes through h2's own
  pipeline, which raises exactly what it always raised, so h2 answers with the same
  GOAWAY.  A block :mod:`.h2_inbound` remembers (the same bytes, so the same fields)
  that passed as an ordinary request head is not checked again, and the stream it
  opens is made directly (:func:`.h2_inbound.open_request`, as h2's stream and its state
  machine would make it); so is the DATA of an open stream
  (:func:`.h2_inbound.request_data`).  Neither frame is made a hyperframe object unless
  h2's own path needs it (:class:`.h2_inbound.RequestFrame`; :mod:`.h2_receive`).

``tests/protocol/native/test_fastpath_frames.py`` checks the DATA path against h2
itself (the same writes, window updates and settings sent through h2's ``send_data``
and through here leave identical bytes, windows and states), and
``tests/protocol/native/test_http2_header_validation.py`` the header blocks both ways.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Sequence

import h2.config
import h2.connection
import h2.events
from h2.connection import AllowedStreamIDs, ConnectionState
from h2.errors import ErrorCodes
from h2.exceptions import StreamClosedError, StreamIDTooLowError
from h2.settings import SettingCodes, Settings
from h2.stream import STREAM_OPEN, H2Stream, H2StreamStateMachine, StreamClosedBy, StreamInputs, StreamState
from h2.windows import WindowManager
from hyperframe.frame import Frame, RstStreamFrame, WindowUpdateFrame

from llmsim.protocol.native.frames import FRAME_HEADER, data_frames, header_block_frames
from llmsim.protocol.native.h2_hpack import CachingEncoder
from llmsim.protocol.native.h2_inbound import (
    CachingDecoder,
    InboundFrames,
    RequestData,
    RequestHeaders,
)
from llmsim.protocol.native.h2_objects import ConnectionMachine, RequestStream, StreamMachine, request_stream
from llmsim.protocol.native.h2_receive import ReceivingConnection
from llmsim.speedups import installer

__all__ = [
    "H2Stream",
    "ServerConnection",
    "connection_window",
    "last_stream_id",
    "send_buffered",
    "send_data",
    "send_data_now",
    "send_response_head",
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
_CLOSED = StreamState.CLOSED
_SEND_END_STREAM = StreamInputs.SEND_END_STREAM
_SEND_HEADERS = StreamInputs.SEND_HEADERS
_CLOSED_BY_SEND_END_STREAM = StreamClosedBy.SEND_END_STREAM
# h2's closed streams are a SizeLimitDict (an OrderedDict trimming itself on each
# insertion, in Python): the walk inserts without the trim, then trims once.
_remember = collections.OrderedDict.__setitem__
_PACK_HEADER = FRAME_HEADER.pack
# A DATA frame's header without flags and under 64 KiB: FRAME_HEADER with its first byte
# (the length's top byte), type and flags zero, as padding: two arguments to pack, not five.
_PACK_DATA_HEADER = struct.Struct(">xH2xL").pack

# --- the connection ---------------------------------------------------------------------

# Inbound header blocks are validated by h2_validation.check_header_block; outbound ones are ours,
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


class ServerConnection(ReceivingConnection):
    """h2's server connection, with the per-request costs above made cheap, a malformed
    request a stream error, and a bounded memory of closed streams.

    ``MAX_CLOSED_STREAMS``: h2 remembers how each closed stream was closed, up to 65,536
    of them per connection (about 115 bytes each: 7.5 MB on a long-lived connection).
    nginx and h2o keep a few hundred.  A late frame on a stream forgotten here is still
    answered as RFC 9113 section 5.1 allows: WINDOW_UPDATE and RST_STREAM are ignored,
    DATA is credited to the connection window and answered with RST_STREAM
    (h2's ``_handle_data_on_closed_stream``), and HEADERS is a connection error.
    """

    # What the per-token write reads, in slots (see .h2_objects).
    __slots__ = ("max_outbound_frame_size", "outbound_flow_control_window", "state_machine")

    MAX_CLOSED_STREAMS = 256
    _next_walk = 64

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config)
        self.state_machine = ConnectionMachine()  # (h2's own, just made and still IDLE, replaced)
        # A request's frames made directly, a repeated header block decoded once
        # (h2_inbound); h2 sets the decoder's limits as ever.
        self.incoming_buffer = InboundFrames(server=True)
        self.decoder = CachingDecoder(self.decoder.max_header_list_size)
        # A repeated response head encoded once (h2_hpack); h2 resizes its table as ever.
        self.encoder: CachingEncoder = CachingEncoder()
        self.plain_requests = {}  # (see ReceivingConnection)
        # An ordinary request's frames, as InboundFrames yields them (no hyperframe object).
        self._frame_dispatch_table[RequestHeaders] = self._receive_request_headers  # type: ignore[index]
        self._frame_dispatch_table[RequestData] = self._receive_request_data  # type: ignore[index]

    def _begin_new_stream(self, stream_id: int, allowed_ids: AllowedStreamIDs) -> H2Stream:
        """h2's, its new stream made a :class:`.h2_objects.RequestStream` (as
        :func:`.h2_inbound.open_request` makes every ordinary one), so that the per-token
        write reads its fields by slot whichever path opened it."""
        stream = request_stream(super()._begin_new_stream(stream_id, allowed_ids))
        self.streams[stream_id] = stream
        return stream

    @property
    def open_inbound_streams(self) -> int:
        """h2 counts the open inbound streams on each HEADERS that opens one, walking
        every stream it holds (and forgetting the closed ones as it goes): O(streams)
        per request, about 0.15 ms at 500 streams on one connection.  llmsim lifts h2's
        limit and refuses with REFUSED_STREAM by its own count (see
        :func:`server_connection`), so the number is never compared with anything that
        matters.  Here the walk runs only once the table has doubled since the last one,
        so closed streams are still forgotten (at most about as many linger as are open,
        plus 64), in amortized O(1); the table size is returned, an upper bound of the
        true count.  The walk forgets what h2's ``_open_streams`` forgets, in the same
        order (every CLOSED stream, remembering how it was closed), without h2's two
        property calls per stream; h2's ``SizeLimitDict`` of closed streams is trimmed
        once after the walk instead of after each one (the same newest
        ``MAX_CLOSED_STREAMS`` remain, in the same order)."""
        streams = self.streams
        if len(streams) >= self._next_walk:
            closed = [sid for sid, stream in streams.items() if stream.state_machine.state is _CLOSED]
            remembered = self._closed_streams
            assert isinstance(remembered, collections.OrderedDict)
            for sid in closed:
                _remember(remembered, sid, streams.pop(sid).state_machine.stream_closed_by)
            for _ in range(len(remembered) - self.MAX_CLOSED_STREAMS):
                remembered.popitem(last=False)
            self._next_walk = max(64, 2 * len(streams))
        return len(streams)

    def acknowledge_received_data(self, acknowledged_size: int, stream_id: int) -> None:
        """h2's own (once per request body frame), without its two debug logs, its lookup
        by exception and its frame lists when no WINDOW_UPDATE is due."""
        stream = self.streams.get(stream_id)
        if stream is None or stream_id <= 0 or acknowledged_size < 0:
            super().acknowledge_received_data(acknowledged_size, stream_id)
            return
        increment = _process_bytes(self._inbound_flow_control_window_manager, acknowledged_size)
        stream_open = STREAM_OPEN[stream.state_machine.state]  # (H2Stream.open, without the property call)
        stream_increment = _process_bytes(stream._inbound_window_manager, acknowledged_size) if stream_open else 0
        if increment or stream_increment:
            frames: list[Frame] = []
            if increment:
                frames.append(WindowUpdateFrame(0, window_increment=increment))
            if stream_increment:
                frames.append(WindowUpdateFrame(stream_id, window_increment=stream_increment))
            self._prepare_for_sending(frames)

    def _receive_frame(self, frame: Frame) -> list[h2.events.Event]:
        """h2 4.x's own, less ``logger.trace("Received frame: %s", repr(frame))`` and the
        call that sends no frames."""
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
            if frames:  # (_prepare_for_sending does nothing without: a request's frames make none)
                self._prepare_for_sending(frames)
        return events


def _end_stream_sent(machine: H2StreamStateMachine) -> None:
    """A frame with END_STREAM is sent: ``SEND_END_STREAM`` through the stream's state
    machine.  From HALF_CLOSED_REMOTE (the request complete, the usual case) h2's
    transition closes the stream and its ``send_end_stream`` records who closed it:
    done here without the table lookup; from any other state, by h2's machine."""
    if machine.state is _HALF_CLOSED_REMOTE:
        machine.state = _CLOSED
        machine.stream_closed_by = _CLOSED_BY_SEND_END_STREAM
    else:
        machine.process_input(_SEND_END_STREAM)


def _process_bytes(manager: WindowManager, size: int) -> int | None:
    """``manager.process_bytes(size)``: h2 counts the bytes processed and runs its
    algorithm (``WindowManager._maybe_update_window``), which returns an increment only
    when the window is exhausted or half of it is processed; otherwise the count is all
    that changes, and that is done here without the two calls."""
    processed = manager._bytes_processed + size
    if manager.current_window_size and processed < manager.max_window_size // 2:
        manager._bytes_processed = processed
        return 0
    return manager.process_bytes(size)


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
    sid = stream.stream_id
    out.append(_PACK_DATA_HEADER(size, sid) if size < 0x10000 else _PACK_HEADER(size >> 8, size & 0xFF, 0, 0, sid))
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
        _end_stream_sent(stream.state_machine)


def send_response_head(
    out: list[bytes],
    conn: ServerConnection,
    stream: H2Stream,
    status: int,
    headers: Sequence[tuple[bytes, bytes]],
    end_stream: bool,
) -> None:
    """Send the response head ``response_headers(status, headers)`` (not 1xx) on
    ``stream``, which :func:`sendable_stream` returned and which has sent no HEADERS
    yet, as h2's ``send_headers`` would: frames appended to ``out``, the stream's state
    machine and ``request_method`` updated.  The block is encoded once per distinct head
    and HPACK table state (:class:`.h2_hpack.CachingEncoder`).

    (An informational head or trailers take other state transitions: leave them to h2.)
    """
    machine = stream.state_machine
    state = machine.state
    if (state is _HALF_CLOSED_REMOTE or state is _OPEN) and machine.client is False and not machine.headers_sent:
        # SEND_HEADERS from OPEN or HALF_CLOSED_REMOTE (sendable_stream's states) keeps
        # the state, and its ``response_sent`` only marks the headers sent on a server's
        # stream that has sent none (its event is dropped, as send_headers drops it):
        # done here without the state machine's table lookup and event.
        machine.headers_sent = True
    else:
        machine.process_input(_SEND_HEADERS)  # (raises what h2 raises)
    max_frame = stream.max_outbound_frame_size
    assert max_frame is not None  # set by the connection as it creates the stream
    block, method = conn.encoder.encode_head(status, headers)
    header_block_frames(out, stream.stream_id, block, max_frame, end_stream)
    if end_stream:
        _end_stream_sent(machine)
    stream.request_method = method


# The compiled per-token write (native/h2_write.c) reads these classes' slots by offset.
if (_install := installer("install_h2_objects")) is not None:
    _install(RequestStream, StreamMachine, ServerConnection, ConnectionMachine)
