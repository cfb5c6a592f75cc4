"""The exact bytes of POST /inference/v1/generate: vLLM's ``GenerateTokensResponse`` (or
``GenerateTextResponse`` for ``output_mode: "text"``) and its stream.

Non-streaming (vllm/entrypoints/scale_out/token_in_token_out/serving.py:405-628): the
response ``model_dump()`` whole (api_router.py:66-67), every field in declaration order
(protocol.py:606-660), each choice with its token ids, the EOS id included when the
model ended the turn::

    {"request_id":"generate-tokens-<id>","model":"m","created":T,"usage":{…},
     "prompt_logprobs":null,"prompt_token_id_logprobs":null,"prompt_token_ids":null,
     "mm_placeholders":null,"metrics":null,"kv_transfer_params":null,
     "ec_transfer_params":null,"output_mode":"tokens","choices":[{"index":0,
     "finish_reason":"stop","stop_reason":null,"token_ids":[…],"routed_experts":null,
     "sampling_mask":null,"weight_versions":null,"logprobs":null}]}

Streaming (serving.py:630-820): one ``data:`` chunk per choice per engine step with the
step's token ids, dumped without ``prompt_token_ids``/``mm_placeholders``/``metrics``
unless set (the first chunk carries the prompt with ``return_token_ids``), the finish
reason on the chunk of the last token; with ``include_usage`` a ``"choices":[]`` chunk
dumped ``exclude_none``; then ``data: [DONE]``::

    data: {"request_id":"generate-tokens-<id>","usage":null,"output_mode":"tokens","choices":[{"index":0,
      "finish_reason":null,"stop_reason":null,"token_ids":[1234],"routed_experts":null,"sampling_mask":null,
      "weight_versions":null,"logprobs":null}]}
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import orjson

from llmsim.api.errors import ApiError
from llmsim.api.generate.logprobs import GenerateLogprobs
from llmsim.api.plan import stop_reason_of_job
from llmsim.api.sse import DONE_EVENT, PlainTokens, error_events
from llmsim.api.usage import Usage, UsageStyle
from llmsim.engine.job import Job, JobState

__all__ = ["GenerateShape", "GenerateStreamRenderer", "generate_body"]

_FINISHED = JobState.FINISHED
_NOT_FINISHED = b',"finish_reason":null,"stop_reason":null'
_CHOICE_NULLS = b',"routed_experts":null,"sampling_mask":null,"weight_versions":null'
_CHUNK_END = b',"logprobs":null}]}\n\n'


@attrs.frozen(kw_only=True)
class GenerateShape:
    """What a generate response says besides its tokens."""

    request_id: str
    text_mode: bool  # output_mode "text": each choice carries its text too
    stop_reasons: Sequence[str | int | None]
    usage_style: UsageStyle
    prompt_token_ids: Sequence[int] | None = None  # set with return_token_ids
    mm_placeholders: dict[str, object] | None = None  # the features' ranges, with return_token_ids
    logprobs: GenerateLogprobs | None = None  # sampling_params.logprobs asked for them

    def choice(self, job: Job, start: int, stop: int, finish_reason: str | None) -> dict[str, object]:
        """One choice (or one step of it), ``GenerateChoiceBase`` then the mode's fields."""
        choice: dict[str, object] = {
            "index": job.index,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason_of_job(job, self.stop_reasons) if finish_reason is not None else None,
            "token_ids": list(job.output_token_ids[start:stop]),
            "routed_experts": None,
            "sampling_mask": None,
            "weight_versions": None,
        }
        if self.text_mode:
            choice["text"] = "".join(job.output[start:stop])
        choice["logprobs"] = None if self.logprobs is None else self.logprobs.of(job, start, stop)
        return choice

    @property
    def output_mode(self) -> str:
        return "text" if self.text_mode else "tokens"


