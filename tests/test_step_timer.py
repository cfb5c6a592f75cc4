"""The engine task's timer: wakes at the deadline, not at the next whole millisecond.

These run on trio's real clock (the timer counts real time), so they sleep a few
milliseconds for real.
"""

from __future__ import annotations

import math
import random
import statistics

import trio
from trio.testing import MockClock

from llmsim.step_timer import StepTimer


def open_timer() -> StepTimer:
    timer = StepTimer.open()
    assert timer is not None  # Linux: the reference platform has timerfd
    return timer


async def test_a_mock_clock_gets_no_timer(autojump_clock: MockClock) -> None:
    assert StepTimer.open() is None  # the engine task then sleeps on trio's deadline


async def test_it_is_never_early_and_beats_trios_millisecond_timeout() -> None:
    """Targets at random phases of a 2 ms grid, as engine steps are.  trio's own sleep
    ends up to 1 ms late (epoll_wait's timeout is rounded up to whole milliseconds),
    the timer's only by the wake-up latency; compared in the same run, interleaved, so
    that a loaded machine slows both alike."""
    timer = open_timer()
    rng = random.Random(3)
    late: dict[str, list[float]] = {"timer": [], "trio": []}
    try:
        for _ in range(25):
            for name in ("timer", "trio"):
                await trio.sleep(rng.uniform(0.0, 0.002))
                deadline = (int(trio.current_time() / 0.002) + 2) * 0.002
                if name == "timer":
                    await timer.sleep_until(deadline)
                else:
                    await trio.sleep_until(deadline)
                late[name].append(trio.current_time() - deadline)
    finally:
        timer.close()
    assert min(late["timer"]) >= 0.0
    assert statistics.median(late["timer"]) < statistics.median(late["trio"]) - 0.0002


async def test_a_cancelled_sleep_leaves_no_expiry_behind() -> None:
    timer = open_timer()
    try:
        with trio.move_on_after(0.0005):
            await timer.sleep_until(trio.current_time() + 0.001)
        await trio.sleep(0.003)  # the abandoned arming has expired by now
        deadline = trio.current_time() + 0.02
        await timer.sleep_until(deadline)  # re-arming cleared it: no early return
        assert trio.current_time() >= deadline
    finally:
        timer.close()


async def test_a_deadline_already_past_returns_at_once() -> None:
    timer = open_timer()
    try:
        with trio.fail_after(1):
            await timer.sleep_until(trio.current_time() - 1.0)
    finally:
        timer.close()


async def test_fire_now_ends_a_sleep_without_a_deadline() -> None:
    """The engine task's wake-up: with nothing planned it sleeps with no deadline
    (the timer disarmed) until a submitted job fires the timer."""
    timer = open_timer()
    woke_at: list[float] = []

    async def sleeper() -> None:
        await timer.sleep_until(math.inf)
        woke_at.append(trio.current_time())

    try:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sleeper)
                await trio.sleep(0.01)  # a disarmed timer does not fire on its own
                assert woke_at == []
                fired_at = trio.current_time()
                timer.fire_now()
        assert woke_at and woke_at[0] >= fired_at
    finally:
        timer.close()


async def test_a_firing_between_sleeps_is_forgotten() -> None:
    timer = open_timer()
    try:
        timer.fire_now()
        await trio.sleep(0.002)  # it has fired, and nobody waited
        deadline = trio.current_time() + 0.02
        await timer.sleep_until(deadline)  # re-arming cleared it: no early return
        assert trio.current_time() >= deadline
    finally:
        timer.close()
