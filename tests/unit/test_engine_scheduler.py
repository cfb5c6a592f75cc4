"""The engine's scheduler, driven with a fake clock (plain ``now`` values)."""

from __future__ import annotations

import math
import random

import attrs
import pytest

from llmsim.config import Config
from llmsim.engine import (
    MAX_TOKENS_PER_STEP,
    QUEUE_FULL_MESSAGE,
    Engine,
    Job,
    JobState,
    QueueFullError,
)


@attrs.frozen
class Call:
    start: int
    stop: int
    now: float
    state: JobState
    emitted: int


@attrs.define
class RecordingSink:
    """Records every on_output call; answers ``accept`` (or what ``answers`` pops)."""

    calls: list[Call] = attrs.Factory(list)
    accept: bool = True

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        self.calls.append(Call(start, stop, now, job.state, job.emitted))
        return self.accept

    @property
    def times(self) -> list[float]:
        return [call.now for call in self.calls]


def make_job(*, prompt: int = 10, output: int = 5, sink: RecordingSink | None = None, **fields: object) -> Job:
    return Job(
        prompt_token_ids=list(range(prompt)),
        output=tuple(f"w{i} " for i in range(output)),
        finish_reason="stop",
        sink=sink if sink is not None else RecordingSink(),
        **fields,  # type: ignore[arg-type]
    )


def sink_of(job: Job) -> RecordingSink:
    assert isinstance(job.sink, RecordingSink)
    return job.sink


def run_until_idle(engine: Engine, *, max_steps: int = 100_000) -> None:
    """Step at each deadline exactly, as a perfectly punctual driver would."""
    for _ in range(max_steps):
        deadline = engine.next_deadline()
        if deadline == math.inf:
            return
        engine.step(deadline)
    raise AssertionError("engine never went idle")


# --- TTFT and ITL --------------------------------------------------------------------------


def test_constant_ttft_then_one_token_per_itl() -> None:
    engine = Engine(Config(time_to_first_token=0.1, inter_token_latency=0.02))
    job = make_job(output=5)
    engine.submit(job, 0.005)
    run_until_idle(engine)

    assert sink_of(job).times == pytest.approx([0.105, 0.125, 0.145, 0.165, 0.185])
    assert [(c.start, c.stop) for c in sink_of(job).calls] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert [c.emitted for c in sink_of(job).calls] == [1, 2, 3, 4, 5]
    assert [c.state for c in sink_of(job).calls] == [JobState.DECODING] * 4 + [JobState.FINISHED]
    assert job.arrival_time == job.admitted_time == 0.005
    assert job.first_token_time == pytest.approx(0.105)
    assert job.finish_time == pytest.approx(0.185)
    assert job.prefilled_tokens == job.prompt_tokens


@pytest.mark.parametrize("calculator", ["per-token", ""])
def test_per_token_ttft_skips_cached_tokens(calculator: str) -> None:
    config = Config(latency_calculator=calculator, prefill_overhead=0.01, prefill_time_per_token=0.001)
    engine = Engine(config)
    job = make_job(prompt=100, output=1, cached_tokens=40)
    engine.submit(job, 1.0)
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(1.0 + 0.01 + 60 * 0.001)


def test_constant_calculator_ignores_prompt_length() -> None:
    config = Config(latency_calculator="constant", time_to_first_token=0.05, prefill_time_per_token=1.0)
    engine = Engine(config)
    job = make_job(prompt=500, output=1)
    engine.submit(job, 0.0)
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("knobs", "expected"),
    [
        ({"kv_cache_transfer_latency": 0.05}, 0.05),
        ({"kv_cache_transfer_time_per_token": 0.001}, 0.03),
    ],
)
def test_remote_prefill_ttft_is_the_kv_transfer_and_not_scaled_by_load(knobs: dict[str, float], expected: float) -> None:
    config = Config(time_to_first_token=1.0, max_num_seqs=2, time_factor_under_load=4.0, **knobs)  # type: ignore[arg-type]
    engine = Engine(config)
    engine.submit(make_job(output=100), 0.0)  # a second running job: load factor 4
    job = make_job(prompt=30, output=1, remote_prefill=True)
    engine.submit(job, 0.0)
    engine.step(expected)
    assert job.first_token_time == pytest.approx(expected)


