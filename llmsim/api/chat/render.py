"""The exact bytes of /v1/chat/completions: stream chunks and the complete response.

Streams follow vLLM 0.33 (``chat_completion_stream_generator``,
vllm/entrypoints/openai/chat_completion/serving.py:479-870), each chunk dumped with
``exclude_unset`` (serving.py:499-501): the keys vLLM passes, nulls included::

    data: {"id":"chatcmpl-…","object":"chat.completion.chunk","created":T,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}
    data: {…,"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null,"token_ids":null}],"kv_transfer_params":null}
    data: {…,"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}
    data: {…,"choices":[],"usage":{"prompt_tokens":…,"total_tokens":…,"completion_tokens":…},"system_fingerprint":"vllm-0.33.0-…"}
    data: [DONE]

``system_fingerprint`` goes on the usage chunk, or without one on each choice's
finishing chunk (serving.py:824-834); the usage chunk leaves out null keys
(``exclude_none``), so ``prompt_tokens_details`` only with
``--enable-prompt-tokens-details``.
One chunk per token, and the last token's own chunk carries the ``finish_reason``
(serving.py:796-809): on ``length`` that is the last text token; a turn the model ended
itself ends with its EOS token (see ``llmsim.api.stops.with_eos``), whose chunk has empty
content (its text is skipped) and arrives one inter-token latency after the last text;
a turn a ``stop`` string or stop token ended has no EOS, and its last chunk names that
string or id in ``stop_reason`` (see ``llmsim.api.stops.stop_turn``).
The role chunks go out with the request's first token (after TTFT), one per choice, all
before any token (serving.py:597-634); with ``echo`` the echoed assistant prefix of
every choice follows them.  The usage chunk comes only with
``stream_options.include_usage``; with ``continuous_usage_stats`` too, every chunk
carries its choice's cumulative ``usage`` (:class:`~llmsim.api.usage.ChunkUsage`; the
role and echo chunks count 0 tokens).  Each chunk carries one choice.

A choice that calls tools streams, after the role chunks, one chunk per argument
token; a call's first one carries its id, type and name with the first arguments piece,
``"delta":{"tool_calls":[{"id":…,"type":"function","index":k,"function":{"name":…,"arguments":"…"}}]}``,
as vLLM's streaming parsers send it (vllm/tool_parsers/streaming.py:49-57, 284-296), the
others ``"delta":{"tool_calls":[{"index":k,"function":{"arguments":"…"}}]}``: id, type
and name are never repeated, since the openai SDK's ``.stream()`` helper concatenates
every string it sees twice.  Its EOS token's chunk has empty content.
With ``logprobs`` each token's chunk carries ``{"content":[<entry>]}`` instead of
``null`` (the EOS token's too).  An error after the stream began ends it with vLLM's
``data: {"error": …}`` and ``[DONE]``.
"""  # noqa: E501 (the chunks above are quoted whole)

from __future__ import annotations

from collections.abc import Sequence

import attrs

from llmsim.api.errors import ApiError
from llmsim.api.logprobs_format import ChatLogprobs
from llmsim.api.plan import stop_reason_of_job
from llmsim.api.sse import (
    DONE_EVENT,
    PlainTokens,
    chunk_head,
    error_events,
    escape,
    escape_all,
    escape_uncached,
    escaped_piece,
    fingerprint_field,
    json_bytes,
    usage_events,
)
from llmsim.api.turns import Block
from llmsim.api.usage import ChunkUsage, Usage, UsageStyle
from llmsim.engine.job import Job, JobState
from llmsim.model.text import FinishReason

__all__ = ["ChatStreamRenderer", "chat_completion_body"]

