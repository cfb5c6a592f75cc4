"""The native server: the listener, the connections, and graceful shutdown.

Cancelling the scope that runs :func:`serve_app` is a graceful shutdown: the listener
closes at once, every HTTP/2 connection gets a GOAWAY naming its last stream, idle
HTTP/1.1 connections close, and in-flight responses (and the engine that produces
them) keep running for up to ``shutdown_grace_period`` seconds.  Then everything left
is cancelled.  The connections and the engine run in a cancel scope that is shielded
once the server is up, so that the caller's cancellation reaches them only through
this sequence.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from functools import partial

import attrs
import trio

from llmsim.api.http import Application
from llmsim.options import ServerOptions
from llmsim.protocol.native.connection import Connection, WriteCoalescer
from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings, ServerHandle
from llmsim.protocol.tls import server_ssl_context

__all__ = ["open_listener", "serve_app"]

LISTEN_BACKLOG = 4096


async def serve_app(
    app: Application,
    options: ServerOptions,
    *,
    tracker: ConnectionTracker | None = None,
    background: Callable[[], Awaitable[None]] | None = None,
    coalescer: WriteCoalescer | None = None,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` with the native HTTP/1.1 + HTTP/2 handlers until cancelled.

    ``background`` (the engine driver) runs beside the connections and, like them,
    keeps running through the shutdown grace period.  ``coalescer``, held by the
    engine driver around its steps, lets it send what a step wrote itself.
    """
    settings = ProtocolSettings.from_options(options, server_ssl_context(options))
    listener = await open_listener(options.host, options.port)
    server = _NativeServer(app, settings, tracker or ConnectionTracker(), coalescer)
    await server.run(listener, background, task_status)


async def open_listener(host: str, port: int) -> trio.SocketListener:
    """One listening socket on the first address ``host`` resolves to (port 0: any free port)."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = trio.socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        await sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise OSError(
            exc.errno,
            f"cannot listen on {host}:{port}: {exc.strerror}; choose another --host/--port (port 0 picks a free one)",
        ) from exc
    return trio.SocketListener(sock)


def _url(scheme: str, host: str, port: int) -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


@attrs.define(eq=False)
class _NativeServer:
    app: Application
    settings: ProtocolSettings
    tracker: ConnectionTracker
    coalescer: WriteCoalescer | None
    _connections: set[Connection] = attrs.field(factory=set, init=False)
    _shutting_down: bool = attrs.field(default=False, init=False)
    _all_closed: trio.Event = attrs.field(factory=trio.Event, init=False)

    async def run(
        self,
        listener: trio.SocketListener,
        background: Callable[[], Awaitable[None]] | None,
        task_status: trio.TaskStatus[ServerHandle],
    ) -> None:
        core = trio.CancelScope()
        host, port = listener.socket.getsockname()[:2]
        scheme = "https" if self.settings.ssl_context is not None else "http"
        handle = ServerHandle(host=host, port=port, url=_url(scheme, host, port), tracker=self.tracker)
        async with trio.open_nursery() as nursery:
            core_nursery: trio.Nursery = await nursery.start(self._run_core, core, background)
            core.shield = True  # from here on, cancellation means graceful shutdown
            await nursery.start(
                partial(trio.serve_listeners, self._serve_connection, [listener], handler_nursery=core_nursery)
            )
            task_status.started(handle)
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await self._shut_down()
                core.cancel()

    async def _run_core(
        self,
        core: trio.CancelScope,
        background: Callable[[], Awaitable[None]] | None,
        *,
        task_status: trio.TaskStatus[trio.Nursery],
    ) -> None:
        """The connections and the background task, in ``core``."""
        with core:
            async with trio.open_nursery() as nursery:
                if background is not None:
                    nursery.start_soon(background)
                task_status.started(nursery)
                await trio.sleep_forever()

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        connection = Connection(stream, self.app, self.settings, self.tracker, self.coalescer)
        self._connections.add(connection)
        if self._shutting_down:
            connection.begin_shutdown()
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)
            if self._shutting_down and not self._connections:
                self._all_closed.set()

    async def _shut_down(self) -> None:
        """GOAWAY / close idle connections, then wait for the rest up to the grace period."""
        self._shutting_down = True
        for connection in list(self._connections):
            connection.begin_shutdown()
        if not self._connections:
            return
        with trio.move_on_after(self.settings.shutdown_grace_period):
            await self._all_closed.wait()
