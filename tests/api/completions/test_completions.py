"""/v1/completions through the real router, engine and text generator, on trio's mock
clock (no server, no sockets)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from llmsim.api.completions.request import COMPLETIONS_DEFAULT_MAX_TOKENS
from tests.api.fakes import CREATED, post, running, sse_payloads

PATH = "/v1/completions"
LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.01}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "llmsim/sim-model", "prompt": "The capital of France is", **fields}


async def test_stream_one_chunk_per_token_finish_on_the_last(autojump_clock: MockClock) -> None:
    async with running(**LATENCY) as sim:
        started = trio.current_time()
        response = await post(
            sim, PATH, completion(max_tokens=3, ignore_eos=True, stream=True, stream_options={"include_usage": True})
        )
    assert response.status == 200
    assert response.headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert [when - started for when, _ in response.writes] == pytest.approx([0.1, 0.11, 0.12])
    *chunks, usage, done = sse_payloads(response.body)
    assert done == "[DONE]"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert all(c["usage"] is None and c["object"] == "text_completion" for c in chunks)
    assert re.fullmatch(r"cmpl-[0-9a-f]{16}", chunks[0]["id"])
    assert {c["created"] for c in chunks} == {CREATED}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    ("prompt", "prompt_tokens"),
    [
        ("The capital of France is", None),
        (["first prompt", "second one here"], None),
        ([11, 12, 13], [3]),
        ([[1, 2], [3, 4, 5, 6]], [2, 4]),
    ],
)
async def test_the_four_prompt_forms(prompt: Any, prompt_tokens: list[int] | None, autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, PATH, completion(prompt=prompt, n=2, max_tokens=4))
    body = response.json()
    prompts = 1 if isinstance(prompt, str) or isinstance(prompt[0], int) else len(prompt)
    assert response.status == 200
    assert [c["index"] for c in body["choices"]] == list(range(2 * prompts))
    if prompt_tokens is not None:
        assert body["usage"]["prompt_tokens"] == sum(prompt_tokens)  # counted once per prompt, not per choice
    assert all(c["text"] and c["finish_reason"] in ("stop", "length") for c in body["choices"])
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


async def test_default_max_tokens_is_vllms_16(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, PATH, completion(ignore_eos=True))
    assert response.json()["usage"]["completion_tokens"] == COMPLETIONS_DEFAULT_MAX_TOKENS == 16
    assert response.json()["choices"][0]["finish_reason"] == "length"


async def test_echo_mode_replays_text_and_token_prompts(autojump_clock: MockClock) -> None:
    async with running(mode="echo") as sim:
        response = await post(sim, PATH, completion(prompt=[[1, 2, 3]], max_tokens=50))
        text = await post(sim, PATH, completion(prompt="hello echo world", max_tokens=50))
        capped = await post(sim, PATH, completion(prompt="one two three four", max_tokens=2))
    assert response.json()["choices"][0]["text"] == "1,2,3"
    assert text.json()["choices"][0]["text"] == "hello echo world"
    assert capped.json()["choices"][0]["finish_reason"] == "length"


async def test_echo_field_prepends_the_prompt(autojump_clock: MockClock) -> None:
    async with running() as sim:
        whole = await post(sim, PATH, completion(prompt=["Roses are", "Violets are"], echo=True, max_tokens=3))
        streamed = await post(sim, PATH, completion(prompt="Roses are", echo=True, max_tokens=3, stream=True))
    texts = [c["text"] for c in whole.json()["choices"]]
    assert texts[0].startswith("Roses are") and texts[1].startswith("Violets are")
    first = sse_payloads(streamed.body)[0]
    assert first["choices"][0]["text"].startswith("Roses are")


async def test_x_request_id(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, PATH, completion(), headers=((b"x-request-id", b"abc"),))
    assert response.json()["id"] == "cmpl-abc"
    assert response.headers[b"x-request-id"] == b"abc"


@pytest.mark.parametrize(
    ("body", "status", "param", "message"),
    [
        (completion(prompt=[]), 400, "prompt", "prompt array must contain at least one prompt"),
        (completion(prompt=""), 400, "prompt", "prompt must not contain an empty string"),
        (completion(prompt=["a", ""]), 400, "prompt", "prompt must not contain an empty string"),
        (completion(prompt=[[1, 2], []]), 400, "prompt", "prompt must not contain an empty token-id array"),
        (completion(prompt=123), 400, "prompt", "prompt must be a string, an array of strings, an array of token ids"),
        (completion(prompt=["a", 1]), 400, "prompt", "must not mix"),
        (completion(prompt=[1, True]), 400, "prompt", "must not mix"),
        (completion(prompt=[-1, 2]), 400, "prompt", "Token id -1 is out of vocabulary"),
        ({"model": "llmsim/sim-model"}, 400, "prompt", "Field 'prompt' is required."),
        (completion(model="gpt-4"), 404, "model", "The model `gpt-4` does not exist."),
        (completion(n=-1), 400, "n", "n must be at least 1"),
        (completion(max_tokens=0), 400, "max_tokens", "Max completion tokens and max tokens should be positive"),
        (completion(echo="yes"), 400, "echo", "expected a boolean"),
        (completion(stream_options={"include_usage": True}), 400, "stream_options", "only be defined when stream"),
        (completion(stream=True, stream_options={"include_usage": 1}), 400, "stream_options.include_usage", "boolean"),
    ],
)
async def test_invalid_requests(
    body: dict[str, Any], status: int, param: str, message: str, autojump_clock: MockClock
) -> None:
    async with running() as sim:
        response = await post(sim, PATH, body)
        submitted = sim.engine.statistics().submitted
    assert response.status == status
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, status)
    assert message in error["message"]
    assert submitted == 0


async def test_context_length_counts_the_default_16_tokens(autojump_clock: MockClock) -> None:
    async with running(max_model_len=20) as sim:
        over = await post(sim, PATH, completion(prompt=list(range(1, 6))))  # 5 + 16 > 20
        fits = await post(sim, PATH, completion(prompt=list(range(1, 5))))  # 4 + 16 == 20
        unset = await post(sim, PATH, completion(prompt=list(range(1, 6)), max_tokens=None, ignore_eos=True))
    assert over.status == 400
    assert over.json()["error"]["message"].startswith(
        "This model's maximum context length is 20 tokens. However, you requested 16 output tokens and your prompt "
        "contains 5 input tokens, for a total of 21 tokens."
    )
    assert fits.status == 200
    assert unset.json()["usage"]["completion_tokens"] == 15  # max_tokens null: the rest of the context


async def test_token_ids_beyond_the_vocabulary_are_400_not_500(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, PATH, {"prompt": [1_000_000_000_000], "max_tokens": 2})
        echoed = await post(sim, PATH, {"prompt": [[5], [2**40]], "max_tokens": 2, "echo": True, "logprobs": 1})
    for bad in (response, echoed):
        assert bad.status == 400, bad.body
        error = bad.json()["error"]
        assert error["param"] == "prompt" and "out of vocabulary" in error["message"]


async def test_more_choices_than_the_engine_can_hold_are_429_at_once(autojump_clock: MockClock) -> None:
    async with running(max_num_seqs=4, max_waiting_queue_length=6) as sim:
        huge = await post(sim, PATH, {"prompt": "hi", "n": 1_000_000_000, "max_tokens": 2})
        prompts = await post(sim, PATH, {"prompt": ["a", "b", "c", "d"], "n": 3, "max_tokens": 2})
        fits = await post(sim, PATH, {"prompt": ["a", "b"], "n": 5, "max_tokens": 2})
        chat = await post(sim, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 11})
        assert sim.engine.statistics().rejected == 0  # refused before any job was built
    for refused in (huge, prompts, chat):
        assert refused.status == 429, refused.body
        assert refused.json()["error"]["type"] == "RateLimitError"
    assert fits.status == 200 and len(fits.json()["choices"]) == 10
