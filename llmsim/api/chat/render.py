"""The exact bytes of /v1/chat/completions: stream chunks and the complete response.

Streams follow vLLM 0.33 (``chat_completion_stream_generator``,
vllm/entrypoints/openai/chat_completion/serving.py:479-870) without
``system_fingerprint``::

    data: {"id":"chatcmpl-…","object":"chat.completion.chunk","created":T,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}
    data: {…,"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,"token_ids":null}]}
    data: {…,"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}]}
    data: {…,"choices":[],"usage":{"prompt_tokens":…,"total_tokens":…,"completion_tokens":…,"prompt_tokens_details":{"cached_tokens":…}}}
    data: [DONE]

One chunk per token, and the last token's own chunk carries the ``finish_reason``
(serving.py:796-809): on ``length`` that is the last text token; a turn the model ended
itself ends with its EOS token (see ``llmsim.api.plan.with_eos``), whose chunk has empty
content (its text is skipped) and arrives one inter-token latency after the last text.
The role chunks go out with the request's first token (after TTFT), one per choice, all
before any token (serving.py:597-634); with ``echo`` the echoed assistant prefix of
every choice follows them.  The usage chunk comes only with
``stream_options.include_usage``; with ``continuous_usage_stats`` too, every chunk
carries its choice's cumulative ``usage`` (:class:`~llmsim.api.usage.ChunkUsage`; the
role and echo chunks count 0 tokens).  Each chunk carries one choice.

A choice that calls tools streams, after the role chunks, per call one header chunk
``"delta":{"tool_calls":[{"id":…,"type":"function","index":k,"function":{"name":…}}]}``
(no ``arguments`` key; sent with the call's first token) and then one chunk per
argument token, ``"delta":{"tool_calls":[{"index":k,"function":{"arguments":"…"}}]}``:
id, type and name are never repeated, since the openai SDK's ``.stream()`` helper
concatenates every string it sees twice.  Its EOS token's chunk has empty content.
With ``logprobs`` each token's chunk carries ``{"content":[<entry>]}`` instead of
``null`` (the EOS token's too).  An error after the stream began ends it with vLLM's
``data: {"error": …}`` and ``[DONE]``.
"""  # noqa: E501 (the chunks above are quoted whole)

from __future__ import annotations

from collections.abc import Sequence

import attrs

from llmsim.api.errors import ApiError
from llmsim.api.logprobs_format import ChatLogprobs
from llmsim.api.plan import Block
from llmsim.api.sse import DONE_EVENT, chunk_head, error_events, escape, escape_uncached, json_bytes
from llmsim.api.usage import ChunkUsage, Usage
from llmsim.engine.job import Job, JobState

__all__ = ["ChatStreamRenderer", "chat_completion_body"]

_ROLE_DELTA = b',"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
_ROLE_CLOSE = b',"prompt_token_ids":null,"prompt_text":null}\n\n'
_CONTENT_OPEN = b',"delta":{"content":"'
_CONTENT_CLOSE = b'"},"logprobs":'
_UNFINISHED = b',"finish_reason":null,"token_ids":null}]'  # a token chunk's choice, after its logprobs
_FINISH_OPEN = b',"finish_reason":'
_FINISH_CLOSE = b',"stop_reason":null,"token_ids":null}]'
_END = b"}\n\n"
_TOKEN_CLOSE = _CONTENT_CLOSE + b"null" + _UNFINISHED + _END
_CALL_OPEN = b',"delta":{"tool_calls":[{"index":'
_ARGUMENTS_OPEN = b',"function":{"arguments":"'
_ARGUMENTS_CLOSE = b'"}}]},"logprobs":'
_ECHO_CLOSE = b'"},"logprobs":null,"finish_reason":null}]'
_FINISHED = JobState.FINISHED  # a module global: enum member lookups cost on the per-token path


def _finish_tail(job: Job) -> bytes:
    """The end of the choice of a job's last chunk, after its logprobs."""
    return _FINISH_OPEN + json_bytes(job.finish_reason) + _FINISH_CLOSE


@attrs.frozen
class _CallChunks:
    """One choice's tool calls, pre-rendered: the header chunk of each call up to its
    usage (keyed by its first token) and, per argument token, its chunk up to the
    token's text."""

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
                + _UNFINISHED
            )
            opens.extend([choice_head + _CALL_OPEN + str(k).encode() + _ARGUMENTS_OPEN] * (call.stop - call.start))
        return cls(headers, tuple(opens))


