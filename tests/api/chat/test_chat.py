"""/v1/chat/completions through the real router, engine and text generator, on trio's
mock clock (no server, no sockets)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from tests.api.fakes import CREATED, FakeResponse, post, running, sse_payloads

PATH = "/v1/chat/completions"
LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}
HELLO = [{"role": "user", "content": "Hello there, how are you today?"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "llmsim/sim-model", "messages": HELLO, **fields}


async def test_stream_sends_the_role_chunk_with_the_first_token_after_ttft(autojump_clock: MockClock) -> None:
    async with running(**LATENCY) as sim:
        started = trio.current_time()
        response = await post(sim, PATH, chat(max_tokens=4, ignore_eos=True, stream=True))
    assert response.status == 200
    assert response.headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    times = [when - started for when, _ in response.writes]
    assert times == pytest.approx([0.1, 0.11, 0.12, 0.13])
    payloads = sse_payloads(response.body)
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    # N tokens, N content chunks: the last token's own chunk carries the finish_reason
    # (vllm/entrypoints/openai/chat_completion/serving.py:796-809)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["length"]
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in chunks[1:])
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", chunks[0]["id"])
    assert {(c["id"], c["object"], c["created"], c["model"]) for c in chunks} == {
        (chunks[0]["id"], "chat.completion.chunk", CREATED, "llmsim/sim-model")
    }


async def test_stream_usage_chunk_matches_the_non_streaming_usage(autojump_clock: MockClock) -> None:
    async with running() as sim:
        streamed = await post(
            sim, PATH, chat(max_tokens=5, ignore_eos=True, stream=True, stream_options={"include_usage": True})
        )
        whole = await post(sim, PATH, chat(max_tokens=5, ignore_eos=True))
    *chunks, done = sse_payloads(streamed.body)
    assert done == "[DONE]"
    assert chunks[-1]["choices"] == []
    # the usage chunk is dumped with exclude_none, the body whole
    # (vllm/entrypoints/openai/chat_completion/serving.py:499-501; api_router.py:113)
    assert chunks[-1]["usage"] == {k: v for k, v in whole.json()["usage"].items() if v is not None}
    usage_keys = [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
    ]
    assert list(whole.json()["usage"]) == usage_keys  # vllm/entrypoints/serve/engine/protocol.py:135-140
    assert whole.json()["usage"]["completion_tokens"] == 5


async def test_x_request_id_names_the_response_and_seeds_its_text(autojump_clock: MockClock) -> None:
    async with running() as sim:
        first = await post(sim, PATH, chat(max_tokens=20), headers=((b"x-request-id", b"req-42"),))
        second = await post(sim, PATH, chat(max_tokens=20), headers=((b"x-request-id", b"req-42"),))
        other = await post(sim, PATH, chat(max_tokens=20))
    assert first.json()["id"] == "chatcmpl-req-42"
    assert first.headers[b"x-request-id"] == b"req-42"
    assert b"x-request-id" not in other.headers
    assert first.json()["choices"] == second.json()["choices"]


async def test_non_streaming_response_with_n_choices(autojump_clock: MockClock) -> None:
    async with running(**LATENCY) as sim:
        response = await post(sim, PATH, chat(n=3, max_tokens=6))
    body = response.json()
    assert response.status == 200
    assert response.headers[b"content-type"] == b"application/json"
    assert body["object"] == "chat.completion" and body["created"] == CREATED
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["message"]["role"] == "assistant" and c["message"]["content"] for c in body["choices"])
    assert all(c["finish_reason"] in ("stop", "length") for c in body["choices"])
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


async def test_streamed_choices_each_get_one_role_chunk(autojump_clock: MockClock) -> None:
    async with running(**LATENCY) as sim:
        response = await post(sim, PATH, chat(n=2, max_tokens=3, ignore_eos=True, stream=True))
    chunks = sse_payloads(response.body)[:-1]
    assert all(len(c["choices"]) == 1 for c in chunks)
    roles = [c["choices"][0]["index"] for c in chunks if "role" in c["choices"][0]["delta"]]
    assert sorted(roles) == [0, 1]
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1]


async def test_max_completion_tokens_wins_over_max_tokens(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, PATH, chat(max_tokens=1, max_completion_tokens=3, ignore_eos=True))
    assert response.json()["usage"]["completion_tokens"] == 3
    assert response.json()["choices"][0]["finish_reason"] == "length"


async def test_echo_mode_replays_the_text_of_the_last_user_message(autojump_clock: MockClock) -> None:
    messages = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Tell me"},
                {"type": "image_url", "image_url": {"url": "u"}},
                {"type": "text", "text": "more."},
            ],
        },
    ]
    async with running(mode="echo") as sim:
        response = await post(sim, PATH, {"messages": messages})
    choice = response.json()["choices"][0]
    assert choice["message"]["content"] == "Tell me\nmore."
    assert choice["finish_reason"] == "stop"


async def test_echo_field_prepends_a_trailing_assistant_message(autojump_clock: MockClock) -> None:
    messages = [*HELLO, {"role": "assistant", "content": "Once upon "}]
    async with running() as sim:
        echoed = await post(sim, PATH, {"messages": messages, "echo": True, "max_tokens": 3})
        plain = await post(sim, PATH, {"messages": HELLO, "echo": True, "max_tokens": 3})
    assert echoed.json()["choices"][0]["message"]["content"].startswith("Once upon ")
    assert not plain.json()["choices"][0]["message"]["content"].startswith("Hello there")


async def test_media_blocks_cost_a_few_placeholder_tokens(autojump_clock: MockClock) -> None:
    text = {"type": "text", "text": "Describe these."}
    media = [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "image_url", "image_url": "https://example.com/b.png"},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}},
        {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}},
    ]
    async with running() as sim:
        plain = await post(sim, PATH, {"messages": [{"role": "user", "content": [text]}], "max_tokens": 1})
        rich = await post(sim, PATH, {"messages": [{"role": "user", "content": [text, *media]}], "max_tokens": 1})
    assert rich.status == 200
    extra = rich.json()["usage"]["prompt_tokens"] - plain.json()["usage"]["prompt_tokens"]
    assert len(media) <= extra <= 10 * len(media)


@pytest.mark.parametrize(
    ("body", "status", "param", "message"),
    [
        (
            chat(model="no-such-model"),
            404,
            "model",
            "The model `no-such-model` does not exist. Valid aliases: llmsim/sim-model.",
        ),
        ({"model": "llmsim/sim-model"}, 400, "body.messages", "'msg': 'Field required'"),
        (chat(messages="hi"), 400, "body.messages", "'msg': 'Input should be a valid list'"),
        (chat(messages=[{"role": "user", "content": 5}]), 400, "body.messages.0.content", "got an integer"),
        (chat(messages=[{"content": "x"}]), 400, "body.messages.0.role", "Field required"),
        (
            chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": 3}]}]),
            400,
            "body.messages.0.content.0.image_url",
            "got an integer",
        ),
        (
            chat(messages=[{"role": "user", "content": [{"type": "file", "file": {}}]}]),
            400,
            "messages[0].content[0].type",
            "Unknown content part type 'file'",
        ),
        (
            chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
            400,
            "messages[0].content[0].text",
            "no 'text'",
        ),
        (chat(n="x"), 400, "body.n", "unable to parse string as an integer"),
        (chat(n=0), 400, None, "n must be at least 1, got 0."),  # vllm/sampling_params.py:53-54
        (chat(stream="maybe"), 400, "body.stream", "Input should be a valid boolean, unable to interpret input"),
        # vllm/sampling_params.py:691-696: the param is max_tokens whatever field was sent
        (
            chat(max_tokens=0),
            400,
            "max_tokens",
            "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        ),
        (chat(max_completion_tokens=-1), 400, "max_tokens", "max_tokens must be at least 1, got -1."),
        (chat(max_tokens=1.5), 400, "body.max_tokens", "got a number with a fractional part"),
        (
            chat(stream_options={"include_usage": True}),
            400,
            "stream_options",
            # vllm/entrypoints/openai/chat_completion/protocol.py:858-868
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
        ),
        (chat(stream=True, stream_options=True), 400, "body.stream_options", "Input should be a valid dictionary"),
        (chat(model=7), 400, "body.model", "Input should be a valid string"),
    ],
)
async def test_invalid_requests(
    body: dict[str, Any], status: int, param: str | None, message: str, autojump_clock: MockClock
) -> None:
    async with running() as sim:
        response = await post(sim, PATH, body)
        statistics = sim.engine.statistics()
    assert response.status == status
    error = response.json()["error"]
    assert error["param"] == param
    assert message in error["message"]
    assert error["code"] == status
    # request-validation errors: vllm/entrypoints/serve/exception_handling/handlers/validation.py:149-196
    body_error = param is not None and param.startswith("body")
    assert error["type"] == ("NotFoundError" if status == 404 else "Bad Request" if body_error else "BadRequestError")
    assert statistics.submitted == 0


async def test_empty_stream_options_without_stream_are_accepted(autojump_clock: MockClock) -> None:
    # vllm/entrypoints/openai/chat_completion/protocol.py:863: `data.get("stream_options")` is falsy for {}
    async with running() as sim:
        response = await post(sim, PATH, chat(max_tokens=2, stream_options={}))
    assert response.status == 200
    assert response.json()["object"] == "chat.completion"


async def test_malformed_json_is_400(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, PATH, b'{"messages": [')
        trailing = await post(sim, PATH, b'{"messages": [],}')
    # FastAPI's json_invalid error (Python's decoder: position and text) as vLLM renders it
    # (vllm/entrypoints/serve/exception_handling/handlers/validation.py:149-196)
    assert (response.status, response.body) == (
        400,
        b"{\"error\":{\"message\":\"1 validation error:\\n  {'type': 'json_invalid', 'loc': 'body.14', "
        b"'msg': 'JSON decode error', 'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting value'}}\","
        b'"type":"Bad Request","param":"body.14","code":400}}',
    )
    assert trailing.json()["error"]["param"] == "body.16"
    assert (
        "'ctx': {'error': 'Expecting property name enclosed in double quotes'}" in trailing.json()["error"]["message"]
    )


def context_error(message: str, param: str) -> dict[str, Any]:
    return {"message": message, "type": "BadRequestError", "param": param, "code": 400}


async def test_context_length_as_vllm_0_33(autojump_clock: MockClock) -> None:
    # 400 only when max_tokens alone (vllm/renderers/params.py:270-283) or the prompt alone
    # (params.py:531-551; text is tokenized with truncation at max_model_len + 1, hence
    # "at least") exceeds max_model_len; the field's own name in both message and param
    long = [{"role": "user", "content": "word " * 200}]
    async with running(max_model_len=100) as sim:
        too_long = await post(sim, PATH, {"messages": long})
        too_many = await post(sim, PATH, chat(max_tokens=101))
        too_many_completion = await post(sim, PATH, chat(max_tokens=5, max_completion_tokens=101))
    assert too_long.status == 400
    assert too_long.json()["error"] == context_error(
        "This model's maximum context length is 100 tokens. However, your prompt contains at least 101 input "
        "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input "
        "prompt. (parameter=input_tokens, value=101)",
        "input_tokens",
    )
    assert too_many.json()["error"] == context_error(
        "max_tokens=101 cannot be greater than max_model_len=100. Please request fewer output tokens. "
        "(parameter=max_tokens, value=101)",
        "max_tokens",
    )
    assert too_many_completion.json()["error"] == context_error(
        "max_completion_tokens=101 cannot be greater than max_model_len=100. Please request fewer output tokens. "
        "(parameter=max_completion_tokens, value=101)",
        "max_completion_tokens",
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_prompt_plus_max_tokens_over_the_window_is_clamped(stream: bool, autojump_clock: MockClock) -> None:
    # get_max_tokens clamps max_tokens to max_model_len - prompt
    # (vllm/entrypoints/serve/utils/api_utils.py:234-270, chat_completion/serving.py:349-358)
    options = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    async with running(max_model_len=100) as sim:
        response = await post(sim, PATH, chat(max_tokens=100, ignore_eos=True, **options))
        unset = await post(sim, PATH, chat(ignore_eos=True))
    assert response.status == 200
    if stream:
        *chunks, usage_chunk, _ = sse_payloads(response.body)
        usage, finish = usage_chunk["usage"], chunks[-1]["choices"][0]["finish_reason"]
    else:
        usage, finish = response.json()["usage"], response.json()["choices"][0]["finish_reason"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 100 and finish == "length"
    usage = unset.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 100  # no cap: the rest of the context


async def test_a_prompt_that_fills_the_window_leaves_max_tokens_0(autojump_clock: MockClock) -> None:
    # the clamped cap is 0, which SamplingParams refuses as max_tokens (vllm/sampling_params.py:691-696)
    async with running() as sim:
        prompt_tokens = (await post(sim, PATH, chat(max_tokens=1))).json()["usage"]["prompt_tokens"]
    async with running(max_model_len=prompt_tokens) as sim:
        full = await post(sim, PATH, chat(max_completion_tokens=5, stream=True))
    assert full.status == 400
    assert full.json()["error"] == context_error(
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens"
    )


async def test_a_full_queue_is_429_and_leaves_no_job_behind(autojump_clock: MockClock) -> None:
    # Two slots, no queue: the second request's first choice gets the free slot and its
    # second is refused, so the first must be taken back (all or none).
    limits = {"max_num_seqs": 2, "max_waiting_queue_length": 0, "time_to_first_token": 10.0}
    async with running(**limits) as sim, trio.open_nursery() as nursery:
        first = FakeResponse()
        nursery.start_soon(post, sim, PATH, chat(max_tokens=2, stream=True), (), first)
        await trio.testing.wait_all_tasks_blocked()
        rejected = await post(sim, PATH, chat(n=2, max_tokens=2, stream=True))
        statistics = sim.engine.statistics()
    assert rejected.status == 429
    assert rejected.json()["error"] == {
        "message": "Failed to enqueue request, waiting requests queue is full",
        "type": "RateLimitError",
        "param": None,
        "code": 429,
    }
    assert (statistics.running, statistics.waiting, statistics.rejected) == (1, 0, 1)
    assert first.status == 200 and first.ended


@pytest.mark.parametrize("stream", [True, False])
async def test_client_gone_cancels_the_jobs_in_the_engine(stream: bool, autojump_clock: MockClock) -> None:
    async with running(time_to_first_token=0.1, inter_token_latency=1.0) as sim:
        response = FakeResponse()
        with trio.move_on_after(2.5):
            await post(sim, PATH, chat(n=2, max_tokens=50, ignore_eos=True, stream=stream), (), response)
        statistics = sim.engine.statistics()
    assert (statistics.running, statistics.waiting, statistics.cancelled, statistics.finished) == (0, 0, 2, 0)
    assert not response.ended
    if stream:
        assert sse_payloads(response.body)[0]["choices"][0]["delta"]["role"] == "assistant"


# --- how a turn ends (vLLM 0.33) -----------------------------------------------------------------


async def test_a_natural_stop_is_the_eos_token_one_itl_later_and_counted(autojump_clock: MockClock) -> None:
    """EOS is a sampled token: its chunk (empty content, ``stop``) comes one decode step
    after the last text, and usage counts it, streamed or not; the text leaves it out
    (vllm/v1/engine/detokenizer.py:107-128; chat_completion/serving.py:796-809, 1099-1101)."""
    echo = [{"role": "user", "content": "one two three"}]
    async with running(mode="echo", **LATENCY) as sim:
        started = trio.current_time()
        streamed = await post(
            sim, PATH, chat(messages=echo, stream=True, stream_options={"include_usage": True}, max_tokens=50)
        )
        whole = await post(sim, PATH, chat(messages=echo, max_tokens=50))
    assert [when - started for when, _ in streamed.writes] == pytest.approx([0.1, 0.11, 0.12, 0.13])
    *chunks, usage, _ = sse_payloads(streamed.body)
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": "one "},
        {"content": "two "},
        {"content": "three"},
        {"content": ""},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, None, "stop"]
    assert streamed.writes[-1][1].startswith(b'data: {"id"') and b'"content":""' in streamed.writes[-1][1]
    assert usage["usage"]["completion_tokens"] == 4 == whole.json()["usage"]["completion_tokens"]
    choice = whole.json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("one two three", "stop")


async def test_no_eos_when_the_cap_is_reached_or_ignore_eos(autojump_clock: MockClock) -> None:
    """``length`` (max_tokens reached, or ``ignore_eos``) ends on a text token: no EOS."""
    echo = [{"role": "user", "content": "one two three"}]
    async with running(mode="echo") as sim:
        exact = await post(sim, PATH, chat(messages=echo, max_tokens=3, stream=True))
    chunks = sse_payloads(exact.body)[:-1]
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["", "one ", "two ", "three"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_the_eos_chunk_carries_the_eos_tokens_logprobs(autojump_clock: MockClock) -> None:
    """vLLM's EOS chunk has logprobs like any token, named by the EOS string
    (serving.py:724-735; vllm/tokenizers/detokenizer_utils.py:143-168)."""
    echo = [{"role": "user", "content": "one two"}]
    async with running(mode="echo") as sim:
        same_id = ((b"x-request-id", b"eos-1"),)  # the same logprob seed
        streamed = await post(sim, PATH, chat(messages=echo, logprobs=True, top_logprobs=1, stream=True), same_id)
        whole = await post(sim, PATH, chat(messages=echo, logprobs=True, top_logprobs=1), same_id)
    last = sse_payloads(streamed.body)[-2]["choices"][0]
    assert last["delta"] == {"content": ""} and last["finish_reason"] == "stop"
    (entry,) = last["logprobs"]["content"]
    assert entry["token"] == "<|im_end|>" and entry["bytes"] == list(b"<|im_end|>")
    content = whole.json()["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == ["one ", "two", "<|im_end|>"]
    assert content[-1] == entry


async def test_n_choices_send_every_role_chunk_before_any_token(autojump_clock: MockClock) -> None:
    """``for i in range(num_choices)`` on the first engine output (serving.py:597-634)."""
    async with running(**LATENCY) as sim:
        response = await post(sim, PATH, chat(n=3, max_tokens=2, ignore_eos=True, stream=True))
    deltas = [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in sse_payloads(response.body)[:-1]]
    assert [delta for _, delta in deltas[:3]] == [{"role": "assistant", "content": ""}] * 3
    assert [index for index, _ in deltas[:3]] == [0, 1, 2]
    assert all("role" not in delta for _, delta in deltas[3:])


# --- min_tokens ----------------------------------------------------------------------------------


async def test_min_tokens_equal_to_max_tokens_gives_exactly_that_many(autojump_clock: MockClock) -> None:
    """The sampler masks EOS until ``min_tokens`` (vllm/sampling_params.py:339, the
    min-tokens logits processor), so every choice runs to the cap."""
    async with running() as sim:
        response = await post(sim, PATH, chat(n=16, max_tokens=40, min_tokens=40))
        streamed = await post(
            sim,
            PATH,
            chat(n=4, max_tokens=40, min_tokens=40, stream=True, stream_options={"include_usage": True}),
        )
    assert {c["finish_reason"] for c in response.json()["choices"]} == {"length"}
    assert response.json()["usage"]["completion_tokens"] == 16 * 40
    assert sse_payloads(streamed.body)[-2]["usage"]["completion_tokens"] == 4 * 40


async def test_min_tokens_is_a_floor_for_every_draw(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, PATH, chat(n=32, max_tokens=60, min_tokens=30, logprobs=True))
    for choice in response.json()["choices"]:
        tokens = len(choice["logprobs"]["content"])
        assert 30 <= tokens <= 60
        assert choice["finish_reason"] == ("length" if tokens == 60 else "stop")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_tokens": 5, "min_tokens": 6}, "min_tokens must be less than or equal to max_tokens=5, got 6."),
        (
            {"max_completion_tokens": 5, "min_tokens": 6},
            "min_tokens must be less than or equal to max_tokens=5, got 6.",
        ),
        ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0, got -1."),
    ],
)
async def test_invalid_min_tokens_are_400_with_vllms_text(
    fields: dict[str, Any], message: str, autojump_clock: MockClock
) -> None:
    """``SamplingParams._verify_args`` (vllm/sampling_params.py:697-705): no parameter
    suffix, param null."""
    async with running() as sim:
        response = await post(sim, PATH, chat(**fields))
    assert response.status == 400
    assert response.json()["error"] == {"message": message, "type": "BadRequestError", "param": None, "code": 400}


async def test_min_tokens_is_checked_against_the_clamped_cap(autojump_clock: MockClock) -> None:
    """Without ``max_tokens`` vLLM's max_tokens is the room the prompt leaves
    (``get_max_tokens``, vllm/entrypoints/serve/utils/api_utils.py:234-270), and the
    message names it."""
    async with running(max_model_len=100) as sim:
        prompt = (await post(sim, PATH, chat(max_tokens=1))).json()["usage"]["prompt_tokens"]
        response = await post(sim, PATH, chat(min_tokens=100))
    room = 100 - prompt
    message = f"min_tokens must be less than or equal to max_tokens={room}, got 100."
    assert response.json()["error"]["message"] == message


# --- stream_options.continuous_usage_stats ------------------------------------------------------


async def test_continuous_usage_stats_put_usage_on_every_chunk(autojump_clock: MockClock) -> None:
    """Cumulative usage on every chunk, the role chunk at 0 (serving.py:624-634, 838-851)."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    async with running() as sim:
        response = await post(sim, PATH, chat(max_tokens=3, ignore_eos=True, stream=True, stream_options=options))
    *chunks, final, _ = sse_payloads(response.body)
    prompt = final["usage"]["prompt_tokens"]
    assert [c["usage"] for c in chunks] == [
        {"prompt_tokens": prompt, "total_tokens": prompt + k, "completion_tokens": k, "completion_tokens_details": None}
        for k in range(4)
    ]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 3


async def test_continuous_usage_stats_need_include_usage(autojump_clock: MockClock) -> None:
    """``should_include_usage``: continuous only with include_usage
    (vllm/entrypoints/serve/utils/api_utils.py:273-285)."""
    async with running() as sim:
        response = await post(
            sim, PATH, chat(max_tokens=2, stream=True, stream_options={"continuous_usage_stats": True})
        )
    assert all("usage" not in c for c in sse_payloads(response.body)[:-1])
