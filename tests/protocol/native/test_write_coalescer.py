"""What an engine step writes is sent from the engine's task (``WriteCoalescer``).

While the engine steps, connections that get output are only queued; after the step
``Connection.flush_now`` sends each one's batch with one non-blocking send, and only
what the kernel does not take goes to the connection's writer task.  These tests run
the real server and engine on loopback TCP and check that (1) token batches leave
without waking the writer, (2) when the kernel refuses part of a batch, everything
still arrives whole and in order, on HTTP/1.1 and HTTP/2, and (3) the coalescer's
bookkeeping is exact.
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
from llmsim.protocol.native import connection
from llmsim.protocol.native.connection import Connection, WriteCoalescer, _direct_socket
from tests.protocol.helpers import H1Client, H2Client

TOKENS = 20_000  # about 3 MB of SSE: far beyond a loopback socket's buffers


def chat_body(max_tokens: int) -> bytes:
    return json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": max_tokens, "ignore_eos": True}
    ).encode()


@attrs.define
class RefusingSocket:
    """The real socket; ``refused`` is set the first time the kernel takes less than offered."""

    sock: socket.socket
    refused: trio.Event

    def send(self, data: bytes) -> int:
        try:
            taken = self.sock.send(data)
        except BlockingIOError:
            taken = 0
        if taken < len(data):
            self.refused.set()
        if not taken:
            raise BlockingIOError
        return taken


@pytest.fixture
def refused(monkeypatch: pytest.MonkeyPatch) -> trio.Event:
    event = trio.Event()

    def wrapping(transport: trio.abc.Stream) -> RefusingSocket | None:
        sock = _direct_socket(transport)
        return None if sock is None else RefusingSocket(sock, event)

    monkeypatch.setattr(connection, "_direct_socket", wrapping)
    return event


@attrs.define
class SendCounts:
    inline: int = 0  # batches flush_now sent from the engine's task
    writer: int = 0  # batches the writer task sent


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> SendCounts:
    counted = SendCounts()
    flush_now, send = Connection.flush_now, Connection._send

    def counting_flush(self: Connection) -> None:
        before = self._dirty
        flush_now(self)
        counted.inline += before and not self._dirty and self._backlog is None

    async def counting_send(self: Connection, data: bytes | memoryview) -> bool:
        counted.writer += 1
        return await send(self, data)

    monkeypatch.setattr(Connection, "flush_now", counting_flush)
    monkeypatch.setattr(Connection, "_send", counting_send)
    return counted


def sse_events(body: bytes) -> list[bytes]:
    assert body.endswith(b"\n\n")
    return body[:-2].split(b"\n\n")


def assert_whole_chat_stream(body: bytes, tokens: int) -> None:
    """Role chunk, one chunk per token (the last with the finish reason, as vLLM's
    chat_completion/serving.py:796-809), [DONE]: in this order, none lost."""
    events = sse_events(body)
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(event.removeprefix(b"data: ")) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    contents = [chunk["choices"][0]["delta"].get("content") for chunk in chunks[1:]]
    assert len(contents) == tokens and all(isinstance(text, str) for text in contents)


async def send_h2_chats(
    handle: llmsim.ServerHandle, count: int, tokens: int, **settings: int
) -> tuple[H2Client, list[int]]:
    """An HTTP/2 client whose receive windows never fill, with ``count`` streamed chats
    of ``tokens`` tokens sent on it."""
    client = H2Client(await trio.open_tcp_stream(handle.host, handle.port))
    await client.start(INITIAL_WINDOW_SIZE=2**30, **settings)
    client.conn.increment_flow_control_window(2**30)
    await client.flush()
    headers = ((b"content-type", b"application/json"),)
    body = chat_body(tokens)
    sids = [
        await client.request("/v1/chat/completions", method="POST", body=body, headers=headers) for _ in range(count)
    ]
    return client, sids


async def receive_whole_chats(client: H2Client, sids: list[int], tokens: int) -> None:
    """Read until every stream ended, close, and check each is a whole chat stream."""
    await client.wait_until(lambda: all(client.records[sid].done for sid in sids))
    await client.stream.aclose()
    for sid in sids:
        assert client.records[sid].ended
        assert_whole_chat_stream(client.records[sid].body, tokens)


async def test_token_batches_leave_from_the_engine_task_without_waking_writers(
    nursery: trio.Nursery, counts: SendCounts, autojump_clock: trio.testing.MockClock
) -> None:
    """20 paced streams of 200 tokens (a step every millisecond): the token batches go
    out from the engine's task; the writer sends only what arrives between steps
    (SETTINGS, request intake), a bounded number per request whatever the length.
    (On the autojump clock: a loaded machine, which delays steps in real time, would
    change how many writes fall between steps.)"""
    streams, tokens = 20, 200
    config = Config(port=0, time_to_first_token=0.005, inter_token_latency=0.001, max_num_seqs=100)
    handle = await nursery.start(llmsim.serve, config)
    client, sids = await send_h2_chats(handle, streams, tokens)  # no flow-control waits
    await receive_whole_chats(client, sids, tokens)
    assert counts.writer <= 2 * streams + 10
    assert counts.inline >= 150  # a batch per step: about 200 steps of the virtual clock


async def test_a_full_socket_during_steps_loses_and_reorders_nothing_on_http1(
    nursery: trio.Nursery, refused: trio.Event
) -> None:
    config = Config(port=0, time_to_first_token=0.0, inter_token_latency=0.0)
    handle = await nursery.start(llmsim.serve, config)
    stream = await trio.open_tcp_stream(handle.host, handle.port)
    client = H1Client(stream)
    body = chat_body(TOKENS)
    await client.send(
        h11.Request(
            method="POST",
            target="/v1/chat/completions",
            headers=[("host", "x"), ("content-type", "application/json"), ("content-length", str(len(body)))],
        ),
        h11.Data(data=body),
        h11.EndOfMessage(),
    )
    await refused.wait()  # the client has not read a byte: the kernel refused part of a batch
    head, response = await client.response()
    await stream.aclose()
    assert head.status_code == 200
    assert_whole_chat_stream(response, TOKENS)


async def test_a_full_socket_during_steps_loses_and_reorders_nothing_on_http2(
    nursery: trio.Nursery, refused: trio.Event
) -> None:
    config = Config(port=0, time_to_first_token=0.0, inter_token_latency=0.0)
    handle = await nursery.start(llmsim.serve, config)
    client, sids = await send_h2_chats(handle, 4, TOKENS // 4, MAX_FRAME_SIZE=2**20)
    await refused.wait()
    await receive_whole_chats(client, sids, TOKENS // 4)


@attrs.define(eq=False)
class FakeConnection:
    flushed: int = 0

    def flush_now(self) -> None:
        self.flushed += 1


def test_release_flushes_every_deferred_connection_once_and_stops_holding() -> None:
    coalescer = WriteCoalescer()
    first, second = FakeConnection(), FakeConnection()
    coalescer.hold()
    assert coalescer.held
    coalescer.defer(first)  # type: ignore[arg-type]
    coalescer.defer(second)  # type: ignore[arg-type]
    coalescer.release()
    assert not coalescer.held
    assert (first.flushed, second.flushed) == (1, 1)
    coalescer.release()  # nothing deferred since: nothing flushed again
    assert (first.flushed, second.flushed) == (1, 1)
