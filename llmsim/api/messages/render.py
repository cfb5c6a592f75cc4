"""The exact bytes of Anthropic's /v1/messages: the message object and its event stream.

Events are ``event: <name>\\ndata: <json>\\n\\n`` with Anthropic's names (the SDK
dispatches on them), no ``[DONE]``::

    message_start (usage.input_tokens), content_block_start, ping,    (first token, after TTFT)
    content_block_delta                                               (one per token)
    content_block_stop, message_delta (stop_reason, usage.output_tokens), message_stop

A text block streams ``text_delta`` events; a tool_use block starts with
``{"type":"tool_use","id":"toolu_…","name":…,"input":{}}``, an empty
``input_json_delta`` and then one ``input_json_delta`` per token of its arguments.
Several tool_use blocks follow each other (stop of one, start of the next).  Key order
and the ``ping`` payload (``{"type": "ping"}``) are the API's own, as captured in the
anthropic SDK's test fixtures.

The tokens and their timing are vLLM's, whose /v1/messages is its chat endpoint
underneath (vllm/entrypoints/anthropic/serving.py:632-650): a turn the model ends itself
ends with its EOS token (:func:`llmsim.api.stops.with_eos`), counted in ``output_tokens``
(``completion_tokens``, serving.py:97-98), whose empty text sends no delta
(serving.py:1118-1120), so ``content_block_stop`` and the message's closing events come
one inter-token latency after the last text.  A stop sequence ends the turn at the token
completing it, counted (:func:`llmsim.api.stops.stop_turn`); a stream holds back the text
that could begin one, and a token whose text is all held back sends no delta either.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import attrs

from llmsim.api.errors import ApiError, anthropic_error_type
from llmsim.api.plan import as_emitted
from llmsim.api.sse import PlainTokens, escape, event_bytes, json_bytes
from llmsim.api.turns import TEXT, TurnPlan
from llmsim.engine.job import Job, JobState
from llmsim.model.text import FinishReason

__all__ = ["PING_EVENT", "MessageShell", "MessagesStreamRenderer", "content_blocks", "message_body", "stop_reason_of"]

_FINISHED = JobState.FINISHED
PING_EVENT = b'event: ping\ndata: {"type": "ping"}\n\n'
_DELTA_CLOSE = b'"}}\n\n'
_MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


@attrs.frozen
class MessageShell:
    message_id: str
    model: str
    stop_sequence: str | None = None  # the stop sequence the text was cut at, if any


def stop_reason_of(plan: TurnPlan, stop_sequence: str | None) -> str:
    if plan.finish_reason == FinishReason.TOOL_CALLS:
        return "tool_use"
    if plan.finish_reason in (FinishReason.LENGTH, FinishReason.CACHE_THRESHOLD):  # llm-d: response_builder.go:836
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def usage_object(job: Job, *, output_tokens: int | None = None) -> dict[str, int]:
    """Anthropic counts cached prompt tokens apart from ``input_tokens``."""
    cached = job.cached_tokens
    return {
        "input_tokens": job.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": job.completion_tokens if output_tokens is None else output_tokens,
    }


def _tool_input(arguments: str) -> object:
    """A tool_use block's ``input``: the arguments object (``{}`` when the output cap
    cut it mid-way and it does not parse)."""
    try:
        return json.loads(arguments)
    except ValueError:
        return {}


def content_blocks(plan: TurnPlan) -> list[dict[str, object]]:
    blocks: list[dict[str, object]] = []
    for block in plan.blocks:
        text = plan.block_text(block)
        if block.kind == TEXT:
            blocks.append({"type": "text", "text": text})
        else:
            blocks.append({"type": "tool_use", "id": block.call_id, "name": block.name, "input": _tool_input(text)})
    return blocks


def _stop(plan: TurnPlan, shell: MessageShell) -> dict[str, str | None]:
    """``stop_reason`` and ``stop_sequence``: both null for an abort (vLLM maps only
    ``stop``, ``length`` and ``tool_calls``, vllm/entrypoints/anthropic/serving.py:131-134)."""
    if plan.finish_reason == FinishReason.ABORT:
        return {"stop_reason": None, "stop_sequence": None}
    return {"stop_reason": stop_reason_of(plan, shell.stop_sequence), "stop_sequence": shell.stop_sequence}


def message_body(shell: MessageShell, plan: TurnPlan, job: Job) -> bytes:
    """The non-streaming message object (of what was generated, if an abort ended it)."""
    plan = as_emitted(plan, job.emitted, job.finish_reason)
    return json_bytes(
        {
            "id": shell.message_id,
            "type": "message",
            "role": "assistant",
            "content": content_blocks(plan),
            "model": shell.model,
            **_stop(plan, shell),
            "usage": usage_object(job),
        }
    )


def _event(name: str, data: Mapping[str, object]) -> bytes:
    return event_bytes(name, json_bytes(data))


class MessagesStreamRenderer:
    """Renders the one job of a streaming /v1/messages request."""

    def __init__(self, *, shell: MessageShell, plan: TurnPlan) -> None:
        self._shell = shell
        self._plan = plan
        blocks = plan.blocks
        self._starts = {block.start: index for index, block in enumerate(blocks) if index}  # later blocks
        self._opens = [
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
            + str(index).encode()
            + (
                b',"delta":{"type":"text_delta","text":"'
                if block.kind == TEXT
                else b',"delta":{"type":"input_json_delta","partial_json":"'
            )
            for index, block in enumerate(blocks)
        ]
        self._block = 0  # the block now streaming

    def head(self) -> bytes:
        return b""  # message_start goes out with the first token, as vLLM sends it

    def render(self, job: Job, start: int, stop: int) -> bytes:
        if start and stop - start == 1 and job.state is not _FINISHED and start not in self._starts:
            piece = job.output[start]
            return self._opens[self._block] + escape(piece) + _DELTA_CLOSE if piece else b""
        events = []
        if start == 0:
            events.append(self._message_start(job))
            events.append(self._block_start(0))
            events.append(PING_EVENT)
            events.append(self._first_json_delta(0))
        for index in range(start, stop):
            block = self._starts.get(index)
            if block is not None:
                events.append(self._block_stop(self._block))
                events.append(self._block_start(block))
                events.append(self._first_json_delta(block))
                self._block = block
            piece = job.output[index]
            if piece:  # an EOS token or held-back text: no delta
                events.append(self._opens[self._block] + escape(piece) + _DELTA_CLOSE)
        if job.state is _FINISHED:
            events.append(self._block_stop(self._block))
        return b"".join(events)

    def plain_tokens(self) -> PlainTokens | None:
        return None

    def tail(self, jobs: Sequence[Job]) -> bytes:
        job = jobs[0]
        delta = {
            "type": "message_delta",
            "delta": _stop(as_emitted(self._plan, job.emitted, job.finish_reason), self._shell),
            "usage": {"output_tokens": job.completion_tokens},
        }
        return _event("message_delta", delta) + _MESSAGE_STOP

    def error(self, error: ApiError) -> bytes:
        return _event(
            "error", {"type": "error", "error": {"type": anthropic_error_type(error.status), "message": error.message}}
        )

    def _message_start(self, job: Job) -> bytes:
        message: dict[str, object] = {
            "id": self._shell.message_id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self._shell.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_object(job, output_tokens=1),
        }
        return _event("message_start", {"type": "message_start", "message": message})

    def _block_start(self, index: int) -> bytes:
        block = self._plan.blocks[index]
        if block.kind == TEXT:
            return _event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            )
        start = {"type": "tool_use", "id": block.call_id, "name": block.name, "input": {}}
        return _event("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})

    def _first_json_delta(self, index: int) -> bytes:
        """A tool_use block's arguments begin with an empty ``input_json_delta``."""
        if self._plan.blocks[index].kind == TEXT:
            return b""
        return self._opens[index] + _DELTA_CLOSE

    def _block_stop(self, index: int) -> bytes:
        return _event("content_block_stop", {"type": "content_block_stop", "index": index})
