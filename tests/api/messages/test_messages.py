"""/v1/messages and /v1/messages/count_tokens through the real router, engine and
generators on trio's mock clock (no server): Anthropic-shaped errors, tool_choice
rules, stop sequences, token counting."""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest
import trio
from trio.testing import MockClock

from llmsim.api.http import HttpRequest
from tests.api.fakes import FakeResponse, post, running

PATH = "/v1/messages"
LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
HELLO: list[Any] = [{"role": "user", "content": "Hello there, how are you?"}]
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}
TOOLS: list[Any] = [
    {"name": "get_weather", "description": "Weather", "input_schema": SCHEMA},
    {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
]


def message(**fields: Any) -> dict[str, Any]:
    return {"model": "llmsim/sim-model", "max_tokens": 32, "messages": HELLO, **fields}


async def test_non_streaming_message(autojump_clock: MockClock) -> None:
    async with running(**LATENCY) as sim:
        started = trio.current_time()
        response = await post(
            sim, PATH, message(max_tokens=5, ignore_eos=True, system=[{"type": "text", "text": "Be brief."}])
        )
        elapsed = trio.current_time() - started
    body = response.json()
    assert response.status == 200 and elapsed == pytest.approx(0.14)
    assert body["id"].startswith("msg_") and body["type"] == "message" and body["role"] == "assistant"
    assert list(body) == ["id", "type", "role", "content", "model", "stop_reason", "stop_sequence", "usage"]
    assert body["stop_reason"] == "max_tokens" and body["stop_sequence"] is None
    assert body["content"][0]["type"] == "text" and body["content"][0]["text"]
    assert body["usage"]["output_tokens"] == 5


async def test_stream_starts_with_the_first_token(autojump_clock: MockClock) -> None:
    async with running(**LATENCY) as sim:
        started = trio.current_time()
        response = await post(sim, PATH, message(max_tokens=3, ignore_eos=True, stream=True))
    assert response.headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert [round(when - started, 6) for when, _ in response.writes] == [0.1, 0.11, 0.12]
    assert response.writes[0][1].startswith(b"event: message_start\n")
    assert response.body.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')


@pytest.mark.parametrize(
    ("body", "message_text"),
    [
        ({"model": "llmsim/sim-model", "messages": HELLO}, "max_tokens: Field required"),
        (message(max_tokens=0), "max_tokens: must be greater than or equal to 1"),
        (message(messages=[]), "messages: at least one message is required"),
        # vLLM's request-validation text (vllm/entrypoints/serve/exception_handling/handlers/validation.py:149-196)
        (
            {"model": "llmsim/sim-model", "max_tokens": 5},
            "{'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required'",
        ),
        (
            message(messages=[{"role": "system", "content": "x"}]),
            "messages.0.role: Input should be 'user' or 'assistant'",
        ),
        (
            message(messages=[{"role": "user", "content": [{"type": "image"}]}]),
            "messages.0.content.0.source: Field required",
        ),
        (
            message(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]),
            "messages.0.content.0.source.data: Field required",
        ),
        (message(messages=[{"role": "user", "content": [{"type": "tool_result"}]}]), "tool_use_id: Field required"),
        (message(messages=[{"role": "user", "content": [{"type": "video"}]}]), "Unknown content block type 'video'"),
        (message(max_tokens="x"), "{'type': 'int_parsing', 'loc': 'body.max_tokens'"),
        (message(tools=TOOLS, tool_choice={"type": "tool"}), "tool_choice.name: Field required"),
        (message(tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}), "Tool 'nope' not found"),
        (message(tools=TOOLS, tool_choice={"type": "sometimes"}), "tool_choice.type: Input should be"),
        (message(tools=[{"name": "f"}]), "tools.0.input_schema: Field required"),
        (message(tools=[{"name": "f", "input_schema": {"type": "object", "if": {}}}]), "Tool validation failed"),
    ],
)
async def test_errors_are_anthropic_shaped(autojump_clock: MockClock, body: dict[str, Any], message_text: str) -> None:
    async with running() as sim:
        response = await post(sim, PATH, body)
    assert response.status == 400, response.body
    assert set(response.json()) == {"type", "error"} and response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert message_text in response.json()["error"]["message"]


async def test_not_found_malformed_json_and_wrong_method(autojump_clock: MockClock) -> None:
    async with running() as sim:
        unknown = await post(sim, PATH, message(model="claude-nope"))
        malformed = await post(sim, PATH, b"{not json")
        wrong_method = FakeResponse()
        await sim.app.handle(HttpRequest("GET", PATH), wrong_method)
    assert unknown.status == 404
    assert unknown.json() == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "The model `claude-nope` does not exist. Valid aliases: llmsim/sim-model.",
        },
    }
    assert malformed.status == 400 and malformed.json()["error"]["type"] == "invalid_request_error"
    assert wrong_method.status == 405
    assert wrong_method.json()["type"] == "error"
    assert wrong_method.json()["error"]["type"] == "invalid_request_error"


