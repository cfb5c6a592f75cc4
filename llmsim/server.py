"""``serve()``: one simulator behind the server backend its configuration names.

This is wiring, not protocol: it builds the :class:`~llmsim.app.Simulator` (engine and
API) and hands its application to the native handlers
(:mod:`llmsim.protocol.native.server`) or to hypercorn (:mod:`llmsim.protocol.asgi.server`).
"""

from __future__ import annotations

from functools import partial

import trio

from llmsim.app import Simulator
from llmsim.config import Config
from llmsim.protocol.native.connection import WriteCoalescer
from llmsim.protocol.native.server import serve_app
from llmsim.protocol.settings import ConnectionTracker, ServerHandle, ServerStatistics

__all__ = ["ServerHandle", "ServerStatistics", "serve"]


async def serve(config: Config, *, task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED) -> None:
    """Run a simulator for ``config`` until cancelled; ``nursery.start`` returns its handle."""
    sim = Simulator(config)

    def load() -> tuple[int, int]:
        stats = sim.engine.statistics()
        return stats.running, stats.waiting

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
