"""The receive side's use of h2's and hpack's insides: frames parsed once, HPACK
decoded once per distinct header block and table state, and an ordinary request's
stream opened and fed directly.

**Frames** (:class:`InboundFrames`): h2's ``FrameBuffer`` parses each frame by slicing
its buffer into memoryviews, building the frame class's ``Flags`` from its flag
definitions, and running the padding and priority parsers, all in Python.  For the two
frames of an ordinary request (DATA without padding, HEADERS with END_HEADERS and
neither padding nor priority, on a stream other than 0, complete in the buffer and
within the frame size limit) no hyperframe object is made at all: a
:class:`RequestFrame` (:class:`RequestHeaders` or :class:`RequestData`: three slots,
the stream, the payload and END_STREAM) goes to the connection, whose frame dispatch
table sends it to its own handlers (:class:`.h2_fastpath.ServerConnection`); where they
need h2's generic path, :meth:`RequestFrame.parsed` makes the frame hyperframe would
have made (the same class, attributes and ``Flags``).  Everything else (CONTINUATION,
padding, priority, a header block still open, control frames) goes through h2's own
code, which raises what it always raised.

**HPACK** (:class:`CachingDecoder`): a client that sends the same request over and
over (a load generator, an SDK in a loop) sends the same header block: after its first
request every field is either indexed (a reference to the dynamic table) or a literal
that is *not* added to the table (nghttp2 writes ``:path`` and ``content-length`` so).
Decoding such a block leaves the decoder's state as it was, so the same bytes decode to
the same fields for as long as that state stays the same.  hpack's decoder is pure
Python (a call per field and per integer, a ``log.debug`` per field, Huffman decoding
of every literal): about a sixth of the server's work on a small request.

:class:`CachingDecoder` remembers the fields of each block whose decoding changed
nothing, keyed by the block's bytes, and forgets them all whenever anything a decoding
depends on changes: an entry added to the dynamic table (and the evictions it causes),
a table size update (from the client, or set by the server), or the limits h2 sets on
the decoder (``max_header_list_size``, ``max_allowed_table_size``).  A block that
changed the table as it decoded is not remembered: decoding it again would not do the
same.  A block that fails to decode is not remembered either; it fails each time as it
did, through hpack.  So a hit returns exactly what hpack would have returned (the same
field objects) and the decoder ends in exactly the state hpack would have left.

**Streams** (:func:`open_request`, :func:`request_data`): for a HEADERS frame opening a
stream with a remembered ordinary request head, and for DATA on an open stream, h2 runs
its state machines (an enum-keyed table lookup, a validation flags object and a debug
log per input) for transitions whose effects are a few attributes and an event; those
are set directly, and every check that can fail (flow control, ``content-length``) is
h2's own method, called in h2's order.

This leans on h2 4.x, hyperframe 6.x and hpack 4.x as they are inside (the frame
classes' attributes; ``HeaderTable.add`` and the ``maxsize`` setter as the only ways
the dynamic table changes; the stream state machine's transitions and attributes),
which ``pyproject.toml``'s pin of h2 fixes; ``tests/protocol/native/test_h2_inbound.py``
and ``test_h2_open_request.py`` check them against h2 and hpack.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any, TypeVar

from h2.connection import H2Connection
from h2.events import DataReceived, Event, RequestReceived, StreamEnded
from h2.frame_buffer import FrameBuffer
from h2.stream import H2Stream, StreamState
from hpack import Decoder, HeaderTuple
from hpack.struct import Header
from hpack.table import HeaderTable
from hyperframe.flags import Flags
from hyperframe.frame import DataFrame, Frame, HeadersFrame

from llmsim.protocol.native.h2_objects import RequestStream

__all__ = [
    "MAX_BLOCKS",
    "MAX_BLOCK_SIZE",
    "Block",
    "CachingDecoder",
    "CountingTable",
    "InboundFrames",
    "RequestData",
    "RequestFrame",
    "RequestHeaders",
    "open_request",
    "request_data",
]

# --- frames -------------------------------------------------------------------------------

_HEADER = struct.Struct(">HBBBL")
_END_STREAM, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x4, 0x8, 0x20
# The flag names each frame class accepts (shared by the frames made here: Flags never
# changes its set of valid names).
_DATA_FLAGS = {flag.name for flag in DataFrame.defined_flags}
_HEADERS_FLAGS = {flag.name for flag in HeadersFrame.defined_flags}


class RequestFrame:
    """One of an ordinary request's two frames as read, before any hyperframe object is
    made of it: its stream, payload and END_STREAM flag (see the module docstring)."""

    __slots__ = ("data", "end_stream", "stream_id")

    data: bytes
    end_stream: bool
    stream_id: int

    def parsed(self) -> Frame:
        """The frame hyperframe would have parsed from the same bytes: the same class and
        attributes, the same ``Flags``."""
        raise NotImplementedError


class RequestHeaders(RequestFrame):
    """A HEADERS frame with END_HEADERS, without padding or priority."""

    __slots__ = ()

    def parsed(self) -> HeadersFrame:
        frame = _with_flags(
            HeadersFrame, _HEADERS_FLAGS, {"END_HEADERS", "END_STREAM"} if self.end_stream else {"END_HEADERS"}
        )
        frame.depends_on = 0
        frame.stream_weight = 0
        frame.exclusive = False
        return _with_payload(frame, self)


class RequestData(RequestFrame):
    """A DATA frame without padding."""

    __slots__ = ()

    def parsed(self) -> DataFrame:
        frame = _with_flags(DataFrame, _DATA_FLAGS, {"END_STREAM"} if self.end_stream else set())
        return _with_payload(frame, self)


_FrameT = TypeVar("_FrameT", DataFrame, HeadersFrame)


def _with_flags(cls: type[_FrameT], valid: set[str], names: set[str]) -> _FrameT:
    """A ``cls`` frame with the flags ``names`` set, as ``Frame.parse_flags`` makes them."""
    frame = _new(cls)
    flags: Flags = _new(Flags)
    flags._valid_flags = valid
    flags._flags = names
    frame.flags = flags
    return frame


def _with_payload(frame: _FrameT, raw: RequestFrame) -> _FrameT:
    frame.stream_id = raw.stream_id
    frame.body_len = len(raw.data)
    frame.pad_length = 0
    frame.data = raw.data
    return frame


class InboundFrames(FrameBuffer):
    """h2's frame buffer, yielding an ordinary request's frames as :class:`RequestFrame`
    objects (see the module docstring); every other frame as h2 parses it."""

    # (h2's loop hands each item to the connection's dispatch table, by class: the server
    # connection's has entries for the two RequestFrame classes.)
    def __next__(self) -> Frame | RequestFrame:  # type: ignore[override]
        data = self._data
        if len(data) < 9 or self._headers_buffer:
            return super().__next__()
        high, low, kind, bits, stream_id = _HEADER.unpack_from(data)
        length = high << 8 | low
        end = 9 + length
        stream_id &= 0x7FFFFFFF
        if not stream_id or len(data) < end or length > self.max_frame_size:
            return super().__next__()
        frame: RequestFrame
        if kind == 0x0 and not bits & _PADDED:
            frame = _new(RequestData)
        elif kind == 0x1 and bits & _END_HEADERS and not bits & (_PADDED | _PRIORITY):
            frame = _new(RequestHeaders)
        else:
            return super().__next__()
        frame.stream_id = stream_id
        frame.end_stream = bool(bits & _END_STREAM)
        frame.data = bytes(data[9:end])
        del data[:end]
        return frame


_new = object.__new__


# --- HPACK --------------------------------------------------------------------------------

#: Distinct blocks remembered per connection at most (then they are all forgotten).
MAX_BLOCKS = 16
#: Longer blocks are never remembered: memory per connection stays small (at most
#: ``MAX_BLOCKS`` blocks of this size and the fields they decode to, which mostly share
#: the table's own bytes objects).
MAX_BLOCK_SIZE = 512


class CountingTable(HeaderTable):
    """hpack's dynamic table, counting its changes (``generation``)."""

    generation = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.generation += 1
        super().add(name, value)

    @property
    def maxsize(self) -> int:
        return self._maxsize

    @maxsize.setter
    def maxsize(self, newmax: int) -> None:
        self.generation += 1
        HeaderTable.maxsize.fset(self, newmax)  # type: ignore[attr-defined]


