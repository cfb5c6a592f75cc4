"""Configuration loading: durations, coercion, sources and their precedence."""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import pytest

from llmsim.config import (
    DURATION_FIELDS,
    FIELD_KEYS,
    IGNORED_KEYS,
    Config,
    ConfigError,
    config_from_environment,
    config_from_mapping,
    format_duration,
    load_config,
    parse_duration,
)

# --- durations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("100ms", 0.1),
        ("1.5s", 1.5),
        ("250", 0.25),
        (250, 0.25),
        (0.5, 0.0005),
        ("0", 0.0),
        (" 20 ms ", 0.02),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        ("500us", 0.0005),
        ("500µs", 0.0005),
        ("1000000ns", 0.001),
        (".5s", 0.5),
        ("1e3ms", 1.0),
    ],
)
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "ms", "1x", "-5ms", "-1", "1.2.3s", "100 ms s", "fast", True, None, [1], "inf"])
def test_parse_duration_rejects(value: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


def test_parse_duration_rejects_non_finite_numbers() -> None:
    with pytest.raises(ValueError, match="finite"):
        parse_duration(math.inf)


@pytest.mark.parametrize("seconds", [0.0, 0.0001, 0.02, 0.1, 0.999, 1.0, 1.5, 75.0])
def test_format_duration_reads_back(seconds: float) -> None:
    text = format_duration(seconds)
    assert text.endswith("s")
    assert parse_duration(text) == pytest.approx(seconds)


# --- mappings and coercion -----------------------------------------------------------------


def _as_yaml_would_spell_it(field: attrs.Attribute[object]) -> object:
    if field.name in DURATION_FIELDS:
        return format_duration(field.default)  # type: ignore[arg-type]
    return list(field.default) if isinstance(field.default, tuple) else field.default


def test_every_key_read_back_at_its_default_gives_the_default_config() -> None:
    values = {
        attribute.name.replace("_", "-"): _as_yaml_would_spell_it(attribute) for attribute in attrs.fields(Config)
    }
    assert set(values) == set(FIELD_KEYS)
    assert config_from_mapping(values) == Config()


def test_every_key_read_back_from_text_gives_the_default_config() -> None:
    """Environment variables are text: every field type must parse from its own spelling."""
    environ = {}
    for attribute in attrs.fields(Config):
        value = _as_yaml_would_spell_it(attribute)
        text = "" if value is None else " ".join(value) if isinstance(value, list) else str(value)
        environ["LLMSIM_" + attribute.name.upper()] = text
    assert load_config(environ=environ) == Config()


def test_mapping_accepts_kebab_and_snake_keys_and_keeps_the_base() -> None:
    base = Config(model="base", port=0)
    config = config_from_mapping({"time-to-first-token": "100ms", "inter_token_latency": 20}, base=base)
    assert (config.model, config.port) == ("base", 0)
    assert config.time_to_first_token == pytest.approx(0.1)
    assert config.inter_token_latency == pytest.approx(0.02)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"time-to-first-tokn": "1s"}, "time-to-first-tokn"),
        ({"port": "http"}, "port"),
        ({"port": 70000}, "port"),
        ({"port": True}, "port"),
        ({"port": 80.5}, "port"),
        ({"max-num-seqs": 0}, "max-num-seqs"),
        ({"mode": "chaos"}, "mode"),
        ({"server": "uvicorn"}, "server"),
        ({"latency-calculator": "linear"}, "latency-calculator"),
        ({"self-signed-certs": "maybe"}, "self-signed-certs"),
        ({"time-factor-under-load": 0.5}, "time-factor-under-load"),
        ({"time-factor-under-load": "nan"}, "time-factor-under-load"),
        ({"max-request-body-size-mb": "big"}, "max-request-body-size-mb"),
        ({"model": None}, "model"),
        ({"model": {"name": "x"}}, "model"),
        ({"served-model-name": 5}, "served-model-name"),
        ({"served-model-name": [{"a": 1}]}, "served-model-name"),
        ({"inter-token-latency": "20ms", "inter-token-latency-std-dev": "10ms"}, "inter-token-latency-std-dev"),
        ({"ssl-certfile": "cert.pem"}, "ssl-certfile"),
    ],
)
def test_mapping_errors_name_the_key(values: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(values)
    assert caught.value.key == key
    assert str(caught.value).startswith(f"invalid configuration: {key}: ")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", True), ("true", True), ("Yes", True), ("on", True), ("0", False), ("false", False), ("off", False)],
)
def test_booleans_from_text(text: str, expected: bool) -> None:
    assert config_from_mapping({"self-signed-certs": text}).self_signed_certs is expected


@pytest.mark.parametrize("value", ["a b c", "a,b,c", " a, b  c ", ["a", "b", "c"]])
def test_served_model_names(value: object) -> None:
    config = config_from_mapping({"model": "base", "served-model-name": value})
    assert config.served_model_name == ("a", "b", "c")
    assert config.model_names == ("a", "b", "c")
    assert config.display_model == "a"


def test_without_served_model_names_the_model_is_the_name() -> None:
    config = config_from_mapping({"model": "base"})
    assert config.model_names == ("base",)
    assert config.display_model == "base"


@pytest.mark.parametrize("value", [None, ""])
def test_empty_values_unset_optional_fields(value: object) -> None:
    base = Config(seed=7, tokenizer="tok.json")
    config = config_from_mapping({"seed": value, "tokenizer": value}, base=base)
    assert (config.seed, config.tokenizer) == (None, None)


def test_ignored_keys_are_not_fields() -> None:
    assert IGNORED_KEYS
    assert not set(IGNORED_KEYS) & set(FIELD_KEYS)


