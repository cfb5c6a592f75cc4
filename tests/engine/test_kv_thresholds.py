"""Cache-hit thresholds and P/D decode timing in the engine, with a fake clock.

A job with a ``cache_hit_threshold`` is rated at admission against the pool as it is
then (llm-d-inference-sim ``pkg/llm-d-inference-sim/request.go:194-220,266-291``: hit
rate = cached prompt tokens / prompt tokens; below the threshold the request returns at
once with finish reason ``cache_threshold``, no TTFT and no decode).  A ``remote_prefill``
job waits the KV transfer (llm-d ``latencies.go``; ``--kv-cache-transfer-latency``) and
its prompt's blocks land in this pool.
"""

from __future__ import annotations

import math

import pytest

from llmsim.engine.job import Job, JobState
from llmsim.engine.kv_cache import BlockPool
from llmsim.engine.pause import PauseState
from llmsim.engine.scheduler import CACHE_THRESHOLD, Engine
from llmsim.engine.testing import planned_job, recording_sink, run_until_idle
from llmsim.options import EngineOptions, LatencyOptions

BLOCK = 16
LATENCY = LatencyOptions(latency_calculator="per-token", prefill_time_per_token=0.001, inter_token_latency=0.001)


def _engine(
    num_blocks: int = 64, *, max_num_seqs: int = 8, latency: LatencyOptions = LATENCY
) -> tuple[Engine, BlockPool]:
    pool = BlockPool(num_blocks, BLOCK, "", model="m")
    return Engine(EngineOptions(max_num_seqs=max_num_seqs), latency, kv_cache=pool), pool


def _job(prompt: int = 40, *, threshold: float | None = None, remote_prefill: bool = False) -> Job:
    job = planned_job(prompt=prompt, output=3, remote_prefill=remote_prefill)
    job.cache_hit_threshold = threshold
    return job


def _run(engine: Engine, job: Job, now: float) -> Job:
    engine.submit(job, now)
    run_until_idle(engine)
    assert job.state is JobState.FINISHED
    return job


def test_a_cold_prompt_below_its_threshold_ends_at_once_without_tokens_or_blocks() -> None:
    engine, pool = _engine()
    job = _job(threshold=0.5)
    engine.submit(job, 1.0)
    assert job.state is JobState.FINISHED  # decided at admission, in submit
    assert recording_sink(job).calls == []  # but its sink is called by the next step, not inside submit
    assert engine.next_deadline() == 1.0
    engine.step(1.0)
    (call,) = recording_sink(job).calls
    assert (call.start, call.stop, call.now, call.state) == (0, 0, 1.0, JobState.FINISHED)
    assert (job.finish_reason, job.emitted, job.first_token_time, job.admitted_time) == (CACHE_THRESHOLD, 0, None, None)
    assert not pool.holds(job)
    assert (pool.prefix_cache_queries, pool.num_used, len(pool.cached_hashes())) == (0, 0, 0)
    stats = engine.statistics()
    assert (stats.running, stats.finished, stats.prompt_tokens) == (0, 1, 0)
    assert engine.metrics.snapshot().histograms["time_to_first_token_seconds"].count == 0
    assert engine.next_deadline() == math.inf


def test_a_warm_prompt_at_or_above_its_threshold_runs_with_its_hit() -> None:
    engine, _ = _engine()
    _run(engine, _job(), 0.0)  # caches two full blocks of the 40-token prompt
    warm = _run(engine, _job(threshold=0.8), 10.0)  # 32 / 40 = 0.8: not below
    assert (warm.finish_reason, warm.emitted, warm.cached_tokens) == ("stop", 3, 32)
    assert recording_sink(warm).times[0] - 10.0 == pytest.approx(0.008, abs=1e-6)
    cold = _run(engine, _job(threshold=0.81), 20.0)
    assert (cold.finish_reason, cold.emitted) == (CACHE_THRESHOLD, 0)


def test_the_rate_is_taken_when_the_job_is_admitted_not_when_it_arrives() -> None:
    """Behind a job with the same prompt, a waiting job finds that prompt cached when its
    slot comes: admission is where llm-d rates it (the worker, after the queue)."""
    engine, _ = _engine(max_num_seqs=1)
    first, second = _job(), _job(threshold=0.5)
    engine.submit(first, 0.0)
    engine.submit(second, 0.0)
    assert second.state is JobState.WAITING
    run_until_idle(engine)
    assert (second.finish_reason, second.cached_tokens, second.emitted) == ("stop", 32, 3)


