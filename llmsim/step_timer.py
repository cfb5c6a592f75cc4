"""Waking the engine task on time, to the tenth of a millisecond.

trio sleeps in ``epoll_wait``, whose timeout CPython rounds *up* to whole
milliseconds: an engine step planned for ``t`` starts somewhere in ``[t, t + 1 ms)``,
plus the wake-up latency, 0.75 ms late on average on the reference machine.  Every
token of that step is that much late, so every TTFT a client measures is too (1.5 % of
a 50 ms TTFT).  A Linux timerfd has no such rounding: armed for ``t``, it makes its
file descriptor readable at ``t``, which wakes ``epoll_wait`` at once; the median
lateness falls to about 0.15 ms, the wake-up latency alone (docs/performance.md,
"Low-load bias").

Python 3.11 has no ``os.timerfd_create`` (3.13 has), so the two libc calls go through
:mod:`ctypes`.  Where they are missing (not Linux) :meth:`StepTimer.open` returns None
and the engine task sleeps on trio's own deadline, as before.  So does a trio run on
a :class:`trio.testing.MockClock`: a timerfd counts real time, a test's clock does not.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
from collections.abc import Callable

import trio

__all__ = ["StepTimer"]

_CLOCK_MONOTONIC = 1  # trio's system clock is time.perf_counter(): CLOCK_MONOTONIC on Linux
_TFD_NONBLOCK = getattr(os, "O_NONBLOCK", 0o4000)  # (read where there is no timerfd either)
_TFD_CLOEXEC = 0o2000000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class StepTimer:
    """A timerfd the engine task waits on; see the module docstring.  Close it when done."""

    def __init__(self, fd: int, settime: Callable[..., int]) -> None:
        self._fd = fd
        self._settime = settime
        self._spec = _Itimerspec()  # reused: one arming per sleep

    @classmethod
    def open(cls) -> StepTimer | None:
        """A timer for the running trio loop, or None where there is none (see the
        module docstring)."""
        from trio.testing import MockClock  # not loaded with trio: only when a server starts

        if isinstance(trio.lowlevel.current_clock(), MockClock):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            create, settime = libc.timerfd_create, libc.timerfd_settime
        except (OSError, AttributeError, TypeError):  # TypeError: CDLL(None) on Windows
            return None
        create.argtypes = [ctypes.c_int, ctypes.c_int]
        create.restype = ctypes.c_int
        settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        settime.restype = ctypes.c_int
        fd = int(create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC))
        return None if fd < 0 else cls(fd, settime)

    async def sleep_until(self, deadline: float) -> None:
        """Return at ``deadline`` (trio's clock; ``inf``: only :meth:`fire_now` ends the
        sleep), give or take the wake-up latency.  Cancellable: the timer then stays
        armed, and the next call re-arms it (which also clears an expiry nobody waited for)."""
        value = self._spec.it_value
        if deadline == math.inf:
            value.tv_sec, value.tv_nsec = 0, 0  # disarmed
        else:
            delay = deadline - trio.current_time()
            if delay > 0.0:
                fraction, seconds = math.modf(delay)
                value.tv_sec, value.tv_nsec = int(seconds), max(int(fraction * 1e9), 1)
            else:
                value.tv_sec, value.tv_nsec = 0, 1  # 0 would disarm it
        self._arm()
        await trio.lowlevel.wait_readable(self._fd)
        with contextlib.suppress(BlockingIOError):
            os.read(self._fd, 8)  # the expiry count: reading it makes the fd unreadable again

    def fire_now(self) -> None:
        """End the current :meth:`sleep_until` at once: a wake-up.  (Between sleeps it
        has no effect: the next sleep re-arms the timer, which forgets a firing.)"""
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = 0, 1
        self._arm()

    def _arm(self) -> None:
        if self._settime(self._fd, 0, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def close(self) -> None:
        trio.lowlevel.notify_closing(self._fd)
        os.close(self._fd)
