"""vLLM 0.33's Prometheus metric families, read from the engine at scrape time.

:class:`VllmCollector` is a ``prometheus_client`` custom collector: every scrape reads
one :class:`~llmsim.engine.statistics.EngineStatistics` and one
:class:`~llmsim.engine.metrics.MetricsSnapshot` and turns them into metric families
with vLLM's names, help texts, label names and bucket bounds
(``vllm/v1/metrics/loggers.py:473-1130``).  The request path never touches
``prometheus_client``; the engine only adds to plain counters.

Labels are vLLM's: ``model_name`` (the first served model name) and ``engine`` (``"0"``,
one engine core), plus each family's own (``finished_reason``, ``source``, ...).  Every
labelled child vLLM creates up front is reported from the start, at 0.  Counters and
histograms carry a ``_created`` sample, as ``prometheus_client`` gives vLLM's.

Families vLLM only has with a feature llmsim does not simulate (speculative decoding,
KV connectors, LoRA without ``--enable-lora`` or adapters, NaN and watermark accounting,
KV block residency sampling) are left out, as vLLM leaves them out without the feature.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import attrs
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from llmsim.engine.fake_metrics import FakeMetricsSnapshot, LoraInfo
from llmsim.engine.metrics import ADMISSION_REASONS, HistogramSnapshot, MetricsSnapshot
from llmsim.engine.statistics import EngineStatistics

__all__ = ["CacheInfo", "EngineReading", "VllmCollector"]

_LABELS = ("model_name", "engine")
_ENGINE = "0"
_PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
_CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
_AWAKE = {"awake": 1, "weights_offloaded": 0, "discard_all": 0}

#: (name, help) of every histogram, in vLLM's order; the buckets come with the snapshot.
_HISTOGRAMS: tuple[tuple[str, str], ...] = (
    ("request_prompt_tokens", "Number of prefill tokens processed."),
    ("request_generation_tokens", "Number of generation tokens processed."),
    ("iteration_tokens_total", "Histogram of number of tokens per engine_step."),
    ("request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens."),
    ("request_params_n", "Histogram of the n request parameter."),
    ("request_params_max_tokens", "Histogram of the max_tokens request parameter."),
    ("time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    ("request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request."),
    ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    ("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
    ("request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
    ("request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
    ("request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
    ("request_num_preemptions", "Histogram of the number of times a request was preempted."),
    (
        "request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
    ),
)


@attrs.frozen
class EngineReading:
    """What one scrape reports: the engine's numbers and, with ``--fake-metrics``, the
    fake values at this moment.

    ``sleep_state`` is vLLM's ``engine_sleep_state`` by label (awake unless sleep mode
    put the engine to sleep).  With fake
    metrics, a faked gauge replaces the engine's; a faked counter or histogram is a
    base the engine's own counts add to (so counters never go backwards, and real
    requests still show, as llm-d-inference-sim adds them to its fake token and success
    counts); families the fake configuration does not name report the engine.
    """

    statistics: EngineStatistics
    metrics: MetricsSnapshot
    kv_cache_usage: float = 0.0
    sleep_state: Mapping[str, int] = attrs.field(factory=lambda: dict(_AWAKE))
    fake: FakeMetricsSnapshot | None = None
    max_loras: int = 1
    lora: tuple[LoraInfo, ...] | None = None  # the engine's lora_requests_info series; None without LoRA
    deferred: int = 0  # waiting requests held by the LoRA budget (vLLM's num_skipped_waiting_reqs)

    def gauge(self, name: str, real: float) -> float:
        return self.fake.gauges.get(name, real) if self.fake is not None else real

    def counter(self, name: str, real: int) -> int:
        return real + self.fake.counters.get(name, 0) if self.fake is not None else real

    def request_success(self) -> dict[str, int]:
        real = self.metrics.request_success
        if self.fake is None or self.fake.request_success is None:
            return real
        merged = dict(real)
        for reason, count in self.fake.request_success.items():
            merged[reason] = merged.get(reason, 0) + count
        return merged

    def histogram(self, name: str) -> HistogramSnapshot:
        real = self.metrics.histograms[name]
        fake = self.fake.histograms.get(name) if self.fake is not None else None
        if fake is None or fake.bounds != real.bounds:
            return real
        counts = tuple(a + b for a, b in zip(real.counts, fake.counts, strict=True))
        return HistogramSnapshot(real.bounds, counts, real.sum + fake.sum)


@attrs.frozen
class CacheInfo:
    """The labels of ``vllm:cache_config_info`` (vLLM: every ``CacheConfig`` field as a
    string, ``vllm/config/cache.py:440-443``), in vLLM's field order."""

    labels: Mapping[str, str]


