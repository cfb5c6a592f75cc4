"""``--lora-modules``: vLLM's two forms (``vllm/entrypoints/common/cli_args.py:38-69``),
read from flags and YAML, and the start-up checks (``max-cpu-loras``, names)."""

from __future__ import annotations

import pytest

from llmsim.cli import config_from_args, parse_args
from llmsim.lora_modules import LoraModule, parse_lora_module
from llmsim.options import ConfigError, EngineOptions, ModelOptions


def test_name_equals_path_and_json_forms() -> None:
    assert parse_lora_module("sql=/adapters/sql=v2") == LoraModule("sql", "/adapters/sql=v2")
    assert parse_lora_module('{"name": "a", "path": "/p", "base_model_name": "m"}') == LoraModule("a", "/p", "m")
    # a comma makes it JSON, as in vLLM
    with pytest.raises(ValueError, match="Invalid JSON format for --lora-modules: a=/p,q"):
        parse_lora_module("a=/p,q")


@pytest.mark.parametrize(
    "text",
    ["plain", '{"name": "a"}', '{"name": "a", "path": 3}', '{"name": "a", "path": "/p", "rank": 8}', "[1]", "=/p"],
)
def test_bad_entries_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--lora-modules"):
        parse_lora_module(text)
    with pytest.raises(ConfigError, match="lora-modules"):
        ModelOptions(lora_modules=(text,))


def test_modules_enable_lora_and_empty_entries_are_skipped() -> None:
    options = ModelOptions(lora_modules=("", "a=/a"))
    assert options.lora_enabled
    assert options.lora_adapters == (LoraModule("a", "/a"),)
    assert not ModelOptions().lora_enabled
    assert ModelOptions(enable_lora=True).lora_enabled


@pytest.mark.parametrize("modules", [("a=/a", "a=/b"), ("llmsim/sim-model=/a",)])
def test_duplicate_or_base_model_names_are_refused(modules: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError, match="lora-modules"):
        ModelOptions(lora_modules=modules)


def test_max_cpu_loras_at_least_max_loras() -> None:
    assert EngineOptions(max_loras=2, max_cpu_loras=2).max_cpu_loras == 2
    with pytest.raises(ConfigError, match="max-cpu-loras"):
        EngineOptions(max_loras=2, max_cpu_loras=1)
    with pytest.raises(ConfigError, match="max-loras"):
        EngineOptions(max_loras=0)


def test_flags_take_several_modules() -> None:
    args = parse_args(["serve", "--lora-modules", "a=/a", '{"name": "b", "path": "/b"}', "--max-loras", "2"])
    config = config_from_args(args, {})
    assert config.model.lora_modules == ("a=/a", '{"name": "b", "path": "/b"}')
    assert config.engine.max_loras == 2
