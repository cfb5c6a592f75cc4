"""Structured output on /v1/chat/completions and /v1/completions: ``response_format``
(vllm/entrypoints/openai/chat_completion/protocol.py:252, completion/protocol.py:125) and
vLLM's ``structured_outputs`` (vllm/sampling_params.py:102-113), normalised as
``structured_outputs_from_response_format`` does (vllm/entrypoints/generate/base/protocol.py:181-211).
The streamed text satisfies the constraint, token by token, and ends with the EOS token
(vllm/v1/engine/detokenizer.py:107-128) or ``length`` when cut."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from tests.api.fakes import UNSATISFIABLE_SCHEMA, post, running, sse_payloads

MODEL = "llmsim/sim-model"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Tell me about Paris."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": HELLO, "max_tokens": 400, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Paris is", "max_tokens": 400, **fields}


def streamed_text(body: bytes, index: int = 0) -> tuple[list[str], str | None]:
    """The content pieces of choice ``index``, one per chunk, and its finish reason."""
    pieces, finish = [], None
    for payload in sse_payloads(body):
        if payload == "[DONE]" or not payload["choices"]:
            continue
        choice = payload["choices"][0]
        if choice["index"] != index:
            continue
        piece = choice["delta"].get("content") if "delta" in choice else choice["text"]
        if piece:
            pieces.append(piece)
        finish = choice["finish_reason"] or finish
    return pieces, finish


@pytest.mark.parametrize(
    ("fields", "check"),
    [
        ({"response_format": JSON_SCHEMA_FORMAT}, lambda text: jsonschema.validate(json.loads(text), PERSON)),
        ({"structured_outputs": {"json": PERSON}}, lambda text: jsonschema.validate(json.loads(text), PERSON)),
        # ``json`` may also be the schema's JSON text (sampling_params.py:104)
        (
            {"structured_outputs": {"json": json.dumps(PERSON)}},
            lambda text: jsonschema.validate(json.loads(text), PERSON),
        ),
        ({"response_format": {"type": "json_object"}}, lambda text: isinstance(json.loads(text), dict) or 1 / 0),
        ({"structured_outputs": {"json_object": True}}, lambda text: isinstance(json.loads(text), dict) or 1 / 0),
        (
            {"structured_outputs": {"regex": r"[A-Z]{2}-\d{3}(x|yz)?"}},
            lambda text: re.fullmatch(r"[A-Z]{2}-\d{3}(x|yz)?", text) or 1 / 0,
        ),
        (
            {"structured_outputs": {"choice": ["positive", "negative", "neutral"]}},
            lambda text: text in ("positive", "negative", "neutral") or 1 / 0,
        ),
    ],
    ids=["response_format json_schema", "json", "json text", "json_object", "so json_object", "regex", "choice"],
)
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_streamed_output_satisfies_the_constraint(
    path: str, fields: dict[str, Any], check: Any, autojump_clock: MockClock
) -> None:
    body = (chat if path == CHAT else completion)(n=3, stream=True, **fields)
    async with running() as sim:
        streamed = await post(sim, path, body)
        whole = await post(sim, path, {**body, "stream": False})
    assert streamed.status == whole.status == 200, (streamed.body, whole.body)
    for index in range(3):
        pieces, finish = streamed_text(streamed.body, index)
        text = "".join(pieces)
        check(text)
        assert finish == "stop"
        choice = whole.json()["choices"][index]
        check(choice["message"]["content"] if path == CHAT else choice["text"])
    if fields.get("structured_outputs", {}).get("choice") is None:
        assert len(pieces) > 1  # token by token, not one chunk


async def test_schema_output_ends_with_its_eos_token_counted_in_usage(autojump_clock: MockClock) -> None:
    """The model ends the JSON itself: an EOS chunk (empty content, ``stop``) after the
    last text token, counted in ``completion_tokens`` (vllm/v1/engine/detokenizer.py:107-128)."""
    body = chat(response_format=JSON_SCHEMA_FORMAT, stream=True, stream_options={"include_usage": True})
    async with running() as sim:
        response = await post(sim, CHAT, body)
    chunks = [p for p in sse_payloads(response.body) if p != "[DONE]"]
    token_chunks = [c for c in chunks if c["choices"] and "role" not in c["choices"][0]["delta"]]
    last = token_chunks[-1]["choices"][0]
    assert last["delta"] == {"content": ""} and last["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in token_chunks[:-1])
    assert chunks[-1]["usage"]["completion_tokens"] == len(token_chunks)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_a_complete_structure_ends_before_min_tokens(path: str, autojump_clock: MockClock) -> None:
    """vLLM 0.33 lifts ``min_tokens``' ban on the EOS token when the grammar allows
    nothing else (``MinTokensLogitsProcessor``, vllm/v1/sample/logits_processor/
    builtin.py:253-277), and the scheduler stops on EOS before it looks at min_tokens
    (vllm/v1/core/sched/utils.py:103-105, 122-127): the completed choice wins, so the
    answer ends with its EOS token well short of ``min_tokens``."""
    build = chat if path == CHAT else completion
    body = build(structured_outputs={"choice": ["yes", "no"]}, min_tokens=50, max_tokens=60)
    async with running() as sim:
        response = await post(sim, path, body)
    choice = response.json()["choices"][0]
    text = choice["message"]["content"] if path == CHAT else choice["text"]
    assert (text in ("yes", "no"), choice["finish_reason"]) == (True, "stop")
    assert response.json()["usage"]["completion_tokens"] == 2  # the choice's one token and the EOS


async def test_output_cut_at_max_tokens_finishes_length(autojump_clock: MockClock) -> None:
    body = chat(response_format=JSON_SCHEMA_FORMAT, max_tokens=3)
    async with running() as sim:
        response = await post(sim, CHAT, body)
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert response.json()["usage"]["completion_tokens"] == 3
    with pytest.raises(ValueError):
        json.loads(choice["message"]["content"])


async def test_response_format_text_and_absent_answer_with_prose(autojump_clock: MockClock) -> None:
    async with running(seed=7) as sim:
        plain = await post(sim, CHAT, chat(seed=1), ((b"x-request-id", b"r"),))
        text = await post(sim, CHAT, chat(seed=1, response_format={"type": "text"}), ((b"x-request-id", b"r"),))
    assert plain.json()["choices"][0]["message"] == text.json()["choices"][0]["message"]


async def test_tool_calls_beside_structured_outputs_answer_text_in_the_constraint(autojump_clock: MockClock) -> None:
    """tool_choice ``none`` with a constraint: the text follows the constraint."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    body = chat(tools=[tool], tool_choice="none", structured_outputs={"choice": ["yes", "no"]})
    async with running() as sim:
        response = await post(sim, CHAT, body)
    assert response.json()["choices"][0]["message"]["content"] in ("yes", "no")


