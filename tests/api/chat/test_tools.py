"""Tool calling on /v1/chat/completions: golden stream bytes (renderer + a real Engine
with explicit times, TTFT 100 ms, ITL 10 ms), and the endpoint through the router on
trio's mock clock: tool_choice rules, schema-valid arguments, usage, every 400."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from llmsim.api.chat.render import ChatStreamRenderer, chat_completion_body
from llmsim.api.generation import CollectingSink
from llmsim.api.turns import TOOL_CALL, Block
from tests.api.fakes import UNSATISFIABLE_SCHEMA, EngineRun, make_job, post, running, sse_payloads

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
HEAD = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
ROLE = (
    HEAD + b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
    b'"prompt_token_ids":null,"prompt_text":null}\n\n'
)
DONE = b"data: [DONE]\n\n"
PATH = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER_SCHEMA},
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def arguments(text: bytes, call: int = 0) -> bytes:
    return (
        HEAD + b'[{"index":0,"delta":{"tool_calls":[{"index":%d,"function":{"arguments":"%s"}}]},"logprobs":null,'
        b'"finish_reason":null,"token_ids":null}],"kv_transfer_params":null}\n\n' % (call, text)
    )


def first(call_id: bytes, name: bytes, text: bytes, call: int = 0) -> bytes:
    """A call's first chunk: its id, type and name with the first arguments piece, as
    ``extract_named_tool_call_streaming`` (vllm/tool_parsers/streaming.py:49-57) and
    ``extract_required_tool_call_streaming`` (ibid. 284-296) build it."""
    return (
        HEAD + b'[{"index":0,"delta":{"tool_calls":[{"id":"%s","type":"function","index":%d,"function":'
        b'{"name":"%s","arguments":"%s"}}]},"logprobs":null,"finish_reason":null,"token_ids":null}],'
        b'"kv_transfer_params":null}\n\n' % (call_id, call, name, text)
    )


def finish(reason: bytes) -> bytes:
    return (
        HEAD + b'[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"%s","stop_reason":null,'
        b'"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}\n\n' % reason
    )


PIECES = ('{"', "city", '":', ' "', "Paris", '"}', "{}")
PLAN = (*PIECES, "")  # the calls' arguments, then the EOS token (vLLM's engine ends the turn with it)
TIME_CALL = Block(TOOL_CALL, 0, 1, "get_time", "chatcmpl-tool-b")
ARGUMENT_PIECES = (b'{\\"', b"city", b'\\":', b' \\"', b"Paris", b'\\"}')  # the first call's, JSON-escaped
CALLS = (
    Block(TOOL_CALL, 0, 6, "get_weather", "chatcmpl-tool-a"),
    Block(TOOL_CALL, 6, 7, "get_time", "chatcmpl-tool-b"),
)


def test_two_tool_calls_stream_exact_bytes() -> None:
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(
        response_id="chatcmpl-1", created=1, model="m", choices=1, include_usage=True, tool_calls=[CALLS]
    )
    sink = run.streaming_sink(renderer, 1)
    run.submit([make_job(sink, PLAN, "tool_calls")])
    run.run()
    steps = run.writes_at()
    assert steps[0.1] == (
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
        b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,'
        b'"prompt_text":null}\n\n'
        b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
        b'"delta":{"tool_calls":[{"id":"chatcmpl-tool-a","type":"function","index":0,"function":'
        b'{"name":"get_weather","arguments":"{\\""}}]},"logprobs":null,"finish_reason":null,"token_ids":null}],'
        b'"kv_transfer_params":null}\n\n'
    )
    assert steps[0.11] == arguments(b"city")
    assert steps[0.16] == first(b"chatcmpl-tool-b", b"get_time", b"{}", 1)
    assert steps[0.17] == (  # the EOS token's chunk, one ITL after the last argument
        finish(b"tool_calls")
        + HEAD
        + b'[],"usage":{"prompt_tokens":3,"total_tokens":11,"completion_tokens":8}}\n\n'
        + DONE
    )
    assert run.response.body == (
        ROLE
        + first(b"chatcmpl-tool-a", b"get_weather", ARGUMENT_PIECES[0])
        + b"".join(arguments(piece) for piece in ARGUMENT_PIECES[1:])
        + steps[0.16]
        + steps[0.17]
    )


def test_tool_call_tokens_due_together_keep_one_chunk_per_token() -> None:
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(
        response_id="chatcmpl-1", created=1, model="m", choices=1, include_usage=False, tool_calls=[CALLS]
    )
    sink = run.streaming_sink(renderer, 1)
    run.submit([make_job(sink, PLAN, "tool_calls")])
    run.step_to(0.2)  # late: every token is due in one step
    assert [data for _, data in run.response.writes] == [
        ROLE
        + first(b"chatcmpl-tool-a", b"get_weather", ARGUMENT_PIECES[0])
        + b"".join(arguments(piece) for piece in ARGUMENT_PIECES[1:])
        + first(b"chatcmpl-tool-b", b"get_time", b"{}", 1)
        + finish(b"tool_calls")
        + DONE
    ]


def test_required_tool_choice_later_deltas_name_null() -> None:
    """``tool_choice: "required"``: a call's later deltas pass ``name=None`` explicitly, so
    they dump ``"name":null`` (vllm/tool_parsers/streaming.py:270-283); the first carries
    id, type, name and the first arguments piece (ibid. 284-296)."""
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(
        response_id="chatcmpl-1",
        created=1,
        model="m",
        choices=1,
        include_usage=False,
        tool_calls=[(Block(TOOL_CALL, 0, 2, "get_weather", "chatcmpl-tool-a"),)],
        required_tool_choice=True,
    )
    sink = run.streaming_sink(renderer, 1)
    run.submit([make_job(sink, (*PIECES[:2], ""), "tool_calls")])
    run.run()
    assert run.response.body == (
        ROLE
        + first(b"chatcmpl-tool-a", b"get_weather", ARGUMENT_PIECES[0])
        + HEAD
        + b'[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":null,"arguments":"city"}}]},'
        b'"logprobs":null,"finish_reason":null,"token_ids":null}],"kv_transfer_params":null}\n\n'
        + finish(b"tool_calls")
        + DONE
    )


def test_a_text_choice_beside_a_tool_choice_streams_plain_content() -> None:
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(
        response_id="chatcmpl-1", created=1, model="m", choices=2, include_usage=False, tool_calls=[(), [TIME_CALL]]
    )
    sink = run.streaming_sink(renderer, 2)
    run.submit([make_job(sink, ("Hi", ""), "stop", index=0), make_job(sink, ("{}", ""), "tool_calls", index=1)])
    run.run()
    chunks = sse_payloads(run.response.body)[:-1]
    deltas = [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in chunks]
    assert deltas == [
        (0, {"role": "assistant", "content": ""}),
        (1, {"role": "assistant", "content": ""}),
        (0, {"content": "Hi"}),
        (
            1,
            {
                "tool_calls": [
                    {
                        "id": "chatcmpl-tool-b",
                        "type": "function",
                        "index": 0,
                        "function": {"name": "get_time", "arguments": "{}"},
                    }
                ]
            },
        ),
        (0, {"content": ""}),
        (1, {"content": ""}),
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks[-2:]] == ["stop", "tool_calls"]


def test_non_streaming_body_with_tool_calls_exact_bytes() -> None:
    run = EngineRun(**LATENCY)
    sink = CollectingSink(1)
    job = make_job(sink, PLAN, "tool_calls")
    run.submit([job])
    run.run()
    body = chat_completion_body(response_id="chatcmpl-1", created=1, model="m", jobs=[job], tool_calls=[CALLS])
    assert body == (
        b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":'
        b'{"role":"assistant","content":null,"refusal":null,"annotations":null,"audio":null,"function_call":null,'
        b'"tool_calls":[{"id":"chatcmpl-tool-a","type":"function","function":{"name":"get_weather",'
        b'"arguments":"{\\"city\\": \\"Paris\\"}"}},{"id":"chatcmpl-tool-b","type":"function","function":'
        b'{"name":"get_time","arguments":"{}"}}],"reasoning":null},"logprobs":null,"finish_reason":"tool_calls",'
        b'"stop_reason":null,"token_ids":null,"routed_experts":null,"weight_versions":null}],"service_tier":null,'
        b'"system_fingerprint":null,"usage":{"prompt_tokens":3,"total_tokens":11,"completion_tokens":8,'
        b'"prompt_tokens_details":null,"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,'
        b'"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'
    )


# --- through the router ------------------------------------------------------------------------


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "llmsim/sim-model", "messages": HELLO, "tools": [WEATHER, TIME], **fields}


def reassemble(
    body: bytes, index: int = 0, *, required: bool = True
) -> tuple[list[dict[str, Any]], str | None, list[Any]]:
    """The tool calls of choice ``index`` rebuilt from a stream, as a client does;
    checks that id, type and name come exactly once per call, before its arguments."""
    chunks = [c for c in sse_payloads(body)[:-1] if c["choices"] and c["choices"][0]["index"] == index]
    calls: list[dict[str, Any]] = []
    finish_reason = None
    for chunk in chunks:
        choice = chunk["choices"][0]
        finish_reason = choice["finish_reason"] or finish_reason
        for delta in choice["delta"].get("tool_calls", []):
            if "id" in delta:
                assert delta["index"] == len(calls) and delta["type"] == "function"
                assert set(delta["function"]) == {"name", "arguments"}  # vllm/tool_parsers/streaming.py:49-57
                calls.append(
                    {"id": delta["id"], "name": delta["function"]["name"], "arguments": delta["function"]["arguments"]}
                )
            else:
                # "required" passes name=None explicitly (vllm/tool_parsers/streaming.py:270-283),
                # a named choice leaves it unset (ibid. 33-37)
                names = {"name", "arguments"} if required else {"arguments"}
                assert set(delta) == {"index", "function"} and set(delta["function"]) == names
                assert delta["function"].get("name") is None
                calls[delta["index"]]["arguments"] += delta["function"]["arguments"]
    return calls, finish_reason, chunks


async def test_required_calls_stream_and_complete_alike(autojump_clock: MockClock) -> None:
    request_id = ((b"x-request-id", b"tools-1"),)
    async with running(**LATENCY) as sim:
        streamed = await post(sim, PATH, chat(tool_choice="required", stream=True), request_id)
        whole = await post(sim, PATH, chat(tool_choice="required"), request_id)
    calls, finish_reason, chunks = reassemble(streamed.body)
    choice = whole.json()["choices"][0]
    assert finish_reason == choice["finish_reason"] == "tool_calls"
    # a forced tool_choice's content is "", not null
    # (vllm/entrypoints/openai/chat_completion/message_assembly.py:60-61, 105-109)
    assert choice["message"]["content"] == ""
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [
        (c["id"], c["name"], c["arguments"]) for c in calls
    ]
    # vLLM's make_tool_call_id: "chatcmpl-tool-" and random_uuid(), 16 hex digits
    # (vllm/renderers/chat_utils/tool_call.py:27-32, vllm/utils/__init__.py:11-12)
    assert all(
        c["type"] == "function" and re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", c["id"])
        for c in choice["message"]["tool_calls"]
    )
    assert len(calls) >= 1
    for call in calls:
        value = json.loads(call["arguments"])
        if call["name"] == "get_weather":
            jsonschema.validate(value, WEATHER_SCHEMA)
        else:
            assert value == {}
    argument_chunks = [c for c in chunks if "arguments" in str(c["choices"][0]["delta"])]
    # the EOS token ends the turn: its own last chunk, counted (serving.py:1099-1101)
    assert chunks[-1]["choices"][0]["delta"] == {"content": ""}
    assert whole.json()["usage"]["completion_tokens"] == len(argument_chunks) + 1


async def test_named_tool_choice_calls_exactly_that_function_and_finishes_stop(autojump_clock: MockClock) -> None:
    """A forced named tool reports ``stop``, streamed or not: ``resolve_finish_reason``
    (vllm/entrypoints/serve/utils/tool_calls_utils.py:41-59)."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    async with running() as sim:
        responses = [await post(sim, PATH, chat(tool_choice=named, n=3)) for _ in range(3)]
        streamed = await post(sim, PATH, chat(tool_choice=named, stream=True))
    for response in responses:
        for choice in response.json()["choices"]:
            assert choice["message"]["content"] == ""  # message_assembly.py:60-61, 105-109
            (call,) = choice["message"]["tool_calls"]
            assert call["function"]["name"] == "get_weather"
            jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER_SCHEMA)
            assert choice["finish_reason"] == "stop"
    calls, finish_reason, _ = reassemble(streamed.body, required=False)
    assert finish_reason == "stop" and [call["name"] for call in calls] == ["get_weather"]


