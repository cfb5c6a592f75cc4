"""The C twin of ``Engine._run`` (native/engine_run.c) against the pure one (``PURE_RUN``).

Two engines with the same options, seed and jobs are driven through the same script:
one runs the pure ``_run`` (bound on the instance), the other the installed C method.
Sinks follow per-call scripts (accept, refuse, raise, resume themselves or another job,
cancel another job, ask for the next deadline, answer with non-bool values), so the
loop's rare branches and its except/finally run too.  After every driver action both
worlds must agree on everything observable: every sink call (job, start, stop, now and
the job's state then), every job's fields, the timetable (buckets, their order, the
ready list), the engine's statistics and its metrics (histogram counts and sums, bit
for bit).
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import types
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.config import Config
from llmsim.engine import MAX_TOKENS_PER_STEP, Engine, Job, JobState
from llmsim.engine.pause import PauseState
from llmsim.engine.scheduler import PURE_RUN
from llmsim.engine.timetable import READY
from llmsim.speedups import NATIVE
from tests.engine.leaks import assert_flat

pytestmark = pytest.mark.skipif(NATIVE is None, reason="llmsim._speedups is not built (or LLMSIM_PURE=1)")

#: What a scripted sink does on one call; "ok" (accept) when a call has no entry.
ACTIONS = ("ok", "refuse", "raise", "resume_self", "resume_other", "cancel_other", "peek", "one", "zero", "none")
WEIGHTS = (60, 10, 3, 4, 4, 2, 3, 2, 2, 2)


class SinkError(Exception):
    pass


class World:
    """One engine, its jobs and the log of everything observable."""

    def __init__(self, config: Config, seed: int, quantum: float, native: bool) -> None:
        self.engine = Engine(config.engine, config.latency, rng=random.Random(seed))
        self.engine.set_step_quantum(quantum)
        if not native:  # the instance attribute shadows the class's (C) method
            self.engine._run = types.MethodType(PURE_RUN, self.engine)  # type: ignore[method-assign]
        self.jobs: list[Job] = []
        self.log: list[Any] = []
        put_back = self.engine._put_back

        def logged_put_back(rest: list[Job], time: float, due: float) -> None:  # both twins call it by name
            self.log.append(("put_back", [self.number(job) for job in rest], time, due))
            put_back(rest, time, due)

        self.engine._put_back = logged_put_back  # type: ignore[method-assign]

    def number(self, job: Job) -> int:
        return next(index for index, known in enumerate(self.jobs) if known is job)

    def snapshot(self) -> tuple[Any, ...]:
        engine = self.engine
        jobs = tuple(
            (
                job.state,
                job.emitted,
                job.paused,
                job.deadline,
                job.slot,
                job.last_token_time,
                job.first_token_time,
                job.finish_time,
                job.admitted_time,
                job.prefilled_tokens,
            )
            for job in self.jobs
        )
        buckets = sorted((time, [self.number(job) for job in jobs]) for time, jobs in engine._buckets.items())
        timetable = (
            buckets,
            sorted(engine._times),
            [self.number(job) for job in engine._ready],
            engine._ready_time,
            engine._decoding,
            dict(engine._resumed),
        )
        return jobs, timetable, engine.statistics(), engine.metrics.snapshot()


class ScriptedSink:
    """Acts on its n-th call as ``script[n]`` says; logs every call in its world."""

    def __init__(self, world: World, number: int, script: dict[int, tuple[str, int]]) -> None:
        self.world = world
        self.number = number
        self.script = script
        self.calls = 0

    def on_output(self, job: Job, start: int, stop: int, now: float) -> object:
        world, engine = self.world, self.world.engine
        world.log.append(("call", self.number, start, stop, now, job.state, job.emitted, job.paused))
        action, other = self.script.get(self.calls, ("ok", 0))
        self.calls += 1
        target = world.jobs[other % len(world.jobs)]
        if action == "raise":
            raise SinkError(f"job {self.number} call {self.calls}")
        if action == "resume_self":
            engine.resume(job, now)
            return False
        if action == "resume_other":
            engine.resume(target, now)
        elif action == "cancel_other":
            engine.cancel(target, now)
        elif action == "peek":
            world.log.append(("peek", engine.next_deadline()))
        return {"refuse": False, "one": 1, "zero": 0, "none": None}.get(action, True)


class FormatSink(str):
    """A sink whose ``on_output`` is a C method descriptor (``str.format``): its answer
    is a string, true unless empty."""

    on_output = str.format


def scenario_config(rng: random.Random) -> tuple[Config, float]:
    ttft, itl = rng.choice([0.0, 0.05, 0.1]), rng.choice([0.0, 0.01, 0.02, 0.025])
    config = Config(
        time_to_first_token=ttft,
        time_to_first_token_std_dev=rng.choice([0.0, 0.25 * ttft]),
        inter_token_latency=itl,
        inter_token_latency_std_dev=rng.choice([0.0, 0.0, 0.25 * itl]),  # jitter: no fixed ITL
        max_num_seqs=(seqs := rng.choice([1, 3, 8, 64])),
        max_num_batched_tokens=rng.choice([None, None, max(40, seqs)]),  # chunked prefill of long prompts
    )
    return config, rng.choice([0.0, 0.002, 0.003])


def job_specs(rng: random.Random, count: int) -> list[tuple[float, int, int, dict[int, tuple[str, int]]]]:
    """(arrival, prompt, output, sink script) of each job."""
    specs = []
    arrival = 1000.0 + rng.random()
    for _ in range(count):
        arrival += rng.expovariate(200.0)
        script = {
            call: (rng.choices(ACTIONS, WEIGHTS)[0], rng.randrange(count)) for call in range(40) if rng.random() < 0.3
        }
        specs.append((arrival, rng.choice([1, 10, 100]), rng.choice([0, 1, 2, 5, 20, 35, 60]), script))
    return specs


def drive(world: World, seed: int, specs: list[tuple[float, int, int, dict[int, tuple[str, int]]]]) -> None:
    """Submit, step (on time or late), resume, cancel and pause by a seeded script,
    logging a snapshot after each action."""
    rng = random.Random(seed)
    engine = world.engine
    for number, (_, prompt, output, script) in enumerate(specs):
        sink = ScriptedSink(world, number, script) if number % 7 else FormatSink("{2}" if number % 2 else "")
        world.jobs.append(
            Job(
                prompt_token_ids=list(range(prompt)),
                output=tuple(f"t{i}" for i in range(output)),
                finish_reason="stop",
                sink=sink,  # type: ignore[arg-type]
            )
        )
    pending = list(zip((spec[0] for spec in specs), world.jobs, strict=True))
    now = 1000.0
    paused_all = False
    for _ in range(5000):
        deadline = engine.next_deadline()
        choice = rng.random()
        if pending and pending[0][0] <= min(deadline, now + 0.05):
            arrival, job = pending.pop(0)
            now = max(now, arrival)
            if job.state is JobState.NEW:  # else cancelled before it came
                engine.submit(job, arrival)
            world.log.append(("submit", world.number(job)))
        elif choice < 0.04:
            job = rng.choice(world.jobs)
            engine.cancel(job, now)
            world.log.append(("cancel", world.number(job)))
        elif choice < 0.12 or (deadline == math.inf and not pending):
            if deadline == math.inf and not pending and not any(job.paused for job in world.jobs) and not paused_all:
                break
            for job in world.jobs:
                engine.resume(job, now)
            if paused_all:
                paused_all = False
                engine.set_pause_state(PauseState.UNPAUSED, now)
            world.log.append(("resume", now))
        elif choice < 0.14 and not paused_all:
            paused_all = True
            engine.set_pause_state(PauseState.PAUSED_ALL, now)
            world.log.append(("pause", now))
        elif deadline != math.inf:
            # late steps hand out catch-ups of several tokens, very late ones up to the cap
            lateness = rng.choices([0.0, rng.uniform(0.0, 0.05), rng.uniform(0.1, 0.5)], [70, 24, 6])[0]
            now = max(now, deadline + lateness)
            try:
                engine.step(now)
            except SinkError as error:
                world.log.append(("raised", str(error)))
            world.log.append(("step", now))
        else:
            now += 0.01
        world.log.append(world.snapshot())


def run_world(seed: int, native: bool) -> World:
    """Scenario ``seed`` driven through one world (the pure one, or the C one)."""
    rng = random.Random(seed)
    config, quantum = scenario_config(rng)
    specs = job_specs(rng, rng.randrange(1, 40))
    world = World(config, seed, quantum, native)
    drive(world, seed, specs)
    return world


def run_both(seed: int) -> tuple[World, World]:
    return run_world(seed, False), run_world(seed, True)


def assert_same(pure: World, native: World) -> None:
    for index, (expected, got) in enumerate(zip(pure.log, native.log, strict=False)):
        assert got == expected, f"log entry {index} differs"
    assert len(native.log) == len(pure.log)


def test_the_c_twin_is_installed() -> None:
    assert Engine._run is not PURE_RUN
    assert type(Engine.__dict__["_run"]).__name__ == "method_descriptor"


#: The branches each seeded scenario reached: the differential test below records them, so
#: that test_the_scenarios_reach_the_rare_branches need not drive those scenarios again.
BRANCHES: dict[int, set[str]] = {}


@pytest.mark.parametrize("seed", range(40))
def test_pure_and_native_agree_on_seeded_scenarios(seed: int) -> None:
    pure, native = run_both(seed)
    assert_same(pure, native)
    BRANCHES[seed] = branches_reached(pure.log)


@given(seed=st.integers(min_value=40, max_value=2**32))
def test_pure_and_native_agree_on_random_scenarios(seed: int) -> None:
    pure, native = run_both(seed)
    assert_same(pure, native)


def test_the_scenarios_reach_the_rare_branches() -> None:
    """The seeded scenarios exercise what the differential tests are for: the sinks'
    actions, and catch-ups (several tokens in one call, the per-step cap, a job finishing
    in one, a job left in the ready list by the cap).  (A scenario the differential test
    has not run yet, as when this test runs alone, is driven here, in the pure world.)"""
    seen: set[str] = set()
    for seed in range(40):
        if seed not in BRANCHES:
            BRANCHES[seed] = branches_reached(run_world(seed, False).log)
        seen |= BRANCHES[seed]
    assert {"call", "raised", "put_back_some", "peek", "cancel", "pause", "resume"} <= seen
    assert {"catch_up", "catch_up_finished", "cap", "ready"} <= seen


def branches_reached(log: list[Any]) -> set[str]:
    """What a scenario's log shows it went through: its actions, and the kinds of catch-up."""
    seen: set[str] = set()
    for entry in log:
        if isinstance(entry, tuple) and entry and isinstance(entry[0], str):
            seen.add(entry[0] if entry[0] != "put_back" or not entry[1] else "put_back_some")
            if entry[0] == "call" and entry[3] - entry[2] > 1:
                seen.add("catch_up_finished" if entry[5] is JobState.FINISHED else "catch_up")
                seen.add("cap" if entry[3] - entry[2] == MAX_TOKENS_PER_STEP else "catch_up")
        elif isinstance(entry, tuple) and any(job[4] == READY for job in entry[0]):
            seen.add("ready")
    return seen


