"""The live configuration behind ``/admin/config``: llm-d-inference-sim's admin API over a
running simulator.

llm-d's rules (``pkg/common/config.go:702-870``, ``pkg/llm-d-inference-sim/context.go:
120-150``): GET shows every setting by its kebab-case key, durations as Go writes them
(``"100ms"``, ``"1m30s"``), keys sorted as Go's JSON writes a map.  POST takes a partial
object of the keys tagged ``admin:"configurable"``; any other key, or a value the
configuration refuses, fails the whole update.  ``null`` leaves a key as it is.
``fake-metrics`` may change only if the server started with fake metrics, and its
object is laid over the current one key by key.

llmsim reads the values as its flags and YAML are read (:func:`llmsim.config.
config_from_mapping`): a duration is ``"100ms"``, ``"1.5s"`` or ``"1m30s"``, and a bare
number is milliseconds (llm-d's JSON would read it as nanoseconds).  llm-d's image keys
(``image-emission-rate``, ``time-to-generate-image[-std-dev]``) are refused: llmsim does
not simulate image output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import orjson

from llmsim.config import SETTINGS, Config, ConfigError, Setting, config_from_mapping
from llmsim.engine.scheduler import Engine

__all__ = ["ADMIN_KEYS", "LiveConfig", "go_duration"]

#: The keys ``POST /admin/config`` may change: the latency model's and llm-d's control keys
#: (llm-d's own: not llmsim's ``latency-profile``), and llmsim's protocol faults
#: (``fault``, ``fault-rate``: docs/faults.md).
ADMIN_KEYS = frozenset(
    [setting.key for setting in SETTINGS.values() if setting.group == "latency" and setting.llmd_key]
    + ["failure-injection-rate", "failure-types", "fake-metrics", "fault", "fault-rate"]
)
_FAKE_METRICS = "fake-metrics"
_SECRET_KEYS = frozenset(["api-key"])
_MASK = "***"


class LiveConfig:
    """The running :class:`~llmsim.config.Config` and the one way to change it
    (implements :class:`llmsim.api.admin.AdminControl`).

    An update builds the whole new Config first, then hands the latency options to the
    engine (new TTFTs, and in-flight streams from their next token, as llm-d re-reads its
    latency calculator per token) and the new Config to ``on_change`` (the simulator's
    ``config`` and ``ctx.control``), all in one synchronous call.
    """

    def __init__(self, config: Config, engine: Engine, on_change: Callable[[Config], None]) -> None:
        self.config = config
        self._engine = engine
        self._on_change = on_change

    def snapshot(self) -> dict[str, object]:
        return _snapshot(self.config)

    def update(self, values: Mapping[str, object]) -> dict[str, object]:
        changes: dict[str, object] = {}
        for raw_key, value in values.items():
            key = raw_key.replace("_", "-")
            if key not in ADMIN_KEYS:
                raise ValueError(f"field '{raw_key}' is not admin-configurable")
            if value is not None:
                changes[key] = value
        if _FAKE_METRICS in changes:
            changes[_FAKE_METRICS] = self._fake_metrics_over_current(changes[_FAKE_METRICS])
        new = config_from_mapping(changes, base=self.config)
        answer = _snapshot(new)  # before anything changes: a value it cannot show changes nothing
        if new.latency != self.config.latency:
            self._engine.reconfigure(new.engine, new.latency)
        self.config = new
        self._on_change(new)
        return answer

    def _fake_metrics_over_current(self, value: object) -> dict[str, object]:
        current = self.config.control.fake_metrics
        if current is None:
            raise ValueError("the simulator is reporting real metrics; fake metrics cannot be updated")
        if not isinstance(value, Mapping):
            raise ConfigError(_FAKE_METRICS, f"expected a JSON object, got {type(value).__name__}")
        merged: dict[str, object] = orjson.loads(current)
        merged.update((key, item) for key, item in value.items() if item is not None)
        return merged


def _snapshot(config: Config) -> dict[str, object]:
    """Every setting by its key, as llm-d's GET shows them, keys sorted as Go writes a map."""
    values = {
        setting.key: _json_value(setting, getattr(getattr(config, setting.group), setting.field.name))
        for setting in SETTINGS.values()
    }
    return dict(sorted(values.items()))


def _json_value(setting: Setting, value: object) -> object:
    if setting.key in _SECRET_KEYS:
        return [_MASK for _ in value] if isinstance(value, tuple) else _MASK
    if setting.doc.duration and isinstance(value, float):
        return go_duration(value)
    if setting.key == _FAKE_METRICS and isinstance(value, str):
        return orjson.loads(value)
    if isinstance(value, tuple):
        return list(value)
    return value


_NANOSECONDS = {"h": 3_600_000_000_000, "m": 60_000_000_000, "s": 1_000_000_000, "ms": 1_000_000, "µs": 1_000}


def go_duration(seconds: float) -> str:
    """Go's ``time.Duration.String()``: ``0s``, ``250ns``, ``1.5µs``, ``100ms``, ``2.5s``,
    ``1m30s``, ``1h0m0s`` (what llm-d's GET shows; :func:`llmsim.config.parse_duration`
    reads each back)."""
    nanoseconds = round(seconds * 1e9)
    if nanoseconds < _NANOSECONDS["µs"]:
        return f"{nanoseconds}ns" if nanoseconds else "0s"
    if nanoseconds < _NANOSECONDS["s"]:
        unit = "µs" if nanoseconds < _NANOSECONDS["ms"] else "ms"
        return _decimal(nanoseconds, _NANOSECONDS[unit]) + unit
    hours, rest = divmod(nanoseconds, _NANOSECONDS["h"])
    minutes, rest = divmod(rest, _NANOSECONDS["m"])
    text = f"{hours}h" if hours else ""
    if hours or minutes:
        text += f"{minutes}m"
    return text + _decimal(rest, _NANOSECONDS["s"]) + "s"


def _decimal(nanoseconds: int, unit: int) -> str:
    """``nanoseconds / unit`` in decimal, without trailing zeros."""
    whole, fraction = divmod(nanoseconds, unit)
    if not fraction:
        return str(whole)
    digits = str(fraction).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"
