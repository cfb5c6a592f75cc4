"""The engine's timing: TTFT and ITL, load, jitter, queueing, chunked prefill.

Driven with a fake clock: every ``now`` is a plain number.
"""

from __future__ import annotations

import random
from itertools import pairwise

import attrs
import pytest

from llmsim.app import build_engine
from llmsim.config import Config
from llmsim.engine import Engine, JobState, QueueFullError, QueueLimit
from llmsim.engine.testing import planned_job, recording_sink, run_until_idle

# --- TTFT and ITL --------------------------------------------------------------------------


def test_constant_ttft_then_one_token_per_itl() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.02))
    job = planned_job(output=5)
    engine.submit(job, 0.005)
    run_until_idle(engine)

    assert recording_sink(job).times == pytest.approx([0.105, 0.125, 0.145, 0.165, 0.185])
    assert [(c.start, c.stop) for c in recording_sink(job).calls] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert [c.emitted for c in recording_sink(job).calls] == [1, 2, 3, 4, 5]
    assert [c.state for c in recording_sink(job).calls] == [JobState.DECODING] * 4 + [JobState.FINISHED]
    assert job.arrival_time == job.admitted_time == 0.005
    assert job.first_token_time == pytest.approx(0.105)
    assert job.finish_time == pytest.approx(0.185)
    assert job.prefilled_tokens == job.prompt_tokens


@pytest.mark.parametrize("ttft", [0.1, 0.0])
def test_a_job_that_arrived_before_the_last_step_counts_from_its_arrival(ttft: float) -> None:
    """The server submits with the time the request's first bytes came in, after reading,
    parsing and planning it: TTFT, queue time and e2e count from there, and a first
    token already due goes out at the next step."""
    engine = build_engine(Config(time_to_first_token=ttft, inter_token_latency=0.02))
    engine.step(0.05)  # the engine moved on while the request was being read
    job = planned_job(prompt=0, output=3)
    engine.submit(job, 0.0497)
    assert job.arrival_time == job.admitted_time == 0.0497
    assert engine.next_deadline() == pytest.approx(0.0497 + ttft)
    engine.step(0.0502)  # the driver's next step: the first token if it is due already
    run_until_idle(engine)
    first = max(0.0497 + ttft, 0.0502)
    assert recording_sink(job).times == pytest.approx([first, 0.0497 + ttft + 0.02, 0.0497 + ttft + 0.04])
    histograms = engine.metrics.snapshot().histograms
    assert histograms["time_to_first_token_seconds"].sum == pytest.approx(first - 0.0497)
    assert histograms["request_queue_time_seconds"].sum == 0.0
    assert histograms["e2e_request_latency_seconds"].sum == pytest.approx(ttft + 0.04)


def test_a_job_back_dated_before_the_last_step_is_not_a_late_step() -> None:
    """Reading and parsing the request is not the engine's lateness: a first token due
    before the last step, for a job submitted after it, counts from that step."""
    engine = build_engine(Config(time_to_first_token=0.0, inter_token_latency=0.02))
    engine.step(0.05)
    engine.submit(planned_job(prompt=0, output=1), 0.045)  # arrived 5 ms before that step
    engine.step(0.0502)
    assert engine.statistics().late_steps == 0
    assert engine.statistics().max_lateness == pytest.approx(0.0002)


@pytest.mark.parametrize("calculator", ["per-token", ""])
def test_per_token_ttft_skips_cached_tokens(calculator: str) -> None:
    config = Config(latency_calculator=calculator, prefill_overhead=0.01, prefill_time_per_token=0.001)
    engine = build_engine(config)
    job = planned_job(prompt=100, output=1, cached_tokens=40)
    engine.submit(job, 1.0)
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(1.0 + 0.01 + 60 * 0.001)


def test_constant_calculator_ignores_prompt_length() -> None:
    config = Config(latency_calculator="constant", time_to_first_token=0.05, prefill_time_per_token=1.0)
    engine = build_engine(config)
    job = planned_job(prompt=500, output=1)
    engine.submit(job, 0.0)
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (Config(kv_cache_transfer_latency=0.05), 0.05),
        (Config(kv_cache_transfer_time_per_token=0.001), 0.03),
    ],
)
def test_remote_prefill_ttft_is_the_kv_transfer_and_not_scaled_by_load(config: Config, expected: float) -> None:
    engine = build_engine(config.replace(time_to_first_token=1.0, max_num_seqs=2, time_factor_under_load=4.0))
    engine.submit(planned_job(output=100), 0.0)  # a second running job: load factor 4
    job = planned_job(prompt=30, output=1, remote_prefill=True)
    engine.submit(job, 0.0)
    engine.step(expected)
    assert job.first_token_time == pytest.approx(expected)


