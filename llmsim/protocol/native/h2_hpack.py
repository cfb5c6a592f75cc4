"""The send side's HPACK: a response head encoded once per distinct head and table state.

A server answers request after request with the same head (``:status 200``, an SSE
``content-type``, ``cache-control``): after the first one has put its fields in the
encoder's dynamic table, every later encoding of it is a few indexed references, the
same bytes each time, and leaves the table as it was.  hpack's encoder is pure Python
(a table search, a ``log.debug`` and a few integer encodings per field): about a tenth
of the protocol side of a short streaming request.

:class:`CachingEncoder` remembers the block of each head (status and the application's
header tuple) whose encoding changed nothing, and forgets them all whenever the table
changes: an entry added (by any encoding, h2's own for trailers and informational heads
included) or a table size set (the client's SETTINGS_HEADER_TABLE_SIZE, acknowledged).
A block encoded while a table size update was pending starts with that update, which is
sent once: it is not remembered.  So a hit returns exactly the bytes hpack would have
made, and the encoder stays in exactly the state hpack would have left it in.
``tests/protocol/native/test_h2_hpack.py`` checks this against hpack and a decoder.
"""

from __future__ import annotations

from collections.abc import Sequence

from h2.utilities import extract_method_header
from hpack import Encoder

from llmsim.protocol.native.h2_headers import response_headers
from llmsim.protocol.native.h2_inbound import MAX_BLOCK_SIZE, MAX_BLOCKS, CountingTable

__all__ = ["CachingEncoder", "Head"]

#: An encoded response head: the header block, and the ``:method`` field of its fields
#: (what h2 records as the stream's ``request_method`` when it sends them; None but for
#: an odd application header).
Head = tuple[bytes, bytes | None]


class CachingEncoder(Encoder):
    """hpack's :class:`~hpack.Encoder`, encoding a repeated response head once (see the
    module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.header_table = CountingTable()
        self._heads: dict[tuple[int, Sequence[tuple[bytes, bytes]]], Head] = {}
        self._generation = 0  # the table's generation the remembered heads belong to

    @property
    def header_table_size(self) -> int:
        return int(self.header_table.maxsize)

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        """As hpack's, but a size set again before the next block keeps the update pending:
        hpack 4.2 records one only when the size differs from the last (``resized``), so a
        client's second SETTINGS_HEADER_TABLE_SIZE of the same value (h2 sets the size on
        every acknowledged one) dropped the first one's update, and the next block went out
        without the dynamic table size update RFC 7541 section 4.2 requires (nghttp2 fails
        the connection then).  What is signalled is what 4.2 asks for: the smallest size
        since the last block, then the final one if it differs."""
        table = self.header_table
        pending = self.table_size_changes
        table.maxsize = value
        if table.resized or pending:
            smallest = min([*pending, value])
            self.table_size_changes = [smallest] if smallest == value else [smallest, value]
            table.resized = True

    def encode_head(self, status: int, headers: Sequence[tuple[bytes, bytes]]) -> Head:
        """The block of ``response_headers(status, headers)``, encoded as
        :meth:`encode` would (changing the table as it would), and its ``:method``."""
        table = self.header_table
        assert isinstance(table, CountingTable)
        heads = self._heads
        key = (status, headers)
        if table.generation != self._generation:
            heads.clear()
            self._generation = table.generation
        try:
            head = heads.get(key)
        except TypeError:  # (a list of headers, not a tuple: not remembered)
            return self._encode_head(status, headers)
        if head is not None:
            return head
        resizing = table.resized
        head = self._encode_head(status, headers)
        if not resizing and table.generation == self._generation and len(head[0]) <= MAX_BLOCK_SIZE:
            if len(heads) >= MAX_BLOCKS:
                heads.clear()
            heads[key] = head
        return head

    def _encode_head(self, status: int, headers: Sequence[tuple[bytes, bytes]]) -> Head:
        fields = response_headers(status, headers)
        return self.encode(fields), extract_method_header(fields)