async def test_auto_sometimes_answers_with_text_and_none_never_calls(autojump_clock: MockClock) -> None:
    async with running() as sim:
        auto = await post(sim, PATH, chat(n=24, max_tokens=100))
        none = await post(sim, PATH, chat(n=8, max_tokens=5, tool_choice="none"))
        single = await post(sim, PATH, chat(n=16, tool_choice="required", parallel_tool_calls=False))
    kinds = {bool(c["message"].get("tool_calls")) for c in auto.json()["choices"]}
    assert kinds == {True, False}
    for choice in auto.json()["choices"]:
        if choice["message"].get("tool_calls"):
            assert choice["message"]["content"] is None and choice["finish_reason"] == "tool_calls"
        else:
            assert choice["message"]["content"] and choice["finish_reason"] in ("stop", "length")
    assert not any("tool_calls" in c["message"] for c in none.json()["choices"])
    assert all(len(c["message"]["tool_calls"]) == 1 for c in single.json()["choices"])


async def test_allowed_tools_and_custom_tool_choices_are_accepted(autojump_clock: MockClock) -> None:
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function"}]}}
    custom = {"type": "custom", "custom": {"name": "x"}}
    async with running() as sim:
        required = await post(sim, PATH, chat(tool_choice=allowed, n=4))
        auto = await post(sim, PATH, chat(tool_choice=custom, max_tokens=3))
    assert all(c["message"]["tool_calls"] for c in required.json()["choices"])
    assert auto.status == 200


