"""Output of the scenarios: plain-text tables on stdout, JSON and PNG files in results/."""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import psutil

__all__ = ["environment", "percent_error", "print_table", "ratio", "write_json"]


def write_json(directory: Path, name: str, payload: dict[str, Any]) -> Path:
    """``<directory>/<name>.json``, with NaN written as null (JSON has no NaN)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps(_plain(payload), indent=2) + "\n")
    return path


def environment() -> dict[str, Any]:
    """What a reader needs to judge the numbers: the machine and how busy it was."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "python": platform.python_version(),
        "cpus": psutil.cpu_count(),
        "load_average_1m": psutil.getloadavg()[0],
    }


def ratio(value: float, base: float) -> float:
    return value / base if base and not math.isnan(base) else math.nan


def percent_error(measured: float, configured: float) -> float:
    return (measured - configured) / configured * 100.0


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A fixed-width table; floats are shown with 3 significant figures."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def _cell(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _plain(value: Any) -> Any:
    if attrs.has(type(value)):
        return _plain(attrs.asdict(value, recurse=False))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