class ChatStreamRenderer:
    """Renders one streaming chat request's jobs (one job per choice) into SSE bytes.

    ``tool_calls[i]`` are the calls choice ``i`` makes (its output pieces are their
    arguments; empty: the choice answers with text); ``logprobs`` adds each token's
    logprobs to its chunk; ``chunk_usage`` puts the cumulative usage on every chunk.
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
        chunk_usage: ChunkUsage | None = None,
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
        self._opening = self._opening_chunks(None if echo is None else escape_uncached(echo), chunk_usage)
        self._opened = False
        self._calls = None if tool_calls is None else self._call_chunks(tool_calls)
        self._logprobs = logprobs
        self._chunk_usage = chunk_usage
        # Every chunk a bare text token: the per-token fast path.
        self._plain = tool_calls is None and logprobs is None and chunk_usage is None

    def _opening_chunks(self, echo: bytes | None, chunk_usage: ChunkUsage | None) -> bytes:
        """The role chunk of every choice, then (with ``echo``) the echoed prefix of every
        choice: what the request's first engine output sends before its tokens."""
        usage = b"" if chunk_usage is None else chunk_usage.render(0)
        chunks = [choice_head + _ROLE_DELTA + usage + _ROLE_CLOSE for choice_head in self._choice_heads]
        if echo is not None:
            chunks.extend(token_open + echo + _ECHO_CLOSE + usage + _END for token_open in self._token_opens)
        return b"".join(chunks)

    def _call_chunks(self, tool_calls: Sequence[Sequence[Block]]) -> list[_CallChunks | None]:
        """Per choice, its pre-rendered tool-call chunks (None: it answers with text)."""
        return [
            _CallChunks.of(choice_head, calls) if calls else None
            for choice_head, calls in zip(self._choice_heads, tool_calls, strict=True)
        ]

    def head(self) -> bytes:
        return b""  # the role chunks go out with the first token, after TTFT

    def render(self, job: Job, start: int, stop: int) -> bytes:
        """The events for ``job.output[start:stop]``: the opening chunks on the request's
        first call, then a chunk per token, the last token's with the finish reason."""
        if self._plain and start and stop - start == 1 and job.state is not _FINISHED:  # the common case
            return self._token_opens[job.index] + escape(job.output[start]) + _TOKEN_CLOSE
        tokens = self._tokens(job, start, stop) if self._plain else self._chunks(job, start, stop)
        if self._opened:
            return tokens
        self._opened = True
        return self._opening + tokens

    def _tokens(self, job: Job, start: int, stop: int) -> bytes:
        """Bare text chunks; a finished job's last one with its finish reason (a job
        with an empty plan still gets that one chunk, with empty content)."""
        index = job.index
        pieces = [escape(piece) for piece in job.output[start:stop]]
        if job.state is not _FINISHED:
            if not pieces:
                return b""
            return self._token_opens[index] + self._token_joiners[index].join(pieces) + _TOKEN_CLOSE
        body = self._token_joiners[index].join(pieces)
        return self._token_opens[index] + body + _CONTENT_CLOSE + b"null" + _finish_tail(job) + _END

    def _chunks(self, job: Job, start: int, stop: int) -> bytes:
        """One chunk per token, with tool-call deltas, logprobs and usage as asked."""
        index = job.index
        finished = job.state is _FINISHED
        if finished and stop == start:  # an empty plan: only its finish chunk
            usage = b"" if self._chunk_usage is None else self._chunk_usage.render(0)
            return self._token_opens[index] + _CONTENT_CLOSE + b"null" + _finish_tail(job) + usage + _END
        calls = None if self._calls is None else self._calls[index]
        arguments = 0 if calls is None else len(calls.opens)  # later positions: the EOS token
        logprobs, chunk_usage = self._logprobs, self._chunk_usage
        last = stop - 1 if finished else -1
        chunks = []
        for position in range(start, stop):
            piece = escape(job.output[position])
            values = b"null" if logprobs is None else logprobs.token_bytes(job, position)
            end = _END if chunk_usage is None else chunk_usage.render(position + 1) + _END
            close = (_finish_tail(job) if position == last else _UNFINISHED) + end
            if calls is None or position >= arguments:
                chunks.append(self._token_opens[index] + piece + _CONTENT_CLOSE + values + close)
                continue
            header = calls.headers.get(position)
            if header is not None:  # vLLM's one chunk for the call's first token, as two
                chunks.append(header + end)
            chunks.append(calls.opens[position] + piece + _ARGUMENTS_CLOSE + values + close)
        return b"".join(chunks)

    def tail(self, jobs: Sequence[Job]) -> bytes:
        """After the last choice finished: the usage chunk if asked for, then [DONE]."""
        if not self._include_usage:
            return DONE_EVENT
        usage = Usage.of(jobs, choices_per_prompt=len(self._choice_heads))
        return self._usage_head + json_bytes(usage.as_dict()) + b"}\n\n" + DONE_EVENT

    def error(self, error: ApiError) -> bytes:
        return error_events(error, compact=True)


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