async def test_tools_and_tool_history_cost_prompt_tokens(autojump_clock: MockClock) -> None:
    history = [
        *HELLO,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 degrees"},
    ]
    async with running() as sim:
        bare = await post(sim, PATH, {"messages": HELLO, "max_tokens": 1})
        with_tools = await post(sim, PATH, chat(tool_choice="none", max_tokens=1))
        with_history = await post(sim, PATH, chat(messages=history, tool_choice="none", max_tokens=1))
    prompt = [r.json()["usage"]["prompt_tokens"] for r in (bare, with_tools, with_history)]
    assert prompt[0] + 20 < prompt[1] < prompt[2]


async def test_arguments_are_cut_at_max_tokens(autojump_clock: MockClock) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    async with running() as sim:
        response = await post(sim, PATH, chat(tool_choice=named, max_tokens=2))
        streamed = await post(sim, PATH, chat(tool_choice=named, max_tokens=2, stream=True))
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert response.json()["usage"]["completion_tokens"] == 2
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["arguments"] == '{"'
    calls, finish_reason, _ = reassemble(streamed.body, required=False)
    assert finish_reason == "length" and len(calls) == 1


NAMED_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (chat(tools=[]), "tools", "`tools` must not be an empty array."),
        (chat(tools=None, tool_choice="auto"), "tool_choice", "When using `tool_choice`, `tools` must be set."),
        (chat(tools=None, tool_choice="required"), "tool_choice", "When using `tool_choice`, `tools` must be set."),
        (
            chat(tool_choice={"type": "function", "function": {"name": "nope"}}),
            "tool_choice",
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
        ),
        # request validation: vllm/entrypoints/serve/exception_handling/handlers/validation.py:149-196
        (
            chat(tool_choice="sometimes"),
            "body.tool_choice",
            "Invalid value for `tool_choice`: sometimes! Only named tools",
        ),
        (chat(tool_choice={"type": "function"}), "body.tool_choice", "Invalid value for `function`: `None`"),
        (
            chat(tool_choice={"function": {}}),
            "body.tool_choice",
            f"Expected field `name` in `function` in `tool_choice`! {NAMED_USAGE}",
        ),
        (chat(tool_choice={"function": {"name": ""}}), "body.tool_choice", "Invalid `name` in `function`: ``"),
        (chat(tool_choice=3), "body.tool_choice", "expected a string or an object, got an integer"),
        (chat(tools=[{"type": "function"}]), "body.tools.0.function", "'msg': 'Field required'"),
        (chat(tools=[{"function": {"description": "x"}}]), "body.tools.0.function.name", "Field required"),
        (
            chat(tools=[{"type": "custom", "custom": {"name": "x"}}]),
            "body.tools.0",
            "only function tools are supported",
        ),
        (chat(tools="get_weather"), "body.tools", "Input should be a valid list"),
        (
            chat(tools=[TIME, {"function": {"name": "bad", "parameters": {"type": "string"}}}]),
            "tools[1].function.parameters",
            "Tool validation failed for 'bad': tools[1].function.parameters",
        ),
        (
            chat(
                tools=[
                    {"function": {"name": "neg", "parameters": {"type": "object", "properties": {"a": {"not": {}}}}}}
                ]
            ),
            "tools[0].function.parameters",
            "tools[0].function.parameters.properties.a.not",
        ),
        (chat(tools=[{"function": {"name": "s", "parameters": "object"}}]), "tools[0].function.parameters", "'s'"),
        (chat(parallel_tool_calls="maybe"), "body.parallel_tool_calls", "Input should be a valid boolean"),
        (
            chat(messages=[{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]),
            "body.messages.0.tool_calls.0.function.arguments",
            "required",
        ),
    ],
)
async def test_invalid_tool_requests_are_400(
    body: dict[str, Any], param: str, message: str, autojump_clock: MockClock
) -> None:
    async with running() as sim:
        response = await post(sim, PATH, body)
        submitted = sim.engine.statistics().submitted
    assert response.status == 400, response.body
    error = response.json()["error"]
    kind = "Bad Request" if param.startswith("body") else "BadRequestError"
    assert (error["param"], error["type"], error["code"]) == (param, kind, 400)
    assert message in error["message"]
    assert submitted == 0


