"""``--latency-profile NAME``: llm-d-inference-sim's latency presets, under every source."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmsim.cli import config_from_args, parse_args
from llmsim.config import Config, ConfigError, config_from_mapping, load_config
from llmsim.latency_profiles import PROFILE_NAMES

#: llm-d-inference-sim's manifests/latency-profiles/<name>.yaml at commit
#: eec055a39e6bbc1adbcb54f88f24f36b7f94e781, each file's settings verbatim (comments left out).
MANIFESTS = {
    "8b-h100-balanced-constant": """
port: 8000
model: "meta-llama/Llama-3.1-8B-Instruct"
max-num-seqs: 16
mode: "random"
latency-calculator: constant
time-to-first-token: 100ms
time-to-first-token-std-dev: 20ms
inter-token-latency: 12ms
inter-token-latency-std-dev: 2ms
kv-cache-transfer-latency: 2ms
kv-cache-transfer-latency-std-dev: 400us
time-factor-under-load: 2.0
""",
    "8b-h100-balanced-per-token": """
port: 8000
model: "meta-llama/Llama-3.1-8B-Instruct"
max-num-seqs: 16
mode: "random"
latency-calculator: per-token
inter-token-latency: 12ms
inter-token-latency-std-dev: 2ms
prefill-overhead: 30ms
prefill-time-per-token: 250us
prefill-time-std-dev: 5ms
kv-cache-transfer-time-per-token: 3us
kv-cache-transfer-time-std-dev: 200us
time-factor-under-load: 2.0
""",
    "70b-h100-tp8-throughput-constant": """
port: 8000
model: "meta-llama/Llama-3.1-70B-Instruct"
max-num-seqs: 64
mode: "random"
latency-calculator: constant
time-to-first-token: 200ms
time-to-first-token-std-dev: 40ms
inter-token-latency: 25ms
inter-token-latency-std-dev: 4ms
kv-cache-transfer-latency: 2ms
kv-cache-transfer-latency-std-dev: 400us
time-factor-under-load: 3.0
""",
    "70b-h100-tp8-throughput-per-token": """
port: 8000
model: "meta-llama/Llama-3.1-70B-Instruct"
max-num-seqs: 64
mode: "random"
latency-calculator: per-token
inter-token-latency: 25ms
inter-token-latency-std-dev: 4ms
prefill-overhead: 80ms
prefill-time-per-token: 500us
prefill-time-std-dev: 15ms
kv-cache-transfer-time-per-token: 8us
kv-cache-transfer-time-std-dev: 500us
time-factor-under-load: 3.0
""",
    "small-l40s-edge-constant": """
port: 8000
model: "meta-llama/Llama-3.2-3B-Instruct"
max-num-seqs: 4
mode: "random"
latency-calculator: constant
time-to-first-token: 110ms
time-to-first-token-std-dev: 15ms
inter-token-latency: 15ms
inter-token-latency-std-dev: 2ms
kv-cache-transfer-latency: 5ms
kv-cache-transfer-latency-std-dev: 1ms
time-factor-under-load: 1.5
""",
    "small-l40s-edge-per-token": """
port: 8000
model: "meta-llama/Llama-3.2-3B-Instruct"
max-num-seqs: 4
mode: "random"
latency-calculator: per-token
inter-token-latency: 15ms
inter-token-latency-std-dev: 2ms
prefill-overhead: 20ms
prefill-time-per-token: 350us
prefill-time-std-dev: 3ms
kv-cache-transfer-time-per-token: 12us
kv-cache-transfer-time-std-dev: 500us
time-factor-under-load: 1.5
""",
}
EIGHT_B = "8b-h100-balanced-constant"


def test_the_profiles_are_the_manifests() -> None:
    assert tuple(MANIFESTS) == PROFILE_NAMES


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_a_profile_sets_what_its_manifest_sets(name: str) -> None:
    """The manifest loaded as a YAML file gives the same Config as the profile, but for
    the served model's name, which a profile leaves alone."""
    manifest = yaml.safe_load(MANIFESTS[name])
    del manifest["model"]
    expected = config_from_mapping(manifest).settings()
    profiled = Config(latency_profile=name).settings()
    assert (profiled.pop("latency_profile"), expected.pop("latency_profile")) == (name, "")
    assert profiled == expected


def test_no_profile_changes_nothing() -> None:
    assert Config(latency_profile="") == Config()


def test_an_explicit_flag_overrides_one_value() -> None:
    config = config_from_args(parse_args(["serve", "--latency-profile", EIGHT_B, "--inter-token-latency", "10ms"]), {})
    assert config.latency.inter_token_latency == 0.01
    assert config.latency.time_to_first_token == 0.1  # the rest is the profile's
    assert config.engine.max_num_seqs == 16


def test_precedence_flags_environment_yaml_profile_defaults(tmp_path: Path) -> None:
    path = tmp_path / "llmsim.yaml"
    path.write_text(f"latency-profile: {EIGHT_B}\nmax-num-seqs: 8\ntime-factor-under-load: 1.2\n", encoding="utf-8")
    environ = {"LLMSIM_TIME_FACTOR_UNDER_LOAD": "1.4", "LLMSIM_INTER_TOKEN_LATENCY": "20ms"}
    config = load_config({"inter_token_latency": "30ms"}, environ=environ, config_path=str(path))
    assert config.latency.inter_token_latency == 0.03  # flag over environment
    assert config.latency.time_factor_under_load == 1.4  # environment over YAML
    assert config.engine.max_num_seqs == 8  # YAML over profile
    assert config.latency.time_to_first_token == 0.1  # profile over default
    assert config.latency.prefill_overhead == 0.0  # default


def test_rules_across_keys_judge_the_final_values() -> None:
    """The profile's TTFT std-dev (20ms) is more than 30% of a 50ms TTFT given as a flag."""
    with pytest.raises(ConfigError, match="time-to-first-token-std-dev: must be at most 30%"):
        config_from_args(parse_args(["serve", "--latency-profile", EIGHT_B, "--time-to-first-token", "50ms"]), {})


def test_an_unknown_profile_is_one_line_naming_the_choices() -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_args(parse_args(["serve", "--latency-profile", "8b-h100"]), {})
    message = str(caught.value)
    assert message.startswith("invalid configuration: latency-profile: unknown profile '8b-h100'; choose from ")
    assert all(name in message for name in PROFILE_NAMES) and "\n" not in message


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"]])
def test_help_lists_the_profiles(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)
    shown = " ".join(capsys.readouterr().out.split())
    assert all(name in shown for name in PROFILE_NAMES)


def test_replace_with_another_profile_lays_it_over() -> None:
    config = Config(latency_profile=EIGHT_B).replace(latency_profile="small-l40s-edge-constant", max_num_seqs=2)
    assert (config.latency.time_to_first_token, config.engine.max_num_seqs) == (0.11, 2)
    assert Config(latency_profile=EIGHT_B).replace(max_num_seqs=2).latency.time_to_first_token == 0.1
