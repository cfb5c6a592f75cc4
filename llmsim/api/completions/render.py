"""The exact bytes of /v1/completions: stream chunks and the complete response.

Streams follow vLLM 0.33 (``completion_stream_generator``,
vllm/entrypoints/openai/completion/serving.py:299-558), each chunk dumped with
``exclude_unset`` (serving.py:486), so no ``usage`` key unless asked for: there is no
role chunk, one chunk per token, and ``finish_reason`` rides on the chunk of the last
token, with ``system_fingerprint`` when no usage chunk follows (serving.py:467-476)::

    data: {"id":"cmpl-…","object":"text_completion","created":T,"model":"m","choices":[{"index":0,"text":" and","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null,"weight_versions":null}],"system_fingerprint":"vllm-0.33.0-…","kv_transfer_params":null}

A turn the model ended itself ends with its EOS token (see
``llmsim.api.stops.with_eos``), whose chunk has empty ``text`` and ``"stop"``, one
inter-token latency after the last text; a turn a ``stop`` string or stop token ended
has no EOS, and its last chunk names that string or id in ``stop_reason`` (see
``llmsim.api.stops.stop_turn``).  Then, with ``stream_options.include_usage``,
a ``"choices":[]`` usage chunk, then ``data: [DONE]``; with ``continuous_usage_stats``
too, every chunk carries its choice's cumulative ``usage`` against its prompt
(:class:`~llmsim.api.usage.ChunkUsage`).  Choice ``i`` answers prompt ``i // n``; with
``echo: true`` its first chunk starts with that prompt's text, and with ``max_tokens:
0`` as well that text is all it says: vLLM generates one token it does not show
(serving.py:363-366), counted in usage.  With ``logprobs`` each chunk carries the
logprobs of its tokens (the echoed prompt's too, the EOS token's too) instead of
``null``.  An error after the stream began ends it with vLLM's ``data: {"error": …}``
and ``[DONE]``.
"""  # noqa: E501 (the chunk above is quoted whole)

from __future__ import annotations

from collections.abc import Sequence

from llmsim.api.errors import ApiError
from llmsim.api.logprobs_format import CompletionLogprobs
from llmsim.api.plan import stop_reason_of_job
from llmsim.api.sse import (
    DONE_EVENT,
    PlainTokens,
    chunk_head,
    error_events,
    escape,
    escape_all,
    escape_uncached,
    fingerprint_field,
    json_bytes,
    usage_events,
)
from llmsim.api.usage import ChunkUsage, Usage, UsageStyle
from llmsim.engine.job import Job, JobState
from llmsim.model.text import FinishReason

__all__ = ["CompletionStreamRenderer", "completion_body"]

_TEXT_OPEN = b',"text":"'
_LOGPROBS_KEY = b'","logprobs":'
_REASON_KEY = b',"finish_reason":'
_UNFINISHED = _REASON_KEY + b"null"
# A chunk's choice passes every field (serving.py:437-462) and the chunk is dumped with
# exclude_unset (serving.py:486): no "usage" key unless set, kv_transfer_params always.
_STOP_REASON = b',"stop_reason":'
_CHOICE_REST = b',"prompt_token_ids":null,"token_ids":null,"weight_versions":null}]'
_CHOICE_CLOSE = _STOP_REASON + b"null" + _CHOICE_REST
_KV_END = b',"kv_transfer_params":null}\n\n'
_TOKEN_CLOSE = _LOGPROBS_KEY + b"null" + _UNFINISHED + _CHOICE_CLOSE + _KV_END
#: Completions' usage without --enable-prompt-tokens-details (the routes pass the server's).
COMPLETION_USAGE = UsageStyle(prompt_details=False, created_cache_tokens=False)
_FINISHED = JobState.FINISHED  # a module global: enum member lookups cost on the per-token path
#: :meth:`CompletionStreamRenderer._finish_close` of a choice no stop string or token
#: ended, per finish reason: made once rather than dumped twice at the end of every choice.
_PLAIN_FINISH_CLOSES = {
    reason: _REASON_KEY + json_bytes(reason) + _STOP_REASON + b"null" + _CHOICE_REST
    for reason in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT, FinishReason.CACHE_THRESHOLD)
}


