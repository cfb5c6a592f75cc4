"""The blaster, in process over a socketpair: paced timing on a virtual clock, unpaced bytes.

The paced blaster is the measurement floor of the fidelity scenario, so its schedule
must be what it claims: every token at the grid time nearest its deadline (llmsim's
rule, :mod:`llmsim.engine.grid`; at once if that time has passed), deadlines chained so
that ITLs are exact, and the same events as an unpaced response.  Tests run on trio's autojump clock:
the socketpair delivers every write at once, so the clock only jumps when the pacer
sleeps, and each read is stamped with the grid time the pacer sent it at.
"""

from __future__ import annotations

import bisect
import itertools
import os
import select
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from benchmarks.loadgen import http2
from benchmarks.loadgen.blaster import Responses, render_events, serve_connection
from benchmarks.loadgen.pacer import GRID, Output, Pace, Pacer, grid_interval
from benchmarks.loadgen.records import chat_body
from llmsim.app import STEP_QUANTUM
from llmsim.engine.scheduler import step_grid

TTFT, ITL = 0.1, 0.02
#: Float sums of deadlines are a hair off the grid, as in llmsim (``_GRID_TOLERANCE``).
EPSILON = 1e-9

Event = tuple[float, bytes]  # (arrival time, SSE event)


class _Reads:
    """Everything the client received, with the time each byte arrived."""

    def __init__(self) -> None:
        self.data = b""
        self._ends: list[int] = []
        self._times: list[float] = []
        self._changed = trio.Event()

    def add(self, data: bytes) -> None:
        self.data += data
        self._ends.append(len(self.data))
        self._times.append(trio.current_time())
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, predicate: Callable[[_Reads], bool]) -> None:
        while not predicate(self):
            await self._changed.wait()

    def time_of(self, end: int) -> float:
        """When the byte before offset ``end`` arrived."""
        return self._times[bisect.bisect_left(self._ends, end)]


def _h1_responses(reads: _Reads) -> list[list[Event]]:
    """The complete chunked responses in ``reads``, one event per chunk."""
    data, responses, position = reads.data, [], 0
    while (head_end := data.find(b"\r\n\r\n", position)) >= 0:
        assert data[position:head_end].startswith(b"HTTP/1.1 200 OK\r\n")
        position, events = head_end + 4, []
        while (line_end := data.find(b"\r\n", position)) >= 0:
            size = int(data[position:line_end], 16)
            end = line_end + 2 + size + 2
            if end > len(data):
                return responses
            if size == 0:
                responses.append(events)
                position = end
                break
            events.append((reads.time_of(end), data[line_end + 2 : end - 2]))
            position = end
        else:
            return responses
    return responses


def _h2_streams(reads: _Reads) -> dict[int, list[Event]]:
    """The HTTP/2 streams in ``reads`` that ended, one event per DATA frame."""
    data, position = reads.data, 0
    streams: dict[int, list[Event]] = {}
    ended: set[int] = set()
    while len(data) - position >= 9:
        length = int.from_bytes(data[position : position + 3], "big")
        kind, flags, stream_id = data[position + 3], data[position + 4], struct.unpack_from(">I", data, position + 5)[0]
        end = position + 9 + length
        if end > len(data):
            break
        if kind == http2.DATA:
            streams.setdefault(stream_id, []).append((reads.time_of(end), data[position + 9 : end]))
            if flags & http2.END_STREAM:
                ended.add(stream_id)
        position = end
    return {stream_id: events for stream_id, events in streams.items() if stream_id in ended}


Requests = Callable[[trio.SocketStream, _Reads], Awaitable[None]]


async def _talk(pace: Pace, requests: Requests, done: Callable[[_Reads], bool]) -> _Reads:
    """Serve one connection (with its own pacer when paced); ``requests`` sends while
    this reads until ``done``."""
    server_socket, client_socket = trio.socket.socketpair()
    client = trio.SocketStream(client_socket)
    reads = _Reads()
    pacer = Pacer(pace) if pace.paced else None
    with trio.fail_after(60):  # on the autojump clock: fails at once if the pacer stalls
        async with trio.open_nursery() as nursery:
            if pacer is not None:
                nursery.start_soon(pacer.run)
            nursery.start_soon(serve_connection, trio.SocketStream(server_socket), Responses(), pacer)
            nursery.start_soon(requests, client, reads)
            while not done(reads):
                data = await client.receive_some(1 << 20)
                assert data, "the server closed the connection"
                reads.add(data)
            nursery.cancel_scope.cancel()
    return reads


def _h1_request(tokens: int) -> bytes:
    body = chat_body("m", tokens)
    return b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def _h2_request(stream_id: int, tokens: int) -> bytes:
    """HEADERS (the blaster never decodes the block) and the body with END_STREAM."""
    headers = http2.frame(http2.HEADERS, http2.END_HEADERS, stream_id, b"\x83")
    return headers + http2.frame(http2.DATA, http2.END_STREAM, stream_id, chat_body("m", tokens))


