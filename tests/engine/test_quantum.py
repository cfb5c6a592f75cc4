"""The step quantum: steps on a grid, every token at the grid time nearest its deadline
(at most half an interval early or late, zero on average), every gap of a constant ITL exact.

Driven with a fake clock (plain ``now`` values), except the last test, which runs the
server's engine task under trio's MockClock.
"""

from __future__ import annotations

import math
import random
from itertools import pairwise

import attrs
import pytest
import trio
import trio.testing

from llmsim.app import STEP_QUANTUM, Simulator
from llmsim.config import Config
from llmsim.engine import Engine, Job, JobState
from llmsim.engine.grid import step_grid
from llmsim.engine.testing import planned_job, recording_sink, run_until_idle

TTFT, ITL = 0.1, 0.02
PACED = Config(time_to_first_token=TTFT, inter_token_latency=ITL, max_num_seqs=5000, max_waiting_queue_length=5000)
#: Float sums of ITLs may land this far on either side of a grid time.
EPS = 1e-9


@attrs.define
class DeadlineSink:
    """Records each call's time and the deadline the engine set for the *next* token."""

    times: list[float] = attrs.Factory(list)
    next_deadlines: list[float] = attrs.Factory(list)

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        self.times.append(now)
        self.next_deadlines.append(job.deadline)
        return True


def quantized_engine(config: Config = PACED, quantum: float = 0.002, seed: int = 1) -> Engine:
    engine = Engine(config.engine, config.latency, rng=random.Random(seed))
    engine.set_step_quantum(quantum)
    return engine


def submit_spread(engine: Engine, count: int, *, output: int = 20, span: float = 0.5, seed: int = 2) -> list[Job]:
    """``count`` jobs arriving at random times over ``span`` seconds (each submitted
    when the engine has stepped up to its arrival, as a server would)."""
    rng = random.Random(seed)
    jobs = []
    for arrival in sorted(rng.uniform(0.0, span) for _ in range(count)):
        while engine.next_deadline() <= arrival:
            engine.step(engine.next_deadline())
        job = planned_job(output=output, sink=DeadlineSink())
        engine.submit(job, arrival)
        jobs.append(job)
    return jobs


def sink_of(job: Job) -> DeadlineSink:
    assert isinstance(job.sink, DeadlineSink)
    return job.sink


# --- the grid ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("itl", "target", "expected"),
    [
        (0.02, 0.002, 0.002),  # divides the ITL already
        (0.025, 0.002, 0.025 / 13),  # the largest ITL / k not above the target
        (0.001, 0.002, 0.001),  # an ITL below the target is the grid
        (0.0, 0.002, 0.002),  # no ITL: the target itself
        (0.02, 0.0, 0.0),  # no quantum: exact steps
    ],
)
def test_the_grid_divides_the_inter_token_latency(itl: float, target: float, expected: float) -> None:
    grid = step_grid(itl, target)
    assert grid == pytest.approx(expected)
    assert grid <= target
    if grid and itl:
        assert itl / grid == pytest.approx(round(itl / grid))


def test_the_grid_follows_reconfigure() -> None:
    engine = quantized_engine()
    assert engine.step_quantum == pytest.approx(0.002)
    engine.reconfigure(PACED.engine, attrs.evolve(PACED.latency, inter_token_latency=0.015))
    assert engine.step_quantum == pytest.approx(0.015 / 8)
    engine.set_step_quantum(0.0)
    assert engine.step_quantum == 0.0


# --- when tokens go out -----------------------------------------------------------------------


@pytest.mark.parametrize("quantum", [0.002, 0.005, 0.003])
def test_tokens_go_out_at_the_nearest_grid_time_unbiased(quantum: float) -> None:
    engine = quantized_engine(quantum=quantum)
    grid = engine.step_quantum
    jobs = submit_spread(engine, 300)
    run_until_idle(engine)
    errors = []
    for job in jobs:
        times = sink_of(job).times
        assert len(times) == 20  # a punctual driver: one token per call
        exact = [job.arrival_time + TTFT + i * ITL for i in range(20)]
        assert all(e - grid / 2 - EPS <= t <= e + grid / 2 + EPS for t, e in zip(times, exact, strict=True))
        assert all(t / grid == pytest.approx(round(t / grid), abs=1e-6) for t in times)
        errors.append(times[0] - exact[0])
    # Uniform in [-grid/2, grid/2] over the arrivals: zero on average (rounding up made it grid/2).
    assert abs(sum(errors) / len(errors)) < 0.1 * grid


