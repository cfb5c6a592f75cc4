"""Configuration: option groups, durations, the lenient converter, sources and their precedence."""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import pytest
import yaml

from llmsim.config import (
    IGNORED_KEYS,
    SETTINGS,
    Config,
    ConfigError,
    Setting,
    config_from_environment,
    config_from_mapping,
    format_duration,
    load_config,
    parse_duration,
    sections,
)
from llmsim.options import (
    ControlOptions,
    EngineOptions,
    KvEventsOptions,
    LatencyOptions,
    LimitOptions,
    ModelOptions,
    ServerOptions,
    ToolCallOptions,
    option_key,
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


@pytest.mark.parametrize("value", ["-5ms", "-1", " -1m30s", -5])
def test_a_negative_duration_is_called_negative(value: object) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        parse_duration(value)


def test_parse_duration_rejects_non_finite_numbers() -> None:
    with pytest.raises(ValueError, match="finite"):
        parse_duration(math.inf)


@pytest.mark.parametrize("seconds", [0.0, 0.0001, 0.02, 0.1, 0.999, 1.0, 1.5, 75.0])
def test_format_duration_reads_back(seconds: float) -> None:
    text = format_duration(seconds)
    assert text.endswith("s")
    assert parse_duration(text) == pytest.approx(seconds)


# --- the groups and the flat settings ---------------------------------------------------------


def test_every_group_field_is_one_setting_under_its_own_key() -> None:
    groups = (
        ModelOptions,
        EngineOptions,
        ToolCallOptions,
        LatencyOptions,
        ServerOptions,
        ControlOptions,
        LimitOptions,
        KvEventsOptions,
    )
    fields = [field for group in groups for field in attrs.fields(group)]
    assert [option_key(field) for field in fields] == [setting.key for setting in SETTINGS.values()]
    assert len(set(SETTINGS)) == len(fields)
    assert [title for title, _ in sections()] == [
        "model and API",
        "engine",
        "tool calls",
        "latency model",
        "server",
        "metrics, failures, sleep, API key and logs",
        "limits",
        "KV events and data-parallel ranks",
    ]


def test_settings_land_in_their_groups() -> None:
    config = Config(model="m", port=0, server="hypercorn", max_num_seqs=3, time_to_first_token=0.05, seed=4)
    assert (config.model.name, config.model.seed) == ("m", 4)
    assert (config.server.port, config.server.backend) == (0, "hypercorn")
    assert config.engine.max_num_seqs == 3
    assert config.latency.time_to_first_token == 0.05
    assert config.tool_calls == ToolCallOptions()


def test_the_readme_example() -> None:
    config = Config(port=0, time_to_first_token=0.05, served_model_name=("gpt-test",))
    assert config.model.display_model == "gpt-test"
    assert config.latency.time_to_first_token == 0.05


@pytest.mark.parametrize(
    ("settings", "group", "field", "expected"),
    [
        ({"time_to_first_token": "100ms"}, "latency", "time_to_first_token", 0.1),
        ({"time_to_first_token": "250"}, "latency", "time_to_first_token", 0.25),  # text: milliseconds
        ({"time_to_first_token": 2}, "latency", "time_to_first_token", 2.0),  # a Python number: seconds
        ({"port": "8080"}, "server", "port", 8080),
        ({"max_num_seqs": 4.0}, "engine", "max_num_seqs", 4),
        ({"self_signed_certs": "yes"}, "server", "self_signed_certs", True),
        ({"served_model_name": "a,b"}, "model", "served_model_name", ("a", "b")),
        ({"served_model_name": ["a", "b"]}, "model", "served_model_name", ("a", "b")),
        ({"tokenizer": ""}, "model", "tokenizer", None),
        ({"max_num_batched_tokens": "300"}, "engine", "max_num_batched_tokens", 300),
        ({"max_logprobs": "-1"}, "model", "max_logprobs", -1),  # vLLM: -1 lifts the cap to the vocabulary
        ({"max_num_queued_reqs": "0"}, "engine", "max_num_queued_reqs", 0),
        ({"max_num_queued_reqs": ""}, "engine", "max_num_queued_reqs", None),
    ],
)
def test_python_values_are_read_leniently(
    settings: dict[str, object], group: str, field: str, expected: object
) -> None:
    assert getattr(getattr(Config(**settings), group), field) == expected


@pytest.mark.parametrize(
    ("settings", "key", "message"),
    [
        ({"time_to_first_tokn": 0.1}, "time_to_first_tokn", "unknown key"),
        ({"port": "http"}, "port", "expected an integer, got 'http'"),
        ({"port": 80.5}, "port", "expected an integer"),
        ({"time_to_first_token": "soon"}, "time-to-first-token", "expected a duration"),
        ({"time_to_first_token": -0.1}, "time-to-first-token", "must be >= 0"),
        ({"time_factor_under_load": math.nan}, "time-factor-under-load", "finite"),
        ({"model": None}, "model", "a value is required"),
    ],
)
def test_python_value_errors_name_the_key(settings: dict[str, object], key: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config(**settings)
    assert caught.value.key == key
    assert message in str(caught.value)


def test_replace_changes_only_what_it_names() -> None:
    base = Config(model="base", port=0, time_to_first_token=0.05)
    changed = base.replace(port=9, inter_token_latency="20ms")
    assert (changed.model.name, changed.server.port, changed.latency.time_to_first_token) == ("base", 9, 0.05)
    assert changed.latency.inter_token_latency == pytest.approx(0.02)
    assert Config(**base.settings()) == base


def test_attrs_evolve_points_to_replace() -> None:
    with pytest.raises(TypeError, match=r"config\.replace"):
        attrs.evolve(Config(), port=1)


def test_groups_check_their_own_rules() -> None:
    with pytest.raises(ConfigError, match="max-num-batched-tokens"):
        EngineOptions(max_num_seqs=10, max_num_batched_tokens=5)
    with pytest.raises(ConfigError, match="inter-token-latency-std-dev: must be at most 30%"):
        LatencyOptions(inter_token_latency=0.01, inter_token_latency_std_dev=0.005)
    with pytest.raises(ConfigError, match="ssl-certfile"):
        ServerOptions(ssl_certfile="cert.pem")
    with pytest.raises(ConfigError, match=r"min-tool-call-integer-param: must be <= max-tool-call-integer-param \(4\)"):
        ToolCallOptions(min_tool_call_integer_param=5, max_tool_call_integer_param=4)
    with pytest.raises(ConfigError, match="served-model-name"):
        ModelOptions(served_model_name=("a", ""))


def test_derived_values() -> None:
    assert EngineOptions().batched_token_budget == 8192
    assert EngineOptions(max_num_seqs=10_000).batched_token_budget == 10_000
    assert EngineOptions(max_num_batched_tokens=300).batched_token_budget == 300
    assert ServerOptions(max_request_body_size_mb=1.5).max_request_body_bytes == 1_572_864
    assert ServerOptions(self_signed_certs=True).tls_enabled
    assert not ServerOptions().tls_enabled


# --- mappings (YAML values) --------------------------------------------------------------------


def _as_yaml_would_spell_it(setting: Setting) -> object:
    if setting.doc.duration:
        return format_duration(setting.default)
    return list(setting.default) if isinstance(setting.default, tuple) else setting.default


def test_every_key_read_back_at_its_default_gives_the_default_config() -> None:
    values = {setting.key: _as_yaml_would_spell_it(setting) for setting in SETTINGS.values()}
    assert config_from_mapping(values) == Config()


def test_every_key_read_back_from_text_gives_the_default_config() -> None:
    """Environment variables are text: every setting's type must parse from its own spelling."""
    environ = {}
    for name, setting in SETTINGS.items():
        value = _as_yaml_would_spell_it(setting)
        text = "" if value is None else " ".join(value) if isinstance(value, list) else str(value)
        environ["LLMSIM_" + name.upper()] = text
    assert load_config(environ=environ) == Config()


def test_mapping_accepts_kebab_and_snake_keys_and_keeps_the_base() -> None:
    base = Config(model="base", port=0)
    config = config_from_mapping({"time-to-first-token": "100ms", "inter_token_latency": 20}, base=base)
    assert (config.model.name, config.server.port) == ("base", 0)
    assert config.latency.time_to_first_token == pytest.approx(0.1)
    assert config.latency.inter_token_latency == pytest.approx(0.02)


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
        ({"min-tool-call-number-param": 5, "max-tool-call-number-param": 1}, "min-tool-call-number-param"),
        ({"max-num-batched-tokens": 10, "max-num-seqs": 20}, "max-num-batched-tokens"),
        ({"max-logprobs": -2}, "max-logprobs"),  # vLLM's ModelConfig.max_logprobs: ge=-1
        ({"max-num-queued-reqs": -1}, "max-num-queued-reqs"),  # vLLM's SchedulerConfig: ge=0
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
    assert config_from_mapping({"self-signed-certs": text}).server.self_signed_certs is expected


@pytest.mark.parametrize("value", ["a b c", "a,b,c", " a, b  c ", ["a", "b", "c"]])
def test_served_model_names(value: object) -> None:
    model = config_from_mapping({"model": "base", "served-model-name": value}).model
    assert model.served_model_name == ("a", "b", "c")
    assert model.model_names == ("a", "b", "c")
    assert model.display_model == "a"


def test_without_served_model_names_the_model_is_the_name() -> None:
    model = config_from_mapping({"model": "base"}).model
    assert model.model_names == ("base",)
    assert model.display_model == "base"


@pytest.mark.parametrize("value", [None, ""])
def test_empty_values_unset_optional_fields(value: object) -> None:
    base = Config(seed=7, tokenizer="tok.json")
    config = config_from_mapping({"seed": value, "tokenizer": value}, base=base)
    assert (config.model.seed, config.model.tokenizer) == (None, None)


def test_ignored_keys_are_not_settings() -> None:
    assert IGNORED_KEYS
    assert not set(IGNORED_KEYS) & {setting.key for setting in SETTINGS.values()}


# --- every key of llm-d-inference-sim ---------------------------------------------------------

#: The yaml tags of ``Configuration`` in pkg/common/config.go and the flags registered in
#: pkg/common/parser.go of llm-d-inference-sim at commit eec055a39e6bbc1adbcb54f88f24f36b7f94e781
#: (main, 2026-08-20; every flag has the YAML key of the same name, plus ``--config``).
LLMD_KEYS = (
    "block-size",
    "config",
    "data-parallel-rank",
    "data-parallel-size",
    "dataset-in-memory",
    "dataset-path",
    "dataset-table-name",
    "dataset-url",
    "default-embedding-dimensions",
    "ec-transfer-config",
    "enable-kvcache",
    "enable-prefix-caching",
    "enable-request-id-headers",
    "enable-sleep-mode",
    "enforce-eager",
    "event-batch-size",
    "failure-injection-rate",
    "failure-types",
    "fake-metrics",
    "fake-metrics-refresh-interval",
    "force-dummy-tokenizer",
    "global-cache-hit-threshold",
    "hash-seed",
    "image-emission-rate",
    "inter-token-latency",
    "inter-token-latency-std-dev",
    "kv-cache-size",
    "kv-cache-transfer-latency",
    "kv-cache-transfer-latency-std-dev",
    "kv-cache-transfer-time-per-token",
    "kv-cache-transfer-time-std-dev",
    "kv-events-replay-endpoint",
    "kv-events-replay-queue-size",
    "latency-calculator",
    "log-http",
    "lora-modules",
    "max-cpu-loras",
    "max-loras",
    "max-model-len",
    "max-num-seqs",
    "max-request-body-size-mb",
    "max-tool-call-array-param-length",
    "max-tool-call-integer-param",
    "max-tool-call-number-param",
    "max-waiting-queue-length",
    "min-tool-call-array-param-length",
    "min-tool-call-integer-param",
    "min-tool-call-number-param",
    "mm-encoder-only",
    "mm-processor-kwargs",
    "mm-render-timeout",
    "mode",
    "model",
    "object-tool-call-not-required-field-probability",
    "omni",
    "port",
    "prefill-overhead",
    "prefill-time-per-token",
    "prefill-time-std-dev",
    "render-timeout",
    "render-url",
    "seed",
    "self-signed-certs",
    "served-model-name",
    "skip-tool-validation",
    "ssl-certfile",
    "ssl-keyfile",
    "startup-duration",
    "tensor-parallel-size",
    "time-factor-under-load",
    "time-to-first-token",
    "time-to-first-token-std-dev",
    "time-to-generate-image",
    "time-to-generate-image-std-dev",
    "tool-call-extra-call-probability",
    "tool-call-not-required-param-probability",
    "use-vllm-map-event-format",
    "zmq-endpoint",
)

#: Keys of earlier releases that main no longer has, from the same two files:
#: ``tokenizers-cache-dir`` (v0.3.2 to v0.7.1) and ``zmq-max-connect-attempts`` (v0.4.0 to
#: v0.7.1) at tag v0.7.1 (fa50983c5d6a076a53b48813a76b54f8a149f9b9); ``uds-socket-path``
#: (v0.8.x) at tag v0.8.2 (a311a6c5d2f12afe008bca627ad3a9fd7e100558).
LLMD_RETIRED_KEYS = ("tokenizers-cache-dir", "zmq-max-connect-attempts", "uds-socket-path")


def test_every_llmd_key_is_a_setting_or_ignored() -> None:
    implemented = {setting.llmd_key for setting in SETTINGS.values()} - {None}
    keys = set(LLMD_KEYS) | set(LLMD_RETIRED_KEYS)
    assert implemented <= keys, "a setting claims an llm-d-inference-sim key it does not have"
    assert keys == implemented | (set(IGNORED_KEYS) & keys) | {"config"}


def _ignored_value(key: str) -> object:
    return {"switch": True, "value": "1", "values": ["a"]}[IGNORED_KEYS[key].arity]


def test_a_yaml_file_with_every_llmd_key_loads(tmp_path: Path) -> None:
    by_key = {setting.key: setting for setting in SETTINGS.values()}
    document = {
        key: _as_yaml_would_spell_it(by_key[key]) if key in by_key else _ignored_value(key)
        for key in (*LLMD_KEYS, *LLMD_RETIRED_KEYS)
        if key != "config"
    }
    path = tmp_path / "llmd.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    notes: list[str] = []
    assert load_config(environ={}, config_path=str(path), note=notes.append) == Config()
    assert sorted(note.split(":")[0].removeprefix("ignoring ") for note in notes) == sorted(
        key for key in document if key in IGNORED_KEYS
    )


# --- sources -------------------------------------------------------------------------------


def _yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "llmsim.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_defaults_without_any_source() -> None:
    config = load_config(environ={})
    assert config == Config()
    assert (config.server.host, config.server.port, config.model.name) == ("127.0.0.1", 8000, "llmsim/sim-model")
    # vLLM 0.33's defaults: ModelConfig.max_logprobs 20, SchedulerConfig.max_num_queued_reqs None
    # (vllm/config/model.py:286, vllm/config/scheduler.py:92)
    assert (config.model.max_logprobs, config.engine.max_num_queued_reqs) == (20, None)


def test_precedence_flags_over_environment_over_yaml_over_defaults(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "port: 1001\nmode: echo\nmax-num-seqs: 3\ntime-to-first-token: 300ms\n")
    environ = {"LLMSIM_PORT": "2002", "LLMSIM_MODE": "random", "LLMSIM_TIME_TO_FIRST_TOKEN": "200"}
    config = load_config({"port": "3003"}, environ=environ, config_path=path)
    assert config.server.port == 3003  # flag beats environment and YAML
    assert config.model.mode == "random"  # environment beats YAML
    assert config.latency.time_to_first_token == pytest.approx(0.2)
    assert config.engine.max_num_seqs == 3  # YAML beats the default
    assert config.engine.max_waiting_queue_length == EngineOptions().max_waiting_queue_length


def test_rules_across_keys_judge_the_merged_values(tmp_path: Path) -> None:
    """A std-dev from YAML is valid against a mean given on the command line."""
    path = _yaml(tmp_path, "time-to-first-token-std-dev: 20ms\n")
    config = load_config({"time_to_first_token": "100ms"}, environ={}, config_path=path)
    assert config.latency.time_to_first_token_std_dev == pytest.approx(0.02)


def test_sim_model_and_llmsim_model() -> None:
    assert load_config(environ={"SIM_MODEL": "from-sim"}).model.name == "from-sim"
    both = {"SIM_MODEL": "from-sim", "LLMSIM_MODEL": "from-llmsim"}
    assert load_config(environ=both).model.name == "from-llmsim"
    assert load_config({"model": "from-flag"}, environ=both).model.name == "from-flag"
    assert config_from_environment(both) == {"model": "from-llmsim"}


def test_environment_values_are_parsed() -> None:
    environ = {
        "LLMSIM_SERVED_MODEL_NAME": "a,b",
        "LLMSIM_SELF_SIGNED_CERTS": "yes",
        "LLMSIM_SEED": "42",
        "LLMSIM_SERVER": "hypercorn",
    }
    config = load_config(environ=environ)
    assert config.model.served_model_name == ("a", "b")
    assert config.server.self_signed_certs is True
    assert config.model.seed == 42
    assert config.server.backend == "hypercorn"


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
    assert load_config(environ={"LLMSIM_CONFIG": first}).server.port == 1111
    assert load_config(environ={"LLMSIM_CONFIG": first}, config_path=str(second)).server.port == 2222


def test_yaml_values_keep_their_types(tmp_path: Path) -> None:
    path = _yaml(
        tmp_path,
        "served-model-name: [a, b]\nself-signed-certs: true\ninter-token-latency: 20\n"
        "time-factor-under-load: 2\nseed: null\nlatency_calculator: per-token\n",
    )
    config = load_config(environ={}, config_path=path)
    assert config.model.served_model_name == ("a", "b")
    assert config.server.self_signed_certs is True
    assert config.latency.inter_token_latency == pytest.approx(0.02)
    assert config.latency.time_factor_under_load == 2.0
    assert config.latency.latency_calculator == "per-token"


def test_empty_yaml_file_means_defaults(tmp_path: Path) -> None:
    assert load_config(environ={}, config_path=_yaml(tmp_path, "# nothing\n")) == Config()


def test_ignored_yaml_keys_are_noted(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "omni: true\ntensor_parallel_size: 4\ntokenizers-cache-dir: hf_cache\nport: 9\n")
    notes: list[str] = []
    config = load_config(environ={}, config_path=path, note=notes.append)
    assert config.server.port == 9
    assert [note.split(":")[0] for note in notes] == [
        "ignoring omni",
        "ignoring tensor_parallel_size",
        "ignoring tokenizers-cache-dir",
    ]
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
    assert config.server.tls_enabled
