"""Fake metrics (``--fake-metrics``): parsing, value functions, refresh ticks, histograms.

Expected values are computed by hand from llm-d-inference-sim's code:
``pkg/llm-d-inference-sim/fake_metrics.go`` (generators 106-144, ``initFakeHistogram``
149-180, ticker 66-90) and ``pkg/common/config_fake_metrics.go`` (parsing and checks).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmsim.config import load_config
from llmsim.engine.fake_metrics import FakeMetrics, FakeMetricsSnapshot, LoraInfo
from llmsim.engine.metric_buckets import (
    INTER_TOKEN_LATENCY_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TIME_TO_FIRST_TOKEN_BUCKETS,
)

FINE = 1e-9  # a refresh interval of 1 ns: the snapshot is the function's value at `elapsed`


def parse(config: dict[str, object], max_model_len: int = 1024) -> FakeMetrics:
    return FakeMetrics.from_json(json.dumps(config), max_model_len=max_model_len)


def at(config: dict[str, object], elapsed: float, refresh: float = FINE) -> FakeMetricsSnapshot:
    return parse(config).snapshot(elapsed, refresh)


def gauge(spec: str | float, elapsed: float, *, key: str = "waiting-requests", refresh: float = FINE) -> float:
    name = {"running-requests": "num_requests_running", "waiting-requests": "num_requests_waiting"}
    return at({key: spec}, elapsed, refresh).gauges[name.get(key, "kv_cache_usage_perc")]


# --- gauges: fixed values and functions ------------------------------------------------------


def test_fixed_gauges_are_reported_as_given_at_any_time() -> None:
    """pkg/tests/fake_metrics_test.go "Should respond with fake metrics": 10, 30, 0.4."""
    fake = parse({"running-requests": 10, "waiting-requests": 30, "kv-cache-usage": 0.4})
    for elapsed in (0.0, 0.05, 7.3, 1e6):
        assert fake.snapshot(elapsed, 0.1).gauges == {
            "num_requests_running": 10.0,
            "num_requests_waiting": 30.0,
            "kv_cache_usage_perc": 0.4,
        }


def test_a_fixed_value_may_be_numeric_text_as_llmd_reads_yaml() -> None:
    """UnmarshalYAML tries ParseFloat first (config_fake_metrics.go:162-176)."""
    assert gauge("12", 0.0) == 12.0


@pytest.mark.parametrize(
    ("elapsed", "expected"),
    [
        (0.0, 5.0),  # mid = (0 + 10) / 2
        (0.5, 8.0),  # 5 + 5 sin(pi/4) = 8.53..., truncated to a whole request
        (1.0, 10.0),  # 5 + 5 sin(pi/2)
        (2.0, 5.0),  # 5 + 5 sin(pi) = 5.0000000000000006 -> 5
        (3.0, 0.0),  # 5 + 5 sin(3pi/2) = 0
        (5.0, 10.0),  # the next period
    ],
)
def test_oscillate_is_a_sine_of_one_period_around_the_middle(elapsed: float, expected: float) -> None:
    """oscillate: mid + amp * sin(2 pi t / period) (fake_metrics.go:106-112), int64() for requests (78-81)."""
    assert gauge("oscillate:0:10:4s", elapsed) == expected


def test_request_gauges_truncate_like_go_int64() -> None:
    """sin(2 pi) is -2.4e-16 in float64, so oscillate:1:5:1s at 1 s is 2.9999999999999996 and
    llm-d's int64() makes it 2, not 3 (fake_metrics.go:78-81)."""
    assert gauge("oscillate:1:5:1s", 1.0, key="running-requests") == 2.0
    assert gauge("oscillate:1:5:1s", 0.5, key="running-requests") == 3.0  # 3.0000000000000004


