"""The C twins of ``Engine._advance`` and ``Timetable._enter`` (native/engine_advance.c)
against the pure engine.

A late step hands a job every token due by its reach at once (up to the per-step cap):
the C loop counts them, finishes the job or gives it its next entry (the span cache, the
grid formula of ``Timetable._enter``, or the ready list) without the Python methods.
Here jobs get crafted deadlines (near grid boundaries, at negative times, with the cap
in reach) and steps come late; the pure engine (``PURE_RUN`` bound on the instance) and
the C one must agree on everything, floats compared by ``repr`` (so ``-0.0`` is not
``0.0``).  tests/engine/test_native_run.py compares whole random scenarios.
"""

from __future__ import annotations

import collections
import math
import random
import sys
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsim.config import Config
from llmsim.engine import MAX_TOKENS_PER_STEP, Engine, Job, JobState
from llmsim.engine.grid import grid_span
from llmsim.engine.scheduler import PURE_RUN
from llmsim.engine.timetable import READY
from llmsim.speedups import NATIVE
from tests.engine.leaks import assert_flat

pytestmark = pytest.mark.skipif(NATIVE is None, reason="llmsim._speedups is not built (or LLMSIM_PURE=1)")


class Sink:
    """Logs every call; on its ``reconfigure_at``-th call reconfigures the engine."""

    def __init__(self, log: list[Any], number: int, engine: Engine, reconfigure_at: int = -1) -> None:
        self.log, self.number, self.engine, self.reconfigure_at = log, number, engine, reconfigure_at
        self.calls = 0

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        self.log.append(("call", self.number, start, stop, now, job.deadline, job.slot, job.state))
        if self.calls == self.reconfigure_at:
            config = Config(time_to_first_token=0.1, inter_token_latency=0.007)
            self.engine.reconfigure(config.engine, config.latency)
        self.calls += 1
        return True


def make_engine(native: bool, itl: float, quantum: float, engine_class: type[Engine] = Engine) -> Engine:
    config = Config(time_to_first_token=0.1, inter_token_latency=itl, max_num_seqs=64)
    engine = engine_class(config.engine, config.latency, rng=random.Random(0))
    engine.set_step_quantum(quantum)
    if not native:  # the instance attribute shadows the class's (C) method
        engine._run = types.MethodType(PURE_RUN, engine)  # type: ignore[method-assign]
    return engine


def snapshot(engine: Engine, jobs: list[Job]) -> str:
    """Everything observable, as one string (``repr`` tells -0.0 from 0.0)."""
    number = {id(job): index for index, job in enumerate(jobs)}
    state = (
        [(job.state, job.emitted, job.deadline, job.slot, job.finish_time, job.last_token_time) for job in jobs],
        sorted((repr(time), [number[id(job)] for job in bucket]) for time, bucket in engine._buckets.items()),
        sorted(repr(time) for time in engine._times),
        [number[id(job)] for job in engine._ready],
        engine._ready_time,
        engine.statistics(),
        engine.metrics.snapshot(),
    )
    return repr(state)


#: (output tokens, deadline offset from the step after the first token, in grid intervals or ITLs)
JobSpec = tuple[int, float]


def run_case(
    native: bool, base: float, itl: float, quantum: float, specs: list[JobSpec], lateness: list[float]
) -> list[str]:
    """Jobs submitted at ``base``, their first token at the first step; then each job's
    deadline is set to a crafted value and steps come ``lateness`` ITLs late."""
    engine = make_engine(native, itl, quantum)
    log: list[Any] = []
    jobs = [
        Job([1, 2], tuple(f"t{i}" for i in range(tokens)), "stop", Sink(log, index, engine))  # type: ignore[arg-type]
        for index, (tokens, _) in enumerate(specs)
    ]
    for job in jobs:
        engine.submit(job, base)
    now = engine.next_deadline()
    engine.step(now)
    unit = quantum or itl or 0.001
    for job, (_, offset) in zip(jobs, specs, strict=True):
        if job.state is JobState.DECODING:
            job.deadline = now + offset * unit  # still in its bucket: the step takes it from there
    states = [snapshot(engine, jobs)]
    for late in lateness:
        deadline = engine.next_deadline()
        if deadline == float("inf"):
            break
        now = max(now, deadline + late * (itl or 0.001))
        engine.step(now)
        states.append(snapshot(engine, jobs))
        states.append(repr(log))
    return states


