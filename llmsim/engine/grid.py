"""The step grid: the interval engine steps are rounded up to (see the scheduler's docstring)."""

from __future__ import annotations

import math

__all__ = ["GRID_TOLERANCE", "step_grid"]

#: A deadline this close below a grid time (in grid intervals) belongs to it: float
#: sums of the ITL can land a hair off the grid.
GRID_TOLERANCE = 1e-6


def step_grid(inter_token_latency: float, target: float) -> float:
    """The grid interval for a step quantum of about ``target`` seconds: the largest
    ``inter_token_latency / k`` (k a positive integer) not above ``target``, or
    ``target`` itself without an inter-token latency; 0 (no grid) if ``target <= 0``."""
    if target <= 0.0:
        return 0.0
    itl = inter_token_latency
    if itl <= 0.0:
        return target
    return itl / max(1, math.ceil(itl / target - GRID_TOLERANCE))
