"""P/D disaggregation end to end: a prefill llmsim and a decode llmsim, over sockets, with
one request taken through both as llm-d's routing sidecar does.

The sidecar (llm-d-routing-sidecar ``internal/proxy/connector_nixlv2.go``,
``runNIXLProtocolV2``) sends the client's request to the prefill pod with
``kv_transfer_params: {"do_remote_decode": true, "do_remote_prefill": false,
"remote_engine_id": null, ...}``, ``stream: false``, no ``stream_options`` and
``max_tokens: 1``, then the original request (its own ``stream`` and ``max_tokens``) to
the decode pod with the ``kv_transfer_params`` the prefill pod answered, both under one
``X-Request-Id``.  The prefill pod answers as llm-d-inference-sim's does
(``pkg/llm-d-inference-sim/request.go:252-258``: finish ``remote_decode``;
``pkg/api/response.go:436-451``: the placeholder params), and the decode pod's first
token waits ``--kv-cache-transfer-latency`` instead of a prefill (``latencies.go``).
vLLM's own prefill side would answer ``length`` with its connector's real params
(vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py:191-295).

Timing is the real clock, bounded by the configured latencies (no sleeps): a local
prefill on the decode pod would take about 5 s, the transfer about 0.05 s.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from llmsim.testing import open_simulator
from tests.api.fakes import sse_payloads
from tests.api.test_transfer import PLACEHOLDER

PROMPT = "Summarise the history of the lighthouse keepers of the northern coast " * 4
REQUEST = {
    "messages": [{"role": "user", "content": PROMPT}],
    "max_tokens": 5,
    "stream": True,
    "stream_options": {"include_usage": True},
}
HEADERS = {"x-request-id": "pd-1"}
PREFILL = {"enable_kvcache": True, "time_to_first_token": 0.3, "inter_token_latency": 0.0, "seed": 1}
#: The decode pod prefills 100 ms a token (a local prefill of this prompt: about 5 s) and
#: pulls KV at 1 ms a token (latencies.go's per-token forms).
DECODE = {
    "enable_kvcache": True,
    "enable_prompt_tokens_details": True,
    "latency_calculator": "per-token",
    "prefill_time_per_token": 0.1,
    "kv_cache_transfer_time_per_token": 0.001,
    "inter_token_latency": 0.0,
    "seed": 2,
}


def _prefill_request(original: dict[str, Any]) -> dict[str, Any]:
    """What the sidecar sends the prefill pod (connector_nixlv2.go, "Prepare prefill request")."""
    request = {key: value for key, value in original.items() if key != "stream_options"}
    request["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    return {**request, "stream": False, "max_tokens": 1}


async def test_a_request_through_a_prefill_and_a_decode_llmsim() -> None:
    async with (
        open_simulator(**PREFILL) as prefill,
        open_simulator(**DECODE) as decode,
        httpx.AsyncClient(base_url=prefill.url, timeout=10) as to_prefill,
        httpx.AsyncClient(base_url=decode.url, timeout=10) as to_decode,
    ):
        bootstrap = (await to_prefill.get("/query")).json()
        started = time.monotonic()
        prefilled = await to_prefill.post("/v1/chat/completions", json=_prefill_request(REQUEST), headers=HEADERS)
        prefill_time = time.monotonic() - started
        params = prefilled.json()["kv_transfer_params"]
        started = time.monotonic()
        decoded = await to_decode.post(
            "/v1/chat/completions", json={**REQUEST, "kv_transfer_params": params}, headers=HEADERS
        )
        decode_time = time.monotonic() - started
        started = time.monotonic()
        local = await to_decode.post("/v1/chat/completions", json={**REQUEST, "stream": False, "stream_options": None})
        local_time = time.monotonic() - started

    assert list(bootstrap) == ["0"]
    assert prefilled.status_code == 200, prefilled.text
    answer = prefilled.json()
    assert answer["choices"][0]["finish_reason"] == "remote_decode"
    assert answer["usage"]["completion_tokens"] == 1
    assert params == PLACEHOLDER
    assert prefill_time >= 0.3  # the prefill pod prefilled

    assert decoded.status_code == 200, decoded.text
    events = sse_payloads(decoded.content)
    assert events[-1] == "[DONE]"
    finishes = [choice["finish_reason"] for event in events[:-1] for choice in event["choices"]]
    assert finishes[-1] in ("stop", "length")
    assert "remote_decode" not in finishes
    assert events[-2]["usage"]["completion_tokens"] >= 1
    prompt_tokens = events[-2]["usage"]["prompt_tokens"]
    assert prompt_tokens * 0.1 > 4.0
    assert prompt_tokens * 0.001 <= decode_time < 1.5  # the transfer, not a local prefill

    # the transferred prompt's blocks are in the decode pod's pool now: a local request hits them
    assert local.status_code == 200, local.text
    cached = local.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= prompt_tokens - 16
    assert local_time < 2.0  # only the uncached tail is prefilled: under 16 x 100 ms
