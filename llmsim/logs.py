"""The server's log, in vLLM's words: the start-up banner, the periodic engine stats
line, the shutdown summary, and the line format of ``llmsim serve``.

Everything goes through :mod:`logging`, under ``llmsim.*`` loggers.  ``serve()`` only
emits records; the host program decides where they go.  Only the ``llmsim`` command
sets up a handler (:func:`configure_logging`, with ``--log-level``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TextIO

import attrs
import trio

from llmsim import __version__
from llmsim.api import request_log
from llmsim.config import SETTINGS, Config
from llmsim.engine.statistics import EngineStatistics

__all__ = [
    "DATE_FORMAT",
    "LOG_FORMAT",
    "STATS_INTERVAL",
    "CacheReading",
    "LogFormatter",
    "ServerLog",
    "StatsLine",
    "configure_logging",
    "format_stats_line",
    "non_default_settings",
]

server_log = logging.getLogger("llmsim.server")
stats_log = logging.getLogger("llmsim.stats")

#: vLLM's line format (``vllm/logger.py:28-33``): ``(APIServer pid=7) INFO 12-01
#: 07:30:00 [logs.py:123] message``.  ``APIServer`` names the process's role, as the
#: API server process of ``vllm serve`` does (``entrypoints/launchers/api_server/entry.py:166``).
LOG_FORMAT = "(APIServer pid=%(process)d) %(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
DATE_FORMAT = "%m-%d %H:%M:%S"

#: Seconds between two stats lines: ``VLLM_LOG_STATS_INTERVAL``'s default
#: (``vllm/envs.py:873-878``), slept between lines as vLLM's ``_force_log`` task does
#: (``vllm/entrypoints/launchers/utils/server_utils.py:78-84``).
STATS_INTERVAL = 10.0

#: Settings whose values are never logged (vLLM's ``_SENSITIVE_ARG_FIELDS``,
#: ``vllm/entrypoints/common/startup.py:49-60``): shown as ``***``.
_SENSITIVE = frozenset({"api_key"})


class LogFormatter(logging.Formatter):
    """:data:`LOG_FORMAT`; every further line of a message (a traceback, say) starts
    with the same prefix, as vLLM's ``NewLineFormatter`` does
    (``vllm/logging_utils/formatter.py:75-79``, which uses ``\\r\\n`` where this uses ``\\n``)."""

    def __init__(self) -> None:
        super().__init__(LOG_FORMAT, DATE_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if "\n" not in text or not record.message:
            return text
        prefix = text[: text.index(record.message)]
        return text.replace("\n", "\n" + prefix)


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """What ``llmsim serve`` does with ``--log-level``: the ``llmsim`` logger writes
    :data:`LOG_FORMAT` lines to ``stream`` (stderr) from ``level`` (any case) up, and
    not to the root logger's handlers (vLLM's ``vllm`` logger, ``vllm/logger.py:97-103``).
    Calling it again replaces the handler it installed before."""
    logger = logging.getLogger("llmsim")
    for handler in list(logger.handlers):
        if isinstance(handler.formatter, LogFormatter):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(LogFormatter())
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


# --- the banner and the summary ------------------------------------------------------------


def non_default_settings(config: Config) -> dict[str, object]:
    """The settings that differ from their defaults, by ``Config`` keyword, secrets
    masked: vLLM's ``non-default args`` (``vllm/entrypoints/common/startup.py:63-96``)."""
    return {
        name: "***" if name in _SENSITIVE else value
        for name, value in config.settings().items()
        if value != SETTINGS[name].default
    }


@attrs.frozen
class CacheReading:
    """The prefix cache, as the stats line reports it: the KV usage (a fraction) and the
    prefix-cache queries and hits so far (tokens)."""

    usage: float = 0.0
    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float | None:
        """Hits over queries since start-up; None before any request was scheduled.
        (vLLM's ``CachingMetrics`` averages over its last 1,000 requests.)"""
        return self.hits / self.queries if self.queries else None


_NO_CACHE = CacheReading()


def _no_cache() -> CacheReading:
    return _NO_CACHE