def test_load_factor_scales_ttft_and_itl() -> None:
    config = Config(time_to_first_token=0.1, inter_token_latency=0.01, max_num_seqs=5, time_factor_under_load=3.0)
    engine = Engine(config)
    jobs = [make_job(output=2) for _ in range(5)]
    for job in jobs:
        engine.submit(job, 0.0)
    run_until_idle(engine)
    # The k-th admitted job sees k running: factor 1 + 2 * (k - 1) / 4.
    assert [job.first_token_time for job in jobs] == pytest.approx([0.1, 0.15, 0.2, 0.25, 0.3])
    # The first job's second token is paced while all five run: ITL 0.01 * 3.
    assert sink_of(jobs[0]).times == pytest.approx([0.1, 0.13])
    # The last one's second token comes when it alone is left: ITL 0.01 * 1.
    assert sink_of(jobs[4]).times == pytest.approx([0.3, 0.31])


def test_single_job_runs_at_factor_one() -> None:
    config = Config(time_to_first_token=0.1, inter_token_latency=0.01, max_num_seqs=5, time_factor_under_load=3.0)
    engine = Engine(config)
    job = make_job(output=3)
    engine.submit(job, 0.0)
    run_until_idle(engine)
    assert sink_of(job).times == pytest.approx([0.1, 0.11, 0.12])


def test_jittered_latencies_stay_in_bounds_and_repeat_with_the_seed() -> None:
    config = Config(
        time_to_first_token=0.1,
        time_to_first_token_std_dev=0.03,
        inter_token_latency=0.01,
        inter_token_latency_std_dev=0.003,
        max_num_seqs=1000,
    )

    def run(seed: int) -> list[list[float]]:
        engine = Engine(config, rng=random.Random(seed))
        jobs = [make_job(output=20) for _ in range(50)]
        for job in jobs:
            engine.submit(job, 0.0)
        run_until_idle(engine)
        return [sink_of(job).times for job in jobs]

    first = run(7)
    assert first == run(7)
    assert first != run(8)
    ttfts = [times[0] for times in first]
    gaps = [b - a for times in first for a, b in zip(times, times[1:])]
    assert all(0.03 - 1e-12 <= ttft <= 0.17 + 1e-12 for ttft in ttfts)
    assert all(0.003 - 1e-12 <= gap <= 0.017 + 1e-12 for gap in gaps)
    assert len(set(ttfts)) > 40 and len({round(gap, 9) for gap in gaps}) > 100


def test_seed_from_config_makes_runs_reproducible() -> None:
    config = Config(time_to_first_token=0.1, time_to_first_token_std_dev=0.03, seed=42)

    def ttft() -> float | None:
        engine = Engine(config)
        job = make_job(output=1)
        engine.submit(job, 0.0)
        run_until_idle(engine)
        return job.first_token_time

    assert ttft() == ttft()


# --- queueing and admission ------------------------------------------------------------------


def test_waiting_jobs_are_admitted_in_fifo_order_when_a_slot_frees() -> None:
    engine = Engine(Config(time_to_first_token=0.1, inter_token_latency=0.01, max_num_seqs=1))
    first, second, third = (make_job(output=3) for _ in range(3))
    engine.submit(first, 0.0)
    engine.submit(second, 0.001)
    engine.submit(third, 0.002)
    assert (first.state, second.state, third.state) == (JobState.PREFILL, JobState.WAITING, JobState.WAITING)
    assert engine.statistics().waiting == 2

    run_until_idle(engine)
    assert first.finish_time == pytest.approx(0.12)
    assert second.admitted_time == pytest.approx(0.12)  # in the step the slot freed
    assert second.first_token_time == pytest.approx(0.22)
    assert third.admitted_time == pytest.approx(second.finish_time)
    assert third.first_token_time == pytest.approx(0.34)