def generate_body(
    shape: GenerateShape,
    *,
    model: str,
    created: int,
    jobs: Sequence[Job],
    kv_transfer_params: dict[str, object] | None,
    ec_transfer_params: dict[str, object] | None = None,
) -> bytes:
    """The complete response of a request whose jobs all finished."""
    usage = Usage.of(jobs, len(jobs))
    body = {
        "request_id": shape.request_id,
        "model": model,
        "created": created,
        "usage": usage.body_dict(shape.usage_style),
        "prompt_logprobs": None,
        "prompt_token_id_logprobs": None,
        "prompt_token_ids": None if shape.prompt_token_ids is None else list(shape.prompt_token_ids),
        "mm_placeholders": shape.mm_placeholders,
        "metrics": None,
        "kv_transfer_params": kv_transfer_params,
        "ec_transfer_params": ec_transfer_params,
        "output_mode": shape.output_mode,
        # finish_reason "or 'stop'" (serving.py:495): a finished job always has one
        "choices": [shape.choice(job, 0, job.emitted, job.finish_reason) for job in jobs],  # ended early: less
    }
    return orjson.dumps(body)


class GenerateStreamRenderer:
    """The :class:`~llmsim.api.generation.StreamRenderer` of a generate stream."""

    def __init__(self, shape: GenerateShape, *, include_usage: bool, continuous_usage: bool) -> None:
        self._shape = shape
        self._include_usage = include_usage
        self._continuous = continuous_usage
        self._prompt_pending = shape.prompt_token_ids is not None  # the first chunk carries it
        # The common chunk (no usage, prompt or logprobs) from byte templates: it is the
        # per-token path.  The same bytes as the dict below, which the tests pin.
        self._plain = not continuous_usage and shape.logprobs is None
        self._head = b'data: {"request_id":%s,"usage":null,"output_mode":"%s","choices":[{"index":' % (
            orjson.dumps(shape.request_id),
            shape.output_mode.encode(),
        )

    def head(self) -> bytes:
        return b""

    def render(self, job: Job, start: int, stop: int) -> bytes:
        finished = job.state is _FINISHED
        if start == stop and not finished:
            return b""
        if self._plain and not self._prompt_pending:
            return self._plain_chunk(job, start, stop, finished)
        shape = self._shape
        chunk: dict[str, object] = {"request_id": shape.request_id, "usage": None}
        if self._continuous:
            prompt, done = job.prompt_tokens, stop
            chunk["usage"] = {
                "prompt_tokens": prompt,
                "total_tokens": prompt + done,
                "completion_tokens": done,
                "prompt_tokens_details": None,
                "completion_tokens_details": None,
            }
        if self._prompt_pending:
            self._prompt_pending = False
            chunk["prompt_token_ids"] = list(shape.prompt_token_ids or ())
            chunk["mm_placeholders"] = shape.mm_placeholders
        chunk["output_mode"] = shape.output_mode
        chunk["choices"] = [shape.choice(job, start, stop, job.finish_reason if finished else None)]
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def _plain_chunk(self, job: Job, start: int, stop: int, finished: bool) -> bytes:
        ending = _NOT_FINISHED
        if finished:
            reason = stop_reason_of_job(job, self._shape.stop_reasons)
            ending = b',"finish_reason":%s,"stop_reason":%s' % (orjson.dumps(job.finish_reason), orjson.dumps(reason))
        text = b',"text":' + orjson.dumps("".join(job.output[start:stop])) if self._shape.text_mode else b""
        ids = orjson.dumps(job.output_token_ids[start:stop])
        return b'%s%d%s,"token_ids":%s%s%s' % (self._head, job.index, ending, ids, _CHOICE_NULLS, text + _CHUNK_END)

    def plain_tokens(self) -> PlainTokens | None:
        return None

    def tail(self, jobs: Sequence[Job]) -> bytes:
        if not self._include_usage:
            return DONE_EVENT
        usage = Usage.of(jobs, len(jobs)).chunk_dict(self._shape.usage_style)
        chunk = {"request_id": self._shape.request_id, "usage": usage, "output_mode": self._shape.output_mode}
        return b"data: " + orjson.dumps({**chunk, "choices": []}) + b"\n\n" + DONE_EVENT

    def error(self, error: ApiError) -> bytes:
        """``create_streaming_error_response`` (``json.dumps``, vllm/entrypoints/generate/base/
        serving.py:183-198) then ``[DONE]`` (token_in_token_out/serving.py:812-820)."""
        return error_events(error)
