"""vLLM's request and iteration statistics, recorded from the engine's own events.

The engine calls :class:`EngineMetrics` as things happen to its jobs (admission, first
token, every later output, finish, an admission refused) and at the end of each step;
``/metrics`` reads a :meth:`EngineMetrics.snapshot` at scrape time.  Recording is
plain integer and float arithmetic on lists (a histogram is its bucket counts and a
sum); nothing is formatted until somebody scrapes.

What is recorded follows vLLM 0.33's ``IterationStats`` and ``PrometheusStatLogger``
(``vllm/v1/metrics/stats.py:474-645``, ``vllm/v1/metrics/loggers.py:1138-1330``):

* time to first token: first output - arrival (``stats.py:524-528``);
* inter-token latency: one sample per later output of a job, the time since its
  previous output, however many tokens the output carried (``stats.py:552-556``);
* per finished job: e2e (finish - arrival), queue (admitted - arrival), prefill
  (first token - admitted), decode (last token - first token), inference (last token
  - admitted), mean time per output token (decode / (tokens - 1), 0 for one token),
  prompt and generation token counts, ``max_tokens``, preemptions (always 0 here) and
  the prompt tokens computed (not cached) (``stats.py:585-645``, ``loggers.py:1284-1330``);
* per request (all its ``n`` choices finished): ``n`` and the most tokens a choice
  generated (``parallel_sampling.py:137-152``);
* per engine step that produced tokens: prompt tokens computed for the jobs whose
  first token it produced plus the tokens it generated (``loggers.py:1262-1265``).

A job the engine ended (sleep ``mode=abort``, :meth:`EngineMetrics.aborted`) is a finished
request with reason ``abort``.  A job cancelled because its client left is not a finished request: vLLM's frontend
drops an aborted request's state before any finish statistics are taken
(``vllm/v1/engine/output_processor.py:599-660``), so only the tokens it had generated
and its time to first token count.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left

import attrs

from llmsim.engine.job import Job
from llmsim.engine.metric_buckets import BucketBounds, bucket_bounds

__all__ = [
    "ADMISSION_REASONS",
    "FINISH_REASONS",
    "EngineMetrics",
    "Histogram",
    "HistogramSnapshot",
    "MetricsSnapshot",
]

#: vLLM's ``FinishReason`` names (``vllm/v1/engine/__init__.py:37``): every one has a
#: ``request_success`` series, counted or not.
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
#: vLLM's reasons for refusing a request at admission (``vllm/v1/metrics/loggers.py:47``).
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
#: The engine's reason for an API-level one: a tool call ends on the model's EOS like any
#: answer (the API layer renames it), and a P/D prefill side stops at its one token.
#: Others are their own (llm-d-inference-sim counts ``cache_threshold``).
_ENGINE_FINISH_REASONS = {"tool_calls": "stop", "remote_decode": "length"}


@attrs.frozen
class HistogramSnapshot:
    """A histogram's state: ``counts[i]`` observations fell in bucket ``i`` (at most
    ``bounds[i]``, above the bound before); the last count is the ``+Inf`` bucket."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> tuple[int, ...]:
        """Observations at most each bound, then the total (Prometheus's ``le`` buckets)."""
        return tuple(itertools.accumulate(self.counts))


