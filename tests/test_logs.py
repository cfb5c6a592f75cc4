"""The server's log (llmsim/logs.py): vLLM's stats line, the banner, the summary, the
CLI's line format."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import httpx
import pytest
import trio
import trio.testing

from llmsim.config import Config
from llmsim.engine.statistics import EngineStatistics
from llmsim.logs import (
    STATS_INTERVAL,
    CacheReading,
    LogFormatter,
    ServerLog,
    StatsLine,
    configure_logging,
    format_stats_line,
    non_default_settings,
)
from llmsim.testing import open_simulator

# vLLM 0.33's parts, as vllm/v1/metrics/loggers.py:283-321 joins them for an engine on
# CUDA with an observed prefix cache and nothing else to report.
VLLM_LOG_PARTS = [
    "Avg prompt throughput: %.1f tokens/s",
    "Avg generation throughput: %.1f tokens/s",
    "Running: %d reqs",
    "Waiting: %d reqs",
    "%s KV cache usage: %.1f%%",
    "Prefix cache hit rate: %.1f%%",
]


def stats(*, prompt: int = 0, generated: int = 0, running: int = 0, waiting: int = 0) -> EngineStatistics:
    return EngineStatistics(
        running=running,
        waiting=waiting,
        submitted=0,
        finished=0,
        cancelled=0,
        rejected=0,
        generated_tokens=generated,
        prompt_tokens=prompt,
        steps=0,
        late_steps=0,
        max_lateness=0.0,
    )


def records(caplog: pytest.LogCaptureFixture, name: str) -> list[tuple[int, str]]:
    return [(record.levelno, record.getMessage()) for record in caplog.records if record.name == name]


@pytest.fixture
def llmsim_logger() -> Iterator[logging.Logger]:
    """The ``llmsim`` logger, put back as it was after the test reconfigured it."""
    logger = logging.getLogger("llmsim")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


# --- the stats line ------------------------------------------------------------------------


def test_the_stats_line_is_vllms_format() -> None:
    vllm = "Engine 000: " + ", ".join(VLLM_LOG_PARTS) % (1234.56, 78.04, 3, 12, "GPU", 41.25, 0.0)
    assert format_stats_line(1234.56, 78.04, 3, 12, 0.4125, 0.0) == vllm
    assert vllm == (
        "Engine 000: Avg prompt throughput: 1234.6 tokens/s, Avg generation throughput: 78.0 tokens/s, "
        "Running: 3 reqs, Waiting: 12 reqs, GPU KV cache usage: 41.2%, Prefix cache hit rate: 0.0%"
    )


def test_no_prefix_cache_part_before_any_request_was_scheduled() -> None:
    """vLLM leaves it out while its CachingMetrics are empty (loggers.py:316-318)."""
    vllm = "Engine 000: " + ", ".join(VLLM_LOG_PARTS[:-1]) % (0.0, 0.0, 0, 0, "GPU", 0.0)
    assert format_stats_line(0.0, 0.0, 0, 0, 0.0, None) == vllm


#: A prefix cache some request has queried, with no hit.
SCHEDULED = CacheReading(queries=10)


def test_throughputs_are_token_deltas_over_the_interval() -> None:
    line = StatsLine(stats(prompt=100, generated=50), 5.0)
    level, text = line.tick(stats(prompt=300, generated=1050, running=4, waiting=2), 15.0, SCHEDULED)
    assert level == logging.INFO
    assert text == format_stats_line(20.0, 100.0, 4, 2, 0.0, 0.0)
    level, text = line.tick(stats(prompt=300, generated=1100, running=1), 20.0, SCHEDULED)
    assert text == format_stats_line(0.0, 10.0, 1, 0, 0.0, 0.0)


def test_an_idle_engine_logs_at_debug_after_one_quiet_line() -> None:
    """vLLM's engine_is_idle (loggers.py:262-276): both this interval's throughputs and
    the last ones are zero."""
    line = StatsLine(stats(), 0.0)
    assert line.tick(stats(), 10.0)[0] == logging.DEBUG  # never did anything
    assert line.tick(stats(prompt=10, generated=5, running=1), 20.0)[0] == logging.INFO
    assert line.tick(stats(prompt=10, generated=5), 30.0, SCHEDULED) == (
        logging.INFO,
        format_stats_line(0, 0, 0, 0, 0, 0),
    )
    assert line.tick(stats(prompt=10, generated=5), 40.0)[0] == logging.DEBUG
    assert line.tick(stats(prompt=10, generated=6), 50.0)[0] == logging.INFO


def test_kv_usage_and_hit_rate_come_from_the_prefix_cache() -> None:
    """The usage and hits over queries of the KV pool (with --enable-kvcache; 0 % without)."""
    line = StatsLine(stats(), 0.0)
    cache = CacheReading(usage=0.25, queries=200, hits=50)
    assert line.tick(stats(running=1), 10.0, cache)[1].endswith(
        "GPU KV cache usage: 25.0%, Prefix cache hit rate: 25.0%"
    )
    assert CacheReading().hit_rate is None  # nothing scheduled yet: the part is left out


async def test_the_stats_task_logs_every_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "llmsim")
    current = stats()
    server_log = ServerLog(Config(port=0), lambda: current, cache=lambda: SCHEDULED)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server_log.report_stats)
        await trio.sleep(STATS_INTERVAL / 2)
        current = stats(prompt=500, generated=2000, running=7, waiting=1)
        await trio.sleep(STATS_INTERVAL)
        assert records(caplog, "llmsim.stats") == [(logging.INFO, format_stats_line(50.0, 200.0, 7, 1, 0.0, 0.0))]
        await trio.sleep(2 * STATS_INTERVAL)
        nursery.cancel_scope.cancel()
    quiet = format_stats_line(0.0, 0.0, 7, 1, 0.0, 0.0)
    assert records(caplog, "llmsim.stats")[1:] == [(logging.INFO, quiet), (logging.DEBUG, quiet)]


# --- the banner and the summary -------------------------------------------------------------


def test_non_default_settings_mask_the_api_key() -> None:
    config = Config(port=0, api_key=("secret",), max_num_seqs=7)
    assert non_default_settings(config) == {"max_num_seqs": 7, "port": 0, "api_key": "***"}
    assert non_default_settings(Config()) == {}


@pytest.mark.parametrize("disable_log_stats", [False, True])
async def test_serve_logs_banner_stats_and_summary(
    backend: str,
    disable_log_stats: bool,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "llmsim")
    config = Config(port=0, server=backend, api_key=("secret",), disable_log_stats=disable_log_stats)
    expected_args = {"port": 0, "server": backend, "api_key": "***", "disable_log_stats": True}
    if backend == "native":
        del expected_args["server"]  # the default
    if not disable_log_stats:
        del expected_args["disable_log_stats"]
    async with open_simulator(config) as server:
        banner = records(caplog, "llmsim.server")
        assert [message for _, message in banner] == [
            "llmsim version 0.1.0 simulating vLLM 0.33.0, serving model llmsim/sim-model",
            f"non-default args: {expected_args}",
            f"Starting llmsim server ({backend} backend) on {server.url}",
        ]
        async with httpx.AsyncClient(base_url=server.url, headers={"authorization": "Bearer secret"}) as client:
            body = {"prompt": "hello there", "max_tokens": 20, "ignore_eos": True}
            response = await client.post("/v1/completions", json=body)
        assert response.status_code == 200
        await trio.sleep(STATS_INTERVAL + 0.5)
        lines = records(caplog, "llmsim.stats")
        if disable_log_stats:
            assert lines == []
        else:
            [(level, line)] = lines
            assert level == logging.INFO
            assert re.fullmatch(
                r"Engine 000: Avg prompt throughput: 0\.\d tokens/s, Avg generation throughput: 2\.0 tokens/s, "
                r"Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0\.0%, Prefix cache hit rate: 0\.0%",
                line,
            ), line
    summary = records(caplog, "llmsim.server")[3:]
    assert len(summary) == 1
    assert re.fullmatch(
        r"Shutting down after 1\d\.\d s: 1 requests finished, 0 cancelled, 0 rejected; "
        r"\d+ prompt tokens, 20 generated tokens\.",
        summary[0][1],
    ), summary


async def test_a_server_that_cannot_bind_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Its one error line stays the only line (the CLI's promise, tests/test_cli.py)."""
    caplog.set_level(logging.DEBUG, "llmsim")
    with trio.socket.socket() as busy:
        await busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.RaisesGroup(OSError, flatten_subgroups=True):
            async with open_simulator(port=busy.getsockname()[1]):
                pass  # pragma: no cover
    assert records(caplog, "llmsim.server") == []