# --- arguments valid against many schemas --------------------------------------------------------

LEAVES = st.one_of(
    st.builds(
        lambda low, span: {"type": "integer", "minimum": low, "maximum": low + span},
        st.integers(-50, 50),
        st.integers(0, 20),
    ),
    st.just({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
    st.builds(
        lambda low, span: {"type": "string", "minLength": low, "maxLength": low + span},
        st.integers(0, 5),
        st.integers(0, 10),
    ),
    st.just({"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}),
    st.just({"type": "string", "format": "date"}),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.just({"enum": ["a", 1, None, 'ü"\\']}),
    st.just({"type": ["string", "integer"]}),
)


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": sorted(properties)[: len(properties) // 2]}


SCHEMAS = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.builds(
            lambda items, low, span: {"type": "array", "items": items, "minItems": low, "maxItems": low + span},
            children,
            st.integers(0, 2),
            st.integers(0, 3),
        ),
        st.builds(_object, st.dictionaries(st.sampled_from(["a", "b c", "é", "d\n"]), children, max_size=4)),
        st.builds(lambda options: {"anyOf": options}, st.lists(children, min_size=1, max_size=3)),
    ),
    max_leaves=8,
)
PARAMETERS = st.builds(
    lambda properties, closed: {**_object(properties), "additionalProperties": not closed},
    st.dictionaries(st.sampled_from(["city", "count", "items", "ünï", 'q"uote']), SCHEMAS, max_size=5),
    st.booleans(),
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parameters=PARAMETERS)
async def test_streamed_arguments_are_valid_against_the_tool_schema(
    parameters: dict[str, Any], autojump_clock: MockClock
) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    body = chat(tools=[tool], tool_choice="required", n=2, stream=True)
    async with running() as sim:
        response = await post(sim, PATH, body)
    assert response.status == 200, response.body
    for index in (0, 1):
        calls, finish_reason, _ = reassemble(response.body, index)
        assert calls and finish_reason == "tool_calls"
        for call in calls:
            jsonschema.Draft202012Validator(parameters).validate(json.loads(call["arguments"]))


async def test_the_prompt_lists_the_tools_as_sent(autojump_clock: MockClock) -> None:
    async with running() as sim:
        short = await post(sim, PATH, chat(tools=[TIME], tool_choice="none", max_tokens=1))
        long = await post(sim, PATH, chat(tools=[TIME, WEATHER], tool_choice="none", max_tokens=1))
    weather_tokens = len(sim.ctx.tokenizer.encode(orjson.dumps(WEATHER).decode()))
    extra = long.json()["usage"]["prompt_tokens"] - short.json()["usage"]["prompt_tokens"]
    assert weather_tokens // 2 < extra < weather_tokens * 2


async def test_a_schema_that_admits_no_value_is_a_400_on_every_endpoint(autojump_clock: MockClock) -> None:
    """Accepted at compile time, but ``uniqueItems`` cannot be met: the client's 400, not a 500."""
    chat_tools = [{"type": "function", "function": {"name": "f", "parameters": UNSATISFIABLE_SCHEMA}}]
    flat_tools = [{"type": "function", "name": "f", "parameters": UNSATISFIABLE_SCHEMA}]
    async with running() as sim:
        chat_response = await post(sim, PATH, chat(tools=chat_tools, tool_choice="required"))
        responses_response = await post(
            sim, "/v1/responses", {"input": "hi", "tools": flat_tools, "tool_choice": "required"}
        )
        messages_response = await post(
            sim,
            "/v1/messages",
            {
                "max_tokens": 50,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"name": "f", "input_schema": UNSATISFIABLE_SCHEMA}],
                "tool_choice": {"type": "any"},
            },
        )
        assert sim.engine.statistics().submitted == 0
    for response in (chat_response, responses_response):
        assert response.status == 400, response.body
        assert response.json()["error"]["param"].endswith(".properties.a")
    assert messages_response.status == 400
    assert messages_response.json()["error"]["type"] == "invalid_request_error"
