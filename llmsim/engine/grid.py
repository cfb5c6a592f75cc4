"""The step grid: steps run at multiples of one interval, and every token goes out at
the grid time nearest its deadline.

Why a grid.  Every distinct deadline would be a step of its own: with thousands of
jobs at random phases, that is thousands of tiny steps per second, each one waking the
writers of many connections.  ``Engine.set_step_quantum``
(:mod:`llmsim.engine.scheduler`) puts steps on a grid instead: a token due at ``d`` is
handed out at the grid time *nearest* ``d`` (:data:`GRID_SHIFT`), so one step serves
every job due within half an interval either side of it, and the driver wakes at most once per interval.  Deadlines
themselves stay exact and chained, so the rounding never accumulates.

Why the nearest grid time and not the next one: rounding up made every first token
late by half an interval on average (+1 ms on a 2 ms grid, 1 to 2 % of a typical
TTFT), a bias a client measures; rounding to the nearest makes the error of a TTFT
uniform in ``[-grid/2, +grid/2]``, zero on average.  The price is that a token may go
out up to half an interval before its deadline, which no client can tell from the
network's own jitter, and never more: a step at ``now`` hands out only tokens whose
grid time has come (:func:`grid_reach`), and a step that runs late
catches up on what was due but takes nothing of the next grid time along.  (Rounding up
and stepping half an interval early is the same rule with the grid shifted; rounding on
the deadlines keeps ``step(now)`` honest about the time.)  The inter-token latency
is not touched: the grid interval divides it (20 ms with a 2 ms target: exactly 2 ms),
so without jitter every token of a job lands the same distance from its deadline and
the client sees the configured ITL exactly.  Tokens already due (zero latency, catching
up, a resume) are never held back for the grid.  Without a quantum (the default) every
deadline is its own step time, exactly.
"""

from __future__ import annotations

import math

__all__ = ["GRID_SHIFT", "GRID_TOLERANCE", "grid_reach", "grid_span", "step_grid"]

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


def grid_span(index: int, grid: float, inverse_grid: float) -> tuple[float, float]:
    """Deadlines ``(first, last)`` that round to grid time ``index * grid`` by the rule of
    :data:`GRID_SHIFT` (``math.ceil(deadline * inverse_grid - GRID_SHIFT) == index``),
    each one checked by that very formula: ``math.inf`` / ``-math.inf`` for an end
    whose check fails.  The rounding is monotonic in the deadline (a product with a
    positive number, a difference and ``ceil`` all are, in floats too), so every
    deadline between two checked ones rounds to ``index`` as well, bit for bit: the
    per-token path (``Engine._run``) gives such deadlines this time without the formula.
    The ends lie a millionth of an interval inside the exact boundaries, which float
    error at any realistic clock value does not reach."""
    first = (index - 0.5 + 2 * GRID_TOLERANCE) * grid
    last = (index + 0.5) * grid
    if math.ceil(first * inverse_grid - GRID_SHIFT) != index:
        first = math.inf
    if math.ceil(last * inverse_grid - GRID_SHIFT) != index:
        last = -math.inf
    return first, last
