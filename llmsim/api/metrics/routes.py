"""``GET /metrics`` as vLLM serves it: ``prometheus_client``'s exposition of one registry.

vLLM mounts ``prometheus_client.make_asgi_app`` on ``/metrics``
(``vllm/entrypoints/serve/instrumentator/metrics.py:55-81``): the text format, or
OpenMetrics when the ``Accept`` header asks for it, gzip when the client accepts it, and
``name[]`` query parameters to pick families.  This does the same with the library's
public pieces (``choose_encoder``, ``gzip_accepted``, ``restricted_registry``).  The
registry holds :class:`~llmsim.api.metrics.collector.VllmCollector` and the process,
platform and garbage-collector collectors vLLM's default registry has.
"""

from __future__ import annotations

import gzip
import logging
import weakref
from collections.abc import Callable
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from llmsim.api.context import ApiContext, Call
from llmsim.api.metrics.collector import CacheInfo, EngineReading, VllmCollector
from llmsim.api.metrics.faults import InjectedFaultsCollector
from llmsim.api.metrics.lora import LoraSeries
from llmsim.api.metrics.shared import combine, peers_of
from llmsim.api.router import Router
from llmsim.engine.fake_metrics import FakeMetrics

__all__ = ["cache_info", "metrics_registry", "register"]

log = logging.getLogger("llmsim.api")

_registries: weakref.WeakKeyDictionary[ApiContext, CollectorRegistry] = weakref.WeakKeyDictionary()


def cache_info(block_size: int = 16, num_gpu_blocks: int = 1024) -> CacheInfo:
    """``vllm:cache_config_info``'s labels: vLLM 0.33's ``CacheConfig`` fields that say
    something about a simulated engine, in its field order (``vllm/config/cache.py``).
    The block size and count are ``--block-size`` and ``--kv-cache-size``."""
    return CacheInfo(
        {
            "block_size": str(block_size),
            "gpu_memory_utilization": "0.92",
            "cache_dtype": "auto",
            "is_attention_free": "False",
            "num_gpu_blocks_override": "None",
            "sliding_window": "None",
            "enable_prefix_caching": "True",
            "prefix_caching_hash_algo": "sha256",
            "num_gpu_blocks": str(num_gpu_blocks),
            "num_cpu_blocks": "None",
        }
    )


class _FakeMetricsCache:
    """``ctx.control.fake_metrics`` parsed once per text (``/admin/config`` may swap it)."""

    def __init__(self) -> None:
        self._text: str | None = None
        self._parsed: FakeMetrics | None = None

    def get(self, text: str | None, max_model_len: int) -> FakeMetrics | None:
        if text != self._text:
            # Checked when the configuration was loaded or changed: a parse error here
            # would be a bug, and /metrics must still answer with the engine's values.
            try:
                self._parsed = None if text is None else FakeMetrics.from_json(text, max_model_len=max_model_len)
            except ValueError:
                log.exception("--fake-metrics could not be read; /metrics reports the engine")
                self._parsed = None
            self._text = text
        return self._parsed


def _reader(ctx: ApiContext) -> Callable[[], EngineReading]:
    fake_metrics = _FakeMetricsCache()
    lora_series = LoraSeries()

    def read() -> EngineReading:
        engine, control = ctx.engine, ctx.control
        fake = fake_metrics.get(control.fake_metrics, ctx.model.max_model_len)
        statistics = engine.statistics()
        lora, deferred = None, 0
        if ctx.loras.enabled:  # vLLM has the family only with a LoRA config (loggers.py:1092)
            state = engine.lora_state()
            busy = statistics.running + statistics.waiting > 0
            lora, deferred = lora_series.read(state.adapters, busy, ctx.wall_clock()), state.deferred
        reading = EngineReading(
            statistics=statistics,
            metrics=engine.metrics.snapshot(),
            kv_cache_usage=engine.kv_cache_usage,
            sleep_state=ctx.sleep.sleep_state_gauge(),
            fake=None
            if fake is None
            else fake.snapshot(max(0.0, ctx.clock() - ctx.started_at), control.fake_metrics_refresh_interval),
            max_loras=engine.options.max_loras,
            lora=lora,
            deferred=deferred,
        )
        peers = peers_of(ctx)  # --workers: the other workers' numbers too
        return reading if peers is None else combine(reading, peers())

    return read


def metrics_registry(ctx: ApiContext) -> CollectorRegistry:
    """The registry ``/metrics`` exposes for the simulator of ``ctx`` (built once)."""
    registry = _registries.get(ctx)
    if registry is None:
        registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=registry)
        registry.register(
            VllmCollector(
                _reader(ctx),
                model_name=ctx.model.display_model,
                created=ctx.wall_clock(),
                cache_info=cache_info(ctx.engine.options.block_size, ctx.engine.options.kv_cache_size),
            )
        )
        registry.register(InjectedFaultsCollector(ctx.injected_faults, ctx.wall_clock()))
        _registries[ctx] = registry
    return registry


async def metrics(call: Call) -> None:
    request = call.request
    registry: Collector = metrics_registry(call.ctx)
    names = parse_qs(request.query).get("name[]")
    if names:
        registry = metrics_registry(call.ctx).restricted_registry(names)
    encoder, content_type = choose_encoder(request.header("accept") or "")
    body = encoder(registry)
    headers = [(b"content-type", content_type.encode())]
    if gzip_accepted(request.header("accept-encoding") or ""):
        body = gzip.compress(body)
        headers.append((b"content-encoding", b"gzip"))
    call.respond(200, body, tuple(headers))


def register(router: Router) -> None:
    router.add("GET", "/metrics", metrics)