class VllmCollector:
    """Reads ``read()`` at every scrape and yields vLLM's families for it."""

    def __init__(
        self,
        read: Callable[[], EngineReading],
        *,
        model_name: str,
        created: float,
        cache_info: CacheInfo,
    ) -> None:
        self._read = read
        self._values = (model_name, _ENGINE)
        self._model_name = model_name
        self._created = created
        self._cache_info = cache_info

    def describe(self) -> list[Metric]:
        """Nothing: describing would take a reading at registration (``auto_describe``)."""
        return []

    def collect(self) -> Iterator[Metric]:
        reading = self._read()
        stats, snapshot = reading.statistics, reading.metrics
        running = reading.gauge("num_requests_running", stats.running)
        waiting = reading.gauge("num_requests_waiting", stats.waiting)
        yield self._gauge("num_requests_running", "Number of requests in model execution batches.", running)
        yield self._gauge("num_requests_waiting", "Number of requests waiting to be processed.", waiting)
        yield self._gauge_by(
            "num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
            "Sum of all reasons equals vllm:num_requests_waiting.",
            "reason",
            {"capacity": max(waiting - reading.deferred, 0), "deferred": reading.deferred},
        )
        yield self._sleep_state(reading.sleep_state)
        kv_cache_usage = reading.gauge("kv_cache_usage_perc", reading.kv_cache_usage)
        yield self._gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv_cache_usage)
        yield from self._cache_counters(reading)
        yield self._counter("num_preemptions", "Cumulative number of preemption from the engine.", 0)
        prompt_tokens = reading.counter("prompt_tokens", stats.prompt_tokens)
        yield self._counter("prompt_tokens", "Number of prefill tokens processed.", prompt_tokens)
        yield self._counter_by(
            "prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            "source",
            dict(
                zip(_PROMPT_SOURCES, (snapshot.prompt_tokens_computed, snapshot.prompt_tokens_cached, 0), strict=True)
            ),
        )
        yield self._counter(
            "prompt_tokens_cached", "Number of cached prompt tokens (local + external).", snapshot.prompt_tokens_cached
        )
        yield self._counter_by(
            "prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to "
            "DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
            "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            "source",
            {source: snapshot.prefix_cache_hits if source == "device" else 0 for source in _CACHE_HIT_SOURCES},
        )
        generation_tokens = reading.counter("generation_tokens", stats.generated_tokens)
        yield self._counter("generation_tokens", "Number of generation tokens processed.", generation_tokens)
        yield self._counter_by(
            "request_success", "Count of successfully processed requests.", "finished_reason", reading.request_success()
        )
        yield self._admission_rejections(snapshot.admission_rejections)
        for name, documentation in _HISTOGRAMS:
            yield self._histogram(name, documentation, reading.histogram(name))
        yield self._cache_config_info()
        if reading.fake is not None and reading.fake.lora_requests_info is not None:
            yield self._lora_requests_info(reading.fake.lora_requests_info, reading.max_loras)
        elif reading.lora is not None:
            yield self._lora_requests_info(reading.lora, reading.max_loras)

    # --- families --------------------------------------------------------------------------

    def _gauge(self, name: str, documentation: str, value: float) -> Metric:
        family = GaugeMetricFamily("vllm:" + name, documentation, labels=_LABELS)
        family.add_metric(self._values, value)
        return family

    def _gauge_by(self, name: str, documentation: str, label: str, values: Mapping[str, float]) -> Metric:
        family = GaugeMetricFamily("vllm:" + name, documentation, labels=(*_LABELS, label))
        for label_value, value in values.items():
            family.add_metric((*self._values, label_value), value)
        return family

    def _counter(self, name: str, documentation: str, value: float) -> Metric:
        family = CounterMetricFamily("vllm:" + name, documentation, labels=_LABELS)
        family.add_metric(self._values, value, created=self._created)
        return family

    def _counter_by(self, name: str, documentation: str, label: str, values: Mapping[str, float]) -> Metric:
        family = CounterMetricFamily("vllm:" + name, documentation, labels=(*_LABELS, label))
        for label_value, value in values.items():
            family.add_metric((*self._values, label_value), value, created=self._created)
        return family

    def _cache_counters(self, reading: EngineReading) -> Iterator[Metric]:
        snapshot = reading.metrics
        yield self._counter(
            "prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            reading.counter("prefix_cache_queries", snapshot.prefix_cache_queries),
        )
        yield self._counter(
            "prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            reading.counter("prefix_cache_hits", snapshot.prefix_cache_hits),
        )
        for kind, unit in (("queries", "queried"), ("hits", "cached")):
            yield self._counter(
                f"external_prefix_cache_{kind}",
                f"External prefix cache {kind} from KV connector cross-instance cache sharing, "
                f"in terms of number of {unit} tokens.",
                0,
            )
        for kind, unit in (("queries", "queried"), ("hits", "cached")):
            yield self._counter(f"mm_cache_{kind}", f"Multi-modal cache {kind}, in terms of number of {unit} items.", 0)

    def _sleep_state(self, states: Mapping[str, int]) -> Metric:
        """vLLM's ``record_sleep_state`` (``loggers.py:1335-1352``)."""
        return self._gauge_by(
            "engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            "sleep_state",
            states,
        )

    def _admission_rejections(self, rejections: Mapping[str, int]) -> Metric:
        family = CounterMetricFamily(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            labels=("model_name", "reason"),
        )
        for reason in ADMISSION_REASONS:
            family.add_metric((self._model_name, reason), rejections.get(reason, 0), created=self._created)
        return family

    def _histogram(self, name: str, documentation: str, histogram: HistogramSnapshot) -> Metric:
        family = HistogramMetricFamily("vllm:" + name, documentation, labels=_LABELS)
        family.add_metric(self._values, _buckets(histogram.bounds, histogram.cumulative()), histogram.sum)
        # HistogramMetricFamily takes no creation time; a _created sample is what
        # prometheus_client's own Histogram adds (and the exposition formats split out).
        family.samples.append(
            Sample(f"vllm:{name}_created", dict(zip(_LABELS, self._values, strict=True)), self._created)
        )
        return family

    def _lora_requests_info(self, series: Sequence[LoraInfo], max_loras: int) -> Metric:
        """vLLM's LoRA gauge (``loggers.py:1097-1112``, ``set_to_current_time``): labels
        only, the value a timestamp; the fake configuration's series or the engine's."""
        family = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=("max_lora", "waiting_lora_adapters", "running_lora_adapters"),
        )
        for info in series:
            family.add_metric((str(max_loras), info.waiting, info.running), info.timestamp)
        return family

    def _cache_config_info(self) -> Metric:
        labels = {**self._cache_info.labels, "engine": _ENGINE}
        family = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=tuple(labels)
        )
        family.add_metric(tuple(labels.values()), 1.0)
        return family


#: prometheus_client's spelling of a bucket bound (``1.0``, ``0.025``, ``+Inf``); untyped there.
_go_float: Callable[[float], str] = floatToGoString


def _buckets(bounds: Sequence[float], cumulative: Sequence[int]) -> list[tuple[str, float]]:
    """``(le, count)`` pairs for :class:`HistogramMetricFamily`, the last one ``+Inf``."""
    pairs: list[tuple[str, float]] = [
        (_go_float(bound), count) for bound, count in zip(bounds, cumulative, strict=False)
    ]
    pairs.append(("+Inf", cumulative[-1]))
    return pairs
