"""The compiled ``Http2Stream.write`` (native/h2_write.c) against the pure one (``http2.PURE_WRITE``).

Two identical handlers receive the very same client bytes and open the same stream;
every write goes through the pure write on one and the C write on the other.  After
each operation both must leave the same batch bytes (``b"".join(handler._frames)``: the
C write appends header and payload as one item, the pure one as two; nothing reads the
list but ``outgoing``'s join), the same h2 windows and state, the same stream fields,
the same transport calls, and return or raise the same.  The cases are the fast one
and each condition that hands a write to the general path (BufferedResponse.write):
both windows, the frame size, the state of the response and of h2's state machines,
the head not yet sent, buffered or queued bytes, congestion, the low-water mark within
a batch, ``frame_at_once`` and HEAD; then random sequences (hypothesis), and
reference counts and memory over many calls.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import attrs
import h2.config
import h2.connection
import pytest
from h2.connection import ConnectionState
from h2.stream import H2Stream, H2StreamStateMachine, StreamState
from hypothesis import given
from hypothesis import strategies as st

from llmsim.protocol.native.http2 import PURE_WRITE, Http2Handler, Http2Stream
from llmsim.protocol.settings import ProtocolSettings
from llmsim.speedups import NATIVE
from tests.protocol.helpers import RecordingTransport, h2_fields

pytestmark = pytest.mark.skipif(NATIVE is None, reason="llmsim._speedups is not built (or LLMSIM_PURE=1)")

HEAD = [(b"content-type", b"text/event-stream")]
TOKEN = b'data: {"choices":[{"delta":{"content":" token"}}]}\n\n'
# Fields that hold objects of one side (compared by identity) or the time a call happened.
UNCOMPARED = {"host", "_cancel_scope", "h2stream", "request", "received_at", "deadline"}


Wire = RecordingTransport  # (its handler tasks never run: the test drives the response itself)


def client_bytes(method: str, sid: int, end_request: bool, settings: dict[int, int]) -> bytes:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    if settings:
        client.update_settings(settings)
    head = [(b":method", method.encode()), (b":path", b"/v1/chat"), (b":scheme", b"http"), (b":authority", b"x")]
    client.send_headers(sid, head, end_stream=end_request)
    return client.data_to_send()


@attrs.define(eq=False)
class Side:
    """One handler, its stream, and the write it is driven with."""

    handler: Http2Handler
    wire: Wire
    stream: Http2Stream
    write_fn: Callable[[Http2Stream, bytes], bool]

    def write(self, data: bytes) -> tuple[str, object]:
        try:
            return "returned", self.write_fn(self.stream, data)
        except Exception as exc:  # (both must raise the same)
            return "raised", (type(exc), str(exc))

    def outgoing(self) -> bytes:
        out = self.handler.outgoing()
        self.handler.flushed()
        return out

    def observe(self) -> dict[str, object]:
        conn, stream = self.handler._h2, self.stream
        h2stream = conn.streams.get(stream.stream_id)
        return {
            "frames": b"".join(getattr(self.handler, "_frames", [b"(none)"])),
            "connection": (conn.outbound_flow_control_window, conn.state_machine.state, conn._data_to_send),
            "h2stream": None
            if h2stream is None
            else (h2stream.outbound_flow_control_window, h2stream.state_machine.state),
            "fields": attrs.asdict(stream, recurse=False, filter=lambda field, _: field.name not in UNCOMPARED),
            "calls": list(self.wire.calls),
            "handler": (self.handler._batch, [ready.stream_id for ready in self.handler._ready], self.handler._phase),
        }


@attrs.define(eq=False)
class Pair:
    pure: Side
    native: Side

    def write(self, data: bytes) -> tuple[str, object]:
        result = self.pure.write(data)
        assert self.native.write(data) == result
        self.check()
        return result

    def outgoing(self) -> bytes:
        out = self.pure.outgoing()
        assert self.native.outgoing() == out
        self.check()
        return out

    def both(self, change: Callable[[Side], object]) -> None:
        change(self.pure)
        change(self.native)

    def check(self) -> None:
        assert self.native.observe() == self.pure.observe()


def open_side(write_fn: Callable[[Http2Stream, bytes], bool], request: bytes, *, low_water: int, head: bool) -> Side:
    wire = Wire(settings=ProtocolSettings(low_water=low_water, high_water=4 * low_water))
    handler = Http2Handler(wire)  # type: ignore[arg-type]
    handler.receive(request)
    (stream,) = handler._streams.values()
    handler.outgoing()  # the server's preface and SETTINGS ACK
    if head:
        stream.start(200, HEAD)
        handler.outgoing()  # the head: h2stream is set
        assert stream.h2stream is not None
    wire.calls.clear()
    return Side(handler, wire, stream, write_fn)


def open_pair(
    method: str = "POST",
    sid: int = 1,
    *,
    end_request: bool = True,
    settings: dict[int, int] | None = None,
    low_water: int = 4096,
    head: bool = True,
) -> Pair:
    request = client_bytes(method, sid, end_request, settings or {})
    pair = Pair(
        open_side(PURE_WRITE, request, low_water=low_water, head=head),
        open_side(Http2Stream.write, request, low_water=low_water, head=head),
    )
    pair.check()
    return pair


def frames_taken(pair: Pair) -> bytes:
    """The frames the writes put into the batch since the last ``outgoing``."""
    return b"".join(pair.native.handler._frames)


def data_frame(sid: int, data: bytes) -> bytes:
    return len(data).to_bytes(3, "big") + b"\x00\x00" + sid.to_bytes(4, "big") + data


def test_the_compiled_write_is_installed() -> None:
    assert Http2Stream.write is not PURE_WRITE
    assert type(Http2Stream.__dict__["write"]).__name__ == "method_descriptor"


async def test_the_per_token_case_frames_at_once_and_wakes_the_writer_once_per_batch() -> None:
    pair = open_pair()
    for _ in range(3):
        assert pair.write(TOKEN) == ("returned", True)
    assert frames_taken(pair) == data_frame(1, TOKEN) * 3
    # The C write took them: one list item a frame (header and payload), the pure write's two.
    assert (len(pair.native.handler._frames), len(pair.pure.handler._frames)) == (3, 6)
    assert pair.native.wire.calls == ["wake"]  # for the first frame of the batch
    assert pair.native.stream.framed == 3 * len(TOKEN)
    pair.outgoing()
    assert pair.write(b"x") == ("returned", True)  # a new batch: framed starts again, one more wake-up
    assert pair.native.stream.framed == 1 and pair.native.stream.framed_batch == pair.native.handler._batch
    assert pair.native.wire.calls == ["wake", "wake"]


async def test_an_open_request_stream_and_a_high_stream_id_frame_at_once_too() -> None:
    pair = open_pair(sid=2**31 - 1, end_request=False)
    assert pair.native.handler._h2.streams[2**31 - 1].state_machine.state is StreamState.OPEN
    assert pair.write(TOKEN) == ("returned", True)
    assert frames_taken(pair) == data_frame(2**31 - 1, TOKEN)


async def test_a_frame_of_64_kib_and_more_has_the_same_header() -> None:
    pair = open_pair(settings={4: 2**20, 5: 2**20}, low_water=2**21)  # INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE
    pair.both(lambda side: setattr(side.handler._h2, "outbound_flow_control_window", 2**21))
    data = bytes(range(256)) * 300  # 76,800 bytes
    assert pair.write(data) == ("returned", True)
    assert frames_taken(pair) == data_frame(1, data)


@pytest.mark.parametrize("window", ["stream", "connection"])
async def test_a_frame_beyond_a_window_buffers(window: str) -> None:
    pair = open_pair()

    def shrink(side: Side) -> None:
        target = side.stream.h2stream if window == "stream" else side.handler._h2
        target.outbound_flow_control_window = len(TOKEN) + 3

    pair.both(shrink)
    assert pair.write(TOKEN) == ("returned", True)  # fits, then three bytes are left
    assert pair.write(b"four") == ("returned", True)
    assert frames_taken(pair) == data_frame(1, TOKEN)
    assert pair.native.stream.buffered == 4 and pair.native.stream.queued
    pair.outgoing()  # three bytes go, one waits
    assert pair.write(b"x") == ("returned", True)  # buffered: the general path
    assert pair.native.stream.buffered == 2


@pytest.mark.parametrize("limit", ["stream", "connection", "frame"])
async def test_a_frame_that_fits_exactly_goes_at_once(limit: str) -> None:
    pair = open_pair()

    def fit(side: Side) -> None:
        conn = side.handler._h2
        if limit == "frame":
            conn.max_outbound_frame_size = len(TOKEN)
        else:
            (side.stream.h2stream if limit == "stream" else conn).outbound_flow_control_window = len(TOKEN)

    pair.both(fit)
    assert pair.write(TOKEN) == ("returned", True)
    assert pair.native.handler._frames == [data_frame(1, TOKEN)]  # (one item: the C write took it)


def plain_h2_objects(side: Side, which: str) -> None:
    """Make the stream, its state machine or the connection's state machine an object
    of h2's own class (no slots), with the same fields: the C write must not read it by
    offset, but hand the write to the pure one."""
    conn = side.handler._h2
    stream = conn.streams[1]
    if which == "connection machine":
        machine = h2.connection.H2ConnectionStateMachine()
        machine.state = conn.state_machine.state
        conn.state_machine = machine
        return
    plain_machine = H2StreamStateMachine.__new__(H2StreamStateMachine)
    plain_machine.__dict__.update(h2_fields(stream.state_machine))
    if which == "stream machine":
        stream.state_machine = plain_machine
        return
    plain = H2Stream.__new__(H2Stream)
    plain.__dict__.update(h2_fields(stream))
    plain.state_machine = plain_machine
    conn.streams[1] = side.stream.h2stream = plain


@pytest.mark.parametrize("which", ["stream", "stream machine", "connection machine"])
async def test_h2_objects_without_the_slots_go_to_the_pure_write(which: str) -> None:
    pair = open_pair()
    pair.both(lambda side: plain_h2_objects(side, which))
    assert pair.write(TOKEN) == ("returned", True)
    assert frames_taken(pair) == data_frame(1, TOKEN)
    assert len(pair.native.handler._frames) == 2  # (header and payload: the pure write took it)
    pair.outgoing()
    assert pair.write(TOKEN) == ("returned", True)
    assert pair.native.stream.h2stream.outbound_flow_control_window == 65535 - 2 * len(TOKEN)


async def test_a_frame_larger_than_the_max_frame_size_buffers() -> None:
    pair = open_pair()
    pair.both(lambda side: setattr(side.handler._h2, "max_outbound_frame_size", len(TOKEN) - 1))
    assert pair.write(TOKEN) == ("returned", True)
    assert not frames_taken(pair) and pair.native.stream.buffered == len(TOKEN)
    pair.outgoing()


async def test_the_head_not_sent_and_a_response_not_streaming_take_the_general_path() -> None:
    pair = open_pair(head=False)
    assert pair.write(TOKEN)[0] == "raised"  # IDLE: not started
    pair.both(lambda side: side.stream.start(200, HEAD))
    assert pair.write(TOKEN) == ("returned", True)  # started, the head not sent yet: buffered
    assert pair.native.stream.h2stream is None and pair.native.stream.buffered == len(TOKEN)
    pair.outgoing()
    assert pair.write(TOKEN) == ("returned", True)
    assert frames_taken(pair) == data_frame(1, TOKEN)
    pair.both(lambda side: side.stream.end())
    assert pair.write(TOKEN)[0] == "raised"  # ENDED
    pair.outgoing()
    assert pair.write(TOKEN)[0] == "raised"  # DONE


async def test_a_reset_stream_drops_writes() -> None:
    pair = open_pair()
    pair.both(lambda side: side.handler.inject_reset(side.stream, 8))
    assert pair.write(TOKEN) == ("returned", True)  # closed: dropped
    assert pair.outgoing()


@pytest.mark.parametrize("state", [StreamState.CLOSED, StreamState.HALF_CLOSED_LOCAL, StreamState.IDLE])
async def test_h2_stream_states_other_than_open_go_to_h2(state: StreamState) -> None:
    pair = open_pair()
    pair.both(lambda side: setattr(side.handler._h2.streams[1].state_machine, "state", state))
    assert pair.write(TOKEN) == ("returned", True)
    assert not frames_taken(pair) and pair.native.stream.buffered == len(TOKEN)


@pytest.mark.parametrize("state", [ConnectionState.CLOSED, ConnectionState.IDLE])
async def test_a_connection_not_open_goes_to_h2(state: ConnectionState) -> None:
    pair = open_pair()
    pair.both(lambda side: setattr(side.handler._h2.state_machine, "state", state))
    assert pair.write(TOKEN) == ("returned", True)
    assert not frames_taken(pair) and pair.native.stream.buffered == len(TOKEN)


async def test_buffered_or_queued_bytes_keep_their_order() -> None:
    pair = open_pair()
    pair.both(lambda side: setattr(side.stream, "queued", True))
    assert pair.write(TOKEN) == ("returned", True)
    assert not frames_taken(pair) and pair.native.stream.chunks == [TOKEN]
    pair.both(lambda side: setattr(side.stream, "queued", False))
    assert pair.write(b"more") == ("returned", True)  # buffered: after the first
    assert pair.native.stream.chunks == [TOKEN, b"more"]
    pair.outgoing()
    assert pair.write(TOKEN) == ("returned", True)
    assert frames_taken(pair) == data_frame(1, TOKEN)


async def test_a_congested_connection_buffers() -> None:
    pair = open_pair()
    pair.both(lambda side: setattr(side.wire, "congested", True))
    assert pair.write(TOKEN) == ("returned", True)
    assert not frames_taken(pair)
    pair.both(lambda side: setattr(side.wire, "congested", False))
    pair.outgoing()
    assert pair.write(TOKEN) == ("returned", True)
    assert frames_taken(pair) == data_frame(1, TOKEN)


async def test_the_low_water_mark_is_reached_within_a_batch() -> None:
    pair = open_pair(low_water=3 * len(TOKEN))
    for _ in range(4):
        assert pair.write(TOKEN) == ("returned", True)
    assert frames_taken(pair) == data_frame(1, TOKEN) * 2  # the third reaches the mark
    assert pair.native.stream.buffered == 2 * len(TOKEN)
    pair.outgoing()
    assert pair.write(TOKEN) == ("returned", True)  # a new batch: at once again
    assert frames_taken(pair) == data_frame(1, TOKEN)


async def test_frame_at_once_false_and_head_only_take_the_general_path() -> None:
    pair = open_pair()
    pair.both(lambda side: setattr(side.stream, "frame_at_once", False))
    assert pair.write(TOKEN) == ("returned", True)
    assert not frames_taken(pair) and pair.native.stream.buffered == len(TOKEN)
    head = open_pair(method="HEAD")
    assert head.write(TOKEN) == ("returned", True)
    assert not frames_taken(head) and head.native.stream.buffered == 0


@pytest.mark.parametrize("data", [b"", bytearray(TOKEN), memoryview(TOKEN), type("Token", (bytes,), {})(TOKEN)])
async def test_empty_writes_and_other_bytes_types_go_to_the_pure_write(data: bytes) -> None:
    pair = open_pair()
    assert pair.write(data) == ("returned", True)
    assert pair.outgoing() == (data_frame(1, bytes(data)) if data else b"")


async def test_values_of_unusual_types_go_to_the_pure_write() -> None:
    pair = open_pair()
    pair.both(lambda side: setattr(side.stream, "low_water", 2**70))  # beyond a C integer
    assert pair.write(TOKEN) == ("returned", True)
    pair.both(lambda side: setattr(side.stream, "low_water", 4096.5))
    assert pair.write(TOKEN) == ("returned", True)
    pair.both(lambda side: setattr(side.wire, "congested", 0))
    assert pair.write(TOKEN) == ("returned", True)
    pair.both(lambda side: setattr(side.wire, "congested", None))
    assert pair.write(TOKEN) == ("returned", True)
    pair.both(lambda side: setattr(side.handler._h2, "max_outbound_frame_size", 16384.0))
    assert pair.write(TOKEN) == ("returned", True)
    assert frames_taken(pair) == data_frame(1, TOKEN) * 5


async def test_a_failing_wake_up_raises_after_the_frame_is_taken() -> None:
    pair = open_pair()
    pair.both(lambda side: setattr(side.wire, "fail_wake", True))
    assert pair.write(TOKEN) == ("raised", (RuntimeError, "the writer is gone"))
    assert frames_taken(pair) == data_frame(1, TOKEN)
    assert pair.write(TOKEN) == ("returned", True)  # not the first of its batch: no wake-up


async def test_a_missing_handler_attribute_raises_as_the_pure_write_does() -> None:
    pair = open_pair()
    pair.both(lambda side: delattr(side.handler, "_frames"))
    assert pair.write(TOKEN)[0] == "raised"


operations = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 300)),
        st.tuples(st.just("outgoing"), st.just(0)),
        st.tuples(st.just("congested"), st.booleans()),
        st.tuples(st.just("connection_window"), st.integers(-10, 2000)),
        st.tuples(st.just("stream_window"), st.integers(-10, 2000)),
        st.tuples(st.just("max_frame"), st.integers(50, 400)),
        st.tuples(st.just("end"), st.just(0)),
    ),
    max_size=40,
)


# What an operation of the random sequences sets: (the object of a side, the attribute).
SETTABLE: dict[str, tuple[Callable[[Side], object], str]] = {
    "congested": (lambda side: side.wire, "congested"),
    "connection_window": (lambda side: side.handler._h2, "outbound_flow_control_window"),
    "stream_window": (lambda side: side.handler._h2.streams[1], "outbound_flow_control_window"),
    "max_frame": (lambda side: side.handler._h2, "max_outbound_frame_size"),
}


@given(ops=operations, low_water=st.sampled_from([100, 500, 4096]))
async def test_random_sequences_leave_identical_handlers(ops: list[tuple[str, Any]], low_water: int) -> None:
    pair = open_pair(low_water=low_water)
    for op, value in ops:
        if op == "write":
            pair.write(bytes(value % 256 for _ in range(value)))
        elif op == "outgoing":
            pair.outgoing()
        elif op in SETTABLE:
            owner, name = SETTABLE[op]
            for side in (pair.pure, pair.native):
                setattr(owner(side), name, value)
        elif op == "end" and not pair.native.stream.state.ended:
            pair.both(lambda side: side.stream.end())
        pair.check()


def leak_check(side: Side, count: int, step: Callable[[], object]) -> None:
    """``count`` calls of ``step`` change no reference count of the objects involved, and
    the memory traced stays flat (the batch is emptied as it goes)."""
    stream, handler = side.stream, side.handler
    watched = [TOKEN, stream, handler, handler._h2, side.wire, stream.h2stream, stream.state]
    watched += [handler._h2.state_machine.state, StreamState.HALF_CLOSED_REMOTE, PURE_WRITE]

    def run(n: int) -> None:
        for i in range(n):
            step()
            if i % 50 == 49:
                handler._frames.clear()
                side.wire.calls.clear()
                handler._batch += 1
                stream.chunks.clear()
                stream.buffered = 0
                stream.queued = False
                handler._ready.clear()

    run(count // 10)  # (warm: caches, free lists)
    # No collection in between: garbage of earlier tests that the collector frees would
    # move the counts of shared objects (the enum members) by itself.
    gc.collect()
    gc.disable()
    before = [sys.getrefcount(obj) for obj in watched]
    tracemalloc.start()
    try:
        run(count)
        first, _ = tracemalloc.get_traced_memory()
        run(count)
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    assert [sys.getrefcount(obj) for obj in watched] == before
    assert second - first < 10_000


async def test_no_reference_or_memory_leaks() -> None:
    pair = open_pair()
    side = pair.native
    side.handler._h2.outbound_flow_control_window = side.stream.h2stream.outbound_flow_control_window = 2**30
    side.handler._h2.streams[1].outbound_flow_control_window = 2**30
    side.stream.write(TOKEN)
    assert side.handler._frames == [data_frame(1, TOKEN)]  # (one item: the C write's)
    leak_check(side, 10_000, lambda: side.stream.write(TOKEN))  # framed at once
    side.wire.congested = True
    leak_check(side, 10_000, lambda: side.stream.write(TOKEN))  # handed to the pure write
    side.wire.congested, side.wire.fail_wake = False, True

    def failing() -> None:
        side.handler._frames.clear()
        with pytest.raises(RuntimeError):
            side.stream.write(TOKEN)

    leak_check(side, 10_000, failing)  # the wake-up raises
