"""The C ``Http1Response.write`` (native/h1_write.c) against the pure one (``http1.PURE_WRITE``).

Two identical handlers on fake transports get the same writes, one through the pure
write and one through the C write; everything observable must be the same after each:
the batch ``_out`` (bytes), ``_framed``, the response's buffer and fields, the return
values, the writer's wake-ups, the exceptions and the bytes that leave.  The C code takes
the per-token case (one chunk framed into an empty batch) and hands everything else to
the pure write: the take-back of a framed chunk, a response not chunked, not STREAMING,
with bytes buffered or not framed at once, a congested connection, a piece too big or
empty, data not bytes.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.api.http import ResponseStateError
from llmsim.protocol.native.frames import chunk
from llmsim.protocol.native.http1 import PURE_WRITE, Http1Handler, Http1Response
from llmsim.protocol.native.http1_fastpath import SIZE_LINES
from llmsim.speedups import NATIVE
from tests.protocol.helpers import settings
from tests.protocol.native.test_http1_fastpath import Wire, streaming

pytestmark = pytest.mark.skipif(NATIVE is None, reason="llmsim._speedups is not built, or LLMSIM_PURE is set")

LOW_WATER = 16384


def c_write(stream: Http1Response, data: Any) -> bool:
    return stream.write(data)


@attrs.define(eq=False)
class Side:
    """One handler with its transport and response, written to with one ``write``."""

    write: Any
    wire: Wire = attrs.field(factory=lambda: Wire(settings=settings(low_water=LOW_WATER, high_water=4 * LOW_WATER)))
    handler: Http1Handler = attrs.field(init=False)
    stream: Http1Response = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.handler, self.stream = streaming(self.wire)

    def seen(self) -> tuple[object, ...]:
        """Everything the write may change."""
        stream, handler = self.stream, self.handler
        return (
            [bytes(piece) for piece in handler._out],
            handler._framed,
            list(stream.chunks),
            stream.buffered,
            stream.queued,
            stream.state,
            stream.chunked,
            self.wire.wakes,
        )

    def call(self, data: Any) -> object:
        """The write's return value, or the exception it raised (type and message)."""
        try:
            return self.write(self.stream, data)
        except Exception as exc:
            return (type(exc), str(exc))

    def flush(self) -> bytes:
        data = self.handler.outgoing()
        self.handler.flushed()
        return data


def pair() -> tuple[Side, Side]:
    return Side(PURE_WRITE), Side(c_write)


def same_writes(pure: Side, native: Side, *pieces: Any) -> list[object]:
    """Write ``pieces`` on both sides, checking after each; the return values."""
    results = []
    for data in pieces:
        result = pure.call(data)
        assert native.call(data) == result
        assert native.seen() == pure.seen()
        results.append(result)
    return results


def test_the_c_write_is_installed_and_the_pure_one_kept() -> None:
    assert Http1Response.write is not PURE_WRITE
    assert type(Http1Response.__dict__["write"]).__name__ == "method_descriptor"
    assert PURE_WRITE.__qualname__ == "Http1Response.write"


@pytest.mark.parametrize("size", [1, 15, 16, 255, 256, 4095, 4096, 4097, 5000, LOW_WATER - 1])
async def test_a_lone_token_is_framed_into_the_batch_as_the_pure_write_frames_it(size: int) -> None:
    pure, native = pair()
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    wakes = native.wire.wakes
    assert same_writes(pure, native, data) == [True]
    assert native.handler._out == [chunk(data)] and native.handler._framed is data  # framed at once
    assert native.stream.buffered == 0 and native.wire.wakes == pure.wire.wakes == wakes + 1
    assert native.flush() == pure.flush() == b"%x\r\n%b\r\n" % (size, data)


