"""Router resolution: exact and pattern routes, 404/405, and the remembered answers of
exact routes (which must never outlive a change of the routes)."""

from __future__ import annotations

import pytest

from llmsim.api.context import Call
from llmsim.api.errors import ApiError
from llmsim.api.router import ErrorStyle, Router


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