def test_a_late_step_admits_at_the_time_the_slot_freed() -> None:
    engine = Engine(Config(time_to_first_token=0.1, max_num_seqs=1))
    first, second = make_job(output=1), make_job(output=1)
    engine.submit(first, 0.0)
    engine.submit(second, 0.0)
    engine.step(0.15)  # first's only token was due at 0.1
    assert second.admitted_time == pytest.approx(0.1)
    assert engine.next_deadline() == pytest.approx(0.2)


def test_full_queue_rejects_and_changes_nothing_else() -> None:
    engine = Engine(Config(time_to_first_token=0.1, max_num_seqs=1, max_waiting_queue_length=1))
    running, waiting, refused = make_job(), make_job(), make_job()
    engine.submit(running, 0.0)
    engine.submit(waiting, 0.0)
    before = (engine.statistics(), engine.next_deadline())

    with pytest.raises(QueueFullError, match=QUEUE_FULL_MESSAGE):
        engine.submit(refused, 0.01)

    assert refused.state is JobState.REJECTED
    after = engine.statistics()
    assert attrs.evolve(after, rejected=0, submitted=after.submitted - 1) == before[0]
    assert (after.rejected, after.submitted) == (1, 3)
    assert engine.next_deadline() == before[1]
    run_until_idle(engine)
    assert sink_of(refused).calls == []
    assert waiting.state is JobState.FINISHED


def test_zero_length_queue_rejects_as_soon_as_the_slots_are_busy() -> None:
    engine = Engine(Config(max_num_seqs=1, max_waiting_queue_length=0))
    engine.submit(make_job(), 0.0)
    with pytest.raises(QueueFullError):
        engine.submit(make_job(), 0.0)


def test_a_job_cannot_be_submitted_twice() -> None:
    engine = Engine(Config())
    job = make_job()
    engine.submit(job, 0.0)
    with pytest.raises(ValueError, match="already submitted"):
        engine.submit(job, 0.0)


# --- chunked prefill -------------------------------------------------------------------------

CHUNKED = Config(max_num_batched_tokens=100, inter_token_latency=0.01)


def test_long_prompt_prefills_over_several_periods() -> None:
    engine = Engine(CHUNKED)
    job = make_job(prompt=250, output=1)
    engine.submit(job, 0.003)
    assert engine.next_deadline() == pytest.approx(0.01)
    engine.step(0.01)
    assert job.prefilled_tokens == 100
    engine.step(0.02)
    assert job.prefilled_tokens == 200
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(0.03)


def test_cached_tokens_are_not_prefilled_again() -> None:
    engine = Engine(CHUNKED)
    job = make_job(prompt=250, output=1, cached_tokens=150)
    engine.submit(job, 0.003)
    assert job.prefilled_tokens == 150
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(0.01)


def test_prefill_budget_is_shared_in_fifo_order() -> None:
    engine = Engine(CHUNKED)
    first, second = make_job(prompt=150, output=1), make_job(prompt=150, output=1)
    engine.submit(first, 0.0)
    engine.submit(second, 0.0)
    engine.step(0.01)
    assert (first.prefilled_tokens, second.prefilled_tokens) == (100, 0)
    engine.step(0.02)
    assert (first.prefilled_tokens, second.prefilled_tokens) == (150, 50)
    run_until_idle(engine)
    assert first.first_token_time == pytest.approx(0.02)
    assert second.first_token_time == pytest.approx(0.03)


def test_decoding_jobs_take_one_token_of_each_period() -> None:
    engine = Engine(CHUNKED)
    decoder = make_job(prompt=1, output=100)
    engine.submit(decoder, 0.0)
    engine.step(0.01)  # its prompt is prefilled at the period end, and its first token is due
    assert decoder.state is JobState.DECODING
    prompt = make_job(prompt=198, output=1)
    engine.submit(prompt, 0.01)
    engine.step(0.02)
    assert prompt.prefilled_tokens == 99
    run_until_idle(engine)
    assert prompt.first_token_time == pytest.approx(0.03)


