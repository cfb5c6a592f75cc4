"""The option groups: what each part of llmsim can be told, with its checks and its docs.

Every setting is a field of one frozen group (:class:`ModelOptions`, :class:`EngineOptions`,
:class:`LatencyOptions`, :class:`ToolCallOptions`, :class:`ServerOptions`,
:class:`ControlOptions`, :class:`LimitOptions`, :class:`KvEventsOptions`).  Its flag help,
metavar, help default, whether it is a duration and whether llm-d-inference-sim has the
same key travel with the field as :class:`OptionDoc` metadata (see :func:`option`), so
that ``--help``, the docs' flag table and the loaders are all built from this one place.

This package is the bottom layer: the engine, the model and the schema generator take
their group from here, without importing the configuration loader or the CLI.
Durations are seconds (floats).  Values are typed here; the lenient reading of text
(``"100ms"``, ``"yes"``, ``"a,b"``) is the loader's job (:mod:`llmsim.config`).
"""

from __future__ import annotations

from llmsim.options.control import ControlOptions
from llmsim.options.fields import (
    DEFAULT_MODEL,
    FAILURE_TYPES,
    LOG_LEVELS,
    ConfigError,
    JsonObjectText,
    OptionDoc,
    option,
    option_doc,
    option_key,
)
from llmsim.options.groups import (
    MAX_STD_DEV_FRACTION,
    EngineOptions,
    LatencyOptions,
    ModelOptions,
    ToolCallOptions,
)
from llmsim.options.kv_events import KvEventsOptions
from llmsim.options.limits import LimitOptions
from llmsim.options.server import ServerOptions

__all__ = [
    "DEFAULT_MODEL",
    "FAILURE_TYPES",
    "LOG_LEVELS",
    "MAX_STD_DEV_FRACTION",
    "ConfigError",
    "ControlOptions",
    "EngineOptions",
    "JsonObjectText",
    "KvEventsOptions",
    "LatencyOptions",
    "LimitOptions",
    "ModelOptions",
    "OptionDoc",
    "ServerOptions",
    "ToolCallOptions",
    "option",
    "option_doc",
    "option_key",
]
