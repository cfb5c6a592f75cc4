"""vLLM 0.33's histogram bucket bounds (``vllm/v1/metrics/buckets.py``), one family each.

Every histogram of ``/metrics`` takes its upper bounds from one of these families, as
vLLM's Prometheus stat logger does (``vllm/v1/metrics/loggers.py:822-841``); the
``+Inf`` bucket is implied.
"""

from __future__ import annotations

__all__ = [
    "INTER_TOKEN_LATENCY_BUCKETS",
    "ITERATION_TOKENS_BUCKETS",
    "REQUEST_LATENCY_BUCKETS",
    "REQUEST_NUM_PREEMPTIONS_BUCKETS",
    "REQUEST_PARAMS_N_BUCKETS",
    "TIME_TO_FIRST_TOKEN_BUCKETS",
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
