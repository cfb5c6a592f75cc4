"""The C ``WriteCoalescer.release`` (native/flush.c) against the pure one (``PURE_RELEASE``).

Two identical connections, each with an HTTP/1.1 handler streaming a response and a
real non-blocking socket (one end of a socket pair), are queued on their coalescers and
released, one by the pure release and one by the C one; everything observable must be
the same after: the bytes the peer receives, the connection's dirty flag, backlog and
``congested``, the writer's wake-ups, the handler's batch and ``_framed``, the response's
state, the coalescer's queue.  The C code sends the per-token case (one chunk in the
batch of a STREAMING chunked response) itself and hands every other connection to its
``flush_now``: a head or an end in the batch, bytes buffered, callbacks waiting for the
drain, a connection sending or with a backlog, closing, without a direct socket or
with a closed one, a handler that is not an Http1Handler, a subclass.
"""

from __future__ import annotations

import gc
import socket
import sys
import tracemalloc
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
import pytest

from llmsim.protocol.native.connection import PURE_RELEASE, Connection, ConnectionPhase, WriteCoalescer
from llmsim.protocol.native.frames import chunk
from llmsim.protocol.native.http1 import Http1Handler, Http1Response
from llmsim.speedups import NATIVE
from tests.protocol.helpers import settings
from tests.protocol.native.test_http1_fastpath import Wire, streaming
from tests.protocol.native.test_native_wake import RecordingLot

pytestmark = pytest.mark.skipif(NATIVE is None, reason="llmsim._speedups is not built, or LLMSIM_PURE is set")

Release = Callable[[WriteCoalescer], None]
NATIVE_RELEASE: Release = WriteCoalescer.release
LOW_WATER = 16384
TOKEN = b'data: {"choices":[{"delta":{"content":" token"}}]}\n\n'


@attrs.define(eq=False)
class Side:
    """One connection with a streaming HTTP/1.1 response, flushed by one ``release``."""

    release: Release
    connection_type: type[Connection] = Connection
    wire: Wire = attrs.field(factory=lambda: Wire(settings=settings(low_water=LOW_WATER, high_water=4 * LOW_WATER)))
    handler: Http1Handler = attrs.field(init=False)
    stream: Http1Response = attrs.field(init=False)
    coalescer: WriteCoalescer = attrs.field(factory=WriteCoalescer)
    connection: Connection = attrs.field(init=False)
    ours: socket.socket = attrs.field(init=False)
    peer: socket.socket = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.handler, self.stream = streaming(self.wire)
        self.ours, self.peer = socket.socketpair()
        self.ours.setblocking(False)
        self.peer.setblocking(False)
        made = self.connection_type(stream=None, app=None, settings=None, tracker=None, coalescer=self.coalescer)  # type: ignore[arg-type]
        made.handler = self.handler
        made._direct = self.ours
        made.phase = ConnectionPhase.OPEN
        made._writer_lot = RecordingLot()  # type: ignore[assignment]
        self.connection = made

    def close(self) -> None:
        self.ours.close()
        self.peer.close()

    def queue(self) -> None:
        """What an engine step does for a connection it wrote to: hold, wake the writer."""
        self.coalescer.hold()
        self.connection._dirty = False
        self.connection.wake_writer()

    def received(self) -> bytes:
        pieces = []
        while True:
            try:
                piece = self.peer.recv(1 << 20)
            except BlockingIOError:
                return b"".join(pieces)
            if not piece:
                return b"".join(pieces)
            pieces.append(piece)

    def seen(self) -> tuple[object, ...]:
        """Everything a release may change."""
        made, handler, lot = self.connection, self.handler, self.connection._writer_lot
        assert isinstance(lot, RecordingLot)
        backlog = made._backlog
        return (
            made._dirty,
            None if backlog is None else bytes(backlog),
            made.congested,
            lot.unparked,
            [bytes(piece) for piece in handler._out],
            handler._framed,
            handler._response is None,
            self.stream.state,
            self.stream.buffered,
            [entry is made for entry in self.coalescer._pending],
            self.coalescer.held,
        )

    def run(self) -> tuple[object, ...]:
        """Release, then what the peer received and what the release left."""
        try:
            self.release(self.coalescer)
        except Exception as exc:  # (the test compares it)
            return (type(exc), str(exc), self.received(), self.seen())
        return (self.received(), self.seen())


@pytest.fixture
def pair() -> Any:
    made: list[Side] = []

    def make(connection_type: type[Connection] = Connection) -> tuple[Side, Side]:
        sides = (Side(PURE_RELEASE, connection_type), Side(NATIVE_RELEASE, connection_type))
        made.extend(sides)
        return sides

    yield make
    for side in made:
        side.close()