async def test_log_requests_above_info_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """vLLM's RequestLogger warning (vllm/entrypoints/serve/utils/request_logger.py:24-29)."""
    caplog.set_level(logging.WARNING, "llmsim")
    async with open_simulator(enable_log_requests=True):
        pass
    assert records(caplog, "llmsim.server") == [
        (
            logging.WARNING,
            "`--enable-log-requests` is set but the minimum log level is higher than INFO. "
            "No request information will be logged.",
        )
    ]


# --- the line format and --log-level ------------------------------------------------------


def _record(message: str, *args: object, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("llmsim.server", level, "/x/llmsim/logs.py", 123, message, args, None)


def test_lines_have_vllms_format() -> None:
    """vllm/logger.py:28-33 (with the API server's process name)."""
    line = LogFormatter().format(_record("Starting on %s", "http://h:1"))
    assert re.fullmatch(
        r"\(APIServer pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d \[logs\.py:123\] Starting on http://h:1", line
    ), line


def test_every_line_of_a_message_gets_the_prefix() -> None:
    line = LogFormatter().format(_record("one\ntwo", level=logging.WARNING))
    first, second = line.split("\n")
    assert first.endswith("] one")
    assert second == first.removesuffix("one") + "two"


@pytest.mark.parametrize("level", ["DEBUG", "info", "Warning", "error", "CRITICAL"])
def test_configure_logging_applies_the_level(level: str, llmsim_logger: logging.Logger) -> None:
    out = io.StringIO()
    configure_logging(level, out)
    configure_logging(level, out)  # again: one handler, not two
    logging.getLogger("llmsim.server").log(logging.getLevelName(level.upper()), "shown")
    logging.getLogger("llmsim.server").log(logging.getLevelName(level.upper()) - 10, "hidden")
    assert llmsim_logger.level == logging.getLevelName(level.upper())
    assert not llmsim_logger.propagate
    [line] = out.getvalue().splitlines()
    assert f") {level.upper()} " in line
    assert line.endswith("] shown")
