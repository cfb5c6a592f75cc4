"""The native server: the listener, the connections, and graceful shutdown.

Cancelling the scope that runs :func:`serve_app` is a graceful shutdown: the listener
closes at once, every HTTP/2 connection gets a GOAWAY naming its last stream, idle
HTTP/1.1 connections close, and in-flight responses (and the engine that produces
them) keep running for up to ``shutdown_grace_period`` seconds.  Then everything left
is cancelled.  The connections and the engine run in a cancel scope that is shielded
once the server is up, so that the caller's cancellation reaches them only through
this sequence.

**The connection cap** (``--max-connections``, by default the open-file limit less a
tenth of it, at least 64 kept for everything else the process opens).  At the cap, a new
connection displaces the connection that has had no response in flight for longest (one
still negotiating, trickling a request, or idle between requests: a slow or silent
client goes before a keep-alive client between two requests), which is closed as at
shutdown (HTTP/2 gets a GOAWAY).  Slow and idle clients cannot shut everyone else out,
and ``/health`` stays reachable for as long as any connection is not busy.  When every
connection has a response in flight, new ones wait in the listen backlog until a
response ends.  When ``accept`` fails for want of file descriptors (EMFILE and its
kin) the loop evicts the same way and backs off, logging one line per burst rather
than a traceback per attempt (which is what :func:`trio.serve_listeners` does).
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket
from collections.abc import Awaitable, Callable
from functools import partial

import attrs
import trio

from llmsim.api.http import Application
from llmsim.options import LimitOptions, ServerOptions
from llmsim.protocol.native.arrival import enable_stamps
from llmsim.protocol.native.connection import Connection, WriteCoalescer
from llmsim.protocol.native.faulty import FaultInjection
from llmsim.protocol.settings import ConnectionTracker, ProtocolSettings, ServerHandle
from llmsim.protocol.tls import server_ssl_context

__all__ = ["ConnectionStreams", "default_max_connections", "open_listener", "serve_app"]

log = logging.getLogger("llmsim.server")

LISTEN_BACKLOG = 4096
#: ``accept`` errors that mean "no room for one more socket now" (trio's own list).
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
#: The first and the longest pause between two ``accept`` attempts that found no room.
BACKOFF_FIRST, BACKOFF_MAX = 0.01, 0.5
#: A burst of failed accepts (logged once) ends after this long without a failure.
BURST_QUIET = 5.0
#: File descriptors the default cap leaves for everything else (logs, files, the TLS
#: context, the engine): a tenth of the limit, at least this many.
FD_RESERVE = 64


async def serve_app(
    app: Application,
    options: ServerOptions,
    *,
    tracker: ConnectionTracker | None = None,
    background: Callable[[], Awaitable[None]] | None = None,
    coalescer: WriteCoalescer | None = None,
    limits: LimitOptions | None = None,
    faults: FaultInjection | None = None,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` with the native HTTP/1.1 + HTTP/2 handlers until cancelled.

    ``background`` (the engine driver) runs beside the connections and, like them,
    keeps running through the shutdown grace period.  ``coalescer``, held by the
    engine driver around its steps, lets it send what a step wrote itself.
    ``faults``: ``--fault`` and the count of injected faults (:mod:`.faulty`).
    """
    limits = limits or LimitOptions()
    settings = ProtocolSettings.from_options(options, server_ssl_context(options), limits)
    settings = attrs.evolve(settings, faults=faults)
    cap = limits.max_connections or default_max_connections()
    # --workers: every worker process binds the same port; the kernel spreads connections
    listener = await open_listener(options.host, options.port, reuse_port=options.workers > 1)
    server = _NativeServer(app, settings, tracker or ConnectionTracker(), coalescer, cap)
    await server.run(listener, background, task_status)


