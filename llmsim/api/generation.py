"""The flow every generating endpoint shares: plan -> submit -> sink.

A request becomes a :class:`~llmsim.api.plan.GenerationPlan` (each choice's output
planned up front) and then one :class:`~llmsim.engine.job.Job` per choice
(:func:`build_jobs`).  The queue limits are checked before the response starts:
vLLM's ``--max-num-queued-reqs`` before planning (:func:`check_job_count`, a 503) and
llm-d-inference-sim's ``--max-waiting-queue-length`` as the jobs are submitted, all or
none (:class:`SubmittedJobs`, a 429), so a full queue is a real status and nothing is
left behind (:func:`queue_full_error` maps the limit to what the client sees).  Then
the engine task drives the jobs and calls their sink:

* :func:`stream` — a :class:`StreamingSink` renders each step's tokens with the
  endpoint's :class:`StreamRenderer` and writes them at once.  The renderer decides
  the framing: ``data:`` lines and ``[DONE]`` (chat, completions) or ``event:`` +
  ``data:`` (responses, messages), its opening events, its closing ones and its in-band
  error event.  Nothing waits: ``stream`` returns once the jobs are submitted and the
  head is written, and the sink ends the response (so a handler that only streams
  needs no task: see ``Application.start`` in :mod:`llmsim.api.http`).
* :func:`submit_collected` — a :class:`CollectingSink` only notices when the last job
  finished; the handler waits for that (:meth:`PendingJobs.finished`) and renders the
  complete body from the finished jobs.

However the request ends — its last job finished, the stream failed, the client went
away — leaving ``SubmittedJobs`` cancels every unfinished job in the engine at once,
freeing their slots (:meth:`SubmittedJobs.leave`: the sink's end and the response's
close call it for a stream; the end of the wait for a complete answer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import trio

from llmsim.api.context import ApiContext, Call, request_adapter
from llmsim.api.errors import ApiError, ResponseClosed
from llmsim.api.http import JSON_HEADERS, Headers, ResponseStream
from llmsim.api.plan import GenerationPlan
from llmsim.api.request_fields import check_n_limit
from llmsim.api.request_log import RequestLog, request_log
from llmsim.api.sse import SSE_HEADERS, PlainTokens, escape, escape_all, escape_cache, escaped_piece
from llmsim.engine.errors import QueueFullError, QueueLimit
from llmsim.engine.job import Job, JobSink, JobState, RequestGroup
from llmsim.engine.scheduler import Engine
from llmsim.model.logprobs import MAX_SIMULATED_LOGPROBS
from llmsim.speedups import installer

__all__ = [
    "PURE_ON_OUTPUT",
    "QUEUE_OVERFLOW_MESSAGE",
    "WAITING_QUEUE_FULL_MESSAGE",
    "CollectingSink",
    "PendingJobs",
    "RequestIdentity",
    "StreamRenderer",
    "StreamingSink",
    "SubmittedJobs",
    "build_jobs",
    "check_job_count",
    "check_output_volume",
    "queue_full_error",
    "respond_collected",
    "stream",
    "stream_error",
    "stream_to_end",
    "submit_collected",
]

log = logging.getLogger("llmsim.api")

_FINISHED = JobState.FINISHED  # a module global: enum member lookups cost on the per-token path
_DECODING = JobState.DECODING


class RequestIdentity(NamedTuple):
    """How a request is named: ``X-Request-Id`` when the client sent one (then echoed
    back as a header), else the body's ``request_id`` (chat and completions), else a
    fresh id: vLLM's ``_base_request_id(raw_request, request.request_id)``
    (vllm/entrypoints/serve/engine/serving.py:133-142; chat_completion/serving.py:321,
    completion/serving.py:147).

    (A named tuple rather than a frozen attrs class, as :class:`~llmsim.api.sse.PlainTokens`:
    every generating request makes one, and a frozen attrs class's ``__init__`` sets
    each field through ``object.__setattr__``, several times the cost.)"""

    request_id: str  # seeds the text RNG of every choice
    response_id: str  # the prefixed id the body reports: "chatcmpl-<id>", "resp_<id>"...
    headers: tuple[tuple[bytes, bytes], ...]

    @classmethod
    def of(cls, call: Call, prefix: str, body_id: str | None = None) -> RequestIdentity:
        given = call.request.header("x-request-id")
        if given:
            return cls(given, prefix + given, ((b"x-request-id", given.encode("latin-1")),))
        if body_id is not None:
            return cls(body_id, prefix + body_id, ())
        request_id = call.ctx.new_request_id()
        return cls(request_id, prefix + request_id, ())


#: llm-d-inference-sim's text for a full waiting queue (429).
WAITING_QUEUE_FULL_MESSAGE = "Failed to enqueue request, waiting requests queue is full"
#: vLLM's ``QueueOverflowError`` text (503, ``vllm/exceptions.py:147-160``).
QUEUE_OVERFLOW_MESSAGE = (
    "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance."
)


def queue_full_error(limit: QueueLimit) -> ApiError:
    """What the client sees when a request hits ``limit``: llm-d-inference-sim's 429
    for ``--max-waiting-queue-length`` (drop-in users rely on it), vLLM's 503 for
    ``--max-num-queued-reqs``: type ``HTTPStatus(503).phrase`` and no param, as
    ``create_error_response`` makes it for a ``GracefulHTTPError``
    (``vllm/entrypoints/serve/exception_handling/error_response.py:38-41``)."""
    if limit is QueueLimit.QUEUED_REQUESTS:
        return ApiError(503, QUEUE_OVERFLOW_MESSAGE, error_type="Service Unavailable")
    return ApiError(429, WAITING_QUEUE_FULL_MESSAGE)


def check_job_count(ctx: ApiContext, job_count: int, n: int | None = None) -> None:
    """The queue checks made before a request is planned.

    First vLLM's admission check (``_preflight``, ``vllm/entrypoints/generate/base/
    serving.py:169-181``): 503 if the request's jobs would take the jobs in flight
    beyond ``--max-num-queued-reqs``.  Then vLLM's limit on ``n`` (the choices per
    prompt, ``job_count`` unless given), a 400 (:func:`check_n_limit`).  Then a 400 at
    once for a request with more choices than the engine could ever hold (running
    slots plus waiting queue): a huge ``n`` must not cost the server minutes of
    planning only to be refused, and a 429 would tell the client to retry.  Nothing
    awaits between this and the submission, so the engine's counts are the same when
    the jobs are submitted.
    """
    engine = ctx.engine
    try:
        engine.check_admission(job_count)
    except QueueFullError as exc:
        raise queue_full_error(exc.limit) from None
    check_n_limit(job_count if n is None else n)
    limits = engine.options
    capacity = limits.max_num_seqs + limits.max_waiting_queue_length
    if job_count > capacity:  # retrying cannot help, so a 400 rather than the queue's 429
        raise ApiError(
            400,
            f"This request asks for {job_count} choices, but the server holds at most {capacity} requests "
            f"(max-num-seqs {limits.max_num_seqs} + max-waiting-queue-length {limits.max_waiting_queue_length}).",
            param="n",
        )


def check_output_volume(ctx: ApiContext, caps: Sequence[int], n: int, top_logprobs: int) -> None:
    """400 when the output asked for, ``n`` choices of each prompt's output cap ``caps``
    times ``1 + top_logprobs`` entries per token, exceeds ``--max-output-volume``:
    a few hundred bytes (n=256, max_tokens 500, top_logprobs 20) must not ask for a
    187 MB body.  Checked once the caps are known, before planning.  -1 is the
    vocabulary; a count beyond what may or can be listed counts as that limit (its
    400 is made as the engine takes the request, :mod:`llmsim.api.logprobs_limit`)."""
    max_logprobs = ctx.model.max_logprobs
    vocab_size = ctx.tokenizer.vocab_size
    top = vocab_size if top_logprobs == -1 else top_logprobs
    top = min(top, vocab_size if max_logprobs == -1 else max_logprobs, MAX_SIMULATED_LOGPROBS)
    volume = n * sum(caps) * (1 + max(top, 0))
    limit = ctx.model.max_output_volume
    if volume > limit:
        raise ApiError(
            400,
            f"This request asks for up to {volume} output entries (n x max_tokens x (1 + top_logprobs)), "
            f"more than max-output-volume ({limit}); lower n, max_tokens or top_logprobs.",
            param="max_tokens",
        )


def build_jobs(plan: GenerationPlan, sink: JobSink, lora: str | None = None) -> list[Job]:
    """One job per choice, in choice-index order; choice ``i`` answers prompt
    ``i // plan.choices_per_prompt``; each runs with the LoRA adapter ``lora``."""
    jobs = []
    prompts, per_prompt = plan.prompts, plan.choices_per_prompt
    group: RequestGroup | None = None
    for index, turn in enumerate(plan.choices):
        prompt = prompts[index // per_prompt]
        if per_prompt > 1 and index % per_prompt == 0:
            group = RequestGroup(per_prompt)  # vLLM: one parent request per prompt, n children
        jobs.append(
            Job(
                prompt_token_ids=prompt.token_ids,
                output=turn.pieces,
                finish_reason=turn.finish_reason,
                sink=sink,
                output_token_ids=turn.token_ids,
                index=index,
                request_id=plan.request_id,
                max_tokens=prompt.output_cap,
                remote_prefill=prompt.remote_prefill,
                cache_hit_threshold=prompt.cache_hit_threshold,
                group=group,
                lora=lora,
                kv_multimodal=prompt.kv_multimodal,
            )
        )
    return jobs


class StreamRenderer(Protocol):
    """An endpoint's event stream: the exact bytes, and the framing they come in."""

    def head(self) -> bytes:
        """The events sent as soon as the 200 is decided, before any token (may be empty)."""

    def render(self, job: Job, start: int, stop: int) -> bytes:
        """The events for one ``on_output`` call of ``job``."""

    def tail(self, jobs: Sequence[Job]) -> bytes:
        """The events after the last job finished (usage, ``[DONE]``...)."""

    def plain_tokens(self) -> PlainTokens | None:
        """How :meth:`render` renders one token in the middle of a choice, if every such
        token is one event around its escaped text (then the sink builds it itself)."""

    def error(self, error: ApiError) -> bytes:
        """The in-band error event(s) that end a stream which failed after it began."""


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
    ``response.write``; ends the response when the last job finished, and then calls
    :attr:`on_end` (once: also when the stream fails, or :meth:`stop` ends it because
    the client went away).

    Backpressure: when the write finds the client's buffer full the job is paused
    (``on_output`` returns False) and resumed through ``resume`` once it drained.

    The per-token case (one token in the middle of a choice, on a renderer with
    :class:`~llmsim.api.sse.PlainTokens`) is built here, without a call into the
    renderer: exactly the bytes its ``render`` would return.  That case has a C twin
    (native/sink.c, installed below): hence the ``__slots__``, which it reads by offset.
    """

    __slots__ = (
        "_ended",
        "_finished",
        "_job_count",
        "_paused",
        "_renderer",
        "_response",
        "_resume",
        "_token_close",
        "_token_opens",
        "on_end",
    )

    def __init__(
        self,
        response: ResponseStream,
        renderer: StreamRenderer,
        job_count: int,
        resume: Callable[[Job], None],
    ) -> None:
        self._ended = False
        #: Called once as the stream ends, however it does (None: nothing to call).
        self.on_end: Callable[[], None] | None = None
        self._response = response
        self._renderer = renderer
        self._job_count = job_count
        self._resume = resume
        self._finished: list[Job] = []
        self._paused: list[Job] = []
        plain = renderer.plain_tokens()
        self._token_opens = plain.opens if plain is not None else None
        self._token_close = plain.close if plain is not None else b""

    @property
    def ended(self) -> bool:
        """The stream ended: every job finished, it failed, or it was stopped."""
        return self._ended

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        if self._ended:
            return True  # the stream already ended (in error); on_end cancels the rest
        try:
            opens = self._token_opens
            if opens is not None and start and stop > start and job.state is _DECODING:
                if stop - start == 1:
                    text = job.output[start]
                    escaped = escaped_piece(text)
                    data = opens[job.index] + (escaped if escaped is not None else escape(text)) + self._token_close
                else:
                    data = self._token_events(opens[job.index], job.output, start, stop)
                if self._response.write(data):
                    return True
                self._pause(job)
                return False
            data = self._renderer.render(job, start, stop)
            if job.state is _FINISHED:
                self._finish(job, data)
                return True
            if not data or self._response.write(data):
                return True
            self._pause(job)
            return False
        except Exception as error:
            self._rendering_failed(job, error)
            return True

    def _token_events(self, opens: bytes, output: Sequence[str], start: int, stop: int) -> bytes:
        """Several tokens in the middle of a choice (a step that came late hands out every
        token due since the last): one plain event each, ``opens + escape(piece) + close``,
        as the renderer's own path for them makes them (one ``join``)."""
        close = self._token_close
        return opens + (close + opens).join(escape_all(output[start:stop])) + close

    def _rendering_failed(self, job: Job, error: Exception) -> None:
        """Never let a rendering bug escape into the engine task: it serves everyone.
        (A method of its own: the C twin calls it with the exception it caught.)"""
        log.error("rendering the stream of %r failed", job, exc_info=error)
        self.fail(ApiError(500, "Internal server error"))

    def fail(self, error: ApiError) -> None:
        """End the stream with the renderer's in-band error event (its 200 is long sent)."""
        if not self._response.closed:
            self._response.end(self._renderer.error(error))
        self._end()

    def stop(self) -> None:
        """End the stream without writing anything (the client went away: the response's
        close callback); a no-op once it ended."""
        if not self._ended:
            self._end()

    def _end(self) -> None:
        self._ended = True
        # The jobs point back at this sink: holding them would leave the request's
        # whole object graph (response stream included) in a reference cycle, for the
        # cycle collector to find; once the stream ended they are needed no more.
        self._finished = []
        self._paused = []
        on_end, self.on_end = self.on_end, None
        if on_end is not None:
            try:
                on_end()
            except Exception:  # (called from the engine's step: never let it escape there)
                log.exception("ending the request of a stream failed")

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


#: The pure-Python ``StreamingSink.on_output``: the reference for its C twin
#: (native/sink.c), which takes the token case and hands every other call to this.
PURE_ON_OUTPUT = StreamingSink.on_output
if (_install := installer("install_streaming_sink")) is not None:
    _install(StreamingSink, Job, _DECODING, escape_cache, escape, PURE_ON_OUTPUT)


class SubmittedJobs:
    """A request's jobs in the engine: :meth:`submit` submits every one, all or none (a
    full waiting queue is a 429); :meth:`leave`, called once whatever ends the request
    (the stream's end or close, the end of a complete answer's wait, cancellation
    included), cancels every job that has not finished, freeing its slot.  ``log``
    (:func:`~llmsim.api.request_log.request_log`; None: no log) gets its lines once the
    jobs are in the engine and as they are left, before that cancelling.  (The engine
    allows ``leave`` from inside a sink call, mid-step: a cancelled job's entry goes stale.)

    ``arrival`` is when the request's first bytes arrived (``HttpRequest.received_at``;
    None: now).  The jobs arrive then, so that the TTFT a client measures does not
    include what reading, parsing and planning took; vLLM's metrics follow (TTFT and
    e2e count from it, queue time stays 0 while a slot is free: see ``Engine.submit``).

    (It holds the log rather than the caller calling it beside: two more calls per request.)
    """

    __slots__ = ("_arrival", "_clock", "_engine", "_jobs", "_left", "_log")

    def __init__(
        self,
        engine: Engine,
        jobs: Sequence[Job],
        clock: Callable[[], float],
        arrival: float | None = None,
        *,
        log: RequestLog | None = None,
    ) -> None:
        self._engine = engine
        self._jobs = jobs
        self._clock = clock
        self._arrival = arrival
        self._log = log
        self._left = False

    def submit(self) -> None:
        """Submit every job (raises, with none left in the engine, if one is refused)."""
        try:
            self._submit()
            if self._log is not None:
                self._log.submitted()
        except BaseException:
            self._cancel_unfinished()
            raise

    def leave(self) -> None:
        """The request leaves its jobs: log it, cancel those not finished.  Only the first call counts."""
        if self._left:
            return
        self._left = True
        try:
            if self._log is not None:
                self._log.left()
        finally:
            self._cancel_unfinished()

    def _submit(self) -> None:
        submit, now = self._engine.submit, self._clock()
        if self._arrival is not None and self._arrival < now:
            now = self._arrival
        try:
            for job in self._jobs:
                submit(job, now)
        except QueueFullError as exc:
            raise queue_full_error(exc.limit) from None

    def _cancel_unfinished(self) -> None:
        now = None  # the clock is read only when a job is left to cancel (a stream ends with none)
        for job in self._jobs:
            if not job.done:
                if now is None:
                    now = self._clock()
                self._engine.cancel(job, now)


def stream(
    call: Call,
    plan: GenerationPlan,
    renderer: StreamRenderer,
    headers: Headers = (),
    *,
    refusal: ApiError | None = None,
    on_end: Callable[[], None] | None = None,
) -> StreamingSink | None:
    """Start ``plan`` as a 200 event stream rendered by ``renderer`` and return at once:
    the jobs are submitted (a full queue raises its error, nothing started) and the head
    is written; the engine's steps write the rest, and the sink ends the response.  The
    jobs left are cancelled as the stream ends or the client goes away; then ``on_end``
    is called, if given.  Returns the stream's sink (its ``stop`` ends the request
    early), or None.

    With a ``refusal`` (what vLLM's engine refuses as it takes the request, such as
    too many logprobs) the stream holds only that error (:func:`stream_error`) and
    None is returned."""
    if refusal is not None:
        stream_error(call, renderer, refusal, headers)
        return None
    ctx = call.ctx
    response = call.response

    def resume(job: Job) -> None:
        ctx.engine.resume(job, ctx.clock())

    sink = StreamingSink(response, renderer, len(plan.choices), resume)
    _, submitted = _submit(call, plan, sink)
    sink.on_end = submitted.leave if on_end is None else _both(submitted.leave, on_end)
    try:
        response.start(200, (*SSE_HEADERS, *headers))
        head = renderer.head()
        if head:
            response.write(head)
    except BaseException:
        sink.stop()
        raise
    response.on_close(sink.stop)  # the client went away: the jobs are cancelled
    return sink


async def stream_to_end(
    call: Call,
    plan: GenerationPlan,
    renderer: StreamRenderer,
    headers: Headers = (),
) -> None:
    """:func:`stream`, and return once the stream ended or the client went away, for a
    handler with work after the stream (or cancelled: then the jobs left are cancelled)."""
    ended = trio.Event()
    sink = stream(call, plan, renderer, headers, on_end=ended.set)
    assert sink is not None  # (None only for a refusal)
    try:
        await ended.wait()
    finally:
        sink.stop()


def _submit(call: Call, plan: GenerationPlan, sink: JobSink) -> tuple[list[Job], SubmittedJobs]:
    """``plan``'s jobs for ``sink``, built and submitted (all or none), arriving when the
    request's first bytes did; with what leaves them."""
    ctx = call.ctx
    jobs = build_jobs(plan, sink, request_adapter())
    submitted = SubmittedJobs(ctx.engine, jobs, ctx.clock, call.request.received_at, log=request_log(ctx, plan, jobs))
    submitted.submit()
    return jobs, submitted


def _both(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        try:
            first()
        finally:
            then()

    return both


def stream_error(call: Call, renderer: StreamRenderer, error: ApiError, headers: Headers = ()) -> None:
    """A 200 event stream that holds only ``error`` (in-band, and ``[DONE]`` where the
    framing has it): what vLLM sends when a streaming request fails as the engine
    takes it, after the response began (e.g. too many logprobs: ``SamplingParams.verify``
    runs in ``AsyncLLM.add_request``, on the stream's first iteration,
    ``vllm/entrypoints/openai/chat_completion/serving.py:572-587,951-953``).  No job
    is submitted."""
    call.response.start(200, (*SSE_HEADERS, *headers))
    call.response.end(renderer.head() + renderer.error(error))


class PendingJobs:
    """A plan's jobs submitted for a complete response (:func:`submit_collected`): their
    submission happens at once, in the handler's synchronous part (right after the queue
    checks, with no wait in between); :meth:`finished` waits for them."""

    __slots__ = ("_response", "_sink", "_submitted", "jobs")

    def __init__(self, call: Call, plan: GenerationPlan) -> None:
        self._response = call.response
        self._sink = sink = CollectingSink(len(plan.choices))
        #: The plan's jobs, in choice-index order (submitted; finished once ``finished`` returned).
        self.jobs, self._submitted = _submit(call, plan, sink)
        # The client went away: finished() returns (the jobs are cancelled on the way out).
        call.response.on_close(sink.done.set)

    async def finished(self) -> list[Job]:
        """The finished jobs, in choice-index order, once the last one finished.  Raises
        :class:`ResponseClosed` as soon as the client went away (the jobs left are
        cancelled however this ends, cancellation included)."""
        try:
            await self._sink.done.wait()
        finally:
            self._submitted.leave()
        if self._response.closed:
            raise ResponseClosed
        return self.jobs


def submit_collected(call: Call, plan: GenerationPlan, *, refusal: ApiError | None = None) -> PendingJobs:
    """Submit ``plan``'s jobs for a complete response (raise ``refusal`` instead, if there
    is one: a complete response gets its status); await ``finished()`` on the result."""
    if refusal is not None:
        raise refusal
    return PendingJobs(call, plan)


async def respond_collected(call: Call, pending: PendingJobs, body: Callable[..., bytes], headers: Headers) -> None:
    """The rest of a non-streaming request once its jobs are submitted: wait for them,
    then answer 200 with ``body(jobs=...)`` as JSON (and ``headers``)."""
    jobs = await pending.finished()
    call.respond(200, body(jobs=jobs), (*JSON_HEADERS, *headers))
