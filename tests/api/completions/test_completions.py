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
    # exclude_unset: no usage key on a token chunk (vllm/entrypoints/openai/completion/serving.py:486)
    assert all("usage" not in c and c["object"] == "text_completion" for c in chunks)
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
    # absent or null: vllm/entrypoints/openai/completion/protocol.py:64 and :451-456 (normalize_null_max_tokens)
    async with running() as sim:
        absent = await post(sim, PATH, completion(ignore_eos=True))
        null = await post(sim, PATH, completion(ignore_eos=True, max_tokens=None))
    for response in (absent, null):
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
        (
            completion(prompt=123),
            400,
            "body.prompt",
            "prompt must be a string, an array of strings, an array of token ids",
        ),
        (completion(prompt=["a", 1]), 400, "body.prompt", "must not mix"),
        (completion(prompt=[1, True]), 400, "body.prompt", "must not mix"),
        # vllm/renderers/base.py:480-486 (no parameter)
        (completion(prompt=[-1, 2]), 400, None, "Token id -1 is out of vocabulary"),
        ({"model": "llmsim/sim-model"}, 400, "body.prompt", "Field required"),
        (completion(model="gpt-4"), 404, "model", "The model `gpt-4` does not exist. Valid aliases: llmsim/sim-model."),
        (completion(n=-1), 400, None, "n must be at least 1, got -1."),  # vllm/sampling_params.py:53-54
        # vllm/sampling_params.py:691-696 (echo with max_tokens 0 is served: see below)
        (
            completion(max_tokens=0),
            400,
            "max_tokens",
            "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        ),
        (completion(echo="maybe"), 400, "body.echo", "valid boolean"),
        (
            completion(stream_options={"include_usage": True}),
            400,
            "stream_options",
            "only be defined when `stream=True`.",
        ),
        (
            completion(stream=True, stream_options={"include_usage": 2}),
            400,
            "body.stream_options.include_usage",
            "boolean",
        ),
    ],
)
async def test_invalid_requests(
    body: dict[str, Any], status: int, param: str | None, message: str, autojump_clock: MockClock
) -> None:
    async with running() as sim:
        response = await post(sim, PATH, body)
        submitted = sim.engine.statistics().submitted
    assert response.status == status
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, status)
    assert message in error["message"]
    assert submitted == 0


async def test_context_length_clamps_the_default_16_tokens(autojump_clock: MockClock) -> None:
    # prompt + max_tokens over max_model_len is served with max_tokens clamped
    # (vllm/entrypoints/serve/utils/api_utils.py:234-270, completion/serving.py:163-171)
    async with running(max_model_len=20) as sim:
        over = await post(sim, PATH, completion(prompt=list(range(1, 6)), ignore_eos=True))  # 5 + 16 > 20
        fits = await post(sim, PATH, completion(prompt=list(range(1, 5)), ignore_eos=True))  # 4 + 16 == 20
        unset = await post(sim, PATH, completion(prompt=list(range(1, 6)), max_tokens=None, ignore_eos=True))
    assert over.status == 200
    assert over.json()["usage"]["completion_tokens"] == 15
    assert over.json()["choices"][0]["finish_reason"] == "length"
    assert fits.json()["usage"]["completion_tokens"] == 16
    assert unset.json()["usage"]["completion_tokens"] == 15  # max_tokens null: the default 16, clamped


def bad_request(message: str, param: str) -> dict[str, Any]:
    return {"message": message, "type": "BadRequestError", "param": param, "code": 400}


