"""Cache-hit thresholds and P/D on every endpoint llm-d-inference-sim has them
(llmsim/api/transfer.py).

References: llm-d-inference-sim ``pkg/llm-d-inference-sim/request.go:194-220,252-291``
(the threshold outcome, ``remote_decode``), ``helpers.go:76-79`` (no streamed prefill),
``pkg/api/request.go:158-173,394-408`` (``cache_hit_threshold`` and the header on chat
and completions only), ``messages.go:32-44`` (messages served as chat),
``pkg/communication/http.go:257-261`` (the header, ``strconv.ParseBool``),
``response_builder.go:836`` (messages' ``max_tokens`` stop reason),
``pkg/api/response.go:436-451`` (the placeholder ``kv_transfer_params``), and the vLLM PR
the field comes from (vllm-project/vllm#24520, ``validate_cache_hit_threshold``).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from trio.testing import MockClock

from llmsim.app import Simulator
from tests.api.fakes import FakeResponse, post, running, sse_payloads
from tests.api.metrics.test_metrics_endpoint import scrape, value

LONG = "Tell me a long story about the sea, the ships and the sailors " * 4
CHAT = {"messages": [{"role": "user", "content": LONG}], "max_tokens": 3}
COMPLETION = {"prompt": LONG, "max_tokens": 3}
MESSAGES = {"model": "llmsim/sim-model", "messages": [{"role": "user", "content": LONG}], "max_tokens": 3}
RESPONSES = {"input": LONG, "max_output_tokens": 3}
GENERATE = {"token_ids": list(range(1, 60)), "sampling_params": {"max_tokens": 3}}
KV = {"enable_kvcache": True, "enable_prompt_tokens_details": True, "seed": 1}
FORCE = ((b"x-cache-threshold-finish-reason", b"true"),)
# llm-d-inference-sim pkg/api/response.go:436-451, restated here (not read from llmsim.api.transfer)
# so that a change to the placeholder fails the P/D tests that import it.
PLACEHOLDER = {
    "do_remote_decode": False,
    "do_remote_prefill": True,
    "remote_engine_id": "DUMMY_ID",
    "remote_block_ids": ["DUMMY_ID"],
    "remote_host": "DUMMY",
    "remote_port": 1234,
    "tp_size": 1,
}


def _json(response: FakeResponse) -> dict[str, Any]:
    assert response.status == 200, response.body
    body: dict[str, Any] = orjson.loads(response.body)
    return body


def _finish(path: str, body: dict[str, Any]) -> str:
    """The finish reason a complete response reports, in its family's spelling."""
    if path == "/v1/messages":
        return str(body["stop_reason"])
    if path == "/v1/responses":
        return str(body["status"])
    return str(body["choices"][0]["finish_reason"])


def _generated(body: dict[str, Any]) -> int:
    """The completion tokens a complete response reports, in its family's spelling."""
    usage = body["usage"]
    return int(usage.get("completion_tokens", usage.get("output_tokens", 0)))


async def _ask(sim: Simulator, path: str, body: dict[str, Any], headers: Any = ()) -> dict[str, Any]:
    return _json(await post(sim, path, body, headers))


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
async def test_a_cold_prompt_below_the_request_threshold_ends_with_cache_threshold(
    autojump_clock: MockClock, path: str, body: dict[str, Any]
) -> None:
    async with running(**KV, time_to_first_token=5.0) as sim:
        start = autojump_clock.current_time()
        cold = await _ask(sim, path, {**body, "cache_hit_threshold": 0.5})
        elapsed = autojump_clock.current_time() - start
        await _ask(sim, path, body)  # caches the prompt
        warm = await _ask(sim, path, {**body, "cache_hit_threshold": 0.5})
    choice = cold["choices"][0]
    assert choice["finish_reason"] == "cache_threshold"
    assert choice.get("text", choice.get("message", {}).get("content")) in ("", None)
    assert elapsed < 0.01  # neither the 5 s TTFT nor any decode
    usage = cold["usage"]
    assert (usage["completion_tokens"], usage["prompt_tokens_details"]["cached_tokens"]) == (0, 0)
    assert usage["prompt_tokens"] > 16
    assert warm["choices"][0]["finish_reason"] in ("stop", "length")
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_the_global_threshold_applies_unless_the_request_sets_its_own(autojump_clock: MockClock) -> None:
    async with running(**KV, global_cache_hit_threshold=0.9) as sim:
        refused = await _ask(sim, "/v1/chat/completions", CHAT)
        own = await _ask(sim, "/v1/chat/completions", {**CHAT, "cache_hit_threshold": 0.0})
    assert refused["choices"][0]["finish_reason"] == "cache_threshold"
    assert own["choices"][0]["finish_reason"] != "cache_threshold"


@pytest.mark.parametrize(
    "path, body, expected",
    [
        ("/v1/chat/completions", CHAT, "cache_threshold"),
        ("/v1/completions", COMPLETION, "cache_threshold"),
        ("/v1/messages", MESSAGES, "max_tokens"),
        ("/v1/responses", RESPONSES, "completed"),
        ("/inference/v1/generate", GENERATE, "cache_threshold"),
    ],
)
async def test_the_global_threshold_covers_every_generating_endpoint(
    autojump_clock: MockClock, path: str, body: dict[str, Any], expected: str
) -> None:
    """llm-d rates every request its workers take (request.go:194-203), the request field
    aside; /v1/responses shows no finish reason, only an empty completed output."""
    async with running(**KV, global_cache_hit_threshold=1.0, enable_scale_out=True) as sim:
        answer = await _ask(sim, path, body)
        families = await scrape(sim)
    assert _finish(path, answer) == expected
    if path == "/v1/responses":
        assert answer["output"][0]["content"][0]["text"] == ""
    assert value(families, "prefix_cache_queries", "_total") == 0  # never admitted


