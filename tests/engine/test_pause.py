"""Pausing the engine as vLLM's sleep mode pauses its scheduler (llmsim/engine/pause.py):
``abort_all`` (``mode=abort``), PAUSED_NEW (``mode=wait``) and PAUSED_ALL (``mode=keep``),
``vllm/v1/engine/core.py:2181-2223``.  Driven with a fake clock."""

from __future__ import annotations

import math

import pytest

from llmsim.app import build_engine
from llmsim.config import Config
from llmsim.engine import Engine, JobState
from llmsim.engine.job import RequestGroup
from llmsim.engine.pause import PauseState
from llmsim.engine.testing import RecordingSink, SinkCall, planned_job, recording_sink, run_until_idle

#: TTFT 0.1, then a token every 0.02; one slot, so a second job waits.
ONE_SLOT = Config(time_to_first_token=0.1, inter_token_latency=0.02, max_num_seqs=1)


def _engine(config: Config = ONE_SLOT) -> tuple[Engine, list[float]]:
    engine = build_engine(config)
    wakeups: list[float] = []
    engine.set_wakeup(lambda: wakeups.append(engine.next_deadline()))
    return engine, wakeups


# --- abort -----------------------------------------------------------------------------------


def test_abort_all_ends_running_and_waiting_jobs_with_one_last_empty_call() -> None:
    engine, _ = _engine()
    running, waiting = planned_job(output=10), planned_job(output=3)
    engine.submit(running, 0.0)
    engine.submit(waiting, 0.0)
    engine.step(0.1)
    engine.step(0.125)  # two tokens out

    assert engine.abort_all(0.13) == 2

    for job, emitted in ((running, 2), (waiting, 0)):
        assert job.state is JobState.FINISHED and job.finish_reason == "abort" and job.finish_time == 0.13
        assert recording_sink(job).calls[-1] == SinkCall(emitted, emitted, 0.13, JobState.FINISHED, emitted)
    assert len(recording_sink(waiting).calls) == 1
    stats = engine.statistics()
    assert (stats.running, stats.waiting, stats.finished, stats.cancelled) == (0, 0, 2, 0)
    assert engine.next_deadline() == math.inf
    run_until_idle(engine)
    assert len(recording_sink(running).calls) == 3  # nothing after the abort


def test_abort_all_reaches_paused_and_prefilling_jobs() -> None:
    """A job paused by backpressure, or still in chunked prefill, has no entry in the
    schedule: the engine still finds it."""
    config = Config(time_to_first_token=0.1, inter_token_latency=0.02, max_num_batched_tokens=50, max_num_seqs=8)
    engine, _ = _engine(config)
    paused, prefilling = planned_job(output=5), planned_job(prompt=400, output=5)
    recording_sink(paused).accept = False
    engine.submit(paused, 0.0)
    engine.submit(prefilling, 0.0)
    engine.step(0.1)
    assert paused.paused and prefilling.state is JobState.PREFILL

    assert engine.abort_all(0.11) == 2

    assert [job.state for job in (paused, prefilling)] == [JobState.FINISHED, JobState.FINISHED]
    assert not paused.paused
    assert engine.next_deadline() == math.inf
    assert engine.statistics().running == 0


def test_aborted_jobs_count_as_finished_requests_with_reason_abort() -> None:
    """vLLM's abort output counts as an output (a TTFT for a job without a token, an ITL
    otherwise, vllm/v1/metrics/stats.py:509-558), then the request finishes
    (output_processor.py:868-887): request_success{finished_reason="abort"}."""
    engine, _ = _engine()
    group = RequestGroup(2)
    running, waiting = planned_job(output=10), planned_job(output=3)
    running.group, waiting.group = group, group
    engine.submit(running, 0.0)
    engine.submit(waiting, 0.0)
    engine.step(0.1)
    engine.step(0.125)

    engine.abort_all(0.13)

    snapshot = engine.metrics.snapshot()
    assert snapshot.request_success["abort"] == 2
    assert snapshot.request_success["stop"] == snapshot.request_success["length"] == 0
    ttft = snapshot.histograms["time_to_first_token_seconds"]
    assert ttft.count == 2 and ttft.sum == pytest.approx(0.1 + 0.13)  # the waiting job's "first output"
    itl = snapshot.histograms["inter_token_latency_seconds"]
    assert itl.count == 2 and itl.sum == pytest.approx(0.025 + 0.005)
    assert snapshot.histograms["e2e_request_latency_seconds"].sum == pytest.approx(0.26)
    assert snapshot.histograms["request_queue_time_seconds"].sum == pytest.approx(0.13)  # the waiting job's
    assert snapshot.histograms["request_decode_time_seconds"].sum == pytest.approx(0.03)
    assert snapshot.histograms["request_generation_tokens"].sum == 2
    assert snapshot.histograms["request_params_n"].count == 1  # the group completed


def test_a_cancelled_job_is_not_aborted_again() -> None:
    engine, _ = _engine()
    gone = planned_job()
    engine.submit(gone, 0.0)
    engine.cancel(gone, 0.05)
    assert engine.abort_all(0.06) == 0
    assert gone.state is JobState.CANCELLED
    assert engine.metrics.snapshot().request_success["abort"] == 0


# --- PAUSED_NEW (mode=wait) -------------------------------------------------------------------