def test_load_factor_scales_ttft_and_itl() -> None:
    config = Config(time_to_first_token=0.1, inter_token_latency=0.01, max_num_seqs=5, time_factor_under_load=3.0)
    engine = build_engine(config)
    jobs = [planned_job(output=2) for _ in range(5)]
    for job in jobs:
        engine.submit(job, 0.0)
    run_until_idle(engine)
    # The k-th admitted job sees k running: factor 1 + 2 * (k - 1) / 4.
    assert [job.first_token_time for job in jobs] == pytest.approx([0.1, 0.15, 0.2, 0.25, 0.3])
    # The first job's second token is paced while all five run: ITL 0.01 * 3.
    assert recording_sink(jobs[0]).times == pytest.approx([0.1, 0.13])
    # The last one's second token comes when it alone is left: ITL 0.01 * 1.
    assert recording_sink(jobs[4]).times == pytest.approx([0.3, 0.31])


def test_single_job_runs_at_factor_one() -> None:
    config = Config(time_to_first_token=0.1, inter_token_latency=0.01, max_num_seqs=5, time_factor_under_load=3.0)
    engine = build_engine(config)
    job = planned_job(output=3)
    engine.submit(job, 0.0)
    run_until_idle(engine)
    assert recording_sink(job).times == pytest.approx([0.1, 0.11, 0.12])


def test_jittered_latencies_stay_in_bounds_and_repeat_with_the_seed() -> None:
    config = Config(
        time_to_first_token=0.1,
        time_to_first_token_std_dev=0.03,
        inter_token_latency=0.01,
        inter_token_latency_std_dev=0.003,
        max_num_seqs=1000,
    )

    def run(seed: int) -> list[list[float]]:
        engine = Engine(config.engine, config.latency, rng=random.Random(seed))
        jobs = [planned_job(output=20) for _ in range(50)]
        for job in jobs:
            engine.submit(job, 0.0)
        run_until_idle(engine)
        return [recording_sink(job).times for job in jobs]

    first = run(7)
    assert first == run(7)
    assert first != run(8)
    ttfts = [times[0] for times in first]
    gaps = [b - a for times in first for a, b in pairwise(times)]
    assert all(0.03 - 1e-12 <= ttft <= 0.17 + 1e-12 for ttft in ttfts)
    assert all(0.003 - 1e-12 <= gap <= 0.017 + 1e-12 for gap in gaps)
    assert len(set(ttfts)) > 40 and len({round(gap, 9) for gap in gaps}) > 100


def test_seed_from_config_makes_runs_reproducible() -> None:
    config = Config(time_to_first_token=0.1, time_to_first_token_std_dev=0.03, seed=42)

    def ttft() -> float | None:
        engine = build_engine(config)
        job = planned_job(output=1)
        engine.submit(job, 0.0)
        run_until_idle(engine)
        return job.first_token_time

    assert ttft() == ttft()


# --- queueing and admission ------------------------------------------------------------------


def test_waiting_jobs_are_admitted_in_fifo_order_when_a_slot_frees() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.01, max_num_seqs=1))
    first, second, third = (planned_job(output=3) for _ in range(3))
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
    engine = build_engine(Config(time_to_first_token=0.1, max_num_seqs=1))
    first, second = planned_job(output=1), planned_job(output=1)
    engine.submit(first, 0.0)
    engine.submit(second, 0.0)
    engine.step(0.15)  # first's only token was due at 0.1
    assert second.admitted_time == pytest.approx(0.1)
    assert engine.next_deadline() == pytest.approx(0.2)


def test_full_queue_rejects_and_changes_nothing_else() -> None:
    engine = build_engine(Config(time_to_first_token=0.1, max_num_seqs=1, max_waiting_queue_length=1))
    running, waiting, refused = planned_job(), planned_job(), planned_job()
    engine.submit(running, 0.0)
    engine.submit(waiting, 0.0)
    before = (engine.statistics(), engine.next_deadline())

    with pytest.raises(QueueFullError) as caught:
        engine.submit(refused, 0.01)

    assert caught.value.limit is QueueLimit.WAITING_QUEUE_LENGTH
    assert refused.state is JobState.REJECTED
    after = engine.statistics()
    assert attrs.evolve(after, rejected=0, submitted=after.submitted - 1) == before[0]
    assert (after.rejected, after.submitted) == (1, 3)
    assert engine.next_deadline() == before[1]
    run_until_idle(engine)
    assert recording_sink(refused).calls == []
    assert waiting.state is JobState.FINISHED


