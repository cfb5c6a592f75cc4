"""What the load generator remembers about each stream, and the bytes it sends.

Times are ``time.perf_counter()`` values.  On Linux that is CLOCK_MONOTONIC, the same clock
in every process, so records from several worker processes can be merged and compared
with one measurement window.
"""

from __future__ import annotations

import math
from array import array

import attrs
import orjson

__all__ = ["StreamRecord", "chat_body"]


def chat_body(model: str, max_tokens: int) -> bytes:
    """The streaming chat-completion request every stream sends."""
    return orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
    )


@attrs.define(slots=True, eq=False)
class StreamRecord:
    """One request/response stream as the client saw it.

    ``events`` counts SSE events whose JSON has non-empty ``choices`` (the role chunk,
    one chunk per token, the finish chunk); ``first`` and ``last`` are the arrival times
    of the first and last of them and ``gaps`` every interval in between.  ``tokens`` is
    ``usage.completion_tokens`` from the final usage chunk, or -1 when there was none.
    """

    start: float
    status: int = 0
    first: float = math.nan
    last: float = math.nan
    end: float = math.nan
    events: int = 0
    tokens: int = -1
    done: bool = False
    error: str | None = None
    gaps: array[float] = attrs.field(factory=lambda: array("d"))

    def on_events(self, count: int, now: float) -> None:
        """``count`` content events arrived in one read at ``now``: all but the first gap are 0."""
        if self.events:
            self.gaps.append(now - self.last)
        else:
            self.first = now
        if count > 1:
            self.gaps.frombytes(bytes(self.gaps.itemsize * (count - 1)))
        self.last = now
        self.events += count

    def fail(self, error: str, now: float) -> None:
        """Record the first error only: later ones are consequences of it."""
        if self.error is None:
            self.error = error
        if math.isnan(self.end):
            self.end = now

    @property
    def ttft(self) -> float:
        return self.first - self.start

    @property
    def completion_tokens(self) -> int:
        """Server-reported tokens when available, else the count of token-carrying events."""
        return self.tokens if self.tokens >= 0 else max(0, self.events - 2)
