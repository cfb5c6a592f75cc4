"""``serve()``: one simulator behind the server backend its configuration names.

This is wiring, not protocol: it builds the :class:`~llmsim.app.Simulator` (engine and
API) and hands its application to the native handlers
(:mod:`llmsim.protocol.native.server`) or to hypercorn (:mod:`llmsim.protocol.asgi.server`).
"""

from __future__ import annotations

from functools import partial

import attrs
import trio

from llmsim.app import Simulator
from llmsim.config import Config
from llmsim.logs import CacheReading, ServerLog
from llmsim.protocol.native.connection import WriteCoalescer
from llmsim.protocol.native.server import serve_app
from llmsim.protocol.settings import ConnectionTracker, EngineLoad, ServerHandle, ServerStatistics

__all__ = ["ServerHandle", "ServerStatistics", "serve"]


async def serve(config: Config, *, task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED) -> None:
    """Run a simulator for ``config`` until cancelled; ``nursery.start`` returns its handle.

    It logs (:mod:`llmsim.logs`) the banner once bound, the stats line every 10 s beside
    the engine (unless ``--disable-log-stats``) and a summary once it has shut down.
    A server that cannot start raises what its backend raised (an ``OSError`` for a
    port in use), not wrapped in a group of this function's own."""
    sim = Simulator(config)
    engine = sim.engine

    def cache() -> CacheReading:
        metrics = engine.metrics
        return CacheReading(engine.kv_cache_usage, metrics.prefix_cache_queries, metrics.prefix_cache_hits)

    server_log = ServerLog(config, engine.statistics, cache=cache)
    if not config.control.disable_log_stats:
        sim.beside_engine.append(server_log.report_stats)
    try:
        await _serve_backend(sim, config, task_status=_Announcing(task_status, server_log))
    finally:
        server_log.stopped()


@attrs.frozen
class _Announcing:
    """The caller's task status, with the banner logged when the server is bound."""

    task_status: trio.TaskStatus[ServerHandle]
    server_log: ServerLog

    def started(self, value: ServerHandle | None = None) -> None:
        if value is None:
            raise TypeError("serve() reports a ServerHandle when it is bound")
        self.server_log.listening(value.url)
        self.task_status.started(value)


async def _serve_backend(
    sim: Simulator, config: Config, *, task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED
) -> None:
    """``sim`` behind the backend ``config`` names."""

    def load() -> EngineLoad:
        stats = sim.engine.statistics()
        return EngineLoad(
            running=stats.running,
            waiting=stats.waiting,
            prompt_tokens=stats.prompt_tokens,
            generation_tokens=stats.generated_tokens,
            requests_finished=sum(sim.engine.metrics.request_success.values()),
        )

    tracker = ConnectionTracker(load=load)
    if config.server.backend == "hypercorn":
        from llmsim.protocol.asgi.server import serve_hypercorn  # hypercorn loads only when asked for

        await serve_hypercorn(sim, config.server, tracker, task_status=task_status)
    else:
        coalescer = WriteCoalescer()
        engine = partial(sim.run_engine, hold_writes=coalescer.hold, release_writes=coalescer.release)
        await serve_app(
            sim.app, config.server, tracker=tracker, background=engine, coalescer=coalescer, task_status=task_status
        )
