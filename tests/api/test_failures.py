"""Failure injection (``--failure-injection-rate``, ``--failure-types``) and the
``X-Return-Error`` header, as llm-d-inference-sim answers them
(pkg/llm-d-inference-sim/failures.go, pkg/communication/http.go:223-255): through the
real router and engine on trio's mock clock, and through a real server with the openai
SDK for the exception each status becomes."""

from __future__ import annotations

from typing import Any

import attrs
import httpx
import openai
import pytest
from trio.testing import MockClock

from llmsim.api.failures import FAILURES
from llmsim.app import Simulator
from llmsim.options import FAILURE_TYPES
from llmsim.testing import open_simulator
from tests.api.fakes import FakeResponse, post, running

MODEL = "llmsim/sim-model"
HELLO: list[Any] = [{"role": "user", "content": "Hello there"}]
# One small request per generation endpoint; messages answers in Anthropic's envelope.
ENDPOINTS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL, "messages": HELLO, "max_tokens": 2},
    "/v1/completions": {"model": MODEL, "prompt": "Hello", "max_tokens": 2},
    "/v1/responses": {"model": MODEL, "input": "Hello", "max_output_tokens": 2},
    "/v1/messages": {"model": MODEL, "messages": HELLO, "max_tokens": 2},
}
OPENAI_PATHS = [path for path in ENDPOINTS if path != "/v1/messages"]
# pkg/llm-d-inference-sim/failures.go:26-44, the model being --model
EXPECTED = {
    "rate_limit": (
        429,
        "RateLimitError",
        None,
        f"Rate limit reached for {MODEL} in organization org-xxx on requests per min (RPM): "
        "Limit 3, Used 3, Requested 1.",
    ),
    "invalid_api_key": (401, "AuthenticationError", None, "Incorrect API key provided."),
    "context_length": (
        400,
        "BadRequestError",
        "messages",
        "This model's maximum context length is 4096 tokens. However, your messages resulted in 4500 tokens.",
    ),
    "server_error": (503, "InternalServerError", None, "The server is overloaded or not ready yet."),
    "invalid_request": (400, "BadRequestError", "model", "Invalid request: missing required parameter 'model'."),
    "model_not_found": (404, "NotFoundError", "model", f"The model '{MODEL}-nonexistent' does not exist"),
}


async def _ask(sim: Simulator, path: str, headers: tuple[tuple[bytes, bytes], ...] = (), **fields: Any) -> FakeResponse:
    return await post(sim, path, {**ENDPOINTS[path], **fields}, headers)


def test_every_failure_type_has_a_predefined_error() -> None:
    assert tuple(FAILURES) == FAILURE_TYPES == tuple(EXPECTED)


@pytest.mark.parametrize("failure", FAILURE_TYPES)
@pytest.mark.parametrize("path", OPENAI_PATHS)
async def test_each_failure_type_is_llm_d_s_error(failure: str, path: str, autojump_clock: MockClock) -> None:
    async with running(failure_injection_rate=100, failure_types=(failure,)) as sim:
        response = await _ask(sim, path)
    status, error_type, param, message = EXPECTED[failure]
    assert response.status == status
    assert response.json() == {"error": {"message": message, "type": error_type, "param": param, "code": status}}


@pytest.mark.parametrize("failure", FAILURE_TYPES)
async def test_messages_get_the_failure_in_anthropic_s_envelope(failure: str, autojump_clock: MockClock) -> None:
    async with running(failure_injection_rate=100, failure_types=(failure,)) as sim:
        response = await _ask(sim, "/v1/messages")
    status, _, _, message = EXPECTED[failure]
    kinds = {429: "rate_limit_error", 401: "authentication_error", 400: "invalid_request_error"}
    kinds |= {503: "overloaded_error", 404: "not_found_error"}
    assert response.status == status
    assert response.json() == {"type": "error", "error": {"type": kinds[status], "message": message}}


@pytest.mark.parametrize("path", list(ENDPOINTS))
async def test_a_stream_gets_the_real_status_and_nothing_reaches_the_engine(
    path: str, autojump_clock: MockClock
) -> None:
    async with running(failure_injection_rate=100, failure_types=("rate_limit",)) as sim:
        response = await _ask(sim, path, stream=True)
        assert sim.ctx.engine.statistics().submitted == 0
    assert response.status == 429
    assert response.headers[b"content-type"] == b"application/json"
    assert b"data:" not in response.body


async def test_the_roll_comes_before_the_model_check_but_after_the_body(autojump_clock: MockClock) -> None:
    async with running(failure_injection_rate=100, failure_types=("server_error",)) as sim:
        unknown_model = await _ask(sim, "/v1/completions", model="no-such-model")
        bad_body = await _ask(sim, "/v1/completions", prompt=None)
    assert unknown_model.status == 503
    assert bad_body.status == 400 and bad_body.json()["error"]["param"] == "body.prompt"


async def _run_many(count: int, **config: Any) -> list[int | None]:
    async with running(**config) as sim:
        return [(await _ask(sim, "/v1/completions")).status for _ in range(count)]


async def test_the_rate_is_a_percentage_and_the_rolls_repeat_under_a_seed(autojump_clock: MockClock) -> None:
    first = await _run_many(200, seed=11, failure_injection_rate=30)
    again = await _run_many(200, seed=11, failure_injection_rate=30)
    other = await _run_many(200, seed=12, failure_injection_rate=30)
    assert first == again
    assert first != other
    failed = [s for s in first if s != 200]
    assert 40 <= len(failed) <= 80  # 30 % of 200, binomial sd ~6.5
    assert {400, 401, 404, 429, 503} == set(failed)  # every type, uniformly picked


