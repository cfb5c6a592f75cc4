"""Fake metrics (``--fake-metrics``): values ``/metrics`` reports instead of the engine's.

The format is llm-d-inference-sim's (``pkg/common/config_fake_metrics.go``); this module
parses it once (:meth:`FakeMetrics.from_json`) and answers, for any time since start-up,
what ``/metrics`` shows in vLLM 0.33's terms (:meth:`FakeMetrics.snapshot`).  It is pure:
no clock, no I/O.

How llm-d turns each key into series (``pkg/llm-d-inference-sim/fake_metrics.go``):

* ``running-requests``, ``waiting-requests``, ``kv-cache-usage``: a gauge, fixed or a
  function of time ``func:start:end:period`` recomputed on every tick of
  ``--fake-metrics-refresh-interval`` (lines 66-90, 106-144).  The request gauges of a
  function are truncated to whole numbers (``int64(value)``, lines 78-81).
* ``*-buckets-values`` and the token arrays (``request-prompt-tokens`` ...): **per-bucket
  counts**, not samples, aligned with the metric's bucket bounds, the last one ``+Inf``;
  trailing buckets may be left out (``initHistogramSnapshot``, lines 149-180).  llm-d observes
  each bucket's upper bound ``count`` times (``+Inf``: the last bound + 1), so ``_sum`` is
  ``sum(count * bound)``; so is the derived token total (line 176).
* ``request-prompt-tokens`` / ``request-generation-tokens`` also give ``prompt_tokens`` /
  ``generation_tokens`` that derived total, unless ``total-prompt-tokens`` /
  ``total-generation-tokens`` set it (``updateTokenMetrics``, lines 416-468).
* ``request-success-total``, ``prefix-cache-hits``, ``prefix-cache-queries``: counters.
* ``loras``: one ``lora_requests_info`` series per entry, its value the timestamp.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from fractions import Fraction

import attrs

from llmsim.engine.metric_buckets import (
    INTER_TOKEN_LATENCY_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
    request_tokens_buckets,
)
from llmsim.engine.metrics import HistogramSnapshot

__all__ = ["FUNCTIONS", "FakeMetrics", "FakeMetricsSnapshot", "HistogramSnapshot", "LoraInfo", "ValueFunction"]

#: The value functions of ``func:start:end:period`` (config_fake_metrics.go:30-35).
FUNCTIONS = ("oscillate", "ramp", "rampreset", "squarewave")

#: Gauges: key -> (vLLM name, whole numbers, at most 1).
_GAUGES: dict[str, tuple[str, bool, bool]] = {
    "running-requests": ("num_requests_running", True, False),
    "waiting-requests": ("num_requests_waiting", True, False),
    "kv-cache-usage": ("kv_cache_usage_perc", False, True),
}
#: Bucket-count arrays of the time histograms: key -> (vLLM name, bounds).  llm-d feeds
#: ``tpot-buckets-values`` to its ``time_per_output_token_seconds`` and
#: ``inter_token_latency_seconds`` (fake_metrics.go:229-230); vLLM 0.33 has only the latter.
_TIME_HISTOGRAMS: dict[str, tuple[str, tuple[float, ...]]] = {
    "ttft-buckets-values": ("time_to_first_token_seconds", TIME_TO_FIRST_TOKEN_BUCKETS),
    "tpot-buckets-values": ("inter_token_latency_seconds", INTER_TOKEN_LATENCY_BUCKETS),
    "request-tpot-buckets-values": ("request_time_per_output_token_seconds", INTER_TOKEN_LATENCY_BUCKETS),
    "e2erl-buckets-values": ("e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS),
    "queue-time-buckets-values": ("request_queue_time_seconds", REQUEST_LATENCY_BUCKETS),
    "inf-time-buckets-values": ("request_inference_time_seconds", REQUEST_LATENCY_BUCKETS),
    "prefill-time-buckets-values": ("request_prefill_time_seconds", REQUEST_LATENCY_BUCKETS),
    "decode-time-buckets-values": ("request_decode_time_seconds", REQUEST_LATENCY_BUCKETS),
}
#: Bucket-count arrays of the token histograms (bounds: the 1-2-5 series up to
#: max-model-len): key -> vLLM name.  llm-d's ``max_num_generation_tokens`` is vLLM's
#: ``request_max_num_generation_tokens``.
_TOKEN_HISTOGRAMS: dict[str, str] = {
    "request-prompt-tokens": "request_prompt_tokens",
    "request-generation-tokens": "request_generation_tokens",
    "request-max-generation-tokens": "request_max_num_generation_tokens",
    "request-params-max-tokens": "request_params_max_tokens",
}
#: Token totals: explicit key -> (vLLM counter, the histogram key it is otherwise derived from).
_TOKEN_TOTALS: dict[str, tuple[str, str]] = {
    "total-prompt-tokens": ("prompt_tokens", "request-prompt-tokens"),
    "total-generation-tokens": ("generation_tokens", "request-generation-tokens"),
}
#: vLLM 0.33's ``finished_reason`` values, all shown from start-up (``FinishReason``,
#: vllm/v1/engine/__init__.py:49-67; vllm/v1/metrics/loggers.py:807-819).
_VLLM_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
#: Accepted too, so llm-d configurations keep working (pkg/common/config.go:46-80).
_LLMD_FINISH_REASONS = ("tool_calls", "remote_decode", "cache_threshold")
_LORA_KEYS = ("running", "waiting", "timestamp")

_KNOWN_KEYS = (
    *_GAUGES,
    "loras",
    *_TIME_HISTOGRAMS,
    *_TOKEN_HISTOGRAMS,
    *_TOKEN_TOTALS,
    "request-success-total",
    "prefix-cache-hits",
    "prefix-cache-queries",
)

_NS_PER_S = 1_000_000_000
#: Go's ``strconv.ParseFloat`` decimal forms (no inf/nan: a bound must be finite).
_NUMBER_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
#: Go's ``time.ParseDuration`` (time/format.go): ``0`` or signed number+unit parts.
_DURATION_RE = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+|[+-]?0")
_DURATION_PART_RE = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
#: The longest duration Go has (``math.MaxInt64`` nanoseconds).
_MAX_GO_DURATION_NS = 2**63 - 1
_UNIT_NS = {"ns": 1, "us": 1000, "µs": 1000, "μs": 1000, "ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}


def _go_seconds(ns: int) -> float:
    """``time.Duration.Seconds()``: whole seconds plus the rest, as Go rounds it."""
    sec, nsec = divmod(ns, _NS_PER_S)
    return sec + nsec / 1e9


@attrs.frozen
class ValueFunction:
    """``func:start:end:period``; :meth:`at` is llm-d's generator (fake_metrics.go:106-144)."""

    kind: str
    start: float
    end: float
    period_ns: int
    #: The request gauges report ``int64(value)`` (fake_metrics.go:78-81); llm-d leaves the
    #: start-up value f(0) unrounded (line 481), llmsim truncates it too.
    whole: bool = False

    def at(self, t_ns: int) -> float:
        """The value ``t_ns`` nanoseconds after start-up."""
        value = self._raw(t_ns)
        return float(int(value)) if self.whole else value

    def _raw(self, t_ns: int) -> float:
        start, end = self.start, self.end
        if self.kind == "oscillate":  # a sine of one period around the middle (lines 106-112)
            phase = (2 * math.pi * _go_seconds(t_ns)) / _go_seconds(self.period_ns)
            return (start + end) / 2 + (end - start) / 2 * math.sin(phase)
        if self.kind == "ramp":  # start to end over one period, then end (lines 114-121)
            frac = _go_seconds(t_ns) / _go_seconds(self.period_ns)
            return end if frac >= 1 else start + frac * (end - start)
        if self.kind == "rampreset":  # the ramp, restarted every period (lines 123-133)
            frac = _go_seconds(t_ns % self.period_ns) / _go_seconds(self.period_ns)
            return start + min(frac, 1.0) * (end - start)
        # squarewave: start for the first half (integer nanoseconds) of each period (lines 135-144)
        return start if t_ns % self.period_ns < self.period_ns // 2 else end