def test_with_a_grid_that_divides_the_itl_every_gap_is_exact() -> None:
    engine = quantized_engine()
    jobs = submit_spread(engine, 200)
    run_until_idle(engine)
    gaps = [b - a for job in jobs for a, b in pairwise(sink_of(job).times)]
    assert gaps == pytest.approx([ITL] * len(gaps), abs=1e-9)


def test_jittered_and_load_scaled_tokens_are_at_most_half_an_interval_off_either() -> None:
    config = PACED.replace(
        time_to_first_token_std_dev=0.02,
        inter_token_latency_std_dev=0.005,
        time_factor_under_load=2.0,
        max_num_seqs=400,
    )
    engine = quantized_engine(config)
    grid = engine.step_quantum
    jobs = submit_spread(engine, 300)
    run_until_idle(engine)
    for job in jobs:
        sink = sink_of(job)
        # Call k hands out the token that was "next" at call k - 1.
        for due, at in zip(sink.next_deadlines[:-1], sink.times[1:], strict=True):
            assert due - grid / 2 - EPS <= at <= due + grid / 2 + EPS


def test_steps_happen_only_on_the_grid_so_they_are_few() -> None:
    exact = Engine(PACED.engine, PACED.latency, rng=random.Random(1))
    quantized = quantized_engine()
    steps = {}
    for name, engine in (("exact", exact), ("quantized", quantized)):
        submit_spread(engine, 500, span=1.0)
        run_until_idle(engine)
        steps[name] = engine.statistics().steps
    span = 1.0 + TTFT + 19 * ITL
    assert steps["quantized"] <= span / 0.002 + 1
    assert steps["exact"] > 5 * steps["quantized"]
    assert quantized.statistics().generated_tokens == exact.statistics().generated_tokens == 500 * 20


def test_a_token_goes_out_early_only_once_its_grid_time_has_come() -> None:
    config = PACED.replace(inter_token_latency=0.002)  # grid 2 ms: one token per grid time
    engine = quantized_engine(config)
    near, far = planned_job(prompt=0, output=3), planned_job(prompt=0, output=3)
    engine.submit(near, 0.0029)  # due at 0.1029: nearest grid time 0.102
    engine.submit(far, 0.0031)  # due at 0.1031: nearest grid time 0.104
    grid_time = engine.next_deadline()
    assert grid_time == pytest.approx(0.102)
    engine.step(0.1015)  # a step before the grid time hands out nothing
    assert near.emitted == far.emitted == 0
    engine.step(grid_time)
    assert (near.emitted, far.emitted) == (1, 0)  # 0.9 ms early, the most is 1 ms
    # Half an interval late, the step still belongs to grid time 0.104: near's token due
    # at 0.1049 goes along, far's next one (due 0.1051, grid time 0.106) does not, though
    # "now + grid / 2" would reach it.
    engine.step(0.1045)
    assert (near.emitted, far.emitted) == (2, 1)
    run_until_idle(engine)
    assert recording_sink(near).times == pytest.approx([0.102, 0.1045, 0.106])
    assert recording_sink(far).times == pytest.approx([0.1045, 0.106, 0.108])


def test_due_tokens_do_not_wait_for_the_grid() -> None:
    engine = quantized_engine(Config(), quantum=0.005)  # zero latency
    job = planned_job(output=40)
    engine.submit(job, 0.0013)
    assert engine.next_deadline() == pytest.approx(0.0013)
    engine.step(0.0013)
    assert job.emitted == 16
    assert engine.next_deadline() <= 0.0013  # the rest is due at once, not at 0.005
    run_until_idle(engine)
    assert job.state is JobState.FINISHED
    assert recording_sink(job).times == pytest.approx([0.0013] * 3)


def test_a_late_step_catches_up_on_every_bucket_it_passed() -> None:
    engine = quantized_engine()
    jobs = [planned_job(output=10) for _ in range(3)]
    for i, job in enumerate(jobs):
        engine.submit(job, 0.0007 * i)
    engine.step(0.2)
    # First tokens due at 0.1, 0.1007, 0.1014; then every 20 ms: six tokens by 0.2, and
    # the second job's 0.2007 goes with them (its nearest grid time is 0.2), 0.2014 not.
    assert [job.emitted for job in jobs] == [6, 6, 5]
    run_until_idle(engine)
    assert all(job.state is JobState.FINISHED for job in jobs)