async def test_tool_choice_rules(autojump_clock: MockClock) -> None:
    async with running() as sim:
        anys = [
            (await post(sim, PATH, message(tools=TOOLS, tool_choice={"type": "any"}, max_tokens=200))).json()
            for _ in range(8)
        ]
        forced = (
            await post(sim, PATH, message(tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}))
        ).json()
        none = (await post(sim, PATH, message(tools=TOOLS, tool_choice={"type": "none"}))).json()
        autos = [(await post(sim, PATH, message(tools=TOOLS, max_tokens=200))).json() for _ in range(12)]
        single = [
            (
                await post(
                    sim, PATH, message(tools=TOOLS, tool_choice={"type": "any", "disable_parallel_tool_use": True})
                )
            ).json()
            for _ in range(8)
        ]
    for body in anys:
        assert body["stop_reason"] == "tool_use" and body["content"]
        assert all(block["type"] == "tool_use" and block["id"].startswith("toolu_") for block in body["content"])
        assert len({block["id"] for block in body["content"]}) == len(body["content"])
        for block in body["content"]:
            if block["name"] == "get_weather":
                jsonschema.validate(block["input"], SCHEMA)
    assert [b["name"] for b in forced["content"]] == ["get_weather"] and forced["stop_reason"] == "tool_use"
    assert none["content"][0]["type"] == "text" and none["stop_reason"] in ("end_turn", "max_tokens")
    assert {body["stop_reason"] for body in autos} >= {"tool_use"}
    assert any(body["content"][0]["type"] == "text" for body in autos)  # auto may answer with text
    assert all(len(body["content"]) == 1 for body in single)


async def test_stop_sequences_cut_the_text(autojump_clock: MockClock) -> None:
    """vLLM passes ``stop_sequences`` to chat as ``stop`` (anthropic/serving.py:643-646):
    the echoed "one", " two", " STOP", " three" stop at the token completing "STOP", which
    counts (3 output tokens; 5 without a stop: 4 and the EOS); a stream holds back 3
    characters while "STOP" could be forming, and a token whose text is all held back
    sends no delta (serving.py:1118-1120)."""
    async with running(mode="echo") as sim:
        body = message(messages=[{"role": "user", "content": "one two STOP three"}], stop_sequences=["STOP", "zzz"])
        response = (await post(sim, PATH, body)).json()
        streamed = await post(sim, PATH, {**body, "stream": True})
        unstopped = (await post(sim, PATH, {**body, "stop_sequences": ["zzz"]})).json()
    assert response["content"][0]["text"] == "one two "
    assert (response["stop_reason"], response["stop_sequence"]) == ("stop_sequence", "STOP")
    assert response["usage"]["output_tokens"] == 3 and unstopped["usage"]["output_tokens"] == 5
    assert (
        b'"delta":{"stop_reason":"stop_sequence","stop_sequence":"STOP"},"usage":{"output_tokens":3}' in streamed.body
    )
    texts = [line for line in streamed.body.split(b"\n") if b'"text_delta"' in line]
    assert [orjson.loads(line[6:])["delta"]["text"] for line in texts] == ["o", "ne t", "wo "]


async def test_count_tokens_matches_usage_and_history_counts(autojump_clock: MockClock) -> None:
    conversation = [
        *HELLO,
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "unit": "c"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21"}]}],
        },
    ]
    fields = {"messages": conversation, "system": "Be brief.", "tools": TOOLS}
    async with running() as sim:
        counted = await post(sim, f"{PATH}/count_tokens", {"model": "llmsim/sim-model", **fields})
        created = await post(sim, PATH, message(**fields, tool_choice={"type": "none"}))
        short = await post(sim, f"{PATH}/count_tokens", {"model": "llmsim/sim-model", "messages": HELLO})
        bad = await post(sim, f"{PATH}/count_tokens", {"model": "llmsim/sim-model", "messages": []})
    tokens = created.json()["usage"]["input_tokens"]
    # vllm/entrypoints/anthropic/serving.py:1276-1281 (dumped with exclude_none)
    assert counted.body == b'{"input_tokens":%d,"context_management":{"original_input_tokens":%d}}' % (tokens, tokens)
    assert short.json()["input_tokens"] < counted.json()["input_tokens"]
    assert bad.status == 400 and bad.json()["type"] == "error"


async def test_echo_mode_and_request_id(autojump_clock: MockClock) -> None:
    content = [
        {"type": "text", "text": "say this"},
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
    ]
    async with running(mode="echo") as sim:
        response = await post(
            sim, PATH, message(messages=[{"role": "user", "content": content}]), headers=((b"x-request-id", b"abc"),)
        )
    assert response.json()["content"][0]["text"] == "say this"
    assert response.json()["id"] == "msg_abc" and response.headers[b"x-request-id"] == b"abc"