def test_admission_counts_running_and_waiting_jobs_against_max_num_queued_reqs() -> None:
    # vLLM's AsyncLLM.check_admission: refuse when in flight + n > max_num_queued_reqs
    # (vllm/v1/engine/async_llm.py:352-369); a request of n choices counts n.
    engine = build_engine(Config(time_to_first_token=0.1, max_num_seqs=1, max_num_queued_reqs=3))
    engine.check_admission(3)
    engine.submit(planned_job(), 0.0)  # running
    engine.submit(planned_job(), 0.0)  # waiting
    before = (engine.statistics(), engine.next_deadline())
    engine.check_admission(1)
    with pytest.raises(QueueFullError) as caught:
        engine.check_admission(2)
    assert caught.value.limit is QueueLimit.QUEUED_REQUESTS
    assert (engine.statistics(), engine.next_deadline()) == before  # nothing changed
    run_until_idle(engine)
    engine.check_admission(3)  # finished jobs are no longer in flight


def test_without_max_num_queued_reqs_admission_accepts_everything() -> None:
    engine = build_engine(Config(max_num_seqs=1, max_waiting_queue_length=0))
    engine.submit(planned_job(), 0.0)
    engine.check_admission(10**9)


def test_max_num_queued_reqs_zero_refuses_every_request() -> None:
    engine = build_engine(Config(max_num_queued_reqs=0))
    with pytest.raises(QueueFullError):
        engine.check_admission(1)


def test_zero_length_queue_rejects_as_soon_as_the_slots_are_busy() -> None:
    engine = build_engine(Config(max_num_seqs=1, max_waiting_queue_length=0))
    engine.submit(planned_job(), 0.0)
    with pytest.raises(QueueFullError):
        engine.submit(planned_job(), 0.0)


def test_a_job_cannot_be_submitted_twice() -> None:
    engine = build_engine(Config())
    job = planned_job()
    engine.submit(job, 0.0)
    with pytest.raises(ValueError, match="already submitted"):
        engine.submit(job, 0.0)


# --- chunked prefill -------------------------------------------------------------------------

CHUNKED = Config(max_num_batched_tokens=100, max_num_seqs=100, inter_token_latency=0.01)


def test_long_prompt_prefills_over_several_periods() -> None:
    engine = build_engine(CHUNKED)
    job = planned_job(prompt=250, output=1)
    engine.submit(job, 0.003)
    assert engine.next_deadline() == pytest.approx(0.01)
    engine.step(0.01)
    assert job.prefilled_tokens == 100
    engine.step(0.02)
    assert job.prefilled_tokens == 200
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(0.03)


def test_cached_tokens_are_not_prefilled_again() -> None:
    engine = build_engine(CHUNKED)
    job = planned_job(prompt=250, output=1, cached_tokens=150)
    engine.submit(job, 0.003)
    assert job.prefilled_tokens == 150
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(0.01)


def test_prefill_budget_is_shared_in_fifo_order() -> None:
    engine = build_engine(CHUNKED)
    first, second = planned_job(prompt=150, output=1), planned_job(prompt=150, output=1)
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
    engine = build_engine(CHUNKED)
    decoder = planned_job(prompt=1, output=100)
    engine.submit(decoder, 0.0)
    engine.step(0.01)  # its prompt is prefilled at the period end, and its first token is due
    assert decoder.state is JobState.DECODING
    prompt = planned_job(prompt=198, output=1)
    engine.submit(prompt, 0.01)
    engine.step(0.02)
    assert prompt.prefilled_tokens == 99
    run_until_idle(engine)
    assert prompt.first_token_time == pytest.approx(0.03)


def test_a_remotely_prefilled_prompt_is_not_prefilled_here() -> None:
    engine = build_engine(CHUNKED.replace(kv_cache_transfer_latency=0.005))
    job = planned_job(prompt=1000, output=1, remote_prefill=True)
    engine.submit(job, 0.0)
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(0.005)


def test_chunking_never_brings_the_first_token_before_ttft() -> None:
    engine = build_engine(CHUNKED.replace(time_to_first_token=0.05))
    job = planned_job(prompt=10, output=1)
    engine.submit(job, 0.0)
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(0.05)


def test_without_inter_token_latency_prefill_is_bounded_by_ttft_only() -> None:
    engine = build_engine(Config(max_num_batched_tokens=100, max_num_seqs=100, time_to_first_token=0.05))
    job = planned_job(prompt=100_000, output=1)
    engine.submit(job, 0.0)
    assert engine.next_deadline() == pytest.approx(0.05)
    run_until_idle(engine)
    assert job.first_token_time == pytest.approx(0.05)
