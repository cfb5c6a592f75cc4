"""The exact bytes of /v1/responses: the response object and its event stream.

Events are ``event: <type>\\ndata: <json>\\n\\n``, each with ``type`` and a
``sequence_number`` counting from 0, no ``[DONE]``; keys in the field order of the
openai types (as vLLM's pydantic dumps write them).  A text turn::

    response.created, response.in_progress            (at once, status in_progress)
    response.output_item.added (message), response.content_part.added, delta 1   (first token, after TTFT)
    response.output_text.delta                        (one per token)
    response.output_text.done, response.content_part.done, response.output_item.done,
    response.completed or response.incomplete         (with the last token)

A tool turn: ``output_item.added`` (function_call), one
``response.function_call_arguments.delta`` per token,
``response.function_call_arguments.done``, ``output_item.done``, ``completed``.

A turn the model ends itself ends with its EOS token (:func:`llmsim.api.stops.with_eos`),
as in vLLM, whose ``SimpleContext`` counts every token id the engine returns, the EOS
too, in ``output_tokens`` (vllm/entrypoints/openai/responses/context.py:223).  Its
empty text makes no event and takes no sequence number (``resolve_target_state`` finds
no content, streaming_events.py:1288-1297; serving.py:1269-1274): the closing events
go out when the engine emits it, one inter-token latency after the last text.  A
stream's logprobs are those of its deltas, so the EOS token has none there nor in the
final response built from them (serving.py:860-861, streaming_events.py:893-919);
a non-streaming body lists it, named as the tokenizer names it (serving.py:1031-1043,
978-1013).  ``response.output_text.done`` carries ``logprobs: []`` (streaming_events.py:916).
``output_index`` and ``content_index`` are 0: a turn has one item with one part.  A
turn cut by the output cap (finish ``length``) ends as vLLM 0.33 ends it: its item and
the response have status ``incomplete``, the response ``incomplete_details: {"reason":
"max_output_tokens"}``, and the last event is ``response.incomplete``
(``vllm/entrypoints/openai/responses/serving.py:857-859,1442-1456``;
``protocol.py:982-984``; ``utils.py:103-107``).  The openai SDK's ``stream()`` helper
then has no ``response.completed`` to build its final response from, as with OpenAI.

Per token only the escaped piece and the sequence number are inserted into
pre-rendered bytes; the per-token logprobs (when asked for) are rendered when the turn
is planned, before it is submitted.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs
import orjson

from llmsim.api.chat.tools import tool_call_id
from llmsim.api.errors import ApiError
from llmsim.api.plan import as_emitted
from llmsim.api.sse import PlainTokens, escape, event_bytes, json_bytes
from llmsim.api.turns import TEXT, Block, TurnPlan
from llmsim.engine.job import Job, JobState
from llmsim.model.logprobs import synthesize_logprobs, token_bytes

__all__ = [
    "ResponseShell",
    "ResponsesStreamRenderer",
    "TokenLogprobs",
    "TurnIds",
    "final_response",
    "output_items",
    "usage_object",
]

_FINISHED = JobState.FINISHED
_TEXT_DELTA_BASE = 4  # sequence number of the first delta: text turn 4, tool turn 3
_TOOL_DELTA_BASE = 3
_SEQUENCE_CACHED = 4096
_SEQUENCE = tuple(str(n).encode() for n in range(_SEQUENCE_CACHED))  # sequence numbers as bytes


@attrs.frozen(kw_only=True)
class ResponseShell:
    """What the response object says about the request (decided before generating)."""

    response_id: str
    created_at: int
    model: str
    instructions: str | None = None
    max_output_tokens: int  # the output cap the engine got (vLLM's sampling_params.max_tokens)
    previous_response_id: str | None = None
    tool_choice: object = "auto"
    tools: Sequence[object] = ()
    text: dict[str, object] | None = None  # the request's own ``text``, null when it sends none
    top_logprobs: int | None = None  # the engine's logprobs: null unless include asks for them
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    metadata: object = None
    user: str | None = None
    truncation: str | None = "disabled"
    service_tier: str | None = "auto"
    max_tool_calls: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def response(
        self,
        *,
        status: str,
        output: Sequence[object] = (),
        usage: object = None,
    ) -> dict[str, object]:
        """The response object: vLLM's ``ResponsesResponse``, every field in its order
        (``model_dump``, nulls kept; ``metrics`` left out when null), as ``from_request``
        fills it (vllm/entrypoints/openai/responses/protocol.py:870-1033): no ``error``,
        ``completed_at`` or ``store``; ``temperature``, ``top_p`` and the penalties the
        sampling values; ``top_logprobs`` the engine's logprobs, null unless asked."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.response_id,
            "created_at": self.created_at,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "metadata": self.metadata,
            "model": self.model,
            "object": "response",
            "output": list(output),
            "parallel_tool_calls": self.parallel_tool_calls,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "tool_choice": self.tool_choice,
            "tools": list(self.tools),
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "background": False,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": self.max_tool_calls,
            "previous_response_id": self.previous_response_id,
            "prompt": None,
            "prompt_cache_options": None,
            "prompt_cache_key": None,
            "prompt_cache_retention": None,
            "reasoning": None,
            "safety_identifier": None,
            "service_tier": self.service_tier,
            "status": status,
            "text": self.text,
            "top_logprobs": self.top_logprobs,
            "truncation": self.truncation,
            "usage": usage,
            "user": self.user,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }


