"""The soak scenario's verdict on an RSS curve."""

from __future__ import annotations

from benchmarks.soak import levels_off

MIB = 2**20


def test_a_curve_that_flattens_levels_off() -> None:
    curve = [(float(t), (60 + min(t, 10)) * MIB) for t in range(0, 60, 5)]
    flat, growth, slope = levels_off(curve)
    assert flat and growth == 0 and slope == 0


def test_a_curve_that_keeps_climbing_does_not() -> None:
    curve = [(float(t), (60 + t) * MIB) for t in range(0, 60, 5)]  # 1 MiB a second
    flat, growth, slope = levels_off(curve)
    assert not flat and growth == 25 * MIB and round(slope) == 60