_ROLE_DELTA = b',"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
_ROLE_CLOSE = b',"prompt_token_ids":null,"prompt_text":null}\n\n'
_ROLE_END = _ROLE_DELTA + _ROLE_CLOSE  # a role chunk after its choice's head, without usage
_CONTENT_OPEN = b',"delta":{"content":"'
_CONTENT_CLOSE = b'"},"logprobs":'
_UNFINISHED = b',"finish_reason":null,"token_ids":null}]'  # a token chunk's choice, after its logprobs
_FINISH_OPEN = b',"finish_reason":'
_STOP_REASON = b',"stop_reason":'
_FINISH_CLOSE = b',"token_ids":null,"weight_versions":null}]'
_END = b"}\n\n"  # the role and echo chunks: built without kv_transfer_params (serving.py:610-619, 646-652)
_KV_END = b',"kv_transfer_params":null}\n\n'  # a token chunk passes it, None until set (serving.py:815-823)
_TOKEN_CLOSE = _CONTENT_CLOSE + b"null" + _UNFINISHED + _KV_END
_CALL_OPEN = b',"delta":{"tool_calls":[{"index":'
_ARGUMENTS_OPEN = b',"function":{"arguments":"'
# tool_choice "required": later deltas pass name=None explicitly (vllm/tool_parsers/streaming.py:270-283)
_NULL_NAME_ARGUMENTS_OPEN = b',"function":{"name":null,"arguments":"'
_ARGUMENTS_CLOSE = b'"}}]},"logprobs":'
_ECHO_CLOSE = b'"},"logprobs":null,"finish_reason":null}]'
# A choice finished without output (an abort before its first token): the delta is a bare
# DeltaMessage() (vllm/entrypoints/openai/chat_completion/stream_processor.py:73-75).
_EMPTY_DELTA = b',"delta":{},"logprobs":'
# ... and so is one ended unadmitted, below its cache-hit threshold (llm-d-inference-sim
# sends a bare ``delta:{}`` chunk with its finish reason, pkg/communication/http.go:550-554).
_UNSERVED = (FinishReason.ABORT, FinishReason.CACHE_THRESHOLD)
#: Chat's usage without --enable-prompt-tokens-details (the routes pass the server's).
CHAT_USAGE = UsageStyle(prompt_details=False, created_cache_tokens=True)
_FINISHED = JobState.FINISHED  # a module global: enum member lookups cost on the per-token path

#: :meth:`ChatStreamRenderer._finish_tail` of a choice no stop string or token ended, per
#: finish reason: made once rather than dumped twice at the end of every choice.
_PLAIN_FINISH_TAILS = {
    reason: _FINISH_OPEN + json_bytes(reason) + _STOP_REASON + b"null" + _FINISH_CLOSE
    for reason in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.TOOL_CALLS, *_UNSERVED)
}


@attrs.frozen
class _CallChunks:
    """One choice's tool calls, pre-rendered: per argument token, its chunk up to the
    token's text.  A call's first token's chunk also carries its id, type and name, as
    vLLM's streaming parsers send them with the first arguments piece
    (vllm/tool_parsers/streaming.py:49-57 named, 284-296 required)."""

    opens: tuple[bytes, ...]

    @classmethod
    def of(cls, choice_head: bytes, calls: Sequence[Block], null_names: bool = False) -> _CallChunks:
        opens: list[bytes] = []
        arguments_open = _NULL_NAME_ARGUMENTS_OPEN if null_names else _ARGUMENTS_OPEN
        for k, call in enumerate(calls):
            if call.stop == call.start:
                continue
            opens.append(
                choice_head
                + b',"delta":{"tool_calls":[{"id":'
                + json_bytes(call.call_id)
                + b',"type":"function","index":'
                + str(k).encode()
                + b',"function":{"name":'
                + json_bytes(call.name)
                + b',"arguments":"'
            )
            opens.extend([choice_head + _CALL_OPEN + str(k).encode() + arguments_open] * (call.stop - call.start - 1))
        return cls(tuple(opens))


