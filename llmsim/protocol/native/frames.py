"""Hand-built framing for the per-token path: HTTP/2 DATA frames and HTTP/1.1 chunks,
and the response HEADERS of each HTTP/2 stream.

Why: h2's ``send_data`` builds a hyperframe ``DataFrame`` (with its ``Flags`` set and
``Padding`` mixin), runs two state machines, logs twice and serializes, for every frame;
with one frame per stream per engine step that was about a third of the server's CPU
time at 2,000 paced streams.  The bytes themselves are trivial: a 9-byte header and
the payload.

How it stays exact: h2 remains the owner of every piece of state.  We only skip what
has no effect in the states we send from, and we do the rest ourselves exactly as h2's
``H2Connection.send_data`` / ``H2Stream.send_data`` / ``end_stream`` would:

* The connection must be ``SERVER_OPEN`` and the stream ``OPEN`` or
  ``HALF_CLOSED_REMOTE``; there ``SEND_DATA`` is a no-op transition of both state
  machines (h2/connection.py and h2/stream.py transition tables), so skipping it changes
  nothing.  In any other state :func:`sendable_stream` says None and the caller uses
  h2's own ``send_data``, which raises exactly what it always did.
* ``SEND_END_STREAM`` is *not* skipped: it closes (or half-closes) the stream and
  records who closed it, so it goes through h2's stream state machine.
* Flow control: a frame of n bytes subtracts n from the stream's and the connection's
  ``outbound_flow_control_window``, the very attributes h2's WINDOW_UPDATE and
  SETTINGS_INITIAL_WINDOW_SIZE handling add to; a frame is never larger than
  ``min(stream window, connection window)`` (checked) nor ``max_outbound_frame_size``
  (h2 updates that when the peer's MAX_FRAME_SIZE setting is acknowledged).
* No padding, so ``flow_controlled_length`` is the payload length.

The response head (:func:`send_headers`) goes the same way: h2's ``send_headers``
transitions its state machines, copies and scans the header list, builds validation
flags, a ``HeadersFrame`` and a ``Flags`` set, and serializes, about 8 % of the
server's CPU time at one short response per request.  Here the stream's ``SEND_HEADERS``
(and ``SEND_END_STREAM``) still go through h2's state machine, the block is encoded by
the connection's own HPACK encoder as h2 would (its outbound normalization and
validation are off in llmsim's configuration), and split at the stream's
``max_outbound_frame_size`` into HEADERS and CONTINUATION frames as h2 splits it.

``tests/protocol/test_fastpath_frames.py`` checks this against h2 itself: the same
sequence of writes, window updates and settings sent through h2's ``send_data`` and
through here leaves identical windows and states, and a client H2Connection parses
every frame (and ``tests/protocol/test_http2_header_validation.py`` the HEADERS).

HTTP/1.1 chunks (:func:`chunk`) are h11's ``ChunkedWriter`` output written directly:
once h11 has sent the response head and chose chunked framing, a ``Data`` event changes
nothing in h11's state (``SEND_BODY`` to ``SEND_BODY``) and the writer is stateless.
"""

from __future__ import annotations

import struct

import h2.connection
import h2.stream
from h2.connection import ConnectionState
from h2.stream import StreamInputs, StreamState
from h2.utilities import extract_method_header

__all__ = [
    "DATA_HEADER",
    "END_STREAM_FLAG",
    "chunk",
    "data_frames",
    "h11_sends_chunked",
    "send_data",
    "send_headers",
    "sendable_stream",
]

#: A frame header: 24-bit length (as 16 + 8 bits), type (0x0 for DATA), flags, stream id (RFC 9113 4.1).
DATA_HEADER = struct.Struct(">HBBBL")
END_STREAM_FLAG = 0x1
_DATA, _HEADERS, _CONTINUATION, _END_HEADERS = 0x0, 0x1, 0x9, 0x4

# Module globals, compared by identity: enum attribute lookups and Enum.__hash__ are
# Python-level calls, too slow for a path taken once per stream per engine step.
_SERVER_OPEN = ConnectionState.SERVER_OPEN
_OPEN = StreamState.OPEN
_HALF_CLOSED_REMOTE = StreamState.HALF_CLOSED_REMOTE
_SEND_END_STREAM = StreamInputs.SEND_END_STREAM
_SEND_HEADERS = StreamInputs.SEND_HEADERS
_PACK_HEADER = DATA_HEADER.pack