def test_kv_cache_usage_is_not_truncated() -> None:
    assert gauge("oscillate:0.2:0.6:2s", 0.5, key="kv-cache-usage") == pytest.approx(0.6)  # 0.4 + 0.2 sin(pi/2)
    assert gauge("oscillate:0.2:0.6:2s", 0.25, key="kv-cache-usage") == pytest.approx(0.4 + 0.2 * math.sqrt(0.5))


@pytest.mark.parametrize(
    ("elapsed", "expected"),
    [(0.0, 10.0), (2.0, 6.0), (4.9, 0.0), (5.0, 0.0), (60.0, 0.0)],  # 10 - 10 * t/5; 4.9 -> 0.2 -> 0
)
def test_ramp_goes_from_start_to_end_once_then_stays(elapsed: float, expected: float) -> None:
    """ramp: start + (t / period) (end - start), end once t >= period (fake_metrics.go:114-121)."""
    assert gauge("ramp:10:0:5s", elapsed) == expected


def test_ramp_of_the_kv_cache() -> None:
    """pkg/tests/fake_metrics_test.go: ramp:0:1:700ms grows, and is 1 from 700 ms on."""
    assert gauge("ramp:0:1:700ms", 0.2, key="kv-cache-usage") == pytest.approx(0.2 / 0.7)
    assert gauge("ramp:0:1:700ms", 0.7, key="kv-cache-usage") == 1.0
    assert gauge("ramp:0:1:700ms", 0.8, key="kv-cache-usage") == 1.0


@pytest.mark.parametrize(
    ("elapsed", "expected"),
    [
        (0.0, 1.0),
        (0.2, 1 - 200 / 550),
        (0.549, 1 - 549 / 550),
        (0.55, 1.0),  # (t % period) = 0: back to start
        (0.6, 1 - 50 / 550),
        (1.2, 1 - 100 / 550),
    ],
)
def test_rampreset_restarts_the_ramp_every_period(elapsed: float, expected: float) -> None:
    """rampreset: start + ((t % period) / period) (end - start) (fake_metrics.go:123-133);
    pkg/tests/fake_metrics_test.go uses rampreset:1:0:550ms."""
    assert gauge("rampreset:1:0:550ms", elapsed, key="kv-cache-usage") == pytest.approx(expected)


@pytest.mark.parametrize(
    ("elapsed", "expected"),
    [(0.0, 10.0), (0.199, 10.0), (0.2, 15.0), (0.399, 15.0), (0.4, 10.0), (0.6, 15.0), (100.0, 10.0)],
)
def test_squarewave_holds_start_then_end_for_half_a_period_each(elapsed: float, expected: float) -> None:
    """squarewave: start while t % period < period / 2, else end (fake_metrics.go:135-144)."""
    assert gauge("squarewave:10:15:400ms", elapsed) == expected


def test_squarewave_halves_an_odd_period_in_whole_nanoseconds() -> None:
    """Go divides the Duration (int64 ns): a 3 ns period has half = 1 ns."""
    assert [gauge("squarewave:0:1:3ns", t * 1e-9) for t in range(5)] == [0.0, 1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("period", "elapsed", "expected"),
    [("1m30s", 45.0, 45.0), ("1.5s", 0.75, 45.0), ("1500ms", 0.75, 45.0), ("90000000us", 45.0, 45.0)],
)
def test_periods_are_go_durations(period: str, elapsed: float, expected: float) -> None:
    """time.ParseDuration forms; ramp:0:90 is at 45 halfway through."""
    assert gauge(f"ramp:0:90:{period}", elapsed) == expected


# --- refresh ticks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("elapsed", "refresh", "value_at"),
    [
        (0.0, 0.1, 0.0),
        (0.05, 0.1, 0.0),  # before the first tick: the value set at start-up, f(0)
        (0.1, 0.1, 0.1),
        (0.2999, 0.1, 0.2),
        (0.3, 0.1, 0.3),  # 0.3 / 0.1 is 2.9999999999999996 in floats; whole nanoseconds get it right
        (0.35, 0.1, 0.3),
        (0.74, 0.25, 0.5),
        (0.75, 0.25, 0.75),
    ],
)
def test_functions_change_only_on_refresh_ticks(elapsed: float, refresh: float, value_at: float) -> None:
    """llm-d's ticker recomputes at k * interval and the gauge holds until the next tick
    (fake_metrics.go:66-90); ramp:0:1:1s shows the time it was computed at."""
    assert gauge("ramp:0:1:1s", elapsed, key="kv-cache-usage", refresh=refresh) == pytest.approx(value_at)