@attrs.frozen
class TurnIds:
    """Ids of one turn's items, each its own random id as vLLM draws them, independent of
    the response id: ``msg_…`` for a message, ``fc_…`` and the call id
    ``chatcmpl-tool-…`` for a function call (vllm/entrypoints/openai/responses/
    serving.py:1071, streaming_events.py:839,1057-1059, utils.py:162-164)."""

    message_id: str
    function_id: str
    call_id: str

    @classmethod
    def of(cls, rng: random.Random) -> TurnIds:
        return cls(f"msg_{rng.getrandbits(64):016x}", f"fc_{rng.getrandbits(64):016x}", tool_call_id(rng))


class TokenLogprobs:
    """Per-token logprobs of a text turn (``include: ["message.output_text.logprobs"]``).

    Values come from :func:`~llmsim.model.logprobs.synthesize_logprobs`, a pure
    function of (token, position, seed), so a delta event and the final ``output_text``
    carry the same numbers.  A delta's entries are openai's ``Logprob`` of
    ``ResponseTextDeltaEvent`` (token, logprob, top_logprobs of token + logprob); the
    final part's carry ``bytes`` too.
    """

    def __init__(self, top_n: int, seed: int, eos: str) -> None:
        self._top_n = top_n
        self._seed = seed
        self._eos = eos  # how logprobs name the EOS token

    def delta(self, tokens: Sequence[str], index: int) -> bytes:
        """The ``logprobs`` array of token ``index``'s delta event (``tokens``: the
        turn's whole tokens)."""
        (value,) = synthesize_logprobs(
            tokens[index : index + 1], top_n=self._top_n, position_offset=index, seed=self._seed
        )
        top = [{"token": token, "logprob": logprob} for token, logprob in value.top]
        return orjson.dumps([{"token": value.token, "logprob": value.logprob, "top_logprobs": top}])

    def full(self, plan: TurnPlan, *, streamed: bool) -> list[dict[str, object]]:
        """The ``logprobs`` of a finished ``output_text`` part, each naming its whole
        token: one per token and the EOS token's; or, ``streamed``, its deltas' ones
        only (no EOS, no token whose text a stop string held back)."""
        block = plan.blocks[0]
        tokens = plan.token_texts[block.start : block.stop]
        if plan.ends_with_eos and not streamed:
            tokens = (*tokens, self._eos)
        values = synthesize_logprobs(tokens, top_n=self._top_n, seed=self._seed)
        if streamed:
            pieces = plan.pieces[block.start : block.stop]
            values = [value for value, piece in zip(values, pieces, strict=True) if piece]
        return [
            {
                "token": value.token,
                "bytes": list(value.bytes),
                "logprob": value.logprob,
                "top_logprobs": [{"token": t, "bytes": list(token_bytes(t)), "logprob": lp} for t, lp in value.top],
            }
            for value in values
        ]


def usage_object(job: Job) -> dict[str, object]:
    prompt = job.prompt_tokens
    output = job.completion_tokens
    # vllm/entrypoints/openai/responses/protocol.py:98-117, serving.py:896-919 (one turn of
    # a SimpleContext records no per-turn metrics, so the lists are empty)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": job.cached_tokens,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": output,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt + output,
    }


def _status(plan: TurnPlan) -> str:
    return "incomplete" if plan.truncated else "completed"