# negative times (a grid time of 0 after negative ones) and clocks so large that a grid
# span's ends fail their check (grid.py:grid_span) as well as ordinary ones
BASES = st.sampled_from([-1.0, -0.12, -0.0123, 0.0, 1000.0, 123456.789, 3e9, 1e12])
ITLS = st.sampled_from([0.0, 0.001, 0.02, 0.025, 0.1 / 3])
QUANTA = st.sampled_from([0.0, 0.002, 0.003, 0.0025])
# offsets near the half-interval boundaries of the grid (GRID_SHIFT) and between them
OFFSETS = st.one_of(
    st.integers(-30, 30).map(float),
    st.builds(lambda k, eps: k + 0.5 + eps, st.integers(-30, 30), st.sampled_from([-2e-6, -1e-6, 0.0, 1e-6, 3e-6])),
    st.floats(-30.0, 30.0, allow_nan=False),
)
SPECS = st.lists(st.tuples(st.integers(1, 60), OFFSETS), min_size=1, max_size=8)
LATENESS = st.lists(st.sampled_from([0.0, 0.0, 0.4, 2.0, 3.5, 7.0, 20.0]), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(base=BASES, itl=ITLS, quantum=QUANTA, specs=SPECS, lateness=LATENESS)
def test_catchups_agree(base: float, itl: float, quantum: float, specs: list[JobSpec], lateness: list[float]) -> None:
    assert run_case(True, base, itl, quantum, specs, lateness) == run_case(False, base, itl, quantum, specs, lateness)


@pytest.mark.parametrize("quantum", [0.0, 0.002, 0.003])
@pytest.mark.parametrize("base", [-0.05, 0.0, 1000.0])
def test_seeded_catchups_agree(quantum: float, base: float) -> None:
    rng = random.Random(f"{quantum} {base}")
    for _ in range(20):
        specs = [(rng.randrange(1, 60), rng.uniform(-20.0, 20.0)) for _ in range(rng.randrange(1, 10))]
        lateness = [rng.choice([0.0, 1.5, 3.0, 5.0, 18.0]) for _ in range(10)]
        itl = rng.choice([0.02, 0.025])
        native = run_case(True, base, itl, quantum, specs, lateness)
        assert native == run_case(False, base, itl, quantum, specs, lateness)


@pytest.mark.parametrize("native", [False, True])
def test_a_grid_time_of_zero_is_positive_zero(native: bool) -> None:
    """A deadline just before 0 rounds to grid time 0 (``math.ceil`` gives the int 0):
    the bucket's key and the job's slot are 0.0, not -0.0 (C's ``ceil`` gives -0.0)."""
    engine = make_engine(native, 0.02, 0.002)
    job = Job([1], ("x",) * 5, "stop", Sink([], 0, engine))  # type: ignore[arg-type]
    engine.submit(job, -0.1205)  # the first token due at -0.0205: a step at -0.02 reaches -0.019
    while not job.emitted:
        engine.step(engine.next_deadline())
    assert job.deadline == pytest.approx(-0.0005)  # the second one: past the reach, on grid time 0
    assert repr(job.slot) == "0.0" and [repr(time) for time in engine._buckets] == ["0.0"]


def deadline_before(target: float, itl: float) -> float:
    """A deadline ``d`` with ``d + itl == target`` exactly (in floats)."""
    deadline = target - itl
    while deadline + itl != target:
        deadline = math.nextafter(deadline, target if deadline + itl < target else -math.inf)
    return deadline


@pytest.mark.parametrize("native", [False, True])
def test_a_grid_span_end_that_fails_its_check(native: bool) -> None:
    """At a clock of 1e12 s the float products are coarse: grid time 500000000000003 * 2 ms
    has a span whose upper end (index + 0.5) * grid itself rounds to the next grid time, so
    grid_span drops that end.  A job due there after one due inside the span gets the next
    bucket, not the remembered one."""
    grid, index = 0.002, 500_000_000_000_003
    high = (index + 0.5) * grid
    assert grid_span(index, grid, 1 / grid)[1] == -math.inf  # the case this test is about
    engine = make_engine(native, 0.02, grid)
    jobs = [Job([1], ("x",) * 5, "stop", Sink([], number, engine)) for number in range(2)]  # type: ignore[arg-type]
    for job in jobs:
        engine.submit(job, 1e12 - 0.2)
    while not jobs[1].emitted:
        engine.step(engine.next_deadline())
    jobs[0].deadline = deadline_before(index * grid, 0.02)
    jobs[1].deadline = deadline_before(high, 0.02)
    engine.step(engine.next_deadline())
    assert [job.emitted for job in jobs] == [2, 2]
    assert [job.slot for job in jobs] == [index * grid, (index + 1) * grid]


def python_calls(native: bool, step_every: float, quantum: float) -> tuple[collections.Counter[str], list[str]]:
    """The Python functions of the engine called while late steps run (each ``step_every``
    ITLs), and the states after each step."""
    engine = make_engine(native, 0.02, quantum)
    log: list[Any] = []
    jobs = [Job([1], ("x",) * 40, "stop", Sink(log, index, engine)) for index in range(30)]  # type: ignore[arg-type]
    for index, job in enumerate(jobs):
        engine.submit(job, 1000.0 + index * 0.0007)
    calls: collections.Counter[str] = collections.Counter()

    def profile(frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call":
            calls[frame.f_code.co_name] += 1

    states = []
    now = 1000.0
    while (deadline := engine.next_deadline()) != float("inf"):
        now = max(now + step_every * 0.02, deadline)
        sys.setprofile(profile)
        try:
            engine.step(now)
        finally:
            sys.setprofile(None)
        states.append(snapshot(engine, jobs))
    states.append(repr(log))
    return calls, states


@pytest.mark.parametrize("quantum", [0.0, 0.002])
@pytest.mark.parametrize("step_every", [3.0, 4.5, 17.0])
def test_catchups_run_in_c(step_every: float, quantum: float) -> None:
    """Late steps (several tokens due per job, the cap hit every 17 ITLs): the same
    states, and the C loop calls none of _advance, due_tokens and _enter in Python; the
    ends of jobs (_finish) and the ready list (_enter_ready, at the cap) stay Python's."""
    pure_calls, pure_states = python_calls(False, step_every, quantum)
    native_calls, native_states = python_calls(True, step_every, quantum)
    assert native_states == pure_states
    assert pure_calls["_advance"] > 0 and pure_calls["due_tokens"] > 0 and pure_calls["_enter"] > 0
    assert native_calls["_advance"] == native_calls["due_tokens"] == native_calls["_enter"] == 0
    assert native_calls["_finish"] == pure_calls["_finish"] == 30
    assert native_calls["_enter_ready"] == pure_calls["_enter_ready"]
    assert (pure_calls["_enter_ready"] > 0) == (step_every > MAX_TOKENS_PER_STEP)


class LoggingEngine(Engine):
    """An engine whose _advance and _enter are its own: the C loop must call them."""

    calls: list[str]

    def _advance(self, job: Job, start: int, now: float, reach: float) -> int:
        self.calls.append(f"advance {start} {now!r} {reach!r}")
        return super()._advance(job, start, now, reach)

    def _enter(self, job: Job, deadline: float, now: float) -> tuple[float, float, float, list[Job]]:
        self.calls.append(f"enter {deadline!r} {now!r}")
        return super()._enter(job, deadline, now)


def overridden_run(native: bool, quantum: float) -> tuple[list[str], list[str]]:
    engine = make_engine(native, 0.02, quantum, engine_class=LoggingEngine)
    assert isinstance(engine, LoggingEngine)
    engine.calls = []
    log: list[Any] = []
    jobs = [Job([1], ("x",) * 12, "stop", Sink(log, index, engine)) for index in range(3)]  # type: ignore[arg-type]
    return engine.calls, [*run_late(engine, jobs, 0.07), repr(log)]


def run_late(engine: Engine, jobs: list[Job], gap: float) -> list[Any]:
    """Submit ``jobs`` at 0, then step at least ``gap`` after the last step until nothing
    is due: the state after each step."""
    for job in jobs:
        engine.submit(job, 0.0)
    now = 0.0
    states = []
    while (deadline := engine.next_deadline()) != float("inf"):
        now = max(now + gap, deadline)
        engine.step(now)
        states.append(snapshot(engine, jobs))
    return states


@pytest.mark.parametrize("quantum", [0.0, 0.002])
def test_overridden_methods_are_called(quantum: float) -> None:
    pure = overridden_run(False, quantum)
    native = overridden_run(True, quantum)
    assert native == pure
    assert any(call.startswith("advance") for call in native[0])
    assert any(call.startswith("enter") for call in native[0])


@pytest.mark.parametrize("quantum", [0.0, 0.002])
def test_a_sink_that_reconfigures_mid_step(quantum: float) -> None:
    """The Python _advance reads the engine's latency model at each call: after a sink
    replaced it, the C loop counts no catch-up with the old fixed ITL."""
    states = []
    for native in (False, True):
        engine = make_engine(native, 0.02, quantum)
        log: list[Any] = []
        jobs = [
            Job([1], ("x",) * 30, "stop", Sink(log, index, engine, reconfigure_at=3 if index == 0 else -1))  # type: ignore[arg-type]
            for index in range(4)
        ]
        states.append([*run_late(engine, jobs, 0.09), repr(log)])
    assert states[1] == states[0]


# --- references and memory ------------------------------------------------------------------


class CountingSink:
    def __init__(self) -> None:
        self.calls = 0

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        self.calls += 1
        return True


@pytest.mark.parametrize("quantum", [0.0, 0.002])
def test_no_leaks_in_catchups(quantum: float) -> None:
    """Thousands of late steps through every C case (several tokens, the cap and the
    ready list, new buckets from _enter's twin, jobs finishing in a catch-up), batch
    after batch of jobs: the references of the objects involved and the traced memory
    stay flat."""
    engine = make_engine(True, 0.02, quantum)
    sinks = [CountingSink() for _ in range(6)]
    output = ("x",) * 37
    histogram = engine.metrics.inter_token_latency
    watched = [*sinks, engine, output, READY, JobState.DECODING, histogram, engine._resumed, PURE_RUN]
    rng = random.Random(3)
    now = 0.0

    def run(batches: int) -> None:
        nonlocal now
        for _ in range(batches):
            for sink in sinks:
                engine.submit(Job([1], output, "stop", sink), now + rng.random() * 0.02)
            while (deadline := engine.next_deadline()) != float("inf"):
                now = max(now, deadline) + rng.choice([0.0, 0.05, 0.09, 0.4])
                engine.step(now)

    assert_flat(run, watched, warm_ups=(20, 20), measured=400)
    assert engine.statistics().finished == 440 * len(sinks)
    assert sum(sink.calls for sink in sinks) > 10_000
