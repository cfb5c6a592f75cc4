"""LoRA adapters through the real router: load, serve, unload (vLLM's bodies, answers and
errors, ``vllm/entrypoints/openai/models/serving.py:159-300``), /v1/models, the
``max_loras`` wait, and ``vllm:lora_requests_info``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from trio.testing import MockClock

from llmsim.api.http import HttpRequest
from llmsim.app import Simulator
from llmsim.config import Config
from llmsim.testing import open_simulator
from tests.api.fakes import CREATED, FakeResponse, post, running

_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def get(sim: Simulator, path: str) -> FakeResponse:
    response = FakeResponse()
    await sim.app.handle(HttpRequest("GET", path), response)
    return response


async def test_load_request_unload_then_404(autojump_clock: MockClock) -> None:
    async with running() as sim:
        loaded = await post(sim, "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": "/adapters/sql"})
        chat = await post(sim, "/v1/chat/completions", {**_CHAT, "model": "sql"})
        completion = await post(sim, "/v1/completions", {"model": "sql", "prompt": "hi", "max_tokens": 2})
        unloaded = await post(sim, "/v1/unload_lora_adapter", {"lora_name": "sql"})
        after = await post(sim, "/v1/chat/completions", {**_CHAT, "model": "sql"})
        again = await post(sim, "/v1/unload_lora_adapter", {"lora_name": "sql"})
    assert (loaded.status, loaded.body) == (200, b"Success: LoRA adapter 'sql' added successfully.")
    assert b"content-type" not in loaded.headers  # Response(content=str): no media type
    assert (chat.status, chat.json()["model"]) == (200, "sql")  # served under the adapter's name
    assert (completion.status, completion.json()["model"]) == (200, "sql")
    assert (unloaded.status, unloaded.body) == (200, b"Success: LoRA adapter 'sql' removed successfully.")
    assert after.status == 404
    assert after.json()["error"] == {
        "message": "The model `sql` does not exist. Valid aliases: llmsim/sim-model.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    assert again.status == 404
    assert again.json()["error"]["message"] == "The lora adapter 'sql' cannot be found."


async def test_models_lists_adapters_with_parent_and_root(autojump_clock: MockClock) -> None:
    modules = ("sql=/adapters/sql", '{"name": "chat", "path": "/adapters/chat", "base_model_name": "alias"}')
    async with running(served_model_name=("base", "alias"), lora_modules=modules) as sim:
        await post(sim, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": "/adapters/late"})
        listed = (await get(sim, "/v1/models")).json()["data"]
    assert [(card["id"], card["root"], card["parent"], card["max_model_len"]) for card in listed] == [
        ("base", "llmsim/sim-model", None, 32768),
        ("alias", "llmsim/sim-model", None, 32768),
        ("sql", "/adapters/sql", "base", None),
        ("chat", "/adapters/chat", "alias", None),
        ("late", "/adapters/late", "base", None),
    ]
    assert {card["owned_by"] for card in listed} == {"vllm"}
    assert {card["created"] for card in listed} == {CREATED}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({}, 400, "Field required"),
        ({"lora_name": 5, "lora_path": "/p"}, 400, "Input should be a valid string"),
        ({"lora_name": "x", "lora_path": "/p", "load_inplace": "maybe"}, 400, "valid boolean"),
        ({"lora_name": "", "lora_path": "/p"}, 400, "Both 'lora_name' and 'lora_path' must be provided."),
        ({"lora_name": "llmsim/sim-model", "lora_path": "/p"}, 400, "conflicts with a served base model"),
        ({"lora_name": "sql", "lora_path": "/p"}, 400, "has already been loaded"),
        (b"{not json", 400, "JSON decode error"),
        ([1, 2], 400, "valid dictionary"),
    ],
)
async def test_bad_load_bodies_get_a_4xx_envelope(
    autojump_clock: MockClock, body: Any, status: int, message: str
) -> None:
    async with running(lora_modules=("sql=/adapters/sql",)) as sim:
        response = await post(sim, "/v1/load_lora_adapter", body)
        inplace = await post(
            sim, "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": "/new", "load_inplace": True}
        )
    assert response.status == status
    error = response.json()["error"]
    assert message in error["message"]
    assert error["code"] == status
    assert inplace.status == 200  # load_inplace replaces an adapter


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({}, 400, "Field required"),
        ({"lora_name": ""}, 400, "'lora_name' needs to be provided to unload a LoRA adapter."),
        ({"lora_name": "nope"}, 404, "The lora adapter 'nope' cannot be found."),
        ({"lora_name": "sql", "lora_int_id": "x"}, 400, "valid integer"),
    ],
)
async def test_bad_unload_bodies_get_a_4xx_envelope(
    autojump_clock: MockClock, body: Any, status: int, message: str
) -> None:
    async with running(lora_modules=("sql=/adapters/sql",)) as sim:
        response = await post(sim, "/v1/unload_lora_adapter", body)
    assert response.status == status
    assert message in response.json()["error"]["message"]


async def test_a_request_waits_for_a_lora_slot(autojump_clock: MockClock) -> None:
    """max_loras 1: b's request waits until a's ends; a base-model request does not."""
    finished: dict[str, float] = {}
    config = {"lora_modules": ("a=/a", "b=/b"), "time_to_first_token": 0.1, "inter_token_latency": 0.05}
    async with running(**config) as sim:

        async def ask(model: str, tokens: int, delay: float) -> None:
            await trio.sleep(delay)
            body = {"model": model, "prompt": "hi", "max_tokens": tokens, "ignore_eos": True}
            response = await post(sim, "/v1/completions", body)
            assert response.json()["model"] == model
            finished[model] = trio.current_time()

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "a", 10, 0.0)
            nursery.start_soon(ask, "b", 1, 0.01)
            nursery.start_soon(ask, "llmsim/sim-model", 1, 0.01)
    a_end = finished["a"] - start
    assert a_end == pytest.approx(0.1 + 9 * 0.05, abs=0.01)
    assert finished["llmsim/sim-model"] - start == pytest.approx(0.11, abs=0.01)
    assert finished["b"] - start == pytest.approx(a_end + 0.1, abs=0.01)  # admitted when a ended


def _family(body: bytes, name: str) -> Any:
    [family] = [f for f in text_string_to_metric_families(body.decode()) if f.name == name]
    return family


def _lora_series(body: bytes) -> list[dict[str, str]]:
    return [sample.labels for sample in _family(body, "vllm:lora_requests_info").samples]


def _waiting_by_reason(body: bytes) -> dict[str, float]:
    return {s.labels["reason"]: s.value for s in _family(body, "vllm:num_requests_waiting_by_reason").samples}


async def test_lora_requests_info_lists_the_adapters_in_flight(autojump_clock: MockClock) -> None:
    """vLLM fills both labels with every adapter that has a request waiting or running
    (vllm/v1/metrics/stats.py:699-704, loggers.py:1224-1236); a label set stays, and the
    idle one appears once the engine has emptied."""
    config = {"lora_modules": ("a=/a", "b=/b"), "time_to_first_token": 0.1, "inter_token_latency": 0.05}
    async with running(**config) as sim:

        async def ask(model: str, delay: float) -> None:
            await trio.sleep(delay)  # the autojump clock's time: b arrives after a
            await post(sim, "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 5, "ignore_eos": True})

        before = _lora_series((await get(sim, "/metrics")).body)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "a", 0.0)
            nursery.start_soon(ask, "b", 0.01)
            await trio.sleep(0.05)
            assert (sim.engine.statistics().running, sim.engine.statistics().waiting) == (1, 1)
            scrape = (await get(sim, "/metrics")).body
            during = _lora_series(scrape)
            # b waits for the LoRA budget: vLLM counts it deferred (scheduler.py:3288-3292)
            assert _waiting_by_reason(scrape) == {"capacity": 0, "deferred": 1}
        after = _lora_series((await get(sim, "/metrics")).body)
    assert before == []
    busy = {"max_lora": "1", "waiting_lora_adapters": "a,b", "running_lora_adapters": "a,b"}
    assert during == [busy]
    assert after == [busy, {"max_lora": "1", "waiting_lora_adapters": "", "running_lora_adapters": ""}]


async def test_no_lora_family_without_lora(autojump_clock: MockClock) -> None:
    async with running() as sim:
        body = (await get(sim, "/metrics")).body
    assert b"vllm:lora_requests_info" not in body


async def test_over_http_on_both_backends(backend: str) -> None:
    """The adapter reaches the engine from a real connection (each request its own task)."""
    config = Config(port=0, server=backend, time_to_first_token=0.0, inter_token_latency=0.0, max_loras=1)
    async with open_simulator(config) as server, httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        loaded = await client.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": "/sql"})
        body = {**_CHAT, "model": "sql", "stream": True}
        streamed = await client.post("/v1/chat/completions", json=body)
        base = await client.post("/v1/chat/completions", json=_CHAT)
        unloaded = await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
        after = await client.post("/v1/chat/completions", json=body)
    assert loaded.status_code == 200
    chunks = [json.loads(line[6:]) for line in streamed.text.split("\n\n") if line.startswith("data: {")]
    assert chunks
    assert {chunk["model"] for chunk in chunks} == {"sql"}
    assert base.json()["model"] == "llmsim/sim-model"
    assert unloaded.status_code == 200
    assert after.status_code == 404