def _message_item(ids: TurnIds, text: str, status: str, logprobs: list[dict[str, object]] | None) -> dict[str, object]:
    part = {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}
    return {"id": ids.message_id, "content": [part], "role": "assistant", "status": status, "type": "message"}


def _function_item(ids: TurnIds, block: Block, arguments: str, status: str) -> dict[str, object]:
    return {
        "arguments": arguments,
        "call_id": ids.call_id,
        "name": block.name,
        "type": "function_call",
        "id": ids.function_id,
        "status": status,
    }


def output_items(
    plan: TurnPlan, ids: TurnIds, logprobs: TokenLogprobs | None, *, streamed: bool
) -> list[dict[str, object]]:
    """The output of a finished turn: one message, or one function_call."""
    block = plan.blocks[0]
    status = _status(plan)
    if block.kind == TEXT:
        lp = logprobs.full(plan, streamed=streamed) if logprobs is not None else None
        return [_message_item(ids, plan.block_text(block), status, lp)]
    return [_function_item(ids, block, plan.block_text(block), status)]


def final_response(
    shell: ResponseShell, plan: TurnPlan, ids: TurnIds, job: Job, logprobs: TokenLogprobs | None, *, streamed: bool
) -> dict[str, object]:
    """The response object of a finished turn (non-streaming body, the last event, the store).
    An abort ends it ``completed`` with what was generated: vLLM's ``SimpleContext``
    marks only ``length`` (vllm/entrypoints/openai/responses/serving.py:791-795,856-859)."""
    plan = as_emitted(plan, job.emitted, job.finish_reason)
    output = output_items(plan, ids, logprobs, streamed=streamed)
    return shell.response(status=_status(plan), output=output, usage=usage_object(job))


def _event(event_type: str, fields: bytes, sequence: int) -> bytes:
    """An event whose data is ``{<fields>,"sequence_number":n,"type":<type>}``."""
    data = b"{" + fields + b',"sequence_number":' + str(sequence).encode() + b',"type":"' + event_type.encode() + b'"}'
    return event_bytes(event_type, data)