def sendable_stream(conn: h2.connection.H2Connection, stream_id: int) -> h2.stream.H2Stream | None:
    """h2's stream ``stream_id`` if DATA may go out on it now without h2's checks; None
    if h2 would refuse (closed stream, connection not open): then call h2 itself."""
    if conn.state_machine.state is not _SERVER_OPEN:
        return None
    stream = conn.streams.get(stream_id)
    if stream is None:
        return None
    state = stream.state_machine.state
    return stream if state is _HALF_CLOSED_REMOTE or state is _OPEN else None


def data_frames(out: list[bytes], stream_id: int, data: bytes, max_frame: int, end_stream: bool) -> None:
    """Append to ``out`` the DATA frames carrying ``data`` (each payload at most
    ``max_frame`` bytes), END_STREAM on the last; ``b""`` with ``end_stream`` is one
    empty frame.  Pure framing: no flow-control or state bookkeeping."""
    _split_frames(out, stream_id, data, max_frame, _DATA, _DATA, 0, END_STREAM_FLAG if end_stream else 0)


def _split_frames(
    out: list[bytes],
    stream_id: int,
    block: bytes,
    max_frame: int,
    first_kind: int,
    rest_kind: int,
    first_flags: int,
    last_flags: int,
) -> None:
    """Append the frames that carry ``block`` in payloads of at most ``max_frame``
    bytes: the first of type ``first_kind`` with ``first_flags``, the others of
    ``rest_kind``, ``last_flags`` on the last (a single frame has both; ``b""`` is one
    empty frame).  DATA is DATA throughout with END_STREAM last; a header block is
    HEADERS (END_STREAM) then CONTINUATION, END_HEADERS last."""
    size = len(block)
    pack = _PACK_HEADER
    if size <= max_frame:
        out.append(pack(size >> 8, size & 0xFF, first_kind, first_flags | last_flags, stream_id))
        if size:
            out.append(block)
        return
    view = memoryview(block)
    last = (size - 1) // max_frame * max_frame  # offset of the last frame's payload
    for offset in range(0, size, max_frame):
        payload = view[offset : offset + max_frame]
        length = len(payload)
        kind, flags = (first_kind, first_flags) if offset == 0 else (rest_kind, 0)
        if offset == last:
            flags |= last_flags
        out.append(pack(length >> 8, length & 0xFF, kind, flags, stream_id))
        out.append(payload.tobytes())


def send_data(
    out: list[bytes],
    conn: h2.connection.H2Connection,
    stream: h2.stream.H2Stream,
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
        if size <= conn.max_outbound_frame_size:  # the usual case: one frame, inlined
            out.append(_PACK_HEADER(size >> 8, size & 0xFF, 0, END_STREAM_FLAG if end_stream else 0, stream.stream_id))
            out.append(data)
        else:
            data_frames(out, stream.stream_id, data, conn.max_outbound_frame_size, end_stream)
    else:
        out.append(_PACK_HEADER(0, 0, 0, END_STREAM_FLAG if end_stream else 0, stream.stream_id))
    if end_stream:
        stream.state_machine.process_input(_SEND_END_STREAM)


def send_headers(
    out: list[bytes],
    conn: h2.connection.H2Connection,
    stream: h2.stream.H2Stream,
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
    block = conn.encoder.encode(headers)
    first_flags = END_STREAM_FLAG if end_stream else 0
    _split_frames(out, stream.stream_id, block, max_frame, _HEADERS, _CONTINUATION, first_flags, _END_HEADERS)
    if end_stream:
        stream.state_machine.process_input(_SEND_END_STREAM)
    stream.request_method = extract_method_header(headers)


# --- HTTP/1.1 ------------------------------------------------------------------------


def chunk(out: list[bytes], data: bytes) -> None:
    """Append ``data`` to ``out`` as one chunk of a chunked body, as h11's
    ``ChunkedWriter`` writes it (nothing for ``b""``: an empty chunk ends the body)."""
    if data:
        out.append(b"%x\r\n" % len(data))
        out.append(data)
        out.append(b"\r\n")


def h11_sends_chunked(conn: object) -> bool:
    """Whether h11 frames the body being sent with chunked encoding (so that its
    ``Data`` events can be written with :func:`chunk` instead).  False when unsure
    (an h11 without these internals): then every ``Data`` goes through h11."""
    writer = getattr(conn, "_writer", None)
    return type(writer).__name__ == "ChunkedWriter" and type(writer).__module__ == "h11._writers"