def both(pure: Side, native: Side, prepare: Callable[[Side], object]) -> tuple[object, ...]:
    """``prepare`` each side, queue and release both; the outcomes, checked equal."""
    for side in (pure, native):
        prepare(side)
        side.queue()
    outcome = pure.run()
    assert native.run() == outcome
    return outcome


def test_the_c_release_is_installed_and_the_pure_one_kept() -> None:
    assert WriteCoalescer.release is not PURE_RELEASE
    assert type(WriteCoalescer.__dict__["release"]).__name__ == "method_descriptor"
    assert PURE_RELEASE.__qualname__ == "WriteCoalescer.release"


async def test_a_token_is_sent_as_the_pure_release_sends_it(pair: Any) -> None:
    pure, native = pair()
    received, seen = both(pure, native, one_token)
    assert received == chunk(TOKEN)
    assert seen == (False, None, False, 0, [], None, False, pure.stream.state, 0, [], False)
    for _ in range(3):  # and the next steps' tokens
        assert both(pure, native, one_token) == (chunk(TOKEN), seen)


def one_token(side: Side) -> None:
    side.stream.write(TOKEN)


def last_token_and_end(side: Side) -> None:
    side.stream.write(TOKEN)
    side.stream.end()


async def test_the_last_token_and_the_end_finish_the_response_as_before(pair: Any) -> None:
    pure, native = pair()
    received, seen = both(pure, native, last_token_and_end)
    assert received == chunk(TOKEN) + b"0\r\n\r\n"
    assert seen[6] is True  # the response is done: the handler has none


#: What a connection has to send that is not the per-token case (flush_now's), by name.
FLUSH_NOW_CASES: dict[str, Callable[[Side], object]] = {
    "two-writes-one-chunk": lambda side: [side.stream.write(TOKEN), side.stream.write(b"more")],
    "buffered": lambda side: side.stream.write(b"x" * (LOW_WATER + 1)),
    "nothing-to-send": lambda side: None,
    "aborted": lambda side: [side.stream.write(TOKEN), side.stream.abort()],
    "two-in-the-batch": lambda side: [side.stream.write(TOKEN), side.handler._out.append(b"3\r\nabc\r\n")],
    "drained-callbacks": lambda side: [side.stream.write(TOKEN), side.stream.drained_callbacks.append(lambda: None)],
    "finished-0": lambda side: [side.stream.write(TOKEN), setattr(side.handler, "finished", 0)],
}
#: A connection field that keeps the release from sending itself, and its value then.
MAY_NOT_SEND = [
    ("_sending", True),
    ("_sending", 0),
    ("_backlog", b"older"),
    ("phase", ConnectionPhase.CLOSING),
    ("_direct", None),
    ("handler", None),
]


def may_not_send(side: Side, field: str, value: object) -> None:
    side.stream.write(TOKEN)
    setattr(side.connection, field, value)


def closed(side: Side) -> None:
    side.stream.write(TOKEN)
    side.ours.close()


@pytest.mark.parametrize("prepare", list(FLUSH_NOW_CASES.values()), ids=list(FLUSH_NOW_CASES))
async def test_the_cases_flush_now_takes_are_the_same(pair: Any, prepare: Callable[[Side], object]) -> None:
    pure, native = pair()
    both(pure, native, prepare)


@pytest.mark.parametrize(("field", "value"), MAY_NOT_SEND)
async def test_a_connection_that_may_not_send_now_is_flush_nows(pair: Any, field: str, value: object) -> None:
    pure, native = pair()
    received, seen = both(pure, native, partial(may_not_send, field=field, value=value))
    if field != "_sending" or value is True:
        assert received == b"" and seen[3] == 1  # the writer task is woken to do it


async def test_a_closed_socket_is_flush_nows_and_the_chunk_becomes_the_backlog(pair: Any) -> None:
    pure, native = pair()
    received, seen = both(pure, native, closed)
    assert received == b"" and seen[1] == chunk(TOKEN) and seen[2] is True


async def test_a_full_socket_keeps_what_it_did_not_take_as_the_backlog(pair: Any) -> None:
    pure, native = pair()
    for side in (pure, native):
        side.ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        while True:  # until the kernel takes no more
            try:
                side.ours.send(b"f" * 4096)
            except BlockingIOError:
                break
        side.stream.write(TOKEN)
        side.queue()
    outcomes = [side.run() for side in (pure, native)]
    for side, (received, seen) in zip((pure, native), outcomes, strict=True):
        assert isinstance(received, bytes) and isinstance(seen, tuple)
        backlog = seen[1]
        assert isinstance(backlog, bytes) and backlog and seen[2] is True and seen[3] == 1
        assert (received + backlog).endswith(chunk(TOKEN))
        assert side.handler._out == [] and side.connection._dirty is False


