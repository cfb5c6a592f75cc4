"""The fast paths through the real handlers: HTTP/2 flow control seen by an h2 client,
HTTP/1.1 chunks as h11 would write them, and one ``send_all`` per connection per step.

The HTTP/2 property test drives a server :class:`~llmsim.protocol.native.connection.Connection`
with an h2 client that never acknowledges data on its own, so that only the windows the
test opens let bytes through.  After every step it checks, with everything settled,
that the client's receive windows equal the server's send windows (connection and
every stream), that no DATA frame exceeded the MAX_FRAME_SIZE in force, and at the end
that every body arrived whole with END_STREAM (the client's h2 would also raise on any
frame beyond a window or too large).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import h2.events
import h11
import trio
import trio.testing
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from hypothesis import given
from hypothesis import strategies as st

from llmsim.api.http import HttpRequest, ResponseStream
from llmsim.protocol.native.http2 import Http2Handler
from tests.protocol.helpers import SSE, H2Client, StreamRecord, TestApp, open_memory_connection
from tests.protocol.helpers import settings as protocol_settings

BIG = 50_000
EVENTS = 40


@attrs.define
class Observer:
    """Reads the server's bytes into the client's h2 (which enforces windows and frame
    sizes) and records every DATA frame with the MAX_FRAME_SIZE in force."""

    client: H2Client
    frame_sizes: list[tuple[int, int]] = attrs.field(factory=list)  # (frame length, limit then)

    async def run(self) -> None:
        conn = self.client.conn
        while data := await self.client.stream.receive_some(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    assert event.data is not None
                    self.frame_sizes.append((len(event.data), conn.max_inbound_frame_size))
                self.client._record(event)

    async def settle(self) -> None:
        """Until nothing moves: the server has sent all it can and the client has read it
        and sent its own pending frames (SETTINGS ACKs, WINDOW_UPDATEs)."""
        while True:
            await trio.testing.wait_all_tasks_blocked()
            pending = self.client.conn.data_to_send()
            if not pending:
                return
            await self.client.stream.send_all(pending)


def server_h2(connection: object) -> h2.connection.H2Connection:
    handler = connection.handler  # type: ignore[attr-defined]
    assert isinstance(handler, Http2Handler)
    return handler._h2


def check_windows(client: H2Client, server: h2.connection.H2Connection, sids: list[int]) -> None:
    conn = client.conn
    assert conn._inbound_flow_control_window_manager.current_window_size == server.outbound_flow_control_window
    for sid in sids:
        if sid in server.streams and not server.streams[sid].closed:
            assert conn.streams[sid].inbound_flow_control_window == server.streams[sid].outbound_flow_control_window


windows = st.one_of(st.integers(0, 200), st.sampled_from([16383, 16384, 16385, 65535]), st.integers(1000, 70000))
operations = st.one_of(
    st.tuples(st.just("window"), st.sampled_from([0, 1, 2]), windows.filter(bool)),
    st.tuples(st.just("initial_window"), st.just(0), windows),
    st.tuples(st.just("max_frame"), st.just(0), st.sampled_from([16384, 16385, 20000, 40000])),
    st.tuples(st.just("reset"), st.sampled_from([1, 2]), st.just(0)),
)


@given(initial_window=windows, max_frame=st.sampled_from([16384, 30000]), ops=st.lists(operations, max_size=12))
async def test_flow_control_windows_stay_identical_to_the_clients(
    initial_window: int, max_frame: int, ops: list[tuple[str, int, int]]
) -> None:
    app = TestApp()
    async with open_memory_connection(app, protocol_settings(high_water=2**20)) as mc:
        client = H2Client(mc.client, auto_ack=False)
        observer = Observer(client)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(observer.run)
            await client.start(INITIAL_WINDOW_SIZE=initial_window, MAX_FRAME_SIZE=max_frame)
            big = await client.request(f"/big?size={BIG}")
            stream = await client.request(f"/stream?n={EVENTS}")
            sids = [big, stream]
            server = server_h2(mc.connection)
            await observer.settle()
            check_windows(client, server, sids)
            reset: set[int] = set()
            for op, target, value in ops:
                if op == "window":
                    sid = sids[target - 1] if target else None
                    if sid is not None and (sid in reset or client.records[sid].done):
                        continue
                    client.conn.increment_flow_control_window(value, stream_id=sid)
                elif op == "initial_window":
                    client.conn.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: value})
                elif op == "max_frame":
                    client.conn.update_settings({SettingCodes.MAX_FRAME_SIZE: value})
                elif op == "reset" and sids[target - 1] not in reset and not client.records[sids[target - 1]].done:
                    reset.add(sids[target - 1])
                    client.conn.reset_stream(sids[target - 1], ErrorCodes.CANCEL)
                await client.flush()
                await observer.settle()
                check_windows(client, server, sids)
            # Open everything up: every stream that was not reset must finish whole.
            client.conn.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 2**20})
            client.conn.increment_flow_control_window(2**24)
            await client.flush()
            for sid in sids:
                if sid not in reset and not client.records[sid].done:
                    client.conn.increment_flow_control_window(2**20, stream_id=sid)
            await client.flush()
            await observer.settle()
            check_windows(client, server, sids)
            nursery.cancel_scope.cancel()
        stats = mc.tracker.statistics()
    expected = {big: b"x" * BIG, stream: b"".join(b"data: %d\n\n" % i for i in range(EVENTS)) + b"data: [DONE]\n\n"}
    for sid in sids:
        record = client.records[sid]
        if sid in reset:
            assert expected[sid].startswith(record.body) and not record.ended
        else:
            assert record.ended and record.reset is None and record.body == expected[sid]
    assert all(size <= limit for size, limit in observer.frame_sizes)
    assert stats.active_streams == 0


# --- one send per connection per step ---------------------------------------------------


@attrs.define
class StepApp:
    """Every request streams; the test plays the engine: ``step()`` writes one event to
    every open response, synchronously, as one engine step does."""

    responses: list[ResponseStream] = attrs.field(factory=list)
    opened: trio.Event = attrs.field(factory=trio.Event)
    expected: int = 0

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        response.start(200, SSE)
        self.responses.append(response)
        if len(self.responses) == self.expected:
            self.opened.set()
        await trio.sleep_forever()

    def step(self, number: int) -> None:
        for response in self.responses:
            response.write(b"data: %d\n\n" % number)


def counting_pair(counts: list[int]) -> Callable[[], tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream]]:
    def pair() -> tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream]:
        client, server = trio.testing.memory_stream_pair()
        original = server.send_stream.send_all_hook

        async def hook() -> None:
            counts.append(1)
            if original is not None:
                await original()

        server.send_stream.send_all_hook = hook
        return client, server

    return pair


async def test_http2_one_send_all_per_connection_per_step() -> None:
    app = StepApp(expected=50)
    sends: list[int] = []
    async with open_memory_connection(app, pair=counting_pair(sends)) as mc:  # type: ignore[arg-type]
        client = H2Client(mc.client)
        observer = Observer(client)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(observer.run)
            await client.start()
            sids = [await client.request("/s") for _ in range(50)]
            await app.opened.wait()
            await observer.settle()
            for number in range(5):
                sends.clear()
                app.step(number)
                await observer.settle()
                assert len(sends) == 1  # 50 streams, one event each: one write
            nursery.cancel_scope.cancel()
    for sid in sids:
        assert client.records[sid].body == b"".join(b"data: %d\n\n" % n for n in range(5))
        assert len(client.records[sid].chunks) == 5  # one DATA frame per stream per step


async def test_http1_chunks_are_h11s_bytes_and_one_send_per_step() -> None:
    app = StepApp(expected=1)
    sends: list[int] = []
    async with open_memory_connection(app, pair=counting_pair(sends)) as mc:  # type: ignore[arg-type]
        await mc.client.send_all(b"POST /s HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        await app.opened.wait()
        await trio.testing.wait_all_tasks_blocked()
        head = await mc.client.receive_some(65536)
        wire = []
        for number in range(3):
            sends.clear()
            app.step(number)
            app.step(number + 100)  # two writes in one step: still one chunk, one send
            await trio.testing.wait_all_tasks_blocked()
            assert len(sends) == 1
            wire.append(await mc.client.receive_some(65536))
        app.responses[0].end(b"data: [DONE]\n\n")
        await trio.testing.wait_all_tasks_blocked()
        wire.append(await mc.client.receive_some(65536))
    # What h11 alone makes of the same response, step by step
    reference = h11.Connection(h11.SERVER)
    reference.receive_data(b"POST /s HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
    reference.next_event()
    expected_head = reference.send(h11.Response(status_code=200, headers=list(SSE), reason=b"OK"))
    expected = [
        reference.send(h11.Data(data=b"data: %d\n\ndata: %d\n\n" % (number, number + 100))) for number in range(3)
    ]
    expected.append(
        reference.send(h11.Data(data=b"data: [DONE]\n\n")) + reference.send(h11.EndOfMessage())  # type: ignore[operator]
    )
    assert head == expected_head
    assert wire == expected


async def test_http2_many_events_per_step_leave_in_one_frame_per_stream() -> None:
    """The writer coalesces everything a stream has into as few DATA frames as its
    window and MAX_FRAME_SIZE allow (here: one per stream per step)."""
    app = TestApp()
    async with open_memory_connection(app) as mc:
        client = H2Client(mc.client)
        await client.start()
        sids = [await client.request("/burst?n=200") for _ in range(3)]
        await client.wait_until(lambda: all(client.records[sid].done for sid in sids))
    for sid in sids:
        record: StreamRecord = client.records[sid]
        assert record.body == b"".join(b"data: %d\n\n" % i for i in range(200))
        assert [len(chunk) for chunk in record.chunks] == [len(record.body)]  # 2,290 bytes, one frame


async def test_h2_forgets_closed_streams_without_walking_them_on_every_request() -> None:
    """h2's per-request open-stream count is amortized (``ServerConnection``): closed
    streams are still dropped from its table, which stays bounded."""
    app = TestApp()
    async with open_memory_connection(app, protocol_settings(max_concurrent_streams=300)) as mc:
        client = H2Client(mc.client)
        await client.start()
        sizes = []
        for _ in range(10):
            held = [await client.request("/hold") for _ in range(20)]
            sids = [await client.request("/stream?n=2") for _ in range(100)]
            await all_done(client, sids)
            sizes.append(len(server_h2(mc.connection).streams))
            app.release.set()
            await all_done(client, held)
            app.release = trio.Event()
        stats = mc.tracker.statistics()
    assert stats.requests_served == 1200 and stats.active_streams == 0
    assert max(sizes) <= 2 * 120 + 64  # at most about as many closed as open linger


async def all_done(client: H2Client, sids: list[int]) -> None:
    await client.wait_until(lambda: all(client.records[sid].done for sid in sids))


@attrs.define
class EndLaterApp:
    """Writes ten bytes, then ends without data once ``release`` is set."""

    release: trio.Event = attrs.field(factory=trio.Event)

    async def handle(self, request: HttpRequest, response: ResponseStream) -> None:
        response.start(200, SSE)
        response.write(b"x" * 10)
        await self.release.wait()
        response.end()


async def test_end_stream_waits_while_a_settings_change_left_the_window_negative() -> None:
    app = EndLaterApp()
    async with open_memory_connection(app) as mc:  # type: ignore[arg-type]
        client = H2Client(mc.client, auto_ack=False)
        observer = Observer(client)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(observer.run)
            await client.start(INITIAL_WINDOW_SIZE=10)
            sid = await client.request("/")
            await observer.settle()
            record = client.records[sid]
            assert record.body == b"x" * 10 and not record.ended
            client.conn.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 5})  # the window is now -5
            await client.flush()
            await observer.settle()
            app.release.set()
            await observer.settle()
            assert not record.ended  # an empty DATA frame would break the client (h2 raises)
            client.conn.increment_flow_control_window(4, stream_id=sid)  # -1: still waits
            await client.flush()
            await observer.settle()
            assert not record.ended
            # Back to 0: a zero-length frame fits (waiting for a positive window could
            # deadlock a client that opens windows only after END_STREAM).
            client.conn.increment_flow_control_window(1, stream_id=sid)
            await client.flush()
            await observer.settle()
            assert record.ended and record.body == b"x" * 10
            nursery.cancel_scope.cancel()