class Block:
    """A remembered header block: its fields, and what the connection has found out
    from the fields alone (valid as long as the block is remembered, since the same
    bytes decode to these fields until then)."""

    __slots__ = ("content_length", "fields", "head", "plain")

    def __init__(self, fields: tuple[HeaderTuple, ...]) -> None:
        self.fields = fields
        self.plain = False  # an ordinary request head (h2_validation._plain_request)
        # Once plain: the content-length h2 found in it (None if it has none).
        self.content_length: int | None = None
        self.head: Any = None  # the request head the handler made of it


class CachingDecoder(Decoder):
    """hpack's :class:`~hpack.Decoder`, decoding a repeated block once (see the module
    docstring).  Only the raw form h2 asks for (``raw=True``) is remembered."""

    def __init__(self, max_header_list_size: int) -> None:
        super().__init__(max_header_list_size)
        self.header_table = CountingTable()
        self.max_allowed_table_size = self.header_table.maxsize
        self._last: Block | None = None  # the last block decoded, if it is remembered
        self._blocks: dict[bytes, Block] = {}
        self._state = (0, max_header_list_size, self.max_allowed_table_size)

    def decode(self, data: bytes, raw: bool = False) -> Iterable[HeaderTuple]:
        table = self.header_table
        assert isinstance(table, CountingTable)
        state = (table.generation, self.max_header_list_size, self.max_allowed_table_size)
        blocks = self._blocks
        if state != self._state:
            blocks.clear()
            self._state = state
        elif raw:
            block = blocks.get(data)
            if block is not None:
                self._last = block
                return list(block.fields)
        self._last = None
        headers = super().decode(data, raw)
        if raw and table.generation == state[0] and len(data) <= MAX_BLOCK_SIZE:
            if len(blocks) >= MAX_BLOCKS:
                blocks.clear()
            assert isinstance(headers, list)
            self._last = blocks[bytes(data)] = Block(tuple(headers))
        return headers

    def remembered(self, data: bytes) -> Block | None:
        """The remembered block of ``data`` if the decoder's state is the one it was
        remembered in: then ``decode(data, raw=True)`` would return ``list(block.fields)``
        and change nothing, so the caller need not call it."""
        table = self.header_table
        assert isinstance(table, CountingTable)
        if (table.generation, self.max_header_list_size, self.max_allowed_table_size) != self._state:
            return None
        return self._blocks.get(data)

    def take_last(self) -> Block | None:
        """The block decoded last, if it is remembered; once."""
        block, self._last = self._last, None
        return block


