"""The official openai SDK's Responses API against a running simulator: create
(streaming and not), the ``responses.stream()`` helper, a two-turn tool conversation
through function_call_output, previous_response_id chaining, retrieve, structured
output and logprobs — over HTTP/1.1 and HTTP/2 (prior knowledge), on every server
backend.  Latencies are tiny and real."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import trio

from llmsim.server import ServerHandle

MODEL = "sim-model"
SEED = 5
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER_SCHEMA}
]


@pytest.fixture
async def client(llmsim_server: ServerHandle, http_kwargs: dict[str, Any]) -> AsyncIterator[openai.AsyncOpenAI]:
    async with httpx.AsyncClient(**http_kwargs) as http_client:
        yield openai.AsyncOpenAI(
            base_url=f"{llmsim_server.url}/v1", api_key="unused", max_retries=0, http_client=http_client
        )


async def test_create_non_streaming(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(
        model=MODEL,
        input="Tell me a story.",
        instructions="Be brief.",
        max_output_tokens=12,
        extra_body={"ignore_eos": True},
    )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.model == MODEL and response.instructions == "Be brief."
    assert response.status == "incomplete"  # ignore_eos: the cap is hit
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    assert response.output_text and response.output_text == message.content[0].text
    usage = response.usage
    assert usage is not None and usage.output_tokens == 12
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0 and usage.output_tokens_details.reasoning_tokens == 0


async def test_create_streaming(client: openai.AsyncOpenAI) -> None:
    stream = await client.responses.create(
        model=MODEL,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Hi"},
                    {"type": "input_image", "image_url": "https://x/y.png"},
                ],
            }
        ],
        stream=True,
    )
    events = [event async for event in stream]
    types = [event.type for event in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[-1].response.status == "completed"  # type: ignore[union-attr]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert deltas and all(event.content_index == 0 and event.output_index == 0 for event in deltas)
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == "".join(event.delta for event in deltas)  # type: ignore[union-attr]
    # the EOS token counts, and sends no delta (vllm/entrypoints/openai/responses/context.py:223)
    assert completed.usage is not None and completed.usage.output_tokens == len(deltas) + 1


async def test_stream_helper_final_response(client: openai.AsyncOpenAI) -> None:
    texts: list[str] = []
    async with client.responses.stream(model=MODEL, input="Hello") as stream:
        async for event in stream:
            if event.type == "response.output_text.delta":
                texts.append(event.delta)
        final = await stream.get_final_response()
    assert final.output_text == "".join(texts)
    assert final.status == "completed"


async def test_a_stream_cut_by_max_output_tokens_ends_with_response_incomplete(client: openai.AsyncOpenAI) -> None:
    # vLLM 0.33 ends it with response.incomplete (vllm/entrypoints/openai/responses/serving.py:1442-1456),
    # as OpenAI does; the SDK parses the event, and its stream() helper, which builds its final
    # response from response.completed only (openai/lib/streaming/responses/_responses.py), has none
    stream = await client.responses.create(
        model=MODEL, input="Tell me a story.", max_output_tokens=6, stream=True, extra_body={"ignore_eos": True}
    )
    events = [event async for event in stream]
    assert [event.type for event in events][-2:] == ["response.output_item.done", "response.incomplete"]
    last = events[-1]
    assert isinstance(last, openai.types.responses.ResponseIncompleteEvent)
    assert last.response.status == "incomplete" and last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.usage is not None and last.response.usage.output_tokens == 6
    assert last.response.output_text == "".join(e.delta for e in events if e.type == "response.output_text.delta")
    async with client.responses.stream(
        model=MODEL, input="Hi", max_output_tokens=3, extra_body={"ignore_eos": True}
    ) as helper:
        kinds = [event.type async for event in helper]
        with pytest.raises(RuntimeError, match=r"`response\.completed`"):
            await helper.get_final_response()
    assert kinds[-1] == "response.incomplete"
    stored = await client.responses.retrieve(last.response.id)
    assert stored.status == "incomplete" and stored.output_text == last.response.output_text


async def test_two_turn_tool_conversation(client: openai.AsyncOpenAI) -> None:
    first = await client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=TOOLS)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.id is not None and call.id.startswith("fc_") and call.call_id.startswith("chatcmpl-tool-")
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)

    second = await client.responses.create(
        model=MODEL,
        tools=TOOLS,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21}'},
        ],
    )
    [message] = second.output
    assert message.type == "message" and second.output_text
    assert second.usage is not None and second.usage.input_tokens > first.usage.input_tokens  # type: ignore[union-attr]


async def test_tool_turn_streaming_and_named_choice(client: openai.AsyncOpenAI) -> None:
    tools = [*TOOLS, {"type": "function", "name": "noop", "parameters": {"type": "object", "properties": {}}}]
    async with client.responses.stream(
        model=MODEL, input="Weather?", tools=tools, tool_choice={"type": "function", "name": "get_weather"}
    ) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    types = [event.type for event in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    [call] = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)


async def test_previous_response_id_chain_and_retrieve(client: openai.AsyncOpenAI) -> None:
    first = await client.responses.create(model=MODEL, input="Remember the number 7.", max_output_tokens=10)
    second = await client.responses.create(
        model=MODEL, input="Which number?", previous_response_id=first.id, max_output_tokens=10
    )
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    fetched = await client.responses.retrieve(second.id)
    assert fetched.id == second.id and fetched.output_text == second.output_text
    with pytest.raises(openai.NotFoundError) as caught:
        await client.responses.retrieve("resp_missing")
    assert caught.value.message.endswith("Response with id 'resp_missing' not found.")
    assert caught.value.body == {
        "message": "Response with id 'resp_missing' not found.",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": 404,
    }
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model=MODEL, input="x", previous_response_id="resp_missing")


async def test_streamed_response_is_stored(client: openai.AsyncOpenAI) -> None:
    async with client.responses.stream(model=MODEL, input="Hi") as stream:
        final = await stream.get_final_response()
    fetched = await client.responses.retrieve(final.id)
    assert fetched.output_text == final.output_text and fetched.usage == final.usage


async def test_structured_output_and_logprobs(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(
        model=MODEL,
        input="Weather as JSON",
        text={"format": {"type": "json_schema", "name": "weather", "schema": WEATHER_SCHEMA}},
    )
    jsonschema.validate(json.loads(response.output_text), WEATHER_SCHEMA)
    with_logprobs = await client.responses.create(
        model=MODEL, input="Hi", max_output_tokens=6, include=["message.output_text.logprobs"], top_logprobs=2
    )
    part = with_logprobs.output[0].content[0]  # type: ignore[union-attr]
    # a finished turn's body lists its EOS token too (responses/serving.py:1031-1043)
    eos = "<|im_end|>" if with_logprobs.status == "completed" else ""
    assert part.logprobs is not None and "".join(lp.token for lp in part.logprobs) == part.text + eos
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)


async def test_errors(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        await client.responses.create(model="nope", input="x")
    assert not_found.value.message.endswith("The model `nope` does not exist. Valid aliases: sim-model.")
    with pytest.raises(openai.BadRequestError) as bad_choice:
        await client.responses.create(
            model=MODEL, input="x", tools=TOOLS, tool_choice={"type": "function", "name": "missing"}
        )
    assert bad_choice.value.body["param"] == "tool_choice"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad_schema:
        await client.responses.create(
            model=MODEL,
            input="x",
            tools=[{"type": "function", "name": "f", "parameters": {"type": "object", "not": {}}}],
        )
    assert bad_schema.value.status_code == 400


async def test_sync_client(llmsim_server: ServerHandle, http_kwargs: dict[str, Any]) -> None:
    def use_sync_client() -> tuple[Any, Any]:
        with httpx.Client(**http_kwargs) as http_client:
            client = openai.OpenAI(
                base_url=f"{llmsim_server.url}/v1", api_key="unused", max_retries=0, http_client=http_client
            )
            created = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
            with client.responses.stream(model=MODEL, input="Hi") as stream:
                final = stream.get_final_response()
            return created, final

    created, final = await trio.to_thread.run_sync(use_sync_client)
    assert created.output_text and final.output_text