def test_snapshot_rejects_a_bad_clock() -> None:
    fake = parse({})
    with pytest.raises(ValueError, match="elapsed"):
        fake.snapshot(-1.0, 0.1)
    with pytest.raises(ValueError, match="refresh_interval"):
        fake.snapshot(1.0, 0.0)


# --- histograms --------------------------------------------------------------------------------


def test_bucket_values_are_per_bucket_counts_observed_at_the_upper_bound() -> None:
    """ttft [1, 2, 3]: le=0.001 -> 1, le=0.005 -> 3, le=0.01 -> 6, then 6 up to +Inf
    (pkg/tests/fake_metrics_test.go); _sum = 1*0.001 + 2*0.005 + 3*0.01 (initFakeHistogram)."""
    ttft = parse({"ttft-buckets-values": [1, 2, 3]}).snapshot(0.0, 0.1).histograms["time_to_first_token_seconds"]
    assert ttft.bounds == TIME_TO_FIRST_TOKEN_BUCKETS
    assert ttft.counts == (1, 2, 3) + (0,) * 20
    assert ttft.cumulative() == (1, 3) + (6,) * 21
    assert ttft.count == 6
    assert ttft.sum == pytest.approx(0.041)


def test_the_last_count_is_the_inf_bucket_observed_at_the_last_bound_plus_one() -> None:
    """pkg/tests/fake_metrics_test.go "fake ttft metrics": 22 zeros then 1 -> only +Inf; the
    observed value is 2560 + 1 (fake_metrics.go:166-169)."""
    ttft = parse({"ttft-buckets-values": [0] * 22 + [1]}).histograms["time_to_first_token_seconds"]
    assert ttft.cumulative() == (0,) * 22 + (1,)
    assert ttft.sum == 2561.0


@pytest.mark.parametrize(
    ("key", "name", "bounds"),
    [
        ("tpot-buckets-values", "inter_token_latency_seconds", INTER_TOKEN_LATENCY_BUCKETS),
        ("request-tpot-buckets-values", "request_time_per_output_token_seconds", INTER_TOKEN_LATENCY_BUCKETS),
        ("e2erl-buckets-values", "e2e_request_latency_seconds", REQUEST_LATENCY_BUCKETS),
        ("queue-time-buckets-values", "request_queue_time_seconds", REQUEST_LATENCY_BUCKETS),
        ("inf-time-buckets-values", "request_inference_time_seconds", REQUEST_LATENCY_BUCKETS),
        ("prefill-time-buckets-values", "request_prefill_time_seconds", REQUEST_LATENCY_BUCKETS),
        ("decode-time-buckets-values", "request_decode_time_seconds", REQUEST_LATENCY_BUCKETS),
    ],
)
def test_each_bucket_key_feeds_its_vllm_histogram(key: str, name: str, bounds: tuple[float, ...]) -> None:
    """[0, 1, 2] -> cumulative 0, 1, 3, 3, ... (pkg/tests/fake_metrics_test.go "fake latency metrics")."""
    histogram = parse({key: [0, 1, 2]}).histograms[name]
    assert histogram.bounds == bounds
    assert histogram.cumulative() == (0, 1) + (3,) * (len(bounds) - 1)
    assert histogram.sum == pytest.approx(bounds[1] + 2 * bounds[2])


TOKEN_KEYS = {
    "request-prompt-tokens": "request_prompt_tokens",
    "request-generation-tokens": "request_generation_tokens",
    "request-max-generation-tokens": "request_max_num_generation_tokens",
    "request-params-max-tokens": "request_params_max_tokens",
}


