"""Durations as llmsim's settings spell them: ``100ms``, ``1.5s``, Go's ``1m30s``, or a
bare number of milliseconds (as the integer form of llm-d-inference-sim's flags did)."""

from __future__ import annotations

import math
import re

__all__ = ["NUMBER", "format_duration", "parse_duration"]

#: A decimal number without a sign (``1``, ``1.5``, ``.5``, ``2e3``), as a regex.
NUMBER = r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_BARE_NUMBER_RE = re.compile(rf"{NUMBER}")
_UNIT = r"(ns|us|µs|ms|s|m|h)"  # "ms" before "m": the first alternative that fits wins
_WITH_UNITS_RE = re.compile(rf"(?:\s*{NUMBER}\s*{_UNIT})+")
_PART_RE = re.compile(rf"({NUMBER})\s*{_UNIT}")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_HINT = "expected a duration such as 100ms, 1.5s or a number of milliseconds"
_NEGATIVE = "duration must be finite and non-negative"


def parse_duration(value: object) -> float:
    """``"100ms"`` / ``"1.5s"`` / ``"1m30s"`` / ``250`` (milliseconds) -> seconds.

    A bare number means milliseconds, as the integer form of llm-d-inference-sim did.
    """
    if isinstance(value, bool):
        raise ValueError(f"{_DURATION_HINT}, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value) / 1000.0
    elif isinstance(value, str):
        seconds = _parse_duration_text(value)
    else:
        raise ValueError(f"{_DURATION_HINT}, got {type(value).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{_NEGATIVE}, got {value!r}")
    return seconds


def _parse_duration_text(value: str) -> float:
    text = value.strip()
    if text.startswith("-") and (_BARE_NUMBER_RE.fullmatch(text[1:]) or _WITH_UNITS_RE.fullmatch(text[1:])):
        raise ValueError(f"{_NEGATIVE}, got {value!r}")
    if _BARE_NUMBER_RE.fullmatch(text):
        return float(text) / 1000.0
    if not _WITH_UNITS_RE.fullmatch(text):
        raise ValueError(f"{_DURATION_HINT}, got {value!r}")
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART_RE.findall(text))


def format_duration(seconds: float) -> str:
    """A spelling :func:`parse_duration` reads back, with its unit: ``0s``, ``100ms``, ``10s``."""
    if 0 < seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"
