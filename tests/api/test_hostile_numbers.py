"""Inputs at the edges of what numbers and nesting can be: each a clear 4xx, never a 500,
and nothing changed by a refused update (found by this session's review fuzzing)."""

from __future__ import annotations

import json

import orjson
import pytest
from trio.testing import MockClock

from llmsim.api.http import HttpRequest
from llmsim.app import Simulator
from tests.api.fakes import FakeResponse, post, running

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
UNPARSABLE = {"message": "There was an error parsing the body", "type": "Bad Request", "param": None, "code": 400}


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 1100 + b"]" * 1100,  # deeper than Python's json can nest
        b'{"messages":' + b"[" * 990 + b"1234567890123456789" + b"]" * 990 + b"}",  # orjson's depth, a long number
        b'{"max_tokens": ' + b"9" * 5000 + b"}",  # beyond Python's int-from-text digit limit
    ],
)
async def test_bodies_pythons_json_cannot_read_are_fastapis_400(body: bytes, autojump_clock: MockClock) -> None:
    """fastapi/routing.py answers a decoder failure other than a syntax error with
    HTTPException(400, "There was an error parsing the body"), which vLLM's handler renders
    (vllm/entrypoints/serve/exception_handling/handlers/http.py)."""
    async with running() as sim:
        refused = await post(sim, "/v1/chat/completions", body)
        after = await post(sim, "/v1/chat/completions", CHAT)
    assert refused.status == 400
    error = orjson.loads(refused.body)["error"]
    assert error == UNPARSABLE or error["type"] == "Bad Request"
    assert after.status == 200


async def test_a_huge_duration_is_refused_and_changes_nothing(autojump_clock: MockClock) -> None:
    async with running() as sim:
        refused = await post(sim, "/admin/config", {"time-to-first-token": 1e308})
        shown = await get_config(sim)
    assert refused.status == 400
    assert b"time-to-first-token" in refused.body
    assert shown["time-to-first-token"] == "0s"


async def get_config(sim: Simulator) -> dict[str, object]:
    response = FakeResponse()
    await sim.app.handle(HttpRequest("GET", "/admin/config"), response)
    assert response.status == 200
    config: dict[str, object] = orjson.loads(response.body)
    return config


async def test_a_sleep_level_with_thousands_of_digits_is_a_400(autojump_clock: MockClock) -> None:
    async with running(enable_sleep_mode=True) as sim:
        response = FakeResponse()
        await sim.app.handle(HttpRequest("POST", "/sleep", query="level=" + "9" * 5000), response)
    assert response.status == 400


@pytest.mark.parametrize("path", ["/v1/chat/completions/render", "/v1/completions/render"])
async def test_render_with_n_beyond_64_bits_is_vllms_400(path: str, autojump_clock: MockClock) -> None:
    """vLLM's render builds SamplingParams (scale_out/render/serving.py:178,310), whose
    n limit (sampling_params.py:56-63) refuses it."""
    body = {**CHAT, "n": 10**30} if "chat" in path else {"prompt": "hi", "max_tokens": 2, "n": 10**30}
    async with running() as sim:
        response = await post(sim, path, json.dumps(body).encode())  # orjson cannot write 10**30
    assert response.status == 400
    assert b"n must be at most 16384" in response.body
