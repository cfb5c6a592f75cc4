"""A job's life in the engine: cancellation, catching up, backpressure, wakeups, statistics.

Driven with a fake clock: every ``now`` is a plain number.
"""

from __future__ import annotations

import math

import attrs
import pytest

from llmsim.app import build_engine
from llmsim.config import Config
from llmsim.engine import MAX_TOKENS_PER_STEP, Job, JobState, QueueFullError
from llmsim.engine.testing import SinkCall, planned_job, recording_sink, run_until_idle
from llmsim.options import EngineOptions, LatencyOptions

CHUNKED = Config(max_num_batched_tokens=100, max_num_seqs=100, inter_token_latency=0.01)


# --- cancellation ------------------------------------------------------------------------------


def test_cancel_frees_the_slot_at_once_and_admits_the_next_job() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.01, max_num_seqs=1))
    running, waiting = planned_job(output=10), planned_job(output=2)
    engine.submit(running, 0.0)
    engine.submit(waiting, 0.0)
    engine.step(0.1)
    assert len(recording_sink(running).calls) == 1

    engine.cancel(running, 0.105)

    assert running.state is JobState.CANCELLED and running.finish_time == 0.105
    assert waiting.state is JobState.PREFILL and waiting.admitted_time == 0.105
    stats = engine.statistics()
    assert (stats.running, stats.waiting, stats.cancelled) == (1, 0, 1)
    run_until_idle(engine)
    assert len(recording_sink(running).calls) == 1
    assert waiting.first_token_time == pytest.approx(0.205)

    stats = engine.statistics()
    assert (stats.running, stats.finished, stats.cancelled) == (0, 1, 1)
    engine.cancel(running, 0.3)
    engine.cancel(waiting, 0.3)  # finished: nothing to do
    assert engine.statistics() == stats


def test_cancelled_waiting_job_is_skipped() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, max_num_seqs=1))
    running, cancelled, next_job = planned_job(output=1), planned_job(output=1), planned_job(output=1)
    for job in (running, cancelled, next_job):
        engine.submit(job, 0.0)
    engine.cancel(cancelled, 0.01)
    assert engine.statistics().waiting == 1
    run_until_idle(engine)
    assert recording_sink(cancelled).calls == []
    assert next_job.first_token_time == pytest.approx(0.2)


def test_cancel_during_chunked_prefill_forgets_the_prompt() -> None:
    engine = build_engine(CHUNKED)
    job = planned_job(prompt=1000, output=1)
    engine.submit(job, 0.0)
    engine.cancel(job, 0.005)
    assert engine.next_deadline() == math.inf
    assert engine.statistics().running == 0


def test_cancel_before_submit_makes_the_job_unsubmittable() -> None:
    engine = build_engine(Config())
    job = planned_job()
    engine.cancel(job, 0.0)
    assert job.state is JobState.CANCELLED
    with pytest.raises(ValueError):
        engine.submit(job, 0.0)
    assert engine.statistics().cancelled == 0


def test_many_cancelled_waiting_jobs_do_not_pile_up() -> None:
    engine = build_engine(Config(max_num_seqs=1, max_waiting_queue_length=100_000))
    engine.submit(planned_job(), 0.0)
    for _ in range(10_000):
        job = planned_job()
        engine.submit(job, 0.0)
        engine.cancel(job, 0.0)
    assert len(engine._waiting) < 200
    assert engine.statistics().waiting == 0


def test_a_sink_may_cancel_its_own_job() -> None:
    engine = build_engine(Config(inter_token_latency=0.01))

    @attrs.define
    class HangUp:
        calls: int = 0

        def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
            self.calls += 1
            engine.cancel(job, now)
            return True

    sink = HangUp()
    job = planned_job(output=5, sink=sink)
    engine.submit(job, 0.0)
    run_until_idle(engine)
    assert sink.calls == 1 and job.state is JobState.CANCELLED
    assert engine.statistics().running == 0


# --- catching up -------------------------------------------------------------------------------