class ChatStreamRenderer:
    """Renders one streaming chat request's jobs (one job per choice) into SSE bytes.

    ``tool_calls[i]`` are the calls choice ``i`` makes (its output pieces are their
    arguments; empty: the choice answers with text); ``logprobs`` adds each token's
    logprobs to its chunk; ``chunk_usage`` puts the cumulative usage on every chunk.
    Under ``tool_choice: "required"`` (``required_tool_choice``) a call's later
    argument deltas say ``"name":null``, as vLLM's required parser passes it
    (vllm/tool_parsers/streaming.py:270-283).  ``stop_reasons[i]`` is the stop string or
    token id that ended choice ``i`` (None: none did).
    """

    # Slots: a request sets every one of them once, and the per-token path reads them.
    __slots__ = (
        "_calls",
        "_choice_heads",
        "_chunk_usage",
        "_fingerprint",
        "_finish_end",
        "_head",
        "_include_usage",
        "_logprobs",
        "_opened",
        "_opening",
        "_plain",
        "_stop_reasons",
        "_token_opens",
        "_usage_style",
    )

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
        required_tool_choice: bool = False,
        logprobs: ChatLogprobs | None = None,
        chunk_usage: ChunkUsage | None = None,
        fingerprint: str | None = None,
        usage_style: UsageStyle = CHAT_USAGE,
        stop_reasons: Sequence[str | int | None] | None = None,
    ) -> None:
        head = chunk_head(response_id, b'"chat.completion.chunk"', created, model)
        self._stop_reasons = stop_reasons
        usage = b"" if chunk_usage is None else chunk_usage.render(0)  # the role and echo chunks count 0 tokens
        # The end of every choice's role chunk, so that each costs one concatenation.
        role_end = _ROLE_END if not usage else _ROLE_DELTA + usage + _ROLE_CLOSE
        # One plain loop, not a comprehension per list: this runs once per request.
        self._choice_heads: list[bytes] = []
        self._token_opens: list[bytes] = []
        role_chunks: list[bytes] = []
        for i in range(choices):
            choice_head = head + b'"choices":[{"index":' + str(i).encode()
            self._choice_heads.append(choice_head)
            self._token_opens.append(choice_head + _CONTENT_OPEN)
            role_chunks.append(choice_head + role_end)
        self._head = head
        self._include_usage = include_usage
        self._usage_style = usage_style
        # The fingerprint goes on the usage chunk, or else on each choice's finishing
        # chunk (serving.py:824-834, 903-912); every finishing chunk ends with it.
        self._fingerprint = fingerprint_field(fingerprint)
        self._finish_end = (self._fingerprint if not include_usage else b"") + _KV_END
        # What the request's first engine output sends before its tokens: the role chunk
        # of every choice, then (with ``echo``) the echoed prefix of every choice.
        self._opening = b"".join(role_chunks)
        if echo is not None:
            self._opening += self._echo_chunks(echo, usage)
        self._opened = False
        self._calls = None if tool_calls is None else self._call_chunks(tool_calls, required_tool_choice)
        self._logprobs = logprobs
        self._chunk_usage = chunk_usage
        # Every chunk a bare text token: the per-token fast path.
        self._plain = tool_calls is None and logprobs is None and chunk_usage is None

    def _echo_chunks(self, echo: str, usage: bytes) -> bytes:
        """The echoed assistant prefix of every choice (after all the role chunks)."""
        escaped = escape_uncached(echo)
        return b"".join([token_open + escaped + _ECHO_CLOSE + usage + _END for token_open in self._token_opens])

    def _call_chunks(self, tool_calls: Sequence[Sequence[Block]], null_names: bool) -> list[_CallChunks | None]:
        """Per choice, its pre-rendered tool-call chunks (None: it answers with text)."""
        return [
            _CallChunks.of(choice_head, calls, null_names) if calls else None
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
        count = stop - start
        if count == 1:  # a paced stream's first and last call: one piece, no list to join
            text = job.output[start]
            body = escaped_piece(text) or escape(text)  # b"" (an EOS) is cached too: escape() again
        else:
            # (the joiner made here rather than per choice up front: most requests never need it)
            body = (_TOKEN_CLOSE + self._token_opens[index]).join(escape_all(job.output[start:stop]))
        if job.state is not _FINISHED:
            if not count:
                return b""
            return self._token_opens[index] + body + _TOKEN_CLOSE
        if not job.emitted and job.finish_reason in _UNSERVED:  # vLLM's bare DeltaMessage()
            return self._choice_heads[index] + _EMPTY_DELTA + b"null" + self._finish_tail(job) + self._finish_end
        return self._token_opens[index] + body + _CONTENT_CLOSE + b"null" + self._finish_tail(job) + self._finish_end

    def _chunks(self, job: Job, start: int, stop: int) -> bytes:
        """One chunk per token, with tool-call deltas, logprobs and usage as asked."""
        index = job.index
        finished = job.state is _FINISHED
        if finished and stop == start:  # no token left (an empty plan, an abort): only its finish chunk
            usage = b"" if self._chunk_usage is None else self._chunk_usage.render(stop)
            close = self._finish_tail(job) + usage + self._finish_end
            if not stop and job.finish_reason in _UNSERVED:  # vLLM's bare DeltaMessage()
                return self._choice_heads[index] + _EMPTY_DELTA + b"null" + close
            return self._token_opens[index] + _CONTENT_CLOSE + b"null" + close
        calls = None if self._calls is None else self._calls[index]
        arguments = 0 if calls is None else len(calls.opens)  # later positions: the EOS token
        logprobs, chunk_usage = self._logprobs, self._chunk_usage
        last = stop - 1 if finished else -1
        chunks = []
        for position in range(start, stop):
            piece = escape(job.output[position])
            values = b"null" if logprobs is None else logprobs.token_bytes(job, position)
            usage = b"" if chunk_usage is None else chunk_usage.render(position + 1)
            end = usage + _KV_END
            close = self._finish_tail(job) + usage + self._finish_end if position == last else _UNFINISHED + end
            if calls is None or position >= arguments:
                chunks.append(self._token_opens[index] + piece + _CONTENT_CLOSE + values + close)
                continue
            chunks.append(calls.opens[position] + piece + _ARGUMENTS_CLOSE + values + close)
        return b"".join(chunks)

    def _finish_tail(self, job: Job) -> bytes:
        """The end of the choice of a job's last chunk, after its logprobs: the finish
        reason and the stop string or token id that ended the choice (serving.py:796-809;
        none for an abort, which ends it before)."""
        stop_reason = None if self._stop_reasons is None else stop_reason_of_job(job, self._stop_reasons)
        if stop_reason is None:
            tail = _PLAIN_FINISH_TAILS.get(job.finish_reason)
            if tail is not None:
                return tail
        return _FINISH_OPEN + json_bytes(job.finish_reason) + _STOP_REASON + json_bytes(stop_reason) + _FINISH_CLOSE

    def plain_tokens(self) -> PlainTokens | None:
        return PlainTokens(self._token_opens, _TOKEN_CLOSE) if self._plain else None

    def tail(self, jobs: Sequence[Job]) -> bytes:
        """After the last choice finished: the usage chunk if asked for, then [DONE]."""
        if not self._include_usage:
            return DONE_EVENT
        usage = Usage.of(jobs, choices_per_prompt=len(self._choice_heads)).chunk_dict(self._usage_style)
        return usage_events(self._head, usage, self._fingerprint)

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
    fingerprint: str | None = None,
    usage_style: UsageStyle = CHAT_USAGE,
    forced_tool_calls: bool = False,
    stop_reasons: Sequence[str | int | None] | None = None,
    kv_transfer_params: dict[str, object] | None = None,
    ec_transfer_params: dict[str, object] | None = None,
) -> bytes:
    """The non-streaming response: vLLM's ``ChatCompletionResponse`` dumped whole
    (vllm/entrypoints/openai/chat_completion/protocol.py:113-164, api_router.py:113).
    ``kv_transfer_params``: what a P/D prefill pod tells the decoder, ``ec_transfer_params``
    what an encoder pod tells the next one (api/transfer.py).

    A choice with tool calls has ``content`` null (or just the echoed prefix) and its
    calls in ``tool_calls``, between ``function_call`` and ``reasoning``; under a named
    or ``required`` tool_choice (``forced_tool_calls``) that content is ``""``, not null
    (vllm/entrypoints/openai/chat_completion/message_assembly.py:60-61, 105-109).
    """
    choices = [
        {
            "index": job.index,
            "message": _message(job, echo, tool_calls[job.index] if tool_calls else (), forced_tool_calls),
            "logprobs": None if logprobs is None else logprobs.of(job),
            "finish_reason": job.finish_reason,
            "stop_reason": None if stop_reasons is None else stop_reason_of_job(job, stop_reasons),
            "token_ids": None,
            "routed_experts": None,
            "weight_versions": None,
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
            "system_fingerprint": fingerprint,
            "usage": Usage.of(jobs, choices_per_prompt=len(jobs)).body_dict(usage_style),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": kv_transfer_params,
            "ec_transfer_params": ec_transfer_params,
            "metrics": None,
        }
    )


def _message(job: Job, echo: str | None, calls: Sequence[Block], forced: bool) -> dict[str, object]:
    prefix = echo or ""
    message: dict[str, object] = {
        "role": "assistant",
        "content": (prefix if forced else prefix or None) if calls else prefix + "".join(job.output[: job.emitted]),
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
                "function": {
                    "name": call.name,
                    "arguments": "".join(job.output[call.start : min(call.stop, job.emitted)]),
                },
            }
            for call in calls
        ]
    message["reasoning"] = None
    return message
