"""The official anthropic SDK against a running simulator: messages.create (streaming
and not), the ``messages.stream()`` helper, a tool_use round trip, count_tokens, and
the SDK's exception classes for our (Anthropic-shaped) errors — over HTTP/1.1 and
HTTP/2 (prior knowledge, through the SDK's own httpx2 client), on every server
backend.  Latencies are tiny and real."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx2  # the anthropic SDK runs on httpx2 and rejects httpx clients
import jsonschema
import pytest
import trio

from llmsim.server import ServerHandle

MODEL = "sim-model"
SEED = 11
MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about the weather."}]
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 3},
    },
    "required": ["city"],
}
TOOLS: list[Any] = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER_SCHEMA}]


@pytest.fixture
async def client(llmsim_server: ServerHandle, http_kwargs: dict[str, Any]) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with httpx2.AsyncClient(**http_kwargs) as http_client:
        yield anthropic.AsyncAnthropic(
            base_url=llmsim_server.url, api_key="unused", max_retries=0, http_client=http_client
        )


async def test_create_non_streaming(client: anthropic.AsyncAnthropic) -> None:
    message = await client.messages.create(
        model=MODEL, max_tokens=10, system="Be brief.", messages=MESSAGES, extra_body={"ignore_eos": True}
    )
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == MODEL
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    [block] = message.content
    assert block.type == "text" and block.text
    assert message.usage.output_tokens == 10 and message.usage.input_tokens > 0
    assert message.usage.cache_read_input_tokens == 0 and message.usage.cache_creation_input_tokens == 0


async def test_create_streaming(client: anthropic.AsyncAnthropic) -> None:
    stream = await client.messages.create(model=MODEL, max_tokens=50, messages=MESSAGES, stream=True)
    events = [event async for event in stream]
    types = [event.type for event in events]
    assert types[:2] == ["message_start", "content_block_start"]
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    deltas = [event for event in events if event.type == "content_block_delta"]
    assert deltas and all(event.delta.type == "text_delta" for event in deltas)  # type: ignore[union-attr]
    stop_reason = events[-2].delta.stop_reason  # type: ignore[union-attr]
    assert stop_reason in ("end_turn", "max_tokens")
    # an ended turn's EOS token counts and sends no delta (vllm/entrypoints/anthropic/serving.py:97-98)
    assert events[-2].usage.output_tokens == len(deltas) + (stop_reason == "end_turn")  # type: ignore[union-attr]


async def test_stream_helper_final_message(client: anthropic.AsyncAnthropic) -> None:
    async with client.messages.stream(model=MODEL, max_tokens=30, messages=MESSAGES) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.usage.output_tokens >= 1 and final.usage.input_tokens > 0


async def test_tool_use_round_trip(client: anthropic.AsyncAnthropic) -> None:
    first = await client.messages.create(
        model=MODEL, max_tokens=200, messages=MESSAGES, tools=TOOLS, tool_choice={"type": "any"}
    )
    assert first.stop_reason == "tool_use"
    calls = [block for block in first.content if block.type == "tool_use"]
    assert calls and all(call.id.startswith("toolu_") and call.name == "get_weather" for call in calls)
    for call in calls:
        jsonschema.validate(call.input, WEATHER_SCHEMA)

    second = await client.messages.create(
        model=MODEL,
        max_tokens=50,
        tools=TOOLS,
        tool_choice={"type": "none"},
        messages=[
            *MESSAGES,
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "21 degrees"} for call in calls],
            },
        ],
    )
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert second.content[0].type == "text" and second.content[0].text
    assert second.usage.input_tokens > first.usage.input_tokens


async def test_tool_use_stream_helper(client: anthropic.AsyncAnthropic) -> None:
    async with client.messages.stream(
        model=MODEL, max_tokens=200, messages=MESSAGES, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}
    ) as stream:
        final = await stream.get_final_message()
    [call] = final.content
    assert call.type == "tool_use" and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER_SCHEMA)
    assert final.stop_reason == "tool_use"


async def test_count_tokens_matches_usage(client: anthropic.AsyncAnthropic) -> None:
    counted = await client.messages.count_tokens(model=MODEL, messages=MESSAGES, system="Be brief.", tools=TOOLS)
    message = await client.messages.create(
        model=MODEL, max_tokens=5, messages=MESSAGES, system="Be brief.", tools=TOOLS, tool_choice={"type": "none"}
    )
    assert counted.input_tokens == message.usage.input_tokens


async def test_errors(client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as not_found:
        await client.messages.create(model="nope", max_tokens=5, messages=MESSAGES)
    assert not_found.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "The model `nope` does not exist. Valid aliases: sim-model."},
    }
    with pytest.raises(anthropic.BadRequestError) as missing:
        # timeout given: the SDK would otherwise compute one from max_tokens
        await client.messages.create(model=MODEL, max_tokens=anthropic.omit, messages=MESSAGES, timeout=30)  # type: ignore[arg-type]
    assert missing.value.body["error"]["message"] == "max_tokens: Field required"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        await client.messages.create(
            model=MODEL, max_tokens=5, messages=MESSAGES, tools=TOOLS, tool_choice={"type": "tool", "name": "x"}
        )


async def test_sync_client(llmsim_server: ServerHandle, http_kwargs: dict[str, Any]) -> None:
    def use_sync_client() -> tuple[Any, Any]:
        with httpx2.Client(**http_kwargs) as http_client:
            client = anthropic.Anthropic(
                base_url=llmsim_server.url, api_key="unused", max_retries=0, http_client=http_client
            )
            created = client.messages.create(model=MODEL, max_tokens=5, messages=MESSAGES)
            with client.messages.stream(model=MODEL, max_tokens=5, messages=MESSAGES) as stream:
                final = stream.get_final_message()
            return created, final

    created, final = await trio.to_thread.run_sync(use_sync_client)
    assert created.content[0].text and final.content[0].text
