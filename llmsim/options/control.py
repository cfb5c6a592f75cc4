"""What operators and test harnesses steer while the simulator runs: fake metrics,
injected failures and protocol faults, sleep mode, the API key, the logs."""

from __future__ import annotations

from typing import Any

import attrs

from llmsim.faults import FaultSyntaxError, parse_faults
from llmsim.options.fields import (
    FAILURE_TYPES,
    LOG_LEVELS,
    ConfigError,
    JsonObjectText,
    check_failure_types,
    check_log_level,
    check_percent,
    check_positive,
    option,
    option_key,
)

__all__ = ["ControlOptions"]


def _check_fault(instance: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None:
        try:
            parse_faults(value)
        except FaultSyntaxError as exc:
            raise ConfigError(option_key(attribute), str(exc).removeprefix("x-llmsim-fault: ")) from None


def _check_fraction(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not 0 <= value <= 1:
        raise ConfigError(option_key(attribute), f"must be a fraction in 0..1, got {value}")


@attrs.frozen(kw_only=True)
class ControlOptions:
    """What operators and test harnesses steer: fake metrics, injected failures, sleep
    mode, the API key and the logs.  The first three can be changed while the server
    runs (``POST /admin/config``)."""

    failure_injection_rate: int = option(
        0,
        metavar="PERCENT",
        validator=check_percent,
        help="share of generation requests answered with an injected error",
    )
    failure_types: tuple[str, ...] = option(
        (),
        metavar="TYPE",
        shown_default="all of them",
        validator=check_failure_types,
        help="injected errors to pick from: " + ", ".join(FAILURE_TYPES),
    )
    fake_metrics: JsonObjectText | None = option(  # noqa: RUF009 (a str: immutable, but a NewType ruff cannot see into)
        None,
        metavar="JSON",
        shown_default="unset: /metrics reports the engine",
        help="fixed or time-varying values /metrics reports instead of the engine's (llm-d-inference-sim's keys)",
    )
    fake_metrics_refresh_interval: float = option(
        0.1, duration=True, validator=check_positive, help="how often time-varying fake metrics are recomputed"
    )
    custom_histogram_buckets: JsonObjectText | None = option(  # noqa: RUF009 (as fake_metrics)
        None,
        metavar="JSON",
        shown_default="vLLM's buckets",
        llmd=False,
        help="vLLM's: {family: [bounds]} replacing a histogram family's buckets on /metrics",
    )
    fault: str | None = option(
        None,
        metavar="FAULTS",
        shown_default="unset",
        llmd=False,
        validator=_check_fault,
        help="protocol faults (x-llmsim-fault syntax, docs/faults.md) for a share of /v1/ requests (--fault-rate)",
    )
    fault_rate: float = option(
        0.0,
        metavar="FRACTION",
        llmd=False,
        validator=_check_fraction,
        help="share (0 to 1) of /v1/ requests without an x-llmsim-fault header that get --fault (seeded by --seed)",
    )
    enable_sleep_mode: bool = option(False, help="serve POST /sleep, POST /wake_up and GET /is_sleeping")
    api_key: tuple[str, ...] = option(
        (),
        metavar="KEY",
        shown_default="unset, or VLLM_API_KEY",
        llmd=False,
        help="require Authorization: Bearer KEY on /v1/* (any of the keys given)",
    )
    disable_log_stats: bool = option(False, llmd=False, help="no periodic engine stats line in the log")
    enable_log_requests: bool = option(False, llmd=False, help="log a line as each request arrives and as it ends")
    log_level: str = option(
        "info",
        metavar="{" + ",".join(LOG_LEVELS) + "}",
        llmd=False,
        validator=check_log_level,
        help="the log's threshold",
    )