async def open_listener(host: str, port: int, *, reuse_port: bool = False) -> trio.SocketListener:
    """One listening socket on the first address ``host`` resolves to (port 0: any free port);
    ``reuse_port``: shared with other processes of this user (``SO_REUSEPORT``)."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = trio.socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        await sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
        enable_stamps(sock)  # a request's clock starts when its bytes arrive (.arrival)
    except OSError as exc:
        sock.close()
        raise OSError(
            exc.errno,
            f"cannot listen on {host}:{port}: {exc.strerror}; choose another --host/--port (port 0 picks a free one)",
        ) from exc
    return trio.SocketListener(sock)


def default_max_connections(fd_limit: int | None = None) -> int:
    """The default ``--max-connections``: ``fd_limit`` (the process's soft open-file
    limit) less a tenth of it, at least :data:`FD_RESERVE`; 1,024 gives 922."""
    if fd_limit is None:
        fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if fd_limit == resource.RLIM_INFINITY:
            fd_limit = 1 << 20
    return max(1, fd_limit - max(FD_RESERVE, fd_limit // 10))


def _url(scheme: str, host: str, port: int) -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


@attrs.define(eq=False)
class ConnectionStreams(ConnectionTracker):
    """The server's tracker as one connection sees it: every count goes to ``server``,
    and ``own_streams`` counts this connection's streams in flight (none: the
    connection may be displaced at the cap).  ``on_idle`` runs when it drops to none."""

    server: ConnectionTracker = attrs.field(factory=ConnectionTracker)
    on_idle: Callable[[], None] = attrs.field(default=lambda: None)
    own_streams: int = 0

    def connection_opened(self) -> None:
        self.server.connection_opened()

    def connection_closed(self) -> None:
        self.server.connection_closed()

    def stream_opened(self) -> None:
        self.own_streams += 1
        self.server.stream_opened()

    def stream_closed(self) -> None:
        self.own_streams -= 1
        self.server.stream_closed()
        if not self.own_streams:
            self.on_idle()

    def request_served(self) -> None:
        self.server.request_served()


@attrs.define
class _Burst:
    """Failed accepts close together: one log line when they start, one when they stop."""

    started: float = 0.0
    last_failure: float = 0.0
    failures: int = 0
    streak: int = 0  # failures since the last accept
    delay: float = 0.0  # the back-off before the next attempt


@attrs.define(eq=False)
class _NativeServer:
    app: Application
    settings: ProtocolSettings
    tracker: ConnectionTracker
    coalescer: WriteCoalescer | None
    max_connections: int
    # Least recently active first: a connection moves to the end when accepted and
    # whenever its last response ends (a dict keeps insertion order).
    _connections: dict[Connection, ConnectionStreams] = attrs.field(factory=dict, init=False)
    _evicted: set[Connection] = attrs.field(factory=set, init=False)  # displaced, not closed yet
    _room: trio.Event = attrs.field(factory=trio.Event, init=False)  # set when one may have made room
    _burst: _Burst = attrs.field(factory=_Burst, init=False)
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
            nursery.start_soon(self._accept_loop, listener, core_nursery)
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

    # --- accepting, within the cap ------------------------------------------------------
    async def _accept_loop(
        self, listener: trio.abc.Listener[trio.abc.HalfCloseableStream], handlers: trio.Nursery
    ) -> None:
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in CAPACITY_ERRNOS:
                        raise
                    await self._back_off(exc.errno)
                    continue
                self._accepted()
                streams = ConnectionStreams(server=self.tracker)
                connection = Connection(stream, self.app, self.settings, streams, self.coalescer)
                streams.on_idle = partial(self._went_idle, connection)
                self._connections[connection] = streams
                try:
                    await self._wait_for_room(connection)
                except BaseException:  # shutdown came first: it is never served
                    del self._connections[connection]
                    with trio.CancelScope(shield=True):
                        await trio.aclose_forcefully(stream)
                    raise
                handlers.start_soon(self._serve_connection, connection)

    async def _wait_for_room(self, new: Connection) -> None:
        """Return once ``new`` fits under the cap, displacing an older connection if need
        be; meanwhile ``new`` waits unserved and nothing more is accepted."""
        while len(self._connections) - len(self._evicted) > self.max_connections:
            if self._evict_one(new):
                return
            self._room = trio.Event()
            await self._room.wait()

    def _evict_one(self, new: Connection | None = None) -> bool:
        """Close the connection idle for longest, as at shutdown; False if all are busy."""
        for connection, streams in self._connections.items():
            if not streams.own_streams and connection is not new and connection not in self._evicted:
                self._evicted.add(connection)
                connection.begin_shutdown()
                return True
        return False

    def _went_idle(self, connection: Connection) -> None:
        """``connection``'s last response ended: it is now the most recently active, and
        it may be displaced if a new one waits for room."""
        if connection in self._connections:
            self._connections[connection] = self._connections.pop(connection)
        self._room.set()

    async def _back_off(self, code: int) -> None:
        """``accept`` found no file descriptor: make room, wait, log once per burst."""
        burst, now = self._burst, trio.current_time()
        if not burst.failures:
            burst.started = now
            log.warning(
                "cannot accept connections: %s (%s) with %d open (--max-connections %d); "
                "closing idle ones and retrying, with back-off, until it clears",
                errno.errorcode.get(code, code),
                os.strerror(code),
                len(self._connections),
                self.max_connections,
            )
        burst.failures += 1
        burst.last_failure = now
        # The first retry only lets the connection closed here go (its fd is then free);
        # from the second on, the back-off grows.
        burst.delay = min(BACKOFF_MAX, max(BACKOFF_FIRST, 2 * burst.delay)) if burst.streak else 0.0
        burst.streak += 1
        self._evict_one()
        await trio.sleep(burst.delay)

    def _accepted(self) -> None:
        """A connection was accepted: the back-off starts over, and a burst of failures
        ends once :data:`BURST_QUIET` seconds have passed without one."""
        burst = self._burst
        burst.delay, burst.streak = 0.0, 0
        if burst.failures and trio.current_time() - burst.last_failure >= BURST_QUIET:
            elapsed = burst.last_failure - burst.started
            log.info("accepting again: %d accepts had failed over %.1f s", burst.failures, elapsed)
            self._burst = _Burst()

    async def _serve_connection(self, connection: Connection) -> None:
        if self._shutting_down:
            connection.begin_shutdown()
        try:
            await connection.run()
        finally:
            del self._connections[connection]
            self._evicted.discard(connection)
            self._room.set()
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