class CompletionStreamRenderer:
    """Renders one streaming completions request's jobs into SSE bytes.

    ``echo_prompts`` are the texts ``echo`` prepends, one per prompt; ``prompt_only``
    is ``echo`` with ``max_tokens: 0``; ``chunk_usages`` (one per prompt) put the
    cumulative usage on every chunk; ``stop_reasons[i]`` is the stop string or token id
    that ended choice ``i`` (None: none did).
    """

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
        prompt_only: bool = False,
        logprobs: CompletionLogprobs | None = None,
        chunk_usages: Sequence[ChunkUsage] | None = None,
        fingerprint: str | None = None,
        usage_style: UsageStyle = COMPLETION_USAGE,
        stop_reasons: Sequence[str | int | None] | None = None,
    ) -> None:
        head = chunk_head(response_id, b'"text_completion"', created, model)
        self._stop_reasons = stop_reasons
        # One plain loop, not a comprehension per list: this runs once per request.
        self._text_opens: list[bytes] = []
        self._text_joiners: list[bytes] = []
        for i in range(choices):
            text_open = head + b'"choices":[{"index":' + str(i).encode() + _TEXT_OPEN
            self._text_opens.append(text_open)
            self._text_joiners.append(_TOKEN_CLOSE + text_open)
        self._head = head
        self._choices_per_prompt = choices_per_prompt
        self._include_usage = include_usage
        self._usage_style = usage_style
        # The fingerprint goes on the usage chunk, or else on each choice's finishing
        # chunk (serving.py:467-476, 535-546).
        self._fingerprint = fingerprint_field(fingerprint)
        self._finish_end = (self._fingerprint if not include_usage else b"") + _KV_END
        self._echo_prompts = None if echo_prompts is None else [escape_uncached(text) for text in echo_prompts]
        self._prompt_only = prompt_only
        self._logprobs = logprobs
        self._chunk_usages = chunk_usages
        self._plain = logprobs is None and chunk_usages is None  # every chunk bare text: the fast path

    def head(self) -> bytes:
        return b""  # nothing goes out before the first token

    def render(self, job: Job, start: int, stop: int) -> bytes:
        """One chunk per token of ``job.output[start:stop]``; the last token's chunk
        carries the finish_reason (a job with no tokens still gets that one chunk)."""
        index = job.index
        finished = job.state is _FINISHED
        if self._plain and start and stop - start == 1 and not finished:  # the common case
            return self._text_opens[index] + escape(job.output[start]) + _TOKEN_CLOSE
        if self._prompt_only:
            return self._prompt_chunk(job)
        texts = escape_all(job.output[start:stop])
        if start == 0 and self._echo_prompts is not None:
            prompt = self._echo_prompts[index // self._choices_per_prompt]
            texts[:1] = [prompt + (texts[0] if texts else b"")]
        if not texts:
            if not finished:
                return b""
            texts = [b""]
        if not self._plain:
            return self._chunks(job, start, stop, texts, finished)
        close = _LOGPROBS_KEY + b"null" + self._finish_close(job) + self._finish_end if finished else _TOKEN_CLOSE
        return self._text_opens[index] + self._text_joiners[index].join(texts) + close

    def _chunks(self, job: Job, start: int, stop: int, texts: list[bytes], finished: bool) -> bytes:
        """One chunk per text, each with the logprobs of its token (the first with the
        echoed prompt's, an empty finishing chunk with none) and the usage so far."""
        logprobs = self._logprobs
        last = len(texts) - 1
        chunks = []
        for k, text in enumerate(texts):
            position = start + k
            values = b"null" if logprobs is None else logprobs.chunk_bytes(job, position, min(position + 1, stop))
            if finished and k == last:
                chunks.append(
                    self._chunk(job, text, values, self._finish_close(job), min(position + 1, stop), self._finish_end)
                )
            else:
                chunks.append(self._chunk(job, text, values, _UNFINISHED + _CHOICE_CLOSE, min(position + 1, stop)))
        return b"".join(chunks)

    def _prompt_chunk(self, job: Job) -> bytes:
        """``echo`` without generation: the job's one call (its one token is its last)
        sends the prompt alone, with the prompt's logprobs, and counts the token."""
        assert self._echo_prompts is not None  # prompt_only comes with echo
        prompt = self._echo_prompts[job.index // self._choices_per_prompt]
        values = b"null" if self._logprobs is None else self._logprobs.chunk_bytes(job, 0, 0)
        return self._chunk(job, prompt, values, self._finish_close(job), job.emitted, self._finish_end)

    def _chunk(self, job: Job, text: bytes, values: bytes, reason: bytes, tokens: int, end: bytes = _KV_END) -> bytes:
        """One chunk: ``text``, its logprobs ``values``, the finish ``reason`` and the
        rest of the choice, the usage after ``tokens`` tokens of the choice, ``end``."""
        usages = self._chunk_usages
        usage = b"" if usages is None else usages[job.index // self._choices_per_prompt].render(tokens)
        return self._text_opens[job.index] + text + _LOGPROBS_KEY + values + reason + usage + end

    def _finish_close(self, job: Job) -> bytes:
        """A finished job's last chunk, from its finish reason (and the stop string or
        token id that ended it, serving.py:437-462; none after an abort) to the end of its choice."""
        stop_reason = None if self._stop_reasons is None else stop_reason_of_job(job, self._stop_reasons)
        if stop_reason is None:
            close = _PLAIN_FINISH_CLOSES.get(job.finish_reason)
            if close is not None:
                return close
        return _REASON_KEY + json_bytes(job.finish_reason) + _STOP_REASON + json_bytes(stop_reason) + _CHOICE_REST

    def plain_tokens(self) -> PlainTokens | None:
        return PlainTokens(self._text_opens, _TOKEN_CLOSE) if self._plain else None

    def tail(self, jobs: Sequence[Job]) -> bytes:
        """After the last choice finished: the usage chunk if asked for, then [DONE]."""
        if not self._include_usage:
            return DONE_EVENT
        usage = Usage.of(jobs, self._choices_per_prompt).chunk_dict(self._usage_style)
        return usage_events(self._head, usage, self._fingerprint)

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
    prompt_only: bool = False,
    logprobs: CompletionLogprobs | None = None,
    fingerprint: str | None = None,
    usage_style: UsageStyle = COMPLETION_USAGE,
    stop_reasons: Sequence[str | int | None] | None = None,
    kv_transfer_params: dict[str, object] | None = None,
) -> bytes:
    """The non-streaming response: vLLM's ``CompletionResponse`` dumped whole
    (vllm/entrypoints/openai/completion/protocol.py:674-725, serving.py:704-714).
    With ``prompt_only`` (``echo`` with ``max_tokens: 0``) each choice's text is its
    prompt alone, though usage counts the token generated (serving.py:590-597, 653)."""

    def text_of(job: Job) -> str:
        text = "" if prompt_only else "".join(job.output[: job.emitted])  # an abort ends it early
        if echo_prompts is None:
            return text
        return echo_prompts[job.index // choices_per_prompt] + text

    choices = [
        {
            "index": job.index,
            "text": text_of(job),
            "logprobs": None if logprobs is None else logprobs.of(job, with_output=not prompt_only),
            "finish_reason": job.finish_reason,
            "stop_reason": None if stop_reasons is None else stop_reason_of_job(job, stop_reasons),
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "routed_experts": None,
            "weight_versions": None,
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
            "system_fingerprint": fingerprint,
            "usage": Usage.of(jobs, choices_per_prompt).body_dict(usage_style),
            "kv_transfer_params": kv_transfer_params,  # a P/D prefill pod's (api/transfer.py)
            "ec_transfer_params": None,
            "metrics": None,
        }
    )
