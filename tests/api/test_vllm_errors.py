"""Error bodies as vLLM 0.33.0 sends them, byte for byte: unknown models, request
validation (FastAPI's ``RequestValidationError`` through vLLM's handler), ``suffix``."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from trio.testing import MockClock

from llmsim.api.http import HttpRequest
from tests.api.fakes import FakeResponse, post, running


def envelope(message: str, kind: str, param: str | None, code: int = 400) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


async def test_unknown_model_lists_the_served_names(autojump_clock: MockClock) -> None:
    """vllm/entrypoints/serve/engine/serving.py:75-84."""
    async with running(served_model_name=("alpha", "beta")) as sim:
        response = await post(
            sim, "/v1/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
        )
    expected = envelope("The model `x` does not exist. Valid aliases: alpha, beta.", "NotFoundError", "model", 404)
    assert (response.status, response.body) == (404, expected)


@pytest.mark.parametrize(
    ("body", "param", "error"),
    [
        # vllm/entrypoints/serve/exception_handling/handlers/validation.py:83-104 (input summarised),
        # 149-196 (param the loc, type "Bad Request")
        (
            {"prompt": "hi", "max_tokens": "many"},
            "body.max_tokens",
            "{'type': 'int_parsing', 'loc': 'body.max_tokens', 'msg': 'Input should be a valid integer, "
            "unable to parse string as an integer', 'input': 'many'}",
        ),
        (
            {"max_tokens": 3},
            "body.prompt",
            "{'type': 'missing', 'loc': 'body.prompt', 'msg': 'Field required', 'input': '<dict of 1 items>'}",
        ),
        (
            {"prompt": "hi", "n": 2.5},
            "body.n",
            "{'type': 'int_from_float', 'loc': 'body.n', 'msg': 'Input should be a valid integer, "
            "got a number with a fractional part', 'input': '2.5'}",
        ),
        (
            {"prompt": "hi", "temperature": [1]},
            "body.temperature",
            "{'type': 'float_type', 'loc': 'body.temperature', 'msg': 'Input should be a valid number', "
            "'input': '<list of 1 items>'}",
        ),
        (
            {"prompt": "hi", "model": False},
            "body.model",
            "{'type': 'string_type', 'loc': 'body.model', 'msg': 'Input should be a valid string', 'input': 'False'}",
        ),
    ],
)
async def test_request_validation_errors(
    body: dict[str, Any], param: str, error: str, autojump_clock: MockClock
) -> None:
    async with running() as sim:
        response = await post(sim, "/v1/completions", body)
    expected = envelope(f"1 validation error:\n  {error}", "Bad Request", param)
    assert (response.status, response.body) == (400, expected)


@pytest.mark.parametrize(
    ("raw", "param", "error"),
    [
        (b"", "body", "{'type': 'missing', 'loc': 'body', 'msg': 'Field required', 'input': 'None'}"),
        (
            b"[1, 2]",
            "body",
            "{'type': 'model_attributes_type', 'loc': 'body', 'msg': 'Input should be a valid dictionary or "
            "object to extract fields from', 'input': '<list of 2 items>'}",
        ),
        (
            b'{"prompt": "hi",}',
            "body.16",
            "{'type': 'json_invalid', 'loc': 'body.16', 'msg': 'JSON decode error', 'input': '<dict of 0 items>', "
            "'ctx': {'error': 'Expecting property name enclosed in double quotes'}}",
        ),
    ],
)
async def test_bodies_that_are_not_a_json_object(raw: bytes, param: str, error: str, autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, "/v1/completions", raw)
    expected = envelope(f"1 validation error:\n  {error}", "Bad Request", param)
    assert (response.status, response.body) == (400, expected)


@pytest.mark.parametrize("headers", [((b"content-type", b"application/vnd.api+json"),), ()])
async def test_a_content_type_other_than_json_or_none(
    headers: tuple[tuple[bytes, bytes], ...], autojump_clock: MockClock
) -> None:
    """vllm/entrypoints/serve/utils/api_utils.py:309-315: the media type must be application/json,
    and a request without the header reads as "" (so is refused too)."""
    async with running() as sim:
        response = FakeResponse()
        await sim.app.handle(HttpRequest("POST", "/v1/completions", headers=headers, body=b'{"prompt":"hi"}'), response)
    message = "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
    assert (response.status, response.body) == (400, envelope(message, "Bad Request", None))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        # vllm/renderers/online_renderer.py:614-664 (no model llmsim simulates renders FIM)
        (
            {"prompt": "def f(", "suffix": "return 1"},
            "suffix is only supported for models with FIM completion rendering",
        ),
        ({"prompt": ["a", "b"], "suffix": ""}, "suffix is only supported for models with FIM completion rendering"),
        ({"prompt": "a", "suffix": "b", "echo": True}, "Echo is unsupported with suffix."),
        ({"prompt": [1, 2], "suffix": "b"}, "suffix requires text prompt input for FIM completion rendering"),
    ],
)
async def test_suffix_is_refused_as_vllm_does(fields: dict[str, Any], message: str, autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, "/v1/completions", fields)
    assert (response.status, response.body) == (400, envelope(message, "BadRequestError", "suffix"))


@pytest.mark.parametrize(
    ("seed", "error"),
    [
        (
            2**63,
            "{'type': 'less_than_equal', 'loc': 'body.seed', 'msg': 'Input should be less than or equal to "
            "9223372036854775807', 'input': 9223372036854775808, 'ctx': {'le': 9223372036854775807}}",
        ),
        (
            -(2**63) - 1,
            "{'type': 'greater_than_equal', 'loc': 'body.seed', 'msg': 'Input should be greater than or equal to "
            "-9223372036854775808', 'input': -9223372036854775809, 'ctx': {'ge': -9223372036854775808}}",
        ),
        (
            2**64,
            "{'type': 'less_than_equal', 'loc': 'body.seed', 'msg': 'Input should be less than or equal to "
            "9223372036854775807', 'input': 18446744073709551616, 'ctx': {'le': 9223372036854775807}}",
        ),
    ],
)
async def test_a_seed_outside_int64_is_pydantics_range_error(seed: int, error: str, autojump_clock: MockClock) -> None:
    """vllm/entrypoints/openai/chat_completion/protocol.py:253 (Field(None, ge=_INT64_MIN, le=_INT64_MAX)),
    rendered by vllm/entrypoints/serve/exception_handling/handlers/validation.py:149-196; the numbers
    exactly as sent, as Python's json module (FastAPI's) reads them."""
    body = f'{{"prompt": "hi", "max_tokens": 2, "seed": {seed}}}'.encode()
    async with running() as sim:
        response = await post(sim, "/v1/completions", body)
        edge = await post(sim, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "seed": 2**63 - 1})
    assert (response.status, response.body) == (
        400,
        envelope(f"1 validation error:\n  {error}", "Bad Request", "body.seed"),
    )
    assert edge.status == 200
