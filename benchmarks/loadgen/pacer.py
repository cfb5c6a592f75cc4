"""The paced blaster's schedule: one timer wheel for the whole server, on llmsim's grid.

The paced blaster is the reference that shows what the load generator and the machine
add to latencies, so its own cost per event must be negligible and its rounding must be
llmsim's.  Hence:

* **llmsim's step grid.**  A token due at ``d`` leaves at the grid time nearest ``d``
  (at most half an interval early or late, zero on average: llmsim's rule,
  :mod:`llmsim.engine.grid`; a time already past leaves at once), and each deadline is
  the previous *deadline* plus the ITL, so the rounding never accumulates.  The interval is
  :data:`GRID` made to divide the ITL, exactly as llmsim's engine does with its
  ``STEP_QUANTUM``, so both servers round the same way and whatever llmsim adds on top
  of the blaster is its own cost.  Because the grid divides the ITL, token *i* of a
  stream is due exactly ``i * ITL / grid`` ticks after the first one: schedules are
  integer tick numbers, exact and never recomputed from the clock.
* **One task, no per-event heap entry.**  The wheel is a dict from grid tick to the
  streams due then, grouped by connection; a heap holds only the distinct ticks.  After
  a tick, its surviving streams move as whole lists to the tick one ITL later, where
  they stay grouped, so the per-event work is a list append and a counter.
* **One syscall per connection and tick.**  :class:`Output` writes a connection's due
  events, joined, straight into the kernel with a non-blocking ``os.write``.  Only what
  the kernel does not take goes to that connection's own writer task, and later writes
  queue behind it, so the byte order per connection holds.
"""

from __future__ import annotations

import heapq
import math
import os
from collections.abc import Callable

import attrs
import trio

from llmsim.engine.grid import GRID_SHIFT, step_grid
from llmsim.step_timer import StepTimer

__all__ = ["GRID", "Output", "Pace", "Pacer", "grid_interval"]

#: Target grid interval (seconds), the same as ``llmsim.app.STEP_QUANTUM``; the interval
#: actually used divides the ITL (see :func:`grid_interval`).
GRID = 0.002


def grid_interval(itl: float, target: float = GRID) -> float:
    """llmsim's ``step_grid``: the largest ``itl / k`` (k a positive integer) not above
    ``target``, or ``target`` without an ITL, so that every token of a stream lands the
    same distance from its deadline and the client sees the ITL exactly."""
    return step_grid(itl, target)


@attrs.frozen
class Pace:
    """Simulated latencies in seconds; both 0 means: stream everything at once."""

    ttft: float = 0.0
    itl: float = 0.0

    @property
    def paced(self) -> bool:
        return self.ttft > 0 or self.itl > 0


class Output:
    """One connection's send side, shared by its reader and the pacer.

    :meth:`write` never blocks: it tries the kernel first, and only a remainder (or
    anything written while a remainder is pending) goes to :meth:`run`, the connection's
    writer task, which awaits ``send_all``.
    """

    __slots__ = ("_backlog", "_drained", "_fd", "_stream", "_wake", "closed")

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._fd = stream.socket.fileno()
        self._backlog: list[bytes] = []
        self._wake = trio.Event()
        self._drained: trio.Event | None = None  # set while the writer task has bytes
        self.closed = False

    def write(self, data: bytes) -> None:
        """Send ``data`` after everything written before, without waiting."""
        if self.closed:
            return
        if self._drained is not None:
            self._backlog.append(data)
            return
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:  # the peer is gone; the reader finds out and ends the connection
            self.close()
            return
        if sent < len(data):
            self._backlog.append(data[sent:])
            self._drained = trio.Event()
            self._wake.set()

    async def send(self, data: bytes) -> None:
        """:meth:`write`, then wait until the kernel took it: backpressure for the reader."""
        self.write(data)
        if self._drained is not None:
            await self._drained.wait()
        if self.closed:
            raise trio.BrokenResourceError("connection closed")

    async def run(self) -> None:
        """The writer task: sends what the kernel did not take at once."""
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                while self._backlog:
                    data = b"".join(self._backlog)
                    self._backlog.clear()
                    await self._stream.send_all(data)
                self._release()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.close()

    def close(self) -> None:
        """Drop everything unsent; the pacer skips this connection's streams from now on."""
        self.closed = True
        self._backlog.clear()
        self._release()

    def _release(self) -> None:
        if self._drained is not None:
            self._drained.set()
            self._drained = None