def test_an_ended_job_takes_no_slot_from_those_behind_it() -> None:
    engine, _ = _engine(max_num_seqs=1)
    running, rejected, behind = _job(prompt=20), _job(prompt=30, threshold=1.0), _job(prompt=50)
    for job in (running, rejected, behind):
        engine.submit(job, 0.0)
    run_until_idle(engine)
    assert rejected.finish_reason == CACHE_THRESHOLD
    assert (running.finish_reason, behind.finish_reason) == ("stop", "stop")
    # the rejected job was rated when the slot freed, and the one behind it admitted then
    assert behind.admitted_time == rejected.finish_time == running.finish_time


def test_an_infinite_threshold_forces_the_outcome_even_without_a_pool() -> None:
    """``X-Cache-Threshold-Finish-Reason: true`` (pkg/communication/http.go:257-261)."""
    engine = Engine(EngineOptions(), LATENCY)
    job = _run(engine, _job(threshold=math.inf), 0.0)
    assert (job.finish_reason, job.emitted, recording_sink(job).times) == (CACHE_THRESHOLD, 0, [0.0])


def test_a_remote_prefill_job_waits_the_transfer_and_leaves_its_blocks_here() -> None:
    latency = LatencyOptions(kv_cache_transfer_latency=0.25, time_to_first_token=2.0, inter_token_latency=0.001)
    engine, pool = _engine(latency=latency)
    decoded = _run(engine, _job(remote_prefill=True, threshold=0.9), 0.0)  # transferred blocks count as hits
    assert decoded.finish_reason == "stop"
    assert recording_sink(decoded).times[0] == pytest.approx(0.25)  # the transfer, not the 2 s TTFT
    assert len(pool.cached_hashes()) == 2  # the prompt's two full blocks are now in this pool
    local = _run(engine, _job(), 10.0)
    assert local.cached_tokens == 32


def test_per_token_transfer_time_scales_with_the_prompt() -> None:
    """latencies.go: ``prompt x kv-cache-transfer-time-per-token`` (llmsim/engine/latency.py)."""
    latency = LatencyOptions(latency_calculator="per-token", kv_cache_transfer_time_per_token=0.002)
    engine, _ = _engine(latency=latency)
    job = _run(engine, _job(prompt=100, remote_prefill=True), 0.0)
    assert recording_sink(job).times[0] == pytest.approx(0.2)


def test_an_unloaded_adapters_idle_blocks_are_evicted_first() -> None:
    """``Engine.set_lora_loaded`` reaches the pool (llm-d ``pickBlockToEvict``): the
    adapter's blocks, freed last, go before the base model's older ones."""
    engine, _ = _engine(num_blocks=4)
    _run(engine, planned_job(prompt=32, output=0), 0.0)  # the base model's 2 blocks, idle first
    adapter = planned_job(prompt=32, output=0)
    adapter.lora = "sql"
    _run(engine, adapter, 1.0)  # the adapter's 2 blocks, idle later
    engine.set_lora_loaded("sql", False)
    newcomer = planned_job(prompt=32, output=0)
    newcomer.prompt_token_ids = [500 + token for token in newcomer.prompt_token_ids]
    _run(engine, newcomer, 2.0)  # needs 2 blocks: evicts 2 idle ones
    assert _run(engine, planned_job(prompt=32, output=0), 3.0).cached_tokens == 16  # the base model's survived
    again = planned_job(prompt=32, output=0)
    again.lora = "sql"
    assert _run(engine, again, 4.0).cached_tokens == 0


def test_a_job_ended_just_before_a_freeze_still_gets_its_answer() -> None:
    """Sleep's ``keep`` mode freezes every step (llmsim/engine/pause.py), but a job already
    ended at admission is owed its one sink call."""
    engine, _ = _engine()
    job = _job(threshold=0.5)
    engine.submit(job, 1.0)
    engine.set_pause_state(PauseState.PAUSED_ALL, 1.0)
    assert engine.next_deadline() == 1.0
    engine.step(1.0)
    assert recording_sink(job).times == [1.0]
    assert engine.next_deadline() == math.inf
