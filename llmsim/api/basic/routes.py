"""Health, version and model-listing endpoints (vLLM's shapes)."""

from __future__ import annotations

from llmsim._version import __version__
from llmsim.api.context import Call
from llmsim.api.errors import ApiError
from llmsim.api.router import Router

__all__ = ["register"]

_EMPTY_HEADERS: tuple[tuple[bytes, bytes], ...] = ()


async def health(call: Call) -> None:
    """200 with an empty body, as vLLM's /health."""
    call.respond(200, b"", _EMPTY_HEADERS)


async def ready(call: Call) -> None:
    """503 until the configured start-up duration has passed, then 200."""
    ctx = call.ctx
    remaining = ctx.started_at + ctx.startup_duration - ctx.clock()
    if remaining > 0:
        raise ApiError(503, f"The server is starting up; ready in {remaining:.3f}s")
    call.respond(200, b"", _EMPTY_HEADERS)


async def version(call: Call) -> None:
    call.respond_json({"version": __version__})


async def models(call: Call) -> None:
    """vLLM's model cards: one per served model name, ``root`` the model path."""
    ctx = call.ctx
    model = ctx.model
    created = int(ctx.wall_clock())
    cards = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": model.name,
            "parent": None,
            "max_model_len": model.max_model_len,
        }
        for name in model.model_names
    ]
    call.respond_json({"object": "list", "data": cards})


def register(router: Router) -> None:
    router.add("GET", "/health", health)
    router.add("GET", "/ping", health)
    router.add("POST", "/ping", health)
    router.add("GET", "/health/ready", ready)
    router.add("GET", "/version", version)
    router.add("GET", "/v1/models", models)