def _check_schedule(events: list[Event], start: float, tokens: int, pace: Pace) -> None:
    """The blaster's promise: the unpaced events, grouped, each on the grid after its deadline."""
    assert [event for _, event in events] == render_events(tokens)
    times = [time for time, _ in events]
    grid = grid_interval(pace.itl)
    token_times = times[1 : tokens + 1]
    assert times[0] == token_times[0], "the role chunk leaves with the first token"
    assert set(times[tokens + 1 :]) == {token_times[-1]}, "the closing events leave with the last token"
    for index, sent in enumerate(token_times):
        deadline = start + pace.ttft + index * pace.itl
        nearest = round(deadline / grid) * grid
        assert abs(nearest - deadline) <= grid / 2 + EPSILON
        assert sent == pytest.approx(max(nearest, start), abs=EPSILON), f"token {index}: due {deadline}"
    on_grid = [sent for sent in token_times if sent > start + EPSILON]
    for earlier, later in itertools.pairwise(on_grid):
        assert later - earlier == pytest.approx(pace.itl, abs=EPSILON)


def test_grid_is_llmsims() -> None:
    """Same target and same interval as llmsim's engine, so both round tokens alike."""
    assert GRID == STEP_QUANTUM
    for itl in (0.0, 0.001, 0.003, 0.007, 0.02, 0.05):
        expected = step_grid(itl, STEP_QUANTUM)
        assert grid_interval(itl) == pytest.approx(expected)


@pytest.mark.parametrize("pace", [Pace(TTFT, ITL), Pace(0.0137, 0.003), Pace(TTFT, 0.0), Pace(0.0, ITL)])
async def test_paced_http1_keeps_the_schedule(pace: Pace, autojump_clock: trio.testing.MockClock) -> None:
    """Requests in a row on one keep-alive connection, each at an off-grid time."""
    sizes = (5, 1, 2, 3)
    starts: list[float] = []

    async def requests(client: trio.SocketStream, reads: _Reads) -> None:
        for tokens in sizes:
            await trio.sleep(0.0137)  # virtual time: puts the deadlines off the grid
            starts.append(trio.current_time())
            await client.send_all(_h1_request(tokens))
            await reads.wait_for(lambda seen: len(_h1_responses(seen)) == len(starts))

    reads = await _talk(pace, requests, lambda seen: len(_h1_responses(seen)) == len(sizes))
    for events, start, tokens in zip(_h1_responses(reads), starts, sizes, strict=True):
        _check_schedule(events, start, tokens, pace)


@pytest.mark.parametrize("pace", [Pace(TTFT, ITL), Pace(0.0137, 0.003), Pace(0.0, ITL)])
async def test_paced_http2_keeps_the_schedule(pace: Pace, autojump_clock: trio.testing.MockClock) -> None:
    """Concurrent streams on one connection at different phases of the grid."""
    sizes = {1: 7, 3: 1, 5: 2, 7: 30, 9: 4}
    starts: dict[int, float] = {}

    async def requests(client: trio.SocketStream, reads: _Reads) -> None:
        await client.send_all(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0))
        for stream_id, tokens in sizes.items():
            await trio.sleep(0.0031)  # virtual time: a new phase for each stream
            starts[stream_id] = trio.current_time()
            await client.send_all(_h2_request(stream_id, tokens))

    reads = await _talk(pace, requests, lambda seen: len(_h2_streams(seen)) == len(sizes))
    assert reads.data.startswith(http2.frame(http2.SETTINGS, 0, 0, struct.pack(">HI", 0x3, 1 << 20)))
    for stream_id, events in _h2_streams(reads).items():
        _check_schedule(events, starts[stream_id], sizes[stream_id], pace)


async def test_unpaced_http1_sends_whole_responses() -> None:
    sizes = (3, 1, 200)

    async def requests(client: trio.SocketStream, reads: _Reads) -> None:
        await client.send_all(b"".join(_h1_request(tokens) for tokens in sizes))  # pipelined

    reads = await _talk(Pace(), requests, lambda seen: len(_h1_responses(seen)) == len(sizes))
    for events, tokens in zip(_h1_responses(reads), sizes, strict=True):
        assert [event for _, event in events] == render_events(tokens)


async def test_unpaced_http2_sends_whole_responses() -> None:
    sizes = {1: 3, 3: 1, 5: 200}

    async def requests(client: trio.SocketStream, reads: _Reads) -> None:
        await client.send_all(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0))
        await client.send_all(b"".join(_h2_request(stream_id, tokens) for stream_id, tokens in sizes.items()))

    reads = await _talk(Pace(), requests, lambda seen: len(_h2_streams(seen)) == len(sizes))
    for stream_id, events in _h2_streams(reads).items():
        assert [event for _, event in events] == render_events(sizes[stream_id])


