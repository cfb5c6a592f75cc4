"""Random sequences of submit / cancel / step / pause / resume keep the engine consistent."""

from __future__ import annotations

import math
import random

import attrs
from hypothesis import given
from hypothesis import strategies as st

from llmsim.config import Config
from llmsim.engine import MAX_TOKENS_PER_STEP, Engine, Job, JobState, QueueFullError

CONFIG = Config(
    max_num_seqs=3,
    max_waiting_queue_length=4,
    max_num_batched_tokens=20,
    time_to_first_token=0.01,
    time_to_first_token_std_dev=0.003,
    inter_token_latency=0.005,
    inter_token_latency_std_dev=0.001,
    time_factor_under_load=2.0,
)


@attrs.define
class CheckingSink:
    """Asserts the sink contract on every call."""

    early: float = 0.0  # how early a token may go out: half the step grid's interval
    accept: bool = True
    ranges: list[tuple[int, int]] = attrs.Factory(list)
    last_now: float = -math.inf
    next_due: float = -math.inf  # the deadline of the next token, as of the last call

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        expected_start = self.ranges[-1][1] if self.ranges else 0
        assert start == expected_start and job.emitted == stop
        # Never early without a step quantum; with one, at most half an interval early.
        assert now >= self.next_due - self.early - 1e-9
        self.next_due = job.deadline
        assert stop - start <= MAX_TOKENS_PER_STEP
        assert stop > start or len(job.output) == 0
        assert now >= self.last_now and job.admitted_time is not None and now >= job.admitted_time
        assert (job.state is JobState.FINISHED) == (stop == len(job.output))
        self.ranges.append((start, stop))
        self.last_now = now
        return self.accept


@attrs.frozen
class Op:
    kind: str  # submit / cancel / step / block / resume
    number: int = 0  # submit: prompt tokens; cancel/block/resume: which job
    output: int = 0
    cached: int = 0
    dt: float = 0.0


operations = st.lists(
    st.one_of(
        st.builds(Op, st.just("submit"), st.integers(0, 60), st.integers(0, 40), st.integers(0, 30)),
        st.builds(Op, st.sampled_from(["cancel", "block", "resume"]), st.integers(0, 100)),
        st.builds(Op, st.just("step"), dt=st.floats(0.0, 0.03)),
    ),
    max_size=60,
)


def sink_of(job: Job) -> CheckingSink:
    assert isinstance(job.sink, CheckingSink)
    return job.sink


def _check_counts(engine: Engine, jobs: list[Job]) -> None:
    stats = engine.statistics()
    states = [job.state for job in jobs]
    limits = CONFIG.engine
    assert stats.running == sum(s in (JobState.PREFILL, JobState.DECODING) for s in states) <= limits.max_num_seqs
    assert stats.waiting == states.count(JobState.WAITING) <= limits.max_waiting_queue_length
    assert stats.finished == states.count(JobState.FINISHED)
    assert stats.cancelled == states.count(JobState.CANCELLED)
    assert stats.rejected == states.count(JobState.REJECTED)
    assert stats.submitted == len(jobs)
    assert stats.generated_tokens == sum(job.emitted for job in jobs)


@given(ops=operations, seed=st.integers(0, 1000), quantum=st.sampled_from([0.0, 0.002, 0.0035]))
def test_engine_stays_consistent(ops: list[Op], seed: int, quantum: float) -> None:
    engine = Engine(CONFIG.engine, CONFIG.latency, rng=random.Random(seed))
    engine.set_step_quantum(quantum)
    jobs: list[Job] = []
    emitted_at_cancel: dict[int, int] = {}
    now = 0.0
    for op in ops:
        if op.kind == "submit":
            sink = CheckingSink(early=engine.step_quantum / 2)
            job = Job(list(range(op.number)), ("x",) * op.output, "stop", sink, cached_tokens=op.cached)
            jobs.append(job)
            try:
                engine.submit(job, now)
            except QueueFullError:
                assert job.state is JobState.REJECTED
        elif op.kind == "step":
            now += op.dt
            engine.step(now)
        elif jobs:
            job = jobs[op.number % len(jobs)]
            sink = sink_of(job)
            if op.kind == "cancel":
                engine.cancel(job, now)
                emitted_at_cancel.setdefault(id(job), len(sink.ranges))
            elif op.kind == "block":
                sink.accept = False
            else:
                sink.accept = True
                engine.resume(job, now)
        _check_counts(engine, jobs)

    for job in jobs:  # unblock everyone and drain
        sink_of(job).accept = True
        engine.resume(job, now)
    while (deadline := engine.next_deadline()) != math.inf:
        now = max(now, deadline)
        engine.step(now)
    _check_counts(engine, jobs)
    assert engine.statistics().running == engine.statistics().waiting == 0
    for job in jobs:
        assert job.state in (JobState.FINISHED, JobState.CANCELLED, JobState.REJECTED)
        if job.state is JobState.FINISHED:
            assert job.emitted == len(job.output)
        if id(job) in emitted_at_cancel:  # no output after a cancel
            assert len(sink_of(job).ranges) == emitted_at_cancel[id(job)]
