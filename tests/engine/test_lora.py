"""The LoRA slots: vLLM's ``max_loras`` admission rule (``vllm/v1/core/sched/scheduler.py:
1038-1101``): a waiting request whose adapter is not among the running requests' adapters,
when those already number ``max_loras``, is skipped and keeps its place; the requests
behind it (no adapter, or an adapter already running) may be admitted.

Driven with a fake clock: every ``now`` is a plain number.
"""

from __future__ import annotations

import pytest

from llmsim.app import build_engine
from llmsim.config import Config
from llmsim.engine import Engine, Job, JobState
from llmsim.engine.lora import LoraState
from llmsim.engine.testing import planned_job, run_until_idle


def _job(lora: str | None, output: int = 5) -> Job:
    job = planned_job(output=output)
    job.lora = lora
    return job


def _engine(max_loras: int = 1, max_num_seqs: int = 8) -> Engine:
    return build_engine(
        Config(time_to_first_token=0.1, inter_token_latency=0.02, max_loras=max_loras, max_num_seqs=max_num_seqs)
    )


def test_a_request_waits_for_an_adapter_slot_and_others_pass_it() -> None:
    engine = _engine(max_loras=1)
    a1, b1, base, a2 = _job("a"), _job("b"), _job(None), _job("a", output=2)
    for index, job in enumerate((a1, b1, base, a2)):
        engine.submit(job, index * 0.001)
    # b waits for the one slot a holds; the base-model request and a's second go past it
    assert [job.state for job in (a1, b1, base, a2)] == [
        JobState.PREFILL,
        JobState.WAITING,
        JobState.PREFILL,
        JobState.PREFILL,
    ]
    assert engine.statistics().waiting == 1
    assert engine.lora_state() == LoraState(adapters=("a", "b"), deferred=1)
    run_until_idle(engine)
    # b is admitted when a's last job (a1: TTFT 0.1 + 4 ITLs of 0.02 after 0.000) ends
    assert a2.finish_time == pytest.approx(0.003 + 0.1 + 0.02)
    assert b1.admitted_time == pytest.approx(a1.finish_time) == pytest.approx(0.18)
    assert all(job.state is JobState.FINISHED for job in (a1, b1, base, a2))
    assert engine.lora_state() == LoraState(adapters=(), deferred=0)


def test_skipped_requests_keep_their_order() -> None:
    engine = _engine(max_loras=1)
    a = _job("a", output=1)
    b1, c, b2 = _job("b", output=1), _job("c", output=1), _job("b", output=1)
    for index, job in enumerate((a, b1, c, b2)):
        engine.submit(job, index * 0.001)
    assert [job.state for job in (b1, c, b2)] == [JobState.WAITING] * 3
    engine.step(0.1)  # a's only token: a ends, and b's two requests get the slot, c waits
    assert a.state is JobState.FINISHED
    assert [job.state for job in (b1, c, b2)] == [JobState.PREFILL, JobState.WAITING, JobState.PREFILL]
    run_until_idle(engine)
    assert c.admitted_time == pytest.approx(0.2)  # when b's jobs (admitted at 0.1, TTFT 0.1) end


def test_max_loras_distinct_adapters_run_together() -> None:
    engine = _engine(max_loras=2)
    a, b, c = _job("a"), _job("b"), _job("c")
    for job in (a, b, c):
        engine.submit(job, 0.0)
    assert [job.state for job in (a, b, c)] == [JobState.PREFILL, JobState.PREFILL, JobState.WAITING]


def test_running_slots_still_cap_admission() -> None:
    engine = _engine(max_loras=1, max_num_seqs=1)
    a, base = _job("a"), _job(None)
    engine.submit(a, 0.0)
    engine.submit(base, 0.0)
    assert base.state is JobState.WAITING  # no slot, adapter or not


def test_cancelling_the_adapters_last_job_frees_its_slot() -> None:
    engine = _engine(max_loras=1)
    a, b = _job("a"), _job("b")
    engine.submit(a, 0.0)
    engine.submit(b, 0.0)
    engine.cancel(a, 0.05)
    assert b.state is JobState.PREFILL
    assert b.admitted_time == 0.05


def test_a_blocked_queue_is_admitted_when_max_loras_grows() -> None:
    engine = _engine(max_loras=1)
    a, b = _job("a", output=50), _job("b")
    engine.submit(a, 0.0)
    engine.submit(b, 0.0)
    engine.step(0.1)
    assert b.state is JobState.WAITING
    config = Config(time_to_first_token=0.1, inter_token_latency=0.02, max_loras=2, max_num_seqs=8)
    engine.reconfigure(config.engine, config.latency)
    engine.step(0.12)
    assert b.state is JobState.PREFILL
    assert b.admitted_time == 0.12


def test_many_jobs_of_one_adapter_keep_the_bookkeeping_small() -> None:
    engine = _engine(max_loras=1, max_num_seqs=4)
    for index in range(2000):
        engine.submit(_job("a", output=1), index * 0.01)
        run_until_idle(engine)
    assert engine.statistics().finished == 2000
    assert len(engine._loras._jobs["a"]) <= 16 + 1
