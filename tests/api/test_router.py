"""Router resolution: exact and pattern routes, 404/405, and the remembered answers of
exact routes (which must never outlive a change of the routes)."""

from __future__ import annotations

import orjson
import pytest

from llmsim.api.context import Call
from llmsim.api.errors import ApiError
from llmsim.api.http import HttpRequest
from llmsim.api.router import Api, ErrorStyle, Router
from tests.api.fakes import FakeResponse, make_simulator


async def get_models(call: Call) -> None:
    """A handler (never run here)."""


async def post_models(call: Call) -> None:
    """Another handler (never run here)."""


def test_an_exact_route_resolves_the_same_every_time() -> None:
    router = Router()
    router.add("GET", "/v1/models", get_models)
    first = router.resolve("GET", "/v1/models")
    assert (first.handler, dict(first.params), first.error_style) == (get_models, {}, ErrorStyle.OPENAI)
    assert router.resolve("GET", "/v1/models") == first
    assert router.resolve("get", "/v1/models").handler is get_models


def test_pattern_routes_capture_each_request_s_parameters() -> None:
    router = Router()
    router.add("GET", "/v1/responses/{response_id}", get_models)
    assert router.resolve("GET", "/v1/responses/a").params == {"response_id": "a"}
    assert router.resolve("GET", "/v1/responses/b").params == {"response_id": "b"}
    with pytest.raises(ApiError) as empty:
        router.resolve("GET", "/v1/responses/")
    assert empty.value.status == 404


def test_wrong_method_stays_405_and_unknown_path_404() -> None:
    router = Router()
    router.add("POST", "/v1/chat/completions", post_models)
    for _ in range(2):
        with pytest.raises(ApiError) as wrong:
            router.resolve("GET", "/v1/chat/completions")
        assert (wrong.value.status, wrong.value.headers) == (405, ((b"allow", b"POST"),))
        with pytest.raises(ApiError) as unknown:
            router.resolve("POST", "/v1/nothing")
        assert unknown.value.status == 404


def test_head_is_answered_by_get() -> None:
    router = Router()
    router.add("GET", "/health", get_models)
    assert router.resolve("HEAD", "/health").handler is get_models


def test_a_route_added_later_is_served() -> None:
    router = Router()
    router.add("GET", "/v1/models", get_models)
    assert router.resolve("GET", "/v1/models").handler is get_models
    with pytest.raises(ApiError):
        router.resolve("POST", "/v1/models")
    router.add("POST", "/v1/models", post_models)
    router.add("GET", "/v1/models", post_models)
    assert router.resolve("POST", "/v1/models").handler is post_models
    assert router.resolve("GET", "/v1/models").handler is post_models


def _failing_api(*, after_start: bool) -> Api:
    """An Api whose one route fails unexpectedly, before or after starting its response."""

    async def fail(call: Call) -> None:
        if after_start:
            call.response.start(200, ((b"content-type", b"text/event-stream"),))
            call.response.write(b"data: 1\n\n")
        raise RuntimeError("a bug in a handler")

    router = Router()
    router.add("GET", "/fails", fail)
    return Api(make_simulator().ctx, router)


async def test_a_failure_before_the_start_is_a_500_in_the_envelope() -> None:
    response = FakeResponse()
    await _failing_api(after_start=False).handle(HttpRequest("GET", "/fails"), response)
    assert response.status == 500
    assert orjson.loads(response.body)["error"]["code"] == 500


async def test_a_failure_after_the_start_reaches_the_protocol_layer_instead_of_a_clean_end() -> None:
    """The protocol layer aborts a started response whose handler raises (RST_STREAM, or a
    close mid-body); ending it here would hand the client a truncated body that looks whole."""
    response = FakeResponse()
    with pytest.raises(RuntimeError, match="a bug in a handler"):
        await _failing_api(after_start=True).handle(HttpRequest("GET", "/fails"), response)
    assert not response.ended
