"""The supervisor of ``llmsim serve --workers N``: start, watch, restart and stop N workers.

**The port.**  The supervisor binds the port first (with ``SO_REUSEPORT``, and without
listening), so that ``--port 0`` picks one port for every worker, a port in use is one
error line before any worker starts, and a restarted worker gets the same port back.
Each worker then binds and listens on it with ``SO_REUSEPORT`` (``ServerOptions.workers
> 1`` tells the listener to), and the kernel (Linux 3.9 and later) spreads new
connections over the workers' listeners.  A connection stays with the worker that
accepted it: every request of one HTTP/1.1 keep-alive or HTTP/2 connection goes to the
same worker.  Other platforms have no balancing ``SO_REUSEPORT``: ``--workers`` is then a
configuration error.

**Signals.**  Workers run in their own process group, so a Ctrl-C in a terminal reaches
only the supervisor.  The first SIGINT or SIGTERM is sent on to every worker as SIGTERM:
each one shuts down gracefully (its own ``--shutdown-grace-period``), and the supervisor
exits 0 once all of them exited 0.  A second signal kills every worker at once and exits
with 128 + its number.  If the supervisor itself dies, the workers see end of file on
their stdin and shut down gracefully.

**Restarts.**  A worker that exits while the server is not stopping is logged and started
again (the restarts are counted, and the summary line says how many).  A worker that
dies before it served (its ``ready`` line) is a failed start: after
:data:`MAX_START_FAILURES` in a row (with a growing pause between them), or at once for a
configuration error (exit status 2), the supervisor stops every worker and exits
non-zero (2 for a configuration error, else 1).
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import trio

from llmsim.cli import run_server
from llmsim.config import Config, format_duration
from llmsim.workers.snapshots import SnapshotDir, snapshot_root
from llmsim.workers.worker import READY, WorkerSpec

__all__ = ["MAX_START_FAILURES", "WORKER_COMMAND", "Supervisor", "reserve_port", "run_workers", "worker_count"]

#: Failed starts in a row after which the supervisor gives up.
MAX_START_FAILURES = 3
#: The pause before the first restart after a failed start (doubled after each one).
_FIRST_BACKOFF = 0.25


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def worker_count(requested: int) -> int:
    """``--workers``: the number given, or for 0 the CPUs this process may run on."""
    if requested > 0:
        return requested
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def run_workers(config: Config) -> int:
    """Serve ``config`` with ``--workers`` processes until a signal; the exit status."""
    count = worker_count(config.server.workers)
    if count == 1:
        return run_server(config.replace(workers=1))
    if config.server.backend != "native":
        _say("llmsim: invalid configuration: workers: --workers needs --server native")
        return 2
    if not (sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")):
        _say(
            "llmsim: invalid configuration: workers: --workers needs SO_REUSEPORT load balancing "
            f"(Linux 3.9 or later), which {sys.platform} does not have"
        )
        return 2
    server = config.server
    try:
        reservation = reserve_port(server.host, server.port)
    except OSError as exc:
        _say(f"llmsim: cannot serve: cannot listen on {server.host}:{server.port}: {exc.strerror}")
        return 1
    with reservation, tempfile.TemporaryDirectory(prefix="llmsim-workers-", dir=snapshot_root()) as directory:
        port = reservation.getsockname()[1]
        supervisor = Supervisor(config.replace(port=port, workers=count), count, Path(directory))
        return trio.run(supervisor.run)


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound (not listening) to ``host:port`` with ``SO_REUSEPORT``: the port is
    ours (port 0: a free one) and every worker can bind it too."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


@attrs.define(eq=False)
class _Slot:
    """Worker ``index``: its current process, and the exit status of the last one."""

    index: int
    process: trio.Process | None = None
    status: int | None = None


#: How a worker is started (its spec follows on stdin).
WORKER_COMMAND = (sys.executable, "-m", "llmsim.workers.worker")


@attrs.define(eq=False)
class Supervisor:
    """Keeps ``count`` workers of ``config`` (its port already reserved) running until a
    signal; ``directory`` holds their metrics.  :meth:`run` returns the exit status."""

    config: Config
    count: int
    directory: Path
    command: tuple[str, ...] = WORKER_COMMAND
    restarts: int = 0
    _slots: list[_Slot] = attrs.field(init=False)
    _stopping: bool = attrs.field(default=False, init=False)
    _status: int | None = attrs.field(default=None, init=False)  # decided before the workers' own
    _ready: set[int] = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        self._slots = [_Slot(index) for index in range(self.count)]

    async def run(self) -> int:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_signals, signals)
                async with trio.open_nursery() as workers:
                    for slot in self._slots:
                        workers.start_soon(self._keep_running, slot)
                nursery.cancel_scope.cancel()
        statuses = [slot.status for slot in self._slots]
        # -SIGTERM: a worker that our SIGTERM reached before it had its handler (nothing in flight)
        clean = all(s in (0, -signal.SIGTERM) for s in statuses)
        status = self._status if self._status is not None else (0 if clean else 1)
        _say(f"llmsim: {self.count} workers stopped (exit statuses {statuses}, {self.restarts} restarts)")
        return status

    # --- one worker, again and again ------------------------------------------------------

    async def _keep_running(self, slot: _Slot) -> None:
        failures = 0
        while not self._stopping:
            status, served = await self._run_once(slot)
            slot.status = status
            if self.stopping():
                return
            SnapshotDir(self.directory).retire(slot.index, self.restarts)
            if served:
                failures = 0
                _say(f"llmsim: worker {slot.index} exited with status {status}; starting it again")
            else:
                failures += 1
                if status == 2 or failures >= MAX_START_FAILURES:
                    _say(f"llmsim: worker {slot.index} failed to start {failures} time(s) (status {status}); stopping")
                    self._stop(2 if status == 2 else 1)
                    return
                backoff = _FIRST_BACKOFF * 2 ** (failures - 1)
                _say(f"llmsim: worker {slot.index} failed to start (status {status}); again in {backoff:g}s")
                await trio.sleep(backoff)
            self.restarts += 1

    async def _run_once(self, slot: _Slot) -> tuple[int, bool]:
        """Start worker ``slot`` and wait for it to exit: its status, and whether it served."""
        process = await trio.lowlevel.open_process(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            process_group=0,  # a terminal's Ctrl-C reaches the supervisor only
        )
        slot.process = process
        if self._stopping:  # a signal came while it was starting
            process.send_signal(signal.SIGTERM)
        assert process.stdin is not None and process.stdout is not None
        served = False
        try:
            spec = WorkerSpec(self.config, slot.index, str(self.directory))
            await process.stdin.send_all(pickle.dumps(spec))
            line = await _read_line(process.stdout)
            if line.startswith(READY + " "):
                served = True
                self._served(slot, line.split()[1])
        except trio.BrokenResourceError:  # it died before reading its spec
            pass
        finally:
            with trio.CancelScope(shield=True):
                status = await process.wait()
                await process.stdin.aclose()
                await process.stdout.aclose()
        return status, served

    def _served(self, slot: _Slot, url: str) -> None:
        first_time = slot.index not in self._ready
        self._ready.add(slot.index)
        if first_time and len(self._ready) == self.count:
            model = self.config.model.display_model
            _say(f"llmsim serving {model} on {url} (HTTP/1.1 + HTTP/2, {self.count} workers)")

    # --- stopping ---------------------------------------------------------------------------

    async def _watch_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if not self._stopping:
                grace = format_duration(self.config.server.shutdown_grace_period)
                _say(
                    f"llmsim: shutting down {self.count} workers; in-flight streams get up to {grace} "
                    "(SIGINT or SIGTERM again to stop at once)"
                )
                self._stop(None)
            else:
                _say("llmsim: stopped at once by a second signal")
                self._status = 128 + signum
                self._signal_all(signal.SIGKILL)

    def stopping(self) -> bool:
        """True once the server is stopping (a signal, or a worker that cannot start)."""
        return self._stopping

    def _stop(self, status: int | None) -> None:
        """Stop every worker gracefully; ``status``: the exit status already decided."""
        self._stopping = True
        if status is not None and self._status is None:
            self._status = status
        self._signal_all(signal.SIGTERM)

    def _signal_all(self, signum: int) -> None:
        for slot in self._slots:
            if slot.process is not None and slot.process.returncode is None:
                slot.process.send_signal(signum)


async def _read_line(stream: trio.abc.ReceiveStream) -> str:
    """The first line of ``stream`` ("" if it ends first)."""
    received = b""
    while b"\n" not in received:
        chunk = await stream.receive_some()
        if not chunk:
            return ""
        received += chunk
    return received.split(b"\n", 1)[0].decode(errors="replace")
