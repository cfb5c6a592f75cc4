"""The exact bytes of /v1/chat/completions: stream chunks and the complete response.

Streams follow vLLM 0.29 (captured on the wire) without ``system_fingerprint``::

    data: {"id":"chatcmpl-…","object":"chat.completion.chunk","created":T,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}
    data: {…,"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,"token_ids":null}]}
    data: {…,"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}]}
    data: {…,"choices":[],"usage":{"prompt_tokens":…,"total_tokens":…,"completion_tokens":…,"prompt_tokens_details":{"cached_tokens":…}}}
    data: [DONE]

The role chunk of a choice goes out with its first token (after TTFT), the usage chunk
only with ``stream_options.include_usage``.  Each chunk carries one choice.

A choice that calls tools streams, after its role chunk, per call one header chunk
``"delta":{"tool_calls":[{"id":…,"type":"function","index":k,"function":{"name":…}}]}``
(no ``arguments`` key; sent with the call's first token) and then one chunk per
argument token, ``"delta":{"tool_calls":[{"index":k,"function":{"arguments":"…"}}]}``:
id, type and name are never repeated, since the openai SDK's ``.stream()`` helper
concatenates every string it sees twice.  Its finish chunk says ``tool_calls``.  With
``logprobs`` each token's chunk carries ``{"content":[<entry>]}`` instead of ``null``.
An error after the stream began ends it with vLLM's ``data: {"error": …}`` and ``[DONE]``.
"""  # noqa: E501 (the chunks above are quoted whole)

from __future__ import annotations

from collections.abc import Sequence

import attrs

from llmsim.api.errors import ApiError
from llmsim.api.logprobs_format import ChatLogprobs
from llmsim.api.plan import Block
from llmsim.api.sse import DONE_EVENT, chunk_head, error_events, escape, escape_uncached, json_bytes
from llmsim.api.usage import Usage
from llmsim.engine.job import Job, JobState

__all__ = ["ChatStreamRenderer", "chat_completion_body"]

_ROLE_DELTA = (
    b',"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
    b'"prompt_token_ids":null,"prompt_text":null}\n\n'
)
_CONTENT_OPEN = b',"delta":{"content":"'
_CONTENT_CLOSE = b'"},"logprobs":'
_CHUNK_TAIL = b',"finish_reason":null,"token_ids":null}]}\n\n'
_TOKEN_CLOSE = _CONTENT_CLOSE + b"null" + _CHUNK_TAIL
_CALL_OPEN = b',"delta":{"tool_calls":[{"index":'
_ARGUMENTS_OPEN = b',"function":{"arguments":"'
_ARGUMENTS_CLOSE = b'"}}]},"logprobs":'
_ECHO_CLOSE = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
_FINISH_OPEN = b',"delta":{"content":""},"logprobs":null,"finish_reason":'
_FINISH_CLOSE = b',"stop_reason":null,"token_ids":null}]}\n\n'
_FINISHED = JobState.FINISHED  # a module global: enum member lookups cost on the per-token path


@attrs.frozen
class _CallChunks:
    """One choice's tool calls, pre-rendered: the header chunk of each call (keyed by
    its first token) and, per token, its argument chunk up to the token's text."""

    headers: dict[int, bytes]
    opens: tuple[bytes, ...]

    @classmethod
    def of(cls, choice_head: bytes, calls: Sequence[Block]) -> _CallChunks:
        headers = {}
        opens: list[bytes] = []
        for k, call in enumerate(calls):
            headers[call.start] = (
                choice_head
                + b',"delta":{"tool_calls":[{"id":'
                + json_bytes(call.call_id)
                + b',"type":"function","index":'
                + str(k).encode()
                + b',"function":{"name":'
                + json_bytes(call.name)
                + b'}}]},"logprobs":null'
                + _CHUNK_TAIL
            )
            opens.extend([choice_head + _CALL_OPEN + str(k).encode() + _ARGUMENTS_OPEN] * (call.stop - call.start))
        return cls(headers, tuple(opens))


