"""vLLM 0.33's histogram bucket bounds (``vllm/v1/metrics/buckets.py``), one family each.

Every histogram of ``/metrics`` takes its upper bounds from one of these families, as
vLLM's Prometheus stat logger does (``vllm/v1/metrics/loggers.py:822-841``); the
``+Inf`` bucket is implied.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from itertools import pairwise

__all__ = [
    "BUCKET_FAMILIES",
    "INTER_TOKEN_LATENCY_BUCKETS",
    "ITERATION_TOKENS_BUCKETS",
    "REQUEST_LATENCY_BUCKETS",
    "REQUEST_NUM_PREEMPTIONS_BUCKETS",
    "REQUEST_PARAMS_N_BUCKETS",
    "TIME_TO_FIRST_TOKEN_BUCKETS",
    "BucketBounds",
    "bucket_bounds",
    "parse_custom_buckets",
    "request_tokens_buckets",
]

#: e2e, queue, inference, prefill and decode time of a request (seconds; buckets.py:30-52).
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
#: Time to first token (seconds; buckets.py:57-80).
TIME_TO_FIRST_TOKEN_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
#: Inter-token latency and a request's mean time per output token (seconds; buckets.py:84-104).
INTER_TOKEN_LATENCY_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
#: Tokens per engine step (buckets.py:107-121).
ITERATION_TOKENS_BUCKETS: tuple[float, ...] = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: The ``n`` sampling parameter (buckets.py:125).
REQUEST_PARAMS_N_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20)
#: Preemptions of one request (buckets.py:128).
REQUEST_NUM_PREEMPTIONS_BUCKETS: tuple[float, ...] = (1, 2, 3, 4, 5, 10, 20)


def request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """Token counts of a request: the 1-2-5 series up to ``max_model_len`` (buckets.py:170-210)."""
    bounds: list[float] = []
    power = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * power
            if value > max_model_len:
                return tuple(bounds)
            bounds.append(value)
        power *= 10


#: vLLM's bucket families (``buckets.py:15-24``); ``request_tokens`` depends on the context window.
BUCKET_FAMILIES = (
    "request_latency",
    "time_to_first_token",
    "inter_token_latency",
    "iteration_tokens",
    "request_params_n",
    "request_num_preemptions",
    "request_tokens",
    "kv_cache_residency",
)
_STATIC: dict[str, tuple[float, ...]] = {
    "request_latency": REQUEST_LATENCY_BUCKETS,
    "time_to_first_token": TIME_TO_FIRST_TOKEN_BUCKETS,
    "inter_token_latency": INTER_TOKEN_LATENCY_BUCKETS,
    "iteration_tokens": ITERATION_TOKENS_BUCKETS,
    "request_params_n": REQUEST_PARAMS_N_BUCKETS,
    "request_num_preemptions": REQUEST_NUM_PREEMPTIONS_BUCKETS,
}

#: ``--custom-histogram-buckets`` read: upper bounds by family.
BucketBounds = Mapping[str, tuple[float, ...]]


def bucket_bounds(family: str, max_model_len: int, overrides: BucketBounds | None = None) -> tuple[float, ...]:
    """A family's upper bounds: the override if given, else vLLM's (``buckets.py:213-240``)."""
    if overrides is not None and family in overrides:
        return overrides[family]
    if family == "request_tokens":
        return request_tokens_buckets(max_model_len)
    return _STATIC[family]


def parse_custom_buckets(text: str) -> dict[str, tuple[float, ...]]:
    """``--custom-histogram-buckets`` (a JSON object) checked as vLLM's
    ``ObservabilityConfig`` checks it (``vllm/config/observability.py:167-214``), with its
    messages; ``ValueError`` otherwise."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("custom_histogram_buckets: expected a JSON object of bucket lists")
    parsed: dict[str, tuple[float, ...]] = {}
    for family, buckets in value.items():
        if family not in BUCKET_FAMILIES:
            raise ValueError(
                f"custom_histogram_buckets: unknown bucket family {family!r}; known families: {sorted(BUCKET_FAMILIES)}"
            )
        if not isinstance(buckets, list) or not all(
            isinstance(bound, (int, float)) and not isinstance(bound, bool) for bound in buckets
        ):
            raise ValueError(f"custom_histogram_buckets[{family!r}]: expected a list of numbers, got {buckets!r}")
        if not buckets:
            raise ValueError(f"custom_histogram_buckets[{family!r}]: bucket list must not be empty")
        for bound in buckets:
            if not math.isfinite(bound) or bound <= 0:
                raise ValueError(
                    f"custom_histogram_buckets[{family!r}]: bound {bound!r} must be finite and greater than 0"
                )
        if any(a >= b for a, b in pairwise(buckets)):
            raise ValueError(f"custom_histogram_buckets[{family!r}]: bounds {buckets} must be strictly increasing")
        parsed[family] = tuple(float(bound) for bound in buckets)
    return parsed
