"""The exact bytes of /v1/completions: stream chunks and the complete response.

Streams follow the vLLM ≈0.20 capture: every chunk dumps every field, ``usage`` null
included, there is no role chunk, and ``finish_reason`` rides on the chunk of the last
token::

    data: {"id":"cmpl-…","object":"text_completion","created":T,"model":"m","choices":[{"index":0,"text":" and","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}

then, with ``stream_options.include_usage``, a ``"choices":[]`` usage chunk, then
``data: [DONE]``.  Choice ``i`` answers prompt ``i // n``; with ``echo: true`` its
first chunk starts with that prompt's text.  With ``logprobs`` each chunk carries the
logprobs of its tokens (the echoed prompt's too) instead of ``null``.  An error after
the stream began ends it with vLLM's ``data: {"error": …}`` and ``[DONE]``.
"""  # noqa: E501 (the chunk above is quoted whole)

from __future__ import annotations

from collections.abc import Sequence

from llmsim.api.errors import ApiError
from llmsim.api.logprobs_format import CompletionLogprobs
from llmsim.api.sse import DONE_EVENT, chunk_head, error_events, escape, escape_uncached, json_bytes
from llmsim.api.usage import Usage
from llmsim.engine.job import Job, JobState

__all__ = ["CompletionStreamRenderer", "completion_body"]

_TEXT_OPEN = b',"text":"'
_LOGPROBS_KEY = b'","logprobs":'
_REASON_KEY = b',"finish_reason":'
_CHOICE_TAIL = b',"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}\n\n'
_UNFINISHED = _REASON_KEY + b"null" + _CHOICE_TAIL
_TOKEN_CLOSE = _LOGPROBS_KEY + b"null" + _UNFINISHED
_FINISH_OPEN = _LOGPROBS_KEY + b"null" + _REASON_KEY
_FINISHED = JobState.FINISHED  # a module global: enum member lookups cost on the per-token path


class CompletionStreamRenderer:
    """Renders one streaming completions request's jobs into SSE bytes."""

    def __init__(
        self,
        *,
        response_id: str,
        created: int,
        model: str,
        choices: int,
        choices_per_prompt: int,
        include_usage: bool,
        echo_prompts: Sequence[str] | None = None,
        logprobs: CompletionLogprobs | None = None,
    ) -> None:
        head = chunk_head(response_id, b'"text_completion"', created, model)
        # One plain loop, not a comprehension per list: this runs once per request.
        self._text_opens: list[bytes] = []
        self._text_joiners: list[bytes] = []
        for i in range(choices):
            text_open = head + b'"choices":[{"index":' + str(i).encode() + _TEXT_OPEN
            self._text_opens.append(text_open)
            self._text_joiners.append(_TOKEN_CLOSE + text_open)
        self._usage_head = head + b'"choices":[],"usage":'
        self._choices_per_prompt = choices_per_prompt
        self._include_usage = include_usage
        self._echo_prompts = None if echo_prompts is None else [escape_uncached(text) for text in echo_prompts]
        self._logprobs = logprobs

    def head(self) -> bytes:
        return b""  # nothing goes out before the first token

    def render(self, job: Job, start: int, stop: int) -> bytes:
        """One chunk per token of ``job.output[start:stop]``; the last token's chunk
        carries the finish_reason (a job with no tokens still gets that one chunk)."""
        index = job.index
        finished = job.state is _FINISHED
        if start and stop - start == 1 and not finished and self._logprobs is None:  # the common case
            return self._text_opens[index] + escape(job.output[start]) + _TOKEN_CLOSE
        texts = [escape(piece) for piece in job.output[start:stop]]
        if start == 0 and self._echo_prompts is not None:
            prompt = self._echo_prompts[index // self._choices_per_prompt]
            texts[:1] = [prompt + (texts[0] if texts else b"")]
        if not texts:
            if not finished:
                return b""
            texts = [b""]
        if self._logprobs is not None:
            return self._with_logprobs(job, start, stop, texts, self._logprobs, finished)
        close = _FINISH_OPEN + json_bytes(job.finish_reason) + _CHOICE_TAIL if finished else _TOKEN_CLOSE
        return self._text_opens[index] + self._text_joiners[index].join(texts) + close

    def _with_logprobs(
        self, job: Job, start: int, stop: int, texts: list[bytes], logprobs: CompletionLogprobs, finished: bool
    ) -> bytes:
        """One chunk per text, each with the logprobs of its token (the first with the
        echoed prompt's, an empty finishing chunk with none)."""
        text_open = self._text_opens[job.index]
        last = len(texts) - 1
        chunks = []
        for k, text in enumerate(texts):
            position = start + k
            values = logprobs.chunk_bytes(job, position, min(position + 1, stop))
            tail = _REASON_KEY + json_bytes(job.finish_reason) + _CHOICE_TAIL if finished and k == last else _UNFINISHED
            chunks.append(text_open + text + _LOGPROBS_KEY + values + tail)
        return b"".join(chunks)

    def tail(self, jobs: Sequence[Job]) -> bytes:
        """After the last choice finished: the usage chunk if asked for, then [DONE]."""
        if not self._include_usage:
            return DONE_EVENT
        usage = Usage.of(jobs, self._choices_per_prompt)
        return self._usage_head + json_bytes(usage.as_dict()) + b"}\n\n" + DONE_EVENT

    def error(self, error: ApiError) -> bytes:
        return error_events(error)


def completion_body(
    *,
    response_id: str,
    created: int,
    model: str,
    jobs: Sequence[Job],
    choices_per_prompt: int,
    echo_prompts: Sequence[str] | None = None,
    logprobs: CompletionLogprobs | None = None,
) -> bytes:
    """The non-streaming response, in vLLM 0.23's shape (every field, nulls included)."""

    def text_of(job: Job) -> str:
        text = "".join(job.output)
        if echo_prompts is None:
            return text
        return echo_prompts[job.index // choices_per_prompt] + text

    choices = [
        {
            "index": job.index,
            "text": text_of(job),
            "logprobs": None if logprobs is None else logprobs.of(job),
            "finish_reason": job.finish_reason,
            "stop_reason": None,
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "routed_experts": None,
        }
        for job in sorted(jobs, key=lambda job: job.index)
    ]
    return json_bytes(
        {
            "id": response_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": Usage.of(jobs, choices_per_prompt).as_dict(),
            "kv_transfer_params": None,
        }
    )