async def test_every_size_line_of_the_table_is_the_tables_and_above_it_chunks() -> None:
    """The C code formats the size itself: the same line as SIZE_LINES for every size
    the table has, and as frames.chunk above it (up to the low-water mark)."""
    native = Side(c_write)
    for size in [*range(1, len(SIZE_LINES)), *range(len(SIZE_LINES), LOW_WATER, 97), LOW_WATER - 1]:
        data = b"z" * size
        assert native.write(native.stream, data) is True
        line = SIZE_LINES[size] if size < len(SIZE_LINES) else b"%x\r\n" % size
        assert native.handler._out == [line + data + b"\r\n"]
        assert native.flush() == chunk(data)


async def test_a_second_write_before_the_batch_left_takes_the_chunk_back_once() -> None:
    pure, native = pair()
    assert same_writes(pure, native, b"a", b"bc", b"", b"def") == [True] * 4
    assert native.stream.chunks == [b"a", b"bc", b"def"] and native.handler._out == []
    assert native.flush() == pure.flush() == chunk(b"abcdef")
    assert same_writes(pure, native, b"g") == [True] and native.handler._out == [chunk(b"g")]
    assert native.flush() == pure.flush() == b"1\r\ng\r\n"


async def test_the_cases_the_pure_write_takes_are_the_same() -> None:
    pure, native = pair()
    pieces = [b"", b"x" * LOW_WATER, b"y" * (LOW_WATER + 1), bytearray(b"ba"), memoryview(b"mv"), Sub(b"sub")]
    for data in pieces:
        same_writes(pure, native, data)
        assert native.flush() == pure.flush()
    for side in (pure, native):
        side.wire.congested = True
    assert same_writes(pure, native, b"c1", b"c2") == [True, True]
    assert native.stream.chunks == [b"c1", b"c2"]  # buffered, not framed
    for side in (pure, native):
        side.wire.congested = False
    assert same_writes(pure, native, b"c3") == [True] and native.stream.buffered == 6  # buffered: not framed
    assert native.flush() == pure.flush() == chunk(b"c1c2c3")


@pytest.mark.parametrize(
    ("field", "value"), [("chunked", False), ("frame_at_once", False), ("buffered", 0.0), ("low_water", 2.0**20)]
)
async def test_a_response_field_that_rules_the_fast_case_out_hands_it_over(field: str, value: object) -> None:
    pure, native = pair()
    for side in (pure, native):
        setattr(side.stream, field, value)
    same_writes(pure, native, b"tok", b"en")
    assert native.handler._out == pure.handler._out


@pytest.mark.parametrize("congested", [0, 1, None, "", "yes"])
async def test_a_congested_that_is_not_a_bool_is_the_pure_writes_to_judge(congested: object) -> None:
    pure, native = pair()
    for side in (pure, native):
        side.wire.congested = congested  # type: ignore[assignment]
    same_writes(pure, native, b"tok", b"en")


async def test_a_write_before_start_and_after_end_and_abort_is_the_pure_writes() -> None:
    pure, native = pair()
    for side in (pure, native):
        side.stream.end()
    result = same_writes(pure, native, b"late")
    assert result[0][0] is ResponseStateError  # type: ignore[index]
    pure, native = pair()
    for side in (pure, native):
        side.stream.abort()
    assert same_writes(pure, native, b"gone") == [True]


async def test_an_exception_from_wake_writer_leaves_the_same_state() -> None:
    pure, native = Side(PURE_WRITE, Touchy()), Side(c_write, Touchy())
    for side in (pure, native):
        side.wire.explode = True  # type: ignore[attr-defined]
    assert same_writes(pure, native, b"boom") == [(RuntimeError, "wake_writer failed")]
    assert native.handler._out == [chunk(b"boom")] and native.handler._framed == b"boom"