def test_a_late_step_emits_every_due_token_without_drifting() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.01))
    job = planned_job(output=15)
    engine.submit(job, 0.0)
    engine.step(0.205)  # tokens due at 0.10, 0.11, ..., 0.20
    assert [(c.start, c.stop, c.now) for c in recording_sink(job).calls] == [(0, 11, 0.205)]
    assert engine.next_deadline() == pytest.approx(0.21)  # from the deadline, not from 0.205
    run_until_idle(engine)
    assert recording_sink(job).times[1:] == pytest.approx([0.21, 0.22, 0.23, 0.24])
    stats = engine.statistics()
    # The late step's earliest due event was the prefill period ending at 0.01.
    assert stats.late_steps == 1 and stats.max_lateness == pytest.approx(0.195)


def test_catch_up_is_capped_per_step_and_loses_nothing() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.001))
    job = planned_job(output=40)
    engine.submit(job, 0.0)
    engine.step(1.0)
    assert [(c.start, c.stop) for c in recording_sink(job).calls] == [(0, MAX_TOKENS_PER_STEP)]
    assert engine.next_deadline() <= 1.0  # the rest is due at once
    engine.step(1.0)
    engine.step(1.0)
    assert [(c.start, c.stop) for c in recording_sink(job).calls] == [(0, 16), (16, 32), (32, 40)]
    assert job.state is JobState.FINISHED and engine.next_deadline() == math.inf


def test_zero_latency_jobs_take_turns() -> None:
    engine = build_engine(Config())
    jobs = [planned_job(output=40) for _ in range(3)]
    for job in jobs:
        engine.submit(job, 0.0)
    engine.step(0.0)
    assert [job.emitted for job in jobs] == [16, 16, 16]
    run_until_idle(engine)
    assert all(job.state is JobState.FINISHED for job in jobs)


# --- backpressure ------------------------------------------------------------------------------


def test_paused_job_gets_no_tokens_until_resumed() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.01))
    job = planned_job(output=4)
    recording_sink(job).accept = False
    engine.submit(job, 0.0)
    engine.step(0.1)
    assert job.paused and engine.next_deadline() == math.inf
    assert engine.statistics().running == 1

    recording_sink(job).accept = True
    engine.resume(job, 0.5)
    assert not job.paused
    run_until_idle(engine)
    assert recording_sink(job).times == pytest.approx([0.1, 0.5, 0.51, 0.52])


def test_resume_before_the_deadline_keeps_the_deadline() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.05))
    job = planned_job(output=2)
    recording_sink(job).accept = False
    engine.submit(job, 0.0)
    engine.step(0.1)
    engine.resume(job, 0.12)
    run_until_idle(engine)
    assert recording_sink(job).times == pytest.approx([0.1, 0.15])


def test_resume_from_inside_the_sink_call_cancels_the_pause() -> None:
    engine = build_engine(Config(inter_token_latency=0.01))

    @attrs.define
    class DrainsAtOnce:
        calls: int = 0

        def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
            self.calls += 1
            engine.resume(job, now)  # what an on_drained callback firing at once does
            return False

    sink = DrainsAtOnce()
    job = planned_job(output=3, sink=sink)
    engine.submit(job, 0.0)
    run_until_idle(engine)
    assert sink.calls == 3 and job.state is JobState.FINISHED


def test_resume_of_a_running_job_is_a_no_op() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.01))
    job = planned_job(output=3)
    engine.submit(job, 0.0)
    engine.step(0.1)
    engine.resume(job, 0.5)
    assert engine.next_deadline() == pytest.approx(0.11)


# --- empty plans, sinks, wakeups, statistics -------------------------------------------------


def test_an_empty_plan_gets_one_finishing_call_at_its_first_token_time() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, max_num_seqs=1))
    empty, after = planned_job(output=0), planned_job(output=1)
    engine.submit(empty, 0.0)
    engine.submit(after, 0.0)
    run_until_idle(engine)
    assert recording_sink(empty).calls == [SinkCall(0, 0, 0.1, JobState.FINISHED, 0)]
    assert after.admitted_time == pytest.approx(0.1)
    stats = engine.statistics()
    assert (stats.finished, stats.generated_tokens) == (2, 1)