def test_chunking_never_brings_the_first_token_before_ttft() -> None:
    engine = Engine(attrs.evolve(CHUNKED, time_to_first_token=0.05))
    job = make_job(prompt=10, output=1)
    engine.submit(job, 0.0)
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(0.05)


def test_without_inter_token_latency_prefill_is_bounded_by_ttft_only() -> None:
    engine = Engine(Config(max_num_batched_tokens=100, time_to_first_token=0.05))
    job = make_job(prompt=100_000, output=1)
    engine.submit(job, 0.0)
    assert engine.next_deadline() == pytest.approx(0.05)
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(0.05)


# --- cancellation ------------------------------------------------------------------------------


def test_cancel_frees_the_slot_at_once_and_admits_the_next_job() -> None:
    engine = Engine(Config(time_to_first_token=0.1, inter_token_latency=0.01, max_num_seqs=1))
    running, waiting = make_job(output=10), make_job(output=2)
    engine.submit(running, 0.0)
    engine.submit(waiting, 0.0)
    engine.step(0.1)
    assert len(sink_of(running).calls) == 1

    engine.cancel(running, 0.105)

    assert running.state is JobState.CANCELLED and running.finish_time == 0.105
    assert waiting.state is JobState.PREFILL and waiting.admitted_time == 0.105
    stats = engine.statistics()
    assert (stats.running, stats.waiting, stats.cancelled) == (1, 0, 1)
    run_until_idle(engine)
    assert len(sink_of(running).calls) == 1
    assert waiting.first_token_time == pytest.approx(0.205)

    stats = engine.statistics()
    assert (stats.running, stats.finished, stats.cancelled) == (0, 1, 1)
    engine.cancel(running, 0.3)
    engine.cancel(waiting, 0.3)  # finished: nothing to do
    assert engine.statistics() == stats


def test_cancelled_waiting_job_is_skipped() -> None:
    engine = Engine(Config(time_to_first_token=0.1, max_num_seqs=1))
    running, cancelled, next_job = make_job(output=1), make_job(output=1), make_job(output=1)
    for job in (running, cancelled, next_job):
        engine.submit(job, 0.0)
    engine.cancel(cancelled, 0.01)
    assert engine.statistics().waiting == 1
    run_until_idle(engine)
    assert sink_of(cancelled).calls == []
    assert next_job.first_token_time == pytest.approx(0.2)


def test_cancel_during_chunked_prefill_forgets_the_prompt() -> None:
    engine = Engine(CHUNKED)
    job = make_job(prompt=1000, output=1)
    engine.submit(job, 0.0)
    engine.cancel(job, 0.005)
    assert engine.next_deadline() == math.inf
    assert engine.statistics().running == 0


def test_cancel_before_submit_makes_the_job_unsubmittable() -> None:
    engine = Engine(Config())
    job = make_job()
    engine.cancel(job, 0.0)
    assert job.state is JobState.CANCELLED
    with pytest.raises(ValueError):
        engine.submit(job, 0.0)
    assert engine.statistics().cancelled == 0


def test_many_cancelled_waiting_jobs_do_not_pile_up() -> None:
    engine = Engine(Config(max_num_seqs=1, max_waiting_queue_length=100_000))
    engine.submit(make_job(), 0.0)
    for _ in range(10_000):
        job = make_job()
        engine.submit(job, 0.0)
        engine.cancel(job, 0.0)
    assert len(engine._waiting) < 200
    assert engine.statistics().waiting == 0


def test_a_sink_may_cancel_its_own_job() -> None:
    engine = Engine(Config(inter_token_latency=0.01))

    @attrs.define
    class HangUp:
        calls: int = 0

        def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
            self.calls += 1
            engine.cancel(job, now)
            return True

    sink = HangUp()
    job = make_job(output=5, sink=sink)  # type: ignore[arg-type]
    engine.submit(job, 0.0)
    run_until_idle(engine)
    assert sink.calls == 1 and job.state is JobState.CANCELLED
    assert engine.statistics().running == 0