@attrs.define
class ServerLog:
    """One server's log lines, from the banner to the summary.

    ``serve()`` calls :meth:`listening` once the server is bound, runs
    :meth:`report_stats` beside it (unless ``--disable-log-stats``) and calls
    :meth:`stopped` when it has shut down.
    """

    config: Config
    statistics: Callable[[], EngineStatistics]
    clock: Callable[[], float] = trio.current_time
    cache: Callable[[], CacheReading] = _no_cache
    _started_at: float | None = attrs.field(default=None, init=False)

    def listening(self, url: str) -> None:
        """The banner, once the server is bound: vLLM's ``vLLM server version %s,
        serving model %s``, ``non-default args: %s`` and ``Starting vLLM server on %s``
        (``entrypoints/common/startup.py:18,96``, ``launchers/api_server/entry.py:139``),
        saying what is really running.  All at once, so a server that cannot bind
        ends with its one error line only."""
        self._started_at = self.clock()
        model = self.config.model
        server_log.info(
            "llmsim version %s simulating vLLM %s, serving model %s", __version__, model.vllm_version, model.name
        )
        server_log.info("non-default args: %s", non_default_settings(self.config))
        control = self.config.control
        if control.enable_log_requests and not request_log.log.isEnabledFor(logging.INFO):
            # vllm/entrypoints/serve/utils/request_logger.py:24-29
            server_log.warning(
                "`--enable-log-requests` is set but the minimum log level is higher than INFO. "
                "No request information will be logged."
            )
        server_log.info("Starting llmsim server (%s backend) on %s", self.config.server.backend, url)

    async def report_stats(self) -> None:
        """vLLM's stats line every :data:`STATS_INTERVAL` seconds, forever (at DEBUG
        while the engine is idle, see :class:`StatsLine`)."""
        line = StatsLine(self.statistics(), self.clock())
        while True:
            await trio.sleep(STATS_INTERVAL)
            level, text = line.tick(self.statistics(), self.clock(), self.cache())
            stats_log.log(level, "%s", text)

    def stopped(self) -> None:
        """The shutdown summary (nothing if the server never started)."""
        if self._started_at is None:
            return
        stats = self.statistics()
        server_log.info(
            "Shutting down after %.1f s: %d requests finished, %d cancelled, %d rejected; "
            "%d prompt tokens, %d generated tokens.",
            self.clock() - self._started_at,
            stats.finished,
            stats.cancelled,
            stats.rejected,
            stats.prompt_tokens,
            stats.generated_tokens,
        )


# --- the stats line ----------------------------------------------------------------------


def format_stats_line(
    prompt_throughput: float,
    generation_throughput: float,
    running: int,
    waiting: int,
    kv_cache_usage: float,
    prefix_cache_hit_rate: float | None,
) -> str:
    """vLLM's ``LoggingStatLogger.log`` line (``vllm/v1/metrics/loggers.py:279-336``) for
    engine 0 of a CUDA device; usage and hit rate are fractions.  The hit rate is left
    out while no request has been scheduled (``CachingMetrics.empty``); the parts vLLM
    adds only for features llmsim has not (preemptions, KV transfer, spec decoding)
    are never there."""
    line = (
        f"Engine 000: Avg prompt throughput: {prompt_throughput:.1f} tokens/s, "
        f"Avg generation throughput: {generation_throughput:.1f} tokens/s, "
        f"Running: {running} reqs, Waiting: {waiting} reqs, "
        f"GPU KV cache usage: {kv_cache_usage * 100:.1f}%"
    )
    if prefix_cache_hit_rate is not None:
        line += f", Prefix cache hit rate: {prefix_cache_hit_rate * 100:.1f}%"
    return line


@attrs.define
class StatsLine:
    """vLLM's ``LoggingStatLogger`` over llmsim's engine counters
    (``vllm/v1/metrics/loggers.py:144-276``): each :meth:`tick` turns the token counts
    since the last tick into throughputs.  A tick is logged at DEBUG when it and the one
    before both saw no tokens at all ("avoid log noise on an idle production system"),
    so an idle server's INFO log stays quiet after one all-zero line."""

    _last: EngineStatistics
    _last_time: float
    _last_prompt_throughput: float = 0.0
    _last_generation_throughput: float = 0.0

    def tick(self, stats: EngineStatistics, now: float, cache: CacheReading = _NO_CACHE) -> tuple[int, str]:
        """The level and text of the stats line at ``now``."""
        elapsed = now - self._last_time
        prompt = _throughput(stats.prompt_tokens - self._last.prompt_tokens, elapsed)
        generation = _throughput(stats.generated_tokens - self._last.generated_tokens, elapsed)
        idle = not any((prompt, generation, self._last_prompt_throughput, self._last_generation_throughput))
        self._last, self._last_time = stats, now
        self._last_prompt_throughput, self._last_generation_throughput = prompt, generation
        text = format_stats_line(prompt, generation, stats.running, stats.waiting, cache.usage, cache.hit_rate)
        return (logging.DEBUG if idle else logging.INFO), text


def _throughput(tokens: int, elapsed: float) -> float:
    """``LoggingStatLogger._get_throughput`` (vllm/v1/metrics/loggers.py:170-175)."""
    return tokens / elapsed if elapsed > 0 else 0.0
