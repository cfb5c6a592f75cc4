"""The generation flow for endpoints whose jobs are planned by the endpoint itself and
whose streams have their own framing (``event: <type>`` lines): /v1/responses and
/v1/messages.

It is :mod:`llmsim.api.generation`'s flow (all jobs submitted before the response
starts, so a full queue is a real 429; the job's first event rendered with its first
token; client loss cancels the jobs) with two additions an event-typed stream needs:

* ``head()``: bytes written right after the 200 is decided, before any token
  (``response.created``/``response.in_progress`` of /v1/responses, which vLLM sends
  at once).
* ``error(error)``: the in-band error that ends a stream which failed after it began
  (``event: error`` in the endpoint's own shape, not chat's ``data: {"error"}`` +
  ``[DONE]``).

These endpoints have one job per request (no ``n``); it comes from the caller
(``make_job(sink)``) because these endpoints plan more than
random text: tool-call arguments and schema-valid JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from llmsim.api.context import Call
from llmsim.api.errors import ApiError
from llmsim.api.generation import (
    CollectingSink,
    StreamingSink,
    StreamRenderer,
    SubmittedJobs,
)
from llmsim.api.http import Headers
from llmsim.api.sse import SSE_HEADERS
from llmsim.engine.job import Job, JobSink

__all__ = ["EventStreamRenderer", "EventStreamingSink", "collect_job", "event_bytes", "stream_job"]


def event_bytes(event_type: str, data: bytes) -> bytes:
    """One ``event: <type>\\ndata: <json>\\n\\n`` frame (LF LF, as vLLM frames them)."""
    return b"event: " + event_type.encode() + b"\ndata: " + data + b"\n\n"


class EventStreamRenderer(StreamRenderer, Protocol):
    """A :class:`~llmsim.api.generation.StreamRenderer` with a head and an error frame."""

    def head(self) -> bytes:
        """The events sent as soon as the stream starts (may be empty)."""

    def error(self, error: ApiError) -> bytes:
        """The in-band error event that ends a stream after it started."""


class EventStreamingSink(StreamingSink):
    """:class:`~llmsim.api.generation.StreamingSink` whose in-band error is the
    renderer's own event."""

    _renderer: EventStreamRenderer

    def _error_bytes(self, error: ApiError) -> bytes:
        return self._renderer.error(error)


async def stream_job(
    call: Call,
    make_job: Callable[[JobSink], Job],
    renderer: EventStreamRenderer,
    headers: Headers = (),
) -> Job:
    """Run the request's one job as a 200 event stream; return it once the stream ended."""
    ctx = call.ctx

    def resume(job: Job) -> None:
        ctx.engine.resume(job, ctx.clock())

    sink = EventStreamingSink(call.response, renderer, 1, resume)
    job = make_job(sink)
    with SubmittedJobs(ctx.engine, (job,), ctx.clock):
        call.response.start(200, (*SSE_HEADERS, *headers))
        head = renderer.head()
        if head:
            call.response.write(head)
        await sink.done.wait()
    return job


async def collect_job(call: Call, make_job: Callable[[JobSink], Job]) -> Job:
    """Run the request's one job to the end (non-streaming) and return it."""
    ctx = call.ctx
    sink = CollectingSink(1)
    job = make_job(sink)
    with SubmittedJobs(ctx.engine, (job,), ctx.clock):
        await sink.done.wait()
    return job