@attrs.frozen
class LoraInfo:
    """One ``lora_requests_info`` series: labels ``running_lora_adapters``,
    ``waiting_lora_adapters`` (comma-separated names, as given), value ``timestamp``."""

    running: str
    waiting: str
    timestamp: float


@attrs.frozen
class FakeMetricsSnapshot:
    """What ``/metrics`` shows at one moment; names are vLLM's without ``vllm:``.

    Only families whose key the configuration has are here.  For the others llm-d shows
    the engine's values for the token and success families (``request_prompt_tokens``,
    ``request_generation_tokens``, ``request_max_num_generation_tokens``,
    ``request_params_max_tokens``, ``prompt_tokens``, ``generation_tokens``,
    ``request_success``; real requests add to the fake values of these too), and no
    series at all for the rest (metrics.go: ``setInitialPrometheusMetrics``, ``reportLoras``,
    ``reportHistogramValue``, ``reportPrefixCacheStats`` and the gauge updaters drop real
    values in fake mode; ``recordRequestMetricsOnSuccess`` does not).
    """

    #: ``num_requests_running``, ``num_requests_waiting``, ``kv_cache_usage_perc``.
    gauges: Mapping[str, float]
    #: ``prompt_tokens``, ``generation_tokens``, ``prefix_cache_queries``, ``prefix_cache_hits``.
    counters: Mapping[str, int]
    #: ``request_success`` by ``finished_reason`` (vLLM's five reasons always present).
    request_success: Mapping[str, int] | None
    #: By vLLM name, e.g. ``time_to_first_token_seconds``, ``request_prompt_tokens``.
    histograms: Mapping[str, HistogramSnapshot]
    #: ``None`` without ``loras``; ``()`` for ``"loras": []``.
    lora_requests_info: tuple[LoraInfo, ...] | None