class ChatStreamRenderer:
    """Renders one streaming chat request's jobs (one job per choice) into SSE bytes.

    ``tool_calls[i]`` are the calls choice ``i`` makes (its output pieces are their
    arguments; empty: the choice answers with text); ``logprobs`` adds each token's
    logprobs to its chunk.
    """

    def __init__(
        self,
        *,
        response_id: str,
        created: int,
        model: str,
        choices: int,
        include_usage: bool,
        echo: str | None = None,
        tool_calls: Sequence[Sequence[Block]] | None = None,
        logprobs: ChatLogprobs | None = None,
    ) -> None:
        head = chunk_head(response_id, b'"chat.completion.chunk"', created, model)
        # One plain loop, not a comprehension per list: this runs once per request.
        self._choice_heads: list[bytes] = []
        self._token_opens: list[bytes] = []
        self._token_joiners: list[bytes] = []
        for i in range(choices):
            choice_head = head + b'"choices":[{"index":' + str(i).encode()
            self._choice_heads.append(choice_head)
            self._token_opens.append(choice_head + _CONTENT_OPEN)
            self._token_joiners.append(_TOKEN_CLOSE + choice_head + _CONTENT_OPEN)
        self._usage_head = head + b'"choices":[],"usage":'
        self._include_usage = include_usage
        self._echo = None if echo is None else escape_uncached(echo)
        self._calls = None if tool_calls is None else self._call_chunks(tool_calls)
        self._logprobs = logprobs
        self._plain = tool_calls is None and logprobs is None  # every chunk a bare text token

    def _call_chunks(self, tool_calls: Sequence[Sequence[Block]]) -> list[_CallChunks | None]:
        """Per choice, its pre-rendered tool-call chunks (None: it answers with text)."""
        return [
            _CallChunks.of(choice_head, calls) if calls else None
            for choice_head, calls in zip(self._choice_heads, tool_calls, strict=True)
        ]

    def head(self) -> bytes:
        return b""  # the role chunk goes out with the first token, after TTFT

    def render(self, job: Job, start: int, stop: int) -> bytes:
        """The events for ``job.output[start:stop]``: the role chunk (and the echoed
        assistant prefix) on the first call, a chunk per token, the finish chunk last."""
        index = job.index
        if self._plain and start and stop - start == 1 and job.state is not _FINISHED:  # the common case
            return self._token_opens[index] + escape(job.output[start]) + _TOKEN_CLOSE
        events = []
        if start == 0:
            events.append(self._choice_heads[index] + _ROLE_DELTA)
            if self._echo is not None:
                events.append(self._token_opens[index] + self._echo + _ECHO_CLOSE)
        if stop > start:
            events.append(self._tokens(job, start, stop))
        if job.state is _FINISHED:
            events.append(self._choice_heads[index] + _FINISH_OPEN + json_bytes(job.finish_reason) + _FINISH_CLOSE)
        return b"".join(events)

    def _tokens(self, job: Job, start: int, stop: int) -> bytes:
        index = job.index
        if self._plain:
            pieces = [escape(piece) for piece in job.output[start:stop]]
            return self._token_opens[index] + self._token_joiners[index].join(pieces) + _TOKEN_CLOSE
        calls = None if self._calls is None else self._calls[index]
        logprobs = self._logprobs
        chunks = []
        for position in range(start, stop):
            piece = escape(job.output[position])
            values = b"null" if logprobs is None else logprobs.token_bytes(job, position)
            if calls is None:
                chunks.append(self._token_opens[index] + piece + _CONTENT_CLOSE + values + _CHUNK_TAIL)
                continue
            header = calls.headers.get(position)
            if header is not None:
                chunks.append(header)
            chunks.append(calls.opens[position] + piece + _ARGUMENTS_CLOSE + values + _CHUNK_TAIL)
        return b"".join(chunks)

    def tail(self, jobs: Sequence[Job]) -> bytes:
        """After the last choice finished: the usage chunk if asked for, then [DONE]."""
        if not self._include_usage:
            return DONE_EVENT
        usage = Usage.of(jobs, choices_per_prompt=len(self._choice_heads))
        return self._usage_head + json_bytes(usage.as_dict()) + b"}\n\n" + DONE_EVENT

    def error(self, error: ApiError) -> bytes:
        return error_events(error)


def chat_completion_body(
    *,
    response_id: str,
    created: int,
    model: str,
    jobs: Sequence[Job],
    echo: str | None = None,
    tool_calls: Sequence[Sequence[Block]] | None = None,
    logprobs: ChatLogprobs | None = None,
) -> bytes:
    """The non-streaming response, in vLLM 0.26's shape (every field, nulls included).

    A choice with tool calls has ``content`` null (or just the echoed prefix) and its
    calls in ``tool_calls``, between ``function_call`` and ``reasoning``.
    """
    choices = [
        {
            "index": job.index,
            "message": _message(job, echo, tool_calls[job.index] if tool_calls else ()),
            "logprobs": None if logprobs is None else logprobs.of(job),
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


def _message(job: Job, echo: str | None, calls: Sequence[Block]) -> dict[str, object]:
    prefix = echo or ""
    message: dict[str, object] = {
        "role": "assistant",
        "content": (prefix or None) if calls else prefix + "".join(job.output),
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if calls:
        message["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": "".join(job.output[call.start : call.stop])},
            }
            for call in calls
        ]
    message["reasoning"] = None
    return message
