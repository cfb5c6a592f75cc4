"""Sampling parameters are checked as vLLM 0.33.0's ``SamplingParams._verify_args`` does
(vllm/sampling_params.py:635-774): same status, ``param`` and text, byte for byte, on
chat and completions.  The `` (parameter=…, value=…)`` suffix appears where vLLM names
the parameter (vllm/exceptions.py:49-56); the body is vLLM's ``create_error_response``
for a ``VLLMValidationError`` (vllm/entrypoints/serve/exception_handling/error_response.py:43-46)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from trio.testing import MockClock

from tests.api.fakes import post, running

MESSAGES = [{"role": "user", "content": "hi"}]


def error(message: str, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}})


CASES: list[tuple[dict[str, Any], bytes]] = [
    # sampling_params.py:53-54 (_verify_num_sequences names no parameter)
    ({"n": 0}, error("n must be at least 1, got 0.")),
    # sampling_params.py:639-646
    ({"presence_penalty": 2.5}, error("presence_penalty must be in [-2, 2], got 2.5.")),
    ({"frequency_penalty": -3}, error("frequency_penalty must be in [-2, 2], got -3.0.")),
    # sampling_params.py:652-656
    ({"repetition_penalty": 0}, error("repetition_penalty must be greater than zero, got 0.0.")),
    # sampling_params.py:663-674
    (
        {"temperature": -0.5},
        error("temperature must be non-negative, got -0.5. (parameter=temperature, value=-0.5)", "temperature"),
    ),
    (
        {"temperature": 2.5},
        error("temperature must be in [0, 2], got 2.5. (parameter=temperature, value=2.5)", "temperature"),
    ),
    # sampling_params.py:675-680
    ({"top_p": 0}, error("top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)", "top_p")),
    ({"top_p": 1.5}, error("top_p must be in (0, 1], got 1.5. (parameter=top_p, value=1.5)", "top_p")),
    # sampling_params.py:681-685 (-1 and 0 both disable top-k)
    ({"top_k": -2}, error("top_k must be 0 (disable), or at least 1, got -2.")),
    # sampling_params.py:690-691
    ({"min_p": 1.5}, error("min_p must be in [0, 1], got 1.5.")),
    # sampling_params.py:737-738
    ({"stop": ["a", ""]}, error("stop cannot contain an empty string.")),
    ({"stop": ""}, error("stop cannot contain an empty string.")),
    # sampling_params.py:770-774 (temperature below 1e-5 is greedy)
    ({"temperature": 0, "n": 2}, error("n must be 1 when using greedy sampling, got 2.")),
    # checked in _verify_args order: the penalty before the temperature
    ({"temperature": -1, "presence_penalty": 3}, error("presence_penalty must be in [-2, 2], got 3.0.")),
]


@pytest.mark.parametrize(
    ("path", "base"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES}),
        ("/v1/completions", {"prompt": "hi"}),
    ],
)
@pytest.mark.parametrize(("fields", "expected"), CASES)
async def test_sampling_parameters_rejected_as_vllm_does(
    path: str, base: dict[str, Any], fields: dict[str, Any], expected: bytes, autojump_clock: MockClock
) -> None:
    async with running() as sim:
        response = await post(sim, path, {**base, **fields})
        statistics = sim.engine.statistics()
    assert (response.status, response.body) == (400, expected)
    assert statistics.submitted == 0


@pytest.mark.parametrize(
    "fields",
    [
        # the edges vLLM accepts (sampling_params.py:639-691)
        {"temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0, "presence_penalty": -2, "frequency_penalty": 2},
        {"temperature": 2, "top_k": 0, "repetition_penalty": 0.01, "seed": 7, "stop": ["x"], "stop_token_ids": [3]},
        {"temperature": 1e-5, "n": 2, "top_p": 1e-9, "min_p": 1, "stop": "y"},
    ],
)
async def test_sampling_parameters_vllm_accepts_are_served(fields: dict[str, Any], autojump_clock: MockClock) -> None:
    async with running() as sim:
        chat = await post(sim, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, **fields})
        completion = await post(sim, "/v1/completions", {"prompt": "hi", "max_tokens": 2, **fields})
    assert (chat.status, completion.status) == (200, 200), (chat.body, completion.body)


@pytest.mark.parametrize("prompt", [[5, 70_000_000, -3], [[5], [2**40, 9]]])
async def test_prompt_token_ids_outside_the_vocabulary(prompt: list[Any], autojump_clock: MockClock) -> None:
    """vllm/renderers/base.py:480-490: the smallest id first when negative, else the largest; no parameter."""
    async with running() as sim:
        response = await post(sim, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    bad = -3 if prompt[-1] == -3 else 2**40
    assert (response.status, response.body) == (400, error(f"Token id {bad} is out of vocabulary"))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [case for case in CASES if "n" not in case[0]],
)
async def test_responses_sampling_parameters_rejected_as_vllm_does(
    fields: dict[str, Any], expected: bytes, autojump_clock: MockClock
) -> None:
    """vllm/entrypoints/openai/responses/protocol.py:576-650 builds the same SamplingParams."""
    async with running() as sim:
        response = await post(sim, "/v1/responses", {"input": "hi", **fields})
    assert (response.status, response.body) == (400, expected)