class _Stream:
    """One paced response: the bytes it sends next, what follows, and how many are left."""

    __slots__ = ("last", "left", "middle", "next")

    def __init__(self, groups: tuple[bytes, bytes, bytes], count: int) -> None:
        self.next, self.middle, self.last = groups
        self.left = count


#: The streams due at one tick, per connection.
_Bucket = dict[Output, list[_Stream]]


class Pacer:
    """The timer wheel: every paced stream of the server, sent on the grid by one task."""

    def __init__(self, pace: Pace) -> None:
        self._ttft = pace.ttft
        self._grid = grid_interval(pace.itl)
        self._step = round(pace.itl / self._grid)  # ticks per ITL
        self._wheel: dict[int, _Bucket] = {}
        self._ticks: list[int] = []  # heap of the wheel's keys
        self._wake = trio.Event()
        self._wake_up: Callable[[], None] = self._wake.set  # ends the current sleep (see run)

    @property
    def grid(self) -> float:
        return self._grid

    def add(self, output: Output, groups: tuple[bytes, bytes, bytes], count: int) -> None:
        """Start a response of ``count`` groups of events, TTFT from now.

        ``groups`` are the bytes of the first group (headers, role chunk and first
        token), of every middle one (one token) and of the last one (the last token
        and the closing events); with ``count`` 1 the first one is the whole response.
        """
        deadline = trio.current_time() + self._ttft
        tick = math.ceil(deadline / self._grid - GRID_SHIFT)  # the nearest grid time
        self._bucket(tick).setdefault(output, []).append(_Stream(groups, count))
        if tick == self._ticks[0]:
            self._wake_up()  # maybe earlier than the tick the pacer sleeps until

    async def run(self) -> None:
        """Sleep until the next grid tick with due streams (or a new earlier one), send
        what is due, repeat.  Forever.  One pass of trio's scheduler per tick: the wait
        is the checkpoint, even when the pacer is behind and the tick is already due.

        It sleeps as llmsim's engine task does: on a Linux timerfd
        (:class:`llmsim.step_timer.StepTimer`) where there is one, since trio's own
        deadline wakes up to a millisecond late (``epoll_wait`` rounds its timeout up),
        which would bias the floor; on trio's deadline elsewhere and on a test's clock."""
        timer = StepTimer.open()
        if timer is None:
            await self._run_on_deadlines()
            return
        self._wake_up = timer.fire_now  # (between sleeps: no effect, the next sleep re-arms)
        try:
            while True:
                await timer.sleep_until(self._next_time())
                self._send_due(trio.current_time())
        finally:
            timer.close()

    async def _run_on_deadlines(self) -> None:
        while True:
            self._wake = trio.Event()
            self._wake_up = self._wake.set
            with trio.move_on_at(self._next_time()):
                await self._wake.wait()
            self._send_due(trio.current_time())

    def _next_time(self) -> float:
        return self._ticks[0] * self._grid if self._ticks else math.inf

    def _bucket(self, tick: int) -> _Bucket:
        bucket = self._wheel.get(tick)
        if bucket is None:
            bucket = self._wheel[tick] = {}
            heapq.heappush(self._ticks, tick)
        return bucket

    def _send_due(self, now: float) -> None:
        """Send every group due at or before ``now``: one write per connection."""
        ticks, grid = self._ticks, self._grid
        due: dict[Output, list[bytes]] = {}
        while ticks and ticks[0] * grid <= now:
            tick = heapq.heappop(ticks)
            self._advance(self._wheel.pop(tick), tick + self._step, due)
        for output, chunks in due.items():
            output.write(b"".join(chunks))

    def _advance(self, bucket: _Bucket, next_tick: int, due: dict[Output, list[bytes]]) -> None:
        """Take each stream's next bytes into ``due``; move the unfinished ones to ``next_tick``.
        Streams of closed connections just drop out."""
        later: _Bucket | None = None
        for output, streams in bucket.items():
            if output.closed:
                continue
            chunks = due.setdefault(output, [])
            kept = []
            for stream in streams:
                chunks.append(stream.next)
                left = stream.left - 1
                if left:
                    stream.left = left
                    stream.next = stream.middle if left > 1 else stream.last
                    kept.append(stream)
            if kept:
                later = self._bucket(next_tick) if later is None else later
                waiting = later.get(output)
                if waiting is None:
                    later[output] = kept
                else:
                    waiting += kept