@pytest.mark.parametrize(
    ("path", "fields", "param", "message"),
    [
        # vllm/entrypoints/openai/chat_completion/protocol.py:840-851
        (
            CHAT,
            {"response_format": {"type": "json_schema"}},
            "response_format",
            "When response_format type is 'json_schema', the 'json_schema' field must be provided. "
            "(parameter=response_format)",
        ),
        (
            CHAT,
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
            "response_format.json_schema.schema",
            "Schema validation failed",
        ),
        (
            COMPLETIONS,
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
            "response_format.json_schema.schema",
            "Schema validation failed",
        ),
        (CHAT, {"response_format": {"type": "xml"}}, "response_format.type", "Invalid response_format type 'xml'"),
        (CHAT, {"structured_outputs": {"regex": "(a"}}, "structured_outputs.regex", "Invalid regex"),
        (CHAT, {"structured_outputs": {"regex": "a(?=b)"}}, "structured_outputs.regex", "Invalid regex"),
        (CHAT, {"structured_outputs": {"json": "{not json"}}, "structured_outputs.json", "Invalid JSON schema"),
        (CHAT, {"structured_outputs": {"json": {"type": "nope"}}}, "structured_outputs.json", "Schema validation"),
        (CHAT, {"structured_outputs": {"choice": []}}, "structured_outputs.choice", "at least one"),
        (CHAT, {"structured_outputs": {"grammar": "root ::= 'a'"}}, "structured_outputs.grammar", "grammar"),
        # vllm/entrypoints/openai/chat_completion/protocol.py:950-956 (chat names no parameter)
        (
            CHAT,
            {"structured_outputs": {"regex": "a", "choice": ["a"]}},
            None,
            "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice').",
        ),
        # vllm/entrypoints/openai/completion/protocol.py:513-518 (completions names structured_outputs)
        (
            COMPLETIONS,
            {"structured_outputs": {"regex": "a", "choice": ["a"]}},
            "structured_outputs",
            "You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice'). "
            "(parameter=structured_outputs)",
        ),
        # vllm/entrypoints/openai/chat_completion/protocol.py:957-966
        (
            CHAT,
            {
                "structured_outputs": {"choice": ["a"]},
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            None,
            "You can only either use constraints for structured outputs or tools, not both.",
        ),
        # request-validation errors (their envelope is the structure layer's)
        (CHAT, {"response_format": "json"}, None, "response_format"),
        (CHAT, {"response_format": {"type": "json_schema", "json_schema": {}}}, None, "name"),
    ],
)
async def test_invalid_constraints_are_400_naming_the_field(
    path: str, fields: dict[str, Any], param: str | None, message: str, autojump_clock: MockClock
) -> None:
    body = (chat if path == CHAT else completion)(**fields)
    async with running() as sim:
        response = await post(sim, path, body)
        submitted = sim.engine.statistics().submitted
    assert response.status == 400, response.body
    error = response.json()["error"]
    if param is not None:
        assert error["param"] == param
    assert message in error["message"]
    assert submitted == 0


REGEXES = st.sampled_from(
    [
        r"\d{3}-\d{4}",
        r"(yes|no|maybe)",
        r"[a-f0-9]{8}",
        r"[A-Z][a-z]+( [A-Z][a-z]+)?",
        r"^\w+@example\.com$",
        r"(ab|c)*d",
        r"-?\d+(\.\d{1,2})?",
    ]
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=20)
@given(pattern=REGEXES, seed=st.integers(0, 1000))
async def test_regex_output_matches_in_full(pattern: str, seed: int, autojump_clock: MockClock) -> None:
    body = chat(structured_outputs={"regex": pattern}, stream=True, seed=seed)
    async with running() as sim:
        response = await post(sim, CHAT, body)
    pieces, finish = streamed_text(response.body)
    assert re.fullmatch(pattern, "".join(pieces)), pieces
    assert finish == "stop"


async def test_a_schema_that_admits_no_value_is_a_400(autojump_clock: MockClock) -> None:
    """Accepted at compile time, but ``uniqueItems`` cannot be met: the client's 400, not a 500."""
    async with running() as sim:
        chat_response = await post(sim, CHAT, chat(structured_outputs={"json": UNSATISFIABLE_SCHEMA}))
        completion_response = await post(
            sim, COMPLETIONS, completion(structured_outputs={"json": UNSATISFIABLE_SCHEMA})
        )
    for response in (chat_response, completion_response):
        assert response.status == 400, response.body
        assert "Cannot generate a value" in response.json()["error"]["message"]