async def test_rate_zero_never_fails_and_rate_100_always_does(autojump_clock: MockClock) -> None:
    assert set(await _run_many(50, failure_injection_rate=0)) == {200}
    assert set(await _run_many(50, failure_injection_rate=100, failure_types=("invalid_api_key",))) == {401}


async def test_a_replaced_control_applies_to_the_next_request(autojump_clock: MockClock) -> None:
    """``POST /admin/config`` replaces ``ctx.control`` whole; each request reads it afresh."""
    async with running() as sim:
        before = await _ask(sim, "/v1/chat/completions")
        sim.ctx.control = attrs.evolve(sim.ctx.control, failure_injection_rate=100, failure_types=("rate_limit",))
        during = await _ask(sim, "/v1/chat/completions")
        sim.ctx.control = attrs.evolve(sim.ctx.control, failure_injection_rate=0)
        after = await _ask(sim, "/v1/chat/completions")
    assert (before.status, during.status, after.status) == (200, 429, 200)


@pytest.mark.parametrize("path", list(ENDPOINTS))
async def test_x_return_error_answers_with_that_status(path: str, autojump_clock: MockClock) -> None:
    async with running() as sim:
        response = await _ask(sim, path, ((b"x-return-error", b"418"),), model="unknown-model", stream=True)
        assert sim.ctx.engine.statistics().submitted == 0
    assert response.status == 418
    message = "Simulated error triggered by X-Return-Error header (code 418)"
    if path == "/v1/messages":
        assert response.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    else:  # pkg/api/response.go:381-404: a status it has no name for is "APIConnectionError"
        error = {"message": message, "type": "APIConnectionError", "param": None, "code": 418}
        assert response.json() == {"error": error}


@pytest.mark.parametrize(
    ("value", "status", "error_type"),
    [(b"429", 429, "RateLimitError"), (b"+503", 503, "InternalServerError"), (b"422", 422, "UnprocessableEntityError")],
)
async def test_x_return_error_wins_over_the_roll(
    value: bytes, status: int, error_type: str, autojump_clock: MockClock
) -> None:
    async with running(failure_injection_rate=100, failure_types=("server_error",)) as sim:
        response = await _ask(sim, "/v1/chat/completions", ((b"x-return-error", value),))
    assert response.status == status
    assert response.json()["error"]["type"] == error_type


@pytest.mark.parametrize(
    ("value", "quoted", "reason"),
    [
        (b"abc", '"abc"', "must be an integer"),
        (b"4 29", '"4 29"', "must be an integer"),
        (b'4"2\\9', '"4\\"2\\\\9"', "must be an integer"),
        (b"4_29", '"4_29"', "must be an integer"),  # Python's int() would take it; Go's Atoi does not
        (b"200", '"200"', "must be an error status (400-599)"),
        (b"-429", '"-429"', "must be an error status (400-599)"),
        # Go's Atoi fails beyond int64 (strconv.ErrRange): not an integer to llm-d either
        (b"9999999999999999999999", '"9999999999999999999999"', "must be an integer"),
        (b"9" * 5000, '"' + "9" * 5000 + '"', "must be an integer"),
    ],
)
async def test_x_return_error_that_is_no_error_status_is_400(
    value: bytes, quoted: str, reason: str, autojump_clock: MockClock
) -> None:
    async with running() as sim:
        response = await _ask(sim, "/v1/completions", ((b"x-return-error", value),))
    assert response.status == 400
    error = {"message": f"Invalid X-Return-Error header value {quoted}: {reason}", "type": "BadRequestError"}
    assert response.json() == {"error": {**error, "param": None, "code": 400}}


async def test_x_return_error_is_only_for_generation_endpoints(autojump_clock: MockClock) -> None:
    async with running(failure_injection_rate=100) as sim:
        count = await post(
            sim,
            "/v1/messages/count_tokens",
            {"model": MODEL, "messages": HELLO},
            ((b"x-return-error", b"500"),),
        )
        empty = await _ask(
            sim,
            "/v1/completions",
            ((b"x-return-error", b""),),
        )
    assert count.status == 200
    assert empty.status != 200  # an empty value is ignored: the roll (100 %) answers


# --- a real server, the openai SDK's exceptions -----------------------------------------------


@pytest.mark.parametrize(
    ("failure", "exception"),
    [
        ("rate_limit", openai.RateLimitError),
        ("invalid_api_key", openai.AuthenticationError),
        ("context_length", openai.BadRequestError),
        ("server_error", openai.InternalServerError),
        ("model_not_found", openai.NotFoundError),
    ],
)
async def test_the_openai_sdk_raises_its_exception_for_each_failure(
    failure: str, exception: type[openai.APIStatusError]
) -> None:
    async with (
        open_simulator(failure_injection_rate=100, failure_types=(failure,), served_model_name=(MODEL,)) as server,
        httpx.AsyncClient() as http_client,
    ):
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, http_client=http_client)
        with pytest.raises(exception) as raised:
            await client.chat.completions.create(model=MODEL, messages=HELLO, stream=True)
    status, error_type, param, message = EXPECTED[failure]
    assert raised.value.status_code == status
    assert raised.value.body == {"message": message, "type": error_type, "param": param, "code": status}


async def test_x_return_error_through_the_sdk() -> None:
    async with (
        open_simulator(served_model_name=(MODEL,)) as server,
        httpx.AsyncClient() as http_client,
    ):
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, http_client=http_client)
        with pytest.raises(openai.RateLimitError):
            await client.completions.create(
                model=MODEL, prompt="Hi", stream=True, extra_headers={"X-Return-Error": "429"}
            )
        done = await client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert done.choices[0].finish_reason in ("length", "stop")  # the header alone made the 429
