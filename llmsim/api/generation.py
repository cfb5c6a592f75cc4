"""The flow every generating endpoint shares: plan jobs, submit them, deliver their
output through a sink, and cancel whatever is unfinished when the handler ends.

A request becomes one :class:`~llmsim.engine.job.Job` per choice (``n`` per prompt),
each with its whole output planned up front: by the text generator, or by the endpoint
itself when it plans more than text (chat's tool calls).  All jobs are
submitted before the response starts, so a full waiting queue is a real 429.  Then the
handler waits; the engine task drives the jobs and calls the sink, which (streaming)
renders and writes each step's tokens at once, or (non-streaming) only counts.  When
the client goes away the protocol cancels the handler, and its ``finally`` cancels
every unfinished job in the engine at once, freeing their slots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs
import trio

from llmsim.api.context import ApiContext, Call
from llmsim.api.errors import ApiError
from llmsim.api.http import Headers, ResponseStream
from llmsim.api.sse import SSE_HEADERS, error_events
from llmsim.engine.errors import QUEUE_FULL_MESSAGE, QueueFullError
from llmsim.engine.job import Job, JobSink, JobState
from llmsim.engine.scheduler import Engine

__all__ = [
    "CollectingSink",
    "GenerationPlan",
    "PlannedOutput",
    "PromptPlan",
    "RequestIdentity",
    "StreamRenderer",
    "StreamingSink",
    "SubmittedJobs",
    "build_jobs",
    "check_job_count",
    "generate_all",
    "generate_stream",
]

log = logging.getLogger("llmsim.api")

_FINISHED = JobState.FINISHED  # a module global: enum member lookups cost on the per-token path


@attrs.frozen
class RequestIdentity:
    """How a request is named: ``X-Request-Id`` when the client sent one (then echoed
    back as a header), otherwise a fresh id."""

    request_id: str  # seeds the text RNG of every choice
    response_id: str  # "chatcmpl-<id>" / "cmpl-<id>"
    headers: tuple[tuple[bytes, bytes], ...]

    @classmethod
    def of(cls, call: Call, prefix: str) -> RequestIdentity:
        given = call.request.header("x-request-id")
        if given:
            return cls(given, prefix + given, ((b"x-request-id", given.encode("latin-1")),))
        request_id = call.ctx.new_request_id()
        return cls(request_id, prefix + request_id, ())


@attrs.frozen
class PromptPlan:
    token_ids: Sequence[int]
    echo_text: str  # what --mode echo replays for this prompt


class PlannedOutput(Protocol):
    """What one choice says, planned before its job is built (one piece and id per token)."""

    @property
    def pieces(self) -> Sequence[str]: ...

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def finish_reason(self) -> str: ...


@attrs.frozen
class GenerationPlan:
    """Everything needed to build the jobs of one request."""

    request_id: str
    prompts: Sequence[PromptPlan]
    choices_per_prompt: int
    max_tokens: int | None  # None: as many as the context leaves (the generator decides)
    ignore_eos: bool
    outputs: Sequence[PlannedOutput] | None = None  # one per choice; None: the text generator plans

    @property
    def job_count(self) -> int:
        return len(self.prompts) * self.choices_per_prompt


def check_job_count(ctx: ApiContext, job_count: int) -> None:
    """429 at once for a request with more choices than the engine could ever hold
    (running slots plus waiting queue), before any of them is planned: a huge ``n``
    must not cost the server minutes of planning only to be refused."""
    config = ctx.config
    if job_count > config.max_num_seqs + config.max_waiting_queue_length:
        raise ApiError(429, QUEUE_FULL_MESSAGE)


def build_jobs(ctx: ApiContext, plan: GenerationPlan, sink: JobSink) -> list[Job]:
    """One job per choice, in choice-index order; choice ``i`` answers prompt ``i // n``.
    Each choice's text comes from its own RNG, so it is reproducible under ``--seed``."""
    jobs = []
    for prompt_index, prompt in enumerate(plan.prompts):
        prompt_tokens = len(prompt.token_ids)
        cap = plan.max_tokens if plan.max_tokens is not None else ctx.config.max_model_len - prompt_tokens
        for choice in range(plan.choices_per_prompt):
            index = prompt_index * plan.choices_per_prompt + choice
            text = plan.outputs[index] if plan.outputs is not None else _generate_text(ctx, plan, prompt, index)
            jobs.append(
                Job(
                    prompt_token_ids=prompt.token_ids,
                    output=text.pieces,
                    finish_reason=text.finish_reason,
                    sink=sink,
                    output_token_ids=text.token_ids,
                    index=index,
                    request_id=plan.request_id,
                    max_tokens=cap,
                )
            )
    return jobs


def _generate_text(ctx: ApiContext, plan: GenerationPlan, prompt: PromptPlan, index: int) -> PlannedOutput:
    return ctx.text.generate(
        ctx.rng_for(plan.request_id, index),
        max_tokens=plan.max_tokens,
        ignore_eos=plan.ignore_eos,
        prompt_tokens=len(prompt.token_ids),
        echo_text=prompt.echo_text,
    )


