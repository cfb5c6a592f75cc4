"""What the connections of one load-generator process share."""

from __future__ import annotations

import time

import attrs
import trio

from benchmarks.loadgen.records import StreamRecord

__all__ = ["Plan", "sleep_until"]

#: Pause after a failed connection attempt, so that a dead server costs a few records
#: per second instead of a busy loop.
RECONNECT_PAUSE = 0.05


@attrs.define(eq=False)
class Plan:
    """Target, request body, stop time and the records of every stream started.

    Streams are closed-loop: each finished stream is replaced at once until ``stop_at``.
    """

    host: str
    port: int
    path: str
    body: bytes
    stop_at: float
    records: list[StreamRecord] = attrs.field(factory=list)

    def may_start(self) -> bool:
        return time.perf_counter() < self.stop_at

    def new_record(self) -> StreamRecord:
        record = StreamRecord(start=time.perf_counter())
        self.records.append(record)
        return record

    def failed_attempt(self, error: str) -> None:
        """A connection could not be opened: that counts as one failed stream."""
        now = time.perf_counter()
        self.new_record().fail(error, now)


async def sleep_until(at: float) -> None:
    """Sleep until the ``time.perf_counter()`` value ``at`` (trio's clock has its own offset)."""
    await trio.sleep(max(0.0, at - time.perf_counter()))
