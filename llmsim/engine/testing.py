"""Helpers for driving the engine in tests, with a fake clock (plain ``now`` values)."""

from __future__ import annotations

import math

import attrs

from llmsim.engine.job import Job, JobSink, JobState
from llmsim.engine.scheduler import Engine

__all__ = ["RecordingSink", "SinkCall", "planned_job", "recording_sink", "run_until_idle"]


@attrs.frozen
class SinkCall:
    """One ``on_output`` call, with the job's state and ``emitted`` at that moment."""

    start: int
    stop: int
    now: float
    state: JobState
    emitted: int


@attrs.define
class RecordingSink:
    """Records every ``on_output`` call and answers ``accept`` (False pauses the job)."""

    calls: list[SinkCall] = attrs.Factory(list)
    accept: bool = True

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        self.calls.append(SinkCall(start, stop, now, job.state, job.emitted))
        return self.accept

    @property
    def times(self) -> list[float]:
        """When each call happened."""
        return [call.now for call in self.calls]

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """``(start, stop)`` of each call."""
        return [(call.start, call.stop) for call in self.calls]


def planned_job(
    *,
    prompt: int = 10,
    output: int = 5,
    sink: JobSink | None = None,
    cached_tokens: int = 0,
    remote_prefill: bool = False,
) -> Job:
    """A job with a ``prompt``-token prompt and ``output`` planned pieces, recording
    its output in a fresh :class:`RecordingSink` unless given another sink."""
    return Job(
        prompt_token_ids=list(range(prompt)),
        output=tuple(f"w{i} " for i in range(output)),
        finish_reason="stop",
        sink=sink if sink is not None else RecordingSink(),
        cached_tokens=cached_tokens,
        remote_prefill=remote_prefill,
    )


def recording_sink(job: Job) -> RecordingSink:
    """``job.sink``, which must be a :class:`RecordingSink`."""
    if not isinstance(job.sink, RecordingSink):
        raise TypeError(f"{job!r} has a {type(job.sink).__name__}, not a RecordingSink")
    return job.sink


def run_until_idle(engine: Engine, *, max_steps: int = 100_000) -> None:
    """Step at each deadline exactly, as a perfectly punctual driver would, until
    nothing is due.  Raises AssertionError if the engine never goes idle."""
    for _ in range(max_steps):
        deadline = engine.next_deadline()
        if deadline == math.inf:
            return
        engine.step(deadline)
    raise AssertionError(f"the engine was still busy after {max_steps} steps")
