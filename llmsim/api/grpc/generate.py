"""``VllmEngine.Generate``: token ids (or text) in, token ids out, planned and paced by
the same flow as ``/inference/v1/generate`` (:mod:`llmsim.api.generate.routes`).

The messages are those of vLLM's servicer (smg-grpc-servicer 0.14.1,
``smg_grpc_servicer/vllm/servicer.py:379-647``, ``_chunk_response`` :1364-1434,
``_complete_response`` :1436-1534):

* streaming: per engine step and choice, a ``GenerateStreamChunk`` with that step's
  token ids (``completion_tokens`` is their count, the delta); when the choice
  finishes, its last chunk is followed by a ``GenerateComplete`` carrying that same
  last delta, the finish reason and the matched stop;
* not streaming: one ``GenerateComplete`` per choice with all its token ids, once every
  choice finished;
* ``Abort`` of a running call: each unfinished choice ends with ``finish_reason
  "abort"`` and status OK, as vLLM's output processor ends an aborted request
  (``vllm/v1/engine/output_processor.py:637-652``): streaming, an empty chunk and an
  empty ``GenerateComplete``; not streaming, the tokens produced so far.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from llmsim.api.context import ApiContext, Call
from llmsim.api.errors import ApiError, validation_error
from llmsim.api.failures import check_injected_failure
from llmsim.api.generation import PendingJobs, check_job_count, check_output_volume, stream_to_end
from llmsim.api.grpc.response import GrpcResponse
from llmsim.api.grpc.wire import GrpcError, StatusCode, frame, status_for_http
from llmsim.api.plan import (
    GenerationPlan,
    PromptPlan,
    check_min_tokens,
    output_cap,
    plan_text_choices,
    stop_reason_of_job,
)
from llmsim.api.prompts import check_prompt_length
from llmsim.api.sse import PlainTokens
from llmsim.api.stops import StopRule
from llmsim.engine.job import Job, JobState
from llmsim.model.text import FinishReason

__all__ = ["GenerateCall", "plan_generate"]

_FINISHED = JobState.FINISHED


def plan_generate(ctx: ApiContext, request: Any) -> GenerationPlan:
    """The plan of a ``GenerateRequest``, or the ApiError vLLM's checks give (a 400 is
    INVALID_ARGUMENT).  Sampling fields the simulator has no use for (temperature,
    penalties, seed, logit_bias, structured-output constraints, logprobs) are read and
    ignored; the text comes from the request id, as on every endpoint."""
    params = request.sampling_params
    n = params.n or 1  # proto3's 0 is "unset": vLLM's SamplingParams default
    check_job_count(ctx, n)
    max_num_seqs = ctx.engine.options.max_num_seqs
    if n > max_num_seqs:
        raise ApiError(400, f"n must be at most the server's max_num_seqs ({max_num_seqs}), got {n}.")
    prompt = _prompt_ids(ctx, request)
    max_model_len = ctx.model.max_model_len
    check_prompt_length(max_model_len, len(prompt), prompt_is_text=False)
    max_tokens = params.max_tokens if params.HasField("max_tokens") else None
    cap = output_cap(ctx, len(prompt), max_tokens)
    check_min_tokens(params.min_tokens, cap)
    check_output_volume(ctx, (cap,), n, 0)
    request_id = request.request_id or ctx.new_request_id()
    stop = None
    if params.stop or params.stop_token_ids:
        stop = StopRule(
            tuple(params.stop), frozenset(params.stop_token_ids), params.include_stop_str_in_output, params.min_tokens
        )
    turns = plan_text_choices(
        ctx,
        request_id,
        ((len(prompt), ctx.tokenizer.decode(prompt)),),  # echo mode replays the prompt
        choices_per_prompt=n,
        max_tokens=max_tokens,
        ignore_eos=params.ignore_eos,
        min_tokens=params.min_tokens,
        stop=stop,
        prompt_ids=(prompt,),
    )
    return GenerationPlan(request_id, (PromptPlan(prompt, cap),), turns, n)


def _prompt_ids(ctx: ApiContext, request: Any) -> tuple[int, ...]:
    kind = request.WhichOneof("input")
    if kind == "tokenized":
        prompt = tuple(request.tokenized.input_ids)
    elif kind == "text":
        prompt = tuple(ctx.tokenizer.encode(request.text))
    else:
        raise GrpcError(StatusCode.INVALID_ARGUMENT, "GenerateRequest needs an input: tokenized or text")
    if not prompt:  # vllm/v1/engine/input_processor.py: _validate_model_input
        raise validation_error("The decoder prompt cannot be empty")
    highest = max(prompt)
    if highest >= ctx.tokenizer.vocab_size:  # vllm/renderers/base.py:453-490
        raise validation_error(f"Token id {highest} is out of vocabulary")
    return prompt


def _complete(job: Job, token_ids: Sequence[int], stop_reasons: Sequence[str | int | None]) -> bytes:
    """A framed ``GenerateResponse{complete}`` for ``job`` with ``token_ids``."""
    matched: dict[str, int | str] = {}
    reason = stop_reason_of_job(job, stop_reasons) if job.state is _FINISHED else None
    if isinstance(reason, int):
        matched["matched_token_id"] = reason
    elif isinstance(reason, str):
        matched["matched_stop_str"] = reason
    finish_reason = job.finish_reason if job.state is _FINISHED else FinishReason.ABORT
    complete = pb.GenerateComplete(
        output_ids=token_ids,
        finish_reason=finish_reason,
        prompt_tokens=job.prompt_tokens,
        completion_tokens=len(token_ids),
        cached_tokens=job.cached_tokens,
        index=job.index,
        **matched,
    )
    return frame(pb.GenerateResponse(complete=complete).SerializeToString())


@functools.lru_cache(maxsize=1 << 16)
def _varint(value: int) -> bytes:
    """Protobuf's varint (remembered: token ids and counts repeat)."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _chunk(job: Job, token_ids: Sequence[int]) -> bytes:
    """A framed ``GenerateResponse{chunk: GenerateStreamChunk{token_ids, prompt_tokens,
    completion_tokens (the delta, as vLLM's servicer sends it), cached_tokens, index}}``,
    encoded by hand: the per-token path, several times cheaper than building the
    messages.  The same bytes as protobuf's ``SerializeToString`` (fields in number
    order, zeros left out, ``token_ids`` packed), which the tests check."""
    ids = b"".join([_varint(token) for token in token_ids])
    cached, index = job.cached_tokens, job.index
    chunk = b"%s\x10%s%s%s%s" % (
        b"\x0a" + _varint(len(ids)) + ids if ids else b"",
        _varint(job.prompt_tokens),  # never 0: an empty prompt is refused
        b"\x18" + _varint(len(token_ids)) if token_ids else b"",
        b"\x20" + _varint(cached) if cached else b"",
        b"\x38" + _varint(index) if index else b"",
    )
    return frame(b"\x0a" + _varint(len(chunk)) + chunk)


