"""The per-token path's shortcuts (issue 16, third pass) give what the general rules give.

``Engine._run`` hands most jobs their next grid time without the rounding formula: it
remembers a span of deadlines known to round to the last grid time it gave out
(:func:`grid_span`).  These tests compare every entry against the formula, on random
grids and clock values and on deadlines a few ulps either side of the rounding
boundaries (where float sums of the ITL land), and check the cached bucket survives a
sink that asks for the next deadline mid-step.
"""

from __future__ import annotations

import math
import random

import pytest

from llmsim.config import Config
from llmsim.engine import Engine, Job, JobState
from llmsim.engine.grid import GRID_SHIFT, grid_span, step_grid
from llmsim.engine.prefill import ChunkedPrefill
from llmsim.engine.testing import planned_job, recording_sink, run_until_idle
from llmsim.engine.timetable import READY


def rounded(deadline: float, grid: float) -> int:
    """The grid index the rule of ``GRID_SHIFT`` gives ``deadline`` (what the engine used before)."""
    return math.ceil(deadline * (1.0 / grid) - GRID_SHIFT)


GRIDS = [0.002, step_grid(0.025, 0.002), step_grid(0.02, 0.003), 0.001, 1 / 3, 0.0017]


@pytest.mark.parametrize("grid", GRIDS)
def test_grid_span_ends_and_every_deadline_between_round_to_the_index(grid: float) -> None:
    rng = random.Random(16)
    inverse = 1.0 / grid
    for _ in range(2000):
        # Clock values up to ~2e5 s: trio's clock starts at a random offset that large.
        index = rng.choice([rng.randrange(1, 1000), rng.randrange(10**5, 10**8)])
        first, last = grid_span(index, grid, inverse)
        assert first <= last  # both ends checked: a usable span
        assert rounded(first, grid) == index and rounded(last, grid) == index
        # Every float between them (a few ulps inside each end, and random ones).
        for d in (first, math.nextafter(first, math.inf), math.nextafter(last, -math.inf), last):
            assert rounded(d, grid) == index
        for _ in range(5):
            assert rounded(rng.uniform(first, last), grid) == index
        # The span covers all but a millionth of an interval at each end.
        assert first - (index - 0.5) * grid < 3e-6 * grid + 1e-9
        assert (index + 0.5) * grid - last < 2e-6 * grid + 1e-9


def test_grid_span_ends_fail_closed() -> None:
    """A span end that does not round to the index is dropped (infinite), never guessed."""
    first, last = grid_span(10**17, 0.002, 500.0)  # beyond float precision: the formula misses
    assert (first == math.inf or rounded(first, 0.002) == 10**17) and (
        last == -math.inf or rounded(last, 0.002) == 10**17
    )


def entries_match_the_formula(engine: Engine, jobs: list[Job]) -> int:
    """Every scheduled job sits in the bucket the rounding formula names; returns how many were checked."""
    grid = engine.step_quantum
    checked = 0
    for job in jobs:
        if job.state is not JobState.DECODING or job.slot is None or job.slot == READY or job.paused:
            continue
        expected = rounded(job.deadline, grid) * grid
        assert job.slot == expected, (job.deadline, job.slot, expected)
        assert any(entry is job for entry in engine._buckets[job.slot])
        checked += 1
    return checked


@pytest.mark.parametrize(("itl", "target"), [(0.02, 0.002), (0.025, 0.002), (0.015, 0.004), (0.01, 0.003)])
@pytest.mark.parametrize("hairs", [False, True])
def test_every_entry_is_the_grid_time_the_formula_gives(itl: float, target: float, hairs: bool) -> None:
    """Many jobs at random phases (or with first deadlines a few ulps either side of a
    rounding boundary), stepped at every deadline: after each step every job's entry is
    the formula's grid time of its deadline, and every token came out."""
    config = Config(time_to_first_token=0.1, inter_token_latency=itl, max_num_seqs=1000, max_waiting_queue_length=1000)
    engine = Engine(config.engine, config.latency, rng=random.Random(1))
    engine.set_step_quantum(target)
    grid = engine.step_quantum
    rng = random.Random(7)
    offset = rng.uniform(1e4, 2e5)  # a trio-like clock value
    jobs = []
    for number in range(300):
        if hairs:
            # A first deadline (arrival + TTFT) on a boundary between two grid times, nudged by ulps.
            boundary = (round(offset / grid) + number + 0.5 + 1e-6) * grid
            arrival = boundary - 0.1
            for _ in range(rng.randrange(-3, 4)):
                arrival = math.nextafter(arrival, math.inf)
        else:
            arrival = offset + rng.uniform(0.0, 0.3)
        jobs.append((arrival, planned_job(output=rng.randrange(2, 30))))
    jobs.sort(key=lambda pair: pair[0])
    checked = 0
    for arrival, job in jobs:
        while engine.next_deadline() <= arrival:
            engine.step(engine.next_deadline())
            checked += entries_match_the_formula(engine, [job for _, job in jobs])
        engine.submit(job, arrival)
    while engine.next_deadline() != math.inf:
        engine.step(engine.next_deadline())
        checked += entries_match_the_formula(engine, [job for _, job in jobs])
    assert checked > 1000
    for _, job in jobs:
        assert job.state is JobState.FINISHED and job.emitted == len(job.output)
        assert sum(stop - start for start, stop in recording_sink(job).ranges) == len(job.output)


