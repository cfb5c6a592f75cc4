"""GET /metrics: vLLM 0.33's families, counted from what the clients received.

Scraped and parsed with prometheus_client's own parser; the requests run on a mock
clock, so every latency is the configured one.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import trio
from prometheus_client import Counter, Histogram
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from trio.testing import MockClock

from llmsim.api.http import HttpRequest
from llmsim.app import Simulator
from llmsim.config import Config, ConfigError
from llmsim.testing import open_simulator
from tests.api.fakes import FakeResponse, post, running

LATENCY = {"time_to_first_token": 0.1, "inter_token_latency": 0.02, "seed": 7}
MODEL = "llmsim/sim-model"
LABELS = {"model_name": MODEL, "engine": "0"}
CHAT = {"messages": [{"role": "user", "content": "Say something about the sea"}]}


async def scrape(sim: Simulator) -> dict[str, Metric]:
    response = FakeResponse()
    await sim.app.handle(HttpRequest("GET", "/metrics"), response)
    assert response.status == 200
    assert response.headers[b"content-type"] == b"text/plain; version=0.0.4; charset=utf-8"
    return {family.name: family for family in text_string_to_metric_families(response.body.decode())}


def value(families: dict[str, Metric], name: str, suffix: str = "", **labels: str) -> float:
    """The one sample of family ``name`` (``vllm:`` added) with these extra labels."""
    family = families["vllm:" + name]
    wanted = {**LABELS, **labels}
    (found,) = (s.value for s in family.samples if s.name == f"vllm:{name}{suffix}" and s.labels == wanted)
    return found


def histogram(families: dict[str, Metric], name: str) -> tuple[float, float]:
    return value(families, name, "_count"), value(families, name, "_sum")


def sse_chunks(body: bytes) -> Iterator[dict[str, Any]]:
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            yield orjson.loads(line[6:])


async def test_counters_and_histograms_match_what_the_clients_received(autojump_clock: MockClock) -> None:
    """Every completed choice is one finished engine request; generation_tokens is the
    sum of the completion_tokens the clients were told (vllm/v1/metrics/loggers.py:
    1254-1330)."""
    async with running(**LATENCY) as sim:
        length = await post(sim, "/v1/chat/completions", {**CHAT, "max_tokens": 5, "ignore_eos": True})
        natural = await post(sim, "/v1/chat/completions", {**CHAT, "max_tokens": 400})
        streamed = await post(
            sim,
            "/v1/chat/completions",
            {**CHAT, "max_tokens": 3, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}},
        )
        two = await post(sim, "/v1/completions", {"prompt": "The sea", "max_tokens": 4, "n": 2, "ignore_eos": True})
        families = await scrape(sim)

    bodies = [orjson.loads(length.body), orjson.loads(natural.body), orjson.loads(two.body)]
    stream_usage = [chunk["usage"] for chunk in sse_chunks(streamed.body) if chunk.get("usage")][-1]
    completion_tokens = sum(body["usage"]["completion_tokens"] for body in bodies) + stream_usage["completion_tokens"]
    prompt_tokens = sum(body["usage"]["prompt_tokens"] for body in bodies) + stream_usage["prompt_tokens"]
    assert bodies[1]["choices"][0]["finish_reason"] == "stop"

    assert value(families, "generation_tokens", "_total") == completion_tokens
    # each of the two completions choices is a request of its own to the engine
    per_choice_prompt = bodies[2]["usage"]["prompt_tokens"]
    assert value(families, "prompt_tokens", "_total") == prompt_tokens + per_choice_prompt
    assert value(families, "request_success", "_total", finished_reason="length") == 4
    assert value(families, "request_success", "_total", finished_reason="stop") == 1
    assert value(families, "request_success", "_total", finished_reason="abort") == 0
    assert histogram(families, "e2e_request_latency_seconds")[0] == 5
    assert histogram(families, "request_generation_tokens") == (5, completion_tokens)
    assert histogram(families, "request_params_n") == (4, 5)  # one per request: n = 1, 1, 1, 2
    assert histogram(families, "request_params_max_tokens") == (5, 5 + 400 + 3 + 4 + 4)
    ttft_count, ttft_sum = histogram(families, "time_to_first_token_seconds")
    assert ttft_count == 5
    assert ttft_sum / ttft_count == pytest.approx(0.1, abs=0.002)  # within one step of the grid
    itl_count, itl_sum = histogram(families, "inter_token_latency_seconds")
    assert itl_count == completion_tokens - 5
    assert itl_sum / itl_count == pytest.approx(0.02)
    assert value(families, "inter_token_latency_seconds", "_bucket", le="0.025") == itl_count
    assert value(families, "inter_token_latency_seconds", "_bucket", le="0.01") == 0
    assert value(families, "num_requests_running") == 0


async def test_a_client_that_leaves_is_not_a_finished_request(autojump_clock: MockClock) -> None:
    """An aborted request's tokens and first token count; nothing else does
    (vllm/v1/engine/output_processor.py:599-660 drops its state before any finish stats)."""
    async with running(**LATENCY) as sim:
        response = FakeResponse()
        with trio.move_on_after(0.15):  # the first token at 0.1, the second at 0.12, then gone
            await post(sim, "/v1/chat/completions", {**CHAT, "max_tokens": 50, "stream": True}, response=response)
        families = await scrape(sim)
    received = sum(1 for chunk in sse_chunks(response.body) if chunk["choices"] and chunk["choices"][0]["delta"])
    assert value(families, "generation_tokens", "_total") == received - 1  # less the role chunk
    assert histogram(families, "time_to_first_token_seconds")[0] == 1
    assert histogram(families, "e2e_request_latency_seconds")[0] == 0
    assert sum(s.value for s in families["vllm:request_success"].samples if s.name.endswith("_total")) == 0


def rejections(families: dict[str, Metric]) -> dict[str, float]:
    """vllm:admission_rejections by reason (labels model_name and reason only, loggers.py:847-859)."""
    family = families["vllm:admission_rejections"]
    return {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")}


@pytest.mark.parametrize(
    ("limits", "status", "counted"),
    [
        ({"max_num_queued_reqs": 1}, 503, 1),  # vLLM counts it (vllm/v1/engine/async_llm.py:360-388)
        ({"max_waiting_queue_length": 0}, 429, 0),  # llm-d-inference-sim's limit: counted nowhere
    ],
)
async def test_queue_refusals(autojump_clock: MockClock, limits: dict[str, int], status: int, counted: int) -> None:
    async with running(**LATENCY, max_num_seqs=1, **limits) as sim:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, sim, "/v1/chat/completions", {**CHAT, "max_tokens": 5, "ignore_eos": True})
            await trio.sleep(0.01)
            refused = await post(sim, "/v1/chat/completions", {**CHAT, "max_tokens": 5})
            running_now = value(await scrape(sim), "num_requests_running")
        families = await scrape(sim)
    assert refused.status == status
    assert running_now == 1
    assert rejections(families) == {"max_num_queued_reqs": counted, "max_num_queued_tokens": 0}
    assert value(families, "request_success", "_total", finished_reason="length") == 1
    assert histogram(families, "e2e_request_latency_seconds")[0] == 1


#: vllm/v1/metrics/buckets.py:30-52, copied rather than imported from llmsim.
VLLM_REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
VLLM_REQUEST_LATENCY_BUCKETS += (120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def _vllm_registry(prompt_tokens: int, e2e_latency: float) -> CollectorRegistry:
    """Two of vLLM's own metric objects, made as vllm/v1/metrics/loggers.py:748-756 and
    960-967 make them, with prometheus_client's classes."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    counter = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=registry)
    e2e = Histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        labels,
        buckets=VLLM_REQUEST_LATENCY_BUCKETS,
        registry=registry,
    )
    counter.labels(MODEL, "0").inc(prompt_tokens)
    e2e.labels(MODEL, "0").observe(e2e_latency)
    return registry