def python_frames_of_run(engine: Engine, now: float) -> int:
    """How many Python frames of ``_run`` ``engine.step(now)`` made (the C twin makes none)."""
    calls = 0

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call" and frame.f_code is PURE_RUN.__code__:
            calls += 1

    sys.setprofile(profile)
    try:
        engine.step(now)
    finally:
        sys.setprofile(None)
    return calls


def test_unusual_calls_go_to_the_pure_twin() -> None:
    """A float ``now`` is the C loop's; an int ``now`` goes to the pure function, and
    both give what the pure engine gives."""
    config = Config(time_to_first_token=1.0, inter_token_latency=1.0)
    worlds = []
    for native in (False, True):
        world = World(config, 0, 0.0, native)
        world.jobs = [Job([1, 2], ("a", "b", "c"), "stop", ScriptedSink(world, 0, {}))]
        world.engine.submit(world.jobs[0], 0)
        frames = [python_frames_of_run(world.engine, now) for now in (1, 2.0, 3)]
        world.log.append(world.snapshot())
        worlds.append((world, frames))
    (pure, pure_frames), (native, native_frames) = worlds
    assert pure_frames == [1, 1, 1]
    assert native_frames == [1, 0, 1]
    assert_same(pure, native)
    assert native.jobs[0].state is JobState.FINISHED