class Histogram:
    """Bucket counts and a sum: what ``observe`` costs is one bisect and two additions.
    The engine's per-token path updates :attr:`counts` and :attr:`sum` inline."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(self.bounds, tuple(self.counts), self.sum)


@attrs.frozen
class MetricsSnapshot:
    """Everything :class:`EngineMetrics` recorded, at one moment.  Histograms are keyed
    by their vLLM name without the ``vllm:`` prefix; counters are totals since start."""

    request_success: dict[str, int]
    admission_rejections: dict[str, int]
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens_cached: int
    prompt_tokens_computed: int
    histograms: dict[str, HistogramSnapshot]


class EngineMetrics:
    """The statistics of one engine (see the module docstring for what each one is).

    ``max_model_len`` bounds the token-count histograms' buckets, as in vLLM (the
    default is ``--max-model-len``'s); ``buckets`` replaces families' bounds
    (``--custom-histogram-buckets``).
    """

    def __init__(self, max_model_len: int = 32768, buckets: BucketBounds | None = None) -> None:
        def bounds(family: str) -> tuple[float, ...]:
            return bucket_bounds(family, max_model_len, buckets)

        tokens = bounds("request_tokens")
        latency = bounds("request_latency")
        itl = bounds("inter_token_latency")
        self.request_success = dict.fromkeys(FINISH_REASONS, 0)
        self.admission_rejections = dict.fromkeys(ADMISSION_REASONS, 0)
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.prompt_tokens_cached = 0
        self.prompt_tokens_computed = 0
        self.time_to_first_token = Histogram(bounds("time_to_first_token"))
        self.inter_token_latency = Histogram(itl)
        self.iteration_tokens = Histogram(bounds("iteration_tokens"))
        self._histograms = {
            "time_to_first_token_seconds": self.time_to_first_token,
            "inter_token_latency_seconds": self.inter_token_latency,
            "iteration_tokens_total": self.iteration_tokens,
            "request_time_per_output_token_seconds": Histogram(itl),
            "e2e_request_latency_seconds": Histogram(latency),
            "request_queue_time_seconds": Histogram(latency),
            "request_inference_time_seconds": Histogram(latency),
            "request_prefill_time_seconds": Histogram(latency),
            "request_decode_time_seconds": Histogram(latency),
            "request_prompt_tokens": Histogram(tokens),
            "request_generation_tokens": Histogram(tokens),
            "request_max_num_generation_tokens": Histogram(tokens),
            "request_params_n": Histogram(bounds("request_params_n")),
            "request_params_max_tokens": Histogram(tokens),
            "request_num_preemptions": Histogram(bounds("request_num_preemptions")),
            "request_prefill_kv_computed_tokens": Histogram(tokens),
        }
        # Prompt tokens computed for the jobs that got their first token in the step
        # under way (iteration_tokens_total counts them with the step's output).
        self._step_prompt_tokens = 0
        # What finished() observes, in the order of its values.
        self._per_job = tuple(
            self._histograms[name]
            for name in (
                "e2e_request_latency_seconds",
                "request_queue_time_seconds",
                "request_prefill_time_seconds",
                "request_inference_time_seconds",
                "request_decode_time_seconds",
                "request_prefill_kv_computed_tokens",
                "request_prompt_tokens",
                "request_generation_tokens",
                "request_time_per_output_token_seconds",
            )
        )
        preemptions = self._histograms["request_num_preemptions"]
        # Every job has 0 preemptions: always this bucket (and the sum stays 0).
        self._preemptions = (preemptions.counts, bisect_left(preemptions.bounds, 0))

    # --- events (called by the engine) -----------------------------------------------------

    def admission_rejected(self, reason: str) -> None:
        self.admission_rejections[reason] += 1

    def admitted(self, job: Job) -> None:
        """A job got a running slot: its prompt is looked up in the prefix cache."""
        self.prefix_cache_queries += len(job.prompt_token_ids)
        self.prefix_cache_hits += job.cached_tokens

    def first_token(self, job: Job, now: float) -> None:
        prompt_tokens = len(job.prompt_token_ids)
        cached = min(job.cached_tokens, prompt_tokens)
        self.time_to_first_token.observe(now - job.arrival_time)
        self.prompt_tokens_cached += cached
        self.prompt_tokens_computed += prompt_tokens - cached
        self._step_prompt_tokens += prompt_tokens - cached

    def step_done(self, generated: int) -> None:
        """An engine step handed out ``generated`` tokens."""
        tokens = generated + self._step_prompt_tokens
        self._step_prompt_tokens = 0
        if tokens:
            self.iteration_tokens.observe(tokens)

    def finished(self, job: Job, now: float) -> None:
        """``job`` produced its last token at ``now``.  (Once per request: the
        observations are inlined, :meth:`Histogram.observe` in a loop.)"""
        arrival = job.arrival_time
        admitted = job.admitted_time if job.admitted_time is not None else now  # aborted while waiting
        first = job.first_token_time if job.first_token_time is not None else now
        generated = job.emitted
        prompt_tokens = len(job.prompt_token_ids)
        cached = job.cached_tokens
        decode = now - first
        reason = _ENGINE_FINISH_REASONS.get(job.finish_reason, job.finish_reason)
        self.request_success[reason] = self.request_success.get(reason, 0) + 1
        values = (
            now - arrival,
            admitted - arrival,
            first - admitted,
            now - admitted,
            decode,
            prompt_tokens - cached if cached > 0 else prompt_tokens,  # a test: max() is a costly call
            prompt_tokens,
            generated,
            decode / (generated - 1) if generated > 1 else 0.0,
        )
        # No strict=: given a keyword, zip() parses its arguments the slow way (~1,500
        # instructions, as much as this loop's bookkeeping); both tuples are nine long.
        for histogram, value in zip(self._per_job, values):  # noqa: B905
            histogram.counts[bisect_left(histogram.bounds, value)] += 1
            histogram.sum += value
        counts, index = self._preemptions
        counts[index] += 1
        if job.max_tokens:
            self._histograms["request_params_max_tokens"].observe(job.max_tokens)
        group = job.group
        if group is None:
            self._request_done(1, generated)
            return
        group.unfinished -= 1
        if generated > group.max_generated:
            group.max_generated = generated
        if group.unfinished == 0:
            self._request_done(group.n, group.max_generated)

    def aborted(self, job: Job, now: float) -> None:
        """The engine ended ``job`` at ``now`` (sleep ``mode=abort``).  vLLM's abort is an
        output without tokens: it counts as the job's first output (a time to first
        token) or as one more (an inter-token latency), ``vllm/v1/metrics/stats.py:509-558``,
        and then the request finished with reason ``abort``
        (``vllm/v1/engine/output_processor.py:868-887``).  A job aborted while waiting
        has its queue time run until the abort (vLLM, never having scheduled it, reports
        a negative one)."""
        if job.first_token_time is None:
            self.time_to_first_token.observe(now - job.arrival_time)
        else:
            self.inter_token_latency.observe(now - job.last_token_time)
        self.finished(job, now)

    def _request_done(self, n: int, max_generated: int) -> None:
        self._histograms["request_params_n"].observe(n)
        self._histograms["request_max_num_generation_tokens"].observe(max_generated)

    # --- reading ---------------------------------------------------------------------------

    def snapshot(self) -> MetricsSnapshot:
        return MetricsSnapshot(
            request_success=dict(self.request_success),
            admission_rejections=dict(self.admission_rejections),
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            prompt_tokens_cached=self.prompt_tokens_cached,
            prompt_tokens_computed=self.prompt_tokens_computed,
            histograms={name: histogram.snapshot() for name, histogram in self._histograms.items()},
        )
