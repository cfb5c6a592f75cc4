"""vLLM 0.33.0's limits on what a request asks for, with their texts and their order:
``n`` at most ``VLLM_MAX_N_SEQUENCES`` (16384), checked as the sampling params are built,
after the admission check (``--max-num-queued-reqs``, a 503) and before llmsim's own 400
for a request the engine could never hold; at most ``VLLM_MAX_STOP_STRINGS`` (4) stop
strings; ``logit_bias`` read and checked as vLLM does; token ids within the vocabulary."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from trio.testing import MockClock

from llmsim.api.generation import QUEUE_OVERFLOW_MESSAGE
from tests.api.fakes import post, running

MESSAGES = [{"role": "user", "content": "hi"}]
ENDPOINTS = [("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "hi"})]


def error(status: int, message: str, kind: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}})


#: vllm/sampling_params.py:56-63 (``VLLMValidationError`` without a parameter: no suffix).
TOO_MANY = error(
    400,
    "n must be at most 16384, got 16385. To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable.",
    "BadRequestError",
)


async def answer(path: str, body: dict[str, Any], **config: Any) -> tuple[int, bytes]:
    async with running(**config) as sim:
        response = await post(sim, path, body)
        assert sim.engine.statistics().submitted == 0
    return response.status, response.body


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
async def test_n_above_vllms_limit_is_its_400(path: str, base: dict[str, Any], autojump_clock: MockClock) -> None:
    assert await answer(path, {**base, "n": 16385}) == (400, TOO_MANY)


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
async def test_n_at_the_limit_passes_it_and_meets_the_queue_guard(
    path: str, base: dict[str, Any], autojump_clock: MockClock
) -> None:
    """16384 choices are within vLLM's limit; llmsim's engine (256 slots + 1000 waiting
    by default) could never hold them: its 400 naming the limit comes after vLLM's check."""
    status, body = await answer(path, {**base, "n": 16384})
    assert status == 400
    assert orjson.loads(body)["error"] == {
        "message": "This request asks for 16384 choices, but the server holds at most 1256 requests "
        "(max-num-seqs 256 + max-waiting-queue-length 1000).",
        "type": "BadRequestError",
        "param": "n",
        "code": 400,
    }


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
async def test_the_admission_check_comes_before_the_n_limit(
    path: str, base: dict[str, Any], autojump_clock: MockClock
) -> None:
    """vLLM runs ``_preflight`` before ``to_sampling_params`` (chat_completion/serving.py:283,
    completion/serving.py:111): with --max-num-queued-reqs exceeded the 503 wins."""
    expected = error(503, QUEUE_OVERFLOW_MESSAGE, "Service Unavailable")
    assert await answer(path, {**base, "n": 16385}, max_num_queued_reqs=4) == (503, expected)


async def test_the_limit_is_on_n_not_on_the_jobs_of_every_prompt(autojump_clock: MockClock) -> None:
    """Two prompts of 9000 choices: n is within the limit (each prompt's ``SamplingParams``
    has n 9000), so the request meets the queue guard instead; 2 x 16385 is the 400."""
    body = {"prompt": ["a", "b"], "n": 9000}
    status, guard = await answer("/v1/completions", body)
    assert status == 400 and b"asks for 18000 choices" in guard
    assert await answer("/v1/completions", {**body, "n": 16385}) == (400, TOO_MANY)


def bad_request(message: str, param: str) -> bytes:
    """FastAPI's ``RequestValidationError`` as vLLM renders it
    (vllm/entrypoints/serve/exception_handling/handlers/validation.py:149-196)."""
    return error(400, message, "Bad Request").replace(b'"param":null', b'"param":"%s"' % param.encode())