def test_a_punctual_driver_has_no_late_steps() -> None:
    engine = quantized_engine()
    submit_spread(engine, 100)
    run_until_idle(engine)
    stats = engine.statistics()
    assert stats.late_steps == 0 and stats.max_lateness == pytest.approx(0.0, abs=1e-9)


# --- entries: pause, resume, cancel, failures --------------------------------------------------


def test_resume_before_the_step_keeps_the_one_entry() -> None:
    engine = quantized_engine()
    job = planned_job(output=3)
    recording_sink(job).accept = False
    engine.submit(job, 0.0013)  # first token due at 0.1013: grid time 0.102
    run_until_idle(engine)
    assert job.paused
    recording_sink(job).accept = True
    engine.resume(job, 0.11)  # before the next token's grid time (0.122)
    engine.resume(job, 0.111)  # a second resume is a no-op
    run_until_idle(engine)
    assert recording_sink(job).times == pytest.approx([0.102, 0.122, 0.142])


def test_resume_after_the_deadline_is_a_ready_entry_and_the_stale_one_is_skipped() -> None:
    engine = quantized_engine()
    job = planned_job(output=3)
    recording_sink(job).accept = False
    engine.submit(job, 0.0013)
    run_until_idle(engine)
    recording_sink(job).accept = True
    engine.resume(job, 0.1215)  # after the deadline 0.1213, before its grid time 0.122
    assert engine.next_deadline() == pytest.approx(0.1215)
    engine.step(0.1215)
    run_until_idle(engine)
    # From 0.1215 on, the chain continues from there: 0.1415 -> grid 0.142.
    assert recording_sink(job).times == pytest.approx([0.102, 0.1215, 0.142])


def test_cancelled_entries_do_not_make_steps() -> None:
    engine = quantized_engine()
    jobs = [planned_job(output=5) for _ in range(3)]
    for job in jobs:
        engine.submit(job, 0.0)
    engine.step(0.1)
    for job in jobs:
        engine.cancel(job, 0.105)
    assert engine.next_deadline() == math.inf


def test_a_failing_sink_does_not_lose_the_rest_of_its_bucket() -> None:
    engine = quantized_engine()

    class Broken:
        def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
            raise RuntimeError("renderer bug")

    broken = planned_job(output=3, sink=Broken())
    healthy = planned_job(output=3)
    engine.submit(broken, 0.0013)
    engine.submit(healthy, 0.0011)  # due at 0.1013 and 0.1011: both at grid time 0.102
    engine.step(0.02)  # their prompts are prefilled at the end of the first period
    grid_time = engine.next_deadline()
    assert grid_time == pytest.approx(0.102)
    with pytest.raises(RuntimeError, match="renderer bug"):
        engine.step(grid_time)
    assert engine.next_deadline() == grid_time
    engine.step(grid_time)
    assert recording_sink(healthy).times == pytest.approx([0.102])
    assert engine.next_deadline() == pytest.approx(0.122)


# --- the server's engine task ----------------------------------------------------------------------


def test_the_engine_task_steps_on_the_grid() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    sim_jobs: list[Job] = []

    async def main() -> None:
        sim = Simulator(PACED)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sim.run_engine)
            await trio.sleep(0.0001)
            assert sim.engine.step_quantum == pytest.approx(STEP_QUANTUM)
            for delay in (0.0003, 0.0011, 0.0004):
                await trio.sleep(delay)
                job = planned_job(output=5, sink=DeadlineSink())
                sim.engine.submit(job, trio.current_time())
                sim_jobs.append(job)
            while not all(job.done for job in sim_jobs):
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
    grid = STEP_QUANTUM
    for job in sim_jobs:
        times = sink_of(job).times
        assert len(times) == 5
        first = job.arrival_time + TTFT
        assert first - grid / 2 - EPS <= times[0] <= first + grid / 2 + EPS
        assert all(t / grid == pytest.approx(round(t / grid), abs=1e-6) for t in times)
        assert [b - a for a, b in pairwise(times)] == pytest.approx([ITL] * 4, abs=1e-9)
