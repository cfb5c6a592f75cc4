"""The latency model: calculators, load factor, jitter."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.engine.latency import LatencyModel, jittered
from llmsim.options import LatencyOptions


@given(
    mean=st.floats(min_value=1e-6, max_value=100.0),
    relative_sd=st.floats(min_value=0.0, max_value=5.0),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_jitter_stays_within_0_3_and_1_7_of_the_mean(mean: float, relative_sd: float, seed: int) -> None:
    value = jittered(random.Random(seed), mean, mean * relative_sd)
    assert 0.3 * mean <= value <= 1.7 * mean


def test_jitter_without_deviation_or_mean_draws_nothing() -> None:
    rng = random.Random(1)
    state = rng.getstate()
    assert jittered(rng, 0.25, 0.0) == 0.25
    assert jittered(rng, 0.0, 0.5) == 0.0
    assert rng.getstate() == state


def test_jitter_is_gaussian_around_the_mean() -> None:
    rng = random.Random(3)
    samples = [jittered(rng, 1.0, 0.1) for _ in range(4000)]
    mean = sum(samples) / len(samples)
    spread = (sum((s - mean) ** 2 for s in samples) / len(samples)) ** 0.5
    assert mean == pytest.approx(1.0, abs=0.01)
    assert spread == pytest.approx(0.1, rel=0.1)


@pytest.mark.parametrize(
    ("running", "expected"),
    [(0, 1.0), (1, 1.0), (2, 1.5), (3, 2.0), (5, 3.0), (9, 3.0)],
)
def test_load_factor_is_linear_in_running_jobs(running: int, expected: float) -> None:
    model = LatencyModel.from_options(LatencyOptions(time_factor_under_load=3.0), max_num_seqs=5)
    assert model.load_factor(running) == pytest.approx(expected)


def test_load_factor_is_one_with_a_single_slot() -> None:
    model = LatencyModel.from_options(LatencyOptions(time_factor_under_load=3.0), max_num_seqs=1)
    assert model.load_factor(1) == 1.0


@pytest.mark.parametrize(
    ("config", "per_token_prefill", "per_token_transfer"),
    [
        (LatencyOptions(), True, True),
        (LatencyOptions(time_to_first_token=0.1), False, True),
        (LatencyOptions(kv_cache_transfer_latency=0.1), True, False),
        (LatencyOptions(latency_calculator="constant"), False, False),
        (LatencyOptions(latency_calculator="per-token", time_to_first_token=0.1), True, True),
    ],
)
def test_calculator_resolution(config: LatencyOptions, per_token_prefill: bool, per_token_transfer: bool) -> None:
    model = LatencyModel.from_options(config, max_num_seqs=256)
    assert (model.per_token_prefill, model.per_token_transfer) == (per_token_prefill, per_token_transfer)


def test_time_to_first_token_formulas() -> None:
    config = LatencyOptions(
        latency_calculator="per-token",
        prefill_overhead=0.02,
        prefill_time_per_token=0.001,
        kv_cache_transfer_time_per_token=0.0005,
        time_factor_under_load=2.0,
    )
    model = LatencyModel.from_options(config, max_num_seqs=256)
    rng = random.Random(0)
    local = model.time_to_first_token(rng, prompt_tokens=100, cached_tokens=30, remote_prefill=False, factor=2.0)
    remote = model.time_to_first_token(rng, prompt_tokens=100, cached_tokens=30, remote_prefill=True, factor=2.0)
    assert local == pytest.approx((0.02 + 70 * 0.001) * 2.0)
    assert remote == pytest.approx(100 * 0.0005)


def test_per_token_prefill_jitter_uses_the_prefill_deviation() -> None:
    config = LatencyOptions(latency_calculator="per-token", prefill_time_per_token=0.001, prefill_time_std_dev=0.01)
    model = LatencyModel.from_options(config, max_num_seqs=256)
    rng = random.Random(5)
    samples = {
        model.time_to_first_token(rng, prompt_tokens=50, cached_tokens=0, remote_prefill=False, factor=1.0)
        for _ in range(50)
    }
    assert len(samples) > 40
    assert all(0.3 * 0.05 <= s <= 1.7 * 0.05 for s in samples)


def test_inter_token_latency_scales_the_mean_not_the_deviation() -> None:
    config = LatencyOptions(inter_token_latency=0.01, inter_token_latency_std_dev=0.003)
    model = LatencyModel.from_options(config, max_num_seqs=256)
    rng = random.Random(9)
    samples = [model.inter_token_latency(rng, 4.0) for _ in range(4000)]
    mean = sum(samples) / len(samples)
    spread = (sum((s - mean) ** 2 for s in samples) / len(samples)) ** 0.5
    assert mean == pytest.approx(0.04, rel=0.01)
    assert spread == pytest.approx(0.003, rel=0.1)