# --- sources -------------------------------------------------------------------------------


def _yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "llmsim.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_defaults_without_any_source() -> None:
    config = load_config(environ={})
    assert config == Config()
    assert (config.host, config.port, config.model) == ("127.0.0.1", 8000, "llmsim/sim-model")


def test_precedence_flags_over_environment_over_yaml_over_defaults(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "port: 1001\nmode: echo\nmax-num-seqs: 3\ntime-to-first-token: 300ms\n")
    environ = {"LLMSIM_PORT": "2002", "LLMSIM_MODE": "random", "LLMSIM_TIME_TO_FIRST_TOKEN": "200"}
    config = load_config({"port": "3003"}, environ=environ, config_path=path)
    assert config.port == 3003  # flag beats environment and YAML
    assert config.mode == "random"  # environment beats YAML
    assert config.time_to_first_token == pytest.approx(0.2)
    assert config.max_num_seqs == 3  # YAML beats the default
    assert config.max_waiting_queue_length == Config().max_waiting_queue_length


def test_rules_across_keys_judge_the_merged_values(tmp_path: Path) -> None:
    """A std-dev from YAML is valid against a mean given on the command line."""
    path = _yaml(tmp_path, "time-to-first-token-std-dev: 20ms\n")
    config = load_config({"time_to_first_token": "100ms"}, environ={}, config_path=path)
    assert config.time_to_first_token_std_dev == pytest.approx(0.02)


def test_sim_model_and_llmsim_model() -> None:
    assert load_config(environ={"SIM_MODEL": "from-sim"}).model == "from-sim"
    both = {"SIM_MODEL": "from-sim", "LLMSIM_MODEL": "from-llmsim"}
    assert load_config(environ=both).model == "from-llmsim"
    assert load_config({"model": "from-flag"}, environ=both).model == "from-flag"
    assert config_from_environment(both) == {"model": "from-llmsim"}


def test_environment_values_are_parsed() -> None:
    environ = {"LLMSIM_SERVED_MODEL_NAME": "a,b", "LLMSIM_SELF_SIGNED_CERTS": "yes", "LLMSIM_SEED": "42"}
    config = load_config(environ=environ)
    assert config.served_model_name == ("a", "b")
    assert config.self_signed_certs is True
    assert config.seed == 42


def test_environment_errors_name_the_key_and_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"^invalid configuration: port: .*\(from LLMSIM_PORT\)$") as caught:
        load_config(environ={"LLMSIM_PORT": "eighty"})
    assert caught.value.key == "port"


def test_unknown_environment_variables_are_noted() -> None:
    notes: list[str] = []
    load_config(environ={"LLMSIM_PORTT": "1", "OTHER": "x"}, note=notes.append)
    assert notes == ["ignoring unknown environment variable LLMSIM_PORTT"]


def test_yaml_file_from_llmsim_config_and_overridden_by_config_path(tmp_path: Path) -> None:
    first = _yaml(tmp_path, "port: 1111\n")
    second = tmp_path / "second.yaml"
    second.write_text("port: 2222\n", encoding="utf-8")
    assert load_config(environ={"LLMSIM_CONFIG": first}).port == 1111
    assert load_config(environ={"LLMSIM_CONFIG": first}, config_path=str(second)).port == 2222


def test_yaml_values_keep_their_types(tmp_path: Path) -> None:
    path = _yaml(
        tmp_path,
        "served-model-name: [a, b]\nself-signed-certs: true\ninter-token-latency: 20\n"
        "time-factor-under-load: 2\nseed: null\nlatency_calculator: per-token\n",
    )
    config = load_config(environ={}, config_path=path)
    assert config.served_model_name == ("a", "b")
    assert config.self_signed_certs is True
    assert config.inter_token_latency == pytest.approx(0.02)
    assert config.time_factor_under_load == 2.0
    assert config.latency_calculator == "per-token"


def test_empty_yaml_file_means_defaults(tmp_path: Path) -> None:
    assert load_config(environ={}, config_path=_yaml(tmp_path, "# nothing\n")) == Config()


def test_ignored_yaml_keys_are_noted(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "enable-kvcache: true\ntensor_parallel_size: 4\nport: 9\n")
    notes: list[str] = []
    config = load_config(environ={}, config_path=path, note=notes.append)
    assert config.port == 9
    assert [note.split(":")[0] for note in notes] == ["ignoring enable-kvcache", "ignoring tensor_parallel_size"]
    assert all(note.endswith(f"(in {path})") for note in notes)


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ("time-to-first-tokn: 1s\n", "time-to-first-tokn", "unknown key"),
        ("port: [1]\n", "port", "expected an integer"),
        ("- port\n- 8000\n", "config", "must hold a mapping"),
        ("just text\n", "config", "must hold a mapping"),
        ("port: [1\n", "config", "not valid YAML"),
        ("port: 1\n\tmode: echo\n", "config", "not valid YAML"),
    ],
)
def test_yaml_errors_name_the_key(tmp_path: Path, text: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(environ={}, config_path=_yaml(tmp_path, text))
    assert caught.value.key == key
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_missing_yaml_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read") as caught:
        load_config(environ={}, config_path=str(tmp_path / "absent.yaml"))
    assert caught.value.key == "config"


def test_tls_files_must_exist(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("cert", encoding="utf-8")
    with pytest.raises(ConfigError, match="no such file") as caught:
        load_config({"ssl_certfile": str(cert), "ssl_keyfile": str(key)}, environ={})
    assert caught.value.key == "ssl-keyfile"
    key.write_text("key", encoding="utf-8")
    config = load_config({"ssl_certfile": str(cert), "ssl_keyfile": str(key)}, environ={})
    assert config.tls_enabled
