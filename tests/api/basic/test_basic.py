"""/version, /v1/models and the version header, through the real router."""

from __future__ import annotations

import re
from typing import Any

import orjson
from trio.testing import MockClock

from llmsim import __version__
from llmsim.api.http import HttpRequest
from llmsim.app import Simulator
from tests.api.fakes import CREATED, FakeResponse, post, running


async def get(sim: Simulator, path: str) -> FakeResponse:
    response = FakeResponse()
    await sim.app.handle(HttpRequest("GET", path), response)
    return response


async def test_version_reports_the_vllm_version_simulated(autojump_clock: MockClock) -> None:
    """vLLM's /version is ``{"version": VLLM_VERSION}``
    (vllm/entrypoints/serve/instrumentator/basic.py:53-56): the simulated one,
    ``--vllm-version``; llmsim's own version is in its header."""
    async with running() as sim:
        default = await get(sim, "/version")
    async with running(vllm_version="0.31.2") as sim:
        chosen = await get(sim, "/version")
    assert default.body == b'{"version":"0.33.0"}'
    assert chosen.body == b'{"version":"0.31.2"}'
    assert default.headers[b"x-llmsim-version"] == __version__.encode()


async def test_every_response_carries_the_llmsim_version_header(autojump_clock: MockClock) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with running() as sim:
        responses = [
            await get(sim, "/health"),
            await get(sim, "/v1/models"),
            await get(sim, "/v1/nothing"),
            await post(sim, "/v1/chat/completions", chat),
            await post(sim, "/v1/chat/completions", {**chat, "stream": True}),
            await post(sim, "/v1/completions", {"prompt": "hi", "max_tokens": 0}),  # a 400
        ]
    assert [r.status for r in responses] == [200, 200, 404, 200, 200, 400]
    assert {r.headers.get(b"x-llmsim-version") for r in responses} == {__version__.encode()}


async def test_models_cards_carry_vllms_default_permission(autojump_clock: MockClock) -> None:
    """One ``ModelPermission()`` per card, dumped whole in field order
    (vllm/entrypoints/openai/models/serving.py:66-77;
    vllm/entrypoints/serve/engine/protocol.py:90-112), a fresh ``modelperm-<16 hex>`` id."""
    async with running(served_model_name=("a", "b")) as sim:
        first = orjson.loads((await get(sim, "/v1/models")).body)
        second = orjson.loads((await get(sim, "/v1/models")).body)
    permissions: list[dict[str, Any]] = [card["permission"][0] for card in first["data"]]
    ids = [permission.pop("id") for permission in permissions]
    assert all(re.fullmatch(r"modelperm-[0-9a-f]{16}", i) for i in ids) and len(set(ids)) == 2
    assert second["data"][0]["permission"][0]["id"] not in ids
    expected = {
        "object": "model_permission",
        "created": CREATED,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    assert all(list(p) == list(expected) and p == expected for p in permissions)
    assert [list(card) for card in first["data"]] == [
        ["id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"]
    ] * 2
