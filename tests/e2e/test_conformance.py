"""Every basic endpoint and every bad input, identical on both backends and both HTTP versions.

Each test runs four times: {native, hypercorn} x {HTTP/1.1, HTTP/2 prior knowledge}.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from llmsim import __version__
from llmsim.config import Config
from llmsim.testing import open_simulator


@pytest.fixture
async def client(backend: str, http_kwargs: dict[str, Any]) -> AsyncIterator[httpx.AsyncClient]:
    config = Config(
        port=0,
        server=backend,
        served_model_name=("alpha", "beta"),
        model="org/base-model",
        max_model_len=4096,
        max_request_body_size_mb=0.01,  # 10 KiB
    )
    async with (
        open_simulator(config) as server,
        httpx.AsyncClient(base_url=server.url, timeout=10, **http_kwargs) as client,
    ):
        yield client


def _assert_envelope(response: httpx.Response, status: int, error_type: str) -> dict[str, object]:
    assert response.status_code == status
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["type"] == error_type
    assert isinstance(error["message"], str) and error["message"]
    return error


async def test_health_ping_and_version(client: httpx.AsyncClient, http_version: str) -> None:
    for method, path in (("GET", "/health"), ("GET", "/ping"), ("POST", "/ping")):
        response = await client.request(method, path)
        assert response.status_code == 200, (method, path)
        assert response.content == b""
        assert response.http_version == ("HTTP/2" if http_version == "http2" else "HTTP/1.1")
        assert response.headers["x-llmsim-version"] == __version__
    # the vLLM version simulated (--vllm-version), as vLLM's /version
    # (vllm/entrypoints/serve/instrumentator/basic.py:53-56); llmsim's own in a header
    version = await client.get("/version")
    assert version.status_code == 200 and version.json() == {"version": "0.33.0"}
    assert version.headers["x-llmsim-version"] == __version__
    ready = await client.get("/health/ready")
    assert ready.status_code == 200


async def test_models_lists_every_served_name_in_vllm_shape(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [card["id"] for card in body["data"]] == ["alpha", "beta"]
    for card in body["data"]:
        # ModelCard with one default ModelPermission (vllm/entrypoints/openai/models/serving.py:66-77,
        # vllm/entrypoints/serve/engine/protocol.py:90-112)
        assert list(card) == ["id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"]
        assert card["object"] == "model" and card["owned_by"] == "vllm"
        assert card["root"] == "org/base-model" and card["parent"] is None
        assert card["max_model_len"] == 4096 and isinstance(card["created"], int)
        (permission,) = card["permission"]
        assert re.fullmatch(r"modelperm-[0-9a-f]{16}", permission.pop("id"))
        assert permission == {
            "object": "model_permission",
            "created": card["created"],
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


async def test_unknown_path_is_404(client: httpx.AsyncClient) -> None:
    _assert_envelope(await client.get("/v1/nothing-here"), 404, "NotFoundError")
    _assert_envelope(await client.post("/v2/chat/completions", json={}), 404, "NotFoundError")


async def test_wrong_method_is_405_with_allow(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/chat/completions")
    _assert_envelope(response, 405, "MethodNotAllowed")
    assert response.headers["allow"] == "POST"
    _assert_envelope(await client.delete("/v1/models"), 405, "MethodNotAllowed")


async def test_malformed_json_is_400(client: httpx.AsyncClient) -> None:
    for body in (b"{not json", b"[1, 2]", b"", b'"just a string"'):
        response = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        # FastAPI's RequestValidationError as vLLM renders it
        # (vllm/entrypoints/serve/exception_handling/handlers/validation.py:149-196)
        error = _assert_envelope(response, 400, "Bad Request")
        assert str(error["param"]).startswith("body")
        assert str(error["message"]).startswith("1 validation error:\n  {")


async def test_wrong_content_type_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", content=b'{"prompt": "hi"}', headers={"content-type": "text/plain"})
    error = _assert_envelope(response, 400, "Bad Request")  # vllm/entrypoints/serve/utils/api_utils.py:309-315
    assert error["message"] == "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
    assert error["param"] is None


async def test_body_too_large_is_413_and_the_server_keeps_serving(client: httpx.AsyncClient) -> None:
    big = {"prompt": "x" * 20_000, "max_tokens": 1}
    response = await client.post("/v1/completions", json=big)
    _assert_envelope(response, 413, "RequestEntityTooLarge")
    assert (await client.get("/health")).status_code == 200


async def test_wrong_field_types_are_400_naming_the_field(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json={"messages": "hello", "max_tokens": 3})
    # vllm/entrypoints/serve/exception_handling/handlers/validation.py:167-172: param is the loc
    error = _assert_envelope(response, 400, "Bad Request")
    assert error["param"] == "body.messages"
    response = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": "many"})
    error = _assert_envelope(response, 400, "Bad Request")
    assert (error["param"], error["message"]) == (
        "body.max_tokens",
        "1 validation error:\n  {'type': 'int_parsing', 'loc': 'body.max_tokens', "
        "'msg': 'Input should be a valid integer, unable to parse string as an integer', 'input': 'many'}",
    )


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", json={"model": "gamma", "prompt": "hi", "max_tokens": 2})
    error = _assert_envelope(response, 404, "NotFoundError")
    assert (
        error["message"] == "The model `gamma` does not exist. Valid aliases: alpha, beta."
    )  # vllm/entrypoints/serve/engine/serving.py:75-84
    assert error["param"] == "model"


async def test_ready_is_503_during_the_startup_duration(backend: str) -> None:
    config = Config(port=0, server=backend, startup_duration=3600.0)
    async with open_simulator(config) as server, httpx.AsyncClient(base_url=server.url) as client:
        _assert_envelope(await client.get("/health/ready"), 503, "InternalServerError")
        assert (await client.get("/health")).status_code == 200