class GenerateStreamRenderer:
    """The :class:`~llmsim.api.generation.StreamRenderer` of a streaming Generate: framed
    protobuf messages instead of SSE events, and errors as the call's status."""

    def __init__(self, response: GrpcResponse, stop_reasons: Sequence[str | int | None]) -> None:
        self._response = response
        self._stop_reasons = stop_reasons
        self.jobs: dict[int, Job] = {}  # every choice seen so far, by index
        self.finished: set[int] = set()

    def head(self) -> bytes:
        return b""

    def render(self, job: Job, start: int, stop: int) -> bytes:
        finished = job.state is _FINISHED
        self.jobs[job.index] = job
        if start == stop and not finished:
            return b""
        ids = job.output_token_ids[start:stop]
        data = _chunk(job, ids)
        if finished:
            self.finished.add(job.index)
            data += _complete(job, ids, self._stop_reasons)
        return data

    def plain_tokens(self) -> PlainTokens | None:
        return None

    def tail(self, jobs: Sequence[Job]) -> bytes:
        return b""

    def error(self, error: ApiError) -> bytes:
        self._response.set_status(status_for_http(error.status), error.message)
        return b""

    def aborted(self, plan: GenerationPlan) -> bytes:
        """The messages that end every unfinished choice of an aborted call (a choice
        with no output yet has no job seen here: its counts come from the plan)."""
        prompt_tokens = len(plan.prompts[0].token_ids)
        messages = []
        for index in range(len(plan.choices)):
            if index in self.finished:
                continue
            job = self.jobs.get(index)
            counts = {"prompt_tokens": prompt_tokens, "cached_tokens": job.cached_tokens if job else 0, "index": index}
            chunk = pb.GenerateResponse(chunk=pb.GenerateStreamChunk(**counts))
            complete = pb.GenerateResponse(complete=pb.GenerateComplete(finish_reason=FinishReason.ABORT, **counts))
            messages.append(frame(chunk.SerializeToString()) + frame(complete.SerializeToString()))
        return b"".join(messages)


class GenerateCall:
    """One Generate call: run its plan, streaming or not; :meth:`abort` ends it as
    ``VllmEngine.Abort`` does (see the module docstring)."""

    def __init__(self, call: Call, response: GrpcResponse, request: Any) -> None:
        self._call = call
        self._response = response
        self._request = request
        self._jobs: list[Job] = []
        self._plan: GenerationPlan | None = None
        self._renderer: GenerateStreamRenderer | None = None

    async def run(self) -> None:
        call, request = self._call, self._request
        check_injected_failure(call)  # X-Return-Error as call metadata, --failure-injection-rate
        plan = self._plan = plan_generate(call.ctx, request)
        stop_reasons = [turn.stop_reason for turn in plan.choices]
        if request.stream:
            self._renderer = GenerateStreamRenderer(self._response, stop_reasons)
            await stream_to_end(Call(call.ctx, call.request, self._response), plan, self._renderer)
            return
        pending = PendingJobs(Call(call.ctx, call.request, self._response), plan)
        self._jobs = pending.jobs  # (what abort() answers with, should Abort cancel the wait)
        await pending.finished()
        self._respond(stop_reasons)

    def _respond(self, stop_reasons: Sequence[str | int | None]) -> None:
        body = b"".join(_complete(job, job.output_token_ids[: job.emitted], stop_reasons) for job in self._jobs)
        self._response.start(200, ())
        self._response.end(body)

    def abort(self) -> None:
        """End the call after its run was cancelled by ``Abort`` (its jobs are cancelled)."""
        response = self._response
        if response.ended:
            return
        if self._renderer is not None and self._plan is not None:
            if not response.started:
                response.start(200, ())
            response.end(self._renderer.aborted(self._plan))
        elif self._jobs:
            self._respond([None] * len(self._jobs))
        else:
            response.finish(StatusCode.CANCELLED, "Request aborted")