async def test_a_connection_of_another_protocol_is_flush_nows(pair: Any) -> None:
    @attrs.define
    class Other:
        """Stands for an HTTP/2 handler: a batch, flushed, never finished."""

        batch: bytes = b""
        finished: bool = False
        flushes: int = 0

        def outgoing(self) -> bytes:
            batch, self.batch = self.batch, b""
            return batch

        def flushed(self) -> None:
            self.flushes += 1

    pure, native = pair()
    others = []
    for side in (pure, native):
        other = Other(batch=b"frames")
        side.connection.handler = other  # type: ignore[assignment]
        others.append(other)
        side.queue()
    assert native.run()[0] == pure.run()[0] == b"frames"
    assert others[0] == others[1] == Other(b"", False, 1)


async def test_a_subclass_is_flush_nows_and_what_it_raises_leaves_the_queue(pair: Any) -> None:
    class Failing(Connection):
        __slots__ = ()

        def flush_now(self) -> None:
            raise RuntimeError("flush failed")

    pure, native = pair(Failing)
    outcome = both(pure, native, one_token)
    assert outcome[:2] == (RuntimeError, "flush failed")
    assert native.coalescer._pending == [native.connection] and native.coalescer.held is False


async def test_a_connection_queued_during_the_release_is_flushed_by_it(pair: Any) -> None:
    """``for connection in pending`` sees what is appended meanwhile: so does the C loop."""
    pure, native = pair()
    extras = [Side(PURE_RELEASE), Side(NATIVE_RELEASE)]
    try:
        for side, extra in zip((pure, native), extras, strict=True):
            extra.stream.write(TOKEN)
            side.stream.write(TOKEN)
            # A callback waiting for the drain: the release hands the connection to
            # flush_now, whose flushed() runs it, and it queues another connection.
            side.stream.drained_callbacks.append(partial(side.coalescer._pending.append, extra.connection))
            side.queue()
        assert native.run() == pure.run()
        assert [extra.received() for extra in extras] == [chunk(TOKEN)] * 2
    finally:
        for extra in extras:
            extra.close()


#: Every kind of connection the release meets, for a mixed queue (the release reads ahead
#: through its queue to warm the caches: native/flush.c ``warm_window``).
MIXED: list[Callable[[Side], object]] = [
    *FLUSH_NOW_CASES.values(),
    *(partial(may_not_send, field=field, value=value) for field, value in MAY_NOT_SEND),
    closed,
    last_token_and_end,
]


async def test_a_mixed_queue_is_released_as_the_pure_release_does() -> None:
    """One coalescer's queue of connections of every kind, in turn with per-token ones:
    each twin releases its own copy in one call, and every connection ends alike."""
    outcomes = []
    for release in (PURE_RELEASE, NATIVE_RELEASE):
        coalescer = WriteCoalescer()
        prepares = [step for prepare in MIXED for step in (prepare, one_token)] * 2
        sides = [Side(release, coalescer=coalescer) for _ in prepares]
        try:
            for side, prepare in zip(sides, prepares, strict=True):
                prepare(side)
                side.queue()
            release(coalescer)
            outcomes.append([(side.received(), side.seen()) for side in sides])
        finally:
            for side in sides:
                side.close()
    assert outcomes[0] == outcomes[1]
    assert sum(received == chunk(TOKEN) for received, _ in outcomes[1]) >= len(MIXED) * 2


async def test_no_reference_or_memory_is_leaked(pair: Any) -> None:
    _, native = pair()
    made, coalescer, handler, stream = native.connection, native.coalescer, native.handler, native.stream

    def run(times: int) -> None:
        for _ in range(times):
            stream.write(TOKEN)
            native.queue()
            NATIVE_RELEASE(coalescer)
            native.received()

    things = (made, coalescer, handler, stream, handler._out, native.ours, TOKEN, None, False, True)
    tracemalloc.start()
    try:
        run(100)
        gc.collect()
        counts = [sys.getrefcount(thing) for thing in things]
        before, _ = tracemalloc.get_traced_memory()
        run(5_000)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
        assert [sys.getrefcount(thing) for thing in things] == counts
    finally:
        tracemalloc.stop()
    assert after - before < 4096
