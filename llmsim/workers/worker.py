"""One ``--workers`` worker: ``python -m llmsim.workers.worker``, started by the supervisor.

It reads its :class:`WorkerSpec` (pickled) from stdin, then serves exactly as ``llmsim
serve`` does (:func:`llmsim.cli.run_server`: the same signals, graceful shutdown and exit
statuses), with three additions made before it serves:

* it publishes its metrics every :data:`~llmsim.workers.snapshots.SNAPSHOT_INTERVAL`
  and adds the other workers' to its ``/metrics`` (:mod:`llmsim.workers.snapshots`);
* it adds ``x-llmsim-worker: <index>`` to every response;
* it watches stdin: the supervisor never writes to it again, so end of file means the
  supervisor is gone, and the worker shuts down gracefully as on SIGTERM.

Once bound it writes ``ready <url>`` on stdout, its line to the supervisor; everything
else it prints goes to stderr (stdout is pointed there).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from functools import partial
from pathlib import Path
from typing import TextIO

import attrs
import trio

from llmsim.api.metrics.shared import WorkerReading, share_with_peers
from llmsim.app import Simulator
from llmsim.cli import run_server
from llmsim.config import Config
from llmsim.protocol.settings import ServerHandle
from llmsim.workers.headers import answer_headers, with_headers
from llmsim.workers.snapshots import SNAPSHOT_INTERVAL, SnapshotDir

__all__ = ["READY", "WorkerSpec", "main"]

#: The first word of the line a worker writes on stdout once it serves.
READY = "ready"


@attrs.frozen
class WorkerSpec:
    """What the supervisor tells a worker: its configuration (the port fixed), its index
    and the metrics directory."""

    config: Config
    index: int
    directory: str


def main() -> int:
    spec: WorkerSpec = pickle.load(sys.stdin.buffer)  # the supervisor's own pipe
    control = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # print() and friends go to stderr; stdout is the line to the supervisor
    snapshots = SnapshotDir(Path(spec.directory))

    def setup(sim: Simulator) -> None:  # once per --data-parallel-size rank
        rank = sim.config.kv_events.rank or 0  # llm-d's -1 (unset) is rank 0 here too
        share_with_peers(sim.ctx, partial(snapshots.peers, exclude=spec.index, rank=rank))
        sim.beside_engine.append(partial(_publish, sim, snapshots, spec.index, rank))
        if rank == 0:
            sim.beside_engine.append(_watch_supervisor)
        # the pod headers: the Simulator adds them already
        sim.app = with_headers(sim.app, answer_headers({}, spec.config.server.port, spec.index))

    return run_server(spec.config, setup=setup, announce=partial(_announce, control, spec.index))


def _announce(control: TextIO, index: int, config: Config, handle: ServerHandle) -> None:
    print(f"llmsim: worker {index} (pid {os.getpid()}) serving on {handle.url}", file=sys.stderr, flush=True)
    control.write(f"{READY} {handle.url}\n")
    control.flush()


def _reading(sim: Simulator) -> WorkerReading:
    engine = sim.engine
    return WorkerReading(engine.statistics(), engine.metrics.snapshot(), engine.kv_cache_usage)


async def _publish(sim: Simulator, snapshots: SnapshotDir, index: int, rank: int) -> None:
    """Publish now, every :data:`SNAPSHOT_INTERVAL`, and once more when cancelled."""
    try:
        while True:
            snapshots.publish(index, rank, _reading(sim))
            await trio.sleep(SNAPSHOT_INTERVAL)
    finally:
        snapshots.publish(index, rank, _reading(sim))


async def _watch_supervisor() -> None:
    """End of file on stdin: the supervisor is gone; shut down as on SIGTERM."""
    stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with stream:
        while await stream.receive_some():
            pass
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
