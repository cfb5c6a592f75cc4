"""Logprobs on /v1/chat/completions and /v1/completions: golden stream bytes (renderer
+ a real Engine with explicit times), and the endpoints through the router on trio's
mock clock: vLLM's shapes, identical values streamed and not, every 400."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from trio.testing import MockClock

from llmsim.api.chat.render import ChatStreamRenderer
from llmsim.api.completions.render import CompletionStreamRenderer
from llmsim.api.generation import CollectingSink
from llmsim.api.logprobs_format import ChatLogprobs, CompletionLogprobs, EchoedPrompt
from llmsim.model.logprobs import MAX_SIMULATED_LOGPROBS, synthesize_logprobs
from llmsim.model.text import EosToken
from tests.api.fakes import EngineRun, make_job, post, running, sse_payloads

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
DONE = b"data: [DONE]\n\n"
CHAT_HEAD = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
TEXT_HEAD = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":'
SEED = 99


def number(value: float) -> bytes:
    return repr(value).encode()


def chat_entry(token: str, position: int, top: int) -> bytes:
    (value,) = synthesize_logprobs([token], top_n=top, position_offset=position, seed=SEED)
    alternatives = b",".join(
        b'{"token":%s,"logprob":%s,"bytes":%s}'
        % (orjson.dumps(name), number(logprob), orjson.dumps(list(name.encode())))
        for name, logprob in value.top
    )
    return b'{"token":%s,"logprob":%s,"bytes":%s,"top_logprobs":[%s]}' % (
        orjson.dumps(token),
        number(value.logprob),
        orjson.dumps(list(token.encode())),
        alternatives,
    )


def test_chat_stream_with_logprobs_exact_bytes() -> None:
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(
        response_id="chatcmpl-1", created=1, model="m", choices=1, include_usage=False, logprobs=ChatLogprobs(2, [SEED])
    )
    sink = run.streaming_sink(renderer, 1)
    run.submit([make_job(sink, ("Hello", " w\u00f6rld"), "length")])
    run.run()
    assert run.response.body == (
        CHAT_HEAD + b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
        b'"prompt_token_ids":null,"prompt_text":null}\n\n'
        + CHAT_HEAD
        + b'[{"index":0,"delta":{"content":"Hello"},"logprobs":{"content":['
        + chat_entry("Hello", 0, 2)
        + b']},"finish_reason":null,"token_ids":null}],"kv_transfer_params":null}\n\n'
        + CHAT_HEAD
        + b'[{"index":0,"delta":{"content":" w\xc3\xb6rld"},"logprobs":{"content":['
        + chat_entry(" w\u00f6rld", 1, 2)
        + b']},"finish_reason":"length","stop_reason":null,"token_ids":null,"weight_versions":null}],'
        b'"kv_transfer_params":null}\n\n' + DONE
    )


def test_chat_stream_eos_chunk_carries_the_eos_tokens_logprobs() -> None:
    """The EOS token's chunk has logprobs like any token, named by its string
    (vllm/entrypoints/openai/chat_completion/serving.py:724-735,1216-1280)."""
    eos = EosToken(3, "<|im_end|>")
    run = EngineRun(**LATENCY)
    renderer = ChatStreamRenderer(
        response_id="chatcmpl-1",
        created=1,
        model="m",
        choices=1,
        include_usage=False,
        logprobs=ChatLogprobs(0, [SEED], eos),
    )
    sink = run.streaming_sink(renderer, 1)
    job = make_job(sink, ("Hi", ""), "stop")
    job.output_token_ids = (700, eos.token_id)
    run.submit([job])
    run.run()
    assert run.response.body.endswith(
        CHAT_HEAD
        + b'[{"index":0,"delta":{"content":""},"logprobs":{"content":['
        + chat_entry("<|im_end|>", 1, 0)
        + b']},"finish_reason":"stop","stop_reason":null,"token_ids":null,"weight_versions":null}],'
        b'"kv_transfer_params":null}\n\n' + DONE
    )


def test_chat_logprobs_without_top_logprobs_list_no_alternatives() -> None:
    logprobs = ChatLogprobs(0, [SEED])
    job = make_job(CollectingSink(1), ("a", "b"))
    (entry, second) = logprobs.of(job)["content"]  # type: ignore[misc]
    assert entry["top_logprobs"] == [] and entry["token"] == "a" and entry["bytes"] == (97,)
    assert logprobs.token_bytes(job, 1) == b'{"content":[' + orjson.dumps(second) + b"]}"


def completion_chunk(text: bytes, logprobs: dict[str, Any], reason: bytes = b"null") -> bytes:
    """vllm/entrypoints/openai/completion/serving.py:437-486 (exclude_unset)."""
    return (
        TEXT_HEAD + b'[{"index":0,"text":"%s","logprobs":%s,"finish_reason":%s,"stop_reason":null,'
        b'"prompt_token_ids":null,"token_ids":null,"weight_versions":null}],"kv_transfer_params":null}\n\n'
        % (text, orjson.dumps(logprobs), reason)
    )


def test_completion_stream_with_echo_and_logprobs_exact_bytes() -> None:
    run = EngineRun(**LATENCY)
    prompt = EchoedPrompt(("Say", " hi"), seed=5)
    logprobs = CompletionLogprobs(1, [SEED], choices_per_prompt=1, prompts=[prompt])
    renderer = CompletionStreamRenderer(
        response_id="cmpl-1",
        created=1,
        model="m",
        choices=1,
        choices_per_prompt=1,
        include_usage=False,
        echo_prompts=["Say hi"],
        logprobs=logprobs,
    )
    sink = run.streaming_sink(renderer, 1)
    run.submit([make_job(sink, (" there", "!"), "stop")])
    run.run()
    (hi,) = synthesize_logprobs([" hi"], top_n=1, position_offset=1, seed=5)
    there, bang = synthesize_logprobs([" there", "!"], top_n=1, seed=SEED)
    assert [value.top for value in (hi, there, bang)] == [((t.token, t.logprob),) for t in (hi, there, bang)]
    assert run.response.body == (
        completion_chunk(
            b"Say hi there",
            {
                "text_offset": [0, 3, 6],
                "token_logprobs": [None, hi.logprob, there.logprob],
                "tokens": ["Say", " hi", " there"],
                "top_logprobs": [None, {" hi": hi.logprob}, {" there": there.logprob}],
            },
        )
        + completion_chunk(
            b"!",
            {
                "text_offset": [12],
                "token_logprobs": [bang.logprob],
                "tokens": ["!"],
                "top_logprobs": [{"!": bang.logprob}],
            },
            b'"stop"',
        )
        + DONE
    )


def test_completion_logprobs_of_a_job_without_tokens() -> None:
    run = EngineRun(**LATENCY)
    logprobs = CompletionLogprobs(3, [SEED], choices_per_prompt=1)
    renderer = CompletionStreamRenderer(
        response_id="cmpl-1",
        created=1,
        model="m",
        choices=1,
        choices_per_prompt=1,
        include_usage=False,
        logprobs=logprobs,
    )
    sink = run.streaming_sink(renderer, 1)
    run.submit([make_job(sink, (), "stop")])
    run.run()
    empty = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    assert run.response.body == completion_chunk(b"", empty, b'"stop"') + DONE


# --- through the router ------------------------------------------------------------------------

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Hello there, how are you today?"}]
SAME_ID = ((b"x-request-id", b"lp-1"),)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "llmsim/sim-model", "messages": HELLO, "max_tokens": 12, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "llmsim/sim-model", "prompt": "The capital of France is", "max_tokens": 12, **fields}


@pytest.mark.parametrize("top_logprobs", [None, 0, 3, 20])
async def test_chat_logprobs_streamed_equal_complete(top_logprobs: int | None, autojump_clock: MockClock) -> None:
    fields = {"logprobs": True, "top_logprobs": top_logprobs, "n": 2}
    async with running(**LATENCY) as sim:
        whole = await post(sim, CHAT, chat(**fields), SAME_ID)
        streamed = await post(sim, CHAT, chat(**fields, stream=True), SAME_ID)
    for choice in whole.json()["choices"]:
        content = choice["logprobs"]["content"]
        text = [entry["token"] for entry in content]
        if choice["finish_reason"] == "stop":  # the EOS token is listed, its text is not in the content
            assert text.pop() == "<|im_end|>"
        assert "".join(text) == choice["message"]["content"]
        assert all(len(entry["top_logprobs"]) == (top_logprobs or 0) for entry in content)
        assert all(entry["bytes"] == list(entry["token"].encode()) for entry in content)
        assert all(entry["logprob"] <= 0 for entry in content)
        chunks = [
            c["choices"][0] for c in sse_payloads(streamed.body)[:-1] if c["choices"][0]["index"] == choice["index"]
        ]
        assert chunks[0]["logprobs"] is None  # the role chunk; every token's chunk has its own, the last too
        streamed_content = [entry for chunk in chunks[1:] for entry in chunk["logprobs"]["content"]]
        assert streamed_content == content
        assert all(len(chunk["logprobs"]["content"]) == 1 for chunk in chunks[1:])


async def test_chat_logprobs_cover_tool_call_arguments(autojump_clock: MockClock) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    async with running() as sim:
        response = await post(sim, CHAT, chat(tools=[tool], tool_choice="required", logprobs=True, max_tokens=None))
        streamed = await post(sim, CHAT, chat(tools=[tool], tool_choice="required", logprobs=True, stream=True))
    choice = response.json()["choices"][0]
    arguments = "".join(call["function"]["arguments"] for call in choice["message"]["tool_calls"])
    *tokens, eos = (entry["token"] for entry in choice["logprobs"]["content"])
    assert "".join(tokens) == arguments and eos == "<|im_end|>"
    *chunks, last = sse_payloads(streamed.body)[:-1]
    for chunk in chunks:
        delta = chunk["choices"][0]["delta"]
        has_token = "arguments" in str(delta)
        assert (chunk["choices"][0]["logprobs"] is not None) == has_token
    assert last["choices"][0]["delta"] == {"content": ""} and last["choices"][0]["logprobs"] is not None


async def test_chat_without_logprobs_keeps_them_null(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, CHAT, chat(logprobs=False, top_logprobs=0))
    assert response.json()["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("echo", [False, True])
@pytest.mark.parametrize("logprobs", [0, 1, 5])
async def test_completion_logprobs_streamed_equal_complete(
    echo: bool, logprobs: int, autojump_clock: MockClock
) -> None:
    fields = {"logprobs": logprobs, "echo": echo, "prompt": ["Roses are red,", "Violets"], "n": 2}
    async with running(**LATENCY) as sim:
        whole = await post(sim, COMPLETIONS, completion(**fields), SAME_ID)
        streamed = await post(sim, COMPLETIONS, completion(**fields, stream=True), SAME_ID)
    for choice in whole.json()["choices"]:
        values = choice["logprobs"]
        assert list(values) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
        eos = ["<|im_end|>"] if choice["finish_reason"] == "stop" else []  # listed, not in the text
        assert values["tokens"][len(values["tokens"]) - len(eos) :] == eos
        assert "".join(values["tokens"][: len(values["tokens"]) - len(eos)]) == choice["text"]
        assert values["text_offset"] == [sum(map(len, values["tokens"][:i])) for i in range(len(values["tokens"]))]
        listed = [top for top in values["top_logprobs"] if top is not None]
        assert all(len(top) == max(logprobs, 1) for top in listed)
        assert all(
            top[token] == lp
            for token, lp, top in zip(values["tokens"], values["token_logprobs"], values["top_logprobs"], strict=True)
            if top
        )
        if echo:
            assert values["token_logprobs"][0] is None and values["top_logprobs"][0] is None
        chunks = [
            c["choices"][0] for c in sse_payloads(streamed.body)[:-1] if c["choices"][0]["index"] == choice["index"]
        ]
        joined: dict[str, list[Any]] = {key: [] for key in values}
        for chunk in chunks:
            for key in values:
                joined[key] += chunk["logprobs"][key]
        assert joined == values
        assert "".join(chunk["text"] for chunk in chunks) == choice["text"]


async def test_echoed_prompts_share_logprobs_across_their_choices(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, COMPLETIONS, completion(prompt=[[5, 6, 7]], echo=True, logprobs=2, n=2))
    first, second = (c["logprobs"] for c in response.json()["choices"])
    assert first["token_logprobs"][:3] == second["token_logprobs"][:3]
    assert first["token_logprobs"][0] is None and None not in first["token_logprobs"][1:]


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        # vllm/entrypoints/openai/chat_completion/protocol.py:913-926
        (
            CHAT,
            chat(top_logprobs=2),
            "top_logprobs",
            "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
        ),
        (CHAT, chat(logprobs=False, top_logprobs=-1), "top_logprobs", "`logprobs` must be set to true"),
        (
            CHAT,
            chat(logprobs=True, top_logprobs=-2),
            "top_logprobs",
            "`top_logprobs` must be a positive value or -1. (parameter=top_logprobs, value=-2)",
        ),
        # request validation (vllm/entrypoints/serve/exception_handling/handlers/validation.py:149-196)
        (CHAT, chat(logprobs=2), "body.logprobs", "'type': 'bool_parsing'"),
        (CHAT, chat(logprobs=True, top_logprobs=2.5), "body.top_logprobs", "'type': 'int_from_float'"),
        # vllm/entrypoints/openai/completion/protocol.py:586-595
        (
            COMPLETIONS,
            completion(logprobs=-2),
            "logprobs",
            "`logprobs` must be a positive value or -1. (parameter=logprobs, value=-2)",
        ),
        (COMPLETIONS, completion(logprobs="x"), "body.logprobs", "'type': 'int_parsing'"),
    ],
)
async def test_invalid_logprob_requests_are_400(
    path: str, body: dict[str, Any], param: str, message: str, autojump_clock: MockClock
) -> None:
    async with running() as sim:
        response = await post(sim, path, body)
    assert response.status == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, 400)
    assert message in error["message"]


def too_many(count: int, limit: int) -> dict[str, Any]:
    """vLLM's refusal of more logprobs than ``--max-logprobs``: ``param`` is ``logprobs``
    whatever the field (vllm/sampling_params.py:922-937, vllm/exceptions.py:49-56)."""
    return {
        "message": f"Requested sample logprobs of {count}, which is greater than max allowed: {limit} "
        f"(parameter=logprobs, value={count})",
        "type": "BadRequestError",
        "param": "logprobs",
        "code": 400,
    }


@pytest.mark.parametrize(
    ("path", "body", "count"),
    [
        (CHAT, chat(logprobs=True, top_logprobs=21), 21),
        (CHAT, chat(logprobs=True, top_logprobs=-1), 2**31),  # -1: the whole vocabulary
        (COMPLETIONS, completion(logprobs=21), 21),
        (COMPLETIONS, completion(logprobs=-1, echo=True), 2**31),
    ],
)
async def test_more_logprobs_than_max_logprobs_is_vllms_400(
    path: str, body: dict[str, Any], count: int, autojump_clock: MockClock
) -> None:
    async with running() as sim:
        response = await post(sim, path, body)
        assert sim.engine.statistics().submitted == 0
    assert response.status == 400
    assert response.body == orjson.dumps({"error": too_many(count, 20)})


async def test_a_stream_asking_too_many_logprobs_gets_the_error_in_band(autojump_clock: MockClock) -> None:
    # vLLM verifies the sampling params as the engine takes the request, on the stream's
    # first iteration: a 200 whose only event is the error, then [DONE]
    # (vllm/v1/engine/input_processor.py:157, chat_completion/serving.py:496-497,951-953;
    # completion/serving.py:554-558 writes it with json.dumps)
    async with running() as sim:
        chat_stream = await post(sim, CHAT, chat(logprobs=True, top_logprobs=25, stream=True))
        text_stream = await post(sim, COMPLETIONS, completion(logprobs=25, stream=True))
        assert sim.engine.statistics().submitted == 0
    assert (chat_stream.status, text_stream.status) == (200, 200)
    assert chat_stream.body == b"data: " + orjson.dumps({"error": too_many(25, 20)}) + b"\n\n" + DONE
    assert text_stream.body == b"data: " + json.dumps({"error": too_many(25, 20)}).encode() + b"\n\n" + DONE


async def test_completions_take_up_to_max_logprobs(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, COMPLETIONS, completion(logprobs=20))
    tops = response.json()["choices"][0]["logprobs"]["top_logprobs"]
    assert tops and all(len(top) == 20 for top in tops)


async def test_max_logprobs_raises_the_limit(autojump_clock: MockClock) -> None:
    async with running(max_logprobs=40) as sim:
        allowed = await post(sim, CHAT, chat(logprobs=True, top_logprobs=40))
        refused = await post(sim, CHAT, chat(logprobs=True, top_logprobs=41))
    content = allowed.json()["choices"][0]["logprobs"]["content"]
    assert all(len({top["token"] for top in entry["top_logprobs"]}) == 40 for entry in content)
    assert refused.body == orjson.dumps({"error": too_many(41, 40)})


async def test_max_logprobs_minus_one_lifts_the_cap_to_what_llmsim_can_list(autojump_clock: MockClock) -> None:
    # vLLM: -1 allows up to the vocabulary size (vllm/sampling_params.py:923-925); llmsim
    # lists at most MAX_SIMULATED_LOGPROBS alternatives per token and says so
    async with running(max_logprobs=-1) as sim:
        many = await post(sim, COMPLETIONS, completion(logprobs=MAX_SIMULATED_LOGPROBS, max_tokens=2))
        vocabulary = await post(sim, COMPLETIONS, completion(logprobs=-1))
    assert all(len(top) == MAX_SIMULATED_LOGPROBS for top in many.json()["choices"][0]["logprobs"]["top_logprobs"])
    assert vocabulary.status == 400
    assert vocabulary.json()["error"] == {
        "message": f"llmsim lists at most {MAX_SIMULATED_LOGPROBS} logprobs per token; {2**31} were requested.",
        "type": "BadRequestError",
        "param": "logprobs",
        "code": 400,
    }
