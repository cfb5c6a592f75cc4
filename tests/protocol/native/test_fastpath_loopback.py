"""The writer's direct socket sends (``Connection._send``) on real loopback TCP.

The writer offers each batch to the non-blocking socket first and passes whatever the
kernel did not take to trio's ``send_all``.  These tests make the kernel buffer fill
(a client that reads late), so both halves run, and check the bytes arrive whole and
in order, on HTTP/1.1 and HTTP/2.
"""

from __future__ import annotations

import json
import socket

import attrs
import h11
import pytest
import trio
import trio.testing

import llmsim
from llmsim.config import Config
from llmsim.engine.scheduler import Engine
from llmsim.protocol.native import connection
from llmsim.protocol.native.connection import _direct_socket
from llmsim.protocol.native.server import serve_app
from tests.protocol.helpers import H1Client, H2Client, TestApp

SIZE = 8_000_000  # well beyond a loopback socket's send buffer


@attrs.define
class RecordingSocket:
    """Delegates to the real socket and records (offered, taken) per direct send."""

    sock: socket.socket
    sends: list[tuple[int, int]]

    def send(self, data: bytes) -> int:
        try:
            taken = self.sock.send(data)
        except BlockingIOError:
            self.sends.append((len(data), 0))
            raise
        self.sends.append((len(data), taken))
        return taken


@pytest.fixture
def direct_sends(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    sends: list[tuple[int, int]] = []

    def recording(transport: trio.abc.Stream) -> RecordingSocket | None:
        sock = _direct_socket(transport)
        return None if sock is None else RecordingSocket(sock, sends)

    monkeypatch.setattr(connection, "_direct_socket", recording)
    return sends


async def test_direct_socket_is_the_plain_tcp_socket_only() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listeners[0]:
        port = listeners[0].socket.getsockname()[1]
        client = await trio.open_tcp_stream("127.0.0.1", port)
        server = await listeners[0].accept()
        async with client, server:
            direct = _direct_socket(server)
            assert direct is not None and direct.fileno() == server.socket.fileno() and not direct.getblocking()
    assert _direct_socket(trio.testing.memory_stream_pair()[0]) is None  # type: ignore[arg-type]


async def test_a_late_reader_gets_every_byte_in_order_on_http1(
    nursery: trio.Nursery, direct_sends: list[tuple[int, int]]
) -> None:
    app = TestApp()
    handle = await nursery.start(serve_app, app, Config(port=0).server)
    stream = await trio.open_tcp_stream(handle.host, handle.port)
    client = H1Client(stream)
    await client.send(
        h11.Request(method="GET", target=f"/big?size={SIZE}", headers=[("host", "x")]), h11.EndOfMessage()
    )
    await trio.sleep(0.3)  # the kernel buffers fill; the writer waits in send_all
    head, body = await client.response()
    assert head.status_code == 200 and body == b"x" * SIZE
    client.conn.start_next_cycle()
    head, body = await client.request("GET", "/stream?n=300")  # keep-alive, then many small writes
    assert body == b"".join(b"data: %d\n\n" % i for i in range(300)) + b"data: [DONE]\n\n"
    await stream.aclose()
    assert any(taken < offered for offered, taken in direct_sends)  # the rest went through send_all
    assert any(taken == offered for offered, taken in direct_sends)


async def test_a_late_reader_gets_every_byte_in_order_on_http2(
    nursery: trio.Nursery, direct_sends: list[tuple[int, int]]
) -> None:
    app = TestApp()
    handle = await nursery.start(serve_app, app, Config(port=0).server)
    stream = await trio.open_tcp_stream(handle.host, handle.port)
    client = H2Client(stream)
    await client.start(INITIAL_WINDOW_SIZE=2**30, MAX_FRAME_SIZE=2**20)
    client.conn.increment_flow_control_window(2**30)
    await client.flush()
    big = await client.request(f"/big?size={SIZE}")
    small = [await client.request("/stream?n=100") for _ in range(5)]
    await trio.sleep(0.3)
    await client.wait_until(lambda: all(client.records[sid].done for sid in (big, *small)))
    assert client.records[big].body == b"x" * SIZE and client.records[big].ended
    for sid in small:
        assert client.records[sid].body == b"".join(b"data: %d\n\n" % i for i in range(100)) + b"data: [DONE]\n\n"
    await stream.aclose()
    assert any(taken < offered for offered, taken in direct_sends)
    assert any(taken == offered for offered, taken in direct_sends)


async def test_with_the_real_engine_a_connection_flushes_at_most_once_per_engine_step(
    nursery: trio.Nursery, direct_sends: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 streamed chats of 200 tokens on one HTTP/2 connection at zero latency: 10,000
    tokens, but the connection's writer sends once per engine step (plus the batches
    of response heads), never once per token or per stream."""
    steps: list[float] = []
    step = Engine.step

    def counting_step(self: Engine, now: float) -> None:
        steps.append(now)
        step(self, now)

    monkeypatch.setattr(Engine, "step", counting_step)
    config = Config(port=0, time_to_first_token=0.0, inter_token_latency=0.0, max_num_seqs=100)
    handle = await nursery.start(llmsim.serve, config)
    stream = await trio.open_tcp_stream(handle.host, handle.port)
    client = H2Client(stream)
    await client.start()
    await client.wait_until(lambda: client.conn.remote_settings.max_concurrent_streams > 100)
    body = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 200, "ignore_eos": True}
    ).encode()
    headers = ((b"content-type", b"application/json"),)
    sids = [await client.request("/v1/chat/completions", method="POST", body=body, headers=headers) for _ in range(50)]
    await client.wait_until(lambda: all(client.records[sid].done for sid in sids))
    await stream.aclose()
    for sid in sids:
        record = client.records[sid]
        # one chunk per token, the last with the finish reason (vLLM's chat_completion/serving.py:796-809)
        assert record.ended and record.body.count(b'"delta":{"content":') == 200
    assert len(direct_sends) <= len(steps) + 50 + 4  # per step (and per response head, at worst)
    assert len(direct_sends) < 10_000 / 10