def _without_created(text: str, names: tuple[str, ...]) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if any(name in line for name in names) and "_created" not in line and not line.startswith("# HELP")
    ] + [line for line in text.splitlines() if line.startswith("# HELP") and line.split()[2] in names]


async def test_the_exposition_is_byte_for_byte_what_vllms_metric_objects_give(autojump_clock: MockClock) -> None:
    names = ("vllm:prompt_tokens_total", "vllm:e2e_request_latency_seconds")
    async with running(time_to_first_token=0.18) as sim:
        answer = await post(sim, "/v1/chat/completions", {**CHAT, "max_tokens": 1})
        response = FakeResponse()
        await sim.app.handle(HttpRequest("GET", "/metrics"), response)
        families = await scrape(sim)
    ours = response.body.decode()
    prompt_tokens = orjson.loads(answer.body)["usage"]["prompt_tokens"]
    e2e_latency = histogram(families, "e2e_request_latency_seconds")[1]
    assert e2e_latency == pytest.approx(0.18, abs=0.002)
    theirs = generate_latest(_vllm_registry(prompt_tokens, e2e_latency)).decode()
    assert "vllm:prompt_tokens_total" in ours
    assert _without_created(ours, names) == _without_created(theirs, names)


#: Every family vLLM 0.33 always creates (vllm/v1/metrics/loggers.py:526-1035) with the
#: type it has, and vllm:cache_config_info (loggers.py:1114-1136, log_engine_initialized).
VLLM_FAMILIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_waiting_by_reason": "gauge",
    "vllm:engine_sleep_state": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:external_prefix_cache_queries": "counter",
    "vllm:external_prefix_cache_hits": "counter",
    "vllm:mm_cache_queries": "counter",
    "vllm:mm_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:prompt_tokens_cached": "counter",
    "vllm:prompt_tokens_cached_by_source": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:admission_rejections": "counter",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:request_max_num_generation_tokens": "histogram",
    "vllm:request_params_n": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_num_preemptions": "histogram",
    "vllm:request_prefill_kv_computed_tokens": "histogram",
    "vllm:cache_config_info": "gauge",
}