async def test_context_window_errors_are_vllms(autojump_clock: MockClock) -> None:
    # vllm/renderers/params.py:270-283 (max_tokens alone), 531-551 (the prompt alone: text is
    # tokenized with truncation at max_model_len + 1, token ids are counted as given),
    # vllm/sampling_params.py:691-696 (a prompt that fills the window leaves max_tokens 0)
    async with running(max_model_len=20) as sim:
        too_many = await post(sim, PATH, completion(max_tokens=21))
        long_text = await post(sim, PATH, completion(prompt="word " * 40))
        long_ids = await post(sim, PATH, completion(prompt=list(range(1, 26))))
        second_too_long = await post(sim, PATH, completion(prompt=[[1, 2], list(range(1, 22))]))
        full = await post(sim, PATH, completion(prompt=list(range(1, 21))))
    assert too_many.json()["error"] == bad_request(
        "max_tokens=21 cannot be greater than max_model_len=20. Please request fewer output tokens. "
        "(parameter=max_tokens, value=21)",
        "max_tokens",
    )

    def too_long(count: str, value: int) -> dict[str, Any]:
        return bad_request(
            f"This model's maximum context length is 20 tokens. However, your prompt contains {count} input tokens, "
            "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={value})",
            "input_tokens",
        )

    assert long_text.json()["error"] == too_long("at least 21", 21)
    assert long_ids.json()["error"] == too_long("25", 25)
    assert second_too_long.json()["error"] == too_long("at least 21", 21)
    assert full.json()["error"] == bad_request(
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens"
    )


async def test_token_ids_beyond_the_vocabulary_are_400_not_500(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, PATH, {"prompt": [1_000_000_000_000], "max_tokens": 2})
        echoed = await post(sim, PATH, {"prompt": [[5], [2**40]], "max_tokens": 2, "echo": True, "logprobs": 1})
    for bad in (response, echoed):
        assert bad.status == 400, bad.body
        error = bad.json()["error"]
        # vllm/renderers/base.py:487-490: the largest id, no parameter
        assert error["param"] is None and error["message"].endswith(" is out of vocabulary")


async def test_more_choices_than_the_engine_can_hold_are_400_at_once(autojump_clock: MockClock) -> None:
    """A 400 naming the limit, not a 429: retrying can never help (issue 17)."""
    async with running(max_num_seqs=4, max_waiting_queue_length=6) as sim:
        # n within vLLM's VLLM_MAX_N_SEQUENCES (16384; beyond it a 400, tests/api/test_sampling_limits.py)
        huge = await post(sim, PATH, {"prompt": "hi", "n": 16_384, "max_tokens": 2})
        prompts = await post(sim, PATH, {"prompt": ["a", "b", "c", "d"], "n": 3, "max_tokens": 2})
        fits = await post(sim, PATH, {"prompt": ["a", "b"], "n": 5, "max_tokens": 2})
        chat = await post(sim, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 11})
        assert sim.engine.statistics().rejected == 0  # refused before any job was built
    for refused in (huge, prompts, chat):
        assert refused.status == 400, refused.body
        error = refused.json()["error"]
        assert error["type"] == "BadRequestError" and error["param"] == "n"
        assert "at most 10 requests" in error["message"] and "max-waiting-queue-length 6" in error["message"]
    assert fits.status == 200 and len(fits.json()["choices"]) == 10


# --- how a completion ends (vLLM 0.33) ------------------------------------------------------------


async def test_a_natural_stop_is_the_eos_tokens_empty_chunk_one_itl_later(autojump_clock: MockClock) -> None:
    """The last text chunk no longer says ``stop``: the EOS token's own chunk does, one
    decode step later, and usage counts it streamed or not
    (vllm/v1/engine/detokenizer.py:107-128; completion/serving.py:438-470, 653)."""
    async with running(mode="echo", **LATENCY) as sim:
        started = trio.current_time()
        streamed = await post(
            sim,
            PATH,
            completion(prompt="one two three", max_tokens=50, stream=True, stream_options={"include_usage": True}),
        )
        whole = await post(sim, PATH, completion(prompt="one two three", max_tokens=50))
    assert [when - started for when, _ in streamed.writes] == pytest.approx([0.1, 0.11, 0.12, 0.13])
    *chunks, usage, _ = sse_payloads(streamed.body)
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks] == [
        ("one ", None),
        ("two ", None),
        ("three", None),
        ("", "stop"),
    ]
    assert usage["usage"]["completion_tokens"] == 4 == whole.json()["usage"]["completion_tokens"]
    assert (whole.json()["choices"][0]["text"], whole.json()["choices"][0]["finish_reason"]) == (
        "one two three",
        "stop",
    )


