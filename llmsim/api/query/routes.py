"""``GET /query``: vLLM's Mooncake bootstrap server, as llm-d-inference-sim emulates it.

A Mooncake prefill pod serves ``/query`` with one entry per data-parallel rank, which
the decode side reads for the prefill engine's id
(vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_utils.py:56,177;
mooncake_connector.py:2572-2609), and llm-d's routing sidecar does the same.
llm-d-inference-sim answers ``{"0": {"engine_id": "<uuid>"}}``: only the engine id (no
``worker_addr``), a UUID drawn once per process (pkg/communication/http.go:865-900).
llmsim draws it once per server, from ``--seed`` when set, and serves rank 0.
"""

from __future__ import annotations

import random
import uuid
from weakref import WeakKeyDictionary

from llmsim.api.context import ApiContext, Call
from llmsim.api.router import Router

__all__ = ["engine_id", "register"]

_ENGINE_IDS: WeakKeyDictionary[ApiContext, str] = WeakKeyDictionary()


def engine_id(ctx: ApiContext) -> str:
    """This server's (rank 0's) engine id: the same for its lifetime."""
    found = _ENGINE_IDS.get(ctx)
    if found is None:
        seed = ctx.model.seed
        bits = random.Random(f"mooncake:{seed}").getrandbits(128) if seed is not None else None
        value = uuid.uuid4() if bits is None else uuid.UUID(int=bits, version=4)
        found = _ENGINE_IDS[ctx] = str(value)
    return found


async def query(call: Call) -> None:
    call.respond_json({"0": {"engine_id": engine_id(call.ctx)}})


def register(router: Router) -> None:
    router.add("GET", "/query", query)
