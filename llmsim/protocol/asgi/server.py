"""``--server hypercorn``: the simulator as an ASGI app under hypercorn's trio worker.

Cancelling the scope around :func:`serve_hypercorn` is a *graceful* shutdown:
hypercorn runs in a shielded scope and is told to stop through its
``shutdown_trigger``; it stops accepting, lets in-flight requests run for
``shutdown_grace_period`` and then cancels them.  The engine task keeps stepping
until hypercorn has returned, so that draining streams still get their tokens.
"""

from __future__ import annotations

import logging
import ssl
import sys
from collections.abc import Awaitable, Callable
from typing import Protocol

import hypercorn.config
import hypercorn.trio
import trio

from llmsim.api.http import Application
from llmsim.options import ServerOptions
from llmsim.protocol.asgi import guards
from llmsim.protocol.asgi.app import AsgiApp
from llmsim.protocol.settings import MAX_HEADER_BYTES, ConnectionTracker, ServerHandle
from llmsim.protocol.tls import ALPN_PROTOCOLS, server_ssl_context

__all__ = ["SimulatorLike", "hypercorn_config", "serve_hypercorn"]

# How long past the grace period hypercorn may take to return before it is cancelled
# (hypercorn cancels its own connections at the grace period; this covers the rest).
_SHUTDOWN_SLACK = 2.0


class SimulatorLike(Protocol):
    """What :func:`serve_hypercorn` needs of :class:`llmsim.app.Simulator`."""

    @property
    def app(self) -> Application: ...

    async def run_engine(self) -> None: ...


class _HypercornConfig(hypercorn.config.Config):
    """hypercorn's Config, with the TLS context built by us rather than from files
    (so that self-signed certificates never touch the disk)."""

    def __init__(self, ssl_context: ssl.SSLContext | None) -> None:
        self._ssl_context = ssl_context

    @property
    def ssl_enabled(self) -> bool:
        return self._ssl_context is not None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        return self._ssl_context


def hypercorn_config(options: ServerOptions, ssl_context: ssl.SSLContext | None = None) -> hypercorn.config.Config:
    """The hypercorn Config equivalent to ``options`` (TLS if ``ssl_context`` is given)."""
    hc = _HypercornConfig(ssl_context)
    host = f"[{options.host}]" if ":" in options.host else options.host
    hc.bind = [f"{host}:{options.port}"]
    hc.alpn_protocols = list(ALPN_PROTOCOLS)
    hc.h2_max_concurrent_streams = options.max_concurrent_streams
    hc.h11_max_incomplete_size = MAX_HEADER_BYTES
    hc.h2_max_header_list_size = MAX_HEADER_BYTES
    hc.graceful_timeout = options.shutdown_grace_period
    hc.keep_alive_timeout = options.keep_alive_timeout
    # hypercorn has no header-read timeout (its read_timeout would also cut streams
    # whose client sends nothing while it reads), so only the TLS handshake is bounded.
    hc.ssl_handshake_timeout = options.header_read_timeout
    # After this many requests on one HTTP/2 connection hypercorn sends GOAWAY, which
    # in h2 also breaks the streams still running on it: fatal for load tests.
    hc.keep_alive_max_requests = sys.maxsize
    hc.include_server_header = False
    hc.accesslog = None
    hc.errorlog = logging.getLogger("llmsim.hypercorn")
    return hc


async def serve_hypercorn(
    sim: SimulatorLike,
    options: ServerOptions,
    tracker: ConnectionTracker,
    *,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``sim`` with hypercorn until cancelled; report a ServerHandle when bound.

    hypercorn's own failures are kept to their connection (:mod:`.guards`)."""
    guards.install()
    app = AsgiApp(sim.app, tracker, max_body_size=options.max_request_body_bytes)
    hc = hypercorn_config(options, server_ssl_context(options))
    shutdown = trio.Event()
    server_scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(_run_hypercorn, sim.run_engine, app, hc, shutdown.wait, server_scope)
        # Cancelled before this point is a hard stop; from here on it is graceful.
        server_scope.shield = True
        task_status.started(_server_handle(binds[0], tracker))
        try:
            await trio.sleep_forever()
        finally:
            shutdown.set()
            server_scope.deadline = trio.current_time() + options.shutdown_grace_period + _SHUTDOWN_SLACK


async def _run_hypercorn(
    run_engine: Callable[[], Awaitable[None]],
    app: AsgiApp,
    hc: hypercorn.config.Config,
    shutdown_trigger: Callable[[], Awaitable[None]],
    scope: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """hypercorn and the engine task, in ``scope`` (shielded once they are up)."""
    with scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_engine)
            await hypercorn.trio.serve(app, hc, shutdown_trigger=shutdown_trigger, task_status=task_status, mode="asgi")
            nursery.cancel_scope.cancel()


def _server_handle(bind_url: str, tracker: ConnectionTracker) -> ServerHandle:
    """The handle for hypercorn's bind URL (``http://127.0.0.1:PORT``, IPv6 in brackets)."""
    _, _, address = bind_url.partition("://")
    host, _, port = address.rpartition(":")
    return ServerHandle(host=host.strip("[]"), port=int(port), url=bind_url, tracker=tracker)
