"""An application that ends on its own once its response closes (``ends_on_close``, see
``Application`` in llmsim.api.http) runs in no cancel scope of its own: a client that
goes away ends its handler through the close callbacks, not by cancelling it; shutdown
still cancels what is left."""

from __future__ import annotations

import attrs
import trio
import trio.testing

from llmsim.api.http import HttpRequest, ResponseStream
from llmsim.config import Config
from llmsim.protocol.settings import ServerHandle
from tests.protocol.helpers import H2Client, TestApp, open_memory_connection, serve_until_cancelled


@attrs.define(eq=False)
class ClosingApp(TestApp):
    """TestApp whose ``/hold`` also ends when its response closes; ``/stubborn`` holds
    whatever happens to its response (an application that breaks its promise)."""

    __test__ = False
    ends_on_close = True

    async def _route(self, request: HttpRequest, response: ResponseStream) -> None:
        if request.path == "/stubborn":
            response.start(200, ())
            self.holding.set()
            await trio.sleep_forever()
        if request.path != "/hold":
            await super()._route(request, response)
            return
        closed = trio.Event()
        response.on_close(closed.set)
        response.start(200, ())
        response.write(b"data: first\n\n")
        self.holding.set()
        await closed.wait()


async def test_a_client_gone_ends_the_handler_through_its_close_callback_on_http1() -> None:
    app = ClosingApp()
    async with open_memory_connection(app) as mc:
        await mc.client.send_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        await app.holding.wait()
        await mc.client.aclose()
        await mc.done.wait()
        stats = mc.tracker.statistics()
    assert app.log == ["start /hold", "closed /hold", "end /hold"]  # returned: never cancelled
    assert (stats.open_connections, stats.active_streams) == (0, 0)


async def test_a_reset_stream_ends_its_handler_and_leaves_the_others_on_http2() -> None:
    app = ClosingApp()
    async with open_memory_connection(app) as mc:
        client = H2Client(mc.client)
        await client.start()
        held = await client.request("/hold")
        await app.holding.wait()
        client.conn.reset_stream(held)
        await client.flush()
        answered = await client.request("/echo")
        await client.wait_until(lambda: client.records[answered].done)
        await trio.testing.wait_all_tasks_blocked()
        assert mc.tracker.statistics().active_streams == 0
    assert app.log[:3] == ["start /hold", "closed /hold", "end /hold"]
    assert "cancelled /hold" not in app.log


async def test_shutdown_still_cancels_a_handler_that_did_not_end(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    app = ClosingApp()
    scope, done = trio.CancelScope(), trio.Event()
    handle: ServerHandle = await nursery.start(
        serve_until_cancelled, app, Config(port=0, shutdown_grace_period=4.0), scope, done
    )
    stream = await trio.open_tcp_stream(handle.host, handle.port)
    await stream.send_all(b"GET /stubborn HTTP/1.1\r\nHost: x\r\n\r\n")
    await app.holding.wait()
    scope.cancel()
    await done.wait()
    assert sorted(app.log) == ["cancelled /stubborn", "closed /stubborn", "start /stubborn"]
    assert handle.statistics().active_streams == 0
