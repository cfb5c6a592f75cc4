"""The workers' metrics, shared through one small file per worker.

Every worker writes its :class:`~llmsim.api.metrics.shared.WorkerReading` to
``worker-<index>.r<rank>.json`` in the supervisor's directory every :data:`SNAPSHOT_INTERVAL`
seconds (and once more as it stops), replacing the file atomically (``os.replace``), so
a reader never sees half a file.  The worker that answers ``/metrics`` reads the other
workers' files at scrape time and adds them to its own live numbers: the others are at
most :data:`SNAPSHOT_INTERVAL` (plus one engine step) old.  ``rank`` is the
``--data-parallel-size`` rank: each rank is a server of its own on its own port, so rank r
of one worker adds up rank r of the others.  When a worker dies the supervisor renames
its files ``retired-<index>-<n>.r<rank>.json``: its counters stay in the
totals (a counter never goes back because a worker was restarted), its gauges do not.

The directory lives on ``/dev/shm`` where there is one (memory, not disk), and only this
user can read it.  The files are JSON, written and read with one cattrs converter.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import attrs
import cattrs
import orjson

from llmsim.api.metrics.shared import WorkerReading

__all__ = ["SNAPSHOT_INTERVAL", "SnapshotDir", "snapshot_root"]

#: How often a worker publishes its numbers (seconds): the staleness bound of /metrics.
SNAPSHOT_INTERVAL = 0.5

_LIVE = "worker-"
_RETIRED = "retired-"
_converter = cattrs.Converter()
log = logging.getLogger("llmsim.workers")


def snapshot_root() -> str | None:
    """Where the supervisor makes its directory: ``/dev/shm`` if it can, else the default."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


@attrs.frozen
class SnapshotDir:
    path: Path

    def _live(self, index: int, rank: int) -> Path:
        return self.path / f"{_LIVE}{index}.r{rank}.json"

    def publish(self, index: int, rank: int, reading: WorkerReading) -> None:
        """Replace the file of worker ``index``'s rank ``rank`` with ``reading``."""
        data = _converter.unstructure(attrs.evolve(reading, live=True))
        target = self._live(index, rank)
        temporary = target.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_bytes(orjson.dumps(data))
        os.replace(temporary, target)

    def retire(self, index: int, generation: int) -> None:
        """Worker ``index`` died: keep its last counters, as retired readings."""
        for live in self.path.glob(f"{_LIVE}{index}.r*.json"):
            rank_suffix = live.name.removeprefix(f"{_LIVE}{index}")
            os.replace(live, self.path / f"{_RETIRED}{index}-{generation}{rank_suffix}")

    def peers(self, exclude: int, rank: int = 0) -> list[WorkerReading]:
        """Every reading of rank ``rank`` but worker ``exclude``'s: the live workers' and
        the retired ones."""
        readings = []
        own = self._live(exclude, rank).name
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            name = entry.name
            if not name.endswith(f".r{rank}.json") or name == own:
                continue
            if name.startswith(_LIVE) or name.startswith(_RETIRED):
                reading = _read(Path(entry.path))
                if reading is not None:
                    readings.append(attrs.evolve(reading, live=name.startswith(_LIVE)))
        return readings


def _read(path: Path) -> WorkerReading | None:
    """The reading in ``path``; None if it went away meanwhile (a worker retired) or is
    unreadable (which would be a bug: it is logged, and /metrics still answers)."""
    try:
        return _converter.structure(orjson.loads(path.read_bytes()), WorkerReading)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, cattrs.BaseValidationError):
        log.exception("cannot read the worker metrics in %s", path)
        return None
