"""The pytest plugin's fixtures, as a user's test suite would use them."""

from __future__ import annotations

import httpx
import pytest

from llmsim.config import Config
from llmsim.server import ServerHandle


@pytest.fixture
def llmsim_config() -> Config:
    """Overriding the plugin's config fixture, as the README shows."""
    return Config(port=0, served_model_name=("plugin-model",), time_to_first_token=0.001)


async def test_llmsim_server_fixture_serves_on_a_free_port(llmsim_server: ServerHandle) -> None:
    assert llmsim_server.port > 0
    assert llmsim_server.url == f"http://127.0.0.1:{llmsim_server.port}"
    async with httpx.AsyncClient(base_url=llmsim_server.url) as client:
        models = (await client.get("/v1/models")).json()
        completion = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert [card["id"] for card in models["data"]] == ["plugin-model"]
    assert completion.status_code == 200 and completion.json()["model"] == "plugin-model"
    stats = llmsim_server.statistics()
    assert stats.requests_served == 2 and stats.active_streams == 0 and stats.running == 0
