"""The one frozen configuration object, and how it is read.

:class:`Config` is composed of the option groups of :mod:`llmsim.options`; its keyword
arguments are flat (``Config(port=0, time_to_first_token=0.05)``) and each goes to its
group.  Sources, highest first: command-line flags, environment (``LLMSIM_<KEY>`` with
the kebab-case key upper-cased and ``-`` turned into ``_``; ``SIM_MODEL`` too, as in
llm-d-inference-sim), a YAML file (``--config`` or ``LLMSIM_CONFIG``), the latency
profile one of them names (``latency-profile``, :mod:`llmsim.latency_profiles`: it fills
only the keys no source gave, in ``Config.__init__``), defaults.  Keys are the kebab-case
names of llm-d-inference-sim.

Every value goes through one lenient cattrs converter (:data:`converter`).  Text (flags,
environment) and YAML values are read the same way: durations ``100ms``, ``1.5s``, Go's
``1m30s`` or a bare number of milliseconds; booleans ``true``/``yes``/``on``/``1``; name
lists space- or comma-separated.  Python values given to :class:`Config` are used as
they are (a duration number is seconds), and strings among them are read as text.
"""

from __future__ import annotations

import math
import os
import re
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NewType, Union, get_args, get_origin

import attrs
import cattrs
import orjson
import yaml

from llmsim.durations import NUMBER, format_duration, parse_duration
from llmsim.engine.fake_metrics import FakeMetrics
from llmsim.engine.metric_buckets import parse_custom_buckets
from llmsim.ignored_keys import IGNORED_KEYS, IgnoredKey
from llmsim.latency_profiles import LATENCY_PROFILES
from llmsim.options import (
    ConfigError,
    ControlOptions,
    EngineOptions,
    JsonObjectText,
    KvEventsOptions,
    LatencyOptions,
    LimitOptions,
    ModelOptions,
    OptionDoc,
    ServerOptions,
    ToolCallOptions,
    option_doc,
    option_key,
)

__all__ = [
    "IGNORED_KEYS",
    "SETTINGS",
    "Config",
    "ConfigError",
    "IgnoredKey",
    "Setting",
    "config_from_environment",
    "config_from_mapping",
    "converter",
    "format_duration",
    "load_config",
    "parse_duration",
    "read_yaml",
    "sections",
]

# --- the lenient converter -------------------------------------------------------------------

#: The structuring target of a duration read as text: a bare number is milliseconds.
DurationText = NewType("DurationText", float)

_FLOAT_RE = re.compile(rf"[-+]?{NUMBER}")


def _to_bool(value: object, _: object = None) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, (str, int)) else None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _to_int(value: object, _: object = None) -> int:
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


def _to_float(value: object, _: object = None) -> float:
    if isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
        number = float(value.strip())
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"expected a finite number, got {value!r}")
    return number


def _to_str(value: object, _: object = None) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"expected a string, got {type(value).__name__}")


def _to_names(value: object, _: object = None) -> tuple[str, ...]:
    """Space- or comma-separated text (flags, environment) or a list (YAML, Python)."""
    if isinstance(value, str):
        return tuple(part for part in re.split(r"[\s,]+", value) if part)
    if isinstance(value, (list, tuple)):
        return tuple(_to_str(item) for item in value)
    raise ValueError(f"expected a name or a list of names, got {type(value).__name__}")


