"""The receive side's shortcuts (``h2_inbound``) against h2's and hpack's own code.

* :class:`InboundFrames` must make exactly the frames h2's ``FrameBuffer`` makes (same
  class, attributes, flags, and the same errors; an ordinary request's frames once
  ``RequestFrame.parsed`` has made them hyperframe's), whatever the frames and however
  the bytes are split into reads.
* :class:`CachingDecoder` must decode every block exactly as a fresh hpack decoder fed
  the same blocks does (fields, errors, and the dynamic table afterwards), through
  repeated blocks, entries added and evicted, table size updates from either side, and
  limit changes; and it must actually decode a repeated block only once.
* The handler makes the request of a remembered block once, and forgets nothing it
  should not: refused streams leave nothing behind, and ``with_body`` keeps every field.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import hpack
import pytest
import trio
import trio.testing
from h2.frame_buffer import FrameBuffer
from hpack import Decoder, Encoder, HeaderTuple, NeverIndexedHeaderTuple
from hypothesis import given
from hypothesis import strategies as st

from llmsim.api.http import HttpRequest, ResponseStream
from llmsim.protocol.native.h2_headers import with_body
from llmsim.protocol.native.h2_inbound import MAX_BLOCK_SIZE, CachingDecoder, InboundFrames, RequestFrame
from llmsim.protocol.native.http2 import Http2Handler
from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# --- frames --------------------------------------------------------------------------------


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return struct.pack(">HBBBL", len(payload) >> 8, len(payload) & 0xFF, kind, flags, stream_id) + payload


# DATA: plain, END_STREAM, padded (also with too much padding), unknown flag bits, stream 0
DATA_FRAMES = [
    frame(0x0, flags, sid, payload)
    for flags in (0x0, 0x1, 0x8, 0x9, 0x2, 0xF1)
    for sid in (1, 3, 0, 2**31 + 5)
    for payload in (b"", b"abc", b"\x02ab\x00\x00", b"\x05ab", b"x" * 300)
]
# HEADERS: END_HEADERS or not (then CONTINUATION), END_STREAM, PADDED, PRIORITY
HEADERS_FRAMES = [
    frame(0x1, flags, sid, payload)
    for flags in (0x4, 0x5, 0x0, 0x1, 0xC, 0x24, 0x25, 0xF4, 0x2D)
    for sid in (1, 3, 0)
    for payload in (b"", b"\x82\x86", b"\x01\x00\x00\x00\x03\x0f\x82", b"\x00\x00\x00\x00\x03\x82")
]
OTHER_FRAMES = [
    frame(0x9, 0x0, 1, b"\x84"),  # CONTINUATION
    frame(0x9, 0x4, 1, b"\x84"),
    frame(0x9, 0x4, 3, b"\x84"),
    frame(0x4, 0x0, 0, b""),  # SETTINGS
    frame(0x4, 0x1, 0, b""),
    frame(0x6, 0x0, 0, b"12345678"),  # PING
    frame(0x8, 0x0, 1, b"\x00\x00\x01\x00"),  # WINDOW_UPDATE
    frame(0x3, 0x0, 1, b"\x00\x00\x00\x08"),  # RST_STREAM
    frame(0x2, 0x0, 3, b"\x00\x00\x00\x01\x10"),  # PRIORITY
    frame(0xFA, 0x3, 1, b"ext"),  # unknown type
    frame(0x0, 0x0, 1, b"y" * 70),  # over the frame size limit below
]
FRAMES = st.sampled_from(DATA_FRAMES + HEADERS_FRAMES + OTHER_FRAMES)


def parsed(buffer: FrameBuffer, reads: list[bytes]) -> list[Any]:
    """Every frame ``buffer`` yields for ``reads`` (or the error that stopped it)."""
    out: list[Any] = []
    try:
        for data in reads:
            buffer.add_data(data)
            for item in buffer:
                if isinstance(item, RequestFrame):  # (what the connection's generic path gets of it)
                    item = item.parsed()
                flags = item.flags
                out.append((type(item), {k: v for k, v in vars(item).items() if k != "flags"}, vars(flags)))
    except Exception as exc:  # (compared with h2's)
        out.append((type(exc), str(exc)))
    return out


def compare_frames(frames: list[bytes], cuts: list[int], preface: bool) -> None:
    data = (PREFACE if preface else b"") + b"".join(frames)
    reads, start = [], 0
    for cut in sorted(cuts):
        reads.append(data[start:cut])
        start = max(start, cut)
    reads.append(data[start:])
    results = []
    for cls in (FrameBuffer, InboundFrames):
        buffer = cls(server=preface)
        buffer.max_frame_size = 64
        results.append(parsed(buffer, reads))
    assert results[0] == results[1]


@pytest.mark.parametrize("first", DATA_FRAMES + HEADERS_FRAMES + OTHER_FRAMES)
def test_each_kind_of_frame_is_made_exactly_as_by_h2s_frame_buffer(first: bytes) -> None:
    """Each frame alone, then followed by a DATA frame, whole or cut after its header."""
    for then in ([], [frame(0x0, 0x1, 5, b"{}")]):
        compare_frames([first, *then], [], False)
        compare_frames([first, *then], [10], True)


@given(st.lists(FRAMES, max_size=12), st.lists(st.integers(1, 80), max_size=6), st.booleans())
def test_random_frames_are_made_exactly_as_by_h2s_frame_buffer(
    frames: list[bytes], cuts: list[int], preface: bool
) -> None:
    compare_frames(frames, cuts, preface)


def test_an_ordinary_requests_frames_do_not_take_h2s_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = FrameBuffer.__next__

    def counted(self: FrameBuffer) -> Any:
        calls.append(1)
        return original(self)

    monkeypatch.setattr(FrameBuffer, "__next__", counted)
    buffer = InboundFrames(server=False)
    buffer.max_frame_size = 16384
    buffer.add_data(frame(0x1, 0x4, 1, b"\x82\x86\x84") + frame(0x0, 0x1, 1, b"{}"))
    assert [type(item).__name__ for item in buffer] == ["RequestHeaders", "RequestData"]
    assert len(calls) == 1  # only the end of the buffer (StopIteration)


# --- HPACK --------------------------------------------------------------------------------

NAMES = [b"accept", b"user-agent", b"x-long", b":path", b"content-length"]
VALUES = [b"*/*", b"a", b"b" * 40, b"/v1/chat/completions", b"154", b"\xff\x00"]
FIELD = st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES), st.booleans())

# An action: a block from the client's encoder (fields; never-indexed or not), the same
# bytes again, a table size change the encoder announces in its next block, a limit set
# on the decoder as h2 does after a SETTINGS ACK, or a block of raw bytes.
ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("encode"), st.lists(FIELD, max_size=5)),
        st.tuples(st.just("again"), st.integers(0, 20)),
        st.tuples(st.just("table"), st.sampled_from([0, 60, 100, 200, 4096])),
        st.tuples(st.just("list-limit"), st.sampled_from([60, 200, 65536])),
        st.tuples(st.just("table-limit"), st.sampled_from([0, 100, 4096])),
        st.tuples(
            st.just("raw"),
            st.sampled_from(
                [
                    b"\xbe",  # the newest dynamic entry (if any)
                    b"\xbe\xbf",
                    b"\x82\x20\x86",  # a size update after a field: an error
                    b"\x3f\xe1\x1f\x82",  # size update to 4096
                    b"\x3f\x45\x82",  # size update to 100
                    b"\x20\x82",  # size update to 0
                    b"\x82\xff\x80\x80",  # bad index
                    b"\x04\x03abc\x0f\x0d\x03154",  # literals without indexing
                    b"\x44\x03/xy",  # literal with indexing
                ]
            ),
        ),
    ),
    max_size=25,
)


def table_state(decoder: Decoder) -> tuple:
    table = decoder.header_table
    return list(table.dynamic_entries), table.maxsize, table._current_size


def outcome(decoder: Decoder, block: bytes) -> tuple:
    try:
        fields = decoder.decode(block, raw=True)
    except hpack.HPACKError as exc:
        # (Less the address in a message naming the decoder's memoryview, "<memory at 0x...>":
        # the two decoders' views are two objects, at the same address only as often as the
        # allocator reuses the first's.)
        return ("error", type(exc), re.sub(r" at 0x[0-9a-f]+", "", str(exc)), table_state(decoder))
    return ([(type(field), *field) for field in fields], table_state(decoder))


INDEXING = b"\x44\x03/xy"  # a literal added to the table
LONG = [(b"x-long", b"b" * 40, False)]
SEQUENCES = {
    "a literal with indexing, again and again": [("raw", INDEXING)] * 3 + [("raw", b"\xbe\xbf")] * 2,
    "a block refers to entries that a later one evicts": [
        ("table", 100),
        ("encode", LONG),
        ("encode", LONG),  # all indexed now
        ("again", 1),
        ("encode", [(b"user-agent", b"b" * 40, False)]),  # evicts x-long
        ("again", 1),
    ],
    "the client shrinks the table, then an old block": [
        ("encode", [(b"accept", b"*/*", False)]),
        ("encode", [(b"accept", b"*/*", False)]),
        ("again", 1),
        ("table", 0),
        ("encode", []),
        ("again", 1),
    ],
    "a table size update, twice": [("raw", b"\x3f\x45\x82")] * 3,
    "the header list limit shrinks": [("encode", LONG), ("encode", LONG), ("again", 1), ("list-limit", 60)]
    + [("again", 1)] * 2,
    "the table limit shrinks below the table": [("encode", LONG), ("encode", LONG), ("again", 1), ("table-limit", 0)]
    + [("again", 1)] * 2,
    "a failing block, again": [("raw", b"\x82\xff\x80\x80")] * 2 + [("raw", b"\x82\x20\x86")] * 2,
    "h2load's blocks": [("raw", b"\x04\x03abc\x0f\x0d\x03154")] * 3,
}


@pytest.mark.parametrize("actions", SEQUENCES.values(), ids=SEQUENCES.keys())
def test_the_caching_decoder_decodes_these_blocks_exactly_as_hpack(actions: list[tuple[str, Any]]) -> None:
    replay(actions)


@given(ACTIONS)
def test_the_caching_decoder_decodes_every_block_exactly_as_hpack(actions: list[tuple[str, Any]]) -> None:
    replay(actions)


def replay(actions: list[tuple[str, Any]]) -> None:
    """Each action on the client's encoder, or to both decoders; the same outcome from both
    (and from ``CachingDecoder.remembered`` where it knows the block)."""
    encoder = Encoder()
    ours, reference = CachingDecoder(65536), Decoder(65536)
    blocks: list[bytes] = []
    for action, value in actions:
        if action == "table":
            encoder.header_table_size = value
            continue
        if action in ("list-limit", "table-limit"):
            for decoder in (ours, reference):
                setattr(decoder, "max_header_list_size" if action == "list-limit" else "max_allowed_table_size", value)
            continue
        if action == "encode":
            fields = [(NeverIndexedHeaderTuple if never else HeaderTuple)(n, v) for n, v, never in value]
            block = encoder.encode(fields)
        elif action == "again":
            if not blocks:
                continue
            block = blocks[value % len(blocks)]
        else:
            block = value
        blocks.append(block)
        known, before = ours.remembered(block), table_state(reference)
        result = outcome(reference, block)
        assert outcome(ours, block) == result
        if known is not None:  # (what the connection takes instead of decoding: the same, and no change)
            assert result == ([(type(field), *field) for field in known.fields], before)


def test_a_repeated_block_is_decoded_once_and_a_table_change_forgets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    decodes = []
    original = Decoder.decode

    def counted(self: Decoder, data: bytes, raw: bool = False) -> Any:
        decodes.append(bytes(data))
        return original(self, data, raw)

    monkeypatch.setattr(Decoder, "decode", counted)
    encoder, decoder = Encoder(), CachingDecoder(65536)
    head = [(b":method", b"POST"), (b":path", b"/v1/chat/completions"), (b"accept", b"*/*")]
    first, again = encoder.encode(head), encoder.encode(head)
    assert first != again  # the first indexes its fields, the second refers to them
    for block in (first, again, again, again):
        assert decoder.decode(block, raw=True) == head
    assert decodes == [first, again]  # the literals changed the table: not remembered
    block = decoder.take_last()
    assert block is not None and block.fields == tuple(head)
    assert decoder.take_last() is None  # once
    decoder.decode(encoder.encode([(b"x-new", b"1")]), raw=True)  # adds an entry
    assert decoder.decode(again, raw=True) != head  # the indices now point one further
    assert len(decodes) == 4
    assert decoder.decode(b"\x82" * (MAX_BLOCK_SIZE + 1), raw=True) == [(b":method", b"GET")] * (MAX_BLOCK_SIZE + 1)
    assert decoder.take_last() is None  # too long to remember


# --- the handler ---------------------------------------------------------------------------


@attrs.define(eq=False)
class Transport:
    app: Any
    nursery: trio.Nursery
    settings: ProtocolSettings = attrs.field(factory=lambda: ProtocolSettings(max_concurrent_streams=2))
    tracker: ConnectionTracker = attrs.field(factory=ConnectionTracker)
    scheme: str = "https"
    shutting_down: bool = False
    congested: bool = False

    def wake_writer(self) -> None:
        pass

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        self.nursery.start_soon(fn, *args)

    def set_read_deadline(self, deadline: float) -> None:
        pass


@attrs.define
class Recorder:
    requests: list[HttpRequest] = attrs.field(factory=list)

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        self.requests.append(request)
        response.start(204, ())
        response.end()


async def test_the_handler_makes_a_repeated_head_once_and_keeps_nothing_of_refused_streams() -> None:
    """Stream limit 2: of three requests in one read the third is refused; then two
    more.  Every request served has its own body and the same head, the same object
    for the same block; nothing is left of any of them."""
    encoder = Encoder()
    head = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a?q=1"), (b":authority", b"h")]

    def request(sid: int, body: bytes) -> bytes:
        return frame(0x1, 0x4, sid, encoder.encode(head)) + frame(0x0, 0x1, sid, body)

    app = Recorder()
    async with trio.open_nursery() as nursery:
        handler = Http2Handler(Transport(app, nursery))  # type: ignore[arg-type]
        handler.receive(PREFACE + frame(0x4, 0, 0, b"") + request(1, b"one") + request(3, b"two") + request(5, b"x"))
        await trio.testing.wait_all_tasks_blocked()
        handler.outgoing()
        handler.flushed()
        handler.receive(request(7, b"three") + request(9, b""))
        await trio.testing.wait_all_tasks_blocked()
        handler.outgoing()
        assert not handler._h2.plain_requests and not handler._streams
    served = {r.body: r for r in app.requests}
    assert sorted(served) == [b"", b"one", b"three", b"two"]
    expected = HttpRequest("POST", "/a", "q=1", ((b"host", b"h"),), b"", "2", "http")  # (:scheme)
    assert [attrs.evolve(r, body=b"", received_at=None) for r in app.requests] == [expected] * 4
    assert all(r.received_at is not None for r in app.requests)
    # The first block indexed its fields; the others are the same bytes, made into a head once.
    assert served[b"two"].headers is served[b"three"].headers is served[b""].headers
    assert served[b"one"].headers is not served[b"two"].headers


def test_with_body_keeps_every_field() -> None:
    values = {"method": "PUT", "path": "/p", "query": "a=b", "headers": ((b"x", b"y"),), "body": b""}
    values |= {"http_version": "2", "scheme": "https", "received_at": None}
    assert set(values) == {field.name for field in attrs.fields(HttpRequest)}
    head = HttpRequest(**values)
    assert with_body(head, b"body", 5.0) == attrs.evolve(head, body=b"body", received_at=5.0)
