"""vLLM's request statistics, recorded from the engine's events (llmsim/engine/metrics.py).

Driven with a fake clock, so every interval is known: each expectation is the
definition in vLLM 0.33's ``vllm/v1/metrics/stats.py`` applied to the job's times.
"""

from __future__ import annotations

import bisect
import math
import random
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.app import build_engine
from llmsim.config import Config
from llmsim.engine import Engine, QueueFullError
from llmsim.engine.job import RequestGroup
from llmsim.engine.metrics import EngineMetrics, Histogram, MetricsSnapshot
from llmsim.engine.testing import planned_job, recording_sink, run_until_idle


def _engine(**settings: object) -> tuple[Engine, EngineMetrics]:
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.02, **settings))
    return engine, engine.metrics


def _sum(snapshot: MetricsSnapshot, name: str) -> float:
    return snapshot.histograms[name].sum


def _count(snapshot: MetricsSnapshot, name: str) -> int:
    return snapshot.histograms[name].count


def test_two_requests_one_slot_every_interval() -> None:
    """a: admitted at 0, first token 0.1, last 0.18 (5 tokens); b waits for a's slot:
    admitted 0.18, first token 0.28, last 0.32 (3 tokens)."""
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.02, max_num_seqs=1))
    a, b = planned_job(output=5), planned_job(output=3)
    engine.submit(a, 0.0)
    engine.submit(b, 0.0)
    run_until_idle(engine)
    snapshot = engine.metrics.snapshot()

    expected_sums = {
        "time_to_first_token_seconds": 0.1 + 0.28,  # stats.py:524: first output - arrival
        "inter_token_latency_seconds": 6 * 0.02,  # stats.py:552-556: one per later output
        "e2e_request_latency_seconds": 0.18 + 0.32,
        "request_queue_time_seconds": 0.0 + 0.18,  # stats.py:595: scheduled - queued
        "request_prefill_time_seconds": 0.1 + 0.1,  # stats.py:599: first token - scheduled
        "request_decode_time_seconds": 0.08 + 0.04,  # stats.py:603: last token - first token
        "request_inference_time_seconds": 0.18 + 0.14,  # stats.py:607: last token - scheduled
        "request_time_per_output_token_seconds": 0.02 + 0.02,  # stats.py:610-614: decode / (tokens - 1)
        "request_prompt_tokens": 20,
        "request_generation_tokens": 8,
        "request_max_num_generation_tokens": 8,  # parallel_sampling.py:137-152: n = 1, its own tokens
        "request_params_n": 2,
        "request_num_preemptions": 0,
        "request_prefill_kv_computed_tokens": 20,
        # loggers.py:1262-1265: each step's computed prompt tokens plus its output
        "iteration_tokens_total": (10 + 1) * 2 + 6,
    }
    for name, expected in expected_sums.items():
        assert _sum(snapshot, name) == pytest.approx(expected), name
    counts = {name: _count(snapshot, name) for name in snapshot.histograms}
    assert counts == {
        **dict.fromkeys(snapshot.histograms, 2),
        "inter_token_latency_seconds": 6,
        "iteration_tokens_total": 8,  # one per step that produced tokens
        "request_params_max_tokens": 0,  # only when max_tokens was set (loggers.py:1326-1329)
    }
    assert snapshot.request_success == {"stop": 2, "length": 0, "abort": 0, "error": 0, "repetition": 0}
    assert snapshot.prefix_cache_queries == 20
    assert snapshot.prompt_tokens_computed == 20
    statistics = engine.statistics()
    assert (statistics.prompt_tokens, statistics.generated_tokens) == (20, 8)


def test_histograms_bucket_as_prometheus_does() -> None:
    """``le`` buckets hold observations at most their bound."""
    histogram = Histogram((0.1, 0.5))
    for value in (0.05, 0.1, 0.2, 0.5, 7.0):
        histogram.observe(value)
    snapshot = histogram.snapshot()
    assert snapshot.counts == (2, 2, 1)
    assert snapshot.cumulative() == (2, 4, 5)
    assert snapshot.sum == pytest.approx(7.85)


def test_a_cancelled_job_counts_its_tokens_but_never_finishes() -> None:
    """vLLM's frontend drops an aborted request's state before any finish statistics
    (vllm/v1/engine/output_processor.py:599-660): tokens and TTFT count, nothing else."""
    engine, metrics = _engine()
    job = planned_job(output=10)
    engine.submit(job, 0.0)
    while engine.statistics().generated_tokens < 2:  # the first token, then one more
        engine.step(engine.next_deadline())
    engine.cancel(job, engine.next_deadline() - 0.001)
    run_until_idle(engine)
    snapshot = metrics.snapshot()
    assert engine.statistics().generated_tokens == 2
    assert _count(snapshot, "time_to_first_token_seconds") == 1
    assert _count(snapshot, "inter_token_latency_seconds") == 1
    assert _count(snapshot, "e2e_request_latency_seconds") == 0
    assert sum(snapshot.request_success.values()) == 0


def test_n_and_the_longest_choice_are_recorded_once_per_request() -> None:
    engine, metrics = _engine()
    group = RequestGroup(3)
    jobs = [planned_job(output=tokens) for tokens in (2, 6, 4)]
    for job in jobs:
        job.group = group
        job.max_tokens = 6
        engine.submit(job, 0.0)
    run_until_idle(engine)
    histograms = metrics.snapshot().histograms
    assert (histograms["request_params_n"].count, histograms["request_params_n"].sum) == (1, 3)
    assert histograms["request_max_num_generation_tokens"].sum == 6
    assert histograms["request_params_max_tokens"].count == 3  # per child request, as vLLM
    assert histograms["request_generation_tokens"].sum == 12