def _to_json_object_text(value: object, _: object = None) -> JsonObjectText:
    """A JSON object as canonical JSON text: from JSON or YAML text (a flag, the
    environment) or from a mapping (a YAML file, Python, ``POST /admin/config``)."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)  # YAML 1.1 reads JSON objects too
        except yaml.YAMLError as exc:
            raise ValueError(f"expected a JSON object, got text that does not parse: {_yaml_problem(exc)}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    try:
        return JsonObjectText(orjson.dumps(value).decode())
    except TypeError as exc:
        raise ValueError(f"expected a JSON object: {exc}") from None


def _is_optional(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)


def _to_optional(value: object, annotation: Any) -> object:
    """``None`` or an empty string unsets an optional value, as an empty string does in
    llm-d-inference-sim (``ssl-certfile: ""``)."""
    if value is None or value == "":
        return None
    (inner,) = (arg for arg in get_args(annotation) if arg is not type(None))
    return converter.structure(value, inner)


def _build_converter() -> cattrs.Converter:
    lenient = cattrs.Converter()
    lenient.register_structure_hook(bool, _to_bool)
    lenient.register_structure_hook(int, _to_int)
    lenient.register_structure_hook(float, _to_float)
    lenient.register_structure_hook(str, _to_str)
    lenient.register_structure_hook(DurationText, lambda value, _: parse_duration(value))
    lenient.register_structure_hook(JsonObjectText, _to_json_object_text)
    lenient.register_structure_hook_func(lambda annotation: annotation == tuple[str, ...], _to_names)
    lenient.register_structure_hook_func(_is_optional, _to_optional)
    return lenient


#: Reads option values from text, YAML and Python; raises ValueError saying what it expected.
converter = _build_converter()


# --- the settings: every field of every group, flat ------------------------------------------


@attrs.frozen
class Setting:
    """One flat setting of :class:`Config`: a field of one of its option groups."""

    group: str  # the Config attribute that holds the group
    field: attrs.Attribute[Any]  # the group's field, its type resolved

    @property
    def annotation(self) -> Any:
        """The field's type (resolved when :data:`SETTINGS` is built)."""
        return _type_of(self.field)

    @property
    def key(self) -> str:
        """The flag and YAML key (kebab-case)."""
        return option_key(self.field)

    @property
    def name(self) -> str:
        """The keyword of ``Config(...)`` and the ``LLMSIM_`` variable's suffix (snake_case)."""
        return self.key.replace("-", "_")

    @property
    def doc(self) -> OptionDoc:
        return option_doc(self.field)

    @property
    def default(self) -> Any:
        return self.field.default

    @property
    def llmd_key(self) -> str | None:
        """llm-d-inference-sim's flag and YAML key for this setting, if it has one."""
        return self.key if self.doc.llmd else None

    def read(self, value: object, *, text: bool) -> object:
        """``value`` as this setting's type, or ValueError.

        ``text``: read as flags, environment and YAML are (a number is a duration in
        milliseconds); otherwise a Python value, used as it is unless it is a string.
        """
        if value is None and not _is_optional(self.annotation):
            raise ValueError("a value is required")
        target = DurationText if self.doc.duration and (text or isinstance(value, str)) else self.annotation
        return converter.structure(value, target)


@attrs.frozen(init=False)
class Config:
    """Everything llmsim can be told, as option groups.  Durations are seconds.

    Built from flat keyword arguments, each routed to its group::

        Config(port=0, time_to_first_token=0.05, served_model_name=("gpt-test",))

    Strings are read like command-line values (``time_to_first_token="100ms"``); an
    unknown keyword or a bad value raises :class:`ConfigError` naming the key.
    """

    model: ModelOptions = attrs.field(factory=ModelOptions, metadata={"title": "model and API"})
    engine: EngineOptions = attrs.field(factory=EngineOptions, metadata={"title": "engine"})
    tool_calls: ToolCallOptions = attrs.field(factory=ToolCallOptions, metadata={"title": "tool calls"})
    latency: LatencyOptions = attrs.field(factory=LatencyOptions, metadata={"title": "latency model"})
    server: ServerOptions = attrs.field(factory=ServerOptions, metadata={"title": "server"})
    control: ControlOptions = attrs.field(
        factory=ControlOptions, metadata={"title": "metrics, failures, sleep, API key and logs"}
    )
    limits: LimitOptions = attrs.field(factory=LimitOptions, metadata={"title": "limits"})
    kv_events: KvEventsOptions = attrs.field(
        factory=KvEventsOptions, metadata={"title": "KV events and data-parallel ranks"}
    )

    def __init__(self, **settings: object) -> None:
        for key, value in settings.items():
            if type(value) in _GROUP_TYPES.values():
                raise TypeError(
                    f"Config takes flat settings, not the option group {type(value).__name__} ({key}=...); "
                    "derive a changed copy with config.replace(...) rather than attrs.evolve"
                )
        given = _with_profile(settings)
        values = dict(_read_item(key, value, text=False, origin=None) for key, value in given.items())
        self.__attrs_init__(**_groups(values))
        _check_metrics_options(self)

    def settings(self) -> dict[str, object]:
        """Every setting's value by keyword: ``Config(**config.settings()) == config``."""
        return {name: getattr(getattr(self, setting.group), setting.field.name) for name, setting in SETTINGS.items()}

    def replace(self, **settings: object) -> Config:
        """A copy with some settings changed, given as ``Config`` takes them (a new
        ``latency_profile`` replaces the current values of its keys)."""
        return Config(**_changed(self.settings(), settings))


def _with_profile(settings: Mapping[str, object]) -> dict[str, object]:
    """``settings`` over the values of the latency profile they name, if any: a profile
    fills only the settings no source gave."""
    name = settings.get("latency_profile")
    if not name or not isinstance(name, str) or name not in LATENCY_PROFILES:
        return dict(settings)  # no profile, or one the option's own check refuses
    return {**{key.replace("-", "_"): value for key, value in LATENCY_PROFILES[name].items()}, **settings}


def _changed(current: Mapping[str, object], changes: Mapping[str, object]) -> dict[str, object]:
    """Every current setting with ``changes`` laid over it; a change of latency profile
    first lays the new profile over the current values."""
    profile = changes.get("latency_profile", current.get("latency_profile"))
    if profile != current.get("latency_profile"):
        current = {**current, **_with_profile({"latency_profile": profile})}
    return {**current, **changes}