class StreamRenderer(Protocol):
    """An endpoint's stream format (see chat_format / completions_format)."""

    def render(self, job: Job, start: int, stop: int) -> bytes:
        """The events for one ``on_output`` call of ``job``."""

    def tail(self, jobs: Sequence[Job]) -> bytes:
        """The events after the last job finished (usage, ``[DONE]``)."""


class CollectingSink:
    """For non-streaming requests: the output stays on the jobs; this only notices
    when the last one finished."""

    def __init__(self, job_count: int) -> None:
        self.done = trio.Event()
        self._unfinished = job_count

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        if job.state is _FINISHED:
            self._unfinished -= 1
            if self._unfinished == 0:
                self.done.set()
        return True


class StreamingSink:
    """For streaming requests: renders every step's tokens and writes them with one
    ``response.write``; ends the response when the last job finished.

    Backpressure: when the write finds the client's buffer full the job is paused
    (``on_output`` returns False) and resumed through ``resume`` once it drained.
    """

    def __init__(
        self,
        response: ResponseStream,
        renderer: StreamRenderer,
        job_count: int,
        resume: Callable[[Job], None],
    ) -> None:
        self.done = trio.Event()
        self._ended = False  # mirrors done.is_set(), cheaper on the per-token path
        self._response = response
        self._renderer = renderer
        self._job_count = job_count
        self._resume = resume
        self._finished: list[Job] = []
        self._paused: list[Job] = []

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        if self._ended:
            return True  # the stream already ended in error; the handler cancels the rest
        try:
            data = self._renderer.render(job, start, stop)
            if job.state is _FINISHED:
                self._finish(job, data)
                return True
            if not data or self._response.write(data):
                return True
            self._pause(job)
            return False
        except Exception:
            # Never let a rendering bug escape into the engine task: it serves everyone.
            log.exception("rendering the stream of %r failed", job)
            self.fail(ApiError(500, "Internal server error"))
            return True

    def fail(self, error: ApiError) -> None:
        """End the stream with vLLM's in-band error event (its 200 is long sent)."""
        if not self._response.closed:
            self._response.end(self._error_bytes(error))
        self._end()

    def _error_bytes(self, error: ApiError) -> bytes:
        """The in-band error event of this endpoint's stream format."""
        return error_events(error)

    def _end(self) -> None:
        self._ended = True
        # The jobs point back at this sink: holding them would leave the request's
        # whole object graph (response stream included) in a reference cycle, for the
        # cycle collector to find; once the stream ended they are needed no more.
        self._finished = []
        self._paused = []
        self.done.set()

    def _finish(self, job: Job, data: bytes) -> None:
        self._finished.append(job)
        if len(self._finished) == self._job_count:
            self._response.end(data + self._renderer.tail(self._finished))
            self._end()
        elif data:
            self._response.write(data)  # a finished job has nothing left to pause

    def _pause(self, job: Job) -> None:
        self._paused.append(job)
        if len(self._paused) == 1:
            self._response.on_drained(self._resume_paused)

    def _resume_paused(self) -> None:
        paused, self._paused = self._paused, []
        for job in paused:
            if not job.done:
                self._resume(job)


class SubmittedJobs:
    """``with SubmittedJobs(engine, jobs, clock):`` submits every job, all or none: a
    full queue is a 429.  On exit, however it happens, every job that has not finished
    is cancelled (freeing its slot).

    A class rather than a generator-based ``@contextmanager``: it runs once per
    request, and the generator machinery cost more than the submitting.
    """

    __slots__ = ("_clock", "_engine", "_jobs")

    def __init__(self, engine: Engine, jobs: Sequence[Job], clock: Callable[[], float]) -> None:
        self._engine = engine
        self._jobs = jobs
        self._clock = clock

    def __enter__(self) -> None:
        try:
            self._submit()
        except BaseException:
            self._cancel_unfinished()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self._cancel_unfinished()

    def _submit(self) -> None:
        submit, now = self._engine.submit, self._clock()
        try:
            for job in self._jobs:
                submit(job, now)
        except QueueFullError as exc:
            raise ApiError(429, str(exc)) from None

    def _cancel_unfinished(self) -> None:
        now = self._clock()
        for job in self._jobs:
            if not job.done:
                self._engine.cancel(job, now)


async def generate_stream(call: Call, plan: GenerationPlan, renderer: StreamRenderer, headers: Headers = ()) -> None:
    """Run ``plan`` as a 200 event stream rendered by ``renderer``; return when it ended."""
    ctx = call.ctx

    def resume(job: Job) -> None:
        ctx.engine.resume(job, ctx.clock())

    sink = StreamingSink(call.response, renderer, plan.job_count, resume)
    jobs = build_jobs(ctx, plan, sink)
    with SubmittedJobs(ctx.engine, jobs, ctx.clock):
        call.response.start(200, (*SSE_HEADERS, *headers))
        await sink.done.wait()


async def generate_all(call: Call, plan: GenerationPlan) -> list[Job]:
    """Run ``plan`` to the end and return its finished jobs, in choice-index order."""
    ctx = call.ctx
    sink = CollectingSink(plan.job_count)
    jobs = build_jobs(ctx, plan, sink)
    with SubmittedJobs(ctx.engine, jobs, ctx.clock):
        await sink.done.wait()
    return jobs