async def test_every_family_vllm_always_has(autojump_clock: MockClock) -> None:
    async with running() as sim:
        families = await scrape(sim)
    ours = {name: family.type for name, family in families.items() if name.startswith("vllm:")}
    created = {name for name in ours if name.endswith("_created")}  # the text format's split-out samples
    assert {name: kind for name, kind in ours.items() if name not in created} == VLLM_FAMILIES
    assert {"process_cpu_seconds", "python_gc_objects_collected", "python_info"} <= set(families)


async def test_request_token_buckets_follow_max_model_len(autojump_clock: MockClock) -> None:
    """1-2-5 up to max_model_len (vllm/v1/metrics/buckets.py:170-210)."""
    async with running(max_model_len=1000) as sim:
        families = await scrape(sim)
    bounds = [s.labels["le"] for s in families["vllm:request_prompt_tokens"].samples if s.name.endswith("_bucket")]
    assert bounds == ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "1000.0", "+Inf"]


@pytest.mark.parametrize("backend", ["native", "hypercorn"])
async def test_negotiation_over_http(backend: str) -> None:
    """prometheus_client's make_asgi_app, which vLLM mounts on /metrics
    (vllm/entrypoints/serve/instrumentator/metrics.py:76-81): gzip when accepted,
    OpenMetrics when asked for, ``name[]`` picks families."""
    async with open_simulator(server=backend) as server, httpx.AsyncClient(base_url=server.url) as client:
        plain = await client.get("/metrics")  # httpx accepts gzip
        raw = await client.get("/metrics", headers={"accept-encoding": "identity"})
        open_metrics = await client.get(
            "/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"}
        )
        picked = await client.get("/metrics", params={"name[]": "vllm:num_requests_running"})
    assert plain.headers["content-encoding"] == "gzip"
    assert "vllm:generation_tokens_total" in plain.text
    assert "content-encoding" not in raw.headers
    assert gzip.decompress(gzip.compress(raw.content)) == raw.content
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")
    assert open_metrics.text.endswith("# EOF\n")
    families = list(text_string_to_metric_families(picked.text))
    assert [family.name for family in families] == ["vllm:num_requests_running"]


# --- fake metrics ---------------------------------------------------------------------------

FAKE = (
    '{"running-requests": "oscillate:0:10:4s", "waiting-requests": 30, "kv-cache-usage": 0.4,'
    ' "request-success-total": {"stop": 20}, "total-generation-tokens": 1000,'
    ' "ttft-buckets-values": [0, 5, 5], "loras": [{"running": "a,b", "waiting": "c", "timestamp": 1257894567}]}'
)


