"""``--api-key``: vLLM 0.33's AuthenticationMiddleware (vllm/entrypoints/serve/middleware/
authenticate.py:10-63, register.py:32-36) on both server backends, with httpx and the
openai and anthropic SDKs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import attrs
import httpx
import httpx2  # the anthropic SDK runs on httpx2 and rejects httpx clients
import openai
import pytest
from trio.testing import MockClock

from llmsim.api.auth import authorized
from llmsim.api.http import HttpRequest
from llmsim.config import Config, load_config
from llmsim.testing import open_simulator
from tests.api.fakes import FakeResponse, make_simulator, post, running

MODEL = "llmsim/sim-model"
KEYS = ("first-key", "second-key")
HELLO: list[Any] = [{"role": "user", "content": "Hello"}]
UNAUTHORIZED = b'{"error":"Unauthorized"}'


@pytest.fixture
async def server_url(backend: str) -> AsyncIterator[str]:
    config = Config(port=0, server=backend, api_key=KEYS, served_model_name=(MODEL,))
    async with open_simulator(config) as server:
        yield server.url


# verify=False: plain HTTP, and a verifying client loads the CA bundle first (~0.1 s each)
@pytest.fixture
async def client(server_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server_url, timeout=10, verify=False) as client:
        yield client


def _assert_unauthorized(response: httpx.Response) -> None:
    assert response.status_code == 401
    assert response.content == UNAUTHORIZED
    assert response.headers["content-type"] == "application/json"
    assert "www-authenticate" not in response.headers


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer wrong",
        "Basic first-key",
        "first-key",
        "Bearer  first-key",  # the token is all after the first space
        "Bearer first-keyX",
    ],
)
async def test_v1_without_a_good_bearer_token_is_401(client: httpx.AsyncClient, authorization: str | None) -> None:
    headers = {} if authorization is None else {"authorization": authorization}
    _assert_unauthorized(await client.get("/v1/models", headers=headers))


@pytest.mark.parametrize(
    "authorization", ["Bearer first-key", "Bearer second-key", "bearer first-key", "BEARER second-key"]
)
async def test_any_key_with_the_bearer_scheme_in_any_case_passes(client: httpx.AsyncClient, authorization: str) -> None:
    response = await client.get("/v1/models", headers={"authorization": authorization})
    assert response.status_code == 200
    assert response.json()["data"][0]["id"] == MODEL


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/no-such-route"),  # checked before routing: 401, not 404
        ("DELETE", "/v1/models"),  # nor 405
        ("POST", "/v1/chat/completions"),
        ("GET", "/v2/anything"),
        ("GET", "/v1foo"),  # a string prefix, not a path segment
        ("GET", "/inference/v1/generate"),
        ("GET", "/cohere/v2/chat"),
        ("GET", "/%76%31/models"),  # percent-decoded first, as ASGI gives vLLM the path
        ("HEAD", "/v1/models"),
    ],
)
async def test_every_method_but_options_on_a_guarded_prefix_needs_the_key(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await client.request(method, path)
    assert response.status_code == 401
    if method != "HEAD":
        _assert_unauthorized(response)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/health"),
        ("GET", "/ping"),
        ("POST", "/ping"),
        ("GET", "/version"),
        ("GET", "/health/ready"),
        ("GET", "/metrics"),
        ("GET", "/no-such-route"),
        ("OPTIONS", "/v1/models"),
    ],
)
async def test_other_paths_and_options_stay_open(client: httpx.AsyncClient, method: str, path: str) -> None:
    response = await client.request(method, path)
    assert response.status_code != 401


async def test_the_openai_sdk_sends_its_api_key_as_a_bearer_token(server_url: str) -> None:
    async with httpx.AsyncClient(verify=False) as http_client:
        good = openai.AsyncOpenAI(base_url=f"{server_url}/v1", api_key=KEYS[1], max_retries=0, http_client=http_client)
        bad = openai.AsyncOpenAI(base_url=f"{server_url}/v1", api_key="nope", max_retries=0, http_client=http_client)
        completion = await good.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
        with pytest.raises(openai.AuthenticationError) as raised:
            await bad.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, stream=True)
    assert completion.choices[0].message.role == "assistant"
    assert raised.value.status_code == 401
    assert raised.value.body == "Unauthorized"  # the SDK keeps the value of "error"


async def test_the_anthropic_sdk_sends_its_key_as_a_bearer_token(server_url: str) -> None:
    """anthropic 2.x sends ``api_key`` as ``Authorization: Bearer``, which is what vLLM reads."""
    async with httpx2.AsyncClient() as http_client:
        good = anthropic.AsyncAnthropic(base_url=server_url, api_key=KEYS[0], max_retries=0, http_client=http_client)
        bad = anthropic.AsyncAnthropic(base_url=server_url, api_key="nope", max_retries=0, http_client=http_client)
        message = await good.messages.create(model=MODEL, messages=HELLO, max_tokens=2)
        with pytest.raises(anthropic.AuthenticationError) as raised:
            await bad.messages.create(model=MODEL, messages=HELLO, max_tokens=2, stream=True)
    assert message.role == "assistant"
    assert raised.value.status_code == 401


async def test_x_api_key_alone_is_not_read(client: httpx.AsyncClient) -> None:
    """Anthropic's own header: vLLM's middleware reads only ``Authorization``."""
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 2}
    _assert_unauthorized(await client.post("/v1/messages", json=body, headers={"x-api-key": KEYS[0]}))


async def test_without_keys_nothing_is_checked(autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await post(sim, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1})
    assert response.status == 200


async def test_empty_keys_are_dropped_as_vllm_does() -> None:
    sim = make_simulator(api_key=("",))
    response = FakeResponse()
    await sim.app.handle(HttpRequest("GET", "/v1/models"), response)
    assert response.status == 200


async def test_a_replaced_control_applies_to_the_next_request(autojump_clock: MockClock) -> None:
    """The keys are read from ``ctx.control`` per request, never cached."""
    async with running(api_key=("old",)) as sim:
        sim.ctx.control = attrs.evolve(sim.ctx.control, api_key=("new",))
        old = FakeResponse()
        new = FakeResponse()
        await sim.app.handle(HttpRequest("GET", "/v1/models", headers=((b"authorization", b"Bearer old"),)), old)
        await sim.app.handle(HttpRequest("GET", "/v1/models", headers=((b"authorization", b"Bearer new"),)), new)
    assert (old.status, new.status) == (401, 200)
    assert old.body == UNAUTHORIZED


def test_a_non_ascii_key_matches_only_when_sent_as_latin_1_as_in_vllm() -> None:
    """starlette decodes the header as latin-1, vLLM hashes the token as UTF-8."""
    key = "clé"
    request = HttpRequest("GET", "/v1/models", headers=((b"authorization", f"Bearer {key}".encode()),))
    assert not authorized(request, (key,))
    assert authorized(attrs.evolve(request, headers=((b"authorization", b"Bearer cl\xe9"),)), (key,))


def test_vllm_api_key_is_read_and_api_key_wins_over_it() -> None:
    from_env = load_config({}, environ={"VLLM_API_KEY": "env-key"})
    from_flag = load_config({"api_key": ("a", "b")}, environ={"VLLM_API_KEY": "env-key"})
    assert from_env.control.api_key == ("env-key",)
    assert from_flag.control.api_key == ("a", "b")