def test_a_sink_that_is_a_c_method() -> None:
    """``on_output`` a C method descriptor (``str.format``), its answer a string."""
    config = Config(time_to_first_token=0.1, inter_token_latency=0.02)
    engine = Engine(config.engine, config.latency, rng=random.Random(0))
    accepting, refusing = FormatSink("{2}"), FormatSink("")
    jobs = [Job([1], ("a", "b", "c"), "stop", accepting), Job([1], ("a", "b", "c"), "stop", refusing)]  # type: ignore[arg-type]
    for job in jobs:
        engine.submit(job, 0.0)
    engine.step(0.1)
    engine.step(engine.next_deadline())
    assert jobs[0].emitted == 2 and not jobs[0].paused
    assert jobs[1].emitted == 1 and jobs[1].paused  # "" is false: paused after its first token


# --- references and memory ------------------------------------------------------------------


class CountingSink:
    """Accepts, or raises on every ``every``-th call."""

    def __init__(self, every: int = 0) -> None:
        self.every = every
        self.calls = 0

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        self.calls += 1
        if self.every and self.calls % self.every == 0:
            raise SinkError
        return True


def long_jobs(engine: Engine, sinks: list[CountingSink], tokens: int) -> list[Job]:
    jobs = [Job([1, 2, 3], ("x",) * tokens, "stop", sink) for sink in sinks]
    for job in jobs:
        engine.submit(job, 0.0)
    return jobs


