"""h2_hpack.CachingEncoder: a remembered response head is exactly what hpack would
encode, and is forgotten when the dynamic table changes or a table size is set.

Every block is decoded by a real hpack Decoder, in order, as the client would: a stale
block (indices into a table that has since changed, or a missing table size update)
decodes to other fields or fails.  The differential tests run the same operations on a
stock hpack Encoder and require the same bytes.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import pytest
from h2.settings import SettingCodes
from hpack import Decoder, Encoder
from hypothesis import given
from hypothesis import strategies as st

from llmsim.protocol.native.h2_fastpath import send_response_head, sendable_stream, server_connection
from llmsim.protocol.native.h2_headers import response_headers
from llmsim.protocol.native.h2_hpack import CachingEncoder

SSE = ((b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"))
JSON = ((b"content-type", b"application/json"), (b"x-request-id", b"abc"))
REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/v1/chat/completions"), (b":authority", b"t")]


def head(status: int, headers: tuple[tuple[bytes, bytes], ...]) -> list[tuple[bytes, bytes]]:
    return response_headers(status, headers)


def _size_updates(block: bytes) -> list[int]:
    """The dynamic table size updates at the start of a block (RFC 7541 sections 5.1 and
    6.3: a 5-bit prefix, then 7-bit continuation bytes)."""
    return _split_size_updates(block)[0]


def _without_size_updates(block: bytes) -> bytes:
    return block[_split_size_updates(block)[1] :]


def _split_size_updates(block: bytes) -> tuple[list[int], int]:
    sizes, offset = [], 0
    while offset < len(block) and block[offset] & 0xE0 == 0x20:
        value, offset = block[offset] & 0x1F, offset + 1
        if value == 31:
            shift = 0
            while True:
                byte, offset = block[offset], offset + 1
                value += (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
        sizes.append(value)
    return sizes, offset


def test_a_repeated_head_is_encoded_once_and_decodes_each_time() -> None:
    encoder, decoder = CachingEncoder(), Decoder()
    blocks = [encoder.encode_head(200, SSE)[0] for _ in range(4)]
    assert blocks[1] == blocks[2] == blocks[3] != blocks[0]  # the first adds its fields to the table
    assert blocks[2] is blocks[1]  # remembered
    for block in blocks:
        assert decoder.decode(block, raw=True) == head(200, SSE)


def test_a_table_change_by_another_block_forgets_the_remembered_head() -> None:
    """Trailers (h2 encodes them with the same encoder) add an entry: the SSE fields
    move one index down, and the head must say so."""
    encoder, decoder = CachingEncoder(), Decoder()
    for _ in range(3):
        assert decoder.decode(encoder.encode_head(200, SSE)[0], raw=True) == head(200, SSE)
    remembered = encoder.encode_head(200, SSE)[0]
    decoder.decode(remembered, raw=True)
    decoder.decode(encoder.encode([(b"grpc-status", b"0")]), raw=True)
    block = encoder.encode_head(200, SSE)[0]
    assert block != remembered
    assert decoder.decode(block, raw=True) == head(200, SSE)


@pytest.mark.parametrize("size", [0, 200])
def test_a_header_table_size_update_forgets_the_remembered_head(size: int) -> None:
    """A SETTINGS_HEADER_TABLE_SIZE of 0 empties the table, one of 200 keeps the SSE
    fields: either way the next block starts with the size update (and with 0 spells
    the fields out again), and only that one (the update is sent once)."""
    encoder, decoder = CachingEncoder(), Decoder()
    for _ in range(3):
        decoder.decode(encoder.encode_head(200, SSE)[0], raw=True)
    encoder.header_table_size = size
    first = encoder.encode_head(200, SSE)[0]
    assert first[0] & 0xE0 == 0x20  # a dynamic table size update
    assert decoder.decode(first, raw=True) == head(200, SSE)
    again = encoder.encode_head(200, SSE)[0]
    assert again[0] & 0xE0 != 0x20
    assert decoder.decode(again, raw=True) == head(200, SSE)
    assert decoder.header_table.maxsize == size


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("head"), st.sampled_from([200, 404, 103]), st.sampled_from([SSE, JSON, ()])),
        st.tuples(st.just("encode"), st.sampled_from([[(b"grpc-status", b"0")], list(SSE), [(b"x-a", b"b" * 300)]])),
        st.tuples(st.just("resize"), st.sampled_from([0, 64, 100, 200, 4096])),
    ),
    max_size=30,
)


@given(OPERATIONS)
def test_heads_are_encoded_exactly_as_by_hpack(operations: list[tuple]) -> None:
    """Any mix of heads, other blocks and table size changes: the same bytes as a stock
    Encoder but for the table size updates a block starts with, which are RFC 7541
    section 4.2's (if the size changed since the last block: the smallest size it changed
    to, then the final one if it differs), where hpack 4.2 signals every change and
    forgets a pending one when the same size is set again; and a Decoder reads every
    block back."""
    ours, reference, decoder = CachingEncoder(), Encoder(), Decoder()
    size, changes = 4096, []
    for operation in operations:
        if operation[0] == "resize":
            ours.header_table_size = reference.header_table_size = operation[1]
            if operation[1] != size:
                size = operation[1]
                changes.append(size)
            continue
        if operation[0] == "head":
            fields = head(operation[1], operation[2])
            block, method = ours.encode_head(operation[1], operation[2])
            assert method is None
        else:
            fields = operation[1]
            block = ours.encode(fields)
        expected = [] if not changes else [min(changes)] if min(changes) == size else [min(changes), size]
        changes = []
        updates = _size_updates(block)
        assert updates == expected
        reference_block = reference.encode(fields)
        assert _without_size_updates(block) == _without_size_updates(reference_block)
        assert decoder.decode(block, raw=True) == fields
        assert list(ours.header_table.dynamic_entries) == list(reference.header_table.dynamic_entries)


def test_a_client_header_table_size_setting_reaches_the_remembered_head() -> None:
    """Through the server's connection: the client lowers SETTINGS_HEADER_TABLE_SIZE
    between two responses; the server's next head carries the update, and the client's
    h2 decodes every head."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    server = server_connection(100, 65536, None)
    heads = []
    for index in range(6):
        sid = 2 * index + 1
        if index == 3:
            client.update_settings({SettingCodes.HEADER_TABLE_SIZE: 0})
        client.send_headers(sid, REQUEST, end_stream=True)
        server.receive_data(client.data_to_send())
        stream = sendable_stream(server, sid)
        assert stream is not None
        out = [server.data_to_send()]
        send_response_head(out, server, stream, 200, SSE, True)
        events = client.receive_data(b"".join(out))
        heads += [list(event.headers) for event in events if isinstance(event, h2.events.ResponseReceived)]
    assert heads == [head(200, SSE)] * 6
    assert server.encoder.header_table_size == 0


@pytest.mark.parametrize(
    ("settings", "signalled"),
    [
        ([100], [100]),
        ([100, 100], [100]),  # the same size twice before a block: still signalled (hpack 4.2 dropped it)
        ([100, 100, 100], [100]),
        ([100, 50, 120], [50, 120]),  # the smallest since the last block, then the final one
        ([50, 120, 120], [50, 120]),
        ([4096], []),  # no change at all: nothing to signal
    ],
)
def test_a_table_size_set_before_a_block_is_signalled_at_its_start(settings: list[int], signalled: list[int]) -> None:
    encoder, decoder = CachingEncoder(), Decoder()
    for size in settings:
        encoder.header_table_size = size
    block = encoder.encode_head(200, SSE)[0]
    assert _size_updates(block) == signalled
    decoder.max_allowed_table_size = max(settings)
    assert decoder.decode(block, raw=True) == head(200, SSE)
    assert decoder.header_table_size == (signalled[-1] if signalled else 4096)
    assert _size_updates(encoder.encode_head(200, SSE)[0]) == []  # sent once
