"""The paced_cost scenario: its arithmetic, its /metrics reading, its rows, and one tiny run."""

from __future__ import annotations

import http.client
import math
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest

from benchmarks import floor
from benchmarks.scenarios import paced_cost, paced_intake
from benchmarks.scenarios.paced_cost import (
    ROOT,
    Load,
    Reading,
    cost_row,
    measure_cost,
    paced_server,
    parse_metrics,
    split_cost,
)
from benchmarks.scenarios.paced_latency import latency_row
from benchmarks.servers import running

PAGE = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="bench-model"} 280.0
vllm:generation_tokens_created{engine="0",model_name="bench-model"} 1.7e9
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="bench-model"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="a } b"} 25.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="bench-model"} 0.0
vllm:request_success_total_bucket 99
vllm:num_requests_running{engine="0",model_name="bench-model"} 7.0
"""


def test_metrics_are_summed_over_label_sets_and_nothing_else() -> None:
    assert parse_metrics(PAGE) == {"vllm:generation_tokens_total": 280.0, "vllm:request_success_total": 28.0}


def test_metrics_without_labels_and_missing_names() -> None:
    assert parse_metrics("a_total 2\nb 5\n", ("a_total", "c")) == {"a_total": 2.0, "c": 0.0}


def test_split_recovers_cost_per_token_and_per_request() -> None:
    """cpu/token = T + R/len at 100 and 400 tokens per request."""
    per_token, per_request = 3.5, 520.0
    short = (per_token + per_request / 100, 1 / 100)
    long = (per_token + per_request / 400, 1 / 400)
    assert split_cost(short, long) == pytest.approx((per_token, per_request))


def test_split_of_loads_that_cannot_be_told_apart_is_nan() -> None:
    assert all(math.isnan(v) for v in split_cost((5.0, 0.01), (4.0, 0.01)))
    assert all(math.isnan(v) for v in split_cost((math.nan, 0.01), (4.0, 0.0025)))


def test_cost_row_is_cpu_over_the_servers_tokens() -> None:
    before = Reading(at=10.0, user=1.0, system=0.5, runnable=2.0, tokens=1_000, requests=10)
    after = Reading(at=12.0, user=1.3, system=0.6, runnable=3.5, tokens=101_000, requests=1_010)
    row = cost_row(before, after)
    assert row["us_per_token"] == pytest.approx(4.0)  # 0.4 CPU s over 100,000 tokens
    assert row["user_us_per_token"] == pytest.approx(3.0)
    assert row["sys_us_per_token"] == pytest.approx(1.0)
    assert row["tokens_per_second"] == pytest.approx(50_000)
    assert row["requests_per_second"] == pytest.approx(500)
    assert row["requests_per_token"] == pytest.approx(0.01)
    assert row["server_busy"] == pytest.approx(0.75)


def test_no_tokens_is_nan_not_a_division_error() -> None:
    reading = Reading(at=1.0, user=1.0, system=1.0, runnable=1.0, tokens=5, requests=0)
    assert math.isnan(cost_row(reading, attrs.evolve(reading, at=2.0))["us_per_token"])


def _sample(round_index: int, server: str, tokens: int, us: float) -> dict[str, object]:
    row: dict[str, object] = {"round": round_index, "server": server, "load": "h2 20x50", "http2": True}
    row.update(streams=1000, max_tokens=tokens, h2load_errors=0, instances_ended_early=0)
    row.update({key: us for key in paced_cost.COST_KEYS})
    row["requests_per_token"] = 1 / tokens
    return row


def test_rows_are_medians_with_the_ratio_to_the_other_checkout() -> None:
    samples = [
        _sample(r, server, tokens, us * (1 + r / 10))
        for r in range(3)
        for server, us in ((paced_cost.OLD, 15.0), (paced_cost.NEW, 5.0))
        for tokens in (100, 400)
    ]
    rows = {(row["server"], row["max_tokens"]): row for row in paced_cost._medians(samples)}
    assert rows[paced_cost.NEW, 100]["us_per_token"] == pytest.approx(5.5)  # the middle round
    assert rows[paced_cost.NEW, 100]["ratio_to_against"] == pytest.approx(1 / 3)
    assert math.isnan(rows[paced_cost.OLD, 400]["ratio_to_against"])


def test_rows_have_the_ratio_to_the_floor_where_it_ran() -> None:
    samples = [
        {**_sample(0, server, 100, us), "load": load}
        for server, us, load in (
            (paced_cost.OLD, 18.0, "h1 1000"),
            (paced_cost.NEW, 12.0, "h1 1000"),
            (paced_cost.FLOOR, 8.0, "h1 1000"),
            (paced_cost.NEW, 4.0, "h2 20x50"),
        )
    ]
    rows = {(row["server"], row["load"]): row for row in paced_cost._medians(samples)}
    assert rows[paced_cost.NEW, "h1 1000"]["ratio_to_floor"] == pytest.approx(1.5)
    assert rows[paced_cost.OLD, "h1 1000"]["ratio_to_floor"] == pytest.approx(2.25)
    assert math.isnan(rows[paced_cost.FLOOR, "h1 1000"]["ratio_to_floor"])
    assert math.isnan(rows[paced_cost.FLOOR, "h1 1000"]["ratio_to_against"])
    assert math.isnan(rows[paced_cost.NEW, "h2 20x50"]["ratio_to_floor"])  # no floor at HTTP/2


def test_split_rows_are_solved_per_round() -> None:
    samples = [{**_sample(0, paced_cost.NEW, tokens, 0.0), "us_per_token": 2.0 + 600 / tokens} for tokens in (100, 400)]
    [row] = paced_cost._split(samples)
    assert row["us_per_token"] == pytest.approx(2.0)
    assert row["us_per_request"] == pytest.approx(600.0)


def test_latency_row_errors_against_configuration_and_blaster() -> None:
    def percentiles(p50: float, p99: float) -> SimpleNamespace:
        return SimpleNamespace(p50=p50, p99=p99)

    summary = SimpleNamespace(
        streams_measured=9,
        errors=0,
        ttft=percentiles(0.0505, 0.06),
        itl=percentiles(0.020, 0.025),
        tokens_per_second=1.0,
        client_busy=0.1,
    )
    # ITL p50 0: every event of a stream arrived in one read (an overloaded client)
    blaster = SimpleNamespace(**{**vars(summary), "ttft": percentiles(0.0501, 0.055), "itl": percentiles(0.0, 0.03)})
    reference = latency_row(blaster, 0.05, None)
    row = latency_row(summary, 0.05, reference)
    assert row["ttft_p50_error_ms"] == pytest.approx(0.5)
    assert row["ttft_p50_error_percent"] == pytest.approx(1.0)
    assert row["ttft_p50_vs_blaster_percent"] == pytest.approx((0.0505 / 0.0501 - 1) * 100)
    assert row["itl_p50_error_percent"] == pytest.approx(0.0)
    assert math.isnan(reference["ttft_p50_vs_blaster_percent"])
    assert math.isnan(row["itl_p50_vs_blaster_percent"])


def test_the_server_runs_from_the_given_checkout_with_its_fd_limit_raised(tmp_path: Path) -> None:
    """``--against DIR`` must run DIR's llmsim even from this checkout's directory (where
    ``python -m`` would put the working directory first on ``sys.path``)."""
    package = tmp_path / "llmsim"
    package.mkdir()
    (package / "__init__.py").write_text("")
    probe = "import resource, llmsim; print(llmsim.__file__, *resource.getrlimit(resource.RLIMIT_NOFILE))"
    (package / "__main__.py").write_text(probe)
    command = paced_server("probe", tmp_path).command(0)
    output = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True, timeout=30).stdout
    path, soft, hard = output.split()
    assert Path(path) == package / "__init__.py"
    assert int(soft) == int(hard) == resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def test_intake_submits_and_keeps_requests_in_flight() -> None:
    row = paced_intake.measure(100, 20, warmup=5)
    assert row["requests"] == 20
    assert 0 < row["cpu_us_median"] <= row["cpu_us_mean"] * 5
    assert row["bytes_per_stream"] > 1000  # a request, its plan, its job and a task


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load (nghttp2-client) not installed")
def test_tiny_paced_run_over_both_protocols(tmp_path: Path) -> None:
    """10-token streams (280 ms each) from h2load, a 0.5 s window: every request succeeds and
    the server's counters give a finite cost near the ideal paced rate."""
    with running(paced_server(paced_cost.NEW, ROOT), tmp_path) as server:
        for load in (Load("h1 4", False, 4, 1), Load("h2 2x5", True, 2, 5)):
            row = measure_cost(server, load, 10, 0.5, tmp_path)
            assert row["h2load_errors"] == 0 and row["h2load_succeeded"] > 0
            assert row["instances_ended_early"] == 0
            ideal = load.concurrency * 10 / (0.1 + 9 * 0.02)
            assert 0.5 * ideal < row["tokens_per_second"] < 1.2 * ideal
            assert 0 < row["us_per_token"] < math.inf and row["requests"] > 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load (nghttp2-client) not installed")
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_tiny_paced_run_of_the_floor(tmp_path: Path) -> None:
    """The C pacer (benchmarks.floor) serves what h2load asks at its pace, its /metrics count
    every token and request, and a stream is what llmsim sends: chunks, then [DONE]."""
    spec = floor.h1_pacer(paced_cost.FLOOR, tmp_path, paced_cost.TTFT, paced_cost.ITL)
    assert spec is not None
    with running(spec, tmp_path) as server:
        load = Load("h1 4", False, 4, 1)
        row = measure_cost(server, load, 10, 0.5, tmp_path)
        assert row["h2load_errors"] == 0 and row["h2load_succeeded"] > 0
        ideal = load.concurrency * 10 / (0.1 + 9 * 0.02)
        assert 0.5 * ideal < row["tokens_per_second"] < 1.2 * ideal
        assert row["requests"] > 0 and row["tokens"] == pytest.approx(10 * row["requests"], abs=40)
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        connection.request("POST", "/v1/chat/completions", b'{"max_tokens": 3}')
        response = connection.getresponse()
        body = response.read()
        connection.close()
    assert response.status == 200 and response.getheader("transfer-encoding") == "chunked"
    assert body.count(b"data: {") == 3 and body.endswith(b"data: [DONE]\n\n")


def test_module_runs_alone(tmp_path: Path) -> None:
    """paced_intake imports nothing of benchmarks: the scenario runs it by path."""
    script = Path(paced_intake.__file__)
    code = f"import runpy, sys; sys.argv = ['x', '--help']; runpy.run_path({str(script)!r}, run_name='__main__')"
    result = subprocess.run(
        [sys.executable, "-P", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "--max-tokens" in result.stdout
