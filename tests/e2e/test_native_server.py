"""``llmsim.serve`` with its native handlers and the real simulator: the basic endpoints
and a streamed chat over every transport, h2load, and clients that leave mid-stream."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable

import h11
import httpx
import pytest
import trio
import trio.testing
from h2.errors import ErrorCodes

import llmsim
from llmsim.config import Config
from llmsim.server import ServerHandle, ServerStatistics
from tests.conftest import require_tool
from tests.protocol.helpers import H1Client, H2Client

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}


async def start(nursery: trio.Nursery, **config: object) -> ServerHandle:
    return await nursery.start(llmsim.serve, Config(port=0, served_model_name=("sim-model",), **config))  # type: ignore[arg-type]


@pytest.mark.parametrize(("http1", "http2", "version"), [(True, False, "HTTP/1.1"), (False, True, "HTTP/2")])
async def test_health_models_and_a_streamed_chat(nursery: trio.Nursery, http1: bool, http2: bool, version: str) -> None:
    server = await start(nursery)
    async with httpx.AsyncClient(http1=http1, http2=http2, base_url=server.url) as client:
        health = await client.get("/health")
        models = await client.get("/v1/models")
        async with client.stream("POST", "/v1/chat/completions", json=CHAT) as chat:
            events = [line async for line in chat.aiter_lines() if line.startswith("data: ")]
    assert (health.status_code, health.http_version) == (200, version)
    assert [card["id"] for card in models.json()["data"]] == ["sim-model"]
    assert chat.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "data: [DONE]" and len(events) >= 3
    stats = server.statistics()
    assert (stats.active_streams, stats.running, stats.waiting) == (0, 0, 0)
    assert stats.requests_served == 3


async def stream_chats(client: httpx.AsyncClient, count: int) -> None:
    """``count`` streamed chats, one after the other, each read to its ``[DONE]``."""
    for _ in range(count):
        async with client.stream("POST", "/v1/chat/completions", json=CHAT) as chat:
            events = [line async for line in chat.aiter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"


class SpawnedTasks(trio.abc.Instrument):
    """The names of the tasks spawned while it is installed."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)


@pytest.mark.parametrize(("http1", "http2"), [(True, False), (False, True)], ids=["http1", "http2"])
async def test_a_streamed_chat_runs_in_no_task_of_its_own(nursery: trio.Nursery, http1: bool, http2: bool) -> None:
    """The API answers a streaming chat (or message) in ``Api.start``, called from the
    connection's reader (``start_handler``), and the engine's sink ends it: no task per
    request.  A complete answer waits for its jobs in one."""
    server = await start(nursery)
    async with httpx.AsyncClient(http1=http1, http2=http2, base_url=server.url) as client:
        assert (await client.get("/health")).status_code == 200  # the connection's own tasks run
        spawned = SpawnedTasks()
        trio.lowlevel.add_instrument(spawned)
        try:
            await stream_chats(client, 3)
            message = {"model": "sim-model", "messages": CHAT["messages"], "max_tokens": 5, "stream": True}
            async with client.stream("POST", "/v1/messages", json=message) as anthropic:
                lines = [line async for line in anthropic.aiter_lines() if line.startswith("event: ")]
            assert lines[-1] == "event: message_stop"
            complete = await client.post("/v1/chat/completions", json={**CHAT, "stream": False, "ignore_eos": True})
        finally:
            trio.lowlevel.remove_instrument(spawned)
    assert complete.json()["usage"]["completion_tokens"] == 5
    assert [name for name in spawned.names if name.startswith("llmsim.")] == ["llmsim.protocol.native.stream._answer"]


class TaskSteps(trio.abc.Instrument):
    """How many times each task (by name) ran while it is installed."""

    def __init__(self) -> None:
        self.steps: collections.Counter[str] = collections.Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task.name] += 1


@pytest.mark.parametrize(("http1", "http2"), [(True, False), (False, True)], ids=["http1", "http2"])
async def test_a_streamed_chat_wakes_no_writer_task(nursery: trio.Nursery, http1: bool, http2: bool) -> None:
    """The connection's reader sends what a request makes it write (the head) at once,
    with the write coalescer held across the handler's ``receive`` and released after
    it, and the engine's task sends the tokens and the end: the connection's writer (its
    main task, which runs ``Connection.run``) has nothing to do for a streamed chat."""
    server = await start(nursery)
    async with httpx.AsyncClient(http1=http1, http2=http2, base_url=server.url) as client:
        assert (await client.get("/health")).status_code == 200  # the connection is set up
        ran = TaskSteps()
        trio.lowlevel.add_instrument(ran)
        try:
            await stream_chats(client, 3)
        finally:
            trio.lowlevel.remove_instrument(ran)
    assert ran.steps["llmsim.protocol.native.connection.Connection._read_loop"] >= 3  # (it saw the connection)
    assert ran.steps["llmsim.protocol.native.server._NativeServer._serve_connection"] == 0