class AskingSink:
    """Finishes at once; asks the engine for its next deadline from inside the call."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.answers: list[float] = []

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        self.answers.append(self.engine.next_deadline())
        return True


def test_a_sink_asking_for_the_next_deadline_mid_step_loses_no_job() -> None:
    """A paused job is the only entry of the next grid time when another job's sink asks
    for the next deadline: the bucket must stay, for the job after them goes in it too."""
    config = Config(time_to_first_token=0.1, inter_token_latency=0.02)
    engine = Engine(config.engine, config.latency, rng=random.Random(1))
    engine.set_step_quantum(0.002)
    paused = planned_job(output=5)
    recording_sink(paused).accept = False
    asking = planned_job(output=1, sink=AskingSink(engine))
    last = planned_job(output=5)
    for job in (paused, asking, last):
        engine.submit(job, 0.0)
    run_until_idle(engine)
    assert isinstance(asking.sink, AskingSink) and asking.sink.answers == [math.inf]
    assert last.state is JobState.FINISHED and len(recording_sink(last).calls) == 5
    assert paused.paused and paused.emitted == 1


def test_a_resume_before_its_own_call_in_the_same_step_does_not_stop_the_pause() -> None:
    """Only a resume made during the job's own sink call cancels its pause; one made (by an
    earlier job's sink) before its call in the same step is a no-op, as before."""
    config = Config(time_to_first_token=0.1, inter_token_latency=0.02)
    engine = Engine(config.engine, config.latency, rng=random.Random(1))

    second = planned_job(output=5)
    recording_sink(second).accept = False

    class ResumingSink:
        def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
            engine.resume(second, now)  # not paused yet: a no-op
            return True

    first = planned_job(output=5, sink=ResumingSink())
    engine.submit(first, 0.0)
    engine.submit(second, 0.0)
    engine.step(0.1)
    assert second.paused and second.emitted == 1


@pytest.mark.parametrize("seed", range(6))
def test_submit_wakes_the_driver_exactly_when_the_next_deadline_moves_earlier(seed: int) -> None:
    """submit() decides from the heads alone (no liveness checks) after its own
    next_deadline(): the wake-up must still fire exactly when the next deadline moved
    earlier, through queueing, cancels, pauses, resumes and chunked prefill."""
    rng = random.Random(seed)
    ttft = rng.choice([0.0, 0.05, 0.1])
    config = Config(
        time_to_first_token=ttft,
        time_to_first_token_std_dev=rng.choice([0.0, ttft / 10]),
        inter_token_latency=rng.choice([0.0, 0.01, 0.02]),
        max_num_seqs=rng.choice([1, 3, 50]),
        max_waiting_queue_length=1000,
        max_num_batched_tokens=rng.choice([8, 2048]),
    )
    engine = Engine(config.engine, config.latency, rng=random.Random(seed))
    engine.set_step_quantum(rng.choice([0.0, 0.002]))
    wakes: list[float] = []
    engine.set_wakeup(lambda: wakes.append(0.0))
    now, jobs, fired, outcomes = 0.0, [], 0, set()
    for _ in range(400):
        op = rng.random()
        if op < 0.5:
            job = planned_job(prompt=rng.randrange(1, 40), output=rng.randrange(0, 6))
            recording_sink(job).accept = rng.random() < 0.8
            before = engine.next_deadline()
            engine.submit(job, now - rng.choice([0.0, 0.001]))
            jobs.append(job)
            expected = engine.next_deadline() < before
            assert (len(wakes) > fired) == expected
            outcomes.add(expected)
        elif op < 0.6 and jobs:
            engine.cancel(rng.choice(jobs), now)
        elif op < 0.7 and jobs:
            engine.resume(rng.choice(jobs), now)
        else:
            now += rng.choice([0.0005, 0.003, 0.02])
            while engine.next_deadline() <= now:
                engine.step(max(engine.next_deadline(), 0.0) if rng.random() < 0.5 else now)
        fired = len(wakes)
    assert outcomes == {True, False}


@pytest.mark.parametrize(("before", "after"), [(0.0, 0.02), (0.02, 0.0)])
def test_chunked_prefill_follows_reconfigure(before: float, after: float) -> None:
    """``ChunkedPrefill.enabled`` is a plain attribute now (the per-request path reads it):
    reconfigure must keep it in step with the period, both ways."""
    prefill = ChunkedPrefill(8, before)
    assert prefill.enabled is (before > 0.0)
    prefill.reconfigure(8, after)
    assert prefill.enabled is (after > 0.0)
