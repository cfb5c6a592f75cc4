"""The step grid: steps run at multiples of one interval, and every token goes out at
the grid time nearest its deadline (see the scheduler's docstring)."""

from __future__ import annotations

import math

__all__ = ["GRID_SHIFT", "GRID_TOLERANCE", "grid_reach", "step_grid"]

#: A deadline this close to a grid boundary (in grid intervals) counts as on it: float
#: sums of the ITL can land a hair off the grid.
GRID_TOLERANCE = 1e-6

#: ``math.ceil(deadline / grid - GRID_SHIFT) * grid`` is the grid time nearest
#: ``deadline``: the first one at or after ``deadline - grid / 2``.  A deadline half
#: way between two grid times (or a hair beyond) goes to the earlier one.
GRID_SHIFT = 0.5 + GRID_TOLERANCE


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


def grid_reach(now: float, grid: float, inverse_grid: float) -> float:
    """The latest deadline a step at ``now`` hands out: ``now`` itself, or, on a grid,
    the last deadline whose grid time (see :data:`GRID_SHIFT`) is at or before ``now``,
    whichever is later.  So a token goes out at most half an interval early, and a
    step that runs a little late does not take tokens of the next grid time along."""
    if not grid:
        return now
    reach = (math.floor(now * inverse_grid + GRID_TOLERANCE) + GRID_SHIFT) * grid
    return reach if reach > now else now