# --- streams ------------------------------------------------------------------------------

_OPEN, _HALF_CLOSED_REMOTE = StreamState.OPEN, StreamState.HALF_CLOSED_REMOTE


def open_request(
    conn: H2Connection, stream: RequestStream, block: Block, headers: list[Header], end_stream: bool
) -> list[Event]:
    """The events of a HEADERS frame that opens ``stream`` (a new one, its id odd and
    above every stream the client opened, made as h2's ``_begin_new_stream`` makes it;
    no PRIORITY flag) with a remembered ordinary
    request head (``block``; ``headers``, as decoded): what h2's ``_begin_new_stream``
    and ``H2Stream.receive_headers`` do, without what has no effect here.

    The stream is registered as ``_begin_new_stream`` registers it (less its debug
    logs); its state machine takes ``RECV_HEADERS`` (and ``RECV_END_STREAM``) exactly
    as its transitions ``request_received`` (and ``stream_half_closed``) do, from IDLE to
    OPEN (to HALF_CLOSED_REMOTE), with the same events.  Skipped: the informational
    response check (a request has no ``:status``), and the validation flags and
    pipeline, which llmsim's configuration turns off (h2 returns ``list(headers)``).
    The expected ``content-length`` is the one h2 found in the block when it first saw
    it (``_initialize_content_length`` depends on nothing else: a new stream's
    ``request_method`` is None).
    """
    stream_id = stream.stream_id
    conn.streams[stream_id] = stream
    conn.highest_inbound_stream_id = stream_id
    machine = stream.state_machine
    machine.client = False
    machine.headers_received = True
    event = RequestReceived(stream_id=stream_id)
    events: list[Event] = [event]
    if end_stream:
        machine.state = _HALF_CLOSED_REMOTE
        event.stream_ended = ended = StreamEnded(stream_id=stream_id)
        events.append(ended)
    else:
        machine.state = _OPEN
    stream._expected_content_length = block.content_length
    event.headers = headers
    return events


def request_data(conn: H2Connection, stream: H2Stream, data: bytes, length: int, end_stream: bool) -> list[Event]:
    """The events of a DATA frame (``data``, ``length`` bytes flow-controlled, with
    END_STREAM or not) on ``stream``, which is OPEN (its request head received) on a
    connection in SERVER_OPEN: what h2's ``_receive_data_frame`` and
    ``H2Stream.receive_data`` do, in the same order (so a flow-control or
    ``content-length`` error leaves the same state behind), with the state machines'
    no-op transitions (``RECV_DATA`` from SERVER_OPEN to SERVER_OPEN, from OPEN to
    OPEN) made by hand, and ``RECV_END_STREAM`` as ``stream_half_closed`` makes it."""
    conn._inbound_flow_control_window_manager.window_consumed(length)
    event = DataReceived(stream_id=stream.stream_id)
    stream._inbound_window_manager.window_consumed(length)
    stream._track_content_length(len(data), end_stream)
    events: list[Event] = [event]
    if end_stream:
        stream.state_machine.state = _HALF_CLOSED_REMOTE
        event.stream_ended = ended = StreamEnded(stream_id=stream.stream_id)
        events.append(ended)
    event.data = data
    event.flow_controlled_length = length
    return events