class ResponsesStreamRenderer:
    """Renders the one job of a streaming /v1/responses request.

    ``final`` holds the response object of the last event (``response.completed`` or
    ``response.incomplete``) once the stream ended (the handler stores it).
    """

    def __init__(
        self,
        *,
        shell: ResponseShell,
        plan: TurnPlan,
        ids: TurnIds,
        logprobs: TokenLogprobs | None,
    ) -> None:
        self._shell = shell
        self._plan = plan
        self._ids = ids
        self._logprobs = logprobs
        self._block = block = plan.blocks[0]
        self._text = block.kind == TEXT
        self._next = 2  # sequence number of the next event, once the turn closed
        self._job: Job | None = None
        self._plain = logprobs is None or block.kind != TEXT  # the per-token fast path needs no logprobs
        self.final: dict[str, object] | None = None
        if self._text:
            item_id = json_bytes(ids.message_id)
            self._base = _TEXT_DELTA_BASE
            self._delta_open = b'event: response.output_text.delta\ndata: {"content_index":0,"delta":"'
            self._delta_lp = b'","item_id":' + item_id + b',"logprobs":'
            self._delta_seq = b',"output_index":0,"sequence_number":'
            self._delta_fixed = self._delta_lp + b"[]" + self._delta_seq  # without logprobs
        else:
            item_id = json_bytes(ids.function_id)
            self._base = _TOOL_DELTA_BASE
            self._delta_open = b'event: response.function_call_arguments.delta\ndata: {"delta":"'
            self._delta_fixed = b'","item_id":' + item_id + b',"output_index":0,"sequence_number":'
        self._delta_close = (
            b',"type":"response.output_text.delta"}\n\n'
            if self._text
            else b',"type":"response.function_call_arguments.delta"}\n\n'
        )

    # --- StreamRenderer ------------------------------------------------------------------

    def head(self) -> bytes:
        """``response.created`` and ``response.in_progress`` (sent at once, like vLLM)."""
        shell = json_bytes(self._shell.response(status="in_progress"))
        return _event("response.created", b'"response":' + shell, 0) + _event(
            "response.in_progress", b'"response":' + shell, 1
        )

    def render(self, job: Job, start: int, stop: int) -> bytes:
        if start and stop - start == 1 and job.state is not _FINISHED and self._plain:  # the common case
            piece = job.output[start]
            if not piece:
                return self._skip()
            sequence = self._base + start
            number = _SEQUENCE[sequence] if sequence < _SEQUENCE_CACHED else str(sequence).encode()
            return self._delta_open + escape(piece) + self._delta_fixed + number + self._delta_close
        events = []
        if start == 0:
            self._job = job
            events.append(self._opening())
        events.extend(self._delta(job, i) if job.output[i] else self._skip() for i in range(start, stop))
        if job.state is _FINISHED:
            self._plan = as_emitted(self._plan, job.emitted, job.finish_reason)  # an abort: what was sent
            events.append(self._closing(job))
            self._job = None  # error() needs it no more, and job -> sink -> self would be a reference cycle
        return b"".join(events)

    def plain_tokens(self) -> PlainTokens | None:
        return None

    def tail(self, jobs: Sequence[Job]) -> bytes:
        self.final = final_response(self._shell, self._plan, self._ids, jobs[0], self._logprobs, streamed=True)
        terminal = "response.incomplete" if self._plan.truncated else "response.completed"
        return _event(terminal, b'"response":' + json_bytes(self.final), self._next)

    def error(self, error: ApiError) -> bytes:
        sequence = self._next
        if self._job is not None and self._job.state is not _FINISHED:
            sequence = self._base + self._job.emitted  # the deltas sent so far
        data = json_bytes(
            {
                "type": "error",
                "code": error.error_type,
                "message": error.message,
                "param": error.param,
                "sequence_number": sequence,
            }
        )
        return event_bytes("error", data)

    # --- events ----------------------------------------------------------------------------

    def _skip(self) -> bytes:
        """No event for a token of empty text (the EOS): the deltas after it, and the
        closing events, number one lower."""
        self._base -= 1
        return b""

    def _delta(self, job: Job, index: int) -> bytes:
        if self._logprobs is None or not self._text:
            middle = self._delta_fixed
        else:
            middle = self._delta_lp + self._logprobs.delta(self._plan.token_texts, index) + self._delta_seq
        sequence = self._base + index
        number = _SEQUENCE[sequence] if sequence < _SEQUENCE_CACHED else str(sequence).encode()
        return self._delta_open + escape(job.output[index]) + middle + number + self._delta_close

    def _opening(self) -> bytes:
        ids = self._ids
        if self._text:
            item: dict[str, object] = {
                "id": ids.message_id,
                "content": [],
                "role": "assistant",
                "status": "in_progress",
                "type": "message",
            }
            part = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
            item_id = json_bytes(ids.message_id)
            return _event(
                "response.output_item.added", b'"item":' + json_bytes(item) + b',"output_index":0', 2
            ) + _event(
                "response.content_part.added",
                b'"content_index":0,"item_id":' + item_id + b',"output_index":0,"part":' + json_bytes(part),
                3,
            )
        item = _function_item(ids, self._block, "", "in_progress")
        return _event("response.output_item.added", b'"item":' + json_bytes(item) + b',"output_index":0', 2)

    def _closing(self, job: Job) -> bytes:
        plan, ids = self._plan, self._ids
        [item] = output_items(plan, ids, self._logprobs, streamed=True)
        text = plan.block_text(self._block)
        seq = self._base + job.emitted
        events = []
        if self._text:
            item_id = json_bytes(ids.message_id)
            part = item["content"][0]  # type: ignore[index]
            data = (  # "text" sorts after "sequence_number" in this event
                b'{"content_index":0,"item_id":'
                + item_id
                + b',"logprobs":[],"output_index":0,"sequence_number":'
                + str(seq).encode()
                + b',"text":'
                + json_bytes(text)
                + b',"type":"response.output_text.done"}'
            )
            events.append(event_bytes("response.output_text.done", data))
            events.append(
                _event(
                    "response.content_part.done",
                    b'"content_index":0,"item_id":' + item_id + b',"output_index":0,"part":' + json_bytes(part),
                    seq + 1,
                )
            )
            seq += 2
        else:
            fields = (
                b'"arguments":'
                + json_bytes(text)
                + b',"item_id":'
                + json_bytes(ids.function_id)
                + b',"name":'
                + json_bytes(self._block.name)
                + b',"output_index":0'
            )
            events.append(_event("response.function_call_arguments.done", fields, seq))
            seq += 1
        events.append(_event("response.output_item.done", b'"item":' + json_bytes(item) + b',"output_index":0', seq))
        self._next = seq + 1
        return b"".join(events)
