"""The benchmark scenarios.  Each module has ``run(options) -> dict`` that prints a table,
writes ``results/<name>.json`` and its plots, and returns what it wrote."""

from __future__ import annotations

from pathlib import Path

import attrs

__all__ = ["Options"]


@attrs.frozen
class Options:
    """Settings shared by every scenario.

    ``quick`` shortens every timed load (for smoke runs; the numbers get noisier);
    ``processes`` is how many load-generator worker processes share the connections;
    ``against`` is the other llmsim checkout of the ``compare`` and ``paced_cost``
    scenarios; ``rounds``, when set, overrides a scenario's number of rounds.
    """

    quick: bool = False
    processes: int = 2
    against: Path | None = None
    rounds: int | None = None
    results_dir: Path = Path(__file__).resolve().parent.parent / "results"

    @property
    def log_dir(self) -> Path:
        """Server logs and scratch files (not committed)."""
        return self.results_dir / "tmp"