async def test_fake_gauges_follow_their_function_and_counters_add_the_engines(autojump_clock: MockClock) -> None:
    """llm-d-inference-sim's --fake-metrics: oscillate is mid + amp sin(2 pi t / period),
    refreshed every --fake-metrics-refresh-interval; real requests add to the fake counts."""
    async with running(**LATENCY, fake_metrics=FAKE, fake_metrics_refresh_interval="1s") as sim:
        at_start = await scrape(sim)
        await trio.sleep(1.5)  # the refresh at 1 s: 5 + 5 sin(pi / 2) = 10
        quarter = await scrape(sim)
        answer = await post(sim, "/v1/chat/completions", {**CHAT, "max_tokens": 3, "ignore_eos": True})
        after = await scrape(sim)
    assert orjson.loads(answer.body)["usage"]["completion_tokens"] == 3
    assert value(at_start, "num_requests_running") == 5
    assert value(quarter, "num_requests_running") == 10
    assert value(after, "num_requests_waiting") == 30
    assert value(after, "num_requests_waiting_by_reason", reason="capacity") == 30
    assert value(after, "kv_cache_usage_perc") == 0.4
    assert value(at_start, "generation_tokens", "_total") == 1000
    assert value(after, "generation_tokens", "_total") == 1003
    assert value(after, "request_success", "_total", finished_reason="stop") == 20
    assert value(after, "request_success", "_total", finished_reason="length") == 1
    assert value(at_start, "time_to_first_token_seconds", "_bucket", le="0.005") == 5
    assert value(after, "time_to_first_token_seconds", "_count") == 11  # 10 fake + the real request
    lora = at_start["vllm:lora_requests_info"].samples[0]
    assert lora.labels == {"max_lora": "1", "running_lora_adapters": "a,b", "waiting_lora_adapters": "c"}
    assert lora.value == 1257894567


def test_bad_fake_metrics_stop_the_configuration() -> None:
    with pytest.raises(ConfigError, match="fake-metrics: running-requests"):
        Config(fake_metrics='{"running-requests": "sometimes"}')


@pytest.mark.parametrize("backend", ["native", "hypercorn"])
async def test_server_statistics_agree_with_metrics(backend: str) -> None:
    """What an embedding test suite reads from ``handle.statistics()`` is what /metrics says."""
    async with open_simulator(server=backend) as server, httpx.AsyncClient(base_url=server.url) as client:
        for n in (1, 3):
            answer = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4, "n": n})
            assert answer.status_code == 200
        statistics = server.statistics()
        text = (await client.get("/metrics")).text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert statistics.requests_finished == 4
    assert statistics.generation_tokens == value(families, "generation_tokens", "_total")
    assert statistics.prompt_tokens == value(families, "prompt_tokens", "_total")
    assert statistics.requests_finished == sum(
        s.value for s in families["vllm:request_success"].samples if s.name.endswith("_total")
    )
    assert (statistics.running, statistics.waiting) == (0, 0)


async def test_custom_histogram_buckets_replace_a_family(autojump_clock: MockClock) -> None:
    """vLLM's --custom-histogram-buckets (vllm/config/observability.py:70-80): a family's
    bounds replaced for every histogram of the family, the others left as they were."""
    custom = '{"time_to_first_token": [0.05, 0.1, 0.15], "request_latency": [1, 2]}'
    async with running(**LATENCY, custom_histogram_buckets=custom) as sim:
        await post(sim, "/v1/chat/completions", {**CHAT, "max_tokens": 2, "ignore_eos": True})
        families = await scrape(sim)

    def bounds(name: str) -> list[str]:
        return [s.labels["le"] for s in families[f"vllm:{name}"].samples if s.name.endswith("_bucket")]

    assert bounds("time_to_first_token_seconds") == ["0.05", "0.1", "0.15", "+Inf"]
    assert bounds("e2e_request_latency_seconds") == bounds("request_queue_time_seconds") == ["1.0", "2.0", "+Inf"]
    assert bounds("inter_token_latency_seconds")[:2] == ["0.01", "0.025"]
    assert value(families, "time_to_first_token_seconds", "_bucket", le="0.15") == 1


@pytest.mark.parametrize(
    ("custom", "message"),
    [
        ('{"ttft": [1]}', "unknown bucket family 'ttft'"),
        ('{"request_latency": []}', "custom_histogram_buckets['request_latency']: bucket list must not be empty"),
        ('{"request_latency": [0, 1]}', "bound 0 must be finite and greater than 0"),
        ('{"request_latency": [2, 1]}', "bounds [2, 1] must be strictly increasing"),
        ('{"request_latency": [true]}', "expected a list of numbers"),
    ],
)
def test_bad_custom_buckets_stop_the_configuration(custom: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Config(custom_histogram_buckets=custom)