async def test_a_host_that_is_not_an_http1handler_is_the_pure_writes() -> None:
    """Its fields are not where the C code would read them: it must not read them."""
    sides = []
    for write in (PURE_WRITE, c_write):
        host = LooseHost()
        stream = Http1Response(host=host, low_water=LOW_WATER)  # type: ignore[arg-type]
        stream.start(200, ())
        stream.chunked = True
        results = [write(stream, data) for data in (b"a", b"bc", b"d")]
        results.append(stream.take(stream.buffered))  # what outgoing() would take
        host._out.clear()
        results.append(write(stream, b"e"))
        sides.append((results, host._out, host._framed, host.taken, stream.chunks, stream.buffered, host._t.wakes))
    assert sides[0] == sides[1]
    assert sides[1][1:4] == ([chunk(b"e")], b"e", 1)


async def test_a_transport_without_congested_raises_as_the_pure_write_does() -> None:
    pure, native = Side(PURE_WRITE, Bare()), Side(c_write, Bare())
    result = same_writes(pure, native, b"tok")
    assert result[0][0] is AttributeError  # type: ignore[index]


operations = st.one_of(
    st.tuples(st.just("write"), st.sampled_from([0, 1, 2, 16, 255, 4096, LOW_WATER - 1, LOW_WATER, 70000])),
    st.tuples(st.just("flush"), st.just(0)),
    st.tuples(st.just("congested"), st.sampled_from([0, 1])),
    st.tuples(st.just("frame_at_once"), st.sampled_from([0, 1])),
)


@given(ops=st.lists(operations, max_size=25))
async def test_any_sequence_of_writes_and_flushes_is_the_same(ops: list[tuple[str, int]]) -> None:
    pure, native = pair()
    for op, value in ops:
        if op == "write":
            same_writes(pure, native, b"w" * value)
        elif op == "flush":
            assert native.flush() == pure.flush()
        else:
            for side in (pure, native):
                if op == "congested":
                    side.wire.congested = bool(value)
                else:
                    side.stream.frame_at_once = bool(value)
        assert native.seen() == pure.seen()
    assert native.flush() == pure.flush()


async def test_no_reference_or_memory_is_leaked() -> None:
    native = Side(c_write)
    data, big, handler, stream, wire = b"t" * 230, b"b" * LOW_WATER, native.handler, native.stream, native.wire

    def run(times: int) -> None:
        for _ in range(times):
            native.write(stream, data)  # framed
            native.write(stream, data)  # taken back, buffered (the pure write)
            native.write(stream, big)  # buffered (the pure write)
            native.flush()

    run(100)
    gc.collect()
    things = (data, big, handler, handler._out, stream, wire, PURE_WRITE)
    counts = [sys.getrefcount(thing) for thing in things]
    singletons = [sys.getrefcount(singleton) for singleton in (None, False, True)]
    tracemalloc.start()
    try:
        run(100)
        before, _ = tracemalloc.get_traced_memory()
        run(10_000)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [sys.getrefcount(thing) for thing in things] == counts
    for singleton, count in zip((None, False, True), singletons, strict=True):  # (wake_writer's None, congested)
        assert abs(sys.getrefcount(singleton) - count) < 1000
    assert after - before < 10_000
    assert wire.wakes > 10_000


class Sub(bytes):
    """A bytes subclass: not the C code's to frame."""


@attrs.define(eq=False)
class Touchy(Wire):
    explode: bool = False

    def wake_writer(self) -> None:
        super().wake_writer()
        if self.explode:
            raise RuntimeError("wake_writer failed")


@attrs.define(eq=False)
class Bare(Wire):
    """A transport with no ``congested`` (a slot left unset)."""

    def __attrs_post_init__(self) -> None:
        del self.congested


class LooseHost:
    """Not an Http1Handler: the same attributes in a __dict__."""

    def __init__(self) -> None:
        self._out: list[bytes] = []
        self._framed: bytes | None = None
        self._t = Wire()
        self.taken = 0

    def schedule(self, stream: Http1Response) -> None:
        self._t.wake_writer()

    def take_back(self, stream: Http1Response) -> None:
        self.taken += 1
        Http1Handler.take_back(self, stream)  # type: ignore[arg-type]