# --- catching up -------------------------------------------------------------------------------


def test_a_late_step_emits_every_due_token_without_drifting() -> None:
    engine = Engine(Config(time_to_first_token=0.1, inter_token_latency=0.01))
    job = make_job(output=15)
    engine.submit(job, 0.0)
    engine.step(0.205)  # tokens due at 0.10, 0.11, ..., 0.20
    assert [(c.start, c.stop, c.now) for c in sink_of(job).calls] == [(0, 11, 0.205)]
    assert engine.next_deadline() == pytest.approx(0.21)  # from the deadline, not from 0.205
    run_until_idle(engine)
    assert sink_of(job).times[1:] == pytest.approx([0.21, 0.22, 0.23, 0.24])
    stats = engine.statistics()
    # The late step's earliest due event was the prefill period ending at 0.01.
    assert stats.late_steps == 1 and stats.max_lateness == pytest.approx(0.195)


def test_catch_up_is_capped_per_step_and_loses_nothing() -> None:
    engine = Engine(Config(time_to_first_token=0.1, inter_token_latency=0.001))
    job = make_job(output=40)
    engine.submit(job, 0.0)
    engine.step(1.0)
    assert [(c.start, c.stop) for c in sink_of(job).calls] == [(0, MAX_TOKENS_PER_STEP)]
    assert engine.next_deadline() <= 1.0  # the rest is due at once
    engine.step(1.0)
    engine.step(1.0)
    assert [(c.start, c.stop) for c in sink_of(job).calls] == [(0, 16), (16, 32), (32, 40)]
    assert job.state is JobState.FINISHED and engine.next_deadline() == math.inf


def test_zero_latency_jobs_take_turns() -> None:
    engine = Engine(Config())
    jobs = [make_job(output=40) for _ in range(3)]
    for job in jobs:
        engine.submit(job, 0.0)
    engine.step(0.0)
    assert [job.emitted for job in jobs] == [16, 16, 16]
    run_until_idle(engine)
    assert all(job.state is JobState.FINISHED for job in jobs)


# --- backpressure ------------------------------------------------------------------------------


def test_paused_job_gets_no_tokens_until_resumed() -> None:
    engine = Engine(Config(time_to_first_token=0.1, inter_token_latency=0.01))
    job = make_job(output=4)
    sink_of(job).accept = False
    engine.submit(job, 0.0)
    engine.step(0.1)
    assert job.paused and engine.next_deadline() == math.inf
    assert engine.statistics().running == 1

    sink_of(job).accept = True
    engine.resume(job, 0.5)
    assert not job.paused
    run_until_idle(engine)
    assert sink_of(job).times == pytest.approx([0.1, 0.5, 0.51, 0.52])


def test_resume_before_the_deadline_keeps_the_deadline() -> None:
    engine = Engine(Config(time_to_first_token=0.1, inter_token_latency=0.05))
    job = make_job(output=2)
    sink_of(job).accept = False
    engine.submit(job, 0.0)
    engine.step(0.1)
    engine.resume(job, 0.12)
    run_until_idle(engine)
    assert sink_of(job).times == pytest.approx([0.1, 0.15])


def test_resume_from_inside_the_sink_call_cancels_the_pause() -> None:
    engine = Engine(Config(inter_token_latency=0.01))

    @attrs.define
    class DrainsAtOnce:
        calls: int = 0

        def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
            self.calls += 1
            engine.resume(job, now)  # what an on_drained callback firing at once does
            return False

    sink = DrainsAtOnce()
    job = make_job(output=3, sink=sink)  # type: ignore[arg-type]
    engine.submit(job, 0.0)
    run_until_idle(engine)
    assert sink.calls == 3 and job.state is JobState.FINISHED


def test_resume_of_a_running_job_is_a_no_op() -> None:
    engine = Engine(Config(time_to_first_token=0.1, inter_token_latency=0.01))
    job = make_job(output=3)
    engine.submit(job, 0.0)
    engine.step(0.1)
    engine.resume(job, 0.5)
    assert engine.next_deadline() == pytest.approx(0.11)