async def test_the_eos_tokens_logprobs_name_it(autojump_clock: MockClock) -> None:
    """The EOS token is listed like any sampled token, its text offset after the text
    (completion/serving.py:714-800)."""
    async with running(mode="echo") as sim:
        response = await post(sim, PATH, completion(prompt="one two", max_tokens=9, logprobs=1))
    values = response.json()["choices"][0]["logprobs"]
    assert values["tokens"] == ["one ", "two", "<|im_end|>"]
    assert values["text_offset"] == [0, 4, 7]
    assert list(values["top_logprobs"][-1]) == ["<|im_end|>"]


async def test_echo_with_max_tokens_0_returns_the_prompt_alone(autojump_clock: MockClock) -> None:
    """``echo_without_generation``: vLLM runs one token (internal max_tokens 1) and
    answers with the prompt (completion/protocol.py:393,416; serving.py:363-366, 594-597),
    its finish ``length`` and its one token counted."""
    fields = {"prompt": "Say hi", "max_tokens": 0, "echo": True}
    async with running(**LATENCY) as sim:
        whole = await post(sim, PATH, completion(**fields, logprobs=1))
        started = trio.current_time()
        streamed = await post(sim, PATH, completion(**fields, stream=True, stream_options={"include_usage": True}))
    choice = whole.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("Say hi", "length")
    assert choice["logprobs"]["tokens"] == ["Say ", "hi"] and choice["logprobs"]["token_logprobs"][0] is None
    assert whole.json()["usage"]["completion_tokens"] == 1
    assert [when - started for when, _ in streamed.writes] == pytest.approx([0.1])
    chunk, usage, _ = sse_payloads(streamed.body)
    assert (chunk["choices"][0]["text"], chunk["choices"][0]["finish_reason"]) == ("Say hi", "length")
    assert usage["usage"]["completion_tokens"] == 1


async def test_min_tokens_equal_to_max_tokens_gives_exactly_that_many(autojump_clock: MockClock) -> None:
    """vllm/sampling_params.py:339 (the sampler masks EOS before ``min_tokens``)."""
    async with running() as sim:
        response = await post(sim, PATH, completion(prompt=["a", "b c"], n=8, max_tokens=20, min_tokens=20))
    assert {c["finish_reason"] for c in response.json()["choices"]} == {"length"}
    assert response.json()["usage"]["completion_tokens"] == 16 * 20


async def test_min_tokens_above_max_tokens_is_vllms_400(autojump_clock: MockClock) -> None:
    """vllm/sampling_params.py:701-705, the default 16 as max_tokens."""
    async with running() as sim:
        response = await post(sim, PATH, completion(min_tokens=17))
    assert response.status == 400
    assert response.json()["error"] == {
        "message": "min_tokens must be less than or equal to max_tokens=16, got 17.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


async def test_continuous_usage_stats_count_each_choice_against_its_prompt(autojump_clock: MockClock) -> None:
    """completion/serving.py:477-484: prompt_tokens of the chunk's own prompt,
    completion_tokens of the chunk's own choice so far."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    async with running() as sim:
        response = await post(
            sim,
            PATH,
            completion(prompt=[[1], [1, 2, 3]], max_tokens=2, ignore_eos=True, stream=True, stream_options=options),
        )
    *chunks, final, _ = sse_payloads(response.body)
    seen = {0: 0, 1: 0}
    for c in chunks:
        index = c["choices"][0]["index"]
        seen[index] += 1
        prompt = (1, 3)[index]
        assert c["usage"] == {
            "prompt_tokens": prompt,
            "total_tokens": prompt + seen[index],
            "completion_tokens": seen[index],
        }
    assert final["usage"]["completion_tokens"] == 4 and final["usage"]["prompt_tokens"] == 4
