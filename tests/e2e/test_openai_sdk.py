"""The official openai SDK against a running simulator: chat and completions, streaming
and not, the ``.stream()`` helper, tool calls and logprobs parsed into the SDK's types,
async and sync clients, over HTTP/1.1 and HTTP/2 (prior knowledge), on every server
backend; and the SDK's exception types for our errors.  Latencies are tiny and real
(sockets and the SDK's own timeouts do not mix with a mock clock)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest
import trio
from openai.types.chat import ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import ChoiceLogprobs

from llmsim.config import Config
from llmsim.server import ServerHandle
from llmsim.testing import open_simulator

MODEL = "sim-model"
SEED = 3
MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about the weather."}]


@pytest.fixture
async def client(llmsim_server: ServerHandle, http_kwargs: dict[str, Any]) -> AsyncIterator[openai.AsyncOpenAI]:
    async with httpx.AsyncClient(**http_kwargs) as http_client:
        yield openai.AsyncOpenAI(
            base_url=f"{llmsim_server.url}/v1", api_key="unused", max_retries=0, http_client=http_client
        )


async def test_chat_non_streaming(client: openai.AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, max_completion_tokens=8)
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    assert [choice.index for choice in completion.choices] == [0, 1]
    assert all(choice.message.role == "assistant" and choice.message.content for choice in completion.choices)
    assert completion.usage is not None
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    # null without --enable-prompt-tokens-details (vllm/entrypoints/openai/chat_completion/serving.py:95-103)
    assert completion.usage.prompt_tokens_details is None
    assert completion.system_fingerprint is not None and completion.system_fingerprint.startswith("vllm-0.33.0-")


async def test_chat_streaming(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_completion_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.object == "chat.completion.chunk" and chunk.id == chunks[0].id for chunk in chunks)
    content = [chunk.choices[0].delta.content for chunk in chunks if chunk.choices]
    assert len([piece for piece in content if piece]) == 10
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10


async def test_chat_stream_usage_on_every_chunk_and_min_tokens(client: openai.AsyncOpenAI) -> None:
    """``continuous_usage_stats`` and ``min_tokens`` as vLLM 0.33 takes them (through
    ``extra_body``): cumulative usage the SDK parses on every chunk
    (chat_completion/serving.py:624-634, 838-851), and exactly ``min_tokens == max_tokens``
    tokens (vllm/sampling_params.py:339)."""
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_completion_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"min_tokens": 6, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    )
    chunks = [chunk async for chunk in stream]
    counts = [chunk.usage.completion_tokens for chunk in chunks if chunk.usage is not None]
    assert counts == [0, 1, 2, 3, 4, 5, 6, 6]  # the role chunk, six tokens, the usage chunk
    assert chunks[-2].choices[0].finish_reason == "length"


async def test_chat_stream_helper_final_completion(client: openai.AsyncOpenAI) -> None:
    deltas: list[str] = []
    # No token cap: the helper raises LengthFinishReasonError on finish_reason "length".
    async with client.chat.completions.stream(
        model=MODEL, messages=MESSAGES, n=2, stream_options={"include_usage": True}
    ) as stream:
        async for event in stream:
            if event.type == "chunk" and event.chunk.choices and event.chunk.choices[0].index == 0:
                deltas.append(event.chunk.choices[0].delta.content or "")
        final = await stream.get_final_completion()
    assert [choice.index for choice in final.choices] == [0, 1]
    assert final.choices[0].message.role == "assistant"  # sent once per choice, never doubled
    assert final.choices[0].message.content == "".join(deltas)
    assert all(choice.finish_reason == "stop" and choice.message.content for choice in final.choices)
    assert final.usage is not None and final.usage.completion_tokens >= 2


async def test_completions_non_streaming(client: openai.AsyncOpenAI) -> None:
    completion = await client.completions.create(
        model=MODEL, prompt=["Once upon a time", "The answer is"], max_tokens=5, echo=True
    )
    assert completion.id.startswith("cmpl-")
    assert completion.object == "text_completion"
    assert completion.choices[0].text.startswith("Once upon a time")
    assert completion.choices[1].text.startswith("The answer is")
    assert completion.usage is not None and completion.usage.completion_tokens >= 2


async def test_completions_streaming(client: openai.AsyncOpenAI) -> None:
    stream = await client.completions.create(
        model=MODEL,
        prompt=[1, 2, 3, 4],
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert len(texts) == 7 and all(texts)
    assert [chunk.choices[0].finish_reason for chunk in chunks[:-1]] == [None] * 6 + ["length"]
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 7)


async def test_sync_client(llmsim_server: ServerHandle, http_kwargs: dict[str, Any]) -> None:
    def use_sync_client() -> tuple[Any, list[Any], Any]:
        with httpx.Client(**http_kwargs) as http_client:
            client = openai.OpenAI(
                base_url=f"{llmsim_server.url}/v1", api_key="unused", max_retries=0, http_client=http_client
            )
            chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
            chunks = list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, stream=True))
            with client.chat.completions.stream(model=MODEL, messages=MESSAGES) as stream:
                final = stream.get_final_completion()
            return chat, chunks, final

    chat, chunks, final = await trio.to_thread.run_sync(use_sync_client)
    assert chat.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.content


@pytest.mark.parametrize(
    ("call", "error_type", "message"),
    [
        (
            lambda c: c.chat.completions.create(model="nope", messages=MESSAGES),
            openai.NotFoundError,
            "The model `nope` does not exist.",
        ),
        (
            lambda c: c.chat.completions.create(model=MODEL, messages=MESSAGES, n=0),
            openai.BadRequestError,
            "n must be at least 1",
        ),
        (
            lambda c: c.completions.create(model=MODEL, prompt=[]),
            openai.BadRequestError,
            "prompt array must contain at least one prompt",
        ),
        (
            lambda c: c.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, max_tokens=0),
            openai.BadRequestError,
            "max_tokens must be at least 1, got 0.",
        ),
    ],
)
async def test_error_types(
    client: openai.AsyncOpenAI,
    call: Callable[[openai.AsyncOpenAI], Any],
    error_type: type[openai.APIStatusError],
    message: str,
) -> None:
    with pytest.raises(error_type) as caught:
        await call(client)
    assert message in caught.value.message
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == caught.value.status_code


async def test_full_queue_is_a_rate_limit_error(llmsim_config: Config, http_kwargs: dict[str, Any]) -> None:
    busy = llmsim_config.replace(max_num_seqs=1, max_waiting_queue_length=0, time_to_first_token=60.0)
    async with open_simulator(busy) as server, httpx.AsyncClient(**http_kwargs) as http_client:
        client = openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0, http_client=http_client
        )
        holding = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        with pytest.raises(openai.RateLimitError) as caught:
            await client.completions.create(model=MODEL, prompt="Hi")
        await holding.close()
    assert caught.value.status_code == 429
    assert caught.value.message.endswith("Failed to enqueue request, waiting requests queue is full")


class Forecast(pydantic.BaseModel):
    city: str
    days: int = pydantic.Field(ge=1, le=7)
    unit: Literal["celsius", "fahrenheit"]
    tags: list[str]


FORECAST = openai.pydantic_function_tool(Forecast, name="get_forecast")  # strict: the helper parses it
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
SCHEMAS = {"get_forecast": FORECAST["function"]["parameters"], "get_time": CLOCK["function"]["parameters"]}


def _same_request(name: str) -> dict[str, str]:
    return {"X-Request-Id": name}  # the same id plans the same output, streamed or not


async def test_chat_tool_calls_streaming_and_not(client: openai.AsyncOpenAI) -> None:
    fields: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "tools": [FORECAST, CLOCK], "n": 2}
    completion = await client.chat.completions.create(
        **fields, tool_choice="required", extra_headers=_same_request("tools-e2e")
    )
    stream = await client.chat.completions.create(
        **fields, tool_choice="required", stream=True, extra_headers=_same_request("tools-e2e")
    )
    streamed: dict[int, dict[int, list[str]]] = {0: {}, 1: {}}  # choice -> call -> [id, name, arguments]
    finish: dict[int, str | None] = {}
    async for chunk in stream:
        choice = chunk.choices[0]
        finish[choice.index] = choice.finish_reason or finish.get(choice.index)
        for delta in choice.delta.tool_calls or []:
            if delta.id is not None:
                # the first delta carries the first arguments piece (vllm/tool_parsers/streaming.py:284-296)
                assert delta.type == "function" and delta.function is not None and delta.function.arguments
                streamed[choice.index][delta.index] = [delta.id, delta.function.name or "", delta.function.arguments]
            else:
                assert delta.function is not None and delta.function.name is None
                streamed[choice.index][delta.index][2] += delta.function.arguments or ""
    for choice in completion.choices:
        assert choice.finish_reason == finish[choice.index] == "tool_calls"
        assert choice.message.content == ""  # required: vllm/.../chat_completion/message_assembly.py:60-61
        calls = choice.message.tool_calls or []
        assert calls and [[c.id, c.function.name, c.function.arguments] for c in calls] == list(
            streamed[choice.index].values()
        )
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


async def test_chat_stream_helper_with_tools(client: openai.AsyncOpenAI) -> None:
    fields: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "tools": [FORECAST],
        "tool_choice": {"type": "function", "function": {"name": "get_forecast"}},
    }
    done_events = []
    async with client.chat.completions.stream(**fields, extra_headers=_same_request("helper")) as stream:
        async for event in stream:
            if event.type == "tool_calls.function.arguments.done":
                done_events.append(event)
        final = await stream.get_final_completion()
    plain = await client.chat.completions.create(**fields, extra_headers=_same_request("helper"))
    (call,) = final.choices[0].message.tool_calls or []
    (expected,) = plain.choices[0].message.tool_calls or []
    assert (call.id, call.type, call.function.name) == (expected.id, "function", "get_forecast")  # never doubled
    assert call.function.arguments == expected.function.arguments
    assert call.function.parsed_arguments == Forecast.model_validate_json(expected.function.arguments)
    assert [event.parsed_arguments for event in done_events] == [call.function.parsed_arguments]
    # a forced named tool finishes "stop" (vllm/entrypoints/serve/utils/tool_calls_utils.py:41-59)
    assert final.choices[0].finish_reason == plain.choices[0].finish_reason == "stop"
    assert final.choices[0].message.role == "assistant"


class City(pydantic.BaseModel):
    name: str
    population: int
    tags: list[Literal["coastal", "capital", "alpine"]]


async def test_chat_response_format_parses_into_the_model(client: openai.AsyncOpenAI) -> None:
    """``response_format`` from a pydantic model (the SDK sends a strict json_schema,
    vllm/entrypoints/generate/base/protocol.py:137-143): the answer, streamed token by
    token or not, parses into the model; ``structured_outputs`` (vllm/sampling_params.py:102-106)
    through ``extra_body``."""
    parsed = await client.chat.completions.parse(model=MODEL, messages=MESSAGES, response_format=City)
    message = parsed.choices[0].message
    assert isinstance(message.parsed, City) and parsed.choices[0].finish_reason == "stop"
    pieces = []
    async with client.chat.completions.stream(model=MODEL, messages=MESSAGES, response_format=City) as stream:
        async for event in stream:
            if event.type == "content.delta":
                pieces.append(event.delta)
        final = await stream.get_final_completion()
    assert len(pieces) > 1 and isinstance(final.choices[0].message.parsed, City)
    assert City.model_validate_json("".join(pieces)) == final.choices[0].message.parsed
    choice = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, extra_body={"structured_outputs": {"choice": ["yes", "no"]}}
    )
    assert choice.choices[0].message.content in ("yes", "no")
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"structured_outputs": {"regex": "(unclosed"}}
        )
    assert raised.value.param == "structured_outputs.regex"


async def test_chat_logprobs_parse_into_the_sdk_types(client: openai.AsyncOpenAI) -> None:
    fields: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 8,
        "logprobs": True,
        "top_logprobs": 3,
    }
    completion = await client.chat.completions.create(**fields, extra_headers=_same_request("lp"))
    async with client.chat.completions.stream(**fields, extra_headers=_same_request("lp")) as stream:
        final = await stream.get_final_completion()
    logprobs = completion.choices[0].logprobs
    assert isinstance(logprobs, ChoiceLogprobs) and logprobs.content
    assert all(isinstance(entry, ChatCompletionTokenLogprob) for entry in logprobs.content)
    tokens = [entry.token for entry in logprobs.content]
    if completion.choices[0].finish_reason == "stop":  # the EOS token is listed, not in the text
        assert tokens.pop() == "<|im_end|>"
    assert "".join(tokens) == completion.choices[0].message.content
    assert all(
        len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token for entry in logprobs.content
    )
    assert all(entry.bytes == list(entry.token.encode()) for entry in logprobs.content)
    assert final.choices[0].logprobs is not None
    assert final.choices[0].logprobs.content == logprobs.content


async def test_completion_logprobs_with_echo(client: openai.AsyncOpenAI) -> None:
    fields: dict[str, Any] = {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 6,
        "logprobs": 2,
        "echo": True,
    }
    completion = await client.completions.create(**fields, extra_headers=_same_request("lp"))
    chunks = [
        c async for c in await client.completions.create(**fields, stream=True, extra_headers=_same_request("lp"))
    ]
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs and logprobs.top_logprobs
    tokens = list(logprobs.tokens)
    if completion.choices[0].finish_reason == "stop":  # the EOS token is listed, not in the text
        assert tokens.pop() == "<|im_end|>"
    assert "".join(tokens) == completion.choices[0].text
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(len(top) == 2 for top in logprobs.top_logprobs[1:])
    streamed = [chunk.choices[0].logprobs for chunk in chunks]
    assert [offset for values in streamed if values for offset in values.text_offset or []] == logprobs.text_offset