@pytest.mark.parametrize(
    "path, body, forced",
    [
        ("/v1/chat/completions", CHAT, True),
        ("/v1/completions", COMPLETION, True),
        ("/v1/messages", MESSAGES, True),
        ("/v1/responses", RESPONSES, False),  # llm-d's responses request ignores the header
        ("/inference/v1/generate", GENERATE, False),
    ],
)
async def test_the_header_forces_cache_threshold_without_a_kv_cache(
    autojump_clock: MockClock, path: str, body: dict[str, Any], forced: bool
) -> None:
    async with running(enable_scale_out=True) as sim:
        answer = await _ask(sim, path, body, FORCE)
        ignored = await _ask(sim, path, body, ((b"x-cache-threshold-finish-reason", b"yes"),))  # not a Go bool
    assert (_generated(answer) == 0) is forced
    if forced:
        assert _finish(path, answer) == {"/v1/messages": "max_tokens"}.get(path, "cache_threshold")
    assert _generated(ignored) > 0


async def test_a_streamed_cache_threshold_is_one_empty_finish_chunk(autojump_clock: MockClock) -> None:
    """llm-d: a bare ``delta:{}`` chunk with the finish reason (http.go:550-554), then usage
    and [DONE]; llmsim keeps vLLM's role chunk before it."""
    stream = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with running() as sim:
        response = await post(sim, "/v1/chat/completions", stream, FORCE)
    assert response.status == 200, response.body
    role, finish, usage, done = sse_payloads(response.body)
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert finish["choices"][0]["delta"] == {}
    assert finish["choices"][0]["finish_reason"] == "cache_threshold"
    assert usage["usage"]["completion_tokens"] == 0
    assert done == "[DONE]"


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
@pytest.mark.parametrize("path, body", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
async def test_a_threshold_outside_zero_to_one_is_a_400(
    autojump_clock: MockClock, path: str, body: dict[str, Any], threshold: float
) -> None:
    async with running() as sim:
        response = await post(sim, path, {**body, "cache_hit_threshold": threshold})
        wrong_type = await post(sim, path, {**body, "cache_hit_threshold": "high"})
    assert response.status == 400, response.body
    error = orjson.loads(response.body)["error"]
    assert "Parameter `cache_hit_threshold` must be between 0.0 and 1.0 if provided." in error["message"]
    assert (error["type"], error["param"], error["code"]) == ("Bad Request", "body", 400)
    assert wrong_type.status == 400


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
async def test_the_prefill_side_answers_remote_decode_with_the_decoders_params(
    autojump_clock: MockClock, path: str, body: dict[str, Any]
) -> None:
    async with running(**KV, global_cache_hit_threshold=1.0) as sim:  # a prefill is never held to it
        answer = await _ask(sim, path, {**body, "kv_transfer_params": {"do_remote_decode": True}})
        plain = await _ask(sim, path, {**body, "cache_hit_threshold": 0.0})
        streamed = await post(sim, path, {**body, "stream": True, "kv_transfer_params": {"do_remote_decode": True}})
    assert answer["choices"][0]["finish_reason"] == "remote_decode"
    assert answer["kv_transfer_params"] == PLACEHOLDER
    assert plain["kv_transfer_params"] is None
    assert streamed.status == 400
    assert orjson.loads(streamed.body)["error"]["message"] == "Prefill does not support streaming"


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)])
async def test_the_decode_side_waits_the_transfer_instead_of_the_ttft(
    autojump_clock: MockClock, path: str, body: dict[str, Any]
) -> None:
    latency = {"time_to_first_token": 2.0, "kv_cache_transfer_latency": 0.25, "inter_token_latency": 0.0}
    async with running(**latency) as sim:
        start = autojump_clock.current_time()
        decoded = await _ask(sim, path, {**body, "kv_transfer_params": {"do_remote_prefill": True}})
        remote = autojump_clock.current_time() - start
        start = autojump_clock.current_time()
        await _ask(sim, path, body)
        local = autojump_clock.current_time() - start
    assert decoded["kv_transfer_params"] is None
    assert decoded["choices"][0]["finish_reason"] in ("stop", "length")
    assert remote == pytest.approx(0.25, abs=0.003)
    assert local == pytest.approx(2.0, abs=0.003)


async def test_query_answers_one_stable_engine_id_per_rank(autojump_clock: MockClock) -> None:
    """llm-d-inference-sim ``HandleMooncakeQuery`` (pkg/communication/http.go:865-900)."""
    from llmsim.api.http import HttpRequest

    async with running(seed=3) as sim:
        answers = []
        for _ in range(2):
            response = FakeResponse()
            await sim.app.handle(HttpRequest("GET", "/query"), response)
            answers.append(_json(response))
    assert answers[0] == answers[1]
    (rank,) = answers[0]
    assert rank == "0"
    assert len(answers[0]["0"]["engine_id"]) == 36


async def test_unloading_an_adapter_marks_its_blocks_evictable_first(autojump_clock: MockClock) -> None:
    async with running(**KV, kv_cache_size=64) as sim:
        load = {"lora_name": "sql", "lora_path": "/adapters/sql"}
        assert (await post(sim, "/v1/load_lora_adapter", load)).status == 200
        assert (await post(sim, "/v1/unload_lora_adapter", {"lora_name": "sql"})).status == 200
        assert sim.kv_cache is not None
        unloaded = "sql" in sim.kv_cache._unloaded
        assert (await post(sim, "/v1/load_lora_adapter", load)).status == 200
        reloaded = "sql" in sim.kv_cache._unloaded
    assert (unloaded, reloaded) == (True, False)