@attrs.frozen
class FakeMetrics:
    """A parsed ``--fake-metrics``: the constant parts ready, the gauges to evaluate."""

    #: By vLLM gauge name: a fixed value or a function of time.
    gauges: Mapping[str, float | ValueFunction]
    counters: Mapping[str, int]
    request_success: Mapping[str, int] | None
    histograms: Mapping[str, HistogramSnapshot]
    lora_requests_info: tuple[LoraInfo, ...] | None

    @classmethod
    def from_json(cls, text: str, *, max_model_len: int) -> FakeMetrics:
        """Parse and check ``text`` (a JSON object); ``ValueError`` names the bad key.

        ``max_model_len`` gives the token histograms' bounds.  A JSON ``null`` is the
        same as a missing key, as in llm-d.
        """
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be positive, got {max_model_len}")
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"expected a JSON object, got {_kind(raw)}")
        data = {key: value for key, value in raw.items() if value is not None}
        for key in data:
            if key not in _KNOWN_KEYS:
                raise ValueError(f"{key}: unknown key; the keys are {', '.join(_KNOWN_KEYS)}")
        histograms = _histograms(data, max_model_len)
        success, loras = data.get("request-success-total"), data.get("loras")
        return cls(
            gauges={name: _gauge(key, data[key], *how) for key, (name, *how) in _GAUGES.items() if key in data},
            counters=_counters(data, histograms),
            request_success=None if success is None else _request_success(success),
            histograms=histograms,
            lora_requests_info=None if loras is None else _loras(loras),
        )

    def snapshot(self, elapsed: float, refresh_interval: float) -> FakeMetricsSnapshot:
        """The values ``elapsed`` seconds after start-up.

        Functions change only on refresh ticks: between ``k`` and ``k + 1`` intervals they
        hold their value at ``k`` intervals, as llm-d's ticker sets them (its value at 0 is
        set at start-up, fake_metrics.go:66-90 and 470-487).  Times are whole nanoseconds.
        """
        if not (math.isfinite(elapsed) and elapsed >= 0):
            raise ValueError(f"elapsed must be a non-negative number of seconds, got {elapsed!r}")
        if not (math.isfinite(refresh_interval) and refresh_interval > 0):
            raise ValueError(f"refresh_interval must be positive, got {refresh_interval!r}")
        tick_ns = max(1, round(refresh_interval * _NS_PER_S))
        t_ns = round(elapsed * _NS_PER_S) // tick_ns * tick_ns
        gauges = {
            name: spec.at(t_ns) if isinstance(spec, ValueFunction) else spec for name, spec in self.gauges.items()
        }
        return FakeMetricsSnapshot(
            gauges=gauges,
            counters=self.counters,
            request_success=self.request_success,
            histograms=self.histograms,
            lora_requests_info=self.lora_requests_info,
        )


