"""``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``, vLLM's bodies and answers.

vLLM mounts them only with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
(``vllm/entrypoints/serve/lora/api_router.py:23-48``); llmsim serves them always, as
llm-d-inference-sim does (its users call them without setting anything).  The bodies
are ``LoadLoRAAdapterRequest`` and ``UnloadLoRAAdapterRequest``
(``vllm/entrypoints/serve/lora/protocol.py``); success is a 200 whose body is a plain
sentence with no content type (``Response(status_code=200, content=...)``,
api_router.py:69-74).
"""

from __future__ import annotations

import attrs

from llmsim.api.context import Call
from llmsim.api.router import Router
from llmsim.api.structure import structure

__all__ = ["register"]


@attrs.frozen(kw_only=True)
class LoadLoraAdapterRequest:
    """``LoadLoRAAdapterRequest`` (protocol.py:7-11)."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


@attrs.frozen(kw_only=True)
class UnloadLoraAdapterRequest:
    """``UnloadLoRAAdapterRequest`` (protocol.py:14-16); ``lora_int_id`` is read and unused."""

    lora_name: str
    lora_int_id: int | None = None


async def load_lora_adapter(call: Call) -> None:
    request = structure(call.json(), LoadLoraAdapterRequest)
    text = call.ctx.loras.load(request.lora_name, request.lora_path, load_inplace=request.load_inplace)
    call.ctx.engine.set_lora_loaded(request.lora_name, True)
    call.respond(200, text.encode(), ())


async def unload_lora_adapter(call: Call) -> None:
    request = structure(call.json(), UnloadLoraAdapterRequest)
    text = call.ctx.loras.unload(request.lora_name)
    # its idle KV blocks go first when room is needed (llm-d-inference-sim block_cache.go)
    call.ctx.engine.set_lora_loaded(request.lora_name, False)
    call.respond(200, text.encode(), ())


def register(router: Router) -> None:
    router.add("POST", "/v1/load_lora_adapter", load_lora_adapter)
    router.add("POST", "/v1/unload_lora_adapter", unload_lora_adapter)
