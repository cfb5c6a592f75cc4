"""The receive side's use of h2's and hpack's insides: frames parsed once, and HPACK
decoded once per distinct header block and table state.

**Frames** (:class:`InboundFrames`): h2's ``FrameBuffer`` parses each frame by slicing
its buffer into memoryviews, building the frame class's ``Flags`` from its flag
definitions, and running the padding and priority parsers, all in Python.  For the two
frames of an ordinary request (DATA without padding, HEADERS with END_HEADERS and
neither padding nor priority, on a stream other than 0, complete in the buffer and
within the frame size limit) the same frame objects are made directly: the same class,
the same attributes with the same values, the same ``Flags``.  Everything else
(CONTINUATION, padding, priority, a header block still open, control frames) goes
through h2's own code, which raises what it always raised.

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

This leans on h2 4.x, hyperframe 6.x and hpack 4.x as they are inside (the frame
classes' attributes; ``HeaderTable.add`` and the ``maxsize`` setter as the only ways
the dynamic table changes), which ``pyproject.toml``'s pin of h2 fixes;
``tests/protocol/native/test_h2_inbound.py`` checks both against h2 and hpack.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from h2.frame_buffer import FrameBuffer
from hpack import Decoder, HeaderTuple
from hpack.table import HeaderTable
from hyperframe.flags import Flags
from hyperframe.frame import DataFrame, Frame, HeadersFrame

__all__ = ["MAX_BLOCKS", "MAX_BLOCK_SIZE", "Block", "CachingDecoder", "InboundFrames"]

# --- frames -------------------------------------------------------------------------------

_HEADER = struct.Struct(">HBBBL")
_END_STREAM, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x4, 0x8, 0x20
# The flag names each frame class accepts (shared by the frames made here: Flags never
# changes its set of valid names).
_DATA_FLAGS = {flag.name for flag in DataFrame.defined_flags}
_HEADERS_FLAGS = {flag.name for flag in HeadersFrame.defined_flags}


def _flags(valid: set[str], names: set[str]) -> Flags:
    """``Flags(defined_flags)`` with ``names`` added, as ``Frame.parse_flags`` makes it."""
    flags: Flags = object.__new__(Flags)
    flags._valid_flags = valid
    flags._flags = names
    return flags


class InboundFrames(FrameBuffer):
    """h2's frame buffer, making an ordinary request's frames directly (see the
    module docstring)."""

    def __next__(self) -> Frame:
        data = self._data
        if len(data) < 9 or self._headers_buffer:
            return super().__next__()
        high, low, kind, bits, stream_id = _HEADER.unpack_from(data)
        length = high << 8 | low
        end = 9 + length
        stream_id &= 0x7FFFFFFF
        if not stream_id or len(data) < end or length > self.max_frame_size:
            return super().__next__()
        frame: DataFrame | HeadersFrame
        if kind == 0x0 and not bits & _PADDED:
            frame = object.__new__(DataFrame)
            frame.flags = _flags(_DATA_FLAGS, {"END_STREAM"} if bits & _END_STREAM else set())
        elif kind == 0x1 and bits & _END_HEADERS and not bits & (_PADDED | _PRIORITY):
            frame = object.__new__(HeadersFrame)
            names = {"END_HEADERS", "END_STREAM"} if bits & _END_STREAM else {"END_HEADERS"}
            frame.flags = _flags(_HEADERS_FLAGS, names)
            frame.depends_on = 0
            frame.stream_weight = 0
            frame.exclusive = False
        else:
            return super().__next__()
        frame.stream_id = stream_id
        frame.body_len = length
        frame.pad_length = 0
        frame.data = bytes(data[9:end])
        del data[:end]
        return frame


# --- HPACK --------------------------------------------------------------------------------

#: Distinct blocks remembered per connection at most (then they are all forgotten).
MAX_BLOCKS = 16
#: Longer blocks are never remembered: memory per connection stays small (at most
#: ``MAX_BLOCKS`` blocks of this size and the fields they decode to, which mostly share
#: the table's own bytes objects).
MAX_BLOCK_SIZE = 512


class _CountingTable(HeaderTable):
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

    __slots__ = ("fields", "head", "plain")

    def __init__(self, fields: tuple[HeaderTuple, ...]) -> None:
        self.fields = fields
        self.plain = False  # an ordinary request head (h2_fastpath._plain_request)
        self.head: Any = None  # the request head the handler made of it


class CachingDecoder(Decoder):
    """hpack's :class:`~hpack.Decoder`, decoding a repeated block once (see the module
    docstring).  Only the raw form h2 asks for (``raw=True``) is remembered."""

    def __init__(self, max_header_list_size: int) -> None:
        super().__init__(max_header_list_size)
        self.header_table = _CountingTable()
        self.max_allowed_table_size = self.header_table.maxsize
        self._last: Block | None = None  # the last block decoded, if it is remembered
        self._blocks: dict[bytes, Block] = {}
        self._state = (0, max_header_list_size, self.max_allowed_table_size)

    def decode(self, data: bytes, raw: bool = False) -> Iterable[HeaderTuple]:
        table = self.header_table
        assert isinstance(table, _CountingTable)
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

    def take_last(self) -> Block | None:
        """The block decoded last, if it is remembered; once."""
        block, self._last = self._last, None
        return block