def test_paused_new_lets_running_jobs_finish_and_holds_waiting_ones() -> None:
    """vllm/v1/core/sched/scheduler.py:1049-1066: under PAUSED_NEW only running requests
    are scheduled; queued ones stay queued until the resume."""
    engine, _ = _engine()
    running, waiting = planned_job(output=3), planned_job(output=2)
    engine.submit(running, 0.0)
    engine.submit(waiting, 0.0)
    engine.set_pause_state(PauseState.PAUSED_NEW, 0.05)
    late = planned_job(output=1)
    engine.submit(late, 0.06)
    run_until_idle(engine)

    assert running.state is JobState.FINISHED and running.finish_time == pytest.approx(0.14)
    assert (waiting.state, late.state) == (JobState.WAITING, JobState.WAITING)
    assert engine.statistics().waiting == 2

    engine.set_pause_state(PauseState.UNPAUSED, 1.0)
    assert waiting.admitted_time == 1.0
    run_until_idle(engine)
    assert waiting.state is late.state is JobState.FINISHED


# --- PAUSED_ALL (mode=keep) -------------------------------------------------------------------


def test_paused_all_freezes_the_schedule_and_shifts_it_by_the_paused_time() -> None:
    engine, wakeups = _engine()
    job = planned_job(output=5)
    engine.submit(job, 0.0)
    engine.step(0.1)
    engine.step(0.125)  # tokens at 0.1 and 0.125 (due 0.12); the next is due at 0.14
    engine.set_pause_state(PauseState.PAUSED_ALL, 0.13)

    assert engine.next_deadline() == math.inf
    engine.step(0.5)
    assert len(recording_sink(job).calls) == 2

    engine.set_pause_state(PauseState.UNPAUSED, 1.13)  # paused for 1 s
    assert wakeups[-1] == pytest.approx(1.14)
    run_until_idle(engine)
    assert recording_sink(job).times == pytest.approx([0.1, 0.125, 1.14, 1.16, 1.18])


def test_paused_all_also_delays_the_first_token_and_chunked_prefill() -> None:
    config = Config(time_to_first_token=0.1, inter_token_latency=0.02, max_num_batched_tokens=50, max_num_seqs=8)
    engine, _ = _engine(config)
    short, long = planned_job(output=1), planned_job(prompt=100, output=1)  # long: prefilled over 2 periods
    engine.submit(short, 0.0)
    engine.submit(long, 0.0)
    engine.set_pause_state(PauseState.PAUSED_ALL, 0.05)
    engine.set_pause_state(PauseState.UNPAUSED, 2.05)
    run_until_idle(engine)
    assert short.first_token_time == pytest.approx(2.1)
    assert long.first_token_time == pytest.approx(2.1)
    assert long.prefilled_tokens == 100


def test_while_paused_all_no_job_is_admitted_and_a_resume_waits() -> None:
    engine, _ = _engine()
    first, second = planned_job(output=3), planned_job(output=1)
    recording_sink(first).accept = False
    engine.submit(first, 0.0)
    engine.step(0.1)  # first token; paused by backpressure
    engine.set_pause_state(PauseState.PAUSED_ALL, 0.11)
    engine.submit(second, 0.12)
    engine.resume(first, 0.2)
    engine.cancel(first, 0.3)  # frees the slot: still nobody is admitted
    assert second.state is JobState.WAITING
    engine.set_pause_state(PauseState.UNPAUSED, 1.0)
    assert second.admitted_time == 1.0
    run_until_idle(engine)
    assert second.first_token_time == pytest.approx(1.1)


def test_keep_then_abort_ends_the_kept_jobs() -> None:
    """``sleep(mode=keep)`` then ``sleep(mode=abort)``: the frozen jobs end with ``abort``."""
    engine, _ = _engine()
    job = planned_job(output=5)
    engine.submit(job, 0.0)
    engine.step(0.1)
    engine.set_pause_state(PauseState.PAUSED_ALL, 0.11)
    engine.abort_all(0.5)
    engine.set_pause_state(PauseState.PAUSED_NEW, 0.5)
    assert job.finish_reason == "abort" and recording_sink(job).ranges == [(0, 1), (1, 1)]
    assert engine.next_deadline() == math.inf


def test_the_engine_holds_no_job_once_it_finished_or_left() -> None:
    """The engine's list of running jobs (for abort_all) never keeps a job alive: a
    finished job's response must be freed when its request ends."""
    engine, _ = _engine(Config(time_to_first_token=0.1, inter_token_latency=0.01, max_num_seqs=4))
    done, gone, kept = planned_job(output=2), planned_job(output=9), planned_job(output=9)
    for job in (done, gone, kept):
        engine.submit(job, 0.0)
    engine.step(0.1)
    engine.step(0.11)
    engine.cancel(gone, 0.115)
    assert done.state is JobState.FINISHED
    assert list(engine._admitted) == [kept]


def test_a_job_resumed_while_frozen_is_shifted_once() -> None:
    """A client that drains while the engine is frozen: its next token comes as much after
    the wake-up as it was due after the freeze, not the frozen time twice (review finding)."""
    engine = build_engine(Config(time_to_first_token=0.1, inter_token_latency=0.5))
    sink = RecordingSink(accept=False)
    job = planned_job(output=4, sink=sink)
    engine.submit(job, 0.0)
    engine.step(engine.next_deadline())  # first token at 0.1; the sink is full: paused
    assert job.paused
    engine.set_pause_state(PauseState.PAUSED_ALL, 1.0)
    sink.accept = True
    engine.resume(job, 2.0)
    engine.set_pause_state(PauseState.UNPAUSED, 3.0)
    assert engine.next_deadline() == pytest.approx(3.0)  # due at the freeze (1.0), shifted by 2.0