# --- parsing ---------------------------------------------------------------------------------


def _kind(value: object) -> str:
    """A JSON value's kind, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    return "array" if isinstance(value, list) else "object"


def _whole(where: str, value: object) -> int:
    """A non-negative whole number (llm-d's ``int``/``int64`` fields)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: expected a non-negative whole number, got {_kind(value)}")
    if value < 0:
        raise ValueError(f"{where}: cannot be negative, got {value}")
    return value


def _number(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: expected a number, got {_kind(value)}")
    return float(value)


def _gauge(key: str, value: object, whole: bool, unit: bool) -> float | ValueFunction:
    """A fixed number (or numeric text, as llm-d's YAML reads it) or ``func:start:end:period``
    (config_fake_metrics.go:162-200, checks 234-263 and 370-385)."""
    if isinstance(value, str) and _NUMBER_RE.fullmatch(value.strip()):
        value = float(value)
    spec: float | ValueFunction
    if isinstance(value, str):
        spec = _function(key, value, whole)
        what, bounds = "start and end", (spec.start, spec.end)
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key}: expected a number or func:start:end:period, got {_kind(value)}")
    else:
        spec = float(value)
        what, bounds = "the value", (spec, spec)
    if min(bounds) < 0:
        raise ValueError(f"{key}: {what} cannot be negative, got {value!r}")
    if unit and max(bounds) > 1:
        raise ValueError(f"{key}: {what} must be between 0 and 1 (a fraction of the KV cache), got {value!r}")
    return spec


def _function(key: str, text: str, whole: bool) -> ValueFunction:
    parts = text.strip().split(":")
    if len(parts) != 4:
        raise ValueError(f"{key}: expected a number or func:start:end:period (e.g. oscillate:0:10:5s), got {text!r}")
    kind, start, end, period = parts
    if kind not in FUNCTIONS:
        raise ValueError(f"{key}: unknown function {kind!r}; use one of {', '.join(FUNCTIONS)}")
    for name, number in (("start", start), ("end", end)):
        if not _NUMBER_RE.fullmatch(number) or not math.isfinite(float(number)):
            raise ValueError(f"{key}: {name} must be a finite number, got {number!r} in {text!r}")
    return ValueFunction(kind, float(start), float(end), _period_ns(key, period, text), whole)


def _period_ns(key: str, period: str, text: str) -> int:
    """Go's ``time.ParseDuration`` (units required), truncated to whole nanoseconds."""
    if not _DURATION_RE.fullmatch(period):
        raise ValueError(f"{key}: period must be a duration such as 5s or 500ms, got {period!r} in {text!r}")
    total = sum(Fraction(number) * _UNIT_NS[unit] for number, unit in _DURATION_PART_RE.findall(period))
    ns = int(-total if period.startswith("-") else total)
    if ns <= 0:
        raise ValueError(f"{key}: period must be positive, got {period!r} in {text!r}")
    if ns > _MAX_GO_DURATION_NS:  # Go's ParseDuration refuses it too ("invalid duration")
        raise ValueError(f"{key}: period must be at most 2562047h47m16.854775807s, got {period!r} in {text!r}")
    return ns


def _bucket_counts(key: str, value: object, bounds: tuple[float, ...]) -> HistogramSnapshot:
    """Per-bucket counts; missing trailing buckets are 0 (fake_metrics.go:149-180).

    llm-d rejects too long arrays only for TTFT and TPOT (config_fake_metrics.go:265-284)
    and puts the extra counts of the others into ``+Inf``; llmsim rejects them all.
    """
    if not isinstance(value, list):
        raise ValueError(f"{key}: expected an array of per-bucket counts, got {_kind(value)}")
    if len(value) > len(bounds) + 1:
        raise ValueError(f"{key}: {len(value)} counts for {len(bounds) + 1} buckets ({len(bounds)} bounds and +Inf)")
    counts = [_whole(f"{key}[{i}]", count) for i, count in enumerate(value)]
    counts += [0] * (len(bounds) + 1 - len(counts))
    observed = (*bounds, bounds[-1] + 1)
    return HistogramSnapshot(bounds, tuple(counts), math.fsum(c * v for c, v in zip(counts, observed, strict=True)))


def _histograms(data: Mapping[str, object], max_model_len: int) -> dict[str, HistogramSnapshot]:
    token_bounds = request_tokens_buckets(max_model_len)
    wanted = [*_TIME_HISTOGRAMS.items(), *((key, (name, token_bounds)) for key, name in _TOKEN_HISTOGRAMS.items())]
    return {name: _bucket_counts(key, data[key], bounds) for key, (name, bounds) in wanted if key in data}


def _counters(data: Mapping[str, object], histograms: Mapping[str, HistogramSnapshot]) -> dict[str, int]:
    counters: dict[str, int] = {}
    for key, (name, derived_from) in _TOKEN_TOTALS.items():
        if key in data:
            counters[name] = _whole(key, data[key])
        elif derived_from in data:  # sum(count * bound), whole numbers (fake_metrics.go:176)
            counters[name] = int(histograms[_TOKEN_HISTOGRAMS[derived_from]].sum)
    hits, queries = data.get("prefix-cache-hits"), data.get("prefix-cache-queries")
    if (hits is None) != (queries is None):  # config_fake_metrics.go:359-365
        raise ValueError(f"{'prefix-cache-queries' if hits is not None else 'prefix-cache-hits'}: missing; "
                         "prefix-cache-hits and prefix-cache-queries go together")  # fmt: skip
    if hits is not None:
        counters["prefix_cache_hits"] = _whole("prefix-cache-hits", hits)
        counters["prefix_cache_queries"] = _whole("prefix-cache-queries", queries)
        if counters["prefix_cache_hits"] > counters["prefix_cache_queries"]:
            raise ValueError(f"prefix-cache-hits: cannot exceed prefix-cache-queries ({hits} > {queries})")
    return counters


def _request_success(value: object) -> dict[str, int]:
    """Counts by finish reason, vLLM's reasons filled in with 0 (config_fake_metrics.go:285-301)."""
    if not isinstance(value, dict):
        raise ValueError(f"request-success-total: expected an object of counts by finish reason, got {_kind(value)}")
    known = (*_VLLM_FINISH_REASONS, *_LLMD_FINISH_REASONS)
    counts = dict.fromkeys(_VLLM_FINISH_REASONS, 0)
    for reason, count in value.items():
        if reason not in known:
            raise ValueError(f"request-success-total.{reason}: unknown finish reason; use one of {', '.join(known)}")
        counts[reason] = _whole(f"request-success-total.{reason}", count)
    return counts


def _loras(value: object) -> tuple[LoraInfo, ...]:
    """Objects ``{running, waiting, timestamp}``, or (llm-d's YAML form) JSON text of one."""
    if not isinstance(value, list):
        raise ValueError(f"loras: expected an array of {{running, waiting, timestamp}}, got {_kind(value)}")
    return tuple(_lora(f"loras[{i}]", item) for i, item in enumerate(value))


def _lora(where: str, item: object) -> LoraInfo:
    if isinstance(item, str):
        try:
            item = json.loads(item)
        except ValueError as exc:
            raise ValueError(f"{where}: not a JSON object: {exc}") from None
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected an object {{running, waiting, timestamp}}, got {_kind(item)}")
    for key in item:
        if key not in _LORA_KEYS:
            raise ValueError(f"{where}.{key}: unknown key; the keys are {', '.join(_LORA_KEYS)}")
    timestamp = item.get("timestamp")
    return LoraInfo(
        running=_text(f"{where}.running", item.get("running")),
        waiting=_text(f"{where}.waiting", item.get("waiting")),
        timestamp=0.0 if timestamp is None else _number(f"{where}.timestamp", timestamp),
    )


def _text(where: str, value: object) -> str:
    """Comma-separated adapter names; missing is empty, as in Go."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected comma-separated LoRA names, got {_kind(value)}")
    return value
