"""The KV-cache options (llm-d-inference-sim's keys): defaults, checks, ``PYTHONHASHSEED``."""

from __future__ import annotations

import pytest

from llmsim.app import build_engine
from llmsim.config import Config, ConfigError, load_config
from llmsim.engine.testing import planned_job


def test_defaults_are_llm_ds() -> None:
    engine = Config().engine
    assert (engine.enable_kvcache, engine.kv_cache_size, engine.block_size, engine.hash_seed) == (False, 1024, 16, "")


@pytest.mark.parametrize(("key", "value"), [("block_size", 12), ("block_size", 256), ("kv_cache_size", 0)])
def test_bad_sizes_are_refused(key: str, value: int) -> None:
    with pytest.raises(ConfigError, match=key.replace("_", "-")):
        Config(**{key: value})


def test_pythonhashseed_is_the_default_seed_and_the_flag_wins() -> None:
    assert load_config({}, environ={"PYTHONHASHSEED": "42"}).engine.hash_seed == "42"
    assert load_config({"hash_seed": "7"}, environ={"PYTHONHASHSEED": "42"}).engine.hash_seed == "7"
    assert load_config({}, environ={"PYTHONHASHSEED": "42", "LLMSIM_HASH_SEED": "9"}).engine.hash_seed == "9"


def test_the_engine_gets_a_pool_only_when_enabled() -> None:
    without = build_engine(Config())
    without.submit(planned_job(prompt=10, output=5), 0.0)
    assert without.kv_cache_usage == 0.0
    engine = build_engine(Config(enable_kvcache=True, kv_cache_size=4, block_size=8))
    engine.submit(planned_job(prompt=10, output=5), 0.0)
    assert engine.kv_cache_usage == 0.5  # 15 tokens: 2 of 4 blocks
