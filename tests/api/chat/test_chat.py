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
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
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
    assert chunks[-1]["usage"] == whole.json()["usage"]
    usage_keys = ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"]
    assert list(whole.json()["usage"]) == usage_keys
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
        (chat(model="no-such-model"), 404, "model", "The model `no-such-model` does not exist."),
        ({"model": "llmsim/sim-model"}, 400, "messages", "Field 'messages' is required."),
        (chat(messages="hi"), 400, "messages", "expected an array, got a string"),
        (chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content", "got an integer"),
        (chat(messages=[{"content": "x"}]), 400, "messages[0].role", "required"),
        (
            chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": 3}]}]),
            400,
            "messages[0].content[0].image_url",
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
        (chat(n="2"), 400, "n", "expected an integer, got a string"),
        (chat(n=0), 400, "n", "n must be at least 1"),
        (chat(stream="yes"), 400, "stream", "expected a boolean"),
        (chat(max_tokens=0), 400, "max_tokens", "Max completion tokens and max tokens should be positive"),
        (chat(max_completion_tokens=-1), 400, "max_completion_tokens", "should be positive"),
        (chat(max_tokens=1.5), 400, "max_tokens", "expected an integer"),
        (
            chat(stream_options={"include_usage": True}),
            400,
            "stream_options",
            "Stream options can only be defined when stream is True.",
        ),
        (chat(stream=True, stream_options=True), 400, "stream_options", "expected an object"),
        (chat(model=7), 400, "model", "expected a string"),
    ],
)
async def test_invalid_requests(
    body: dict[str, Any], status: int, param: str, message: str, autojump_clock: MockClock
) -> None:
    async with running() as sim:
        response = await post(sim, PATH, body)
        statistics = sim.engine.statistics()
    assert response.status == status
    error = response.json()["error"]
    assert error["param"] == param
    assert message in error["message"]
    assert error["code"] == status
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")
    assert statistics.submitted == 0


async def test_malformed_json_is_400(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, PATH, b'{"messages": [')
    assert response.status == 400
    assert response.json()["error"]["type"] == "BadRequestError"


async def test_context_length(autojump_clock: MockClock) -> None:
    long = [{"role": "user", "content": "word " * 200}]
    async with running(max_model_len=100) as sim:
        too_long = await post(sim, PATH, {"messages": long})
        too_many = await post(sim, PATH, chat(max_tokens=95))
        fits = await post(sim, PATH, chat(max_tokens=50))
        unset = await post(sim, PATH, chat(ignore_eos=True))
    error = too_long.json()["error"]
    assert too_long.status == 400 and error["param"] == "input_tokens"
    assert re.fullmatch(
        r"This model's maximum context length is 100 tokens\. However, you requested 1 output tokens and your prompt "
        r"contains \d+ input tokens, for a total of \d+ tokens\. Please reduce the length of the input prompt or the "
        r"number of requested output tokens\.",
        error["message"],
    )
    assert too_many.status == 400 and too_many.json()["error"]["param"] == "max_tokens"
    assert "you requested 95 output tokens" in too_many.json()["error"]["message"]
    assert fits.status == 200
    usage = unset.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 100  # no cap: the rest of the context


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