async def test_pipelined_streamed_chats_are_answered_in_order(nursery: trio.Nursery) -> None:
    """HTTP/1.1 takes a pipelined request up once the one before it was sent, which for a
    stream is usually in the engine's task (the last flush after a step, WriteCoalescer):
    the next request is then started there, with ``Api.start``, and streams in its turn."""
    server = await start(nursery, inter_token_latency=0.005)
    body = json.dumps({**CHAT, "ignore_eos": True}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    one = head + b"content-length: %d\r\n\r\n" % len(body) + body
    client = H1Client(await trio.open_tcp_stream(server.host, server.port))
    await client.stream.send_all(one * 3)
    ids = []
    for index in range(3):
        # (h11 reads only a response to a request it sent: this one is for its state; the bytes went above)
        client.conn.send(h11.Request(method="POST", target="/x", headers=[("host", "x"), ("content-length", "0")]))
        client.conn.send(h11.EndOfMessage())
        response, streamed = await client.response()
        client.conn.start_next_cycle()
        events = [line for line in streamed.decode().split("\n\n") if line]
        assert response.status_code == 200 and events[-1] == "data: [DONE]", index
        ids.append(json.loads(events[0].removeprefix("data: "))["id"])
    await client.stream.aclose()
    assert len(set(ids)) == 3
    stats = await _settle(server, lambda s: s.active_streams == 0 and s.running == 0)
    assert stats.requests_served == 3


async def test_curl_over_tls_negotiates_h2(nursery: trio.Nursery) -> None:
    server = await start(nursery, self_signed_certs=True)
    result = await trio.run_process(
        [require_tool("curl"), "-sS", "-k", "--http2", "-w", "\n%{http_version}", server.url + "/v1/models"],
        capture_stdout=True,
    )
    body, _, version = result.stdout.decode().rpartition("\n")
    assert version == "2" and '"sim-model"' in body


@pytest.mark.slow
@pytest.mark.parametrize("mode", [(), ("--h1",)])
async def test_h2load_against_health(nursery: trio.Nursery, mode: tuple[str, ...]) -> None:
    server = await start(nursery)
    result = await trio.run_process(
        [require_tool("h2load"), "-n", "2000", "-c", "10", "-m", "100", *mode, server.url + "/health"],
        capture_stdout=True,
    )
    out = result.stdout.decode()
    assert "2000 succeeded, 0 failed, 0 errored" in out, out


async def _settle(server: ServerHandle, done: Callable[[ServerStatistics], bool]) -> ServerStatistics:
    """The server's statistics once ``done`` holds (it sees the client's act as soon as
    the loopback delivers it; this only waits for that)."""
    with trio.fail_after(10):
        while not done(stats := server.statistics()):
            await trio.testing.wait_all_tasks_blocked()
    return stats


async def test_rst_stream_and_connection_close_mid_chat_cancel_the_job(nursery: trio.Nursery) -> None:
    server = await start(nursery, inter_token_latency=0.01)
    request = json.dumps({**CHAT, "max_tokens": 10_000, "ignore_eos": True}).encode()
    stream = await trio.open_tcp_stream(server.host, server.port)
    client = H2Client(stream)
    await client.start()
    headers = ((b"content-type", b"application/json"),)
    first = await client.request("/v1/chat/completions", method="POST", body=request, headers=headers)
    second = await client.request("/v1/chat/completions", method="POST", body=request, headers=headers)
    await client.wait_until(lambda: bool(client.records[first].chunks and client.records[second].chunks))
    assert server.statistics().running == 2
    client.conn.reset_stream(first, ErrorCodes.CANCEL)
    await client.flush()
    stats = await _settle(server, lambda s: s.running == 1)
    assert (stats.active_streams, stats.open_connections) == (1, 1)
    await stream.aclose()
    stats = await _settle(server, lambda s: s.open_connections == 0)
    assert (stats.active_streams, stats.running, stats.waiting) == (0, 0, 0)