def _pair(send_buffer: int = 0) -> tuple[Output, trio.SocketStream]:
    """A server-side :class:`Output` and the client end of a socketpair."""
    server_socket, client_socket = trio.socket.socketpair()
    if send_buffer:
        server_socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    return Output(trio.SocketStream(server_socket)), trio.SocketStream(client_socket)


async def _available(client: trio.SocketStream) -> bytes:
    """Everything the server sent by the time all tasks are blocked, without waiting for more."""
    await trio.testing.wait_all_tasks_blocked()
    data = b""
    while select.select([client.socket.fileno()], [], [], 0)[0]:
        data += os.read(client.socket.fileno(), 1 << 20)
    return data


async def test_output_keeps_the_order_when_the_kernel_is_full() -> None:
    """What the kernel does not take goes to the writer task, and later writes queue
    behind it even when the kernel has room again."""
    output, client = _pair(send_buffer=4096)
    pieces = [bytes([i]) * 50_000 for i in range(10)]
    sent = trio.Event()

    async def send_last() -> None:
        await output.send(b"!")  # returns once everything before it is in the kernel
        sent.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(output.run)
        for piece in pieces:
            output.write(piece)
        await trio.testing.wait_all_tasks_blocked()  # the writer task waits for room
        received = os.read(client.socket.fileno(), 10_000)  # makes room...
        output.write(b"end")  # ...which must not let this jump the queue
        nursery.start_soon(send_last)
        await trio.testing.wait_all_tasks_blocked()
        assert not sent.is_set(), "send() waits while the backlog is not in the kernel"
        expected = b"".join(pieces) + b"end!"
        while len(received) < len(expected):
            received += await client.receive_some(1 << 20)
        assert received == expected
        await sent.wait()
        nursery.cancel_scope.cancel()


async def test_output_to_a_closed_peer_closes_quietly() -> None:
    output, client = _pair()
    await client.aclose()
    output.write(b"x")
    assert output.closed
    with pytest.raises(trio.BrokenResourceError):
        await output.send(b"y")


async def test_pacer_skips_closed_connections(mock_clock: trio.testing.MockClock) -> None:
    """A connection that went away mid-stream does not disturb the others."""
    pacer = Pacer(Pace(TTFT, ITL))
    first, middle, last = groups = Responses().h1_paced(10)
    (gone, gone_client), (kept, kept_client) = _pair(), _pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pacer.run)
        pacer.add(gone, groups, 10)
        pacer.add(kept, groups, 10)
        mock_clock.jump(TTFT + 1e-6)
        assert await _available(gone_client) == await _available(kept_client) == first
        gone.close()
        mock_clock.jump(9 * ITL)  # the last token is due 1e-6 ago
        assert await _available(kept_client) == 8 * middle + last
        assert await _available(gone_client) == b"", "nothing is sent after close"
        nursery.cancel_scope.cancel()


async def test_a_late_pacer_catches_up_on_the_original_schedule(mock_clock: trio.testing.MockClock) -> None:
    """Deadlines chain from the previous deadline, not from when a token went out: after a
    stall, every token due meanwhile leaves at once and the next one is on time."""
    pacer = Pacer(Pace(TTFT, ITL))
    first, middle, _ = groups = Responses().h1_paced(10)
    output, client = _pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pacer.run)
        pacer.add(output, groups, 10)
        mock_clock.jump(TTFT + 3.5 * ITL)  # the pacer missed tokens 0 to 3
        assert await _available(client) == first + 3 * middle
        mock_clock.jump(0.5 * ITL - 1e-6)
        assert await _available(client) == b"", "token 4 is not due yet"
        mock_clock.jump(2e-6)  # token 4's grid time, not one ITL after the catch-up
        assert await _available(client) == middle
        nursery.cancel_scope.cancel()


async def test_on_the_real_clock_the_pacer_sleeps_on_a_timerfd_never_before_the_grid() -> None:
    """Off a test clock the pacer sleeps on llmsim's StepTimer (where Linux has one):
    each group still leaves no earlier than its nearest grid time, and a stream added
    while the pacer sleeps with nothing due wakes it (``fire_now``)."""
    pace = Pace(0.006, 0.004)
    pacer = Pacer(pace)
    first, middle, last = groups = Responses().h1_paced(4)
    output, client = _pair()
    arrivals: list[tuple[float, int]] = []
    expected = len(first) + 2 * len(middle) + len(last)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pacer.run)
            await trio.testing.wait_all_tasks_blocked()  # the pacer sleeps: nothing is due
            start = trio.current_time()
            pacer.add(output, groups, 4)
            received = 0
            while received < expected:
                received += len(await client.receive_some())
                arrivals.append((trio.current_time(), received))
            nursery.cancel_scope.cancel()
    grid = pacer.grid
    for index, boundary in enumerate(itertools.accumulate((len(first), len(middle), len(middle), len(last)))):
        deadline = start + pace.ttft + index * pace.itl
        arrived = next(time for time, count in arrivals if count >= boundary)
        assert arrived >= round(deadline / grid) * grid - EPSILON, f"group {index} left before its grid time"