STRING_BRANCH = "{'type': 'string_type', 'loc': 'body.stop', 'msg': 'Input should be a valid string', 'input': %s}"


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
@pytest.mark.parametrize(
    ("stop", "message", "param"),
    [
        # StopParam, vllm/entrypoints/generate/base/protocol.py:26-28: str | list[str] of at most 4;
        # pydantic reports each branch of the union, the list's length before its items
        (
            ["a", "b", "c", "d", 5],
            "2 validation errors:\n  "
            + STRING_BRANCH % "'<list of 5 items>'"
            + "\n  {'type': 'too_long', 'loc': 'body.stop', 'msg': 'List should have at most 4 items after "
            "validation, not 5', 'input': '<list of 5 items>', 'ctx': {'field_type': 'List', 'max_length': 4, "
            "'actual_length': 5}}",
            "body.stop",
        ),
        (
            ["a", 1, None],
            "3 validation errors:\n  "
            + STRING_BRANCH % "'<list of 3 items>'"
            + "\n  {'type': 'string_type', 'loc': 'body.stop.1', 'msg': 'Input should be a valid string', "
            "'input': '1'}\n  {'type': 'string_type', 'loc': 'body.stop.2', 'msg': 'Input should be a valid "
            "string', 'input': 'None'}",
            "body.stop",
        ),
        (
            7,
            "2 validation errors:\n  "
            + STRING_BRANCH % "'7'"
            + "\n  {'type': 'list_type', 'loc': 'body.stop', 'msg': 'Input should be a valid list', 'input': '7'}",
            "body.stop",
        ),
    ],
)
async def test_stop_is_a_string_or_at_most_four(
    path: str, base: dict[str, Any], stop: object, message: str, param: str, autojump_clock: MockClock
) -> None:
    assert await answer(path, {**base, "stop": stop}) == (400, bad_request(message, param))


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
async def test_four_stop_strings_are_served(path: str, base: dict[str, Any], autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, path, {**base, "stop": ["w", "x", "y", "z"], "max_tokens": 2})
    assert response.status == 200


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
@pytest.mark.parametrize(
    ("logit_bias", "expected"),
    [
        # pydantic's dict[str, float] (chat_completion/protocol.py:241, completion/protocol.py:62)
        (
            [1],
            bad_request(
                "1 validation error:\n  {'type': 'dict_type', 'loc': 'body.logit_bias', 'msg': 'Input should be "
                "a valid dictionary', 'input': '<list of 1 items>'}",
                "body.logit_bias",
            ),
        ),
        (
            {"5": "x", "6": 1, "7": None},
            bad_request(
                "2 validation errors:\n  {'type': 'float_parsing', 'loc': 'body.logit_bias.5', 'msg': 'Input "
                "should be a valid number, unable to parse string as a number', 'input': 'x'}\n  {'type': "
                "'float_type', 'loc': 'body.logit_bias.7', 'msg': 'Input should be a valid number', 'input': 'None'}",
                "body.logit_bias.5",
            ),
        ),
        # SamplingParams.from_optional, vllm/sampling_params.py:491-516 (Python's int() reads the keys)
        (
            {"a": 1, " 12 ": 2, "1.5": 3, "1_000": 4},
            error(
                400,
                "logit_bias contains key(s) that cannot be converted to integer token IDs: ['a', '1.5'] "
                "(parameter=logit_bias, value=['a', '1.5'])",
                "BadRequestError",
            ).replace(b'"param":null', b'"param":"logit_bias"'),
        ),
    ],
)
async def test_logit_bias_is_read_as_vllm_reads_it(
    path: str, base: dict[str, Any], logit_bias: object, expected: bytes, autojump_clock: MockClock
) -> None:
    assert await answer(path, {**base, "logit_bias": logit_bias}) == (400, expected)


def out_of_vocab(name: str, ids: str) -> dict[str, Any]:
    """vllm/sampling_params.py:1040-1093 (``SamplingParams.verify``); the vocabulary is
    llmsim's built-in tokenizer's, 2**31 ids."""
    return {
        "error": {
            "message": f"token_id(s) {ids} in {name} contain out-of-vocab token ids. Vocabulary size: 2147483648 "
            f"(parameter={name}, value={ids})",
            "type": "BadRequestError",
            "param": name,
            "code": 400,
        }
    }


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
@pytest.mark.parametrize(
    ("fields", "name", "ids"),
    [
        ({"logit_bias": {"-1": 1, "5": -300, "2147483648": 1, "-01": 2}}, "logit_bias", "[-1, 2147483648]"),
        ({"stop_token_ids": [3, 2147483648, -2, 2147483648]}, "stop_token_ids", "[2147483648, -2]"),
        # verify() checks logit_bias before stop_token_ids (sampling_params.py:912-914)
        ({"stop_token_ids": [-5], "logit_bias": {"-6": 0}}, "logit_bias", "[-6]"),
    ],
)
async def test_token_ids_outside_the_vocabulary_are_refused_as_the_engine_takes_the_request(
    path: str, base: dict[str, Any], fields: dict[str, Any], name: str, ids: str, autojump_clock: MockClock
) -> None:
    """A 400 before a complete response; in-band on a stream, whose 200 is sent
    (vllm/v1/engine/input_processor.py:157, as for too many logprobs)."""
    async with running() as sim:
        response = await post(sim, path, {**base, **fields})
        streamed = await post(sim, path, {**base, **fields, "stream": True})
        assert sim.engine.statistics().submitted == 0
    body = out_of_vocab(name, ids)
    # chat writes its error events with orjson, completions with json.dumps (completion/serving.py:554-558)
    event = orjson.dumps(body) if "chat" in path else json.dumps(body).encode()
    assert (response.status, response.body) == (400, orjson.dumps(body))
    assert (streamed.status, streamed.body) == (200, b"data: " + event + b"\n\ndata: [DONE]\n\n")


@pytest.mark.parametrize(("path", "base"), ENDPOINTS)
async def test_biases_and_stop_tokens_in_the_vocabulary_are_served(
    path: str, base: dict[str, Any], autojump_clock: MockClock
) -> None:
    """Biases are clamped to [-100, 100], never refused (sampling_params.py:495-498)."""
    fields = {"logit_bias": {"0": -1000, "2147483647": 1e9}, "stop_token_ids": [0, 2147483647], "max_tokens": 2}
    async with running() as sim:
        response = await post(sim, path, {**base, **fields})
    assert response.status == 200
