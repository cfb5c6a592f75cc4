"""The KV block pool in the engine: prefix hits skip prefill, admission waits for blocks
(vLLM's FCFS waiting loop, ``vllm/v1/core/sched/scheduler.py:1435-1461``), blocks are
freed on finish, cancel and abort, and sleep clears the cache."""

from __future__ import annotations

import pytest

from llmsim.engine.job import JobState
from llmsim.engine.kv_cache import BlockPool
from llmsim.engine.scheduler import Engine
from llmsim.engine.testing import planned_job, recording_sink, run_until_idle
from llmsim.options import EngineOptions, LatencyOptions

BLOCK = 16
#: The per-token calculator: 1 ms per uncached prompt token and per output token (the
#: inter-token latency is also the chunked-prefill period TTFT ends on).
LATENCY = LatencyOptions(latency_calculator="per-token", prefill_time_per_token=0.001, inter_token_latency=0.001)


def _engine(num_blocks: int = 64, *, max_num_seqs: int = 8) -> tuple[Engine, BlockPool]:
    pool = BlockPool(num_blocks, BLOCK, "", model="m")
    return Engine(EngineOptions(max_num_seqs=max_num_seqs), LATENCY, kv_cache=pool), pool


def _ttft(engine: Engine, prompt: int, now: float) -> tuple[float, int]:
    """Run one job with a ``prompt``-token prompt (tokens 0..prompt-1) alone from ``now``:
    its TTFT and its cached tokens."""
    job = planned_job(prompt=prompt, output=3)
    engine.submit(job, now)
    run_until_idle(engine)
    assert job.state is JobState.FINISHED
    return recording_sink(job).times[0] - now, job.cached_tokens


def test_a_repeated_prompt_hits_its_full_blocks_and_prefills_faster() -> None:
    engine, pool = _engine()
    first_ttft, first_cached = _ttft(engine, 40, 0.0)
    second_ttft, second_cached = _ttft(engine, 40, 10.0)
    assert first_cached == 0
    assert second_cached == 32  # two full blocks; the 8-token tail is never a hit
    assert first_ttft == pytest.approx(0.040, abs=1e-6)
    assert second_ttft == pytest.approx(0.008, abs=1e-6)
    assert (pool.prefix_cache_queries, pool.prefix_cache_hits) == (80, 32)
    assert engine.metrics.snapshot().prefix_cache_hits == 32


def test_a_whole_block_prompt_is_never_entirely_cached() -> None:
    engine, _ = _engine()
    _ttft(engine, 32, 0.0)
    ttft, cached = _ttft(engine, 32, 10.0)
    assert cached == 16  # the last block holds the token vLLM recomputes
    assert ttft == pytest.approx(0.016, abs=1e-6)


def test_a_job_waits_for_blocks_and_is_admitted_when_they_free() -> None:
    engine, pool = _engine(num_blocks=4)
    first = planned_job(prompt=40, output=5)  # 45 tokens: 3 blocks
    second = planned_job(prompt=30, output=5)  # 35 tokens: 3 blocks, none shared
    second.prompt_token_ids = [1000 + token for token in second.prompt_token_ids]
    engine.submit(first, 0.0)
    engine.submit(second, 0.0)
    assert (first.state, second.state) == (JobState.PREFILL, JobState.WAITING)
    assert pool.usage == 0.75
    run_until_idle(engine)
    assert second.state is JobState.FINISHED
    assert first.finish_time is not None and second.admitted_time == first.finish_time
    assert pool.usage == 0.0


def test_fcfs_a_blocked_head_holds_back_smaller_jobs() -> None:
    engine, _ = _engine(num_blocks=4)
    running = planned_job(prompt=40, output=5)
    big = planned_job(prompt=40, output=5)
    big.prompt_token_ids = [2000 + token for token in big.prompt_token_ids]
    small = planned_job(prompt=3, output=1)
    small.prompt_token_ids = [3000, 3001, 3002]
    for job in (running, big, small):
        engine.submit(job, 0.0)
    # ``small`` would fit the one free block, but ``big`` came first and does not.
    assert (big.state, small.state) == (JobState.WAITING, JobState.WAITING)
    engine.cancel(running, 0.001)
    assert (big.state, small.state) == (JobState.PREFILL, JobState.PREFILL)


def test_a_job_larger_than_the_pool_runs_uncached_instead_of_waiting_forever() -> None:
    engine, pool = _engine(num_blocks=2)
    job = planned_job(prompt=40, output=5)
    engine.submit(job, 0.0)
    assert job.state is JobState.PREFILL
    assert pool.usage == 0.0
    run_until_idle(engine)
    assert job.state is JobState.FINISHED


def test_blocks_are_freed_on_finish_cancel_and_abort() -> None:
    engine, pool = _engine()
    finished, cancelled, aborted = (planned_job(prompt=20 + i, output=4) for i in range(3))
    for job in (finished, cancelled, aborted):
        engine.submit(job, 0.0)
    assert pool.num_used == 4  # two blocks each, the first one shared
    engine.cancel(cancelled, 0.001)
    assert pool.num_used == 3
    engine.step(engine.next_deadline())
    assert engine.abort_all(0.05) == 2  # finished (still decoding) and aborted
    assert pool.usage == 0.0
    assert engine.kv_cache_usage == 0.0


def test_usage_counts_the_running_jobs_blocks() -> None:
    engine, _ = _engine(num_blocks=10)
    engine.submit(planned_job(prompt=20, output=4), 0.0)
    assert engine.kv_cache_usage == pytest.approx(0.2)
    run_until_idle(engine)
    assert engine.kv_cache_usage == 0.0


def test_clearing_the_cache_forgets_the_prefixes() -> None:
    engine, pool = _engine()
    _ttft(engine, 40, 0.0)
    engine.clear_kv_cache()
    assert pool.cached_hashes() == frozenset()
    ttft, cached = _ttft(engine, 40, 10.0)
    assert cached == 0
    assert ttft == pytest.approx(0.040, abs=1e-6)


def test_without_a_pool_nothing_is_cached() -> None:
    engine = Engine(EngineOptions(), LATENCY)
    _ttft(engine, 40, 0.0)
    ttft, cached = _ttft(engine, 40, 10.0)
    assert cached == 0
    assert ttft == pytest.approx(0.040, abs=1e-6)
    engine.clear_kv_cache()
    assert engine.kv_cache_usage == 0.0
