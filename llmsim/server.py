"""``serve()``: one simulator behind the server backend its configuration names.

This is wiring, not protocol: it builds the :class:`~llmsim.app.Simulator` (engine and
API) and hands its application to the native handlers
(:mod:`llmsim.protocol.native.server`) or to hypercorn (:mod:`llmsim.protocol.asgi.server`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import attrs
import trio

from llmsim.app import Simulator
from llmsim.config import Config
from llmsim.faults import FAULT_NAMES
from llmsim.logs import CacheReading, ServerLog
from llmsim.protocol.native.connection import WriteCoalescer
from llmsim.protocol.native.faulty import FaultInjection
from llmsim.protocol.native.server import serve_app
from llmsim.protocol.settings import ConnectionTracker, EngineLoad, ServerHandle, ServerStatistics

__all__ = ["DataParallelHandle", "ServerHandle", "ServerStatistics", "serve", "serve_ranks"]


async def serve(
    config: Config,
    *,
    setup: Callable[[Simulator], None] | None = None,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a simulator for ``config`` until cancelled; ``nursery.start`` returns its handle.

    It logs (:mod:`llmsim.logs`) the banner once bound, the stats line every 10 s beside
    the engine (unless ``--disable-log-stats``) and a summary once it has shut down.
    A server that cannot start raises what its backend raised (an ``OSError`` for a
    port in use), not wrapped in a group of this function's own.  ``setup`` sees the
    simulator before it serves (a ``--workers`` worker adds its metrics sharing there).
    With ``--data-parallel-size`` N (and no rank), N ranks are served (:func:`serve_ranks`)."""
    if config.kv_events.rank is None and config.kv_events.data_parallel_size > 1:
        await serve_ranks(config, setup=setup, task_status=task_status)
        return
    sim = Simulator(config)
    if setup is not None:
        setup(sim)
    engine = sim.engine

    def cache() -> CacheReading:
        metrics = engine.metrics
        return CacheReading(engine.kv_cache_usage, metrics.prefix_cache_queries, metrics.prefix_cache_hits)

    server_log = ServerLog(config, engine.statistics, cache=cache)
    if not config.control.disable_log_stats:
        sim.beside_engine.append(server_log.report_stats)
    try:
        await _serve_backend(sim, config, task_status=_Announcing(task_status, server_log, sim.serving))
    finally:
        server_log.stopped()


@attrs.frozen
class _Announcing:
    """The caller's task status, with the banner logged when the server is bound."""

    task_status: trio.TaskStatus[ServerHandle]
    server_log: ServerLog
    bound: Callable[[int], None]  # told the port (Simulator.serving)

    def started(self, value: ServerHandle | None = None) -> None:
        if value is None:
            raise TypeError("serve() reports a ServerHandle when it is bound")
        self.bound(value.port)
        self.server_log.listening(value.url)
        self.task_status.started(value)


@attrs.define(eq=False)
class DataParallelHandle(ServerHandle):
    """What :func:`serve_ranks` reports: rank 0's handle (its address and statistics),
    with every rank's in ``ranks`` (rank r listens on rank 0's port + r)."""

    ranks: tuple[ServerHandle, ...] = ()


#: With ``--port 0``, how many times :func:`serve_ranks` looks for free consecutive ports.
FREE_PORT_TRIES = 10


async def serve_ranks(
    config: Config,
    *,
    setup: Callable[[Simulator], None] | None = None,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``--data-parallel-size`` N in one process, as llm-d-inference-sim serves it: rank r
    is a whole simulator of its own (engine, KV cache, metrics, ZMQ endpoints offset by r)
    on rank 0's port + r (``pkg/llm-d-inference-sim/simulator.go`` ``Start``).  With
    ``--port 0`` rank 0 gets a free port and the others the ports after it (tried again
    from another free port if one of those is taken)."""
    tries = FREE_PORT_TRIES if config.server.port == 0 else 1
    for attempt in range(1, tries + 1):
        failure: OSError | None = None
        async with trio.open_nursery() as nursery:
            try:
                handles = [await nursery.start(partial(serve, _rank(config, 0, config.server.port), setup=setup))]
                for rank in range(1, config.kv_events.data_parallel_size):
                    port = handles[0].port + rank
                    handles.append(await nursery.start(partial(serve, _rank(config, rank, port), setup=setup)))
            except OSError as exc:  # a port in use: the ranks started so far stop
                failure = exc
                nursery.cancel_scope.cancel()
            else:
                first, ranks = handles[0], tuple(handles)
                task_status.started(DataParallelHandle(first.host, first.port, first.url, first.tracker, ranks=ranks))
        if failure is None:
            return
        if attempt == tries:
            raise failure


def _rank(config: Config, rank: int, port: int) -> Config:
    return config.replace(port=port, data_parallel_rank=rank)


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
            sim.app,
            config.server,
            tracker=tracker,
            background=engine,
            coalescer=coalescer,
            limits=config.limits,
            faults=_fault_injection(sim, config),
            task_status=task_status,
        )


def _fault_injection(sim: Simulator, config: Config) -> FaultInjection:
    """``--fault`` read live from the simulator's control options (``/admin/config``
    replaces them), counting into the simulator's ``/metrics``."""
    counts = sim.ctx.injected_faults
    counts.declare(FAULT_NAMES)

    def control() -> tuple[str | None, float]:
        return sim.ctx.control.fault, sim.ctx.control.fault_rate

    return FaultInjection(counts, control, seed=config.model.seed)