def test_a_failing_sink_does_not_lose_other_due_jobs() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.01))

    class Broken:
        def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
            raise RuntimeError("renderer bug")

    broken = planned_job(output=3, sink=Broken())
    healthy = planned_job(output=3)
    engine.submit(broken, 0.0)
    engine.submit(healthy, 0.0)
    with pytest.raises(RuntimeError, match="renderer bug"):
        engine.step(0.1)
    engine.step(0.1)
    assert recording_sink(healthy).times == pytest.approx([0.1])
    assert engine.next_deadline() == pytest.approx(0.11)


def test_wakeup_fires_when_a_submit_makes_the_next_deadline_earlier() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, max_num_seqs=2))
    wakeups: list[float] = []
    engine.set_wakeup(lambda: wakeups.append(engine.next_deadline()))
    engine.submit(planned_job(), 0.0)
    assert wakeups == [pytest.approx(0.1)]
    engine.submit(planned_job(), 0.05)  # due at 0.15: later than 0.1
    engine.submit(planned_job(), 0.05)  # queued
    assert len(wakeups) == 1
    engine.reconfigure(EngineOptions(max_num_seqs=3), LatencyOptions(time_to_first_token=0.01))
    engine.submit(planned_job(), 0.05)  # the queued job is admitted now, due at 0.06
    assert wakeups[1:] == [pytest.approx(0.06)]


def test_wakeup_fires_when_cancel_admits_a_job_due_sooner() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, max_num_seqs=1))
    running, waiting = planned_job(), planned_job()
    engine.submit(running, 0.0)
    engine.reconfigure(EngineOptions(max_num_seqs=1), LatencyOptions(time_to_first_token=0.01))
    engine.submit(waiting, 0.0)
    wakeups: list[float] = []
    engine.set_wakeup(lambda: wakeups.append(engine.next_deadline()))
    engine.cancel(running, 0.05)
    assert wakeups == [pytest.approx(0.06)]


def test_wakeup_fires_on_resume() -> None:
    engine = build_engine(Config(inter_token_latency=0.01))
    job = planned_job()
    recording_sink(job).accept = False
    engine.submit(job, 0.0)
    run_until_idle(engine)
    wakeups: list[float] = []
    engine.set_wakeup(lambda: wakeups.append(engine.next_deadline()))
    engine.resume(job, 0.3)
    assert wakeups == [pytest.approx(0.3)]


def test_reconfigure_applies_to_later_decisions_only() -> None:
    engine = build_engine(Config(time_to_first_token=0.1))
    early = planned_job(output=1)
    engine.submit(early, 0.0)
    engine.reconfigure(EngineOptions(), LatencyOptions(time_to_first_token=0.3))
    late = planned_job(output=1)
    engine.submit(late, 0.0)
    run_until_idle(engine)
    assert (early.first_token_time, late.first_token_time) == pytest.approx((0.1, 0.3))


def test_statistics_count_every_outcome() -> None:
    engine = build_engine(
        Config(time_to_first_token=0.1, inter_token_latency=0.01, max_num_seqs=2, max_waiting_queue_length=1)
    )
    jobs = [planned_job(prompt=7, output=3) for _ in range(4)]
    for job in jobs[:3]:
        engine.submit(job, 0.0)
    with pytest.raises(QueueFullError):
        engine.submit(jobs[3], 0.0)
    engine.cancel(jobs[1], 0.05)
    run_until_idle(engine)
    stats = engine.statistics()
    assert stats.submitted == 4 == stats.finished + stats.cancelled + stats.rejected + stats.running + stats.waiting
    assert (stats.finished, stats.cancelled, stats.rejected) == (2, 1, 1)
    assert (stats.generated_tokens, stats.prompt_tokens) == (6, 14)
    assert stats.steps > 0 and stats.late_steps == 0 and stats.max_lateness == pytest.approx(0.0, abs=1e-12)