def test_finish_reasons_are_the_engines() -> None:
    """A tool call ends on EOS like any answer (vLLM's engine says stop; the API layer
    renames it), a P/D prefill side on its one token; llm-d's cache_threshold is its own."""
    engine, metrics = _engine()
    for reason in ("stop", "length", "tool_calls", "remote_decode", "cache_threshold"):
        job = planned_job(output=1)
        job.finish_reason = reason
        engine.submit(job, 0.0)
    run_until_idle(engine)
    assert metrics.snapshot().request_success == {
        "stop": 2,
        "length": 2,
        "abort": 0,
        "error": 0,
        "repetition": 0,
        "cache_threshold": 1,
    }


def test_an_admission_refusal_is_counted_by_reason() -> None:
    engine, metrics = _engine(max_num_queued_reqs=1)
    engine.submit(planned_job(), 0.0)
    with pytest.raises(QueueFullError):
        engine.check_admission(1)
    assert metrics.snapshot().admission_rejections == {"max_num_queued_reqs": 1, "max_num_queued_tokens": 0}


def test_cached_prompt_tokens_are_hits_not_computed() -> None:
    engine, metrics = _engine()
    engine.submit(planned_job(prompt=32, cached_tokens=16), 0.0)
    run_until_idle(engine)
    snapshot = metrics.snapshot()
    assert (snapshot.prefix_cache_queries, snapshot.prefix_cache_hits) == (32, 16)
    assert (snapshot.prompt_tokens_computed, snapshot.prompt_tokens_cached) == (16, 16)
    assert snapshot.histograms["request_prefill_kv_computed_tokens"].sum == 16


@given(seed=st.integers(0, 2**32 - 1), quantum=st.sampled_from([0.0, 0.002, 0.005, 0.01]), jobs=st.integers(4, 40))
def test_every_inter_token_latency_lands_in_its_own_bucket(seed: int, quantum: float, jobs: int) -> None:
    """The engine's per-token path reuses the last ITL's bucket while the next ITL falls
    in it (scheduler.Engine._run); the counts must still be those of bisecting each ITL,
    i.e. vLLM's histogram of the gaps between a request's outputs.  ITLs here straddle
    the 25 ms bound (mean 25 ms, std dev 7.5 ms; the 10 ms and 50 ms bounds are near).
    Within a grid bucket the ITLs come in non-increasing order (jobs join it in the order
    they emitted); a late driver's catch-up and ready list mix them up."""
    engine = build_engine(
        Config(time_to_first_token=0.05, inter_token_latency=0.025, inter_token_latency_std_dev=0.0075, seed=seed)
    )
    if quantum:
        engine.set_step_quantum(quantum)
    submitted = [planned_job(output=8 + index) for index in range(jobs)]
    for index, job in enumerate(submitted):
        engine.submit(job, index * 0.003)
    late = random.Random(seed)  # a driver that wakes up late, up to 15 ms: catch-up, the ready list
    while (deadline := engine.next_deadline()) != math.inf:
        engine.step(deadline + late.choice([0.0, 0.0, late.uniform(0.0, 0.015)]))
    histogram = engine.metrics.inter_token_latency
    expected = [0] * (len(histogram.bounds) + 1)
    total = 0.0
    for job in submitted:
        for gap in (b - a for a, b in pairwise(recording_sink(job).times)):
            expected[bisect.bisect_left(histogram.bounds, gap)] += 1
            total += gap
    assert histogram.counts == expected
    assert sum(1 for count in expected if count) >= 2  # (else the test proves little)
    assert histogram.sum == pytest.approx(total)


def test_a_longer_inter_token_latency_after_a_shorter_one_in_the_same_step_gets_its_own_bucket() -> None:
    """Within one grid time the jobs mostly come in non-increasing ITL order (they join
    it in the order they emitted), but jobs resumed after a pause go out in the order
    they were resumed: here C (30 ms since its last token) and then A (90 ms) in the same
    step, so the bucket reused from C's ITL must not take A's."""
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.02))
    engine.set_step_quantum(0.01)
    c = planned_job(output=6)
    a = planned_job(output=6)
    engine.submit(c, 0.0)
    engine.submit(a, 0.0)
    recording_sink(a).accept = False  # A pauses at its first token
    for now in (0.1, 0.12, 0.14):
        engine.step(now)
    recording_sink(c).accept = False  # C pauses at its fourth
    engine.step(0.16)
    recording_sink(a).accept = recording_sink(c).accept = True
    engine.resume(c, 0.185)
    engine.resume(a, 0.185)
    engine.step(0.19)
    assert recording_sink(c).times == pytest.approx([0.1, 0.12, 0.14, 0.16, 0.19])
    assert recording_sink(a).times == pytest.approx([0.1, 0.19])
    histogram = engine.metrics.inter_token_latency
    expected = [0] * (len(histogram.bounds) + 1)
    for gap in (0.02, 0.02, 0.02, 0.03, 0.09):
        expected[bisect.bisect_left(histogram.bounds, gap)] += 1
    assert histogram.counts == expected
