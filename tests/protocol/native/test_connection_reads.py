"""The connection's reader keeps one cancel scope (the read deadline) across reads
(``Connection._read_loop``) instead of entering a new one per read: a deadline the
handler sets that has already passed still stops the next read before it takes
anything, as a new scope entered with it did (on a socket, whose receive takes what is
there before trio's scheduler has seen the deadline), and a deadline set while the
reader waits still applies to that wait."""

from __future__ import annotations

import math
import socket
from collections.abc import Callable

import attrs
import trio
import trio.testing

from llmsim.protocol.native.connection import Connection
from tests.protocol.helpers import TestApp, open_memory_connection, settings


@attrs.define(eq=False)
class Recorder:
    """A protocol handler that records what the reader hands it (switched to once the
    connection serves)."""

    connection: Connection
    log: list[str] = attrs.field(factory=list)
    timed_out: trio.Event = attrs.field(factory=trio.Event)
    on_receive: Callable[[], None] | None = None
    finished: bool = False
    arrivals: list[float | None] = attrs.field(factory=list)  # what the reader said of each read

    def receive(self, data: bytes, arrived_at: float | None = None) -> None:
        self.log.append(f"receive {data.decode()}")
        self.arrivals.append(arrived_at)
        if self.on_receive is not None:
            on_receive, self.on_receive = self.on_receive, None
            on_receive()

    def read_timed_out(self) -> bool:
        self.log.append("timed out")
        self.timed_out.set()
        self.connection.set_read_deadline(math.inf)
        return True

    def outgoing(self) -> bytes:
        return b""

    def flushed(self) -> None:
        pass

    def connection_lost(self) -> None:
        self.log.append("lost")

    def begin_shutdown(self) -> None:
        pass


async def serve_one_request(connection: Connection, client: trio.abc.Stream) -> Recorder:
    """An HTTP/1.1 request answered (the connection serves), then a :class:`Recorder`
    takes over."""
    await client.send_all(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += await client.receive_some()
    assert head.startswith(b"HTTP/1.1 200")
    recorder = Recorder(connection)
    connection.switch_to(recorder)
    return recorder


async def test_a_deadline_already_past_stops_the_next_read_before_it_takes_anything() -> None:
    raw_server, raw_client = socket.socketpair()

    def pair() -> tuple[trio.SocketStream, trio.SocketStream]:
        server = trio.SocketStream(trio.socket.from_stdlib_socket(raw_server))
        return trio.SocketStream(trio.socket.from_stdlib_socket(raw_client)), server

    async with open_memory_connection(TestApp(), settings(), pair=pair) as mc:
        connection = mc.connection
        recorder = await serve_one_request(connection, mc.client)

        def past_deadline_and_more_bytes() -> None:
            connection.set_read_deadline(trio.current_time())
            raw_client.send(b"second")  # in the server's socket buffer before its next receive

        recorder.on_receive = past_deadline_and_more_bytes
        await mc.client.send_all(b"first")
        while len(recorder.log) < 3:
            await trio.testing.wait_all_tasks_blocked()
        assert recorder.log == ["receive first", "timed out", "receive second"]


async def test_the_read_deadline_moves_while_the_reader_waits(autojump_clock: trio.testing.MockClock) -> None:
    """The scope the reader waits in follows ``set_read_deadline``, later and earlier."""
    async with open_memory_connection(TestApp(), settings(keep_alive_timeout=1000.0)) as mc:
        connection = mc.connection
        recorder = await serve_one_request(connection, mc.client)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        connection.set_read_deadline(start + 50.0)
        connection.set_read_deadline(start + 20.0)
        await recorder.timed_out.wait()
        assert recorder.log == ["timed out"] and trio.current_time() - start == 20.0
