"""Strings generated without a ``pattern``: words, and realistic values of known formats.

``format`` is an annotation in JSON Schema 2020-12, so a format value is only used when
its lengths fit minLength/maxLength; each generator comes with the fewest distinct values
it produces (its variety), which the uniqueItems checks count on.
"""

from __future__ import annotations

import functools
import random
import uuid
from collections.abc import Callable

__all__ = ["FORMATS", "MANY", "WORDS", "phrase_variety"]

MANY = 1 << 40  # variety counts are capped here

WORDS = (
    "testing", "hello", "Boston", "sunny", "temperature", "cloudy", "question", "silence",
    "lifetime", "Paris", "London", "Tokyo", "weather", "report", "summary", "coffee",
    "meeting", "project", "update", "garden", "river", "mountain", "yellow", "green",
    "apple", "orange", "music", "travel", "window", "station", "morning", "evening",
    "budget", "invoice", "customer", "ticket", "search", "example", "document", "server",
    "network", "kitchen", "library", "museum", "forest", "ocean", "bridge", "lantern",
)  # fmt: skip


@functools.lru_cache(maxsize=64)
def phrase_variety(max_length: int | None) -> int:
    """Distinct two-word phrases (wide mode) once cut to ``max_length``: a lower bound."""
    return len({f"{a} {b}"[:max_length] for a in WORDS for b in WORDS})


def _word(rng: random.Random) -> str:
    return rng.choice(WORDS).lower()


def _date(rng: random.Random) -> str:
    return f"{rng.randint(2020, 2026):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _time(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"


_SHORT, _LONG = min(len(w) for w in WORDS), max(len(w) for w in WORDS)
_Format = tuple[Callable[[random.Random], str], int, int, int]  # generator, shortest, longest, variety
_EMAIL: _Format = (lambda rng: f"{_word(rng)}@example.com", _SHORT + 12, _LONG + 12, len(WORDS))
_HOSTNAME: _Format = (lambda rng: f"{_word(rng)}.example.com", _SHORT + 12, _LONG + 12, len(WORDS))
_URI: _Format = (lambda rng: f"https://example.com/{_word(rng)}", _SHORT + 20, _LONG + 20, len(WORDS))
FORMATS: dict[str, _Format] = {
    "date": (_date, 10, 10, 7 * 12 * 28),
    "date-time": (lambda rng: f"{_date(rng)}T{_time(rng)}", 20, 20, MANY),
    "time": (_time, 9, 9, 24 * 60 * 60),
    "email": _EMAIL,
    "idn-email": _EMAIL,
    "hostname": _HOSTNAME,
    "idn-hostname": _HOSTNAME,
    "uri": _URI,
    "uri-reference": _URI,
    "iri": _URI,
    "iri-reference": _URI,
    "url": _URI,
    "uuid": (lambda rng: str(uuid.UUID(int=rng.getrandbits(128), version=4)), 36, 36, MANY),
    "ipv4": (lambda rng: f"192.0.2.{rng.randint(1, 254)}", 9, 11, 254),
    "ipv6": (lambda rng: f"2001:db8::{rng.randint(1, 0xFFFF):x}", 11, 14, 0xFFFF),
}