def _check_metrics_options(config: Config) -> None:
    """``--fake-metrics`` and ``--custom-histogram-buckets`` must say something
    ``/metrics`` can show: they are checked once, here, rather than at the first scrape."""
    control = config.control
    try:
        if control.fake_metrics is not None:
            FakeMetrics.from_json(control.fake_metrics, max_model_len=config.model.max_model_len)
    except ValueError as exc:
        raise ConfigError("fake-metrics", str(exc)) from None
    try:
        if control.custom_histogram_buckets is not None:
            parse_custom_buckets(control.custom_histogram_buckets)
    except ValueError as exc:
        raise ConfigError("custom-histogram-buckets", str(exc)) from None


def _type_of(attribute: attrs.Attribute[Any]) -> Any:
    if attribute.type is None or isinstance(attribute.type, str):
        raise TypeError(f"{attribute.name} has no resolved type")
    return attribute.type


def _settings() -> dict[str, Setting]:
    found: dict[str, Setting] = {}
    for group in attrs.fields(attrs.resolve_types(Config)):
        for field in attrs.fields(attrs.resolve_types(_type_of(group))):
            setting = Setting(group.name, field)
            found[setting.name] = setting
    return found


#: Every setting by its ``Config`` keyword, in the order of ``--help``.
SETTINGS: Mapping[str, Setting] = _settings()
_GROUP_TYPES: dict[str, type[Any]] = {group.name: _type_of(group) for group in attrs.fields(Config)}


def sections() -> Iterator[tuple[str, list[Setting]]]:
    """The settings by group, with the group's title: the sections of ``--help``."""
    for group in attrs.fields(Config):
        yield group.metadata["title"], [setting for setting in SETTINGS.values() if setting.group == group.name]


def _read_item(raw_key: object, value: object, *, text: bool, origin: str | None) -> tuple[str, object]:
    """(setting name, typed value); errors name the key and, if known, where it came from."""
    name = str(raw_key).replace("-", "_")
    where = f" (from {origin})" if origin else ""
    setting = SETTINGS.get(name)
    if setting is None:
        raise ConfigError(str(raw_key), f"unknown key{where}")
    try:
        return name, setting.read(value, text=text)
    except (TypeError, ValueError) as exc:
        raise ConfigError(setting.key, f"{exc}{where}") from None


def _groups(values: Mapping[str, object]) -> dict[str, Any]:
    """One group object per Config attribute, from typed values by setting name."""
    fields: dict[str, dict[str, object]] = {group: {} for group in _GROUP_TYPES}
    for name, value in values.items():
        setting = SETTINGS[name]
        fields[setting.group][setting.field.name] = value
    return {group: _GROUP_TYPES[group](**given) for group, given in fields.items()}


# --- sources ---------------------------------------------------------------------------------


def config_from_mapping(values: Mapping[str, object], *, base: Config | None = None) -> Config:
    """Build a Config from YAML-like values under kebab- or snake-case keys, over ``base``."""
    changes = dict(_read_item(key, value, text=True, origin=None) for key, value in values.items())
    return Config(**_changed(base.settings(), changes) if base is not None else changes)


def _environment_items(environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(setting name, value, variable) for every setting in the environment, lowest first."""
    items = [("model", environ["SIM_MODEL"], "SIM_MODEL")] if "SIM_MODEL" in environ else []
    if environ.get("VLLM_API_KEY"):  # vLLM's variable; --api-key wins over it, as in vLLM
        items.append(("api_key", environ["VLLM_API_KEY"], "VLLM_API_KEY"))
    if "PYTHONHASHSEED" in environ:  # llm-d-inference-sim's fallback for --hash-seed
        items.append(("hash_seed", environ["PYTHONHASHSEED"], "PYTHONHASHSEED"))
    for name in SETTINGS:
        variable = "LLMSIM_" + name.upper()
        if variable in environ:
            items.append((name, environ[variable], variable))
    return items


def config_from_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``LLMSIM_*`` (and ``SIM_MODEL``) settings found in the environment."""
    environ = os.environ if environ is None else environ
    return {name: value for name, value, _ in _environment_items(environ)}


def _unknown_variables(environ: Mapping[str, str]) -> list[str]:
    known = {"LLMSIM_CONFIG"} | {"LLMSIM_" + name.upper() for name in SETTINGS}
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
    """Flags > environment > YAML file > latency profile > defaults, the way ``llmsim serve``
    builds its Config.

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
    config = Config(**dict(_read_item(key, value, text=True, origin=origin) for key, value, origin in items))
    _check_files(config.server)
    return config


def _check_files(server: ServerOptions) -> None:
    """Fail at start-up, naming the key, rather than when the first TLS handshake needs them."""
    for key, path in (("ssl-certfile", server.ssl_certfile), ("ssl-keyfile", server.ssl_keyfile)):
        if path is not None and not os.path.isfile(path):
            raise ConfigError(key, f"no such file: {path}")
