"""hypercorn's own failures stay on their connection (issue 17): streams opened while
the server shuts down, and anything else hypercorn raises (llmsim/protocol/asgi/guards.py)."""

from __future__ import annotations

import logging

import h2.errors
import h2.events
import hypercorn.config
import hypercorn.trio.worker_context
import pytest
import trio
import trio.testing

from llmsim.protocol.asgi.guards import ContainedTCPServer
from tests.protocol.asgi.test_server import FakeSimulator, H2Client, IdleTracker, run_cancellable

POST = [(":method", "POST"), (":path", "/echo"), (":scheme", "http"), (":authority", "sim")]


async def _shutting_down_mid_stream(nursery: trio.Nursery) -> tuple[FakeSimulator, H2Client, trio.Event]:
    """A hypercorn server that has begun its graceful shutdown while stream 1 is streaming
    (until ``sim.app.release`` is set); the event is set once the server has stopped."""
    sim = FakeSimulator()
    handle, server_scope, server_done = await run_cancellable(nursery, sim, IdleTracker())
    client = await H2Client.connect(handle.port)
    await client.get(1, "/stream")
    await client.wait_for_data()
    server_scope.cancel()
    await trio.testing.wait_all_tasks_blocked()  # hypercorn has begun its graceful shutdown
    return sim, client, server_done


async def test_streams_opened_during_shutdown_are_refused_and_the_stream_in_flight_finishes(
    nursery: trio.Nursery,
) -> None:
    """Unguarded, the DATA of a stream refused at shutdown raised KeyError in hypercorn
    (pgjones/hypercorn#329) and a stream reset in the same read StreamClosedError: the
    connection died, cutting the stream still in flight."""
    sim, client, server_done = await _shutting_down_mid_stream(nursery)
    client.conn.send_headers(3, POST)
    client.conn.send_data(3, b"body", end_stream=True)  # same read as its HEADERS
    client.conn.send_headers(5, POST)
    client.conn.reset_stream(5)  # the client gives up on it in the same read
    await client.flush()
    resets: dict[int, int] = {}
    with trio.fail_after(5):
        while 3 not in resets:
            for event in await client.events():
                if isinstance(event, h2.events.StreamReset):
                    resets[event.stream_id] = event.error_code
        sim.app.release.set()
        ended = False
        while not ended:
            ended = any(isinstance(e, h2.events.StreamEnded) and e.stream_id == 1 for e in await client.events())
        await client.stream.aclose()
        await server_done.wait()
    assert resets == {3: h2.errors.ErrorCodes.REFUSED_STREAM}


async def test_a_stream_that_ends_during_shutdown_gets_its_end_stream(nursery: trio.Nursery) -> None:
    """Unguarded, hypercorn sent GOAWAY as the last stream closed, before its sender had
    put END_STREAM out (h2 then refused it): about half of such responses ended
    truncated.  Five servers in a row, each with one stream finishing after shutdown began."""
    for _ in range(5):
        sim, client, server_done = await _shutting_down_mid_stream(nursery)
        sim.app.release.set()
        with trio.fail_after(5):
            seen: list[h2.events.Event] = []
            while not any(isinstance(e, (h2.events.StreamEnded, h2.events.ConnectionTerminated)) for e in seen):
                seen = await client.events()
            assert any(isinstance(e, h2.events.StreamEnded) and e.stream_id == 1 for e in seen), seen
            await client.stream.aclose()
            await server_done.wait()


async def test_what_hypercorn_raises_on_a_connection_closes_that_connection_only(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream hypercorn cannot handle (an in-memory one has no socket: AttributeError)
    stands in for its bugs; the first of a kind is a WARNING, the rest are DEBUG."""
    caplog.set_level(logging.DEBUG, "llmsim.hypercorn")
    monkeypatch.setattr(ContainedTCPServer, "_seen", set())
    context = hypercorn.trio.worker_context.WorkerContext(None)
    for _ in range(2):
        client, server = trio.testing.memory_stream_pair()
        await ContainedTCPServer(None, hypercorn.config.Config(), context, {}, server).run()  # type: ignore[arg-type]
        assert await client.receive_some() == b""  # closed
    levels = [r.levelno for r in caplog.records if r.name == "llmsim.hypercorn"]
    assert levels == [logging.WARNING, logging.DEBUG]
    assert "AttributeError" in caplog.records[0].getMessage()
