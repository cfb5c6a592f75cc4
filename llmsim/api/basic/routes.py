"""Health, version and model-listing endpoints (vLLM's shapes)."""

from __future__ import annotations

import secrets

from llmsim.api.context import Call
from llmsim.api.errors import ApiError
from llmsim.api.http import VERSION_HEADER
from llmsim.api.router import Router

__all__ = ["register"]

_EMPTY_HEADERS: tuple[tuple[bytes, bytes], ...] = (VERSION_HEADER,)


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
    """The vLLM version simulated (``--vllm-version``), as vLLM's /version
    (vllm/entrypoints/serve/instrumentator/basic.py:53-56); llmsim's own version is in
    every response's ``x-llmsim-version`` header."""
    call.respond_json({"version": call.ctx.model.vllm_version})


async def models(call: Call) -> None:
    """vLLM's model cards: one per served model name, ``root`` the model path, then one
    per LoRA adapter, ``root`` its path and ``parent`` its base model, no
    ``max_model_len`` (vllm/entrypoints/openai/models/serving.py:66-77,148-162).  Each
    has one default ``ModelPermission`` (vllm/entrypoints/serve/engine/protocol.py:
    90-112), its id ``modelperm-<16 hex>`` fresh each time as vLLM's ``random_uuid()``."""
    ctx = call.ctx
    model = ctx.model
    created = int(ctx.wall_clock())
    cards = [_card(name, model.name, None, model.max_model_len, created) for name in model.model_names]
    cards += [_card(lora.name, lora.path, lora.parent, None, created) for lora in ctx.loras.adapters.values()]
    call.respond_json({"object": "list", "data": cards})


def _card(name: str, root: str, parent: str | None, max_model_len: int | None, created: int) -> dict[str, object]:
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": max_model_len,
        "permission": [
            {
                "id": "modelperm-" + secrets.token_hex(8),
                "object": "model_permission",
                "created": created,
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
        ],
    }


def register(router: Router) -> None:
    router.add("GET", "/health", health)
    router.add("GET", "/ping", health)
    router.add("POST", "/ping", health)
    router.add("GET", "/health/ready", ready)
    router.add("GET", "/version", version)
    router.add("GET", "/v1/models", models)