def test_token_arrays_are_bucket_counts_on_the_1_2_5_bounds_and_give_the_totals() -> None:
    """pkg/tests/fake_metrics_test.go: [10, 20, 30] with max-model-len 1024 -> le=1: 10, le=2: 30,
    then 60; the totals are 10*1 + 20*2 + 30*5 = 200."""
    fake = parse({key: [10, 20, 30] for key in TOKEN_KEYS})
    for name in TOKEN_KEYS.values():
        histogram = fake.histograms[name]
        assert histogram.bounds == (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
        assert histogram.cumulative() == (10, 30) + (60,) * 9
        assert histogram.sum == 200
    assert fake.counters == {"prompt_tokens": 200, "generation_tokens": 200}


def test_a_token_count_in_inf_is_taken_as_the_last_bound_plus_one() -> None:
    """fake_metrics_test.go (unit) "three finite buckets + last (+Inf) bucket", on the bounds
    of max-model-len 5 (1, 2, 5): 1 + 2 + 5 + 6 = 14."""
    fake = parse({"request-prompt-tokens": [1, 1, 1, 1]}, max_model_len=5)
    assert fake.histograms["request_prompt_tokens"].counts == (1, 1, 1, 1)
    assert fake.counters == {"prompt_tokens": 14}


def test_explicit_totals_override_the_derived_ones() -> None:
    """pkg/tests/fake_metrics_test.go "Should use TotalPromptTokens and TotalGenerationTokens"."""
    fake = parse({
        "request-prompt-tokens": [100, 200],
        "request-generation-tokens": [50, 150],
        "total-prompt-tokens": 12345,
        "total-generation-tokens": 67890,
    })  # fmt: skip
    assert fake.counters == {"prompt_tokens": 12345, "generation_tokens": 67890}
    assert fake.histograms["request_prompt_tokens"].counts[:2] == (100, 200)
    assert parse({"total-prompt-tokens": 7}).histograms == {}


def test_an_empty_array_is_a_histogram_of_zeros() -> None:
    fake = parse({"e2erl-buckets-values": [], "request-generation-tokens": []})
    assert fake.histograms["e2e_request_latency_seconds"].count == 0
    assert fake.counters == {"generation_tokens": 0}


# --- counters and LoRA --------------------------------------------------------------------------


def test_request_success_fills_in_vllm_finish_reasons_with_zero() -> None:
    """llm-d fills its required reasons with 0 (config_fake_metrics.go:296-300); vLLM shows its
    five from start-up (vllm/v1/metrics/loggers.py:807-819).  llm-d's own reasons are accepted."""
    fake = parse({"request-success-total": {"stop": 20, "tool_calls": 3}})
    assert fake.request_success == {"stop": 20, "length": 0, "abort": 0, "error": 0, "repetition": 0, "tool_calls": 3}


@pytest.mark.parametrize(("hits", "queries"), [(750, 2000), (0, 0), (500, 500)])
def test_prefix_cache_counters(hits: int, queries: int) -> None:
    fake = parse({"prefix-cache-hits": hits, "prefix-cache-queries": queries})
    assert fake.counters == {"prefix_cache_hits": hits, "prefix_cache_queries": queries}


def test_loras_are_objects_or_llmd_yaml_json_text() -> None:
    """llm-d's JSON takes objects and its YAML takes JSON text (config_fake_metrics.go:40,
    220-232); missing fields are empty / 0 as Go leaves them."""
    fake = parse({"loras": [
        {"running": "lora4,lora2", "waiting": "lora3", "timestamp": 1257894567},
        '{"running":"lora4,lora3","waiting":"","timestamp":1257894569}',
        {"running": "lora1"},
    ]})  # fmt: skip
    assert fake.lora_requests_info == (
        LoraInfo("lora4,lora2", "lora3", 1257894567.0),
        LoraInfo("lora4,lora3", "", 1257894569.0),
        LoraInfo("lora1", "", 0.0),
    )
    assert parse({"loras": []}).lora_requests_info == ()


def test_only_the_keys_given_are_faked_and_null_is_absent() -> None:
    snapshot = at({"running-requests": None, "loras": None}, 1.0)
    assert snapshot == FakeMetricsSnapshot(
        gauges={}, counters={}, request_success=None, histograms={}, lora_requests_info=None
    )


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"running-request": 1}, "running-request: unknown key"),
        ({"running-requests": -1}, "running-requests: the value cannot be negative"),
        ({"waiting-requests": True}, "waiting-requests: expected a number or func:start:end:period, got boolean"),
        ({"waiting-requests": [1]}, "waiting-requests: expected a number or func:start:end:period, got array"),
        ({"kv-cache-usage": 1.5}, "kv-cache-usage: the value must be between 0 and 1"),
        ({"kv-cache-usage": "ramp:0:2:1s"}, "kv-cache-usage: start and end must be between 0 and 1"),
        ({"running-requests": "oscillate:0:10"}, "running-requests: expected a number or func:start:end:period"),
        ({"running-requests": "sine:0:10:1s"}, "running-requests: unknown function 'sine'"),
        ({"running-requests": "ramp:x:10:1s"}, "running-requests: start must be a finite number, got 'x'"),
        ({"running-requests": "ramp:0:inf:1s"}, "running-requests: end must be a finite number"),
        ({"running-requests": "oscillate:1e309:0:1s"}, "running-requests: start must be a finite number"),
        ({"running-requests": "ramp:0:1:" + "9" * 40 + "s"}, "running-requests: period must be at most"),
        ({"running-requests": "ramp:-1:10:1s"}, "running-requests: start and end cannot be negative"),
        ({"running-requests": "ramp:0:10:5"}, "running-requests: period must be a duration such as 5s"),
        ({"running-requests": "ramp:0:10:5sec"}, "running-requests: period must be a duration"),
        ({"running-requests": "ramp:0:10:0s"}, "running-requests: period must be positive"),
        ({"running-requests": "ramp:0:10:-1s"}, "running-requests: period must be positive"),
        ({"ttft-buckets-values": [0] * 24}, "ttft-buckets-values: 24 counts for 23 buckets"),
        ({"tpot-buckets-values": [0] * 21}, "tpot-buckets-values: 21 counts for 20 buckets"),
        ({"e2erl-buckets-values": [0] * 23}, "e2erl-buckets-values: 23 counts for 22 buckets"),
        ({"request-prompt-tokens": [0] * 12}, "request-prompt-tokens: 12 counts for 11 buckets"),
        ({"ttft-buckets-values": [1, -1]}, r"ttft-buckets-values\[1\]: cannot be negative"),
        ({"decode-time-buckets-values": [1.5]}, r"decode-time-buckets-values\[0\]: expected a non-negative whole"),
        ({"request-generation-tokens": {"a": 1}}, "request-generation-tokens: expected an array"),
        ({"request-params-max-tokens": [-3]}, r"request-params-max-tokens\[0\]: cannot be negative"),
        ({"total-prompt-tokens": -1}, "total-prompt-tokens: cannot be negative"),
        ({"total-generation-tokens": "5"}, "total-generation-tokens: expected a non-negative whole number"),
        ({"request-success-total": {"done": 1}}, "request-success-total.done: unknown finish reason"),
        ({"request-success-total": {"stop": -1}}, "request-success-total.stop: cannot be negative"),
        ({"request-success-total": [1]}, "request-success-total: expected an object"),
        ({"prefix-cache-hits": 5}, "prefix-cache-queries: missing; prefix-cache-hits and prefix-cache-queries go"),
        ({"prefix-cache-queries": 5}, "prefix-cache-hits: missing"),
        ({"prefix-cache-hits": 6, "prefix-cache-queries": 5}, r"prefix-cache-hits: cannot exceed .* \(6 > 5\)"),
        ({"prefix-cache-hits": -1, "prefix-cache-queries": 5}, "prefix-cache-hits: cannot be negative"),
        ({"loras": {"running": "a"}}, "loras: expected an array"),
        ({"loras": [{"running": "a", "max": 1}]}, r"loras\[0\].max: unknown key"),
        ({"loras": [{"running": 1}]}, r"loras\[0\].running: expected comma-separated LoRA names"),
        ({"loras": [{"timestamp": "now"}]}, r"loras\[0\].timestamp: expected a number"),
        ({"loras": ["{not json"]}, r"loras\[0\]: not a JSON object"),
        ({"loras": [3]}, r"loras\[0\]: expected an object"),
    ],
)
def test_invalid_configurations_name_the_key_and_why(config: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(config)


@pytest.mark.parametrize(("text", "message"), [("[1]", "expected a JSON object, got array"), ("{", "not valid JSON")])
def test_the_text_must_be_a_json_object(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FakeMetrics.from_json(text, max_model_len=1024)


def test_max_model_len_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        FakeMetrics.from_json("{}", max_model_len=0)


# --- from the configuration ---------------------------------------------------------------------

DOCS = Path(__file__).parents[2] / "docs" / "configuration.md"


def docs_examples() -> tuple[str, str]:
    """The YAML file and the ``--fake-metrics`` JSON of docs/configuration.md "Fake metrics"."""
    section = DOCS.read_text().split("## Fake metrics", 1)[1].split("\n## ", 1)[0]
    command = section.split("```sh\n", 1)[1].split("```", 1)[0]
    yaml_text = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    return command.split("--fake-metrics ", 1)[1].strip().strip("'"), yaml_text


def test_the_docs_examples_load(tmp_path: Path) -> None:
    """docs/configuration.md "Fake metrics": the YAML file and the flag, through the config loader."""
    flag, yaml_text = docs_examples()
    path = tmp_path / "llmsim.yaml"
    path.write_text(yaml_text)
    from_yaml = load_config(config_path=str(path), environ={})
    assert from_yaml.control.fake_metrics is not None
    fake = FakeMetrics.from_json(from_yaml.control.fake_metrics, max_model_len=from_yaml.model.max_model_len)
    snapshot = fake.snapshot(90.5, from_yaml.control.fake_metrics_refresh_interval)  # the 90 s tick
    assert snapshot.gauges == {
        "num_requests_running": 16.0,
        "num_requests_waiting": 2.0,  # 2.5 + 2.5 sin(180 pi), truncated
        "kv_cache_usage_perc": pytest.approx(0.9 * 90 / 600),
    }
    assert snapshot.histograms["time_to_first_token_seconds"].cumulative()[:5] == (10, 30, 60, 70, 70)
    assert snapshot.counters == {
        "prompt_tokens": 10 * 1 + 20 * 2 + 30 * 5 + 15 * 10,
        "prefix_cache_hits": 750,
        "prefix_cache_queries": 2000,
    }
    assert snapshot.request_success == {"stop": 20, "length": 2, "abort": 0, "error": 0, "repetition": 0}
    assert snapshot.lora_requests_info == (LoraInfo("lora1,lora2", "lora3", 1257894567.0),)

    from_flag = load_config({"fake-metrics": flag}, environ={})
    assert from_flag.control.fake_metrics is not None
    fake = FakeMetrics.from_json(from_flag.control.fake_metrics, max_model_len=1024)
    snapshot = fake.snapshot(1.3, 0.25)  # at the tick of 1.25 s: 5 + 5 sin(pi/2)
    assert snapshot.gauges == {"num_requests_running": 10.0, "num_requests_waiting": 30.0, "kv_cache_usage_perc": 0.4}
    assert snapshot.lora_requests_info == (LoraInfo("lora1", "lora2", 1257894567.0),)