def run_steps(engine: Engine, count: int) -> None:
    for _ in range(count):
        with contextlib.suppress(SinkError):
            engine.step(engine.next_deadline())


@pytest.mark.parametrize("every", [0, 3])
@pytest.mark.parametrize("quantum", [0.0, 0.002])
def test_no_reference_or_memory_leaks(every: int, quantum: float) -> None:
    """10,000 steps of the C loop (with sinks raising on every third call, the
    except path): the references of the objects it touches and the traced memory stay flat."""
    config = Config(time_to_first_token=0.1, inter_token_latency=0.02)
    engine = Engine(config.engine, config.latency, rng=random.Random(0))
    engine.set_step_quantum(quantum)
    sinks = [CountingSink(every), CountingSink(0)]
    jobs = long_jobs(engine, sinks, 50_000)
    histogram = engine.metrics.inter_token_latency
    watched = [
        *jobs,
        *sinks,
        engine,
        READY,
        JobState.DECODING,
        JobState.PREFILL,
        histogram,
        histogram.bounds,
        histogram.counts,
        engine._resumed,
        PURE_RUN,
    ]
    assert_flat(lambda steps: run_steps(engine, steps), watched, warm_ups=(2000, 1000), measured=10_000)
    assert sum(sink.calls for sink in sinks) > 10_000
    assert all(job.state is JobState.DECODING for job in jobs)


def raise_in_blocks(native: bool, put_back_raises: bool, sum_broken: bool) -> tuple[Any, ...]:
    """Two jobs due at once, the first one's sink raising; the put-back and/or the
    finally block's ``histogram.sum += ...`` raise too.  Returns what was raised
    (type, its context's type) and the state after."""
    config = Config(time_to_first_token=0.1, inter_token_latency=0.02)
    world = World(config, 0, 0.0, native)
    engine = world.engine
    world.jobs = [Job([1], ("a", "b", "c"), "stop", CountingSink(every)) for every in (2, 0)]
    for job in world.jobs:
        engine.submit(job, 0.0)
    engine.step(0.1)
    if put_back_raises:

        def refuse(rest: list[Job], time: float, due: float) -> None:
            raise RuntimeError("put back")

        engine._put_back = refuse  # type: ignore[method-assign]
    if sum_broken:
        engine.metrics.inter_token_latency.sum = None  # type: ignore[assignment]
    with pytest.raises(Exception) as raised:
        engine.step(engine.next_deadline())
    context = raised.value.__context__
    engine.metrics.inter_token_latency.sum = 0.0
    return type(raised.value), type(context) if context is not None else None, world.snapshot()


@pytest.mark.parametrize(
    ("put_back_raises", "sum_broken"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_errors_in_the_except_and_finally_blocks(put_back_raises: bool, sum_broken: bool) -> None:
    """The same exception (with the same context) and the same state after, whichever
    of the loop, the put-back and the finally block raised."""
    pure = raise_in_blocks(False, put_back_raises, sum_broken)
    native = raise_in_blocks(True, put_back_raises, sum_broken)
    assert native == pure
    expected = TypeError if sum_broken else RuntimeError if put_back_raises else SinkError
    assert pure[0] is expected
    context = None if expected is SinkError else RuntimeError if put_back_raises and sum_broken else SinkError
    assert pure[1] is context
