"""The exact bytes of /v1/chat/completions: stream chunks and the complete response.

Streams follow vLLM 0.29 (captured on the wire) without ``system_fingerprint``::

    data: {"id":"chatcmpl-…","object":"chat.completion.chunk","created":T,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}
    data: {…,"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,"token_ids":null}]}
    data: {…,"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}]}
    data: {…,"choices":[],"usage":{"prompt_tokens":…,"total_tokens":…,"completion_tokens":…,"prompt_tokens_details":{"cached_tokens":…}}}
    data: [DONE]

The role chunk of a choice goes out with its first token (after TTFT), the usage chunk
only with ``stream_options.include_usage``.  Each chunk carries one choice.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmsim.api.sse import DONE_EVENT, escape, escape_uncached, json_bytes
from llmsim.api.usage import Usage
from llmsim.engine.job import Job, JobState

__all__ = ["ChatStreamRenderer", "chat_completion_body"]

_ROLE_DELTA = b',"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n'
_CONTENT_OPEN = b',"delta":{"content":"'
_TOKEN_CLOSE = b'"},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
_ECHO_CLOSE = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
_FINISH_OPEN = b',"delta":{"content":""},"logprobs":null,"finish_reason":'
_FINISH_CLOSE = b',"stop_reason":null,"token_ids":null}]}\n\n'
_FINISHED = JobState.FINISHED  # a module global: enum member lookups cost on the per-token path


class ChatStreamRenderer:
    """Renders one streaming chat request's jobs (one job per choice) into SSE bytes."""

    def __init__(
        self,
        *,
        response_id: str,
        created: int,
        model: str,
        choices: int,
        include_usage: bool,
        echo: str | None = None,
    ) -> None:
        head = (
            b'data: {"id":' + json_bytes(response_id) + b',"object":"chat.completion.chunk","created":'
            + str(created).encode() + b',"model":' + json_bytes(model) + b","
        )
        self._choice_heads = [head + b'"choices":[{"index":' + str(i).encode() for i in range(choices)]
        self._token_opens = [choice_head + _CONTENT_OPEN for choice_head in self._choice_heads]
        self._token_joiners = [_TOKEN_CLOSE + token_open for token_open in self._token_opens]
        self._usage_head = head + b'"choices":[],"usage":'
        self._include_usage = include_usage
        self._echo = None if echo is None else escape_uncached(echo)

    def render(self, job: Job, start: int, stop: int) -> bytes:
        """The events for ``job.output[start:stop]``: the role chunk (and the echoed
        assistant prefix) on the first call, a chunk per token, the finish chunk last."""
        index = job.index
        if start and stop - start == 1 and job.state is not _FINISHED:  # the common case: one more token
            return self._token_opens[index] + escape(job.output[start]) + _TOKEN_CLOSE
        events = []
        if start == 0:
            events.append(self._choice_heads[index] + _ROLE_DELTA)
            if self._echo is not None:
                events.append(self._token_opens[index] + self._echo + _ECHO_CLOSE)
        if stop > start:
            pieces = [escape(piece) for piece in job.output[start:stop]]
            events.append(self._token_opens[index] + self._token_joiners[index].join(pieces) + _TOKEN_CLOSE)
        if job.state is _FINISHED:
            events.append(self._choice_heads[index] + _FINISH_OPEN + json_bytes(job.finish_reason) + _FINISH_CLOSE)
        return b"".join(events)

    def tail(self, jobs: Sequence[Job]) -> bytes:
        """After the last choice finished: the usage chunk if asked for, then [DONE]."""
        if not self._include_usage:
            return DONE_EVENT
        usage = Usage.of(jobs, choices_per_prompt=len(self._choice_heads))
        return self._usage_head + json_bytes(usage.as_dict()) + b"}\n\n" + DONE_EVENT


def chat_completion_body(
    *,
    response_id: str,
    created: int,
    model: str,
    jobs: Sequence[Job],
    echo: str | None = None,
) -> bytes:
    """The non-streaming response, in vLLM 0.26's shape (every field, nulls included)."""
    prefix = echo or ""
    choices = [
        {
            "index": job.index,
            "message": {
                "role": "assistant",
                "content": prefix + "".join(job.output),
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            },
            "logprobs": None,
            "finish_reason": job.finish_reason,
            "stop_reason": None,
            "token_ids": None,
            "routed_experts": None,
        }
        for job in sorted(jobs, key=lambda job: job.index)
    ]
    return json_bytes(
        {
            "id": response_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": Usage.of(jobs, choices_per_prompt=len(jobs)).as_dict(),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )
