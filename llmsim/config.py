"""The one frozen configuration object, and how it is built.

Sources, highest first: command-line flags, environment (``LLMSIM_<KEY>`` with the
kebab-case key upper-cased and ``-`` turned into ``_``; ``SIM_MODEL`` too, as in
llm-d-inference-sim), a YAML file (``--config`` or ``LLMSIM_CONFIG``), defaults.  Keys
are the kebab-case names of llm-d-inference-sim; fields are their snake_case twins.
Durations are seconds as floats in :class:`Config`; on the wire they accept ``100ms``,
``1.5s``, Go's ``1m30s`` or a bare number of milliseconds.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import yaml

__all__ = [
    "DURATION_FIELDS",
    "FIELD_KEYS",
    "IGNORED_KEYS",
    "Config",
    "ConfigError",
    "IgnoredKey",
    "config_from_environment",
    "config_from_mapping",
    "format_duration",
    "load_config",
    "parse_duration",
    "read_yaml",
]

DEFAULT_MODEL = "llmsim/sim-model"


class ConfigError(ValueError):
    """A configuration value or key is invalid.  ``key`` names it in kebab-case."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"invalid configuration: {key}: {message}")
        self.key = key


_NUMBER = r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_BARE_NUMBER_RE = re.compile(rf"{_NUMBER}")
_UNIT = r"(ns|us|µs|ms|s|m|h)"  # "ms" before "m": the first alternative that fits wins
_WITH_UNITS_RE = re.compile(rf"(?:\s*{_NUMBER}\s*{_UNIT})+")
_PART_RE = re.compile(rf"({_NUMBER})\s*{_UNIT}")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_HINT = "expected a duration such as 100ms, 1.5s or a number of milliseconds"


def parse_duration(value: object) -> float:
    """``"100ms"`` / ``"1.5s"`` / ``"1m30s"`` / ``250`` (milliseconds) -> seconds.

    A bare number means milliseconds, as the integer form of llm-d-inference-sim did.
    """
    if isinstance(value, bool):
        raise ValueError(f"{_DURATION_HINT}, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value) / 1000.0
    elif isinstance(value, str):
        seconds = _parse_duration_text(value)
    else:
        raise ValueError(f"{_DURATION_HINT}, got {type(value).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"duration must be finite and non-negative, got {value!r}")
    return seconds


def _parse_duration_text(value: str) -> float:
    text = value.strip()
    if _BARE_NUMBER_RE.fullmatch(text):
        return float(text) / 1000.0
    if not _WITH_UNITS_RE.fullmatch(text):
        raise ValueError(f"{_DURATION_HINT}, got {value!r}")
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART_RE.findall(text))


def format_duration(seconds: float) -> str:
    """A spelling :func:`parse_duration` reads back, with its unit: ``0s``, ``100ms``, ``10s``."""
    if 0 < seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


def _non_negative(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value < 0:
        raise ConfigError(_key(attribute.name), f"must be >= 0, got {value}")


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value <= 0:
        raise ConfigError(_key(attribute.name), f"must be > 0, got {value}")


def _one_of(*choices: str) -> Any:
    def check(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
        if value not in choices:
            raise ConfigError(
                _key(attribute.name), f"must be one of {', '.join(repr(c) for c in choices)}, got {value!r}"
            )

    return check


def _percent(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not 0 <= value <= 100:
        raise ConfigError(_key(attribute.name), f"must be a percentage in 0..100, got {value}")


def _port(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not 0 <= value <= 65535:
        raise ConfigError(_key(attribute.name), f"must be in 0..65535, got {value}")


def _key(field_name: str) -> str:
    return field_name.replace("_", "-")


def _names(value: str | Iterable[object]) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(part for part in re.split(r"[\s,]+", value) if part)
    return tuple(str(v) for v in value)


@attrs.frozen(kw_only=True)
class Config:
    """Everything llmsim can be told.  Durations are seconds."""

    # --- model and API -------------------------------------------------------------
    model: str = DEFAULT_MODEL
    served_model_name: tuple[str, ...] = attrs.field(default=(), converter=_names)
    max_model_len: int = attrs.field(default=32768, validator=_positive)
    mode: str = attrs.field(default="random", validator=_one_of("random", "echo"))
    seed: int | None = None
    tokenizer: str | None = None

    # --- engine --------------------------------------------------------------------
    max_num_seqs: int = attrs.field(default=256, validator=_positive)
    max_waiting_queue_length: int = attrs.field(default=1000, validator=_non_negative)
    max_num_batched_tokens: int | None = attrs.field(default=None, validator=attrs.validators.optional(_positive))

    # --- latency model (llm-d-inference-sim flag names) ------------------------------
    latency_calculator: str = attrs.field(default="", validator=_one_of("", "constant", "per-token"))
    time_to_first_token: float = attrs.field(default=0.0, validator=_non_negative)
    time_to_first_token_std_dev: float = attrs.field(default=0.0, validator=_non_negative)
    inter_token_latency: float = attrs.field(default=0.0, validator=_non_negative)
    inter_token_latency_std_dev: float = attrs.field(default=0.0, validator=_non_negative)
    prefill_overhead: float = attrs.field(default=0.0, validator=_non_negative)
    prefill_time_per_token: float = attrs.field(default=0.0, validator=_non_negative)
    prefill_time_std_dev: float = attrs.field(default=0.0, validator=_non_negative)
    kv_cache_transfer_latency: float = attrs.field(default=0.0, validator=_non_negative)
    kv_cache_transfer_latency_std_dev: float = attrs.field(default=0.0, validator=_non_negative)
    kv_cache_transfer_time_per_token: float = attrs.field(default=0.0, validator=_non_negative)
    kv_cache_transfer_time_std_dev: float = attrs.field(default=0.0, validator=_non_negative)
    time_factor_under_load: float = attrs.field(default=1.0)

    # --- tool-call generation (llm-d-inference-sim's knobs; a schema's bounds win) ----
    min_tool_call_integer_param: int = 0
    max_tool_call_integer_param: int = 100
    min_tool_call_number_param: float = 0.0
    max_tool_call_number_param: float = 100.0
    min_tool_call_array_param_length: int = attrs.field(default=1, validator=_non_negative)
    max_tool_call_array_param_length: int = attrs.field(default=5, validator=_non_negative)
    tool_call_not_required_param_probability: int = attrs.field(default=50, validator=_percent)
    object_tool_call_not_required_field_probability: int = attrs.field(default=50, validator=_percent)
    tool_call_extra_call_probability: int = attrs.field(default=45, validator=_percent)

    # --- server --------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = attrs.field(default=8000, validator=_port)
    server: str = attrs.field(default="native", validator=_one_of("native", "hypercorn"))
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    self_signed_certs: bool = False
    max_request_body_size_mb: float = attrs.field(default=4.0, validator=_positive)
    max_concurrent_streams: int = attrs.field(default=1000, validator=_positive)
    header_read_timeout: float = attrs.field(default=10.0, validator=_positive)
    keep_alive_timeout: float = attrs.field(default=75.0, validator=_positive)
    shutdown_grace_period: float = attrs.field(default=5.0, validator=_non_negative)
    startup_duration: float = attrs.field(default=0.0, validator=_non_negative)

    @time_factor_under_load.validator
    def _check_load_factor(self, attribute: attrs.Attribute[float], value: float) -> None:
        if value < 1.0:
            raise ConfigError("time-factor-under-load", f"must be >= 1.0, got {value}")

    def __attrs_post_init__(self) -> None:
        for mean_name, sd_name in (
            ("time_to_first_token", "time_to_first_token_std_dev"),
            ("inter_token_latency", "inter_token_latency_std_dev"),
            ("kv_cache_transfer_latency", "kv_cache_transfer_latency_std_dev"),
        ):
            mean, sd = getattr(self, mean_name), getattr(self, sd_name)
            if sd > 0.3 * mean + 1e-12:
                raise ConfigError(_key(sd_name), f"must be at most 30% of {_key(mean_name)} ({mean}s), got {sd}s")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigError("ssl-certfile", "ssl-certfile and ssl-keyfile must be given together")
        if self.self_signed_certs and self.ssl_certfile is not None:
            raise ConfigError("self-signed-certs", "cannot be combined with ssl-certfile/ssl-keyfile")
        for name in self.served_model_name:
            if not name:
                raise ConfigError("served-model-name", "names must not be empty")
        for low, high in (
            ("min_tool_call_integer_param", "max_tool_call_integer_param"),
            ("min_tool_call_number_param", "max_tool_call_number_param"),
            ("min_tool_call_array_param_length", "max_tool_call_array_param_length"),
        ):
            if getattr(self, low) > getattr(self, high):
                raise ConfigError(
                    _key(low), f"must be <= {_key(high)} ({getattr(self, high)}), got {getattr(self, low)}"
                )
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                "max-num-batched-tokens",
                f"({self.max_num_batched_tokens}) must be >= max-num-seqs ({self.max_num_seqs}), as vLLM requires: "
                "every running sequence needs one token of each step's budget",
            )

    # --- derived -------------------------------------------------------------------
    @property
    def model_names(self) -> tuple[str, ...]:
        """Names a request may use; the first is the one reported in responses."""
        return self.served_model_name or (self.model,)

    @property
    def batched_token_budget(self) -> int:
        """Tokens per engine step: max-num-batched-tokens, or by default
        max(8192, max-num-seqs) so that decoding never starves prefill."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return max(8192, self.max_num_seqs)

    @property
    def display_model(self) -> str:
        return self.model_names[0]

    @property
    def tls_enabled(self) -> bool:
        return self.self_signed_certs or self.ssl_certfile is not None

    @property
    def max_request_body_bytes(self) -> int:
        return int(self.max_request_body_size_mb * 1024 * 1024)


_FIELDS: dict[str, attrs.Attribute[Any]] = {f.name: f for f in attrs.fields(Config)}
FIELD_KEYS: tuple[str, ...] = tuple(_key(name) for name in _FIELDS)
DURATION_FIELDS: frozenset[str] = frozenset(
    name
    for name in _FIELDS
    if name.startswith(("time_to_first", "inter_token", "prefill_", "kv_cache_transfer"))
    or name in {"header_read_timeout", "keep_alive_timeout", "shutdown_grace_period", "startup_duration"}
)


# --- keys accepted for compatibility and ignored -------------------------------------


@attrs.frozen
class IgnoredKey:
    """A vLLM or llm-d-inference-sim key that llmsim accepts, notes and ignores.

    Listed one by one so that launch commands and YAML files written for vLLM or
    llm-d-inference-sim keep working, while a misspelt key still stops start-up.
    """

    arity: str = attrs.field(validator=attrs.validators.in_(("switch", "value", "values")))
    reason: str


_NOTHING_TO_SIMULATE = "a vLLM engine setting with nothing to simulate"
_NOT_SIMULATED_YET = "an llm-d-inference-sim feature llmsim does not simulate yet"

_VLLM_ONLY: dict[str, str] = {
    "tensor-parallel-size": "value",
    "pipeline-parallel-size": "value",
    "gpu-memory-utilization": "value",
    "dtype": "value",
    "enforce-eager": "switch",
    "enable-prefix-caching": "switch",
    "trust-remote-code": "switch",
    "disable-log-requests": "switch",
    "disable-log-stats": "switch",
    "mm-processor-kwargs": "value",
    "ec-transfer-config": "value",
    "force-dummy-tokenizer": "switch",
    "render-url": "value",
    "render-timeout": "value",
    "mm-render-timeout": "value",
}

_GO_NOT_YET: dict[str, str] = {
    "enable-kvcache": "switch",
    "kv-cache-size": "value",
    "block-size": "value",
    "hash-seed": "value",
    "zmq-endpoint": "value",
    "event-batch-size": "value",
    "use-vllm-map-event-format": "switch",
    "kv-events-replay-endpoint": "value",
    "kv-events-replay-queue-size": "value",
    "global-cache-hit-threshold": "value",
    "lora-modules": "values",
    "max-loras": "value",
    "max-cpu-loras": "value",
    "failure-injection-rate": "value",
    "failure-types": "values",
    "fake-metrics": "value",
    "fake-metrics-refresh-interval": "value",
    "data-parallel-size": "value",
    "data-parallel-rank": "value",
    "enable-sleep-mode": "switch",
    "enable-request-id-headers": "switch",
    "log-http": "switch",
    "default-embedding-dimensions": "value",
    "max-tool-call-integer-param": "value",
    "min-tool-call-integer-param": "value",
    "max-tool-call-number-param": "value",
    "min-tool-call-number-param": "value",
    "max-tool-call-array-param-length": "value",
    "min-tool-call-array-param-length": "value",
    "tool-call-not-required-param-probability": "value",
    "object-tool-call-not-required-field-probability": "value",
    "tool-call-extra-call-probability": "value",
    "skip-tool-validation": "switch",
    "dataset-path": "value",
    "dataset-url": "value",
    "dataset-in-memory": "switch",
    "dataset-table-name": "value",
    "mm-encoder-only": "switch",
    "omni": "switch",
    "image-emission-rate": "value",
    "time-to-generate-image": "value",
    "time-to-generate-image-std-dev": "value",
}

# A key that becomes a Config field stops being ignored, with no edit here.
IGNORED_KEYS: Mapping[str, IgnoredKey] = {
    key: IgnoredKey(arity, reason)
    for table, reason in ((_VLLM_ONLY, _NOTHING_TO_SIMULATE), (_GO_NOT_YET, _NOT_SIMULATED_YET))
    for key, arity in table.items()
    if key not in FIELD_KEYS
}


# --- coercion ----------------------------------------------------------------------------


_FLOAT_RE = re.compile(rf"[-+]?{_NUMBER}")


def _to_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _to_int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip(), 10)
        except ValueError:
            pass
    raise ValueError(f"expected an integer, got {value!r}")


def _to_float(value: object) -> float:
    if (isinstance(value, (int, float)) and not isinstance(value, bool)) or (isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip())):
        number = float(value)
    else:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"expected a finite number, got {value!r}")
    return number


def _to_str(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"expected a string, got {type(value).__name__}")


def _to_names(value: object) -> tuple[str, ...]:
    """Space- or comma-separated text (flags, environment) or a list (YAML)."""
    if isinstance(value, str):
        return _names(value)
    if isinstance(value, (list, tuple)):
        return tuple(_to_str(item) for item in value)
    raise ValueError(f"expected a name or a list of names, got {type(value).__name__}")


_SCALARS: dict[str, Callable[[object], object]] = {
    "bool": _to_bool,
    "int": _to_int,
    "float": _to_float,
    "str": _to_str,
}


def _coerce(name: str, value: object) -> object:
    """Turn a YAML/env/flag value into the field's type, or raise ValueError.

    ``None`` or an empty string unsets an optional field, as an empty string does in
    llm-d-inference-sim (``ssl-certfile: ""``).
    """
    field_type = str(_FIELDS[name].type)
    optional = field_type.endswith(" | None")
    if optional and (value is None or value == ""):
        return None
    if value is None:
        raise ValueError("a value is required")
    if name in DURATION_FIELDS:
        return parse_duration(value)
    if name == "served_model_name":
        return _to_names(value)
    return _SCALARS[field_type.removesuffix(" | None")](value)


def _coerce_item(raw_key: object, value: object, origin: str | None) -> tuple[str, object]:
    """(field name, typed value); errors name the key and, if not a flag, where it came from."""
    name = str(raw_key).replace("-", "_")
    where = f" (from {origin})" if origin else ""
    if name not in _FIELDS:
        raise ConfigError(str(raw_key), f"unknown key{where}")
    try:
        return name, _coerce(name, value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(_key(name), f"{exc}{where}") from None


def _build(fields: Mapping[str, object]) -> Config:
    try:
        return Config(**fields)  # type: ignore[arg-type]
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError("config", str(exc)) from None


def config_from_mapping(values: Mapping[str, object], *, base: Config | None = None) -> Config:
    """Build a Config from kebab- or snake-case keys; unknown keys raise ConfigError."""
    fields: dict[str, object] = attrs.asdict(base, recurse=False) if base is not None else {}
    fields.update(_coerce_item(key, value, None) for key, value in values.items())
    return _build(fields)


# --- sources -----------------------------------------------------------------------------


def _environment_items(environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(field name, value, variable) for every setting in the environment, lowest first."""
    items = [("model", environ["SIM_MODEL"], "SIM_MODEL")] if "SIM_MODEL" in environ else []
    for name in _FIELDS:
        variable = "LLMSIM_" + name.upper()
        if variable in environ:
            items.append((name, environ[variable], variable))
    return items


def config_from_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``LLMSIM_*`` (and ``SIM_MODEL``) settings found in the environment."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value, _ in _environment_items(environ)}


def _unknown_variables(environ: Mapping[str, str]) -> list[str]:
    known = {"LLMSIM_CONFIG"} | {"LLMSIM_" + name.upper() for name in _FIELDS}
    return sorted(v for v in environ if v.startswith("LLMSIM_") and v not in known)


def read_yaml(path: str, note: Callable[[str], None]) -> dict[str, object]:
    """The mapping in a YAML file, minus ignored keys (each noted); errors name ``config``."""
    try:
        with open(path, encoding="utf-8") as file:
            document = yaml.safe_load(file)
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{path} is not valid YAML: {_yaml_problem(exc)}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError("config", f"{path} must hold a mapping of keys to values, not a {type(document).__name__}")
    values: dict[str, object] = {}
    for key, value in document.items():
        kebab = str(key).replace("_", "-")
        if kebab in IGNORED_KEYS:
            note(f"ignoring {key}: {IGNORED_KEYS[kebab].reason} (in {path})")
        else:
            values[str(key)] = value
    return values


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())


def _ignore(message: str) -> None:
    """The default ``note``: load_config is silent unless the caller wants its notes."""


def load_config(
    flags: Mapping[str, object] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    config_path: str | None = None,
    note: Callable[[str], None] = _ignore,
) -> Config:
    """Flags > environment > YAML file > defaults, the way ``llmsim serve`` builds its Config.

    The sources are merged key by key before the Config is built, so that rules across
    keys (a std-dev at most 30% of its mean) judge the final values, wherever each came
    from.  ``config_path`` falls back to ``LLMSIM_CONFIG``.  TLS files must exist.
    """
    environ = os.environ if environ is None else environ
    path = config_path if config_path is not None else environ.get("LLMSIM_CONFIG")
    items: list[tuple[object, object, str | None]] = []
    if path:
        items += [(key, value, path) for key, value in read_yaml(path, note).items()]
    items += _environment_items(environ)
    items += [(key, value, None) for key, value in (flags or {}).items()]
    for variable in _unknown_variables(environ):
        note(f"ignoring unknown environment variable {variable}")
    config = _build(dict(_coerce_item(key, value, origin) for key, value, origin in items))
    _check_files(config)
    return config


def _check_files(config: Config) -> None:
    """Fail at start-up, naming the key, rather than when the first TLS handshake needs them."""
    for name in ("ssl_certfile", "ssl_keyfile"):
        path = getattr(config, name)
        if path is not None and not os.path.isfile(path):
            raise ConfigError(_key(name), f"no such file: {path}")
