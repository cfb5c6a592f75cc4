"""The latency model of llm-d-inference-sim: TTFT calculators, inter-token latency,
the load factor, and jitter.

Everything is in seconds.  Latencies scale with the load factor
``1 + (time_factor_under_load - 1) * (running - 1) / (max_num_seqs - 1)``: 1 with
one running job, ``time_factor_under_load`` with every slot busy.  The factor applies
to TTFT, prefill overhead, prefill time per token and inter-token latency, never to
KV-cache transfer.  A standard deviation adds Gaussian jitter around the (scaled) mean,
clamped to [0.3, 1.7] * mean as the Go simulator does (it is not scaled itself).
"""

from __future__ import annotations

import random

import attrs

from llmsim.options import LatencyOptions

__all__ = ["JITTER_HIGH", "JITTER_LOW", "LatencyModel", "jittered"]

JITTER_LOW = 0.3
JITTER_HIGH = 1.7


def jittered(rng: random.Random, mean: float, std_dev: float) -> float:
    """A Gaussian sample around ``mean``, clamped to [0.3, 1.7] * mean.

    Draws from ``rng`` only when there is something to jitter, so a configuration
    without standard deviations consumes no randomness.
    """
    if mean <= 0.0:
        return 0.0
    if std_dev <= 0.0:
        return mean
    value = rng.gauss(mean, std_dev)
    return min(max(value, JITTER_LOW * mean), JITTER_HIGH * mean)


def _uses_per_token(calculator: str, latency: float, std_dev: float) -> bool:
    """``per-token`` or ``constant`` as configured; ``""`` (legacy) picks per-token
    when the constant latency and its deviation are both zero."""
    if calculator:
        return calculator == "per-token"
    return latency == 0.0 and std_dev == 0.0


@attrs.frozen
class LatencyModel:
    """The latency options, with the calculator resolved, for an engine of ``max_num_seqs`` slots."""

    options: LatencyOptions
    max_num_seqs: int
    per_token_prefill: bool
    per_token_transfer: bool
    #: The inter-token latency when every one is the same (no jitter, no load factor), else
    #: None: the engine's per-token path then skips the model.
    fixed_itl: float | None = None
    #: Likewise the TTFT of every job but a P/D decode side's, what the model would give.
    fixed_ttft: float | None = None

    @classmethod
    def from_options(cls, options: LatencyOptions, max_num_seqs: int) -> LatencyModel:
        per_token_prefill = _uses_per_token(
            options.latency_calculator, options.time_to_first_token, options.time_to_first_token_std_dev
        )
        # Without a load factor, load_factor() is 1.0 exactly; without jitter, jittered()
        # returns the mean (0 when not positive).
        constant = options.time_factor_under_load == 1.0 or max_num_seqs <= 1
        itl = options.inter_token_latency
        constant_ttft = constant and not per_token_prefill and options.time_to_first_token_std_dev <= 0.0
        return cls(
            options=options,
            max_num_seqs=max_num_seqs,
            per_token_prefill=per_token_prefill,
            per_token_transfer=_uses_per_token(
                options.latency_calculator,
                options.kv_cache_transfer_latency,
                options.kv_cache_transfer_latency_std_dev,
            ),
            fixed_itl=itl if constant and (options.inter_token_latency_std_dev <= 0.0 or itl <= 0.0) else None,
            fixed_ttft=max(options.time_to_first_token, 0.0) if constant_ttft else None,
        )

    def load_factor(self, running: int) -> float:
        """How much slower than idle the engine is with ``running`` jobs holding slots."""
        slots = self.max_num_seqs
        if slots <= 1 or running <= 1:
            return 1.0
        busy = min(running, slots) - 1
        return 1.0 + (self.options.time_factor_under_load - 1.0) * busy / (slots - 1)

    def time_to_first_token(
        self,
        rng: random.Random,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        remote_prefill: bool,
        factor: float,
    ) -> float:
        """TTFT of a job admitted when the load factor is ``factor``."""
        options = self.options
        if remote_prefill:
            if self.per_token_transfer:
                mean = prompt_tokens * options.kv_cache_transfer_time_per_token
                return jittered(rng, mean, options.kv_cache_transfer_time_std_dev)
            return jittered(rng, options.kv_cache_transfer_latency, options.kv_cache_transfer_latency_std_dev)
        if self.per_token_prefill:
            uncached = prompt_tokens - min(max(cached_tokens, 0), prompt_tokens)
            mean = (options.prefill_overhead + uncached * options.prefill_time_per_token) * factor
            return jittered(rng, mean, options.prefill_time_std_dev)
        return jittered(rng, options.time_to_first_token * factor, options.time_to_first_token_std_dev)

    def inter_token_latency(self, rng: random.Random, factor: float) -> float:
        """The gap before the next token when the load factor is ``factor``."""
        options = self.options
        return jittered(rng, options.inter_token_latency * factor, options.inter_token_latency_std_dev)

    def due_tokens(
        self, rng: random.Random, running: int, deadline: float, reach: float, remaining: int, cap: int
    ) -> tuple[int, float]:
        """How many of ``remaining`` (at least 2) tokens are due by ``reach``, the first
        at ``deadline`` and at most ``cap``, with ``running`` jobs holding slots; and the
        deadline that follows (the next token's, or the last one's when none remain)."""
        fixed_itl = self.fixed_itl
        factor = self.load_factor(running)
        count = 1
        while True:
            deadline += fixed_itl if fixed_itl is not None else self.inter_token_latency(rng, factor)
            if deadline > reach or count == cap:
                break
            count += 1
            if count == remaining:
                break
        return count, deadline
