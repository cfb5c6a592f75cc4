"""A request's clock starts when its bytes reach the host, not when the server reads them
(:mod:`llmsim.protocol.native.arrival`).

The loopback tests make the server late on purpose: the request is sent, then the trio
loop (server and client share it) is blocked for :data:`BUSY` seconds, as a server busy
with an engine step or a batch of other requests would be.  The request's
``received_at`` must still be the time it was sent, give or take far less than that.
"""

from __future__ import annotations

import math
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator

import attrs
import h11
import pytest
import trio
import trio.testing

from llmsim.config import Config
from llmsim.protocol.native import arrival
from llmsim.protocol.native.arrival import MAX_BACKDATE, StampedStream, stamped
from llmsim.protocol.native.detect import WrappedStream
from llmsim.protocol.native.server import serve_app
from tests.protocol.helpers import H1Client, H2Client, TestApp

BUSY = 0.2  # how long the server is kept from reading (seconds)
#: How far a stamped arrival may lie from the send: scheduling noise on a loaded
#: machine, far below BUSY (a read-time clock would be BUSY late).
SLACK = 0.08

pytestmark = pytest.mark.skipif(not arrival._STAMPS_POSSIBLE, reason="kernel receive stamps are Linux's")


def _stamp(seconds_ago: float) -> list[tuple[int, int, bytes]]:
    """Ancillary data as recvmsg gives it: a stamp ``seconds_ago`` on the wall clock."""
    then = time.time() - seconds_ago
    whole = int(then // 1)
    payload = struct.pack("@ll", whole, int((then - whole) * 1e9))
    return [(socket.SOL_SOCKET, arrival._SO_TIMESTAMPNS, payload)]


async def test_a_stamp_becomes_as_long_before_now_on_trios_clock() -> None:
    arrived = arrival._arrival(_stamp(0.5))
    assert arrived is not None
    assert trio.current_time() - arrived == pytest.approx(0.5, abs=0.05)


async def test_a_stamp_from_the_future_is_now_and_one_from_long_ago_is_capped() -> None:
    """The wall clock stepped back (a stamp ahead of it) or far forward."""
    future = arrival._arrival(_stamp(-30.0))
    assert future is not None and abs(trio.current_time() - future) < 0.05
    ancient = arrival._arrival(_stamp(3600.0))
    assert ancient is not None
    assert trio.current_time() - ancient == pytest.approx(MAX_BACKDATE, abs=0.05)


async def test_ancillary_data_without_a_stamp_says_nothing() -> None:
    assert arrival._arrival([(socket.SOL_SOCKET, 1, b"\0" * 16)]) is None  # SCM_RIGHTS-like, not a stamp
    assert arrival._arrival([(socket.SOL_SOCKET, arrival._SO_TIMESTAMPNS, b"\0" * 4)]) is None  # too short


async def test_only_a_tcp_stream_under_the_real_clock_is_stamped() -> None:
    left, right = trio.socket.socketpair()
    with left, right:
        assert isinstance(stamped(trio.SocketStream(left)), StampedStream)
    memory, _ = trio.testing.memory_stream_pair()
    assert stamped(memory) is memory


async def test_under_a_mock_clock_nothing_is_stamped(autojump_clock: trio.testing.MockClock) -> None:
    left, right = trio.socket.socketpair()
    with left, right:
        stream = trio.SocketStream(left)
        assert stamped(stream) is stream


async def test_a_stamped_stream_reads_and_reports_a_closed_socket() -> None:
    left, right = trio.socket.socketpair()
    stream = StampedStream(trio.SocketStream(left))
    await trio.SocketStream(right).send_all(b"bytes")
    assert await stream.receive_some(100) == b"bytes"
    assert stream.arrived_at is None  # a socketpair is not stamped: the read time is used
    with pytest.raises(ValueError):
        await stream.receive_some(0)
    right.close()
    assert await stream.receive_some() == b""  # EOF
    await stream.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await stream.receive_some()


@attrs.define(eq=False)
class BusyAfterSend(WrappedStream):
    """A client's TCP stream that, when :attr:`armed`, keeps the trio loop busy for
    :data:`BUSY` seconds right after its next send reached the kernel, before any other
    task (the server's reader) can run: a server busy with other work as the request
    arrives.  :attr:`sent_at` is when that send was made."""

    sock: socket.socket  # non-blocking, under ``stream``
    armed: bool = False
    sent_at: float = math.nan

    @classmethod
    def connect(cls, host: str, port: int) -> BusyAfterSend:
        sock = socket.create_connection((host, port))  # the kernel completes it: no accept needed
        sock.setblocking(False)
        return cls(stream=trio.SocketStream(trio.socket.from_stdlib_socket(sock)), sock=sock)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if not self.armed:
            await self.stream.send_all(data)
            return
        self.armed = False
        self.sent_at = trio.current_time()
        assert self.sock.send(data) == len(data)  # (a request: far less than a socket buffer)
        time.sleep(BUSY)
        await trio.lowlevel.checkpoint()


@pytest.fixture
async def kernel_stamps() -> AsyncIterator[None]:
    """Stamping on, for the whole test.  The kernel turns it on a moment after the first
    socket asks for it (deferred work) and off once the last one is closed: between
    tests it may be off, and a server's first packets then come unstamped (their read
    time counts, as before).  A stamped socket pair held open keeps it on, and its
    probe byte shows when it is."""
    listener = trio.socket.socket()
    arrival.enable_stamps(listener)
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = trio.socket.socket()
    await client.connect(listener.getsockname())
    server, _ = await listener.accept()
    with listener, client, server:
        with trio.fail_after(5):
            while True:
                await client.send(b"?")
                _, ancillary, _, _ = await server.recvmsg(1, arrival._ANCILLARY_SIZE)
                if ancillary:
                    break
                await trio.sleep(0.01)  # (polls the kernel's deferred switch: nothing to wait on)
        yield


def _received_at(app: TestApp, index: int = 0) -> float:
    received_at = app.requests[index].received_at
    assert received_at is not None
    return received_at


async def test_http1_requests_are_received_when_they_were_sent(nursery: trio.Nursery, kernel_stamps: None) -> None:
    """The first request of a connection (read while sniffing the protocol, before the
    connection is even accepted), then the next one, through the read loop: both by the
    fast path."""
    app = TestApp()
    handle = await nursery.start(serve_app, app, Config(port=0).server)
    wire = BusyAfterSend.connect(handle.host, handle.port)
    client = H1Client(wire)
    wire.armed = True
    head, _ = await client.request("GET", "/health")
    assert head.status_code == 200 and _received_at(app) - wire.sent_at < SLACK
    wire.armed = True
    await client.request("GET", "/health")
    assert _received_at(app, 1) - wire.sent_at < SLACK


async def test_http1_request_through_h11_is_received_when_its_head_was_sent(
    nursery: trio.Nursery, kernel_stamps: None
) -> None:
    """A head in two reads goes to h11 (not the fast path): it is received when its
    second part came."""
    app = TestApp()
    handle = await nursery.start(serve_app, app, Config(port=0).server)
    wire = BusyAfterSend.connect(handle.host, handle.port)
    client = H1Client(wire)
    events = (
        h11.Request(method="POST", target="/echo", headers=[("host", "x"), ("content-length", "2")]),
        h11.Data(data=b"hi"),
        h11.EndOfMessage(),
    )
    request = b"".join(client.conn.send(event) or b"" for event in events)
    split = request.index(b"\r\n") + 2
    await wire.send_all(request[:split])  # the request line alone
    await trio.testing.wait_all_tasks_blocked()  # the server read it
    wire.armed = True
    await wire.send_all(request[split:])
    head, _ = await client.response()
    assert head.status_code == 200 and app.requests[0].body == b"hi"
    assert _received_at(app) - wire.sent_at < SLACK


@pytest.mark.parametrize("tls", [False, True], ids=["h2c", "h2-tls"])
async def test_http2_requests_are_received_when_they_were_sent(
    nursery: trio.Nursery, tls: bool, kernel_stamps: None
) -> None:
    app = TestApp()
    handle = await nursery.start(serve_app, app, Config(port=0, self_signed_certs=tls).server)
    wire = BusyAfterSend.connect(handle.host, handle.port)
    stream: trio.abc.HalfCloseableStream = wire
    if tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # (the server's certificate is self-signed)
        context.set_alpn_protocols(["h2"])
        stream = trio.SSLStream(wire, context, server_hostname="localhost")
        await stream.do_handshake()
    client = H2Client(stream)
    await client.start()
    await trio.testing.wait_all_tasks_blocked()  # the server took the preface
    wire.armed = True
    sid = await client.request("/health")
    await client.wait_until(lambda: sid in client.records and client.records[sid].done)
    assert _received_at(app) - wire.sent_at < SLACK


async def test_a_pipelined_http1_request_is_received_when_it_is_taken_up(
    nursery: trio.Nursery, kernel_stamps: None
) -> None:
    """HTTP/1.1 answers in order: a request pipelined behind another starts when the one
    before it is answered (as behind uvicorn, where vLLM sees it only then), not when
    its bytes came."""
    app = TestApp()
    handle = await nursery.start(serve_app, app, Config(port=0).server)
    wire = BusyAfterSend.connect(handle.host, handle.port)
    wire.armed = True
    await wire.send_all(b"GET /stream?n=5 HTTP/1.1\r\nhost: x\r\n\r\nGET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    client = H1Client(wire)
    client.conn.send(h11.Request(method="GET", target="/stream?n=5", headers=[("host", "x")]))
    client.conn.send(h11.EndOfMessage())
    await client.response()
    client.conn.start_next_cycle()
    client.conn.send(h11.Request(method="GET", target="/health", headers=[("host", "x")]))
    client.conn.send(h11.EndOfMessage())
    head, _ = await client.response()
    assert head.status_code == 200 and len(app.requests) == 2
    assert _received_at(app) - wire.sent_at < SLACK
    assert _received_at(app, 1) - wire.sent_at >= BUSY  # taken up after the busy spell, once the first was answered
