"""/v1/responses through the real router, engine and generators on trio's mock clock
(no server): validation errors, the tool-turn rules of seed 000, text.format, and the
store (previous_response_id, GET, DELETE, 404)."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import orjson
import pytest
import trio
from trio.testing import MockClock

from llmsim.api.http import HttpRequest
from llmsim.api.responses.store import ResponseStore, StoredResponse
from llmsim.app import Simulator
from tests.api.fakes import CREATED, FakeResponse, post, running

PATH = "/v1/responses"
LOGPROBS = "message.output_text.logprobs"
LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["city", "days"],
}
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": SCHEMA}]


async def get(sim: Simulator, path: str, method: str = "GET") -> FakeResponse:
    response = FakeResponse()
    await sim.app.handle(HttpRequest(method, path), response)
    return response


def output_types(response: FakeResponse) -> list[str]:
    return [item["type"] for item in response.json()["output"]]


async def test_non_streaming_text_turn(autojump_clock: MockClock) -> None:
    async with running(**LATENCY) as sim:
        started = trio.current_time()
        response = await post(sim, PATH, {"input": "Hi there", "max_output_tokens": 4, "ignore_eos": True})
        elapsed = trio.current_time() - started
    body = response.json()
    assert response.status == 200 and response.headers[b"content-type"] == b"application/json"
    assert elapsed == pytest.approx(0.13)
    assert body["object"] == "response" and body["created_at"] == CREATED and body["id"].startswith("resp_")
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    [message] = body["output"]
    # msg_ ids are vLLM's own random ids, not the response's (vllm/entrypoints/openai/responses/serving.py:1071)
    assert re.fullmatch(r"msg_[0-9a-f]{16}", message["id"]) and message["id"][4:] != body["id"][5:]
    assert message["type"] == "message" and message["role"] == "assistant" and message["status"] == "incomplete"
    assert message["content"][0]["type"] == "output_text" and message["content"][0]["text"]
    assert body["usage"]["output_tokens"] == 4
    assert list(body["usage"]) == [
        "input_tokens",
        "input_tokens_details",
        "output_tokens",
        "output_tokens_details",
        "total_tokens",
    ]


async def test_stream_head_is_sent_at_once_and_content_after_ttft(autojump_clock: MockClock) -> None:
    async with running(**LATENCY) as sim:
        started = trio.current_time()
        response = await post(sim, PATH, {"input": "Hi", "max_output_tokens": 3, "ignore_eos": True, "stream": True})
    assert response.headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    times = [round(when - started, 6) for when, _ in response.writes]
    assert times == [0.0, 0.1, 0.11, 0.12]
    assert response.writes[0][1].startswith(b"event: response.created\n")
    assert b"[DONE]" not in response.body


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({}, "input", "input is required"),
        ({"input": 5}, "body.input", "Invalid type for 'input'"),
        # SamplingParams refuses a cap below 1 under the name max_tokens (vllm/sampling_params.py:691-696)
        (
            {"input": "x", "max_output_tokens": 0},
            "max_tokens",
            "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        ),
        # top_logprobs counts with include only (protocol.py:635), under vLLM's limit and range
        # (vllm/sampling_params.py:706-711,922-937)
        (
            {"input": "x", "include": [LOGPROBS], "top_logprobs": 21},
            "logprobs",
            "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)",
        ),
        (
            {"input": "x", "include": [LOGPROBS], "top_logprobs": -2, "stream": True},
            "logprobs",
            "logprobs must be non-negative or -1, got -2. (parameter=logprobs, value=-2)",
        ),
        # vllm/entrypoints/serve/exception_handling/handlers/validation.py:149-196
        (
            {"input": "x", "stream": "maybe"},
            "body.stream",
            "'msg': 'Input should be a valid boolean, unable to interpret input'",
        ),
        ({"input": [{"type": "message", "content": "x"}]}, "input[0].role", "required"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "Invalid role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_video"}]}]},
            "input[0].content[0].type",
            "Unknown content part",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
            "input[0].content[0].text",
            "has no 'text'",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].image_url", "needs"),
        ({"input": [{"type": "web_search_call"}]}, "input[0].type", "Unsupported input item type"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id", "required"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output", "required"),
        ({"input": "x", "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "Invalid tool_choice"),
        (
            {"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
            "tool_choice",
            "not found",
        ),
        ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice.name", "needs a 'name'"),
        ({"input": "x", "tool_choice": {"type": "file_search"}}, "tool_choice.type", "Unsupported tool_choice"),
        ({"input": "x", "tool_choice": 3}, "tool_choice", "expected a string or an object"),
        ({"input": "x", "tools": [{"type": "function", "parameters": SCHEMA}]}, "tools[0].name", "required"),
        (
            {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "not": {}}}]},
            "tools[0].parameters",
            "Tool validation failed",
        ),
        (
            {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": [1]}]},
            "tools[0].parameters",
            "expected an object",
        ),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema", "required"),
        ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type", "Invalid text.format type"),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "schema": {"type": "foo"}}}},
            "text.format.schema",
            "failed",
        ),
        ({"input": "x", "background": True}, "background", "not supported"),
    ],
)
async def test_validation_errors(autojump_clock: MockClock, body: dict[str, Any], param: str, message: str) -> None:
    async with running() as sim:
        response = await post(sim, PATH, body)
    assert response.status == 400, response.body
    error = response.json()["error"]
    kind = "Bad Request" if param.startswith("body") else "BadRequestError"  # request validation or not
    assert error["type"] == kind and error["code"] == 400
    assert error["param"] == param and message in error["message"]


async def test_unknown_model(autojump_clock: MockClock) -> None:
    async with running() as sim:
        unknown = await post(sim, PATH, {"model": "nope", "input": "x"})
    # vllm/entrypoints/serve/engine/serving.py:75-84
    assert unknown.status == 404
    assert unknown.json()["error"]["message"] == "The model `nope` does not exist. Valid aliases: llmsim/sim-model."


async def prompt_tokens_of(body: dict[str, Any]) -> int:
    async with running() as sim:
        return int((await post(sim, PATH, {**body, "max_output_tokens": 1})).json()["usage"]["input_tokens"])


def bad_request(message: str, param: str, error_type: str = "BadRequestError") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": param, "code": 400}})


async def test_context_window_errors_are_vllms(autojump_clock: MockClock) -> None:
    filling = {"input": "word " * 10}
    length = await prompt_tokens_of(filling)
    async with running(max_model_len=length) as sim:
        too_long = await post(sim, PATH, {"input": "word " * 30})
        too_many = await post(sim, PATH, {"input": "x", "max_output_tokens": length + 1})
        full = await post(sim, PATH, filling)
    # the renderer's checks (vllm/renderers/params.py:270-283, 531-551): text is tokenized
    # with truncation at max_model_len + 1, hence "at least"
    assert too_long.status == 400
    assert too_long.body == bad_request(
        f"This model's maximum context length is {length} tokens. However, your prompt contains at least "
        f"{length + 1} input tokens, which exceeds this limit even without any output tokens. Please reduce the "
        f"length of the input prompt. (parameter=input_tokens, value={length + 1})",
        "input_tokens",
    )
    assert too_many.body == bad_request(
        f"max_output_tokens={length + 1} cannot be greater than max_model_len={length}. Please request fewer "
        f"output tokens. (parameter=max_output_tokens, value={length + 1})",
        "max_output_tokens",
    )
    # a prompt that fills the window (vllm/entrypoints/openai/responses/serving.py:232-252)
    assert full.body == bad_request(
        f"The engine prompt length {length} exceeds the max_model_len {length}. Please reduce prompt.",
        "input",
        "invalid_request_error",
    )


async def test_prompt_plus_max_output_tokens_over_the_window_is_clamped(autojump_clock: MockClock) -> None:
    # get_max_tokens clamps the cap to the room the prompt leaves
    # (vllm/entrypoints/serve/utils/api_utils.py:234-270, responses/serving.py:429-437)
    prompt = await prompt_tokens_of({"input": "x"})
    async with running(max_model_len=prompt + 5) as sim:
        response = await post(sim, PATH, {"input": "x", "max_output_tokens": prompt + 5, "ignore_eos": True})
        streamed = await post(
            sim, PATH, {"input": "x", "max_output_tokens": prompt + 5, "stream": True, "ignore_eos": True}
        )
    body = response.json()
    assert response.status == 200 and body["usage"]["output_tokens"] == 5
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert streamed.status == 200 and b"event: response.incomplete\n" in streamed.body


async def test_truncation_auto_keeps_room_for_one_token(autojump_clock: MockClock) -> None:
    # truncation "auto" is truncate_prompt_tokens=-1: the prompt keeps max_model_len - 1
    # tokens (vllm/entrypoints/openai/responses/protocol.py:525-532, renderers/params.py:238-256)
    async with running(max_model_len=12) as sim:
        response = await post(sim, PATH, {"input": "word " * 30, "truncation": "auto"})
    usage = response.json()["usage"]
    assert response.status == 200 and (usage["input_tokens"], usage["output_tokens"]) == (11, 1)
    assert response.json()["status"] == "incomplete"


async def test_tool_turn_rules(autojump_clock: MockClock) -> None:
    question = {"role": "user", "content": "Weather in Paris?"}
    call = {
        "type": "function_call",
        "call_id": "call_a",
        "name": "get_weather",
        "arguments": '{"city": "Paris", "days": 1}',
    }
    output = {"type": "function_call_output", "call_id": "call_a", "output": "sunny"}
    async with running() as sim:
        omitted = await post(sim, PATH, {"input": [question], "tools": TOOLS})
        auto = await post(sim, PATH, {"input": [question], "tools": TOOLS, "tool_choice": "auto"})
        required = await post(sim, PATH, {"input": [question], "tools": TOOLS, "tool_choice": "required"})
        none = await post(sim, PATH, {"input": [question], "tools": TOOLS, "tool_choice": "none"})
        after_output = await post(
            sim, PATH, {"input": [question, call, output], "tools": TOOLS, "tool_choice": "required"}
        )
        allowed = await post(
            sim,
            PATH,
            {"input": "x", "tools": TOOLS, "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}},
        )
        custom = await post(sim, PATH, {"input": "x", "tools": TOOLS, "tool_choice": {"type": "custom", "name": "c"}})
        hosted_only = await post(sim, PATH, {"input": "x", "tools": [{"type": "web_search"}]})
    for response in (omitted, auto, required, allowed, custom):
        assert output_types(response) == ["function_call"], response.body
        [item] = response.json()["output"]
        jsonschema.validate(json.loads(item["arguments"]), SCHEMA)
        assert item["name"] == "get_weather" and item["status"] == "completed"
        # vllm/entrypoints/openai/responses/streaming_events.py:1057-1059, utils.py:162-164
        assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", item["call_id"]) and re.fullmatch(
            r"fc_[0-9a-f]{16}", item["id"]
        )
    for response in (none, after_output, hosted_only):
        assert output_types(response) == ["message"], response.body
    assert custom.json()["tool_choice"] == {"type": "custom", "name": "c"}


async def test_named_tool_choice_calls_that_tool(autojump_clock: MockClock) -> None:
    tools = [*TOOLS, {"type": "function", "name": "other", "parameters": None}]
    async with running() as sim:
        responses = [
            await post(sim, PATH, {"input": "x", "tools": tools, "tool_choice": {"type": "function", "name": "other"}})
            for _ in range(5)
        ]
        nested = await post(
            sim, PATH, {"input": "x", "tools": [{"type": "function", "function": {"name": "g", "parameters": SCHEMA}}]}
        )
    for response in responses:
        [item] = response.json()["output"]
        assert (item["name"], item["arguments"]) == ("other", "{}")
    assert nested.json()["output"][0]["name"] == "g"


async def test_tools_stay_off_across_previous_response_id(autojump_clock: MockClock) -> None:
    async with running() as sim:
        first = (await post(sim, PATH, {"input": "Weather?", "tools": TOOLS})).json()
        [call] = first["output"]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
        second = (
            await post(sim, PATH, {"input": [output], "tools": TOOLS, "previous_response_id": first["id"]})
        ).json()
        third = await post(sim, PATH, {"input": "And tomorrow?", "tools": TOOLS, "previous_response_id": second["id"]})
    assert second["output"][0]["type"] == "message"
    assert output_types(third) == ["message"]  # history carries a function_call_output


async def test_previous_response_id_history_is_counted_and_instructions_are_not_carried(
    autojump_clock: MockClock,
) -> None:
    async with running() as sim:
        first = (await post(sim, PATH, {"input": "Hello", "instructions": "Be kind.", "max_output_tokens": 5})).json()
        alone = (await post(sim, PATH, {"input": "Again"})).json()
        second = (await post(sim, PATH, {"input": "Again", "previous_response_id": first["id"]})).json()
    assert second["previous_response_id"] == first["id"] and second["instructions"] is None
    history = second["usage"]["input_tokens"] - alone["usage"]["input_tokens"]
    # The first turn's input and output come back, without its instructions.
    assert first["usage"]["output_tokens"] < history < first["usage"]["input_tokens"] + first["usage"]["output_tokens"]


async def test_store_get_delete_and_404(autojump_clock: MockClock) -> None:
    async with running() as sim:
        stored = await post(sim, PATH, {"input": "Hello", "max_output_tokens": 5})
        unstored = await post(sim, PATH, {"input": "Hello", "store": False})
        streamed = await post(sim, PATH, {"input": "Hello", "stream": True})
        got = await get(sim, f"{PATH}/{stored.json()['id']}")
        got_unstored = await get(sim, f"{PATH}/{unstored.json()['id']}")
        completed = orjson.loads(streamed.body.rsplit(b"data: ", 1)[1])["response"]
        got_streamed = await get(sim, f"{PATH}/{completed['id']}")
        chained_to_unstored = await post(sim, PATH, {"input": "x", "previous_response_id": unstored.json()["id"]})
        cancel = await get(sim, f"{PATH}/{stored.json()['id']}/cancel", method="POST")
        deleted = await get(sim, f"{PATH}/{stored.json()['id']}", method="DELETE")
        after_delete = await get(sim, f"{PATH}/{stored.json()['id']}")
    assert got.status == 200 and got.body == stored.body
    assert "store" not in unstored.json()  # vLLM's response object has no store key (protocol.py:870-1033)
    assert got_streamed.json() == completed
    assert got_unstored.status == 404
    assert got_unstored.json() == {
        "error": {
            "message": f"Response with id '{unstored.json()['id']}' not found.",
            "type": "invalid_request_error",
            "param": "response_id",
            "code": 404,
        }
    }
    assert chained_to_unstored.status == 404
    assert cancel.status == 400 and cancel.json()["error"]["message"] == "Cannot cancel a synchronous response."
    assert deleted.json() == {"id": stored.json()["id"], "object": "response", "deleted": True}
    assert after_delete.status == 404


async def test_each_simulator_keeps_its_own_responses(autojump_clock: MockClock) -> None:
    async with running() as first, running() as second:
        only_in_first = await post(first, PATH, {"input": "Hello", "max_output_tokens": 3})
        response_id = only_in_first.json()["id"]
        missing = await get(second, f"{PATH}/{response_id}")
        chained = await post(second, PATH, {"input": "x", "previous_response_id": response_id})
        # Same seed, same id stream: the second simulator's first response takes the same id.
        same_id = await post(second, PATH, {"input": "Bonjour", "max_output_tokens": 7})
        from_first = await get(first, f"{PATH}/{response_id}")
        from_second = await get(second, f"{PATH}/{response_id}")
    assert missing.status == 404 and chained.status == 404
    assert same_id.json()["id"] == response_id
    assert from_first.body == only_in_first.body and from_second.body == same_id.body
    assert from_first.body != from_second.body
    assert len(first.ctx.response_store) == 1 and len(second.ctx.response_store) == 1


def test_store_is_a_bounded_lru() -> None:
    store = ResponseStore(capacity=2)
    for name in ("a", "b"):
        store.put(StoredResponse(name, b"{}", (), False))
    assert store.get("a") is not None  # a is now the most recently used
    store.put(StoredResponse("c", b"{}", (), False))
    assert "b" not in store and "a" in store and "c" in store and len(store) == 2


async def test_structured_output_formats(autojump_clock: MockClock) -> None:
    fmt = {"type": "json_schema", "name": "weather", "schema": SCHEMA, "strict": True}
    async with running() as sim:
        schema_response = await post(sim, PATH, {"input": "x", "text": {"format": fmt}})
        object_response = await post(sim, PATH, {"input": "x", "text": {"format": {"type": "json_object"}}})
        streamed = await post(sim, PATH, {"input": "x", "stream": True, "text": {"format": fmt}})
    jsonschema.validate(json.loads(schema_response.json()["output"][0]["content"][0]["text"]), SCHEMA)
    assert schema_response.json()["text"] == {"format": fmt}
    assert isinstance(json.loads(object_response.json()["output"][0]["content"][0]["text"]), dict)
    deltas = [
        orjson.loads(frame.split(b"data: ", 1)[1])["delta"]
        for frame in streamed.body.split(b"\n\n")
        if frame.startswith(b"event: response.output_text.delta")
    ]
    assert len(deltas) > 1  # the JSON streams in pieces
    jsonschema.validate(json.loads("".join(deltas)), SCHEMA)


async def test_echo_mode_replays_the_last_user_text(autojump_clock: MockClock) -> None:
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "first"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "echo me"},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            ],
        },
    ]
    async with running(mode="echo") as sim:
        response = await post(sim, PATH, {"input": items})
    assert response.json()["output"][0]["content"][0]["text"] == "echo me"


async def test_x_request_id_names_the_response(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, PATH, {"input": "x", "tools": TOOLS}, headers=((b"x-request-id", b"r42"),))
    body = response.json()
    assert body["id"] == "resp_r42" and response.headers[b"x-request-id"] == b"r42"
    # item ids are drawn independently of the request id (vllm/entrypoints/openai/responses/streaming_events.py:1057)
    assert body["output"][0]["id"] != "fc_r42" and body["output"][0]["call_id"].startswith("chatcmpl-tool-")


async def test_a_body_request_id_is_the_response_id_and_can_be_fetched(autojump_clock: MockClock) -> None:
    # vllm/entrypoints/openai/responses/protocol.py:357-364 (request_id, default resp_<uuid>) and
    # serving.py:1115 (response_id = request.request_id): the id is used as given, over the header
    async with running() as sim:
        created = await post(
            sim, PATH, {"input": "x", "request_id": "my-run-7"}, headers=((b"x-request-id", b"ignored"),)
        )
        fetched = await get(sim, f"{PATH}/my-run-7")
    assert created.json()["id"] == "my-run-7"
    assert fetched.status == 200 and fetched.json()["id"] == "my-run-7"


async def test_full_queue_is_a_429_before_the_stream_starts(autojump_clock: MockClock) -> None:
    async with (
        running(max_num_seqs=1, max_waiting_queue_length=0, time_to_first_token=10.0) as sim,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(post, sim, PATH, {"input": "x", "stream": True})
        await trio.sleep(1)
        refused = await post(sim, PATH, {"input": "x", "stream": True})
        nursery.cancel_scope.cancel()
    assert refused.status == 429 and refused.json()["error"]["type"] == "RateLimitError"


async def test_response_object_has_vllms_keys_in_vllms_order(autojump_clock: MockClock) -> None:
    """vllm/entrypoints/openai/responses/protocol.py:870-1033 (``from_request``): no error,
    completed_at or store; max_output_tokens the engine's cap (an int even when the request
    has none); text as the request sent it (null without); top_logprobs null unless
    ``include`` asks for logprobs (protocol.py:635); usage details as serving.py:896-919."""
    async with running(seed=1, max_model_len=2048) as sim:
        plain = await post(sim, PATH, {"input": "Hello", "max_output_tokens": 3, "temperature": 0, "top_p": 0.5})
        uncapped = await post(sim, PATH, {"input": "Hello", "text": {"format": {"type": "text"}}})
        logprobs = await post(sim, PATH, {"input": "Hello", "include": [LOGPROBS], "max_output_tokens": 2})
    body = plain.json()
    assert list(body) == [
        "id", "created_at", "incomplete_details", "instructions", "metadata", "model", "object", "output",
        "parallel_tool_calls", "temperature", "tool_choice", "tools", "top_p", "background", "max_output_tokens",
        "max_tool_calls", "previous_response_id", "prompt", "prompt_cache_options", "prompt_cache_key",
        "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier", "status", "text", "top_logprobs",
        "truncation", "usage", "user", "presence_penalty", "frequency_penalty", "kv_transfer_params",
        "ec_transfer_params", "input_messages", "output_messages",
    ]  # fmt: skip
    # greedy sampling reports top_p 1 (vllm/sampling_params.py:616-619)
    assert (body["temperature"], body["top_p"], body["presence_penalty"]) == (0.0, 1.0, 0.0)
    assert (body["max_output_tokens"], body["text"], body["top_logprobs"]) == (3, None, None)
    assert body["usage"]["input_tokens_details"] == {
        "cached_tokens": 0,
        "cache_write_tokens": 0,
        "input_tokens_per_turn": [],
        "cached_tokens_per_turn": [],
    }
    assert body["usage"]["output_tokens_details"] == {
        "reasoning_tokens": 0,
        "tool_output_tokens": 0,
        "output_tokens_per_turn": [],
        "tool_output_tokens_per_turn": [],
    }
    # no max_output_tokens: the room the context leaves (serving.py:428-441)
    prompt_tokens = uncapped.json()["usage"]["input_tokens"]
    assert uncapped.json()["max_output_tokens"] == 2048 - prompt_tokens
    assert uncapped.json()["text"] == {"format": {"type": "text"}}
    assert logprobs.json()["top_logprobs"] == 0


async def test_the_store_can_be_turned_off(autojump_clock: MockClock) -> None:
    """--no-enable-responses-store: vLLM without VLLM_ENABLE_RESPONSES_API_STORE serves the
    request unstored (serving.py:355-363); GET and previous_response_id are then its 404."""
    async with running(enable_responses_store=False) as sim:
        created = await post(sim, PATH, {"input": "Hello", "max_output_tokens": 2})
        response_id = created.json()["id"]
        fetched = await get(sim, f"{PATH}/{response_id}")
        chained = await post(sim, PATH, {"input": "x", "previous_response_id": response_id})
    assert created.status == 200
    assert (fetched.status, chained.status) == (404, 404)
    assert fetched.body == chained.body
    assert fetched.json()["error"]["message"] == f"Response with id '{response_id}' not found."


async def test_a_finished_turn_counts_its_eos_token_streamed_or_not(autojump_clock: MockClock) -> None:
    """vLLM counts every token id the engine returns, the EOS too (responses/context.py:223):
    the non-streaming body and the stream's final response agree on ``output_tokens``, one
    more than the text's tokens.  The body's logprobs list the EOS token, named as the
    tokenizer names it (serving.py:1031-1043, 978-1013); the stream's keep its deltas'
    (streaming_events.py:893-919), so they have none for it."""
    body = {"input": "Hi there", "max_output_tokens": 200, "include": [LOGPROBS]}
    headers = ((b"x-request-id", b"eos-1"),)
    async with running(seed=7) as sim:
        plain = (await post(sim, PATH, body, headers)).json()
        streamed = await post(sim, PATH, {**body, "stream": True}, headers)
    final = orjson.loads(streamed.body.split(b"event: response.completed\ndata: ")[1])["response"]
    deltas = [e for e in streamed.body.split(b"\n\n") if e.startswith(b"event: response.output_text.delta")]
    assert plain["status"] == final["status"] == "completed"
    assert plain["output"][0]["content"][0]["text"] == final["output"][0]["content"][0]["text"]
    assert plain["usage"]["output_tokens"] == final["usage"]["output_tokens"] == len(deltas) + 1
    plain_tokens = [entry["token"] for entry in plain["output"][0]["content"][0]["logprobs"]]
    final_tokens = [entry["token"] for entry in final["output"][0]["content"][0]["logprobs"]]
    assert plain_tokens == [*final_tokens, "<|im_end|>"] and len(final_tokens) == len(deltas)


async def test_stop_strings_end_the_turn_as_on_chat(autojump_clock: MockClock) -> None:
    """vLLM's /v1/responses takes ``stop`` (responses/protocol.py:448, 618-652): the seeded
    text "Some streams end early, and a careful client…" stops at the token completing
    "a car", which counts (8 tokens, no EOS), status ``completed``; the logprobs name
    whole tokens.  A stream holds back 4 characters; every token here still has text to
    send, the last one's delta is what is left before the stop string."""
    body = {
        "input": "hi",
        "max_output_tokens": 12,
        "ignore_eos": True,
        "stop": ["a car"],
        "include": [LOGPROBS],
    }
    headers = ((b"x-request-id", b"stop-r"),)
    async with running(seed=7) as sim:
        plain = (await post(sim, PATH, body, headers)).json()
        streamed = await post(sim, PATH, {**body, "stream": True}, headers)
    part = plain["output"][0]["content"][0]
    tokens = ["Some ", "streams ", "end ", "early", ", ", "and ", "a ", "careful "]
    assert (plain["status"], part["text"], plain["usage"]["output_tokens"]) == (
        "completed",
        "Some streams end early, and ",
        8,
    )
    assert [entry["token"] for entry in part["logprobs"]] == tokens
    frames = [orjson.loads(frame.split(b"data: ", 1)[1]) for frame in streamed.body.split(b"\n\n")[:-1]]
    deltas = [frame for frame in frames if frame["type"] == "response.output_text.delta"]
    assert [d["delta"] for d in deltas] == ["S", "ome stre", "ams ", "end e", "ar", "ly, ", "an", "d "]
    assert [d["logprobs"][0]["token"] for d in deltas] == tokens
    final = frames[-1]["response"]
    assert (frames[-1]["type"], final["usage"]["output_tokens"]) == ("response.completed", 8)
    assert final["output"][0]["content"][0] == part
