"""The shared handler context: the choices' seeded RNGs, the model names."""

from __future__ import annotations

import random

import orjson
import pytest

from llmsim.api.context import request_adapter, seeded_random
from llmsim.api.http import HttpRequest
from tests.api.fakes import FakeResponse, post, running

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.mark.parametrize("text", ["7:abcdef0123456789:0", "None:req-1:3", "é✓:x:12", ""])
def test_seeded_random_is_random_random_of_the_text(text: str) -> None:
    """The same state as ``random.Random(text)``, so every seeded output stays as it was."""
    ours, theirs = seeded_random(text), random.Random(text)
    assert type(ours) is random.Random
    assert ours.getstate() == theirs.getstate()
    assert [ours.random() for _ in range(700)] == [theirs.random() for _ in range(700)]  # past one regeneration
    assert [ours.gauss(0.0, 1.0) for _ in range(3)] == [theirs.gauss(0.0, 1.0) for _ in range(3)]


async def test_each_server_resolves_its_own_model_names() -> None:
    """The names a request may use are read once per server (``ApiContext``): each server
    answers with its own first name, and refuses the other's with its own aliases."""
    async with running(served_model_name=("a", "a2")) as first, running(served_model_name=("b",)) as second:
        assert (await post(first, "/v1/chat/completions", {**CHAT, "model": "a2"})).json()["model"] == "a"
        assert (await post(second, "/v1/chat/completions", CHAT)).json()["model"] == "b"
        refused = await post(first, "/v1/chat/completions", {**CHAT, "model": "b"})
        assert refused.status == 404
        assert refused.json()["error"]["message"] == "The model `b` does not exist. Valid aliases: a, a2."


async def test_resolving_the_base_model_after_an_adapter_clears_the_adapter() -> None:
    """The request's adapter is set only to change it: resolving the base model in a task
    that resolved an adapter before leaves none."""
    async with running(lora_modules=("sql=/adapters/sql",)) as sim:
        assert request_adapter() is None
        assert sim.ctx.resolve_model("sql") == "sql"
        assert request_adapter() == "sql"
        sim.ctx.resolve_model(None)
        assert request_adapter() is None


async def test_a_request_answered_in_start_leaves_no_adapter_to_the_next() -> None:
    """``Api.start`` runs in the task that read the request (the connection's reader), so
    the adapter a LoRA request resolved stays in that task's context: the next request
    begins without it, including one whose jobs are built without ``resolve_model``
    (gRPC's Generate, whose task the reader spawns)."""
    async with running(lora_modules=("sql=/adapters/sql",)) as sim:
        body = orjson.dumps({**CHAT, "model": "sql", "stream": True})
        headers = ((b"content-type", b"application/json"),)
        assert (
            sim.app.start(HttpRequest("POST", "/v1/chat/completions", headers=headers, body=body), FakeResponse())
            is None
        )
        assert request_adapter() == "sql"  # (what the chat's jobs were built with)
        rest = sim.app.start(HttpRequest("GET", "/v1/models"), FakeResponse())
        assert request_adapter() is None
        if rest is not None:
            await rest