# --- empty plans, sinks, wakeups, statistics -------------------------------------------------


def test_an_empty_plan_gets_one_finishing_call_at_its_first_token_time() -> None:
    engine = Engine(Config(time_to_first_token=0.1, max_num_seqs=1))
    empty, after = make_job(output=0), make_job(output=1)
    engine.submit(empty, 0.0)
    engine.submit(after, 0.0)
    run_until_idle(engine)
    assert sink_of(empty).calls == [Call(0, 0, 0.1, JobState.FINISHED, 0)]
    assert after.admitted_time == pytest.approx(0.1)
    stats = engine.statistics()
    assert (stats.finished, stats.generated_tokens) == (2, 1)


def test_a_failing_sink_does_not_lose_other_due_jobs() -> None:
    engine = Engine(Config(time_to_first_token=0.1, inter_token_latency=0.01))

    class Broken:
        def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
            raise RuntimeError("renderer bug")

    broken = make_job(output=3, sink=Broken())  # type: ignore[arg-type]
    healthy = make_job(output=3)
    engine.submit(broken, 0.0)
    engine.submit(healthy, 0.0)
    with pytest.raises(RuntimeError, match="renderer bug"):
        engine.step(0.1)
    engine.step(0.1)
    assert sink_of(healthy).times == pytest.approx([0.1])
    assert engine.next_deadline() == pytest.approx(0.11)


def test_wakeup_fires_when_a_submit_makes_the_next_deadline_earlier() -> None:
    engine = Engine(Config(time_to_first_token=0.1, max_num_seqs=2))
    wakeups: list[float] = []
    engine.set_wakeup(lambda: wakeups.append(engine.next_deadline()))
    engine.submit(make_job(), 0.0)
    assert wakeups == [pytest.approx(0.1)]
    engine.submit(make_job(), 0.05)  # due at 0.15: later than 0.1
    engine.submit(make_job(), 0.05)  # queued
    assert len(wakeups) == 1
    engine.reconfigure(Config(time_to_first_token=0.01, max_num_seqs=3))
    engine.submit(make_job(), 0.05)  # the queued job is admitted now, due at 0.06
    assert wakeups[1:] == [pytest.approx(0.06)]


def test_wakeup_fires_when_cancel_admits_a_job_due_sooner() -> None:
    engine = Engine(Config(time_to_first_token=0.1, max_num_seqs=1))
    running, waiting = make_job(), make_job()
    engine.submit(running, 0.0)
    engine.reconfigure(Config(time_to_first_token=0.01, max_num_seqs=1))
    engine.submit(waiting, 0.0)
    wakeups: list[float] = []
    engine.set_wakeup(lambda: wakeups.append(engine.next_deadline()))
    engine.cancel(running, 0.05)
    assert wakeups == [pytest.approx(0.06)]


def test_wakeup_fires_on_resume() -> None:
    engine = Engine(Config(inter_token_latency=0.01))
    job = make_job()
    sink_of(job).accept = False
    engine.submit(job, 0.0)
    run_until_idle(engine)
    wakeups: list[float] = []
    engine.set_wakeup(lambda: wakeups.append(engine.next_deadline()))
    engine.resume(job, 0.3)
    assert wakeups == [pytest.approx(0.3)]


def test_reconfigure_applies_to_later_decisions_only() -> None:
    engine = Engine(Config(time_to_first_token=0.1))
    early = make_job(output=1)
    engine.submit(early, 0.0)
    engine.reconfigure(Config(time_to_first_token=0.3))
    late = make_job(output=1)
    engine.submit(late, 0.0)
    run_until_idle(engine)
    assert (early.first_token_time, late.first_token_time) == pytest.approx((0.1, 0.3))


def test_statistics_count_every_outcome() -> None:
    engine = Engine(Config(time_to_first_token=0.1, inter_token_latency=0.01, max_num_seqs=2, max_waiting_queue_length=1))
    jobs = [make_job(prompt=7, output=3) for _ in range(4)]
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
