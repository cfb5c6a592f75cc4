"""How an option is declared (:func:`option`, :class:`OptionDoc`), the constants the groups
share, and the checks their fields run (``check_*``, raising :class:`ConfigError`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NewType

import attrs

from llmsim.latency_profiles import PROFILE_NAMES

__all__ = [
    "BLOCK_SIZES",
    "DEFAULT_MODEL",
    "FAILURE_TYPES",
    "LOG_LEVELS",
    "MAX_DURATION_SECONDS",
    "ConfigError",
    "JsonObjectText",
    "OptionDoc",
    "check_at_least_minus_one",
    "check_at_least_one",
    "check_block_size",
    "check_failure_types",
    "check_latency_profile",
    "check_log_level",
    "check_non_negative",
    "check_non_negative_or_unset",
    "check_percent",
    "check_port",
    "check_positive",
    "check_positive_or_unset",
    "check_ranges",
    "option",
    "option_doc",
    "option_key",
]


DEFAULT_MODEL = "llmsim/sim-model"

#: The kinds of failure ``--failure-types`` may pick (llm-d-inference-sim's names).
FAILURE_TYPES = (
    "rate_limit",
    "invalid_api_key",
    "context_length",
    "server_error",
    "invalid_request",
    "model_not_found",
)
#: ``--log-level`` values (vLLM's ``LogLevel``, any case).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")

#: A JSON object kept as its text (``--fake-metrics``): the loader reads a JSON or YAML
#: object, from a flag or a file, into this canonical JSON text; its meaning is checked
#: by whoever uses it (``llmsim.engine.fake_metrics``).
JsonObjectText = NewType("JsonObjectText", str)


class ConfigError(ValueError):
    """A configuration value or key is invalid.  ``key`` names it in kebab-case."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"invalid configuration: {key}: {message}")
        self.key = key


# --- field metadata ----------------------------------------------------------------------

_METADATA_KEY = "llmsim.option"


@attrs.frozen
class OptionDoc:
    """How one option reads on the command line, in ``--help`` and in the docs.

    ``shown_default`` replaces the default in ``--help`` and the flag table when the
    value itself needs words; ``key`` is the flag and YAML key when it is not the field
    name in kebab-case; ``llmd`` says whether llm-d-inference-sim has the same key.
    """

    help: str
    metavar: str = ""
    shown_default: str | None = None
    duration: bool = False
    key: str | None = None
    llmd: bool = True


if TYPE_CHECKING:
    _Validator = Callable[[Any, attrs.Attribute[Any], Any], None]


def option(
    default: object,
    *,
    help: str,
    metavar: str = "",
    shown_default: str | None = None,
    duration: bool = False,
    key: str | None = None,
    llmd: bool = True,
    choices: tuple[str, ...] = (),
    validator: _Validator | None = None,
) -> Any:
    """An ``attrs`` field carrying its :class:`OptionDoc`.

    ``choices`` adds a one-of check and, without a ``metavar``, shows them as
    ``{a,b}`` (an empty choice is allowed but not shown).  Durations get the
    metavar ``DURATION`` and a non-negative check.
    """
    validators: list[_Validator] = []
    if choices:
        validators.append(_one_of(choices))
        metavar = metavar or "{" + ",".join(choice for choice in choices if choice) + "}"
    if duration:
        validators.append(_duration)
        metavar = metavar or "DURATION"
    if validator is not None:
        validators.append(validator)
    doc = OptionDoc(help, metavar, shown_default, duration, key, llmd)
    return attrs.field(default=default, validator=validators, metadata={_METADATA_KEY: doc})


def option_doc(attribute: attrs.Attribute[Any]) -> OptionDoc:
    """The :class:`OptionDoc` of a group field."""
    doc = attribute.metadata.get(_METADATA_KEY)
    if not isinstance(doc, OptionDoc):
        raise TypeError(f"{attribute.name} is not an option (declare it with llmsim.options.option)")
    return doc


def option_key(attribute: attrs.Attribute[Any]) -> str:
    """The kebab-case flag and YAML key of a group field."""
    doc = attribute.metadata.get(_METADATA_KEY)
    if isinstance(doc, OptionDoc) and doc.key is not None:
        return doc.key
    return attribute.name.replace("_", "-")


# --- validators ----------------------------------------------------------------------------


def check_non_negative(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value < 0:
        raise ConfigError(option_key(attribute), f"must be >= 0, got {value}")


#: The longest duration a setting may have: Go's (``math.MaxInt64`` nanoseconds, about 292
#: years), so that every duration can be shown as llm-d-inference-sim shows it.
MAX_DURATION_SECONDS = (2**63 - 1) / 1e9


def _duration(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    check_non_negative(instance, attribute, value)
    if not value <= MAX_DURATION_SECONDS:  # also refuses NaN
        limit = f"{MAX_DURATION_SECONDS:.0f}s"
        raise ConfigError(option_key(attribute), f"must be at most {limit} (Go's longest duration), got {value}")


def check_positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value <= 0:
        raise ConfigError(option_key(attribute), f"must be > 0, got {value}")


def check_non_negative_or_unset(instance: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        check_non_negative(instance, attribute, value)


def check_at_least_minus_one(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if value < -1:
        raise ConfigError(option_key(attribute), f"must be -1 (no cap) or >= 0, got {value}")


def check_positive_or_unset(instance: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None:
        check_positive(instance, attribute, value)


#: llm-d-inference-sim's allowed --block-size values (its config validation).
BLOCK_SIZES = (8, 16, 32, 64, 128)


def check_block_size(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if value not in BLOCK_SIZES:
        raise ConfigError(option_key(attribute), f"must be one of {', '.join(map(str, BLOCK_SIZES))}, got {value}")


def check_percent(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not 0 <= value <= 100:
        raise ConfigError(option_key(attribute), f"must be a percentage in 0..100, got {value}")


def check_failure_types(instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    unknown = [name for name in value if name not in FAILURE_TYPES]
    if unknown:
        raise ConfigError(
            option_key(attribute), f"unknown failure type {unknown[0]!r}; choose from {', '.join(FAILURE_TYPES)}"
        )


def check_log_level(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value.lower() not in LOG_LEVELS:
        raise ConfigError(option_key(attribute), f"must be one of {', '.join(LOG_LEVELS)} (any case), got {value!r}")


def check_latency_profile(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if value and value not in PROFILE_NAMES:
        raise ConfigError(option_key(attribute), f"unknown profile {value!r}; choose from {', '.join(PROFILE_NAMES)}")


def check_port(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not 0 <= value <= 65535:
        raise ConfigError(option_key(attribute), f"must be in 0..65535, got {value}")


def check_at_least_one(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value < 1.0:
        raise ConfigError(option_key(attribute), f"must be >= 1.0, got {value}")


def _one_of(choices: tuple[str, ...]) -> _Validator:
    def check(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
        if value not in choices:
            shown = ", ".join(repr(choice) for choice in choices)
            raise ConfigError(option_key(attribute), f"must be one of {shown}, got {value!r}")

    return check


def check_ranges(instance: attrs.AttrsInstance, ranges: Iterable[tuple[str, str]]) -> None:
    """Each ``(low, high)`` pair of field names must hold ``low <= high``; else a
    ConfigError naming the low one: ``min-x: must be <= max-x (5), got 6``."""
    fields = attrs.fields_dict(type(instance))
    for low, high in ranges:
        value, bound = getattr(instance, low), getattr(instance, high)
        if value > bound:
            raise ConfigError(option_key(fields[low]), f"must be <= {option_key(fields[high])} ({bound}), got {value}")
